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
//! - [`bound`]: the most GPU share any engine could allocate to a set of tasks (for `replay`).
//! - [`consolidate`]: consolidation plans: moves that empty partly used GPUs or hosts.
//! - [`profile`]: the workload's shape and the fragmentation measure built on it.
//! - `gaps`: what a GPU's free share is worth to the workload, learned from its shape.
//! - `classes`: hosts grouped by identical state, so each state is scored once.
//! - [`reject`]: rejection reports with counts by reason and the operator's sentence.
//! - [`openb`]: reading the Alibaba openb trace format, for the `replay` benchmark.
//! - [`variants`]: workload variants of a trace made with a seed (GPU-model pinning, CPU-only
//!   scale, shared and multi-GPU mix), for the `replay --variants` table.
//! - [`rng`]: the seeded generator behind tie-breaks and shuffles.

#![forbid(unsafe_code)]

pub mod bound;
mod classes;
pub mod consolidate;
pub mod engine;
mod gaps;
pub mod openb;
pub mod profile;
pub mod reject;
pub mod request;
pub mod rng;
pub mod snapshot;
pub mod variants;

pub use engine::{BatchOutcome, Engine, Policy, describe_request};
pub use profile::{DemandProfile, ProfileEntry};
pub use reject::{FilterReason, LargestFree, ModelFree, Rejection};
pub use request::{Constraints, GpuDemand, LabelRule, TaskRequest};
pub use snapshot::{
    CapacityError, GpuIdx, GpuSlot, GpuSpec, GpuUsage, HostIdx, HostSpec, Placement, PoolLimits,
    Snapshot,
};
