//! Measured use in buckets, and consolidation plans.
use super::*;
use crate::store::{
    PlanStore, StoredPlan, UsageGroup, UsageQuery, UsageRow, UsageStore, UsageSummary,
};

fn opt_u32(v: Option<i64>) -> Option<u32> {
    v.map(|x| x.clamp(0, i64::from(u32::MAX)) as u32)
}

fn usage_from_row(row: &DbRow) -> Result<UsageRow, StoreError> {
    let host: Option<String> = row.try_get("host_id")?;
    Ok(UsageRow {
        task_id: row.try_get("task_id")?,
        width_secs: row.try_get("width_secs")?,
        bucket_start: row.try_get("bucket_start")?,
        service: row.try_get("service")?,
        task_definition: TaskDefRef {
            family: row.try_get("family")?,
            revision: row.try_get::<i64, _>("revision")? as u32,
        },
        host: host.and_then(|h| HostId::new(h).ok()),
        memory_max: MiB(row.try_get::<i64, _>("memory_max_mib")?.max(0) as u64),
        memory_last: MiB(row.try_get::<i64, _>("memory_last_mib")?.max(0) as u64),
        sm_p50: opt_u32(row.try_get("sm_p50")?),
        sm_p95: opt_u32(row.try_get("sm_p95")?),
        sm_max: opt_u32(row.try_get("sm_max")?),
        samples: row.try_get::<i64, _>("samples")?.max(0) as u32,
        memory_errors: row.try_get::<i64, _>("memory_errors")?.max(0) as u32,
        work_secs: row.try_get("work_secs")?,
        completed: row.try_get("completed")?,
        errors: row.try_get("errors")?,
        latency_ms: [
            row.try_get("latency_p50_ms")?,
            row.try_get("latency_p95_ms")?,
            row.try_get("latency_p99_ms")?,
        ],
        neighbours: row
            .try_get::<Option<String>, _>("neighbours")?
            .map(|n| split_neighbours(&n)),
    })
}

/// Services as stored: sorted, comma-separated; `''` alone.
fn join_neighbours(n: &[String]) -> String {
    n.join(",")
}

