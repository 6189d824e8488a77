//! The store interface. Callers hold an `Arc<dyn Store>` and never see which database is
//! behind it: embedded SQLite, or PostgreSQL for fleets that outgrow one machine.

use crate::error::StoreError;
use async_trait::async_trait;
use std::sync::Arc;
use tessera_model::agent::GpuReport;
use tessera_model::auth::{ApiTokenInfo, AuditEntry, JoinTokenInfo, Role, UserInfo};
use tessera_model::service::{
    Deployment, DeploymentStatus, Event, GpuAllocation, Service, Task, TaskDefRef, TaskDefinition,
    TaskState,
};
use tessera_model::taskdef::TaskDefinitionSpec;
use tessera_model::{HostId, HostInfo, HostStatus, MiB, MilliCpu, PoolInfo, PoolName};

/// Settings of a service that change in place, each `None` when it stays.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SettingsChange {
    /// `Some(None)`: back to the pool's policy.
    pub strategy: Option<Option<tessera_model::PlacementPolicy>>,
    pub constraints: Option<tessera_model::service::ServiceConstraints>,
    pub deployment: Option<tessera_model::service::DeploymentConfig>,
    pub stop_timeout_secs: Option<u32>,
    pub deregistration_delay_secs: Option<u32>,
    pub objectives: Option<tessera_model::work::Objectives>,
}

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
    pub limit: Option<u32>,
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

/// Which hosts a page of the hosts view shows: empty strings match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPageQuery {
    pub pool: String,
    pub status: String,
    /// Hosts with at least one GPU of this model.
    pub model: String,
    pub offset: u32,
    pub limit: u32,
}

/// One page of hosts, and what the filters choose from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostPage {
    pub hosts: Vec<HostInfo>,
    /// Hosts matching the filters, on every page.
    pub matched: u64,
    /// Hosts in the fleet.
    pub total: u64,
    pub pools: Vec<String>,
    pub models: Vec<String>,
}

/// A host's status and pool, without its inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostState {
    pub id: HostId,
    pub pool: PoolName,
    pub status: HostStatus,
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

/// Which events to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub service: Option<String>,
    pub host: Option<HostId>,
    /// Only events with a larger id (for live updates).
    pub after: Option<i64>,
    pub limit: u32,
}

/// What an agent's sync says about its host's GPUs (its health decides the host's status
/// through `set_host_status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReport {
    pub gpus: Vec<GpuReport>,
    /// When the report arrived, as stored (`crate::clock::stamp`).
    pub seen_at: String,
    /// What its tasks used: (task id, peak GPU memory, SM %); ids of tasks not on this
    /// host are ignored.
    pub usage: Vec<(String, Option<MiB>, Option<u32>)>,
    /// Times its agent restarted the MPS daemon, when it says.
    pub mps_restarts: Option<u32>,
}

/// What to change of a user; `None` leaves it as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserChange {
    pub role: Option<Role>,
    pub disabled: Option<bool>,
    /// A new password's hash; sessions signed in before the change end.
    pub password_hash: Option<String>,
}

/// A user as sign-in sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserCredentials {
    pub user: UserInfo,
    pub password_hash: String,
    /// Unix seconds; sessions signed in before this are void.
    pub sessions_after: i64,
}

/// An accepted mutation to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditEntry {
    pub actor: String,
    pub action: String,
    pub target: Option<String>,
    pub address: Option<String>,
}

/// Which audit entries to list, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Entries whose actor contains this.
    pub actor: Option<String>,
    /// Entries whose action or target contains this.
    pub text: Option<String>,
    /// Only entries with a smaller id (the next page).
    pub before: Option<i64>,
    pub limit: u32,
}

