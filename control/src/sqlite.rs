//! The embedded SQLite backend: one file, created on first start, migrated at open.

use crate::error::StoreError;
use crate::store::Store;
use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow};
use sqlx::{Row, SqlitePool};
use std::collections::BTreeMap;
use std::str::FromStr;
use tessera_model::{
    GpuHealth, GpuInfo, GpuUuid, HostId, HostInfo, HostStatus, MiB, MilliCpu, PlacementPolicy,
    PoolInfo, PoolName, SharingMode,
};

/// The SQLite store. The pool of connections is shared by every request; SQLite in WAL mode
/// lets readers run beside the one writer.
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
            .journal_mode(SqliteJournalMode::Wal);
        let path = options.get_filename().to_path_buf();
        let in_memory = url.contains(":memory:");
        if !in_memory && let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
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
        id: HostId::new(row.try_get::<String, _>("id")?)
            .map_err(|e| StoreError::corrupt("host id", e))?,
        pool: PoolName::new(row.try_get::<String, _>("pool")?)
            .map_err(|e| StoreError::corrupt("host pool", e))?,
        status: parse::<HostStatus>("host status", row.try_get("status")?)?,
        simulated: row.try_get::<i64, _>("simulated")? != 0,
        cpu: MilliCpu(row.try_get::<i64, _>("cpu_milli")? as u64),
        memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
        labels: serde_json::from_str::<BTreeMap<String, String>>(&labels)
            .map_err(|e| StoreError::corrupt("host labels", e))?,
        gpus: Vec::new(),
    })
}

const HOST_COLUMNS: &str = "id, pool, status, simulated, cpu_milli, memory_mib, labels";
const GPU_COLUMNS: &str =
    "uuid, host_id, idx, model, memory_mib, mps_client_limit, health, sharing_mode";

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

    async fn pool_exists(&self, name: &PoolName) -> Result<bool, StoreError> {
        let found = sqlx::query("SELECT 1 FROM pools WHERE name = ?")
            .bind(name.as_str())
            .fetch_optional(&self.db)
            .await?;
        Ok(found.is_some())
    }

    async fn upsert_host(&self, host: &HostInfo) -> Result<(), StoreError> {
        let mut tx = self.db.begin().await?;
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
            "INSERT INTO hosts (id, pool, status, simulated, cpu_milli, memory_mib, labels) VALUES (?, ?, ?, ?, ?, ?, ?)
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
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM gpus WHERE host_id = ?")
            .bind(host.id.as_str())
            .execute(&mut *tx)
            .await?;
        for gpu in &host.gpus {
            sqlx::query(&format!(
                "INSERT INTO gpus ({GPU_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            ))
            .bind(gpu.uuid.as_str())
            .bind(host.id.as_str())
            .bind(i64::from(gpu.index))
            .bind(&gpu.model)
            .bind(gpu.memory.0 as i64)
            .bind(i64::from(gpu.mps_client_limit))
            .bind(gpu.health.as_str())
            .bind(gpu.sharing_mode.as_str())
            .execute(&mut *tx)
            .await
            .map_err(|e| match &e {
                sqlx::Error::Database(db) if db.is_unique_violation() => {
                    StoreError::Conflict(format!(
                        "GPU {} (index {}) is already registered",
                        gpu.uuid, gpu.index
                    ))
                }
                _ => StoreError::Database(e),
            })?;
        }
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
        let position: std::collections::HashMap<String, usize> = hosts
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

    async fn get_host(&self, id: &HostId) -> Result<HostInfo, StoreError> {
        let row = sqlx::query(&format!("SELECT {HOST_COLUMNS} FROM hosts WHERE id = ?"))
            .bind(id.as_str())
            .fetch_optional(&self.db)
            .await?
            .ok_or_else(|| StoreError::NotFound {
                what: "host",
                id: id.to_string(),
            })?;
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

    async fn set_host_status(&self, id: &HostId, status: HostStatus) -> Result<(), StoreError> {
        let done = sqlx::query("UPDATE hosts SET status = ? WHERE id = ?")
            .bind(status.as_str())
            .bind(id.as_str())
            .execute(&self.db)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound {
                what: "host",
                id: id.to_string(),
            });
        }
        Ok(())
    }
}
