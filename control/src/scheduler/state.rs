//! The scheduler's state: each pool's engine kept from one pass to the next, what makes
//! them stale, and the specs of task definition revisions.

use crate::cache::Cache;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tessera_model::PoolInfo;
use tessera_model::PoolName;
use tessera_model::service::TaskDefRef;
use tessera_model::taskdef::TaskDefinitionSpec;
use tessera_placement::{Engine, Placement};

/// Bounds of the caches: pools' engines and revisions' specs. Past them the oldest entries
/// are built or read again.
const MAX_POOLS_CACHED: usize = 1024;
const MAX_SPECS_CACHED: usize = 4096;

/// The scheduler's memory.
pub(crate) struct Scheduling {
    /// The last bucket (unix seconds) projects' use was sampled in.
    pub(super) last_project_sample: parking_lot::Mutex<Option<i64>>,
    /// Per pool, the scheduler's engine, kept in step with its own commits from one pass
    /// to the next while nothing else changes capacity.
    pub(super) engines: Cache<PoolName, CachedEngine>,
    /// Bumped by every change of capacity the scheduler did not make itself (a task gone,
    /// a host's status or GPUs, a pool's limits): a cached engine older than it is rebuilt.
    capacity_epoch: AtomicU64,
    /// How many times the scheduler built an engine from the store (for tests and logs).
    engine_builds: AtomicU64,
    /// Specs of task definition revisions, which never change once registered: every sync
    /// and scheduling pass needs them.
    pub(super) specs: Cache<TaskDefRef, Arc<TaskDefinitionSpec>>,
    /// Room a preemption plan claimed for a waiting task, by task id: the scheduler places
    /// it there first once its victims have let go (`crate::preemption`).
    pub(super) claims: parking_lot::Mutex<HashMap<String, Placement>>,
}

impl Default for Scheduling {
    fn default() -> Self {
        Scheduling {
            engines: Cache::new(MAX_POOLS_CACHED),
            capacity_epoch: AtomicU64::new(0),
            engine_builds: AtomicU64::new(0),
            specs: Cache::new(MAX_SPECS_CACHED),
            claims: Default::default(),
            last_project_sample: Default::default(),
        }
    }
}

impl Scheduling {
    /// The capacity epoch now: an engine built before it changed is stale.
    pub(super) fn epoch(&self) -> u64 {
        self.capacity_epoch.load(Ordering::SeqCst)
    }

    /// Capacity changed outside the scheduler: every cached engine is stale.
    pub(super) fn capacity_changed(&self) {
        self.capacity_epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// An engine was built from the store.
    pub(super) fn built(&self) {
        self.engine_builds.fetch_add(1, Ordering::SeqCst);
    }

    /// How many engines were built from the store.
    #[cfg(test)]
    pub(super) fn builds(&self) -> u64 {
        self.engine_builds.load(Ordering::SeqCst)
    }
}

/// A pool's engine with what live tasks hold already assigned.
pub(crate) struct PoolEngine {
    pub(crate) engine: Engine,
    pub(crate) pool: PoolInfo,
    /// The revisions its workload profile was built from.
    pub(crate) profiled: HashSet<TaskDefRef>,
}

/// A pool's engine kept from one scheduling pass to the next: it already holds every
/// placement the scheduler committed since it was built. A pass takes it out of the cache
/// and puts it back only after all its placements were committed, so a pass that fails
/// midway or whose commit was refused in part (the engine's picture drifted from the store;
/// the commit's re-check caught it) leaves nothing behind. It is also rebuilt when capacity
/// changed elsewhere (`Scheduler::capacity_changed`, after `epoch`) and when a revision its
/// profile does not know is pending.
pub(crate) struct CachedEngine {
    pub(crate) built: PoolEngine,
    pub(crate) epoch: u64,
}