/// Operators, their API tokens, console sessions and the audit log.
#[async_trait]
pub trait AuthStore: Send + Sync + 'static {
    async fn count_users(&self) -> Result<u64, StoreError>;

    /// A new user; `Conflict` when the name is taken.
    async fn insert_user(
        &self,
        username: &str,
        role: Role,
        password_hash: &str,
    ) -> Result<UserInfo, StoreError>;
    async fn user_credentials(&self, username: &str)
    -> Result<Option<UserCredentials>, StoreError>;
    async fn list_users(&self) -> Result<Vec<UserInfo>, StoreError>;
    async fn update_user(&self, username: &str, change: &UserChange) -> Result<(), StoreError>;

    /// Stores a token (its hash only) and returns it as lists show it.
    async fn insert_api_token(
        &self,
        id: &str,
        name: &str,
        role: Role,
        created_by: &str,
        expires_in_days: Option<u32>,
        token_hash: &str,
    ) -> Result<ApiTokenInfo, StoreError>;
    /// The token with this hash, if it is valid now: not expired, its creator not disabled.
    async fn valid_api_token(&self, token_hash: &str) -> Result<Option<ApiTokenInfo>, StoreError>;
    async fn list_api_tokens(&self) -> Result<Vec<ApiTokenInfo>, StoreError>;
    async fn delete_api_token(&self, id: &str) -> Result<(), StoreError>;
    /// Deletes the tokens `username` made; returns how many.
    async fn delete_api_tokens_of(&self, username: &str) -> Result<u64, StoreError>;

    /// A session's data, if it exists and has not expired at `now` (unix seconds).
    async fn load_session(&self, id_hash: &str, now: i64) -> Result<Option<String>, StoreError>;
    /// Creates or replaces a session; also forgets sessions expired at `now`.
    async fn save_session(
        &self,
        id_hash: &str,
        data: &str,
        expires_at: i64,
        now: i64,
    ) -> Result<(), StoreError>;
    async fn delete_session(&self, id_hash: &str) -> Result<(), StoreError>;

    /// Counts one sign-in attempt against each of `keys`, checked and counted in one
    /// statement per key (so a burst across servers cannot slip past the limit): a key's
    /// window restarts when it began before `window_cutoff`. Returns, per key, the
    /// attempts counted in its window (this one included) and when that window began.
    async fn count_sign_in_attempt(
        &self,
        keys: &[String],
        now: &str,
        window_cutoff: &str,
    ) -> Result<Vec<(u64, String)>, StoreError>;
    /// Forgets the attempts counted against `key` (after a successful sign-in).
    async fn clear_sign_in_attempts(&self, key: &str) -> Result<(), StoreError>;
    /// Gives back one attempt counted against `key` (a sign-in that succeeded: only
    /// failures use up an address's allowance).
    async fn refund_sign_in_attempt(&self, key: &str) -> Result<(), StoreError>;

    async fn add_audit(&self, entry: &NewAuditEntry) -> Result<(), StoreError>;
    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError>;
}

/// A change of a host's GPUs that a sync brought.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuChange {
    /// A different GPU now sits at `index`; tasks on the old one were stopped.
    Replaced {
        index: u32,
        old: String,
        new: String,
        stopped: Vec<String>,
    },
    /// The agent no longer reports this GPU: unhealthy, its tasks stopped.
    Missing {
        index: u32,
        uuid: String,
        stopped: Vec<String>,
    },
}

impl std::fmt::Display for GpuChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuChange::Replaced {
                index,
                old,
                new,
                stopped,
            } => write!(
                f,
                "GPU {index} replaced ({old} → {new}); {} task(s) on the old one stopped and replaced elsewhere",
                stopped.len()
            ),
            GpuChange::Missing {
                index,
                uuid,
                stopped,
            } => write!(
                f,
                "GPU {index} ({uuid}) is missing from the agent's report: marked unhealthy; {} task(s) on it stopped and replaced elsewhere",
                stopped.len()
            ),
        }
    }
}

/// A use of minted join token `id`, taken if it has one left and has not expired at
/// `now`, in the transaction that writes the host it registers (two registrations racing
/// for the last use cannot both win, and a failed write costs none).
#[derive(Debug, Clone)]
pub struct JoinTokenUse {
    pub id: String,
    pub now: String,
}

/// How a write whose join token had no use left is refused (a `Conflict` starting with
/// this).
pub const JOIN_TOKEN_SPENT: &str = "join token spent:";

