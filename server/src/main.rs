//! `tessera`: the control plane and web console. See the crate docs of `tessera_server`.

use anyhow::Context;
use clap::Parser;
use tessera_control::{Control, ControlConfig};
use tessera_server::config::{Cli, Command, redact_url};
use tessera_server::{AppState, demo, leptos_options, run};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")),
        )
        .init();
    let Command::Serve(args) = Cli::parse().command;
    tracing::info!(?args, "starting");
    let url = args.database_url();
    let store = tessera_control::open(&url)
        .await
        .with_context(|| format!("opening the database {}", redact_url(&url)))?;
    let control = Control::new(
        store,
        ControlConfig {
            sync_interval: std::time::Duration::from_secs(args.sync_interval_secs.max(1)),
            ..ControlConfig::default()
        },
    );
    // The demo's agents need the join token itself, and only its hash is stored: without
    // one given, the demo picks a fresh one each start.
    let join_token = match (&args.join_token, args.demo) {
        (Some(t), _) => Some(t.clone()),
        (None, true) => {
            let token = tessera_control::agents::new_token();
            println!("Join token for agents (demo: new on every start): {token}");
            Some(token)
        }
        (None, false) => None,
    };
    if let Some(token) = control
        .ensure_join_token(join_token.as_deref())
        .await
        .context("setting up the join token")?
    {
        // Shown once: only its hash is stored.
        println!(
            "Join token for agents (shown once; set TESSERA_JOIN_TOKEN to choose your own): {token}"
        );
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    if args.demo {
        demo::seed(&control).await.context("seeding the demo")?;
    }
    let reconciler = {
        let control = control.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            control
                .run(async move {
                    let _ = stop.changed().await;
                })
                .await
        })
    };
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("binding {}", args.bind))?;
    let addr = listener.local_addr()?;
    tracing::info!("listening on http://{addr}");
    let demo_agents = match (args.demo, join_token) {
        (true, Some(token)) => {
            let host = if addr.ip().is_unspecified() {
                "127.0.0.1".to_owned()
            } else {
                addr.ip().to_string()
            };
            let server = format!("http://{host}:{}", addr.port());
            let (dir, stop) = (args.data_dir.clone(), stop_rx.clone());
            tracing::info!("demo fleet: 4 simulated hosts, each a real agent over HTTP");
            Some(tokio::spawn(async move {
                demo::run_agents(server, token, &dir, stop).await
            }))
        }
        _ => None,
    };
    let state = AppState {
        control,
        leptos: leptos_options(args.bind),
    };
    run(listener, state, async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    })
    .await
    .context("serving")?;
    let _ = reconciler.await;
    if let Some(agents) = demo_agents {
        // The demo's agents stop their tasks on the way out.
        let _ = agents.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
