//! The demo fleet: simulated GPU hosts so a machine without GPUs shows a live console.
//! Each host is a real `tessera-agent` (this crate's `Agent`, in-process) talking HTTP to
//! the server: it registers with the join token, syncs, and runs the sample tasks as real,
//! harmless processes (`sleep`). Only the GPUs are simulated (their use is derived from
//! each task's budget), and hosts, API and console say so.

use serde_json::json;
#[cfg(feature = "demo")]
use std::collections::BTreeMap;
#[cfg(feature = "demo")]
use std::path::Path;
#[cfg(feature = "demo")]
use tessera_agent::{Agent, AgentConfig, AgentError};
use tessera_control::inputs::{PoolInput, ServiceInput};
use tessera_control::{Control, ControlError};
use tessera_model::PoolName;
use tessera_model::service::{DeploymentConfig, ServiceConstraints};
#[cfg(feature = "demo")]
use tessera_model::{MiB, MilliCpu};
#[cfg(feature = "demo")]
use tokio::sync::watch;

/// One demo host: its agent's name, pool, simulated GPUs, size and zone label.
#[cfg(feature = "demo")]
struct DemoHost {
    name: &'static str,
    pool: &'static str,
    gpus: &'static str,
    cpu: MilliCpu,
    memory: MiB,
    zone: &'static str,
}

#[cfg(feature = "demo")]
const FLEET: &[DemoHost] = &[
    DemoHost {
        name: "sim-h100-1",
        pool: "training",
        gpus: "8xH100-80GB",
        cpu: MilliCpu(192_000),
        memory: MiB(2 * 1024 * 1024),
        zone: "a",
    },
    DemoHost {
        name: "sim-h100-2",
        pool: "training",
        gpus: "8xH100-80GB",
        cpu: MilliCpu(192_000),
        memory: MiB(2 * 1024 * 1024),
        zone: "b",
    },
    DemoHost {
        name: "sim-l4-1",
        pool: "inference",
        gpus: "4xL4-24GB",
        cpu: MilliCpu(48_000),
        memory: MiB(192 * 1024),
        zone: "a",
    },
    DemoHost {
        name: "sim-l4-2",
        pool: "inference",
        gpus: "4xL4-24GB",
        cpu: MilliCpu(48_000),
        memory: MiB(192 * 1024),
        zone: "b",
    },
];

/// Adds the demo pools, two sample task definitions and a sample service where they are
/// missing. Safe to run on every start. The hosts come from [`run_agents`].
pub async fn seed(control: &Control) -> Result<(), ControlError> {
    let pools = control.list_pools().await?;
    for pool in ["training", "inference"] {
        let name = PoolName::new(pool).expect("demo pool names are valid");
        if !pools.iter().any(|p| p.name == name) {
            control.create_pool(&PoolInput::named(pool)).await?;
        }
    }
    if control.list_task_definition_families().await?.is_empty() {
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
                stop_timeout_secs: 10,
            })
            .await?;
    }
    Ok(())
}

/// Whether this build has the demo fleet's agents (the `demo` feature, on by default).
pub const AVAILABLE: bool = cfg!(feature = "demo");

/// Runs one agent per demo host against `server` until `shutdown` flips; each keeps its
/// state under `data_dir/demo-agents/<name>` and stops its tasks when it exits.
#[cfg(feature = "demo")]
pub async fn run_agents(
    server: String,
    ca_cert: Option<std::path::PathBuf>,
    join_token: String,
    data_dir: &Path,
    shutdown: watch::Receiver<bool>,
) -> Result<(), AgentError> {
    let mut handles = Vec::new();
    for d in FLEET {
        let agent = Agent::new(AgentConfig {
            server: server.clone(),
            ca_cert: ca_cert.clone(),
            insecure_http: false,
            join_token: Some(join_token.clone()),
            state_dir: data_dir.join("demo-agents").join(d.name),
            pool: PoolName::new(d.pool).expect("valid"),
            name: d.name.to_owned(),
            labels: BTreeMap::from([("zone".to_owned(), d.zone.to_owned())]),
            resources: Some((d.cpu, d.memory)),
            simulate: Some(d.gpus.to_owned()),
            mps_control: None,
            max_mps_restarts: 3,
            log_cap: 1024 * 1024,
            stop_tasks_on_exit: true,
            log_retention: std::time::Duration::from_secs(3600),
            // The demo's tasks are `sleep`s, run as the server's own user.
            run_as: None,
        })?;
        let mut stop = shutdown.clone();
        handles.push(tokio::spawn(agent.run(async move {
            let _ = stop.changed().await;
        })));
    }
    for h in handles {
        match h.await {
            Ok(Err(e)) => tracing::error!(error = %e, "a demo agent failed"),
            Err(e) => tracing::error!(error = %e, "a demo agent panicked"),
            Ok(Ok(())) => {}
        }
    }
    Ok(())
}
