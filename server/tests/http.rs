//! The HTTP surface through the router, without a socket: every endpoint, good and bad input.

mod common;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tessera_control::bench::api_token;
use tessera_model::auth::Role;
use tessera_server::{AppState, app, demo};
use tower::ServiceExt;

const JOIN: &str = "http-test-join-token-42";

/// The server's state and an admin's API token, which requests carry unless told otherwise.
struct Ctx {
    app: AppState,
    admin: String,
}

impl std::ops::Deref for Ctx {
    type Target = AppState;
    fn deref(&self) -> &AppState {
        &self.app
    }
}

async fn state() -> Ctx {
    let control = common::control(JOIN).await;
    let admin = api_token(&control, Role::Admin).await.expect("token");
    Ctx {
        app: AppState::new(control, "127.0.0.1:0".parse().expect("valid")),
        admin,
    }
}

/// A request with the admin's token, or with `token` (an agent's) instead.
async fn call(
    state: &Ctx,
    method: Method,
    uri: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    call_as(
        state,
        method,
        uri,
        body,
        Some(token.unwrap_or(&state.admin)),
    )
    .await
}

/// A request with `token`, or without credentials ([`common::send`]).
async fn call_as(
    state: &Ctx,
    method: Method,
    uri: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (StatusCode, Value) {
    let headers: Vec<_> = token.map(common::bearer).into_iter().collect();
    let a = common::send(&state.app, method, uri, body.as_ref(), &headers).await;
    (a.status, a.json())
}

/// The demo's pools and definitions, and its four hosts registered like agents.
async fn demo_fleet(state: &Ctx) {
    demo::seed(&state.control).await.expect("seed");
    common::register_hosts(&state.control, JOIN, &common::DEMO_HOSTS).await;
}

async fn get(state: &Ctx, uri: &str) -> (StatusCode, Value) {
    call(state, Method::GET, uri, None, None).await
}

async fn post(state: &Ctx, uri: &str, body: Value) -> (StatusCode, Value) {
    call(state, Method::POST, uri, Some(body), None).await
}

fn fields(v: &Value) -> Vec<String> {
    v["errors"].as_array().map_or(vec![], |a| {
        a.iter()
            .map(|e| e["field"].as_str().unwrap_or("").to_owned())
            .collect()
    })
}

#[tokio::test]
async fn hosts_api_lists_the_demo_fleet_with_gpus() {
    let state = state().await;
    let (status, body) = get(&state, "/api/v1/hosts").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"hosts": []}));

    demo_fleet(&state).await;
    demo::seed(&state.control)
        .await
        .expect("seeding twice changes nothing");
    let (status, body) = get(&state, "/api/v1/hosts").await;
    assert_eq!(status, StatusCode::OK);
    let hosts = body["hosts"].as_array().expect("array");
    assert_eq!(hosts.len(), 4);
    let h100 = hosts
        .iter()
        .find(|h| h["id"] == "sim-h100-1")
        .expect("H100 host");
    assert_eq!(h100["simulated"], true);
    assert_eq!(h100["pool"], "training");
    assert_eq!(h100["gpus"].as_array().expect("gpus").len(), 8);
    assert_eq!(h100["gpus"][0]["memory"], 80 * 1024);

    let (status, one) = get(&state, "/api/v1/hosts/sim-l4-1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one["gpus"].as_array().expect("gpus").len(), 4);
    assert!(one["tasks"].is_array());
    let (status, _) = get(&state, "/api/v1/hosts/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn healthz_and_openapi() {
    let state = state().await;
    let (status, body) = get(&state, "/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, json!({"status": "ok"}));
    let (status, doc) = get(&state, "/api/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    // Every route is described, with the role the route table enforces.
    for rule in tessera_server::api::routes().rules() {
        let op = &doc["paths"][rule.path.as_str()][rule.method.as_str().to_ascii_lowercase()];
        assert!(
            op.is_object(),
            "{} {} is documented",
            rule.method,
            rule.path
        );
        assert_ne!(
            op["summary"], "(undocumented)",
            "{} {}",
            rule.method, rule.path
        );
        assert_eq!(
            op["x-access"],
            serde_json::to_value(&rule.declared).expect("serialises"),
            "{} {}",
            rule.method,
            rule.path
        );
    }
}

#[tokio::test]
async fn pools_create_list_and_reject_bad_input() {
    let state = state().await;
    let (status, pool) = post(
        &state,
        "/api/v1/pools",
        json!({"name": "gpu-a", "policy": "binpack", "compute_overcommit": 1.5}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(pool["policy"], "binpack");
    let (status, _) = post(&state, "/api/v1/pools", json!({"name": "gpu-a"})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, err) = post(
        &state,
        "/api/v1/pools",
        json!({"name": "Bad!", "policy": "fifo", "mps_client_limit": 99}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(fields(&err), ["name", "policy", "mps_client_limit"]);
    let (status, err) = post(
        &state,
        "/api/v1/pools",
        json!({"name": "x", "colour": "red"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert!(
        err["error"].as_str().expect("message").contains("colour"),
        "{err}"
    );
    let (_, list) = get(&state, "/api/v1/pools").await;
    assert_eq!(
        list["pools"].as_array().expect("pools").len(),
        1,
        "nothing stored from bad input"
    );
}

#[tokio::test]
async fn task_definitions_register_describe_convert_and_deregister() {
    let state = state().await;
    let spec = json!({"family": "llm", "containers": [{"name": "main", "command": ["python", "serve.py"],
        "cpu_milli": 2000, "memory_mib": 4096, "gpu": {"mps": {"memory_mib": 8192, "max_compute_percent": 25}}}]});
    let (status, d1) = post(&state, "/api/v1/task-definitions", spec.clone()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(d1["revision"], 1);
    let (_, d2) = post(&state, "/api/v1/task-definitions", spec).await;
    assert_eq!(d2["revision"], 2, "revisions increase per family");
    let ecs = json!({"family": "emb", "containerDefinitions": [{"name": "w", "command": ["run"], "cpu": 1024, "memory": 512,
        "resourceRequirements": [{"type": "GPU", "value": "1", "sharingStrategy": {"nvidiaMps": {"memory": 4096}}}]}]});
    let (status, e1) = post(&state, "/api/v1/task-definitions", ecs.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{e1}");

    let (_, families) = get(&state, "/api/v1/task-definitions").await;
    let list = families["task_definitions"].as_array().expect("list");
    assert_eq!(list.len(), 2);
    assert_eq!(
        list.iter().find(|f| f["family"] == "llm").expect("llm")["revision"],
        2
    );
    let (_, revisions) = get(&state, "/api/v1/task-definitions/llm").await;
    assert_eq!(
        revisions["revisions"].as_array().expect("revisions").len(),
        2
    );
    let (status, one) = get(&state, "/api/v1/task-definitions/llm:1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        one["spec"]["containers"][0]["gpu"]["mps"]["memory_mib"],
        8192
    );
    let (_, as_ecs) = get(&state, "/api/v1/task-definitions/emb:1?format=ecs").await;
    assert_eq!(
        as_ecs["containerDefinitions"][0]["resourceRequirements"],
        ecs["containerDefinitions"][0]["resourceRequirements"]
    );
    // An ECS GPU definition as people write them comes back as it went in.
    let real = json!({"family": "vllm", "cpu": "2048", "memory": "4096", "networkMode": "awsvpc",
        "executionRoleArn": "arn:aws:iam::123456789012:role/ecsTaskExecutionRole",
        "containerDefinitions": [{"name": "server", "image": "vllm/vllm-openai:v0.6.0", "essential": true,
            "entryPoint": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
            "command": ["--model", "facebook/opt-125m"],
            "portMappings": [{"containerPort": 8000}],
            "logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": "/ecs/vllm"}},
            "resourceRequirements": [{"type": "GPU", "value": "1"}]},
          {"name": "metrics", "image": "prom/statsd-exporter:v0.26.0", "cpu": 100, "memoryReservation": 128}]});
    let (status, v1) = post(&state, "/api/v1/task-definitions", real.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{v1}");
    assert_eq!(
        v1["spec"]["containers"][0]["image"],
        "vllm/vllm-openai:v0.6.0"
    );
    let (_, back) = get(&state, "/api/v1/task-definitions/vllm:1?format=ecs").await;
    assert_eq!(back, real, "nothing dropped, nothing changed");
    let (status, err) = get(&state, "/api/v1/task-definitions/llm:1?format=yaml").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let why = err["error"].as_str().expect("error");
    assert!(why.contains("format") && why.contains("ecs"), "{why}");

    let (status, gone) = call(
        &state,
        Method::DELETE,
        "/api/v1/task-definitions/llm:1",
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(gone["active"], false);
    let (_, still) = get(&state, "/api/v1/task-definitions/llm:1").await;
    assert_eq!(
        still["active"], false,
        "deregistered revisions stay describable"
    );
    let (status, _) = call(
        &state,
        Method::DELETE,
        "/api/v1/task-definitions/llm",
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = get(&state, "/api/v1/task-definitions/nope:3").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get(&state, "/api/v1/task-definitions/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn invalid_task_definitions_get_every_error_and_store_nothing() {
    let state = state().await;
    let (status, err) = post(
        &state,
        "/api/v1/task-definitions",
        json!({"family": "bad name", "containers": [{"name": "a", "command": [""], "cpu_milli": 10, "memory_mib": 1,
            "env": {"CUDA_VISIBLE_DEVICES": "0"}, "gpu": {"mps": {"memory_mib": 10}}}]}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        fields(&err),
        [
            "family",
            "containers[0].command",
            "containers[0].env.CUDA_VISIBLE_DEVICES"
        ]
    );
    let (status, err) = call(&state, Method::POST, "/api/v1/task-definitions", None, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let (_, families) = get(&state, "/api/v1/task-definitions").await;
    assert_eq!(families["task_definitions"], json!([]));
}

async fn fleet(state: &Ctx) -> (String, String) {
    post(state, "/api/v1/pools", json!({"name": "gpu"})).await;
    let mut tokens = Vec::new();
    for name in ["a", "b"] {
        let (status, reg) = post(
            state,
            "/agent/v1/register",
            json!({"join_token": JOIN, "pool": "gpu", "name": name, "cpu_milli": 32000, "memory_mib": 131072,
                "gpus": [{"uuid": format!("GPU-{name}-0"), "index": 0, "model": "NVIDIA L4", "memory_mib": 24576, "healthy": true},
                         {"uuid": format!("GPU-{name}-1"), "index": 1, "model": "NVIDIA L4", "memory_mib": 24576, "healthy": true}]}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{reg}");
        tokens.push(reg["agent_token"].as_str().expect("token").to_owned());
    }
    (tokens[0].clone(), tokens[1].clone())
}

#[tokio::test]
async fn agents_register_with_the_join_token_and_sync_only_as_their_host() {
    let state = state().await;
    post(&state, "/api/v1/pools", json!({"name": "gpu"})).await;
    let body = |token: &str| json!({"join_token": token, "pool": "gpu", "cpu_milli": 1000, "memory_mib": 1024, "gpus": []});
    let (status, _) = post(&state, "/agent/v1/register", body("wrong-token")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, err) = post(&state, "/agent/v1/register", json!({"join_token": JOIN})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    let (a, _) = fleet(&state).await;
    let sync = json!({"gpus": [], "mps": {"healthy": true}, "tasks": []});
    let (status, _) = call(
        &state,
        Method::POST,
        "/agent/v1/sync",
        Some(sync.clone()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call(
        &state,
        Method::POST,
        "/agent/v1/sync",
        Some(sync.clone()),
        Some("forged"),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, resp) = call(&state, Method::POST, "/agent/v1/sync", Some(sync), Some(&a)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(resp["host_id"], "a", "the token acts for its own host only");
}

#[tokio::test]
async fn services_lifecycle_preview_tasks_events_and_drain() {
    let state = state().await;
    let (a, b) = fleet(&state).await;
    let (_, def) = post(
        &state,
        "/api/v1/task-definitions",
        json!({"family": "web", "containers": [{"name": "m", "command": ["sleep", "1d"], "cpu_milli": 1000, "memory_mib": 1024,
            "gpu": {"mps": {"memory_mib": 10240, "max_compute_percent": 50}}}]}),
    )
    .await;
    assert_eq!(def["revision"], 1);

    // Preview first: 5 tasks on 4 GPUs with two 10 GiB slots each all fit; 9 do not.
    let (status, preview) = post(
        &state,
        "/api/v1/placement-preview",
        json!({"task_definition": "web:1", "pool": "gpu", "count": 9}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{preview}");
    assert_eq!(preview["placed"], 8);
    assert_eq!(preview["unplaced"], 1);
    assert!(
        preview["tasks"][8]["message"]
            .as_str()
            .expect("why")
            .contains("no GPU has room")
    );
    assert_eq!(preview["density_before"]["gpus_in_use"], 0);
    assert_eq!(preview["density_after"]["gpus_in_use"], 4);
    let (_, tasks) = get(&state, "/api/v1/tasks").await;
    assert_eq!(tasks["tasks"], json!([]), "a preview commits nothing");
    let (status, err) = post(
        &state,
        "/api/v1/placement-preview",
        json!({"task_definition": "web", "pool": "gpu", "count": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(fields(&err), ["task_definition", "count"]);

    let (status, err) = post(
        &state,
        "/api/v1/services",
        json!({"name": "web", "task_definition": "web:7", "pool": "gpu"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(fields(&err), ["task_definition"]);
    let (status, err) = post(
        &state,
        "/api/v1/services",
        json!({"name": "web", "task_definition": "web:1", "pool": "nope"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(fields(&err), ["pool"]);
    let (status, created) = post(
        &state,
        "/api/v1/services",
        json!({"name": "web", "task_definition": "web:1", "pool": "gpu", "desired_count": 4}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, _) = post(
        &state,
        "/api/v1/services",
        json!({"name": "web", "task_definition": "web:1", "pool": "gpu"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);

    state.control.reconcile_once().await.expect("pass");
    let sync = json!({"gpus": [{"uuid": "GPU-a-0", "index": 0, "model": "NVIDIA L4", "memory_mib": 24576, "healthy": true},
                               {"uuid": "GPU-a-1", "index": 1, "model": "NVIDIA L4", "memory_mib": 24576, "healthy": true}],
                      "mps": {"healthy": true}, "tasks": []});
    let (_, wanted) = call(&state, Method::POST, "/agent/v1/sync", Some(sync), Some(&a)).await;
    let wanted = wanted["tasks"].as_array().expect("tasks").clone();
    assert!(!wanted.is_empty());
    let (_, detail) = get(&state, "/api/v1/services/web").await;
    assert_eq!(detail["desired_count"], 4);
    assert_eq!(detail["deployments"][0]["status"], "primary");
    assert_eq!(
        detail["pending"].as_u64().expect("n") + detail["running"].as_u64().expect("n"),
        4
    );
    let (_, list) = get(&state, "/api/v1/services").await;
    assert_eq!(list["services"].as_array().expect("services").len(), 1);

    let (_, on_a) = get(&state, "/api/v1/tasks?host=a&state=assigned,running").await;
    assert_eq!(on_a["tasks"].as_array().expect("tasks").len(), wanted.len());
    let (status, err) = get(&state, "/api/v1/tasks?state=sleeping").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(fields(&err), ["state"]);

    let (status, err) = call(
        &state,
        Method::PATCH,
        "/api/v1/services/web",
        Some(json!({})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    let (status, err) = call(
        &state,
        Method::PATCH,
        "/api/v1/services/web",
        Some(json!({"task_definition": "web:9"})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    let (status, scaled) = call(
        &state,
        Method::PATCH,
        "/api/v1/services/web",
        Some(json!({"desired_count": 2})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(scaled["desired_count"], 2);
    let (status, _) = call(
        &state,
        Method::PATCH,
        "/api/v1/services/nope",
        Some(json!({"desired_count": 2})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Drain host a: its status changes and the event says so.
    let (status, drained) = post(&state, "/api/v1/hosts/a/drain", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(drained["status"], "draining");
    let (_, active) = post(&state, "/api/v1/hosts/a/activate", json!({})).await;
    assert_eq!(active["status"], "active");
    let (_, events) = get(&state, "/api/v1/events?host=a").await;
    let messages: Vec<&str> = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["message"].as_str().unwrap_or(""))
        .collect();
    assert!(
        messages.iter().any(|m| m.contains("draining")),
        "{messages:?}"
    );
    let (_, events) = get(&state, "/api/v1/events?service=web&limit=5").await;
    assert!(
        events["events"]
            .as_array()
            .expect("events")
            .iter()
            .any(|e| e["message"].as_str().unwrap_or("").contains("created"))
    );

    let (status, _) = call(&state, Method::DELETE, "/api/v1/services/web", None, None).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    state.control.reconcile_once().await.expect("pass");
    let _ = b;
    let (_, detail) = get(&state, "/api/v1/services/web").await;
    assert_eq!(detail["deleting"], true);
}

#[tokio::test]
async fn live_streams_are_capped_and_a_closed_one_frees_its_slot() {
    let mut state = state().await;
    state.app.live_slots = std::sync::Arc::new(tokio::sync::Semaphore::new(1));
    let open = || {
        Request::get("/api/v1/live")
            .header("host", "127.0.0.1:3000")
            .header("authorization", format!("Bearer {}", state.admin))
            .body(Body::empty())
            .expect("request")
    };
    let first = app(state.app.clone())
        .oneshot(open())
        .await
        .expect("answers");
    assert_eq!(first.status(), StatusCode::OK);
    let second = app(state.app.clone())
        .oneshot(open())
        .await
        .expect("answers");
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(first);
    let third = app(state.app.clone())
        .oneshot(open())
        .await
        .expect("answers");
    assert_eq!(third.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_request_stuck_on_a_locked_database_gets_503_and_the_others_wait_their_turn() {
    use sqlx::Connection;
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("tessera.db").display());
    let store = tessera_control::open(&url).await.expect("store");
    let control = tessera_control::Control::new(store, tessera_control::ControlConfig::default());
    let admin = api_token(&control, Role::Admin).await.expect("token");
    let limits = tessera_server::Limits {
        request_timeout: std::time::Duration::from_millis(400),
        concurrent_requests: 1,
        live_streams: 1,
        ..Default::default()
    };
    let state = Ctx {
        app: AppState::new(control, "127.0.0.1:0".parse().expect("valid")).with_limits(limits),
        admin,
    };
    // Another process holds the write lock (a backup, a stuck migration).
    let mut lock = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut lock)
        .await
        .expect("lock");
    let started = std::time::Instant::now();
    let stuck = {
        let state = Ctx {
            app: state.app.clone(),
            admin: state.admin.clone(),
        };
        tokio::spawn(async move {
            let answer = post(&state, "/api/v1/pools", json!({"name": "stuck"})).await;
            (answer.0, std::time::Instant::now())
        })
    };
    // It holds the only slot: a request on any other route waits for it.
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while state.request_slots.available_permits() != 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the stuck request took the slot");
    let (health, _) = get(&state, "/healthz").await;
    let health_at = std::time::Instant::now();
    let (status, stuck_at) = stuck.await.expect("joined");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "answered long before the database's busy timeout: {:?}",
        started.elapsed()
    );
    assert!(
        health_at >= stuck_at,
        "the limit is one for the whole router"
    );
    assert!(
        matches!(health, StatusCode::OK | StatusCode::SERVICE_UNAVAILABLE),
        "{health}"
    );
    sqlx::query("ROLLBACK")
        .execute(&mut lock)
        .await
        .expect("unlock");
    // Nothing of the request that timed out was stored, now or once the database lets
    // writes through again (its write ran in a transaction that was rolled back, not as a
    // statement still queued), and the server serves again.
    for _ in 0..5 {
        let (_, pools) = get(&state, "/api/v1/pools").await;
        assert!(
            !pools.to_string().contains("stuck"),
            "nothing stored: {pools}"
        );
        // Absence cannot be awaited: watch for a while.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (status, _) = post(&state, "/api/v1/pools", json!({"name": "stuck"})).await;
    assert_eq!(status, StatusCode::CREATED);
}

/// Bodies and queries are read as the published schema reads them (the mismatches an
/// independent fuzzer, schemathesis, found): a body is an object at every depth, `5.0` is an
/// integer, a PATCH field the schema does not let be null is refused as null instead of
/// silently changing nothing, a `limit` above its documented maximum and an empty `range`
/// are invalid, a bad `host` in a query is invalid input on every list, and a method the
/// agent API does not have is `405`.
#[tokio::test]
async fn the_api_reads_bodies_and_queries_as_its_schema_says() {
    let state = state().await;
    demo_fleet(&state).await;
    let patch = |body: Value| {
        let state = &state;
        async move {
            call(
                state,
                Method::PATCH,
                "/api/v1/services/summarizer",
                Some(body),
                None,
            )
            .await
        }
    };
    let (_, before) = get(&state, "/api/v1/services/summarizer").await;

    // Arrays are not objects, at the top or inside.
    let (status, err) = patch(json!([3])).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert!(
        err["error"]
            .as_str()
            .unwrap()
            .contains("expected struct ServicePatch"),
        "{err}"
    );
    let (status, err) = patch(json!({"constraints": [false, [], {}, null, null]})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert!(
        err["error"]
            .as_str()
            .unwrap()
            .contains("constraints: invalid type: sequence"),
        "{err}"
    );
    let (status, err) = patch(json!({"alarms": [["error_rate", 0.5, null, 30]]})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert!(
        err["error"]
            .as_str()
            .unwrap()
            .contains("alarms[0]: invalid type: sequence"),
        "{err}"
    );

    // Null where the schema has no null changes nothing and says so.
    for field in [
        "desired_count",
        "task_definition",
        "constraints",
        "deployment",
        "stop_timeout_secs",
        "deregistration_delay_secs",
        "alarms",
        "bake_secs",
    ] {
        let (status, err) = patch(json!({ field: null })).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {err}");
        let message = err["error"].as_str().unwrap();
        assert!(
            message.contains(&format!("{field}: invalid type: null")),
            "{message}"
        );
    }
    let (_, after) = get(&state, "/api/v1/services/summarizer").await;
    assert_eq!(
        before["service"], after["service"],
        "nothing refused was stored"
    );
    let (status, err) = call(
        &state,
        Method::PATCH,
        "/api/v1/users/admin",
        Some(json!({"disabled": null})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");

    // 5.0 is the integer 5; 5.5 is not an integer.
    let (status, body) = patch(json!({"desired_count": 3.0, "bake_secs": 0.0})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, after) = get(&state, "/api/v1/services/summarizer").await;
    assert_eq!(after["desired_count"], 3, "{after}");
    let (status, err) = patch(json!({"desired_count": 3.5})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");

    // Queries: a limit above the documented maximum, an empty range, a bad host.
    for (uri, field) in [
        ("/api/v1/events?limit=1001", "limit"),
        ("/api/v1/audit?limit=1001", "limit"),
        ("/api/v1/tasks?limit=10001", "limit"),
        ("/api/v1/events?host=Not_A_Host", "host"),
        ("/api/v1/tasks?host=Not_A_Host", "host"),
        ("/api/v1/services/summarizer/fit?range=", "range"),
        ("/api/v1/services/summarizer/work?range=", "range"),
    ] {
        let (status, err) = get(&state, uri).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{uri}: {err}");
        assert_eq!(fields(&err), vec![field.to_owned()], "{uri}: {err}");
    }
    let (status, body) = get(&state, "/api/v1/events?limit=1000").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the maximum itself is allowed: {body}"
    );

    // The agent API is POST only.
    let (status, _) = call_as(&state, Method::GET, "/agent/v1/sync", None, None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let (status, _) = call_as(
        &state,
        Method::POST,
        "/agent/v1/sync",
        Some(json!({})),
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a POST still needs an agent token"
    );
}

/// Projects have no roles of their own yet: an operator may not put a service in a project
/// other than `default`, ask for the production class, or move a service; an admin may.
#[tokio::test]
async fn a_services_project_and_production_class_are_the_admins_to_give() {
    let state = state().await;
    demo_fleet(&state).await;
    let operator = api_token(&state.control, Role::Operator)
        .await
        .expect("token");
    let (status, _) = post(&state, "/api/v1/projects", json!({"name": "research"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let body = |extra: Value| {
        let mut b = json!({"name": "svc", "task_definition": "embeddings:1", "pool": "inference", "desired_count": 0});
        b.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        b
    };
    for extra in [
        json!({"project": "research"}),
        json!({"priority": "production"}),
    ] {
        let (status, err) = call_as(
            &state,
            Method::POST,
            "/api/v1/services",
            Some(body(extra.clone())),
            Some(&operator),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{extra}: {err}");
    }
    let (status, err) = call_as(
        &state,
        Method::POST,
        "/api/v1/services",
        Some(body(json!({"priority": "batch"}))),
        Some(&operator),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "batch is a step down: {err}");
    let (status, _) = call_as(
        &state,
        Method::PATCH,
        "/api/v1/services/svc",
        Some(json!({"project": "research"})),
        Some(&operator),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, moved) = call(
        &state,
        Method::PATCH,
        "/api/v1/services/svc",
        Some(json!({"project": "research", "priority": "production"})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{moved}");
    assert_eq!(moved["project"], "research");
    assert_eq!(moved["priority"], "production");
    // A class that is none: refused by its type, naming the field and the classes, and
    // nothing changes.
    for (method, path, bad) in [
        (
            Method::POST,
            "/api/v1/services",
            body(json!({"name": "svc2", "priority": "urgent"})),
        ),
        (
            Method::PATCH,
            "/api/v1/services/svc",
            json!({"priority": "urgent"}),
        ),
    ] {
        let (status, err) = call(&state, method, path, Some(bad), None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{err}");
        let said = err.to_string();
        assert!(
            said.contains("priority") && said.contains("production"),
            "{said}"
        );
    }
    let (_, kept) = call(&state, Method::GET, "/api/v1/services/svc", None, None).await;
    assert_eq!(kept["priority"], "production", "{kept}");
}

/// Log reads, follows and exec sessions held open are capped per user: one user (a leaked
/// token) cannot hold every stream of the server, another is not held up, and a stream
/// whose client leaves gives its turn back.
#[tokio::test]
async fn a_user_holds_at_most_its_share_of_log_and_exec_streams() {
    let mut state = state().await;
    state.app = state.app.clone().with_limits(tessera_server::Limits {
        task_streams_per_user: 2,
        ..Default::default()
    });
    fleet(&state).await;
    post(
        &state,
        "/api/v1/task-definitions",
        json!({"family": "web", "containers": [{"name": "m", "command": ["sleep", "1d"], "cpu_milli": 1000, "memory_mib": 1024}]}),
    )
    .await;
    let (status, created) = post(
        &state,
        "/api/v1/services",
        json!({"name": "web", "task_definition": "web:1", "pool": "gpu", "desired_count": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    state.control.reconcile_once().await.expect("pass");
    let (_, tasks) = get(&state, "/api/v1/tasks").await;
    let id = tasks["tasks"][0]["id"].as_str().expect("placed").to_owned();
    // The task's host has no agent here: each follow waits for it to pick its order up.
    let follow = |token: String| {
        let app = app(state.app.clone());
        let uri = format!("/api/v1/tasks/{id}/logs?follow=true");
        async move {
            app.oneshot(
                Request::get(uri)
                    .header("host", "127.0.0.1:3000")
                    .header("authorization", format!("Bearer {token}"))
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("answers")
        }
    };
    let first = follow(state.admin.clone()).await;
    let second = follow(state.admin.clone()).await;
    assert_eq!(
        (first.status(), second.status()),
        (StatusCode::OK, StatusCode::OK)
    );
    let third = follow(state.admin.clone()).await;
    assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
    let why = axum::body::to_bytes(third.into_body(), 1 << 16)
        .await
        .expect("body");
    let why = String::from_utf8_lossy(&why);
    assert!(
        why.contains("admin") && why.contains("2 log and exec streams open already"),
        "{why}"
    );
    let operator = api_token(&state.control, Role::Operator)
        .await
        .expect("token");
    assert_eq!(
        follow(operator).await.status(),
        StatusCode::OK,
        "another user"
    );
    // The client of one leaves: its turn comes back.
    drop(first);
    tessera_control::testkit::wait_until("the turn given back", || async {
        let again = follow(state.admin.clone()).await;
        again.status() == StatusCode::OK
    })
    .await;
    drop(second);
}
