//! JSON Schemas for the API's bodies (feature `openapi`): the rules the validators enforce,
//! written once more as schemas so schema-driven clients and fuzzers know them. Every
//! pattern and bound here comes from the constant the validator itself uses; the server's
//! tests check that what a schema allows, the validator accepts.
//!
//! Rules that span several fields or items (container names unique within a task, a
//! variable either plain or secret, a task's GPUs of one kind) cannot be said in JSON
//! Schema; the descriptions name them.

use crate::ids::{GpuUuid, HostId, PoolName};
use crate::limits::task_definition::{MAX_CONTAINERS, MAX_GPUS, MAX_MEMORY_MIB, MAX_SECRET_BYTES};
use crate::service::{DeploymentConfig, TaskDefRef};
use crate::taskdef::{ECS_UNCHANGED_SECRET, FAMILY_PATTERN, RESERVED_ENV, Secret};
use crate::units::Percent;
use serde_json::{Value, json};
use std::borrow::Cow;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::Schema;
use utoipa::{PartialSchema, ToSchema};

pub mod fields;
pub use fields::*;

macro_rules! string_schema {
    ($ty:ty, $name:literal, $schema:expr) => {
        impl PartialSchema for $ty {
            fn schema() -> RefOr<Schema> {
                RefOr::T($schema)
            }
        }
        impl ToSchema for $ty {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    };
}

string_schema!(PoolName, "PoolName", name());
string_schema!(HostId, "HostId", name());
string_schema!(
    GpuUuid,
    "GpuUuid",
    from_json(
        json!({"type": "string", "pattern": r"\S", "description": "as NVML reports it, e.g. GPU-8f5c..."})
    )
);
string_schema!(TaskDefRef, "TaskDefRef", task_def_ref());
string_schema!(
    Percent,
    "Percent",
    from_json(json!({"type": "integer", "minimum": 0, "maximum": 100}))
);
string_schema!(
    Secret,
    "Secret",
    from_json(json!({
        "description": "write-only: the value (a string) on input; shown as {\"set\": true}, which sent back keeps the value the family's previous revision has",
        "oneOf": [
            {"type": "string", "maxLength": MAX_SECRET_BYTES},
            {"type": "object", "required": ["set"], "additionalProperties": false, "properties": {"set": {"type": "boolean", "enum": [true]}}}
        ]
    }))
);
string_schema!(
    DeploymentConfig,
    "DeploymentConfig",
    from_json(json!({
        "description": "How a new revision replaces the old one. With minimum_healthy_percent 100, maximum_percent must exceed 100.",
        "allOf": [
            {
                "type": "object",
                "required": ["minimum_healthy_percent", "maximum_percent"],
                "additionalProperties": false,
                "properties": {
                    "minimum_healthy_percent": {"type": "integer", "minimum": 0, "maximum": 100, "description": "running tasks never drop below this share of the desired count"},
                    "maximum_percent": {"type": "integer", "minimum": 100, "maximum": 200, "description": "live tasks never exceed this share of the desired count"}
                }
            },
            {
                "anyOf": [
                    {"type": "object", "properties": {"minimum_healthy_percent": {"type": "integer", "maximum": 99}}},
                    {"type": "object", "properties": {"maximum_percent": {"type": "integer", "minimum": 101}}}
                ]
            }
        ]
    }))
);

// By hand: an alarm has exactly one threshold (`above` or `below`), which the derive
// cannot say. utoipa keeps `oneOf` only inside `allOf` (see DeploymentConfig).
string_schema!(
    crate::work::Alarm,
    "Alarm",
    from_json(json!({
        "description": "Fires when `metric` stays above `above` (or below `below`) for `for_secs`. Exactly one threshold, a number of at least 0 (two thresholds: two alarms).",
        "allOf": [
            {
                "type": "object",
                "additionalProperties": false,
                "required": ["metric"],
                "properties": {
                    "metric": {"type": "string", "enum": [
                        crate::work::AlarmMetric::LatencyP99Ms.as_str(),
                        crate::work::AlarmMetric::ErrorRate.as_str(),
                        crate::work::AlarmMetric::CompletedPerSec.as_str(),
                    ]},
                    "above": {"type": ["number", "null"], "minimum": 0},
                    "below": {"type": ["number", "null"], "minimum": 0},
                    "for_secs": {"type": "integer", "default": 30, "minimum": 0, "maximum": crate::limits::ALARM_FOR_MAX_SECS}
                }
            },
            {
                "oneOf": [
                    {"type": "object", "required": ["above"], "properties": {"above": {"type": "number"}}},
                    {"type": "object", "required": ["below"], "properties": {"below": {"type": "number"}}}
                ]
            }
        ]
    }))
);

string_schema!(
    crate::api::ServicePatch,
    "ServicePatch",
    from_json(json!({
        "type": "object",
        "description": "Scale (desired_count), deploy a new revision (task_definition), or change how its next tasks are placed and rolled out: at least one field; what is left out stays. The pool never changes.",
        "minProperties": 1,
        "additionalProperties": false,
        "properties": {
            "desired_count": {"type": "integer", "minimum": 0, "maximum": crate::limits::MAX_DESIRED},
            "task_definition": {"type": "string", "pattern": TASK_DEF_REF_PATTERN, "description": "family:revision; a new revision starts a rolling deployment"},
            "project": {"type": "string", "pattern": crate::ids::NAME_PATTERN, "maxLength": crate::ids::NAME_MAX, "description": "the project it belongs to from now on"},
            "priority": {"type": "string", "enum": crate::inventory::PriorityClass::ALL.iter().map(|p| json!(p.as_str())).collect::<Vec<_>>(), "description": "its priority class from now on"},
            "strategy": {
                "type": ["string", "null"],
                "enum": crate::PlacementPolicy::ALL.iter().map(|p| json!(p.as_str())).chain([Value::Null]).collect::<Vec<_>>(),
                "description": "the placement policy for its next placements; null: the pool's"
            },
            "constraints": {"$ref": "#/components/schemas/ServiceConstraints"},
            "deployment": {"$ref": "#/components/schemas/DeploymentConfig"},
            "stop_timeout_secs": {"type": "integer", "minimum": crate::limits::STOP_TIMEOUT_MIN_SECS, "maximum": crate::limits::STOP_TIMEOUT_MAX_SECS},
            "deregistration_delay_secs": {"type": "integer", "minimum": 0, "maximum": crate::limits::DEREGISTRATION_DELAY_MAX_SECS, "description": "how long a task stopped on purpose stays running out of the endpoint list before its stop signal"},
            "slo": {"oneOf": [{"$ref": "#/components/schemas/Slo"}, {"type": "null"}], "description": "its latency target; null removes it"},
            "alarms": {"type": "array", "maxItems": 20, "items": {"$ref": "#/components/schemas/Alarm"}, "description": "replaces every alarm"},
            "bake_secs": {"type": "integer", "minimum": 0, "maximum": 86400},
            "autoscaling": {"oneOf": [{"$ref": "#/components/schemas/Autoscaling"}, {"type": "null"}], "description": "target tracking; null turns it off"}
        }
    }))
);

/// An environment variable's name that a task may set.
fn env_name() -> Value {
    json!({
        "type": "string",
        "pattern": format!("^(?!({})$)[A-Za-z_][A-Za-z0-9_]*$", RESERVED_ENV.join("|")),
        "description": format!("letters, digits and '_', not starting with a digit; not one the agent sets ({})", RESERVED_ENV.join(", ")),
    })
}

fn whole(min: u64, max: u64) -> Value {
    json!({"type": "integer", "minimum": min, "maximum": max})
}

fn family() -> Value {
    json!({"type": "string", "pattern": FAMILY_PATTERN, "description": "1 to 255 letters, digits, '-' or '_'"})
}

fn command() -> Value {
    json!({
        "type": "array",
        "minItems": 1,
        "prefixItems": [{"type": "string", "pattern": r"\S", "description": "the program"}],
        "items": {"type": "string"},
        "description": "argv: the program, then its arguments"
    })
}

/// A container's health check: a command or an HTTP GET, with the same timings.
fn health_check() -> Value {
    let timings = |first: (&str, Value)| {
        let mut props = json!({
            "interval_secs": whole(5, 300),
            "timeout_secs": whole(2, 60),
            "retries": whole(1, 10),
            "start_period_secs": whole(0, 300)
        });
        props[first.0] = first.1;
        props
    };
    let command = json!({"oneOf": [
        {"type": "array", "minItems": 2, "prefixItems": [{"type": "string", "enum": ["CMD"]}, {"type": "string", "pattern": "\\S"}], "items": {"type": "string"}},
        {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [{"type": "string", "enum": ["CMD-SHELL"]}, {"type": "string", "pattern": "\\S"}], "items": {"type": "string"}}
    ]});
    let http = json!({"type": "object", "required": ["port"], "additionalProperties": false, "properties": {
        "port": family(), "path": {"type": "string", "pattern": "^/\\S*$", "maxLength": 1024}
    }});
    json!({
        "description": "a command ([\"CMD\", program, args…] or [\"CMD-SHELL\", \"…\"]) or an HTTP GET on one of the container's ports (by name; 2xx and 3xx pass)",
        "oneOf": [
            {"type": "object", "required": ["command"], "additionalProperties": false, "properties": timings(("command", command))},
            {"type": "object", "required": ["http"], "additionalProperties": false, "properties": timings(("http", http))}
        ]
    })
}

// The ECS GPU count's pattern spells 1 to MAX_GPUS as 1-9 and 10-1x.
const _: () = assert!(MAX_GPUS >= 10 && MAX_GPUS <= 19);

/// A task definition's `work` (either shape).
fn work() -> Value {
    let metric =
        json!({"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$", "maxLength": 200});
    json!({
        "type": "object",
        "required": ["port", "completed"],
        "additionalProperties": false,
        "description": "Where the task's application publishes the work it completes, in the Prometheus text format: the agent scrapes it every sync (2 s timeout, 4 MiB cap)",
        "properties": {
            "port": {"type": "string", "description": "the name of one of the task's ports"},
            "path": {"type": "string", "pattern": "^/[!-~]*$", "maxLength": 256, "default": "/metrics", "description": "an absolute URL path of printable ASCII"},
            "completed": metric,
            "errors": metric,
            "latency": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$", "maxLength": 200, "description": "a histogram of latency in seconds (its _bucket series)"}
        }
    })
}

/// Every optional property of every object in `v` may also be null: the parsers read a
/// null as a field left out.
fn nullable_optionals(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.values_mut().for_each(nullable_optionals);
            let required: Vec<Value> = o
                .get("required")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let Some(Value::Object(props)) = o.get_mut("properties") else {
                return;
            };
            for (name, p) in props.iter_mut() {
                if !required.contains(&json!(name)) {
                    let description = p.get("description").cloned();
                    let mut wrapped = json!({"anyOf": [p.take(), {"type": "null"}]});
                    if let Some(d) = description {
                        wrapped["description"] = d;
                    }
                    *p = wrapped;
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(nullable_optionals),
        _ => {}
    }
}

/// Fields kept for ECS's shape: any object, stored and given back by `?format=ecs`.
fn ecs_fields() -> Value {
    json!({"type": "object", "description": "fields Tessera does not use, kept for ECS's shape: stored, and given back by ?format=ecs"})
}

/// `POST /api/v1/task-definitions` in Tessera's shape.
pub fn native_task_definition() -> Schema {
    let mut doc = json!({
        "type": "object",
        "required": ["family", "containers"],
        "additionalProperties": false,
        "properties": {
            "family": family(),
            "ecs": ecs_fields(),
            "work": work(),
            "containers": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_CONTAINERS,
                "description": "Names unique within the task; a variable is either in env or in secrets; the task's GPU containers use either whole GPUs (at most 16 in all) or MPS slots (compute caps adding up to at most 100 %), not both; port names and fixed host ports unique in the task, a container port once per container; a health check's http.port names a port of its container; depends_on names other containers of the task, without cycles, HEALTHY only on one with a health check; at least one container essential.",
                "items": {"description": "A program (command) run on the host, or an image run by the Docker engine (then command and entry_point are optional)", "allOf": [{"anyOf": [
                        {"type": "object", "required": ["command"], "properties": {"command": command()}},
                        {"type": "object", "required": ["image"], "properties": {"image": {"type": "string"}}},
                        {"type": "object", "required": ["entry_point"], "properties": {"entry_point": command()}}
                    ]}, {
                    "type": "object",
                    "required": ["name", "cpu_milli", "memory_mib"],
                    "additionalProperties": false,
                    "properties": {
                        "name": family(),
                        "image": {"type": "string", "pattern": r"\S", "maxLength": crate::limits::MAX_TEXT_CHARS, "description": "a container image; the Docker engine runs it (the host's agent must run containers)"},
                        "entry_point": {"type": "array", "items": {"type": "string"}, "description": "replaces the image's entry point"},
                        "command": {"type": "array", "items": {"type": "string"}, "description": "argv: the program, then its arguments; with an image, the arguments to its entry point"},
                        "ecs": ecs_fields(),
                        "env": {"type": "object", "propertyNames": env_name(), "additionalProperties": {"type": "string"}},
                        "secrets": {"type": "object", "propertyNames": env_name(), "additionalProperties": {"$ref": "#/components/schemas/Secret"}},
                        "cpu_milli": {"type": "integer", "minimum": 0, "maximum": 1_000_000, "description": "CPU reserved, in thousandths of a core; 0 reserves none (as an ECS container without cpu)"},
                        "memory_mib": whole(1, MAX_MEMORY_MIB),
                        "ports": {
                            "type": "array",
                            "description": "Names and (container port, protocol) unique in the task; without host_port the agent picks a dynamic one, which a process gets as PORT (its first port) and TESSERA_PORT_<NAME>",
                            "items": {"type": "object", "required": ["container_port"], "additionalProperties": false, "properties": {
                                "name": family(),
                                "container_port": whole(1, 65535),
                                "host_port": whole(1, 65535),
                                "protocol": {"type": "string", "enum": ["tcp", "udp"]}
                            }}
                        },
                        "health_check": health_check(),
                        "essential": {"type": "boolean", "description": "whether its exit ends the task (default true); at least one container is essential"},
                        "depends_on": {
                            "type": "array",
                            "items": {"type": "object", "required": ["container", "condition"], "additionalProperties": false, "properties": {
                                "container": family(),
                                "condition": {"type": "string", "enum": ["START", "COMPLETE", "SUCCESS", "HEALTHY"]}
                            }}
                        },
                        "gpu": {
                            "oneOf": [
                                {"type": "object", "required": ["gpus"], "additionalProperties": false, "properties": {"gpus": whole(1, MAX_GPUS)}},
                                {"type": "object", "required": ["mps"], "additionalProperties": false, "properties": {"mps": {
                                    "type": "object", "required": ["memory_mib"], "additionalProperties": false,
                                    "properties": {"memory_mib": whole(1, MAX_MEMORY_MIB), "max_compute_percent": whole(1, 100)}
                                }}}
                            ]
                        }
                    }
                }]}
            }
        }
    });
    nullable_optionals(&mut doc);
    from_json(doc)
}

/// The same in ECS's shape (`containerDefinitions`; fields Tessera does not use are
/// ignored); also what `?format=ecs` answers.
pub fn ecs_task_definition() -> Schema {
    let variable = json!({"type": "object", "required": ["name", "value"], "properties": {"name": env_name(), "value": {"type": "string"}}});
    let secret = json!({"type": "object", "required": ["name", "valueFrom"], "properties": {
        "name": env_name(),
        "valueFrom": {"type": "string", "pattern": "^(?!arn:)", "maxLength": MAX_SECRET_BYTES, "description": format!("the value itself (Tessera reads no AWS ARN), or {ECS_UNCHANGED_SECRET:?} to keep the previous revision's")}
    }});
    let gpu = json!({"oneOf": [
        {"type": "object", "required": ["type", "value"], "additionalProperties": false, "properties": {
            "type": {"type": "string", "enum": ["GPU"]},
            "value": {"type": "string", "pattern": format!("^([1-9]|1[0-{}])$", MAX_GPUS - 10), "description": format!("whole GPUs, 1 to {MAX_GPUS}")}
        }},
        {"type": "object", "required": ["type", "sharingStrategy"], "additionalProperties": false, "properties": {
            "type": {"type": "string", "enum": ["GPU"]},
            "value": {"type": "string", "enum": ["1"], "description": "may be left out: a shared slot is on one GPU"},
            "sharingStrategy": {"type": "object", "required": ["nvidiaMps"], "properties": {"nvidiaMps": {
                "type": "object", "required": ["memory"],
                "properties": {"memory": whole(1, MAX_MEMORY_MIB), "maxComputePercent": whole(1, 100)}
            }}}
        }}
    ]});
    let mut doc = json!({
        "type": "object",
        "required": ["family", "containerDefinitions"],
        "properties": {
            "family": family(),
            "work": work(),
            "containerDefinitions": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_CONTAINERS,
                "description": "The same cross-container rules as Tessera's shape.",
                "items": {"description": "A program (command) run on the host, or an image run by the Docker engine (then command and entryPoint are optional). Memory: memory or memoryReservation here, or the task's memory (ECS's rule).", "allOf": [{"anyOf": [
                        {"type": "object", "required": ["command"], "properties": {"command": command()}},
                        {"type": "object", "required": ["image"], "properties": {"image": {"type": "string"}}},
                        {"type": "object", "required": ["entryPoint"], "properties": {"entryPoint": command()}}
                    ]}, {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": family(),
                        "image": {"type": "string", "pattern": r"\S", "maxLength": crate::limits::MAX_TEXT_CHARS},
                        "entryPoint": {"type": "array", "items": {"type": "string"}},
                        "command": {"type": "array", "items": {"type": "string"}},
                        "cpu": {"type": "integer", "minimum": 0, "maximum": 1_024_000, "description": "1/1024 vCPU; 0 or none reserves none"},
                        "memory": whole(1, MAX_MEMORY_MIB),
                        "memoryReservation": whole(1, MAX_MEMORY_MIB),
                        "environment": {"type": "array", "items": variable},
                        "secrets": {"type": "array", "items": secret},
                        "resourceRequirements": {
                            "type": "array",
                            "maxItems": 1,
                            "items": gpu,
                        }
                    }
                }]}
            }
        }
    });
    nullable_optionals(&mut doc);
    from_json(doc)
}

