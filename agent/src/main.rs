//! `tessera-agent`: runs on each GPU host. See the crate docs of `tessera_agent`.

use anyhow::Context;
use clap::Parser;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tessera_agent::probe::{GpuProbe, NvmlProbe, SimulatedProbe};
use tessera_agent::{Agent, AgentConfig, ContainerRuntime, Isolation};
use tessera_model::PoolName;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "tessera-agent",
    version = tessera_model::version::long(),
    about = "Tessera host agent: GPUs, MPS, tasks"
)]
struct Cli {
    /// `check`: check this host's prerequisites (driver and NVML, compute mode, the MPS
    /// program, root and task uids, cgroups, Docker and its NVIDIA runtime, each server
    /// and its certificate), print a verdict for each with what to do, and exit: 1 when
    /// the agent cannot run as configured. It changes nothing. Takes the agent's flags.
    #[arg(value_enum)]
    action: Option<Action>,
    /// The control plane's URL, or the URLs of several of its servers separated by commas
    /// (one database behind them): one is used at a time, and when it does not answer the
    /// agent moves to the next at once.
    #[arg(long, env = "TESSERA_AGENT_SERVER", required_unless_present = "probe")]
    server: Option<String>,
    /// Trust this CA certificate (PEM) for the server's HTTPS, besides the system's roots.
    #[arg(long, env = "TESSERA_AGENT_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// Allow plain http:// to a server that is not on loopback (tokens and secrets in clear).
    #[arg(long, env = "TESSERA_AGENT_INSECURE_HTTP")]
    insecure_http: bool,
    /// A file holding the join token (needed only to register; keep it readable by root
    /// only). The token may also come from TESSERA_AGENT_JOIN_TOKEN, never the command
    /// line, which every process on the host can read. The agent forgets it once
    /// registered.
    #[arg(long, env = "TESSERA_AGENT_JOIN_TOKEN_FILE")]
    join_token_file: Option<PathBuf>,
    /// Refused: a token here would be in /proc/PID/cmdline for every local process (every
    /// task) to read. Use --join-token-file or TESSERA_AGENT_JOIN_TOKEN.
    #[arg(long, hide = true)]
    join_token: Option<String>,
    /// Where the agent keeps its credentials, task state and logs.
    #[arg(
        long,
        env = "TESSERA_AGENT_STATE_DIR",
        default_value = "/var/lib/tessera-agent"
    )]
    state_dir: PathBuf,
    /// Pool to join.
    #[arg(long, env = "TESSERA_AGENT_POOL", default_value = "default")]
    pool: String,
    /// Host id to ask for (default: the hostname).
    #[arg(long, env = "TESSERA_AGENT_NAME")]
    name: Option<String>,
    /// Host label KEY=VALUE, for placement constraints (repeatable).
    #[arg(long = "label", env = "TESSERA_AGENT_LABELS", value_delimiter = ',')]
    labels: Vec<String>,
    /// CPU to offer, in thousandths of a core (default: all of this machine's).
    #[arg(long, env = "TESSERA_AGENT_CPU_MILLI", requires = "memory_mib")]
    cpu_milli: Option<u64>,
    /// Host memory to offer, in MiB (default: all of this machine's).
    #[arg(long, env = "TESSERA_AGENT_MEMORY_MIB", requires = "cpu_milli")]
    memory_mib: Option<u64>,
    /// Simulate GPUs, e.g. `8xH100-80GB`, instead of asking NVML.
    #[arg(long, env = "TESSERA_AGENT_SIMULATE")]
    simulate: Option<String>,
    /// Path of nvidia-cuda-mps-control (or a stand-in).
    #[arg(long, env = "TESSERA_AGENT_MPS_CONTROL")]
    mps_control: Option<PathBuf>,
    /// Run no MPS daemon: the GPUs are time-shared and MPS holds no task's memory or
    /// compute limit (where MPS cannot run; the agent says so in its log).
    #[arg(long, env = "TESSERA_AGENT_NO_MPS", conflicts_with = "mps_control")]
    no_mps: bool,
    /// Per-task log size before it starts over, in bytes.
    #[arg(long, env = "TESSERA_AGENT_LOG_CAP", default_value_t = 10 * 1024 * 1024)]
    log_cap: u64,
    /// Log directories of ended tasks are deleted after this many hours untouched.
    #[arg(long, env = "TESSERA_AGENT_LOG_RETENTION_HOURS", default_value_t = 24)]
    log_retention_hours: u64,
    /// Run every task as this one user: they then share its uid and can read each other's
    /// environment (secrets), so this is an explicit choice. Without it an agent running
    /// as root gives each task a uid of its own (see --task-uids); one not running as root
    /// runs tasks as its own user. `--run-as root` keeps root for tasks, and says so in
    /// the log. --task-uids takes precedence.
    #[arg(long, env = "TESSERA_AGENT_RUN_AS")]
    run_as: Option<String>,
    /// Give each task a uid of its own from this range, START-END, with a group of the
    /// same number, unless its definition names a user (which its pool must allow). Tasks
    /// then cannot read each other's environment (secrets), signal each other's processes
    /// or open each other's files and logs. Needs the agent to run as root; takes
    /// precedence over --run-as. Default, as root without --run-as:
    /// 1000000000-1000065535 (uids no account has).
    #[arg(long, env = "TESSERA_AGENT_TASK_UIDS", value_parser = parse_uid_range)]
    task_uids: Option<(u32, u32)>,
    /// The cgroup under which each task gets a cgroup of its own, named after its id
    /// (relative to the root of each cgroup hierarchy, cgroup v2 or v1): its CPU, memory
    /// and pid limits are set there, and stopping it kills every process in it, whatever
    /// it did with setsid or double forks. Needs write access to /sys/fs/cgroup (root);
    /// without it the agent says so and runs tasks without.
    #[arg(long, env = "TESSERA_AGENT_CGROUP_PARENT", default_value = "tessera", value_parser = parse_cgroup_parent)]
    cgroup_parent: String,
    /// The most processes and threads one task may have (its cgroup's pids.max, a
    /// container's PidsLimit); 0: no limit.
    #[arg(long, env = "TESSERA_AGENT_TASK_PIDS_MAX", default_value_t = tessera_agent::runtime::DEFAULT_PIDS_MAX)]
    task_pids_max: u64,
    /// How containers with an image run: `docker` (the engine on --docker-socket; the
    /// agent does not start without it), `process` (images refused), or `auto` (docker
    /// where the socket answers). A container without an image always runs as a process.
    #[arg(long, env = "TESSERA_AGENT_RUNTIME", value_enum, default_value_t = RuntimeArg::Auto)]
    runtime: RuntimeArg,
    /// The Docker engine's socket (default: `DOCKER_HOST`'s unix:// path, else
    /// /var/run/docker.sock).
    #[arg(long, env = "TESSERA_AGENT_DOCKER_SOCKET")]
    docker_socket: Option<PathBuf>,
    /// The address tasks on this host are reached at, which endpoints and load balancers
    /// use (default: this machine's primary address, the one its default route leaves from).
    #[arg(long, env = "TESSERA_AGENT_ADVERTISE_ADDRESS")]
    advertise_address: Option<String>,
    /// The range dynamic host ports are chosen from, FROM-TO.
    #[arg(long, env = "TESSERA_AGENT_PORT_RANGE", default_value = "32768-60999", value_parser = parse_port_range)]
    port_range: (u16, u16),
    /// This machine's id at its capacity provider (e.g. its EC2 instance id, or what an
    /// operator's provider command named it), said when it joins: how the pool's provider
    /// knows the host it asked for.
    #[arg(long, env = "TESSERA_AGENT_PROVIDER_ID", value_parser = parse_provider_id)]
    provider_id: Option<String>,
    /// Print the GPUs found (JSON) and exit.
    #[arg(long)]
    probe: bool,
}

