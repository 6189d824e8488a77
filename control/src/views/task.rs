//! One task's page (`GET /api/v1/tasks/{id}`): the task, what its service runs now, its
//! host's status, its budget and what was measured of it, its deployment's failures (a
//! crash loop stands out) and the events that name it. Its output is read apart
//! ([`Views::task_last_output`]), by operators of its project.

use super::Views;
use crate::error::ControlError;
use crate::store::{EventFilter, UsageQuery};
use tessera_model::MiB;
use tessera_model::api::{DeploymentFailures, TaskDetail};
use tessera_model::fit::UsagePoint;

/// How far back the page draws what was measured.
const USAGE_SPAN_SECS: i64 = 6 * 3600;
/// The most events the page lists.
const EVENTS: u32 = 50;

impl Views {
    /// `GET /api/v1/tasks/{id}` (`NotFound` naming the id when there is no such task).
    pub async fn task_detail(&self, id: &str) -> Result<TaskDetail, ControlError> {
        let task = match self.store.get_task(id).await {
            Ok(t) => t,
            Err(crate::StoreError::NotFound { .. }) => {
                return Err(ControlError::NotFound(format!("no task {id}")));
            }
            Err(e) => return Err(e.into()),
        };
        let service = match self.store.get_service(&task.service).await {
            Ok(s) => Some(s),
            Err(crate::StoreError::NotFound { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        let failures = match &service {
            Some(_) => self
                .store
                .list_deployments(&task.service)
                .await?
                .into_iter()
                .find(|d| d.id == task.deployment_id && d.failed_tasks > 0)
                .map(|d| DeploymentFailures {
                    deployment: d.id,
                    failed_tasks: d.failed_tasks,
                    restart_delay_secs: crate::plan::restart_delay(
                        d.failed_tasks,
                        self.core.config().max_restart_delay,
                    )
                    .as_secs(),
                }),
            None => None,
        };
        let host_status = match &task.host {
            Some(h) => match self.store.get_host(h).await {
                Ok(h) => Some(h.status),
                Err(crate::StoreError::NotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            },
            None => None,
        };
        let allocated = task.allocations.iter().map(|a| a.memory).sum::<MiB>();
        let (budget_mib, compute_cap_percent) =
            match self.scheduler.spec_of(&task.task_definition).await {
                Ok(spec) => {
                    let (budget, cap, shared) = super::fit::budget_of(&spec, Some(allocated));
                    (if shared { budget } else { allocated }, cap)
                }
                // A revision deleted since: what it was given.
                Err(_) => (allocated, None),
            };
        let events = self
            .store
            .list_events(&EventFilter {
                service: Some(task.service.clone()),
                task: Some(task.id.clone()),
                limit: EVENTS,
                ..Default::default()
            })
            .await?;
        Ok(TaskDetail {
            usage: self.task_usage(&task.id).await?,
            project: service.as_ref().map(|s| s.project.clone()),
            service_revision: service.map(|s| s.task_definition),
            host_status,
            budget_mib,
            compute_cap_percent,
            failures,
            events,
            task,
            now: self.core.unix_now(),
        })
    }

    /// What was measured of task `id` over the last hours, in the finest buckets kept.
    async fn task_usage(&self, id: &str) -> Result<Vec<UsagePoint>, ControlError> {
        let [fine, _] = self.core.config().usage.widths();
        let rows = self
            .store
            .list_usage(&UsageQuery {
                service: None,
                task: Some(id.to_owned()),
                width_secs: fine,
                since: self.core.unix_now() - USAGE_SPAN_SECS,
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| UsagePoint {
                t: r.bucket_start,
                memory_mean_mib: r.memory_max.0,
                memory_max_mib: r.memory_max.0,
                sm_mean: r.sm_p50,
                sm_p95: r.sm_p95,
                tasks: 1,
            })
            .collect())
    }
}
