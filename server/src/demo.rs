//! The demo fleet: simulated GPU hosts so a machine without GPUs shows a live console.
//! Each host is a real `tessera-agent` (this crate's `Agent`, in-process) talking HTTP to
//! the server: it registers with the join token, syncs, and runs the sample tasks as real,
//! harmless processes (`sleep`, and `tessera example-server` for the HTTP service
//! `embeddings`, reached on its dynamic ports at 127.0.0.1). Only the GPUs are simulated (their use is derived from
//! each task's budget), and hosts, API and console say so.

use serde_json::json;
#[cfg(feature = "demo")]
use std::collections::BTreeMap;
#[cfg(feature = "demo")]
use std::path::Path;
#[cfg(feature = "demo")]
use tessera_agent::{Agent, AgentConfig, AgentError};
use tessera_control::inputs::{PoolInput, ServiceInput};
#[cfg(feature = "demo")]
use tessera_control::providers::Machines;
use tessera_control::{Control, ControlError};
use tessera_model::PoolName;
use tessera_model::provider::{HostShape, ProviderInput};
#[cfg(feature = "demo")]
use tessera_model::provider::{Provider, ProviderKind};
use tessera_model::service::{DeploymentConfig, ServiceConstraints};
use tessera_model::work::{Alarm, AlarmMetric, Autoscaling, ScaleMetric, Slo};
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

/// The demo pool whose hosts its capacity provider makes and removes (simulated hosts the
/// server starts), as `nightly-batch` comes and goes.
pub const ELASTIC: &str = "elastic";

/// The elastic pool's provider: hosts of 2 × L4, at most 3, an empty one gone after two
/// minutes.
fn elastic_provider() -> ProviderInput {
    ProviderInput {
        kind: "demo".into(),
        min_hosts: Some(0),
        max_hosts: 3,
        target_capacity_percent: Some(100),
        scale_out_cooldown_secs: Some(30),
        scale_in_cooldown_secs: Some(120),
        boot_timeout_secs: Some(60),
        shape: Some(HostShape {
            gpu_model: "L4 24GB (simulated)".into(),
            gpus: 2,
            gpu_memory_mib: 24 * 1024,
            cpu_milli: 32_000,
            memory_mib: 128 * 1024,
        }),
        ..Default::default()
    }
}

/// The GPU memory each sample's tasks use at their peak, in MiB (the agent's simulated
/// probe reads it from the task's environment; right-sized revisions keep it).
const SIM_MIB_ENV: &str = "TESSERA_SIM_GPU_MIB";

/// A sample service: family (and service name), pool, desired count, its container, and
/// the GPU memory its tasks use at their peak (MiB).
struct Sample {
    family: &'static str,
    pool: &'static str,
    count: u32,
    container: serde_json::Value,
    peak_mib: &'static str,
    /// Where its application publishes its work (the task definition's `work`).
    work: Option<serde_json::Value>,
}

/// The work `tessera example-server` publishes.
fn example_work() -> serde_json::Value {
    json!({"port": "http", "completed": "example_requests_total", "errors": "example_errors_total",
           "latency": "example_request_seconds"})
}

