//! Hosts, their GPUs and the pools they belong to, as the store keeps them and the API and
//! console show them.

use crate::ids::{GpuUuid, HostId, PoolName};
use crate::time::Timestamp;
use crate::units::{MiB, MilliCpu};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// A stored or typed word that is not one of an enum's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is not one of: {allowed}")]
pub struct ParseEnumError {
    pub what: &'static str,
    pub value: String,
    pub allowed: &'static str,
}

/// Enums that are stored as text and typed by operators, with one spelling each way.
macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident, $what:literal { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl FromStr for $name {
            type Err = ParseEnumError;
            fn from_str(s: &str) -> Result<Self, ParseEnumError> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(ParseEnumError {
                        what: $what,
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
pub(crate) use text_enum;

text_enum!(
    /// Where a host stands in its lifecycle.
    HostStatus, "host status" {
        /// Healthy and accepting tasks.
        Active => "active",
        /// Set by an operator: no new tasks; running ones are moved off.
        Draining => "draining",
        /// The agent reports its MPS control daemon or a GPU unhealthy.
        Impaired => "impaired",
        /// The agent has not synced within the timeout.
        Lost => "lost",
    }
);

text_enum!(
    /// How preemption runs in a pool.
    #[derive(Default)]
    PreemptionMode, "preemption" {
        /// A plan is carried out as soon as it is found.
        #[default]
        Automatic => "automatic",
        /// A plan is proposed and waits until an operator approves it (or declines it).
        Approve => "approve",
    }
);

text_enum!(
    /// What happens to a task whose measured GPU memory (all its processes together) stays
    /// above its budget past the grace period. MPS holds each client process to the
    /// budget; a task of several processes is held to it by this.
    #[derive(Default)]
    GpuBudget, "gpu budget" {
        /// It is stopped with the reason `gpu memory over budget`.
        #[default]
        Enforce => "enforce",
        /// It keeps running; its service's events say it is over, once.
        Warn => "warn",
    }
);

text_enum!(
    /// Where a preemption stands.
    PreemptionState, "preemption state" {
        /// Waiting for an operator (a pool whose preemption is `approve`).
        Proposed => "proposed",
        /// Approved: the next pass carries it out if a fresh plan stops no other tasks
        /// (otherwise it expires and a new plan is proposed).
        Approved => "approved",
        /// Carried out: its victims were told to stop.
        Done => "done",
        /// An operator declined it: its task does not preempt again.
        Declined => "declined",
        /// Its task no longer waited when it was looked at again.
        Expired => "expired",
    }
);

text_enum!(
    /// Whether a pool gives a newly registered host tasks at once.
    #[derive(Default)]
    Admission, "admission" {
        /// Hosts that register with a valid join token get tasks at once.
        #[default]
        Auto => "auto",
        /// Hosts that register are held (no tasks, so no secrets) until an admin approves
        /// them, unless their join token was minted pre-approved.
        Manual => "manual",
    }
);

text_enum!(
    /// How a GPU is being shared right now.
    SharingMode, "sharing mode" {
        /// Nothing runs on it.
        Idle => "idle",
        /// Only MPS sharing tasks run on it, each within its memory and compute budget.
        Mps => "mps",
        /// One task holds the whole GPU.
        Dedicated => "dedicated",
    }
);

text_enum!(
    /// A GPU's health as its host's agent last reported it.
    GpuHealth, "GPU health" {
        Healthy => "healthy",
        /// For example an uncorrectable ECC error or an Xid that needs a reset.
        Unhealthy => "unhealthy",
    }
);

text_enum!(
    /// How much a service's tasks matter when a pool is short: a waiting task of a higher
    /// class, of a project within its guarantee, may have tasks of a lower class that use
    /// borrowed capacity stopped to make room (preemption). Ordered: batch < default <
    /// production.
    #[derive(Default)]
    PriorityClass, "priority class" {
        Batch => "batch",
        #[default]
        Default => "default",
        Production => "production",
    }
);

text_enum!(
    /// How a pool chooses among GPUs that have room.
    PlacementPolicy, "placement policy" {
        /// Fragmentation-aware packing: keeps free capacity in shapes the workload can use.
        Fragmentation => "fragmentation",
        /// Best fit: the GPU (and host) with the least room left that still fits.
        Binpack => "binpack",
        /// Spread tasks over hosts.
        SpreadHost => "spread_host",
        /// Spread tasks over GPUs.
        SpreadGpu => "spread_gpu",
    }
);

impl Default for PlacementPolicy {
    /// Sharing pools pack with the fragmentation-aware policy unless told otherwise.
    fn default() -> Self {
        PlacementPolicy::Fragmentation
    }
}

/// A named group of hosts with its packing policy and limits.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolInfo {
    pub name: PoolName,
    pub policy: PlacementPolicy,
    /// 1.0: compute caps are reserved (they add up to at most 100 % per GPU); above 1.0
    /// they may add up to that many times a GPU.
    pub compute_overcommit: f64,
    /// Overrides the MPS client limit of every GPU in the pool when set.
    pub mps_client_limit: Option<u32>,
    /// Whether new hosts get tasks at once or wait for an admin's approval.
    #[serde(default)]
    pub admission: Admission,
    /// Task definitions may name the user their containers run as; otherwise each task
    /// runs as a uid of its own.
    #[serde(default)]
    pub task_users: bool,
    /// Containers may be privileged.
    #[serde(default)]
    pub privileged: bool,
    /// Tasks may share the host's network (`networkMode: host`) and add the capabilities
    /// that act on a network (`NET_RAW`, `NET_ADMIN`): with them a task sees the host's
    /// loopback and LAN traffic.
    #[serde(default)]
    pub host_network: bool,
    /// Operators of a task's project (and admins) may run commands in it (`tessera
    /// exec`): off by default, since a command sees the task's secrets.
    #[serde(default)]
    pub exec: bool,
    /// Whether preemption plans are carried out at once or wait for approval.
    #[serde(default)]
    pub preemption: PreemptionMode,
    /// Whether a task over its GPU memory budget is stopped or only reported.
    #[serde(default)]
    pub gpu_budget: GpuBudget,
    /// What makes and removes its machines, and how many it may have (absent: hosts join
    /// and leave as operators make them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<crate::provider::Provider>,
}

/// One GPU as its host's agent reported it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub uuid: GpuUuid,
    /// The device index on its host (`nvidia-smi` order).
    pub index: u32,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    pub memory: MiB,
    /// How many MPS clients the GPU accepts at once (48 on Volta and later by default).
    pub mps_client_limit: u32,
    pub health: GpuHealth,
    pub sharing_mode: SharingMode,
}

/// A GPU host and its devices.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    pub id: HostId,
    pub pool: PoolName,
    pub status: HostStatus,
    /// Registered in a pool with manual admission and not yet approved: it gets no tasks
    /// (and so no secrets) until an admin approves it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// True for hosts whose GPUs are simulated (the demo fleet); the console labels them.
    pub simulated: bool,
    pub cpu: MilliCpu,
    pub memory: MiB,
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<GpuInfo>,
    /// Why it is impaired, lost or draining (absent when active, or when nothing says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    /// When its agent last synced (RFC 3339, UTC); absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<Timestamp>,
    /// Times its agent restarted the MPS control daemon (since the agent started).
    #[serde(default)]
    pub mps_restarts: u32,
    /// The address its tasks are reached at (what its agent advertises).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Ports of its agent's dynamic range still free (as last reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_ports_free: Option<u32>,
    /// GPUs its agent reports beyond what the host was admitted with, in a pool with
    /// manual admission: not capacity until an admin approves them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_gpus: Vec<PendingGpu>,
    /// What its agent can enforce there, as it last said (absent before its first sync,
    /// or from an agent that does not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<HostCapabilities>,
    /// The provider's id of the machine it runs on (an EC2 instance id), as its agent said
    /// when it joined.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// Its agent's version, as its last sync said (absent: not synced since this was
    /// recorded, or an agent before 0.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
}

/// What the agent can hold its tasks to on this host, as it found it at start: shown on
/// the host's page so an operator sees what is enforced without reading the agent's log.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCapabilities {
    /// How GPUs are found: NVML, or simulated.
    pub gpu_discovery: Capability,
    /// MPS: a control daemon per GPU (memory and compute limits per process), or
    /// time-shared GPUs and why.
    pub mps: Capability,
    /// Whether a task can open only its own GPUs' device nodes.
    pub gpu_devices: Capability,
    /// CPU, memory and pid limits (the cgroup layout).
    pub limits: Capability,
    /// Whether each task runs as a uid of its own.
    pub task_users: Capability,
    /// Whether tasks with a container image can run.
    pub containers: Capability,
}

