//! Task definitions: what a task runs and what it needs, their validation (every error
//! names its field path and rule), and the ECS-style JSON shape.

use crate::units::{ComputeMilli, MiB, MilliCpu, Percent};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One rule broken at one place in the input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    /// Where, e.g. `containers[0].gpu.mps.memory_mib`.
    pub field: String,
    /// What is wrong and what would be right.
    pub message: String,
}

/// Every error found in one input; empty never escapes a validator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct ValidationErrors {
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        f.write_str(&parts.join("; "))
    }
}

/// The GPU a container needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuRequirement {
    /// Whole GPUs, used by this container alone.
    Gpus(u32),
    /// A slot on one GPU shared through MPS. All MPS containers of a task share one GPU.
    Mps {
        memory_mib: MiB,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_compute_percent: Option<Percent>,
    },
}

/// A secret value of a container: write-only. It serializes as `{"set": true}` and prints as
/// `***`, so no response, page, event or log can show it by accident; the one way to read it
/// is [`Secret::expose`], which the agent API's sync answer uses.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    Value(String),
    /// On input: keep the value the family's previous revision has (what a described
    /// definition sends back). Resolved at registration; never stored.
    Unchanged,
}

/// What `{"valueFrom": ...}` of ECS's `secrets` says to keep the previous revision's value.
pub const ECS_UNCHANGED_SECRET: &str = "tessera:unchanged";
const MAX_SECRET_BYTES: usize = 64 * 1024;

impl Secret {
    /// The value, for the one place that must send it (a host's sync answer).
    pub fn expose(&self) -> Option<&str> {
        match self {
            Secret::Value(v) => Some(v),
            Secret::Unchanged => None,
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("set", &true)?;
        m.end()
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(v) => Ok(Secret::Value(v)),
            v if v == serde_json::json!({"set": true}) => Ok(Secret::Unchanged),
            other => Err(serde::de::Error::custom(format!(
                "a secret is a string, or {{\"set\": true}} to keep the previous value; got {}",
                kind(&other)
            ))),
        }
    }
}

/// One process of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub name: String,
    /// argv; the first element is the program.
    pub command: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Environment variables whose values are write-only (see [`Secret`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, Secret>,
    pub cpu_milli: MilliCpu,
    pub memory_mib: MiB,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuRequirement>,
}

/// What a task runs; registered as a new revision of its family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDefinitionSpec {
    pub family: String,
    pub containers: Vec<ContainerSpec>,
}

/// The GPU a whole task needs: the sum over its containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskGpu {
    None,
    Whole {
        count: u32,
    },
    Shared {
        memory: MiB,
        compute: Option<ComputeMilli>,
    },
}

/// Secret values by container name, then variable name: how the store keeps them apart from
/// the rest of a definition.
pub type SecretValues = BTreeMap<String, BTreeMap<String, String>>;

