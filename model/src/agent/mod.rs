//! The agent protocol: what `tessera-agent` and the server say to each other over
//! `/agent/v1`. Sync is declarative: the agent says what it has, the server answers with
//! everything it should run.

use crate::bounds;
use crate::ids::{GpuUuid, HostId, PoolName};
use crate::limits::report::MAX_NAME_CHARS;
use crate::service::{TaskHealth, TaskPort};
use crate::taskdef::{ContainerSecurity, Dependency, HealthCheck, PortSpec};
use crate::taskdef::{FieldError, ValidationErrors};
use crate::units::{MiB, MilliCpu};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod sanitize;
pub mod streams;

pub use crate::inventory::{Capability, HostCapabilities};

/// One GPU as the agent sees it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuReport {
    pub uuid: GpuUuid,
    /// Unique on the host.
    #[cfg_attr(feature = "openapi", schema(maximum = 1023))]
    pub index: u32,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::agent_text))]
    pub model: String,
    #[cfg_attr(feature = "openapi", schema(value_type = u64, minimum = 1, maximum = 16_777_216))]
    pub memory_mib: MiB,
    #[serde(default = "default_client_limit")]
    #[cfg_attr(feature = "openapi", schema(default = 48, minimum = 1, maximum = 48))]
    pub mps_client_limit: u32,
    pub healthy: bool,
}

fn default_client_limit() -> u32 {
    crate::limits::MPS_CLIENT_LIMIT_MAX
}

/// `POST /agent/v1/register`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub join_token: String,
    pub pool: PoolName,
    #[cfg_attr(feature = "openapi", schema(value_type = u64, maximum = 100_000_000))]
    pub cpu_milli: MilliCpu,
    #[cfg_attr(feature = "openapi", schema(value_type = u64, maximum = 1_099_511_627_776_u64))]
    pub memory_mib: MiB,
    #[serde(default)]
    pub simulated: bool,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::agent_labels))]
    pub labels: BTreeMap<String, String>,
    /// GPU indices unique.
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub gpus: Vec<GpuReport>,
    /// The address tasks on this host are reached at (`--advertise-address`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9.:\\[\\]-]{1,253}$"))]
    pub address: Option<String>,
    /// A name to base the host id on (e.g. the hostname).
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 256, pattern = "^[^\\u0000]*$")
    )]
    pub name: Option<String>,
    /// The provider's id of the machine it runs on (`--provider-id`, e.g. the EC2 instance
    /// id): matches it to the machine a pool's capacity provider was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:/-]{1,256}$"))]
    pub provider_id: Option<String>,
    /// The agent's version (`tessera-agent --version`): a server refuses one its
    /// compatibility policy does not serve, naming what to upgrade. Absent: an agent
    /// before 0.2 (taken as 0.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_agent_version))]
    pub agent_version: Option<String>,
}

/// Whether `id` can be a provider's machine id: 1 to 256 letters, digits and `._:/-`.
pub fn provider_id_ok(id: &str) -> bool {
    (1..=256).contains(&id.len())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c))
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub host_id: HostId,
    /// Shown once; the server keeps only its hash.
    pub agent_token: String,
    pub sync_interval_secs: u32,
}

/// The MPS control daemon's health on the host.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsReport {
    pub healthy: bool,
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 4096, pattern = "^[^\\u0000]*$")
    )]
    pub reason: Option<String>,
    /// Times the agent restarted the daemon since it started.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 1_000_000))]
    pub restarts: Option<u32>,
}

