//! Projects' limits as the scheduler holds them: what each project uses of a pool now and
//! over the fair-share window, what a pool offers, and the samples fair share is read from.

use super::Scheduler;
use crate::error::ControlError;
use crate::projects::shares::{
    FAIR_SHARE_WINDOW_SECS, SAMPLE_SECS, pool_capacity, project_of, task_usage, usage_by_project,
    use_over_time,
};
use std::collections::{BTreeMap, HashMap};
use tessera_model::PoolName;
use tessera_model::project::{DEFAULT_PROJECT, Usage};
use tessera_model::service::{Service, TaskState};

impl Scheduler {
    /// Records what each project holds in each pool, once per [`SAMPLE_SECS`] bucket
    /// (the reconcile loop calls it every pass; the first pass past the bucket's middle
    /// that finds anything to record does): every project with a quota or tasks in a pool
    /// gets a row, so a project that let go shows zero.
    pub(crate) async fn sample_project_use(&self) -> Result<(), ControlError> {
        let now = self.core.unix_now();
        let bucket = now.div_euclid(SAMPLE_SECS) * SAMPLE_SECS;
        // Halfway through the bucket, so that a server just started has placed its tasks.
        if now - bucket < SAMPLE_SECS / 2 || *self.state.last_project_sample.lock() == Some(bucket)
        {
            return Ok(());
        }
        let services = self.store.list_services().await?;
        let project_of = project_of(&services);
        let holding = self
            .store
            .list_tasks(&crate::store::TaskFilter {
                states: TaskState::HOLDING.to_vec(),
                without_allocations: false,
                ..Default::default()
            })
            .await?;
        let mut rows: BTreeMap<(String, String), Usage> = BTreeMap::new();
        for p in self.store.list_projects().await? {
            for q in &p.quotas {
                rows.entry((p.name.clone(), q.pool.clone())).or_default();
            }
        }
        for t in &holding {
            let project = project_of
                .get(&t.service)
                .cloned()
                .unwrap_or_else(|| DEFAULT_PROJECT.to_owned());
            let u = rows.entry((project, t.pool.to_string())).or_default();
            *u = u.plus(&task_usage(t));
        }
        // A fleet that holds nothing is sampled on a later pass, once something is held.
        if rows.is_empty() {
            return Ok(());
        }
        let rows: Vec<(String, String, Usage)> = rows
            .into_iter()
            .map(|((p, pool), u)| (p, pool, u))
            .collect();
        self.store.record_project_usage(bucket, &rows).await?;
        *self.state.last_project_sample.lock() = Some(bucket);
        Ok(())
    }
    /// Each project's use of `pool` over the fair-share window ([`use_over_time`]), from
    /// its samples and `now`.
    pub(crate) async fn project_use_over_time(
        &self,
        pool: &PoolName,
        now: &HashMap<String, Usage>,
    ) -> Result<HashMap<String, Usage>, ControlError> {
        let since = self.core.unix_now() - FAIR_SHARE_WINDOW_SECS;
        let samples = self.store.project_usage(since, Some(pool.as_str())).await?;
        Ok(use_over_time(&samples, now))
    }
    /// Each project's use of `pool` now, from the tasks holding capacity there.
    pub(crate) async fn project_use_in(
        &self,
        pool: &PoolName,
        services: &HashMap<String, Service>,
    ) -> Result<HashMap<String, Usage>, ControlError> {
        let project_of = project_of(services.values());
        let holding = self
            .store
            .list_tasks(&crate::store::TaskFilter {
                pool: Some(pool.clone()),
                states: TaskState::HOLDING.to_vec(),
                ..Default::default()
            })
            .await?;
        Ok(usage_by_project(&holding, &project_of))
    }
    /// What `pool`'s hosts offer (see [`pool_capacity`]).
    pub(crate) async fn pool_capacity_of(&self, pool: &PoolName) -> Result<Usage, ControlError> {
        let hosts = self.store.list_hosts().await?;
        Ok(pool_capacity(hosts.iter().filter(|h| &h.pool == pool)))
    }
}