impl TaskDefinitionSpec {
    /// Every secret that has a value, for the store.
    pub fn secret_values(&self) -> SecretValues {
        self.containers
            .iter()
            .filter(|c| !c.secrets.is_empty())
            .map(|c| {
                let values = c
                    .secrets
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.expose()?.to_owned())))
                    .collect();
                (c.name.clone(), values)
            })
            .collect()
    }

    /// Gives every secret marked [`Secret::Unchanged`] its value from `values` (a stored
    /// revision's). Returns the fields of those that have none there.
    pub fn fill_secrets(&mut self, values: &SecretValues) -> Vec<FieldError> {
        let mut missing = Vec::new();
        for (i, c) in self.containers.iter_mut().enumerate() {
            for (k, v) in c.secrets.iter_mut() {
                if *v == Secret::Unchanged {
                    match values.get(&c.name).and_then(|m| m.get(k)) {
                        Some(value) => *v = Secret::Value(value.clone()),
                        None => missing.push(FieldError {
                            field: format!("containers[{i}].secrets.{k}"),
                            message: format!(
                                "no earlier revision of {} has a value for this secret in container {:?}; give its value",
                                self.family, c.name
                            ),
                        }),
                    }
                }
            }
        }
        missing
    }

    pub fn cpu(&self) -> MilliCpu {
        self.containers.iter().map(|c| c.cpu_milli).sum()
    }

    pub fn memory(&self) -> MiB {
        self.containers.iter().map(|c| c.memory_mib).sum()
    }

    /// Whole GPUs add up; MPS slots add up on one GPU, and so do their compute caps (a
    /// container without a cap reserves no compute).
    pub fn gpu(&self) -> TaskGpu {
        let mut whole = 0;
        let mut memory = MiB::ZERO;
        let mut compute: Option<ComputeMilli> = None;
        for c in &self.containers {
            match c.gpu {
                Some(GpuRequirement::Gpus(n)) => whole += n,
                Some(GpuRequirement::Mps {
                    memory_mib,
                    max_compute_percent,
                }) => {
                    memory += memory_mib;
                    if let Some(p) = max_compute_percent {
                        compute = Some(compute.unwrap_or_default() + p.to_compute_milli());
                    }
                }
                None => {}
            }
        }
        if whole > 0 {
            TaskGpu::Whole { count: whole }
        } else if memory > MiB::ZERO {
            TaskGpu::Shared { memory, compute }
        } else {
            TaskGpu::None
        }
    }
}

/// Environment variables the agent sets itself; a definition may not override them.
pub const RESERVED_ENV: &[&str] = &[
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
];

const MAX_CONTAINERS: usize = 10;
const MAX_GPUS: u64 = 16;
const MAX_MEMORY_MIB: u64 = 16 * 1024 * 1024;

/// Collects errors while walking a JSON document.
struct Checker {
    errors: Vec<FieldError>,
}

