//! `console-bench`: server-side rendering time of console pages on a large fleet.
//!
//! ```text
//! console-bench [--hosts 1000] [--gpus-per-host 8] [--tasks 10000] [--requests 20]
//!               [--syncs-between 100]
//! ```
//!
//! Builds the fleet in an SQLite file (hosts through the admission path, one service's
//! tasks placed by the real reconcile pass, then one sync per host reporting each task
//! running with its measured GPU memory and SM use). Then times the fleet read model's
//! first reading (once per server start; with how much resident memory the model takes),
//! the baseline (`/metrics` as written before the model: every host, GPU and task read
//! from the store per scrape) and requests through the router: the hosts page (first and
//! a later page, one filter), the overview, `/metrics`, a service's endpoint list,
//! Prometheus discovery and the JSON host list of the REST API. Requests carry a viewer's
//! API token, so the authentication layer's cost is part of every figure. Before each
//! request `--syncs-between` hosts (100) sync, not timed: their tasks' SM use moved, and
//! the first reports a change the model marks, so every reading has changes to read, as
//! on a live fleet. Last, the model's periodic reading of every placed task's measured
//! figures (which no change mark follows) is timed on its own. For each row: the first request's time, the
//! mean, p50 and p99, the body's size, and the process's peak resident memory over what
//! it held before the row (`+peak MiB`).

