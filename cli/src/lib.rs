//! The command line's client side: `tessera login`, `get`, `describe`, `apply`, `scale`,
//! `drain`, `activate`, `preview`, `events`, `lb haproxy`. Every command talks to a
//! server's REST API with an API token: the one `tessera login` keeps (mode 0600 in the
//! user's config directory), or `--url` / `--token` (`TESSERA_URL` / `TESSERA_TOKEN`) for
//! scripts and CI.
//!
//! # Layout
//! - `args`: the command line (clap): connection flags and each command's options.
//! - `client`: the REST client: the server's URL, HTTPS with an extra CA, the API token,
//!   refusals as exits.
//! - `commands`: sign-in, `get` and `describe`, hosts, join tokens and events.
//! - `apply`: `tessera apply` (task definitions and services from files) and `preview`.
//! - [`lb`]: `tessera lb haproxy`, an HAProxy backend kept equal to a service's endpoints.
//! - `login_store`: the login `tessera login` keeps, owner-only.
//! - `table`: plain-text tables that fit the terminal.
//! - [`tls`]: `tessera tls`, a private CA and the certificates Tessera's HTTPS needs.

#![forbid(unsafe_code)]

/// Prints a line to standard output; a closed pipe (`tessera get tasks | head`) ends the
/// command quietly.
macro_rules! say {
    ($($t:tt)*) => { $crate::write_out(&format!("{}\n", format_args!($($t)*))) };
}

mod apply;
mod args;
mod client;
mod commands;
pub mod lb;
mod login_store;
mod table;
pub mod tls;

#[doc(hidden)]
pub fn write_out(text: &str) {
    use std::io::Write;
    let text = printable(text);
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush())
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}

/// `text` safe to print on a terminal: control characters (escape sequences that could
/// move the cursor, rewrite the screen or set the window title, from an event, a health
/// check's output or a task's error, which tasks control) become `�`. Line breaks and tabs
/// stay.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| if unsafe_char(c) { '\u{fffd}' } else { c })
            .collect(),
    )
}

use anyhow::bail;
use commands::describe::describe;
use commands::events::events;
use commands::get::get;
use commands::hosts::host_action;
use commands::join_tokens::join_token;
use commands::pools::pool;
use commands::session::{login, logout};
use std::time::Duration;
use tessera_model::api::ServicePatch;

pub use args::{
    ClientCommand, Connection, Described, JoinTokenCommand, Kind, LbCommand, Output, PoolCommand,
    Token,
};
pub use client::Client;

/// A command ended without doing what was asked: its exit status.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    pub code: u8,
    pub message: String,
    /// The HTTP status when the server refused.
    pub status: Option<u16>,
}

impl Exit {
    /// An exit the command decides itself (no server refusal behind it).
    pub fn new(code: u8, message: impl Into<String>) -> Exit {
        Exit {
            code,
            message: message.into(),
            status: None,
        }
    }
}

