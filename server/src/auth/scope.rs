//! The project an operation acts on, found where its declaration's scope says
//! ([`tessera_model::operations::Scope`]), and the caller's role there, checked before the
//! handler or server function runs. Handlers never check a project's role themselves.
//!
//! A request's arguments are read as the handler reads them: a REST operation's path
//! parameters (percent-decoded, as `Path` does) and its JSON body (as `Json` does, where
//! `strict` refuses what the schema does not say); a server function's by its own decoder
//! (`tessera_app::access::decode`), whatever the request's content type claims. What the
//! layer cannot read as the operation will, it refuses.

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
    /// A server function's arguments, as its own decoder read them (a JSON object of its
    /// arguments by name).
    pub(super) fn server_fn(
        args: serde_json::Value,
        body: Option<&'static str>,
    ) -> Result<Arguments, ApiError> {
        match args {
            serde_json::Value::Object(args) => Ok(Arguments::ServerFn { args, body }),
            other => Err(ApiError::BadRequest(format!(
                "a server function's arguments are an object, not {other}"
            ))),
        }
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
                // The function's body argument is a struct, written back whole: anything
                // else means the declaration names an argument the function lacks.
                Some(b) => match args.get(*b) {
                    Some(serde_json::Value::Object(inner)) => inner.get(named),
                    _ => {
                        return Err(ApiError::BadRequest(format!(
                            "the server function has no argument {b} holding {named}"
                        )));
                    }
                },
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
            Scope::Task(argument) => {
                let id = given.ok_or_else(|| {
                    ApiError::BadRequest(format!("{argument} must name the task acted on"))
                })?;
                let project = control.streams().project_of_task(&id).await?;
                tessera_model::project::may_act_in(caller, &project, needed)
                    .map_err(ApiError::Forbidden)?;
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
    use serde_json::json;
    use std::borrow::Cow;

    fn arg(args: &Arguments, scope: Scope) -> Result<Option<String>, ApiError> {
        args.get(&scope)
    }

    #[test]
    fn a_server_functions_arguments_are_read_by_name_and_its_body_by_field() {
        let args = Arguments::server_fn(
            json!({"name": "web", "patch": {"project": "research", "desired_count": 2}}),
            Some("patch"),
        )
        .expect("an object");
        let service = || Scope::Service(Cow::Borrowed("{name}"));
        let moved = || Scope::MovedInto(Cow::Borrowed("project"));
        assert_eq!(arg(&args, service()).expect("read").as_deref(), Some("web"));
        assert_eq!(
            arg(&args, moved()).expect("read").as_deref(),
            Some("research")
        );
        let args = Arguments::server_fn(
            json!({"name": "web", "patch": {"project": null}}),
            Some("patch"),
        )
        .expect("an object");
        assert_eq!(arg(&args, moved()).expect("read"), None, "null is absent");
    }

    #[test]
    fn what_the_function_could_read_otherwise_is_refused() {
        let into = || Scope::Into(Cow::Borrowed("project"));
        // A body argument that is not a struct, or that the function lacks (a declaration
        // naming the wrong one), is never taken for "no project given".
        for args in [
            json!({"input": ["x", "llm:1", "gpu", "research"]}),
            json!({"inptu": {}}),
            json!({}),
        ] {
            let args = Arguments::server_fn(args.clone(), Some("input")).expect("an object");
            assert!(arg(&args, into()).is_err());
        }
        assert!(Arguments::server_fn(json!([1]), None).is_err());
        let args = Arguments::server_fn(json!({"name": 7}), None).expect("an object");
        assert!(arg(&args, Scope::Service(Cow::Borrowed("{name}"))).is_err());
    }
}
