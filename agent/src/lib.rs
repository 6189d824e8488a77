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
//!   containers with an image through the Docker Engine API ([`runtime::docker`]).
//! - [`agent`]: registration, the sync loop with backoff, and `AgentConfig`.

#![forbid(unsafe_code)]

pub mod agent;
pub mod mps;
pub mod probe;
pub mod runtime;

pub use agent::{Agent, AgentConfig, AgentError, ContainerRuntime};
