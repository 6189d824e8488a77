//! Who may do what, through the router: every route and every server function refuses a
//! caller without credentials (401) and a viewer where it changes something (403); cross-site
//! requests, unknown hosts, guessed passwords and revoked credentials are refused with nothing
//! changed; secrets appear in no answer but the agent's sync; the audit log records changes.

mod common;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use leptos::server_fn::ServerFn;
use serde_json::{Value, json};
use tessera_control::Control;
use tessera_control::bench::api_token;
use tessera_model::HostId;
use tessera_model::auth::Role;
use tessera_server::auth::{Access, server_fn_rules};
use tessera_server::{AppState, api, app, demo};
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

/// Every route's role, written out here rather than read from the declarations, so a role
/// changes only on purpose (both the handler's `x-required-role` and this list).
#[test]
fn every_route_has_the_role_this_list_gives_it() {
    let expected: Vec<(&str, &str, &str)> = vec![
        ("GET", "/healthz", "none"),
        ("GET", "/metrics", "viewer"),
        ("GET", "/api/v1/openapi.json", "none"),
        ("POST", "/api/v1/session", "none"),
        ("GET", "/api/v1/session", "viewer"),
        ("DELETE", "/api/v1/session", "none"),
        ("POST", "/api/v1/session/token", "none"),
        ("POST", "/api/v1/session/end", "none"),
        ("GET", "/api/v1/hosts", "viewer"),
        ("GET", "/api/v1/hosts/{id}", "viewer"),
        ("DELETE", "/api/v1/hosts/{id}", "admin"),
        ("POST", "/api/v1/hosts/{id}/drain", "operator"),
        ("POST", "/api/v1/hosts/{id}/activate", "operator"),
        ("POST", "/api/v1/hosts/{id}/revoke", "admin"),
        ("POST", "/api/v1/hosts/{id}/approve", "admin"),
        ("POST", "/api/v1/join-token", "admin"),
        ("GET", "/api/v1/join-tokens", "admin"),
        ("POST", "/api/v1/join-tokens", "admin"),
        ("DELETE", "/api/v1/join-tokens/{id}", "admin"),
        ("GET", "/api/v1/cluster", "viewer"),
        ("GET", "/api/v1/pools", "viewer"),
        ("POST", "/api/v1/pools", "admin"),
        ("PATCH", "/api/v1/pools/{name}", "admin"),
        ("GET", "/api/v1/projects", "viewer"),
        ("POST", "/api/v1/projects", "admin"),
        ("GET", "/api/v1/projects/{name}", "viewer"),
        ("PUT", "/api/v1/projects/{name}", "admin"),
        ("DELETE", "/api/v1/projects/{name}", "admin"),
        ("PUT", "/api/v1/projects/{name}/members/{username}", "admin"),
        ("GET", "/api/v1/preemptions", "viewer"),
        ("POST", "/api/v1/preemptions/{id}/approve", "operator"),
        ("POST", "/api/v1/preemptions/{id}/decline", "operator"),
        ("GET", "/api/v1/projects/{name}/usage", "viewer"),
        (
            "DELETE",
            "/api/v1/projects/{name}/members/{username}",
            "admin",
        ),
        ("GET", "/api/v1/task-definitions", "viewer"),
        ("POST", "/api/v1/task-definitions", "operator"),
        ("GET", "/api/v1/task-definitions/{id}", "viewer"),
        ("DELETE", "/api/v1/task-definitions/{id}", "operator"),
        ("GET", "/api/v1/services", "viewer"),
        ("POST", "/api/v1/services", "project-operator"),
        ("GET", "/api/v1/services/{name}", "viewer"),
        ("PATCH", "/api/v1/services/{name}", "project-operator"),
        ("DELETE", "/api/v1/services/{name}", "project-operator"),
        ("POST", "/api/v1/placement-preview", "operator"),
        ("GET", "/api/v1/services/{name}/fit", "viewer"),
        ("GET", "/api/v1/fit", "viewer"),
        ("GET", "/api/v1/services/{name}/work", "viewer"),
        ("GET", "/api/v1/services/{name}/endpoints", "viewer"),
        ("GET", "/api/v1/discovery/prometheus", "viewer"),
        ("GET", "/api/v1/services/{name}/right-size", "viewer"),
        ("POST", "/api/v1/services/{name}/right-size", "operator"),
        ("GET", "/api/v1/consolidation-plans", "viewer"),
        ("POST", "/api/v1/consolidation-plans", "operator"),
        ("GET", "/api/v1/consolidation-plans/{id}", "viewer"),
        (
            "POST",
            "/api/v1/consolidation-plans/{id}/execute",
            "operator",
        ),
        (
            "POST",
            "/api/v1/consolidation-plans/{id}/cancel",
            "operator",
        ),
        ("GET", "/api/v1/tasks", "viewer"),
        ("GET", "/api/v1/events", "viewer"),
        ("GET", "/api/v1/live", "viewer"),
        ("GET", "/api/v1/tokens", "admin"),
        ("POST", "/api/v1/tokens", "admin"),
        ("DELETE", "/api/v1/tokens/{id}", "viewer"),
        ("GET", "/api/v1/users", "admin"),
        ("POST", "/api/v1/users", "admin"),
        ("PATCH", "/api/v1/users/{username}", "admin"),
        ("GET", "/api/v1/audit", "admin"),
        ("POST", "/agent/v1/register", "agent"),
        ("POST", "/agent/v1/sync", "agent"),
    ];
    let mut declared: Vec<(String, String, String)> = api::routes()
        .rules()
        .iter()
        .map(|r| {
            (
                r.method.to_string(),
                r.path.clone(),
                r.access.as_str().to_owned(),
            )
        })
        .collect();
    let mut expected: Vec<(String, String, String)> = expected
        .into_iter()
        .map(|(m, p, r)| (m.to_owned(), p.to_owned(), r.to_owned()))
        .collect();
    declared.sort();
    expected.sort();
    assert_eq!(declared, expected);
}

