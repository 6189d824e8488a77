//! The reconcile pass: host lifecycle (lost hosts, moving tasks off draining and impaired
//! hosts), services (desired counts, rolling deployments, the circuit breaker, deletion),
//! then scheduling of whatever is pending.

use crate::clock::{since, stamp, to_chrono};
use crate::control::Control;
use crate::error::ControlError;
use crate::store::{HostState, NewTask, Pruned, TaskFilter};

/// How often old rows are pruned.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
use std::collections::{BTreeMap, HashMap};
use tessera_model::service::{DeploymentStatus, Service, Task, TaskState};
use tessera_model::{HostId, HostStatus};

/// Orders tasks for stopping: ones not yet running first, then the newest.
fn stop_order(tasks: &mut [&Task]) {
    tasks.sort_by_key(|t| {
        (
            t.state == TaskState::Running,
            std::cmp::Reverse(t.created_at.clone()),
        )
    });
}

impl Control {
    /// One pass over everything. Serialised: concurrent callers wait for each other.
    pub async fn reconcile_once(&self) -> Result<(), ControlError> {
        let _pass = self.pass.lock().await;
        self.detect_lost_hosts().await?;
        self.migrate_off_unhealthy_hosts().await?;
        for service in self.store.list_services().await? {
            // Each service on its own: one that fails (a definition that no longer parses,
            // say) is reported and the others are still reconciled.
            if let Err(e) = self.reconcile_service(&service).await {
                let message = format!("reconciling service {} failed: {e}", service.name);
                tracing::error!(service = %service.name, error = %e, "reconciling a service failed");
                let key = format!("failed:{}", service.name);
                let before = self
                    .last_complaint
                    .lock()
                    .expect("not poisoned")
                    .insert(key, message.clone());
                if before.as_deref() != Some(message.as_str()) {
                    self.event(Some(&service.name), None, &message).await;
                }
            }
        }
        self.schedule().await?;
        let due = {
            let mut last = self.last_prune.lock().expect("not poisoned");
            let now = self.now();
            let due = last.is_none_or(|t| since(now, t) >= PRUNE_EVERY);
            if due {
                *last = Some(now);
            }
            due
        };
        if due {
            self.prune().await?;
        }
        Ok(())
    }

    /// Deletes what is older than the retention: stopped tasks, events, finished
    /// deployments. Runs from the reconcile loop every 10 minutes.
    pub async fn prune(&self) -> Result<Pruned, ControlError> {
        let pruned = self
            .store
            .prune(&stamp(self.now() - to_chrono(self.config.retention)))
            .await?;
        if pruned != Pruned::default() {
            tracing::info!(?pruned, "pruned rows past the retention");
        }
        Ok(pruned)
    }

    /// Whether new tasks of deployment `id` may start now. After the deployment's n-th
    /// failed task they wait 2^(n-1) s (at most `max_restart_delay`), so a revision that
    /// crashes at once, with nothing to roll back to, is not restarted in a tight loop.
    fn may_start_tasks(&self, id: i64, failed: u32) -> Option<std::time::Duration> {
        if failed == 0 {
            return None;
        }
        let now = self.now();
        let mut backoff = self.restart_backoff.lock().expect("not poisoned");
        let entry = backoff.entry(id).or_insert((0, now));
        if failed > entry.0 {
            let delay = std::time::Duration::from_secs(1u64 << (failed - 1).min(16))
                .min(self.config.max_restart_delay);
            *entry = (failed, now + to_chrono(delay));
        }
        (now < entry.1).then(|| since(entry.1, now))
    }

    /// Hosts silent past the timeout become lost; their tasks stop and are replaced. For one
    /// lost timeout after this control plane started nothing is declared lost: agents
    /// could not reach a server that was down, and get that long to sync again.
    async fn detect_lost_hosts(&self) -> Result<(), ControlError> {
        let swept = self.store.stop_tasks_on_lost_hosts().await?;
        if !swept.is_empty() {
            tracing::warn!(tasks = swept.len(), "stopped tasks left on lost hosts");
            self.wake();
        }
        let timeout = self.lost_timeout();
        let now = self.now();
        if since(now, self.started) < timeout {
            return Ok(());
        }
        let secs = timeout.as_secs_f64();
        let cutoff = stamp(now - to_chrono(timeout));
        for id in self.store.hosts_silent_since(&cutoff).await? {
            let reason = format!("no agent sync for {secs:.0} s");
            // Marked and its tasks stopped in one transaction, and only if it is still
            // silent: a sync that arrived meanwhile wins.
            let Some(stopped) = self.store.mark_host_lost(&id, &reason, &cutoff).await? else {
                continue;
            };
            self.event(
                None,
                Some(&id),
                &format!(
                    "host {id} lost ({reason}); {} task(s) stopped and replaced elsewhere",
                    stopped.len()
                ),
            )
            .await;
            self.wake();
        }
        Ok(())
    }

