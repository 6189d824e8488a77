//! Services, their deployments and tasks, and the events the control plane records.

use crate::ids::{GpuUuid, HostId, PoolName};
use crate::inventory::PlacementPolicy;
use crate::taskdef::TaskDefinitionSpec;
use crate::time::Timestamp;
use crate::units::{ComputeMilli, MiB};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// `family:revision`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskDefRef {
    pub family: String,
    pub revision: u32,
}

/// A `family:revision` that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not family:revision (e.g. llm-serve:3)")]
pub struct TaskDefRefError(pub String);

impl FromStr for TaskDefRef {
    type Err = TaskDefRefError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (family, revision) = s
            .rsplit_once(':')
            .ok_or_else(|| TaskDefRefError(s.to_owned()))?;
        let revision = revision
            .parse()
            .ok()
            .filter(|&r| r > 0)
            .ok_or_else(|| TaskDefRefError(s.to_owned()))?;
        if family.is_empty() {
            return Err(TaskDefRefError(s.to_owned()));
        }
        Ok(TaskDefRef {
            family: family.to_owned(),
            revision,
        })
    }
}

impl TryFrom<String> for TaskDefRef {
    type Error = TaskDefRefError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<TaskDefRef> for String {
    fn from(r: TaskDefRef) -> String {
        r.to_string()
    }
}

impl fmt::Display for TaskDefRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.family, self.revision)
    }
}

/// A registered revision. Immutable except for its status.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDefinition {
    pub family: String,
    pub revision: u32,
    /// `false` once deregistered: still describable, no new tasks.
    pub active: bool,
    pub spec: TaskDefinitionSpec,
    pub registered_at: Timestamp,
}

impl TaskDefinition {
    pub fn reference(&self) -> TaskDefRef {
        TaskDefRef {
            family: self.family.clone(),
            revision: self.revision,
        }
    }
}

/// Where a service's tasks may run, beyond the pool.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceConstraints {
    /// GPU models allowed; empty means any.
    pub gpu_models: Vec<String>,
    /// Host labels that must equal these values.
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::labels))]
    pub labels: BTreeMap<String, String>,
    /// At most one task of the service per host.
    pub distinct_hosts: bool,
    /// At most this many of its tasks share one GPU (one MPS server: a fault of one client
    /// can take down every client of that GPU).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 48))]
    pub max_per_gpu: Option<u32>,
    /// At most this many of its tasks on one host.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10000))]
    pub max_per_host: Option<u32>,
}

impl ServiceConstraints {
    /// The most tasks of the service one host may hold (1 with distinct hosts).
    pub fn host_cap(&self) -> Option<u32> {
        match (self.distinct_hosts, self.max_per_host) {
            (true, _) => Some(1),
            (false, cap) => cap,
        }
    }
}

/// How a new revision replaces the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentConfig {
    /// Running tasks never drop below this share of the desired count during a deployment.
    pub minimum_healthy_percent: u32,
    /// Live tasks (old and new) never exceed this share of the desired count.
    pub maximum_percent: u32,
}

impl Default for DeploymentConfig {
    fn default() -> Self {
        DeploymentConfig {
            minimum_healthy_percent: 100,
            maximum_percent: 200,
        }
    }
}

/// A service as stored.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub name: String,
    pub task_definition: TaskDefRef,
    pub pool: PoolName,
    /// The project it belongs to ([`DEFAULT_PROJECT`] unless it said).
    #[serde(default = "default_project")]
    pub project: String,
    /// Its tasks' priority class (`default` unless it said).
    #[serde(default)]
    pub priority: PriorityClass,
    pub desired_count: u32,
    /// Overrides the pool's placement policy when set.
    pub strategy: Option<PlacementPolicy>,
    pub constraints: ServiceConstraints,
    pub deployment: DeploymentConfig,
    pub stop_timeout_secs: u32,
    /// How long a task stopped on purpose stays out of the endpoint list, still running,
    /// before its stop signal (requests in flight finish; the load balancer lets go).
    #[serde(default = "default_deregistration_delay")]
    pub deregistration_delay_secs: u32,
    /// Its latency target, alarms, bake time and autoscaling.
    #[serde(flatten)]
    pub objectives: crate::work::Objectives,
    /// `true` after DELETE: it drains to zero tasks and is then removed.
    pub deleting: bool,
    pub created_at: Timestamp,
}

/// The project of a service that names none, and of every service from before projects.
pub const DEFAULT_PROJECT: &str = "default";

fn default_project() -> String {
    DEFAULT_PROJECT.to_owned()
}

pub use crate::inventory::PriorityClass;

/// ECS's default deregistration delay is 300 s; a GPU service's clients retry, and 5 s
/// lets a load balancer hear of the change and requests in flight finish.
pub fn default_deregistration_delay() -> u32 {
    5
}

