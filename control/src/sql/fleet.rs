//! The fleet read model's readings: rows by change mark (`FLEET_NEXT` is the backend's
//! rule for where the next reading starts; the migrations `*_fleet_marks.sql` say why it
//! misses nothing).

use super::*;
use crate::store::{FLEET_FROM_START, FleetChanges, FleetStore};

#[async_trait]
impl FleetStore for This {
    async fn fleet_changes(&self, since: i64) -> Result<FleetChanges, StoreError> {
        // First where the next reading starts, then the rows: whatever commits meanwhile
        // is read now or next time, never neither.
        let next: i64 = sqlx::query(FLEET_NEXT)
            .fetch_one(&self.db)
            .await?
            .try_get(0)?;
        let pools = self.list_pools().await?;
        let mut hosts: Vec<HostInfo> = sqlx::query(&format!(
            "SELECT {HOST_COLUMNS} FROM hosts WHERE fleet_mark >= $1"
        ))
        .bind(since)
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(host_from_row)
        .collect::<Result<_, _>>()?;
        if !hosts.is_empty() {
            let gpus = sqlx::query(&format!(
                "SELECT {GPU_COLUMNS} FROM gpus
                  WHERE host_id IN (SELECT id FROM hosts WHERE fleet_mark >= $1)
                  ORDER BY host_id, idx"
            ))
            .bind(since)
            .fetch_all(&self.db)
            .await?;
            attach_gpus(&mut hosts, &gpus)?;
        }
        // A first reading has nothing to remove: stopped tasks (all of history) are
        // skipped.
        // Without `work`: the model does not show it (nor would a change of it mark the row).
        let columns = TASK_COLUMNS.replace(" work,", " CAST(NULL AS TEXT) AS work,");
        let mut tasks: Vec<Task> = sqlx::query(&format!(
            "SELECT {columns} FROM tasks WHERE fleet_mark >= $1 AND ($2 = 1 OR state <> 'stopped')"
        ))
        .bind(since)
        .bind(i64::from(since != FLEET_FROM_START))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(task_from_row)
        .collect::<Result<_, _>>()?;
        self.attach_allocations(&mut tasks).await?;
        let host_count: i64 = sqlx::query("SELECT COUNT(*) FROM hosts")
            .fetch_one(&self.db)
            .await?
            .try_get(0)?;
        Ok(FleetChanges {
            next,
            pools,
            hosts,
            tasks,
            host_count: host_count as u64,
        })
    }

    async fn measured_figures(&self) -> Result<Vec<(String, Measured)>, StoreError> {
        sqlx::query(&format!(
            "SELECT id, gpu_memory_peak_mib, sm_percent FROM tasks WHERE {}",
            holding_states()
        ))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(|row| {
            Ok((
                row.try_get("id")?,
                Measured {
                    gpu_memory_peak: row
                        .try_get::<Option<i64>, _>("gpu_memory_peak_mib")?
                        .map(|m| MiB(m as u64)),
                    sm_percent: row
                        .try_get::<Option<i64>, _>("sm_percent")?
                        .map(|p| p as u32),
                    work: None,
                },
            ))
        })
        .collect()
    }

    async fn host_ids(&self) -> Result<Vec<HostId>, StoreError> {
        sqlx::query("SELECT id FROM hosts")
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(|row| {
                HostId::new(row.try_get::<String, _>(0)?)
                    .map_err(|e| StoreError::corrupt("host id", e))
            })
            .collect()
    }
}
