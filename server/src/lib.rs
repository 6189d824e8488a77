//! The `tessera` server: configuration, HTTP routes (console pages and server functions,
//! REST API, static files) and the demo fleet. Handlers are thin: they translate HTTP to
//! calls on the control plane's store.
//!
//! # Layout
//! - [`config`]: command line and environment (`tessera serve --bind --database --demo`).
//! - [`auth`]: the authentication layer: sessions, API tokens, each route's role, the
//!   cross-site and Host checks, the audit log.
//! - [`session`]: signing in and out, API tokens, users and the audit log over REST.
//! - [`api`]: the REST API under `/api/v1`, the agent API under `/agent/v1`, and `/healthz`.
//! - [`openapi`]: the OpenAPI document served at `/api/v1/openapi.json`.
//! - [`demo`]: the simulated demo fleet `--demo` adds, registered through the agent API
//!   path, with in-process simulated agents that sync it.
//! - [`error`]: `ApiError`, how store errors become HTTP responses.
//! - [`edge`]: what a connection and a request may hold (deadlines, sizes, per-client and
//!   per-agent budgets), so no client starves the agents' syncs.
//! - [`forwarded`]: the client's address behind a load balancer (`--trusted-proxies`).
//! - [`metrics`]: Prometheus metrics at `/metrics`, the fleet's gauges streamed from the
//!   fleet read model.
//! - [`example`]: `tessera example-server`, the small HTTP service the demo and the
//!   serving drill run as tasks.
//!
//! The library exposes [`app`] and [`run`] so tests can build the router and serve it on
//! port 0, over HTTP or HTTPS.

#![forbid(unsafe_code)]
#![recursion_limit = "512"]

pub mod api;
pub mod auth;
/// The command line's client side (its own crate, `tessera-cli`).
pub use tessera_cli as cli;
pub mod config;
pub mod demo;
pub mod edge;
pub mod error;
pub mod example;
pub mod forwarded;
pub mod metrics;
pub use api::openapi;

use axum::Router;
use axum::extract::FromRef;
use leptos::prelude::*;
use leptos_axum::{LeptosRoutes, generate_route_list};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tessera_app::{App, shell};
use tessera_control::Control;
use tower_http::trace::TraceLayer;

/// What every handler can reach.
#[derive(Clone, FromRef)]
pub struct AppState {
    pub control: Control,
    pub leptos: LeptosOptions,
    pub auth: Arc<auth::AuthSettings>,
    /// Open `/api/v1/live` streams are capped: each holds a task and a connection.
    pub live_slots: Arc<tokio::sync::Semaphore>,
    /// One permit per request being handled, shared by every route but the agents'.
    #[from_ref(skip)]
    pub request_slots: Arc<tokio::sync::Semaphore>,
    /// The agents' own: a flood on other routes never makes a sync wait.
    #[from_ref(skip)]
    pub agent_slots: Arc<tokio::sync::Semaphore>,
    /// Requests in flight per client address on routes other than the agents'.
    #[from_ref(skip)]
    pub request_addresses: edge::PerAddress,
    /// Agents' requests in flight per client address.
    #[from_ref(skip)]
    pub agent_addresses: edge::PerAddress,
    /// Turns for writing `/metrics` scrapes.
    #[from_ref(skip)]
    pub metrics: metrics::Scrapes,
    /// Live event streams open per user, and per client address.
    #[from_ref(skip)]
    pub live_users: edge::Shares<String>,
    #[from_ref(skip)]
    pub live_addresses: edge::PerAddress,
    /// Proxies whose forwarding headers name the client (none by default).
    #[from_ref(skip)]
    pub trusted_proxies: forwarded::TrustedProxies,
    /// Log and exec streams open per user.
    #[from_ref(skip)]
    pub task_stream_users: edge::Shares<String>,
    /// Hosts with a sync in flight: one each.
    #[from_ref(skip)]
    pub agent_hosts: edge::OnePerHost,
    /// Agents' stream requests (waits, output, input) in flight per host: a host's
    /// streams never take its sync's turn nor another host's share.
    #[from_ref(skip)]
    pub agent_streams: edge::Shares<tessera_model::HostId>,
    /// Addresses whose agent tokens were wrong lately.
    #[from_ref(skip)]
    pub wrong_tokens: edge::WrongTokens,
    #[from_ref(skip)]
    pub limits: Limits,
}

