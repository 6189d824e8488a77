//! `tessera example-server`: a small HTTP service for trying Tessera's serving with
//! processes (no image): it listens on `$PORT` (what the agent gives a task's first port),
//! answers `/` with who it is, `/health` with `ok`, and `/metrics` with its request and
//! error counters and latency histogram in Prometheus's text format. A request takes
//! `?work_ms=N` (else `$EXAMPLE_WORK_MS`, default 0) of simulated work; `?fail=1` answers
//! 500 and counts an error. On SIGTERM it stops accepting and finishes the requests in
//! flight, as a server behind a draining load balancer should. The demo fleet's example
//! service and the serving drill run it.
//!
//! On a simulated host (`$TESSERA_SIMULATED_GPU_DIR`, set by an agent with `--simulate`)
//! it simulates sharing its GPU: it registers the load it puts on its GPU
//! (`$EXAMPLE_GPU_LOAD`, default 0) under the GPU's id, and its work takes
//! `1 + the sum of its neighbours' loads` times longer, as a task beside one that saturates
//! the streaming multiprocessors would. Nothing of this touches a real GPU.

use axum::Router;
use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::routing::get;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Latency histogram bounds, in seconds.
const BUCKETS: [f64; 8] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

#[derive(Default)]
struct Stats {
    requests: AtomicU64,
    /// Cumulative counts per bucket, then +Inf.
    buckets: [AtomicU64; 9],
    /// Total latency in microseconds.
    micros: AtomicU64,
}

struct Example {
    stats: Stats,
    who: String,
    /// Simulated work per request when the request does not say.
    work_ms: u64,
    /// How much longer work takes beside its simulated GPU's neighbours (× 1000).
    slowdown_milli: AtomicU64,
    errors: AtomicU64,
}

#[derive(serde::Deserialize)]
struct Work {
    work_ms: Option<u64>,
    fail: Option<u8>,
}

async fn root(State(s): State<Arc<Example>>, Query(w): Query<Work>) -> axum::response::Response {
    let started = Instant::now();
    let ms = w.work_ms.unwrap_or(s.work_ms).min(10_000);
    if ms > 0 {
        let slowdown = s.slowdown_milli.load(Ordering::Relaxed).max(1000);
        tokio::time::sleep(Duration::from_micros(ms * slowdown)).await;
    }
    if w.fail.is_some_and(|f| f != 0) {
        s.errors.fetch_add(1, Ordering::Relaxed);
        return (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "failed on purpose (?fail=1)",
        )
            .into_response();
    }
    let elapsed = started.elapsed();
    s.stats.requests.fetch_add(1, Ordering::Relaxed);
    s.stats
        .micros
        .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    let secs = elapsed.as_secs_f64();
    for (i, b) in BUCKETS.iter().enumerate() {
        if secs <= *b {
            s.stats.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
    }
    s.stats.buckets[BUCKETS.len()].fetch_add(1, Ordering::Relaxed);
    axum::Json(serde_json::json!({ "served_by": s.who })).into_response()
}

async fn metrics(State(s): State<Arc<Example>>) -> impl IntoResponse {
    let mut out = String::from(
        "# HELP example_requests_total Requests answered.\n# TYPE example_requests_total counter\n",
    );
    out.push_str(&format!(
        "example_requests_total {}\n",
        s.stats.requests.load(Ordering::Relaxed)
    ));
    out.push_str(&format!(
        "# HELP example_errors_total Requests failed.\n# TYPE example_errors_total counter\nexample_errors_total {}\n",
        s.errors.load(Ordering::Relaxed)
    ));
    out.push_str("# HELP example_request_seconds Request latency.\n# TYPE example_request_seconds histogram\n");
    for (i, b) in BUCKETS.iter().enumerate() {
        out.push_str(&format!(
            "example_request_seconds_bucket{{le=\"{b}\"}} {}\n",
            s.stats.buckets[i].load(Ordering::Relaxed)
        ));
    }
    let total = s.stats.buckets[BUCKETS.len()].load(Ordering::Relaxed);
    out.push_str(&format!(
        "example_request_seconds_bucket{{le=\"+Inf\"}} {total}\nexample_request_seconds_sum {}\nexample_request_seconds_count {total}\n",
        s.stats.micros.load(Ordering::Relaxed) as f64 / 1e6
    ));
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        out,
    )
}

