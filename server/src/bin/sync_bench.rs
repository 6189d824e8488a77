//! `sync-bench`: how long an agent's sync takes when a large fleet syncs at its normal
//! pace, through the real router (agent-token authentication included) and store, with the
//! reconcile loop running, and whether any host is wrongly declared lost.
//!
//! ```text
//! sync-bench [--hosts 10000] [--gpus-per-host 8] [--tasks 20000] [--interval 5] [--seconds 30]
//!            [--no-reconcile 1] [--full-passes 1] [--compare-reconcile 1]
//!            [--postgres URL] [--servers 1] [--work 1] [--compare-work 1]
//! ```
//!
//! The reconcile loop's passes look only at the services that changed, with a full pass
//! every two minutes; `--full-passes 1` makes every pass full (as before passes were
//! incremental), `--no-reconcile 1` runs no loop at all. `--compare-reconcile 1` runs the
//! same fleet four ways, twice in turn (no loop; the loop's writes of heartbeats and usage
//! without passes; incremental passes; full passes) and prints the sync latencies and the
//! cost of one pass of each kind side by side.
//!
//! `--work 1` adds to every task's report what its application completed (as agents
//! scrape it); `--compare-work 1` runs the same fleet twice, without and with it, and
//! prints the two side by side.
//!
//! Every host syncs once per interval, spread evenly over it (10,000 hosts every 5 s is
//! 2,000 syncs/s), reporting its GPUs and the tasks placed on it as running. Printed: the
//! rate reached, p50/p99/max sync latency, and hosts lost (should be 0).
//!
//! On an SQLite file, or with `--postgres` (a server whose user may create databases) on a
//! fresh PostgreSQL database; `--servers N` runs N control planes on that database, each
//! with its own connections, router and loop (one of them schedules), and spreads the
//! hosts over them (host h syncs with server h mod N).

use axum::body::Body;
use axum::http::Request;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_control::bench::{
    admit_simulated_hosts, analyze, arg, arg_text, create_service, fresh_postgres_database,
    register_task_definition, simulated_gpus,
};
use tessera_control::inputs::PoolInput;
use tessera_control::store::TaskFilter;
use tessera_control::{Control, ControlConfig};
use tessera_model::HostStatus;
use tessera_model::agent::{MpsReport, SyncRequest, TaskReport};
use tessera_model::service::TaskState;
use tessera_model::{HostId, PoolName};
use tessera_server::{AppState, app};
use tower::ServiceExt;

