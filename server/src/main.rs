//! `tessera`: the control plane and web console. See the crate docs of `tessera_server`.

use anyhow::Context;
use clap::Parser;
use std::sync::Arc;
use tessera_control::{Control, ControlConfig};
use tessera_model::auth::Role;
use tessera_server::auth::AuthSettings;
use tessera_server::config::{Cli, Command, DbArgs, ServeArgs, UserCommand, redact_url};
use tessera_server::{AppState, TlsFiles, demo, run};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run_command().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // A client command's own outcome (refused, rolled back, timed out) has its code.
            if let Some(exit) = e.downcast_ref::<tessera_server::cli::Exit>() {
                eprintln!("{}", tessera_server::cli::printable(&exit.to_string()));
                return std::process::ExitCode::from(exit.code);
            }
            match e
                .chain()
                .find_map(|c| c.downcast_ref::<tessera_server::cli::Exit>())
            {
                Some(exit) => {
                    eprintln!(
                        "error: {}",
                        tessera_server::cli::printable(&format!("{e}: {exit}"))
                    );
                    std::process::ExitCode::from(exit.code)
                }
                None => {
                    eprintln!(
                        "error: {}",
                        tessera_server::cli::printable(&format!("{e:#}"))
                    );
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}

async fn run_command() -> anyhow::Result<()> {
    let command = Cli::parse().command;
    // The server logs what it does; the other commands print their answer and only
    // warnings.
    let default_filter = match command {
        Command::Serve(_) => "info,sqlx=warn",
        Command::User { .. }
        | Command::Backup { .. }
        | Command::MigrateStore { .. }
        | Command::Openapi
        | Command::Client(_)
        | Command::Tls { .. }
        | Command::ExampleServer { .. } => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .init();
    match command {
        Command::Serve(args) => serve(args).await,
        Command::User { db, command } => user(db, command).await,
        Command::Backup { db, file } => {
            let url = db.database_url();
            let made = tessera_control::sqlite::backup::backup(&url, &file).await?;
            println!(
                "backed up {} to {} ({} bytes, schema version {}); to restore it, see docs/operations.md, \"Backup and restore\"",
                redact_url(&url),
                made.file.display(),
                made.bytes,
                made.schema_version
            );
            Ok(())
        }
        Command::MigrateStore { from, to } => {
            let moved = tessera_control::move_store::migrate_store(&from, &to).await?;
            for (table, rows) in &moved.tables {
                println!("{table:<28} {rows:>9} rows");
            }
            println!(
                "copied {} rows in {} tables from {} to {}; point the servers at it with --database (TESSERA_DATABASE)",
                moved.rows(),
                moved.tables.len(),
                redact_url(&from),
                redact_url(&to)
            );
            Ok(())
        }
        Command::Openapi => {
            println!(
                "{}",
                serde_json::to_string_pretty(&tessera_server::openapi::document())?
            );
            Ok(())
        }
        Command::Client(c) => {
            use clap::CommandFactory;
            tessera_server::cli::run(c, Cli::command()).await
        }
        Command::Tls { command } => tessera_server::cli::tls::run(command),
        Command::ExampleServer { port } => tessera_server::example::run(port).await,
    }
}

async fn open(db: &DbArgs, config: ControlConfig) -> anyhow::Result<Control> {
    let url = db.database_url();
    let store = tessera_control::open(&url)
        .await
        .with_context(|| format!("opening the database {}", redact_url(&url)))?;
    Ok(Control::new(store, config))
}

/// A password for `tessera user`: from a file, `TESSERA_PASSWORD`, or a prompt.
fn read_password(file: Option<&std::path::Path>) -> anyhow::Result<String> {
    if let Some(path) = file {
        let raw = std::fs::read_to_string(path)
            .with_context(|| format!("reading --password-file {}", path.display()))?;
        return Ok(raw.trim_end_matches(['\n', '\r']).to_owned());
    }
    if let Ok(p) = std::env::var("TESSERA_PASSWORD") {
        return Ok(p);
    }
    let first = rpassword::prompt_password("Password: ").context("reading the password")?;
    let again = rpassword::prompt_password("Again: ").context("reading the password")?;
    anyhow::ensure!(first == again, "the passwords differ");
    Ok(first)
}

async fn user(db: DbArgs, command: UserCommand) -> anyhow::Result<()> {
    let control = open(&db, ControlConfig::default()).await?;
    match command {
        UserCommand::Add {
            username,
            role,
            password_file,
        } => {
            let role: Role = role.parse().context("--role")?;
            let password = read_password(password_file.as_deref())?;
            let u = control
                .accounts()
                .add_user(&username, &password, role)
                .await?;
            println!("added {} ({})", u.username, u.role);
        }
        UserCommand::Passwd {
            username,
            password_file,
        } => {
            let password = read_password(password_file.as_deref())?;
            control
                .accounts()
                .update_user(&username, None, None, Some(&password))
                .await?;
            println!("password of {username} changed; its sessions have ended");
        }
        UserCommand::List => {
            println!("{:<24} {:<9} {:<9} created", "username", "role", "status");
            for u in control.accounts().list_users().await? {
                let status = if u.disabled { "disabled" } else { "enabled" };
                println!(
                    "{:<24} {:<9} {:<9} {}",
                    u.username,
                    u.role.as_str(),
                    status,
                    u.created_at
                );
            }
        }
        UserCommand::Disable { username } => {
            control
                .accounts()
                .update_user(&username, None, Some(true), None)
                .await?;
            println!("{username} disabled");
        }
        UserCommand::Enable { username } => {
            control
                .accounts()
                .update_user(&username, None, Some(false), None)
                .await?;
            println!("{username} enabled");
        }
    }
    Ok(())
}

async fn serve(mut args: ServeArgs) -> anyhow::Result<()> {
    // As the kernel shows them (`args()` would panic on one that is not UTF-8).
    let argv: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(why) = tessera_server::config::secret_on_command_line(&argv) {
        anyhow::bail!(why);
    }
    if let Some(path) = &args.join_token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("reading the join token from {}", path.display()))?;
        let token = token.trim();
        anyhow::ensure!(
            !token.is_empty(),
            "--join-token-file {}: the file is empty",
            path.display()
        );
        args.join_token = Some(token.to_owned());
    }
    tracing::info!(?args, "starting");
    let control = open(
        &args.db,
        ControlConfig {
            sync_interval: std::time::Duration::from_secs(args.sync_interval_secs.max(1)),
            gpu_budget_grace: std::time::Duration::from_secs(args.gpu_budget_grace_secs),
            retention: std::time::Duration::from_secs(args.retention_days * 24 * 3600),
            audit_retention: std::time::Duration::from_secs(
                args.audit_retention_days.saturating_mul(24 * 3600),
            ),
            address: format!(
                "{}://{}",
                if args.tls_cert.is_some() {
                    "https"
                } else {
                    "http"
                },
                args.bind
            ),
            // The demo compresses time so its fit verdicts show within minutes (labelled
            // wherever they are shown).
            usage: if args.demo {
                tessera_control::usage::UsageConfig::compressed()
            } else {
                tessera_control::usage::UsageConfig::default()
            },
            ..ControlConfig::default()
        },
    )
    .await?;
    let admin_password = match &args.admin_password_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading --admin-password-file {}", path.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
        ),
        None => std::env::var("TESSERA_ADMIN_PASSWORD").ok(),
    };
    if let Some(password) = control
        .accounts()
        .ensure_admin(admin_password.as_deref(), args.demo)
        .await
        .context("setting up the admin account")?
    {
        // Shown once: only its hash is stored.
        if args.demo {
            println!(
                "Sign in as admin with password {password} (demo: new on every start; set TESSERA_ADMIN_PASSWORD to choose)"
            );
        } else {
            println!(
                "Sign in as admin with password {password} (shown once; change it with `tessera user passwd admin`)"
            );
        }
    }
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
    // The fleet's clock (the database's) before anything is written with it.
    control.read_db_clock().await;
    // Pools whose capacity provider is an operator's command.
    control.providers().register(
        tessera_model::provider::ProviderKind::Command,
        std::sync::Arc::new(tessera_control::providers::command::CommandMachines::default()),
    );
    // Pools whose capacity provider is an AWS Auto Scaling group (credentials and region the
    // usual AWS way, read when a pool first needs them; `AWS_ENDPOINT_URL` honoured).
    control.providers().register(
        tessera_model::provider::ProviderKind::AwsAsg,
        std::sync::Arc::new(tessera_aws::AsgMachines::new()),
    );
    if let Some(token) = control
        .agents()
        .ensure_join_token(join_token.as_deref())
        .await
        .context("setting up the join token")?
    {
        // Shown once: only its hash is stored.
        println!(
            "Join token for agents (shown once; set TESSERA_JOIN_TOKEN to choose your own): {token}"
        );
    }
    // As ECS has its default cluster: a fresh fleet has a pool that an agent started with
    // its defaults joins.
    if control
        .deployments()
        .ensure_default_pool()
        .await
        .context("creating the default pool")?
    {
        println!("Created the pool `default` (agents join it unless told another)");
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    if args.demo {
        anyhow::ensure!(
            demo::AVAILABLE,
            "--demo needs a build with the `demo` feature (on by default); this one has none"
        );
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
    let tls = args
        .tls_cert
        .clone()
        .zip(args.tls_key.clone())
        .map(|(cert, key)| TlsFiles { cert, key });
    let scheme = if tls.is_some() { "https" } else { "http" };
    // The address ends the line: scripts and tests read it from there.
    tracing::info!(
        "tessera {} listening on {scheme}://{addr}",
        tessera_model::version::long()
    );
    #[cfg(feature = "demo")]
    let demo_agents = match (args.demo, join_token) {
        (true, Some(token)) => {
            // Under TLS the demo's agents trust the server's own certificate, by name.
            let host = match (&tls, addr.ip().is_unspecified()) {
                (Some(_), _) => "localhost".to_owned(),
                (None, true) => "127.0.0.1".to_owned(),
                (None, false) => addr.ip().to_string(),
            };
            let server = format!("{scheme}://{host}:{}", addr.port());
            let ca_cert = tls.as_ref().map(|t| t.cert.clone());
            let (dir, stop) = (args.db.data_dir.clone(), stop_rx.clone());
            tracing::info!(
                "demo fleet: 4 simulated hosts, each a real agent over {scheme}, and the elastic pool's simulated provider"
            );
            let machines = std::sync::Arc::new(demo::DemoMachines::new(
                demo::Joining {
                    server: server.clone(),
                    ca_cert: ca_cert.clone(),
                    join_token: token.clone(),
                    data_dir: dir.clone(),
                },
                stop_rx.clone(),
            ));
            machines
                .resume(&control)
                .await
                .context("starting the demo provider's machines again")?;
            control
                .providers()
                .register(tessera_model::provider::ProviderKind::Demo, machines);
            tokio::spawn(demo::run_load(control.clone(), stop_rx.clone()));
            Some(tokio::spawn(async move {
                demo::run_agents(server, ca_cert, token, &dir, stop).await
            }))
        }
        _ => None,
    };
    #[cfg(not(feature = "demo"))]
    let demo_agents: Option<tokio::task::JoinHandle<()>> = {
        let _ = join_token;
        None
    };
    let mut auth = AuthSettings::for_bind(args.bind, tls.is_some());
    if !args.allowed_hosts.is_empty() {
        auth.allowed_hosts = args.allowed_hosts.clone();
    } else if args.bind.ip().is_unspecified() {
        tracing::warn!(
            "listening on every address, but only loopback host names are accepted: pass --allowed-hosts with the names clients use"
        );
    }
    if !args.trusted_proxies.is_empty() {
        tracing::info!(proxies = ?args.trusted_proxies.iter().map(ToString::to_string).collect::<Vec<_>>(), "client addresses from these proxies' forwarding headers");
    }
    let state = AppState {
        auth: Arc::new(auth),
        trusted_proxies: tessera_server::forwarded::TrustedProxies::new(
            args.trusted_proxies.clone(),
        ),
        ..AppState::new(control, args.bind)
    }
    .with_limits(tessera_server::Limits {
        connections_per_address: args.connections_per_address.max(1),
        requests_per_address: args.requests_per_address.max(1),
        task_streams_per_user: args.task_streams_per_user.max(1),
        header_timeout: std::time::Duration::from_secs(args.header_timeout_secs.max(1)),
        request_timeout: std::time::Duration::from_secs(args.request_timeout_secs.max(1)),
        ..Default::default()
    });
    let site = std::path::Path::new(state.leptos.site_root.as_ref());
    if site.join("pkg").join("tessera.js").is_file() {
        tracing::info!(site = %site.display(), "console assets");
    } else {
        let looked = tessera_server::find_site(
            std::env::var("LEPTOS_SITE_ROOT").ok(),
            std::env::current_exe().ok().as_deref(),
        );
        tracing::error!("{}", looked.missing());
    }
    run(listener, state, tls, async move {
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
