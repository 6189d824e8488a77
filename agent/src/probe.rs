//! GPU discovery. `NvmlProbe` asks the NVIDIA driver through NVML; `SimulatedProbe` makes
//! up GPUs from a spec such as `8xH100-80GB`, for demos and tests on machines without GPUs.

use nvml_wrapper::Nvml;
use serde::Serialize;
use tessera_model::{GpuHealth, GpuInfo, GpuUuid, MiB, SharingMode};

/// What a probe found on this host.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inventory {
    /// `nvml` or `simulated`.
    pub source: &'static str,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub gpus: Vec<GpuInfo>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(
        "NVML is not available ({0}); is the NVIDIA driver installed? On a machine without GPUs, use --simulate SPEC"
    )]
    NvmlUnavailable(String),
    #[error("NVML call failed: {0}")]
    Nvml(#[from] nvml_wrapper::error::NvmlError),
    #[error(
        "invalid --simulate spec {spec:?}: {why} (expected COUNTxMODEL-MEMORYGB, e.g. 8xH100-80GB)"
    )]
    BadSpec { spec: String, why: &'static str },
}

/// A source of GPU inventory.
pub trait GpuProbe {
    fn inventory(&self) -> Result<Inventory, ProbeError>;
}

/// GPUs as the NVIDIA driver reports them.
pub struct NvmlProbe {
    nvml: Nvml,
}

impl NvmlProbe {
    /// Loads libnvidia-ml; fails with a clear error where there is no driver.
    pub fn new() -> Result<Self, ProbeError> {
        Nvml::init()
            .map(|nvml| NvmlProbe { nvml })
            .map_err(|e| ProbeError::NvmlUnavailable(e.to_string()))
    }
}

/// MPS accepts 48 clients per device on Volta and later.
const MPS_CLIENT_LIMIT: u32 = 48;

impl GpuProbe for NvmlProbe {
    fn inventory(&self) -> Result<Inventory, ProbeError> {
        let count = self.nvml.device_count()?;
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = self.nvml.device_by_index(index)?;
            let memory = device.memory_info()?;
            gpus.push(GpuInfo {
                uuid: GpuUuid::new(device.uuid()?).map_err(|_| ProbeError::BadSpec {
                    spec: "NVML".into(),
                    why: "device returned an empty UUID",
                })?,
                index,
                model: device.name()?,
                memory: MiB(memory.total / (1024 * 1024)),
                mps_client_limit: MPS_CLIENT_LIMIT,
                health: GpuHealth::Healthy,
                sharing_mode: SharingMode::Idle,
            });
        }
        let cuda = self.nvml.sys_cuda_driver_version()?;
        Ok(Inventory {
            source: "nvml",
            driver_version: Some(self.nvml.sys_driver_version()?),
            cuda_version: Some(format!("{}.{}", cuda / 1000, (cuda % 1000) / 10)),
            gpus,
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
        })
    }
}

impl GpuProbe for SimulatedProbe {
    fn inventory(&self) -> Result<Inventory, ProbeError> {
        Ok(Inventory {
            source: "simulated",
            driver_version: None,
            cuda_version: None,
            gpus: (0..self.count)
                .map(|index| GpuInfo {
                    uuid: GpuUuid::new(format!("GPU-SIM-{}-{index}", self.host_tag))
                        .expect("non-empty"),
                    index,
                    model: self.model.clone(),
                    memory: self.memory,
                    mps_client_limit: MPS_CLIENT_LIMIT,
                    health: GpuHealth::Healthy,
                    sharing_mode: SharingMode::Idle,
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_spec_gives_that_many_gpus() {
        let inv = SimulatedProbe::parse("8xH100-80GB", "host-1")
            .expect("valid")
            .inventory()
            .expect("simulated never fails");
        assert_eq!(inv.gpus.len(), 8);
        assert_eq!(inv.gpus[7].memory, MiB(80 * 1024));
        assert_eq!(inv.gpus[0].model, "H100 80GB (simulated)");
        assert_eq!(inv.gpus[3].uuid.as_str(), "GPU-SIM-host-1-3");
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
    fn without_a_driver_nvml_reports_a_clear_error() {
        // On a GPU machine this finds devices instead; both outcomes are checked.
        match NvmlProbe::new() {
            Err(e) => assert!(e.to_string().contains("--simulate"), "{e}"),
            Ok(probe) => assert!(!probe.inventory().expect("NVML inventory").gpus.is_empty()),
        }
    }
}
