//! GPU discovery and measurement. `NvmlProbe` asks the NVIDIA driver through NVML;
//! `SimulatedProbe` makes up GPUs from a spec such as `8xH100-80GB`, for demos and tests on
//! machines without GPUs, and derives each task's use from its own environment.

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::ComputeMode;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use tessera_model::agent::GpuReport;
use tessera_model::{GpuUuid, MiB};

/// One GPU as found, with what the driver says about it now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuStatus {
    pub uuid: GpuUuid,
    pub index: u32,
    pub model: String,
    pub memory_total: MiB,
    pub memory_used: MiB,
    /// GPU busy time over the driver's last sample period, %.
    pub utilization_pct: Option<u32>,
    /// `Default`, `ExclusiveProcess` (what MPS wants), ...
    pub compute_mode: Option<String>,
    pub mps_client_limit: u32,
    pub healthy: bool,
    /// Its device node's minor (`/dev/nvidia<minor>`), where the driver says.
    #[serde(skip)]
    pub minor: Option<u32>,
    /// ECC and MIG mode now (`None`: the GPU has no such mode, or a simulated one).
    pub ecc_enabled: Option<bool>,
    pub mig_enabled: Option<bool>,
}

/// What a probe found on this host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inventory {
    /// `nvml` or `simulated`.
    pub source: &'static str,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub gpus: Vec<GpuStatus>,
}

impl Inventory {
    /// Each GPU's device minor by UUID, where known.
    pub fn minors(&self) -> std::collections::HashMap<String, u32> {
        self.gpus
            .iter()
            .filter_map(|g| Some((g.uuid.to_string(), g.minor?)))
            .collect()
    }

    /// The GPUs' UUIDs, in index order.
    pub fn uuids(&self) -> Vec<String> {
        self.gpus.iter().map(|g| g.uuid.to_string()).collect()
    }

    /// The GPUs as the agent protocol reports them.
    pub fn reports(&self) -> Vec<GpuReport> {
        self.gpus
            .iter()
            .map(|g| GpuReport {
                uuid: g.uuid.clone(),
                index: g.index,
                model: g.model.clone(),
                memory_mib: g.memory_total,
                mps_client_limit: g.mps_client_limit,
                healthy: g.healthy,
            })
            .collect()
    }
}

/// A task's measured GPU use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub gpu_memory: MiB,
    pub sm_percent: Option<u32>,
    /// GPU memory allocations refused at the task's limit since the last measure (a
    /// simulated task that wants more than its budget; NVML cannot see them).
    pub memory_errors: u32,
}

/// What a probe needs to know about a running task to measure it.
pub struct TaskView<'a> {
    pub pids: &'a [u32],
    /// The environment of its first GPU container (budgets are read from it when simulated).
    pub env: &'a BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "NVML is not available ({0}); is the NVIDIA driver installed? On a machine without GPUs, use --simulate SPEC"
    )]
    NvmlUnavailable(String),
    #[error("NVML call failed: {0}")]
    Nvml(#[from] NvmlError),
    #[error(
        "invalid --simulate spec {spec:?}: {why} (expected COUNTxMODEL-MEMORYGB, e.g. 8xH100-80GB)"
    )]
    BadSpec { spec: String, why: &'static str },
}

/// A source of GPU inventory, health and per-task use.
pub trait GpuProbe: Send {
    fn inventory(&mut self) -> Result<Inventory, ProbeError>;
    /// GPU memory and SM use of a task, summed over its processes.
    fn task_usage(&mut self, task: &TaskView<'_>) -> Option<Usage>;
    fn simulated(&self) -> bool;
}

/// MPS accepts 48 clients per device on Volta and later.
const MPS_CLIENT_LIMIT: u32 = tessera_model::limits::MPS_CLIENT_LIMIT_MAX;

/// GPUs as the NVIDIA driver reports them.
pub struct NvmlProbe {
    nvml: &'static Nvml,
    /// Critical Xid and uncorrectable ECC events, where the GPUs support them.
    events: Option<EventSet<'static>>,
    /// GPUs that reported such an event: unhealthy until the agent restarts.
    failed: HashMap<String, String>,
    /// Last timestamp seen by the per-process utilization query.
    last_sample_us: u64,
    /// Each GPU as last read, to report it unhealthy when a read fails.
    last_seen: HashMap<u32, GpuStatus>,
}

impl NvmlProbe {
    /// Loads libnvidia-ml; fails with a clear error where there is no driver. The library
    /// handle lives as long as the process, so the event set can borrow it.
    pub fn new() -> Result<Self, ProbeError> {
        let nvml = Nvml::init().map_err(|e| ProbeError::NvmlUnavailable(e.to_string()))?;
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let mut events = nvml.create_event_set().ok();
        if let Ok(count) = nvml.device_count() {
            for i in 0..count {
                let (Ok(device), Some(set)) = (nvml.device_by_index(i), events.take()) else {
                    continue;
                };
                let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
                events = match device.register_events(wanted, set) {
                    Ok(set) => Some(set),
                    Err(e) => {
                        // A failed registration consumes the set: start a new one.
                        tracing::info!(gpu = i, error = %e.error, "GPU health events not supported on this GPU");
                        nvml.create_event_set().ok()
                    }
                };
            }
        }
        Ok(NvmlProbe {
            nvml,
            events,
            failed: HashMap::new(),
            last_sample_us: 0,
            last_seen: HashMap::new(),
        })
    }

