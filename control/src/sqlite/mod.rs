//! The embedded SQLite backend: one file, created on first start, migrated at open.
//!
//! - `auth`: users, API tokens, console sessions and the audit log.

mod auth;

use crate::error::StoreError;
use crate::store::{
    CommitContext, EventFilter, GpuChange, HeldCapacity, HostReport, HostState, NewTask,
    PendingTask, PlacementCommit, Pruned, Store, TaskFilter,
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

const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

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

    async fn write_host(
        &self,
        host: &HostInfo,
        token_hash: Option<&str>,
        seen_at: Option<&str>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        if sqlx::query("SELECT 1 FROM pools WHERE name = ?")
            .bind(host.pool.as_str())
            .fetch_optional(&mut *tx)
            .await?
            .is_none()
        {
            return Err(StoreError::NotFound {
                what: "pool",
                id: host.pool.to_string(),
            });
        }
        let labels = serde_json::to_string(&host.labels)
            .map_err(|e| StoreError::corrupt("host labels", e))?;
        sqlx::query(
            "INSERT INTO hosts (id, pool, status, simulated, cpu_milli, memory_mib, labels, agent_token_hash, last_seen_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (id) DO UPDATE SET pool = excluded.pool, status = excluded.status,
                 simulated = excluded.simulated, cpu_milli = excluded.cpu_milli,
                 memory_mib = excluded.memory_mib, labels = excluded.labels",
        )
        .bind(host.id.as_str())
        .bind(host.pool.as_str())
        .bind(host.status.as_str())
        .bind(i64::from(host.simulated))
        .bind(host.cpu.0 as i64)
        .bind(host.memory.0 as i64)
        .bind(labels)
        .bind(token_hash)
        .bind(seen_at)
        .execute(&mut *tx)
        .await?;
        write_gpus(&mut tx, &host.id, &host.gpus).await?;
        tx.commit().await?;
        Ok(())
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

async fn write_gpus(
    conn: &mut SqliteConnection,
    host: &HostId,
    gpus: &[GpuInfo],
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM gpus WHERE host_id = ?")
        .bind(host.as_str())
        .execute(&mut *conn)
        .await?;
    for gpu in gpus {
        sqlx::query(&format!(
            "INSERT INTO gpus ({GPU_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        ))
        .bind(gpu.uuid.as_str())
        .bind(host.as_str())
        .bind(i64::from(gpu.index))
        .bind(&gpu.model)
        .bind(gpu.memory.0 as i64)
        .bind(i64::from(gpu.mps_client_limit))
        .bind(gpu.health.as_str())
        .bind(gpu.sharing_mode.as_str())
        .execute(&mut *conn)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.is_unique_violation() => StoreError::Conflict(format!(
                "GPU {} (index {}) is already registered",
                gpu.uuid, gpu.index
            )),
            _ => StoreError::Database(e),
        })?;
    }
    Ok(())
}

fn allocation_from_row(row: &SqliteRow) -> Result<GpuAllocation, StoreError> {
    Ok(GpuAllocation {
        gpu: GpuUuid::new(row.try_get::<String, _>("gpu_uuid")?)
            .map_err(|e| StoreError::corrupt("GPU UUID", e))?,
        index: row.try_get::<i64, _>("idx")? as u32,
        memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
        compute: ComputeMilli(row.try_get::<i64, _>("compute_milli")? as u32),
        dedicated: row.try_get::<i64, _>("dedicated")? != 0,
    })
}

/// `state IN (...)` over the states that hold capacity.
fn holding_states() -> String {
    let states: Vec<String> = TaskState::HOLDING
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    format!("state IN ({})", states.join(", "))
}

/// Reads, on `conn` (inside the commit's transaction), what the re-check of `commits` needs.
async fn commit_context(
    conn: &mut SqliteConnection,
    commits: &[PlacementCommit],
) -> Result<CommitContext, StoreError> {
    let mut host_ids: Vec<&str> = commits.iter().map(|c| c.host.as_str()).collect();
    host_ids.sort_unstable();
    host_ids.dedup();
    let in_list = |q: &mut QueryBuilder<'_, Sqlite>, items: &[&str]| {
        q.push(" (");
        let mut sep = q.separated(", ");
        for item in items {
            sep.push_bind(item.to_string());
        }
        q.push(")");
    };
    let mut ctx = CommitContext::default();
    let mut q =
        QueryBuilder::<Sqlite>::new(format!("SELECT {HOST_COLUMNS} FROM hosts WHERE id IN"));
    in_list(&mut q, &host_ids);
    for row in q.build().fetch_all(&mut *conn).await? {
        ctx.hosts.push(host_from_row(&row)?);
    }
    let mut q =
        QueryBuilder::<Sqlite>::new(format!("SELECT {GPU_COLUMNS} FROM gpus WHERE host_id IN"));
    in_list(&mut q, &host_ids);
    q.push(" ORDER BY host_id, idx");
    for row in q.build().fetch_all(&mut *conn).await? {
        let host: String = row.try_get("host_id")?;
        if let Some(h) = ctx.hosts.iter_mut().find(|h| h.id.as_str() == host) {
            h.gpus.push(gpu_from_row(&row)?);
        }
    }
    for row in sqlx::query(
        "SELECT name, policy, compute_overcommit, mps_client_limit FROM pools ORDER BY name",
    )
    .fetch_all(&mut *conn)
    .await?
    {
        let pool = pool_from_row(&row)?;
        if ctx.hosts.iter().any(|h| h.pool == pool.name) {
            ctx.pools.push(pool);
        }
    }
    let holding = holding_states();
    let mut q = QueryBuilder::<Sqlite>::new(format!(
        "SELECT id, host_id, cpu_milli, memory_mib FROM tasks WHERE {holding} AND host_id IN"
    ));
    in_list(&mut q, &host_ids);
    let mut index: HashMap<String, usize> = HashMap::new();
    for row in q.build().fetch_all(&mut *conn).await? {
        let task_id: String = row.try_get("id")?;
        index.insert(task_id.clone(), ctx.holding.len());
        ctx.holding.push(HeldCapacity {
            task_id,
            host: host_id(row.try_get("host_id")?)?,
            cpu: MilliCpu(row.try_get::<i64, _>("cpu_milli")? as u64),
            memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
            allocations: Vec::new(),
        });
    }
    let mut q = QueryBuilder::<Sqlite>::new(format!(
        "SELECT tg.task_id, tg.gpu_uuid, tg.idx, tg.memory_mib, tg.compute_milli, tg.dedicated
         FROM task_gpus tg JOIN tasks t ON t.id = tg.task_id WHERE t.{holding} AND t.host_id IN"
    ));
    in_list(&mut q, &host_ids);
    q.push(" ORDER BY tg.task_id, tg.idx");
    for row in q.build().fetch_all(&mut *conn).await? {
        let task: String = row.try_get("task_id")?;
        if let Some(&i) = index.get(&task) {
            ctx.holding[i].allocations.push(allocation_from_row(&row)?);
        }
    }
    let task_ids: Vec<&str> = commits.iter().map(|c| c.task_id.as_str()).collect();
    // A large plan is checked against every pending task in one query, a small one by id.
    let chunks: Vec<Option<&[&str]>> = if task_ids.len() > 500 {
        vec![None]
    } else {
        vec![Some(&task_ids[..])]
    };
    let wanted: std::collections::HashSet<&str> = task_ids.iter().copied().collect();
    for chunk in chunks {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT id, cpu_milli, memory_mib FROM tasks WHERE state = 'pending'",
        );
        if let Some(ids) = chunk {
            q.push(" AND id IN");
            in_list(&mut q, ids);
        }
        for row in q.build().fetch_all(&mut *conn).await? {
            let id: String = row.try_get("id")?;
            if !wanted.contains(id.as_str()) {
                continue;
            }
            ctx.pending.insert(
                id,
                (
                    MilliCpu(row.try_get::<i64, _>("cpu_milli")? as u64),
                    MiB(row.try_get::<i64, _>("memory_mib")? as u64),
                ),
            );
        }
    }
    Ok(ctx)
}

