//! The MPS control daemons' supervisors: one daemon per GPU ([`MpsDaemons`]), as the NVIDIA
//! device plugin runs one per shared resource. Each is started (`nvidia-cuda-mps-control
//! -d`) with its GPU alone visible and pipe and log directories of its own, so a task given
//! one GPU's pipe directory reaches that GPU whatever its environment says (its own
//! `CUDA_VISIBLE_DEVICES` included: the daemon's server sees one device). Each is checked
//! to answer a control command within a timeout, restarted within limits, and sent `quit`
//! on shutdown.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

/// How the supervisor runs the daemon.
#[derive(Debug, Clone)]
pub struct MpsConfig {
    /// `nvidia-cuda-mps-control`, or a stand-in in tests.
    pub control: PathBuf,
    /// `CUDA_MPS_PIPE_DIRECTORY`: where the daemon and its clients meet.
    pub pipe_dir: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub log_dir: PathBuf,
    /// A health command that takes longer than this fails.
    pub check_timeout: Duration,
    /// At most this many restarts within `restart_window`; then the daemon stays down and
    /// the host is reported impaired until the agent restarts.
    pub max_restarts: u32,
    pub restart_window: Duration,
    /// The one GPU (its UUID) the daemon and its clients see; `None`: the agent's own
    /// `CUDA_VISIBLE_DEVICES`, if any.
    pub gpu: Option<String>,
}

impl MpsConfig {
    pub fn new(control: PathBuf, state_dir: &std::path::Path) -> MpsConfig {
        MpsConfig {
            control,
            pipe_dir: state_dir.join("mps-pipe"),
            log_dir: state_dir.join("mps-log"),
            check_timeout: Duration::from_secs(5),
            max_restarts: 3,
            restart_window: Duration::from_secs(600),
            gpu: None,
        }
    }

    /// GPU `uuid`'s daemon under `root` (see [`gpu_dir`]), like `self` otherwise; `None`
    /// for a UUID that cannot name a directory.
    pub fn for_gpu(&self, root: &Path, uuid: &str) -> Option<MpsConfig> {
        let dir = gpu_dir(root, uuid)?;
        Some(MpsConfig {
            pipe_dir: dir.join("pipe"),
            log_dir: dir.join("log"),
            gpu: Some(uuid.to_owned()),
            ..self.clone()
        })
    }
}

/// Where GPU `uuid`'s daemon keeps its directories under `root`: `root/<uuid>`, for UUIDs
/// as NVML writes them (`GPU-…`, `MIG-…`: letters, digits, `-`); `None` for anything else.
pub fn gpu_dir(root: &Path, uuid: &str) -> Option<PathBuf> {
    let safe = !uuid.is_empty()
        && uuid.len() <= 128
        && uuid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        && !uuid.starts_with('-');
    safe.then(|| root.join(uuid))
}

/// The pipe directory of GPU `uuid`'s daemon under `root`.
pub fn pipe_dir(root: &Path, uuid: &str) -> Option<PathBuf> {
    gpu_dir(root, uuid).map(|d| d.join("pipe"))
}

/// The daemon's health as the agent reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MpsHealth {
    Healthy,
    Unhealthy(String),
}

impl MpsHealth {
    pub fn reason(&self) -> Option<&str> {
        match self {
            MpsHealth::Healthy => None,
            MpsHealth::Unhealthy(r) => Some(r),
        }
    }
}

/// What to do after a health check; the supervisor's state machine, kept pure for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The daemon answered.
    Healthy,
    /// It did not: restart it (the budget allows).
    Restart(String),
    /// It did not and the restart budget is spent: report unhealthy, do not restart.
    GiveUp(String),
}

/// Restarts allowed within a sliding window.
#[derive(Debug, Clone)]
pub struct RestartBudget {
    max: u32,
    window: Duration,
    history: VecDeque<Instant>,
}

impl RestartBudget {
    pub fn new(max: u32, window: Duration) -> Self {
        RestartBudget {
            max,
            window,
            history: VecDeque::new(),
        }
    }

    /// Whether a restart at `now` would be within the budget.
    pub fn would_allow(&self, now: Instant) -> bool {
        let recent = self
            .history
            .iter()
            .filter(|t| now.duration_since(**t) <= self.window)
            .count();
        (recent as u32) < self.max
    }

