//! One service brought toward its desired state: alarms and autoscaling, then the plan of
//! `plan_service` carried out (stops, starts with crash-loop backoff, rollbacks, deletion).

use crate::clock::{since, stamp, to_chrono};
use crate::deployments::Deployments;
use crate::error::ControlError;
use crate::plan::{Actions, ServicePlan, plan_service};
use crate::store::NewTask;
use tessera_model::notify::NoticeKind;
use tessera_model::service::{Deployment, DeploymentStatus, Service, StopReason, Task};

impl Deployments {
    /// Whether new tasks of deployment `id` may start now: after its n-th failed task they
    /// wait [`crate::plan::restart_delay`], when it has nothing to roll back to.
    fn may_start_tasks(&self, id: i64, failed: u32) -> Option<std::time::Duration> {
        if failed == 0 {
            return None;
        }
        let now = self.core.now();
        let mut backoff = self.passes.restart_backoff.lock();
        let entry = backoff.entry(id).or_insert((0, now));
        if failed > entry.0 {
            let delay = crate::plan::restart_delay(failed, self.core.config().max_restart_delay);
            *entry = (failed, now + to_chrono(delay));
        }
        (now < entry.1).then(|| since(entry.1, now))
    }

    /// Brings one service toward its desired state: carries out [`plan_service`]'s plan.
    pub(super) async fn reconcile_service(&self, service: &Service) -> Result<(), ControlError> {
        let name = service.name.as_str();
        let tasks = self.scheduler.live_tasks(name).await?;
        // A task stopped on purpose first leaves the endpoint list for the service's
        // deregistration delay.
        let drain = (service.deregistration_delay_secs > 0).then(|| {
            stamp(
                self.core.now()
                    + chrono::Duration::seconds(i64::from(service.deregistration_delay_secs)),
            )
        });
        let deployments = if service.deleting {
            Vec::new()
        } else {
            self.store.list_deployments(name).await?
        };
        if !service.deleting && self.watch_primary(service, &tasks, &deployments).await? {
            return Ok(());
        }
        match plan_service(
            service,
            &tasks,
            &deployments,
            self.core.config().failure_threshold,
        ) {
            ServicePlan::Delete { stop, gone } => {
                self.delete_step(name, &stop, gone, drain.as_deref()).await
            }
            ServicePlan::NoPrimary => {
                tracing::warn!(service = name, "service has no primary deployment");
                Ok(())
            }
            ServicePlan::RollBack {
                from,
                failing,
                failed,
                to,
            } => {
                let id = self.store.start_deployment(name, &to, true).await?;
                self.core.notify(NoticeKind::DeploymentRolledBack, (Some(name), None, None), &format!(
                        "deployment {from} rolled back after {failed} failed tasks: {failing} → {to} (deployment {id})"
                    ))
                .await;
                self.core.wake();
                Ok(())
            }
            ServicePlan::Converge(actions) => {
                self.converge(service, &deployments, &actions, drain.as_deref())
                    .await
            }
        }
    }

    /// The primary deployment's alarms (a breach rolls back to the revision before it, if
    /// there is one) and the service's autoscaling. Whether it rolled back (nothing more
    /// to do in this pass).
    async fn watch_primary(
        &self,
        service: &Service,
        tasks: &[Task],
        deployments: &[Deployment],
    ) -> Result<bool, ControlError> {
        let name = service.name.as_str();
        let Some(primary) = deployments
            .iter()
            .find(|d| d.status == DeploymentStatus::Primary)
        else {
            return Ok(false);
        };
        // Old tasks still run (a rollout or a rollback under way).
        let rolling_out = deployments.iter().any(|d| {
            d.id != primary.id
                && d.status != DeploymentStatus::Completed
                && d.running + d.pending > 0
        });
        let steady = !rolling_out && self.service_states.is(name, |s| s.steady);
        let age = self.age_of(primary.created_at);
        if let Some(why) = self
            .watch_alarms(service, tasks, primary.id, steady, age)
            .await?
        {
            let previous = deployments.iter().find(|d| {
                d.id != primary.id
                    && d.status != DeploymentStatus::RolledBack
                    && d.task_definition != primary.task_definition
            });
            let Some(prev) = previous else {
                let said = format!(
                    "deployment {}: {why}; there is no earlier revision to roll back to",
                    primary.id
                );
                self.core
                    .notify(NoticeKind::AlarmFired, (Some(name), None, None), &said)
                    .await;
                self.autoscale(service, tasks, rolling_out).await?;
                return Ok(false);
            };
            let id = self
                .store
                .start_deployment(name, &prev.task_definition, true)
                .await?;
            self.forget_alarms(name);
            let said = format!(
                "deployment {} rolled back: {why}: {} → {} (deployment {id})",
                primary.id, primary.task_definition, prev.task_definition
            );
            self.core
                .notify(
                    NoticeKind::DeploymentRolledBack,
                    (Some(name), None, None),
                    &said,
                )
                .await;
            self.core.wake();
            return Ok(true);
        }
        self.autoscale(service, tasks, rolling_out).await?;
        Ok(false)
    }