/// Deployments of `service` (all when `None`), newest first, with their task counts.
async fn deployments_where(
    db: &SqlitePool,
    service: Option<&str>,
) -> Result<Vec<Deployment>, StoreError> {
    let sql = format!(
        "SELECT d.id, d.service, d.family, d.revision, d.status, d.failed_tasks, d.created_at,
             (SELECT COUNT(*) FROM tasks t WHERE t.deployment_id = d.id AND t.state IN ('pending', 'assigned')) AS pending,
             (SELECT COUNT(*) FROM tasks t WHERE t.deployment_id = d.id AND t.state = 'running') AS running
         FROM deployments d {} ORDER BY d.id DESC",
        if service.is_some() { "WHERE d.service = ?" } else { "" }
    );
    let rows = match service {
        Some(name) => sqlx::query(&sql).bind(name).fetch_all(db).await?,
        None => sqlx::query(&sql).fetch_all(db).await?,
    };
    rows.iter()
        .map(|row| {
            Ok(Deployment {
                id: row.try_get("id")?,
                service: row.try_get("service")?,
                task_definition: TaskDefRef {
                    family: row.try_get("family")?,
                    revision: row.try_get::<i64, _>("revision")? as u32,
                },
                status: parse::<DeploymentStatus>("deployment status", row.try_get("status")?)?,
                pending: row.try_get::<i64, _>("pending")? as u32,
                running: row.try_get::<i64, _>("running")? as u32,
                failed_tasks: row.try_get::<i64, _>("failed_tasks")? as u32,
                created_at: row.try_get("created_at")?,
            })
        })
        .collect()
}

/// `WHERE ...` for `filter` (everything but its limit).
fn task_conditions(q: &mut QueryBuilder<'_, Sqlite>, filter: &TaskFilter) {
    q.push(" WHERE 1 = 1");
    if let Some(s) = &filter.service {
        q.push(" AND service = ").push_bind(s.clone());
    }
    if let Some(h) = &filter.host {
        q.push(" AND host_id = ").push_bind(h.to_string());
    }
    if let Some(p) = &filter.pool {
        q.push(" AND pool = ").push_bind(p.to_string());
    }
    if !filter.hosts.is_empty() {
        q.push(" AND host_id IN (");
        let mut sep = q.separated(", ");
        for h in &filter.hosts {
            sep.push_bind(h.to_string());
        }
        q.push(")");
    }
    if !filter.states.is_empty() {
        q.push(" AND state IN (");
        let mut sep = q.separated(", ");
        for s in &filter.states {
            sep.push_bind(s.as_str());
        }
        q.push(")");
    }
}

fn parse<T: FromStr>(what: &'static str, raw: &str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    raw.parse().map_err(|e| StoreError::corrupt(what, e))
}

fn pool_from_row(row: &SqliteRow) -> Result<PoolInfo, StoreError> {
    let limit: Option<i64> = row.try_get("mps_client_limit")?;
    Ok(PoolInfo {
        name: PoolName::new(row.try_get::<String, _>("name")?)
            .map_err(|e| StoreError::corrupt("pool name", e))?,
        policy: parse::<PlacementPolicy>("pool policy", row.try_get("policy")?)?,
        compute_overcommit: row.try_get("compute_overcommit")?,
        mps_client_limit: limit.map(|l| l as u32),
    })
}

fn gpu_from_row(row: &SqliteRow) -> Result<GpuInfo, StoreError> {
    Ok(GpuInfo {
        uuid: GpuUuid::new(row.try_get::<String, _>("uuid")?)
            .map_err(|e| StoreError::corrupt("GPU UUID", e))?,
        index: row.try_get::<i64, _>("idx")? as u32,
        model: row.try_get("model")?,
        memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
        mps_client_limit: row.try_get::<i64, _>("mps_client_limit")? as u32,
        health: parse::<GpuHealth>("GPU health", row.try_get("health")?)?,
        sharing_mode: parse::<SharingMode>("GPU sharing mode", row.try_get("sharing_mode")?)?,
    })
}

