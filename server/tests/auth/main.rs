//! Who may do what, through the router: every route and every server function refuses a
//! caller without credentials (401) and a viewer where it changes something (403); cross-site
//! requests, unknown hosts, guessed passwords and revoked credentials are refused with nothing
//! changed; secrets appear in no answer but the agent's sync; the audit log records changes.
//!
//! One test binary, by concern: `routes` (deny by default, declarations), `sessions`,
//! `tokens`, `hosts`, `projects`; the helpers every part shares are here.

#[path = "../common/mod.rs"]
mod common;
mod hosts;
mod projects;
mod routes;
mod sessions;
mod tokens;
mod worked_example;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use leptos::server_fn::ServerFn;
use serde_json::{Value, json};
use tessera_control::Control;
use tessera_control::bench::api_token;
use tessera_model::HostId;
use tessera_model::auth::Role;
use tessera_server::{AppState, app, demo};
use tower::ServiceExt;

const JOIN: &str = "auth-test-join-token-01";
const ORIGIN: &str = "http://127.0.0.1:3000";
const ADMIN_PASSWORD: &str = "admin-password-for-tests";

struct Ctx {
    app: AppState,
    control: Control,
    admin: String,
    viewer: String,
    /// Agent tokens of hosts sim-l4-1 and sim-l4-2.
    agents: std::collections::HashMap<String, String>,
}

async fn ctx() -> Ctx {
    let control = common::control(JOIN).await;
    control
        .accounts()
        .ensure_admin(Some(ADMIN_PASSWORD), false)
        .await
        .expect("admin");
    demo::seed(&control).await.expect("seed");
    let tokens = common::register_hosts(&control, JOIN, &common::DEMO_HOSTS[2..]).await;
    let agents = ["sim-l4-1", "sim-l4-2"]
        .map(String::from)
        .into_iter()
        .zip(tokens)
        .collect();
    Ctx {
        agents,
        app: AppState::new(control.clone(), "127.0.0.1:3000".parse().expect("valid")),
        admin: api_token(&control, Role::Admin).await.expect("token"),
        viewer: api_token(&control, Role::Viewer).await.expect("token"),
        control,
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

/// A request through the router ([`common::send`]), its body read as JSON.
async fn send(
    c: &Ctx,
    method: Method,
    uri: &str,
    body: Option<Value>,
    headers: &[(&str, String)],
) -> Answer {
    let a = common::send(&c.app, method, uri, body.as_ref(), headers).await;
    Answer {
        status: a.status,
        // The live stream never ends: its status is all we need.
        body: if uri.starts_with("/api/v1/live") && a.status.is_success() {
            Value::Null
        } else {
            a.json()
        },
        headers: a.headers,
    }
}

fn bearer(token: &str) -> Vec<(&'static str, String)> {
    vec![common::bearer(token)]
}

/// Everything a refused request must leave as it was.
async fn snapshot(c: &Ctx) -> Value {
    let get = |uri: &'static str| async move {
        send(c, Method::GET, uri, None, &bearer(&c.admin))
            .await
            .body
    };
    json!({
        "hosts": get("/api/v1/hosts").await,
        "pools": get("/api/v1/pools").await,
        "projects": get("/api/v1/projects").await,
        "defs": get("/api/v1/task-definitions").await,
        "services": get("/api/v1/services").await,
        "users": get("/api/v1/users").await,
        "tokens": get("/api/v1/tokens").await,
    })
}

fn concrete(path: &str) -> String {
    // Required query parameters, where a route has them.
    if path == "/api/v1/fit" {
        return "/api/v1/fit?pool=inference".to_owned();
    }
    path.replace("{id}", "sim-l4-1")
        .replace("{name}", "embeddings")
        .replace("{username}", "admin")
}

/// Signs in with a password; returns the session cookie (`name=value`).
async fn sign_in(c: &Ctx, username: &str, password: &str) -> String {
    let a = send(
        c,
        Method::POST,
        "/api/v1/session",
        Some(json!({"username": username, "password": password})),
        &[],
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let cookie = a
        .headers
        .get("set-cookie")
        .expect("a session cookie")
        .to_str()
        .expect("text");
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    assert!(!cookie.contains("Secure"), "plain HTTP: not Secure");
    cookie.split(';').next().expect("name=value").to_owned()
}

async fn host_status(c: &Ctx) -> String {
    c.control
        .store()
        .get_host(&HostId::new("sim-l4-1").expect("valid"))
        .await
        .expect("host")
        .status
        .to_string()
}

/// Projects `research` (with service `r1`) and `other`, and a user who is an operator in
/// each and a viewer elsewhere: rita in research, otto in other. Their session cookies.
async fn two_projects(c: &Ctx) -> (String, String) {
    let admin = bearer(&c.admin);
    for (method, uri, body) in [
        (
            Method::POST,
            "/api/v1/projects",
            json!({"name": "research"}),
        ),
        (Method::POST, "/api/v1/projects", json!({"name": "other"})),
        (
            Method::POST,
            "/api/v1/services",
            json!({"name": "r1", "task_definition": "embeddings:1", "pool": "inference",
                "desired_count": 0, "project": "research"}),
        ),
    ] {
        let a = send(c, method, uri, Some(body), &admin).await;
        assert_eq!(a.status, StatusCode::CREATED, "{uri}: {}", a.body);
    }
    for (user, project) in [("rita", "research"), ("otto", "other")] {
        let a = send(
            c,
            Method::POST,
            "/api/v1/users",
            Some(json!({"username": user, "password": format!("{user}-password-123"), "role": "viewer"})),
            &admin,
        )
        .await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
        let a = send(
            c,
            Method::PUT,
            &format!("/api/v1/projects/{project}/members/{user}"),
            Some(json!({"role": "operator"})),
            &admin,
        )
        .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    }
    (
        sign_in(c, "rita", "rita-password-123").await,
        sign_in(c, "otto", "otto-password-123").await,
    )
}
