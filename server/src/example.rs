//! `tessera example-server`: a small HTTP service for trying Tessera's serving with
//! processes (no image): it listens on `$PORT` (what the agent gives a task's first port),
//! answers `/` with who it is, `/health` with `ok`, and `/metrics` with its request counter
//! and latency histogram in Prometheus's text format; `?work_ms=N` makes a request take
//! that long. On SIGTERM it stops accepting and finishes the requests in flight, as a
//! server behind a draining load balancer should. The demo fleet's example service and the
//! serving drill run it.

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
}

#[derive(serde::Deserialize)]
struct Work {
    work_ms: Option<u64>,
}

async fn root(State(s): State<Arc<Example>>, Query(w): Query<Work>) -> impl IntoResponse {
    let started = Instant::now();
    if let Some(ms) = w.work_ms {
        tokio::time::sleep(Duration::from_millis(ms.min(10_000))).await;
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
    axum::Json(serde_json::json!({ "served_by": s.who }))
}

async fn metrics(State(s): State<Arc<Example>>) -> impl IntoResponse {
    let mut out = String::from(
        "# HELP example_requests_total Requests answered.\n# TYPE example_requests_total counter\n",
    );
    out.push_str(&format!(
        "example_requests_total {}\n",
        s.stats.requests.load(Ordering::Relaxed)
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
    let state = Arc::new(Example {
        stats: Stats::default(),
        who,
    });
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