#[tokio::test]
async fn every_route_refuses_callers_without_credentials_or_role() {
    let c = ctx().await;
    let before = snapshot(&c).await;
    let routes = api::routes();
    assert!(routes.rules().len() >= 30, "the walk covers the API");
    for rule in routes.rules() {
        let uri = concrete(&rule.path);
        let body = (rule.method != Method::GET && rule.method != Method::DELETE).then(|| json!({}));
        let anonymous = send(&c, rule.method.clone(), &uri, body.clone(), &[]).await;
        let viewer = send(
            &c,
            rule.method.clone(),
            &uri,
            body.clone(),
            &bearer(&c.viewer),
        )
        .await;
        let bad_token = send(
            &c,
            rule.method.clone(),
            &uri,
            body,
            &bearer("tsr_not-a-token"),
        )
        .await;
        match rule.access {
            Access::Role(role) | Access::InProject(role) => {
                assert_eq!(
                    anonymous.status,
                    StatusCode::UNAUTHORIZED,
                    "{} {uri}",
                    rule.method
                );
                assert!(
                    anonymous.body["error"].is_string(),
                    "a JSON error: {}",
                    anonymous.body
                );
                assert_eq!(
                    bad_token.status,
                    StatusCode::UNAUTHORIZED,
                    "{} {uri}",
                    rule.method
                );
                if role > Role::Viewer {
                    assert_eq!(
                        viewer.status,
                        StatusCode::FORBIDDEN,
                        "{} {uri}",
                        rule.method
                    );
                    assert!(
                        viewer.body["error"]
                            .as_str()
                            .is_some_and(|e| e.contains(role.as_str()))
                    );
                } else {
                    // Let through: an answer, or one about the state of things (nothing to
                    // right-size yet), never a refusal.
                    assert!(
                        viewer.status.is_success()
                            || viewer.status == StatusCode::NOT_FOUND
                            || viewer.status == StatusCode::CONFLICT,
                        "{} {uri}: {}",
                        rule.method,
                        viewer.status
                    );
                }
            }
            Access::Public | Access::Agent => {
                // Open routes: never a role check (their handlers check what they need).
                assert_ne!(
                    anonymous.status,
                    StatusCode::FORBIDDEN,
                    "{} {uri}",
                    rule.method
                );
            }
        }
    }
    assert_eq!(
        snapshot(&c).await,
        before,
        "refused requests change nothing"
    );
}

