//! The reconcile pass: host lifecycle (lost hosts, moving tasks off draining and impaired
//! hosts), services (desired counts, rolling deployments, the circuit breaker, deletion),
//! then scheduling of whatever is pending.

use crate::clock::{since, stamp, to_chrono};
use crate::control::Control;
use crate::error::ControlError;
use crate::plan::{DELETED, ServicePlan, UNHEALTHY, plan_service};
use crate::store::{HostState, NewTask, Pruned, TaskFilter};

/// How often old rows are pruned.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// Changes recorded this recently are read again by each pass: a transaction that took
/// its number before the last pass read may commit after it (PostgreSQL).
const LATE_COMMITS: std::time::Duration = std::time::Duration::from_secs(10);
/// How often the changes already read are deleted.
const FORGET_EVERY: std::time::Duration = std::time::Duration::from_secs(30);
/// More changed services than this are read in one query rather than one by one.
const READ_ONE_BY_ONE: usize = 64;

/// How long each phase of a pass took: the histogram `tessera_reconcile_phase_seconds`,
/// and a debug line per pass.
struct Phases {
    last: std::time::Instant,
    took: Vec<(&'static str, std::time::Duration)>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            last: std::time::Instant::now(),
            took: Vec::with_capacity(8),
        }
    }
}

impl Phases {
    fn done(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        let took = now - self.last;
        self.last = now;
        metrics::histogram!("tessera_reconcile_phase_seconds", "phase" => phase)
            .record(took.as_secs_f64());
        self.took.push((phase, took));
        if phase == "scheduling" {
            tracing::debug!(phases = ?self.took, "reconcile pass");
        }
    }
}

use std::collections::{BTreeMap, BTreeSet, HashSet};
use tessera_model::service::{DeploymentStatus, Service, Task, TaskState};
use tessera_model::{HostId, HostStatus, PoolName};

