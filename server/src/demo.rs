//! The demo fleet: simulated GPU hosts so a machine without GPUs shows a live console.
//! Hosts join through the same registration path agents use (`Control::admit_host`) and
//! are marked simulated everywhere. Until real agents run them, in-process simulated agents
//! sync each host: they report every task the server wants as running. No process runs and
//! no GPU is touched; that is what "simulated" means here.

use serde_json::json;
use std::collections::BTreeMap;
use std::collections::HashMap;
use tessera_control::inputs::{PoolInput, ServiceInput};
use tessera_control::store::TaskFilter;
use tessera_control::{Control, ControlError};
use tessera_model::agent::{GpuReport, MpsReport, RegisterRequest, SyncRequest, TaskReport};
use tessera_model::service::{DeploymentConfig, ServiceConstraints, TaskState};
use tessera_model::{GpuHealth, GpuUuid, HostId, MiB, MilliCpu, PoolName};
use tokio::sync::watch;

/// One kind of demo host.
struct DemoHost {
    name: &'static str,
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
        name: "sim-h100-1",
        pool: "training",
        model: "NVIDIA H100 80GB HBM3",
        gpus: 8,
        gpu_memory: MiB(80 * 1024),
        cpu: MilliCpu(192_000),
        memory: MiB(2048 * 1024),
        zone: "a",
    },
    DemoHost {
        name: "sim-h100-2",
        pool: "training",
        model: "NVIDIA H100 80GB HBM3",
        gpus: 8,
        gpu_memory: MiB(80 * 1024),
        cpu: MilliCpu(192_000),
        memory: MiB(2048 * 1024),
        zone: "b",
    },
    DemoHost {
        name: "sim-l4-1",
        pool: "inference",
        model: "NVIDIA L4",
        gpus: 4,
        gpu_memory: MiB(24 * 1024),
        cpu: MilliCpu(48_000),
        memory: MiB(192 * 1024),
        zone: "a",
    },
    DemoHost {
        name: "sim-l4-2",
        pool: "inference",
        model: "NVIDIA L4",
        gpus: 4,
        gpu_memory: MiB(24 * 1024),
        cpu: MilliCpu(48_000),
        memory: MiB(192 * 1024),
        zone: "b",
    },
];

fn gpu_reports(d: &DemoHost) -> Vec<GpuReport> {
    (0..d.gpus)
        .map(|i| GpuReport {
            uuid: GpuUuid::new(format!("GPU-SIM-{}-{i}", d.name)).expect("non-empty"),
            index: i,
            model: d.model.to_owned(),
            memory_mib: d.gpu_memory,
            mps_client_limit: 48,
            healthy: true,
        })
        .collect()
}

/// Adds the demo pools, hosts, two sample task definitions and a sample service, where
/// they are missing. Safe to run on every start.
pub async fn seed(control: &Control) -> Result<usize, ControlError> {
    let store = control.store();
    for pool in ["training", "inference"] {
        let name = PoolName::new(pool).expect("demo pool names are valid");
        if !store.pool_exists(&name).await? {
            control
                .create_pool(&PoolInput {
                    name: pool.to_owned(),
                    policy: None,
                    compute_overcommit: None,
                    mps_client_limit: None,
                })
                .await?;
        }
    }
    let existing = store.list_hosts().await?;
    for d in FLEET {
        if existing.iter().any(|h| h.id.as_str() == d.name) {
            continue;
        }
        control
            .admit_host(&RegisterRequest {
                join_token: String::new(),
                pool: PoolName::new(d.pool).expect("valid"),
                cpu_milli: d.cpu,
                memory_mib: d.memory,
                simulated: true,
                labels: BTreeMap::from([("zone".to_owned(), d.zone.to_owned())]),
                gpus: gpu_reports(d),
                name: Some(d.name.to_owned()),
            })
            .await?;
    }
    if store.list_task_definition_families().await?.is_empty() {
        control
            .register_task_definition(&json!({
                "family": "llm-inference",
                "containers": [{
                    "name": "server", "command": ["sleep", "infinity"], "cpu_milli": 4000, "memory_mib": 16384,
                    "env": {"MODEL": "llama-3-8b"},
                    "gpu": {"mps": {"memory_mib": 20480, "max_compute_percent": 50}}
                }]
            }))
            .await?;
        control
            .register_task_definition(&json!({
                "family": "embeddings",
                "containers": [{
                    "name": "worker", "command": ["sleep", "infinity"], "cpu_milli": 2000, "memory_mib": 8192,
                    "gpu": {"mps": {"memory_mib": 6144, "max_compute_percent": 25}}
                }]
            }))
            .await?;
        control
            .create_service(&ServiceInput {
                name: "embeddings".into(),
                task_definition: "embeddings:1".into(),
                pool: "inference".into(),
                desired_count: 5,
                strategy: None,
                constraints: ServiceConstraints::default(),
                deployment: Some(DeploymentConfig::default()),
                stop_timeout_secs: 30,
            })
            .await?;
    }
    Ok(FLEET.len())
}

/// Syncs every demo host on the sync interval until `shutdown` flips, reporting each task
/// the server wants on it as running (simulated: nothing is started).
pub async fn run_simulated_agents(control: Control, mut shutdown: watch::Receiver<bool>) {
    let interval = control.config().sync_interval;
    let gpus: HashMap<&str, Vec<GpuReport>> =
        FLEET.iter().map(|d| (d.name, gpu_reports(d))).collect();
    loop {
        for d in FLEET {
            let id = HostId::new(d.name).expect("valid");
            if let Err(e) = sync_once(&control, &id, &gpus[d.name]).await {
                tracing::warn!(host = d.name, error = %e, "simulated agent sync failed");
            }
        }
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

async fn sync_once(control: &Control, id: &HostId, gpus: &[GpuReport]) -> Result<(), ControlError> {
    let host = control.store().get_host(id).await?;
    let wanted = control
        .store()
        .list_tasks(&TaskFilter {
            host: Some(id.clone()),
            states: vec![TaskState::Assigned, TaskState::Running],
            ..Default::default()
        })
        .await?;
    let reports = wanted
        .iter()
        .map(|t| TaskReport {
            task_id: t.id.clone(),
            running: true,
            exit_code: None,
            // A simulated task uses 80 % of its GPU memory budget.
            gpu_memory_peak_mib: t
                .allocations
                .first()
                .filter(|a| !a.dedicated)
                .map(|a| MiB(a.memory.0 * 8 / 10)),
            sm_percent: None,
        })
        .collect();
    let gpus = gpus
        .iter()
        .map(|g| GpuReport {
            healthy: host
                .gpus
                .iter()
                .find(|h| h.uuid == g.uuid)
                .is_none_or(|h| h.health == GpuHealth::Healthy),
            ..g.clone()
        })
        .collect();
    control
        .sync_agent(
            id,
            &SyncRequest {
                gpus,
                mps: MpsReport {
                    healthy: true,
                    reason: None,
                },
                tasks: reports,
            },
        )
        .await?;
    Ok(())
}
