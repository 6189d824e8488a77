//! The sync client: registers once with the join token (keeping the host id and agent
//! token on disk, owner-only), then syncs on the server's interval: it reports GPUs, MPS
//! health and its tasks with their measured use, and converges on the answer. When the
//! server is unreachable it backs off with jitter and keeps its tasks running.

pub(crate) mod client;
mod config;
mod streams;
mod sync;

pub use config::{AgentConfig, ContainerRuntime, Isolation, primary_address};

use crate::mps::{MpsConfig, MpsDaemons};
use crate::probe::{GpuProbe, NvmlProbe, ProbeError, SimulatedProbe};
use crate::runtime::{Runtime, RuntimeError};
use client::{http_client, server_urls};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tessera_model::agent::{Capability, HostCapabilities};
use tessera_model::{MiB, MilliCpu};

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(
        "this agent is not registered and has no join token: give one in a file (--join-token-file) or TESSERA_AGENT_JOIN_TOKEN"
    )]
    NoJoinToken,
    /// The server URL or its TLS settings cannot be used.
    #[error("--server {server}: {why}")]
    Server { server: String, why: String },
    #[error("--runtime docker: {0}")]
    Docker(String),
    #[error("cannot keep credentials in {path}: {source}")]
    Credentials {
        path: String,
        source: std::io::Error,
    },
}

/// What registration gave this agent; kept in `<state-dir>/credentials.json`, mode 0600.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Credentials {
    server: String,
    host_id: String,
    agent_token: String,
}

/// The saved credentials, whatever `--server` says now: a new address for the same control
/// plane (or a list of its servers) keeps them, and a server that does not know the token
/// says so with a 401.
fn load_credentials(path: &std::path::Path) -> Option<Credentials> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Written atomically and owner-only: a crash leaves the old credentials or the new ones.
fn save_credentials(path: &std::path::Path, c: &Credentials) -> Result<(), AgentError> {
    let err = |source| AgentError::Credentials {
        path: path.display().to_string(),
        source,
    };
    let bytes = serde_json::to_vec_pretty(c).map_err(|e| err(std::io::Error::other(e)))?;
    crate::runtime::write_private(path, &bytes).map_err(err)
}

/// Cheap jitter: ±20 % of `d`, from the clock and the pid.
fn jitter(d: Duration) -> Duration {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.subsec_nanos())
        ^ std::process::id();
    let factor = 0.8 + f64::from(seed % 1000) / 1000.0 * 0.4;
    d.mul_f64(factor)
}

/// The wait before the next try after a failure: doubling, but never longer than two sync
/// intervals. A restarted server declares a host lost only after three intervals of
/// silence from its own start, so an agent that waited longer could lose its tasks to a
/// server that was merely down for a while.
fn next_backoff(current: Duration, sync_interval: Duration) -> Duration {
    (current * 2)
        .min(sync_interval * 2)
        .max(Duration::from_secs(1))
}

/// A request that failed: whether the server refused our credentials.
enum SyncFailure {
    Unauthorized,
    Other(String),
}

/// A task's use since the last sync that reached the server.
#[derive(Debug, Clone, Copy, Default)]
struct UsageWindow {
    peak: MiB,
    memory_errors: u32,
}

/// The agent.
pub struct Agent {
    config: AgentConfig,
    http: reqwest::Client,
    /// The servers of the control plane, and the one in use.
    servers: Vec<reqwest::Url>,
    current: usize,
    probe: Box<dyn GpuProbe>,
    /// One MPS control daemon per GPU (none on simulated hosts without a stand-in).
    mps: Option<MpsDaemons>,
    runtime: Runtime,
    /// What each task used since the last sync that reached the server.
    windows: HashMap<String, UsageWindow>,
    /// Each task's last scrape of its work, to compute the next interval's.
    work: HashMap<String, crate::runtime::work::WorkTracker>,
    scraper: reqwest::Client,
    /// What the report's bounds dropped at the last sync, logged when it changes.
    dropped: Vec<String>,
    /// Whether images can run here, or why not (set when the engine is tried).
    containers: Capability,
    /// What this agent can enforce, as found at start; sent with every sync.
    capabilities: Option<HostCapabilities>,
    /// The server's version as its last answer said, logged when it changes.
    server_version: Option<String>,
}

