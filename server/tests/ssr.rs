//! Server-side rendering of console pages through the router.
//!
//! One test in its own binary on purpose: lazily loaded routes keep process-wide state
//! that a future of one tokio runtime may be left awaiting after another test's runtime
//! ended; a test binary per runtime keeps rendering deterministic.

mod common;

use axum::http::StatusCode;
use tessera_control::bench::api_token;
use tessera_model::auth::Role;
use tessera_server::{AppState, demo};

const JOIN: &str = "ssr-test-join-token-0001";

/// A page through the router ([`common::send`]), as a browser at `localhost:3000` asks.
async fn get(state: &AppState, uri: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut headers = vec![("host", "localhost:3000".to_owned())];
    headers.extend(token.map(common::bearer));
    let a = common::send(state, axum::http::Method::GET, uri, None, &headers).await;
    (a.status, a.text())
}

#[tokio::test]
async fn pages_render_on_the_server() {
    let control = common::control(JOIN).await;
    demo::seed(&control).await.expect("seed");
    let hosts = &common::DEMO_HOSTS;
    common::register_hosts(&control, JOIN, &[hosts[0], hosts[3]]).await;
    let viewer = api_token(&control, Role::Viewer).await.expect("token");
    let state = AppState::new(control, "127.0.0.1:0".parse().expect("valid"));
    let token = Some(viewer.as_str());

    // Without a session, every page sends the browser to sign in, and shows nothing.
    let (status, html) = get(&state, "/hosts?pool=training", None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(!html.contains("sim-l4-2"));
    let (status, html) = get(&state, "/sign-in", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("Sign in to Tessera"), "{html}");

    let (status, html) = get(&state, "/hosts", token).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("sim-l4-2"), "SSR shows the hosts");
    assert!(html.contains("simulated"), "simulated hosts are labelled");
    assert!(html.contains("NVIDIA H100 80GB HBM3"));

    let (status, html) = get(&state, "/task-definitions", token).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        html.contains("llm-inference"),
        "the demo's definitions are listed"
    );

    let (status, _) = get(&state, "/no-such-page", token).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The audit log is the admins': a viewer's server-rendered /audit shows none of it
    // (the REST route and the server function refuse it too).
    state
        .control
        .accounts()
        .audit(tessera_control::store::NewAuditEntry {
            actor: "admin".into(),
            action: "POST /api/v1/users".into(),
            target: Some("secret-agent-07".into()),
            address: None,
        })
        .await;
    let (_, html) = get(&state, "/audit", token).await;
    assert!(
        !html.contains("secret-agent-07"),
        "a viewer read the audit log through the rendered page"
    );
    let admin = api_token(&state.control, Role::Admin).await.expect("token");
    let (status, html) = get(&state, "/audit", Some(admin.as_str())).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("secret-agent-07"), "an admin reads it");

    // A secret's value is on no page; that it is set is.
    state
        .control
        .deployments()
        .register_task_definition(
            &serde_json::json!({"family": "vault", "containers": [{"name": "main",
            "command": ["sleep", "600"], "cpu_milli": 100, "memory_mib": 64,
            "secrets": {"DB_PASSWORD": "hunter2-on-a-page"}}]}),
        )
        .await
        .expect("definition");
    let (status, html) = get(&state, "/task-definitions/vault", token).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("DB_PASSWORD"), "the secret's name is shown");
    assert!(!html.contains("hunter2"), "its value never is");
}