fn parse_provider_id(s: &str) -> Result<String, String> {
    if tessera_model::agent::provider_id_ok(s) {
        Ok(s.to_owned())
    } else {
        Err("must be 1 to 256 letters, digits and ._:/-".into())
    }
}

/// The uids tasks get, one each, when the agent runs as root and is told nothing else: far
/// above accounts and the subordinate-id ranges `useradd` hands out (from 100000, 65536
/// per user), below 2^31 (tools that read uids as signed).
const DEFAULT_TASK_UIDS: (u32, u32) = (1_000_000_000, 1_000_065_535);

/// `FROM-TO`, both ports, FROM at most TO.
fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?}: expected FROM-TO, e.g. 32768-60999"))?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{p:?} is not a port (1-65535)"))
    };
    let (a, b) = (port(a)?, port(b)?);
    if a > b {
        return Err(format!("{s:?}: FROM is above TO"));
    }
    Ok((a, b))
}

/// `START-END`, both uids above 0, START at most END.
fn parse_uid_range(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?}: expected START-END, e.g. 200000-265535"))?;
    let uid = |u: &str| {
        u.trim()
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{u:?} is not a uid above 0"))
    };
    let (a, b) = (uid(a)?, uid(b)?);
    if a > b {
        return Err(format!("{s:?}: START is above END"));
    }
    Ok((a, b))
}