fn host_from_row(row: &SqliteRow) -> Result<HostInfo, StoreError> {
    let labels: String = row.try_get("labels")?;
    Ok(HostInfo {
        id: host_id(row.try_get::<String, _>("id")?)?,
        pool: PoolName::new(row.try_get::<String, _>("pool")?)
            .map_err(|e| StoreError::corrupt("host pool", e))?,
        status: parse::<HostStatus>("host status", row.try_get("status")?)?,
        simulated: row.try_get::<i64, _>("simulated")? != 0,
        cpu: MilliCpu(row.try_get::<i64, _>("cpu_milli")? as u64),
        memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
        labels: serde_json::from_str::<BTreeMap<String, String>>(&labels)
            .map_err(|e| StoreError::corrupt("host labels", e))?,
        gpus: Vec::new(),
        status_reason: row.try_get("status_reason")?,
        last_seen: row.try_get("last_seen_at")?,
    })
}

fn host_id(s: String) -> Result<HostId, StoreError> {
    HostId::new(s).map_err(|e| StoreError::corrupt("host id", e))
}

/// A stored definition with its secret values put back (they are kept in their own column).
fn task_def_from_row(row: &SqliteRow) -> Result<TaskDefinition, StoreError> {
    let spec: String = row.try_get("spec")?;
    let secrets: String = row.try_get("secrets")?;
    let mut spec = serde_json::from_str::<TaskDefinitionSpec>(&spec)
        .map_err(|e| StoreError::corrupt("task definition", e))?;
    let secrets: SecretValues = serde_json::from_str(&secrets)
        .map_err(|e| StoreError::corrupt("task definition secrets", e))?;
    if let Some(missing) = spec.fill_secrets(&secrets).first() {
        return Err(StoreError::corrupt(
            "task definition secrets",
            &missing.field,
        ));
    }
    Ok(TaskDefinition {
        family: row.try_get("family")?,
        revision: row.try_get::<i64, _>("revision")? as u32,
        active: row.try_get::<i64, _>("active")? != 0,
        spec,
        registered_at: row.try_get("registered_at")?,
    })
}

fn service_from_row(row: &SqliteRow) -> Result<Service, StoreError> {
    let strategy: Option<String> = row.try_get("strategy")?;
    let constraints: String = row.try_get("constraints")?;
    Ok(Service {
        name: row.try_get("name")?,
        task_definition: TaskDefRef {
            family: row.try_get("family")?,
            revision: row.try_get::<i64, _>("revision")? as u32,
        },
        pool: PoolName::new(row.try_get::<String, _>("pool")?)
            .map_err(|e| StoreError::corrupt("service pool", e))?,
        desired_count: row.try_get::<i64, _>("desired_count")? as u32,
        strategy: strategy
            .map(|s| parse::<PlacementPolicy>("service strategy", &s))
            .transpose()?,
        constraints: serde_json::from_str::<ServiceConstraints>(&constraints)
            .map_err(|e| StoreError::corrupt("service constraints", e))?,
        deployment: DeploymentConfig {
            minimum_healthy_percent: row.try_get::<i64, _>("minimum_healthy_percent")? as u32,
            maximum_percent: row.try_get::<i64, _>("maximum_percent")? as u32,
        },
        stop_timeout_secs: row.try_get::<i64, _>("stop_timeout_secs")? as u32,
        deleting: row.try_get::<i64, _>("deleting")? != 0,
        created_at: row.try_get("created_at")?,
    })
}

fn task_from_row(row: &SqliteRow) -> Result<Task, StoreError> {
    let host: Option<String> = row.try_get("host_id")?;
    let peak: Option<i64> = row.try_get("gpu_memory_peak_mib")?;
    let sm: Option<i64> = row.try_get("sm_percent")?;
    let exit: Option<i64> = row.try_get("exit_code")?;
    Ok(Task {
        id: row.try_get("id")?,
        service: row.try_get("service")?,
        deployment_id: row.try_get("deployment_id")?,
        task_definition: TaskDefRef {
            family: row.try_get("family")?,
            revision: row.try_get::<i64, _>("revision")? as u32,
        },
        pool: PoolName::new(row.try_get::<String, _>("pool")?)
            .map_err(|e| StoreError::corrupt("task pool", e))?,
        cpu: MilliCpu(row.try_get::<i64, _>("cpu_milli")? as u64),
        memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
        state: parse::<TaskState>("task state", row.try_get("state")?)?,
        migrating: row.try_get::<i64, _>("migrating")? != 0,
        host: host.map(host_id).transpose()?,
        allocations: Vec::new(),
        placement_message: row.try_get("placement_message")?,
        stop_reason: row.try_get("stop_reason")?,
        exit_code: exit.map(|c| c as i32),
        measured: Measured {
            gpu_memory_peak: peak.map(|p| MiB(p as u64)),
            sm_percent: sm.map(|s| s as u32),
        },
        created_at: row.try_get("created_at")?,
        started_at: row.try_get("started_at")?,
        stopped_at: row.try_get("stopped_at")?,
    })
}

fn event_from_row(row: &SqliteRow) -> Result<Event, StoreError> {
    let host: Option<String> = row.try_get("host_id")?;
    Ok(Event {
        id: row.try_get("id")?,
        at: row.try_get("at")?,
        service: row.try_get("service")?,
        host: host.map(host_id).transpose()?,
        message: row.try_get("message")?,
    })
}

fn not_found(what: &'static str, id: impl ToString) -> StoreError {
    StoreError::NotFound {
        what,
        id: id.to_string(),
    }
}

/// Stops, inside `tx`, the tasks matching `which` (an SQL condition on `tasks`, with at most
/// one `?` bound to `arg`) that hold capacity: reason `host lost`, allocations released.
async fn stop_holding_tasks(
    tx: &mut sqlx::Transaction<'static, Sqlite>,
    which: &str,
    arg: Option<&str>,
) -> Result<Vec<String>, StoreError> {
    let holding = holding_states();
    let select = format!("SELECT id FROM tasks WHERE {which} AND {holding}");
    let mut q = sqlx::query(&select);
    if let Some(a) = arg {
        q = q.bind(a);
    }
    let ids: Vec<String> = q
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(|r| r.try_get("id"))
        .collect::<Result<_, _>>()?;
    stop_task_rows(tx, &ids, "host lost").await?;
    Ok(ids)
}