/// Serves on `port` (default `$PORT`) until SIGTERM or SIGINT, then lets requests in
/// flight finish.
pub async fn run(port: Option<u16>) -> anyhow::Result<()> {
    use anyhow::Context;
    let port = match port {
        Some(p) => p,
        None => std::env::var("PORT")
            .context(
                "no port: pass --port or set PORT (the agent sets it for a task's first port)",
            )?
            .parse()
            .context("PORT is not a port number")?,
    };
    let who = std::env::var("TESSERA_TASK_ID").unwrap_or_else(|_| format!("port {port}"));
    let env_number = |name: &str| -> anyhow::Result<Option<f64>> {
        match std::env::var(name) {
            Ok(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite() && *n >= 0.0)
                .map(Some)
                .with_context(|| format!("{name} must be a number of at least 0, got {v:?}")),
            Err(_) => Ok(None),
        }
    };
    let state = Arc::new(Example {
        stats: Stats::default(),
        who,
        work_ms: env_number("EXAMPLE_WORK_MS")?.unwrap_or(0.0) as u64,
        slowdown_milli: AtomicU64::new(1000),
        errors: AtomicU64::new(0),
    });
    let _registration = match (
        std::env::var("TESSERA_SIMULATED_GPU_DIR"),
        std::env::var("CUDA_VISIBLE_DEVICES"),
    ) {
        (Ok(dir), Ok(gpu)) if !gpu.is_empty() && !gpu.contains(['/', '.']) => {
            let load = env_number("EXAMPLE_GPU_LOAD")?.unwrap_or(0.0);
            let dir = std::path::Path::new(&dir).join(gpu.replace(',', "+"));
            match SimulatedGpu::join(dir.clone(), load, state.clone()) {
                Ok(r) => Some(r),
                Err(e) => {
                    // The simulation is a nicety: serving goes on without it.
                    eprintln!(
                        "not simulating GPU sharing: cannot register in {}: {e}",
                        dir.display()
                    );
                    None
                }
            }
        }
        _ => None,
    };
    let app = Router::new()
        .route("/", get(root))
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port))
        .await
        .with_context(|| format!("cannot listen on port {port}"))?;
    // Its metrics on their own port too, when the task has one named `metrics`.
    if let Some(m) = std::env::var("TESSERA_PORT_METRICS")
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|&m| m != port)
    {
        let metrics_listener = tokio::net::TcpListener::bind(("0.0.0.0", m))
            .await
            .with_context(|| format!("cannot listen on port {m}"))?;
        let metrics_app = app.clone();
        tokio::spawn(async move {
            let _ = axum::serve(metrics_listener, metrics_app).await;
        });
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM can be watched");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        })
        .await
        .context("serving")?;
    Ok(())
}

/// This process's place on a simulated GPU: a file named by its pid holding its load,
/// removed when it ends; a second task re-reads its neighbours' loads.
struct SimulatedGpu {
    file: std::path::PathBuf,
}

impl SimulatedGpu {
    fn join(dir: std::path::PathBuf, load: f64, state: Arc<Example>) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let me = std::process::id();
        let file = dir.join(me.to_string());
        std::fs::write(&file, load.to_string())?;
        tokio::spawn(async move {
            loop {
                let others = neighbour_load(&dir, me);
                state
                    .slowdown_milli
                    .store(((1.0 + others) * 1000.0) as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Ok(SimulatedGpu { file })
    }
}

impl Drop for SimulatedGpu {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// The summed load of the other live processes registered in `dir` (files of processes
/// that are gone, killed before they could remove theirs, are skipped and removed).
fn neighbour_load(dir: &std::path::Path, me: u32) -> f64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0.0;
    };
    let mut sum = 0.0;
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
            continue;
        }
        if let Some(load) = std::fs::read_to_string(e.path())
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|l| l.is_finite() && *l >= 0.0)
        {
            sum += load.min(100.0);
        }
    }
    sum
}
