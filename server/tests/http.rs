//! The HTTP surface through the router, without a socket.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use tessera_server::{AppState, app, demo, leptos_options};
use tower::ServiceExt;

async fn state() -> AppState {
    let store = tessera_control::open("sqlite::memory:")
        .await
        .expect("in-memory store");
    AppState {
        store,
        leptos: leptos_options("127.0.0.1:0".parse().expect("valid")),
    }
}

async fn get(state: &AppState, uri: &str) -> (StatusCode, String) {
    let response = app(state.clone())
        .oneshot(Request::get(uri).body(Body::empty()).expect("request"))
        .await
        .expect("router answers");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn hosts_api_lists_the_demo_fleet_with_gpus() {
    let state = state().await;
    let (status, body) = get(&state, "/api/v1/hosts").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, r#"{"hosts":[]}"#);

    demo::seed(state.store.as_ref()).await.expect("seed");
    demo::seed(state.store.as_ref())
        .await
        .expect("seeding twice changes nothing");
    let (status, body) = get(&state, "/api/v1/hosts").await;
    assert_eq!(status, StatusCode::OK);
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let hosts = json["hosts"].as_array().expect("array");
    assert_eq!(hosts.len(), 4);
    let h100 = hosts
        .iter()
        .find(|h| h["id"] == "sim-h100-1")
        .expect("H100 host");
    assert_eq!(h100["simulated"], true);
    assert_eq!(h100["pool"], "training");
    assert_eq!(h100["gpus"].as_array().expect("gpus").len(), 8);
    assert_eq!(h100["gpus"][0]["memory"], 80 * 1024);
}

#[tokio::test]
async fn healthz_checks_the_store() {
    let state = state().await;
    let (status, body) = get(&state, "/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, r#"{"status":"ok"}"#);
}

#[tokio::test]
async fn hosts_page_renders_hosts_on_the_server() {
    let state = state().await;
    demo::seed(state.store.as_ref()).await.expect("seed");
    let (status, html) = get(&state, "/hosts").await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains("sim-l4-2"), "SSR shows the hosts");
    assert!(html.contains("simulated"), "simulated hosts are labelled");
    assert!(html.contains("NVIDIA H100 80GB HBM3"));
}

#[tokio::test]
async fn unknown_pages_are_404() {
    let state = state().await;
    let (status, _) = get(&state, "/no-such-page").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