/// The sample services, using at their peak 95 % of the budget (near), 35 % (oversized),
/// 120 % (over: allocations refused at the limit) and 70 % (fits). `embeddings` serves
/// HTTP: it runs `tessera example-server` (this binary) on a dynamic port, with an HTTP
/// health check, so its endpoints answer.
fn samples() -> Vec<Sample> {
    let me = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "tessera".into());
    vec![
        Sample {
            family: "embeddings",
            pool: "inference",
            count: 5,
            container: json!({"name": "worker", "command": [me, "example-server"], "cpu_milli": 2000, "memory_mib": 8192,
                   "env": {"EXAMPLE_WORK_MS": "20"}, "gpu": {"mps": {"memory_mib": 6144, "max_compute_percent": 25}},
                   "ports": [{"name": "http", "container_port": 8080}, {"name": "metrics", "container_port": 9090}],
                   "health_check": {"http": {"port": "http", "path": "/health"}, "interval_secs": 10}}),
            peak_mib: "5837",
            work: Some(example_work()),
        },
        // An HTTP service whose load rises and falls: autoscaled on the work it completes.
        Sample {
            family: "summarizer",
            pool: "inference",
            count: 1,
            container: json!({"name": "summarizer", "command": [me, "example-server"], "cpu_milli": 1000, "memory_mib": 4096,
                   "env": {"EXAMPLE_WORK_MS": "30"}, "gpu": {"mps": {"memory_mib": 4096, "max_compute_percent": 20}},
                   "ports": [{"name": "http", "container_port": 8080}],
                   "health_check": {"http": {"port": "http", "path": "/health"}, "interval_secs": 10}}),
            peak_mib: "3500",
            work: Some(example_work()),
        },
        // A heavy neighbour on the simulated GPUs: the embeddings tasks that share a GPU
        // with it work 2.5 times slower, which the interference estimate finds.
        Sample {
            family: "batch-scorer",
            pool: "inference",
            count: 2,
            container: json!({"name": "scorer", "command": [me, "example-server"], "cpu_milli": 1000, "memory_mib": 4096,
                   "env": {"EXAMPLE_GPU_LOAD": "1.5"}, "gpu": {"mps": {"memory_mib": 4096}},
                   "ports": [{"name": "http", "container_port": 8080}]}),
            peak_mib: "3900",
            work: Some(example_work()),
        },
        Sample {
            family: "llm-inference",
            pool: "training",
            count: 4,
            container: json!({"name": "server", "command": ["sleep", "infinity"], "cpu_milli": 4000, "memory_mib": 16384,
                   "env": {"MODEL": "llama-3-8b"}, "gpu": {"mps": {"memory_mib": 20480, "max_compute_percent": 50}}}),
            peak_mib: "7168",
            work: None,
        },
        Sample {
            family: "reranker",
            pool: "inference",
            count: 2,
            container: json!({"name": "ranker", "command": ["sleep", "infinity"], "cpu_milli": 1000, "memory_mib": 4096,
                   "env": {}, "gpu": {"mps": {"memory_mib": 3072, "max_compute_percent": 20}}}),
            peak_mib: "3686",
            work: None,
        },
        Sample {
            family: "vision",
            pool: "training",
            count: 3,
            container: json!({"name": "detector", "command": ["sleep", "infinity"], "cpu_milli": 2000, "memory_mib": 8192,
                   "env": {}, "gpu": {"mps": {"memory_mib": 8192, "max_compute_percent": 30}}}),
            peak_mib: "5734",
            work: None,
        },
        // A revision that crashes seconds after it starts (its model does not load): its
        // tasks are restarted with a growing delay, and the overview names it with its
        // latest failure, whose last lines its task page shows.
        Sample {
            family: "ocr-preview",
            pool: "inference",
            count: 1,
            container: json!({"name": "ocr", "command": ["sh", "-c", "echo 'loading weights from /models/ocr-v3'; sleep 3; echo 'RuntimeError: CUDA error: out of memory (tried to allocate 2.00 GiB)' >&2; exit 1"],
                   "cpu_milli": 500, "memory_mib": 1024, "env": {}, "gpu": {"mps": {"memory_mib": 1024, "max_compute_percent": 10}}}),
            peak_mib: "900",
            work: None,
        },
        // Batch work in the elastic pool: two tasks of 20 GiB (one host of 2 × L4), on for
        // eight minutes of every sixteen (`run_load`), so the pool grows and shrinks.
        Sample {
            family: "nightly-batch",
            pool: ELASTIC,
            count: 2,
            container: json!({"name": "batch", "command": ["sleep", "infinity"], "cpu_milli": 4000, "memory_mib": 16384,
                   "env": {}, "gpu": {"mps": {"memory_mib": 20480, "max_compute_percent": 50}}}),
            peak_mib: "16384",
            work: None,
        },
    ]
}

