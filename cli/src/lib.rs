//! The command line's client side: `tessera login`, `get`, `describe`, `apply`, `scale`,
//! `drain`, `activate`, `preview`, `events`, `lb haproxy`. Every command talks to a
//! server's REST API with an API token: the one `tessera login` keeps (mode 0600 in the
//! user's config directory), or `--url` / `--token` (`TESSERA_URL` / `TESSERA_TOKEN`) for
//! scripts and CI.

#![forbid(unsafe_code)]

/// Prints a line to standard output; a closed pipe (`tessera get tasks | head`) ends the
/// command quietly.
macro_rules! say {
    ($($t:tt)*) => { $crate::write_out(&format!("{}\n", format_args!($($t)*))) };
}

mod apply;
pub mod lb;
mod table;
pub mod tls;

#[doc(hidden)]
pub fn write_out(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush())
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        std::process::exit(0);
    }
}

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;
use table::Table;
use tessera_model::HostInfo;
use tessera_model::api::{EndpointList, ServiceDetail};
use tessera_model::auth::{Caller, NewApiToken};
use tessera_model::bodies::{
    ErrorBody, EventList, FamilyList, HostDetail, HostList, ServiceList, TaskList,
};
use tessera_model::service::Task;

/// Where the server is and who is calling (the stored login unless given).
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The server's URL (default: the one `tessera login` kept).
    #[arg(long, env = "TESSERA_URL", global = true)]
    pub url: Option<String>,
    /// An API token (default: the one `tessera login` kept).
    #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<Token>,
    /// Trust this CA certificate (PEM) for the server's HTTPS, besides the system's roots.
    #[arg(long, env = "TESSERA_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
    /// Send the token over plain http:// to a server that is not on this machine.
    #[arg(long, env = "TESSERA_INSECURE_HTTP", global = true)]
    pub insecure_http: bool,
}

/// An API token from the command line or the environment: `Debug` shows `***`.
#[derive(Clone)]
pub struct Token(pub String);

