//! Consolidation in pools with a capacity provider, without an operator: the hosts a plan
//! (goal: hosts) could free are watched pass after pass, and those freeable for the
//! provider's scale-in cooldown have their tasks moved off by a plan that moves only their
//! tasks (start before stop, alarms respected, as every plan), so that the provider scales
//! them in. Nothing is planned while tasks wait in the pool, while another plan of the pool
//! is planned or executing, or below `min_hosts`; only hosts the provider made are freed.

use super::plan_body;
use crate::deployments::Deployments;
use crate::error::ControlError;
use std::collections::{BTreeMap, BTreeSet};
use tessera_model::consolidation::PlanStatus;
use tessera_model::provider::MachineState;
use tessera_model::time::Timestamp;
use tessera_model::{HostId, HostStatus, PoolInfo, PoolName};
use tessera_placement::consolidate::Goal;

/// How often a pool's freeable hosts are looked for (a plan is computed each time).
const LOOK_EVERY_SECS: u64 = 15;

/// What the passes remember of a pool's freeable hosts.
#[derive(Debug, Default)]
pub(crate) struct Freeable {
    /// When they were last looked for.
    looked: Option<Timestamp>,
    /// Each freeable host, with since when it has been.
    since: BTreeMap<HostId, Timestamp>,
}

fn secs(earlier: Timestamp, later: Timestamp) -> u64 {
    u64::try_from(later.millis_since(earlier) / 1000).unwrap_or(0)
}

impl Deployments {
    /// One look at every pool with a capacity provider (from the reconcile pass, before
    /// the providers' own pass).
    pub(crate) async fn consolidate_for_providers(&self) -> Result<(), ControlError> {
        let pools: Vec<PoolInfo> = self
            .store
            .list_pools()
            .await?
            .into_iter()
            .filter(|p| p.provider.is_some())
            .collect();
        let now = Timestamp::from_utc(self.core.now());
        // Each pool is looked at every LOOK_EVERY_SECS, so a pass in between reads nothing.
        let due: Vec<PoolInfo> = {
            let freeable = self.passes.freeable.lock();
            pools
                .into_iter()
                .filter(|p| {
                    freeable
                        .get(&p.name)
                        .and_then(|f| f.looked)
                        .is_none_or(|t| secs(t, now) >= LOOK_EVERY_SECS)
                })
                .collect()
        };
        if due.is_empty() {
            return Ok(());
        }
        let busy: BTreeSet<String> = self
            .store
            .list_plans(20)
            .await?
            .into_iter()
            .filter(|p| {
                p.status == PlanStatus::Planned.as_str()
                    || p.status == PlanStatus::Executing.as_str()
            })
            .map(|p| p.pool)
            .collect();
        let waiting: BTreeSet<PoolName> = self
            .store
            .list_pending()
            .await?
            .into_iter()
            .map(|t| t.pool)
            .collect();
        for pool in due {
            if busy.contains(pool.name.as_str()) || waiting.contains(&pool.name) {
                // Not freeable while its tasks wait or a plan runs: start counting again.
                let mut freeable = self.passes.freeable.lock();
                let f = freeable.entry(pool.name.clone()).or_default();
                f.looked = Some(now);
                f.since.clear();
                continue;
            }
            if let Err(e) = self.consolidate_pool(&pool, now).await {
                tracing::warn!(pool = %pool.name, error = %e, "consolidation for the provider failed");
            }
        }
        Ok(())
    }

    /// Looks for `pool`'s freeable hosts and moves the tasks
    /// off those freeable for the scale-in cooldown.
    async fn consolidate_pool(&self, pool: &PoolInfo, now: Timestamp) -> Result<(), ControlError> {
        let provider = pool.provider.as_ref().expect("filtered");
        // Only the provider's hosts go, and never below min_hosts.
        let made: BTreeSet<HostId> = self
            .providers
            .machines(Some(&pool.name), false)
            .await?
            .into_iter()
            .filter(|m| m.state == MachineState::Active)
            .filter_map(|m| m.host_id)
            .collect();
        let hosts = self.store.list_hosts().await?;
        let live = hosts
            .iter()
            .filter(|h| h.pool == pool.name && h.status != HostStatus::Lost)
            .count() as u32;
        let room = live.saturating_sub(provider.min_hosts) as usize;
        let found = self
            .build_plan(&pool.name, Goal::Hosts, "hosts", None)
            .await?;
        let due: Vec<HostId> = {
            let mut freeable = self.passes.freeable.lock();
            let f = freeable.entry(pool.name.clone()).or_default();
            f.looked = Some(now);
            let mut since: BTreeMap<HostId, Timestamp> = found
                .frees_hosts
                .iter()
                .filter_map(|h| HostId::new(h).ok())
                .filter(|h| made.contains(h))
                .map(|h| {
                    let t = f.since.get(&h).copied().unwrap_or(now);
                    (h, t)
                })
                .collect();
            std::mem::swap(&mut f.since, &mut since);
            let mut due: Vec<(&HostId, &Timestamp)> = f
                .since
                .iter()
                .filter(|(_, t)| secs(**t, now) >= u64::from(provider.scale_in_cooldown_secs))
                .collect();
            due.sort_by_key(|(h, t)| (**t, (*h).clone()));
            due.into_iter().take(room).map(|(h, _)| h.clone()).collect()
        };
        if due.is_empty() {
            return Ok(());
        }
        self.empty_unneeded(pool, due, now).await
    }

    /// Moves the tasks off `due` (freeable for the scale-in cooldown) by a plan of their
    /// tasks only, carried out at once; the provider is told they were not needed.
    async fn empty_unneeded(
        &self,
        pool: &PoolInfo,
        due: Vec<HostId>,
        now: Timestamp,
    ) -> Result<(), ControlError> {
        let only: BTreeSet<HostId> = due.iter().cloned().collect();
        let mut plan = self
            .build_plan(&pool.name, Goal::Hosts, "hosts", Some(&only))
            .await?;
        let freed: Vec<HostId> = plan
            .frees_hosts
            .iter()
            .filter_map(|h| HostId::new(h).ok())
            .filter(|h| only.contains(h))
            .collect();
        if freed.is_empty() || plan.moves.is_empty() {
            return Ok(());
        }
        let since = {
            let freeable = self.passes.freeable.lock();
            freeable
                .get(&pool.name)
                .and_then(|f| freed.iter().filter_map(|h| f.since.get(h)).min().copied())
                .unwrap_or(now)
        };
        plan.status = PlanStatus::Executing;
        self.store.save_plan(&plan_body(&plan)?).await?;
        self.providers.emptying_unneeded(&pool.name, &freed, since);
        self.passes.freeable.lock().remove(&pool.name);
        let names: Vec<String> = freed.iter().map(ToString::to_string).collect();
        self.core
            .event(
                None,
                None,
                &format!(
                    "pool {}: consolidation plan {} moves {} task(s), start before stop, off host(s) {} (not needed for {} s, the scale-in cooldown), for the {} provider to scale in",
                    pool.name,
                    plan.id,
                    plan.moves.len(),
                    names.join(", "),
                    secs(since, now),
                    pool.provider.as_ref().map_or("", |p| p.kind.as_str()),
                ),
            )
            .await;
        self.core.wake();
        Ok(())
    }
}
