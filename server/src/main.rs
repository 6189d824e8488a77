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
    if let Some(token) = control
        .ensure_join_token(args.join_token.as_deref())
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
        let hosts = demo::seed(&control)
            .await
            .context("seeding the demo fleet")?;
        tracing::info!(
            hosts,
            "demo fleet ready (simulated GPUs, in-process simulated agents)"
        );
        tokio::spawn(demo::run_simulated_agents(control.clone(), stop_rx.clone()));
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
    tracing::info!("listening on http://{}", listener.local_addr()?);
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