#[tokio::test]
async fn every_server_function_has_a_rule_and_is_refused_without_it() {
    let c = ctx().await;
    let rules = server_fn_rules();
    let registered: Vec<(&str, Method)> = leptos::server_fn::axum::server_fn_paths().collect();
    assert!(
        registered.len() >= 17,
        "the console's server functions are registered"
    );
    let before = snapshot(&c).await;
    for (path, method) in &registered {
        let (name, access) = rules
            .get(path)
            .unwrap_or_else(|| panic!("server function {path} has no access rule"));
        let anonymous = send(
            &c,
            method.clone(),
            path,
            None,
            &[("origin", ORIGIN.to_owned())],
        )
        .await;
        let viewer = send(&c, method.clone(), path, None, &bearer(&c.viewer)).await;
        match access {
            Access::Role(role) | Access::InProject(role) => {
                assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED, "{name}");
                if *role > Role::Viewer {
                    assert_eq!(viewer.status, StatusCode::FORBIDDEN, "{name}");
                }
            }
            _ => assert_eq!(*name, "current_caller", "only who-am-I is open"),
        }
    }
    let unknown = send(
        &c,
        Method::POST,
        "/api/not_a_server_fn",
        None,
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::FORBIDDEN, "no rule, no entry");
    assert_eq!(snapshot(&c).await, before);

    // Signed in on the console's own page, a server function does its work.
    let cookie = sign_in(&c, "admin", ADMIN_PASSWORD).await;
    let req = Request::post(tessera_app::pages::host::SetHostDraining::PATH)
        .header("host", "127.0.0.1:3000")
        .header("cookie", &cookie)
        .header("sec-fetch-site", "same-origin")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("id=sim-l4-1&drain=true"))
        .expect("request");
    let a = app(c.app.clone()).oneshot(req).await.expect("answers");
    assert_eq!(a.status(), StatusCode::OK);
    assert_eq!(host_status(&c).await, "draining");
    // The audit log names the function as its source does.
    let audit = send(&c, Method::GET, "/api/v1/audit", None, &bearer(&c.admin)).await;
    let actions: Vec<&str> = audit.body["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert!(
        actions.contains(&"server function set_host_draining"),
        "{actions:?}"
    );
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