/// Stops, inside `tx`, the tasks holding an allocation on GPU `uuid`, with `reason`.
async fn stop_tasks_on_gpu(
    tx: &mut sqlx::Transaction<'static, Sqlite>,
    uuid: &str,
    reason: &str,
) -> Result<Vec<String>, StoreError> {
    let ids: Vec<String> = sqlx::query("SELECT DISTINCT task_id FROM task_gpus WHERE gpu_uuid = ?")
        .bind(uuid)
        .fetch_all(&mut **tx)
        .await?
        .iter()
        .map(|r| r.try_get("task_id"))
        .collect::<Result<_, _>>()?;
    stop_task_rows(tx, &ids, reason).await?;
    Ok(ids)
}

/// Inside `tx`: tasks `ids` stopped now with `reason` (unless stopped already), their GPU
/// allocations released.
async fn stop_task_rows(
    tx: &mut sqlx::Transaction<'static, Sqlite>,
    ids: &[String],
    reason: &str,
) -> Result<(), StoreError> {
    for id in ids {
        sqlx::query(&format!(
            "UPDATE tasks SET state = 'stopped', stopped_at = {NOW},
                 stop_reason = COALESCE(stop_reason, ?) WHERE id = ? AND state != 'stopped'"
        ))
        .bind(reason)
        .bind(id)
        .execute(&mut **tx)
        .await?;
        sqlx::query("DELETE FROM task_gpus WHERE task_id = ?")
            .bind(id)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// An update of one row by key: no row changed means no such `what`.
fn updated(
    done: sqlx::sqlite::SqliteQueryResult,
    what: &'static str,
    id: impl ToString,
) -> Result<(), StoreError> {
    if done.rows_affected() == 0 {
        Err(not_found(what, id))
    } else {
        Ok(())
    }
}

const HOST_COLUMNS: &str =
    "id, pool, status, simulated, cpu_milli, memory_mib, labels, status_reason, last_seen_at";
const GPU_COLUMNS: &str =
    "uuid, host_id, idx, model, memory_mib, mps_client_limit, health, sharing_mode";
const TASK_COLUMNS: &str = "id, service, deployment_id, family, revision, pool, cpu_milli, memory_mib, state, migrating, host_id, placement_message, \
     stop_reason, exit_code, gpu_memory_peak_mib, sm_percent, created_at, started_at, stopped_at";
const SERVICE_COLUMNS: &str = "name, family, revision, pool, desired_count, strategy, constraints, \
     minimum_healthy_percent, maximum_percent, stop_timeout_secs, deleting, created_at";

#[async_trait]
impl Store for SqliteStore {
    async fn upsert_pool(&self, pool: &PoolInfo) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO pools (name, policy, compute_overcommit, mps_client_limit) VALUES (?, ?, ?, ?)
             ON CONFLICT (name) DO UPDATE SET policy = excluded.policy,
                 compute_overcommit = excluded.compute_overcommit, mps_client_limit = excluded.mps_client_limit",
        )
        .bind(pool.name.as_str())
        .bind(pool.policy.as_str())
        .bind(pool.compute_overcommit)
        .bind(pool.mps_client_limit.map(i64::from))
        .execute(&self.db)
        .await?;
        Ok(())
    }

    async fn list_pools(&self) -> Result<Vec<PoolInfo>, StoreError> {
        sqlx::query(
            "SELECT name, policy, compute_overcommit, mps_client_limit FROM pools ORDER BY name",
        )
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(pool_from_row)
        .collect()
    }

    async fn get_pool(&self, name: &PoolName) -> Result<PoolInfo, StoreError> {
        let row = sqlx::query(
            "SELECT name, policy, compute_overcommit, mps_client_limit FROM pools WHERE name = ?",
        )
        .bind(name.as_str())
        .fetch_optional(&self.db)
        .await?
        .ok_or_else(|| not_found("pool", name))?;
        pool_from_row(&row)
    }

    async fn pool_exists(&self, name: &PoolName) -> Result<bool, StoreError> {
        let found = sqlx::query("SELECT 1 FROM pools WHERE name = ?")
            .bind(name.as_str())
            .fetch_optional(&self.db)
            .await?;
        Ok(found.is_some())
    }

    async fn upsert_host(&self, host: &HostInfo) -> Result<(), StoreError> {
        self.write_host(host, None, None).await
    }

    async fn register_host(
        &self,
        host: &HostInfo,
        token_hash: &str,
        seen_at: &str,
    ) -> Result<(), StoreError> {
        self.write_host(host, Some(token_hash), Some(seen_at)).await
    }

    async fn host_by_token_hash(&self, token_hash: &str) -> Result<Option<HostId>, StoreError> {
        let row = sqlx::query("SELECT id FROM hosts WHERE agent_token_hash = ?")
            .bind(token_hash)
            .fetch_optional(&self.db)
            .await?;
        row.map(|r| host_id(r.try_get("id")?)).transpose()
    }

    async fn revoke_agent_token(&self, id: &HostId) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE hosts SET agent_token_hash = NULL WHERE id = ?")
            .bind(id.as_str())
            .execute(&self.db)
            .await?;
        updated(done, "host", id)
    }

    async fn host_with_gpus(
        &self,
        uuids: &[GpuUuid],
    ) -> Result<Option<(HostId, bool)>, StoreError> {
        for uuid in uuids {
            let row = sqlx::query(
                "SELECT h.id, h.agent_token_hash IS NULL AS revoked FROM gpus g JOIN hosts h ON h.id = g.host_id
                 WHERE g.uuid = ?",
            )
            .bind(uuid.as_str())
            .fetch_optional(&self.db)
            .await?;
            if let Some(r) = row {
                return Ok(Some((
                    host_id(r.try_get("id")?)?,
                    r.try_get::<i64, _>("revoked")? != 0,
                )));
            }
        }
        Ok(None)
    }

    async fn reissue_agent_token(&self, id: &HostId, token_hash: &str) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE hosts SET agent_token_hash = ? WHERE id = ?")
            .bind(token_hash)
            .bind(id.as_str())
            .execute(&self.db)
            .await?;
        updated(done, "host", id)
    }

    async fn delete_host(&self, id: &HostId) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        let holding: i64 =
            sqlx::query("SELECT COUNT(*) AS n FROM tasks WHERE host_id = ? AND state <> 'stopped'")
                .bind(id.as_str())
                .fetch_one(&mut *tx)
                .await?
                .try_get("n")?;
        if holding > 0 {
            return Err(StoreError::Conflict(format!(
                "host {id} still has {holding} task(s); drain it and wait until they have stopped"
            )));
        }
        sqlx::query("UPDATE tasks SET host_id = NULL WHERE host_id = ?")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query("DELETE FROM hosts WHERE id = ?")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        updated(done, "host", id)?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_hosts(&self) -> Result<Vec<HostInfo>, StoreError> {
        let mut hosts: Vec<HostInfo> = sqlx::query(&format!(
            "SELECT {HOST_COLUMNS} FROM hosts ORDER BY pool, id"
        ))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(host_from_row)
        .collect::<Result<_, _>>()?;
        let position: HashMap<String, usize> = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (h.id.to_string(), i))
            .collect();
        for row in sqlx::query(&format!(
            "SELECT {GPU_COLUMNS} FROM gpus ORDER BY host_id, idx"
        ))
        .fetch_all(&self.db)
        .await?
        {
            let host_id: String = row.try_get("host_id")?;
            if let Some(&i) = position.get(&host_id) {
                hosts[i].gpus.push(gpu_from_row(&row)?);
            }
        }
        Ok(hosts)
    }

    async fn host_statuses(&self) -> Result<Vec<HostState>, StoreError> {
        sqlx::query("SELECT id, pool, status FROM hosts ORDER BY pool, id")
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(|row| {
                Ok(HostState {
                    id: host_id(row.try_get("id")?)?,
                    pool: PoolName::new(row.try_get::<String, _>("pool")?)
                        .map_err(|e| StoreError::corrupt("host pool", e))?,
                    status: parse::<HostStatus>("host status", row.try_get("status")?)?,
                })
            })
            .collect()
    }

    async fn get_host(&self, id: &HostId) -> Result<HostInfo, StoreError> {
        let row = sqlx::query(&format!("SELECT {HOST_COLUMNS} FROM hosts WHERE id = ?"))
            .bind(id.as_str())
            .fetch_optional(&self.db)
            .await?
            .ok_or_else(|| not_found("host", id))?;
        let mut host = host_from_row(&row)?;
        host.gpus = sqlx::query(&format!(
            "SELECT {GPU_COLUMNS} FROM gpus WHERE host_id = ? ORDER BY idx"
        ))
        .bind(id.as_str())
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(gpu_from_row)
        .collect::<Result<_, _>>()?;
        Ok(host)
    }

    async fn set_host_status(
        &self,
        id: &HostId,
        status: HostStatus,
        reason: Option<&str>,
    ) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE hosts SET status = ?, status_reason = ? WHERE id = ?")
            .bind(status.as_str())
            .bind(reason)
            .bind(id.as_str())
            .execute(&self.db)
            .await?;
        updated(done, "host", id)
    }

    async fn set_host_status_if(
        &self,
        id: &HostId,
        expected: HostStatus,
        status: HostStatus,
        reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE hosts SET status = ?, status_reason = ? WHERE id = ? AND status = ?",
        )
        .bind(status.as_str())
        .bind(reason)
        .bind(id.as_str())
        .bind(expected.as_str())
        .execute(&self.db)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn mark_host_lost(
        &self,
        id: &HostId,
        reason: &str,
        silent_since: &str,
    ) -> Result<Option<Vec<String>>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let marked = sqlx::query(
            "UPDATE hosts SET status = 'lost', status_reason = ?
             WHERE id = ? AND status != 'lost' AND last_seen_at IS NOT NULL AND last_seen_at < ?",
        )
        .bind(reason)
        .bind(id.as_str())
        .bind(silent_since)
        .execute(&mut *tx)
        .await?;
        if marked.rows_affected() == 0 {
            return Ok(None);
        }
        let stopped = stop_holding_tasks(&mut tx, "host_id = ?", Some(id.as_str())).await?;
        tx.commit().await?;
        Ok(Some(stopped))
    }

    async fn stop_tasks_on_lost_hosts(&self) -> Result<Vec<String>, StoreError> {
        const ON_LOST: &str = "host_id IN (SELECT id FROM hosts WHERE status = 'lost')";
        // Every pass sweeps: look first, so a pass with nothing to do takes no write lock.
        let any = sqlx::query(&format!(
            "SELECT 1 FROM tasks WHERE {ON_LOST} AND {} LIMIT 1",
            holding_states()
        ))
        .fetch_optional(&self.db)
        .await?;
        if any.is_none() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_immediate().await?;
        let stopped = stop_holding_tasks(&mut tx, ON_LOST, None).await?;
        tx.commit().await?;
        Ok(stopped)
    }

    async fn record_host_report(
        &self,
        id: &HostId,
        report: &HostReport,
    ) -> Result<Vec<GpuChange>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        sqlx::query("UPDATE hosts SET last_seen_at = ? WHERE id = ?")
            .bind(&report.seen_at)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        let known: Vec<(String, i64, String)> =
            sqlx::query("SELECT uuid, idx, health FROM gpus WHERE host_id = ?")
                .bind(id.as_str())
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| Ok((r.try_get("uuid")?, r.try_get("idx")?, r.try_get("health")?)))
                .collect::<Result<_, sqlx::Error>>()?;
        let mut changes = Vec::new();
        for (uuid, idx, health) in &known {
            let reported_here = report.gpus.iter().find(|g| i64::from(g.index) == *idx);
            let still_reported = report.gpus.iter().any(|g| g.uuid.as_str() == uuid);
            match reported_here {
                Some(g) if g.uuid.as_str() != uuid => {
                    // Replaced at this index: the old GPU and what ran on it are gone.
                    let stopped = stop_tasks_on_gpu(&mut tx, uuid, "GPU replaced").await?;
                    sqlx::query("DELETE FROM gpus WHERE uuid = ?")
                        .bind(uuid)
                        .execute(&mut *tx)
                        .await?;
                    changes.push(GpuChange::Replaced {
                        index: *idx as u32,
                        old: uuid.clone(),
                        new: g.uuid.to_string(),
                        stopped,
                    });
                }
                None if !still_reported && health == "healthy" => {
                    let stopped = stop_tasks_on_gpu(&mut tx, uuid, "GPU missing").await?;
                    sqlx::query("UPDATE gpus SET health = 'unhealthy' WHERE uuid = ?")
                        .bind(uuid)
                        .execute(&mut *tx)
                        .await?;
                    changes.push(GpuChange::Missing {
                        index: *idx as u32,
                        uuid: uuid.clone(),
                        stopped,
                    });
                }
                _ => {}
            }
        }
        for g in &report.gpus {
            sqlx::query(
                "INSERT INTO gpus (uuid, host_id, idx, model, memory_mib, mps_client_limit, health) VALUES (?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (uuid) DO UPDATE SET health = excluded.health, model = excluded.model,
                     mps_client_limit = excluded.mps_client_limit
                 WHERE gpus.host_id = excluded.host_id",
            )
            .bind(g.uuid.as_str())
            .bind(id.as_str())
            .bind(i64::from(g.index))
            .bind(&g.model)
            .bind(g.memory_mib.0 as i64)
            .bind(i64::from(g.mps_client_limit))
            .bind(if g.healthy { "healthy" } else { "unhealthy" })
            .execute(&mut *tx)
            .await?;
        }
        // Sharing modes follow from what is allocated.
        sqlx::query(
            "UPDATE gpus SET sharing_mode =
                 (SELECT CASE WHEN COUNT(*) = 0 THEN 'idle' WHEN MAX(tg.dedicated) = 1 THEN 'dedicated' ELSE 'mps' END
                  FROM task_gpus tg WHERE tg.gpu_uuid = gpus.uuid)
             WHERE host_id = ?",
        )
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(changes)
    }

    async fn hosts_silent_since(&self, cutoff: &str) -> Result<Vec<HostId>, StoreError> {
        let rows = sqlx::query(
            "SELECT id FROM hosts WHERE status != 'lost' AND last_seen_at IS NOT NULL
             AND last_seen_at < ? ORDER BY id",
        )
        .bind(cutoff)
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(|r| host_id(r.try_get("id")?)).collect()
    }

    async fn host_status_reason(&self, id: &HostId) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT status_reason FROM hosts WHERE id = ?")
            .bind(id.as_str())
            .fetch_optional(&self.db)
            .await?
            .ok_or_else(|| not_found("host", id))?;
        Ok(row.try_get("status_reason")?)
    }

    async fn register_task_definition(
        &self,
        spec: &TaskDefinitionSpec,
    ) -> Result<TaskDefinition, StoreError> {
        // Serializing a spec never writes secret values; they go to their own column.
        let json =
            serde_json::to_string(spec).map_err(|e| StoreError::corrupt("task definition", e))?;
        let secrets = serde_json::to_string(&spec.secret_values())
            .map_err(|e| StoreError::corrupt("task definition secrets", e))?;
        let mut tx = self.begin_immediate().await?;
        let next: i64 = sqlx::query(
            "SELECT COALESCE(MAX(revision), 0) + 1 AS next FROM task_definitions WHERE family = ?",
        )
        .bind(&spec.family)
        .fetch_one(&mut *tx)
        .await?
        .try_get("next")?;
        let row = sqlx::query(
            "INSERT INTO task_definitions (family, revision, spec, secrets) VALUES (?, ?, ?, ?)
             RETURNING family, revision, active, spec, secrets, registered_at",
        )
        .bind(&spec.family)
        .bind(next)
        .bind(json)
        .bind(secrets)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        task_def_from_row(&row)
    }

    async fn list_task_definition_families(&self) -> Result<Vec<TaskDefinition>, StoreError> {
        sqlx::query(
            "SELECT family, revision, active, spec, secrets, registered_at FROM task_definitions t
             WHERE revision = (SELECT MAX(revision) FROM task_definitions u WHERE u.family = t.family)
             ORDER BY family",
        )
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(task_def_from_row)
        .collect()
    }

    async fn list_task_definition_revisions(
        &self,
        family: &str,
    ) -> Result<Vec<TaskDefinition>, StoreError> {
        let defs: Vec<TaskDefinition> = sqlx::query(
            "SELECT family, revision, active, spec, secrets, registered_at FROM task_definitions WHERE family = ? ORDER BY revision",
        )
        .bind(family)
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(task_def_from_row)
        .collect::<Result<_, _>>()?;
        if defs.is_empty() {
            return Err(not_found("task definition family", family));
        }
        Ok(defs)
    }

    async fn get_task_definition(&self, r: &TaskDefRef) -> Result<TaskDefinition, StoreError> {
        let row = sqlx::query(
            "SELECT family, revision, active, spec, secrets, registered_at FROM task_definitions WHERE family = ? AND revision = ?",
        )
        .bind(&r.family)
        .bind(i64::from(r.revision))
        .fetch_optional(&self.db)
        .await?
        .ok_or_else(|| not_found("task definition", r))?;
        task_def_from_row(&row)
    }

    async fn set_task_definition_active(
        &self,
        r: &TaskDefRef,
        active: bool,
    ) -> Result<(), StoreError> {
        let done =
            sqlx::query("UPDATE task_definitions SET active = ? WHERE family = ? AND revision = ?")
                .bind(i64::from(active))
                .bind(&r.family)
                .bind(i64::from(r.revision))
                .execute(&self.db)
                .await?;
        updated(done, "task definition", r)
    }

    async fn create_service(&self, s: &Service) -> Result<(), StoreError> {
        let constraints = serde_json::to_string(&s.constraints)
            .map_err(|e| StoreError::corrupt("service constraints", e))?;
        let mut tx = self.begin_immediate().await?;
        sqlx::query(
            "INSERT INTO services (name, family, revision, pool, desired_count, strategy, constraints,
                 minimum_healthy_percent, maximum_percent, stop_timeout_secs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&s.name)
        .bind(&s.task_definition.family)
        .bind(i64::from(s.task_definition.revision))
        .bind(s.pool.as_str())
        .bind(i64::from(s.desired_count))
        .bind(s.strategy.map(|p| p.as_str()))
        .bind(constraints)
        .bind(i64::from(s.deployment.minimum_healthy_percent))
        .bind(i64::from(s.deployment.maximum_percent))
        .bind(i64::from(s.stop_timeout_secs))
        .execute(&mut *tx)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.is_unique_violation() => {
                StoreError::Conflict(format!("a service named {:?} already exists", s.name))
            }
            _ => StoreError::Database(e),
        })?;
        sqlx::query("INSERT INTO deployments (service, family, revision, status) VALUES (?, ?, ?, 'primary')")
            .bind(&s.name)
            .bind(&s.task_definition.family)
            .bind(i64::from(s.task_definition.revision))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_services(&self) -> Result<Vec<Service>, StoreError> {
        sqlx::query(&format!(
            "SELECT {SERVICE_COLUMNS} FROM services ORDER BY name"
        ))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(service_from_row)
        .collect()
    }

    async fn get_service(&self, name: &str) -> Result<Service, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {SERVICE_COLUMNS} FROM services WHERE name = ?"
        ))
        .bind(name)
        .fetch_optional(&self.db)
        .await?
        .ok_or_else(|| not_found("service", name))?;
        service_from_row(&row)
    }

    async fn set_desired_count(&self, name: &str, desired: u32) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE services SET desired_count = ? WHERE name = ?")
            .bind(i64::from(desired))
            .bind(name)
            .execute(&self.db)
            .await?;
        updated(done, "service", name)
    }

    async fn start_deployment(
        &self,
        name: &str,
        r: &TaskDefRef,
        failed_primary: bool,
    ) -> Result<i64, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let done = sqlx::query("UPDATE services SET family = ?, revision = ? WHERE name = ?")
            .bind(&r.family)
            .bind(i64::from(r.revision))
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("service", name));
        }
        let old = if failed_primary {
            "rolled_back"
        } else {
            "active"
        };
        sqlx::query("UPDATE deployments SET status = ? WHERE service = ? AND status = 'primary'")
            .bind(old)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let id: i64 = sqlx::query(
            "INSERT INTO deployments (service, family, revision, status) VALUES (?, ?, ?, 'primary') RETURNING id",
        )
        .bind(name)
        .bind(&r.family)
        .bind(i64::from(r.revision))
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        tx.commit().await?;
        Ok(id)
    }

    async fn mark_service_deleting(&self, name: &str) -> Result<(), StoreError> {
        let done =
            sqlx::query("UPDATE services SET deleting = 1, desired_count = 0 WHERE name = ?")
                .bind(name)
                .execute(&self.db)
                .await?;
        updated(done, "service", name)
    }

    async fn delete_service(&self, name: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM services WHERE name = ?")
            .bind(name)
            .execute(&self.db)
            .await?;
        Ok(())
    }

    async fn list_deployments(&self, service: &str) -> Result<Vec<Deployment>, StoreError> {
        deployments_where(&self.db, Some(service)).await
    }

    async fn list_all_deployments(&self) -> Result<Vec<Deployment>, StoreError> {
        deployments_where(&self.db, None).await
    }

    async fn set_deployment_status(
        &self,
        id: i64,
        status: DeploymentStatus,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE deployments SET status = ? WHERE id = ?")
            .bind(status.as_str())
            .bind(id)
            .execute(&self.db)
            .await?;
        Ok(())
    }

    async fn create_tasks(&self, tasks: &[NewTask]) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        for chunk in tasks.chunks(200) {
            let mut q = QueryBuilder::<Sqlite>::new(
                "INSERT INTO tasks (id, service, deployment_id, family, revision, pool, cpu_milli, memory_mib, state) ",
            );
            q.push_values(chunk, |mut b, t| {
                b.push_bind(&t.id)
                    .push_bind(&t.service)
                    .push_bind(t.deployment_id)
                    .push_bind(&t.task_definition.family)
                    .push_bind(i64::from(t.task_definition.revision))
                    .push_bind(t.pool.as_str())
                    .push_bind(t.cpu.0 as i64)
                    .push_bind(t.memory.0 as i64)
                    .push_bind("pending");
            });
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>, StoreError> {
        let mut q = QueryBuilder::<Sqlite>::new(format!("SELECT {TASK_COLUMNS} FROM tasks"));
        task_conditions(&mut q, filter);
        q.push(" ORDER BY created_at, id");
        if let Some(limit) = filter.limit {
            q.push(" LIMIT ").push_bind(i64::from(limit));
        }
        let mut tasks: Vec<Task> = q
            .build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(task_from_row)
            .collect::<Result<_, _>>()?;
        let placed: Vec<String> = tasks
            .iter()
            .filter(|t| t.state.holds_capacity())
            .map(|t| t.id.clone())
            .collect();
        let mut allocations = self.load_allocations(&placed).await?;
        for t in &mut tasks {
            if let Some(a) = allocations.remove(&t.id) {
                t.allocations = a;
            }
        }
        Ok(tasks)
    }

    async fn list_pending(&self) -> Result<Vec<PendingTask>, StoreError> {
        sqlx::query(
            "SELECT id, service, family, revision, pool FROM tasks WHERE state = 'pending'
             ORDER BY created_at, id",
        )
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(|row| {
            Ok(PendingTask {
                id: row.try_get("id")?,
                service: row.try_get("service")?,
                task_definition: TaskDefRef {
                    family: row.try_get("family")?,
                    revision: row.try_get::<i64, _>("revision")? as u32,
                },
                pool: PoolName::new(row.try_get::<String, _>("pool")?)
                    .map_err(|e| StoreError::corrupt("task pool", e))?,
            })
        })
        .collect()
    }

    async fn count_tasks(&self, filter: &TaskFilter) -> Result<u64, StoreError> {
        let mut q = QueryBuilder::<Sqlite>::new("SELECT COUNT(*) AS n FROM tasks");
        task_conditions(&mut q, filter);
        let n: i64 = q.build().fetch_one(&self.db).await?.try_get("n")?;
        Ok(n as u64)
    }

    async fn get_task(&self, id: &str) -> Result<Task, StoreError> {
        let row = sqlx::query(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.db)
            .await?
            .ok_or_else(|| not_found("task", id))?;
        let mut task = task_from_row(&row)?;
        task.allocations = self
            .load_allocations(&[task.id.clone()])
            .await?
            .remove(&task.id)
            .unwrap_or_default();
        Ok(task)
    }

    async fn commit_placements(
        &self,
        commits: &[PlacementCommit],
    ) -> Result<Vec<String>, StoreError> {
        if commits.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin_immediate().await?;
        let conn = tx.acquire().await?;
        let ctx = commit_context(conn, commits).await?;
        let accepted = crate::capacity::verify_commits(&ctx, commits);
        let accepted: Vec<&PlacementCommit> = commits
            .iter()
            .zip(accepted)
            .filter_map(|(c, ok)| ok.then_some(c))
            .collect();
        // Written in batches (a statement per row costs more than the rest of the commit).
        let rows: Vec<(&str, &GpuAllocation)> = accepted
            .iter()
            .flat_map(|c| c.allocations.iter().map(|a| (c.task_id.as_str(), a)))
            .collect();
        for chunk in rows.chunks(1000) {
            let mut q = QueryBuilder::<Sqlite>::new(
                "INSERT INTO task_gpus (task_id, gpu_uuid, idx, memory_mib, compute_milli, dedicated) ",
            );
            q.push_values(chunk, |mut b, (task, a)| {
                b.push_bind(*task)
                    .push_bind(a.gpu.as_str())
                    .push_bind(i64::from(a.index))
                    .push_bind(a.memory.0 as i64)
                    .push_bind(i64::from(a.compute.0))
                    .push_bind(i64::from(a.dedicated));
            });
            q.build().execute(&mut *conn).await?;
        }
        for chunk in accepted.chunks(1000) {
            let mut q = QueryBuilder::<Sqlite>::new(
                "UPDATE tasks SET state = 'assigned', host_id = placed.column2, placement_message = NULL
                 FROM (",
            );
            q.push_values(chunk, |mut b, c| {
                b.push_bind(c.task_id.as_str()).push_bind(c.host.as_str());
            });
            q.push(") AS placed WHERE tasks.id = placed.column1");
            q.build().execute(&mut *conn).await?;
        }
        let committed = accepted.iter().map(|c| c.task_id.clone()).collect();
        tx.commit().await?;
        Ok(committed)
    }

    async fn set_placement_message(
        &self,
        task_ids: &[String],
        message: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        for chunk in task_ids.chunks(500) {
            let mut q = QueryBuilder::<Sqlite>::new("UPDATE tasks SET placement_message = ");
            q.push_bind(message)
                .push(" WHERE state = 'pending' AND id IN (");
            let mut sep = q.separated(", ");
            for id in chunk {
                sep.push_bind(id);
            }
            q.push(")");
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn mark_task_running(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query(&format!(
            "UPDATE tasks SET state = 'running', started_at = COALESCE(started_at, {NOW}) WHERE id = ? AND state = 'assigned'"
        ))
        .bind(id)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    async fn mark_task_stopped(
        &self,
        id: &str,
        reason: &str,
        exit_code: Option<i32>,
        failed: bool,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        let done = sqlx::query(&format!(
            "UPDATE tasks SET state = 'stopped', stopped_at = {NOW}, stop_reason = COALESCE(stop_reason, ?),
                 exit_code = COALESCE(?, exit_code) WHERE id = ? AND state != 'stopped'"
        ))
        .bind(reason)
        .bind(exit_code)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() > 0 {
            sqlx::query("DELETE FROM task_gpus WHERE task_id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            if failed {
                sqlx::query(
                    "UPDATE deployments SET failed_tasks = failed_tasks + 1 WHERE id = (SELECT deployment_id FROM tasks WHERE id = ?)",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn request_task_stop(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        let task = self.get_task(id).await?;
        match task.state {
            TaskState::Pending => self.mark_task_stopped(id, reason, None, false).await,
            TaskState::Assigned | TaskState::Running => {
                sqlx::query("UPDATE tasks SET state = 'stopping', stop_reason = ? WHERE id = ? AND state IN ('assigned', 'running')")
                    .bind(reason)
                    .bind(id)
                    .execute(&self.db)
                    .await?;
                Ok(())
            }
            TaskState::Stopping | TaskState::Stopped => Ok(()),
        }
    }

    async fn set_task_migrating(&self, id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE tasks SET migrating = 1 WHERE id = ?")
            .bind(id)
            .execute(&self.db)
            .await?;
        Ok(())
    }

    async fn record_task_usage(
        &self,
        id: &str,
        gpu_memory_peak: Option<MiB>,
        sm_percent: Option<u32>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE tasks SET gpu_memory_peak_mib = MAX(COALESCE(gpu_memory_peak_mib, 0), COALESCE(?, 0)),
                 sm_percent = COALESCE(?, sm_percent) WHERE id = ?",
        )
        .bind(gpu_memory_peak.map(|m| m.0 as i64))
        .bind(sm_percent.map(i64::from))
        .bind(id)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    async fn prune(&self, before: &str) -> Result<Pruned, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let tasks = sqlx::query(
            "DELETE FROM tasks WHERE state = 'stopped' AND COALESCE(stopped_at, created_at) < ?",
        )
        .bind(before)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let events = sqlx::query("DELETE FROM events WHERE at < ?")
            .bind(before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let deployments = sqlx::query(
            "DELETE FROM deployments WHERE status IN ('completed', 'rolled_back') AND created_at < ?
             AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.deployment_id = deployments.id)",
        )
        .bind(before)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(Pruned {
            tasks,
            events,
            deployments,
        })
    }

    async fn add_event(
        &self,
        service: Option<&str>,
        host: Option<&HostId>,
        message: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO events (service, host_id, message) VALUES (?, ?, ?)")
            .bind(service)
            .bind(host.map(HostId::as_str))
            .bind(message)
            .execute(&self.db)
            .await?;
        Ok(())
    }

    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<Event>, StoreError> {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT id, at, service, host_id, message FROM events WHERE 1 = 1",
        );
        if let Some(s) = &filter.service {
            q.push(" AND service = ").push_bind(s.clone());
        }
        if let Some(h) = &filter.host {
            q.push(" AND host_id = ").push_bind(h.to_string());
        }
        if let Some(after) = filter.after {
            q.push(" AND id > ").push_bind(after);
        }
        q.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(filter.limit.max(1)));
        q.build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(event_from_row)
            .collect()
    }

    async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT value FROM settings WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.db)
            .await?;
        Ok(row.map(|r| r.try_get("value")).transpose()?)
    }

    async fn set_setting(&self, key: &str, value: &str) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
            .bind(key)
            .bind(value)
            .execute(&self.db)
            .await?;
        Ok(())
    }
}
