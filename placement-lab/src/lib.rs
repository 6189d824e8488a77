//! The placement engine's laboratory: what the benchmarks need around the pure engine of
//! `tessera-placement`, kept out of it so the engine stays what the control plane links.
//!
//! - [`openb`]: reading the Alibaba openb trace format (nodes and pods).
//! - [`variants`]: workload variants of a trace made with a seed (GPU-model pinning,
//!   CPU-only scale, shared and multi-GPU mix), for the `replay --variants` table.
//! - [`projects`]: the projects replay: arrivals split between projects with priorities,
//!   guarantees and limits, placed pass by pass with preemption, beside a run without.
//! - [`bound`]: the most GPU share any engine could allocate to a set of tasks, a ceiling
//!   to read `replay`'s figures against.
//! - [`autoscale`]: the autoscaling benchmark: a trace's tasks with their creation and
//!   deletion times replayed against a provider of its node types with a boot delay, under
//!   Tessera's capacity-provider rule, a cluster-autoscaler-like rule and a static fleet,
//!   against the lower bound of GPU-hours.
//!
//! Binaries: `replay` (the placement benchmark on a trace, against FGD's published
//! figures and the bound), `projects` (the projects replay), `consolidate` (the
//! consolidation simulator) and `autoscale` (the autoscaling benchmark).

#![forbid(unsafe_code)]

pub mod autoscale;
pub mod bound;
pub mod openb;
pub mod projects;
pub mod variants;
