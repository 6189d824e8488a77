//! Tessera's own JSON shape (`family`, `containers`).

use super::rules::*;
use super::serving::*;
use super::*;
use crate::limits::MAX_TEXT_CHARS;
use crate::limits::task_definition::*;

pub(super) fn parse_native(c: &mut Checker, o: &Map<String, Value>) -> Option<TaskDefinitionSpec> {
    c.unknown_keys(o, &["family", "containers", "ecs", "work"], "");
    let family = c.family(o);
    let containers = match o.get("containers") {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| parse_native_container(c, v, &format!("containers[{i}]")))
            .collect::<Vec<_>>(),
        Some(v) => {
            c.err("containers", format!("must be an array, got {}", kind(v)));
            return None;
        }
        None => {
            c.err(
                "containers",
                "is required: a list of at least one container",
            );
            return None;
        }
    };
    let containers: Option<Vec<ContainerSpec>> = containers.into_iter().collect();
    let ecs = ecs_map(c, o, "ecs");
    let work = parse_work(c, o.get("work"));
    Some(TaskDefinitionSpec {
        family: family?,
        containers: containers?,
        ecs,
        work,
    })
}

/// An `ecs` object of fields kept for ECS's shape (any JSON object).
fn ecs_map(c: &mut Checker, o: &Map<String, Value>, field: &str) -> Map<String, Value> {
    match o.get("ecs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(v) => {
            c.err(field, format!("must be an object, got {}", kind(v)));
            Map::new()
        }
    }
}

/// An optional list of strings (argv), empty when absent.
pub(super) fn parse_argv(c: &mut Checker, v: Option<&Value>, field: &str) -> Vec<String> {
    match v {
        None | Some(Value::Null) => Vec::new(),
        some => parse_command(c, some, field).unwrap_or_default(),
    }
}

pub(super) fn parse_command(
    c: &mut Checker,
    v: Option<&Value>,
    field: &str,
) -> Option<Vec<String>> {
    match v {
        Some(Value::Array(items)) => {
            let mut argv = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match item.as_str() {
                    Some(s) => argv.push(s.to_owned()),
                    None => c.err(
                        format!("{field}[{i}]"),
                        format!("must be a string, got {}", kind(item)),
                    ),
                }
            }
            (argv.len() == items.len()).then_some(argv)
        }
        Some(v) => {
            c.err(
                field,
                format!("must be an array of strings (argv), got {}", kind(v)),
            );
            None
        }
        None => {
            c.err(
                field,
                "is required: the program and its arguments, e.g. [\"python\", \"serve.py\"]",
            );
            None
        }
    }
}