/// How a registration that lost a race for its host id is refused (a `Conflict` starting
/// with this): the caller picks another id.
pub const HOST_ID_TAKEN: &str = "host id taken:";

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
/// Pools and hosts: what the fleet is made of, and each host's lifecycle.
pub trait HostStore: Send + Sync + 'static {
    // Pools.
    /// Creates the pool, or updates its policy and limits if it exists.
    async fn upsert_pool(&self, pool: &PoolInfo) -> Result<(), StoreError>;
    async fn list_pools(&self) -> Result<Vec<PoolInfo>, StoreError>;
    async fn get_pool(&self, name: &PoolName) -> Result<PoolInfo, StoreError>;
    async fn pool_exists(&self, name: &PoolName) -> Result<bool, StoreError>;

    // Hosts.
    /// Creates or replaces a host and its GPUs (GPUs it no longer has are removed).
    async fn upsert_host(&self, host: &HostInfo) -> Result<(), StoreError>;
    /// A new host registered by an agent, with the hash of its token.
    /// Takes `join_token`'s use in the same transaction: no host without its use, no use
    /// without its host.
    async fn register_host(
        &self,
        host: &HostInfo,
        token_hash: &str,
        seen_at: &str,
        join_token: Option<&JoinTokenUse>,
    ) -> Result<(), StoreError>;
    async fn host_by_token_hash(&self, token_hash: &str) -> Result<Option<HostId>, StoreError>;
    /// Forgets a host's agent token: its agent must register again.
    async fn revoke_agent_token(&self, id: &HostId) -> Result<(), StoreError>;
    /// The host that has any of these GPUs, and whether its agent token is revoked.
    async fn host_with_gpus(
        &self,
        uuids: &[tessera_model::GpuUuid],
    ) -> Result<Option<(HostId, bool)>, StoreError>;
    /// Gives a host whose token was revoked a new agent token (it rejoins), taking
    /// `join_token`'s use in the same transaction; a `Conflict` when it has a token again.
    async fn reissue_agent_token(
        &self,
        id: &HostId,
        token_hash: &str,
        join_token: Option<&JoinTokenUse>,
    ) -> Result<(), StoreError>;
    /// Whether the host's agent token was revoked (it has none).
    async fn host_token_revoked(&self, id: &HostId) -> Result<bool, StoreError>;
    /// Holds a host for approval, or approves it.
    async fn set_host_held(&self, id: &HostId, held: bool) -> Result<(), StoreError>;

    /// Stores a minted join token (its hash only).
    async fn insert_join_token(
        &self,
        token: &JoinTokenInfo,
        token_hash: &str,
    ) -> Result<(), StoreError>;
    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenInfo>, StoreError>;
    async fn delete_join_token(&self, id: &str) -> Result<(), StoreError>;
    /// The minted join token with this hash, whatever its state.
    async fn join_token_by_hash(
        &self,
        token_hash: &str,
    ) -> Result<Option<JoinTokenInfo>, StoreError>;

    /// Removes a host that holds no task (`Conflict` otherwise) and its GPUs, so their UUIDs
    /// can join again; stopped tasks keep their history without the host.
    async fn delete_host(&self, id: &HostId) -> Result<(), StoreError>;
    /// All hosts with their GPUs, ordered by pool then id.
    async fn list_hosts(&self) -> Result<Vec<HostInfo>, StoreError>;
    /// One page of hosts matching `q` (ordered by pool then id) with their GPUs, read in a
    /// handful of queries whatever the fleet's size.
    async fn host_page(&self, q: &HostPageQuery) -> Result<HostPage, StoreError>;
    /// The hosts in one of `statuses`, ordered by pool then id (a reconcile pass looks for
    /// draining and impaired hosts: an index finds them without reading the others).
    async fn hosts_in_status(&self, statuses: &[HostStatus]) -> Result<Vec<HostState>, StoreError>;
    /// How many hosts each pool has, whatever their status.
    async fn hosts_per_pool(
        &self,
    ) -> Result<std::collections::HashMap<PoolName, usize>, StoreError>;
    async fn get_host(&self, id: &HostId) -> Result<HostInfo, StoreError>;
    async fn set_host_status(
        &self,
        id: &HostId,
        status: HostStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError>;
    /// Compare-and-set: changes the status only if it is still `expected`; returns whether
    /// it did. Status changes made from what was read earlier use this, so an operator's
    /// drain is never overwritten by a sync that read the host before it.
    async fn set_host_status_if(
        &self,
        id: &HostId,
        expected: HostStatus,
        status: HostStatus,
        reason: Option<&str>,
    ) -> Result<bool, StoreError>;
    /// In one transaction: marks the host lost, if it is not lost yet and has still not
    /// synced since `silent_since`, and stops every task it holds (reason `host lost`, GPU
    /// allocations released). Returns the tasks stopped, or `None` when the host was left
    /// as it was.
    async fn mark_host_lost(
        &self,
        id: &HostId,
        reason: &str,
        silent_since: &str,
    ) -> Result<Option<Vec<String>>, StoreError>;
    /// Stops tasks still holding capacity on lost hosts (left by a crash of an older
    /// version between two writes, or a hand edit); returns them.
    async fn stop_tasks_on_lost_hosts(&self) -> Result<Vec<String>, StoreError>;
    /// Records a sync: last seen now, GPU health and inventory, MPS health. Applied per GPU:
    /// a GPU replaced at an index (a new UUID) takes the index and the old one's tasks are
    /// stopped; a known GPU missing from the report becomes unhealthy and its tasks are
    /// stopped; the other GPUs carry on. Returns what changed, for events.
    async fn record_host_report(
        &self,
        id: &HostId,
        report: &HostReport,
    ) -> Result<Vec<GpuChange>, StoreError>;
    /// Records syncs that changed nothing but the time, many hosts at once; a time never
    /// goes back (a later full report may have been written first).
    async fn touch_hosts(&self, seen: &[(HostId, String)]) -> Result<(), StoreError>;
    /// Each task's work as its agent last measured it (JSON), written together.
    async fn set_task_work(&self, work: &[(String, String)]) -> Result<(), StoreError>;
    /// The address a host's tasks are reached at and the dynamic ports its agent has
    /// free, as it reports them.
    async fn set_host_network(
        &self,
        id: &HostId,
        address: Option<&str>,
        dynamic_ports_free: Option<u32>,
    ) -> Result<(), StoreError>;
    /// Hosts not `lost` whose last sync is older than `cutoff` (a stored time).
    async fn hosts_silent_since(&self, cutoff: &str) -> Result<Vec<HostId>, StoreError>;
}

