//! Who may do what: roles, operators' accounts, API tokens and the audit log, as the API and
//! the console show them. Passwords, token values and hashes never appear in these types.

use crate::inventory::{ParseEnumError, text_enum};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

text_enum!(
    /// What a caller may do. Each role can do everything the one before it can.
    Role, "role" {
        /// Reads everything except secret values.
        Viewer => "viewer",
        /// Also task definitions, services, scale, deploy, placement preview, drain and activate.
        Operator => "operator",
        /// Also pools, users, API tokens, hosts (revoke, delete) and the join token.
        Admin => "admin",
    }
);

text_enum!(
    /// A role given in a project: admins are admins in every project.
    ProjectRole, "project role" {
        /// Reads (as every signed-in user does).
        Viewer => "viewer",
        /// Also the project's services: create, scale, deploy, delete.
        Operator => "operator",
    }
);

impl From<ProjectRole> for Role {
    fn from(r: ProjectRole) -> Role {
        match r {
            ProjectRole::Viewer => Role::Viewer,
            ProjectRole::Operator => Role::Operator,
        }
    }
}

impl Default for Role {
    /// The least a new user or token gets unless told otherwise.
    fn default() -> Self {
        Role::Viewer
    }
}

impl Role {
    /// Whether this role may do what `needed` may.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

/// The role an operation needs from its caller: part of its one declaration
/// ([`crate::operations::Declaration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: `/healthz`, the OpenAPI document, signing in.
    Public,
    /// An agent: the handler checks the join token or the agent token itself.
    Agent,
    /// A signed-in user or an API token with at least this role.
    Role(Role),
    /// At least this role in the project the operation acts on, found where its declaration's
    /// scope says ([`crate::operations::Scope`]) and checked by the layer
    /// ([`Caller::role_in`]) before the handler runs.
    InProject(Role),
}

impl Access {
    pub const VIEW: Access = Access::Role(Role::Viewer);
    pub const OPERATE: Access = Access::Role(Role::Operator);
    pub const ADMIN: Access = Access::Role(Role::Admin);
    pub const OPERATE_IN_PROJECT: Access = Access::InProject(Role::Operator);

    /// The role a caller needs; `None` when no signed-in caller is needed (anyone, or an
    /// agent, whose token its handlers check).
    pub fn role(self) -> Option<Role> {
        match self {
            Access::Role(r) | Access::InProject(r) => Some(r),
            Access::Public | Access::Agent => None,
        }
    }

    /// As the OpenAPI document's `x-access` names it (its `role`): `none`, `agent`, a role, or
    /// `project-operator` (operator in the project acted on).
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Public => "none",
            Access::Agent => "agent",
            Access::Role(r) => r.as_str(),
            Access::InProject(Role::Viewer) => "project-viewer",
            Access::InProject(Role::Operator) => "project-operator",
            Access::InProject(Role::Admin) => "admin",
        }
    }

    /// The inverse of [`Access::as_str`].
    pub fn parse(s: &str) -> Option<Access> {
        match s {
            "none" => Some(Access::Public),
            "agent" => Some(Access::Agent),
            "project-viewer" => Some(Access::InProject(Role::Viewer)),
            "project-operator" => Some(Access::InProject(Role::Operator)),
            role => role.parse().ok().map(Access::Role),
        }
    }
}

/// An operator's account.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    pub username: String,
    pub role: Role,
    pub disabled: bool,
    pub created_at: Timestamp,
}

/// An API token as lists show it: never its value.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiTokenInfo {
    pub id: String,
    pub name: String,
    pub role: Role,
    /// The project it is scoped to: it acts only there, with `role` (and reads as a
    /// viewer elsewhere). `None`: the whole fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub created_by: String,
    pub created_at: Timestamp,
    /// `None`: does not expire.
    pub expires_at: Option<Timestamp>,
}

/// A token just made: the only time its value is shown.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewApiToken {
    #[serde(flatten)]
    pub info: ApiTokenInfo,
    /// Send as `Authorization: Bearer <token>`; shown once, only its hash is kept.
    pub token: String,
}

/// How a caller proved who it is.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallerKind {
    /// A console session (cookie): its mutations must come from the console's own origin.
    Session,
    /// `Authorization: Bearer <API token>`.
    Token,
}

/// Who is calling, once authenticated.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// The user, or the token's name.
    pub name: String,
    /// For a token, the user who made it.
    pub on_behalf_of: Option<String>,
    pub kind: CallerKind,
    /// Its role fleet-wide (for a token scoped to a project: `viewer`).
    pub role: Role,
    /// For a token, its id (what `DELETE /api/v1/tokens/{id}` names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// Roles given in projects, above the fleet-wide one (for a token scoped to a project:
    /// its role there).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub projects: BTreeMap<String, Role>,
    /// For a token scoped to a project: that project, the only one it acts in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

impl Caller {
    /// How the audit log names the caller: `user alice`, `token ci (by alice)`.
    pub fn actor(&self) -> String {
        match (&self.kind, &self.on_behalf_of) {
            (CallerKind::Token, Some(by)) => format!("token {} (by {by})", self.name),
            (CallerKind::Token, None) => format!("token {}", self.name),
            (CallerKind::Session, _) => format!("user {}", self.name),
        }
    }

