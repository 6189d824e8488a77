//! Containers that have an image run through the Docker Engine API (the host's socket):
//! pulled first, created with their task's GPU (a device request by UUID, for the NVIDIA
//! container runtime), limits and labels, started, their output copied to the task's
//! capped logs, waited for, and removed once they end. Each is created without privileges
//! unless its definition asks (and its pool allowed): `no-new-privileges`, every capability
//! dropped but those its definition adds, a pid limit, as its task's own uid unless it
//! names a user, and ECS's `readonlyRootFilesystem` and `privileged` as given.
//!
//! Each container carries labels that tie it to this agent and its task; its name is
//! derived from both, so a restarted agent re-adopts what runs under its labels instead
//! of starting it twice, and what it finds of tasks the server no longer wants is stopped
//! and removed like any other task.

use super::CappedLog;
use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, ContainerSummaryStateEnum, DeviceRequest, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, InspectContainerOptions, KillContainerOptions,
    ListContainersOptions, LogsOptions, RemoveContainerOptions, StopContainerOptions,
    WaitContainerOptions,
};
use futures_util::StreamExt;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// Which agent a container belongs to (the same mark its processes carry).
pub const LABEL_MARK: &str = "tessera.agent-mark";
/// The task a container belongs to.
pub const LABEL_TASK: &str = "tessera.task-id";
/// The container's name in its task definition.
pub const LABEL_CONTAINER: &str = "tessera.container";

/// The Docker engine this agent runs images with.
#[derive(Clone)]
pub struct Engine {
    docker: bollard::Docker,
    socket: PathBuf,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("socket", &self.socket)
            .finish()
    }
}

/// The socket `DOCKER_HOST` names (`unix://PATH`), else Docker's default.
pub fn default_socket() -> PathBuf {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"))
}

impl Engine {
    /// Connects to the engine on `socket` and checks that it answers.
    pub async fn connect(socket: &Path) -> Result<Engine, String> {
        let docker = bollard::Docker::connect_with_unix(
            &socket.display().to_string(),
            120,
            bollard::API_DEFAULT_VERSION,
        )
        .map_err(|e| format!("{}: {e}", socket.display()))?;
        match tokio::time::timeout(Duration::from_secs(5), docker.ping()).await {
            Ok(Ok(_)) => Ok(Engine {
                docker,
                socket: socket.to_path_buf(),
            }),
            Ok(Err(e)) => Err(format!("{} does not answer: {e}", socket.display())),
            Err(_) => Err(format!("{} does not answer within 5 s", socket.display())),
        }
    }

