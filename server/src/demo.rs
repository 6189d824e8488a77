//! The demo fleet: simulated GPU hosts so a machine without GPUs shows a live console.
//! Every host it adds is marked simulated, in the store and therefore everywhere it shows.

use std::collections::BTreeMap;
use tessera_control::{Store, StoreError};
use tessera_model::{
    GpuHealth, GpuInfo, GpuUuid, HostId, HostInfo, HostStatus, MiB, MilliCpu, PlacementPolicy,
    PoolInfo, PoolName, SharingMode,
};

/// One kind of demo host.
struct DemoHost {
    id: &'static str,
    pool: &'static str,
    model: &'static str,
    gpus: u32,
    gpu_memory: MiB,
    cpu: MilliCpu,
    memory: MiB,
    zone: &'static str,
}

const FLEET: &[DemoHost] = &[
    DemoHost {
        id: "sim-h100-1",
        pool: "training",
        model: "NVIDIA H100 80GB HBM3",
        gpus: 8,
        gpu_memory: MiB(80 * 1024),
        cpu: MilliCpu(192_000),
        memory: MiB(2048 * 1024),
        zone: "a",
    },
    DemoHost {
        id: "sim-h100-2",
        pool: "training",
        model: "NVIDIA H100 80GB HBM3",
        gpus: 8,
        gpu_memory: MiB(80 * 1024),
        cpu: MilliCpu(192_000),
        memory: MiB(2048 * 1024),
        zone: "b",
    },
    DemoHost {
        id: "sim-l4-1",
        pool: "inference",
        model: "NVIDIA L4",
        gpus: 4,
        gpu_memory: MiB(24 * 1024),
        cpu: MilliCpu(48_000),
        memory: MiB(192 * 1024),
        zone: "a",
    },
    DemoHost {
        id: "sim-l4-2",
        pool: "inference",
        model: "NVIDIA L4",
        gpus: 4,
        gpu_memory: MiB(24 * 1024),
        cpu: MilliCpu(48_000),
        memory: MiB(192 * 1024),
        zone: "b",
    },
];

/// Adds (or refreshes) the demo pools and hosts. Safe to run on every start.
pub async fn seed(store: &dyn Store) -> Result<usize, StoreError> {
    for pool in ["training", "inference"] {
        let name = PoolName::new(pool).expect("demo pool names are valid");
        if !store.pool_exists(&name).await? {
            store
                .upsert_pool(&PoolInfo {
                    name,
                    policy: PlacementPolicy::Fragmentation,
                    compute_overcommit: 1.0,
                    mps_client_limit: None,
                })
                .await?;
        }
    }
    for d in FLEET {
        let host = HostInfo {
            id: HostId::new(d.id).expect("demo host ids are valid"),
            pool: PoolName::new(d.pool).expect("demo pool names are valid"),
            status: HostStatus::Active,
            simulated: true,
            cpu: d.cpu,
            memory: d.memory,
            labels: BTreeMap::from([("zone".to_owned(), d.zone.to_owned())]),
            gpus: (0..d.gpus)
                .map(|i| GpuInfo {
                    uuid: GpuUuid::new(format!("GPU-SIM-{}-{i}", d.id)).expect("non-empty"),
                    index: i,
                    model: d.model.to_owned(),
                    memory: d.gpu_memory,
                    mps_client_limit: 48,
                    health: GpuHealth::Healthy,
                    sharing_mode: SharingMode::Idle,
                })
                .collect(),
        };
        store.upsert_host(&host).await?;
    }
    Ok(FLEET.len())
}
