//! Tasks: new tasks, filters, placement commits and what their re-check reads, what a
//! prune deleted, and the `TaskStore` trait.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::service::{GpuAllocation, Task, TaskDefRef, TaskState};
use tessera_model::{HostId, HostInfo, MiB, MilliCpu, PoolInfo, PoolName};

/// A task to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    pub id: String,
    pub service: String,
    pub deployment_id: i64,
    pub task_definition: TaskDefRef,
    pub pool: PoolName,
    pub cpu: MilliCpu,
    pub memory: MiB,
    /// Its ports as planned (fixed host ports known, dynamic ones to be reported).
    pub ports: Vec<tessera_model::service::TaskPort>,
    /// `Some(Unknown)` when its definition has a health check.
    pub health: Option<tessera_model::service::TaskHealth>,
}

impl NewTask {
    /// A new task of `spec` for deployment `deployment_id` of `service`.
    pub fn of(
        id: String,
        service: &str,
        deployment_id: i64,
        task_definition: &TaskDefRef,
        pool: &PoolName,
        spec: &tessera_model::taskdef::TaskDefinitionSpec,
    ) -> NewTask {
        NewTask {
            id,
            service: service.to_owned(),
            deployment_id,
            task_definition: task_definition.clone(),
            pool: pool.clone(),
            cpu: spec.cpu(),
            memory: spec.memory(),
            ports: tessera_model::service::TaskPort::planned(spec),
            health: spec
                .has_health_check()
                .then_some(tessera_model::service::TaskHealth::Unknown),
        }
    }
}

/// Which tasks to list; `None` means any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskFilter {
    pub service: Option<String>,
    pub host: Option<HostId>,
    /// Any of these hosts (empty: no restriction).
    pub hosts: Vec<HostId>,
    pub states: Vec<TaskState>,
    pub pool: Option<PoolName>,
    /// Only tasks of this project's services.
    pub project: Option<String>,
    pub limit: Option<u32>,
    /// Newest first (the limit keeps the newest); otherwise oldest first.
    pub newest_first: bool,
    /// Leave `allocations` empty (a pass that needs only states reads less).
    pub without_allocations: bool,
}

/// A placement to commit: the task goes to `host` holding `allocations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementCommit {
    pub task_id: String,
    pub host: HostId,
    pub allocations: Vec<GpuAllocation>,
}

/// What a commit's re-check reads inside its transaction: the hosts its placements name
/// (with their GPUs and pools), what tasks hold on them now, and which of the tasks being
/// committed are still pending (with what they ask of the host).
#[derive(Debug, Clone, Default)]
pub struct CommitContext {
    pub pools: Vec<PoolInfo>,
    pub hosts: Vec<HostInfo>,
    pub holding: Vec<HeldCapacity>,
    pub pending: std::collections::HashMap<String, (MilliCpu, MiB)>,
    /// The fixed host ports each pending task needs (from its planned ports).
    pub pending_ports:
        std::collections::HashMap<String, Vec<(u16, tessera_model::taskdef::Protocol)>>,
}

/// A task waiting for a placement: what the scheduler needs of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingTask {
    pub id: String,
    pub service: String,
    pub task_definition: TaskDefRef,
    pub pool: PoolName,
}

/// What one task holds on its host.
#[derive(Debug, Clone)]
pub struct HeldCapacity {
    pub task_id: String,
    pub host: HostId,
    pub cpu: MilliCpu,
    pub memory: MiB,
    pub allocations: Vec<GpuAllocation>,
    /// The host ports it holds.
    pub ports: Vec<(u16, tessera_model::taskdef::Protocol)>,
}

/// What a prune deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub tasks: u64,
    pub events: u64,
    pub deployments: u64,
    /// Audit entries past the audit log's own retention.
    pub audit: u64,
    /// Servers not seen since the cutoff.
    pub servers: u64,
    /// Consolidation plans that finished (done, failed, cancelled) before the cutoff.
    pub plans: u64,
    /// Join tokens expired, or used up, before the cutoff.
    pub join_tokens: u64,
}

