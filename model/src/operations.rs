//! What each operation needs from its caller, declared once and enforced by the server's
//! authentication layer: the REST handler names its [`Declaration`] in its `#[utoipa::path]`
//! (`extensions(("x-access" = json!(…)))`), a console server function in `guard!` beside
//! itself, and an operation with both (a console twin) names the same constant here, so the
//! router, the OpenAPI document, the server functions, the console's buttons and the access
//! tests read one declaration.
//!
//! An operation on something in a project declares where the project is found in the
//! request ([`Scope`]); the layer resolves it (a service's project from the store) and
//! checks the caller's role there before the handler runs. A handler never checks a
//! project's role by hand.

use crate::auth::{Access, Role};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;

/// Where an operation's project is, named as the REST operation's arguments are: `{name}`
/// is a path parameter, `project` a field of the JSON body. A console server function names
/// the same arguments: `{name}` its argument `name`, `project` a field of its body argument
/// (the one its `guard!` names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// The project of the service this argument names; the service must exist.
    Service(Cow<'static, str>),
    /// The project a service is put into (created there): this argument, or the default
    /// project when it is absent. Putting a service into a project other than the default
    /// needs the role given in that project itself (its quotas are that project's).
    Into(Cow<'static, str>),
    /// The project a service is moved into, when this argument is given; as [`Scope::Into`].
    MovedInto(Cow<'static, str>),
    /// The project of the service of the task this argument names; the task must exist.
    Task(Cow<'static, str>),
}

impl Scope {
    /// The argument it reads.
    pub fn argument(&self) -> &str {
        match self {
            Scope::Service(a) | Scope::Into(a) | Scope::MovedInto(a) | Scope::Task(a) => a,
        }
    }

    /// A path parameter's name (`{name}` → `name`), or `None` for a body field.
    pub fn path_parameter(&self) -> Option<&str> {
        self.argument()
            .strip_prefix('{')
            .and_then(|a| a.strip_suffix('}'))
    }

    fn kind(&self) -> &'static str {
        match self {
            Scope::Service(_) => "service",
            Scope::Into(_) => "into",
            Scope::MovedInto(_) => "moved-into",
            Scope::Task(_) => "task",
        }
    }
}

/// When an accepted request is written to the audit log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Audit {
    /// When it may change something (any method but `GET`, `HEAD`, `OPTIONS`).
    Changes,
    /// Always, reads too: reads of what may hold secrets.
    Always,
}

/// One operation's access: the role it needs, where its project is, and whether it is
/// audited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    pub access: Access,
    /// Where the project acted on is found; empty unless `access` is [`Access::InProject`],
    /// which needs at least one.
    pub scope: Cow<'static, [Scope]>,
    pub audit: Audit,
}

impl Declaration {
    const fn plain(access: Access) -> Declaration {
        Declaration {
            access,
            scope: Cow::Borrowed(&[]),
            audit: Audit::Changes,
        }
    }

    /// Anyone: `/healthz`, the OpenAPI document, signing in.
    pub const PUBLIC: Declaration = Declaration::plain(Access::Public);
    /// An agent: its handlers check the join token or the agent token.
    pub const AGENT: Declaration = Declaration::plain(Access::Agent);
    /// Any signed-in caller.
    pub const VIEW: Declaration = Declaration::plain(Access::VIEW);
    /// An operator fleet-wide.
    pub const OPERATE: Declaration = Declaration::plain(Access::OPERATE);
    /// An admin.
    pub const ADMIN: Declaration = Declaration::plain(Access::ADMIN);

    /// Why the declaration cannot be enforced, if it cannot: a project role without a
    /// scope (the layer would not know where to check it), or a scope on an operation that
    /// is not in a project.
    pub fn check(&self) -> Result<(), String> {
        match (self.access, self.scope.is_empty()) {
            (Access::InProject(_), true) => Err(format!(
                "{} needs a scope: where the layer finds the project",
                self.access.as_str()
            )),
            (Access::InProject(_), false) | (_, true) => Ok(()),
            (other, false) => Err(format!(
                "a scope is for an operation in a project, not {}",
                other.as_str()
            )),
        }
    }

    /// Whether an accepted request with this method is written to the audit log.
    pub fn audited(&self, changes: bool) -> bool {
        changes || self.audit == Audit::Always
    }
}

/// The service a REST path's `{name}` names (a server function's argument `name`).
const NAMED_SERVICE: Scope = Scope::Service(Cow::Borrowed("{name}"));

const fn operator_in(scope: &'static [Scope]) -> Declaration {
    Declaration {
        access: Access::InProject(Role::Operator),
        scope: Cow::Borrowed(scope),
        audit: Audit::Changes,
    }
}

/// Create a service, in the project its input names (the default project when it names
/// none).
pub const CREATE_SERVICE: Declaration = operator_in(&[Scope::Into(Cow::Borrowed("project"))]);
/// Scale, deploy or move a service: an operator in its project, and in the project it
/// moves into.
pub const UPDATE_SERVICE: Declaration =
    operator_in(&[NAMED_SERVICE, Scope::MovedInto(Cow::Borrowed("project"))]);