impl Control {
    /// One pass over everything. Serialised: concurrent callers wait for each other.
    pub async fn reconcile_once(&self) -> Result<(), ControlError> {
        let _pass = self.passes.pass.lock().await;
        let mut phases = Phases::default();
        self.flush_heartbeats().await?;
        phases.done("heartbeats");
        self.detect_lost_hosts().await?;
        phases.done("lost_hosts");
        self.migrate_off_unhealthy_hosts().await?;
        phases.done("migrations");
        let services = self.services_to_reconcile().await?;
        phases.done("changes");
        for service in services {
            // Each service on its own: one that fails (a definition that no longer parses,
            // say) is reported and the others are still reconciled.
            match self.reconcile_service(&service).await {
                Ok(()) => {
                    self.service_state_changed(&service.name, |s| s.failure = None);
                }
                Err(e) => {
                    let message = format!("reconciling service {} failed: {e}", service.name);
                    tracing::error!(service = %service.name, error = %e, "reconciling a service failed");
                    if self
                        .service_state_changed(&service.name, |s| s.failure = Some(message.clone()))
                    {
                        self.event(Some(&service.name), None, &message).await;
                    }
                }
            }
            self.note_reconciled(&service);
        }
        phases.done("services");
        self.forget_changes_read().await?;
        self.advance_consolidation().await?;
        phases.done("consolidation");
        self.schedule().await?;
        phases.done("scheduling");
        let due = {
            let mut last = self.passes.last_prune.lock();
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

    /// The services this pass looks at. A full pass (the first, then one every
    /// `full_pass_every`, and after the scheduler lease changed hands) takes them all;
    /// any other takes those the database recorded a change of since the last pass (its
    /// triggers record every write to a service, its deployments or its tasks' state,
    /// whoever made it) and those that move with time (not steady, failing, deleting,
    /// with alarms or autoscaling). An unchanged fleet costs a pass one small read.
    async fn services_to_reconcile(&self) -> Result<Vec<Service>, ControlError> {
        let recent = stamp(self.now() - to_chrono(LATE_COMMITS));
        let (full, seen, every_pass) = {
            let m = self.passes.memory.lock();
            (
                m.full_due(self.config.full_pass_every),
                m.seen,
                m.every_pass.clone(),
            )
        };
        let seen = match seen {
            Some(seen) if !full => seen,
            _ => {
                // Numbered before the services are read: a change committed meanwhile is
                // read by the next pass.
                let last = self.store.last_service_change().await?;
                let services = self.store.list_services().await?;
                let mut m = self.passes.memory.lock();
                m.seen = Some(last);
                m.acted.clear();
                // Every service stays looked at until its reconcile says it is settled: a
                // pass that ends early (a failure, a panic) leaves the rest for the next.
                m.every_pass = services.iter().map(|s| s.name.clone()).collect();
                m.last_full = Some(std::time::Instant::now());
                m.unforgotten = true;
                m.last_scope = (true, services.len());
                metrics::counter!("tessera_reconcile_passes_total", "scope" => "full").increment(1);
                return Ok(services);
            }
        };
        metrics::counter!("tessera_reconcile_passes_total", "scope" => "changed").increment(1);
        let changes = self.store.service_changes(seen, &recent).await?;
        let mut names: BTreeSet<String> = every_pass;
        {
            let mut m = self.passes.memory.lock();
            let mut acted = HashSet::with_capacity(changes.len());
            let mut newest = seen;
            for (seq, service) in changes {
                // At or below the last number read: a late commit inside the window, new
                // unless a pass already acted on it.
                if seq > seen || !m.acted.contains(&seq) {
                    names.insert(service);
                }
                acted.insert(seq);
                newest = newest.max(seq);
            }
            if newest > seen {
                m.unforgotten = true;
            }
            m.acted = acted;
            m.seen = Some(newest);
            // The changes are marked read: each service they name stays looked at until its
            // reconcile says it is settled, so a pass that ends early (a failure, a panic)
            // loses none of them.
            m.every_pass.extend(names.iter().cloned());
            m.last_scope = (false, names.len());
        }
        if names.len() > READ_ONE_BY_ONE {
            let services: Vec<Service> = self
                .store
                .list_services()
                .await?
                .into_iter()
                .filter(|s| names.contains(&s.name))
                .collect();
            let mut m = self.passes.memory.lock();
            for gone in names
                .iter()
                .filter(|n| !services.iter().any(|s| &s.name == *n))
            {
                m.every_pass.remove(gone);
            }
            return Ok(services);
        }
        let mut services = Vec::with_capacity(names.len());
        for name in names {
            match self.store.get_service(&name).await {
                Ok(s) => services.push(s),
                Err(crate::error::StoreError::NotFound { .. }) => {
                    self.passes.memory.lock().every_pass.remove(&name);
                }
                // One service that cannot be read (a row that no longer parses) keeps its
                // place for the next pass and holds up none of the others.
                Err(e) => {
                    tracing::error!(service = %name, error = %e, "reading a service to reconcile failed");
                }
            }
        }
        Ok(services)
    }

    /// The last pass: whether it looked at every service, and at how many it looked.
    pub fn last_pass_scope(&self) -> (bool, usize) {
        self.passes.memory.lock().last_scope
    }

    /// After a service was reconciled: whether the next passes must look at it even
    /// without a change recorded (it moves with time).
    fn note_reconciled(&self, service: &Service) {
        let o = &service.objectives;
        let settled = !service.deleting
            && o.alarms.is_empty()
            && o.autoscaling.is_none()
            && self
                .passes
                .service_state
                .lock()
                .get(&service.name)
                .is_some_and(|s| s.steady && s.failure.is_none());
        let mut m = self.passes.memory.lock();
        if settled {
            m.every_pass.remove(&service.name);
        } else {
            m.every_pass.insert(service.name.clone());
        }
    }

    /// Deletes the changes the passes have read, at most every [`FORGET_EVERY`].
    async fn forget_changes_read(&self) -> Result<(), ControlError> {
        let upto = {
            let mut m = self.passes.memory.lock();
            let due = m.unforgotten && m.last_forget.is_none_or(|t| t.elapsed() >= FORGET_EVERY);
            match (due, m.seen) {
                (true, Some(seen)) => {
                    m.unforgotten = false;
                    m.last_forget = Some(std::time::Instant::now());
                    seen
                }
                _ => return Ok(()),
            }
        };
        let recent = stamp(self.now() - to_chrono(LATE_COMMITS));
        self.store.forget_service_changes(upto, &recent).await?;
        Ok(())
    }

    /// Deletes what is older than the retention: stopped tasks, events, finished
    /// deployments. Runs from the reconcile loop every 10 minutes.
    pub async fn prune(&self) -> Result<Pruned, ControlError> {
        let pruned = self
            .store
            .prune(
                &stamp(self.now() - to_chrono(self.config.retention)),
                &stamp(self.now() - to_chrono(self.config.audit_retention)),
            )
            .await?;
        if pruned != Pruned::default() {
            tracing::info!(?pruned, "pruned rows past the retention");
        }
        // The changes the passes read are deleted as they go; this is the backstop for
        // those no pass deleted (passes failing for long, an older server holding the lease).
        self.store
            .forget_service_changes(i64::MAX, &stamp(self.now() - chrono::Duration::hours(1)))
            .await?;
        let buckets = self.prune_usage().await?;
        if buckets > 0 {
            tracing::info!(buckets, "pruned usage buckets past their retention");
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
        let mut backoff = self.passes.restart_backoff.lock();
        let entry = backoff.entry(id).or_insert((0, now));
        if failed > entry.0 {
            let delay = std::time::Duration::from_secs(1u64 << (failed - 1).min(16))
                .min(self.config.max_restart_delay);
            *entry = (failed, now + to_chrono(delay));
        }
        (now < entry.1).then(|| since(entry.1, now))
    }

    /// Hosts silent past the timeout become lost; their tasks stop and are replaced. For one
    /// lost timeout after this control plane started, or after it last found itself unable
    /// to work on time (the database down or stalled, a tick late), nothing is declared
    /// lost: agents could not reach a server that was down (or record a sync without its
    /// database), and get that long to sync again.
    async fn detect_lost_hosts(&self) -> Result<(), ControlError> {
        let swept = self.store.stop_tasks_on_lost_hosts().await?;
        if !swept.is_empty() {
            self.capacity_changed();
            tracing::warn!(tasks = swept.len(), "stopped tasks left on lost hosts");
            self.wake();
        }
        let timeout = self.lost_timeout();
        let started = match self.membership.fleet_clock.started() {
            Some(s) => s,
            None => {
                self.read_db_clock().await;
                let Some(s) = self.membership.fleet_clock.started() else {
                    return Ok(());
                };
                s
            }
        };
        let now = self.now();
        let outage = *self.membership.store_failed_at.lock();
        let back = outage.map_or(started, |t| t.max(started));
        if since(now, back) < timeout {
            return Ok(());
        }
        let secs = timeout.as_secs_f64();
        let cutoff = stamp(now - to_chrono(timeout));
        for id in self.store.hosts_silent_since(&cutoff).await? {
            let reason = crate::lifecycle::lost_reason(secs);
            // Marked and its tasks stopped in one transaction, and only if it is still
            // silent: a sync that arrived meanwhile wins.
            let Some(stopped) = self.store.mark_host_lost(&id, &reason, &cutoff).await? else {
                continue;
            };
            self.capacity_changed();
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

    /// Tasks holding capacity on `host`, without their allocations.
    pub(crate) async fn tasks_on(&self, host: &HostId) -> Result<Vec<Task>, ControlError> {
        Ok(self
            .store
            .list_tasks(&TaskFilter {
                host: Some(host.clone()),
                states: TaskState::HOLDING.to_vec(),
                without_allocations: true,
                ..Default::default()
            })
            .await?)
    }

    /// Marks the tasks of draining and impaired hosts for migration, a bounded share of
    /// each pool's hosts at a time. Their services then start replacements first and stop
    /// the old tasks once the replacements run (see `reconcile_service`).
    async fn migrate_off_unhealthy_hosts(&self) -> Result<(), ControlError> {
        // Every pass: the draining and impaired hosts (found by an index), and the pools'
        // sizes only when there are some.
        let hosts = self
            .store
            .hosts_in_status(&[HostStatus::Draining, HostStatus::Impaired])
            .await?;
        if hosts.is_empty() {
            return Ok(());
        }
        let sizes = self.store.hosts_per_pool().await?;
        let mut by_pool: BTreeMap<&PoolName, Vec<&HostState>> = BTreeMap::new();
        for h in &hosts {
            by_pool.entry(&h.pool).or_default().push(h);
        }
        for (pool, pool_hosts) in by_pool {
            let size = sizes.get(pool).copied().unwrap_or(pool_hosts.len());
            let limit = ((size as f64 * self.config.migration_share).floor() as usize).max(1);
            let mut moving = 0;
            let mut candidates = Vec::new();
            for h in pool_hosts {
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
                    self.store.set_task_migrating(id, true).await?;
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

    /// Brings one service toward its desired state: carries out [`plan_service`]'s plan.
    async fn reconcile_service(&self, service: &Service) -> Result<(), ControlError> {
        let name = service.name.as_str();
        let tasks = self.live_tasks(name).await?;
        // A task stopped on purpose first leaves the endpoint list for the service's
        // deregistration delay.
        let drain = (service.deregistration_delay_secs > 0).then(|| {
            stamp(
                self.now()
                    + chrono::Duration::seconds(i64::from(service.deregistration_delay_secs)),
            )
        });
        let deployments = if service.deleting {
            Vec::new()
        } else {
            self.store.list_deployments(name).await?
        };
        if !service.deleting
            && let Some(primary) = deployments
                .iter()
                .find(|d| d.status == DeploymentStatus::Primary)
        {
            // Old tasks still run (a rollout or a rollback under way).
            let rolling_out = deployments.iter().any(|d| {
                d.id != primary.id
                    && d.status != DeploymentStatus::Completed
                    && d.running + d.pending > 0
            });
            let steady = !rolling_out
                && self
                    .passes
                    .service_state
                    .lock()
                    .get(name)
                    .is_some_and(|s| s.steady);
            let age = self.age_of(&primary.created_at).unwrap_or(i64::MAX);
            if let Some(why) = self
                .watch_alarms(service, &tasks, primary.id, steady, age)
                .await?
            {
                let previous = deployments.iter().find(|d| {
                    d.id != primary.id
                        && d.status != DeploymentStatus::RolledBack
                        && d.task_definition != primary.task_definition
                });
                match previous {
                    Some(prev) => {
                        let id = self
                            .store
                            .start_deployment(name, &prev.task_definition, true)
                            .await?;
                        self.forget_alarms(name);
                        self.event(
                            Some(name),
                            None,
                            &format!(
                                "deployment {} rolled back: {why}: {} → {} (deployment {id})",
                                primary.id, primary.task_definition, prev.task_definition
                            ),
                        )
                        .await;
                        self.wake();
                        return Ok(());
                    }
                    None => {
                        self.event(
                            Some(name),
                            None,
                            &format!(
                                "deployment {}: {why}; there is no earlier revision to roll back to",
                                primary.id
                            ),
                        )
                        .await;
                    }
                }
            }
            self.autoscale(service, &tasks, rolling_out).await?;
        }
        let actions = match plan_service(
            service,
            &tasks,
            &deployments,
            self.config.failure_threshold,
        ) {
            ServicePlan::Delete { stop, gone } => {
                for id in &stop {
                    self.store
                        .request_task_stop(id, DELETED, drain.as_deref(), false)
                        .await?;
                }
                if gone {
                    self.store.delete_service(name).await?;
                    self.passes.service_state.lock().remove(name);
                    self.event(Some(name), None, &format!("service {name} deleted"))
                        .await;
                } else if !stop.is_empty() {
                    self.wake();
                }
                return Ok(());
            }
            ServicePlan::NoPrimary => {
                tracing::warn!(service = name, "service has no primary deployment");
                return Ok(());
            }
            ServicePlan::RollBack {
                from,
                failing,
                failed,
                to,
            } => {
                let id = self.store.start_deployment(name, &to, true).await?;
                self.event(
                    Some(name),
                    None,
                    &format!(
                        "deployment {from} rolled back after {failed} failed tasks: {failing} → {to} (deployment {id})"
                    ),
                )
                .await;
                self.wake();
                return Ok(());
            }
            ServicePlan::Converge(actions) => actions,
        };
        let primary = deployments
            .iter()
            .find(|d| d.id == actions.primary)
            .expect("the plan's primary is one of them");
        for (id, reason) in &actions.stop {
            self.store
                .request_task_stop(id, reason, drain.as_deref(), actions.failures.contains(id))
                .await?;
            if *reason == UNHEALTHY {
                self.event(Some(name), None, &format!("task {id} stopped: {UNHEALTHY}"))
                    .await;
            }
        }
        // With a revision to roll back to, the circuit breaker answers failures; without
        // one, restarts slow down.
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
            if self.service_state_changed(name, |s| s.backoff = Some(primary.failed_tasks)) {
                self.event(Some(name), None, &message).await;
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
        if !actions.stop.is_empty() || actions.start > 0 {
            self.wake();
        }
        for &id in &actions.completed {
            self.store
                .set_deployment_status(id, DeploymentStatus::Completed)
                .await?;
            if let Some(d) = deployments.iter().find(|d| d.id == id) {
                self.event(
                    Some(name),
                    None,
                    &format!("deployment {id} ({}) drained", d.task_definition),
                )
                .await;
            }
        }
        let desired = service.desired_count;
        // Progress of a rollout, when the new revision's running count changes.
        if let Some((running, old_left)) = actions.progress
            && self.service_state_changed(name, |s| s.progress = Some((primary.id, running)))
        {
            self.event(
                Some(name),
                None,
                &format!(
                    "deployment {} in progress: {running} of {desired} task(s) of {} running, {old_left} old task(s) left",
                    primary.id, primary.task_definition
                ),
            )
            .await;
        }
        if self.service_state_changed(name, |s| s.steady = actions.steady) && actions.steady {
            self.event(
                Some(name),
                None,
                &format!(
                    "service {name} has reached a steady state: {desired} task(s) of {} running",
                    primary.task_definition
                ),
            )
            .await;
        }
        Ok(())
    }
}
