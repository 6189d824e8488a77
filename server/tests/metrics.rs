//! `GET /metrics`: Prometheus text that parses, with the fleet's gauges and the timings of
//! passes, commits and syncs, for a viewer's token only; and the sample Grafana dashboard
//! queries nothing else.

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::json;
use std::collections::HashMap;
use tessera_control::bench::api_token;
use tessera_model::auth::Role;
use tessera_server::{AppState, app};
use tower::ServiceExt;

const JOIN: &str = "metrics-join-token-0123456789";

/// A request through the router ([`common::send`]): its status, text and content type.
async fn send(
    state: &AppState,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (StatusCode, String, Option<String>) {
    let method = axum::http::Method::from_bytes(method.as_bytes()).expect("a method");
    let headers: Vec<_> = token.map(common::bearer).into_iter().collect();
    let a = common::send(state, method, uri, body.as_ref(), &headers).await;
    (a.status, a.text(), a.content_type())
}

/// Samples of the exposition text: `name{labels}` → value. Panics on a line that is not a
/// comment, blank, or `name{k="v",...} value` (the text format Prometheus parses).
///
/// Also checks what makes the text one exposition: each family typed at most once, its
/// samples together (not split by another family's), and no series twice.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    let mut typed = std::collections::HashSet::new();
    let mut finished = std::collections::HashSet::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().expect("a name").to_owned();
            assert!(typed.insert(name.clone()), "{name} typed twice");
            continue;
        }
        if line.is_empty() || line.starts_with("# HELP ") {
            continue;
        }
        let name = line.split(['{', ' ']).next().expect("a name");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix).filter(|b| typed.contains(*b)))
            .unwrap_or(name)
            .to_owned();
        if current.as_ref() != Some(&family) {
            if let Some(before) = current.take() {
                finished.insert(before);
            }
            assert!(
                !finished.contains(&family),
                "the samples of {family} are split by another family's"
            );
            current = Some(family);
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("value is not a number: {line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "metric name: {line:?}"
        );
        if name_end < series.len() {
            let labels = &series[name_end..];
            assert!(
                labels.starts_with('{') && labels.ends_with('}'),
                "labels: {line:?}"
            );
            for pair in labels[1..labels.len() - 1]
                .split("\",")
                .filter(|p| !p.is_empty())
            {
                let (k, v) = pair
                    .split_once("=\"")
                    .unwrap_or_else(|| panic!("label: {line:?}"));
                assert!(
                    k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "label name: {line:?}"
                );
                assert!(
                    !v.trim_end_matches('"').contains('\n'),
                    "label value: {line:?}"
                );
            }
        }
        assert!(
            samples.insert(series.to_owned(), value).is_none(),
            "{series} twice"
        );
    }
    samples
}

