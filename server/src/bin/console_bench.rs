//! `console-bench`: server-side rendering time of console pages on a large fleet.
//!
//! ```text
//! console-bench [--hosts 1000] [--gpus-per-host 8] [--tasks 10000] [--requests 20]
//! ```
//!
//! Builds the fleet in an SQLite file (hosts through the admission path, one service's
//! tasks placed by the real reconcile pass), then times requests through the router: the
//! hosts page (first and a later page, one filter), the overview, and as the baseline the
//! JSON host list the REST API serves. Requests carry a viewer's API token, so the
//! authentication layer's cost is part of every figure.

use axum::body::Body;
use axum::http::Request;
use serde_json::json;
use std::time::Instant;
use tessera_control::bench::{
    admit_simulated_hosts, api_token, arg, create_service, register_task_definition,
};
use tessera_control::inputs::PoolInput;
use tessera_control::{Control, ControlConfig};
use tessera_model::PoolName;
use tessera_model::auth::Role;
use tessera_server::{AppState, app};
use tower::ServiceExt;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let hosts = arg("--hosts", 1000);
    let per_host = arg("--gpus-per-host", 8);
    let tasks = arg("--tasks", 10_000);
    let requests = arg("--requests", 20);
    let dir = std::env::temp_dir().join(format!("tessera-console-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let store = tessera_control::open(&format!("sqlite://{}/bench.db", dir.display())).await?;
    let control = Control::new(store, ControlConfig::default());
    for pool in ["a", "b"] {
        control.create_pool(&PoolInput::named(pool)).await?;
    }
    let pools = [PoolName::new("a")?, PoolName::new("b")?];
    admit_simulated_hosts(&control, hosts, per_host, |h| pools[h % 2].clone()).await?;
    register_task_definition(&control).await?;
    for pool in ["a", "b"] {
        create_service(&control, &format!("svc-{pool}"), pool, tasks / 2).await?;
    }
    control.reconcile_once().await?;
    let token = api_token(&control, Role::Viewer).await?;
    let state = AppState::new(control, "127.0.0.1:0".parse()?);
    println!(
        "console-bench: {hosts} hosts × {per_host} GPUs = {} GPUs, {tasks} tasks placed; {requests} requests each",
        hosts * per_host
    );
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>10}",
        "request", "mean ms", "p50 ms", "max ms", "bytes"
    );
    let mut rows = Vec::new();
    for uri in [
        "/hosts",
        "/hosts?page=20",
        "/hosts?pool=b&page=3",
        "/",
        "/api/v1/hosts",
    ] {
        let mut times = Vec::new();
        let mut bytes = 0;
        for _ in 0..requests {
            let start = Instant::now();
            let resp = app(state.clone())
                .oneshot(
                    Request::get(uri)
                        .header("host", "127.0.0.1")
                        .header("authorization", format!("Bearer {token}"))
                        .body(Body::empty())?,
                )
                .await?;
            assert!(resp.status().is_success(), "{uri}: {}", resp.status());
            bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await?
                .len();
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let (p50, max) = (times[times.len() / 2], times[times.len() - 1]);
        println!("{uri:<34} {mean:>9.1} {p50:>9.1} {max:>9.1} {bytes:>10}");
        rows.push(
            json!({"uri": uri, "mean_ms": mean, "p50_ms": p50, "max_ms": max, "bytes": bytes}),
        );
    }
    println!(
        "{}",
        json!({ "hosts": hosts, "gpus": hosts * per_host, "tasks": tasks, "results": rows })
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