/// An agent's sync through the router, with its token.
fn sync_request(token: &str, body: &str) -> Request<Body> {
    Request::post("/agent/v1/sync")
        .header("host", "127.0.0.1:3000")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .expect("request")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// What one run measured: sync latency p50 and p99 (ms), hosts wrongly lost, and one
/// full and one incremental pass over the settled fleet (ms).
struct Outcome {
    p50_ms: f64,
    p99_ms: f64,
    lost: usize,
    full_pass_ms: f64,
    changed_pass_ms: f64,
}

/// What runs beside the syncs.
#[derive(Clone, Copy, PartialEq)]
enum Loop {
    /// No reconcile loop: the sync path alone.
    Off,
    /// The loop's writes without its passes: every tick writes the quiet syncs' times and
    /// the usage buckets that closed, as every server does, and runs no pass.
    Writes,
    /// Passes that look at what changed, a full one every two minutes (the default).
    Incremental,
    /// Every pass looks at every service.
    Full,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `RUST_LOG=tessera_control=debug` shows each pass's phases.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    // `--compare-work 1`: the same fleet in one run, its tasks' reports without and with
    // the work their applications completed (what agents scrape), side by side.
    if arg("--compare-reconcile", 0) != 0 {
        return compare_reconcile().await;
    }
    if arg("--compare-work", 0) == 0 {
        let mode = if arg("--no-reconcile", 0) != 0 {
            Loop::Off
        } else if arg("--full-passes", 0) != 0 {
            Loop::Full
        } else {
            Loop::Incremental
        };
        run(arg("--work", 0) != 0, "", mode).await?;
        return Ok(());
    }
    // Each run on its own database, twice in turn (without, with, without, with), and
    // each figure the better of its two: the order of runs in one process and the
    // machine's noise weigh on both sides alike.
    let mut without = Vec::new();
    let mut with = Vec::new();
    for round in 0..2 {
        without.push(run(false, &format!("_{round}"), Loop::Incremental).await?);
        with.push(run(true, &format!("_work_{round}"), Loop::Incremental).await?);
    }
    let best = |v: Vec<Outcome>| {
        v.into_iter()
            .min_by(|a, b| a.p99_ms.total_cmp(&b.p99_ms))
            .expect("two runs")
    };
    let (without, with) = (best(without), best(with));
    println!("sync-bench, work metrics in every task's report, side by side:");
    println!(
        "  {:<34} {:>10} {:>10} {:>11}",
        "", "p50 ms", "p99 ms", "hosts lost"
    );
    for (what, o) in [
        ("without work (today's reports)", &without),
        ("with work", &with),
    ] {
        println!(
            "  {what:<34} {:>10.1} {:>10.1} {:>11}",
            o.p50_ms, o.p99_ms, o.lost
        );
    }
    println!(
        "  p99 with work / without: {:.2} (target: at most 1.20)",
        with.p99_ms / without.p99_ms.max(1e-9)
    );
    Ok(())
}

/// The same fleet with no reconcile loop, with incremental passes and with full passes,
/// each on its own database, side by side.
async fn compare_reconcile() -> Result<(), Box<dyn std::error::Error>> {
    // Twice in turn, each figure the better of its two (as `--compare-work`): the
    // machine's noise weighs on every mode alike.
    let mut runs: [Vec<Outcome>; 4] = Default::default();
    for round in 0..2 {
        for (i, mode) in [Loop::Off, Loop::Writes, Loop::Incremental, Loop::Full]
            .into_iter()
            .enumerate()
        {
            runs[i].push(run(false, &format!("_{i}_{round}"), mode).await?);
        }
    }
    let [off, writes, incremental, full] = runs.map(|v| {
        v.into_iter()
            .min_by(|a, b| a.p99_ms.total_cmp(&b.p99_ms))
            .expect("two runs")
    });
    let (off, writes, incremental, full) = (&off, &writes, &incremental, &full);
    println!("sync-bench, the reconcile loop beside the syncs, side by side:");
    println!(
        "  {:<34} {:>10} {:>10} {:>11}",
        "", "p50 ms", "p99 ms", "hosts lost"
    );
    for (what, o) in [
        ("no reconcile loop", off),
        ("the loop's writes, no passes", writes),
        ("incremental passes (default)", incremental),
        ("every pass full", full),
    ] {
        println!(
            "  {what:<34} {:>10.1} {:>10.1} {:>11}",
            o.p50_ms, o.p99_ms, o.lost
        );
    }
    println!(
        "  p99 with incremental passes / without a loop: {:.2} (target: at most 1.5); with full passes: {:.2}",
        incremental.p99_ms / off.p99_ms.max(1e-9),
        full.p99_ms / off.p99_ms.max(1e-9)
    );
    println!(
        "  p99 with incremental passes / the loop's writes alone: {:.2}; with full passes: {:.2}",
        incremental.p99_ms / writes.p99_ms.max(1e-9),
        full.p99_ms / writes.p99_ms.max(1e-9)
    );
    println!(
        "  one pass over the settled fleet: full {:.1} ms, incremental {:.2} ms (target: under 10 ms)",
        incremental.full_pass_ms, incremental.changed_pass_ms
    );
    Ok(())
}

/// One measured run on a fresh database; with `work`, every task's report carries an
/// interval of completed work, errors and a latency histogram.
async fn run(
    work: bool,
    db_suffix: &str,
    mode: Loop,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let hosts = arg("--hosts", 10_000);
    let per_host = arg("--gpus-per-host", 8);
    let tasks = arg("--tasks", 20_000);
    let interval = Duration::from_secs(arg("--interval", 5) as u64);
    let seconds = arg("--seconds", 30) as u64;
    let dir = std::env::temp_dir().join(format!(
        "tessera-sync-bench-{}{db_suffix}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    let url = match arg_text("--postgres") {
        Some(server) => {
            fresh_postgres_database(&server, &format!("tessera_sync_bench{db_suffix}")).await?
        }
        None => format!("sqlite://{}/bench.db", dir.display()),
    };
    let store_name = if url.starts_with("postgres") {
        "PostgreSQL"
    } else {
        "SQLite file"
    };
    let servers = arg("--servers", 1).max(1);
    // The fleet is built by a control plane that declares nobody lost (registering 10,000
    // hosts takes longer than a lost timeout); the one measured then starts on the same
    // database, as after a restart, and its hosts sync within its grace.
    let control = Control::new(
        tessera_control::open(&url).await?,
        ControlConfig {
            sync_interval: Duration::from_secs(3600),
            ..ControlConfig::default()
        },
    );
    control
        .deployments()
        .create_pool(&PoolInput::named("bench"))
        .await?;
    let pool = PoolName::new("bench")?;
    let admitted = admit_simulated_hosts(&control, hosts, per_host, |_| pool.clone()).await?;
    register_task_definition(&control).await?;
    create_service(&control, "bench", "bench", tasks).await?;
    control.reconcile_once().await?;
    // Each host's sync body: its GPUs and the tasks placed on it, running.
    let placed = control
        .views()
        .list_tasks(&TaskFilter {
            states: TaskState::HOLDING.to_vec(),
            ..Default::default()
        })
        .await?;
    let mut by_host: std::collections::HashMap<HostId, Vec<TaskReport>> = Default::default();
    for t in placed {
        if let Some(h) = t.host {
            by_host.entry(h).or_default().push(TaskReport {
                task_id: t.id,
                running: true,
                gpu_memory_peak_mib: Some(tessera_model::MiB(4096)),
                sm_percent: Some(10),
                work: work.then(|| sample_work(1.0)),
                ..Default::default()
            });
        }
    }
    // Two bodies per host, sent in turn: with work, the second's latency is 30 % higher,
    // so every report says something new and is written (the worst case for the store).
    let bodies: Arc<Vec<(String, String, String)>> = Arc::new(
        admitted
            .iter()
            .enumerate()
            .map(|(h, r)| {
                let mut body = SyncRequest {
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
                let first = serde_json::to_string(&body).expect("serializes");
                for t in body.tasks.iter_mut().filter(|t| t.work.is_some()) {
                    t.work = Some(sample_work(1.3));
                }
                let second = serde_json::to_string(&body).expect("serializes");
                (r.agent_token.clone(), first, second)
            })
            .collect(),
    );
    let mut controls = Vec::new();
    let mut routers = Vec::new();
    for _ in 0..servers {
        let control = Control::new(
            tessera_control::open(&url).await?,
            ControlConfig {
                sync_interval: interval,
                full_pass_every: if mode == Loop::Full {
                    Duration::ZERO
                } else {
                    ControlConfig::default().full_pass_every
                },
                ..ControlConfig::default()
            },
        );
        routers.push(app(AppState::new(control.clone(), "127.0.0.1:0".parse()?)));
        controls.push(control);
    }
    let control = controls[0].clone();
    let routers = Arc::new(routers);
    // Warm-up, not measured: every host syncs twice (its tasks start running, then a quiet
    // sync), and the control plane settles, so what follows is the steady state of a
    // running fleet.
    let warm: Vec<_> = (0..64)
        .map(|w| {
            let (routers, bodies) = (routers.clone(), bodies.clone());
            tokio::spawn(async move {
                for _ in 0..2 {
                    for h in (w..bodies.len()).step_by(64) {
                        let (token, body, _) = &bodies[h];
                        let router = routers[h % routers.len()].clone();
                        let response = router.oneshot(sync_request(token, body)).await;
                        let status = response.expect("answers").status();
                        assert!(status.is_success(), "warm-up sync: {status}");
                    }
                }
            })
        })
        .collect();
    for w in warm {
        w.await?;
    }
    // The other servers write the times of the warm-up's quiet syncs they received (they
    // keep them for up to a tick), then the first takes the lease and runs a pass: as in a
    // running cluster, where every server writes them every tick.
    for c in controls.iter().skip(1) {
        c.agents().flush_heartbeats().await?;
    }
    control.tick().await?;
    analyze(&url).await?;
    control.reconcile_once().await?;
    // One full pass and one that looks at what changed (nothing), over the settled fleet;
    // each the best of three.
    async fn time_pass(url: &str, full: bool) -> Result<Duration, Box<dyn std::error::Error>> {
        let measured = Control::new(
            tessera_control::open(url).await?,
            ControlConfig {
                full_pass_every: if full {
                    Duration::ZERO
                } else {
                    ControlConfig::default().full_pass_every
                },
                ..ControlConfig::default()
            },
        );
        measured.reconcile_once().await?;
        let mut best = Duration::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            measured.reconcile_once().await?;
            best = best.min(t.elapsed());
        }
        Ok(best)
    }
    let full_pass = time_pass(&url, true).await?;
    let changed_pass = time_pass(&url, false).await?;
    let pass = if mode == Loop::Full {
        full_pass
    } else {
        changed_pass
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let reconcile = mode != Loop::Off;
    let interval_tick = ControlConfig::default().tick;
    let reconcilers: Vec<_> = controls
        .iter()
        .map(|control| {
            let control = control.clone();
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                if mode == Loop::Writes {
                    // What `Control::run` writes every tick, without the lease and the pass.
                    loop {
                        tokio::select! {
                            _ = stop.changed() => break,
                            _ = tokio::time::sleep(interval_tick) => {}
                        }
                        let _ = control.agents().flush_heartbeats().await;
                        let _ = control.agents().flush_usage(false).await;
                    }
                } else if reconcile {
                    control
                        .run(async move {
                            let _ = stop.changed().await;
                        })
                        .await;
                }
            })
        })
        .collect();
    println!(
        "sync-bench: {hosts} hosts × {per_host} GPUs, {tasks} tasks, each host syncing every {} s ({:.0} syncs/s) for {seconds} s, {store_name}, {servers} server(s), {}; one reconcile pass after the warm-up took {:.1} ms (full {:.1} ms, incremental {:.2} ms)",
        interval.as_secs(),
        hosts as f64 / interval.as_secs_f64(),
        match mode {
            Loop::Off => "no reconcile loop",
            Loop::Writes => "the loop's writes without passes",
            Loop::Incremental => "incremental passes",
            Loop::Full => "every pass full",
        },
        pass.as_secs_f64() * 1000.0,
        full_pass.as_secs_f64() * 1000.0,
        changed_pass.as_secs_f64() * 1000.0,
    );
    // One sender per host slot would be 10,000 tasks; a few hundred workers each take
    // every n-th host and keep its schedule, so a slow answer delays only that worker.
    let workers = 256.min(hosts.max(1));
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let mut handles = Vec::new();
    for w in 0..workers {
        let routers = routers.clone();
        let bodies = bodies.clone();
        handles.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut round = 0u32;
            'outer: loop {
                for h in (w..bodies.len()).step_by(workers) {
                    let due =
                        start + interval * round + interval.mul_f64(h as f64 / bodies.len() as f64);
                    if due >= end {
                        break 'outer;
                    }
                    tokio::time::sleep_until(due.into()).await;
                    let (token, first, second) = &bodies[h];
                    let body = if round.is_multiple_of(2) {
                        first
                    } else {
                        second
                    };
                    let req = sync_request(token, body);
                    let t0 = Instant::now();
                    let router = routers[h % routers.len()].clone();
                    let response = router.oneshot(req).await.expect("answers");
                    if !response.status().is_success() {
                        errors += 1;
                    }
                    let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await;
                    latencies.push((t0.duration_since(start), t0.elapsed()));
                }
                round += 1;
            }
            (latencies, errors)
        }));
    }
    let mut timed: Vec<(Duration, Duration)> = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (l, e) = h.await?;
        timed.extend(l);
        errors += e;
    }
    // The slowest answer of each second, to tell a steady tail from a stall.
    let mut worst = vec![Duration::ZERO; seconds as usize + 1];
    for (at, took) in &timed {
        let s = (at.as_secs() as usize).min(worst.len() - 1);
        worst[s] = worst[s].max(*took);
    }
    let mut latencies: Vec<Duration> = timed.into_iter().map(|(_, took)| took).collect();
    let elapsed = start.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    for r in reconcilers {
        let _ = r.await;
    }
    latencies.sort();
    let lost = control
        .views()
        .list_hosts()
        .await?
        .iter()
        .filter(|h| h.status == HostStatus::Lost)
        .count();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let worst: Vec<String> = worst.iter().map(|d| format!("{:.0}", ms(*d))).collect();
    println!("  slowest answer per second (ms): {}", worst.join(" "));
    println!(
        "  {} syncs in {elapsed:.1} s = {:.0} syncs/s; latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {errors} errors; hosts lost: {lost}",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(latencies.last().copied().unwrap_or_default()),
    );
    println!(
        "{}",
        serde_json::json!({"store": store_name, "servers": servers, "hosts": hosts, "syncs": latencies.len(), "syncs_per_sec": latencies.len() as f64 / elapsed,
            "p50_ms": ms(percentile(&latencies, 0.5)), "p99_ms": ms(percentile(&latencies, 0.99)),
            "max_ms": ms(latencies.last().copied().unwrap_or_default()), "errors": errors, "hosts_lost": lost})
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Outcome {
        p50_ms: ms(percentile(&latencies, 0.5)),
        p99_ms: ms(percentile(&latencies, 0.99)),
        lost,
        full_pass_ms: ms(full_pass),
        changed_pass_ms: ms(changed_pass),
    })
}

/// Five seconds of an inference server's work: requests completed and failed, and a
/// latency histogram of Triton's/vLLM's usual size, its bounds scaled by `slower`.
fn sample_work(slower: f64) -> tessera_model::work::WorkReport {
    use tessera_model::work::{LatencyBucket, WorkReport, WorkSample};
    let bounds = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ];
    let mut latency: Vec<LatencyBucket> = bounds
        .iter()
        .enumerate()
        .map(|(i, &le)| LatencyBucket {
            le: Some(le * slower),
            count: (100 * (i + 1) / bounds.len()) as f64,
        })
        .collect();
    latency.push(LatencyBucket {
        le: None,
        count: 100.0,
    });
    WorkReport::Measured(WorkSample {
        interval_secs: 5.0,
        completed: 100.0,
        errors: Some(1.0),
        latency,
    })
}