/// A relative cgroup path of plain names.
fn parse_cgroup_parent(s: &str) -> Result<String, String> {
    tessera_agent::runtime::cgroup::relative_cgroup(s)?;
    Ok(s.to_owned())
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Action {
    Check,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RuntimeArg {
    Auto,
    Docker,
    Process,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The Docker client logs whole answers at debug level, and an inspected container's
    // environment holds its task's secrets: it never logs below info, whatever RUST_LOG says.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive("bollard=info".parse().expect("a valid directive"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
    let cli = Cli::parse();
    let name = cli.name.clone().unwrap_or_else(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "host".into())
    });
    if cli.probe {
        let inventory = match &cli.simulate {
            Some(spec) => SimulatedProbe::parse(spec, &name)?.inventory()?,
            None => NvmlProbe::new()?.inventory()?,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&inventory).context("encoding the inventory")?
        );
        return Ok(());
    }
    let mut labels = BTreeMap::new();
    for l in &cli.labels {
        let (k, v) = l
            .split_once('=')
            .with_context(|| format!("--label {l:?}: expected KEY=VALUE"))?;
        labels.insert(k.to_owned(), v.to_owned());
    }
    // As root, each task gets a uid of its own unless the operator chose one shared uid.
    let task_uids = match (cli.task_uids, &cli.run_as) {
        (Some(range), _) => Some(range),
        (None, None) if nix::unistd::geteuid().is_root() => Some(DEFAULT_TASK_UIDS),
        (None, _) => None,
    };
    let config = AgentConfig {
        server: cli.server.clone().expect("required by clap"),
        ca_cert: cli.ca_cert.clone(),
        insecure_http: cli.insecure_http,
        join_token: join_token(&cli)?,
        state_dir: cli.state_dir.clone(),
        pool: PoolName::new(cli.pool.clone()).with_context(|| format!("--pool {:?}", cli.pool))?,
        name,
        labels,
        resources: cli
            .cpu_milli
            .zip(cli.memory_mib)
            .map(|(c, m)| (tessera_model::MilliCpu(c), tessera_model::MiB(m))),
        simulate: cli.simulate.clone(),
        mps_control: cli.mps_control.clone(),
        max_mps_restarts: 3,
        no_mps: cli.no_mps,
        log_cap: cli.log_cap,
        stop_tasks_on_exit: false,
        log_retention: std::time::Duration::from_secs(cli.log_retention_hours * 3600),
        // Each task's own uid (--task-uids) takes precedence: --run-as is not used then.
        run_as: match task_uids {
            Some(_) => None,
            None => task_user(cli.run_as.as_deref())?,
        },
        advertise_address: Some(
            cli.advertise_address
                .clone()
                .unwrap_or_else(tessera_agent::agent::primary_address),
        ),
        port_range: cli.port_range,
        provider_id: cli.provider_id.clone(),
        containers: {
            let socket = cli
                .docker_socket
                .clone()
                .unwrap_or_else(tessera_agent::runtime::default_socket);
            match cli.runtime {
                RuntimeArg::Auto => ContainerRuntime::Auto(socket),
                RuntimeArg::Docker => ContainerRuntime::Docker(socket),
                RuntimeArg::Process => ContainerRuntime::Process,
            }
        },
    };
    if let Some(Action::Check) = cli.action {
        let findings = tessera_agent::check::check(
            &config,
            &tessera_agent::check::CheckOptions {
                task_uids,
                cgroup_parent: cli.cgroup_parent.clone(),
                passwd: "/etc/passwd".into(),
            },
        )
        .await;
        let (text, can_run) = tessera_agent::check::report(&findings);
        print!("{text}");
        std::process::exit(if can_run { 0 } else { 1 });
    }
    tracing::info!(
        version = tessera_model::version::long(),
        "tessera-agent starting"
    );
    let agent = Agent::new(config)?.isolate(Isolation {
        task_uids,
        cgroup_parent: Some(cli.cgroup_parent.clone()),
        pids_max: cli.task_pids_max,
    })?;
    agent
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The user and group tasks run as: the one named, else `nobody` when the agent is root
/// (tasks must not be able to read the agent's credentials), else the agent's own.
fn task_user(name: Option<&str>) -> anyhow::Result<Option<(u32, u32)>> {
    let root = nix::unistd::geteuid().is_root();
    let name = match name {
        Some(n) => n,
        None if root => "nobody",
        None => return Ok(None),
    };
    let user = nix::unistd::User::from_name(name)
        .with_context(|| format!("looking up --run-as {name}"))?
        .with_context(|| format!("--run-as {name}: no such user"))?;
    if user.uid.is_root() {
        tracing::warn!("tasks run as root (--run-as root): they can read this agent's credentials");
        return Ok(None);
    }
    anyhow::ensure!(
        root || user.uid == nix::unistd::geteuid(),
        "--run-as {name}: the agent must run as root to start tasks as another user"
    );
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

/// The join token, from its file or the environment: never the command line.
fn join_token(cli: &Cli) -> anyhow::Result<Option<String>> {
    if cli.join_token.is_some() {
        anyhow::bail!(
            "--join-token puts the token on the command line, which every process on this host can read (/proc/PID/cmdline): put it in a file readable by root only and pass --join-token-file FILE, or set TESSERA_AGENT_JOIN_TOKEN"
        );
    }
    if let Some(path) = &cli.join_token_file {
        let token = std::fs::read_to_string(path)
            .with_context(|| format!("reading the join token from {}", path.display()))?;
        let token = token.trim();
        anyhow::ensure!(
            !token.is_empty(),
            "--join-token-file {}: the file is empty",
            path.display()
        );
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                file = %path.display(),
                "the join token file is readable by other users: chmod 600 it"
            );
        }
        return Ok(Some(token.to_owned()));
    }
    Ok(std::env::var("TESSERA_AGENT_JOIN_TOKEN")
        .ok()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty()))
}
