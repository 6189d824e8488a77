//! The queries of the SQL backends, written once for SQLite and PostgreSQL.
//!
//! Each backend (`crate::sqlite`, `crate::postgres`) compiles these files as its own child
//! module and gives them what differs between the two databases: the store type (`This`)
//! and sqlx's types for its database (`Db`, `DbRow`, ...), `NOW` and `INSTR`, and
//! `lock_writes` (how a write transaction excludes every other writer). The SQL itself is
//! portable: numbered parameters (`$1`), `ON CONFLICT`, `UPDATE … FROM`, integers for
//! flags, and times stored as RFC 3339 text (`crate::clock::stamp`).
//!
//! - `auth`: users, API tokens, console sessions and the audit log.
//! - `hosts`: pools and hosts; `inventory`: a host's row and GPUs as written, a sync's
//!   report, the stops of tasks on what is gone; `services`: task definitions, services,
//!   deployments; `projects`: projects and their quotas; `tasks`: tasks and placement commits; `events`: events and settings;
//!   `cluster`: servers and the scheduler lease; `fleet`: the rows changed since a
//!   reading, for the fleet read model; `usage`: measured use in buckets,
//!   consolidation plans; `machines`: machines asked of pools' capacity providers;
//!   `schema`: migrations under the compatibility policy (a newer schema, an older server).
//! - `rows`: row mapping and column lists shared by them.

mod auth;
mod cluster;
mod events;
mod fleet;
mod hosts;
mod inventory;
mod machines;
mod projects;
mod rows;
pub(crate) mod schema;
mod services;
mod tasks;
mod usage;
mod webhooks;

use rows::*;

pub(super) use super::Db;
use super::{
    DbArguments, DbConn, DbPool, DbResult, DbRow, FLEET_NEXT, INSTR, NOW, TABLE_EXISTS, This,
};
use crate::error::StoreError;
use crate::store::{
    CommitContext, EventFilter, EventStore, GpuChange, HeldCapacity, HostPage, HostPageQuery,
    HostReport, HostState, HostStore, NewTask, PendingTask, PlacementCommit, Pruned, ServiceStore,
    TaskFilter, TaskStore,
};
use async_trait::async_trait;
use sqlx::{Acquire, QueryBuilder, Row};
use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use tessera_model::auth::JoinTokenInfo;
use tessera_model::service::{
    Deployment, DeploymentConfig, DeploymentStatus, Event, GpuAllocation, Measured, Service,
    ServiceConstraints, Task, TaskDefRef, TaskDefinition, TaskState,
};
use tessera_model::taskdef::{SecretValues, TaskDefinitionSpec};
use tessera_model::time::Timestamp;
use tessera_model::{
    ComputeMilli, GpuHealth, GpuInfo, GpuUuid, HostId, HostInfo, HostStatus, MiB, MilliCpu,
    PlacementPolicy, PoolInfo, PoolName, SharingMode,
};

impl This {
    /// A write transaction (see `lock_writes`). On a fenced store it first checks that its
    /// holder still holds the scheduler lease: taking the lease is a write too, so nobody
    /// can take it before this transaction ends, and a write made in it can never land
    /// after a newer holder's.
    async fn begin_immediate(&self) -> Result<sqlx::Transaction<'static, Db>, StoreError> {
        let mut tx = self.lock_writes().await?;
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
        q: sqlx::query::Query<'q, Db, DbArguments<'q>>,
    ) -> Result<DbResult, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let done = q.execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done)
    }

    /// Gives each of `tasks` that holds capacity its allocations.
    async fn attach_allocations(&self, tasks: &mut [Task]) -> Result<(), StoreError> {
        let placed: Vec<String> = tasks
            .iter()
            .filter(|t| t.state.holds_capacity())
            .map(|t| t.id.clone())
            .collect();
        let mut allocations = self.load_allocations(&placed).await?;
        for t in tasks.iter_mut() {
            if let Some(a) = allocations.remove(&t.id) {
                t.allocations = a;
            }
        }
        Ok(())
    }

    async fn load_allocations(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, Vec<GpuAllocation>>, StoreError> {
        let mut out: HashMap<String, Vec<GpuAllocation>> = HashMap::new();
        for chunk in ids.chunks(500) {
            let mut q = QueryBuilder::<Db>::new(
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
