//! Helpers shared by the server's test binaries.

use tessera_control::Control;
use tessera_model::agent::{GpuReport, RegisterRequest};
use tessera_model::{GpuUuid, MiB, MilliCpu, PoolName};

/// The demo's four simulated hosts: (name, pool, GPU model, GPUs, GiB per GPU).
pub const DEMO_HOSTS: [(&str, &str, &str, u32, u64); 4] = [
    ("sim-h100-1", "training", "NVIDIA H100 80GB HBM3", 8, 80),
    ("sim-h100-2", "training", "NVIDIA H100 80GB HBM3", 8, 80),
    ("sim-l4-1", "inference", "NVIDIA L4", 4, 24),
    ("sim-l4-2", "inference", "NVIDIA L4", 4, 24),
];

/// Registers simulated hosts through the agent registration path with `join_token`.
pub async fn register_hosts(
    control: &Control,
    join_token: &str,
    hosts: &[(&str, &str, &str, u32, u64)],
) {
    for &(name, pool, model, count, gib) in hosts {
        control
            .register_agent(&RegisterRequest {
                join_token: join_token.into(),
                pool: PoolName::new(pool).expect("valid"),
                cpu_milli: MilliCpu(64_000),
                memory_mib: MiB(256 * 1024),
                simulated: true,
                labels: Default::default(),
                gpus: (0..count)
                    .map(|i| GpuReport {
                        uuid: GpuUuid::new(format!("GPU-{name}-{i}")).expect("valid"),
                        index: i,
                        model: model.into(),
                        memory_mib: MiB(gib * 1024),
                        mps_client_limit: 48,
                        healthy: true,
                    })
                    .collect(),
                name: Some(name.into()),
            })
            .await
            .expect("register");
    }
}