impl Agent {
    /// Sets up the probe (failing clearly without NVML and without `--simulate`), the MPS
    /// supervisor and the runtime (re-adopting tasks left running).
    pub fn new(config: AgentConfig) -> Result<Agent, AgentError> {
        // Owner-only: it holds the agent's token and what its tasks run.
        std::fs::create_dir_all(&config.state_dir)
            .and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&config.state_dir, std::fs::Permissions::from_mode(0o700))
            })
            .map_err(|source| AgentError::Credentials {
                path: config.state_dir.display().to_string(),
                source,
            })?;
        let probe: Box<dyn GpuProbe> = match &config.simulate {
            // Drills make a simulated GPU disappear by listing it in this file.
            Some(spec) => Box::new(
                SimulatedProbe::parse(spec, &config.name)?
                    .with_removal_file(config.state_dir.join("simulated-gpus-removed")),
            ),
            None => Box::new(NvmlProbe::new()?),
        };
        let control = match (&config.mps_control, probe.simulated()) {
            _ if config.no_mps => {
                tracing::warn!(
                    "no MPS (--no-mps): the GPUs are time-shared and no task's GPU memory or compute limit is held by MPS"
                );
                None
            }
            (Some(path), _) => Some(path.clone()),
            (None, false) => Some(PathBuf::from("nvidia-cuda-mps-control")),
            (None, true) => None,
        };
        let mps = control.map(|path| {
            let mut c = MpsConfig::new(path, &config.state_dir);
            c.max_restarts = config.max_mps_restarts;
            MpsDaemons::new(c, &config.state_dir)
        });
        let mut runtime = Runtime::open(
            &config.state_dir,
            config.log_cap,
            mps.as_ref().map(|m| m.root().to_path_buf()),
        )?;
        runtime = runtime.port_range(config.port_range.0, config.port_range.1);
        if probe.simulated() {
            runtime = runtime
                .simulated_gpus(config.state_dir.join("simulated-gpu-load"))
                .map_err(|source| RuntimeError::StateDir {
                    path: config
                        .state_dir
                        .join("simulated-gpu-load")
                        .display()
                        .to_string(),
                    source,
                })?;
        }
        if let Some((uid, gid)) = config.run_as {
            runtime = runtime.run_as(uid, gid);
            // Tasks of another user reach the MPS pipe directory through the state
            // directory: traversable (0711), never listable; its files stay owner-only.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&config.state_dir, std::fs::Permissions::from_mode(0o711))
                .map_err(|source| AgentError::Credentials {
                    path: config.state_dir.display().to_string(),
                    source,
                })?;
        }
        let servers = server_urls(&config)?;
        Ok(Agent {
            http: http_client(&config, &servers)?,
            servers,
            current: 0,
            config,
            probe,
            mps,
            runtime,
            windows: HashMap::new(),
            work: HashMap::new(),
            scraper: crate::runtime::work::client(),
            dropped: Vec::new(),
            containers: Capability::missing(
                "process tasks only (--runtime process): containers with an image are refused",
            ),
            capabilities: None,
            server_version: None,
        })
    }

    /// Keeps tasks apart as `isolation` says: a uid of their own, a cgroup of their own
    /// (leftover cgroups of tasks this agent no longer has are killed and removed), a pid
    /// limit. Says in the log what is not enforced.
    pub fn isolate(mut self, isolation: Isolation) -> Result<Agent, AgentError> {
        let mut runtime = self.runtime.pids_max(isolation.pids_max);
        match (isolation.task_uids, self.config.run_as) {
            (Some((first, last)), _) => {
                runtime = runtime.task_uids(first, last)?;
                tracing::info!(first, last, "each task runs as a uid of its own");
            }
            (None, Some((uid, _))) => tracing::warn!(
                uid,
                "tasks share one uid: they can read each other's environment (secrets), signal each other's processes and open each other's files; pass --task-uids"
            ),
            (None, None) if nix::unistd::geteuid().is_root() => tracing::warn!(
                "tasks run as the agent's own uid (root): they share it, can read each other's environment (secrets) and this agent's credentials; pass --task-uids"
            ),
            (None, None) => tracing::info!(
                "tasks run as the agent's own uid: they share it and can read each other's environment (secrets); run the agent as root with --task-uids"
            ),
        }
        if let Some(parent) = &isolation.cgroup_parent {
            runtime = runtime.cgroups(crate::runtime::Cgroups::detect(parent));
        } else {
            tracing::warn!(
                "no cgroups (--cgroup-parent unset): tasks run without CPU/memory/pid limits and a task's escaped processes cannot be killed"
            );
        }
        self.runtime = runtime;
        Ok(self)
    }

    /// What this agent can enforce here, each missing one said in the log.
    fn find_capabilities(&self) -> HostCapabilities {
        let gpu_discovery = if self.probe.simulated() {
            Capability::held("simulated GPUs (--simulate): nothing measured is real")
        } else {
            Capability::held("NVML")
        };
        let mps = match &self.mps {
            Some(m) => Capability::held(format!(
                "a control daemon per GPU under {}: each task's GPU memory and compute limits held per process, its budget summed over its processes by measurement",
                m.root().display()
            )),
            None if self.config.no_mps => Capability::missing(
                "off (--no-mps): GPUs are time-shared; no GPU memory or compute limit is held per process, budgets only by measurement",
            ),
            None => Capability::missing(
                "simulated GPUs: no MPS control daemon runs (--mps-control not given), limits are only simulated",
            ),
        };
        let [gpu_devices, limits, task_users] = self.runtime.enforcement();
        let found = HostCapabilities {
            gpu_discovery,
            mps,
            gpu_devices,
            limits,
            task_users,
            containers: self.containers.clone(),
        };
        for (name, c) in found.named() {
            match (c.held, self.probe.simulated()) {
                // Simulated hosts (the demo, drills) hold nothing real: not a warning.
                (held, true) => {
                    tracing::debug!(capability = name, held, detail = %c.detail, "on this simulated host")
                }
                (true, false) => {
                    tracing::info!(capability = name, detail = %c.detail, "enforced on this host")
                }
                (false, false) => {
                    tracing::warn!(capability = name, detail = %c.detail, "not enforced on this host")
                }
            }
        }
        found
    }

    /// Runs until `shutdown` resolves.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), AgentError> {
        tokio::pin!(shutdown);
        match self.config.containers.clone() {
            ContainerRuntime::Process => {}
            ContainerRuntime::Docker(socket) => {
                let engine = crate::runtime::Engine::connect(&socket)
                    .await
                    .map_err(AgentError::Docker)?;
                self.runtime
                    .attach_engine(engine)
                    .await
                    .map_err(AgentError::Docker)?;
                tracing::info!(socket = %socket.display(), "images run through Docker");
                self.containers = Capability::held(format!(
                    "Docker at {}: each container gets only its GPUs",
                    socket.display()
                ));
            }
            ContainerRuntime::Auto(socket) => {
                match crate::runtime::Engine::connect(&socket).await {
                    Ok(engine) => match self.runtime.attach_engine(engine).await {
                        Ok(()) => {
                            tracing::info!(socket = %socket.display(), "images run through Docker");
                            self.containers = Capability::held(format!(
                                "Docker at {}: each container gets only its GPUs",
                                socket.display()
                            ));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "Docker answers but cannot list containers; images are refused");
                            self.containers = Capability::missing(format!(
                                "Docker answers but cannot list containers ({e}): images are refused"
                            ));
                        }
                    },
                    Err(e) => {
                        tracing::info!(reason = %e, "no Docker engine; containers with an image are refused");
                        self.containers = Capability::missing(format!(
                            "no Docker engine ({e}): containers with an image are refused"
                        ));
                    }
                }
            }
        }
        let inventory = self.probe.inventory().ok();
        if let Some(i) = &inventory {
            // Before any task starts: each is kept from the other GPUs' device nodes.
            self.runtime.set_gpu_minors(i.minors());
        }
        if let Some(m) = &mut self.mps {
            let gpus = inventory.map(|i| i.uuids()).unwrap_or_default();
            if let crate::mps::MpsHealth::Unhealthy(r) = m.start(&gpus).await {
                tracing::warn!(reason = %r, "MPS is not healthy on every GPU");
            }
        }
        self.capabilities = Some(self.find_capabilities());
        let creds_path = self.config.state_dir.join("credentials.json");
        let mut creds = load_credentials(&creds_path);
        if creds.is_none() && self.config.join_token.is_none() {
            return Err(AgentError::NoJoinToken);
        }
        let mut pruned_at: Option<std::time::Instant> = None;
        let mut backoff = Duration::from_secs(1);
        // Failures in a row: while some server of the list is untried, the next is tried
        // at once; after a whole round, the agent backs off.
        let mut failures = 0usize;
        // The server's sync interval, from its last answer (its default until then).
        let mut interval = Duration::from_secs(5);
        // A health verdict that changes is told at once (endpoints follow it), not at the
        // next interval.
        let health_changed = self.runtime.health_changes();
        // Streams (logs, exec) go over connections of their own, to the server synced with.
        let (token_tx, token_rx) = tokio::sync::watch::channel(None);
        let (live_tx, live_rx) = tokio::sync::watch::channel(self.runtime.task_ids());
        let (exec_tx, mut exec_rx) = tokio::sync::mpsc::channel(16);
        // Aborted when the agent stops, however it stops (its streams end with it).
        let channel = streams::AbortOnDrop(tokio::spawn(
            streams::Channel {
                http: self.http.clone(),
                servers: self
                    .servers
                    .iter()
                    .map(|s| s.as_str().trim_end_matches('/').to_owned())
                    .collect(),
                token: token_rx,
                tasks_dir: self.runtime.tasks_dir().to_owned(),
                live: live_rx,
                execs: exec_tx,
                epoch: streams::epoch(),
            }
            .run(),
        ));
        'syncs: loop {
            let wait = match &creds {
                None => match self.register().await {
                    Ok(c) => {
                        save_credentials(&creds_path, &c)?;
                        // Its credentials are what it keeps: the join token is forgotten
                        // (a revoked host rejoins only with a token minted for it).
                        self.config.join_token = None;
                        creds = Some(c);
                        Duration::ZERO
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "registration failed; retrying");
                        // The saved credentials (if any) are tried again next: the server
                        // that refused them may be the wrong one.
                        creds = load_credentials(&creds_path);
                        failures += 1;
                        if !failures.is_multiple_of(self.servers.len()) {
                            Duration::ZERO
                        } else {
                            backoff = next_backoff(backoff, interval);
                            jitter(backoff)
                        }
                    }
                },
                Some(c) => {
                    let c = c.clone();
                    match self.sync(&c).await {
                        Ok(answer) => {
                            backoff = Duration::from_secs(1);
                            failures = 0;
                            token_tx.send_if_modified(|now| {
                                let changed = now.as_ref() != Some(&c.agent_token);
                                *now = Some(c.agent_token.clone());
                                changed
                            });
                            interval =
                                Duration::from_secs(u64::from(answer.sync_interval_secs.max(1)));
                            jitter(interval)
                        }
                        Err(SyncFailure::Unauthorized) => {
                            // The file stays until a registration replaces it: a server we
                            // cannot be sure of (a wrong address, a restored backup) must not
                            // cost this host its identity.
                            tracing::warn!(
                                "the server refused this agent's token; registering again with the join token"
                            );
                            creds = None;
                            token_tx.send_replace(None);
                            // At once: the host is silent to the server until it rejoins.
                            Duration::ZERO
                        }
                        Err(SyncFailure::Other(e)) => {
                            failures += 1;
                            if !failures.is_multiple_of(self.servers.len()) {
                                // Another server of the list has not been tried yet.
                                Duration::ZERO
                            } else {
                                backoff = next_backoff(backoff, interval);
                                tracing::warn!(error = %e, retry_in = ?backoff, "sync failed; tasks keep running");
                                jitter(backoff)
                            }
                        }
                    }
                }
            };
            if pruned_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(3600)) {
                pruned_at = Some(std::time::Instant::now());
                let removed = self.runtime.prune_logs(self.config.log_retention);
                if removed > 0 {
                    tracing::info!(removed, "removed log directories of old tasks");
                }
            }
            live_tx.send_if_modified(|live| {
                let now = self.runtime.task_ids();
                let changed = *live != now;
                *live = now;
                changed
            });
            let sleep = tokio::time::sleep(wait);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut shutdown => break 'syncs,
                    _ = &mut sleep => break,
                    _ = health_changed.notified(), if creds.is_some() && failures == 0 => break,
                    Some(ask) = exec_rx.recv() => {
                        let started = self.runtime.exec(&ask.task_id, &ask.request);
                        let _ = ask.reply.send(started);
                    }
                }
            }
        }
        drop(channel);
        if self.config.stop_tasks_on_exit {
            self.runtime.stop_all().await;
        }
        if let Some(m) = &mut self.mps {
            m.shutdown().await;
        }
        tracing::info!(
            tasks_left_running = self.runtime.running_count(),
            "agent stopped"
        );
        Ok(())
    }
}

