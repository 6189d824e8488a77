//! Projects and their quotas (stored as JSON, read back through the model's validator's
//! types).
use super::*;
use crate::store::ProjectStore;
use tessera_model::project::{
    Preempted, Preemption, PreemptionState, Project, Quota, Usage, UsageSample,
};

const PROJECT_COLUMNS: &str = "name, weight, quotas, created_at";

fn project_from_row(row: &DbRow) -> Result<Project, StoreError> {
    let quotas: String = row.try_get("quotas")?;
    Ok(Project {
        name: row.try_get("name")?,
        weight: u32::try_from(row.try_get::<i64, _>("weight")?)
            .map_err(|e| StoreError::corrupt("project weight", e))?,
        quotas: serde_json::from_str::<Vec<Quota>>(&quotas)
            .map_err(|e| StoreError::corrupt("project quotas", e))?,
        created_at: row.try_get("created_at")?,
    })
}

fn quotas_json(p: &Project) -> Result<String, StoreError> {
    serde_json::to_string(&p.quotas).map_err(|e| StoreError::corrupt("project quotas", e))
}

const PREEMPTION_COLUMNS: &str =
    "id, at, pool, host_id, service, project, priority, victims, state, task";

fn preemption_from_row(r: &DbRow) -> Result<Preemption, StoreError> {
    let victims: String = r.try_get("victims")?;
    let priority: String = r.try_get("priority")?;
    let state: String = r.try_get("state")?;
    Ok(Preemption {
        id: r.try_get("id")?,
        state: state
            .parse()
            .map_err(|e| StoreError::corrupt("preemption state", e))?,
        task: r.try_get("task")?,
        at: r.try_get("at")?,
        pool: r.try_get("pool")?,
        host: r.try_get("host_id")?,
        service: r.try_get("service")?,
        project: r.try_get("project")?,
        priority: priority
            .parse()
            .map_err(|e| StoreError::corrupt("preemption priority", e))?,
        victims: serde_json::from_str::<Vec<Preempted>>(&victims)
            .map_err(|e| StoreError::corrupt("preemption victims", e))?,
    })
}

#[async_trait]
impl ProjectStore for This {
    async fn create_project(&self, p: &Project) -> Result<(), StoreError> {
        self.write_one(
            sqlx::query("INSERT INTO projects (name, weight, quotas) VALUES ($1, $2, $3)")
                .bind(&p.name)
                .bind(i64::from(p.weight))
                .bind(quotas_json(p)?),
        )
        .await
        .map_err(|e| match e {
            StoreError::Database(sqlx::Error::Database(db)) if db.is_unique_violation() => {
                StoreError::Conflict(format!("a project named {:?} already exists", p.name))
            }
            other => other,
        })?;
        Ok(())
    }

