//! Pools and hosts: registration, inventory and health reports, status changes (compare
//! and set), lost hosts (marked and their tasks stopped in one transaction).
//! The writes of a host's inventory (and of a sync's report) are in `inventory`.
use super::inventory::{stop_holding_tasks, take_use};
use super::*;
use crate::store::JoinTokenUse;

#[async_trait]
impl HostStore for This {
    async fn upsert_pool(&self, pool: &PoolInfo) -> Result<(), StoreError> {
        self.write_one(sqlx::query(
            "INSERT INTO pools (name, policy, compute_overcommit, mps_client_limit, admission, task_users, privileged, preemption, host_network, gpu_budget, provider, exec)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (name) DO UPDATE SET policy = excluded.policy,
                 compute_overcommit = excluded.compute_overcommit, mps_client_limit = excluded.mps_client_limit,
                 admission = excluded.admission, task_users = excluded.task_users, privileged = excluded.privileged,
                 preemption = excluded.preemption, host_network = excluded.host_network,
                 gpu_budget = excluded.gpu_budget, provider = excluded.provider, exec = excluded.exec",
        )
        .bind(pool.name.as_str())
        .bind(pool.policy.as_str())
        .bind(pool.compute_overcommit)
        .bind(pool.mps_client_limit.map(i64::from))
        .bind(pool.admission.as_str())
        .bind(i64::from(pool.task_users))
        .bind(i64::from(pool.privileged))
        .bind(pool.preemption.as_str())
        .bind(i64::from(pool.host_network))
        .bind(pool.gpu_budget.as_str())
        .bind(pool.provider.as_ref().map(|p| serde_json::to_string(p).expect("a provider serializes")))
        .bind(i64::from(pool.exec))
        )
        .await?;
        Ok(())
    }

    async fn list_pools(&self) -> Result<Vec<PoolInfo>, StoreError> {
        sqlx::query(&format!("SELECT {POOL_COLUMNS} FROM pools ORDER BY name"))
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(pool_from_row)
            .collect()
    }

    async fn get_pool(&self, name: &PoolName) -> Result<PoolInfo, StoreError> {
        let row = sqlx::query(&format!("SELECT {POOL_COLUMNS} FROM pools WHERE name = $1"))
            .bind(name.as_str())
            .fetch_optional(&self.db)
            .await?
            .ok_or_else(|| not_found("pool", name))?;
        pool_from_row(&row)
    }

    async fn pool_exists(&self, name: &PoolName) -> Result<bool, StoreError> {
        let found = sqlx::query("SELECT 1 FROM pools WHERE name = $1")
            .bind(name.as_str())
            .fetch_optional(&self.db)
            .await?;
        Ok(found.is_some())
    }

    async fn upsert_host(&self, host: &HostInfo) -> Result<(), StoreError> {
        self.write_host(host, None, None, None).await
    }

    async fn register_host(
        &self,
        host: &HostInfo,
        token_hash: &str,
        seen_at: &str,
        join_token: Option<&JoinTokenUse>,
    ) -> Result<(), StoreError> {
        self.write_host(host, Some(token_hash), Some(seen_at), join_token)
            .await
    }

    async fn host_by_token_hash(&self, token_hash: &str) -> Result<Option<HostId>, StoreError> {
        let row = sqlx::query("SELECT id FROM hosts WHERE agent_token_hash = $1")
            .bind(token_hash)
            .fetch_optional(&self.db)
            .await?;
        row.map(|r| host_id(r.try_get("id")?)).transpose()
    }

    async fn revoke_agent_token(&self, id: &HostId) -> Result<(), StoreError> {
        let done = self
            .write_one(
                sqlx::query("UPDATE hosts SET agent_token_hash = NULL WHERE id = $1")
                    .bind(id.as_str()),
            )
            .await?;
        updated(done, "host", id)
    }

    async fn gpu_owners(&self, uuids: &[GpuUuid]) -> Result<Vec<(GpuUuid, HostId)>, StoreError> {
        if uuids.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = QueryBuilder::<Db>::new("SELECT uuid, host_id FROM gpus WHERE uuid IN (");
        let mut sep = q.separated(", ");
        for u in uuids {
            sep.push_bind(u.as_str());
        }
        q.push(")");
        q.build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(|r| {
                let uuid = GpuUuid::new(r.try_get::<String, _>("uuid")?)
                    .map_err(|e| StoreError::corrupt("GPU uuid", e))?;
                Ok((uuid, host_id(r.try_get("host_id")?)?))
            })
            .collect()
    }

