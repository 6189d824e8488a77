//! ECS's JSON shape (`containerDefinitions`, CPU in 1/1024 vCPU units): reading it, and
//! writing a spec back in it.

use super::native::{optional_string, parse_argv, parse_command};
use super::rules::*;
use super::serving::*;
use super::*;
use crate::limits::task_definition::*;

/// ECS counts CPU in units of 1/1024 vCPU.
pub(super) fn ecs_units_to_milli(units: u64) -> u64 {
    (units * 1000).div_ceil(1024)
}

pub(super) fn milli_to_ecs_units(milli: MilliCpu) -> u64 {
    (milli.0 * 1024).div_ceil(1000)
}

pub(super) fn parse_ecs(c: &mut Checker, o: &Map<String, Value>) -> Option<TaskDefinitionSpec> {
    let family = c.family(o);
    let defs = match o.get("containerDefinitions") {
        Some(Value::Array(items)) => items,
        Some(v) => {
            c.err(
                "containerDefinitions",
                format!("must be an array, got {}", kind(v)),
            );
            return None;
        }
        None => return None,
    };
    let mut parsed: Vec<Parsed> = Vec::new();
    for (i, v) in defs.iter().enumerate() {
        let prefix = format!("containerDefinitions[{i}]");
        let Some(d) = c.object(v, &prefix) else {
            continue;
        };
        let name = c.string(d, "name", &join(&prefix, "name"));
        let image = optional_string(c, d, "image", &join(&prefix, "image"));
        let entry_point = parse_argv(c, d.get("entryPoint"), &join(&prefix, "entryPoint"));
        let command = if image.is_some() || !entry_point.is_empty() {
            Some(parse_argv(c, d.get("command"), &join(&prefix, "command")))
        } else {
            parse_command(c, d.get("command"), &join(&prefix, "command"))
        };
        let cpu = c.number(d, "cpu", &join(&prefix, "cpu"), 0, 1_024_000, false);
        let memory = c.number(
            d,
            "memory",
            &join(&prefix, "memory"),
            1,
            MAX_MEMORY_MIB,
            false,
        );
        let reservation = c.number(
            d,
            "memoryReservation",
            &join(&prefix, "memoryReservation"),
            1,
            MAX_MEMORY_MIB,
            false,
        );
        // What Tessera does not model is kept as it came (CPU and memory too, so they come
        // back exactly as given).
        let ecs: Map<String, Value> = d
            .iter()
            .filter(|(k, v)| {
                // An empty list Tessera models is kept too, so it comes back as given; so
                // are GPU requirements written without `value` (ECS's own MPS form).
                !MODELED_CONTAINER_KEYS.contains(&k.as_str())
                    || (["environment", "secrets"].contains(&k.as_str())
                        && v.as_array().is_some_and(Vec::is_empty))
                    || (*k == "resourceRequirements"
                        && v.as_array().is_some_and(|items| {
                            items
                                .iter()
                                .any(|r| r.get("value").is_none_or(Value::is_null))
                        }))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut env = BTreeMap::new();
        if let Some(list) = given(d, "environment") {
            match list.as_array() {
                Some(items) => {
                    for (j, item) in items.iter().enumerate() {
                        let p = format!("{prefix}.environment[{j}]");
                        let Some(kv) = c.object(item, &p) else {
                            continue;
                        };
                        if let (Some(k), Some(v)) = (
                            c.string(kv, "name", &join(&p, "name")),
                            c.string(kv, "value", &join(&p, "value")),
                        ) {
                            env.insert(k, v);
                        }
                    }
                }
                None => c.err(
                    join(&prefix, "environment"),
                    "must be an array of {name, value}",
                ),
            }
        }
        let mut secrets = BTreeMap::new();
        if let Some(list) = given(d, "secrets") {
            match list.as_array() {
                Some(items) => {
                    for (j, item) in items.iter().enumerate() {
                        let p = format!("{prefix}.secrets[{j}]");
                        let Some(kv) = c.object(item, &p) else {
                            continue;
                        };
                        let (Some(k), Some(from)) = (
                            c.string(kv, "name", &join(&p, "name")),
                            c.string(kv, "valueFrom", &join(&p, "valueFrom")),
                        ) else {
                            continue;
                        };
                        if from.starts_with("arn:") {
                            c.err(
                                join(&p, "valueFrom"),
                                "is an AWS ARN (Secrets Manager or SSM), which Tessera cannot read; give the value itself as a literal",
                            );
                        } else if from == ECS_UNCHANGED_SECRET {
                            secrets.insert(k, Secret::Unchanged);
                        } else {
                            secrets.insert(k, Secret::Value(from));
                        }
                    }
                }
                None => c.err(
                    join(&prefix, "secrets"),
                    "must be an array of {name, valueFrom}",
                ),
            }
        }
        let mut gpu = None;
        if let Some(reqs) = given(d, "resourceRequirements") {
            let Some(items) = reqs.as_array() else {
                c.err(join(&prefix, "resourceRequirements"), "must be an array");
                continue;
            };
            for (j, item) in items.iter().enumerate() {
                let p = format!("{prefix}.resourceRequirements[{j}]");
                let Some(r) = c.object(item, &p) else {
                    continue;
                };
                match r.get("type").and_then(Value::as_str) {
                    Some("GPU") => {}
                    other => {
                        c.err(
                            join(&p, "type"),
                            format!("only \"GPU\" is supported, got {other:?}"),
                        );
                        continue;
                    }
                }
                // ECS takes `value` or `sharingStrategy` (then one GPU), and both together.
                let shared = r.get("sharingStrategy").is_some_and(|s| !s.is_null());
                let count = if shared && r.get("value").is_none_or(Value::is_null) {
                    None
                } else {
                    c.string(r, "value", &join(&p, "value"))
                }
                .and_then(|v| match v.parse::<u64>() {
                    Ok(n) if (1..=MAX_GPUS).contains(&n) => Some(n),
                    _ => {
                        c.err(
                            join(&p, "value"),
                            format!(
                                "must be a GPU count from 1 to {MAX_GPUS} as a string, got {v:?}"
                            ),
                        );
                        None
                    }
                });
                match r.get("sharingStrategy") {
                    None | Some(Value::Null) => gpu = count.map(|n| GpuRequirement::Gpus(n as u32)),
                    Some(s) => {
                        let sp = join(&p, "sharingStrategy.nvidiaMps");
                        let mps = s.get("nvidiaMps").and_then(Value::as_object);
                        let Some(mps) = mps else {
                            c.err(join(&p, "sharingStrategy"), "must be {\"nvidiaMps\": {\"memory\": MiB, \"maxComputePercent\"?: 1-100}}");
                            continue;
                        };
                        if count.is_some_and(|n| n != 1) {
                            c.err(join(&p, "value"), "must be \"1\" with an MPS sharing strategy: a shared slot is on one GPU");
                        }
                        let memory =
                            c.number(mps, "memory", &join(&sp, "memory"), 1, MAX_MEMORY_MIB, true);
                        let compute = c.number(
                            mps,
                            "maxComputePercent",
                            &join(&sp, "maxComputePercent"),
                            1,
                            100,
                            false,
                        );
                        if let Some(memory) = memory {
                            gpu = Some(GpuRequirement::Mps {
                                memory_mib: MiB(memory),
                                max_compute_percent: compute
                                    .map(|p| Percent::new(p as u32).expect("range checked")),
                            });
                        }
                    }
                }
            }
        }
        let ports = parse_ports(c, d, &prefix, Shape::Ecs);
        let health_check = parse_health_check(c, d, &prefix, Shape::Ecs);
        let essential = parse_essential(c, d, &prefix);
        let depends_on = parse_depends_on(c, d, &prefix, Shape::Ecs);
        if let (
            Some(name),
            Some(command),
            Some(ports),
            Some(health_check),
            Some(essential),
            Some(depends_on),
        ) = (name, command, ports, health_check, essential, depends_on)
        {
            parsed.push(Parsed {
                container: ContainerSpec {
                    name,
                    image,
                    entry_point,
                    command,
                    env,
                    secrets,
                    cpu_milli: MilliCpu(cpu.map_or(0, ecs_units_to_milli)),
                    memory_mib: MiB(memory.or(reservation).unwrap_or(0)),
                    gpu,
                    ports,
                    health_check,
                    essential,
                    depends_on,
                    ecs,
                },
                cpu_given: cpu.is_some(),
                memory_given: memory.or(reservation).is_some(),
            });
        }
    }
    if parsed.len() != defs.len() {
        return None;
    }
    // The task's own CPU and memory (ECS: numbers or strings such as "2048", "1 vCPU",
    // "4 GB") are kept as given, and shared evenly by the containers that give none.
    let task_ecs: Map<String, Value> = o
        .iter()
        .filter(|(k, _)| !["family", "containerDefinitions", "work"].contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let task_cpu = task_size(c, &task_ecs, "cpu", "vCPU", 1024, MAX_TASK_CPU_UNITS);
    let task_memory = task_size(c, &task_ecs, "memory", "GB", 1024, MAX_TASK_MEMORY_MIB);
    let containers: Vec<ContainerSpec> = parsed.iter().map(|p| p.container.clone()).collect();
    let (cpu_share, memory_share) = shares(&containers, task_cpu, task_memory);
    let given_cpu: u64 = parsed
        .iter()
        .filter(|p| p.cpu_given)
        .filter_map(|p| p.container.ecs.get("cpu").and_then(Value::as_u64))
        .sum();
    if let Some(t) = task_cpu
        && given_cpu > t
    {
        c.err(
            "cpu",
            format!("the task's {t} CPU units are fewer than its containers' {given_cpu}"),
        );
    }
    let mut containers = containers;
    for (i, (ct, p)) in containers.iter_mut().zip(&parsed).enumerate() {
        if !p.cpu_given
            && let Some(share) = cpu_share
        {
            ct.cpu_milli = MilliCpu(ecs_units_to_milli(share));
        }
        if !p.memory_given {
            match memory_share {
                Some(share) if share > 0 => ct.memory_mib = MiB(share),
                _ => c.err(
                    format!("containerDefinitions[{i}].memory"),
                    "give memory or memoryReservation here, or the task's memory (ECS's rule)",
                ),
            }
        }
    }
    let work = parse_work(c, o.get("work"));
    Some(TaskDefinitionSpec {
        family: family?,
        containers,
        ecs: task_ecs,
        work,
    })
}

/// Container keys Tessera models; every other key is kept in the container's `ecs`.
const MODELED_CONTAINER_KEYS: &[&str] = &[
    "name",
    "image",
    "entryPoint",
    "command",
    "environment",
    "secrets",
    "resourceRequirements",
];

/// A container as read, and whether its CPU and memory were given.
struct Parsed {
    container: ContainerSpec,
    cpu_given: bool,
    memory_given: bool,
}

/// A task-level size: a number, a numeric string, or `N <unit>` (× `per_unit`).
/// The largest task-level `cpu` (units) and `memory` (MiB): what its most containers could
/// each ask for. Past them a size is refused, never carried into arithmetic that overflows.
const MAX_TASK_CPU_UNITS: u64 = 1_024_000 * MAX_CONTAINERS as u64;
const MAX_TASK_MEMORY_MIB: u64 = MAX_MEMORY_MIB * MAX_CONTAINERS as u64;

/// A task-level size: a number, a numeric string, or `N <unit>` (× `per_unit`), at most `max`.
fn task_size(
    c: &mut Checker,
    task: &Map<String, Value>,
    key: &str,
    unit: &str,
    per_unit: u64,
    max: u64,
) -> Option<u64> {
    let v = task.get(key)?;
    let parsed = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => {
            let s = s.trim();
            match s
                .strip_suffix(unit)
                .or_else(|| s.strip_suffix(&unit.to_lowercase()))
            {
                Some(n) => n
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|n| *n > 0.0 && n.is_finite())
                    .map(|n| (n * per_unit as f64).round().min(u64::MAX as f64) as u64),
                None => s.parse::<u64>().ok(),
            }
        }
        _ => None,
    };
    match parsed {
        None => {
            c.err(
                key,
                format!("must be a number, a string of one (\"2048\") or \"N {unit}\", got {v}"),
            );
            None
        }
        Some(n) if n > max => {
            c.err(key, format!("must be at most {max}, got {v}"));
            None
        }
        some => some,
    }
}

/// What each container that gives no CPU (units) or memory (MiB) gets of the task's: the
/// rest after those that do, shared evenly.
fn shares(
    containers: &[ContainerSpec],
    task_cpu: Option<u64>,
    task_memory: Option<u64>,
) -> (Option<u64>, Option<u64>) {
    let cpu_given: Vec<u64> = containers
        .iter()
        .filter_map(|c| c.ecs.get("cpu").and_then(Value::as_u64))
        .collect();
    let cpu_rest = containers.len() - cpu_given.len();
    let cpu = task_cpu.map(|t| {
        t.saturating_sub(cpu_given.iter().sum())
            .checked_div(cpu_rest as u64)
            .unwrap_or(0)
    });
    let memory_given: Vec<u64> = containers
        .iter()
        .filter_map(|c| {
            c.ecs
                .get("memory")
                .or(c.ecs.get("memoryReservation"))
                .and_then(Value::as_u64)
        })
        .collect();
    let memory_rest = containers.len() - memory_given.len();
    let memory = task_memory.map(|t| {
        t.saturating_sub(memory_given.iter().sum())
            .checked_div(memory_rest as u64)
            .unwrap_or(0)
    });
    (cpu, memory)
}

/// The spec in ECS's shape (`containerDefinitions`, CPU in 1/1024 vCPU units). Fields
/// Tessera does not model come back as they were registered; CPU and memory come back as
/// they were given (units, `memoryReservation`, the task's share) while they still say
/// what the spec says.
pub fn to_ecs_json(spec: &TaskDefinitionSpec) -> Value {
    let mut probe = Checker { errors: Vec::new() };
    let task_cpu = task_size(
        &mut probe,
        &spec.ecs,
        "cpu",
        "vCPU",
        1024,
        MAX_TASK_CPU_UNITS,
    );
    let task_memory = task_size(
        &mut probe,
        &spec.ecs,
        "memory",
        "GB",
        1024,
        MAX_TASK_MEMORY_MIB,
    );
    let (cpu_share, memory_share) = shares(&spec.containers, task_cpu, task_memory);
    let defs: Vec<Value> = spec
        .containers
        .iter()
        .map(|ct| {
            let mut d = Value::Object(ct.ecs.clone());
            d["name"] = ct.name.clone().into();
            if let Some(image) = &ct.image {
                d["image"] = image.clone().into();
            }
            if !ct.entry_point.is_empty() {
                d["entryPoint"] = ct.entry_point.clone().into();
            }
            if !ct.command.is_empty() || (ct.image.is_none() && ct.entry_point.is_empty()) {
                d["command"] = ct.command.clone().into();
            }
            // CPU: as given while it still says the same; the task's share left implicit.
            let given_cpu = ct.ecs.get("cpu").and_then(Value::as_u64);
            match given_cpu {
                Some(u) if ecs_units_to_milli(u) == ct.cpu_milli.0 => {}
                None if cpu_share.is_some_and(|s| ecs_units_to_milli(s) == ct.cpu_milli.0) => {}
                // Given nowhere, reserved none.
                None if cpu_share.is_none() && ct.cpu_milli.0 == 0 => {}
                _ => d["cpu"] = milli_to_ecs_units(ct.cpu_milli).into(),
            }
            let given_memory = ct.ecs.get("memory").and_then(Value::as_u64);
            let reservation = ct.ecs.get("memoryReservation").and_then(Value::as_u64);
            match (given_memory, reservation) {
                (Some(m), _) if m == ct.memory_mib.0 => {}
                (None, Some(r)) if r == ct.memory_mib.0 => {}
                (None, None) if memory_share == Some(ct.memory_mib.0) => {}
                _ => d["memory"] = ct.memory_mib.0.into(),
            }
            if !ct.env.is_empty() {
                d["environment"] = ct
                    .env
                    .iter()
                    .map(|(k, v)| serde_json::json!({"name": k, "value": v}))
                    .collect();
            }
            if !ct.secrets.is_empty() {
                // Never the value: the marker that keeps it when the JSON comes back.
                d["secrets"] = ct
                    .secrets
                    .keys()
                    .map(|k| serde_json::json!({"name": k, "valueFrom": ECS_UNCHANGED_SECRET}))
                    .collect();
            }
            let req = match ct.gpu {
                Some(GpuRequirement::Gpus(n)) => Some(serde_json::json!({"type": "GPU", "value": n.to_string()})),
                Some(GpuRequirement::Mps {
                    memory_mib,
                    max_compute_percent,
                }) => {
                    let mut mps = serde_json::json!({"memory": memory_mib.0});
                    if let Some(p) = max_compute_percent {
                        mps["maxComputePercent"] = p.get().into();
                    }
                    Some(serde_json::json!({"type": "GPU", "value": "1", "sharingStrategy": {"nvidiaMps": mps}}))
                }
                None => None,
            };
            if req.is_none() {
                d.as_object_mut().expect("an object").remove("resourceRequirements");
            }
            if let Some(req) = req {
                // As given while it still says the same (`value` may have been left out).
                let given = ct.ecs.get("resourceRequirements").cloned();
                let same = given.as_ref().is_some_and(|g| {
                    let mut probe = Checker { errors: Vec::new() };
                    let mut one = ct.ecs.clone();
                    one.insert("name".into(), ct.name.clone().into());
                    one.insert("command".into(), Value::Array(vec!["x".into()]));
                    one.insert("memory".into(), 1.into());
                    one.insert("resourceRequirements".into(), g.clone());
                    let doc = serde_json::json!({"family": "probe", "containerDefinitions": [one]});
                    parse_ecs(&mut probe, doc.as_object().expect("an object"))
                        .is_some_and(|s| probe.errors.is_empty() && s.containers[0].gpu == ct.gpu)
                });
                d["resourceRequirements"] = if same { given.expect("checked") } else { Value::Array(vec![req]) };
            }
            // Ports, health check, essential and dependencies: as given while they still say
            // what the spec says, else written from it.
            let obj = d.as_object_mut().expect("an object");
            for key in stale_ecs_keys(ct) {
                let given = obj.remove(key);
                let written = match key {
                    "portMappings" => (!ct.ports.is_empty())
                        .then(|| ports_to_ecs(&ct.ports, given.as_ref())),
                    "healthCheck" => ct.health_check.as_ref().map(health_to_ecs),
                    "essential" => Some(ct.essential.into()),
                    _ => (!ct.depends_on.is_empty()).then(|| depends_to_ecs(&ct.depends_on)),
                };
                if let Some(v) = written {
                    obj.insert(key.into(), v);
                }
            }
            d
        })
        .collect();
    let mut out = Value::Object(spec.ecs.clone());
    out["family"] = spec.family.clone().into();
    out["containerDefinitions"] = defs.into();
    if let Some(w) = &spec.work {
        out["work"] = serde_json::to_value(w).expect("a plain struct");
    }
    out
}
