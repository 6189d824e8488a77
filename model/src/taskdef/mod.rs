//! Task definitions: what a task runs and what it needs, their validation (every error
//! names its field path and rule), and the ECS-style JSON shape.
//!
//! - `spec`: the types; `rules`: limits and checks shared by both shapes;
//!   `native`: Tessera's JSON; `ecs`: ECS's JSON, both ways; `serving`: ports, health
//!   checks and container dependencies in either shape.

use crate::units::{ComputeMilli, MiB, MilliCpu, Percent};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

mod ecs;
mod native;
mod rules;
mod serving;
mod spec;
#[cfg(test)]
mod tests;

pub use crate::error::{FieldError, ValidationErrors};
pub use ecs::to_ecs_json;
pub use rules::{FAMILY_PATTERN, MAX_CONTAINERS, MAX_GPUS, MAX_MEMORY_MIB};
pub use spec::*;

use ecs::parse_ecs;
use native::parse_native;
use rules::{Checker, check_spec};

/// Parses and validates a task definition in Tessera's JSON shape or ECS's (recognised by
/// `containerDefinitions`). Returns every error found, each naming its field.
pub fn parse_task_definition(input: &Value) -> Result<TaskDefinitionSpec, ValidationErrors> {
    let mut c = Checker { errors: Vec::new() };
    let spec = match c.object(input, "(document)") {
        Some(o) if o.contains_key("containerDefinitions") => parse_ecs(&mut c, o),
        Some(o) => parse_native(&mut c, o),
        None => None,
    };
    if let Some(spec) = &spec {
        check_spec(&mut c, spec);
    }
    match spec {
        Some(spec) if c.errors.is_empty() => Ok(spec),
        _ => Err(ValidationErrors { errors: c.errors }),
    }
}
