//! The agent protocol: what `tessera-agent` and the server say to each other over
//! `/agent/v1`. Sync is declarative: the agent says what it has, the server answers with
//! everything it should run.

use crate::ids::{GpuUuid, HostId, PoolName};
use crate::units::{MiB, MilliCpu};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One GPU as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuReport {
    pub uuid: GpuUuid,
    pub index: u32,
    pub model: String,
    pub memory_mib: MiB,
    #[serde(default = "default_client_limit")]
    pub mps_client_limit: u32,
    pub healthy: bool,
}

fn default_client_limit() -> u32 {
    48
}

/// `POST /agent/v1/register`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterRequest {
    pub join_token: String,
    pub pool: PoolName,
    pub cpu_milli: MilliCpu,
    pub memory_mib: MiB,
    #[serde(default)]
    pub simulated: bool,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<GpuReport>,
    /// A name to base the host id on (e.g. the hostname).
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterResponse {
    pub host_id: HostId,
    /// Shown once; the server keeps only its hash.
    pub agent_token: String,
    pub sync_interval_secs: u32,
}

/// The MPS control daemon's health on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsReport {
    pub healthy: bool,
    #[serde(default)]
    pub reason: Option<String>,
}

/// A task as the agent has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskReport {
    pub task_id: String,
    /// `running`, or `exited` with its exit code.
    pub running: bool,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub gpu_memory_peak_mib: Option<MiB>,
    #[serde(default)]
    pub sm_percent: Option<u32>,
}

/// `POST /agent/v1/sync`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRequest {
    pub gpus: Vec<GpuReport>,
    pub mps: MpsReport,
    #[serde(default)]
    pub tasks: Vec<TaskReport>,
}

/// A process the agent should run for a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WantedContainer {
    pub name: String,
    pub command: Vec<String>,
    /// The task's own variables plus `CUDA_VISIBLE_DEVICES`, and for MPS slots
    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.
    /// The agent adds `CUDA_MPS_PIPE_DIRECTORY`, which only it knows.
    pub env: BTreeMap<String, String>,
    /// Secret variables: set in the process's environment, never written to the agent's
    /// state file or log.
    #[serde(default, skip_serializing_if = "SecretEnv::is_empty")]
    pub secrets: SecretEnv,
}

/// Secret environment values on their way to the one agent that runs the task. `Debug`
/// hides the values; serialization (the sync answer) carries them.
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WantedTask {
    pub task_id: String,
    pub containers: Vec<WantedContainer>,
    /// Whether the task uses MPS (the agent then points it at its MPS daemon).
    pub mps: bool,
    pub stop_timeout_secs: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncResponse {
    pub host_id: HostId,
    /// Everything the host should run now; anything else it should stop.
    pub tasks: Vec<WantedTask>,
    pub sync_interval_secs: u32,
}
