//! Placement previews ("what would placing N tasks do now?", nothing committed) and
//! packing density.

use super::PoolEngine;
use super::Scheduler;
use crate::error::ControlError;
use crate::inputs::{Density, PreviewInput, PreviewResult, PreviewTask};
use crate::scheduler::request_for;
use std::collections::{BTreeMap, BTreeSet};
use tessera_model::SharingMode;
use tessera_placement::{GpuUsage, Snapshot};

impl Scheduler {
    /// What placing `input.count` tasks now would do, without committing anything.
    pub async fn preview(&self, input: &PreviewInput) -> Result<PreviewResult, ControlError> {
        let mut e = crate::inputs::Errors::default();
        let r = e.task_definition(&input.task_definition);
        let pool = e.pool(&input.pool);
        let strategy = e.strategy(input.strategy.as_ref()).flatten();
        if !(1..=1000).contains(&input.count) {
            e.add(
                "count",
                format!("must be between 1 and 1000, got {}", input.count),
            );
        }
        e.constraints(&input.constraints);
        e.finish()?;
        let (r, pool) = (r.expect("validated"), pool.expect("validated"));
        let def = self.usable_definition(&r).await?;
        self.existing_pool(&pool).await?;
        let mut req = request_for(&def.spec, &input.constraints, BTreeSet::new());
        if def.spec.ports().next().is_some() {
            (req.constraints.ports_in_use, req.constraints.dynamic_free) =
                self.ports_in_use(&pool).await?;
        }
        let batch = vec![req; input.count as usize];
        let PoolEngine {
            mut engine,
            pool: info,
            ..
        } = self.pool_engine(&pool, strategy, &batch).await?;
        let density_before = density(engine.snapshot());
        let outcome = engine.place_batch(&batch);
        let density_after = density(engine.snapshot());
        let tasks: Vec<PreviewTask> = outcome
            .results
            .iter()
            .enumerate()
            .map(|(i, r)| match r {
                Ok(p) => PreviewTask {
                    index: i as u32,
                    host: Some(p.host_id.clone()),
                    gpus: p.gpus.iter().map(|s| s.index).collect(),
                    message: None,
                },
                Err(rej) => PreviewTask {
                    index: i as u32,
                    host: None,
                    gpus: vec![],
                    message: Some(rej.to_string()),
                },
            })
            .collect();
        let placed = outcome.placed() as u32;
        Ok(PreviewResult {
            task_definition: r,
            pool,
            policy: strategy.unwrap_or(info.policy),
            placed,
            unplaced: input.count - placed,
            tasks,
            density_before,
            density_after,
        })
    }
}

/// Packing density of a snapshot.
pub fn density(snap: &Snapshot) -> Density {
    density_of(
        (0..snap.host_count() as u32).flat_map(|h| snap.gpus_of(h).map(move |g| snap.gpu_usage(g))),
    )
}

/// Packing density of a set of GPUs, from each one's usage.
pub fn density_of(gpus: impl IntoIterator<Item = GpuUsage>) -> Density {
    let mut d = Density::default();
    let (mut mem_total, mut mem_used) = (0u64, 0u64);
    // Shared memory in use per GPU size, for the lower bound on GPUs needed.
    let mut shared_by_size: BTreeMap<u64, u64> = BTreeMap::new();
    for u in gpus {
        d.gpus += 1;
        mem_total += u.memory_capacity.0;
        let used = u.memory_capacity.0 - u.memory_free.0;
        mem_used += used;
        match u.mode {
            SharingMode::Idle => {}
            SharingMode::Dedicated => {
                d.gpus_in_use += 1;
                d.gpus_needed_at_least += 1;
                d.tasks_on_gpus += 1;
            }
            SharingMode::Mps => {
                d.gpus_in_use += 1;
                d.tasks_on_gpus += u.clients;
                *shared_by_size.entry(u.memory_capacity.0).or_default() += used;
            }
        }
    }
    d.gpus_needed_at_least += shared_by_size
        .iter()
        .map(|(size, used)| used.div_ceil(*size.max(&1)) as u32)
        .sum::<u32>();
    d.tasks_per_gpu_in_use = if d.gpus_in_use > 0 {
        f64::from(d.tasks_on_gpus) / f64::from(d.gpus_in_use)
    } else {
        0.0
    };
    d.memory_allocated_pct = if mem_total > 0 {
        100.0 * mem_used as f64 / mem_total as f64
    } else {
        0.0
    };
    d
}
