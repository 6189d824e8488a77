//! The embedded SQLite backend: one file, created on first start, migrated at open.
//!
//! - `auth`: users, API tokens, console sessions and the audit log.
//! - `hosts`: pools and hosts; `services`: task definitions, services, deployments;
//!   `tasks`: tasks and placement commits; `events`: events and settings.
//! - `rows`: row mapping and column lists shared by them.

mod auth;
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
        Ok(SqliteStore { db })
    }

    /// A transaction holding SQLite's write lock from its first statement.
    async fn begin_immediate(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        Ok(self.db.begin_with("BEGIN IMMEDIATE").await?)
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
