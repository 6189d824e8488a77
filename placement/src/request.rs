//! What a task asks of the cluster: host CPU and memory, GPUs, and where it may run.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use tessera_model::{ComputeMilli, HostId, MiB, MilliCpu};

/// The GPU part of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuDemand {
    /// CPU-only.
    None,
    /// `count` whole GPUs on one host, each used by this task alone.
    Whole { count: u32 },
    /// A slot on one GPU shared through MPS: a memory budget and, optionally, a compute cap.
    /// Without a cap the task may use the whole GPU's compute and reserves none.
    Shared {
        memory: MiB,
        compute: Option<ComputeMilli>,
    },
}

/// A label that a host must carry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LabelRule {
    /// `key` is set to exactly `value`.
    Equals { key: String, value: String },
    /// `key` is set to one of `values`.
    In { key: String, values: Vec<String> },
}

impl LabelRule {
    pub fn key(&self) -> &str {
        match self {
            LabelRule::Equals { key, .. } | LabelRule::In { key, .. } => key,
        }
    }

    pub fn allows(&self, value: Option<&String>) -> bool {
        match (self, value) {
            (LabelRule::Equals { value: want, .. }, Some(v)) => v == want,
            (LabelRule::In { values, .. }, Some(v)) => values.contains(v),
            (_, None) => false,
        }
    }
}

/// Where a task may run, beyond having room.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Constraints {
    /// GPU models the task accepts; empty means any.
    pub gpu_models: Vec<String>,
    pub labels: Vec<LabelRule>,
    /// Each task of the batch on a different host, and not on `avoid_hosts`.
    pub distinct_hosts: bool,
    /// Hosts not to use: for `distinct_hosts`, the hosts the service's tasks already hold.
    pub avoid_hosts: BTreeSet<HostId>,
}

/// One task to place.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TaskRequest {
    pub cpu: MilliCpu,
    pub memory: MiB,
    pub gpu: GpuDemand,
    pub constraints: Constraints,
}

impl TaskRequest {
    pub fn cpu_only(cpu: MilliCpu, memory: MiB) -> Self {
        TaskRequest {
            cpu,
            memory,
            gpu: GpuDemand::None,
            constraints: Constraints::default(),
        }
    }

    pub fn whole(cpu: MilliCpu, memory: MiB, count: u32) -> Self {
        TaskRequest {
            gpu: GpuDemand::Whole { count },
            ..Self::cpu_only(cpu, memory)
        }
    }

    pub fn shared(
        cpu: MilliCpu,
        memory: MiB,
        gpu_memory: MiB,
        compute: Option<ComputeMilli>,
    ) -> Self {
        TaskRequest {
            gpu: GpuDemand::Shared {
                memory: gpu_memory,
                compute,
            },
            ..Self::cpu_only(cpu, memory)
        }
    }

    pub fn with_models(mut self, models: &[&str]) -> Self {
        self.constraints.gpu_models = models.iter().map(|m| (*m).to_owned()).collect();
        self
    }

    pub(crate) fn allows_model(&self, model: &str) -> bool {
        self.constraints.gpu_models.is_empty()
            || self.constraints.gpu_models.iter().any(|m| m == model)
    }
}
