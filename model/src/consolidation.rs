//! Consolidation plans: moves that free whole GPUs or hosts, as the API and console show
//! them.

use crate::api::Density;
use crate::service::GpuAllocation;
use serde::{Deserialize, Serialize};

/// `POST /api/v1/consolidation-plans`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanInput {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::name))]
    pub pool: String,
    /// `gpus` (free whole GPUs) or `hosts` (free whole hosts).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^(gpus|hosts)$", max_length = 5)
    )]
    pub goal: String,
}

/// Where a plan is.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanStatus {
    /// Computed; nothing done.
    Planned,
    /// Its moves are being carried out, one at a time.
    Executing,
    Done,
    /// Halted at a move that failed; the moves before it stay done.
    Failed,
    /// Stopped by an operator; a move already started finishes.
    Cancelled,
}

impl PlanStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanStatus::Planned => "planned",
            PlanStatus::Executing => "executing",
            PlanStatus::Done => "done",
            PlanStatus::Failed => "failed",
            PlanStatus::Cancelled => "cancelled",
        }
    }
}

/// Where one move is.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveState {
    Pending,
    /// The replacement is placed on the target and starting; the original runs.
    Starting,
    /// The replacement runs and the original stopped.
    Done,
    Failed,
    /// Moved back: the moved service's alarm fired while the plan was watched.
    Undone,
}

/// One task moved: its replacement starts on the target before it stops.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedMove {
    pub task_id: String,
    pub service: String,
    pub from_host: String,
    pub from_gpus: Vec<u32>,
    pub to_host: String,
    pub to_gpus: Vec<u32>,
    /// What the replacement holds on the target.
    pub allocations: Vec<GpuAllocation>,
    pub state: MoveState,
    pub replacement: Option<String>,
    pub message: Option<String>,
    /// When its replacement was started (unix seconds): the moved service's alarms that
    /// fire after it undo the plan's moves of that service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<i64>,
}

/// A GPU the plan changes: GPU memory allocated before and after.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuBar {
    pub host: String,
    pub index: u32,
    pub capacity_mib: u64,
    pub before_mib: u64,
    pub after_mib: u64,
}

/// A service whose tasks a plan leaves where they are.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptService {
    pub service: String,
    pub why: String,
}

/// A consolidation plan: computed by the placement engine, committed by nothing until
/// executed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsolidationPlan {
    pub id: String,
    pub pool: String,
    pub goal: String,
    pub status: PlanStatus,
    pub created_at: crate::time::Timestamp,
    pub moves: Vec<PlannedMove>,
    /// GPUs emptied, as `host/GPU index`.
    pub frees_gpus: Vec<String>,
    pub frees_hosts: Vec<String>,
    pub density_before: Density,
    pub density_after: Density,
    pub gpus: Vec<GpuBar>,
    /// Services whose tasks stay where they are, and why.
    pub kept: Vec<KeptService>,
    /// What the moves are predicted to do to each moved service's work (from measured
    /// interference with its new neighbours); moves predicted to break a latency target
    /// are not planned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub work_effects: Vec<String>,
    /// When its last move finished (unix seconds): its moved services' alarms are watched
    /// for their bake time after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<i64>,
    /// Why it failed or stopped.
    pub message: Option<String>,
}