    pub(crate) async fn tasks_on(&self, host: &HostId) -> Result<Vec<Task>, ControlError> {
        Ok(self
            .store
            .list_tasks(&TaskFilter {
                host: Some(host.clone()),
                states: vec![TaskState::Assigned, TaskState::Running, TaskState::Stopping],
                ..Default::default()
            })
            .await?)
    }

    /// Marks the tasks of draining and impaired hosts for migration, a bounded share of
    /// each pool's hosts at a time. Their services then start replacements first and stop
    /// the old tasks once the replacements run (see `reconcile_service`).
    async fn migrate_off_unhealthy_hosts(&self) -> Result<(), ControlError> {
        // Every pass: the hosts' statuses only, not their GPUs.
        let hosts = self.store.host_statuses().await?;
        let mut by_pool: BTreeMap<String, Vec<&HostState>> = BTreeMap::new();
        for h in &hosts {
            by_pool.entry(h.pool.to_string()).or_default().push(h);
        }
        for (_, pool_hosts) in by_pool {
            let limit =
                ((pool_hosts.len() as f64 * self.config.migration_share).floor() as usize).max(1);
            let mut moving = 0;
            let mut candidates = Vec::new();
            for h in pool_hosts
                .iter()
                .filter(|h| matches!(h.status, HostStatus::Draining | HostStatus::Impaired))
            {
                let tasks = self.tasks_on(&h.id).await?;
                let live: Vec<&Task> = tasks
                    .iter()
                    .filter(|t| t.state != TaskState::Stopping)
                    .collect();
                if live.iter().any(|t| t.migrating) {
                    moving += 1;
                } else if !live.is_empty() {
                    candidates.push((
                        h.id.clone(),
                        live.iter().map(|t| t.id.clone()).collect::<Vec<_>>(),
                    ));
                }
            }
            for (host, ids) in candidates.into_iter().take(limit.saturating_sub(moving)) {
                for id in &ids {
                    self.store.set_task_migrating(id).await?;
                }
                self.event(
                    None,
                    Some(&host),
                    &format!(
                        "moving {} task(s) off host {host}: replacements start first",
                        ids.len()
                    ),
                )
                .await;
            }
        }
        Ok(())
    }

