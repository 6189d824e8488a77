//! Task definitions, services and their deployments.
use super::*;

/// Deployments of `service` (all when `None`), newest first, with their task counts.
pub(super) async fn deployments_where(
    db: &DbPool,
    service: Option<&str>,
) -> Result<Vec<Deployment>, StoreError> {
    let sql = format!(
        "SELECT d.id, d.service, d.family, d.revision, d.status, d.failed_tasks, d.created_at,
             (SELECT COUNT(*) FROM tasks t WHERE t.deployment_id = d.id AND t.state IN ('pending', 'assigned')) AS pending,
             (SELECT COUNT(*) FROM tasks t WHERE t.deployment_id = d.id AND t.state = 'running') AS running
         FROM deployments d {} ORDER BY d.id DESC",
        if service.is_some() { "WHERE d.service = $1" } else { "" }
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

#[async_trait]
impl ServiceStore for This {
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
            "SELECT COALESCE(MAX(revision), 0) + 1 AS next FROM task_definitions WHERE family = $1",
        )
        .bind(&spec.family)
        .fetch_one(&mut *tx)
        .await?
        .try_get("next")?;
        let row = sqlx::query(
            "INSERT INTO task_definitions (family, revision, spec, secrets) VALUES ($1, $2, $3, $4)
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
            "SELECT family, revision, active, spec, secrets, registered_at FROM task_definitions WHERE family = $1 ORDER BY revision",
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
            "SELECT family, revision, active, spec, secrets, registered_at FROM task_definitions WHERE family = $1 AND revision = $2",
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
        let done = self
            .write_one(
                sqlx::query(
                    "UPDATE task_definitions SET active = $1 WHERE family = $2 AND revision = $3",
                )
                .bind(i64::from(active))
                .bind(&r.family)
                .bind(i64::from(r.revision)),
            )
            .await?;
        updated(done, "task definition", r)
    }

    async fn create_service(&self, s: &Service) -> Result<(), StoreError> {
        let constraints = serde_json::to_string(&s.constraints)
            .map_err(|e| StoreError::corrupt("service constraints", e))?;
        let mut tx = self.begin_immediate().await?;
        // The project must exist when the service is written (a delete of the project
        // checks for services in its own transaction): one statement, no window.
        let done = sqlx::query(
            "INSERT INTO services (name, family, revision, pool, desired_count, strategy, constraints,
                 minimum_healthy_percent, maximum_percent, stop_timeout_secs, deregistration_delay_secs, objectives, project, priority)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14
             WHERE EXISTS (SELECT 1 FROM projects WHERE name = $13)",
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
        .bind(i64::from(s.deregistration_delay_secs))
        .bind(objectives_json(&s.objectives)?)
        .bind(&s.project)
        .bind(s.priority.as_str())
        .execute(&mut *tx)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.is_unique_violation() => {
                StoreError::Conflict(format!("a service named {:?} already exists", s.name))
            }
            _ => StoreError::Database(e),
        })?;
        if done.rows_affected() == 0 {
            return Err(not_found("project", &s.project));
        }
        sqlx::query("INSERT INTO deployments (service, family, revision, status) VALUES ($1, $2, $3, 'primary')")
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

    async fn service_changes(
        &self,
        after: i64,
        recent: &str,
    ) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = sqlx::query_as(
            // Two indexed reads (an `OR` would scan the table).
            "SELECT seq, service FROM service_changes WHERE seq > $1
             UNION SELECT seq, service FROM service_changes WHERE at >= $2 ORDER BY seq",
        )
        .bind(after)
        .bind(recent)
        .fetch_all(&self.db)
        .await?;
        Ok(rows)
    }

    async fn last_service_change(&self) -> Result<i64, StoreError> {
        let (last,): (Option<i64>,) = sqlx::query_as("SELECT MAX(seq) FROM service_changes")
            .fetch_one(&self.db)
            .await?;
        Ok(last.unwrap_or(0))
    }

    async fn forget_service_changes(&self, upto: i64, before: &str) -> Result<(), StoreError> {
        self.write_one(
            sqlx::query("DELETE FROM service_changes WHERE seq <= $1 AND at < $2")
                .bind(upto)
                .bind(before),
        )
        .await?;
        Ok(())
    }

    async fn get_service(&self, name: &str) -> Result<Service, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {SERVICE_COLUMNS} FROM services WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(&self.db)
        .await?
        .ok_or_else(|| not_found("service", name))?;
        service_from_row(&row)
    }

    async fn stop_timeouts(&self, deployments: &[i64]) -> Result<HashMap<i64, u32>, StoreError> {
        let mut out = HashMap::new();
        for chunk in deployments.chunks(500) {
            let mut q = QueryBuilder::<Db>::new(
                "SELECT d.id, s.stop_timeout_secs FROM deployments d JOIN services s ON s.name = d.service WHERE d.id IN (",
            );
            let mut sep = q.separated(", ");
            for id in chunk {
                sep.push_bind(*id);
            }
            q.push(")");
            for row in q.build().fetch_all(&self.db).await? {
                let secs: i64 = row.try_get("stop_timeout_secs")?;
                out.insert(row.try_get("id")?, secs as u32);
            }
        }
        Ok(out)
    }

    async fn set_desired_count(&self, name: &str, desired: u32) -> Result<(), StoreError> {
        let done = self
            .write_one(
                sqlx::query("UPDATE services SET desired_count = $1 WHERE name = $2")
                    .bind(i64::from(desired))
                    .bind(name),
            )
            .await?;
        updated(done, "service", name)
    }

    async fn update_service_settings(
        &self,
        name: &str,
        change: &crate::store::SettingsChange,
    ) -> Result<(), StoreError> {
        let mut q = QueryBuilder::<Db>::new("UPDATE services SET name = name");
        if let Some(project) = &change.project {
            q.push(", project = ").push_bind(project.clone());
        }
        if let Some(priority) = change.priority {
            q.push(", priority = ").push_bind(priority.as_str());
        }
        if let Some(strategy) = &change.strategy {
            q.push(", strategy = ")
                .push_bind(strategy.map(|p| p.as_str()));
        }
        if let Some(c) = &change.constraints {
            let json = serde_json::to_string(c)
                .map_err(|e| StoreError::corrupt("service constraints", e))?;
            q.push(", constraints = ").push_bind(json);
        }
        if let Some(d) = &change.deployment {
            q.push(", minimum_healthy_percent = ")
                .push_bind(i64::from(d.minimum_healthy_percent))
                .push(", maximum_percent = ")
                .push_bind(i64::from(d.maximum_percent));
        }
        if let Some(t) = change.stop_timeout_secs {
            q.push(", stop_timeout_secs = ").push_bind(i64::from(t));
        }
        if let Some(t) = change.deregistration_delay_secs {
            q.push(", deregistration_delay_secs = ")
                .push_bind(i64::from(t));
        }
        if let Some(o) = &change.objectives {
            q.push(", objectives = ").push_bind(objectives_json(o)?);
        }
        q.push(" WHERE name = ").push_bind(name.to_owned());
        let done = self.write_one(q.build()).await?;
        updated(done, "service", name)
    }

    async fn start_deployment(
        &self,
        name: &str,
        r: &TaskDefRef,
        failed_primary: bool,
    ) -> Result<i64, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let done = sqlx::query("UPDATE services SET family = $1, revision = $2 WHERE name = $3")
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
        sqlx::query("UPDATE deployments SET status = $1 WHERE service = $2 AND status = 'primary'")
            .bind(old)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let id: i64 = sqlx::query(
            "INSERT INTO deployments (service, family, revision, status) VALUES ($1, $2, $3, 'primary') RETURNING id",
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
        let done = self
            .write_one(
                sqlx::query("UPDATE services SET deleting = 1, desired_count = 0 WHERE name = $1")
                    .bind(name),
            )
            .await?;
        updated(done, "service", name)
    }

    async fn delete_service(&self, name: &str) -> Result<(), StoreError> {
        self.write_one(sqlx::query("DELETE FROM services WHERE name = $1").bind(name))
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
        self.write_one(
            sqlx::query("UPDATE deployments SET status = $1 WHERE id = $2")
                .bind(status.as_str())
                .bind(id),
        )
        .await?;
        Ok(())
    }
}

/// A service's objectives as stored.
fn objectives_json(o: &tessera_model::work::Objectives) -> Result<String, StoreError> {
    serde_json::to_string(o).map_err(|e| StoreError::corrupt("service objectives", e))
}
