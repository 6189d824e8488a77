//! Projects (teams) and their quotas: the `ProjectStore` trait.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::project::{Preemption, PreemptionState, Project, Usage, UsageSample};

#[async_trait]
/// Projects: who a service belongs to, and the quotas that bound its tasks.
pub trait ProjectStore: Send + Sync + 'static {
    /// Stores a new project; `Conflict` when one of that name exists.
    async fn create_project(&self, project: &Project) -> Result<(), StoreError>;
    /// Replaces an existing project's weight and quotas; `NotFound` when there is none.
    async fn replace_project(&self, project: &Project) -> Result<(), StoreError>;
    /// Every project, by name (`default` among them).
    async fn list_projects(&self) -> Result<Vec<Project>, StoreError>;
    async fn get_project(&self, name: &str) -> Result<Project, StoreError>;
    /// Deletes a project that no service belongs to (`Conflict` naming how many do: the
    /// check and the delete are one transaction).
    async fn delete_project(&self, name: &str) -> Result<(), StoreError>;
    /// Records a preemption (its `id` and `at` are the store's), keeping the newest
    /// [`PREEMPTIONS_KEPT`] decided ones (open ones are never pruned); its id.
    async fn add_preemption(&self, p: &Preemption) -> Result<i64, StoreError>;
    /// Moves preemption `id` from `from` to `to`; false when it was not in `from` (or is
    /// not there).
    async fn set_preemption_state(
        &self,
        id: i64,
        from: PreemptionState,
        to: PreemptionState,
    ) -> Result<bool, StoreError>;
    /// The newest preemptions first, at most `limit`.
    async fn list_preemptions(&self, limit: u32) -> Result<Vec<Preemption>, StoreError>;
    /// Preemptions not decided for good (proposed, approved, declined), newest first; one
    /// pool's or every pool's.
    async fn open_preemptions(&self, pool: Option<&str>) -> Result<Vec<Preemption>, StoreError>;
    async fn get_preemption(&self, id: i64) -> Result<Preemption, StoreError>;
    /// Expires every open preemption of `pool` (its preemption mode changed); how many.
    async fn expire_open_preemptions(&self, pool: &str) -> Result<u64, StoreError>;
    /// Records what each (project, pool) holds in the bucket starting at `at` (unix
    /// seconds), unless that bucket has its sample already.
    async fn record_project_usage(
        &self,
        at: i64,
        rows: &[(String, String, Usage)],
    ) -> Result<(), StoreError>;
    /// Samples from `since` (unix seconds) on, oldest first; one pool's, or every pool's.
    async fn project_usage(
        &self,
        since: i64,
        pool: Option<&str>,
    ) -> Result<Vec<UsageSample>, StoreError>;
    /// Deletes samples older than `before`; how many.
    async fn prune_project_usage(&self, before: i64) -> Result<u64, StoreError>;
}

/// How many preemptions are kept.
pub const PREEMPTIONS_KEPT: i64 = 1000;
