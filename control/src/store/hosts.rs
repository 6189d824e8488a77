//! Pools and hosts: pages of the hosts view, what a sync reports, join tokens' uses, and
//! the `HostStore` trait.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::agent::GpuReport;
use tessera_model::auth::JoinTokenInfo;
use tessera_model::{HostId, HostInfo, HostStatus, MiB, PoolInfo, PoolName};

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
    /// The host of each of these GPUs that some host has, in one query.
    async fn gpu_owners(
        &self,
        uuids: &[tessera_model::GpuUuid],
    ) -> Result<Vec<(tessera_model::GpuUuid, HostId)>, StoreError>;
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
    /// The GPUs a host reports that wait for approval (none: clears them).
    async fn set_pending_gpus(
        &self,
        id: &HostId,
        pending: &[tessera_model::PendingGpu],
    ) -> Result<(), StoreError>;
    /// What a host's agent says it can enforce there.
    async fn set_host_capabilities(
        &self,
        id: &HostId,
        capabilities: &tessera_model::agent::HostCapabilities,
    ) -> Result<(), StoreError>;
    /// The version its agent said in its last sync (`None`: one before 0.2).
    async fn set_host_agent_version(
        &self,
        id: &HostId,
        version: Option<&str>,
    ) -> Result<(), StoreError>;

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