    /// Brings one service toward its desired state.
    async fn reconcile_service(&self, service: &Service) -> Result<(), ControlError> {
        let name = service.name.as_str();
        let tasks = self.live_tasks(name).await?;
        if service.deleting {
            let mut stopping = 0;
            for t in &tasks {
                if t.state != TaskState::Stopping {
                    self.store
                        .request_task_stop(&t.id, "service deleted")
                        .await?;
                    stopping += 1;
                }
            }
            if tasks.is_empty() {
                self.store.delete_service(name).await?;
                self.event(Some(name), None, &format!("service {name} deleted"))
                    .await;
            } else if stopping > 0 {
                self.wake();
            }
            return Ok(());
        }
        let deployments = self.store.list_deployments(name).await?;
        let Some(primary) = deployments
            .iter()
            .find(|d| d.status == DeploymentStatus::Primary)
        else {
            tracing::warn!(service = name, "service has no primary deployment");
            return Ok(());
        };
        // Circuit breaker: a deployment whose tasks keep failing rolls back to the last
        // revision that ran.
        let previous = deployments.iter().find(|d| {
            d.id != primary.id
                && d.status != DeploymentStatus::RolledBack
                && d.task_definition != primary.task_definition
        });
        if primary.failed_tasks >= self.config.failure_threshold
            && let Some(prev) = previous
        {
            let id = self
                .store
                .start_deployment(name, &prev.task_definition, true)
                .await?;
            self.event(
                Some(name),
                None,
                &format!(
                    "deployment {} rolled back after {} failed tasks: {} → {} (deployment {id})",
                    primary.id, primary.failed_tasks, primary.task_definition, prev.task_definition
                ),
            )
            .await;
            self.wake();
            return Ok(());
        }
        let desired = service.desired_count as usize;
        // Tasks being moved off a host and tasks already stopping do not count.
        let counted: Vec<&Task> = tasks
            .iter()
            .filter(|t| !t.migrating && t.state != TaskState::Stopping)
            .collect();
        let (new, old): (Vec<&Task>, Vec<&Task>) =
            counted.iter().partition(|t| t.deployment_id == primary.id);
        let running = |ts: &[&Task]| ts.iter().filter(|t| t.state == TaskState::Running).count();
        let running_total = running(&new) + running(&old);
        let max_total = (desired * service.deployment.maximum_percent as usize)
            .div_ceil(100)
            .max(desired);
        let min_healthy =
            (desired * service.deployment.minimum_healthy_percent as usize).div_ceil(100);
        let mut stop: Vec<(String, &str)> = Vec::new();

        // Too many new tasks (scaled down): stop the surplus.
        if new.len() > desired {
            let mut surplus = new.clone();
            stop_order(&mut surplus);
            stop.extend(
                surplus
                    .iter()
                    .take(new.len() - desired)
                    .map(|t| (t.id.clone(), "scaled down")),
            );
        }
        // Old tasks: those not running can go at once; running ones only while at least
        // minimum_healthy_percent of the desired count stays running.
        let mut old_sorted = old.clone();
        stop_order(&mut old_sorted);
        let mut may_stop_running = running_total.saturating_sub(min_healthy);
        for t in old_sorted {
            if t.state == TaskState::Running {
                if may_stop_running == 0 {
                    break;
                }
                may_stop_running -= 1;
            }
            stop.push((t.id.clone(), "replaced by a newer deployment"));
        }
        // Start new tasks up to the desired count, within maximum_percent of live tasks.
        let live_after_stops = counted.len() - stop.len();
        let start = desired
            .saturating_sub(new.len())
            .min(max_total.saturating_sub(live_after_stops));

        // Migrating tasks stop once the service has enough running tasks without them.
        let migrating: Vec<&Task> = tasks
            .iter()
            .filter(|t| t.migrating && t.state != TaskState::Stopping)
            .collect();
        if !migrating.is_empty() && running_total >= desired {
            stop.extend(
                migrating
                    .iter()
                    .map(|t| (t.id.clone(), "moved off a draining or impaired host")),
            );
        }

        for (id, reason) in &stop {
            self.store.request_task_stop(id, reason).await?;
        }
        // With a revision to roll back to, the circuit breaker answers failures; without
        // one, restarts slow down.
        let wait = if start > 0 && previous.is_none() {
            self.may_start_tasks(primary.id, primary.failed_tasks)
        } else {
            None
        };
        if let Some(wait) = wait {
            let key = format!("backoff:{name}");
            let message = format!(
                "deployment {} has {} failed task(s): new tasks wait {:.0} s before they start",
                primary.id,
                primary.failed_tasks,
                wait.as_secs_f64().ceil()
            );
            let first = self
                .last_complaint
                .lock()
                .expect("not poisoned")
                .insert(key, primary.failed_tasks.to_string())
                != Some(primary.failed_tasks.to_string());
            if first {
                self.event(Some(name), None, &message).await;
            }
        } else if start > 0 {
            let def = self
                .store
                .get_task_definition(&primary.task_definition)
                .await?;
            let tasks: Vec<NewTask> = (0..start)
                .map(|_| NewTask {
                    id: uuid::Uuid::new_v4().to_string(),
                    service: name.to_owned(),
                    deployment_id: primary.id,
                    task_definition: primary.task_definition.clone(),
                    pool: service.pool.clone(),
                    cpu: def.spec.cpu(),
                    memory: def.spec.memory(),
                })
                .collect();
            self.store.create_tasks(&tasks).await?;
        }
        if !stop.is_empty() || start > 0 {
            self.wake();
        }
        // Old deployments without live tasks are done.
        let live_by_deployment: HashMap<i64, usize> =
            tasks.iter().fold(HashMap::new(), |mut m, t| {
                *m.entry(t.deployment_id).or_insert(0) += 1;
                m
            });
        for d in deployments
            .iter()
            .filter(|d| d.status == DeploymentStatus::Active)
        {
            if live_by_deployment.get(&d.id).copied().unwrap_or(0) == 0 {
                self.store
                    .set_deployment_status(d.id, DeploymentStatus::Completed)
                    .await?;
                self.event(
                    Some(name),
                    None,
                    &format!("deployment {} ({}) drained", d.id, d.task_definition),
                )
                .await;
            }
        }
        // Progress of a rollout, when the new revision's running count changes.
        if !old.is_empty() {
            let key = format!("progress:{}", primary.id);
            let now = running(&new).to_string();
            let before = self
                .last_complaint
                .lock()
                .expect("not poisoned")
                .insert(key, now.clone());
            if before.as_deref() != Some(now.as_str()) {
                self.event(
                    Some(name),
                    None,
                    &format!(
                        "deployment {} in progress: {now} of {desired} task(s) of {} running, {} old task(s) left",
                        primary.id,
                        primary.task_definition,
                        old.len()
                    ),
                )
                .await;
            }
        }
        let steady = old.is_empty()
            && new.len() == desired
            && running(&new) == desired
            && migrating.is_empty();
        let key = format!("steady:{name}");
        let was_steady = self
            .last_complaint
            .lock()
            .expect("not poisoned")
            .get(&key)
            .is_some();
        if steady && !was_steady {
            self.last_complaint
                .lock()
                .expect("not poisoned")
                .insert(key, String::new());
            self.event(
                Some(name),
                None,
                &format!(
                    "service {name} has reached a steady state: {desired} task(s) of {} running",
                    primary.task_definition
                ),
            )
            .await;
        } else if !steady && was_steady {
            self.last_complaint
                .lock()
                .expect("not poisoned")
                .remove(&key);
        }
        Ok(())
    }
}
