//! The project an operation acts on, found where its declaration's scope says
//! ([`tessera_model::operations::Scope`]), and the caller's role there, checked before the
//! handler or server function runs. Handlers never check a project's role themselves.
//!
//! A request's arguments are read as the handler reads them: a REST operation's path
//! parameters (percent-decoded) and its JSON body; a server function's arguments from its
//! JSON or form body. Where the two could disagree the request is refused: a body that is
//! not what the operation reads, a form field given twice.

use crate::error::ApiError;
use std::collections::HashMap;
use tessera_control::Control;
use tessera_model::auth::{Access, Caller};
use tessera_model::operations::{Declaration, Scope};
use tessera_model::service::DEFAULT_PROJECT;

/// What a request gives its operation, as a scope's arguments name them.
pub(super) enum Arguments {
    /// A REST operation: its path parameters and its body (`None`: no body read).
    Rest {
        path: HashMap<String, String>,
        body: Option<serde_json::Value>,
    },
    /// A console server function: its arguments, and the one that holds the body a REST
    /// twin would take.
    ServerFn {
        args: serde_json::Map<String, serde_json::Value>,
        body: Option<&'static str>,
    },
}

impl Arguments {
    /// A server function's arguments from its body: JSON (`input = Json`) or a form (its
    /// default encoding, nested fields as `patch[project]`).
    pub(super) fn server_fn(
        content_type: Option<&str>,
        bytes: &[u8],
        body: Option<&'static str>,
    ) -> Result<Arguments, ApiError> {
        let json = content_type.is_some_and(|c| c.starts_with("application/json"));
        let args = if json {
            match serde_json::from_slice::<serde_json::Value>(bytes) {
                Ok(serde_json::Value::Object(m)) => m,
                _ => {
                    return Err(ApiError::BadRequest(
                        "the server function's arguments must be a JSON object".into(),
                    ));
                }
            }
        } else {
            form_arguments(bytes)?
        };
        Ok(Arguments::ServerFn { args, body })
    }

    /// The argument a scope names: `Ok(None)` when it is absent (or `null`).
    fn get(&self, scope: &Scope) -> Result<Option<String>, ApiError> {
        let named = scope.argument();
        let value = match (self, scope.path_parameter()) {
            (Arguments::Rest { path, .. }, Some(p)) => {
                return Ok(path.get(p).cloned());
            }
            (Arguments::Rest { body, .. }, None) => body.as_ref().and_then(|b| b.get(named)),
            (Arguments::ServerFn { args, .. }, Some(p)) => args.get(p),
            (Arguments::ServerFn { args, body }, None) => match body {
                Some(b) => args.get(*b).and_then(|inner| inner.get(named)),
                None => args.get(named),
            },
        };
        match value {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(ApiError::BadRequest(format!(
                "{named} must be a string, got {other}"
            ))),
        }
    }
}

/// A form body as a server function's arguments: every value a string; a field given twice
/// is refused (which one the function would read is not this layer's guess).
fn form_arguments(bytes: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| ApiError::BadRequest("the form is not UTF-8".into()))?;
    let mut args = serde_json::Map::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = tessera_model::urlenc::decode(k);
        let value = serde_json::Value::String(tessera_model::urlenc::decode(v));
        // `patch[project]` is field `project` of argument `patch`.
        let slot = match key.split_once('[') {
            Some((outer, rest)) if rest.ends_with(']') && !rest[..rest.len() - 1].contains('[') => {
                let inner = args
                    .entry(outer.to_owned())
                    .or_insert_with(|| serde_json::Value::Object(Default::default()));
                let serde_json::Value::Object(inner) = inner else {
                    return Err(twice(outer));
                };
                inner
                    .insert(rest[..rest.len() - 1].to_owned(), value)
                    .map(|_| rest.to_owned())
            }
            _ => args.insert(key.clone(), value).map(|_| key.clone()),
        };
        if slot.is_some() {
            return Err(twice(&key));
        }
    }
    Ok(args)
}

fn twice(field: &str) -> ApiError {
    ApiError::BadRequest(format!("the form gives {field} more than once"))
}

/// Whether `caller` has what `declared` needs in every project its scope names in `args`.
pub(super) async fn check(
    control: &Control,
    caller: &Caller,
    declared: &Declaration,
    args: &Arguments,
) -> Result<(), ApiError> {
    let Access::InProject(needed) = declared.access else {
        return Ok(());
    };
    for scope in declared.scope.iter() {
        let given = args.get(scope)?;
        match scope {
            Scope::Service(argument) => {
                let name = given.ok_or_else(|| {
                    ApiError::BadRequest(format!("{argument} must name the service acted on"))
                })?;
                let project = control.projects().project_of_service(&name).await?;
                tessera_model::project::may_act_in(caller, &project, needed)
                    .map_err(ApiError::Forbidden)?;
            }
            Scope::Into(_) => {
                let project = given.as_deref().unwrap_or(DEFAULT_PROJECT);
                tessera_model::project::may_put_in(caller, project).map_err(ApiError::Forbidden)?;
            }
            Scope::MovedInto(_) => {
                if let Some(project) = given {
                    tessera_model::project::may_put_in(caller, &project)
                        .map_err(ApiError::Forbidden)?;
                }
            }
        }
    }
    Ok(())
}

/// Whether the scope reads the body (so the layer must read it before the handler).
pub(super) fn reads_body(declared: &Declaration) -> bool {
    declared.scope.iter().any(|s| s.path_parameter().is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn arg(args: &Arguments, scope: Scope) -> Option<String> {
        args.get(&scope).expect("readable")
    }

    #[test]
    fn server_function_arguments_are_read_as_the_function_reads_them() {
        let form = Arguments::server_fn(
            Some("application/x-www-form-urlencoded"),
            b"name=web%20api&patch%5Bproject%5D=research",
            Some("patch"),
        )
        .expect("a form");
        assert_eq!(
            arg(&form, Scope::Service(Cow::Borrowed("{name}"))).as_deref(),
            Some("web api")
        );
        assert_eq!(
            arg(&form, Scope::MovedInto(Cow::Borrowed("project"))).as_deref(),
            Some("research")
        );
        let json = Arguments::server_fn(
            Some("application/json"),
            br#"{"input":{"name":"web","project":null},"project":"decoy"}"#,
            Some("input"),
        )
        .expect("JSON");
        assert_eq!(arg(&json, Scope::Into(Cow::Borrowed("project"))), None);
        assert_eq!(
            arg(&json, Scope::Service(Cow::Borrowed("{name}"))),
            None,
            "the body argument's fields are not the function's arguments"
        );
    }

    #[test]
    fn arguments_the_function_could_read_otherwise_are_refused() {
        for body in [
            &b"name=a&name=b"[..],
            b"patch[project]=a&patch[project]=b",
            b"patch=x&patch[project]=a",
        ] {
            assert!(
                Arguments::server_fn(None, body, Some("patch")).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        assert!(Arguments::server_fn(Some("application/json"), b"[1]", None).is_err());
        let json =
            Arguments::server_fn(Some("application/json"), br#"{"name":7}"#, None).expect("JSON");
        assert!(json.get(&Scope::Service(Cow::Borrowed("{name}"))).is_err());
    }
}
