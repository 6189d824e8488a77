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
mod security;
mod serving;
mod spec;
#[cfg(test)]
mod tests;

pub use crate::error::{FieldError, ValidationErrors};
pub use ecs::to_ecs_json;
pub use rules::FAMILY_PATTERN;
pub(crate) use rules::kind;
pub use rules::valid_name as valid_container_name;
pub use security::{CAPABILITIES, ContainerSecurity, UNPRIVILEGED_CAPABILITIES};
pub use spec::*;

use ecs::parse_ecs;
use native::parse_native;
use rules::{Checker, check_spec};

/// In Tessera's shape the modelled fields win: an `ecs` copy of ports, the health check,
/// `essential` or `dependsOn` that says otherwise (kept from an ECS import, then edited) is
/// dropped, so what is stored never says two things.
fn drop_stale_ecs(spec: &mut TaskDefinitionSpec) {
    for ct in &mut spec.containers {
        for key in serving::stale_ecs_keys(ct) {
            ct.ecs.remove(key);
        }
    }
}

/// A revision stored before ports, health checks, `essential` and `dependsOn` were
/// modelled keeps them only in its containers' `ecs` objects: read them from there, so
/// its tasks are served and `?format=ecs` gives them back. What does not parse stays as it
/// is (it was accepted when registered).
pub fn upgrade_stored(spec: &mut TaskDefinitionSpec) {
    use serving::{Shape, parse_depends_on, parse_essential, parse_health_check, parse_ports};
    for ct in &mut spec.containers {
        let mut c = Checker { errors: Vec::new() };
        if ct.ports.is_empty()
            && let Some(ports) = parse_ports(&mut c, &ct.ecs, "", Shape::Ecs)
        {
            ct.ports = ports;
        }
        if ct.health_check.is_none()
            && let Some(h) = parse_health_check(&mut c, &ct.ecs, "", Shape::Ecs)
        {
            ct.health_check = h;
        }
        if ct.essential
            && let Some(e) = parse_essential(&mut c, &ct.ecs, "")
        {
            ct.essential = e;
        }
        if ct.depends_on.is_empty()
            && let Some(d) = parse_depends_on(&mut c, &ct.ecs, "", Shape::Ecs)
        {
            ct.depends_on = d;
        }
    }
}

/// Parses and validates a task definition in Tessera's JSON shape or ECS's (recognised by
/// `containerDefinitions`). Returns every error found, each naming its field.
pub fn parse_task_definition(input: &Value) -> Result<TaskDefinitionSpec, ValidationErrors> {
    let mut c = Checker { errors: Vec::new() };
    let spec = match c.object(input, "(document)") {
        Some(o) if o.contains_key("containerDefinitions") => parse_ecs(&mut c, o),
        Some(o) => parse_native(&mut c, o).map(|mut s| {
            drop_stale_ecs(&mut s);
            s
        }),
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