#[tokio::test]
async fn cross_site_requests_with_a_session_are_refused() {
    let c = ctx().await;
    let cookie = sign_in(&c, "admin", ADMIN_PASSWORD).await;
    let who = send(
        &c,
        Method::GET,
        "/api/v1/session",
        None,
        &[("cookie", cookie.clone())],
    )
    .await;
    assert_eq!(who.body["name"], "admin");
    assert_eq!(who.body["role"], "admin");

    // REST, body-less POST, from another site.
    let evil = send(
        &c,
        Method::POST,
        "/api/v1/hosts/sim-l4-1/drain",
        None,
        &[
            ("cookie", cookie.clone()),
            ("origin", "http://evil.example".into()),
        ],
    )
    .await;
    assert_eq!(evil.status, StatusCode::FORBIDDEN, "{}", evil.body);
    // A server function, by a browser that says the request is cross-site.
    let path = tessera_app::pages::host::SetHostDraining::PATH;
    let req = Request::post(path)
        .header("host", "127.0.0.1:3000")
        .header("cookie", &cookie)
        .header("sec-fetch-site", "cross-site")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from("id=sim-l4-1&drain=true"))
        .expect("request");
    let a = app(c.app.clone()).oneshot(req).await.expect("answers");
    assert_eq!(a.status(), StatusCode::FORBIDDEN);
    // With the cookie but no Origin at all (not a browser on our page).
    let bare = send(
        &c,
        Method::POST,
        "/api/v1/hosts/sim-l4-1/drain",
        None,
        &[("cookie", cookie.clone())],
    )
    .await;
    assert_eq!(bare.status, StatusCode::FORBIDDEN);
    assert_eq!(host_status(&c).await, "active", "nothing changed");

    // From the console's own page it works.
    let ok = send(
        &c,
        Method::POST,
        "/api/v1/hosts/sim-l4-1/drain",
        None,
        &[("cookie", cookie.clone()), ("origin", ORIGIN.into())],
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    assert_eq!(host_status(&c).await, "draining");
    // (A server function called from the console's own page: in the server function test,
    // the one test here that runs server functions.)

    // Signed out, the cookie is worth nothing.
    let out = send(
        &c,
        Method::DELETE,
        "/api/v1/session",
        None,
        &[("cookie", cookie.clone()), ("origin", ORIGIN.into())],
    )
    .await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    let who = send(
        &c,
        Method::GET,
        "/api/v1/session",
        None,
        &[("cookie", cookie)],
    )
    .await;
    assert_eq!(who.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn unknown_hosts_and_fixed_session_ids_are_refused() {
    let c = ctx().await;
    let req = Request::get("/api/v1/hosts")
        .header("host", "evil.example")
        .header("authorization", format!("Bearer {}", c.admin))
        .body(Body::empty())
        .expect("request");
    let a = app(c.app.clone()).oneshot(req).await.expect("answers");
    assert_eq!(
        a.status(),
        StatusCode::BAD_REQUEST,
        "DNS rebinding: unknown Host"
    );
    // A session id planted before sign-in is not the one signed in.
    let planted = "tessera_session=AAAAAAAAAAAAAAAAAAAAAA";
    let a = send(
        &c,
        Method::POST,
        "/api/v1/session",
        Some(json!({"username": "admin", "password": ADMIN_PASSWORD})),
        &[("cookie", planted.into())],
    )
    .await;
    let set = a
        .headers
        .get("set-cookie")
        .expect("cookie")
        .to_str()
        .expect("text");
    assert!(
        !set.starts_with(planted),
        "a new session id at sign-in: {set}"
    );
}

#[tokio::test]
async fn failed_sign_ins_are_limited_and_disabled_users_are_out_at_once() {
    let c = ctx().await;
    for _ in 0..5 {
        let a = send(
            &c,
            Method::POST,
            "/api/v1/session",
            Some(json!({"username": "admin", "password": "guess-guess-guess"})),
            &[],
        )
        .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    }
    let a = send(
        &c,
        Method::POST,
        "/api/v1/session",
        Some(json!({"username": "admin", "password": ADMIN_PASSWORD})),
        &[],
    )
    .await;
    assert_eq!(
        a.status,
        StatusCode::TOO_MANY_REQUESTS,
        "even the right password waits"
    );
    assert!(a.headers.contains_key("retry-after"));

    // An operator made by the admin signs in, works, and is out once disabled.
    let made = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "olga", "password": "olga-password-1", "role": "operator"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    assert!(made.body.get("password_hash").is_none());
    let short = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "bob", "password": "short"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(short.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(short.body["errors"][0]["field"], "password");
    let cookie = sign_in(&c, "olga", "olga-password-1").await;
    let scaled = send(
        &c,
        Method::PATCH,
        "/api/v1/services/embeddings",
        Some(json!({"desired_count": 2})),
        &[("cookie", cookie.clone()), ("origin", ORIGIN.into())],
    )
    .await;
    assert_eq!(scaled.status, StatusCode::OK, "{}", scaled.body);
    let pool = send(
        &c,
        Method::POST,
        "/api/v1/pools",
        Some(json!({"name": "x"})),
        &[("cookie", cookie.clone()), ("origin", ORIGIN.into())],
    )
    .await;
    assert_eq!(pool.status, StatusCode::FORBIDDEN, "pools are the admin's");
    let off = send(
        &c,
        Method::PATCH,
        "/api/v1/users/olga",
        Some(json!({"disabled": true})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(off.status, StatusCode::OK, "{}", off.body);
    let after = send(
        &c,
        Method::GET,
        "/api/v1/hosts",
        None,
        &[("cookie", cookie)],
    )
    .await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
    // The last enabled admin cannot be disabled or demoted.
    let one = send(
        &c,
        Method::PATCH,
        "/api/v1/users/admin",
        Some(json!({"disabled": true})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(
        one.status,
        StatusCode::OK,
        "another admin is left: {}",
        one.body
    );
    let last = send(
        &c,
        Method::PATCH,
        "/api/v1/users/bench-admin",
        Some(json!({"role": "viewer"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(last.status, StatusCode::CONFLICT, "{}", last.body);
}

#[tokio::test]
async fn a_login_token_has_its_users_role_and_only_its_owner_or_an_admin_deletes_it() {
    let c = ctx().await;
    let made = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "olga", "password": "olga-operator-pw", "role": "operator"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let wrong = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "olga", "password": "not-it", "name": "cli olga@laptop"})),
        &[],
    )
    .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert!(!wrong.body.to_string().contains("tsr_"));
    let login = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "olga", "password": "olga-operator-pw", "name": "cli olga@laptop", "expires_in_days": 90})),
        &[],
    )
    .await;
    assert_eq!(login.status, StatusCode::CREATED, "{}", login.body);
    assert_eq!(login.body["role"], "operator");
    assert_eq!(login.body["created_by"], "olga");
    let token = login.body["token"].as_str().expect("shown once").to_owned();
    let id = login.body["id"].as_str().expect("id").to_owned();
    let me = send(&c, Method::GET, "/api/v1/session", None, &bearer(&token)).await;
    assert_eq!(me.body["role"], "operator");
    // Someone else's token: only an admin may delete it.
    let other = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{id}"),
        None,
        &bearer(&c.viewer),
    )
    .await;
    assert_eq!(other.status, StatusCode::FORBIDDEN, "{}", other.body);
    // Its own: `tessera logout`.
    let own = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{id}"),
        None,
        &bearer(&token),
    )
    .await;
    assert_eq!(own.status, StatusCode::NO_CONTENT, "{}", own.body);
    let after = send(&c, Method::GET, "/api/v1/hosts", None, &bearer(&token)).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn api_tokens_are_shown_once_and_stop_working_when_deleted() {
    let c = ctx().await;
    let made = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "ci", "role": "operator", "expires_in_days": 30})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let token = made.body["token"].as_str().expect("shown once").to_owned();
    assert!(token.starts_with("tsr_"));
    assert!(made.body["expires_at"].is_string());
    let list = send(&c, Method::GET, "/api/v1/tokens", None, &bearer(&c.admin)).await;
    let text = list.body.to_string();
    assert!(!text.contains(&token) && !text.contains("hash"), "{text}");
    let scaled = send(
        &c,
        Method::PATCH,
        "/api/v1/services/embeddings",
        Some(json!({"desired_count": 1})),
        &bearer(&token),
    )
    .await;
    assert_eq!(scaled.status, StatusCode::OK, "{}", scaled.body);
    let bad = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "x", "expires_in_days": 0})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    let id = made.body["id"].as_str().expect("id");
    let gone = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{id}"),
        None,
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    let after = send(&c, Method::GET, "/api/v1/hosts", None, &bearer(&token)).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);

    // The audit log names who did what, on what; admins only.
    let audit = send(
        &c,
        Method::GET,
        "/api/v1/audit?q=services",
        None,
        &bearer(&c.admin),
    )
    .await;
    let entries = audit.body["entries"].as_array().expect("entries");
    let scale = entries
        .iter()
        .find(|e| e["action"] == "PATCH /api/v1/services/embeddings")
        .expect("recorded");
    assert_eq!(scale["actor"], "token ci (by bench-admin)");
    assert_eq!(scale["target"], "embeddings");
    let viewer = send(&c, Method::GET, "/api/v1/audit", None, &bearer(&c.viewer)).await;
    assert_eq!(viewer.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn secrets_are_in_no_answer_but_the_agents_sync() {
    let c = ctx().await;
    let def = json!({"family": "vault", "containers": [{"name": "main", "command": ["sleep", "600"],
        "cpu_milli": 100, "memory_mib": 64, "env": {"MODE": "plain-value"},
        "secrets": {"DB_PASSWORD": "hunter2-secret"}, "gpu": {"mps": {"memory_mib": 1024}}}]});
    let made = send(
        &c,
        Method::POST,
        "/api/v1/task-definitions",
        Some(def),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    // Registering again what a description shows keeps the value.
    let shown = send(
        &c,
        Method::GET,
        "/api/v1/task-definitions/vault:1",
        None,
        &bearer(&c.viewer),
    )
    .await;
    assert_eq!(
        shown.body["spec"]["containers"][0]["secrets"]["DB_PASSWORD"],
        json!({"set": true})
    );
    assert_eq!(
        shown.body["spec"]["containers"][0]["env"]["MODE"],
        "plain-value"
    );
    let again = send(
        &c,
        Method::POST,
        "/api/v1/task-definitions",
        Some(shown.body["spec"].clone()),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
    let service = send(
        &c,
        Method::POST,
        "/api/v1/services",
        Some(json!({"name": "vault", "task_definition": "vault:2",
        "pool": "inference", "desired_count": 1})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(service.status, StatusCode::CREATED, "{}", service.body);
    c.control.reconcile_once().await.expect("pass");

    let mut everything = String::new();
    for uri in [
        "/api/v1/task-definitions",
        "/api/v1/task-definitions/vault",
        "/api/v1/task-definitions/vault:1",
        "/api/v1/task-definitions/vault:2?format=ecs",
        "/api/v1/services/vault",
        "/api/v1/tasks",
        "/api/v1/events",
        "/api/v1/audit",
        "/api/v1/hosts/sim-l4-1",
        "/api/v1/hosts/sim-l4-2",
    ] {
        let a = send(&c, Method::GET, uri, None, &bearer(&c.admin)).await;
        assert_eq!(a.status, StatusCode::OK, "{uri}");
        everything.push_str(&a.body.to_string());
    }
    // Console pages are checked in tests/ssr.rs (rendering wants a test binary of its own).
    assert!(
        !everything.contains("hunter2"),
        "a secret leaked into an answer"
    );
    assert!(everything.contains("plain-value"));

    // The host that runs the task gets it in its sync answer.
    let task = c
        .control
        .store()
        .list_tasks(&Default::default())
        .await
        .expect("tasks")
        .into_iter()
        .find(|t| t.service == "vault")
        .expect("the vault task");
    let host = task.host.expect("placed");
    let token = c.agents[host.as_str()].clone();
    let sync = send(
        &c,
        Method::POST,
        "/agent/v1/sync",
        Some(common::sync_body(&c.control, &host).await),
        &bearer(&token),
    )
    .await;
    assert_eq!(sync.status, StatusCode::OK, "{}", sync.body);
    let wanted = sync.body["tasks"].as_array().expect("tasks");
    let mine = wanted
        .iter()
        .find(|t| t["task_id"] == task.id)
        .expect("the vault task is wanted");
    assert_eq!(
        mine["containers"][0]["secrets"]["DB_PASSWORD"],
        "hunter2-secret"
    );
}

#[tokio::test]
async fn admins_revoke_agents_delete_idle_hosts_and_rotate_the_join_token() {
    let c = ctx().await;
    let host = HostId::new("sim-l4-2").expect("valid");
    let token = c.agents[host.as_str()].clone();
    let body = common::sync_body(&c.control, &host).await;
    let ok = send(
        &c,
        Method::POST,
        "/agent/v1/sync",
        Some(body.clone()),
        &bearer(&token),
    )
    .await;
    assert_eq!(ok.status, StatusCode::OK);
    let revoked = send(
        &c,
        Method::POST,
        "/api/v1/hosts/sim-l4-2/revoke",
        None,
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(revoked.status, StatusCode::OK, "{}", revoked.body);
    let refused = send(
        &c,
        Method::POST,
        "/agent/v1/sync",
        Some(body),
        &bearer(&token),
    )
    .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);

    let gone = send(
        &c,
        Method::DELETE,
        "/api/v1/hosts/sim-l4-2",
        None,
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT, "{}", gone.body);
    // The same machine (same GPU UUIDs) joins again.
    common::register_hosts(&c.control, JOIN, &common::DEMO_HOSTS[3..]).await;

    let rotated = send(
        &c,
        Method::POST,
        "/api/v1/join-token",
        None,
        &bearer(&c.admin),
    )
    .await;
    let new = rotated.body["join_token"]
        .as_str()
        .expect("shown once")
        .to_owned();
    let old = send(
        &c,
        Method::POST,
        "/agent/v1/register",
        Some(common::register_body(JOIN, "late")),
        &[],
    )
    .await;
    assert_eq!(old.status, StatusCode::UNAUTHORIZED);
    let fresh = send(
        &c,
        Method::POST,
        "/agent/v1/register",
        Some(common::register_body(&new, "late")),
        &[],
    )
    .await;
    assert_eq!(fresh.status, StatusCode::CREATED, "{}", fresh.body);
}

/// A read-only credential deletes nothing above its role: a viewer token an admin made
/// cannot delete that admin's admin token. And a token is worth no more than its user is
/// now: demoting the user demotes the token.
#[tokio::test]
async fn a_tokens_role_bounds_what_it_deletes_and_follows_its_users_role() {
    let c = ctx().await;
    let made = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "dora", "password": "dora-admin-password", "role": "admin"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let login = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "dora", "password": "dora-admin-password", "name": "cli dora"})),
        &[],
    )
    .await;
    assert_eq!(login.status, StatusCode::CREATED, "{}", login.body);
    let dora = login.body["token"].as_str().expect("token").to_owned();
    let dora_id = login.body["id"].as_str().expect("id").to_owned();
    let viewer = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "dashboards", "role": "viewer"})),
        &bearer(&dora),
    )
    .await;
    assert_eq!(viewer.status, StatusCode::CREATED, "{}", viewer.body);
    let viewer = viewer.body["token"].as_str().expect("token").to_owned();
    let attack = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{dora_id}"),
        None,
        &bearer(&viewer),
    )
    .await;
    assert_eq!(attack.status, StatusCode::FORBIDDEN, "{}", attack.body);
    let still = send(&c, Method::GET, "/api/v1/audit", None, &bearer(&dora)).await;
    assert_eq!(
        still.status,
        StatusCode::OK,
        "the admin's token still works"
    );
    // Not even a token of its own role: a read-only credential changes nothing but itself.
    let other = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "wallboard", "role": "viewer"})),
        &bearer(&dora),
    )
    .await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.body);
    let other_id = other.body["id"].as_str().expect("id").to_owned();
    let attack = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{other_id}"),
        None,
        &bearer(&viewer),
    )
    .await;
    assert_eq!(attack.status, StatusCode::FORBIDDEN, "{}", attack.body);
    // Itself: `tessera logout`.
    let mine = send(&c, Method::GET, "/api/v1/tokens", None, &bearer(&dora)).await;
    let own_id = mine.body["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .find(|t| t["name"] == "dashboards")
        .expect("the viewer token")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let logout = send(
        &c,
        Method::DELETE,
        &format!("/api/v1/tokens/{own_id}"),
        None,
        &bearer(&viewer),
    )
    .await;
    assert_eq!(logout.status, StatusCode::NO_CONTENT, "{}", logout.body);

    let demoted = send(
        &c,
        Method::PATCH,
        "/api/v1/users/dora",
        Some(json!({"role": "viewer"})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(demoted.status, StatusCode::OK, "{}", demoted.body);
    let me = send(&c, Method::GET, "/api/v1/session", None, &bearer(&dora)).await;
    assert_eq!(me.body["role"], "viewer", "{}", me.body);
    let audit = send(&c, Method::GET, "/api/v1/audit", None, &bearer(&dora)).await;
    assert_eq!(audit.status, StatusCode::FORBIDDEN, "{}", audit.body);
    // Her password leaked: a new one, and every token she made goes with the old.
    let changed = send(
        &c,
        Method::PATCH,
        "/api/v1/users/dora",
        Some(json!({"password": "dora-new-password-2", "revoke_tokens": true})),
        &bearer(&c.admin),
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.body);
    let me = send(&c, Method::GET, "/api/v1/session", None, &bearer(&dora)).await;
    assert_eq!(me.status, StatusCode::UNAUTHORIZED, "{}", me.body);
    let listed = send(&c, Method::GET, "/api/v1/tokens", None, &bearer(&c.admin)).await;
    assert!(
        listed.body["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .all(|t| t["created_by"] != "dora"),
        "{}",
        listed.body
    );
}

/// Roles per project, attacked from inside: a user who is an operator in one project only,
/// and an API token scoped to that project, change that project's services and nothing
/// else (not another project's services, not the fleet's hosts, not tokens); what they
/// were given can be taken back.
#[tokio::test]
async fn a_project_operator_and_a_scoped_token_act_in_their_project_only() {
    let c = ctx().await;
    let admin = bearer(&c.admin);
    let ok = |a: &Answer, status: StatusCode| {
        assert_eq!(a.status, status, "{}", a.body);
    };
    let a = send(
        &c,
        Method::POST,
        "/api/v1/projects",
        Some(json!({"name": "research"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let a = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "rita", "password": "rita-password-123", "role": "viewer"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let a = send(
        &c,
        Method::PUT,
        "/api/v1/projects/research/members/rita",
        Some(json!({"role": "operator"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::OK);
    assert_eq!(
        a.body["members"],
        json!([{"username": "rita", "role": "operator"}])
    );
    let a = send(
        &c,
        Method::PUT,
        "/api/v1/projects/research/members/rita",
        Some(json!({"role": "admin"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::UNPROCESSABLE_ENTITY);

    let cookie = sign_in(&c, "rita", "rita-password-123").await;
    let rita = vec![("cookie", cookie), ("origin", ORIGIN.to_owned())];
    let service = |name: &str, project: &str| json!({"name": name, "task_definition": "embeddings:1", "pool": "inference", "desired_count": 0, "project": project});
    let before = snapshot(&c).await;
    // Outside research: refused, and nothing changes.
    for (method, uri, body) in [
        (
            Method::POST,
            "/api/v1/services",
            Some(service("r0", "default")),
        ),
        (
            Method::PATCH,
            "/api/v1/services/embeddings",
            Some(json!({"desired_count": 5})),
        ),
        (Method::DELETE, "/api/v1/services/embeddings", None),
        (Method::POST, "/api/v1/hosts/sim-l4-1/drain", None),
        (
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "mine", "role": "operator"})),
        ),
    ] {
        let a = send(&c, method.clone(), uri, body, &rita).await;
        ok(&a, StatusCode::FORBIDDEN);
        assert!(a.body["error"].is_string(), "{method} {uri}: {}", a.body);
    }
    assert_eq!(
        snapshot(&c).await,
        before,
        "refused requests change nothing"
    );
    // In research: its services are hers to make and change.
    let a = send(
        &c,
        Method::POST,
        "/api/v1/services",
        Some(service("r1", "research")),
        &rita,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &rita,
    )
    .await;
    ok(&a, StatusCode::OK);
    // Moving it out of research would put it in a project she has no role in.
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"project": "default"})),
        &rita,
    )
    .await;
    ok(&a, StatusCode::FORBIDDEN);

    // A token scoped to research, made by an admin.
    let a = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "research-ci", "role": "operator", "project": "research"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    assert_eq!(a.body["project"], "research");
    let ci = bearer(a.body["token"].as_str().expect("the token"));
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &ci,
    )
    .await;
    ok(&a, StatusCode::OK);
    let a = send(&c, Method::GET, "/api/v1/services", None, &ci).await;
    ok(&a, StatusCode::OK);
    let before = snapshot(&c).await;
    for (method, uri, body) in [
        (
            Method::PATCH,
            "/api/v1/services/embeddings",
            Some(json!({"desired_count": 5})),
        ),
        (Method::DELETE, "/api/v1/services/embeddings", None),
        (
            Method::POST,
            "/api/v1/services",
            Some(service("r2", "default")),
        ),
        (Method::POST, "/api/v1/hosts/sim-l4-1/drain", None),
        (
            Method::POST,
            "/api/v1/placement-preview",
            Some(json!({"task_definition": "embeddings:1", "pool": "inference", "count": 1})),
        ),
        (
            Method::POST,
            "/api/v1/tokens",
            Some(json!({"name": "wider", "role": "operator"})),
        ),
    ] {
        let a = send(&c, method.clone(), uri, body, &ci).await;
        ok(&a, StatusCode::FORBIDDEN);
    }
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/embeddings",
        Some(json!({"desired_count": 5})),
        &ci,
    )
    .await;
    assert!(
        a.body["error"]
            .as_str()
            .is_some_and(|e| e.contains("project research only")),
        "{}",
        a.body
    );
    assert_eq!(
        snapshot(&c).await,
        before,
        "refused requests change nothing"
    );
    // Bad scopes are named.
    for (body, field) in [
        (
            json!({"name": "x", "role": "operator", "project": "nowhere"}),
            "project",
        ),
        (
            json!({"name": "x", "role": "admin", "project": "research"}),
            "role",
        ),
    ] {
        let a = send(&c, Method::POST, "/api/v1/tokens", Some(body), &admin).await;
        ok(&a, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(a.body.to_string().contains(field), "{}", a.body);
    }

    // In the console too: her service changes, others' are refused.
    for (service, ok_expected) in [("r1", true), ("embeddings", false)] {
        let mut req = Request::post(tessera_app::pages::service::PatchService::PATH)
            .header("host", "127.0.0.1:3000")
            .header("content-type", "application/json");
        for (k, v) in &rita {
            req = req.header(*k, v);
        }
        let req = req
            .body(Body::from(
                json!({"name": service, "patch": {"desired_count": 0}}).to_string(),
            ))
            .expect("request");
        let answer = app(c.app.clone()).oneshot(req).await.expect("answers");
        assert_eq!(answer.status().is_success(), ok_expected, "{service}");
    }
    let a = send(&c, Method::GET, "/api/v1/services/embeddings", None, &admin).await;
    assert_ne!(
        a.body["service"]["desired_count"],
        json!(0),
        "embeddings untouched"
    );

    // Her own command-line token, scoped to research at sign-in: an operator there.
    let a = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "rita", "password": "rita-password-123", "name": "cli rita", "project": "research"})),
        &[],
    )
    .await;
    ok(&a, StatusCode::CREATED);
    assert_eq!(
        (a.body["project"].as_str(), a.body["role"].as_str()),
        (Some("research"), Some("operator"))
    );
    let rita_cli = bearer(a.body["token"].as_str().expect("the token"));
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &rita_cli,
    )
    .await;
    ok(&a, StatusCode::OK);

    // The console's server functions keep the same rule: a fleet-wide operator puts no
    // service into research, and gives no production class.
    let operator = api_token(&c.control, Role::Operator).await.expect("token");
    for input in [
        service("r3", "research"),
        json!({"name": "r4", "task_definition": "embeddings:1", "pool": "inference", "desired_count": 0, "priority": "production"}),
    ] {
        let req = Request::post(tessera_app::pages::service_new::CreateService::PATH)
            .header("host", "127.0.0.1:3000")
            .header("authorization", format!("Bearer {operator}"))
            .header("content-type", "application/json")
            .body(Body::from(json!({"input": input}).to_string()))
            .expect("request");
        let answer = app(c.app.clone()).oneshot(req).await.expect("answers");
        assert!(!answer.status().is_success(), "{input}");
    }
    for name in ["r3", "r4"] {
        let a = send(
            &c,
            Method::GET,
            &format!("/api/v1/services/{name}"),
            None,
            &admin,
        )
        .await;
        ok(&a, StatusCode::NOT_FOUND);
    }

    // A scoped token made by an admin who is then demoted is worth no more than what its
    // maker was given in the project: nothing to act with.
    let a = send(
        &c,
        Method::POST,
        "/api/v1/users",
        Some(json!({"username": "ada", "password": "ada-password-1234", "role": "admin"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let a = send(
        &c,
        Method::POST,
        "/api/v1/session/token",
        Some(json!({"username": "ada", "password": "ada-password-1234", "name": "ada"})),
        &[],
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let ada = bearer(a.body["token"].as_str().expect("the token"));
    let a = send(
        &c,
        Method::POST,
        "/api/v1/tokens",
        Some(json!({"name": "ada-research", "role": "operator", "project": "research"})),
        &ada,
    )
    .await;
    ok(&a, StatusCode::CREATED);
    let ada_research = bearer(a.body["token"].as_str().expect("the token"));
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &ada_research,
    )
    .await;
    ok(&a, StatusCode::OK);
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/users/ada",
        Some(json!({"role": "operator"})),
        &admin,
    )
    .await;
    ok(&a, StatusCode::OK);
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &ada_research,
    )
    .await;
    ok(&a, StatusCode::FORBIDDEN);

    // Taken back: her role in research goes, and with it what it allowed.
    let a = send(
        &c,
        Method::DELETE,
        "/api/v1/projects/research/members/rita",
        None,
        &admin,
    )
    .await;
    ok(&a, StatusCode::NO_CONTENT);
    let a = send(
        &c,
        Method::PATCH,
        "/api/v1/services/r1",
        Some(json!({"desired_count": 0})),
        &rita,
    )
    .await;
    ok(&a, StatusCode::FORBIDDEN);
}