/// A task as the agent has it. `Default` is a task that is not running and measured
/// nothing, for struct-update syntax.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskReport {
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 256, pattern = "^[^\\u0000]*$")
    )]
    pub task_id: String,
    /// `running`, or `exited` with its exit code.
    pub running: bool,
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The highest GPU memory measured since the last sync.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, maximum = 16_777_216))]
    pub gpu_memory_peak_mib: Option<MiB>,
    /// GPU memory in use now.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, maximum = 16_777_216))]
    pub gpu_memory_mib: Option<MiB>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 100))]
    pub sm_percent: Option<u32>,
    /// GPU memory allocations that failed at the task's limit since the last sync.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(maximum = 1_000_000))]
    pub memory_errors: Option<u32>,
    /// Not running yet: its image is being pulled (this image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 512))]
    pub pulling: Option<String>,
    /// Why it could not start, or ended (a refused pull: the registry's reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 2048))]
    pub error: Option<String>,
    /// It ended out of memory: which container, and whether the kernel killed it at its
    /// memory limit or its output says it ran out of GPU memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 2048))]
    pub out_of_memory: Option<String>,
    /// It ended: the last lines it wrote (each container's standard error, then its
    /// standard output, under a `==> main.err.log <==` line each), so why it ended is known
    /// once its host is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 4096))]
    pub last_output: Option<String>,
    /// Its ports and the host ports the agent bound them to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 100))]
    pub ports: Vec<TaskPort>,
    /// What its health checks say (absent: it has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthReport>,
    /// What its application completed since the previous scrape (absent: it publishes
    /// no work, or this was the first scrape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<crate::work::WorkReport>,
}

/// A task's health as its agent last checked it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReport {
    pub status: TaskHealth,
    /// The last failing check's output (or why it failed: a timeout, a refused
    /// connection), cut to 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 1024, pattern = "^[^\\u0000]*$")
    )]
    pub output: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `POST /agent/v1/sync`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncRequest {
    /// GPU indices unique.
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub gpus: Vec<GpuReport>,
    pub mps: MpsReport,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_items = 10_000))]
    pub tasks: Vec<TaskReport>,
    /// The address tasks on this host are reached at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9.:\\[\\]-]{1,253}$"))]
    pub address: Option<String>,
    /// Ports of the agent's dynamic range still free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 65535))]
    pub dynamic_ports_free: Option<u32>,
    /// What the agent can enforce here (absent: an agent older than this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<HostCapabilities>,
    /// The agent's version (`tessera-agent --version`): a server refuses one its
    /// compatibility policy does not serve, naming what to upgrade. Absent: an agent
    /// before 0.2 (taken as 0.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_agent_version))]
    pub agent_version: Option<String>,
}

/// A process the agent should run for a task.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WantedContainer {
    pub name: String,
    /// The container image, when it has one (its argv is then the image's entry point
    /// and command as `command` says, empty for the image's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// What runs: the definition's entry point, then its command.
    pub command: Vec<String>,
    /// How many of `command`'s first words are the entry point (for an image they replace
    /// its `ENTRYPOINT`, the rest its `CMD`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub entry_point_words: usize,
    /// CPU the container may use, in thousandths of a core: a hard cap where the runtime
    /// can enforce one (containers).
    #[serde(default)]
    pub cpu_milli: u64,
    /// Memory the container may use, in MiB.
    #[serde(default)]
    pub memory_mib: u64,
    /// The memory was given as a reservation only (ECS `memoryReservation`): a soft
    /// limit, not a hard one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_soft: bool,
    /// The task's own variables plus `CUDA_VISIBLE_DEVICES`, and for MPS slots
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
    /// The agent adds `CUDA_MPS_PIPE_DIRECTORY`, which only it knows.
    pub env: BTreeMap<String, String>,
    /// Secret variables: set in the process's environment, never written to the agent's
    /// state file or log.
    #[serde(default, skip_serializing_if = "SecretEnv::is_empty")]
    pub secrets: SecretEnv,
    /// Its ports; a `host_port` is fixed (placed), a missing one the agent picks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortSpec>,
    /// The user, privileges and capabilities it runs with (the definition's; its pool
    /// allowed them).
    #[serde(default, skip_serializing_if = "ContainerSecurity::is_default")]
    pub security: ContainerSecurity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Whether its exit ends the task.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub essential: bool,
    /// Containers of the task it waits for before it starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<Dependency>,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Secret environment values on their way to the one agent that runs the task. `Debug`
/// hides the values; serialization (the sync answer) carries them.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretEnv(pub BTreeMap<String, String>);

