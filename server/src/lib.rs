//! The `tessera` server: configuration, HTTP routes (console pages and server functions,
//! REST API, static files) and the demo fleet. Handlers are thin: they translate HTTP to
//! calls on the control plane's store.
//!
//! # Layout
//! - [`config`]: command line and environment (`tessera serve --bind --database --demo`).
//! - [`api`]: the REST API under `/api/v1`, the agent API under `/agent/v1`, and `/healthz`.
//! - [`openapi`]: the OpenAPI document served at `/api/v1/openapi.json`.
//! - [`demo`]: the simulated demo fleet `--demo` adds, registered through the agent API
//!   path, with in-process simulated agents that sync it.
//! - [`error`]: `ApiError`, how store errors become HTTP responses.
//!
//! The library exposes [`app`] and [`run`] so tests can build the router and serve it on
//! port 0.

#![forbid(unsafe_code)]
#![recursion_limit = "512"]

pub mod api;
pub mod config;
pub mod demo;
pub mod error;
pub mod openapi;

use axum::Router;
use axum::extract::FromRef;
use leptos::prelude::*;
use leptos_axum::{LeptosRoutes, generate_route_list};
use std::future::Future;
use tessera_app::{App, shell};
use tessera_control::Control;
use tower_http::trace::TraceLayer;

/// What every handler can reach.
#[derive(Clone, FromRef)]
pub struct AppState {
    pub control: Control,
    pub leptos: LeptosOptions,
}

/// The whole HTTP surface: console pages, server functions, API, static files.
pub fn app(state: AppState) -> Router {
    let routes = generate_route_list(App);
    let control = state.control.clone();
    let leptos = state.leptos.clone();
    Router::new()
        .merge(api::router())
        .leptos_routes_with_context(
            &state,
            routes,
            move || provide_context(control.clone()),
            move || shell(leptos.clone()),
        )
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        // gzip what compresses (the WASM bundle shrinks to about a third); the default
        // predicate leaves the live event stream alone.
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets requests in flight finish.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// Leptos settings: from cargo-leptos's environment when it runs us, otherwise the
/// workspace's defaults (site in `target/site`, or `LEPTOS_SITE_ROOT`).
pub fn leptos_options(bind: std::net::SocketAddr) -> LeptosOptions {
    let from_env = std::env::var_os("LEPTOS_OUTPUT_NAME")
        .and_then(|_| get_configuration(None).ok())
        .map(|conf| conf.leptos_options);
    let mut options = from_env.unwrap_or_else(|| {
        LeptosOptions::builder()
            .output_name("tessera")
            .site_root(std::env::var("LEPTOS_SITE_ROOT").unwrap_or_else(|_| "target/site".into()))
            .site_pkg_dir("pkg")
            .build()
    });
    options.site_addr = bind;
    options
}