impl HostCapabilities {
    /// Each capability with its name, in the order the console lists them.
    pub fn named(&self) -> [(&'static str, &Capability); 6] {
        [
            ("GPU discovery", &self.gpu_discovery),
            ("MPS", &self.mps),
            ("GPU device isolation", &self.gpu_devices),
            ("CPU, memory and pid limits", &self.limits),
            ("A uid per task", &self.task_users),
            ("Container images", &self.containers),
        ]
    }

    pub(crate) fn named_mut(&mut self) -> [(&'static str, &mut Capability); 6] {
        [
            ("gpu_discovery", &mut self.gpu_discovery),
            ("mps", &mut self.mps),
            ("gpu_devices", &mut self.gpu_devices),
            ("limits", &mut self.limits),
            ("task_users", &mut self.task_users),
            ("containers", &mut self.containers),
        ]
    }
}

/// One thing a host can or cannot enforce.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// Enforced (or available) on this host.
    pub held: bool,
    /// How, or why not.
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 1024, pattern = "^[^\\u0000]*$")
    )]
    pub detail: String,
}

impl Capability {
    pub fn held(detail: impl Into<String>) -> Capability {
        Capability {
            held: true,
            detail: detail.into(),
        }
    }

    pub fn missing(detail: impl Into<String>) -> Capability {
        Capability {
            held: false,
            detail: detail.into(),
        }
    }
}

/// A GPU a host's agent reports that its admission did not cover: a new one, one that
/// replaces another, or a known one whose model or memory changed. It runs nothing, and
/// is offered nothing, until an admin approves the host's inventory.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingGpu {
    pub uuid: GpuUuid,
    pub index: u32,
    pub model: String,
    pub memory: MiB,
    #[serde(default = "default_client_limit")]
    pub mps_client_limit: u32,
    /// What is new about it.
    pub why: String,
}

fn default_client_limit() -> u32 {
    crate::limits::MPS_CLIENT_LIMIT_MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_round_trip_through_text() {
        for s in HostStatus::ALL {
            assert_eq!(s.as_str().parse::<HostStatus>(), Ok(*s));
        }
        for p in PlacementPolicy::ALL {
            assert_eq!(p.as_str().parse::<PlacementPolicy>(), Ok(*p));
        }
        let err = "sleeping".parse::<HostStatus>().expect_err("not a status");
        assert!(
            err.to_string().contains("active draining impaired lost"),
            "{err}"
        );
    }

    #[test]
    fn serde_uses_the_same_spelling_as_the_store() {
        let json = serde_json::to_string(&PlacementPolicy::SpreadHost).expect("serializes");
        assert_eq!(json, "\"spread_host\"");
    }
}
