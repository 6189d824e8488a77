//! Several servers on one database: their announcements, the scheduler lease and the
//! fence its holder's writes carry.

use super::Store;
use crate::error::StoreError;
use async_trait::async_trait;
use std::sync::Arc;
use tessera_model::time::Timestamp;

/// Who holds the scheduler lease, from when, until when, and its epoch (which grows with
/// every new holder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    pub epoch: i64,
    /// When this holder took it.
    pub since: Timestamp,
    pub expires_at: Timestamp,
}

/// A server of the control plane as it last announced itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRow {
    pub id: String,
    pub address: String,
    pub started_at: Timestamp,
    pub last_seen_at: Timestamp,
    /// The version it announced (`None`: a server before 0.2).
    pub version: Option<String>,
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
        now: Timestamp,
        expires_at: Timestamp,
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