    async fn replace_project(&self, p: &Project) -> Result<(), StoreError> {
        let done = self
            .write_one(
                sqlx::query("UPDATE projects SET weight = $2, quotas = $3 WHERE name = $1")
                    .bind(&p.name)
                    .bind(i64::from(p.weight))
                    .bind(quotas_json(p)?),
            )
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("project", &p.name));
        }
        Ok(())
    }

    async fn list_projects(&self) -> Result<Vec<Project>, StoreError> {
        sqlx::query(&format!(
            "SELECT {PROJECT_COLUMNS} FROM projects ORDER BY name"
        ))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(project_from_row)
        .collect()
    }

    async fn get_project(&self, name: &str) -> Result<Project, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {PROJECT_COLUMNS} FROM projects WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(&self.db)
        .await?
        .ok_or_else(|| not_found("project", name))?;
        project_from_row(&row)
    }

    async fn delete_project(&self, name: &str) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        let services: i64 = sqlx::query("SELECT COUNT(*) AS n FROM services WHERE project = $1")
            .bind(name)
            .fetch_one(&mut *tx)
            .await?
            .try_get("n")?;
        if services > 0 {
            return Err(StoreError::Conflict(format!(
                "project {name:?} has {services} service(s): delete them or move them to another project first"
            )));
        }
        let done = sqlx::query("DELETE FROM projects WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Err(not_found("project", name));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn add_preemption(&self, p: &Preemption) -> Result<i64, StoreError> {
        let victims = serde_json::to_string(&p.victims)
            .map_err(|e| StoreError::corrupt("preemption victims", e))?;
        // One fenced transaction: a server that lost the scheduler lease records nothing.
        let mut tx = self.begin_immediate().await?;
        let id: i64 = sqlx::query(
            "INSERT INTO preemptions (pool, host_id, service, project, priority, victims, state, task)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
        )
        .bind(&p.pool)
        .bind(&p.host)
        .bind(&p.service)
        .bind(&p.project)
        .bind(p.priority.as_str())
        .bind(victims)
        .bind(p.state.as_str())
        .bind(&p.task)
        .fetch_one(&mut *tx)
        .await?
        .try_get("id")?;
        // Open ones (proposed, approved, declined) are never pruned.
        sqlx::query(
            "DELETE FROM preemptions WHERE state IN ('done', 'expired')
               AND id <= (SELECT MAX(id) FROM preemptions) - $1",
        )
        .bind(crate::store::PREEMPTIONS_KEPT)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    async fn set_preemption_state(
        &self,
        id: i64,
        from: PreemptionState,
        to: PreemptionState,
    ) -> Result<bool, StoreError> {
        Ok(self
            .write_one(
                sqlx::query("UPDATE preemptions SET state = $1 WHERE id = $2 AND state = $3")
                    .bind(to.as_str())
                    .bind(id)
                    .bind(from.as_str()),
            )
            .await?
            .rows_affected()
            > 0)
    }

    async fn list_preemptions(&self, limit: u32) -> Result<Vec<Preemption>, StoreError> {
        sqlx::query(&format!(
            "SELECT {PREEMPTION_COLUMNS} FROM preemptions ORDER BY id DESC LIMIT $1"
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(preemption_from_row)
        .collect()
    }

    async fn open_preemptions(&self, pool: Option<&str>) -> Result<Vec<Preemption>, StoreError> {
        sqlx::query(&format!(
            "SELECT {PREEMPTION_COLUMNS} FROM preemptions
             WHERE state IN ('proposed', 'approved', 'declined') AND ($1 IS NULL OR pool = $1)
             ORDER BY id DESC"
        ))
        .bind(pool)
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(preemption_from_row)
        .collect()
    }

    async fn get_preemption(&self, id: i64) -> Result<Preemption, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {PREEMPTION_COLUMNS} FROM preemptions WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.db)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            what: "preemption",
            id: id.to_string(),
        })?;
        preemption_from_row(&row)
    }

    async fn expire_open_preemptions(&self, pool: &str) -> Result<u64, StoreError> {
        Ok(self
            .write_one(
                sqlx::query(
                    "UPDATE preemptions SET state = 'expired'
                     WHERE pool = $1 AND state IN ('proposed', 'approved', 'declined')",
                )
                .bind(pool),
            )
            .await?
            .rows_affected())
    }

    async fn record_project_usage(
        &self,
        at: i64,
        rows: &[(String, String, Usage)],
    ) -> Result<(), StoreError> {
        let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        // One fenced transaction: a server that lost the scheduler lease samples nothing.
        let mut tx = self.begin_immediate().await?;
        for (project, pool, u) in rows {
            sqlx::query(
                "INSERT INTO project_usage (project, pool, bucket_start, gpus, gpu_memory_mib,
                     compute_milli, cpu_milli, memory_mib)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 ON CONFLICT (pool, bucket_start, project) DO NOTHING",
            )
            .bind(project)
            .bind(pool)
            .bind(at)
            .bind(int(u.gpus))
            .bind(int(u.gpu_memory_mib))
            .bind(int(u.compute_milli))
            .bind(int(u.cpu_milli))
            .bind(int(u.memory_mib))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn project_usage(
        &self,
        since: i64,
        pool: Option<&str>,
    ) -> Result<Vec<UsageSample>, StoreError> {
        let uint = |r: &DbRow, c: &str| -> Result<u64, StoreError> {
            Ok(r.try_get::<i64, _>(c)?.max(0) as u64)
        };
        sqlx::query(
            "SELECT project, pool, bucket_start, gpus, gpu_memory_mib, compute_milli, cpu_milli,
                    memory_mib
             FROM project_usage WHERE bucket_start >= $1 AND ($2 IS NULL OR pool = $2)
             ORDER BY bucket_start, pool, project",
        )
        .bind(since)
        .bind(pool)
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(|r| {
            Ok(UsageSample {
                project: r.try_get("project")?,
                pool: r.try_get("pool")?,
                at: r.try_get("bucket_start")?,
                used: Usage {
                    gpus: uint(r, "gpus")?,
                    gpu_memory_mib: uint(r, "gpu_memory_mib")?,
                    compute_milli: uint(r, "compute_milli")?,
                    cpu_milli: uint(r, "cpu_milli")?,
                    memory_mib: uint(r, "memory_mib")?,
                },
            })
        })
        .collect()
    }

    async fn prune_project_usage(&self, before: i64) -> Result<u64, StoreError> {
        Ok(self
            .write_one(
                sqlx::query("DELETE FROM project_usage WHERE bucket_start < $1").bind(before),
            )
            .await?
            .rows_affected())
    }
}