    /// Decides after a check at `now`; a restart is charged to the budget.
    pub fn decide(&mut self, check: Result<(), String>, now: Instant) -> Decision {
        let reason = match check {
            Ok(()) => return Decision::Healthy,
            Err(reason) => reason,
        };
        while self
            .history
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            self.history.pop_front();
        }
        if (self.history.len() as u32) < self.max {
            self.history.push_back(now);
            Decision::Restart(reason)
        } else {
            Decision::GiveUp(format!(
                "{reason}; restarted {} times in {} s, not restarting again",
                self.history.len(),
                self.window.as_secs()
            ))
        }
    }
}

/// The supervisor of one host's MPS control daemon.
pub struct MpsSupervisor {
    config: MpsConfig,
    budget: RestartBudget,
    health: MpsHealth,
    /// Restarts since the agent started (reported with every sync).
    restarts: u32,
    /// The budget was spent at the last check: not checked again (a hung daemon costs a
    /// timeout each time) until a restart would be allowed.
    gave_up: bool,
}

impl MpsSupervisor {
    pub fn new(config: MpsConfig) -> Self {
        let budget = RestartBudget::new(config.max_restarts, config.restart_window);
        MpsSupervisor {
            config,
            budget,
            health: MpsHealth::Unhealthy("not started yet".into()),
            restarts: 0,
            gave_up: false,
        }
    }

    pub fn pipe_dir(&self) -> &std::path::Path {
        &self.config.pipe_dir
    }

    pub fn health(&self) -> &MpsHealth {
        &self.health
    }

    /// The control program with a minimal environment: the daemon outlives this call and
    /// must not inherit the agent's (which may hold its join token).
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.config.control);
        cmd.env_clear();
        for key in ["PATH", "LANG", "CUDA_VISIBLE_DEVICES"] {
            if let Some(v) = std::env::var_os(key) {
                cmd.env(key, v);
            }
        }
        if let Some(gpu) = &self.config.gpu {
            cmd.env("CUDA_VISIBLE_DEVICES", gpu);
        }
        cmd.env("CUDA_MPS_PIPE_DIRECTORY", &self.config.pipe_dir)
            .env("CUDA_MPS_LOG_DIRECTORY", &self.config.log_dir)
            .kill_on_drop(true);
        cmd
    }

    /// Starts the daemon (`-d` forks it and returns), unless one already answers.
    pub async fn start(&mut self) -> MpsHealth {
        if self.check().await.is_ok() {
            self.health = MpsHealth::Healthy;
            return self.health.clone();
        }
        self.health = match self.spawn_daemon().await {
            Ok(()) => match self.check().await {
                Ok(()) => MpsHealth::Healthy,
                Err(e) => MpsHealth::Unhealthy(format!("started but does not answer: {e}")),
            },
            Err(e) => MpsHealth::Unhealthy(e),
        };
        self.health.clone()
    }

    async fn spawn_daemon(&self) -> Result<(), String> {
        // A new pipe directory is closed (0700) until the agent gives it to the user its
        // GPU's tasks run as: no task reaches a GPU's MPS server before that.
        if !self.config.pipe_dir.is_dir() {
            use std::os::unix::fs::PermissionsExt;
            let dir = &self.config.pipe_dir;
            tokio::fs::create_dir_all(dir)
                .await
                .and_then(|()| {
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                })
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        tokio::fs::create_dir_all(&self.config.log_dir)
            .await
            .map_err(|e| format!("cannot create {}: {e}", self.config.log_dir.display()))?;
        let status = tokio::time::timeout(
            self.config.check_timeout,
            self.command()
                .arg("-d")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .output(),
        )
        .await
        .map_err(|_| {
            format!(
                "{} -d did not return within {:?}",
                self.config.control.display(),
                self.config.check_timeout
            )
        })?
        .map_err(|e| format!("cannot run {}: {e}", self.config.control.display()))?;
        if status.status.success() {
            tracing::info!(pipe_dir = %self.config.pipe_dir.display(), "MPS control daemon started");
            Ok(())
        } else {
            Err(format!(
                "{} -d failed ({}): {}",
                self.config.control.display(),
                status.status,
                String::from_utf8_lossy(&status.stderr).trim()
            ))
        }
    }

    /// Sends `command` to the daemon; its answer, or why there is none.
    async fn send(&self, command: &str) -> Result<String, String> {
        let mut child = self
            .command()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.config.control.display()))?;
        let mut stdin = child.stdin.take().expect("piped");
        let talk = async {
            stdin
                .write_all(format!("{command}\n").as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            drop(stdin);
            let mut out = String::new();
            let mut err = String::new();
            let mut stdout = child.stdout.take().expect("piped");
            let mut stderr = child.stderr.take().expect("piped");
            let _ = stdout.read_to_string(&mut out).await;
            let _ = stderr.read_to_string(&mut err).await;
            let status = child.wait().await.map_err(|e| e.to_string())?;
            if status.success() && !out.trim().is_empty() {
                Ok(out.trim().to_owned())
            } else {
                Err(format!("{} ({status})", err.trim()).trim().to_owned())
            }
        };
        match tokio::time::timeout(self.config.check_timeout, talk).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {:?}", self.config.check_timeout)),
        }
    }

    /// Whether the daemon answers `get_default_active_thread_percentage`.
    async fn check(&self) -> Result<(), String> {
        let answer = self.send("get_default_active_thread_percentage").await?;
        answer
            .parse::<f64>()
            .map(|_| ())
            .map_err(|_| format!("unexpected answer {answer:?}"))
    }

    /// Checks health, restarting within the budget; returns the health to report.
    pub async fn supervise(&mut self) -> MpsHealth {
        if self.gave_up && !self.budget.would_allow(Instant::now()) {
            return self.health.clone();
        }
        let check = self.check().await;
        let decision = self.budget.decide(check, Instant::now());
        self.gave_up = matches!(decision, Decision::GiveUp(_));
        self.health = match decision {
            Decision::Healthy => MpsHealth::Healthy,
            Decision::Restart(reason) => {
                tracing::warn!(%reason, "MPS control daemon unhealthy; restarting it");
                self.restarts = self.restarts.saturating_add(1);
                match self.spawn_daemon().await {
                    Ok(()) => match self.check().await {
                        Ok(()) => MpsHealth::Healthy,
                        Err(e) => MpsHealth::Unhealthy(format!(
                            "{reason}; restarted but it does not answer: {e}"
                        )),
                    },
                    Err(e) => MpsHealth::Unhealthy(format!("{reason}; restart failed: {e}")),
                }
            }
            Decision::GiveUp(reason) => MpsHealth::Unhealthy(reason),
        };
        self.health.clone()
    }

    /// How many times the daemon was restarted since the agent started.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Asks the daemon to quit (it waits for its clients to exit).
    pub async fn shutdown(&mut self) {
        match self.send("quit").await {
            Ok(_) | Err(_) => tracing::info!("MPS control daemon asked to quit"),
        }
    }
}