    fn drain_events(&mut self) {
        let Some(set) = &self.events else { return };
        while let Ok(event) = set.wait(0) {
            let uuid = event.device.uuid().unwrap_or_default();
            let what = match event.event_data {
                Some(xid) => format!("Xid {xid:?}"),
                None => format!("{:?}", event.event_type),
            };
            tracing::warn!(gpu = %uuid, event = %what, "GPU reported a critical error");
            self.failed.insert(uuid, what);
        }
    }
}

impl GpuProbe for NvmlProbe {
    fn inventory(&mut self) -> Result<Inventory, ProbeError> {
        self.drain_events();
        let count = self.nvml.device_count()?;
        let reads = (0..count)
            .map(|index| (index, self.gpu_status(index)))
            .collect();
        let gpus = per_gpu(reads, &mut self.last_seen);
        let cuda = self.nvml.sys_cuda_driver_version().ok();
        Ok(Inventory {
            source: "nvml",
            driver_version: self.nvml.sys_driver_version().ok(),
            cuda_version: cuda.map(|c| format!("{}.{}", c / 1000, (c % 1000) / 10)),
            gpus,
        })
    }

    fn task_usage(&mut self, task: &TaskView<'_>) -> Option<Usage> {
        self.task_usage_nvml(task)
    }

    fn simulated(&self) -> bool {
        false
    }
}

/// The inventory from each GPU's read: a GPU that cannot be read is reported unhealthy
/// as it was last seen (or left out when never seen, which the server also takes as
/// unhealthy); the others are reported as usual, so one failing GPU never stops the
/// host's sync.
fn per_gpu(
    reads: Vec<(u32, Result<GpuStatus, ProbeError>)>,
    last_seen: &mut HashMap<u32, GpuStatus>,
) -> Vec<GpuStatus> {
    let mut gpus = Vec::with_capacity(reads.len());
    for (index, read) in reads {
        match read {
            Ok(status) => {
                last_seen.insert(index, status.clone());
                gpus.push(status);
            }
            Err(e) => {
                tracing::warn!(gpu = index, error = %e, "cannot read this GPU; reporting it unhealthy");
                if let Some(mut last) = last_seen.get(&index).cloned() {
                    last.healthy = false;
                    gpus.push(last);
                }
            }
        }
    }
    gpus
}

impl NvmlProbe {
    /// One GPU as NVML reports it now.
    fn gpu_status(&self, index: u32) -> Result<GpuStatus, ProbeError> {
        let device = self.nvml.device_by_index(index)?;
        let memory = device.memory_info()?;
        let uuid = device.uuid()?;
        Ok(GpuStatus {
            healthy: !self.failed.contains_key(&uuid),
            uuid: GpuUuid::new(uuid).map_err(|_| ProbeError::BadSpec {
                spec: "NVML".into(),
                why: "device returned an empty UUID",
            })?,
            index,
            model: device.name()?,
            memory_total: MiB(memory.total / (1024 * 1024)),
            memory_used: MiB(memory.used / (1024 * 1024)),
            utilization_pct: device.utilization_rates().ok().map(|u| u.gpu),
            compute_mode: device
                .compute_mode()
                .ok()
                .map(|m: ComputeMode| format!("{m:?}")),
            mps_client_limit: MPS_CLIENT_LIMIT,
            minor: device.minor_number().ok(),
            ecc_enabled: device.is_ecc_enabled().ok().map(|e| e.currently_enabled),
            // NVML_DEVICE_MIG_ENABLE is 1.
            mig_enabled: device.mig_mode().ok().map(|m| m.current == 1),
        })
    }

