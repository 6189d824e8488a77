//! Request and response bodies of the REST API that the console shares: service and pool
//! inputs, placement previews, service detail. Validation that needs the store lives in the
//! control plane.

use crate::ids::{HostId, PoolName};
use crate::inventory::PlacementPolicy;
use crate::service::{
    Deployment, DeploymentConfig, Event, Service, ServiceConstraints, TaskDefRef,
};
use serde::{Deserialize, Serialize};

fn default_stop_timeout() -> u32 {
    30
}

fn default_desired() -> u32 {
    1
}

/// `POST /api/v1/pools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolInput {
    pub name: String,
    #[serde(default)]
    pub policy: Option<String>,
    #[serde(default)]
    pub compute_overcommit: Option<f64>,
    #[serde(default)]
    pub mps_client_limit: Option<u32>,
}

impl PoolInput {
    /// A pool with every setting at its default (fragmentation policy, compute caps
    /// reserved, the GPUs' own MPS client limit).
    pub fn named(name: impl Into<String>) -> PoolInput {
        PoolInput {
            name: name.into(),
            policy: None,
            compute_overcommit: None,
            mps_client_limit: None,
        }
    }
}

/// `POST /api/v1/services`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceInput {
    pub name: String,
    /// `family:revision`.
    pub task_definition: String,
    pub pool: String,
    #[serde(default = "default_desired")]
    pub desired_count: u32,
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub constraints: ServiceConstraints,
    #[serde(default)]
    pub deployment: Option<DeploymentConfig>,
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_secs: u32,
}

/// `PATCH /api/v1/services/{name}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePatch {
    #[serde(default)]
    pub desired_count: Option<u32>,
    /// `family:revision`; a new revision starts a rolling deployment.
    #[serde(default)]
    pub task_definition: Option<String>,
}

/// `POST /api/v1/placement-preview`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewInput {
    pub task_definition: String,
    pub pool: String,
    pub count: u32,
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub constraints: ServiceConstraints,
}

/// Where one previewed task would go, or why it would not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviewTask {
    pub index: u32,
    pub host: Option<HostId>,
    /// Device indices on the host.
    pub gpus: Vec<u32>,
    /// The rejection sentence when it would not fit.
    pub message: Option<String>,
}

/// How densely a pool is packed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Density {
    pub gpus: u32,
    pub gpus_in_use: u32,
    /// A lower bound on the GPUs that could hold the current allocations.
    pub gpus_needed_at_least: u32,
    pub tasks_on_gpus: u32,
    pub tasks_per_gpu_in_use: f64,
    /// Allocated GPU memory as a share of all GPU memory, in %.
    pub memory_allocated_pct: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviewResult {
    pub task_definition: TaskDefRef,
    pub pool: PoolName,
    pub policy: PlacementPolicy,
    pub placed: u32,
    pub unplaced: u32,
    pub tasks: Vec<PreviewTask>,
    pub density_before: Density,
    pub density_after: Density,
}

/// `GET /api/v1/services/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceDetail {
    #[serde(flatten)]
    pub service: Service,
    pub running: u32,
    pub pending: u32,
    pub deployments: Vec<Deployment>,
    pub events: Vec<Event>,
}