/// What the edge allows, so that a stuck database or a flood of clients costs a bounded
/// amount of memory and connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request that has no answer after this long gets `503`, whether it waited for a
    /// slot or in its handler (an event stream's answer is its first byte, so streams
    /// are not cut).
    pub request_timeout: std::time::Duration,
    /// Requests handled at once, at most, on routes other than the agents'; more wait
    /// their turn (within the timeout).
    pub concurrent_requests: usize,
    /// Agents' requests (registrations, syncs) handled at once, at most.
    pub concurrent_agent_requests: usize,
    /// Requests one client address may have in flight on routes other than the agents'
    /// (`429` past it).
    pub requests_per_address: usize,
    /// Connections one client address may hold open (more are closed at accept).
    pub connections_per_address: usize,
    /// Request headers, and the first request on a new connection, must arrive within
    /// this; a request body may not pause for longer.
    pub header_timeout: std::time::Duration,
    /// Event streams open at once, at most; one more gets `503`.
    pub live_streams: usize,
    /// Agents' requests one client address may have in flight (`429` past it): many
    /// hosts behind one NAT address each sync, so this is far above one host's one.
    pub agent_requests_per_address: usize,
    /// Event streams one user (or token) may have open at once, and one client address.
    pub live_streams_per_user: usize,
    pub live_streams_per_address: usize,
    /// A task's log reads, follows and exec sessions one user (or token) may have open at
    /// once (`503` past it): a leaked token cannot hold every stream of the server.
    pub task_streams_per_user: usize,
    /// An agent's request body must arrive whole within this, before it takes a slot.
    pub agent_body_timeout: std::time::Duration,
    /// HTTP/2 streams one connection may have open at once.
    pub http2_streams: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            request_timeout: std::time::Duration::from_secs(30),
            concurrent_requests: 1024,
            concurrent_agent_requests: 1024,
            requests_per_address: 64,
            connections_per_address: 256,
            header_timeout: std::time::Duration::from_secs(10),
            live_streams: 256,
            agent_requests_per_address: 512,
            live_streams_per_user: 8,
            live_streams_per_address: 16,
            task_streams_per_user: 64,
            agent_body_timeout: std::time::Duration::from_secs(5),
            http2_streams: 64,
        }
    }
}

impl AppState {
    /// Served on `bind` over plain HTTP, with the default allowed hosts and limits.
    pub fn new(control: Control, bind: SocketAddr) -> Self {
        // Timings are recorded from the start (the recorder is the process's, made once).
        crate::metrics::handle();
        let limits = Limits::default();
        AppState {
            control,
            leptos: leptos_options(bind),
            auth: Arc::new(auth::AuthSettings::for_bind(bind, false)),
            live_slots: Arc::new(tokio::sync::Semaphore::new(limits.live_streams)),
            request_slots: Arc::new(tokio::sync::Semaphore::new(limits.concurrent_requests)),
            agent_slots: Arc::new(tokio::sync::Semaphore::new(
                limits.concurrent_agent_requests,
            )),
            request_addresses: edge::PerAddress::new(limits.requests_per_address),
            agent_addresses: edge::PerAddress::new(limits.agent_requests_per_address),
            live_users: edge::Shares::new(limits.live_streams_per_user),
            live_addresses: edge::PerAddress::new(limits.live_streams_per_address),
            task_stream_users: edge::Shares::new(limits.task_streams_per_user),
            trusted_proxies: forwarded::TrustedProxies::default(),
            agent_hosts: edge::OnePerHost::default(),
            agent_streams: edge::Shares::new(edge::STREAM_REQUESTS_PER_HOST),
            metrics: metrics::Scrapes::default(),
            wrong_tokens: edge::WrongTokens::default(),
            limits,
        }
    }