    fn task_usage_nvml(&mut self, task: &TaskView<'_>) -> Option<Usage> {
        let count = self.nvml.device_count().ok()?;
        // Only its own GPUs count: a process of the same number on another GPU is not its.
        let own: Vec<&str> = task
            .env
            .get("CUDA_VISIBLE_DEVICES")
            .map(|v| v.split(',').filter(|g| !g.is_empty()).collect())
            .unwrap_or_default();
        let mut memory = 0u64;
        let mut sm: Option<u32> = None;
        let mut newest = self.last_sample_us;
        for index in 0..count {
            let Ok(device) = self.nvml.device_by_index(index) else {
                continue;
            };
            if !own.is_empty() && !device.uuid().is_ok_and(|u| own.contains(&u.as_str())) {
                continue;
            }
            // MPS clients are listed by the MPS query; plain processes by the compute one.
            let mut procs = device.mps_running_compute_processes().unwrap_or_default();
            procs.extend(device.running_compute_processes().unwrap_or_default());
            let mut counted = std::collections::HashSet::new();
            for p in procs
                .iter()
                .filter(|p| task.pids.contains(&p.pid) && counted.insert(p.pid))
            {
                if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                    memory += bytes / (1024 * 1024);
                }
            }
            if let Ok(samples) = device.process_utilization_stats(self.last_sample_us) {
                for s in samples.iter().filter(|s| task.pids.contains(&s.pid)) {
                    sm = Some(sm.unwrap_or(0) + s.sm_util);
                    newest = newest.max(s.timestamp);
                }
            }
        }
        self.last_sample_us = newest;
        Some(Usage {
            gpu_memory: MiB(memory),
            sm_percent: sm.map(|s| s.min(100)),
            memory_errors: 0,
        })
    }
}

/// Made-up GPUs from a spec; for demos and tests, and labelled as such.
#[derive(Debug, Clone)]
pub struct SimulatedProbe {
    count: u32,
    model: String,
    memory: MiB,
    /// Distinguishes the UUIDs of several simulated hosts on one machine.
    host_tag: String,
    /// A file listing GPU indexes (one per line) that have "fallen off the bus": left out
    /// of the inventory, as a real GPU that NVML no longer sees (for drills).
    removed: Option<std::path::PathBuf>,
    /// When each simulated task (by its first process id) was first measured: its cycle
    /// starts there.
    first_seen: std::collections::HashMap<u32, std::time::Instant>,
}

/// The share of its GPU memory budget a simulated task uses at its peak: from this
/// variable in the task's environment, 0.6 when unset. Use varies over a five-minute cycle
/// between 88 % and 100 % of that peak, starting at the peak (as a model's load does), so
/// the first measure already shows it. Above 1 (e.g. `1.3`) the task wants more than its
/// budget: as under MPS, it holds at most the budget and each measure counts an
/// allocation refused at the limit.
pub const SIM_USE_ENV: &str = "TESSERA_SIM_GPU_USE";

/// The GPU memory a simulated task uses at its peak, in MiB; wins over [`SIM_USE_ENV`].
pub const SIM_MIB_ENV: &str = "TESSERA_SIM_GPU_MIB";

/// How many of a simulated task's processes use the GPU (1 when unset, at most 64): each
/// uses what [`SIM_USE_ENV`] or [`SIM_MIB_ENV`] says, held to the budget on its own (MPS's
/// limit is per client process), and the task's use is their sum, as NVML's per-process
/// accounting adds it up.
pub const SIM_PROCESSES_ENV: &str = "TESSERA_SIM_GPU_PROCESSES";

/// Where in its five-minute cycle a simulated task is, `secs` after it was first
/// measured: 0 (its peak) at the start, 1 (its low) half-way.
fn sim_wave(secs: f64) -> f64 {
    0.5 - 0.5 * (secs * std::f64::consts::TAU / 300.0).cos()
}

