//! Measured use over time, in buckets, and consolidation plans as stored.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::service::TaskDefRef;
use tessera_model::{HostId, MiB};

/// One bucket of a task's measured use.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRow {
    pub task_id: String,
    pub width_secs: i64,
    /// Unix seconds, a multiple of `width_secs`.
    pub bucket_start: i64,
    pub service: String,
    pub task_definition: TaskDefRef,
    pub host: Option<HostId>,
    pub memory_max: MiB,
    pub memory_last: MiB,
    pub sm_p50: Option<u32>,
    pub sm_p95: Option<u32>,
    pub sm_max: Option<u32>,
    pub samples: u32,
    pub memory_errors: u32,
    /// Seconds of the bucket its work was measured over, and the work completed and failed
    /// in them.
    pub work_secs: f64,
    pub completed: f64,
    pub errors: Option<f64>,
    /// Latency p50, p95, p99 in milliseconds.
    pub latency_ms: [Option<f64>; 3],
    /// The services it shared its GPU with for the whole bucket (empty: alone); `None`
    /// when they changed within it.
    pub neighbours: Option<Vec<String>>,
}

/// Which usage buckets to read: one width, from `since` (unix seconds), oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageQuery {
    pub service: Option<String>,
    /// Only this task's buckets.
    pub task: Option<String>,
    pub width_secs: i64,
    pub since: i64,
}

/// One task's buckets of one width, summed up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageSummary {
    pub task_id: String,
    pub service: String,
    pub task_definition: TaskDefRef,
    pub peak: MiB,
    /// The highest bucket SM p95.
    pub sm_p95: Option<u32>,
    /// The first bucket's start (unix seconds).
    pub first: i64,
    pub memory_errors: u64,
}

/// One point of a service's history: its buckets in one time group, summed up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageGroup {
    pub start: i64,
    pub memory_max: MiB,
    pub memory_mean: MiB,
    pub sm_mean: Option<u32>,
    pub sm_p95: Option<u32>,
    pub tasks: u32,
}

#[async_trait]
/// Measured use over time, in buckets.
pub trait UsageStore: Send + Sync + 'static {
    /// Stores buckets; a bucket already stored (written by another server, or before a
    /// restart) is merged: the larger of each figure, the samples and errors added.
    async fn record_usage(&self, rows: &[UsageRow]) -> Result<(), StoreError>;
    async fn list_usage(&self, q: &UsageQuery) -> Result<Vec<UsageRow>, StoreError>;
    /// Per task (of `q.service`, or all), its buckets summed up in one aggregate query:
    /// however many buckets, one row per task.
    async fn usage_summary(&self, q: &UsageQuery) -> Result<Vec<UsageSummary>, StoreError>;
    /// The service's buckets grouped by `group` seconds of their start, oldest first: one
    /// row per group, however many tasks.
    async fn usage_history(
        &self,
        q: &UsageQuery,
        group: i64,
    ) -> Result<Vec<UsageGroup>, StoreError>;
    /// Deletes buckets of `width_secs` that start before `before`; returns how many.
    async fn prune_usage(&self, width_secs: i64, before: i64) -> Result<u64, StoreError>;
}

/// A consolidation plan as stored: its moves and progress are the JSON `body`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPlan {
    pub id: String,
    pub pool: String,
    pub goal: String,
    pub status: String,
    pub created_at: String,
    pub body: String,
}

#[async_trait]
/// Consolidation plans.
pub trait PlanStore: Send + Sync + 'static {
    /// Creates the plan or replaces it.
    async fn save_plan(&self, plan: &StoredPlan) -> Result<(), StoreError>;
    /// Compare-and-set: stores the plan's status and body only if its stored status is
    /// still `expected`; returns whether it did.
    async fn update_plan(&self, plan: &StoredPlan, expected: &str) -> Result<bool, StoreError>;
    async fn get_plan(&self, id: &str) -> Result<StoredPlan, StoreError>;
    /// The newest plans first.
    async fn list_plans(&self, limit: u32) -> Result<Vec<StoredPlan>, StoreError>;
}
