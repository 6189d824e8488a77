//! `scale-bench`: how fast the control plane places and commits tasks, and how much memory
//! it holds, when one service on a large simulated fleet is scaled from 0 to many tasks.
//!
//! ```text
//! scale-bench [--hosts 1000] [--gpus-per-host 8] [--tasks 10000] [--postgres URL]
//! ```
//!
//! Hosts join through the same registration path as agents; the service's tasks are
//! created, placed by the fragmentation-aware engine and committed by the real reconcile
//! pass on an SQLite file and, given `--postgres` (a server whose user may create
//! databases), on a fresh PostgreSQL database too, printed side by side. The baseline in
//! the same run is the placement engine alone on the same fleet (no store), which bounds
//! what the store path could reach.

use serde_json::json;
use std::time::Instant;
use tessera_control::bench::{
    admit_simulated_hosts, arg, arg_text, create_service, fresh_postgres_database, memory_mib,
    register_task_definition,
};
use tessera_control::inputs::{PoolInput, ServicePatch};
use tessera_control::store::TaskFilter;
use tessera_control::{Control, ControlConfig};
use tessera_model::service::TaskState;
use tessera_model::{GpuUuid, MiB, MilliCpu, PoolName};

/// What one scale-up on one store measured.
struct Run {
    store: &'static str,
    registered: f64,
    placed: usize,
    seconds: f64,
    passes: usize,
    rss_before: f64,
    rss_after: f64,
}

/// Admits the fleet and scales the service from 0 to `tasks` on the store at `url`.
async fn scale_up(
    store: &'static str,
    url: &str,
    hosts: usize,
    per_host: usize,
    tasks: usize,
) -> Result<Run, Box<dyn std::error::Error>> {
    let control = Control::new(tessera_control::open(url).await?, ControlConfig::default());
    control
        .deployments()
        .create_pool(&PoolInput::named("bench"))
        .await?;
    let started = Instant::now();
    let bench_pool = PoolName::new("bench")?;
    admit_simulated_hosts(&control, hosts, per_host, |_| bench_pool.clone()).await?;
    let registered = started.elapsed().as_secs_f64();
    register_task_definition(&control).await?;
    create_service(&control, "bench", "bench", 0).await?;
    control.reconcile_once().await?;
    let (rss_before, _) = memory_mib();

    let start = Instant::now();
    control
        .deployments()
        .update_service(
            "bench",
            &ServicePatch {
                desired_count: Some(tasks as u32),
                task_definition: None,
                ..Default::default()
            },
        )
        .await?;
    let mut passes = 0;
    let placed = loop {
        control.reconcile_once().await?;
        passes += 1;
        let placed = control
            .views()
            .count_tasks(&TaskFilter {
                service: Some("bench".into()),
                states: vec![TaskState::Assigned],
                ..Default::default()
            })
            .await? as usize;
        if placed >= tasks || passes >= 20 {
            break placed;
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    let (rss_after, _) = memory_mib();
    Ok(Run {
        store,
        registered,
        placed,
        seconds,
        passes,
        rss_before,
        rss_after,
    })
}

/// Tasks placed per second by the placement engine alone (no store) on the same fleet.
fn engine_alone(hosts: usize, per_host: usize, tasks: usize) -> f64 {
    use tessera_placement::{
        DemandProfile, Engine, GpuSpec, HostSpec, Policy, PoolLimits, Snapshot, TaskRequest,
    };
    let specs: Vec<HostSpec> = (0..hosts)
        .map(|h| HostSpec {
            id: tessera_model::HostId::new(format!("sim-{h}")).expect("valid"),
            cpu: MilliCpu(192_000),
            memory: MiB(2 * 1024 * 1024),
            labels: Default::default(),
            active: true,
            gpus: (0..per_host)
                .map(|i| GpuSpec {
                    uuid: GpuUuid::new(format!("GPU-SIM-{h}-{i}")).expect("valid"),
                    model: "H100".into(),
                    memory: MiB(80 * 1024),
                    mps_client_limit: 48,
                    healthy: true,
                })
                .collect(),
        })
        .collect();
    let req = TaskRequest::shared(
        MilliCpu(2000),
        MiB(8192),
        MiB(10240),
        Some(tessera_model::ComputeMilli(120)),
    );
    let mut engine = Engine::new(
        Snapshot::new(specs, PoolLimits::default()),
        Policy::Fragmentation,
        &DemandProfile::from_requests([&req]),
        1,
    );
    let t = Instant::now();
    let out = engine.place_batch(&vec![req; tasks]);
    out.placed() as f64 / t.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let hosts = arg("--hosts", 1000);
    let per_host = arg("--gpus-per-host", 8);
    let tasks = arg("--tasks", 10_000);
    let dir = std::env::temp_dir().join(format!("tessera-scale-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut runs = vec![
        scale_up(
            "SQLite file",
            &format!("sqlite://{}/bench.db", dir.display()),
            hosts,
            per_host,
            tasks,
        )
        .await?,
    ];
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(server) = arg_text("--postgres") {
        let url = fresh_postgres_database(&server, "tessera_scale_bench").await?;
        runs.push(scale_up("PostgreSQL", &url, hosts, per_host, tasks).await?);
    }
    let (_, peak) = memory_mib();

    // Baseline: the engine alone on the same fleet.
    let engine_rate = engine_alone(hosts, per_host, tasks);

    println!(
        "scale-bench: {hosts} hosts × {per_host} GPUs = {} GPUs, 0 → {tasks} tasks",
        hosts * per_host
    );
    for r in &runs {
        println!(
            "  {:<12} {} tasks created, placed and committed in {:.2} s over {} reconcile pass(es) = {:.0} tasks/s \
             (hosts registered in {:.2} s; {:.0} → {:.0} MiB resident)",
            r.store,
            r.placed,
            r.seconds,
            r.passes,
            r.placed as f64 / r.seconds,
            r.registered,
            r.rss_before,
            r.rss_after
        );
    }
    println!(
        "  {:<12} {engine_rate:.0} tasks/s (placement engine alone, no store)",
        "baseline"
    );
    println!("  peak resident memory of the whole run: {peak:.0} MiB");
    let stores: Vec<_> = runs
        .iter()
        .map(|r| {
            json!({"store": r.store, "tasks": r.placed, "seconds": r.seconds,
                   "tasks_per_sec": r.placed as f64 / r.seconds, "passes": r.passes,
                   "register_seconds": r.registered,
                   "rss_mib_before": r.rss_before, "rss_mib_after": r.rss_after})
        })
        .collect();
    println!(
        "{}",
        json!({"hosts": hosts, "gpus": hosts * per_host, "stores": stores,
               "engine_only_tasks_per_sec": engine_rate, "peak_rss_mib": peak})
    );
    Ok(())
}