macro_rules! word_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($variant),+ }

        impl $name {
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl FromStr for $name {
            type Err = crate::inventory::ParseEnumError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(crate::inventory::ParseEnumError {
                        what: stringify!($name),
                        value: s.to_owned(),
                        allowed: concat!($($text, " "),+),
                    }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

word_enum!(
    /// A task's lifecycle: pending (not placed) → assigned → running → stopping → stopped.
    TaskState {
        Pending => "pending",
        Assigned => "assigned",
        Running => "running",
        Stopping => "stopping",
        Stopped => "stopped",
    }
);

impl TaskState {
    /// The states in which a task holds (or is about to hold) capacity: the one list every
    /// capacity count uses.
    pub const HOLDING: [TaskState; 3] =
        [TaskState::Assigned, TaskState::Running, TaskState::Stopping];

    /// Holds (or is about to hold) capacity.
    pub fn holds_capacity(self) -> bool {
        Self::HOLDING.contains(&self)
    }

    pub fn is_live(self) -> bool {
        self != TaskState::Stopped
    }
}

word_enum!(
    /// A deployment's place in its service.
    DeploymentStatus {
        Primary => "primary",
        Active => "active",
        Completed => "completed",
        RolledBack => "rolled_back",
    }
);

/// What a placed task holds on one GPU.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuAllocation {
    pub gpu: GpuUuid,
    pub index: u32,
    pub memory: MiB,
    pub compute: ComputeMilli,
    pub dedicated: bool,
}

/// What the agent measured for a task.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measured {
    pub gpu_memory_peak: Option<MiB>,
    pub sm_percent: Option<u32>,
    /// Its application's work as last measured (absent: it publishes none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work: Option<crate::work::WorkNow>,
}

word_enum!(
    /// What a task's health checks say: `unknown` until the first check passes (or while
    /// the start period lasts), then `healthy` or `unhealthy` (after `retries` failures in
    /// a row).
    TaskHealth {
        Unknown => "unknown",
        Healthy => "healthy",
        Unhealthy => "unhealthy",
    }
);

/// A port of a placed task: the container's port and the host port it is reached at.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskPort {
    /// The container it belongs to.
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 256, pattern = "^[^\\u0000]*$")
    )]
    pub container: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 256, pattern = "^[^\\u0000]*$")
    )]
    pub name: Option<String>,
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub container_port: u16,
    /// `None` until the agent has chosen a dynamic one.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub host_port: Option<u16>,
    #[serde(default)]
    pub protocol: crate::taskdef::Protocol,
}

impl TaskPort {
    /// The ports a new task of `spec` has before its agent binds them: fixed host ports
    /// known (under host networking, the container port), dynamic ones not yet.
    pub fn planned(spec: &TaskDefinitionSpec) -> Vec<TaskPort> {
        let host = spec.host_network();
        spec.containers
            .iter()
            .flat_map(|c| {
                c.ports.iter().map(move |p| TaskPort {
                    container: c.name.clone(),
                    name: p.name.clone(),
                    container_port: p.container_port,
                    host_port: p.host_port.or(host.then_some(p.container_port)),
                    protocol: p.protocol,
                })
            })
            .collect()
    }
}

/// Why a task was stopped: what its `stop_reason` says, one variant per cause. Stored as
/// its text ([`std::fmt::Display`]), which is what the API and the console show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The service was scaled below it.
    ScaledDown,
    /// A newer deployment's task replaced it.
    Replaced,
    /// Moved off its host: its replacement runs elsewhere.
    Moved,
    /// Its service was deleted.
    Deleted,
    /// Its health check failed; a replacement started first.
    Unhealthy,
    /// Stopped to make room for a task of a higher class whose project is within its
    /// guarantee.
    Preempted {
        service: String,
        project: String,
        priority: PriorityClass,
    },
    /// A consolidation move's replacement, stopped because an alarm fired.
    MoveUndone,
    /// Stopped as asked: its agent reported it gone.
    Stopped,
    /// Its agent could not start it.
    CannotStart(String),
    /// An essential container exited (`None`: with a code nobody knows).
    Exited(Option<i32>),
    /// An essential container ended out of memory (killed by the kernel at its memory
    /// limit, or out of GPU memory as its output says), with its exit code.
    OutOfMemory {
        why: String,
        code: Option<i32>,
    },
    /// Its host no longer runs it.
    Vanished,
    /// Its pool no longer allows what it asks of the host.
    RefusedByPool {
        pool: String,
        why: String,
    },
    /// Its GPU was replaced, or is missing from its host's report.
    GpuReplaced,
    GpuMissing,
    /// Its host was declared lost.
    HostLost,
    /// Its measured GPU memory (all its processes) stayed above its budget for `secs`
    /// seconds, past the grace period, in a pool that enforces budgets.
    GpuMemoryOverBudget {
        measured: MiB,
        budget: MiB,
        secs: u64,
    },
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopReason::ScaledDown => f.write_str("scaled down"),
            StopReason::Replaced => f.write_str("replaced by a newer deployment"),
            StopReason::Moved => f.write_str("moved: its replacement runs elsewhere"),
            StopReason::Deleted => f.write_str("service deleted"),
            StopReason::Unhealthy => f.write_str("replaced: its health check failed"),
            StopReason::Preempted {
                service,
                project,
                priority,
            } => write!(
                f,
                "preempted: service {service} (project {project}, {priority}) needs the room"
            ),
            StopReason::MoveUndone => f.write_str("its move was undone: an alarm fired"),
            StopReason::Stopped => f.write_str("stopped"),
            StopReason::CannotStart(why) => write!(f, "cannot start: {why}"),
            StopReason::Exited(code) => match code {
                Some(c) => write!(f, "essential container exited with code {c}"),
                None => f.write_str("essential container exited with code unknown"),
            },
            StopReason::OutOfMemory { why, code } => match code {
                Some(c) => write!(f, "out of memory: {why} (exit code {c})"),
                None => write!(f, "out of memory: {why}"),
            },
            StopReason::Vanished => f.write_str("task no longer running on its host"),
            StopReason::RefusedByPool { pool, why } => write!(f, "refused by pool {pool}: {why}"),
            StopReason::GpuReplaced => f.write_str("GPU replaced"),
            StopReason::GpuMissing => f.write_str("GPU missing"),
            StopReason::HostLost => f.write_str("host lost"),
            StopReason::GpuMemoryOverBudget {
                measured,
                budget,
                secs,
            } => write!(
                f,
                "gpu memory over budget: {} MiB measured against {} MiB, {} MiB over, for {secs} s",
                measured.0,
                budget.0,
                measured.0.saturating_sub(budget.0)
            ),
        }
    }
}