use axum::body::Body;
use axum::http::Request;
use metrics::gauge;
use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::json;
use std::time::Instant;
use tessera_control::bench::{
    admit_simulated_hosts, api_token, arg, create_service, memory_mib, register_task_definition,
    reset_peak_memory, simulated_gpus,
};
use tessera_control::inputs::PoolInput;
use tessera_control::store::TaskFilter;
use tessera_control::{Control, ControlConfig};
use tessera_model::agent::{MpsReport, SyncRequest, TaskReport};
use tessera_model::auth::Role;
use tessera_model::service::TaskState;
use tessera_model::{HostId, MiB, PoolName};
use tessera_server::{AppState, app};
use tower::ServiceExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let hosts = arg("--hosts", 1000);
    let per_host = arg("--gpus-per-host", 8);
    let tasks = arg("--tasks", 10_000);
    let requests = arg("--requests", 20);
    let syncs_between = arg("--syncs-between", 100);
    let dir = std::env::temp_dir().join(format!("tessera-console-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = tessera_control::open(&format!("sqlite://{}/bench.db", dir.display())).await?;
    let control = Control::new(store.clone(), ControlConfig::default());
    for pool in ["a", "b"] {
        control
            .deployments()
            .create_pool(&PoolInput::named(pool))
            .await?;
    }
    let pools = [PoolName::new("a")?, PoolName::new("b")?];
    let admitted =
        admit_simulated_hosts(&control, hosts, per_host, |h| pools[h % 2].clone()).await?;
    register_task_definition(&control).await?;
    for pool in ["a", "b"] {
        create_service(&control, &format!("svc-{pool}"), pool, tasks / 2).await?;
    }
    control.reconcile_once().await?;
    let mut syncs = measured_use(&control, &admitted, per_host).await?;
    for (host, request) in &syncs {
        control.agents().sync_agent(host, request).await?;
    }
    control.agents().flush_heartbeats().await?;
    let token = api_token(&control, Role::Viewer).await?;
    println!(
        "console-bench: {hosts} hosts × {per_host} GPUs = {} GPUs, {tasks} tasks placed; {requests} requests each",
        hosts * per_host
    );

    // The fleet read model's first reading, once per server start.
    let (resident_before, _) = memory_mib();
    let start = Instant::now();
    control.views().fleet().await?;
    let first_reading_ms = start.elapsed().as_secs_f64() * 1000.0;
    let model_mib = memory_mib().0 - resident_before;
    println!(
        "fleet read model, first reading: {first_reading_ms:.1} ms, {model_mib:.1} MiB more resident"
    );
    println!(
        "{:<38} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}",
        "request", "first ms", "mean ms", "p50 ms", "p99 ms", "bytes", "+peak MiB"
    );
    let state = AppState::new(control.clone(), "127.0.0.1:0".parse()?);
    let mut rows = Vec::new();
    let uris = [
        "/hosts",
        "/hosts?page=20",
        "/hosts?pool=b&page=3",
        "/",
        "/metrics",
        "/api/v1/services/svc-a/endpoints",
        "/api/v1/discovery/prometheus",
        "/api/v1/hosts",
    ];
    let mut changes = 0u32;
    for uri in std::iter::once(BASELINE).chain(uris) {
        let (resident, _) = memory_mib();
        reset_peak_memory();
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..requests {
            changes += 1;
            live_fleet(&control, &mut syncs, changes, syncs_between).await?;
            let start = Instant::now();
            bytes = if uri == BASELINE {
                baseline_metrics(&control).await?.len()
            } else {
                let resp = app(state.clone())
                    .oneshot(
                        Request::get(uri)
                            .header("host", "127.0.0.1")
                            .header("authorization", format!("Bearer {token}"))
                            .body(Body::empty())?,
                    )
                    .await?;
                assert!(resp.status().is_success(), "{uri}: {}", resp.status());
                axum::body::to_bytes(resp.into_body(), usize::MAX)
                    .await?
                    .len()
            };
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        let first = times[0];
        times.sort_by(|a, b| a.total_cmp(b));
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let p50 = times[times.len() / 2];
        let p99 = times[(times.len() * 99).div_ceil(100) - 1];
        let grew = memory_mib().1 - resident;
        println!(
            "{uri:<38} {first:>9.1} {mean:>9.1} {p50:>9.1} {p99:>9.1} {bytes:>11} {grew:>9.1}"
        );
        rows.push(
            json!({"uri": uri, "first_ms": first, "mean_ms": mean, "p50_ms": p50,
            "p99_ms": p99, "bytes": bytes, "peak_growth_mib": grew}),
        );
    }
    // The measured figures' own reading (every task's peak and SM use, which no change
    // mark follows): the server's loop does it every `fleet_measured_every` (10 s), off
    // the requests; timed here on a model of its own that does it on every reading.
    let periodic = Control::new(
        store,
        ControlConfig {
            fleet_measured_every: std::time::Duration::ZERO,
            ..ControlConfig::default()
        },
    );
    periodic.views().fleet().await?;
    let mut measured_ms = Vec::new();
    for _ in 0..3 {
        changes += 1;
        live_fleet(&control, &mut syncs, changes, syncs_between).await?;
        let start = Instant::now();
        periodic.views().fleet().await?;
        measured_ms.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "fleet read model, a reading with every placed task's measured figures (every 10 s, in the server's loop): {}",
        measured_ms
            .iter()
            .map(|ms| format!("{ms:.1} ms"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "{}",
        json!({ "hosts": hosts, "gpus": hosts * per_host, "tasks": tasks,
            "syncs_between": syncs_between,
            "fleet_model": {"first_reading_ms": first_reading_ms, "resident_mib": model_mib,
                "measured_reading_ms": measured_ms},
            "results": rows })
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Between two requests, `between` hosts sync (their tasks' SM use moved, as it does
/// from one sync to the next), and the first of them reports a changed number of free
/// ports (a change the model marks): every reading of the model has something to read.
async fn live_fleet(
    control: &Control,
    syncs: &mut [(HostId, SyncRequest)],
    round: u32,
    between: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let n = syncs.len();
    for i in 0..between.min(n) {
        let (host, request) = &mut syncs[(round as usize * between + i) % n];
        for t in &mut request.tasks {
            t.sm_percent = Some(10 + round % 50);
        }
        request.dynamic_ports_free = (i == 0).then_some(1000 + round);
        control.agents().sync_agent(host, request).await?;
    }
    control.agents().flush_heartbeats().await?;
    Ok(())
}

/// The row of the baseline: `/metrics` as it was written before the fleet read model.
const BASELINE: &str = "baseline: /metrics from the store";

/// `/metrics` as it was written before the fleet read model, for comparison: every host,
/// GPU and task read from the store on each scrape and set as gauges of a registry, then
/// rendered at once.
async fn baseline_metrics(control: &Control) -> Result<String, Box<dyn std::error::Error>> {
    let hosts = control.views().list_hosts().await?;
    let views = control.views().host_views(hosts.clone()).await?;
    let placed = placed_tasks(control).await?;
    // What the projects' figures read: every task holding capacity or waiting.
    let projects_read = control
        .views()
        .list_tasks(&TaskFilter {
            states: [TaskState::HOLDING.as_slice(), &[TaskState::Pending]].concat(),
            ..Default::default()
        })
        .await?;
    let pending = control
        .views()
        .list_tasks(&TaskFilter {
            states: vec![TaskState::Pending],
            without_allocations: true,
            ..Default::default()
        })
        .await?;
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        for h in &hosts {
            gauge!("tessera_hosts", "status" => h.status.as_str()).increment(1.0);
        }
        for view in &views {
            let host = view.host.id.to_string();
            for g in &view.gpus {
                let labels = [
                    ("host", host.clone()),
                    ("gpu", g.gpu.uuid.to_string()),
                    ("index", g.gpu.index.to_string()),
                    ("model", g.gpu.model.clone()),
                ];
                gauge!("tessera_gpu_memory_total_mib", &labels).set(g.gpu.memory.0 as f64);
                gauge!("tessera_gpu_memory_reserved_mib", &labels).set(g.memory_allocated.0 as f64);
                gauge!("tessera_gpu_memory_used_mib", &labels)
                    .set(g.measured().map_or(0.0, |m| m.0 as f64));
                gauge!("tessera_gpu_compute_reserved_ratio", &labels)
                    .set(f64::from(g.compute_allocated.0) / 1000.0);
            }
        }
        for t in &placed {
            let labels = [
                ("task", t.id.clone()),
                ("service", t.service.clone()),
                (
                    "host",
                    t.host.as_ref().map(|h| h.to_string()).unwrap_or_default(),
                ),
            ];
            if let Some(peak) = t.measured.gpu_memory_peak {
                gauge!("tessera_task_gpu_memory_peak_mib", &labels).set(peak.0 as f64);
            }
            if let Some(sm) = t.measured.sm_percent {
                gauge!("tessera_task_sm_percent", &labels).set(f64::from(sm));
            }
        }
        gauge!("tessera_tasks_pending").set(pending.len() as f64);
        gauge!("tessera_project_tasks").set(projects_read.len() as f64);
    });
    Ok(handle.render())
}

/// Every task assigned or running, without its allocations.
async fn placed_tasks(
    control: &Control,
) -> Result<Vec<tessera_model::service::Task>, Box<dyn std::error::Error>> {
    Ok(control
        .views()
        .list_tasks(&TaskFilter {
            states: vec![TaskState::Assigned, TaskState::Running],
            without_allocations: true,
            ..Default::default()
        })
        .await?)
}

/// One sync per host, as its agent would send it: every task placed there running, with a
/// measured GPU memory peak and SM use, so the per-task figures exist as on a real fleet.
async fn measured_use(
    control: &Control,
    admitted: &[tessera_model::agent::RegisterResponse],
    per_host: usize,
) -> Result<Vec<(HostId, SyncRequest)>, Box<dyn std::error::Error>> {
    let placed = placed_tasks(control).await?;
    let mut by_host: std::collections::HashMap<HostId, Vec<TaskReport>> = Default::default();
    for t in placed {
        if let Some(h) = t.host {
            by_host.entry(h).or_default().push(TaskReport {
                task_id: t.id,
                running: true,
                gpu_memory_peak_mib: Some(MiB(4096)),
                sm_percent: Some(10),
                ..Default::default()
            });
        }
    }
    Ok(admitted
        .iter()
        .enumerate()
        .map(|(h, r)| {
            let request = SyncRequest {
                address: None,
                dynamic_ports_free: None,
                capabilities: None,
                gpus: simulated_gpus(h, per_host),
                mps: MpsReport {
                    healthy: true,
                    reason: None,
                    restarts: None,
                },
                tasks: by_host.remove(&r.host_id).unwrap_or_default(),
                agent_version: None,
            };
            (r.host_id.clone(), request)
        })
        .collect())
}
