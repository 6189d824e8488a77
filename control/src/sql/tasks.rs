//! Tasks: creation, listing, placement commits (re-checked by `crate::capacity` inside
//! the transaction), state changes, measured use, retention.
use super::*;
use tessera_model::service::StopReason;

/// Reads, on `conn` (inside the commit's transaction), what the re-check of `commits` needs.
pub(super) async fn commit_context(
    conn: &mut DbConn,
    commits: &[PlacementCommit],
) -> Result<CommitContext, StoreError> {
    let mut host_ids: Vec<&str> = commits.iter().map(|c| c.host.as_str()).collect();
    host_ids.sort_unstable();
    host_ids.dedup();
    let in_list = |q: &mut QueryBuilder<'_, Db>, items: &[&str]| {
        q.push(" (");
        let mut sep = q.separated(", ");
        for item in items {
            sep.push_bind(item.to_string());
        }
        q.push(")");
    };
    let mut ctx = CommitContext::default();
    let mut q = QueryBuilder::<Db>::new(format!("SELECT {HOST_COLUMNS} FROM hosts WHERE id IN"));
    in_list(&mut q, &host_ids);
    for row in q.build().fetch_all(&mut *conn).await? {
        ctx.hosts.push(host_from_row(&row)?);
    }
    load_gpus(conn, &mut ctx.hosts).await?;
    for row in sqlx::query(&format!("SELECT {POOL_COLUMNS} FROM pools ORDER BY name"))
        .fetch_all(&mut *conn)
        .await?
    {
        let pool = pool_from_row(&row)?;
        if ctx.hosts.iter().any(|h| h.pool == pool.name) {
            ctx.pools.push(pool);
        }
    }
    let holding = holding_states();
    let mut q = QueryBuilder::<Db>::new(format!(
        "SELECT id, host_id, cpu_milli, memory_mib, ports FROM tasks WHERE {holding} AND host_id IN"
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
            ports: host_ports(&row.try_get::<String, _>("ports")?)?,
        });
    }
    let mut q = QueryBuilder::<Db>::new(format!(
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
        let mut q = QueryBuilder::<Db>::new(
            "SELECT id, cpu_milli, memory_mib, ports FROM tasks WHERE state = 'pending'",
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
            ctx.pending_ports
                .insert(id.clone(), host_ports(&row.try_get::<String, _>("ports")?)?);
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

/// The host ports (known ones) of a task's stored `ports` column.
fn host_ports(json: &str) -> Result<Vec<(u16, tessera_model::taskdef::Protocol)>, StoreError> {
    let ports: Vec<tessera_model::service::TaskPort> =
        serde_json::from_str(json).map_err(|e| StoreError::corrupt("task ports", e))?;
    Ok(ports
        .iter()
        .filter_map(|p| Some((p.host_port?, p.protocol)))
        .collect())
}

/// `WHERE ...` for `filter` (everything but its limit).
pub(super) fn task_conditions(q: &mut QueryBuilder<'_, Db>, filter: &TaskFilter) {
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
    if let Some(p) = &filter.project {
        q.push(" AND service IN (SELECT name FROM services WHERE project = ")
            .push_bind(p.clone())
            .push(")");
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

/// Inside `tx`: tasks `ids` stopped now with `reason` (unless stopped already), their GPU
/// allocations released.
pub(super) async fn stop_task_rows(
    tx: &mut sqlx::Transaction<'static, Db>,
    ids: &[String],
    reason: &StopReason,
) -> Result<(), StoreError> {
    let reason = reason.to_string();
    for id in ids {
        sqlx::query(&format!(
            "UPDATE tasks SET state = 'stopped', stopped_at = {NOW},
                 stop_reason = COALESCE(stop_reason, $1) WHERE id = $2 AND state != 'stopped'"
        ))
        .bind(&reason)
        .bind(id)
        .execute(&mut **tx)
        .await?;
        sqlx::query("DELETE FROM task_gpus WHERE task_id = $1")
            .bind(id)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// Inserts `tasks` as pending, in batches.
async fn insert_tasks(conn: &mut DbConn, tasks: &[NewTask]) -> Result<(), StoreError> {
    for chunk in tasks.chunks(200) {
        let mut q = QueryBuilder::<Db>::new(
            "INSERT INTO tasks (id, service, deployment_id, family, revision, pool, cpu_milli, memory_mib, state, ports, health) ",
        );
        let ports: Vec<String> = chunk
            .iter()
            .map(|t| serde_json::to_string(&t.ports).expect("ports serialize"))
            .collect();
        q.push_values(chunk.iter().zip(ports), |mut b, (t, ports)| {
            b.push_bind(&t.id)
                .push_bind(&t.service)
                .push_bind(t.deployment_id)
                .push_bind(&t.task_definition.family)
                .push_bind(i64::from(t.task_definition.revision))
                .push_bind(t.pool.as_str())
                .push_bind(t.cpu.0 as i64)
                .push_bind(t.memory.0 as i64)
                .push_bind("pending")
                .push_bind(ports)
                .push_bind(t.health.map(|h| h.as_str()));
        });
        q.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// Stores placements already verified: their GPU allocations, and their tasks assigned.
async fn write_commits(conn: &mut DbConn, accepted: &[&PlacementCommit]) -> Result<(), StoreError> {
    // Written in batches (a statement per row costs more than the rest of the commit).
    let rows: Vec<(&str, &GpuAllocation)> = accepted
        .iter()
        .flat_map(|c| c.allocations.iter().map(|a| (c.task_id.as_str(), a)))
        .collect();
    for chunk in rows.chunks(1000) {
        let mut q = QueryBuilder::<Db>::new(
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
        let mut q = QueryBuilder::<Db>::new(
            "UPDATE tasks SET state = 'assigned', host_id = placed.column2, placement_message = NULL
             FROM (",
        );
        q.push_values(chunk, |mut b, c| {
            b.push_bind(c.task_id.as_str()).push_bind(c.host.as_str());
        });
        q.push(") AS placed WHERE tasks.id = placed.column1");
        q.build().execute(&mut *conn).await?;
    }
    Ok(())
}

#[async_trait]
impl TaskStore for This {
    async fn create_tasks(&self, tasks: &[NewTask]) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        insert_tasks(&mut tx, tasks).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn start_move(
        &self,
        original: &str,
        from_host: &HostId,
        replacement: &NewTask,
        commit: &PlacementCommit,
    ) -> Result<bool, StoreError> {
        let mut tx = self.begin_immediate().await?;
        // Compare-and-set: the original still runs where the plan found it, not moving.
        let still: Option<(String,)> = sqlx::query_as(
            "SELECT id FROM tasks WHERE id = $1 AND state = 'running' AND migrating = 0 AND host_id = $2",
        )
        .bind(original)
        .bind(from_host.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        if still.is_none() {
            return Ok(false);
        }
        insert_tasks(&mut tx, std::slice::from_ref(replacement)).await?;
        let conn = tx.acquire().await?;
        let commits = std::slice::from_ref(commit);
        let ctx = commit_context(&mut *conn, commits).await?;
        if !crate::capacity::verify_commits(&ctx, commits)[0] {
            // Dropped without commit: nothing of the move is written.
            return Ok(false);
        }
        write_commits(&mut *conn, &[commit]).await?;
        sqlx::query("UPDATE tasks SET migrating = 1 WHERE id = $1")
            .bind(original)
            .execute(&mut *conn)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>, StoreError> {
        let mut q = QueryBuilder::<Db>::new(format!("SELECT {TASK_COLUMNS} FROM tasks"));
        task_conditions(&mut q, filter);
        q.push(if filter.newest_first {
            " ORDER BY created_at DESC, id DESC"
        } else {
            " ORDER BY created_at, id"
        });
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
        if !filter.without_allocations {
            self.attach_allocations(&mut tasks).await?;
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
        let mut q = QueryBuilder::<Db>::new("SELECT COUNT(*) AS n FROM tasks");
        task_conditions(&mut q, filter);
        let n: i64 = q.build().fetch_one(&self.db).await?.try_get("n")?;
        Ok(n as u64)
    }

    async fn get_task(&self, id: &str) -> Result<Task, StoreError> {
        let row = sqlx::query(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1"))
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
        write_commits(&mut *conn, &accepted).await?;
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
            let mut q = QueryBuilder::<Db>::new("UPDATE tasks SET placement_message = ");
            q.push_bind(message)
                .push(" WHERE state IN ('pending', 'assigned') AND id IN (");
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
        self.write_one(sqlx::query(&format!(
            "UPDATE tasks SET state = 'running', placement_message = NULL, started_at = COALESCE(started_at, {NOW}) WHERE id = $1 AND state = 'assigned'"
        ))
        .bind(id)
        )
        .await?;
        Ok(())
    }

    async fn mark_task_stopped(
        &self,
        id: &str,
        reason: &StopReason,
        exit_code: Option<i32>,
        failed: bool,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        let done = sqlx::query(&format!(
            "UPDATE tasks SET state = 'stopped', stopped_at = {NOW}, stop_reason = COALESCE(stop_reason, $1),
                 exit_code = COALESCE($2, exit_code) WHERE id = $3 AND state != 'stopped'"
        ))
        .bind(reason.to_string())
        .bind(exit_code.map(i64::from))
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() > 0 {
            sqlx::query("DELETE FROM task_gpus WHERE task_id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            if failed {
                sqlx::query(
                    "UPDATE deployments SET failed_tasks = failed_tasks + 1 WHERE id = (SELECT deployment_id FROM tasks WHERE id = $1)",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    async fn request_task_stop(
        &self,
        id: &str,
        reason: &StopReason,
        drain_until: Option<&str>,
        failed: bool,
    ) -> Result<(), StoreError> {
        let task = self.get_task(id).await?;
        match task.state {
            TaskState::Pending => self.mark_task_stopped(id, reason, None, failed).await,
            TaskState::Assigned | TaskState::Running => {
                // Only a running task has served anything to drain.
                let drain = drain_until.filter(|_| task.state == TaskState::Running);
                // The stop and its failure count in one transaction, the count only when
                // this call stopped it (compare-and-set on the state).
                let mut tx = self.begin_immediate().await?;
                let done = sqlx::query("UPDATE tasks SET state = 'stopping', stop_reason = $1, drain_until = $3 WHERE id = $2 AND state IN ('assigned', 'running')")
                    .bind(reason.to_string())
                    .bind(id)
                    .bind(drain)
                    .execute(&mut *tx)
                    .await?;
                if failed && done.rows_affected() > 0 {
                    sqlx::query(
                        "UPDATE deployments SET failed_tasks = failed_tasks + 1 WHERE id = (SELECT deployment_id FROM tasks WHERE id = $1)",
                    )
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            }
            TaskState::Stopping | TaskState::Stopped => Ok(()),
        }
    }

    async fn record_task_serving(
        &self,
        id: &str,
        ports: &[tessera_model::service::TaskPort],
        health: Option<(tessera_model::service::TaskHealth, Option<&str>)>,
    ) -> Result<(), StoreError> {
        let ports =
            serde_json::to_string(ports).map_err(|e| StoreError::corrupt("task ports", e))?;
        self.write_one(
            sqlx::query("UPDATE tasks SET ports = $1, health = $2, health_output = $3 WHERE id = $4 AND state != 'stopped'")
                .bind(ports)
                .bind(health.map(|(h, _)| h.as_str()))
                .bind(health.and_then(|(_, o)| o))
                .bind(id),
        )
        .await?;
        Ok(())
    }

    async fn set_task_last_output(&self, id: &str, text: &str) -> Result<(), StoreError> {
        self.write_one(
            sqlx::query("UPDATE tasks SET last_output = $1 WHERE id = $2")
                .bind(text)
                .bind(id),
        )
        .await?;
        Ok(())
    }

    async fn task_last_output(&self, id: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT last_output FROM tasks WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.db)
            .await?;
        Ok(match row {
            Some(r) => r.try_get("last_output")?,
            None => None,
        })
    }

    async fn set_task_migrating(&self, id: &str, migrating: bool) -> Result<(), StoreError> {
        self.write_one(
            sqlx::query("UPDATE tasks SET migrating = $2 WHERE id = $1")
                .bind(id)
                .bind(i64::from(migrating)),
        )
        .await?;
        Ok(())
    }

    async fn prune(&self, before: &str, audit_before: &str) -> Result<Pruned, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let tasks = sqlx::query(
            "DELETE FROM tasks WHERE state = 'stopped' AND COALESCE(stopped_at, created_at) < $1",
        )
        .bind(before)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let events = sqlx::query("DELETE FROM events WHERE at < $1")
            .bind(before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let deployments = sqlx::query(
            "DELETE FROM deployments WHERE status IN ('completed', 'rolled_back') AND created_at < $1
             AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.deployment_id = deployments.id)",
        )
        .bind(before)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let audit = sqlx::query("DELETE FROM audit_log WHERE at < $1")
            .bind(audit_before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let servers = sqlx::query("DELETE FROM servers WHERE last_seen_at < $1")
            .bind(before)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let plans = sqlx::query(
            "DELETE FROM consolidation_plans WHERE status IN ('done', 'failed', 'cancelled') AND created_at < $1",
        )
        .bind(before)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        // Join tokens that can no longer register anything, and sign-in windows long over.
        let join_tokens = sqlx::query(
            "DELETE FROM join_tokens WHERE expires_at < $1 OR (uses_left = 0 AND created_at < $1)",
        )
        .bind(before)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM sign_in_attempts WHERE window_start < $1")
            .bind(before)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Pruned {
            tasks,
            events,
            deployments,
            audit,
            servers,
            plans,
            join_tokens,
        })
    }
}