/// One running copy of a task definition.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub service: String,
    pub deployment_id: i64,
    pub task_definition: TaskDefRef,
    pub pool: PoolName,
    /// Host CPU and memory the task reserves.
    pub cpu: crate::units::MilliCpu,
    pub memory: MiB,
    pub state: TaskState,
    /// Being moved (off a draining or impaired host, or by a consolidation plan): its
    /// replacement starts first.
    pub migrating: bool,
    pub host: Option<HostId>,
    pub allocations: Vec<GpuAllocation>,
    /// For a pending task: why it could not be placed yet; for an assigned one, what its
    /// host is doing before it runs (pulling its image).
    pub placement_message: Option<String>,
    pub stop_reason: Option<String>,
    pub exit_code: Option<i32>,
    pub measured: Measured,
    /// Its ports and the host ports they are reached at (fixed ones from placement,
    /// dynamic ones as the agent reports them).
    #[serde(default)]
    pub ports: Vec<TaskPort>,
    /// `None` when its definition has no health check (it counts as ready once running).
    #[serde(default)]
    pub health: Option<TaskHealth>,
    /// The last check's output, when it failed.
    #[serde(default)]
    pub health_output: Option<String>,
    /// While it is draining: until when it stays running, out of the endpoint list, before
    /// its stop signal.
    #[serde(default)]
    pub drain_until: Option<Timestamp>,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub stopped_at: Option<Timestamp>,
}

impl Task {
    /// How it ended, in words: `exit code 1: it exited on its own`, the code or the reason
    /// alone, or `None` when neither is known.
    pub fn how_it_ended(&self) -> Option<String> {
        match (self.exit_code, &self.stop_reason) {
            (Some(c), Some(r)) => Some(format!("exit code {c}: {r}")),
            (Some(c), None) => Some(format!("exit code {c}")),
            (None, Some(r)) => Some(r.clone()),
            (None, None) => None,
        }
    }

    /// Whether it counts as serving: running, and healthy when it has a check.
    pub fn ready(&self) -> bool {
        self.state == TaskState::Running
            && self.drain_until.is_none()
            && matches!(self.health, None | Some(TaskHealth::Healthy))
    }
}

/// A revision being rolled out (or out) for a service, with its task counts.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    pub id: i64,
    pub service: String,
    pub task_definition: TaskDefRef,
    pub status: DeploymentStatus,
    pub pending: u32,
    pub running: u32,
    /// Tasks of this deployment that stopped on their own with a non-zero exit code.
    pub failed_tasks: u32,
    pub created_at: Timestamp,
}

/// A timestamped, human-readable record on a service or a host.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub id: i64,
    pub at: Timestamp,
    pub service: Option<String>,
    pub host: Option<HostId>,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_def_refs_parse_and_print() {
        let r: TaskDefRef = "llm-serve:3".parse().expect("valid");
        assert_eq!(r.family, "llm-serve");
        assert_eq!(r.revision, 3);
        assert_eq!(r.to_string(), "llm-serve:3");
        for bad in ["llm", "llm:0", ":1", "llm:x"] {
            assert!(bad.parse::<TaskDefRef>().is_err(), "{bad}");
        }
    }
}