    /// This agent's containers, by task: `(task id, container name, Docker name)`. One
    /// that was created but never started (the agent stopped between the two) is removed
    /// instead: its task is started again like any other.
    pub async fn marked(&self, mark: &str) -> Result<Vec<(String, String, String)>, String> {
        let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_MARK}={mark}")])]);
        let list = self
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
            .map_err(|e| e.to_string())?;
        let list = list
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels?;
                // The engine filters; a container without our mark is never taken anyway.
                if labels.get(LABEL_MARK).map(String::as_str) != Some(mark) {
                    return None;
                }
                let name = c.names?.first()?.trim_start_matches('/').to_owned();
                let never_started = c.state == Some(ContainerSummaryStateEnum::CREATED);
                Some((
                    labels.get(LABEL_TASK)?.clone(),
                    labels.get(LABEL_CONTAINER)?.clone(),
                    name,
                    never_started,
                ))
            })
            .collect::<Vec<_>>();
        let mut kept = Vec::new();
        for (task, container, name, never_started) in list {
            if never_started {
                tracing::info!(task = %task, container = %name, "removing a container that was never started");
                self.remove(&name).await;
            } else {
                kept.push((task, container, name));
            }
        }
        Ok(kept)
    }

    /// A started container's phase now: running (with its main process) or ended.
    async fn phase_of(&self, docker_name: &str) -> Phase {
        let state = self
            .docker
            .inspect_container(docker_name, None::<InspectContainerOptions>)
            .await
            .ok()
            .and_then(|i| i.state);
        match state {
            Some(s) if s.running == Some(true) => {
                Phase::Running(s.pid.and_then(|p| u32::try_from(p).ok()).filter(|p| *p > 0))
            }
            Some(s) => Phase::Exited(s.exit_code.and_then(|c| i32::try_from(c).ok())),
            None => Phase::Exited(None),
        }
    }

    /// What Docker's own health check says of a container, with the last check's output;
    /// `None` when the engine does not answer.
    pub async fn health_of(
        &self,
        docker_name: &str,
    ) -> Option<(tessera_model::service::TaskHealth, Option<String>)> {
        use bollard::models::HealthStatusEnum;
        use tessera_model::service::TaskHealth;
        let health = self
            .docker
            .inspect_container(docker_name, None::<InspectContainerOptions>)
            .await
            .ok()?
            .state?
            .health?;
        let status = match health.status? {
            HealthStatusEnum::HEALTHY => TaskHealth::Healthy,
            HealthStatusEnum::UNHEALTHY => TaskHealth::Unhealthy,
            _ => TaskHealth::Unknown,
        };
        let output = health
            .log
            .and_then(|l| l.last().cloned())
            .filter(|r| r.exit_code != Some(0))
            .and_then(|r| r.output);
        Some((status, output))
    }

    /// Pulls `image`; the error is the registry's (or the engine's) reason.
    async fn pull(&self, image: &str) -> Result<(), String> {
        let (from_image, tag) = split_tag(image);
        let mut progress = self.docker.create_image(
            Some(CreateImageOptions {
                from_image: Some(from_image.to_owned()),
                tag: Some(tag.to_owned()),
                ..Default::default()
            }),
            None,
            None,
        );
        while let Some(item) = progress.next().await {
            item.map_err(|e| reason(&e))?;
        }
        Ok(())
    }

    async fn remove(&self, docker_name: &str) {
        let removed = self
            .docker
            .remove_container(
                docker_name,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await;
        match removed {
            Ok(()) => {}
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(e) => {
                tracing::warn!(container = %docker_name, error = %e, "cannot remove a container")
            }
        }
    }
}

/// `registry/name:tag` (or `name@digest`) into what the pull asks for; no tag is `latest`.
fn split_tag(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].rfind(':') {
        Some(i) => (&image[..slash + i], &image[slash + i + 1..]),
        None => (image, "latest"),
    }
}

/// The engine's message, without bollard's wrapping.
fn reason(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        bollard::errors::Error::DockerStreamError { error } => error.clone(),
        other => other.to_string(),
    }
}

/// What one container of a task runs. `Debug` leaves out the environment: it holds the
/// task's secrets.
#[derive(Clone)]
pub struct Launch {
    pub task_id: String,
    /// Its name in the task definition.
    pub name: String,
    pub image: String,
    /// Replaces the image's `ENTRYPOINT` when not empty.
    pub entry_point: Vec<String>,
    /// Replaces the image's `CMD` when not empty.
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// GPUs by UUID; none for a task without GPUs.
    pub gpus: Vec<String>,
    /// The MPS daemon's pipe directory, for an MPS task.
    pub mps_pipe_dir: Option<PathBuf>,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub memory_soft: bool,
    /// The agent's mark.
    pub mark: String,
    /// Published ports: (container port, host port, protocol).
    pub ports: Vec<(u16, u16, tessera_model::taskdef::Protocol)>,
    /// ECS `networkMode: host`.
    pub host_network: bool,
    /// A command health check, which Docker runs itself.
    pub health_check: Option<tessera_model::taskdef::HealthCheck>,
    /// The user it runs as (`uid`, `uid:gid`, `name`, `name:group`): the one its
    /// definition names, else its task's own uid (`--task-uids`); `None`: the image's.
    pub user: Option<String>,
    /// Privileges and capabilities from its definition (its pool allowed them).
    pub security: tessera_model::taskdef::ContainerSecurity,
    /// The most processes and threads it may have (`--task-pids-max`); `None`: no limit.
    pub pids_limit: Option<i64>,
}

