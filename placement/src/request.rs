//! What a task asks of the cluster: host CPU and memory, GPUs, and where it may run.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use tessera_model::taskdef::Protocol;
use tessera_model::{ComputeMilli, GpuUuid, HostId, MiB, MilliCpu};

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
    /// At most this many of the service's tasks per GPU, counting `gpu_counts`.
    pub max_per_gpu: Option<u32>,
    /// At most this many of the service's tasks per host, counting `host_counts`.
    pub max_per_host: Option<u32>,
    /// How many of the service's tasks each GPU holds already (for `max_per_gpu`).
    pub gpu_counts: BTreeMap<GpuUuid, u32>,
    /// How many of the service's tasks each host holds already (for `max_per_host`).
    pub host_counts: BTreeMap<HostId, u32>,
    /// Fixed host ports the task needs: a host where any of them is taken cannot hold it.
    pub host_ports: Vec<(u16, Protocol)>,
    /// Host ports taken on each host (by any task), for `host_ports`.
    pub ports_in_use: BTreeMap<HostId, BTreeSet<(u16, Protocol)>>,
    /// Dynamic host ports the task needs (its agent picks them).
    pub dynamic_ports: u32,
    /// Dynamic ports left on each host, where its agent said (absent: plenty).
    pub dynamic_free: BTreeMap<HostId, u32>,
    /// GPUs to keep off: measured interference with a task there would break a latency
    /// target. A soft rule: the caller places again without it when nothing else has room.
    pub avoid_gpus: BTreeSet<GpuUuid>,
}

impl Constraints {
    /// Counts a placement on host `host_id` and GPUs `gpus` against the caps (the next
    /// task of the batch sees it).
    pub fn count<'a>(
        &mut self,
        host_id: &HostId,
        gpus: impl IntoIterator<Item = &'a GpuUuid>,
        delta: i32,
    ) {
        if self.dynamic_ports > 0
            && let Some(free) = self.dynamic_free.get_mut(host_id)
        {
            *free = free.saturating_add_signed(-delta * self.dynamic_ports as i32);
        }
        if !self.host_ports.is_empty() {
            let used = self.ports_in_use.entry(host_id.clone()).or_default();
            for port in &self.host_ports {
                if delta > 0 {
                    used.insert(*port);
                } else {
                    used.remove(port);
                }
            }
        }
        if self.max_per_host.is_some() {
            let n = self.host_counts.entry(host_id.clone()).or_default();
            *n = n.saturating_add_signed(delta);
        }
        if self.max_per_gpu.is_some() {
            for uuid in gpus {
                let n = self.gpu_counts.entry(uuid.clone()).or_default();
                *n = n.saturating_add_signed(delta);
            }
        }
    }

    /// Whether the service's tasks on host `id` reached its per-host cap.
    pub fn host_full(&self, id: &HostId) -> bool {
        self.max_per_host
            .is_some_and(|m| self.host_counts.get(id).copied().unwrap_or(0) >= m)
    }

    /// The first of the task's fixed host ports already taken on host `id`.
    /// Whether host `id` is out of dynamic ports for the task.
    pub fn ports_exhausted(&self, id: &HostId) -> bool {
        self.dynamic_ports > 0
            && self
                .dynamic_free
                .get(id)
                .is_some_and(|&free| free < self.dynamic_ports)
    }

    pub fn port_taken(&self, id: &HostId) -> Option<(u16, Protocol)> {
        let used = self.ports_in_use.get(id)?;
        self.host_ports.iter().find(|p| used.contains(p)).copied()
    }

    /// Whether the service's tasks on GPU `uuid` reached its per-GPU cap, or it is to be
    /// kept off.
    pub fn gpu_full(&self, uuid: &GpuUuid) -> bool {
        self.max_per_gpu
            .is_some_and(|m| self.gpu_counts.get(uuid).copied().unwrap_or(0) >= m)
            || self.avoid_gpus.contains(uuid)
    }
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

    pub(crate) fn allows_model(&self, model: &str) -> bool {
        self.constraints.gpu_models.is_empty()
            || self.constraints.gpu_models.iter().any(|m| m == model)
    }
}