#[async_trait]
/// Task definitions, services and their deployments: what should run.
pub trait ServiceStore: Send + Sync + 'static {
    // Task definitions.
    /// Stores `spec` as the next revision of its family.
    async fn register_task_definition(
        &self,
        spec: &TaskDefinitionSpec,
    ) -> Result<TaskDefinition, StoreError>;
    /// The latest revision of every family.
    async fn list_task_definition_families(&self) -> Result<Vec<TaskDefinition>, StoreError>;
    async fn list_task_definition_revisions(
        &self,
        family: &str,
    ) -> Result<Vec<TaskDefinition>, StoreError>;
    async fn get_task_definition(&self, r: &TaskDefRef) -> Result<TaskDefinition, StoreError>;
    async fn set_task_definition_active(
        &self,
        r: &TaskDefRef,
        active: bool,
    ) -> Result<(), StoreError>;

    // Services and deployments.
    /// Stores a new service and its first (primary) deployment.
    async fn create_service(&self, service: &Service) -> Result<(), StoreError>;
    async fn list_services(&self) -> Result<Vec<Service>, StoreError>;
    async fn get_service(&self, name: &str) -> Result<Service, StoreError>;
    /// The stop timeout of each deployment's service, in one read (deployments not found
    /// are left out).
    async fn stop_timeouts(
        &self,
        deployments: &[i64],
    ) -> Result<std::collections::HashMap<i64, u32>, StoreError>;
    async fn set_desired_count(&self, name: &str, desired: u32) -> Result<(), StoreError>;
    /// Writes the placement and rollout settings `change` gives, and only those (a
    /// concurrent change of another setting is kept); the service's name, pool, count and
    /// revision stay.
    async fn update_service_settings(
        &self,
        name: &str,
        change: &SettingsChange,
    ) -> Result<(), StoreError>;
    /// Points the service at `r` and makes a new primary deployment for it; the old
    /// primary becomes `active` (or `rolled_back` when `rollback_from` names it).
    async fn start_deployment(
        &self,
        name: &str,
        r: &TaskDefRef,
        failed_primary: bool,
    ) -> Result<i64, StoreError>;
    async fn mark_service_deleting(&self, name: &str) -> Result<(), StoreError>;
    async fn delete_service(&self, name: &str) -> Result<(), StoreError>;
    /// Deployments of a service, newest first, with their task counts.
    async fn list_deployments(&self, service: &str) -> Result<Vec<Deployment>, StoreError>;
    /// Every service's deployments, newest first.
    async fn list_all_deployments(&self) -> Result<Vec<Deployment>, StoreError>;
    async fn set_deployment_status(
        &self,
        id: i64,
        status: DeploymentStatus,
    ) -> Result<(), StoreError>;

    // What changed, by service (rows the database's triggers add; see the migration
    // `service_changes`).
    /// Changes numbered above `after`, and those recorded at or after `recent` (a
    /// transaction that took its number earlier may commit later): (number, service).
    async fn service_changes(
        &self,
        after: i64,
        recent: &str,
    ) -> Result<Vec<(i64, String)>, StoreError>;
    /// The newest change's number; 0 when there is none.
    async fn last_service_change(&self) -> Result<i64, StoreError>;
    /// Deletes the changes numbered up to `upto` recorded before `before`.
    async fn forget_service_changes(&self, upto: i64, before: &str) -> Result<(), StoreError>;
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
        reason: &str,
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
        reason: &str,
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