impl std::fmt::Debug for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("task_id", &self.task_id)
            .field("name", &self.name)
            .field("image", &self.image)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("gpus", &self.gpus)
            .field("user", &self.user)
            .field("security", &self.security)
            .finish_non_exhaustive()
    }
}

/// The container's name on the engine: this agent's and the task's (one per task and
/// container, so a second create of the same container is refused by the engine).
pub fn docker_name(mark: &str, task_id: &str, container: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let mark: String = mark.chars().take(8).collect();
    format!(
        "tessera-{}-{}-{}",
        clean(&mark),
        clean(task_id),
        clean(container)
    )
}

impl Launch {
    /// The create request the engine gets.
    pub fn body(&self) -> ContainerCreateBody {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let labels = HashMap::from([
            (LABEL_MARK.to_owned(), self.mark.clone()),
            (LABEL_TASK.to_owned(), self.task_id.clone()),
            (LABEL_CONTAINER.to_owned(), self.name.clone()),
        ]);
        let mib = |m: u64| i64::try_from(m.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX);
        let mut host = HostConfig {
            // The reservation placement counted is the most it may use.
            nano_cpus: (self.cpu_milli > 0)
                .then(|| i64::try_from(self.cpu_milli * 1_000_000).unwrap_or(i64::MAX)),
            ..Default::default()
        };
        let security = &self.security;
        host.privileged = Some(security.privileged);
        host.readonly_rootfs = Some(security.readonly_root_filesystem);
        host.pids_limit = self.pids_limit;
        if !security.privileged {
            // Nothing it runs gains privileges (setuid binaries, file capabilities), and
            // it keeps only the capabilities its definition adds. A privileged container
            // gets every capability whatever is dropped: its pool allowed that.
            host.security_opt = Some(vec!["no-new-privileges".into()]);
            host.cap_drop = Some(vec!["ALL".into()]);
            host.cap_add = (!security.cap_add.is_empty()).then(|| security.cap_add.clone());
        }
        if self.memory_mib > 0 {
            if self.memory_soft {
                host.memory_reservation = Some(mib(self.memory_mib));
            } else {
                host.memory = Some(mib(self.memory_mib));
            }
        }
        if !self.gpus.is_empty() {
            host.device_requests = Some(vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(self.gpus.clone()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]);
        }
        if let Some(pipe) = &self.mps_pipe_dir {
            // MPS clients reach the daemon through its pipes and shared memory.
            let p = pipe.display().to_string();
            host.binds = Some(vec![format!("{p}:{p}")]);
            host.ipc_mode = Some("host".into());
        }
        if self.host_network {
            host.network_mode = Some("host".into());
        } else if !self.ports.is_empty() {
            host.port_bindings = Some(
                self.ports
                    .iter()
                    .map(|(container, hostp, proto)| {
                        (
                            format!("{container}/{}", proto.as_str()),
                            Some(vec![bollard::models::PortBinding {
                                host_ip: None,
                                host_port: Some(hostp.to_string()),
                            }]),
                        )
                    })
                    .collect(),
            );
        }
        let secs = |s: u32| i64::from(s) * 1_000_000_000;
        let healthcheck = self
            .health_check
            .as_ref()
            .filter(|h| !h.command.is_empty())
            .map(|h| {
                bollard::models::HealthConfig {
                    test: Some(h.command.clone()),
                    interval: Some(secs(h.interval_secs)),
                    timeout: Some(secs(h.timeout_secs)),
                    retries: Some(i64::from(h.retries)),
                    start_period: Some(secs(h.start_period_secs)),
                    // Checked every second until the first pass (Docker 25+).
                    start_interval: Some(secs(1)),
                }
            });
        ContainerCreateBody {
            image: Some(self.image.clone()),
            exposed_ports: (!self.ports.is_empty() && !self.host_network).then(|| {
                self.ports
                    .iter()
                    .map(|(c, _, proto)| format!("{c}/{}", proto.as_str()))
                    .collect()
            }),
            healthcheck,
            entrypoint: (!self.entry_point.is_empty()).then(|| self.entry_point.clone()),
            cmd: (!self.command.is_empty()).then(|| self.command.clone()),
            env: Some(env),
            labels: Some(labels),
            user: self.user.clone(),
            host_config: Some(host),
            ..Default::default()
        }
    }
}

