//! What the console's pages show (and the API can serve): read models the control plane
//! builds in one place (`tessera_control::Control::host_views`, `overview`, ...), so the
//! figures shown anywhere are the scheduler's own.

use crate::api::Density;
use crate::service::{Event, TaskState};
use crate::time::Timestamp;
use crate::{ComputeMilli, GpuInfo, HostInfo, HostStatus, MiB};
use serde::{Deserialize, Serialize};

/// One task's share of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotView {
    pub task_id: String,
    pub service: String,
    pub memory: MiB,
    pub compute: ComputeMilli,
    pub dedicated: bool,
    pub measured_peak: Option<MiB>,
    pub state: TaskState,
    /// Its fit verdict, where one was read.
    #[serde(default)]
    pub verdict: Option<crate::fit::Verdict>,
}

/// A GPU and what is allocated on it. Its sharing mode (in `gpu`) and the figures below
/// are the placement engine's count, with the pool's compute overcommit and MPS client
/// limit, as the scheduler sees them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub gpu: GpuInfo,
    pub slots: Vec<SlotView>,
    pub memory_allocated: MiB,
    pub compute_allocated: ComputeMilli,
    /// 1,000 per GPU times the pool's compute overcommit.
    pub compute_capacity: ComputeMilli,
    pub clients: u32,
    pub client_limit: u32,
}

impl GpuView {
    pub fn measured(&self) -> Option<MiB> {
        let peaks: Vec<MiB> = self.slots.iter().filter_map(|s| s.measured_peak).collect();
        (!peaks.is_empty()).then(|| peaks.into_iter().sum())
    }
}

/// A host with its GPUs' allocations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostView {
    pub host: HostInfo,
    pub gpus: Vec<GpuView>,
}

impl HostView {
    pub fn tasks(&self) -> usize {
        let mut ids: Vec<&str> = self
            .gpus
            .iter()
            .flat_map(|g| g.slots.iter().map(|s| s.task_id.as_str()))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// The MPS daemon's state in words, from what the agent reported.
    pub fn mps_state(&self) -> &'static str {
        match (&self.host.status, &self.host.status_reason) {
            (HostStatus::Lost, _) => "unknown",
            (_, Some(r)) if r.contains("MPS") => "unhealthy",
            _ => "healthy",
        }
    }

    /// The agent's state in words.
    pub fn agent_state(&self) -> &'static str {
        if self.host.status == HostStatus::Lost {
            "silent"
        } else {
            "syncing"
        }
    }
}

/// Filters and paging of the hosts page (its query string).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostQuery {
    pub pool: String,
    pub status: String,
    pub model: String,
    pub page: u32,
}

/// Hosts shown per page: enough to scan, few enough to render fast at any fleet size.
pub const HOSTS_PER_PAGE: usize = 24;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostsPage {
    pub hosts: Vec<HostView>,
    pub total: u32,
    pub matched: u32,
    pub page: u32,
    pub pages: u32,
    pub pools: Vec<String>,
    pub models: Vec<String>,
}

/// Pending tasks of one service and why they wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingView {
    pub service: String,
    pub count: u32,
    pub message: Option<String>,
}

/// A service whose tasks keep failing: tasks of its deployment exited on their own with a
/// non-zero code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailingView {
    pub service: String,
    pub deployment: i64,
    pub failed_tasks: u32,
    /// The latest task that failed, and how it ended.
    pub last_task: Option<String>,
    pub last_exit: Option<String>,
}

/// The overview's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverviewData {
    pub hosts_by_status: Vec<(HostStatus, u32)>,
    pub simulated_hosts: u32,
    pub gpus_idle: u32,
    pub gpus_mps: u32,
    pub gpus_dedicated: u32,
    pub memory_total: MiB,
    pub memory_allocated: MiB,
    /// Peak use the agents measured, where they report it.
    pub memory_measured: Option<MiB>,
    pub compute_total: ComputeMilli,
    pub compute_allocated: ComputeMilli,
    pub density: Density,
    /// Free GPU memory on GPUs whose free memory is too small for the smallest pending
    /// task (zero when nothing is pending).
    pub stranded_memory: MiB,
    pub smallest_pending: Option<String>,
    pub pending: Vec<PendingView>,
    /// Services whose tasks keep failing, most failures first (at most ten).
    pub failing: Vec<FailingView>,
    pub events: Vec<Event>,
}

/// A server of the control plane (`GET /api/v1/cluster`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServerView {
    pub id: String,
    /// Where it serves, as it announced.
    pub address: String,
    /// Whether it holds the scheduler lease: it runs the reconcile and scheduling loop.
    pub scheduling: bool,
    /// Since when it schedules (RFC 3339 UTC), when it does.
    pub since: Option<Timestamp>,
    pub started_at: Timestamp,
    /// Its last announcement (every tick).
    pub last_seen: Timestamp,
    /// Its version (absent: a server before 0.2, which did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The servers sharing the database, and which one schedules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterView {
    pub servers: Vec<ServerView>,
    /// The version and build of the server that answered.
    pub answered_by: crate::version::BuildInfo,
}