fn sum(samples: &HashMap<String, f64>, name: &str, with: &str) -> f64 {
    samples
        .iter()
        .filter(|(s, _)| (s.starts_with(&format!("{name}{{")) || *s == name) && s.contains(with))
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test]
async fn metrics_parse_and_show_the_fleet_its_tasks_and_the_timings() {
    let control = common::control(JOIN).await;
    control
        .deployments()
        .create_pool(&tessera_control::inputs::PoolInput::named("inference"))
        .await
        .expect("pool");
    let tokens = common::register_hosts(&control, JOIN, &common::DEMO_HOSTS[2..3]).await;
    let viewer = api_token(&control, Role::Viewer).await.expect("token");
    let operator = api_token(&control, Role::Operator).await.expect("token");
    let state = AppState::new(control.clone(), "127.0.0.1:0".parse().expect("valid"));

    let (status, _, _) = send(&state, "GET", "/metrics", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no token, no metrics");

    let (status, body, _) = send(
        &state,
        "POST",
        "/api/v1/task-definitions",
        Some(&operator),
        Some(json!({
        "family": "infer", "containers": [{"name": "main", "command": ["sleep", "600"],
            "cpu_milli": 1000, "memory_mib": 1024,
            "gpu": {"mps": {"memory_mib": 10240, "max_compute_percent": 30}}}]})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body, _) = send(
        &state,
        "POST",
        "/api/v1/services",
        Some(&operator),
        Some(json!({
        "name": "infer", "task_definition": "infer:1", "pool": "inference", "desired_count": 9})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(control.tick().await, Ok(true));
    // The host's agent syncs: its tasks run, and it reports what they use.
    let host = tessera_model::HostId::new("sim-l4-1").expect("valid");
    let tasks = control.views().service_tasks("infer").await.expect("tasks");
    let mut sync = common::sync_body(&control, &host).await;
    sync["tasks"] = json!(tasks
        .iter()
        .filter(|t| t.host.as_ref() == Some(&host))
        .map(|t| json!({"task_id": t.id, "running": true, "gpu_memory_peak_mib": 4096, "sm_percent": 12}))
        .collect::<Vec<_>>());
    let placed_here = sync["tasks"].as_array().expect("array").len();
    assert!(placed_here > 0);
    for _ in 0..2 {
        let (status, body, _) = send(
            &state,
            "POST",
            "/agent/v1/sync",
            Some(&tokens[0]),
            Some(sync.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    let (status, text, content_type) = send(&state, "GET", "/metrics", Some(&viewer), None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(
        content_type
            .expect("a content type")
            .starts_with("text/plain; version=0.0.4")
    );
    let samples = parse(&text);
    // As Prometheus asks for it: compressed, whole, the same fleet.
    let gzipped = common::send(
        &state,
        axum::http::Method::GET,
        "/metrics",
        None,
        &[
            common::bearer(&viewer),
            ("accept-encoding", "gzip".to_owned()),
        ],
    )
    .await;
    assert_eq!(gzipped.status, StatusCode::OK);
    assert_eq!(
        gzipped
            .headers
            .get(header::CONTENT_ENCODING)
            .map(|v| v.as_bytes()),
        Some(&b"gzip"[..])
    );
    let mut unzipped = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(&gzipped.bytes[..]),
        &mut unzipped,
    )
    .expect("a whole gzip stream");
    let unzipped = parse(&unzipped);
    for family in [
        "tessera_gpu_memory_total_mib",
        "tessera_gpu_memory_reserved_mib",
    ] {
        assert_eq!(
            sum(&unzipped, family, ""),
            sum(&samples, family, ""),
            "{family}"
        );
    }
    // 4 L4 GPUs of 24 GiB: 8 tasks of 10 GiB each reserved on them, the ninth waits.
    assert_eq!(
        sum(&samples, "tessera_gpu_memory_total_mib", "sim-l4-1"),
        4.0 * 24576.0
    );
    assert_eq!(
        sum(&samples, "tessera_gpu_memory_reserved_mib", "sim-l4-1"),
        8.0 * 10240.0
    );
    assert_eq!(
        sum(&samples, "tessera_gpu_memory_used_mib", "sim-l4-1"),
        placed_here as f64 * 4096.0
    );
    assert_eq!(
        sum(
            &samples,
            "tessera_task_gpu_memory_peak_mib",
            "service=\"infer\""
        ),
        placed_here as f64 * 4096.0
    );
    assert_eq!(
        sum(&samples, "tessera_task_sm_percent", "service=\"infer\""),
        placed_here as f64 * 12.0
    );
    // Every service is in the default project: it reserves what the GPUs show.
    assert_eq!(
        sum(
            &samples,
            "tessera_project_used",
            "resource=\"gpu_memory_mib\""
        ),
        8.0 * 10240.0
    );
    assert_eq!(
        sum(
            &samples,
            "tessera_project_used",
            "resource=\"compute_milli\""
        ),
        8.0 * 300.0
    );
    assert_eq!(
        sum(
            &samples,
            "tessera_project_borrowed",
            "resource=\"gpu_memory_mib\""
        ),
        8.0 * 10240.0,
        "no guarantee: all of it is borrowed"
    );
    assert_eq!(
        sum(
            &samples,
            "tessera_project_tasks_pending",
            "project=\"default\""
        ),
        1.0
    );
    assert_eq!(sum(&samples, "tessera_hosts", "status=\"active\""), 1.0);
    assert_eq!(sum(&samples, "tessera_tasks_pending", "reason=\""), 1.0);
    assert_eq!(sum(&samples, "tessera_hosts", "status=\"lost\""), 0.0);
    assert!(
        sum(&samples, "tessera_reconcile_pass_seconds_count", "") >= 1.0,
        "{text}"
    );
    assert!(
        sum(&samples, "tessera_placement_commit_seconds_count", "") >= 1.0,
        "{text}"
    );
    assert!(
        sum(&samples, "tessera_agent_sync_seconds_count", "") >= 2.0,
        "{text}"
    );
    assert!(
        text.contains("# TYPE tessera_reconcile_pass_seconds histogram"),
        "{text}"
    );
    assert_dashboard_queries_exist(&text);

    // Scaled to nothing: its tasks are in no later scrape (not kept for minutes).
    let (status, body, _) = send(
        &state,
        "PATCH",
        "/api/v1/services/infer",
        Some(&operator),
        Some(json!({"desired_count": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(control.tick().await, Ok(true));
    let (status, text, _) = send(&state, "GET", "/metrics", Some(&viewer), None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let samples = parse(&text);
    assert_eq!(
        sum(&samples, "tessera_task_sm_percent", "service=\"infer\""),
        0.0,
        "{text}"
    );
    assert_eq!(sum(&samples, "tessera_tasks_pending", "reason=\""), 0.0);
    assert_eq!(
        sum(&samples, "tessera_gpu_memory_total_mib", "sim-l4-1"),
        4.0 * 24576.0
    );
}

/// Every metric the sample Grafana dashboard (`server/grafana/tessera-dashboard.json`)
/// and the alert rules (`server/prometheus/tessera-rules.yml`) query is one that `text`
/// (a whole `/metrics` answer) exposes.
fn assert_dashboard_queries_exist(text: &str) {
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../grafana/tessera-dashboard.json"))
            .expect("the dashboard is JSON");
    let exposed: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let mut queried = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            queried.extend(metric_names(
                target["expr"].as_str().expect("an expression"),
            ));
        }
    }
    assert!(queried.len() >= 10, "{queried:?}");
    let alerted = metric_names(include_str!("../prometheus/tessera-rules.yml"));
    assert!(alerted.len() >= 6, "{alerted:?}");
    for (what, names) in [("the dashboard", &queried), ("the alert rules", &alerted)] {
        let missing: Vec<_> = names
            .iter()
            .filter(|q| !exposed.contains(q.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{what} query what /metrics lacks: {missing:?}"
        );
    }
}

/// The metrics `text` names (a histogram's `_bucket`, `_count` and `_sum` as itself).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    text.match_indices("tessera_")
        .map(|(i, _)| {
            let name: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name)
                .to_owned()
        })
        .collect()
}

/// One user holds at most two scrapes at once, and a scrape that is not being read holds
/// no one else's turn: another user's scrape is written whole meanwhile.
#[tokio::test]
async fn a_user_holds_two_scrapes_at_most_and_a_slow_reader_blocks_no_one() {
    let control = common::control(JOIN).await;
    control
        .deployments()
        .create_pool(&tessera_control::inputs::PoolInput::named("inference"))
        .await
        .expect("pool");
    common::register_hosts(&control, JOIN, &common::DEMO_HOSTS[2..3]).await;
    let viewer = api_token(&control, Role::Viewer).await.expect("token");
    // Another user (an operator may read what a viewer may).
    let other = api_token(&control, Role::Operator).await.expect("token");
    let state = AppState::new(control.clone(), "127.0.0.1:0".parse().expect("valid"));
    let scrape = |token: &str| {
        Request::builder()
            .uri("/metrics")
            .header(header::HOST, "127.0.0.1:3000")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::empty())
            .expect("request")
    };
    // Two answers whose bodies are not read: they stay in flight.
    let mut held = Vec::new();
    for _ in 0..2 {
        let resp = app(state.clone())
            .oneshot(scrape(&viewer))
            .await
            .expect("answer");
        assert_eq!(resp.status(), StatusCode::OK);
        held.push(resp);
    }
    let third = app(state.clone())
        .oneshot(scrape(&viewer))
        .await
        .expect("answer");
    assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
    let (status, text, _) = send(&state, "GET", "/metrics", Some(&other), None).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    parse(&text);
    assert!(text.contains("tessera_deployments_in_progress"), "{text}");
    // A held scrape read to its end frees its share.
    let first = held.remove(0);
    let bytes = first.into_body().collect().await.expect("body").to_bytes();
    parse(&String::from_utf8_lossy(&bytes));
    let again = app(state.clone())
        .oneshot(scrape(&viewer))
        .await
        .expect("answer");
    assert_eq!(again.status(), StatusCode::OK);
}