/// Where a container stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Its image is being pulled.
    Pulling(String),
    /// Being created and started.
    Starting,
    /// Running; its main process on the host, once known.
    Running(Option<u32>),
    /// Ended and removed, with its exit code when known.
    Exited(Option<i32>),
    /// Could not start: why.
    Failed(String),
}

impl Phase {
    pub fn ended(&self) -> bool {
        matches!(self, Phase::Exited(_) | Phase::Failed(_))
    }
}

/// One container under the engine, and the task that drives it.
pub struct Boxed {
    pub name: String,
    docker_name: String,
    engine: Engine,
    phase: Arc<Mutex<Phase>>,
    driver: JoinHandle<()>,
}

/// Where a container's output goes.
#[derive(Debug, Clone)]
pub struct LogFiles {
    pub out: PathBuf,
    pub err: PathBuf,
    pub cap: u64,
    /// The group the files belong to (its task's own gid), besides the agent.
    pub group: Option<u32>,
}

impl Boxed {
    /// Pulls, creates and starts the container, in the background.
    pub fn launch(engine: &Engine, launch: Launch, logs: LogFiles) -> Boxed {
        let docker_name = docker_name(&launch.mark, &launch.task_id, &launch.name);
        let phase = Arc::new(Mutex::new(Phase::Pulling(launch.image.clone())));
        let driver = tokio::spawn(drive(
            engine.clone(),
            docker_name.clone(),
            launch.clone(),
            phase.clone(),
            logs,
        ));
        Boxed {
            name: launch.name,
            docker_name,
            engine: engine.clone(),
            phase,
            driver,
        }
    }

    /// Takes over a container a previous run of the agent started. Its state is read
    /// before this returns, so the agent's first report after a restart already says it
    /// runs (a task left out of a report would be taken for lost).
    pub async fn adopt(
        engine: &Engine,
        name: String,
        docker_name: String,
        logs: LogFiles,
    ) -> Boxed {
        let first = engine.phase_of(&docker_name).await;
        let phase = Arc::new(Mutex::new(first.clone()));
        let driver = tokio::spawn(watch(
            engine.clone(),
            docker_name.clone(),
            phase.clone(),
            logs,
            true,
            first,
        ));
        Boxed {
            name,
            docker_name,
            engine: engine.clone(),
            phase,
            driver,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase.lock().clone()
    }

    /// The engine and the container's name there, for reading Docker's health verdict.
    pub fn probe_target(&self) -> (Engine, String) {
        (self.engine.clone(), self.docker_name.clone())
    }

    /// Asks it to stop: the engine sends SIGTERM, then SIGKILL after `timeout`. One that
    /// has not started yet is abandoned and removed.
    pub fn stop(&self, timeout: Duration) {
        let engine = self.engine.clone();
        let name = self.docker_name.clone();
        match self.phase() {
            Phase::Pulling(_) | Phase::Starting => {
                self.driver.abort();
                *self.phase.lock() = Phase::Exited(None);
                tokio::spawn(async move { engine.remove(&name).await });
            }
            Phase::Running(_) => {
                let t = i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX);
                tokio::spawn(async move {
                    let stopped = engine
                        .docker
                        .stop_container(
                            &name,
                            Some(StopContainerOptions {
                                t: Some(t),
                                signal: None,
                            }),
                        )
                        .await;
                    if let Err(e) = stopped {
                        tracing::warn!(container = %name, error = %reason(&e), "cannot stop a container");
                    }
                });
            }
            Phase::Exited(_) | Phase::Failed(_) => {}
        }
    }

