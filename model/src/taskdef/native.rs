//! Tessera's own JSON shape (`family`, `containers`).

use super::rules::*;
use super::*;

pub(super) fn parse_native(c: &mut Checker, o: &Map<String, Value>) -> Option<TaskDefinitionSpec> {
    c.unknown_keys(o, &["family", "containers"], "");
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
    Some(TaskDefinitionSpec {
        family: family?,
        containers: containers?,
    })
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
            "command",
            "env",
            "secrets",
            "cpu_milli",
            "memory_mib",
            "gpu",
        ],
        prefix,
    );
    let name = c.string(o, "name", &join(prefix, "name"));
    let command = parse_command(c, o.get("command"), &join(prefix, "command"));
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
    let cpu = c.number(
        o,
        "cpu_milli",
        &join(prefix, "cpu_milli"),
        1,
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
    Some(ContainerSpec {
        name: name?,
        command: command?,
        env,
        secrets,
        cpu_milli: MilliCpu(cpu?),
        memory_mib: MiB(memory?),
        gpu: gpu?,
    })
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
