//! Why a task could not be placed, as data: every host and GPU that was looked at and
//! turned down is counted under its reason, and the largest free amounts seen say how far
//! off the request was. `Display` is the sentence an operator reads.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use tessera_model::{ComputeMilli, MiB, MilliCpu};

/// Why one host (or one GPU on it) cannot take a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FilterReason {
    /// The host is not active (draining, impaired or lost).
    HostNotActive,
    /// A label rule, the GPU model list, distinct-host placement or the service's per-GPU
    /// or per-host cap excludes it.
    Constraint,
    HostCpu,
    HostMemory,
    /// The GPU is unhealthy.
    GpuUnhealthy,
    /// The GPU is held by a dedicated task, or is shared while a whole GPU was asked for.
    GpuMode,
    GpuMemory,
    GpuCompute,
    MpsClientLimit,
    /// The host has fewer idle GPUs than the task needs.
    NotEnoughIdleGpus,
    /// A fixed host port the task needs is taken there.
    HostPort,
}

impl FilterReason {
    /// What the reason means, for the operator's sentence.
    pub fn describe(self) -> &'static str {
        match self {
            FilterReason::HostNotActive => "host not active",
            FilterReason::Constraint => {
                "excluded by constraints (labels, GPU models, distinct hosts, per-GPU or per-host caps)"
            }
            FilterReason::HostCpu => "not enough host CPU",
            FilterReason::HostMemory => "not enough host memory",
            FilterReason::GpuUnhealthy => "GPU unhealthy",
            FilterReason::GpuMode => "GPU dedicated or already shared",
            FilterReason::GpuMemory => "not enough free GPU memory",
            FilterReason::GpuCompute => "not enough free GPU compute",
            FilterReason::MpsClientLimit => "MPS client limit reached",
            FilterReason::NotEnoughIdleGpus => "not enough idle GPUs",
            FilterReason::HostPort => {
                "a fixed host port it needs is taken, or the host's agent has no dynamic port left"
            }
        }
    }
}

/// The largest free amounts seen among hosts and GPUs that passed the host-level filters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LargestFree {
    /// Free memory on the emptiest usable GPU, and where it is (`host/GPU index`).
    pub gpu_memory: Option<(MiB, String)>,
    pub gpu_compute: Option<ComputeMilli>,
    pub idle_gpus_on_one_host: u32,
    pub host_cpu: MilliCpu,
    pub host_memory: MiB,
}

/// What one GPU model has free on the active hosts: where capacity is left, and whether
/// it is whole GPUs or gaps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelFree {
    pub gpus: u32,
    pub idle_gpus: u32,
    /// Free GPU memory on its healthy GPUs that are not dedicated to a task (idle ones
    /// included).
    pub free_memory: MiB,
}

/// A task that fits nowhere, with the evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// What was asked, in words ("1 GPU slot with 24 GiB and 50% compute, 4 vCPU, 16 GiB").
    pub request: String,
    pub hosts_evaluated: u32,
    pub gpus_evaluated: u32,
    /// Hosts turned down, by the first reason that ruled each out.
    pub hosts_filtered: BTreeMap<FilterReason, u32>,
    /// GPUs turned down on hosts that passed the host filters, by reason.
    pub gpus_filtered: BTreeMap<FilterReason, u32>,
    pub largest_free: LargestFree,
    /// Per GPU model, what is free on active hosts (a task pinned to a model that is full
    /// is told where room is left).
    #[serde(default)]
    pub free_by_model: BTreeMap<String, ModelFree>,
}

impl Rejection {
    /// The reason that turned down the most hosts: what to fix first.
    pub fn dominant_reason(&self) -> Option<FilterReason> {
        self.hosts_filtered
            .iter()
            .max_by_key(|(reason, n)| (**n, std::cmp::Reverse(**reason)))
            .map(|(reason, _)| *reason)
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.hosts_evaluated == 0 {
            return write!(
                f,
                "unable to place task ({}): the pool has no hosts",
                self.request
            );
        }
        write!(f, "unable to place task ({}): ", self.request)?;
        match self.dominant_reason() {
            Some(FilterReason::GpuMemory) | Some(FilterReason::NotEnoughIdleGpus) | None => {
                match &self.largest_free.gpu_memory {
                    Some((mib, at)) => {
                        write!(f, "no GPU has room; largest free GPU memory {mib} on {at}")?
                    }
                    None => write!(f, "no usable GPU")?,
                }
            }
            Some(FilterReason::GpuCompute) => match self.largest_free.gpu_compute {
                Some(c) => write!(f, "no GPU has enough free compute; largest free {c}")?,
                None => write!(f, "no GPU has enough free compute")?,
            },
            Some(FilterReason::HostCpu) => write!(
                f,
                "no host has enough CPU; largest free {}",
                self.largest_free.host_cpu
            )?,
            Some(FilterReason::HostMemory) => write!(
                f,
                "no host has enough memory; largest free {}",
                self.largest_free.host_memory
            )?,
            Some(other) => write!(f, "{}", other.describe())?,
        }
        write!(
            f,
            ". Evaluated {} hosts and {} GPUs",
            self.hosts_evaluated, self.gpus_evaluated
        )?;
        let mut parts: Vec<String> = self
            .hosts_filtered
            .iter()
            .map(|(r, n)| format!("{n} hosts: {}", r.describe()))
            .collect();
        parts.extend(
            self.gpus_filtered
                .iter()
                .map(|(r, n)| format!("{n} GPUs: {}", r.describe())),
        );
        if !parts.is_empty() {
            write!(f, " ({})", parts.join("; "))?;
        }
        if self.free_by_model.len() > 1 {
            let models: Vec<String> = self
                .free_by_model
                .iter()
                .map(|(m, free)| {
                    format!(
                        "{m} {} of {} GPUs idle, {} free",
                        free.idle_gpus, free.gpus, free.free_memory
                    )
                })
                .collect();
            write!(f, ". Free by GPU model: {}", models.join("; "))?;
        }
        Ok(())
    }
}
