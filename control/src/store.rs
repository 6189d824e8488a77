//! The store interface. Callers hold an `Arc<dyn Store>` and never see which database is
//! behind it, so the PostgreSQL backend for fleets that outgrow one machine slots in here
//! without touching them.

use crate::error::StoreError;
use crate::sqlite::SqliteStore;
use async_trait::async_trait;
use std::sync::Arc;
use tessera_model::{HostId, HostInfo, HostStatus, PoolInfo, PoolName};

/// Everything the control plane persists.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates the pool, or updates its policy and limits if it exists.
    async fn upsert_pool(&self, pool: &PoolInfo) -> Result<(), StoreError>;
    async fn list_pools(&self) -> Result<Vec<PoolInfo>, StoreError>;
    /// Creates or replaces a host and its GPUs (GPUs it no longer has are removed).
    /// The pool must exist.
    async fn upsert_host(&self, host: &HostInfo) -> Result<(), StoreError>;
    /// All hosts with their GPUs, ordered by pool then id.
    async fn list_hosts(&self) -> Result<Vec<HostInfo>, StoreError>;
    async fn get_host(&self, id: &HostId) -> Result<HostInfo, StoreError>;
    async fn set_host_status(&self, id: &HostId, status: HostStatus) -> Result<(), StoreError>;
    /// Whether a pool of this name exists.
    async fn pool_exists(&self, name: &PoolName) -> Result<bool, StoreError>;
}

/// Opens the store named by `url`: `sqlite://PATH` (the file and its directory are created
/// if missing; migrations run at open).
pub async fn open(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Err(StoreError::UnsupportedUrl {
            url: url.to_owned(),
            why: "this build has only the embedded SQLite backend; use sqlite://PATH",
        })
    } else {
        Err(StoreError::UnsupportedUrl {
            url: url.to_owned(),
            why: "expected sqlite://PATH",
        })
    }
}
