//! The reconcile pass: host lifecycle (lost hosts, moving tasks off draining and impaired
//! hosts), services (desired counts, rolling deployments, the circuit breaker, deletion),
//! then scheduling of whatever is pending.
//!
//! - `hosts`: lost hosts, and moving tasks off draining and impaired hosts.
//! - `service`: one service brought toward its desired state.

mod hosts;
mod service;

use crate::clock::{since, stamp, to_chrono};
use crate::deployments::Deployments;
use crate::error::ControlError;
use crate::store::Pruned;
use std::collections::{BTreeSet, HashSet};
use tessera_model::service::Service;

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

impl Deployments {
    /// One pass over everything. Serialised: concurrent callers wait for each other.
    pub async fn reconcile_once(&self) -> Result<(), ControlError> {
        let _pass = self.passes.pass.lock().await;
        let mut phases = Phases::default();
        self.agents.flush_heartbeats().await?;
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
                    self.service_states
                        .changed(&service.name, |s| s.failure = None);
                }
                Err(e) => {
                    let message = format!("reconciling service {} failed: {e}", service.name);
                    tracing::error!(service = %service.name, error = %e, "reconciling a service failed");
                    if self
                        .service_states
                        .changed(&service.name, |s| s.failure = Some(message.clone()))
                    {
                        self.core.event(Some(&service.name), None, &message).await;
                    }
                }
            }
            self.note_reconciled(&service);
        }
        phases.done("services");
        self.forget_changes_read().await?;
        self.advance_consolidation().await?;
        phases.done("consolidation");
        self.scheduler.schedule().await?;
        phases.done("scheduling");
        // What still waits, and hosts left empty, are the capacity providers' to act on;
        // hosts not needed are emptied for them first.
        self.consolidate_for_providers().await?;
        self.providers.pass().await?;
        phases.done("providers");
        self.scheduler.sample_project_use().await?;
        let due = {
            let mut last = self.passes.last_prune.lock();
            let now = self.core.now();
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
        let recent = stamp(self.core.now() - to_chrono(LATE_COMMITS));
        let (full, seen, every_pass) = {
            let m = self.passes.memory.lock();
            (
                m.full_due(self.core.config().full_pass_every),
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
                .service_states
                .is(&service.name, |s| s.steady && s.failure.is_none());
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
        let recent = stamp(self.core.now() - to_chrono(LATE_COMMITS));
        self.store.forget_service_changes(upto, &recent).await?;
        Ok(())
    }

    /// Deletes what is older than the retention: stopped tasks, events, finished
    /// deployments. Runs from the reconcile loop every 10 minutes.
    pub async fn prune(&self) -> Result<Pruned, ControlError> {
        let pruned = self
            .store
            .prune(
                &stamp(self.core.now() - to_chrono(self.core.config().retention)),
                &stamp(self.core.now() - to_chrono(self.core.config().audit_retention)),
            )
            .await?;
        if pruned != Pruned::default() {
            tracing::info!(?pruned, "pruned rows past the retention");
        }
        // The changes the passes read are deleted as they go; this is the backstop for
        // those no pass deleted (passes failing for long, an older server holding the lease).
        self.store
            .forget_service_changes(
                i64::MAX,
                &stamp(self.core.now() - chrono::Duration::hours(1)),
            )
            .await?;
        self.store
            .prune_project_usage(self.core.unix_now() - crate::projects::HISTORY_KEPT_SECS)
            .await?;
        let buckets = self.agents.prune_usage().await?;
        if buckets > 0 {
            tracing::info!(buckets, "pruned usage buckets past their retention");
        }
        Ok(pruned)
    }
}