impl Checker {
    fn err(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    fn object<'a>(&mut self, v: &'a Value, field: &str) -> Option<&'a Map<String, Value>> {
        match v.as_object() {
            Some(o) => Some(o),
            None => {
                self.err(field, format!("must be an object, got {}", kind(v)));
                None
            }
        }
    }

    fn string(&mut self, o: &Map<String, Value>, key: &str, field: &str) -> Option<String> {
        match o.get(key) {
            None | Some(Value::Null) => {
                self.err(field, "is required");
                None
            }
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => {
                self.err(field, format!("must be a string, got {}", kind(v)));
                None
            }
        }
    }

    /// A whole number in `min..=max`; `required` decides whether absence is an error.
    fn number(
        &mut self,
        o: &Map<String, Value>,
        key: &str,
        field: &str,
        min: u64,
        max: u64,
        required: bool,
    ) -> Option<u64> {
        match o.get(key) {
            None | Some(Value::Null) => {
                if required {
                    self.err(field, "is required");
                }
                None
            }
            Some(v) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => Some(n),
                Some(n) => {
                    self.err(field, format!("must be between {min} and {max}, got {n}"));
                    None
                }
                None => {
                    self.err(
                        field,
                        format!("must be a whole number between {min} and {max}, got {v}"),
                    );
                    None
                }
            },
        }
    }

    /// The family name, checked at once so its error comes with the others.
    fn family(&mut self, o: &Map<String, Value>) -> Option<String> {
        let family = self.string(o, "family", "family")?;
        if !valid_name(&family) {
            self.err("family", "use 1 to 255 letters, digits, '-' or '_'");
        }
        Some(family)
    }

    fn unknown_keys(&mut self, o: &Map<String, Value>, allowed: &[&str], prefix: &str) {
        for key in o.keys() {
            if !allowed.contains(&key.as_str()) {
                // An empty key still gets a field that names it.
                let shown = if key.is_empty() { "\"\"" } else { key };
                self.err(
                    join(prefix, shown),
                    format!(
                        "is not a known field (expected one of: {})",
                        allowed.join(", ")
                    ),
                );
            }
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn valid_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

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

fn parse_native(c: &mut Checker, o: &Map<String, Value>) -> Option<TaskDefinitionSpec> {
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

fn parse_command(c: &mut Checker, v: Option<&Value>, field: &str) -> Option<Vec<String>> {
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

fn parse_native_container(c: &mut Checker, v: &Value, prefix: &str) -> Option<ContainerSpec> {
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

fn parse_native_gpu(c: &mut Checker, v: &Value, prefix: &str) -> Option<GpuRequirement> {
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

/// ECS counts CPU in units of 1/1024 vCPU.
fn ecs_units_to_milli(units: u64) -> u64 {
    (units * 1000).div_ceil(1024)
}

fn milli_to_ecs_units(milli: MilliCpu) -> u64 {
    (milli.0 * 1024).div_ceil(1000)
}

fn parse_ecs(c: &mut Checker, o: &Map<String, Value>) -> Option<TaskDefinitionSpec> {
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

/// Rules that hold whatever the input shape was.
fn check_spec(c: &mut Checker, spec: &TaskDefinitionSpec) {
    if spec.containers.is_empty() {
        c.err("containers", "needs at least one container");
    }
    if spec.containers.len() > MAX_CONTAINERS {
        c.err(
            "containers",
            format!("at most {MAX_CONTAINERS} containers per task"),
        );
    }
    let mut names = BTreeSet::new();
    let (mut whole, mut mps) = (false, false);
    for (i, ct) in spec.containers.iter().enumerate() {
        let p = format!("containers[{i}]");
        if !valid_name(&ct.name) {
            c.err(join(&p, "name"), "use 1 to 255 letters, digits, '-' or '_'");
        } else if !names.insert(ct.name.as_str()) {
            c.err(
                join(&p, "name"),
                format!("{:?} is used by another container of this task", ct.name),
            );
        }
        if ct.command.first().is_none_or(|p| p.trim().is_empty()) {
            c.err(
                join(&p, "command"),
                "must name a program: a non-empty first element",
            );
        }
        for k in ct.env.keys() {
            if !valid_env_name(k) {
                c.err(format!("{p}.env.{k}"), "is not a valid variable name (letters, digits, '_', not starting with a digit)");
            } else if RESERVED_ENV.contains(&k.as_str()) {
                c.err(
                    format!("{p}.env.{k}"),
                    "is set by the agent from the placement; remove it",
                );
            }
        }
        for (k, v) in &ct.secrets {
            let f = format!("{p}.secrets.{k}");
            if !valid_env_name(k) {
                c.err(f, "is not a valid variable name (letters, digits, '_', not starting with a digit)");
            } else if RESERVED_ENV.contains(&k.as_str()) {
                c.err(f, "is set by the agent from the placement; remove it");
            } else if ct.env.contains_key(k) {
                c.err(f, "is also in env; a variable is either plain or secret");
            } else if v.expose().is_some_and(|v| v.len() > MAX_SECRET_BYTES) {
                c.err(f, format!("is longer than {MAX_SECRET_BYTES} bytes"));
            }
        }
        match ct.gpu {
            Some(GpuRequirement::Gpus(_)) => whole = true,
            Some(GpuRequirement::Mps { .. }) => mps = true,
            None => {}
        }
    }
    if whole && mps {
        c.err(
            "containers",
            "a task uses either whole GPUs or MPS slots, not both",
        );
    }
    if let TaskGpu::Whole { count } = spec.gpu()
        && u64::from(count) > MAX_GPUS
    {
        c.err(
            "containers",
            format!("the task asks for {count} whole GPUs; at most {MAX_GPUS} fit on one host"),
        );
    }
    if let TaskGpu::Shared {
        compute: Some(cm), ..
    } = spec.gpu()
        && cm > ComputeMilli::FULL
    {
        c.err(
            "containers",
            format!("the MPS compute caps add up to {cm}, more than one GPU"),
        );
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(v: Value) -> Vec<(String, String)> {
        parse_task_definition(&v)
            .expect_err("invalid")
            .errors
            .into_iter()
            .map(|e| (e.field, e.message))
            .collect()
    }

    #[test]
    fn native_shape_parses_and_sums_gpu_needs() {
        let spec = parse_task_definition(&json!({
            "family": "llm-serve",
            "containers": [
                {"name": "main", "command": ["python", "serve.py"], "env": {"MODEL": "7b"},
                 "cpu_milli": 2000, "memory_mib": 4096,
                 "gpu": {"mps": {"memory_mib": 8192, "max_compute_percent": 25}}},
                {"name": "sidecar", "command": ["sleep", "inf"], "cpu_milli": 100, "memory_mib": 64,
                 "gpu": {"mps": {"memory_mib": 1024}}}
            ]
        }))
        .expect("valid");
        assert_eq!(spec.cpu(), MilliCpu(2100));
        assert_eq!(
            spec.gpu(),
            TaskGpu::Shared {
                memory: MiB(9216),
                compute: Some(ComputeMilli(250))
            }
        );
    }

    #[test]
    fn every_error_names_its_field() {
        let errs = errors(json!({
            "family": "bad family!",
            "containers": [
                {"name": "a", "command": [], "cpu_milli": 0, "memory_mib": 64,
                 "gpu": {"mps": {"memory_mib": 8192, "max_compute_percent": 150}}},
                {"name": "a", "command": ["x"], "cpu_milli": 10, "memory_mib": 64,
                 "env": {"CUDA_VISIBLE_DEVICES": "0"}, "gpu": {"gpus": 1}}
            ]
        }));
        let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
        assert!(fields.contains(&"containers[0].cpu_milli"), "{errs:?}");
        assert!(
            fields.contains(&"containers[0].gpu.mps.max_compute_percent"),
            "{errs:?}"
        );
        assert!(
            fields.contains(&"family"),
            "the name is checked even when a container fails to parse: {errs:?}"
        );
        assert!(errs.iter().all(|(f, m)| !f.is_empty() && !m.is_empty()));
    }

    #[test]
    fn spec_level_rules_are_reported_together() {
        let errs = errors(json!({
            "family": "bad family!",
            "containers": [
                {"name": "a", "command": [""], "cpu_milli": 10, "memory_mib": 64, "gpu": {"mps": {"memory_mib": 10}}},
                {"name": "a", "command": ["x"], "cpu_milli": 10, "memory_mib": 64,
                 "env": {"CUDA_VISIBLE_DEVICES": "0"}, "gpu": {"gpus": 1}}
            ]
        }));
        let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "family",
                "containers[0].command",
                "containers[1].name",
                "containers[1].env.CUDA_VISIBLE_DEVICES",
                "containers"
            ],
            "{errs:?}"
        );
    }

    #[test]
    fn missing_and_mistyped_fields() {
        let errs = errors(
            json!({"family": 3, "containers": [{"name": "a", "command": "python"}], "extra": 1}),
        );
        assert!(
            errs.contains(&(
                "extra".into(),
                "is not a known field (expected one of: family, containers)".into()
            )),
            "{errs:?}"
        );
        assert!(
            errs.contains(&("family".into(), "must be a string, got a number".into())),
            "{errs:?}"
        );
        assert!(
            errs.iter().any(|(f, _)| f == "containers[0].command"),
            "{errs:?}"
        );
        assert!(
            errs.contains(&("containers[0].cpu_milli".into(), "is required".into())),
            "{errs:?}"
        );
    }

    #[test]
    fn ecs_shape_round_trips() {
        let ecs = json!({
            "family": "inference",
            "containerDefinitions": [{
                "name": "main", "command": ["python", "serve.py"], "cpu": 1024, "memory": 2048,
                "environment": [{"name": "MODEL", "value": "7b"}],
                "resourceRequirements": [{"type": "GPU", "value": "1",
                    "sharingStrategy": {"nvidiaMps": {"memory": 8192, "maxComputePercent": 25}}}]
            }]
        });
        let spec = parse_task_definition(&ecs).expect("valid ECS");
        assert_eq!(spec.containers[0].cpu_milli, MilliCpu(1000));
        assert_eq!(spec.containers[0].env["MODEL"], "7b");
        assert_eq!(
            spec.gpu(),
            TaskGpu::Shared {
                memory: MiB(8192),
                compute: Some(ComputeMilli(250))
            }
        );
        assert_eq!(to_ecs_json(&spec), ecs);
        assert_eq!(parse_task_definition(&to_ecs_json(&spec)), Ok(spec));
    }

    #[test]
    fn ecs_errors_use_ecs_paths() {
        let errs = errors(json!({
            "family": "x",
            "containerDefinitions": [{"name": "m", "command": ["a"], "cpu": 256, "memory": 512,
                "resourceRequirements": [{"type": "GPU", "value": "2",
                    "sharingStrategy": {"nvidiaMps": {"maxComputePercent": 0}}}]}]
        }));
        let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
        assert!(
            fields.contains(&"containerDefinitions[0].resourceRequirements[0].value"),
            "{errs:?}"
        );
        assert!(
            fields.contains(
                &"containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps.memory"
            ),
            "{errs:?}"
        );
        assert!(fields.contains(&"containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps.maxComputePercent"), "{errs:?}");
    }

    #[test]
    fn secrets_are_write_only() {
        let mut spec = parse_task_definition(&json!({
            "family": "db",
            "containers": [{"name": "main", "command": ["serve"], "cpu_milli": 100, "memory_mib": 64,
                "env": {"MODE": "prod"}, "secrets": {"DB_PASSWORD": "hunter2-hunter2"}}]
        }))
        .expect("valid");
        let shown = serde_json::to_string(&spec).expect("serializes");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains(r#""DB_PASSWORD":{"set":true}"#), "{shown}");
        assert!(!format!("{spec:?}").contains("hunter2"));
        let ecs = to_ecs_json(&spec).to_string();
        assert!(!ecs.contains("hunter2"), "{ecs}");
        let values = spec.secret_values();
        assert_eq!(values["main"]["DB_PASSWORD"], "hunter2-hunter2");
        // What a description sends back keeps the value once filled from the store.
        let mut again = parse_task_definition(&serde_json::from_str(&shown).expect("json"))
            .expect("a described definition registers again");
        assert_eq!(
            again.containers[0].secrets["DB_PASSWORD"],
            Secret::Unchanged
        );
        assert!(again.fill_secrets(&values).is_empty());
        assert_eq!(again, spec);
        spec.containers[0].name = "renamed".into();
        let mut renamed = spec.clone();
        renamed.containers[0]
            .secrets
            .insert("DB_PASSWORD".into(), Secret::Unchanged);
        let missing = renamed.fill_secrets(&values);
        assert_eq!(missing[0].field, "containers[0].secrets.DB_PASSWORD");
    }

    #[test]
    fn secret_rules_name_their_field() {
        let errs = errors(json!({
            "family": "db",
            "containers": [{"name": "main", "command": ["serve"], "cpu_milli": 100, "memory_mib": 64,
                "env": {"A": "1"}, "secrets": {"A": "x", "CUDA_VISIBLE_DEVICES": "0", "B": 3}}]
        }));
        let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
        assert!(fields.contains(&"containers[0].secrets.B"), "{errs:?}");
        assert!(fields.contains(&"containers[0].secrets.A"), "{errs:?}");
        assert!(
            fields.contains(&"containers[0].secrets.CUDA_VISIBLE_DEVICES"),
            "{errs:?}"
        );
    }

    #[test]
    fn ecs_secrets_take_literals_and_refuse_arns() {
        let base = |from: &str| {
            json!({"family": "x", "containerDefinitions": [{"name": "m", "command": ["a"],
                "cpu": 256, "memory": 512, "secrets": [{"name": "TOKEN", "valueFrom": from}]}]})
        };
        let spec = parse_task_definition(&base("s3cr3t-literal")).expect("a literal is held");
        assert_eq!(
            spec.containers[0].secrets["TOKEN"].expose(),
            Some("s3cr3t-literal")
        );
        let errs = errors(base("arn:aws:secretsmanager:us-east-1:1:secret:db"));
        assert_eq!(errs[0].0, "containerDefinitions[0].secrets[0].valueFrom");
        assert!(errs[0].1.contains("cannot read"), "{errs:?}");
    }
}