impl SimulatedProbe {
    /// Parses `COUNTxMODEL-MEMORYGB`, e.g. `8xH100-80GB` or `4xL4-24GB`.
    pub fn parse(spec: &str, host_tag: &str) -> Result<Self, ProbeError> {
        let bad = |why| ProbeError::BadSpec {
            spec: spec.to_owned(),
            why,
        };
        let (count, rest) = spec
            .split_once('x')
            .ok_or_else(|| bad("missing 'x' after the count"))?;
        let count: u32 = count
            .parse()
            .map_err(|_| bad("the count is not a number"))?;
        if count == 0 || count > 16 {
            return Err(bad("the count must be 1 to 16"));
        }
        let (model, memory) = rest
            .rsplit_once('-')
            .ok_or_else(|| bad("missing '-MEMORYGB'"))?;
        let gb: u64 = memory
            .strip_suffix("GB")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| bad("memory must look like 80GB"))?;
        if model.is_empty() || gb == 0 {
            return Err(bad("model and memory must not be empty"));
        }
        Ok(SimulatedProbe {
            count,
            model: format!("{model} {gb}GB (simulated)"),
            memory: MiB(gb * 1024),
            host_tag: host_tag.to_owned(),
            removed: None,
            first_seen: Default::default(),
        })
    }

    /// GPUs listed in `path` (indexes, one per line) are left out of the inventory.
    pub fn with_removal_file(mut self, path: std::path::PathBuf) -> Self {
        self.removed = Some(path);
        self
    }

    fn removed_indexes(&self) -> Vec<u32> {
        self.removed
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }
}

/// The MiB in `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M`.
fn pinned_limit(env: &BTreeMap<String, String>) -> Option<u64> {
    let v = env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")?;
    let (_, amount) = v.split(',').next()?.split_once('=')?;
    if let Some(m) = amount.strip_suffix('M') {
        m.parse().ok()
    } else if let Some(g) = amount.strip_suffix('G') {
        g.parse::<u64>().ok().map(|g| g * 1024)
    } else {
        None
    }
}

impl GpuProbe for SimulatedProbe {
    fn inventory(&mut self) -> Result<Inventory, ProbeError> {
        let removed = self.removed_indexes();
        Ok(Inventory {
            source: "simulated",
            driver_version: None,
            cuda_version: None,
            gpus: (0..self.count)
                .filter(|index| !removed.contains(index))
                .map(|index| GpuStatus {
                    uuid: GpuUuid::new(format!("GPU-SIM-{}-{index}", self.host_tag))
                        .expect("non-empty"),
                    index,
                    model: self.model.clone(),
                    memory_total: self.memory,
                    memory_used: MiB::ZERO,
                    utilization_pct: None,
                    compute_mode: None,
                    mps_client_limit: MPS_CLIENT_LIMIT,
                    healthy: true,
                    minor: None,
                    ecc_enabled: None,
                    mig_enabled: None,
                })
                .collect(),
        })
    }