/// One MPS control daemon per GPU, under one root directory (`<state>/mps/<uuid>/pipe`
/// and `…/log`). The host's MPS health is theirs together: healthy when every GPU's
/// daemon answers, otherwise the reasons of those that do not, each naming its GPU.
pub struct MpsDaemons {
    root: PathBuf,
    /// What every GPU's daemon is started with, but its directories and GPU.
    template: MpsConfig,
    daemons: BTreeMap<String, MpsSupervisor>,
    /// Restarts of daemons of GPUs no longer present.
    restarts_before: u32,
}

impl MpsDaemons {
    /// Daemons run by `template.control` under `state_dir/mps`.
    pub fn new(template: MpsConfig, state_dir: &Path) -> MpsDaemons {
        MpsDaemons {
            root: state_dir.join("mps"),
            template,
            daemons: BTreeMap::new(),
            restarts_before: 0,
        }
    }

    /// The directory under which each GPU's pipe directory is ([`pipe_dir`]).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Brings the daemons to `gpus` (UUIDs): one for each new GPU (started), none for a GPU
    /// gone (asked to quit).
    async fn follow(&mut self, gpus: &[String]) {
        let gone: Vec<String> = self
            .daemons
            .keys()
            .filter(|k| !gpus.contains(k))
            .cloned()
            .collect();
        for uuid in gone {
            if let Some(mut d) = self.daemons.remove(&uuid) {
                self.restarts_before = self.restarts_before.saturating_add(d.restarts());
                d.shutdown().await;
                tracing::info!(gpu = %uuid, "GPU gone: its MPS control daemon was asked to quit");
            }
        }
        for uuid in gpus {
            if self.daemons.contains_key(uuid) {
                continue;
            }
            let Some(config) = self.template.for_gpu(&self.root, uuid) else {
                tracing::warn!(gpu = %uuid, "a GPU UUID that cannot name a directory: no MPS daemon for it");
                continue;
            };
            let mut d = MpsSupervisor::new(config);
            match d.start().await {
                MpsHealth::Healthy => {
                    tracing::info!(gpu = %uuid, pipe_dir = %d.pipe_dir().display(), "MPS control daemon is up for this GPU alone")
                }
                MpsHealth::Unhealthy(r) => {
                    tracing::warn!(gpu = %uuid, reason = %r, "MPS control daemon is not healthy")
                }
            }
            self.daemons.insert(uuid.clone(), d);
        }
    }

