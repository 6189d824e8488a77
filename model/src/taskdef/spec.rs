//! The task definition itself: containers, their commands, environment, secrets and
//! GPU needs, and what a whole task asks of a host.

use super::rules::kind;
use super::*;

/// The GPU a container needs.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub name: String,
    /// The container image (ECS `image`); without one the container runs as a process on
    /// the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Run before `command` (ECS `entryPoint`): the argv is `entry_point` then `command`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entry_point: Vec<String>,
    /// argv; the first element is the program (with an `entry_point`, its arguments; with an
    /// image and neither, the image's default).
    #[serde(default)]
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
    /// Ports it listens on (ECS `portMappings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortSpec>,
    /// How the agent tells whether it is healthy (ECS `healthCheck`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Whether its exit ends the task (ECS `essential`, default true); a non-essential
    /// container may exit while the task runs on.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub essential: bool,
    /// Containers of the task it waits for before it starts (ECS `dependsOn`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<Dependency>,
    /// ECS fields of the container that Tessera does not model (`logConfiguration`, ...),
    /// kept as they came and returned in ECS's shape; also how its CPU, memory, ports,
    /// health check and dependencies were given there.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub ecs: Map<String, Value>,
}

impl ContainerSpec {
    /// What runs: `entry_point` then `command`.
    pub fn argv(&self) -> Vec<String> {
        self.entry_point
            .iter()
            .chain(&self.command)
            .cloned()
            .collect()
    }
}

/// What a task runs; registered as a new revision of its family.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDefinitionSpec {
    pub family: String,
    pub containers: Vec<ContainerSpec>,
    /// ECS task-level fields Tessera does not model (`networkMode`, role ARNs,
    /// `requiresCompatibilities`, the task's `cpu` and `memory` as given, ...), kept as they
    /// came and returned in ECS's shape.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub ecs: Map<String, Value>,
    /// Where the task's application publishes the work it completes (Prometheus text on
    /// one of its named ports); in ECS's shape too, as the task-level key `work`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<crate::work::WorkSpec>,
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
    /// What it measures of its work and use: what a service's alarms, latency target and
    /// autoscaling may ask for.
    pub fn published(&self) -> crate::work::Published {
        crate::work::Published::of(
            self.work.as_ref(),
            self.containers.iter().any(|c| c.gpu.is_some()),
        )
    }

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

    /// ECS `networkMode: host`: containers use the host's network, so a container port is
    /// the host port.
    pub fn host_network(&self) -> bool {
        self.ecs.get("networkMode").and_then(Value::as_str) == Some("host")
    }

    /// Every port of the task with its container's index.
    pub fn ports(&self) -> impl Iterator<Item = (usize, &PortSpec)> {
        self.containers
            .iter()
            .enumerate()
            .flat_map(|(i, c)| c.ports.iter().map(move |p| (i, p)))
    }

    /// The host ports the task needs fixed (placement resources); under host networking
    /// every container port is one.
    pub fn fixed_host_ports(&self) -> Vec<(u16, Protocol)> {
        let host = self.host_network();
        let mut out: Vec<(u16, Protocol)> = self
            .ports()
            .filter_map(|(_, p)| {
                p.host_port
                    .or(host.then_some(p.container_port))
                    .map(|h| (h, p.protocol))
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Whether any container has a health check.
    pub fn has_health_check(&self) -> bool {
        self.containers.iter().any(|c| c.health_check.is_some())
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

/// The transport of a port.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// A port a container listens on (ECS `portMappings`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSpec {
    /// How health checks, work metrics and the environment (`TESSERA_PORT_<NAME>`) refer
    /// to it; a port named `metrics` is listed for Prometheus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The port inside the container. A process task has no container: it binds the host
    /// port it is given (`PORT`, `TESSERA_PORT_<NAME>`).
    pub container_port: u16,
    /// A fixed host port: a placement resource (two tasks wanting it never share a host).
    /// Without one the agent picks a free port from its dynamic range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_port: Option<u16>,
    #[serde(default)]
    pub protocol: Protocol,
}

impl PortSpec {
    /// `TESSERA_PORT_<NAME>`: the name upper-cased, `-` as `_`.
    pub fn env_name(&self) -> Option<String> {
        self.name
            .as_ref()
            .map(|n| format!("TESSERA_PORT_{}", n.to_ascii_uppercase().replace('-', "_")))
    }
}

/// How a container's health is checked (ECS `healthCheck`, plus a plain HTTP check).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    /// `["CMD", program, args…]` or `["CMD-SHELL", "a shell command"]`; exit 0 is healthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Or an HTTP GET on one of the container's ports: 2xx and 3xx are healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpCheck>,
    #[serde(default = "HealthCheck::default_interval")]
    pub interval_secs: u32,
    #[serde(default = "HealthCheck::default_timeout")]
    pub timeout_secs: u32,
    /// Consecutive failures that make the container unhealthy.
    #[serde(default = "HealthCheck::default_retries")]
    pub retries: u32,
    /// Failures in this time after the start do not count.
    #[serde(default)]
    pub start_period_secs: u32,
}

impl HealthCheck {
    pub const INTERVAL: (u32, u32, u32) = (5, 300, 30);
    pub const TIMEOUT: (u32, u32, u32) = (2, 60, 5);
    pub const RETRIES: (u32, u32, u32) = (1, 10, 3);
    pub const START_PERIOD: (u32, u32, u32) = (0, 300, 0);
    fn default_interval() -> u32 {
        Self::INTERVAL.2
    }
    fn default_timeout() -> u32 {
        Self::TIMEOUT.2
    }
    fn default_retries() -> u32 {
        Self::RETRIES.2
    }
}

/// An HTTP health check.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpCheck {
    /// The name of one of the container's ports.
    pub port: String,
    /// Starts with `/`.
    #[serde(default = "HttpCheck::default_path")]
    pub path: String,
}

impl HttpCheck {
    fn default_path() -> String {
        "/".into()
    }
}

/// What a container waits for in another of its task's containers before it starts (ECS
/// `dependsOn`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DependencyCondition {
    /// It has started.
    Start,
    /// It has exited (any code).
    Complete,
    /// It has exited with code 0.
    Success,
    /// Its health check passed.
    Healthy,
}

impl DependencyCondition {
    pub fn as_str(self) -> &'static str {
        match self {
            DependencyCondition::Start => "START",
            DependencyCondition::Complete => "COMPLETE",
            DependencyCondition::Success => "SUCCESS",
            DependencyCondition::Healthy => "HEALTHY",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "START" => DependencyCondition::Start,
            "COMPLETE" => DependencyCondition::Complete,
            "SUCCESS" => DependencyCondition::Success,
            "HEALTHY" => DependencyCondition::Healthy,
            _ => return None,
        })
    }
}

/// One entry of a container's `depends_on`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    pub container: String,
    pub condition: DependencyCondition,
}

pub(super) fn is_true(b: &bool) -> bool {
    *b
}

pub(super) fn yes() -> bool {
    true
}