    /// A service being deleted: its tasks `stop` are asked to stop; once nothing is live
    /// (`gone`) it is deleted.
    async fn delete_step(
        &self,
        name: &str,
        stop: &[String],
        gone: bool,
        drain: Option<&str>,
    ) -> Result<(), ControlError> {
        for id in stop {
            self.store
                .request_task_stop(id, &StopReason::Deleted, drain, false)
                .await?;
        }
        if gone {
            self.store.delete_service(name).await?;
            self.service_states.forget(name);
            self.core
                .event(Some(name), None, &format!("service {name} deleted"))
                .await;
        } else if !stop.is_empty() {
            self.core.wake();
        }
        Ok(())
    }

    /// Carries out a converging plan: stops, starts (with crash-loop backoff), drained
    /// deployments completed, and what the service's events say of its progress.
    async fn converge(
        &self,
        service: &Service,
        deployments: &[Deployment],
        actions: &Actions,
        drain: Option<&str>,
    ) -> Result<(), ControlError> {
        let name = service.name.as_str();
        let primary = deployments
            .iter()
            .find(|d| d.id == actions.primary)
            .expect("the plan's primary is one of them");
        for (id, reason) in &actions.stop {
            self.store
                .request_task_stop(id, reason, drain, actions.failures.contains(id))
                .await?;
            if *reason == StopReason::Unhealthy {
                self.core
                    .event(Some(name), None, &format!("task {id} stopped: {reason}"))
                    .await;
            }
        }
        self.start_step(service, primary, actions).await?;
        if !actions.stop.is_empty() || actions.start > 0 {
            self.core.wake();
        }
        for &id in &actions.completed {
            self.store
                .set_deployment_status(id, DeploymentStatus::Completed)
                .await?;
            if let Some(d) = deployments.iter().find(|d| d.id == id) {
                let said = format!("deployment {id} ({}) drained", d.task_definition);
                self.core.event(Some(name), None, &said).await;
            }
        }
        self.say_progress(service, primary, actions).await;
        Ok(())
    }

    /// Starts the plan's new tasks of the primary deployment. With a revision to roll
    /// back to, the circuit breaker answers failures; without one, restarts slow down.
    async fn start_step(
        &self,
        service: &Service,
        primary: &Deployment,
        actions: &Actions,
    ) -> Result<(), ControlError> {
        let name = service.name.as_str();
        let wait = if actions.start > 0 && !actions.can_roll_back {
            self.may_start_tasks(primary.id, primary.failed_tasks)
        } else {
            None
        };
        if let Some(wait) = wait {
            let message = format!(
                "deployment {} has {} failed task(s): new tasks wait {:.0} s before they start",
                primary.id,
                primary.failed_tasks,
                wait.as_secs_f64().ceil()
            );
            if self
                .service_states
                .changed(name, |s| s.backoff = Some(primary.failed_tasks))
            {
                self.core
                    .notify(
                        NoticeKind::TaskCrashLooping,
                        (Some(name), None, None),
                        &message,
                    )
                    .await;
            }
        } else if actions.start > 0 {
            let def = self
                .store
                .get_task_definition(&primary.task_definition)
                .await?;
            let tasks: Vec<NewTask> = (0..actions.start)
                .map(|_| {
                    NewTask::of(
                        uuid::Uuid::new_v4().to_string(),
                        name,
                        primary.id,
                        &primary.task_definition,
                        &service.pool,
                        &def.spec,
                    )
                })
                .collect();
            self.store.create_tasks(&tasks).await?;
        }
        Ok(())
    }

    /// Says a rollout's progress (when the new revision's running count changes) and a
    /// steady state reached.
    async fn say_progress(&self, service: &Service, primary: &Deployment, actions: &Actions) {
        let name = service.name.as_str();
        let desired = service.desired_count;
        if let Some((running, old_left)) = actions.progress
            && self
                .service_states
                .changed(name, |s| s.progress = Some((primary.id, running)))
        {
            self.core.event(
                Some(name),
                None,
                &format!(
                    "deployment {} in progress: {running} of {desired} task(s) of {} running, {old_left} old task(s) left",
                    primary.id, primary.task_definition
                ),
            )
            .await;
        }
        if self
            .service_states
            .changed(name, |s| s.steady = actions.steady)
            && actions.steady
        {
            self.core.event(
                Some(name),
                None,
                &format!(
                    "service {name} has reached a steady state: {desired} task(s) of {} running",
                    primary.task_definition
                ),
            )
            .await;
        }
    }
}