impl std::str::FromStr for Token {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Token(s.to_owned()))
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Wide,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Kind {
    Hosts,
    Services,
    Tasks,
    #[value(name = "task-definitions", alias = "taskdefs")]
    TaskDefinitions,
    // One service's endpoints: `tessera get endpoints SERVICE`.
    Endpoints,
    // One service's work, as its application reports it: `tessera get work SERVICE`.
    Work,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Described {
    Service,
    Host,
}

/// The client commands, flattened into `tessera`'s own.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Sign in to a server and keep an API token for the commands below.
    Login {
        /// The server, e.g. https://tessera.example:3000.
        url: String,
        /// The user (asked for when not given and no --token).
        #[arg(long, short)]
        username: Option<String>,
        /// Read the password from standard input instead of asking.
        #[arg(long)]
        password_stdin: bool,
        /// Keep this API token instead of signing in with a password.
        #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true)]
        token: Option<Token>,
        /// Days until the token expires.
        #[arg(long, default_value_t = 90)]
        expires_in_days: u32,
        #[arg(long, env = "TESSERA_CA_CERT")]
        ca_cert: Option<PathBuf>,
        /// Send the password over plain http:// to a server that is not on this machine.
        #[arg(long, env = "TESSERA_INSECURE_HTTP")]
        insecure_http: bool,
    },
    /// Delete the kept token on the server and forget it here.
    Logout,
    /// List hosts, services, tasks, task definitions, a service's endpoints
    /// (`tessera get endpoints SERVICE`) or its work (`tessera get work SERVICE`).
    Get {
        kind: Kind,
        /// Endpoints: the service (the same as --service).
        name: Option<String>,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Tasks: only this service's. Endpoints: the service.
        #[arg(long)]
        service: Option<String>,
        /// Tasks: only those on this host.
        #[arg(long)]
        host: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Everything about one service (deployments, tasks, events) or host (GPUs, tasks).
    Describe {
        kind: Described,
        name: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Make the server match files of task definitions and services (YAML or JSON,
    /// Tessera's shape or ECS's): a plan of the changes first, then the changes.
    Apply {
        /// A file, or a directory of `.yaml`, `.yml` and `.json` files; `-` reads stdin.
        #[arg(short, long = "filename", required = true)]
        file: Vec<PathBuf>,
        /// Print the plan and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Follow each changed service's rollout until it is steady (exit 0) or rolled
        /// back (exit 3).
        #[arg(long)]
        wait: bool,
        /// How long --wait waits before giving up (exit 4).
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// Secret values in the files are write-only on the server and cannot be compared:
        /// register them (a new revision) instead of keeping the server's.
        #[arg(long)]
        update_secrets: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Set a service's desired count.
    Scale {
        service: String,
        count: u32,
        #[command(flatten)]
        conn: Connection,
    },
    /// Move a host's tasks elsewhere and place nothing new on it.
    Drain {
        host: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Let a drained host take tasks again.
    Activate {
        host: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Let a host that its pool held for approval (manual admission) take tasks.
    Approve {
        host: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Mint, list and delete join tokens: what agents register with, scoped to a pool,
    /// an expiry and a number of uses (or to one revoked host).
    JoinToken {
        #[command(subcommand)]
        command: JoinTokenCommand,
    },
    /// Where a file's services would be placed now, and what would not fit (commits
    /// nothing).
    Preview {
        #[arg(short, long = "filename")]
        file: PathBuf,
        /// How many tasks (default: each service's desired count).
        #[arg(long)]
        count: Option<u32>,
        #[command(flatten)]
        conn: Connection,
    },
    /// What happened, newest last.
    Events {
        #[arg(long)]
        service: Option<String>,
        #[arg(long)]
        host: Option<String>,
        /// Keep printing new events until interrupted.
        #[arg(long, short)]
        follow: bool,
        /// How many to show first.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        conn: Connection,
    },
    /// Keep a load balancer's servers equal to a service's healthy endpoints (Tessera
    /// carries no traffic itself).
    Lb {
        #[command(subcommand)]
        lb: LbCommand,
    },
    /// Print a shell completion script.
    Completion { shell: clap_complete::Shell },
}

/// `tessera join-token …`.
#[derive(Debug, Subcommand)]
pub enum JoinTokenCommand {
    /// Mint one; its value is printed this once (give it to the agent in a file:
    /// `tessera-agent --join-token-file`).
    Create {
        /// The pool hosts may register in with it (any pool when absent).
        #[arg(long)]
        pool: Option<String>,
        /// A revoked host it rejoins, and nothing else.
        #[arg(long)]
        host: Option<String>,
        /// How many hosts may register with it.
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// Hours until it expires (at most 720).
        #[arg(long, default_value_t = 24)]
        expires_in_hours: u64,
        /// Admit its hosts at once even where the pool holds new hosts for approval.
        #[arg(long)]
        preapproved: bool,
        /// What it is for.
        #[arg(long, default_value = "")]
        description: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// The minted tokens, without their values.
    List {
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
        #[command(flatten)]
        conn: Connection,
    },
    /// Stop a token from registering anything (hosts it registered stay).
    Delete {
        id: String,
        #[command(flatten)]
        conn: Connection,
    },
}

/// The load balancers `tessera lb` drives.
#[derive(Debug, Subcommand)]
pub enum LbCommand {
    /// Keep an HAProxy backend's servers equal to a service's healthy endpoints, through
    /// HAProxy's Runtime API, until interrupted.
    ///
    /// Syncs at start, on each change the server announces, and every 5 s (a restarted
    /// HAProxy is filled again). Only servers named `tsr-…` are Tessera's; the backend's
    /// others are left alone. Draining tasks' servers drain; gone, unhealthy or starting
    /// ones are deleted (their sessions closed after 30 s). Stopping leaves the servers as
    /// they are. HAProxy needs `stats socket PATH level admin` and a backend whose
    /// balancing takes servers at runtime (e.g. `balance roundrobin`).
    Haproxy {
        /// HAProxy's admin socket (`stats socket PATH ... level admin`).
        #[arg(long)]
        socket: PathBuf,
        /// The backend to fill (it must exist in HAProxy's configuration).
        #[arg(long)]
        backend: String,
        /// The service whose endpoints are the servers.
        #[arg(long)]
        service: String,
        /// Only the task port with this name (default: every TCP port of each task; pass
        /// it when tasks have several ports).
        #[arg(long)]
        port_name: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
}

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
            ca_cert,
            insecure_http,
        } => {
            login(
                &url,
                insecure_http,
                username,
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
            conn,
        } => {
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
            get(&Client::new(&conn)?, kind, output, service, host).await
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
            let body = serde_json::json!({ "desired_count": count });
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

/// What `tessera login` keeps (never printed: it holds the token).
#[derive(Clone, Serialize, Deserialize)]
struct Login {
    url: String,
    token: String,
    /// The token's id on the server (to delete it at logout).
    token_id: Option<String>,
    /// Who signed in.
    user: String,
    ca_cert: Option<PathBuf>,
    /// Signed in over plain http:// to a remote server on purpose (`--insecure-http`).
    #[serde(default)]
    insecure_http: bool,
}

/// `$TESSERA_CONFIG_DIR`, else `$XDG_CONFIG_HOME/tessera`, else `~/.config/tessera`.
fn config_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("TESSERA_CONFIG_DIR") {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("tessera"));
    }
    let home = std::env::var_os("HOME").context(
        "no HOME to keep the login in: set TESSERA_CONFIG_DIR, or pass --url and --token",
    )?;
    Ok(PathBuf::from(home).join(".config/tessera"))
}

fn login_file() -> anyhow::Result<PathBuf> {
    Ok(config_dir()?.join("login.json"))
}

fn load_login() -> anyhow::Result<Option<Login>> {
    let path = login_file()?;
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "{} is not a login this tessera wrote: run `tessera login URL` again",
                path.display()
            )
        })?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn save_login(login: &Login) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let path = login_file()?;
    let dir = path.parent().expect("a file in a directory");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let bytes = serde_json::to_vec_pretty(login)?;
    // Owner-only from the start, then renamed over: never readable by others, never half
    // written.
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// An API client with a token.
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

fn http_client(ca_cert: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .user_agent(concat!("tessera-cli/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = ca_cert {
        let pem =
            std::fs::read(path).with_context(|| format!("reading --ca-cert {}", path.display()))?;
        let cert = reqwest::Certificate::from_pem(&pem)
            .with_context(|| format!("--ca-cert {}: not a PEM certificate", path.display()))?;
        b = b.add_root_certificate(cert);
    }
    b.build().context("setting up HTTPS")
}

/// The server's URL without a trailing `/`. Plain `http://` only to this machine (or with
/// `insecure`): anything on the network between would read the password or token.
fn base_url(url: &str, insecure: bool) -> anyhow::Result<String> {
    let parsed = reqwest::Url::parse(url).with_context(|| {
        format!("{url:?} is not a URL: give one like https://tessera.example:3000")
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        bail!("{url:?}: only http:// and https:// servers");
    }
    let loopback = match parsed.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    };
    if parsed.scheme() == "http" && !loopback && !insecure {
        bail!(
            "{url:?}: credentials would cross the network in clear; use https:// (the server's --tls-cert), or pass --insecure-http if this network is yours alone"
        );
    }
    Ok(url.trim_end_matches('/').to_owned())
}

impl Client {
    /// From flags or the environment, else the stored login.
    pub fn new(conn: &Connection) -> anyhow::Result<Client> {
        let stored = load_login()?;
        let url = conn
            .url
            .clone()
            .or_else(|| stored.as_ref().map(|l| l.url.clone()))
            .context("no server: run `tessera login URL` first, or pass --url (TESSERA_URL)")?;
        let token = conn
            .token
            .as_ref()
            .map(|t| t.0.clone())
            .or_else(|| stored.as_ref().map(|l| l.token.clone()))
            .context("no token: run `tessera login URL` first, or pass --token (TESSERA_TOKEN)")?;
        let insecure = conn.insecure_http
            || stored
                .as_ref()
                .is_some_and(|l| l.insecure_http && l.url == url.trim_end_matches('/'));
        let ca = conn
            .ca_cert
            .clone()
            .or_else(|| stored.and_then(|l| l.ca_cert));
        Ok(Client {
            http: http_client(ca.as_deref())?,
            base: base_url(&url, insecure)?,
            token,
        })
    }

    /// A request; any answer but a success becomes an error that says what to do.
    pub async fn send<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<T> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = resp.status();
        let bytes = resp.bytes().await.context("reading the answer")?;
        if status.is_success() {
            let bytes = if bytes.is_empty() {
                &b"null"[..]
            } else {
                &bytes[..]
            };
            return serde_json::from_slice(bytes)
                .with_context(|| format!("{method} {path}: an answer this tessera cannot read"));
        }
        Err(api_error(status, &bytes).into())
    }

    pub async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(reqwest::Method::GET, path, None).await
    }

    /// A GET whose answer is read as it arrives (the live event stream), with the answer's
    /// status checked. The client's 60 s limit would cut a stream, so this one has an hour
    /// (the caller reconnects; it also gives up on a stream that goes quiet).
    pub(crate) async fn stream(&self, path: &str) -> anyhow::Result<reqwest::Response> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .timeout(Duration::from_secs(3600))
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let bytes = resp.bytes().await.unwrap_or_default();
        Err(api_error(status, &bytes).into())
    }
}

/// The server's refusal, with every field error and what to do.
fn api_error(status: reqwest::StatusCode, bytes: &[u8]) -> Exit {
    let body: Option<ErrorBody> = serde_json::from_slice(bytes).ok();
    let mut message = match &body {
        Some(b) => b.error.clone(),
        None => String::from_utf8_lossy(bytes).trim().to_owned(),
    };
    if let Some(errors) = body.as_ref().and_then(|b| b.errors.as_ref()) {
        for e in errors {
            message.push_str(&format!("\n  {}: {}", e.field, e.message));
        }
    }
    let hint = match status.as_u16() {
        401 => "\nthe token is missing, expired or deleted: run `tessera login URL`",
        403 => "\nyour token's role does not allow this: ask an admin",
        _ => "",
    };
    Exit {
        code: 1,
        message: format!("refused ({status}): {message}{hint}"),
        status: Some(status.as_u16()),
    }
}

async fn login(
    url: &str,
    insecure_http: bool,
    username: Option<String>,
    password_stdin: bool,
    token: Option<Token>,
    expires_in_days: u32,
    ca_cert: Option<PathBuf>,
) -> anyhow::Result<()> {
    let base = base_url(url, insecure_http)?;
    let http = http_client(ca_cert.as_deref())?;
    let (token, token_id) = match token {
        Some(Token(t)) => (t, None),
        None => {
            let user = match username {
                Some(u) => u,
                None => {
                    eprint!("Username: ");
                    let mut line = String::new();
                    std::io::stdin()
                        .read_line(&mut line)
                        .context("reading the username")?;
                    line.trim().to_owned()
                }
            };
            let password = if password_stdin {
                let mut line = String::new();
                std::io::stdin()
                    .read_line(&mut line)
                    .context("reading the password from standard input")?;
                line.trim_end_matches(['\n', '\r']).to_owned()
            } else {
                rpassword::prompt_password("Password: ").context("reading the password")?
            };
            let host = nix_hostname();
            let body = serde_json::json!({
                "username": user,
                "password": password,
                "name": format!("cli {user}@{host}"),
                "expires_in_days": expires_in_days,
            });
            let resp = http
                .post(format!("{base}/api/v1/session/token"))
                .json(&body)
                .send()
                .await
                .with_context(|| format!("cannot reach {base}"))?;
            let status = resp.status();
            let bytes = resp.bytes().await?;
            if !status.is_success() {
                return Err(api_error(status, &bytes).into());
            }
            let made: NewApiToken = serde_json::from_slice(&bytes)
                .context("the server's answer is not a token: is this a Tessera server?")?;
            (made.token, Some(made.info.id))
        }
    };
    // The token must work before it is kept.
    let client = Client {
        http,
        base: base.clone(),
        token: token.clone(),
    };
    let me: Caller = client.get("/api/v1/session").await?;
    let path = save_login(&Login {
        url: base.clone(),
        token,
        token_id,
        user: me.name.clone(),
        ca_cert,
        insecure_http,
    })?;
    say!(
        "signed in to {base} as {} ({}); token kept in {}",
        me.on_behalf_of.as_deref().unwrap_or(&me.name),
        me.role,
        path.display()
    );
    Ok(())
}

fn nix_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

async fn logout() -> anyhow::Result<()> {
    let Some(login) = load_login()? else {
        say!("not signed in");
        return Ok(());
    };
    let client = Client {
        http: http_client(login.ca_cert.as_deref())?,
        base: login.url.clone(),
        token: login.token.clone(),
    };
    // A token this login made is deleted on the server; one given with --token is the
    // caller's to keep.
    let Some(id) = &login.token_id else {
        std::fs::remove_file(login_file()?).context("forgetting the login")?;
        say!(
            "forgot the login to {}; the token was given to `tessera login --token`, so it still works",
            login.url
        );
        return Ok(());
    };
    let ended: anyhow::Result<serde_json::Value> = client
        .send(
            reqwest::Method::DELETE,
            &format!("/api/v1/tokens/{}", seg(id)),
            None,
        )
        .await;
    std::fs::remove_file(login_file()?).context("forgetting the login")?;
    match ended {
        Ok(_) => say!("signed out of {}; the token no longer works", login.url),
        Err(e) => {
            say!("forgot the login; the server could not delete the token ({e:#}): an admin can")
        }
    }
    Ok(())
}

fn print_json<T: Serialize>(v: &T) -> anyhow::Result<()> {
    say!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

fn gpus_summary(h: &HostInfo) -> String {
    let mut models: Vec<(String, usize)> = Vec::new();
    for g in &h.gpus {
        let short = g.model.trim_start_matches("NVIDIA ").to_owned();
        match models.iter_mut().find(|(m, _)| *m == short) {
            Some((_, n)) => *n += 1,
            None => models.push((short, 1)),
        }
    }
    models
        .iter()
        .map(|(m, n)| format!("{n}x {m}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn allocation(t: &Task) -> String {
    t.allocations
        .iter()
        .map(|a| {
            if a.dedicated {
                format!("gpu{} whole", a.index)
            } else {
                format!("gpu{} {} {}", a.index, a.memory, a.compute)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn task_note(t: &Task) -> String {
    t.stop_reason
        .clone()
        .or(t.placement_message.clone())
        .unwrap_or_default()
}

/// A service's work: the figures now, then (wide) its history, interference, alarms and
/// autoscaling.
fn print_work(w: &tessera_model::work::ServiceWork, wide: bool) {
    use tessera_model::work::trim_float;
    let num = |v: Option<f64>| {
        v.map_or_else(|| "-".to_owned(), |v| trim_float((v * 10.0).round() / 10.0))
    };
    let Some(spec) = &w.spec else {
        println!(
            "{}: its task definition does not say where its work is measured (`work`)",
            w.service
        );
        return;
    };
    let mut t = Table::new(&[
        "SERVICE",
        "COMPLETED/S",
        "PER GPU-HOUR",
        "PER GIB/S",
        "P99 MS",
        "ERRORS",
        "TASKS",
        "TARGET",
    ]);
    t.row(vec![
        w.service.clone(),
        num(w.completed_per_sec),
        num(w.completed_per_gpu_hour),
        num(w.completed_per_sec_per_gib),
        num(w.latency_p99_ms),
        w.error_rate
            .map_or_else(|| "-".to_owned(), |r| format!("{:.2}%", r * 100.0)),
        format!("{} ({} unknown)", w.tasks_measured, w.tasks_unknown),
        w.verdict.clone().unwrap_or_else(|| "-".into()),
    ]);
    t.print();
    println!(
        "measured: {} on port {} at {}",
        spec.completed, spec.port, spec.path
    );
    for (task, why) in &w.unknown {
        println!(
            "unknown: {}: {why}",
            task.chars().take(8).collect::<String>()
        );
    }
    for e in &w.interference {
        println!("{}", e.summary);
    }
    for a in &w.alarms {
        println!(
            "alarm {}: {}{}",
            a.alarm.describe(),
            a.state,
            a.value
                .map(|v| format!(" (now {})", num(Some(v))))
                .unwrap_or_default()
        );
    }
    if let Some(s) = &w.autoscaling {
        println!("autoscaling: {s}");
    }
    if wide {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let mut h = Table::new(&[
            "SINCE",
            "COMPLETED/S",
            "ERROR RATE",
            "P50 MS",
            "P95 MS",
            "P99 MS",
            "TASKS",
        ]);
        for p in &w.series {
            h.row(vec![
                format!("{} s ago", now - p.at),
                num(Some(p.completed_per_sec)),
                p.error_rate
                    .map_or_else(|| "-".to_owned(), |r| format!("{:.2}%", r * 100.0)),
                num(p.latency_p50_ms),
                num(p.latency_p95_ms),
                num(p.latency_p99_ms),
                p.tasks.to_string(),
            ]);
        }
        h.print();
    }
}

async fn get(
    c: &Client,
    kind: Kind,
    output: Output,
    service: Option<String>,
    host: Option<String>,
) -> anyhow::Result<()> {
    let wide = output == Output::Wide;
    match kind {
        Kind::Hosts => {
            let list: HostList = c.get("/api/v1/hosts").await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&["HOST", "POOL", "STATUS", "GPUS"]);
            if wide {
                t.add_columns(&["CPU", "MEMORY", "LAST SEEN", "REASON"]);
            }
            for h in &list.hosts {
                let mut row = vec![
                    h.id.to_string(),
                    h.pool.to_string(),
                    host_status(h),
                    gpus_summary(h),
                ];
                if wide {
                    row.extend([
                        h.cpu.to_string(),
                        h.memory.to_string(),
                        h.last_seen.clone().unwrap_or_default(),
                        h.status_reason.clone().unwrap_or_default(),
                    ]);
                }
                t.row(row);
            }
            t.print();
        }
        Kind::Services => {
            let list: ServiceList = c.get("/api/v1/services").await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&[
                "SERVICE",
                "TASK DEFINITION",
                "DESIRED",
                "RUNNING",
                "PENDING",
                "POOL",
            ]);
            if wide {
                t.add_columns(&["DEPLOYMENTS", "STRATEGY"]);
            }
            for s in &list.services {
                let mut row = vec![
                    s.service.name.clone(),
                    s.service.task_definition.to_string(),
                    s.service.desired_count.to_string(),
                    s.running.to_string(),
                    s.pending.to_string(),
                    s.service.pool.to_string(),
                ];
                if wide {
                    row.push(
                        s.deployments
                            .iter()
                            .map(|d| format!("{} {}", d.task_definition, d.status))
                            .collect::<Vec<_>>()
                            .join(", "),
                    );
                    row.push(
                        s.service
                            .strategy
                            .map_or_else(|| "pool's".to_owned(), |p| p.to_string()),
                    );
                }
                t.row(row);
            }
            t.print();
        }
        Kind::Tasks => {
            let mut query = Vec::new();
            if let Some(s) = &service {
                query.push(format!("service={}", seg(s)));
            }
            if let Some(h) = &host {
                query.push(format!("host={}", seg(h)));
            }
            let list: TaskList = c.get(&format!("/api/v1/tasks?{}", query.join("&"))).await?;
            if output == Output::Json {
                return print_json(&list);
            }
            print_tasks(&list.tasks, wide);
        }
        Kind::Endpoints => {
            let service = service.context("which service? `tessera get endpoints SERVICE`")?;
            let list: EndpointList = c
                .get(&format!("/api/v1/services/{}/endpoints", seg(&service)))
                .await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&["TASK", "HOST", "ADDRESS", "PORT", "HEALTH", "REASON"]);
            if wide {
                t.add_columns(&["PROTOCOL", "TASK DEFINITION"]);
            }
            for e in &list.endpoints {
                let mut row = vec![
                    e.task.chars().take(8).collect(),
                    e.host.to_string(),
                    lb::host_port(&e.address, e.port),
                    e.port_name
                        .clone()
                        .unwrap_or_else(|| e.container_port.to_string()),
                    e.health.as_str().to_owned(),
                    // A check's output can run to several lines: its first.
                    e.reason
                        .as_deref()
                        .and_then(|r| r.lines().next())
                        .unwrap_or_default()
                        .to_owned(),
                ];
                if wide {
                    row.extend([
                        e.protocol.as_str().to_owned(),
                        e.task_definition.to_string(),
                    ]);
                }
                t.row(row);
            }
            t.print();
        }
        Kind::Work => {
            let service = service.context("which service? `tessera get work SERVICE`")?;
            let w: tessera_model::work::ServiceWork = c
                .get(&format!("/api/v1/services/{}/work", seg(&service)))
                .await?;
            if output == Output::Json {
                return print_json(&w);
            }
            print_work(&w, wide);
        }
        Kind::TaskDefinitions => {
            let list: FamilyList = c.get("/api/v1/task-definitions").await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&["FAMILY", "REVISION", "CONTAINERS", "GPU"]);
            if wide {
                t.add_columns(&["IMAGES", "REGISTERED"]);
            }
            for d in &list.task_definitions {
                let gpu = d
                    .spec
                    .containers
                    .iter()
                    .filter_map(|c| c.gpu.as_ref().map(gpu_text))
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut row = vec![
                    d.family.clone(),
                    d.revision.to_string(),
                    d.spec.containers.len().to_string(),
                    if gpu.is_empty() { "-".into() } else { gpu },
                ];
                if wide {
                    row.push(
                        d.spec
                            .containers
                            .iter()
                            .filter_map(|c| c.image.clone())
                            .collect::<Vec<_>>()
                            .join(", "),
                    );
                    row.push(d.registered_at.clone());
                }
                t.row(row);
            }
            t.print();
        }
    }
    Ok(())
}

fn gpu_text(g: &tessera_model::taskdef::GpuRequirement) -> String {
    use tessera_model::taskdef::GpuRequirement;
    match g {
        GpuRequirement::Gpus(n) => format!("{n} whole"),
        GpuRequirement::Mps {
            memory_mib,
            max_compute_percent,
        } => match max_compute_percent {
            Some(p) => format!("MPS {} {}%", memory_mib, p.get()),
            None => format!("MPS {memory_mib}"),
        },
    }
}

fn print_tasks(tasks: &[Task], wide: bool) {
    let mut t = Table::new(&["TASK", "SERVICE", "STATE", "HOST", "GPU"]);
    if wide {
        t.add_columns(&["TASK DEFINITION", "STARTED", "NOTE"]);
    }
    for task in tasks {
        let mut row = vec![
            task.id.clone(),
            task.service.clone(),
            format!(
                "{}{}",
                task.state,
                if task.migrating { " (moving)" } else { "" }
            ),
            task.host
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_else(|| "-".into()),
            allocation(task),
        ];
        if wide {
            row.extend([
                task.task_definition.to_string(),
                task.started_at.clone().unwrap_or_default(),
                task_note(task),
            ]);
        }
        t.row(row);
    }
    t.print();
}

async fn describe(c: &Client, kind: Described, name: &str) -> anyhow::Result<()> {
    match kind {
        Described::Service => {
            let s: ServiceDetail = c.get(&format!("/api/v1/services/{}", seg(name))).await?;
            let svc = &s.service;
            say!("Service:          {}", svc.name);
            say!("Task definition:  {}", svc.task_definition);
            say!("Pool:             {}", svc.pool);
            say!(
                "Tasks:            {} desired, {} running, {} pending",
                svc.desired_count,
                s.running,
                s.pending
            );
            say!(
                "Strategy:         {}",
                svc.strategy
                    .map_or_else(|| "the pool's".to_owned(), |p| p.to_string())
            );
            say!(
                "Deployment:       minimum healthy {}%, maximum {}%; stop timeout {} s",
                svc.deployment.minimum_healthy_percent,
                svc.deployment.maximum_percent,
                svc.stop_timeout_secs
            );
            if svc.deleting {
                say!("Being deleted:    its tasks are stopping");
            }
            say!("\nDeployments:");
            let mut t = Table::new(&[
                "ID",
                "TASK DEFINITION",
                "STATUS",
                "RUNNING",
                "PENDING",
                "FAILED",
            ]);
            for d in &s.deployments {
                t.row(vec![
                    d.id.to_string(),
                    d.task_definition.to_string(),
                    d.status.to_string(),
                    d.running.to_string(),
                    d.pending.to_string(),
                    d.failed_tasks.to_string(),
                ]);
            }
            t.print();
            let tasks: TaskList = c
                .get(&format!("/api/v1/tasks?service={}", seg(name)))
                .await?;
            let (live, stopped): (Vec<Task>, Vec<Task>) =
                tasks.tasks.into_iter().partition(|t| t.state.is_live());
            say!("\nTasks:");
            print_tasks(&live, false);
            if !stopped.is_empty() {
                say!(
                    "({} stopped not shown: `tessera get tasks --service {name} -o wide`)",
                    stopped.len()
                );
            }
            say!("\nEvents:");
            for e in s.events.iter().take(15).rev() {
                say!("  {}  {}", e.at, e.message);
            }
        }
        Described::Host => {
            let h: HostDetail = c.get(&format!("/api/v1/hosts/{}", seg(name))).await?;
            let host = &h.host;
            say!("Host:     {}", host.id);
            say!("Pool:     {}", host.pool);
            say!(
                "Status:   {}{}",
                host.status,
                host.status_reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            );
            say!("CPU:      {}    Memory: {}", host.cpu, host.memory);
            say!(
                "Seen:     {}{}",
                host.last_seen.as_deref().unwrap_or("never"),
                if host.simulated {
                    " (simulated GPUs)"
                } else {
                    ""
                }
            );
            if !host.labels.is_empty() {
                let labels: Vec<String> = host
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                say!("Labels:   {}", labels.join(", "));
            }
            say!("\nGPUs:");
            let mut t = Table::new(&["INDEX", "MODEL", "MEMORY", "SHARING", "HEALTH", "TASKS"]);
            for g in &host.gpus {
                let on = h
                    .tasks
                    .iter()
                    .filter(|t| t.allocations.iter().any(|a| a.gpu == g.uuid))
                    .count();
                t.row(vec![
                    g.index.to_string(),
                    g.model.clone(),
                    g.memory.to_string(),
                    g.sharing_mode.to_string(),
                    g.health.to_string(),
                    on.to_string(),
                ]);
            }
            t.print();
            say!("\nTasks:");
            print_tasks(&h.tasks, false);
        }
    }
    Ok(())
}

async fn host_action(c: &Client, host: &str, action: &str) -> anyhow::Result<()> {
    let h: HostInfo = c
        .send(
            reqwest::Method::POST,
            &format!("/api/v1/hosts/{}/{action}", seg(host)),
            None,
        )
        .await?;
    say!("host {}: {}", h.id, host_status(&h));
    Ok(())
}

/// A host's status as lists show it: held hosts say so.
fn host_status(h: &HostInfo) -> String {
    if h.held {
        format!("{} (held for approval)", h.status)
    } else {
        h.status.to_string()
    }
}

async fn join_token(command: JoinTokenCommand) -> anyhow::Result<()> {
    use tessera_model::auth::{JoinTokenInfo, NewJoinToken};
    match command {
        JoinTokenCommand::Create {
            pool,
            host,
            uses,
            expires_in_hours,
            preapproved,
            description,
            conn,
        } => {
            let body = serde_json::json!({
                "pool": pool, "host": host, "uses": uses,
                "expires_in_secs": expires_in_hours.saturating_mul(3600),
                "preapproved": preapproved, "description": description,
            });
            let t: NewJoinToken = Client::new(&conn)?
                .send(reqwest::Method::POST, "/api/v1/join-tokens", Some(&body))
                .await?;
            say!("{}", t.token);
            eprintln!(
                "join token {}: pool {}, {} use(s), expires {}{}; shown this once. Give it to the agent in a file (--join-token-file) or TESSERA_AGENT_JOIN_TOKEN, never on its command line.",
                t.info.id,
                t.info.pool.as_deref().unwrap_or("any"),
                t.info.uses_left,
                t.info.expires_at,
                t.info
                    .host
                    .as_deref()
                    .map_or(String::new(), |h| format!(", rejoins host {h}")),
            );
            Ok(())
        }
        JoinTokenCommand::List { output, conn } => {
            #[derive(serde::Deserialize, serde::Serialize)]
            struct List {
                join_tokens: Vec<JoinTokenInfo>,
            }
            let list: List = Client::new(&conn)?.get("/api/v1/join-tokens").await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&["ID", "POOL", "USES LEFT", "USED", "EXPIRES", "DESCRIPTION"]);
            for j in &list.join_tokens {
                t.row(vec![
                    j.id.clone(),
                    j.pool.clone().unwrap_or_else(|| "any".into()),
                    j.uses_left.to_string(),
                    j.uses.to_string(),
                    j.expires_at.clone(),
                    j.description.clone(),
                ]);
            }
            t.print();
            Ok(())
        }
        JoinTokenCommand::Delete { id, conn } => {
            let _: serde_json::Value = Client::new(&conn)?
                .send(
                    reqwest::Method::DELETE,
                    &format!("/api/v1/join-tokens/{}", seg(&id)),
                    None,
                )
                .await?;
            say!("join token {id} deleted");
            Ok(())
        }
    }
}

async fn events(
    c: &Client,
    service: Option<String>,
    host: Option<String>,
    follow: bool,
    limit: u32,
) -> anyhow::Result<()> {
    let mut filter = String::new();
    if let Some(s) = &service {
        filter.push_str(&format!("&service={}", seg(s)));
    }
    if let Some(h) = &host {
        filter.push_str(&format!("&host={}", seg(h)));
    }
    let first: EventList = c
        .get(&format!("/api/v1/events?limit={limit}{filter}"))
        .await?;
    let mut last = 0;
    // Newest first from the server; oldest first on the terminal.
    for e in first.events.iter().rev() {
        say!("{}  {}", e.at, e.message);
        last = last.max(e.id);
    }
    if !follow {
        return Ok(());
    }
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let next: EventList = c
            .get(&format!("/api/v1/events?after={last}&limit=500{filter}"))
            .await?;
        for e in next.events.iter().rev() {
            say!("{}  {}", e.at, e.message);
            last = last.max(e.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::base_url;

    #[test]
    fn credentials_cross_a_network_in_clear_only_when_asked_to() {
        for local in [
            "http://127.0.0.1:3000/",
            "http://localhost:3000",
            "http://[::1]:3000",
            "https://tessera.example",
        ] {
            assert!(base_url(local, false).is_ok(), "{local}");
        }
        let err = base_url("http://tessera.example:3000", false).expect_err("refused");
        assert!(err.to_string().contains("--insecure-http"), "{err}");
        assert!(base_url("http://10.0.0.5:3000", false).is_err());
        assert_eq!(
            base_url("http://10.0.0.5:3000/", true).expect("asked for"),
            "http://10.0.0.5:3000"
        );
    }
}
