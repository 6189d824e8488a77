//! The Tessera host agent: discovers a host's GPUs, either through NVML or from a simulated
//! spec, and reports them in the model's vocabulary.
//!
//! # Layout
//! - [`probe`]: the `GpuProbe` trait and its two implementations, `NvmlProbe` and `SimulatedProbe`.

#![forbid(unsafe_code)]

pub mod probe;
