//! ECS's JSON shape (`containerDefinitions`, CPU in 1/1024 vCPU units): reading it, and
//! writing a spec back in it.

use super::native::parse_command;
use super::rules::*;
use super::*;

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
    let mut containers = Vec::new();
    for (i, v) in defs.iter().enumerate() {
        let prefix = format!("containerDefinitions[{i}]");
        let Some(d) = c.object(v, &prefix) else {
            continue;
        };
        let name = c.string(d, "name", &join(&prefix, "name"));
        let command = parse_command(c, d.get("command"), &join(&prefix, "command"));
        let cpu = c.number(d, "cpu", &join(&prefix, "cpu"), 1, 1_024_000, true);
        let memory = c.number(
            d,
            "memory",
            &join(&prefix, "memory"),
            1,
            MAX_MEMORY_MIB,
            true,
        );
        let mut env = BTreeMap::new();
        if let Some(list) = d.get("environment") {
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
        if let Some(list) = d.get("secrets") {
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
        if let Some(reqs) = d.get("resourceRequirements") {
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
                let count = c
                    .string(r, "value", &join(&p, "value"))
                    .and_then(|v| match v.parse::<u64>() {
                        Ok(n) if (1..=MAX_GPUS).contains(&n) => Some(n),
                        _ => {
                            c.err(join(&p, "value"), format!("must be a GPU count from 1 to {MAX_GPUS} as a string, got {v:?}"));
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
        if let (Some(name), Some(command), Some(cpu), Some(memory)) = (name, command, cpu, memory) {
            containers.push(ContainerSpec {
                name,
                command,
                env,
                secrets,
                cpu_milli: MilliCpu(ecs_units_to_milli(cpu)),
                memory_mib: MiB(memory),
                gpu,
            });
        }
    }
    if containers.len() != defs.len() {
        return None;
    }
    Some(TaskDefinitionSpec {
        family: family?,
        containers,
    })
}

/// The spec in ECS's shape (`containerDefinitions`, CPU in 1/1024 vCPU units).
pub fn to_ecs_json(spec: &TaskDefinitionSpec) -> Value {
    let defs: Vec<Value> = spec
        .containers
        .iter()
        .map(|ct| {
            let mut d = serde_json::json!({
                "name": ct.name,
                "command": ct.command,
                "cpu": milli_to_ecs_units(ct.cpu_milli),
                "memory": ct.memory_mib.0,
                "environment": ct.env.iter().map(|(k, v)| serde_json::json!({"name": k, "value": v})).collect::<Vec<_>>(),
            });
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
            if let Some(req) = req {
                d["resourceRequirements"] = Value::Array(vec![req]);
            }
            d
        })
        .collect();
    serde_json::json!({ "family": spec.family, "containerDefinitions": defs })
}
