//! The engine's picture of a pool: hosts, GPUs and what is allocated on them, kept in step
//! with assignments and releases, plus the capacity checks that every placement obeys.

use crate::reject::FilterReason;
use crate::request::{GpuDemand, TaskRequest};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_model::{ComputeMilli, GpuUuid, HostId, MiB, MilliCpu, SharingMode};

/// A host as the engine needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostSpec {
    pub id: HostId,
    pub cpu: MilliCpu,
    pub memory: MiB,
    pub labels: BTreeMap<String, String>,
    /// Only active hosts take new tasks.
    pub active: bool,
    pub gpus: Vec<GpuSpec>,
}

/// A GPU as the engine needs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSpec {
    pub uuid: GpuUuid,
    pub model: String,
    pub memory: MiB,
    pub mps_client_limit: u32,
    pub healthy: bool,
}

/// Pool-wide limits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PoolLimits {
    /// Compute caps may add up to this many GPUs' worth per GPU (1.0: caps are reserved).
    pub compute_overcommit: f64,
    /// Replaces every GPU's MPS client limit when set.
    pub mps_client_limit: Option<u32>,
}

impl Default for PoolLimits {
    fn default() -> Self {
        PoolLimits {
            compute_overcommit: 1.0,
            mps_client_limit: None,
        }
    }
}

/// Index of a host in its snapshot.
pub type HostIdx = u32;
/// Index of a GPU in its snapshot.
pub type GpuIdx = u32;

/// What a placed task holds on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuSlot {
    pub gpu: GpuIdx,
    pub uuid: GpuUuid,
    /// The device index on its host.
    pub index: u32,
    pub memory: MiB,
    pub compute: ComputeMilli,
    /// The task has the whole GPU to itself.
    pub dedicated: bool,
}

/// Where a task goes and what it takes: the unit of assign and release.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Placement {
    pub host: HostIdx,
    pub host_id: HostId,
    pub cpu: MilliCpu,
    pub memory: MiB,
    pub gpus: Vec<GpuSlot>,
}