impl SecretEnv {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for SecretEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, "***")))
            .finish()
    }
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WantedTask {
    pub task_id: String,
    pub containers: Vec<WantedContainer>,
    /// Whether the task uses MPS (the agent then points it at its MPS daemon).
    pub mps: bool,
    pub stop_timeout_secs: u32,
    /// ECS `networkMode: host`: containers share the host's network (a container port is
    /// the host port).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_network: bool,
    /// Host ports the server already knows for it (what an earlier report said), so an
    /// agent that lost its state file starts it again on the same ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bound_ports: Vec<TaskPort>,
    /// Out of the endpoint list until its deregistration delay ends, then stopped: keep
    /// it running, but never start it again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
    /// Where its application publishes the work it completes: the agent scrapes it on
    /// every sync and reports what it measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<crate::work::WorkSpec>,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncResponse {
    pub host_id: HostId,
    /// Everything the host should run now; anything else it should stop.
    pub tasks: Vec<WantedTask>,
    pub sync_interval_secs: u32,
    /// The server's version, for the agent's log (absent: a server before 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_version: Option<String>,
}

/// At most [`MAX_NAME_CHARS`] characters (as JSON Schema's `maxLength` counts them), no NUL:
/// what the registration's schema says of its names (a name is shown escaped everywhere).
fn text_ok(s: &str) -> bool {
    s.chars().count() <= MAX_NAME_CHARS && !s.contains('\0')
}

/// Registration refuses the whole request for one bad GPU: a host is admitted with what
/// it says it has, or not at all.
fn check_gpus(gpus: &[GpuReport], errors: &mut Vec<FieldError>) {
    if gpus.len() > crate::limits::report::MAX_GPUS {
        errors.push(FieldError {
            field: "gpus".into(),
            message: format!("at most {} GPUs per host", crate::limits::report::MAX_GPUS),
        });
    }
    let mut indices = std::collections::BTreeSet::new();
    let mut uuids = std::collections::BTreeSet::new();
    for (i, g) in gpus.iter().enumerate() {
        let fault = sanitize::gpu_fault(g)
            .or_else(|| (!indices.insert(g.index)).then(|| "index: is reported twice".into()))
            .or_else(|| (!uuids.insert(&g.uuid)).then(|| "uuid: is reported twice".into()));
        if let Some(message) = fault {
            errors.push(FieldError {
                field: format!("gpus[{i}]"),
                message,
            });
        }
    }
}

impl RegisterRequest {
    /// Bounds on what an agent may claim; every error names its field.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = Vec::new();
        check_gpus(&self.gpus, &mut errors);
        if self.cpu_milli.0 > 100_000_000 {
            errors.push(FieldError {
                field: "cpu_milli".into(),
                message: "must be at most 100000000".into(),
            });
        }
        if self.memory_mib.0 > 1 << 40 {
            errors.push(FieldError {
                field: "memory_mib".into(),
                message: "is larger than any machine".into(),
            });
        }
        for (k, v) in &self.labels {
            if !text_ok(k) || !text_ok(v) || k.is_empty() {
                errors.push(FieldError {
                    field: format!("labels.{k}"),
                    message: "keys and values are 1 to 256 characters without NUL".into(),
                });
            }
        }
        if self
            .provider_id
            .as_deref()
            .is_some_and(|p| !provider_id_ok(p))
        {
            errors.push(FieldError {
                field: "provider_id".into(),
                message: "must be 1 to 256 letters, digits and ._:/-".into(),
            });
        }
        if self
            .address
            .as_deref()
            .is_some_and(|a| !bounds::address_ok(a))
        {
            errors.push(FieldError {
                field: "address".into(),
                message: "must be a host name or an IP address".into(),
            });
        }
        if self.name.as_deref().is_some_and(|n| !text_ok(n)) {
            errors.push(FieldError {
                field: "name".into(),
                message: "must be at most 256 characters without NUL".into(),
            });
        }
        finish(errors)
    }
}

fn finish(errors: Vec<FieldError>) -> Result<(), ValidationErrors> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors { errors })
    }
}
