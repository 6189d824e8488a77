//! The pass's host lifecycle: hosts silent past the timeout declared lost (their tasks
//! stopped), and the tasks of draining and impaired hosts marked for migration.

use crate::clock::{since, stamp, to_chrono};
use crate::deployments::Deployments;
use crate::error::ControlError;
use crate::store::{HostState, TaskFilter};
use std::collections::BTreeMap;
use tessera_model::notify::NoticeKind;
use tessera_model::service::{Task, TaskState};
use tessera_model::{HostId, HostStatus, PoolName};

impl Deployments {
    /// Hosts silent past the timeout become lost; their tasks stop and are replaced. For one
    /// lost timeout after this control plane started, or after it last found itself unable
    /// to work on time (the database down or stalled, a tick late), nothing is declared
    /// lost: agents could not reach a server that was down (or record a sync without its
    /// database), and get that long to sync again.
    pub(super) async fn detect_lost_hosts(&self) -> Result<(), ControlError> {
        let swept = self.store.stop_tasks_on_lost_hosts().await?;
        if !swept.is_empty() {
            self.scheduler.capacity_changed();
            tracing::warn!(tasks = swept.len(), "stopped tasks left on lost hosts");
            self.core.wake();
        }
        let timeout = self.core.lost_timeout();
        let started = match self.core.membership().fleet_clock().started() {
            Some(s) => s,
            None => {
                self.core.read_db_clock().await;
                let Some(s) = self.core.membership().fleet_clock().started() else {
                    return Ok(());
                };
                s
            }
        };
        let now = self.core.now();
        let outage = self.core.membership().fell_behind_at();
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
            self.scheduler.capacity_changed();
            self.core
                .notify(
                    NoticeKind::HostLost,
                    (None, Some(&id), None),
                    &format!(
                        "host {id} lost ({reason}); {} task(s) stopped and replaced elsewhere",
                        stopped.len()
                    ),
                )
                .await;
            self.core.wake();
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
    pub(super) async fn migrate_off_unhealthy_hosts(&self) -> Result<(), ControlError> {
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
            let limit =
                ((size as f64 * self.core.config().migration_share).floor() as usize).max(1);
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
                self.core
                    .event(
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
}