    /// The same with other limits.
    pub fn with_limits(self, limits: Limits) -> Self {
        AppState {
            live_slots: Arc::new(tokio::sync::Semaphore::new(limits.live_streams)),
            request_slots: Arc::new(tokio::sync::Semaphore::new(limits.concurrent_requests)),
            agent_slots: Arc::new(tokio::sync::Semaphore::new(
                limits.concurrent_agent_requests,
            )),
            request_addresses: edge::PerAddress::new(limits.requests_per_address),
            agent_addresses: edge::PerAddress::new(limits.agent_requests_per_address),
            live_users: edge::Shares::new(limits.live_streams_per_user),
            live_addresses: edge::PerAddress::new(limits.live_streams_per_address),
            task_stream_users: edge::Shares::new(limits.task_streams_per_user),
            limits,
            ..self
        }
    }
}

/// Where the console's assets (`pkg/tessera.js`, its WASM and CSS) are, and whether
/// they are there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub root: PathBuf,
    pub found: bool,
    /// Every place looked at, in order (for the error when none holds them).
    pub looked: Vec<PathBuf>,
}

impl Site {
    /// What to do when the assets were not found.
    pub fn missing(&self) -> String {
        format!(
            "the console's assets (pkg/tessera.js) are in none of {}: pages are served without their script and style. Build them (cargo leptos build --release) and put target/site beside the binary as site/, or in /usr/share/tessera/site, or set LEPTOS_SITE_ROOT",
            self.looked
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

/// The console's assets: `LEPTOS_SITE_ROOT` when set; else the first of `target/site`
/// (a checkout), `site/` beside the binary (a release tarball) and
/// `../share/tessera/site` from the binary's directory (a package: `/usr/bin/tessera`,
/// `/usr/share/tessera/site`) that holds them; else `target/site`, not found.
pub fn find_site(env: Option<String>, exe: Option<&std::path::Path>) -> Site {
    let holds = |p: &std::path::Path| p.join("pkg").join("tessera.js").is_file();
    if let Some(root) = env.filter(|e| !e.is_empty()).map(PathBuf::from) {
        return Site {
            found: holds(&root),
            looked: vec![root.clone()],
            root,
        };
    }
    let mut looked = vec![PathBuf::from("target/site")];
    if let Some(dir) = exe.and_then(|e| e.parent()) {
        looked.push(dir.join("site"));
        looked.push(dir.join("../share/tessera/site"));
    }
    match looked.iter().find(|p| holds(p)) {
        Some(root) => Site {
            root: root.clone(),
            found: true,
            looked: looked.clone(),
        },
        None => Site {
            root: looked[0].clone(),
            found: false,
            looked,
        },
    }
}

/// A certificate chain and its private key, PEM files.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The whole HTTP surface: console pages, server functions, API, static files, behind the
/// authentication layer.
pub fn app(state: AppState) -> Router {
    app_with(state, api::routes())
}

/// [`app`] with these REST routes (the API's, and in tests one more).
pub fn app_with(state: AppState, api: auth::Routes) -> Router {
    let routes = generate_route_list(App);
    let control = state.control.clone();
    let leptos = state.leptos.clone();
    let sessions = auth::session_layer(state.control.clone(), state.auth.tls);
    Router::new()
        .merge(api.into_router())
        .leptos_routes_with_context(
            &state,
            routes,
            move || provide_context(control.clone()),
            move || shell(leptos.clone()),
        )
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(shell))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .layer(sessions)
        // The budgets (see `edge`); the timeout is outside them, so waiting for a slot
        // counts too, and so does reading the body.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            edge::budget,
        ))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            state.limits.header_timeout,
        ))
        // The server's own slowness is a 503 (try again), never a 408, which would blame
        // the client: requests are timed from their first byte, once their headers are in.
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            state.limits.request_timeout,
        ))
        // gzip what compresses (the WASM bundle shrinks to about a third); the default
        // predicate leaves the live event stream alone.
        .layer(tower_http::compression::CompressionLayer::new())
        .layer(TraceLayer::new_for_http())
        // The client's address first, for everything after (see `forwarded`).
        .layer(axum::middleware::from_fn_with_state(
            state.trusted_proxies.clone(),
            forwarded::layer,
        ))
        .with_state(state)
}