/// Adds the demo pools and the sample task definitions and services where they are
/// missing. Safe to run on every start. The hosts come from [`run_agents`].
pub async fn seed(control: &Control) -> Result<(), ControlError> {
    let pools = control.views().list_pools().await?;
    for pool in ["training", "inference", ELASTIC] {
        let name = PoolName::new(pool).expect("demo pool names are valid");
        if !pools.iter().any(|p| p.name == name) {
            control
                .deployments()
                .create_pool(&PoolInput {
                    provider: (pool == ELASTIC).then(elastic_provider),
                    ..PoolInput::named(pool)
                })
                .await?;
        }
    }
    if control
        .views()
        .list_task_definition_families()
        .await?
        .is_empty()
    {
        // Sample services whose simulated use differs, so the fit view has something
        // to say from the first minutes: one near its budget, one oversized, one over it
        // (allocations refused at the limit), one that fits.
        for Sample {
            family,
            pool,
            count,
            container,
            peak_mib,
            work,
        } in samples()
        {
            let mut c = container;
            c["env"][SIM_MIB_ENV] = json!(peak_mib);
            let mut def = json!({"family": family, "containers": [c]});
            if let Some(w) = work {
                def["work"] = w;
            }
            control.deployments().register_task_definition(&def).await?;
            let embeddings = family == "embeddings";
            control
                .deployments()
                .create_service(&ServiceInput {
                    name: family.into(),
                    task_definition: format!("{family}:1"),
                    pool: pool.into(),
                    project: None,
                    priority: None,
                    desired_count: count,
                    // One service spreads its tasks over GPUs, as operators do for
                    // isolation: the consolidation page then has GPUs to free.
                    strategy: (family == "llm-inference").then(|| "spread_gpu".to_owned()),
                    constraints: ServiceConstraints::default(),
                    deployment: Some(DeploymentConfig::default()),
                    stop_timeout_secs: 10,
                    deregistration_delay_secs: tessera_model::service::default_deregistration_delay(
                    ),
                    // The HTTP service judged by its own work: a latency target (placement
                    // keeps it away from neighbours measured to break it), an alarm
                    // watched during deployments, and autoscaling on its load.
                    slo: embeddings.then_some(Slo {
                        latency_p99_ms: 40.0,
                        max_error_rate: None,
                    }),
                    alarms: if embeddings {
                        vec![Alarm {
                            metric: AlarmMetric::LatencyP99Ms,
                            above: Some(150.0),
                            below: None,
                            for_secs: 30,
                        }]
                    } else {
                        Vec::new()
                    },
                    bake_secs: if embeddings { 60 } else { 0 },
                    autoscaling: (family == "summarizer").then_some(Autoscaling {
                        min: 1,
                        max: 4,
                        metric: ScaleMetric::CompletedPerTaskPerSec,
                        target: 5.0,
                        scale_out_cooldown_secs: 30,
                        scale_in_cooldown_secs: 120,
                    }),
                })
                .await?;
        }
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
            labels: BTreeMap::from([("zone".to_owned(), d.zone.to_owned())]),
            ..agent_config(
                &Joining {
                    server: server.clone(),
                    ca_cert: ca_cert.clone(),
                    join_token: join_token.clone(),
                    data_dir: data_dir.to_path_buf(),
                },
                d.name,
                d.pool,
                d.gpus,
                (d.cpu, d.memory),
            )
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

/// What a demo agent joins with.
#[cfg(feature = "demo")]
#[derive(Clone)]
pub struct Joining {
    pub server: String,
    pub ca_cert: Option<std::path::PathBuf>,
    pub join_token: String,
    pub data_dir: std::path::PathBuf,
}

/// A demo agent's settings: simulated GPUs `gpus` (e.g. `4xL4-24GB`), its state under
/// `data_dir/demo-agents/<name>`, its tasks stopped when it exits.
#[cfg(feature = "demo")]
fn agent_config(
    j: &Joining,
    name: &str,
    pool: &str,
    gpus: &str,
    (cpu, memory): (MilliCpu, MiB),
) -> AgentConfig {
    AgentConfig {
        server: j.server.clone(),
        ca_cert: j.ca_cert.clone(),
        insecure_http: false,
        join_token: Some(j.join_token.clone()),
        state_dir: j.data_dir.join("demo-agents").join(name),
        pool: PoolName::new(pool).expect("valid"),
        name: name.to_owned(),
        labels: BTreeMap::new(),
        resources: Some((cpu, memory)),
        simulate: Some(gpus.to_owned()),
        mps_control: None,
        max_mps_restarts: 3,
        no_mps: false,
        log_cap: 1024 * 1024,
        stop_tasks_on_exit: true,
        log_retention: std::time::Duration::from_secs(3600),
        // The demo's tasks are `sleep`s, run as the server's own user.
        run_as: None,
        containers: tessera_agent::ContainerRuntime::Process,
        advertise_address: Some("127.0.0.1".into()),
        port_range: (32768, 60999),
        provider_id: None,
    }
}

/// The demo's capacity provider: each machine asked for is a simulated host, a real
/// in-process agent named as the machine (its provider id too), of the pool's shape;
/// terminating one stops its agent (and its tasks) and forgets its state.
#[cfg(feature = "demo")]
pub struct DemoMachines {
    joining: Joining,
    shutdown: watch::Receiver<bool>,
    running: std::sync::Mutex<BTreeMap<String, Running>>,
}

/// A demo machine's agent: how to stop it, and its task.
#[cfg(feature = "demo")]
type Running = (watch::Sender<bool>, tokio::task::JoinHandle<()>);

#[cfg(feature = "demo")]
impl DemoMachines {
    pub fn new(joining: Joining, shutdown: watch::Receiver<bool>) -> DemoMachines {
        DemoMachines {
            joining,
            shutdown,
            running: Default::default(),
        }
    }

    /// Starts the agent of machine `name` in `pool`, of `shape`.
    fn start(&self, pool: &PoolName, name: &str, shape: &HostShape) -> Result<(), String> {
        let gpus = simulate_spec(shape);
        let config = AgentConfig {
            provider_id: Some(name.to_owned()),
            labels: BTreeMap::from([("provider".to_owned(), "demo".to_owned())]),
            ..agent_config(
                &self.joining,
                name,
                pool.as_str(),
                &gpus,
                (shape.cpu(), shape.memory()),
            )
        };
        let agent = Agent::new(config).map_err(|e| e.to_string())?;
        let (stop, mut stopped) = watch::channel(false);
        let mut shutdown = self.shutdown.clone();
        let handle = tokio::spawn(async move {
            let _ = agent
                .run(async move {
                    tokio::select! {
                        _ = stopped.changed() => {}
                        _ = shutdown.changed() => {}
                    }
                })
                .await;
        });
        self.running
            .lock()
            .expect("not poisoned")
            .insert(name.to_owned(), (stop, handle));
        Ok(())
    }

    /// Starts again the agents of the machines the store says are booting or active (a
    /// restarted demo server): each rejoins as the host it was.
    pub async fn resume(&self, control: &Control) -> Result<(), ControlError> {
        let pools = control.views().list_pools().await?;
        for m in control.providers().machines(None, false).await? {
            let shape = pools
                .iter()
                .find(|p| p.name == m.pool)
                .and_then(|p| p.provider.as_ref())
                .filter(|p| p.kind == ProviderKind::Demo)
                .and_then(|p| p.shape.clone());
            if let Some(shape) = shape
                && self
                    .joining
                    .data_dir
                    .join("demo-agents")
                    .join(&m.id)
                    .is_dir()
                && let Err(e) = self.start(&m.pool, &m.id, &shape)
            {
                tracing::warn!(machine = %m.id, error = %e, "a demo machine could not start again");
            }
        }
        Ok(())
    }
}

/// The simulated probe's spec of `shape`'s GPUs: `4xL4-24GB` for 4 × NVIDIA L4 (24 GiB).
#[cfg(feature = "demo")]
fn simulate_spec(shape: &HostShape) -> String {
    let model = shape
        .gpu_model
        .strip_prefix("NVIDIA ")
        .unwrap_or(&shape.gpu_model)
        .split_whitespace()
        .next()
        .unwrap_or("GPU");
    format!("{}x{model}-{}GB", shape.gpus, shape.gpu_memory_mib / 1024)
}

#[cfg(feature = "demo")]
#[async_trait::async_trait]
impl Machines for DemoMachines {
    async fn launch(
        &self,
        pool: &PoolName,
        provider: &Provider,
        names: &[String],
    ) -> Result<BTreeMap<String, String>, String> {
        let shape = provider
            .shape
            .as_ref()
            .ok_or("the demo provider needs provider.shape")?;
        for name in names {
            self.start(pool, name, shape)?;
        }
        Ok(names.iter().map(|n| (n.clone(), n.clone())).collect())
    }

    async fn terminate(
        &self,
        _pool: &PoolName,
        _provider: &Provider,
        name: &str,
        _provider_id: Option<&str>,
    ) -> Result<(), String> {
        let running = self.running.lock().expect("not poisoned").remove(name);
        if let Some((stop, handle)) = running {
            let _ = stop.send(true);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(20), handle).await;
        }
        let dir = self.joining.data_dir.join("demo-agents").join(name);
        if dir.starts_with(self.joining.data_dir.join("demo-agents")) {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }
}

/// One service the demo's load reaches: its endpoints and when they were read, requests
/// sent, and when the next is due (seconds since the load started).
#[cfg(feature = "demo")]
struct Client {
    name: &'static str,
    targets: Vec<String>,
    refreshed: Option<std::time::Instant>,
    sent: u64,
    due: f64,
}

#[cfg(feature = "demo")]
impl Client {
    fn new(name: &'static str) -> Client {
        Client {
            name,
            targets: Vec::new(),
            refreshed: None,
            sent: 0,
            due: 0.0,
        }
    }
}

/// The demo's clients: requests to the healthy endpoints of `embeddings` (20 a second, one
/// in a hundred asking to fail) and of `summarizer` (2 to 18 a second, rising and falling over
/// ten minutes), so their work, latency, the cost of `batch-scorer` as a neighbour and
/// `summarizer`'s autoscaling show in the console; and `nightly-batch` scaled to 2 and 0 in
/// turn, so the elastic pool's provider grows and shrinks it.
#[cfg(feature = "demo")]
pub async fn run_load(control: Control, mut shutdown: watch::Receiver<bool>) {
    let client = match reqwest::Client::builder()
        .no_proxy()
        .timeout(std::time::Duration::from_secs(5))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "the demo's load cannot start");
            return;
        }
    };
    let started = std::time::Instant::now();
    let mut services = [Client::new("embeddings"), Client::new("summarizer")];
    let tick = std::time::Duration::from_millis(10);
    let mut batch_on = true;
    loop {
        let t = started.elapsed().as_secs_f64();
        // `nightly-batch` runs eight minutes of every sixteen: the elastic pool's provider
        // adds a host for it and removes it once it has stood empty.
        let on = ((t / 480.0) as u64).is_multiple_of(2);
        if on != batch_on {
            batch_on = on;
            let patch = tessera_model::api::ServicePatch {
                desired_count: Some(if on { 2 } else { 0 }),
                ..Default::default()
            };
            if let Err(e) = control
                .deployments()
                .update_service("nightly-batch", &patch)
                .await
            {
                tracing::warn!(error = %e, "the demo could not scale nightly-batch");
            }
        }
        for Client {
            name,
            targets,
            refreshed,
            sent,
            due,
        } in services.iter_mut()
        {
            if refreshed.is_none_or(|r| r.elapsed() > std::time::Duration::from_secs(2)) {
                *refreshed = Some(std::time::Instant::now());
                if let Ok(list) = control.views().endpoints(name).await {
                    *targets = list
                        .endpoints
                        .iter()
                        .filter(|e| {
                            e.health == tessera_model::api::EndpointHealth::Healthy
                                && e.port_name.as_deref() == Some("http")
                        })
                        .map(|e| format!("http://{}:{}/", e.address, e.port))
                        .collect();
                }
            }
            let rate = match *name {
                "summarizer" => 10.0 + 8.0 * (std::f64::consts::TAU * t / 600.0).sin(),
                _ => 20.0,
            };
            while *due <= t {
                *due += 1.0 / rate;
                if targets.is_empty() {
                    continue;
                }
                *sent += 1;
                let url = &targets[(*sent as usize) % targets.len()];
                let url = if *name == "embeddings" && sent.is_multiple_of(100) {
                    format!("{url}?fail=1")
                } else {
                    url.clone()
                };
                let client = client.clone();
                tokio::spawn(async move {
                    let _ = client.get(url).send().await;
                });
            }
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

#[cfg(all(test, feature = "demo"))]
mod tests {
    #[test]
    fn the_samples_name_the_variable_the_simulated_probe_reads() {
        assert_eq!(super::SIM_MIB_ENV, tessera_agent::probe::SIM_MIB_ENV);
    }
}