    /// Kills it now (the stop timeout has passed).
    pub fn kill(&self) {
        if !matches!(self.phase(), Phase::Running(_)) {
            return;
        }
        let engine = self.engine.clone();
        let name = self.docker_name.clone();
        tokio::spawn(async move {
            let _ = engine
                .docker
                .kill_container(
                    &name,
                    Some(KillContainerOptions {
                        signal: "SIGKILL".into(),
                    }),
                )
                .await;
        });
    }
}

fn set(phase: &Mutex<Phase>, to: Phase) {
    *phase.lock() = to;
}

/// Pull, create, start, then watch until it ends.
async fn drive(
    engine: Engine,
    docker_name: String,
    launch: Launch,
    phase: Arc<Mutex<Phase>>,
    logs: LogFiles,
) {
    if let Err(why) = engine.pull(&launch.image).await {
        // A registry that cannot be reached does not stop an image already here.
        if engine.docker.inspect_image(&launch.image).await.is_err() {
            tracing::warn!(task = %launch.task_id, image = %launch.image, error = %why, "image pull failed");
            set(
                &phase,
                Phase::Failed(format!("pulling {}: {why}", launch.image)),
            );
            return;
        }
        tracing::warn!(image = %launch.image, error = %why, "pull failed; using the image already on this host");
    }
    set(&phase, Phase::Starting);
    // A container of this name is a leftover of this very task that was never started
    // (what runs is adopted, never launched again): it goes.
    engine.remove(&docker_name).await;
    let created = engine
        .docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(docker_name.clone()),
                ..Default::default()
            }),
            launch.body(),
        )
        .await;
    if let Err(e) = created {
        set(
            &phase,
            Phase::Failed(format!("creating the container: {}", reason(&e))),
        );
        return;
    }
    if let Err(e) = engine.docker.start_container(&docker_name, None).await {
        engine.remove(&docker_name).await;
        set(
            &phase,
            Phase::Failed(format!("starting the container: {}", reason(&e))),
        );
        return;
    }
    tracing::info!(task = %launch.task_id, container = %launch.name, image = %launch.image, "container started");
    let first = engine.phase_of(&docker_name).await;
    watch(engine, docker_name, phase, logs, false, first).await;
}

/// Follows a started container from its phase `first` (read just before): its logs, its
/// main process, its end; then removes it.
async fn watch(
    engine: Engine,
    docker_name: String,
    phase: Arc<Mutex<Phase>>,
    logs: LogFiles,
    adopted: bool,
    first: Phase,
) {
    if let Phase::Exited(code) = first {
        // It ended already (while no agent watched, or at once): its code is what the
        // engine kept.
        engine.remove(&docker_name).await;
        set(&phase, Phase::Exited(code));
        return;
    }
    set(&phase, first);
    // After an agent restart, only what is new: the earlier output is in the files.
    let since = if adopted {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i32::try_from(d.as_secs()).unwrap_or(0))
    } else {
        0
    };
    let copier = tokio::spawn(copy_logs(engine.clone(), docker_name.clone(), logs, since));
    let mut wait = engine
        .docker
        .wait_container(&docker_name, None::<WaitContainerOptions>);
    let code = match wait.next().await {
        Some(Ok(r)) => i32::try_from(r.status_code).ok(),
        Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
            i32::try_from(code).ok()
        }
        _ => engine
            .docker
            .inspect_container(&docker_name, None::<InspectContainerOptions>)
            .await
            .ok()
            .and_then(|i| i.state?.exit_code)
            .and_then(|c| i32::try_from(c).ok()),
    };
    // The output is complete once the container has ended; then it goes.
    let _ = tokio::time::timeout(Duration::from_secs(5), copier).await;
    engine.remove(&docker_name).await;
    set(&phase, Phase::Exited(code));
}