    /// Starts a daemon for each of `gpus`; their health together. A daemon an older agent
    /// ran for every GPU at once (`<state>/mps-pipe`) is asked to quit first: it must not
    /// serve beside the GPUs' own.
    pub async fn start(&mut self, gpus: &[String]) -> MpsHealth {
        if self.template.pipe_dir.is_dir() {
            let mut legacy = MpsSupervisor::new(self.template.clone());
            legacy.shutdown().await;
            tracing::info!(pipe_dir = %self.template.pipe_dir.display(), "the single MPS daemon of an older agent was asked to quit");
            let _ = std::fs::remove_dir_all(&self.template.pipe_dir);
        }
        self.follow(gpus).await;
        self.health()
    }

    /// Checks every GPU's daemon (restarting within each one's budget), after bringing
    /// them to `gpus`; their health together.
    pub async fn supervise(&mut self, gpus: &[String]) -> MpsHealth {
        self.follow(gpus).await;
        // All at once: one hung daemon costs one timeout, not one per GPU.
        futures_util::future::join_all(self.daemons.values_mut().map(|d| d.supervise())).await;
        self.health()
    }

    /// Healthy when every daemon is (and there is at least one GPU to serve, or none at
    /// all); otherwise each unhealthy GPU with its reason.
    pub fn health(&self) -> MpsHealth {
        let sick: Vec<String> = self
            .daemons
            .iter()
            .filter_map(|(uuid, d)| d.health().reason().map(|r| format!("GPU {uuid}: {r}")))
            .collect();
        if sick.is_empty() {
            MpsHealth::Healthy
        } else {
            MpsHealth::Unhealthy(sick.join("; "))
        }
    }

    /// Restarts of every daemon since the agent started.
    pub fn restarts(&self) -> u32 {
        self.daemons
            .values()
            .fold(self.restarts_before, |n, d| n.saturating_add(d.restarts()))
    }

    /// Asks every daemon to quit.
    pub async fn shutdown(&mut self) {
        for d in self.daemons.values_mut() {
            d.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_uuids_as_nvml_writes_them_name_a_directory() {
        let root = Path::new("/state/mps");
        assert_eq!(
            pipe_dir(root, "GPU-5b2a4c1e-0000-1111-2222-333344445555"),
            Some(PathBuf::from(
                "/state/mps/GPU-5b2a4c1e-0000-1111-2222-333344445555/pipe"
            ))
        );
        assert!(pipe_dir(root, "MIG-1234-abcd").is_some());
        for bad in ["", "../etc", "GPU-1/../../x", "-rf", "GPU 1", "GPU-1\0"] {
            assert_eq!(pipe_dir(root, bad), None, "{bad:?}");
        }
    }

    #[test]
    fn restarts_stay_within_the_budget_and_recover_after_the_window() {
        let mut budget = RestartBudget::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(budget.decide(Ok(()), t0), Decision::Healthy);
        assert_eq!(
            budget.decide(Err("dead".into()), t0),
            Decision::Restart("dead".into())
        );
        assert_eq!(
            budget.decide(Err("dead".into()), t0 + Duration::from_secs(1)),
            Decision::Restart("dead".into())
        );
        match budget.decide(Err("dead".into()), t0 + Duration::from_secs(2)) {
            Decision::GiveUp(reason) => {
                assert!(reason.contains("restarted 2 times in 60 s"), "{reason}")
            }
            other => panic!("expected to give up, got {other:?}"),
        }
        // Healthy checks never spend the budget.
        assert_eq!(
            budget.decide(Ok(()), t0 + Duration::from_secs(3)),
            Decision::Healthy
        );
        // Once the first restarts leave the window, restarting is allowed again.
        assert_eq!(
            budget.decide(Err("dead".into()), t0 + Duration::from_secs(62)),
            Decision::Restart("dead".into())
        );
    }

    #[test]
    fn a_zero_budget_never_restarts() {
        let mut budget = RestartBudget::new(0, Duration::from_secs(60));
        assert!(matches!(
            budget.decide(Err("x".into()), Instant::now()),
            Decision::GiveUp(_)
        ));
    }
}
