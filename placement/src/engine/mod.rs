//! Filter, score, choose: the decision for one task, and for a batch.
//!
//! Fragmentation-aware and spread policies score host *states* (see the `classes` module) and
//! cache each score per task shape, so a decision costs one pass over the distinct states
//! plus the few states that changed since that shape was last placed. Binpack uses ordered
//! indexes and costs O(log n). Whatever the policy, the final host and GPU pass the exact
//! capacity checks of [`Snapshot`], and a task that fits nowhere gets a [`Rejection`].

mod explain;
mod index;
mod policy;
mod scoring;
#[cfg(test)]
mod tests;

pub use explain::describe_request;
use index::BestFitIndex;
pub use policy::{BatchOutcome, Policy};
use scoring::*;

use crate::classes::{ClassKey, Classes};
use crate::profile::{DemandProfile, FragTables, PoolShape, share_needed};
use crate::reject::{FilterReason, LargestFree, Rejection};
use crate::request::{GpuDemand, TaskRequest};
use crate::rng::Rng;
use crate::snapshot::{CapacityError, HostIdx, Placement, Snapshot};
use std::collections::{BTreeSet, HashMap};
use tessera_model::{ComputeMilli, MiB, MilliCpu, PlacementPolicy};

/// A host's entries in the idle and CPU indexes.
type HostEntry = ((u16, u32, u32), (MilliCpu, u32));

/// The placement engine for one pool: a snapshot plus what makes decisions fast.
#[derive(Debug, Clone)]
pub struct Engine {
    snap: Snapshot,
    policy: Policy,
    rng: Rng,
    /// Fragmentation tables for the policy in use: against the demand each GPU kind
    /// receives for the default policy, against the whole workload's for `fgd-sim` (as
    /// published).
    frag: Option<FragTables>,
    /// What the tables are built from, to rebuild them when the policy changes.
    profile: DemandProfile,
    pool: PoolShape,
    classes: Classes,
    index: BestFitIndex,
    /// The policy in use keeps only the structure it reads in step with the snapshot; the
    /// other is rebuilt when a policy that reads it is next used.
    classes_stale: bool,
    index_stale: bool,
    shapes: HashMap<ShapeKey, u32>,
    /// `scores[shape][class slot]`.
    scores: Vec<Vec<Cached>>,
}

/// Counts a task of the same batch placed at `p` against `req`: its caps and ports, and,
/// with distinct hosts, `p`'s host is avoided.
fn count_in_batch(req: &mut TaskRequest, p: &Placement) {
    let c = &mut req.constraints;
    if c.distinct_hosts {
        c.avoid_hosts.insert(p.host_id.clone());
    }
    c.count(&p.host_id, p.gpus.iter().map(|s| &s.uuid), 1);
}

/// Fragmentation tables for `policy`, when there is a profile to measure against.
fn tables_for(
    policy: Policy,
    profile: &DemandProfile,
    snap: &Snapshot,
    pool: &PoolShape,
) -> Option<FragTables> {
    (!profile.is_empty())
        .then(|| FragTables::new(profile, &snap.models, pool, policy != Policy::FgdSim))
}

impl Engine {
    /// An engine over `snapshot`. `profile` is the workload the pool expects (what
    /// fragmentation is measured against); without one the fragmentation policies fall back
    /// to best fit. `seed` drives every random tie-break.
    pub fn new(snapshot: Snapshot, policy: Policy, profile: &DemandProfile, seed: u64) -> Engine {
        let pool = PoolShape::of(&snapshot);
        let frag = tables_for(policy, profile, &snapshot, &pool);
        let classes = Classes::build(&snapshot);
        let index = BestFitIndex::build(&snapshot);
        Engine {
            snap: snapshot,
            policy,
            rng: Rng::new(seed),
            frag,
            profile: profile.clone(),
            pool,
            classes,
            index,
            classes_stale: false,
            index_stale: false,
            shapes: HashMap::new(),
            scores: Vec::new(),
        }
    }