/// Assign or release that does not match the snapshot; a caller bug or a stale plan.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapacityError {
    #[error("placement no longer fits on {host}: {reason}")]
    DoesNotFit { host: HostId, reason: &'static str },
    #[error("release of {host} gives back more than was allocated: {what}")]
    OverRelease { host: HostId, what: &'static str },
    #[error("placement names host index {0}, which this snapshot does not have")]
    UnknownHost(HostIdx),
}

#[derive(Debug, Clone)]
pub(crate) struct Host {
    pub id: HostId,
    pub labels: BTreeMap<String, String>,
    pub active: bool,
    pub cpu_cap: MilliCpu,
    pub mem_cap: MiB,
    pub cpu_free: MilliCpu,
    pub mem_free: MiB,
    /// This host's GPUs are `gpus[first_gpu..first_gpu + gpu_count]`.
    pub first_gpu: u32,
    pub gpu_count: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Gpu {
    pub host: HostIdx,
    pub index: u32,
    pub uuid: GpuUuid,
    /// Interned (model name, memory) — see `Snapshot::models`.
    pub model: u16,
    pub mem_cap: MiB,
    pub mem_free: MiB,
    pub compute_cap: u32,
    pub compute_free: u32,
    pub clients: u32,
    pub client_limit: u32,
    pub healthy: bool,
    pub dedicated: bool,
}

impl Gpu {
    pub fn mode(&self) -> SharingMode {
        if self.dedicated {
            SharingMode::Dedicated
        } else if self.clients > 0 {
            SharingMode::Mps
        } else {
            SharingMode::Idle
        }
    }

    pub fn is_idle(&self) -> bool {
        !self.dedicated && self.clients == 0
    }

    /// Why this GPU cannot take a shared slot of `memory` and `compute`, if it cannot.
    pub fn check_shared(&self, memory: MiB, compute: ComputeMilli) -> Result<(), FilterReason> {
        if !self.healthy {
            Err(FilterReason::GpuUnhealthy)
        } else if self.dedicated {
            Err(FilterReason::GpuMode)
        } else if self.clients >= self.client_limit {
            Err(FilterReason::MpsClientLimit)
        } else if self.mem_free < memory {
            Err(FilterReason::GpuMemory)
        } else if self.compute_free < compute.0 {
            Err(FilterReason::GpuCompute)
        } else {
            Ok(())
        }
    }

    /// Why this GPU cannot be taken whole, if it cannot.
    pub fn check_whole(&self) -> Result<(), FilterReason> {
        if !self.healthy {
            Err(FilterReason::GpuUnhealthy)
        } else if !self.is_idle() {
            Err(FilterReason::GpuMode)
        } else {
            Ok(())
        }
    }

    /// Free share of the GPU in thousandths, the smaller of memory and reserved compute;
    /// 1000 only when idle, 0 when it can take nothing more.
    pub fn free_share(&self) -> u16 {
        if !self.healthy || self.dedicated || self.clients >= self.client_limit {
            return 0;
        }
        if self.is_idle() {
            return 1000;
        }
        let mem = (self.mem_free.0 * 1000 / self.mem_cap.0.max(1)) as u32;
        let compute = self.compute_free.min(1000);
        mem.min(compute).min(999) as u16
    }
}

/// The engine's picture of one pool.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub(crate) hosts: Vec<Host>,
    pub(crate) gpus: Vec<Gpu>,
    /// Interned GPU kinds: (model name, memory per GPU).
    pub(crate) models: Vec<(String, MiB)>,
}

impl Snapshot {
    pub fn new(hosts: Vec<HostSpec>, limits: PoolLimits) -> Self {
        let mut snapshot = Snapshot {
            hosts: Vec::with_capacity(hosts.len()),
            gpus: Vec::new(),
            models: Vec::new(),
        };
        for spec in hosts {
            snapshot.add_host(spec, limits);
        }
        snapshot
    }

    /// Adds an empty host (`limits` as the pool's, as [`Snapshot::new`] takes them): a
    /// what-if host of a provider's shape ([`crate::sizing`]).
    pub fn add_host(&mut self, spec: HostSpec, limits: PoolLimits) -> HostIdx {
        let compute_cap = (1000.0 * limits.compute_overcommit.max(1.0)).round() as u32;
        let host_idx = self.hosts.len() as HostIdx;
        let first_gpu = self.gpus.len() as u32;
        for (index, g) in spec.gpus.iter().enumerate() {
            let model = self.intern_model(&g.model, g.memory);
            self.gpus.push(Gpu {
                host: host_idx,
                index: index as u32,
                uuid: g.uuid.clone(),
                model,
                mem_cap: g.memory,
                mem_free: g.memory,
                compute_cap,
                compute_free: compute_cap,
                clients: 0,
                client_limit: limits.mps_client_limit.unwrap_or(g.mps_client_limit),
                healthy: g.healthy,
                dedicated: false,
            });
        }
        self.hosts.push(Host {
            id: spec.id,
            labels: spec.labels,
            active: spec.active,
            cpu_cap: spec.cpu,
            mem_cap: spec.memory,
            cpu_free: spec.cpu,
            mem_free: spec.memory,
            first_gpu,
            gpu_count: spec.gpus.len() as u32,
        });
        host_idx
    }

    fn intern_model(&mut self, name: &str, memory: MiB) -> u16 {
        if let Some(i) = self
            .models
            .iter()
            .position(|(n, m)| n == name && *m == memory)
        {
            return i as u16;
        }
        self.models.push((name.to_owned(), memory));
        (self.models.len() - 1) as u16
    }

    pub fn host_count(&self) -> usize {
        self.hosts.len()
    }

    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    pub(crate) fn host_gpus(&self, h: HostIdx) -> std::ops::Range<usize> {
        let host = &self.hosts[h as usize];
        host.first_gpu as usize..(host.first_gpu + host.gpu_count) as usize
    }

    /// The GPUs of host `h`.
    pub fn gpus_of(&self, h: HostIdx) -> impl Iterator<Item = GpuIdx> + '_ {
        self.host_gpus(h).map(|g| g as GpuIdx)
    }

    pub fn host_id(&self, h: HostIdx) -> &HostId {
        &self.hosts[h as usize].id
    }

    /// A GPU's model name.
    pub fn gpu_model(&self, g: GpuIdx) -> &str {
        &self.models[usize::from(self.gpus[g as usize].model)].0
    }

    /// Free memory, free reserved compute and client count of a GPU.
    pub fn gpu_usage(&self, g: GpuIdx) -> GpuUsage {
        let gpu = &self.gpus[g as usize];
        GpuUsage {
            memory_free: gpu.mem_free,
            memory_capacity: gpu.mem_cap,
            compute_free: ComputeMilli(gpu.compute_free),
            compute_capacity: ComputeMilli(gpu.compute_cap),
            clients: gpu.clients,
            client_limit: gpu.client_limit,
            mode: gpu.mode(),
        }
    }

    /// Free CPU and memory on a host.
    pub fn host_free(&self, h: HostIdx) -> (MilliCpu, MiB) {
        let host = &self.hosts[h as usize];
        (host.cpu_free, host.mem_free)
    }

    /// Host-level filters, in the order a report names them.
    pub(crate) fn check_host(&self, h: HostIdx, req: &TaskRequest) -> Result<(), FilterReason> {
        self.check_host_rules(h, req)?;
        let host = &self.hosts[h as usize];
        if host.cpu_free < req.cpu {
            return Err(FilterReason::HostCpu);
        }
        if host.mem_free < req.memory {
            return Err(FilterReason::HostMemory);
        }
        Ok(())
    }

    /// The host-level filters that do not depend on its free room: whether `req` may run
    /// on host `h` at all (what preemption can free does not change them).
    pub(crate) fn check_host_rules(
        &self,
        h: HostIdx,
        req: &TaskRequest,
    ) -> Result<(), FilterReason> {
        let host = &self.hosts[h as usize];
        if !host.active {
            return Err(FilterReason::HostNotActive);
        }
        let c = &req.constraints;
        if c.labels
            .iter()
            .any(|rule| !rule.allows(host.labels.get(rule.key())))
            || c.avoid_hosts.contains(&host.id)
            || c.host_full(&host.id)
        {
            return Err(FilterReason::Constraint);
        }
        if c.port_taken(&host.id).is_some() || c.ports_exhausted(&host.id) {
            return Err(FilterReason::HostPort);
        }
        if !req.constraints.gpu_models.is_empty()
            && req.gpu != GpuDemand::None
            && !self
                .host_gpus(h)
                .any(|g| req.allows_model(&self.models[self.gpus[g].model as usize].0))
        {
            return Err(FilterReason::Constraint);
        }
        Ok(())
    }

    /// Whether GPU `g` could hold `req` (shared) or be one of its whole GPUs.
    pub(crate) fn check_gpu(&self, g: usize, req: &TaskRequest) -> Result<(), FilterReason> {
        self.check_gpu_rules(g, req)?;
        let gpu = &self.gpus[g];
        match req.gpu {
            GpuDemand::None => Ok(()),
            GpuDemand::Whole { .. } => gpu.check_whole(),
            GpuDemand::Shared { memory, compute } => {
                gpu.check_shared(memory, compute.unwrap_or_default())
            }
        }
    }

    /// Whether `req` may use GPU `g` at all (its model, its service's cap per GPU), room
    /// aside.
    pub(crate) fn check_gpu_rules(&self, g: usize, req: &TaskRequest) -> Result<(), FilterReason> {
        let gpu = &self.gpus[g];
        if !req.allows_model(&self.models[gpu.model as usize].0)
            || req.constraints.gpu_full(&gpu.uuid)
        {
            return Err(FilterReason::Constraint);
        }
        Ok(())
    }

    /// Builds the placement of `req` on host `h` using the given GPUs (already checked).
    pub(crate) fn make_placement(
        &self,
        h: HostIdx,
        req: &TaskRequest,
        gpus: &[usize],
    ) -> Placement {
        let slots = gpus
            .iter()
            .map(|&g| {
                let gpu = &self.gpus[g];
                match req.gpu {
                    GpuDemand::Shared { memory, compute } => GpuSlot {
                        gpu: g as GpuIdx,
                        uuid: gpu.uuid.clone(),
                        index: gpu.index,
                        memory,
                        compute: compute.unwrap_or_default(),
                        dedicated: false,
                    },
                    _ => GpuSlot {
                        gpu: g as GpuIdx,
                        uuid: gpu.uuid.clone(),
                        index: gpu.index,
                        memory: gpu.mem_cap,
                        compute: ComputeMilli(gpu.compute_cap),
                        dedicated: true,
                    },
                }
            })
            .collect();
        Placement {
            host: h,
            host_id: self.hosts[h as usize].id.clone(),
            cpu: req.cpu,
            memory: req.memory,
            gpus: slots,
        }
    }

    /// Takes what `p` holds. Checks every capacity first and changes nothing if one is short,
    /// so a stale plan can never overcommit.
    /// Takes GPU `g` out of service (a consolidation plan keeps it empty) or puts it back.
    pub fn set_gpu_available(&mut self, g: GpuIdx, available: bool) {
        self.gpus[g as usize].healthy = available;
    }

    /// Whether host `h` takes new tasks.
    pub fn set_host_active(&mut self, h: HostIdx, active: bool) {
        self.hosts[h as usize].active = active;
    }

    /// Whether GPU `g` takes tasks (healthy and not taken out of service).
    pub fn gpu_available(&self, g: GpuIdx) -> bool {
        self.gpus[g as usize].healthy
    }

    /// Whether host `h` takes new tasks.
    pub fn host_active(&self, h: HostIdx) -> bool {
        self.hosts[h as usize].active
    }

    /// The host GPU `g` is on.
    pub fn host_of(&self, g: GpuIdx) -> HostIdx {
        self.gpus[g as usize].host
    }

    pub fn assign(&mut self, p: &Placement) -> Result<(), CapacityError> {
        let host = self
            .hosts
            .get(p.host as usize)
            .ok_or(CapacityError::UnknownHost(p.host))?;
        let fail = |reason| CapacityError::DoesNotFit {
            host: host.id.clone(),
            reason,
        };
        if host.cpu_free < p.cpu {
            return Err(fail("host CPU"));
        }
        if host.mem_free < p.memory {
            return Err(fail("host memory"));
        }
        for slot in &p.gpus {
            let gpu = self
                .gpus
                .get(slot.gpu as usize)
                .ok_or(fail("unknown GPU"))?;
            if gpu.host != p.host {
                return Err(fail("GPU belongs to another host"));
            }
            let ok = if slot.dedicated {
                gpu.check_whole().is_ok()
            } else {
                gpu.check_shared(slot.memory, slot.compute).is_ok()
            };
            if !ok {
                return Err(fail("GPU capacity"));
            }
        }
        let host = &mut self.hosts[p.host as usize];
        host.cpu_free -= p.cpu;
        host.mem_free -= p.memory;
        for slot in &p.gpus {
            let gpu = &mut self.gpus[slot.gpu as usize];
            if slot.dedicated {
                gpu.dedicated = true;
                gpu.mem_free = MiB::ZERO;
                gpu.compute_free = 0;
            } else {
                gpu.clients += 1;
                gpu.mem_free -= slot.memory;
                gpu.compute_free -= slot.compute.0;
            }
        }
        Ok(())
    }

    /// `p` (made on another picture of the pool, with other indices) on this snapshot:
    /// the same host and GPUs by their ids, if the host takes tasks and the GPUs are in
    /// service. Whether the room is there is the caller's to check (`assign`).
    pub fn resolve(&self, p: &Placement) -> Option<Placement> {
        let h = self.hosts.iter().position(|h| h.id == p.host_id)? as HostIdx;
        if !self.host_active(h) {
            return None;
        }
        let mut out = p.clone();
        out.host = h;
        for s in &mut out.gpus {
            let g = self
                .gpus_of(h)
                .find(|&g| self.gpus[g as usize].uuid == s.uuid)?;
            if !self.gpu_available(g) {
                return None;
            }
            s.gpu = g;
        }
        Some(out)
    }

    /// Whether `p` may be committed now, taking what it holds if so: the check a plan made
    /// elsewhere (another server, an older picture of the fleet) passes before it is
    /// stored. The same rules as placement: an active host, and the same GPU and host
    /// capacity checks `assign` makes.
    pub fn verify(&mut self, p: &Placement) -> Result<(), CapacityError> {
        let host = self
            .hosts
            .get(p.host as usize)
            .ok_or(CapacityError::UnknownHost(p.host))?;
        if !host.active {
            return Err(CapacityError::DoesNotFit {
                host: host.id.clone(),
                reason: "host not active",
            });
        }
        self.assign(p)
    }

    /// Gives back exactly what `assign(p)` took.
    pub fn release(&mut self, p: &Placement) -> Result<(), CapacityError> {
        let host = self
            .hosts
            .get(p.host as usize)
            .ok_or(CapacityError::UnknownHost(p.host))?;
        let over = |what| CapacityError::OverRelease {
            host: host.id.clone(),
            what,
        };
        if host.cpu_free + p.cpu > host.cpu_cap {
            return Err(over("host CPU"));
        }
        if host.mem_free + p.memory > host.mem_cap {
            return Err(over("host memory"));
        }
        for slot in &p.gpus {
            let gpu = self
                .gpus
                .get(slot.gpu as usize)
                .ok_or(over("unknown GPU"))?;
            let ok = gpu.host == p.host
                && if slot.dedicated {
                    gpu.dedicated
                } else {
                    !gpu.dedicated
                        && gpu.clients > 0
                        && gpu.mem_free + slot.memory <= gpu.mem_cap
                        && gpu.compute_free + slot.compute.0 <= gpu.compute_cap
                };
            if !ok {
                return Err(over("GPU"));
            }
        }
        let host = &mut self.hosts[p.host as usize];
        host.cpu_free += p.cpu;
        host.mem_free += p.memory;
        for slot in &p.gpus {
            let gpu = &mut self.gpus[slot.gpu as usize];
            if slot.dedicated {
                gpu.dedicated = false;
                gpu.mem_free = gpu.mem_cap;
                gpu.compute_free = gpu.compute_cap;
            } else {
                gpu.clients -= 1;
                gpu.mem_free += slot.memory;
                gpu.compute_free += slot.compute.0;
            }
        }
        Ok(())
    }
}

/// One GPU's usage, for reports and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUsage {
    pub memory_free: MiB,
    pub memory_capacity: MiB,
    pub compute_free: ComputeMilli,
    pub compute_capacity: ComputeMilli,
    pub clients: u32,
    pub client_limit: u32,
    pub mode: SharingMode,
}
