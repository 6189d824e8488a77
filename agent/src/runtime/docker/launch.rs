//! What one container of a task runs, and the create request the engine gets for it:
//! its limits, GPUs, ports, health check and privileges, and its name on the engine.

use super::{LABEL_CONTAINER, LABEL_MARK, LABEL_TASK};
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

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
