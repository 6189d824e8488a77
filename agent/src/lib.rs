//! The Tessera host agent: runs on each GPU host and makes placements real. It discovers
//! GPUs (NVML, or simulated), supervises the MPS control daemon, runs tasks as processes
//! with their MPS limits in their environment, measures what they use, and syncs with the
//! control plane.
//!
//! # Layout
//! - [`probe`]: the `GpuProbe` trait; `NvmlProbe` (inventory, health events, per-process
//!   use) and `SimulatedProbe`.
//! - [`mps`]: the MPS control daemon supervisor and its restart budget.
//! - [`runtime`]: processes per task, capped logs, stop with SIGTERM/SIGKILL, re-adoption;
//!   each task as a uid of its own and in a cgroup of its own ([`runtime::cgroup`]) that
//!   may open its own GPUs' device nodes only ([`runtime::cgroup::devices`]); containers
//!   with an image through the Docker Engine API ([`runtime::docker`]).
//! - [`agent`]: registration, the sync loop with backoff, `AgentConfig` and `Isolation`.
//! - [`check`]: `tessera-agent check`, every prerequisite of the host with a verdict.
//!
//! Unsafe code is denied everywhere but in two places, allowed where they are: a task's
//! process joins its cgroup in the child between `fork` and `exec` (`runtime::confine`),
//! and a device program is loaded and attached with bpf(2) (`runtime::cgroup::devices`);
//! neither can be written without it.

#![deny(unsafe_code)]

pub mod agent;
pub mod check;
pub mod mps;
pub mod probe;
pub mod runtime;

pub use agent::{Agent, AgentConfig, AgentError, ContainerRuntime, Isolation};