/// This machine's CPU (milli) and memory (MiB).
pub fn host_resources() -> (MilliCpu, MiB) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let mem_kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    (MilliCpu(cpus * 1000), MiB(mem_kb / 1024))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use tessera_model::PoolName;

    #[test]
    fn credentials_are_owner_only_and_outlive_a_new_server_address() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("credentials.json");
        let c = Credentials {
            server: "http://a:3000".into(),
            host_id: "h1".into(),
            agent_token: "secret".into(),
        };
        save_credentials(&path, &c).expect("saved");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            load_credentials(&path).map(|c| c.host_id),
            Some("h1".into()),
            "kept whatever --server says now; the server judges the token"
        );
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        for _ in 0..50 {
            let d = jitter(Duration::from_secs(10));
            assert!(
                d >= Duration::from_secs(8) && d <= Duration::from_secs(12),
                "{d:?}"
            );
        }
    }

    #[test]
    fn without_nvml_and_without_simulate_the_agent_refuses_to_start() {
        if NvmlProbe::new().is_ok() {
            return; // a GPU machine: NVML works here
        }
        let dir = tempfile::tempdir().expect("dir");
        let err = Agent::new(bare_config("http://127.0.0.1:9", dir.path()))
            .err()
            .expect("no NVML here");
        assert!(err.to_string().contains("--simulate"), "{err}");
    }

    /// An unregistered agent's settings: real GPUs (NVML), no MPS override.
    fn bare_config(server: &str, dir: &std::path::Path) -> AgentConfig {
        AgentConfig {
            server: server.into(),
            ca_cert: None,
            insecure_http: false,
            join_token: None,
            state_dir: dir.into(),
            pool: PoolName::new("p").expect("valid"),
            name: "h".into(),
            labels: Default::default(),
            resources: None,
            simulate: None,
            mps_control: None,
            max_mps_restarts: 0,
            no_mps: false,
            log_cap: 1000,
            stop_tasks_on_exit: false,
            log_retention: Duration::from_secs(24 * 3600),
            run_as: None,
            containers: ContainerRuntime::Process,
            advertise_address: Some("127.0.0.1".into()),
            port_range: (32768, 60999),
            provider_id: None,
        }
    }

    fn client_for(server: &str, insecure_http: bool, ca_cert: Option<PathBuf>) -> String {
        let dir = tempfile::tempdir().expect("dir");
        let config = AgentConfig {
            ca_cert,
            insecure_http,
            ..bare_config(server, dir.path())
        };
        match server_urls(&config).and_then(|urls| http_client(&config, &urls)) {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn plain_http_only_on_loopback_unless_allowed() {
        assert_eq!(
            client_for("https://tessera.example:3000", false, None),
            "ok"
        );
        assert_eq!(client_for("http://127.0.0.1:3000", false, None), "ok");
        assert_eq!(client_for("http://localhost:3000", false, None), "ok");
        assert_eq!(client_for("http://[::1]:3000", false, None), "ok");
        let refused = client_for("http://10.0.0.5:3000", false, None);
        assert!(refused.contains("--insecure-http"), "{refused}");
        assert_eq!(client_for("http://10.0.0.5:3000", true, None), "ok");
        assert!(client_for("ftp://x", true, None).contains("scheme"));
        // Several servers: each is checked, and the one refused is named.
        assert_eq!(
            client_for("http://127.0.0.1:3000, http://localhost:3001", false, None),
            "ok"
        );
        let refused = client_for("https://a.example,http://10.0.0.5:3000", false, None);
        assert!(
            refused.contains("http://10.0.0.5:3000") && refused.contains("--insecure-http"),
            "{refused}"
        );
        assert!(client_for(" , ", false, None).contains("names no server"));
    }

    #[test]
    fn a_ca_cert_that_is_not_pem_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        let bad = dir.path().join("ca.pem");
        std::fs::write(&bad, "not a certificate").expect("write");
        let e = client_for("https://t.example", false, Some(bad));
        assert!(e.contains("ca.pem"), "{e}");
        let e = client_for(
            "https://t.example",
            false,
            Some(dir.path().join("missing.pem")),
        );
        assert!(e.contains("cannot read --ca-cert"), "{e}");
    }

    #[test]
    fn backoff_stays_below_the_lost_timeout() {
        let interval = Duration::from_secs(5);
        let mut b = Duration::from_secs(1);
        for _ in 0..20 {
            b = next_backoff(b, interval);
            // Lost after 3 intervals; with ±20 % jitter, 2 intervals stay below it.
            assert!(jitter(b) < interval * 3, "{b:?}");
        }
        assert_eq!(b, Duration::from_secs(10));
        assert_eq!(
            next_backoff(Duration::from_secs(1), interval),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn the_state_directory_is_owner_only() {
        let dir = tempfile::tempdir().expect("dir");
        let state = dir.path().join("state");
        std::fs::create_dir(&state).expect("dir");
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let config = AgentConfig {
            simulate: Some("1xL4-24GB".into()),
            ..bare_config("http://127.0.0.1:9", &state)
        };
        Agent::new(config).expect("agent");
        let mode = std::fs::metadata(&state)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700);
    }
}