    async fn host_with_gpus(
        &self,
        uuids: &[GpuUuid],
    ) -> Result<Option<(HostId, bool)>, StoreError> {
        for uuid in uuids {
            let row = sqlx::query(
                "SELECT h.id, h.agent_token_hash FROM gpus g JOIN hosts h ON h.id = g.host_id
                 WHERE g.uuid = $1",
            )
            .bind(uuid.as_str())
            .fetch_optional(&self.db)
            .await?;
            if let Some(r) = row {
                return Ok(Some((
                    host_id(r.try_get("id")?)?,
                    r.try_get::<Option<String>, _>("agent_token_hash")?
                        .is_none(),
                )));
            }
        }
        Ok(None)
    }

    async fn reissue_agent_token(
        &self,
        id: &HostId,
        token_hash: &str,
        join_token: Option<&JoinTokenUse>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        if let Some(u) = join_token {
            take_use(&mut tx, u).await?;
        }
        // Only a host without a token: two rejoins racing cannot both win.
        let done = sqlx::query(
            "UPDATE hosts SET agent_token_hash = $1 WHERE id = $2 AND agent_token_hash IS NULL",
        )
        .bind(token_hash)
        .bind(id.as_str())
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "host {id} has an agent token again (another rejoin won)"
            )));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn host_token_revoked(&self, id: &HostId) -> Result<bool, StoreError> {
        let row = sqlx::query("SELECT agent_token_hash FROM hosts WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.db)
            .await?
            .ok_or_else(|| not_found("host", id))?;
        Ok(row
            .try_get::<Option<String>, _>("agent_token_hash")?
            .is_none())
    }

    async fn set_pending_gpus(
        &self,
        id: &HostId,
        pending: &[tessera_model::PendingGpu],
    ) -> Result<(), StoreError> {
        let json = if pending.is_empty() {
            None
        } else {
            Some(
                serde_json::to_string(pending)
                    .map_err(|e| StoreError::corrupt("pending GPUs", e))?,
            )
        };
        let done = self
            .write_one(
                sqlx::query("UPDATE hosts SET pending_gpus = $1 WHERE id = $2")
                    .bind(json)
                    .bind(id.as_str()),
            )
            .await?;
        updated(done, "host", id)
    }

    async fn set_host_capabilities(
        &self,
        id: &HostId,
        capabilities: &tessera_model::agent::HostCapabilities,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(capabilities)
            .map_err(|e| StoreError::corrupt("host capabilities", e))?;
        let done = self
            .write_one(
                sqlx::query("UPDATE hosts SET capabilities = $1 WHERE id = $2")
                    .bind(json)
                    .bind(id.as_str()),
            )
            .await?;
        updated(done, "host", id)
    }

    async fn set_host_agent_version(
        &self,
        id: &HostId,
        version: Option<&str>,
    ) -> Result<(), StoreError> {
        let done = self
            .write_one(
                sqlx::query("UPDATE hosts SET agent_version = $1 WHERE id = $2")
                    .bind(version)
                    .bind(id.as_str()),
            )
            .await?;
        updated(done, "host", id)
    }

    async fn set_host_held(&self, id: &HostId, held: bool) -> Result<(), StoreError> {
        let done = self
            .write_one(
                sqlx::query("UPDATE hosts SET held = $1 WHERE id = $2")
                    .bind(i64::from(held))
                    .bind(id.as_str()),
            )
            .await?;
        updated(done, "host", id)
    }

    async fn insert_join_token(
        &self,
        t: &JoinTokenInfo,
        token_hash: &str,
    ) -> Result<(), StoreError> {
        self.write_one(
            sqlx::query(
                "INSERT INTO join_tokens (id, token_sha256, description, pool, host_id, expires_at,
                     uses_left, uses, preapproved, created_by, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8, $9, $10)",
            )
            .bind(&t.id)
            .bind(token_hash)
            .bind(&t.description)
            .bind(t.pool.as_deref())
            .bind(t.host.as_deref())
            .bind(t.expires_at)
            .bind(i64::from(t.uses_left))
            .bind(i64::from(t.preapproved))
            .bind(&t.created_by)
            .bind(t.created_at),
        )
        .await?;
        Ok(())
    }

    async fn list_join_tokens(&self) -> Result<Vec<JoinTokenInfo>, StoreError> {
        sqlx::query(&format!(
            "SELECT {JOIN_TOKEN_COLUMNS} FROM join_tokens ORDER BY created_at, id"
        ))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(join_token_from_row)
        .collect()
    }

    async fn delete_join_token(&self, id: &str) -> Result<(), StoreError> {
        let done = self
            .write_one(sqlx::query("DELETE FROM join_tokens WHERE id = $1").bind(id))
            .await?;
        updated(done, "join token", id)
    }

    async fn join_token_by_hash(
        &self,
        token_hash: &str,
    ) -> Result<Option<JoinTokenInfo>, StoreError> {
        sqlx::query(&format!(
            "SELECT {JOIN_TOKEN_COLUMNS} FROM join_tokens WHERE token_sha256 = $1"
        ))
        .bind(token_hash)
        .fetch_optional(&self.db)
        .await?
        .as_ref()
        .map(join_token_from_row)
        .transpose()
    }

    async fn delete_host(&self, id: &HostId) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        let holding: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM tasks WHERE host_id = $1 AND state <> 'stopped'",
        )
        .bind(id.as_str())
        .fetch_one(&mut *tx)
        .await?
        .try_get("n")?;
        if holding > 0 {
            return Err(StoreError::Conflict(format!(
                "host {id} still has {holding} task(s); drain it and wait until they have stopped"
            )));
        }
        sqlx::query("UPDATE tasks SET host_id = NULL WHERE host_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query("DELETE FROM hosts WHERE id = $1")
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
        let gpus = sqlx::query(&format!(
            "SELECT {GPU_COLUMNS} FROM gpus ORDER BY host_id, idx"
        ))
        .fetch_all(&self.db)
        .await?;
        attach_gpus(&mut hosts, &gpus)?;
        Ok(hosts)
    }

    async fn host_page(&self, q: &HostPageQuery) -> Result<HostPage, StoreError> {
        let strings = |rows: Vec<DbRow>| -> Result<Vec<String>, StoreError> {
            rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
        };
        let total: i64 = sqlx::query("SELECT COUNT(*) FROM hosts")
            .fetch_one(&self.db)
            .await?
            .try_get(0)?;
        let pools = strings(
            sqlx::query("SELECT DISTINCT pool FROM hosts ORDER BY pool")
                .fetch_all(&self.db)
                .await?,
        )?;
        let models = strings(
            sqlx::query("SELECT DISTINCT model FROM gpus ORDER BY model")
                .fetch_all(&self.db)
                .await?,
        )?;
        let filtered = |select: &str| {
            let mut b = QueryBuilder::<Db>::new(select);
            b.push(" FROM hosts h WHERE 1 = 1");
            if !q.pool.is_empty() {
                b.push(" AND h.pool = ").push_bind(q.pool.clone());
            }
            if !q.status.is_empty() {
                b.push(" AND h.status = ").push_bind(q.status.clone());
            }
            if !q.model.is_empty() {
                b.push(" AND EXISTS (SELECT 1 FROM gpus g WHERE g.host_id = h.id AND g.model = ")
                    .push_bind(q.model.clone())
                    .push(")");
            }
            b
        };
        let matched: i64 = filtered("SELECT COUNT(*)")
            .build()
            .fetch_one(&self.db)
            .await?
            .try_get(0)?;
        let columns: Vec<String> = HOST_COLUMNS
            .split(", ")
            .map(|c| format!("h.{}", c.trim()))
            .collect();
        let mut page = filtered(&format!("SELECT {}", columns.join(", ")));
        page.push(" ORDER BY h.pool, h.id LIMIT ")
            .push_bind(i64::from(q.limit))
            .push(" OFFSET ")
            .push_bind(i64::from(q.offset));
        let mut hosts: Vec<HostInfo> = page
            .build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(host_from_row)
            .collect::<Result<_, _>>()?;
        load_gpus(&mut *self.db.acquire().await?, &mut hosts).await?;
        Ok(HostPage {
            hosts,
            matched: matched as u64,
            total: total as u64,
            pools,
            models,
        })
    }

    async fn hosts_per_pool(&self) -> Result<HashMap<PoolName, usize>, StoreError> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT pool, COUNT(*) FROM hosts GROUP BY pool")
                .fetch_all(&self.db)
                .await?;
        rows.into_iter()
            .map(|(pool, n)| {
                Ok((
                    PoolName::new(pool).map_err(|e| StoreError::corrupt("host pool", e))?,
                    usize::try_from(n).unwrap_or(0),
                ))
            })
            .collect()
    }

    async fn hosts_in_status(&self, statuses: &[HostStatus]) -> Result<Vec<HostState>, StoreError> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = QueryBuilder::<Db>::new("SELECT id, pool, status FROM hosts WHERE status IN (");
        let mut sep = q.separated(", ");
        for s in statuses {
            sep.push_bind(s.as_str());
        }
        q.push(") ORDER BY pool, id");
        q.build()
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
        let row = sqlx::query(&format!("SELECT {HOST_COLUMNS} FROM hosts WHERE id = $1"))
            .bind(id.as_str())
            .fetch_optional(&self.db)
            .await?
            .ok_or_else(|| not_found("host", id))?;
        let mut host = host_from_row(&row)?;
        host.gpus = sqlx::query(&format!(
            "SELECT {GPU_COLUMNS} FROM gpus WHERE host_id = $1 ORDER BY idx"
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
        let done = self
            .write_one(
                sqlx::query("UPDATE hosts SET status = $1, status_reason = $2 WHERE id = $3")
                    .bind(status.as_str())
                    .bind(reason)
                    .bind(id.as_str()),
            )
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
        let done = self
            .write_one(
                sqlx::query(
                    "UPDATE hosts SET status = $1, status_reason = $2 WHERE id = $3 AND status = $4",
                )
                .bind(status.as_str())
                .bind(reason)
                .bind(id.as_str())
                .bind(expected.as_str()),
            )
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
            "UPDATE hosts SET status = 'lost', status_reason = $1
             WHERE id = $2 AND status != 'lost' AND last_seen_at IS NOT NULL AND last_seen_at < $3",
        )
        .bind(reason)
        .bind(id.as_str())
        .bind(silent_since)
        .execute(&mut *tx)
        .await?;
        if marked.rows_affected() == 0 {
            return Ok(None);
        }
        let stopped = stop_holding_tasks(&mut tx, "host_id = $1", Some(id.as_str())).await?;
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
        self.write_host_report(id, report).await
    }

    async fn set_host_network(
        &self,
        id: &HostId,
        address: Option<&str>,
        dynamic_ports_free: Option<u32>,
    ) -> Result<(), StoreError> {
        let done = self
            .write_one(
                sqlx::query("UPDATE hosts SET address = COALESCE($1, address), dynamic_ports_free = COALESCE($3, dynamic_ports_free) WHERE id = $2")
                    .bind(address)
                    .bind(id.as_str())
                    .bind(dynamic_ports_free.map(i64::from)),
            )
            .await?;
        updated(done, "host", id)
    }

    async fn touch_hosts(&self, seen: &[(HostId, String)]) -> Result<(), StoreError> {
        // One statement per thousand hosts: (id, time) pairs as a table of values.
        for chunk in seen.chunks(1000) {
            let mut q = QueryBuilder::<Db>::new("WITH seen (id, at) AS (VALUES ");
            let mut sep = q.separated(", ");
            for (id, at) in chunk {
                sep.push("(")
                    .push_bind_unseparated(id.as_str())
                    .push_unseparated(", ")
                    .push_bind_unseparated(at)
                    .push_unseparated(")");
            }
            q.push(
                ") UPDATE hosts SET last_seen_at = seen.at
                 FROM seen WHERE hosts.id = seen.id
                   AND (hosts.last_seen_at IS NULL OR hosts.last_seen_at < seen.at)",
            );
            q.build().execute(&self.db).await?;
        }
        Ok(())
    }

    async fn set_task_work(&self, work: &[(String, String)]) -> Result<(), StoreError> {
        // One statement per thousand tasks, as for the hosts' sync times.
        for chunk in work.chunks(1000) {
            let mut q = QueryBuilder::<Db>::new("WITH measured (id, work) AS (VALUES ");
            let mut sep = q.separated(", ");
            for (id, w) in chunk {
                sep.push("(")
                    .push_bind_unseparated(id)
                    .push_unseparated(", ")
                    .push_bind_unseparated(w)
                    .push_unseparated(")");
            }
            q.push(
                ") UPDATE tasks SET work = measured.work
                 FROM measured WHERE tasks.id = measured.id AND tasks.state != 'stopped'",
            );
            q.build().execute(&self.db).await?;
        }
        Ok(())
    }

    async fn hosts_silent_since(&self, cutoff: &str) -> Result<Vec<HostId>, StoreError> {
        let rows = sqlx::query(
            "SELECT id FROM hosts WHERE status != 'lost' AND last_seen_at IS NOT NULL
             AND last_seen_at < $1 ORDER BY id",
        )
        .bind(cutoff)
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(|r| host_id(r.try_get("id")?)).collect()
    }
}