/// Runs a client command; the error says what to do.
/// Runs a client command. `root` is the whole `tessera` command, for `tessera completion`.
pub async fn run(command: ClientCommand, root: clap::Command) -> anyhow::Result<()> {
    match command {
        ClientCommand::Login {
            url,
            username,
            password_stdin,
            token,
            expires_in_days,
            project,
            ca_cert,
            insecure_http,
        } => {
            if token.is_some() && project.is_some() {
                bail!(
                    "--project scopes a token made by signing in; a given --token keeps its own scope"
                );
            }
            login(
                &url,
                insecure_http,
                (username, project),
                password_stdin,
                token,
                expires_in_days,
                ca_cert,
            )
            .await
        }
        ClientCommand::Logout => logout().await,
        ClientCommand::Get {
            kind,
            name,
            output,
            service,
            host,
            project,
            conn,
        } => {
            if project.is_some() && !matches!(kind, Kind::Services | Kind::Projects | Kind::Tasks) {
                bail!("--project filters services, tasks and projects only");
            }
            // Only endpoints and work take a name; the others fail before asking the server.
            let one = matches!(kind, Kind::Endpoints | Kind::Work);
            let service = match (kind, name, service) {
                (_, Some(n), Some(s)) if one && n != s => {
                    bail!("two services: {n:?} and --service {s:?}; give one")
                }
                (_, Some(n), _) if one => Some(n),
                (_, None, None) if one => {
                    bail!("which service? `tessera get endpoints|work SERVICE`")
                }
                (_, Some(n), _) => bail!(
                    "unexpected {n:?}: only `tessera get endpoints|work SERVICE` take a name \
                     (tasks of one service: `tessera get tasks --service {n}`)"
                ),
                (_, None, s) => s,
            };
            get(&Client::new(&conn)?, kind, output, service, host, project).await
        }
        ClientCommand::Describe { kind, name, conn } => {
            describe(&Client::new(&conn)?, kind, &name).await
        }
        ClientCommand::Apply {
            file,
            dry_run,
            wait,
            timeout_secs,
            update_secrets,
            conn,
        } => {
            apply::apply(
                &Client::new(&conn)?,
                &file,
                apply::Options {
                    dry_run,
                    wait,
                    timeout: Duration::from_secs(timeout_secs),
                    update_secrets,
                },
            )
            .await
        }
        ClientCommand::Scale {
            service,
            count,
            conn,
        } => {
            let c = Client::new(&conn)?;
            let body = serde_json::to_value(ServicePatch {
                desired_count: Some(count),
                ..Default::default()
            })?;
            let _: serde_json::Value = c
                .send(
                    reqwest::Method::PATCH,
                    &format!("/api/v1/services/{}", seg(&service)),
                    Some(&body),
                )
                .await?;
            say!("service {service}: desired count {count}");
            Ok(())
        }
        ClientCommand::Drain { host, conn } => {
            host_action(&Client::new(&conn)?, &host, "drain").await
        }
        ClientCommand::Activate { host, conn } => {
            host_action(&Client::new(&conn)?, &host, "activate").await
        }
        ClientCommand::Approve { host, conn } => {
            host_action(&Client::new(&conn)?, &host, "approve").await
        }
        ClientCommand::Pool { command } => pool(command).await,
        ClientCommand::JoinToken { command } => join_token(command).await,
        ClientCommand::Preview { file, count, conn } => {
            apply::preview(&Client::new(&conn)?, &file, count).await
        }
        ClientCommand::Events {
            service,
            host,
            follow,
            limit,
            conn,
        } => events(&Client::new(&conn)?, service, host, follow, limit).await,
        ClientCommand::Logs {
            target,
            follow,
            tail,
            since,
            container,
            timestamps,
            conn,
        } => {
            commands::streams::logs(
                &Client::new(&conn)?,
                commands::streams::LogsAsk {
                    target,
                    follow,
                    tail,
                    since,
                    container,
                    timestamps,
                },
            )
            .await
        }
        ClientCommand::Exec {
            task,
            container,
            interactive,
            tty,
            command,
            conn,
        } => {
            commands::streams::exec(
                &Client::new(&conn)?,
                commands::streams::ExecAsk {
                    task,
                    container,
                    command,
                    stdin: interactive,
                    tty,
                },
            )
            .await
        }
        ClientCommand::Lb {
            lb:
                LbCommand::Haproxy {
                    socket,
                    backend,
                    service,
                    port_name,
                    conn,
                },
        } => {
            lb::run_haproxy(
                &Client::new(&conn)?,
                &socket,
                &backend,
                &service,
                port_name.as_deref(),
            )
            .await
        }
        ClientCommand::Completion { shell } => {
            let mut cmd = root;
            clap_complete::generate(shell, &mut cmd, "tessera", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// A path segment, percent-encoded.
fn seg(s: &str) -> String {
    tessera_model::urlenc::encode(s)
}

#[cfg(test)]
mod printable_tests {
    use super::printable;

    #[test]
    fn escape_sequences_never_reach_the_terminal() {
        assert_eq!(
            printable("plain\nlines\tand tabs"),
            "plain\nlines\tand tabs"
        );
        let hostile = "ok\x1b]0;owned\x07\x1b[2J\r\u{9b}31mred";
        let shown = printable(hostile);
        assert!(
            !shown
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{shown:?}"
        );
        assert!(
            shown.contains("owned") && shown.contains("red"),
            "the text itself stays"
        );
    }
}
