//! The embedded SQLite backend: one file, created on first start, migrated at open.
//!
//! - `auth`: users, API tokens, console sessions and the audit log.
//! - `hosts`: pools and hosts; `services`: task definitions, services, deployments;
//!   `tasks`: tasks and placement commits; `events`: events and settings.
//! - `rows`: row mapping and column lists shared by them.

mod auth;
mod cluster;
mod events;
mod hosts;
mod rows;
mod services;
mod tasks;

use rows::*;

use crate::error::StoreError;
use crate::store::{
    CommitContext, EventFilter, EventStore, GpuChange, HeldCapacity, HostPage, HostPageQuery,
    HostReport, HostState, HostStore, NewTask, PendingTask, PlacementCommit, Pruned, ServiceStore,
    TaskFilter, TaskStore,
};
use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow};
use sqlx::{Acquire, QueryBuilder, Row, Sqlite, SqliteConnection, SqlitePool};
use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use tessera_model::service::{
    Deployment, DeploymentConfig, DeploymentStatus, Event, GpuAllocation, Measured, Service,
    ServiceConstraints, Task, TaskDefRef, TaskDefinition, TaskState,
};
use tessera_model::taskdef::{SecretValues, TaskDefinitionSpec};
use tessera_model::{
    ComputeMilli, GpuHealth, GpuInfo, GpuUuid, HostId, HostInfo, HostStatus, MiB, MilliCpu,
    PlacementPolicy, PoolInfo, PoolName, SharingMode,
};

/// The SQLite store. The pool of connections is shared by every request; SQLite in WAL mode
/// lets readers run beside the one writer, and writes that re-check capacity take the
/// write lock up front (`BEGIN IMMEDIATE`) so two of them can never interleave.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    db: SqlitePool,
    /// Set on the store a lease holder's reconcile passes use: each of their writes checks
    /// it in its own transaction (see [`crate::store::ClusterStore::fenced`]).
    fence: Option<crate::store::Fence>,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` (`sqlite://PATH` or `sqlite::memory:`)
    /// and applies pending migrations.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(std::time::Duration::from_secs(10))
            .journal_mode(SqliteJournalMode::Wal);
        let path = options.get_filename().to_path_buf();
        let in_memory = url.contains(":memory:");
        if let Some(dir) = path
            .parent()
            .filter(|d| !in_memory && !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::DataDir {
                path: dir.display().to_string(),
                source,
            })?;
        }
        // An in-memory database lives as long as its one connection.
        let max = if in_memory { 1 } else { 8 };
        let db = SqlitePoolOptions::new()
            .max_connections(max)
            .connect_with(options)
            .await?;
        MIGRATOR.run(&db).await?;
        tracing::info!(path = %path.display(), "store opened");
        Ok(SqliteStore { db, fence: None })
    }

    /// A transaction holding SQLite's write lock from its first statement. On a fenced
    /// store it first checks that its holder still holds the scheduler lease: under the
    /// write lock nobody can take the lease before this transaction ends, so a write made
    /// in it can never land after a newer holder's.
    async fn begin_immediate(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        let mut tx = self.db.begin_with("BEGIN IMMEDIATE").await?;
        if let Some(fence) = &self.fence {
            let current: Option<(String, i64)> =
                sqlx::query_as("SELECT holder, epoch FROM scheduler_lease WHERE one = 1")
                    .fetch_optional(&mut *tx)
                    .await?;
            if current.as_ref() != Some(&(fence.holder.clone(), fence.epoch)) {
                return Err(StoreError::Fenced {
                    holder: fence.holder.clone(),
                    epoch: fence.epoch,
                });
            }
        }
        Ok(tx)
    }

    /// Runs one write statement in its own write transaction (on a fenced store, after
    /// the fence check). A caller that gives up (a request past its timeout, its future
    /// dropped) leaves nothing behind: sqlx rolls back a transaction whose BEGIN or body
    /// was never acknowledged, where a bare statement would still run once the database
    /// lets it.
    async fn write_one<'q>(
        &self,
        q: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    ) -> Result<sqlx::sqlite::SqliteQueryResult, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let done = q.execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done)
    }

    async fn load_allocations(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, Vec<GpuAllocation>>, StoreError> {
        let mut out: HashMap<String, Vec<GpuAllocation>> = HashMap::new();
        for chunk in ids.chunks(500) {
            let mut q = QueryBuilder::<Sqlite>::new(
                "SELECT task_id, gpu_uuid, idx, memory_mib, compute_milli, dedicated FROM task_gpus WHERE task_id IN (",
            );
            let mut sep = q.separated(", ");
            for id in chunk {
                sep.push_bind(id);
            }
            q.push(") ORDER BY task_id, idx");
            for row in q.build().fetch_all(&self.db).await? {
                out.entry(row.try_get("task_id")?)
                    .or_default()
                    .push(allocation_from_row(&row)?);
            }
        }
        Ok(out)
    }
}