    /// Its role in `project`: the higher of its fleet-wide role and the role it was given
    /// there; a token scoped to another project has none. An admin is admin everywhere.
    pub fn role_in(&self, project: &str) -> Option<Role> {
        if self.project.as_deref().is_some_and(|p| p != project) {
            return None;
        }
        let given = self.projects.get(project).copied();
        Some(given.map_or(self.role, |g| g.max(self.role)))
    }

    /// Whether it was given `role` (or more) in `project` itself, or is an admin: what
    /// putting a service into a project needs (its quotas are that project's).
    pub fn given_in(&self, project: &str, role: Role) -> bool {
        self.role == Role::Admin
            || (self.project.as_deref().is_none_or(|p| p == project)
                && self.projects.get(project).is_some_and(|g| g.allows(role)))
    }

    /// Its highest role anywhere (fleet-wide or in some project).
    pub fn best_role(&self) -> Role {
        self.projects.values().copied().fold(self.role, Role::max)
    }
}

/// One accepted mutation.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub id: i64,
    pub at: Timestamp,
    pub actor: String,
    /// `POST /api/v1/services`, `server function create_service`, `sign in`.
    pub action: String,
    pub target: Option<String>,
    pub address: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_ordered_and_parse() {
        assert!(Role::Admin.allows(Role::Operator));
        assert!(Role::Operator.allows(Role::Viewer));
        assert!(!Role::Viewer.allows(Role::Operator));
        assert!(!Role::Operator.allows(Role::Admin));
        for &r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>().expect("round trip"), r);
        }
        for a in [
            Access::Public,
            Access::Agent,
            Access::VIEW,
            Access::OPERATE,
            Access::ADMIN,
            Access::OPERATE_IN_PROJECT,
        ] {
            assert_eq!(Access::parse(a.as_str()), Some(a));
        }
        assert_eq!(Access::parse("operatr"), None);
        let err = "root".parse::<Role>().expect_err("not a role");
        assert!(err.to_string().contains("viewer operator admin"), "{err}");
    }

    #[test]
    fn roles_in_projects_raise_the_fleet_role_and_scoped_tokens_stay_in_theirs() {
        let viewer = Caller {
            name: "rita".into(),
            on_behalf_of: None,
            kind: CallerKind::Session,
            role: Role::Viewer,
            token_id: None,
            projects: [("research".to_owned(), Role::Operator)].into(),
            project: None,
        };
        assert_eq!(viewer.role_in("research"), Some(Role::Operator));
        assert_eq!(viewer.role_in("default"), Some(Role::Viewer));
        assert!(viewer.given_in("research", Role::Operator));
        assert!(!viewer.given_in("default", Role::Operator));
        assert_eq!(viewer.best_role(), Role::Operator);
        let operator = Caller {
            role: Role::Operator,
            projects: BTreeMap::new(),
            ..viewer.clone()
        };
        assert_eq!(operator.role_in("research"), Some(Role::Operator));
        assert!(
            !operator.given_in("research", Role::Operator),
            "a fleet operator was given nothing in research"
        );
        let scoped = Caller {
            kind: CallerKind::Token,
            project: Some("research".into()),
            ..viewer.clone()
        };
        assert_eq!(scoped.role_in("research"), Some(Role::Operator));
        assert_eq!(scoped.role_in("default"), None, "acts in its project only");
        assert!(!scoped.given_in("default", Role::Viewer));
        let admin = Caller {
            role: Role::Admin,
            ..operator
        };
        assert!(admin.given_in("anything", Role::Operator));
    }

    #[test]
    fn actors_name_the_user_behind_a_token() {
        let c = Caller {
            name: "ci".into(),
            on_behalf_of: Some("alice".into()),
            kind: CallerKind::Token,
            role: Role::Operator,
            token_id: None,
            projects: Default::default(),
            project: None,
        };
        assert_eq!(c.actor(), "token ci (by alice)");
    }
}

/// `POST /api/v1/join-tokens`: a join token scoped to what one rollout needs.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinTokenInput {
    /// What it is for (shown in lists).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 200))]
    pub description: String,
    /// The one pool hosts may register in with it; any pool when absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_name))]
    pub pool: Option<String>,
    /// A revoked host it rejoins (under its old id); nothing else registers with it.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_name))]
    pub host: Option<String>,
    /// Seconds until it expires (default one day, at most 30 days).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 60, maximum = 2_592_000))]
    pub expires_in_secs: Option<u64>,
    /// How many registrations it allows (default 1, at most 10,000).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10_000))]
    pub uses: Option<u32>,
    /// Hosts it registers are admitted even where the pool holds new hosts for approval.
    #[serde(default)]
    pub preapproved: bool,
}

/// A join token as lists show it: never its value.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinTokenInfo {
    pub id: String,
    pub description: String,
    pub pool: Option<String>,
    pub host: Option<String>,
    pub expires_at: Timestamp,
    /// Registrations it still allows.
    pub uses_left: u32,
    /// Registrations made with it.
    pub uses: u32,
    pub preapproved: bool,
    pub created_by: String,
    pub created_at: Timestamp,
}

/// A join token just minted: the only time its value is shown.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewJoinToken {
    #[serde(flatten)]
    pub info: JoinTokenInfo,
    /// Give it to the agent in a file (`--join-token-file`) or `TESSERA_AGENT_JOIN_TOKEN`,
    /// never on its command line; shown once, only its hash is kept.
    pub token: String,
}
