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

mod boxed;
mod launch;

mod exec;
pub use boxed::{Boxed, LogFiles};
pub use launch::{Launch, docker_name};

use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::{
    CreateImageOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

    /// The engine's runtimes (`runc`, `nvidia`, …).
    pub async fn runtimes(&self) -> Result<Vec<String>, String> {
        let info = self.docker.info().await.map_err(|e| e.to_string())?;
        let mut names: Vec<String> = info
            .runtimes
            .map(|r| r.into_keys().collect())
            .unwrap_or_default();
        names.sort();
        Ok(names)
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

    /// Whether the engine says the kernel killed an ended container at its memory limit
    /// (`State.OOMKilled`; false when it does not answer).
    async fn oom_killed(&self, docker_name: &str) -> bool {
        self.docker
            .inspect_container(docker_name, None::<InspectContainerOptions>)
            .await
            .ok()
            .and_then(|i| i.state?.oom_killed)
            .unwrap_or(false)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

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
