//! Tessera's placement engine: which GPU each task runs on.
//!
//! Pure: it reads a snapshot of a pool's capacity and task requests and returns placements
//! or explained rejections. No I/O, no clock, no async; the seed for random tie-breaks is a
//! parameter, so the same input and seed always give the same result. The control plane
//! builds an engine from its store and re-checks every commit with the snapshot's own rules
//! (`Snapshot::verify`).
//!
//! # Layout
//! - [`snapshot`]: hosts, GPUs, allocations; `assign` / `release` and the capacity checks.
//! - [`request`]: what a task asks for (CPU, memory, whole GPUs or an MPS slot) and its constraints.
//! - [`engine`]: filter, score, choose; the policies (`policy`), binpack's index (`index`),
//!   scoring (`scoring`), rejections explained (`explain`); batches and dry runs.
//! - [`consolidate`]: consolidation plans: moves that empty partly used GPUs or hosts.
//! - [`preempt`]: preemption plans: the fewest tasks to stop so that a waiting one fits.
//! - [`sizing`]: what-if sizing: how many more hosts of a provider's shape place the tasks
//!   that wait for room.
//! - [`quota`]: projects' quotas as placement sees them (use, guarantees, fair share) and
//!   the preemption planner's inputs read from a snapshot.
//! - [`profile`]: the workload's shape and the fragmentation measure built on it.
//! - `gaps`: what a GPU's free share is worth to the workload, learned from its shape.
//! - `classes`: hosts grouped by identical state, so each state is scored once.
//! - [`reject`]: rejection reports with counts by reason and the operator's sentence.
//! - [`rng`]: the seeded generator behind tie-breaks and shuffles.
//!
//! The benchmark harness (trace readers, workload variants, the LP bound, `replay` and
//! `consolidate`) is the crate `tessera-placement-lab`, beside this one.

#![forbid(unsafe_code)]

mod classes;
pub mod consolidate;
pub mod engine;
mod gaps;
pub mod preempt;
pub mod profile;
pub mod quota;
pub mod reject;
pub mod request;
pub mod rng;
pub mod sizing;
pub mod snapshot;

pub use engine::{BatchOutcome, Engine, Policy, describe_request};
pub use profile::{DemandProfile, ProfileEntry};
pub use reject::{FilterReason, LargestFree, ModelFree, Rejection};
pub use request::{Constraints, GpuDemand, LabelRule, TaskRequest};
pub use snapshot::{
    CapacityError, GpuIdx, GpuSlot, GpuSpec, GpuUsage, HostIdx, HostSpec, Placement, PoolLimits,
    Snapshot,
};
