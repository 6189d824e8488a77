//! The client commands' command line (clap): the connection flags, what `get` and
//! `describe` take, and each command with its options.

use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

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
    // Pools: their policy and, with a capacity provider, its limits and machines.
    Pools,
    Projects,
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
    Task,
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
        /// Scope the token to this project, with your role there (what a user who is an
        /// operator in one project needs to change its services).
        #[arg(long)]
        project: Option<String>,
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
        /// Services, tasks and projects: only this project's.
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Everything about one service (deployments, tasks, events), host (GPUs, tasks) or
    /// task (how it went, where, its failures, events, and its last lines once stopped).
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
    /// Set or remove a pool's capacity provider (what makes and removes its machines).
    Pool {
        #[command(subcommand)]
        command: PoolCommand,
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
    /// A task's logs, or a service's running tasks' interleaved (each line prefixed with
    /// its task), read from their hosts; `-f` follows new lines.
    Logs {
        /// A task id, or a service's name.
        target: String,
        /// Keep printing new lines until the task ends (or interrupted).
        #[arg(long, short)]
        follow: bool,
        /// Only the last this many lines (of each task).
        #[arg(long)]
        tail: Option<u32>,
        /// Only lines since a time (RFC 3339) or a span back (90s, 10m, 2h, 1d).
        #[arg(long)]
        since: Option<String>,
        /// Only this container's output.
        #[arg(long)]
        container: Option<String>,
        /// Start each line with the time its host read it.
        #[arg(long, short)]
        timestamps: bool,
        #[command(flatten)]
        conn: Connection,
    },
    /// Run a command in a running task (where its pool allows exec): as the task's user,
    /// in its environment and cgroup. `-i` sends standard input, `-t` gives it a terminal
    /// (`tessera exec -it TASK -- sh`).
    Exec {
        task: String,
        /// The container to run it in (the task's first by default).
        #[arg(long)]
        container: Option<String>,
        /// Send standard input to the command.
        #[arg(short, long)]
        interactive: bool,
        /// Give the command a terminal.
        #[arg(short, long)]
        tty: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
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

/// `tessera pool …`.
#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Give the pool a capacity provider, or change its settings: a YAML or JSON file of
    /// them (`kind`, `min_hosts`, `max_hosts`, …, as in `PATCH /api/v1/pools/{name}`).
    SetProvider {
        pool: String,
        /// The settings' file; `-` reads stdin.
        #[arg(short, long)]
        file: String,
        #[command(flatten)]
        conn: Connection,
    },
    /// Take the pool's capacity provider away: its hosts stay, and nothing scales it.
    RemoveProvider {
        pool: String,
        #[command(flatten)]
        conn: Connection,
    },
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
        #[arg(long, env = "HAPROXY_SOCKET")]
        socket: PathBuf,
        /// The backend to fill (it must exist in HAProxy's configuration).
        #[arg(long, env = "HAPROXY_BACKEND")]
        backend: String,
        /// The service whose endpoints are the servers.
        #[arg(long)]
        service: String,
        /// Only the task port with this name (default: every TCP port of each task; pass
        /// it when tasks have several ports).
        #[arg(long, env = "HAPROXY_PORT_NAME")]
        port_name: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
}
