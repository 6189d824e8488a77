//! `logs-bench`: how long a line a task writes takes to reach a `tessera logs -f` reader,
//! and what many follows cost the agents' syncs.
//!
//! ```text
//! logs-bench [--follows 100] [--agents 4] [--sync-hosts 1000] [--interval 5] [--seconds 15]
//!            [--postgres URL [--via-other 1]]
//! ```
//!
//! With `--postgres` (a server whose user may create databases) the store is a fresh
//! PostgreSQL database and a second server runs on it; the agents know both (they sync
//! with the first) and, with `--via-other 1`, the followers read through the second.
//!
//! A server on loopback (SQLite, the real router and loop) with `--agents` real agents
//! (in this process, processes as tasks): service `writer` runs `--follows` tasks, each a
//! Python loop printing the time every 100 ms. Besides, `--sync-hosts` simulated hosts
//! sync through the router once per `--interval`, spread evenly and without a pause for
//! the whole run: their latencies are the sync figures. The run measures, in turn, `--seconds` with no follow open, then
//! `--seconds` with one `GET /api/v1/tasks/{id}/logs?follow=true` per task open (what
//! `tessera logs -f` reads), then both again. Printed: sync p50/p99 in each phase and
//! their ratio (after two unmeasured intervals: every simulated host's first report is a
//! write); each line's latency from the time the task printed to the time the
//! follower read it, p50/p99/max.

use axum::body::Body;
use axum::http::Request;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tessera_agent::{Agent, AgentConfig};
use tessera_control::bench::{
    admit_simulated_hosts, api_token, arg, arg_text, fresh_postgres_database, simulated_gpus,
};
use tessera_control::inputs::{PoolInput, ServiceInput};
use tessera_control::store::TaskFilter;
use tessera_control::{Control, ControlConfig};
use tessera_model::agent::{MpsReport, SyncRequest};
use tessera_model::auth::Role;
use tessera_model::service::{DeploymentConfig, ServiceConstraints, TaskState};
use tessera_model::{MiB, MilliCpu, PoolName};
use tessera_server::{AppState, app, run};
use tokio::sync::Mutex;
use tower::ServiceExt;

const JOIN: &str = "logs-bench-join-token";

/// Each line: `at <seconds since the epoch>`, every 100 ms.
const WRITER: &str = "import time\nwhile True:\n    print(f'at {time.time():.6f}', flush=True)\n    time.sleep(0.1)\n";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn agent_config(url: &str, dir: &std::path::Path, name: &str) -> AgentConfig {
    AgentConfig {
        server: url.to_owned(),
        ca_cert: None,
        insecure_http: false,
        join_token: Some(JOIN.into()),
        state_dir: dir.join(name),
        pool: PoolName::new("logs").expect("valid"),
        name: name.into(),
        labels: Default::default(),
        resources: Some((MilliCpu(256_000), MiB(512 * 1024))),
        simulate: Some("1xL4-24GB".into()),
        mps_control: None,
        max_mps_restarts: 0,
        no_mps: true,
        log_cap: 8 << 20,
        stop_tasks_on_exit: true,
        log_retention: Duration::from_secs(3600),
        run_as: None,
        containers: tessera_agent::ContainerRuntime::Process,
        advertise_address: Some("127.0.0.1".into()),
        port_range: (32768, 60999),
        provider_id: None,
    }
}

/// Each sync: when it started, and its latency (ms).
type Syncs = Arc<Mutex<Vec<(Instant, f64)>>>;