fn split_neighbours(s: &str) -> Vec<String> {
    s.split(',')
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Completes `... WHERE width_secs = ` with the query's width, start and service.
fn usage_filter(b: &mut QueryBuilder<'_, Db>, q: &UsageQuery) {
    b.push_bind(q.width_secs)
        .push(" AND bucket_start >= ")
        .push_bind(q.since);
    if let Some(s) = &q.service {
        b.push(" AND service = ").push_bind(s.clone());
    }
    if let Some(t) = &q.task {
        b.push(" AND task_id = ").push_bind(t.clone());
    }
}

/// The larger of the stored and the new value of `col` (NULL counts as smaller).
fn larger(col: &str) -> String {
    format!(
        "{col} = CASE WHEN task_usage.{col} IS NULL OR (excluded.{col} IS NOT NULL AND excluded.{col} > task_usage.{col}) THEN excluded.{col} ELSE task_usage.{col} END"
    )
}

#[async_trait]
impl UsageStore for This {
    async fn record_usage(&self, rows: &[UsageRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let merge = [
            larger("memory_max_mib"),
            larger("sm_p50"),
            larger("sm_p95"),
            larger("sm_max"),
            larger("latency_p50_ms"),
            larger("latency_p95_ms"),
            larger("latency_p99_ms"),
        ]
        .join(", ");
        let mut tx = self.lock_writes().await?;
        for chunk in rows.chunks(200) {
            let mut q = QueryBuilder::<Db>::new(
                "INSERT INTO task_usage (task_id, width_secs, bucket_start, service, family, revision, host_id,
                 memory_max_mib, memory_last_mib, sm_p50, sm_p95, sm_max, samples, memory_errors,
                 work_secs, completed, errors, latency_p50_ms, latency_p95_ms, latency_p99_ms, neighbours) ",
            );
            q.push_values(chunk, |mut b, r| {
                b.push_bind(r.task_id.clone())
                    .push_bind(r.width_secs)
                    .push_bind(r.bucket_start)
                    .push_bind(r.service.clone())
                    .push_bind(r.task_definition.family.clone())
                    .push_bind(i64::from(r.task_definition.revision))
                    .push_bind(r.host.as_ref().map(|h| h.to_string()))
                    .push_bind(r.memory_max.0 as i64)
                    .push_bind(r.memory_last.0 as i64)
                    .push_bind(r.sm_p50.map(i64::from))
                    .push_bind(r.sm_p95.map(i64::from))
                    .push_bind(r.sm_max.map(i64::from))
                    .push_bind(i64::from(r.samples))
                    .push_bind(i64::from(r.memory_errors))
                    .push_bind(r.work_secs)
                    .push_bind(r.completed)
                    .push_bind(r.errors)
                    .push_bind(r.latency_ms[0])
                    .push_bind(r.latency_ms[1])
                    .push_bind(r.latency_ms[2])
                    .push_bind(r.neighbours.as_deref().map(join_neighbours));
            });
            q.push(format!(
                " ON CONFLICT (task_id, width_secs, bucket_start) DO UPDATE SET {merge},
                 memory_last_mib = excluded.memory_last_mib,
                 samples = task_usage.samples + excluded.samples,
                 memory_errors = task_usage.memory_errors + excluded.memory_errors,
                 work_secs = task_usage.work_secs + excluded.work_secs,
                 completed = task_usage.completed + excluded.completed,
                 errors = CASE WHEN task_usage.errors IS NULL AND excluded.errors IS NULL THEN NULL
                          ELSE COALESCE(task_usage.errors, 0) + COALESCE(excluded.errors, 0) END,
                 neighbours = CASE WHEN task_usage.neighbours = excluded.neighbours THEN task_usage.neighbours ELSE NULL END"
            ));
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn list_usage(&self, q: &UsageQuery) -> Result<Vec<UsageRow>, StoreError> {
        let mut b = QueryBuilder::<Db>::new(
            "SELECT task_id, width_secs, bucket_start, service, family, revision, host_id, memory_max_mib,
             memory_last_mib, sm_p50, sm_p95, sm_max, samples, memory_errors, work_secs, completed, errors,
             latency_p50_ms, latency_p95_ms, latency_p99_ms, neighbours FROM task_usage WHERE width_secs = ",
        );
        usage_filter(&mut b, q);
        b.push(" ORDER BY bucket_start, task_id");
        b.build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(usage_from_row)
            .collect()
    }

    async fn usage_summary(&self, q: &UsageQuery) -> Result<Vec<UsageSummary>, StoreError> {
        let mut b = QueryBuilder::<Db>::new(
            "SELECT task_id, service, family, revision, MAX(memory_max_mib) AS peak, MAX(sm_p95) AS sm,
             MIN(bucket_start) AS first, CAST(SUM(memory_errors) AS BIGINT) AS errors
             FROM task_usage WHERE width_secs = ",
        );
        usage_filter(&mut b, q);
        b.push(" GROUP BY task_id, service, family, revision");
        b.build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(|row| {
                Ok(UsageSummary {
                    task_id: row.try_get("task_id")?,
                    service: row.try_get("service")?,
                    task_definition: TaskDefRef {
                        family: row.try_get("family")?,
                        revision: row.try_get::<i64, _>("revision")? as u32,
                    },
                    peak: MiB(row.try_get::<i64, _>("peak")?.max(0) as u64),
                    sm_p95: opt_u32(row.try_get("sm")?),
                    first: row.try_get("first")?,
                    memory_errors: row.try_get::<i64, _>("errors")?.max(0) as u64,
                })
            })
            .collect()
    }

    async fn usage_history(
        &self,
        q: &UsageQuery,
        group: i64,
    ) -> Result<Vec<UsageGroup>, StoreError> {
        let group = group.max(1);
        let mut b = QueryBuilder::<Db>::new("SELECT (bucket_start - bucket_start % ");
        b.push_bind(group).push(
            ") AS g, MAX(memory_max_mib) AS mem_max, CAST(ROUND(AVG(memory_max_mib)) AS BIGINT) AS mem_mean,
             CAST(ROUND(AVG(sm_p50)) AS BIGINT) AS sm_mean, MAX(sm_p95) AS sm_p95,
             CAST(COUNT(DISTINCT task_id) AS BIGINT) AS tasks
             FROM task_usage WHERE width_secs = ",
        );
        usage_filter(&mut b, q);
        b.push(" GROUP BY g ORDER BY g");
        b.build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(|row| {
                Ok(UsageGroup {
                    start: row.try_get("g")?,
                    memory_max: MiB(row.try_get::<i64, _>("mem_max")?.max(0) as u64),
                    memory_mean: MiB(row.try_get::<i64, _>("mem_mean")?.max(0) as u64),
                    sm_mean: opt_u32(row.try_get("sm_mean")?),
                    sm_p95: opt_u32(row.try_get("sm_p95")?),
                    tasks: row.try_get::<i64, _>("tasks")?.max(0) as u32,
                })
            })
            .collect()
    }

    async fn prune_usage(&self, width_secs: i64, before: i64) -> Result<u64, StoreError> {
        Ok(self
            .write_one(
                sqlx::query("DELETE FROM task_usage WHERE width_secs = $1 AND bucket_start < $2")
                    .bind(width_secs)
                    .bind(before),
            )
            .await?
            .rows_affected())
    }
}

fn plan_from_row(row: &DbRow) -> Result<StoredPlan, StoreError> {
    Ok(StoredPlan {
        id: row.try_get("id")?,
        pool: row.try_get("pool")?,
        goal: row.try_get("goal")?,
        status: row.try_get("status")?,
        created_at: row.try_get("created_at")?,
        body: row.try_get("body")?,
    })
}

#[async_trait]
impl PlanStore for This {
    async fn save_plan(&self, p: &StoredPlan) -> Result<(), StoreError> {
        self.write_one(
            sqlx::query(
                "INSERT INTO consolidation_plans (id, pool, goal, status, created_at, body)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, body = excluded.body",
            )
            .bind(&p.id)
            .bind(&p.pool)
            .bind(&p.goal)
            .bind(&p.status)
            .bind(&p.created_at)
            .bind(&p.body),
        )
        .await?;
        Ok(())
    }

    async fn update_plan(&self, p: &StoredPlan, expected: &str) -> Result<bool, StoreError> {
        let done = self
            .write_one(
                sqlx::query(
                    "UPDATE consolidation_plans SET status = $1, body = $2 WHERE id = $3 AND status = $4",
                )
                .bind(&p.status)
                .bind(&p.body)
                .bind(&p.id)
                .bind(expected),
            )
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn get_plan(&self, id: &str) -> Result<StoredPlan, StoreError> {
        let row = sqlx::query(
            "SELECT id, pool, goal, status, created_at, body FROM consolidation_plans WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.db)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            what: "consolidation plan",
            id: id.to_owned(),
        })?;
        plan_from_row(&row)
    }

    async fn list_plans(&self, limit: u32) -> Result<Vec<StoredPlan>, StoreError> {
        sqlx::query(
            "SELECT id, pool, goal, status, created_at, body FROM consolidation_plans
             ORDER BY created_at DESC, id DESC LIMIT $1",
        )
        .bind(i64::from(limit.max(1)))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(plan_from_row)
        .collect()
    }
}