#[async_trait]
/// Tasks: their placement (commits re-checked with the engine's rules), states and use.
pub trait TaskStore: Send + Sync + 'static {
    // Tasks.
    async fn create_tasks(&self, tasks: &[NewTask]) -> Result<(), StoreError>;
    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>, StoreError>;
    /// Every pending task, oldest first, with only what placing it needs (a light query:
    /// the scheduler reads them on every pass).
    async fn list_pending(&self) -> Result<Vec<PendingTask>, StoreError>;
    /// How many tasks `filter` matches (its `limit` ignored).
    async fn count_tasks(&self, filter: &TaskFilter) -> Result<u64, StoreError>;
    async fn get_task(&self, id: &str) -> Result<Task, StoreError>;
    /// Commits placements in one transaction: it reads the [`CommitContext`] of the hosts
    /// they name under the transaction's write lock, keeps those that
    /// [`crate::capacity::verify_commits`] accepts (the engine's own rules, nothing written
    /// twice), and stores them; returns the ids committed. Placements that no longer fit
    /// (or whose task is no longer pending) are skipped.
    async fn commit_placements(
        &self,
        commits: &[PlacementCommit],
    ) -> Result<Vec<String>, StoreError>;
    /// Records why pending tasks could not be placed, or what an assigned task's host is
    /// doing before it runs; cleared when it runs.
    async fn set_placement_message(
        &self,
        task_ids: &[String],
        message: &str,
    ) -> Result<(), StoreError>;
    async fn mark_task_running(&self, id: &str) -> Result<(), StoreError>;
    /// Stops a task now: state `stopped`, its GPU allocations released. A failure counts
    /// against its deployment when `failed` is set.
    async fn mark_task_stopped(
        &self,
        id: &str,
        reason: &tessera_model::service::StopReason,
        exit_code: Option<i32>,
        failed: bool,
    ) -> Result<(), StoreError>;
    /// Asks for a task to stop: `stopping` if an agent may be running it, else `stopped`.
    /// A running task given `drain_until` (a stored time) keeps running, out of the
    /// endpoint list, until then. `failed`: the stop counts against its deployment (the
    /// circuit breaker's count), in the same transaction.
    async fn request_task_stop(
        &self,
        id: &str,
        reason: &tessera_model::service::StopReason,
        drain_until: Option<&str>,
        failed: bool,
    ) -> Result<(), StoreError>;
    /// Records what a task's agent reports of it: the host ports it bound and its health
    /// (`None`: it has no check).
    async fn record_task_serving(
        &self,
        id: &str,
        ports: &[tessera_model::service::TaskPort],
        health: Option<(tessera_model::service::TaskHealth, Option<&str>)>,
    ) -> Result<(), StoreError>;
    /// Keeps the last lines a task wrote, as its agent sent them when it ended.
    async fn set_task_last_output(&self, id: &str, text: &str) -> Result<(), StoreError>;
    /// The last lines task `id` wrote, if it ended and its agent sent them (kept apart
    /// from the task, which any viewer reads: they may hold secrets).
    async fn task_last_output(&self, id: &str) -> Result<Option<String>, StoreError>;
    /// Marks a task as being moved (its replacement starts first), or no longer.
    async fn set_task_migrating(&self, id: &str, migrating: bool) -> Result<(), StoreError>;
    /// Starts moving task `original` in one transaction: only while it still runs on
    /// `from_host` and is not moving already (compare-and-set), creates `replacement`,
    /// commits its placement if the re-check accepts it, and marks the original as moving.
    /// Returns whether it did; otherwise nothing is written.
    async fn start_move(
        &self,
        original: &str,
        from_host: &HostId,
        replacement: &NewTask,
        commit: &PlacementCommit,
    ) -> Result<bool, StoreError>;

    /// Deletes stopped tasks, events, and finished deployments without tasks, written
    /// before `before` (a stored time); returns how many of each.
    /// Deletes history older than `before` (the audit log: older than `audit_before`).
    async fn prune(&self, before: &str, audit_before: &str) -> Result<Pruned, StoreError>;
}