/// The name of a service (path parameter).
pub struct ServiceName;
string_schema!(ServiceName, "ServiceName", name());
/// A project's name (a path segment).
pub struct ProjectName;
string_schema!(ProjectName, "ProjectName", name());
/// The name of an operator's account (path parameter).
pub struct Username;
string_schema!(Username, "Username", name());
/// A family, or one revision of it as `family:revision` (path parameter).
pub struct FamilyOrRef;
string_schema!(
    FamilyOrRef,
    "FamilyOrRef",
    from_json(
        json!({"type": "string", "pattern": FAMILY_OR_REF_PATTERN, "description": "a family (its revisions), or family:revision (that revision)"})
    )
);
/// A consolidation plan's id (path parameter).
pub struct PlanId;
string_schema!(
    PlanId,
    "PlanId",
    from_json(
        json!({"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", "description": "as the plan list shows it"})
    )
);
/// A task's id (path parameter).
pub struct TaskId;
string_schema!(
    TaskId,
    "TaskId",
    from_json(
        json!({"type": "string", "pattern": "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", "description": "as the task list shows it"})
    )
);
/// An API token's id (path parameter).
pub struct TokenId;
string_schema!(
    TokenId,
    "TokenId",
    from_json(
        json!({"type": "string", "pattern": "^[0-9a-f]{12}$", "description": "as the token list shows it"})
    )
);

/// A join token's id, as `GET /api/v1/join-tokens` lists it.
pub struct JoinTokenId;
string_schema!(
    JoinTokenId,
    "JoinTokenId",
    from_json(
        json!({"type": "string", "pattern": "^[0-9a-f]{12}$", "description": "as the join token list shows it"})
    )
);