/// The simulated hosts' syncs, each host once per `interval` (spread evenly), until
/// `stop`, each into `into`: one load for
/// the whole run, so that no host ever misses a sync between phases (a host silent for
/// longer than the server's lost-after time would be declared lost, and its next sync
/// would be a write: a phase would then measure recoveries, not follows).
async fn sync_load(
    state: AppState,
    bodies: Arc<Vec<(String, String)>>,
    interval: Duration,
    stop: Arc<AtomicBool>,
    into: Syncs,
) {
    // The router is built once (building it is far dearer than a sync).
    let router = app(state);
    let gap = interval / bodies.len().max(1) as u32;
    let mut i = 0usize;
    let mut next = tokio::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        next += gap;
        tokio::time::sleep_until(next).await;
        let (token, body) = bodies[i % bodies.len()].clone();
        i += 1;
        let (router, into) = (router.clone(), into.clone());
        tokio::spawn(async move {
            let req = Request::post("/agent/v1/sync")
                .header("host", "127.0.0.1:3000")
                .header("authorization", format!("Bearer {token}"))
                .header("content-type", "application/json")
                .body(Body::from(body))
                .expect("request");
            let started = Instant::now();
            let answer = router.oneshot(req).await.expect("answers");
            if answer.status().is_success() {
                into.lock()
                    .await
                    .push((started, started.elapsed().as_secs_f64() * 1000.0));
            } else {
                eprintln!("a sync was answered {}", answer.status());
            }
        });
    }
}

/// Follows task `id`'s logs until `stop`; each line's latency (ms) into `into`.
async fn follow(
    url: String,
    token: String,
    id: String,
    stop: Arc<AtomicBool>,
    into: Arc<Mutex<Vec<f64>>>,
) {
    let response = reqwest::Client::new()
        .get(format!("{url}/api/v1/tasks/{id}/logs?follow=true&tail=0"))
        .bearer_auth(token)
        .send()
        .await;
    let mut response = match response {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            eprintln!(
                "a follow was answered {}: {}",
                r.status(),
                r.text().await.unwrap_or_default()
            );
            return;
        }
        Err(e) => {
            eprintln!("a follow failed: {e}");
            return;
        }
    };
    let mut pending = String::new();
    while !stop.load(Ordering::Relaxed) {
        let chunk = match tokio::time::timeout(Duration::from_millis(500), response.chunk()).await {
            Ok(Ok(Some(c))) => c,
            Ok(_) => return,
            Err(_) => continue,
        };
        let read = now_secs();
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            if let Some(at) = line
                .trim()
                .strip_prefix("at ")
                .and_then(|t| t.parse::<f64>().ok())
            {
                into.lock().await.push((read - at) * 1000.0);
            }
        }
    }
}

