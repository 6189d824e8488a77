//! A host's inventory as written: its row and GPUs (a registration taking its join
//! token's use in the same transaction), a sync's report applied per GPU, and the stops of
//! tasks on hosts and GPUs that are gone.
use super::tasks::stop_task_rows;
use super::*;
use crate::store::{HOST_ID_TAKEN, JOIN_TOKEN_SPENT, JoinTokenUse};
use tessera_model::service::StopReason;

/// Takes a use of a minted join token inside `tx` (see [`JoinTokenUse`]).
pub(super) async fn take_use(conn: &mut DbConn, u: &JoinTokenUse) -> Result<(), StoreError> {
    let done = sqlx::query(
        "UPDATE join_tokens SET uses_left = uses_left - 1, uses = uses + 1
         WHERE id = $1 AND uses_left > 0 AND expires_at > $2",
    )
    .bind(&u.id)
    .bind(&u.now)
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 1 {
        Ok(())
    } else {
        Err(StoreError::Conflict(format!("{JOIN_TOKEN_SPENT} {}", u.id)))
    }
}

pub(super) async fn write_gpus(
    conn: &mut DbConn,
    host: &HostId,
    gpus: &[GpuInfo],
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM gpus WHERE host_id = $1")
        .bind(host.as_str())
        .execute(&mut *conn)
        .await?;
    for gpu in gpus {
        sqlx::query(&format!(
            "INSERT INTO gpus ({GPU_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
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

/// Stops, inside `tx`, the tasks matching `which` (an SQL condition on `tasks`, with at most
/// one `?` bound to `arg`) that hold capacity: reason `host lost`, allocations released.
pub(super) async fn stop_holding_tasks(
    tx: &mut sqlx::Transaction<'static, Db>,
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
    stop_task_rows(tx, &ids, &StopReason::HostLost).await?;
    Ok(ids)
}

/// Stops, inside `tx`, the tasks holding an allocation on GPU `uuid`, with `reason`.
pub(super) async fn stop_tasks_on_gpu(
    tx: &mut sqlx::Transaction<'static, Db>,
    uuid: &str,
    reason: &StopReason,
) -> Result<Vec<String>, StoreError> {
    let ids: Vec<String> =
        sqlx::query("SELECT DISTINCT task_id FROM task_gpus WHERE gpu_uuid = $1")
            .bind(uuid)
            .fetch_all(&mut **tx)
            .await?
            .iter()
            .map(|r| r.try_get("task_id"))
            .collect::<Result<_, _>>()?;
    stop_task_rows(tx, &ids, reason).await?;
    Ok(ids)
}

impl This {
    pub(super) async fn write_host(
        &self,
        host: &HostInfo,
        token_hash: Option<&str>,
        seen_at: Option<&str>,
        join_token: Option<&JoinTokenUse>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        if let Some(u) = join_token {
            take_use(&mut tx, u).await?;
        }
        if sqlx::query("SELECT 1 FROM pools WHERE name = $1")
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
            &format!(
            "INSERT INTO hosts (id, pool, status, simulated, cpu_milli, memory_mib, labels, agent_token_hash, last_seen_at, address, held, provider_id, agent_version)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) {}",
            // A registration writes a new row or nothing: two racing for one id must not
            // have the second overwrite the first's pool and admission.
            if token_hash.is_some() {
                ""
            } else {
                "ON CONFLICT (id) DO UPDATE SET pool = excluded.pool, status = excluded.status,
                 simulated = excluded.simulated, cpu_milli = excluded.cpu_milli,
                 memory_mib = excluded.memory_mib, labels = excluded.labels, address = excluded.address,
                 held = excluded.held, provider_id = excluded.provider_id,
                 agent_version = excluded.agent_version"
            }
        ),
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
        .bind(host.address.as_deref())
        .bind(i64::from(host.held))
        .bind(host.provider_id.as_deref())
        .bind(host.agent_version.as_deref())
        .execute(&mut *tx)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.is_unique_violation() => {
                StoreError::Conflict(format!("{HOST_ID_TAKEN} {}", host.id))
            }
            _ => StoreError::Database(e),
        })?;
        write_gpus(&mut tx, &host.id, &host.gpus).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Records a sync, for `HostStore::record_host_report`: last seen, measured use, and
    /// the GPUs as reported (replaced or missing ones' tasks stopped).
    pub(super) async fn write_host_report(
        &self,
        id: &HostId,
        report: &HostReport,
    ) -> Result<Vec<GpuChange>, StoreError> {
        let mut tx = self.begin_immediate().await?;
        sqlx::query(
            "UPDATE hosts SET last_seen_at = $1, mps_restarts = COALESCE($3, mps_restarts) WHERE id = $2",
        )
        .bind(&report.seen_at)
        .bind(id.as_str())
        .bind(report.mps_restarts.map(i64::from))
        .execute(&mut *tx)
        .await?;
        // Measured use, in the same transaction: one write per sync, however many tasks.
        for (task, peak, sm) in &report.usage {
            sqlx::query(
                "UPDATE tasks SET gpu_memory_peak_mib = CASE WHEN COALESCE(gpu_memory_peak_mib, 0) > COALESCE($1, 0)
                         THEN COALESCE(gpu_memory_peak_mib, 0) ELSE COALESCE($1, 0) END,
                     sm_percent = COALESCE($2, sm_percent)
                 WHERE id = $3 AND host_id = $4",
            )
            .bind(peak.map(|m| m.0 as i64))
            .bind(sm.map(i64::from))
            .bind(task)
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        }
        let known: Vec<(String, i64, String)> =
            sqlx::query("SELECT uuid, idx, health FROM gpus WHERE host_id = $1")
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
                    let stopped =
                        stop_tasks_on_gpu(&mut tx, uuid, &StopReason::GpuReplaced).await?;
                    sqlx::query("DELETE FROM gpus WHERE uuid = $1")
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
                    let stopped = stop_tasks_on_gpu(&mut tx, uuid, &StopReason::GpuMissing).await?;
                    sqlx::query("UPDATE gpus SET health = 'unhealthy' WHERE uuid = $1")
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
                "INSERT INTO gpus (uuid, host_id, idx, model, memory_mib, mps_client_limit, health) VALUES ($1, $2, $3, $4, $5, $6, $7)
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
        tx.commit().await?;
        Ok(changes)
    }
}