pub(super) fn parse_native_container(
    c: &mut Checker,
    v: &Value,
    prefix: &str,
) -> Option<ContainerSpec> {
    let o = c.object(v, prefix)?;
    c.unknown_keys(
        o,
        &[
            "name",
            "image",
            "entry_point",
            "command",
            "env",
            "secrets",
            "cpu_milli",
            "memory_mib",
            "gpu",
            "ports",
            "health_check",
            "essential",
            "depends_on",
            "ecs",
        ],
        prefix,
    );
    let name = c.string(o, "name", &join(prefix, "name"));
    let image = optional_string(c, o, "image", &join(prefix, "image"));
    let entry_point = parse_argv(c, o.get("entry_point"), &join(prefix, "entry_point"));
    // With an image or an entry point, the command may be left out.
    let command = if image.is_some() || !entry_point.is_empty() {
        Some(parse_argv(c, o.get("command"), &join(prefix, "command")))
    } else {
        parse_command(c, o.get("command"), &join(prefix, "command"))
    };
    let mut env = BTreeMap::new();
    match o.get("env") {
        None | Some(Value::Null) => {}
        Some(Value::Object(vars)) => {
            for (k, v) in vars {
                match v.as_str() {
                    Some(s) => {
                        env.insert(k.clone(), s.to_owned());
                    }
                    None => c.err(
                        format!("{prefix}.env.{k}"),
                        format!("must be a string, got {}", kind(v)),
                    ),
                }
            }
        }
        Some(v) => c.err(
            join(prefix, "env"),
            format!("must be an object of names to strings, got {}", kind(v)),
        ),
    }
    let mut secrets = BTreeMap::new();
    match o.get("secrets") {
        None | Some(Value::Null) => {}
        Some(Value::Object(vars)) => {
            for (k, v) in vars {
                match Secret::deserialize(v) {
                    Ok(secret) => {
                        secrets.insert(k.clone(), secret);
                    }
                    Err(e) => c.err(format!("{prefix}.secrets.{k}"), e.to_string()),
                }
            }
        }
        Some(v) => c.err(
            join(prefix, "secrets"),
            format!(
                "must be an object of names to values (strings), got {}",
                kind(v)
            ),
        ),
    }
    // 0 reserves no CPU, as an ECS container without `cpu` does: both shapes follow one
    // rule, so every stored definition reads back in either.
    let cpu = c.number(
        o,
        "cpu_milli",
        &join(prefix, "cpu_milli"),
        0,
        1_000_000,
        true,
    );
    let memory = c.number(
        o,
        "memory_mib",
        &join(prefix, "memory_mib"),
        1,
        MAX_MEMORY_MIB,
        true,
    );
    let gpu = match o.get("gpu") {
        None | Some(Value::Null) => Some(None),
        Some(g) => parse_native_gpu(c, g, &join(prefix, "gpu")).map(Some),
    };
    let ports = parse_ports(c, o, prefix, Shape::Native);
    let health_check = parse_health_check(c, o, prefix, Shape::Native);
    let essential = parse_essential(c, o, prefix);
    let depends_on = parse_depends_on(c, o, prefix, Shape::Native);
    let ecs = ecs_map(c, o, &join(prefix, "ecs"));
    Some(ContainerSpec {
        name: name?,
        image,
        entry_point,
        command: command?,
        env,
        secrets,
        cpu_milli: MilliCpu(cpu?),
        memory_mib: MiB(memory?),
        gpu: gpu?,
        ports: ports?,
        health_check: health_check?,
        essential: essential?,
        depends_on: depends_on?,
        ecs,
    })
}

/// An optional non-empty string field.
pub(super) fn optional_string(
    c: &mut Checker,
    o: &Map<String, Value>,
    key: &str,
    field: &str,
) -> Option<String> {
    match o.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.trim().is_empty() && s.chars().count() <= MAX_TEXT_CHARS => {
            Some(s.clone())
        }
        Some(v) => {
            c.err(
                field,
                format!(
                    "must be a non-empty string of at most {MAX_TEXT_CHARS} characters, got {}",
                    kind(v)
                ),
            );
            None
        }
    }
}

pub(super) fn parse_native_gpu(c: &mut Checker, v: &Value, prefix: &str) -> Option<GpuRequirement> {
    let o = c.object(v, prefix)?;
    match (o.get("gpus"), o.get("mps")) {
        (Some(_), Some(_)) => {
            c.err(
                prefix,
                "give either gpus (whole GPUs) or mps (a shared slot), not both",
            );
            None
        }
        (Some(_), None) => {
            c.unknown_keys(o, &["gpus"], prefix);
            c.number(o, "gpus", &join(prefix, "gpus"), 1, MAX_GPUS, true)
                .map(|n| GpuRequirement::Gpus(n as u32))
        }
        (None, Some(m)) => {
            c.unknown_keys(o, &["mps"], prefix);
            let p = join(prefix, "mps");
            let m = c.object(m, &p)?;
            c.unknown_keys(m, &["memory_mib", "max_compute_percent"], &p);
            let memory = c.number(
                m,
                "memory_mib",
                &join(&p, "memory_mib"),
                1,
                MAX_MEMORY_MIB,
                true,
            );
            let compute = c.number(
                m,
                "max_compute_percent",
                &join(&p, "max_compute_percent"),
                1,
                100,
                false,
            );
            Some(GpuRequirement::Mps {
                memory_mib: MiB(memory?),
                max_compute_percent: compute
                    .map(|p| Percent::new(p as u32).expect("range checked")),
            })
        }
        (None, None) => {
            c.err(
                prefix,
                "needs gpus (whole GPUs) or mps { memory_mib, max_compute_percent? }",
            );
            None
        }
    }
}