async fn copy_logs(engine: Engine, docker_name: String, files: LogFiles, since: i32) {
    let mut out = CappedLog::new(files.out, files.cap).group(files.group);
    let mut err = CappedLog::new(files.err, files.cap).group(files.group);
    let mut stream = engine.docker.logs(
        &docker_name,
        Some(LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            since,
            ..Default::default()
        }),
    );
    while let Some(item) = stream.next().await {
        let written = match item {
            Ok(LogOutput::StdErr { message }) => err.write(&message).await,
            Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                out.write(&message).await
            }
            Ok(LogOutput::StdIn { .. }) => Ok(()),
            Err(_) => break,
        };
        if written.is_err() {
            break;
        }
    }
    out.flush().await;
    err.flush().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_split_into_name_and_tag() {
        assert_eq!(
            split_tag("nvcr.io/nvidia/pytorch:24.05-py3"),
            ("nvcr.io/nvidia/pytorch", "24.05-py3")
        );
        assert_eq!(
            split_tag("localhost:5000/app"),
            ("localhost:5000/app", "latest")
        );
        assert_eq!(split_tag("ubuntu"), ("ubuntu", "latest"));
        assert_eq!(split_tag("app@sha256:abc"), ("app@sha256:abc", ""));
    }

    fn launch(security: tessera_model::taskdef::ContainerSecurity) -> Launch {
        Launch {
            task_id: "t1".into(),
            name: "main".into(),
            image: "busybox".into(),
            entry_point: vec![],
            command: vec![],
            env: BTreeMap::new(),
            gpus: vec![],
            mps_pipe_dir: None,
            cpu_milli: 0,
            memory_mib: 0,
            memory_soft: false,
            mark: "m".into(),
            ports: vec![],
            host_network: false,
            health_check: None,
            user: security.user.clone(),
            security,
            pids_limit: Some(4096),
        }
    }

    #[test]
    fn a_container_runs_without_privileges_unless_its_definition_asks() {
        use tessera_model::taskdef::ContainerSecurity;
        let plain = launch(ContainerSecurity::default()).body();
        let host = plain.host_config.clone().expect("host config");
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges".to_owned()])
        );
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(host.cap_add, None);
        assert_eq!(host.pids_limit, Some(4096));
        assert_eq!(host.privileged, Some(false));
        assert_eq!(host.readonly_rootfs, Some(false));
        assert_eq!(plain.user, None, "the image's user when nothing is set");

        let asked = launch(ContainerSecurity {
            user: Some("1000:1000".into()),
            privileged: false,
            readonly_root_filesystem: true,
            cap_add: vec!["NET_BIND_SERVICE".into()],
        })
        .body();
        let host = asked.host_config.clone().expect("host config");
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(host.cap_add, Some(vec!["NET_BIND_SERVICE".to_owned()]));
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(asked.user.as_deref(), Some("1000:1000"));

        let privileged = launch(ContainerSecurity {
            privileged: true,
            ..ContainerSecurity::default()
        })
        .body();
        let host = privileged.host_config.clone().expect("host config");
        assert_eq!(host.privileged, Some(true));
        assert_eq!(host.security_opt, None);
        assert_eq!(host.cap_drop, None);
        assert_eq!(host.pids_limit, Some(4096), "a pid limit whatever it asks");
    }

    #[test]
    fn names_are_the_agents_and_the_tasks() {
        assert_eq!(
            docker_name("0123456789abcdef", "svc-1/a b", "main"),
            "tessera-01234567-svc-1_a_b-main"
        );
    }
}