/// Serves `app` on `listener` (HTTPS with `tls`) until `shutdown` resolves, then lets
/// requests in flight finish.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: AppState,
    tls: Option<TlsFiles>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.limits;
    let service = app(state).into_make_service_with_connect_info::<SocketAddr>();
    let connections = edge::ConnectionLimit {
        addresses: edge::PerAddress::new(limits.connections_per_address),
    };
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopper.graceful_shutdown(Some(std::time::Duration::from_secs(10)));
    });
    let mut server = axum_server::from_tcp(listener.into_std()?)?
        .handle(handle)
        // A connection that sends no request, or headers that never end, is closed.
        .first_request_timeout(limits.header_timeout);
    let http = server.http_builder();
    http.http1().header_read_timeout(limits.header_timeout);
    http.http2().max_concurrent_streams(limits.http2_streams);
    let Some(tls) = tls else {
        return server.acceptor(connections).serve(service).await;
    };
    // One crypto provider for the process (ring), whichever crates asked for others.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(&tls.cert, &tls.key)
        .await
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "reading the TLS certificate {} and key {}: {e}",
                    tls.cert.display(),
                    tls.key.display()
                ),
            )
        })?;
    server
        .acceptor(axum_server::tls_rustls::RustlsAcceptor::new(config).acceptor(connections))
        .serve(service)
        .await
}

/// Leptos settings: from cargo-leptos's environment when it runs us, otherwise the site
/// [`find_site`] finds.
pub fn leptos_options(bind: std::net::SocketAddr) -> LeptosOptions {
    let from_env = std::env::var_os("LEPTOS_OUTPUT_NAME")
        .and_then(|_| get_configuration(None).ok())
        .map(|conf| conf.leptos_options);
    let mut options = from_env.unwrap_or_else(|| {
        let site = find_site(
            std::env::var("LEPTOS_SITE_ROOT").ok(),
            std::env::current_exe().ok().as_deref(),
        );
        LeptosOptions::builder()
            .output_name("tessera")
            .site_root(site.root.display().to_string())
            .site_pkg_dir("pkg")
            .build()
    });
    options.site_addr = bind;
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_is_found_beside_the_binary_or_in_its_package_and_said_missing() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let exe = bin.join("tessera");
        let none = find_site(None, Some(&exe));
        assert!(!none.found);
        assert!(
            none.missing().contains("LEPTOS_SITE_ROOT"),
            "{}",
            none.missing()
        );
        assert!(
            none.missing().contains("usr/bin/site"),
            "{}",
            none.missing()
        );
        let put = |root: &std::path::Path| {
            std::fs::create_dir_all(root.join("pkg")).unwrap();
            std::fs::write(root.join("pkg/tessera.js"), "").unwrap();
        };
        // A package: /usr/bin/tessera and /usr/share/tessera/site.
        put(&dir.path().join("usr/share/tessera/site"));
        let packaged = find_site(None, Some(&exe));
        assert!(packaged.found);
        assert!(
            packaged.root.ends_with("bin/../share/tessera/site"),
            "{packaged:?}"
        );
        // A tarball: site/ beside the binary comes first.
        put(&bin.join("site"));
        assert_eq!(find_site(None, Some(&exe)).root, bin.join("site"));
        // Said outright, it is the only place.
        let said = find_site(Some("/nowhere/site".into()), Some(&exe));
        assert_eq!((said.found, said.looked.len()), (false, 1));
    }
}