#[async_trait]
/// Events and settings.
pub trait EventStore: Send + Sync + 'static {
    // Events and settings.
    async fn add_event(
        &self,
        service: Option<&str>,
        host: Option<&HostId>,
        message: &str,
    ) -> Result<(), StoreError>;
    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<Event>, StoreError>;
    async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError>;
    async fn set_setting(&self, key: &str, value: &str) -> Result<(), StoreError>;
}

/// Everything the control plane persists, one trait per aggregate. Callers hold an `Arc<dyn Store>`;
/// a backend implements the parts and gets this for free.
/// Who holds the scheduler lease, from when, until when, and its epoch (which grows with
/// every new holder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    pub epoch: i64,
    /// When this holder took it (stored time).
    pub since: String,
    pub expires_at: String,
}

/// A server of the control plane as it last announced itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRow {
    pub id: String,
    pub address: String,
    pub started_at: String,
    pub last_seen_at: String,
}

#[async_trait]
/// Several servers on one database: their announcements and the scheduler lease.
pub trait ClusterStore: Send + Sync + 'static {
    /// The database's clock now, as stored times are written (RFC 3339, UTC).
    async fn db_now(&self) -> Result<String, StoreError>;
    /// Records that server `id` (reachable at `address`, up since `started_at`) is alive.
    async fn server_seen(
        &self,
        id: &str,
        address: &str,
        started_at: &str,
        now: &str,
    ) -> Result<(), StoreError>;
    /// Servers seen at `since` or later, by id.
    async fn list_servers(&self, since: &str) -> Result<Vec<ServerRow>, StoreError>;
    /// Takes or renews the lease for `holder` until `expires_at`, atomically. Renewed when
    /// `holder` holds it at epoch `held` (what this process took); taken with a new epoch
    /// when nobody holds it, when it expired before `now`, or when `holder` holds it at
    /// another epoch (an earlier run of the same server, killed or frozen: its writes are
    /// fenced off from now on). `None` when another server holds it.
    async fn acquire_lease(
        &self,
        holder: &str,
        held: Option<i64>,
        now: &str,
        expires_at: &str,
    ) -> Result<Option<Lease>, StoreError>;
    /// Lets go of the lease if `holder` has it (a clean shutdown: another server takes
    /// over at its next tick).
    async fn release_lease(&self, holder: &str) -> Result<(), StoreError>;
    async fn lease(&self) -> Result<Option<Lease>, StoreError>;
    /// The same store, whose scheduler writes (the ones a reconcile pass makes) each check
    /// in their own transaction that `fence` still holds the lease, and are refused with
    /// [`StoreError::Fenced`] otherwise.
    fn fenced(&self, fence: Fence) -> Arc<dyn Store>;
    /// Tells every server on this database that server `from` changed something
    /// (PostgreSQL: NOTIFY, delivered once the publishing transaction ends); nothing where
    /// servers cannot hear each other (SQLite).
    async fn publish_change(&self, from: &str) -> Result<(), StoreError>;
    /// What servers publish: the id of the server that changed something (this one's own
    /// included), or `None` for "some may have been missed" (the listening connection was
    /// lost and made again). `None` where the database carries no such news (SQLite).
    async fn listen_changes(
        &self,
    ) -> Result<Option<tokio::sync::mpsc::Receiver<Option<String>>>, StoreError>;
}

/// What a lease holder's writes carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub holder: String,
    pub epoch: i64,
}

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

pub trait Store:
    AuthStore
    + HostStore
    + ServiceStore
    + TaskStore
    + EventStore
    + ClusterStore
    + UsageStore
    + PlanStore
{
}

impl<
    T: AuthStore
        + HostStore
        + ServiceStore
        + TaskStore
        + EventStore
        + ClusterStore
        + UsageStore
        + PlanStore,
> Store for T
{
}
