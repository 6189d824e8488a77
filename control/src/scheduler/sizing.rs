//! What-if sizing for capacity providers: how many more hosts of a provider's shape would
//! place a pool's waiting tasks, through the placement engine's one fit rule
//! (`tessera_placement::sizing`).

use super::{Scheduler, request_for};
use crate::error::ControlError;
use std::collections::{BTreeMap, BTreeSet};
use tessera_model::provider::HostShape;
use tessera_model::service::ServiceConstraints;
use tessera_model::taskdef::TaskGpu;
use tessera_model::{GpuUuid, HostId, PoolName};
use tessera_placement::sizing::{Sizing, hosts_needed};
use tessera_placement::{GpuSpec, HostSpec, Policy, PoolLimits};

/// A pool's waiting tasks as sizing saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// How many tasks wait for room.
    pub tasks: usize,
    /// By service: how many wait, and the GPU memory they ask for in all (MiB).
    pub by_service: BTreeMap<String, (usize, u64)>,
    /// How many more hosts of the shape place them.
    pub sizing: Sizing,
}

impl Waiting {
    /// "3 tasks of `chat` wait for 24 GiB of GPU memory".
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .by_service
            .iter()
            .map(|(s, (n, mib))| {
                if *mib > 0 {
                    format!(
                        "{n} task(s) of `{s}` wait for {} GiB of GPU memory",
                        mib.div_ceil(1024)
                    )
                } else {
                    format!("{n} task(s) of `{s}` wait for room")
                }
            })
            .collect();
        parts.join("; ")
    }
}

/// The engine's picture of a host of `shape` (GPUs healthy, MPS's usual client limit).
pub(crate) fn shape_spec(shape: &HostShape) -> HostSpec {
    HostSpec {
        id: HostId::new("shape").expect("a valid host id"),
        cpu: shape.cpu(),
        memory: shape.memory(),
        labels: Default::default(),
        active: true,
        gpus: (0..shape.gpus)
            .map(|i| GpuSpec {
                uuid: GpuUuid::new(format!("GPU-shape-{i}")).expect("a valid GPU UUID"),
                model: shape.gpu_model.clone(),
                memory: shape.gpu_memory(),
                mps_client_limit: tessera_model::limits::MPS_CLIENT_LIMIT_MAX,
                healthy: true,
            })
            .collect(),
    }
}

impl Scheduler {
    /// How many more hosts of `shape` would place `pool`'s waiting tasks (each with its
    /// service's constraints), trying at most `max_new`. `None` when nothing waits.
    pub(crate) async fn size_waiting(
        &self,
        pool: &PoolName,
        shape: &HostShape,
        max_new: u32,
    ) -> Result<Option<Waiting>, ControlError> {
        let pending: Vec<_> = self
            .store
            .list_pending()
            .await?
            .into_iter()
            .filter(|t| &t.pool == pool)
            .collect();
        if pending.is_empty() {
            return Ok(None);
        }
        let specs = self
            .task_definition_specs(pending.iter().map(|t| t.task_definition.clone()).collect())
            .await?;
        let services: BTreeMap<String, tessera_model::service::Service> = self
            .store
            .list_services()
            .await?
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        let mut by_service: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        let requests: Vec<_> = pending
            .iter()
            .map(|t| {
                let spec = &specs[&t.task_definition];
                let constraints = services
                    .get(&t.service)
                    .map_or_else(ServiceConstraints::default, |s| s.constraints.clone());
                let entry = by_service.entry(t.service.clone()).or_default();
                entry.0 += 1;
                entry.1 += match spec.gpu() {
                    TaskGpu::Shared { memory, .. } => memory.0,
                    TaskGpu::Whole { count } => u64::from(count) * shape.gpu_memory_mib,
                    TaskGpu::None => 0,
                };
                request_for(spec, &constraints, BTreeSet::new())
            })
            .collect();
        let built = self.pool_engine(pool, None, &requests).await?;
        let limits = PoolLimits {
            compute_overcommit: built.pool.compute_overcommit,
            mps_client_limit: built.pool.mps_client_limit,
        };
        let sizing = hosts_needed(
            built.engine.snapshot(),
            limits,
            &shape_spec(shape),
            &requests,
            max_new,
            Policy::from(built.pool.policy),
        );
        Ok(Some(Waiting {
            tasks: pending.len(),
            by_service,
            sizing,
        }))
    }
}