/// One phase: `seconds` with one follow per task when `follows`; the syncs that started
/// in it and the line latencies (ms), sorted.
async fn phase(
    syncs: &Syncs,
    seconds: u64,
    follows: Option<(&tokio::runtime::Handle, &str, &str, &[String])>,
) -> (Vec<f64>, Vec<f64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let lines = Arc::new(Mutex::new(Vec::new()));
    let mut followers = Vec::new();
    if let Some((readers, url, token, ids)) = follows {
        for id in ids {
            followers.push(readers.spawn(follow(
                url.to_owned(),
                token.to_owned(),
                id.clone(),
                stop.clone(),
                lines.clone(),
            )));
        }
        // Every follow open and its first lines in before the syncs are measured.
        tokio::time::sleep(Duration::from_secs(2)).await;
        lines.lock().await.clear();
    }
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let to = Instant::now();
    stop.store(true, Ordering::Relaxed);
    for f in followers {
        let _ = f.await;
    }
    // The last syncs of the phase answered.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut s: Vec<f64> = syncs
        .lock()
        .await
        .iter()
        .filter(|(at, _)| (from..to).contains(at))
        .map(|(_, ms)| *ms)
        .collect();
    let mut l = lines.lock().await.clone();
    s.sort_by(f64::total_cmp);
    l.sort_by(f64::total_cmp);
    (s, l)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let follows = arg("--follows", 100);
    let agents = arg("--agents", 4);
    let sync_hosts = arg("--sync-hosts", 1000);
    let interval = Duration::from_secs(arg("--interval", 5) as u64);
    let seconds = arg("--seconds", 15) as u64;
    let dir = tempfile::tempdir()?;
    let postgres = arg_text("--postgres");
    let db = match &postgres {
        Some(server) => fresh_postgres_database(server, "tessera_logs_bench").await?,
        None => format!("sqlite://{}/server.db", dir.path().display()),
    };
    // The real agents sync every 2 s; a simulated host, every `--interval`, is declared
    // lost only after three of its own intervals without a sync.
    let config = ControlConfig {
        sync_interval: Duration::from_secs(2),
        lost_after_intervals: 3 * (interval.as_secs() as u32).div_ceil(2).max(1),
        ..ControlConfig::default()
    };
    let control = Control::new(tessera_control::open(&db).await?, config.clone());
    control.agents().ensure_join_token(Some(JOIN)).await?;
    for pool in ["logs", "sim"] {
        control
            .deployments()
            .create_pool(&PoolInput::named(pool))
            .await?;
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let url = format!("http://{addr}");
    // One reader (an address, a token) holds 100 follows here; a server's defaults let an
    // address hold 64 requests at once and a user 64 streams.
    let limits = tessera_server::Limits {
        requests_per_address: 4 * follows.max(64),
        task_streams_per_user: follows.max(64),
        ..tessera_server::Limits::default()
    };
    let state = AppState::new(control.clone(), addr).with_limits(limits);
    tokio::spawn(run(listener, state.clone(), None, std::future::pending()));
    {
        let c = control.clone();
        tokio::spawn(async move { c.run(std::future::pending()).await });
    }
    // A second server on the same database, which the agents know but do not sync with.
    let other_url = match &postgres {
        Some(_) => {
            let other = Control::new(tessera_control::open(&db).await?, config);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            tokio::spawn(run(
                listener,
                AppState::new(other.clone(), addr).with_limits(limits),
                None,
                std::future::pending(),
            ));
            tokio::spawn(async move { other.run(std::future::pending()).await });
            Some(format!("http://{addr}"))
        }
        None => None,
    };
    let servers = match &other_url {
        Some(o) => format!("{url},{o}"),
        None => url.clone(),
    };
    let read_from = match (&other_url, arg("--via-other", 0)) {
        (Some(o), 1) => o.clone(),
        _ => url.clone(),
    };
    // The agents run on a runtime of their own, as their own processes would: their
    // work never waits for the server's threads, nor the server's for theirs.
    let agent_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // So do the readers, as `tessera logs -f` processes would.
    let readers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    for a in 0..agents {
        let agent = Agent::new(agent_config(&servers, dir.path(), &format!("agent-{a}")))?;
        agent_runtime.spawn(async move {
            if let Err(e) = agent.run(std::future::pending()).await {
                eprintln!("an agent stopped: {e}");
            }
        });
    }
    control
        .deployments()
        .register_task_definition(&json!({
            "family": "writer",
            "containers": [{"name": "main", "command": ["python3", "-c", WRITER],
                "cpu_milli": 100, "memory_mib": 64}]
        }))
        .await?;
    control
        .deployments()
        .create_service(&ServiceInput {
            name: "writer".into(),
            task_definition: "writer:1".into(),
            pool: "logs".into(),
            project: None,
            priority: None,
            desired_count: follows as u32,
            strategy: None,
            // Spread evenly: each host serves its share of the follows.
            constraints: ServiceConstraints {
                max_per_host: Some(follows.div_ceil(agents.max(1)) as u32),
                ..ServiceConstraints::default()
            },
            deployment: Some(DeploymentConfig::default()),
            stop_timeout_secs: 2,
            deregistration_delay_secs: 0,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        })
        .await?;
    let started = Instant::now();
    let ids: Vec<String> = loop {
        let running = control
            .views()
            .list_tasks(&TaskFilter {
                service: Some("writer".into()),
                states: vec![TaskState::Running],
                ..Default::default()
            })
            .await?;
        if running.len() >= follows {
            break running.into_iter().map(|t| t.id).collect();
        }
        if started.elapsed() > Duration::from_secs(180) {
            anyhow::bail!("{} of {follows} writers running after 180 s", running.len());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "{follows} writers running on {agents} agents after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let admitted = admit_simulated_hosts(&control, sync_hosts, 1, |_| {
        PoolName::new("sim").expect("valid")
    })
    .await?;
    let bodies: Arc<Vec<(String, String)>> = Arc::new(
        admitted
            .iter()
            .enumerate()
            .map(|(h, r)| {
                let body = SyncRequest {
                    address: None,
                    dynamic_ports_free: None,
                    capabilities: None,
                    gpus: simulated_gpus(h, 1),
                    mps: MpsReport {
                        healthy: true,
                        reason: None,
                        restarts: None,
                    },
                    tasks: Vec::new(),
                    agent_version: None,
                };
                (
                    r.agent_token.clone(),
                    serde_json::to_string(&body).expect("serializes"),
                )
            })
            .collect(),
    );
    let token = api_token(&control, Role::Admin).await?;
    println!(
        "{sync_hosts} simulated hosts sync every {} s ({:.0} syncs/s); {seconds} s per phase; store {}; follows read through {}",
        interval.as_secs(),
        sync_hosts as f64 / interval.as_secs_f64(),
        if postgres.is_some() {
            "PostgreSQL, two servers"
        } else {
            "SQLite"
        },
        if read_from == url {
            "the server the agents sync with"
        } else {
            "the other server"
        }
    );
    println!(
        "{:<28} {:>7} {:>9} {:>9} {:>8} {:>10} {:>10} {:>10}",
        "phase", "syncs", "p50 ms", "p99 ms", "lines", "line p50", "line p99", "line max"
    );
    let syncs: Syncs = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(sync_load(
        state.clone(),
        bodies.clone(),
        interval,
        stop.clone(),
        syncs.clone(),
    ));
    // Unmeasured: every simulated host's first report (a write each), then a quiet round.
    let _ = phase(&syncs, 2 * interval.as_secs(), None).await;
    let mut quiet_p99 = Vec::new();
    let mut busy_p99 = Vec::new();
    let mut all_lines = Vec::new();
    for round in 1..=2 {
        for with in [false, true] {
            let follows_now = with.then_some((
                readers.handle(),
                read_from.as_str(),
                token.as_str(),
                ids.as_slice(),
            ));
            let (syncs, lines) = phase(&syncs, seconds, follows_now).await;
            let name = if with {
                format!("round {round}: {} follows", ids.len())
            } else {
                format!("round {round}: no follow")
            };
            println!(
                "{name:<28} {:>7} {:>9.2} {:>9.2} {:>8} {:>10.1} {:>10.1} {:>10.1}",
                syncs.len(),
                percentile(&syncs, 0.5),
                percentile(&syncs, 0.99),
                lines.len(),
                percentile(&lines, 0.5),
                percentile(&lines, 0.99),
                lines.last().copied().unwrap_or(0.0)
            );
            if with {
                busy_p99.push(percentile(&syncs, 0.99));
                all_lines.extend(lines);
            } else {
                quiet_p99.push(percentile(&syncs, 0.99));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = load.await;
    all_lines.sort_by(f64::total_cmp);
    let (quiet, busy) = (
        quiet_p99.iter().sum::<f64>() / quiet_p99.len() as f64,
        busy_p99.iter().sum::<f64>() / busy_p99.len() as f64,
    );
    println!(
        "sync p99: {quiet:.2} ms without follows, {busy:.2} ms with {} ({:.2}x; target <= 1.2x)",
        ids.len(),
        busy / quiet.max(f64::EPSILON)
    );
    println!(
        "line latency over {} lines: p50 {:.1} ms, p99 {:.1} ms (target <= 1000 ms), max {:.1} ms",
        all_lines.len(),
        percentile(&all_lines, 0.5),
        percentile(&all_lines, 0.99),
        all_lines.last().copied().unwrap_or(0.0)
    );
    agent_runtime.shutdown_background();
    readers.shutdown_background();
    Ok(())
}