/// An operator's action on the service a path's `{name}` names (a server function's
/// argument `name`), checked in that service's project.
pub const OPERATE_ON_SERVICE: Declaration = operator_in(&[NAMED_SERVICE]);
/// Delete a service.
pub const DELETE_SERVICE: Declaration = OPERATE_ON_SERVICE;
/// Read what the tasks of the service `{name}` wrote (their last lines, their logs): an
/// operator in its project, every read in the audit log, since output may hold secrets.
pub const READ_SERVICE_OUTPUT: Declaration = Declaration {
    access: Access::InProject(Role::Operator),
    scope: Cow::Borrowed(&[NAMED_SERVICE]),
    audit: Audit::Always,
};

/// Read what task `{id}` writes (its logs, followed): an operator in its service's
/// project, every read in the audit log, since output may hold secrets.
pub const READ_TASK_OUTPUT: Declaration = Declaration {
    access: Access::InProject(Role::Operator),
    scope: Cow::Borrowed(&[Scope::Task(Cow::Borrowed("{id}"))]),
    audit: Audit::Always,
};
/// Run a command in task `{id}`: an operator in its service's project (where its pool
/// allows exec), every session in the audit log.
pub const EXEC_IN_TASK: Declaration = READ_TASK_OUTPUT;

/// As the OpenAPI document's `x-access` shows it: `{"role": "project-operator",
/// "project": [{"service": "{name}"}], "audit": "changes"}`.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    role: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    project: Vec<std::collections::BTreeMap<String, String>>,
    #[serde(default = "changes")]
    audit: Audit,
}

fn changes() -> Audit {
    Audit::Changes
}

impl Serialize for Declaration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Wire {
            role: self.access.as_str().to_owned(),
            project: self
                .scope
                .iter()
                .map(|sc| [(sc.kind().to_owned(), sc.argument().to_owned())].into())
                .collect(),
            audit: self.audit,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Declaration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let w = Wire::deserialize(d)?;
        let access = Access::parse(&w.role)
            .ok_or_else(|| D::Error::custom(format!("unknown role {:?}", w.role)))?;
        let scope = w
            .project
            .into_iter()
            .map(|m| {
                let [(kind, argument)] = <[(String, String); 1]>::try_from(
                    m.into_iter().collect::<Vec<_>>(),
                )
                .map_err(|_| D::Error::custom("each scope is one of service, into, moved-into"))?;
                let argument = Cow::Owned(argument);
                match kind.as_str() {
                    "service" => Ok(Scope::Service(argument)),
                    "into" => Ok(Scope::Into(argument)),
                    "moved-into" => Ok(Scope::MovedInto(argument)),
                    "task" => Ok(Scope::Task(argument)),
                    other => Err(D::Error::custom(format!("unknown scope {other:?}"))),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let declared = Declaration {
            access,
            scope: Cow::Owned(scope),
            audit: w.audit,
        };
        declared.check().map_err(D::Error::custom)?;
        Ok(declared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_read_back_as_written() {
        for d in [
            Declaration::PUBLIC,
            Declaration::AGENT,
            Declaration::VIEW,
            Declaration::OPERATE,
            Declaration::ADMIN,
            CREATE_SERVICE,
            UPDATE_SERVICE,
            DELETE_SERVICE,
        ] {
            d.check().expect("enforceable");
            let v = serde_json::to_value(&d).expect("serialises");
            assert_eq!(
                serde_json::from_value::<Declaration>(v.clone()).expect("reads back"),
                d,
                "{v}"
            );
        }
        assert_eq!(
            serde_json::to_value(&UPDATE_SERVICE).expect("serialises"),
            serde_json::json!({"role": "project-operator",
                "project": [{"service": "{name}"}, {"moved-into": "project"}], "audit": "changes"})
        );
        assert_eq!(DELETE_SERVICE.scope[0].path_parameter(), Some("name"));
        assert_eq!(CREATE_SERVICE.scope[0].path_parameter(), None);
    }

    #[test]
    fn a_project_role_without_a_scope_or_a_scope_without_one_is_refused() {
        for (bad, why) in [
            (
                serde_json::json!({"role": "project-operator"}),
                "needs a scope",
            ),
            (
                serde_json::json!({"role": "operator", "project": [{"service": "{name}"}]}),
                "a scope is for an operation in a project",
            ),
            (
                serde_json::json!({"role": "project-operator", "project": [{"owner": "x"}]}),
                "unknown scope",
            ),
            (serde_json::json!({"role": "operatr"}), "unknown role"),
            (
                serde_json::json!({"role": "viewer", "audit": "sometimes"}),
                "unknown variant",
            ),
        ] {
            let e = serde_json::from_value::<Declaration>(bad.clone())
                .expect_err("refused")
                .to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn reads_are_audited_only_when_declared_so() {
        assert!(!Declaration::VIEW.audited(false));
        assert!(Declaration::VIEW.audited(true));
        let secret = Declaration {
            audit: Audit::Always,
            ..Declaration::VIEW
        };
        assert!(secret.audited(false));
    }
}