    fn task_usage(&mut self, task: &TaskView<'_>) -> Option<Usage> {
        let budget = pinned_limit(task.env)?;
        // An amount in MiB wins over a share of the budget: it stays what the task needs
        // when its budget changes (a right-sized revision).
        let share: f64 = match task
            .env
            .get(SIM_MIB_ENV)
            .and_then(|v| v.parse::<f64>().ok())
        {
            Some(mib) => mib / (budget as f64).max(1.0),
            None => task
                .env
                .get(SIM_USE_ENV)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.6),
        };
        let cap: f64 = task
            .env
            .get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            .and_then(|v| v.parse().ok())
            .unwrap_or(100.0);
        // Between 88 % and 100 % of the peak share along the cycle; without processes
        // (tests) at the peak.
        let level = match task.pids.first() {
            None => 1.0,
            Some(&pid) => {
                // Ended tasks' entries go once there are many.
                if self.first_seen.len() > 10_000 {
                    self.first_seen.clear();
                }
                let since = *self
                    .first_seen
                    .entry(pid)
                    .or_insert_with(std::time::Instant::now);
                1.0 - 0.12 * sim_wave(since.elapsed().as_secs_f64())
            }
        };
        let wanted = budget as f64 * share * level;
        let refused = wanted > budget as f64;
        let processes: u64 = task
            .env
            .get(SIM_PROCESSES_ENV)
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
            .clamp(1, 64);
        Some(Usage {
            gpu_memory: MiB(wanted.min(budget as f64).round() as u64 * processes),
            sm_percent: Some((cap * (share * level).min(1.0)).round() as u32),
            memory_errors: u32::from(refused),
        })
    }

    fn simulated(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_that_cannot_be_read_is_unhealthy_and_the_others_carry_on() {
        let gpu = |index: u32| GpuStatus {
            uuid: GpuUuid::new(format!("GPU-{index}")).expect("valid"),
            index,
            model: String::from("NVIDIA H200"),
            memory_total: MiB(143_771),
            memory_used: MiB(0),
            utilization_pct: Some(0),
            compute_mode: None,
            mps_client_limit: MPS_CLIENT_LIMIT,
            healthy: true,
            minor: Some(index),
            ecc_enabled: None,
            mig_enabled: None,
        };
        let lost = || Err(ProbeError::Nvml(NvmlError::GpuLost));
        let mut last_seen = HashMap::new();
        let first = per_gpu(
            vec![(0, Ok(gpu(0))), (1, Ok(gpu(1))), (2, lost())],
            &mut last_seen,
        );
        // Never read: left out (the server marks a GPU it knows but is not told of unhealthy).
        assert_eq!(first.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1]);
        let second = per_gpu(
            vec![(0, Ok(gpu(0))), (1, lost()), (2, lost())],
            &mut last_seen,
        );
        let health: Vec<(u32, bool)> = second.iter().map(|g| (g.index, g.healthy)).collect();
        assert_eq!(health, [(0, true), (1, false)]);
        assert_eq!(second[1].uuid.as_str(), "GPU-1", "as it was last seen");
        let third = per_gpu(vec![(0, Ok(gpu(0))), (1, Ok(gpu(1)))], &mut last_seen);
        assert!(
            third.iter().all(|g| g.healthy),
            "healthy again once it reads"
        );
    }

    #[test]
    fn simulated_spec_gives_that_many_gpus() {
        let inv = SimulatedProbe::parse("8xH100-80GB", "host-1")
            .expect("valid")
            .inventory()
            .expect("simulated never fails");
        assert_eq!(inv.gpus.len(), 8);
        assert_eq!(inv.gpus[7].memory_total, MiB(80 * 1024));
        assert_eq!(inv.gpus[0].model, "H100 80GB (simulated)");
        assert_eq!(inv.gpus[3].uuid.as_str(), "GPU-SIM-host-1-3");
        assert_eq!(inv.reports()[3].memory_mib, MiB(80 * 1024));
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (spec, why) in [
            ("H100", "missing 'x'"),
            ("zxH100-80GB", "count is not a number"),
            ("0xH100-80GB", "1 to 16"),
            ("8xH100", "missing '-MEMORYGB'"),
            ("8xH100-80", "like 80GB"),
        ] {
            let err = SimulatedProbe::parse(spec, "h")
                .expect_err(spec)
                .to_string();
            assert!(err.contains(why), "{spec}: {err}");
        }
    }

    #[test]
    fn simulated_use_follows_the_task_budget_and_its_share() {
        let mut probe = SimulatedProbe::parse("1xL4-24GB", "h").expect("valid");
        let mut env = BTreeMap::from([
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_owned(),
                "0=8192M".to_owned(),
            ),
            (
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_owned(),
                "50".to_owned(),
            ),
        ]);
        let usage = probe
            .task_usage(&TaskView {
                pids: &[],
                env: &env,
            })
            .expect("budgeted");
        assert_eq!(usage.gpu_memory, MiB(4915));
        assert_eq!(usage.sm_percent, Some(30));
        env.insert(SIM_USE_ENV.into(), "1.25".into());
        let over = probe
            .task_usage(&TaskView {
                pids: &[],
                env: &env,
            })
            .expect("budgeted");
        assert_eq!(
            (over.gpu_memory, over.memory_errors),
            (MiB(8192), 1),
            "a task over its budget holds the budget and has an allocation refused"
        );
        env.insert(SIM_MIB_ENV.into(), "2048".into());
        let amount = probe
            .task_usage(&TaskView {
                pids: &[],
                env: &env,
            })
            .expect("budgeted");
        assert_eq!(
            (amount.gpu_memory, amount.sm_percent, amount.memory_errors),
            (MiB(2048), Some(13), 0),
            "an amount in MiB wins over the share"
        );
    }

    #[test]
    fn without_a_driver_nvml_reports_a_clear_error() {
        match NvmlProbe::new() {
            Err(e) => assert!(e.to_string().contains("--simulate"), "{e}"),
            Ok(_) => eprintln!("NVML is present here; see the ignored GPU tests"),
        }
    }

    /// Needs an NVIDIA GPU and driver: `cargo test -p tessera-agent -- --ignored`.
    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn nvml_reports_real_gpus() {
        let mut probe = NvmlProbe::new().expect("NVML");
        let inv = probe.inventory().expect("inventory");
        assert!(!inv.gpus.is_empty());
        for g in &inv.gpus {
            assert!(g.uuid.as_str().starts_with("GPU-"), "{}", g.uuid);
            assert!(g.memory_total.0 > 1024);
            println!("{g:?}");
        }
        println!(
            "driver {:?}, CUDA {:?}",
            inv.driver_version, inv.cuda_version
        );
        let env = BTreeMap::new();
        let pid = std::process::id();
        assert!(
            probe
                .task_usage(&TaskView {
                    pids: &[pid],
                    env: &env
                })
                .is_some()
        );
    }
}