    pub fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Switches the ranking policy (e.g. for a service that overrides its pool's); cached
    /// scores of the old policy are dropped.
    pub fn set_policy(&mut self, policy: Policy) {
        if policy != self.policy {
            if (policy == Policy::FgdSim) != (self.policy == Policy::FgdSim) {
                self.frag = tables_for(policy, &self.profile, &self.snap, &self.pool);
            }
            self.policy = policy;
            self.scores.clear();
            self.shapes.clear();
        }
    }

    /// Where `req` would go now. Changes nothing but the engine's caches and random state;
    /// call [`Engine::assign`] to take the capacity.
    pub fn place(&mut self, req: &TaskRequest) -> Result<Placement, Box<Rejection>> {
        self.try_place(req)
            .ok_or_else(|| Box::new(self.explain(req)))
    }

    /// Like [`Engine::place`], without building a rejection report when nothing fits
    /// (which costs a pass over every GPU). Use [`Engine::explain`] for the report.
    pub fn try_place(&mut self, req: &TaskRequest) -> Option<Placement> {
        self.catch_up();
        let found = match self.policy {
            Policy::BestFitSim => self.place_bestfit_sim(req),
            Policy::Binpack => self.place_binpack(req),
            Policy::Fragmentation | Policy::FgdSim if self.frag.is_none() => {
                self.place_binpack(req)
            }
            _ => self.place_by_class(req),
        };
        // Host states carry a GPU's free share as the smaller of memory and reserved
        // compute; a slot without a compute cap may still fit where compute is all
        // reserved, which only the exact scan sees.
        let uncapped_slot = matches!(req.gpu, GpuDemand::Shared { compute: None, .. });
        if found.is_none() && uncapped_slot {
            return self.place_exact_scan(req);
        }
        found
    }

    /// Takes the capacity of `p` (from [`Engine::place`] or a stored allocation).
    pub fn assign(&mut self, p: &Placement) -> Result<(), CapacityError> {
        self.snap.assign(p)?;
        self.refresh(p.host);
        Ok(())
    }

    /// Gives back exactly what `assign(p)` took.
    pub fn release(&mut self, p: &Placement) -> Result<(), CapacityError> {
        self.snap.release(p)?;
        self.refresh(p.host);
        Ok(())
    }

    /// Takes GPU `g` out of service or puts it back (see [`Snapshot::set_gpu_available`]).
    pub fn set_gpu_available(&mut self, g: crate::snapshot::GpuIdx, available: bool) {
        self.snap.set_gpu_available(g, available);
        self.refresh(self.snap.host_of(g));
    }

    /// Cordons host `h` (no new tasks) or opens it again.
    pub fn set_host_active(&mut self, h: HostIdx, active: bool) {
        self.snap.set_host_active(h, active);
        self.refresh(h);
    }

    /// Places and assigns each request in turn (a service scale-up). With distinct-host
    /// constraints, each placed host is avoided by the tasks after it; with per-GPU or
    /// per-host caps, each placement counts against them for the tasks after it.
    pub fn place_batch(&mut self, requests: &[TaskRequest]) -> BatchOutcome {
        let mut placed: Vec<Placement> = Vec::new();
        // A batch is mostly one request repeated: the previous request, counted against
        // the placements before it, is carried to the next equal one, which then counts
        // only the placement made since (linear in the batch, not quadratic).
        let mut carried: Option<(&TaskRequest, TaskRequest, usize)> = None;
        let mut results = Vec::with_capacity(requests.len());
        for original in requests {
            let (mut req, counted) = match carried.take() {
                Some((previous, req, counted)) if previous == original => (req, counted),
                _ => (original.clone(), 0),
            };
            for p in &placed[counted..] {
                count_in_batch(&mut req, p);
            }
            let counted = placed.len();
            let result = self.place(&req).inspect(|p| {
                self.assign(p)
                    .expect("a placement just computed on this snapshot fits it");
                placed.push(p.clone());
            });
            results.push(result);
            carried = Some((original, req, counted));
        }
        BatchOutcome { results }
    }

    /// Whether the current policy places through the best-fit index (else host classes).
    fn uses_index(&self) -> bool {
        match self.policy {
            Policy::Binpack => true,
            Policy::Fragmentation | Policy::FgdSim => self.frag.is_none(),
            _ => false,
        }
    }

    fn refresh(&mut self, h: HostIdx) {
        if self.uses_index() {
            self.index.refresh(&self.snap, h);
            self.classes_stale = true;
        } else {
            self.classes.refresh(&self.snap, h);
            self.index_stale = true;
        }
    }

    /// Rebuilds the structure the current policy reads if other policies let it fall behind.
    fn catch_up(&mut self) {
        if self.uses_index() {
            if self.index_stale {
                self.index = BestFitIndex::build(&self.snap);
                self.index_stale = false;
            }
        } else if self.classes_stale {
            self.classes = Classes::build(&self.snap);
            // Cached scores name class slots of the old structure.
            self.scores.clear();
            self.shapes.clear();
            self.classes_stale = false;
        }
    }

    fn shape_of(&mut self, req: &TaskRequest) -> usize {
        let key = ShapeKey {
            cpu: req.cpu,
            memory: req.memory,
            gpu: req.gpu,
            models: req.constraints.gpu_models.clone(),
        };
        let next = self.shapes.len() as u32;
        let id = *self.shapes.entry(key).or_insert(next);
        if id as usize == self.scores.len() {
            self.scores.push(Vec::new());
        }
        id as usize
    }
}
