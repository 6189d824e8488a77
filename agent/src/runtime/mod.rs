//! The process runtime: runs each wanted task's containers as processes, each in its own
//! process group, with the environment the server computed (plus the MPS pipe directory);
//! writes their output to size-capped logs; reports exits; stops unwanted tasks with
//! SIGTERM, then SIGKILL after the stop timeout, to the whole process group: a task has
//! ended only when no process of it is left.
//!
//! Every process carries its task's id and this agent's mark in its environment. After
//! the agent restarts it re-adopts exactly the processes that carry its mark (read from
//! `/proc`), so a task started just before a crash is not started twice, and a process
//! that merely reuses a remembered process id is never taken for a task. Each group is
//! known by its leader's start time too: once a group has emptied and its id is reused,
//! the new group is never signalled nor taken for the task. The state file
//! (written atomically, owner-only) keeps what `/proc` cannot tell: stop timeouts.
//!
//! Tasks are kept apart. With `--task-uids` each task runs as a uid of its own (and a
//! group of the same number), unless its definition names a user: it cannot read another
//! task's environment (its secrets), signal its processes, or open its files; its logs are
//! readable by the agent and its own group only, and it starts in a working directory only
//! it can enter. Where the agent can use cgroups ([`cgroup`]), each task runs in a cgroup of
//! its own, joined before its program runs (`confine`): its CPU, memory and pid limits
//! hold, and once it is stopped (SIGTERM to its process groups, SIGKILL after its stop
//! timeout) whatever is left in its cgroup is killed, processes that left its groups
//! and sessions included; a task has ended only when its cgroup is empty.

#[cfg(test)]
mod bounds_tests;
pub mod cgroup;
mod confine;
mod converge;
pub mod docker;
pub mod exec;
mod health;
mod identity;
pub(crate) mod log_read;
pub use log_read::{read_log, unstamped_text};
mod logs;
mod oom;
mod ports;
mod procfs;
mod report;
mod start;
mod state;
mod task;
#[cfg(test)]
mod tests;
pub(crate) mod work;

pub use cgroup::Cgroups;
pub use docker::{Engine, default_socket};
pub(crate) use logs::CappedLog;
pub use ports::{PortAllocator, port_environment};
pub use state::write_private;
use task::Task;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_model::agent::{Capability, WantedTask};
use tessera_model::service::TaskPort;
use tessera_model::taskdef::Protocol;

/// Variables a task always gets from the agent's own environment; nothing else leaks
/// through (the agent's environment may hold its join token).
const PASSED_THROUGH: &[&str] = &["PATH", "HOME", "LANG", "TZ"];
/// Which agent started a process: a hash of its state directory, so two agents on one
/// machine (the demo, tests) never adopt each other's tasks.
const AGENT_MARK: &str = "TESSERA_AGENT_MARK";
const TASK_ID: &str = "TESSERA_TASK_ID";
/// A task's working directory inside its log directory, when it runs as a uid of its own.
const WORK_DIR: &str = "work";
/// How long the cgroup of a task that has ended is tried again before it is left.
const CGROUP_REMOVAL: Duration = Duration::from_secs(60);

/// A task's processes, for measurement.
pub struct TaskProcesses {
    pub task_id: String,
    pub pids: Vec<u32>,
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot use the state directory {path}: {source}")]
    StateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("--task-uids: {0}")]
    TaskUids(String),
}

/// The tasks this agent runs.
pub struct Runtime {
    dir: PathBuf,
    state_file: PathBuf,
    /// Put in every process's environment; re-adoption takes only processes with it.
    mark: String,
    /// The user and group tasks run as, when not the agent's own.
    run_as: Option<(u32, u32)>,
    log_cap: u64,
    /// Where each GPU's MPS daemon keeps its pipe directory (`crate::mps::pipe_dir`).
    mps_root: Option<PathBuf>,
    /// On a simulated host: where tasks on one simulated GPU find each other (see
    /// `tessera example-server`, whose simulated GPU work slows beside heavy neighbours).
    simulated_gpus: Option<PathBuf>,
    /// Runs containers that have an image; without it they are refused.
    engine: Option<Engine>,
    /// Stop timeouts the state file kept, for containers re-adopted once the engine is
    /// attached.
    saved_timeouts: BTreeMap<String, Duration>,
    tasks: BTreeMap<String, Task>,
    /// Tasks that exited on their own, with their code and why they could not start,
    /// until the server has heard.
    ended: BTreeMap<String, Ended>,
    /// Tasks that exited and that the server has heard of while their output was still
    /// being copied to their files: forgotten once they are gone, never reported again.
    heard: BTreeSet<String>,
    /// Dynamic host ports.
    ports: PortAllocator,
    /// Notified when a health verdict changes, so the agent syncs at once.
    health_changed: Arc<tokio::sync::Notify>,
    /// Ports the state file kept, for containers re-adopted once the engine is attached.
    saved_ports: BTreeMap<String, Vec<TaskPort>>,
    /// Task uids the state file kept, for containers re-adopted once the engine is attached.
    saved_uids: BTreeMap<String, u32>,
    /// MPS pipe directories the state file kept, for containers re-adopted once the engine
    /// is attached.
    saved_pipes: BTreeMap<String, PathBuf>,
    /// Each task runs as a uid of its own from this range (`--task-uids`), inclusive.
    task_uids: Option<(u32, u32)>,
    /// Where the next task uid is looked for: uids are handed out in turn, so that one
    /// comes back to a new task as late as possible (what a task leaves in `/tmp` or
    /// `/dev/shm` is its uid's).
    next_uid: Option<u32>,
    /// This agent's cgroups, where it can use them.
    cgroups: Option<Cgroups>,
    /// Each GPU's device minor by UUID, as the probe last read them: a task's cgroup is
    /// refused every other GPU's node.
    gpu_minors: HashMap<String, u32>,
    /// Where the host's device nodes are (`/dev`; a directory of fake nodes in tests).
    dev_dir: PathBuf,
    /// Cgroups of tasks gone that still held a process or that the kernel had not let go
    /// of: killed again and removed at each poll, given up on after a while.
    debris: Vec<(cgroup::TaskCgroup, Instant)>,
    /// The most processes and threads a task may have (`--task-pids-max`); 0: no limit.
    pids_max: u64,
}

/// How a task that exited by itself ended, until the server has heard.
#[derive(Debug, Clone, Default)]
struct Ended {
    code: Option<i32>,
    /// Why it could not start.
    error: Option<String>,
    /// Whether it ran out of memory.
    out_of_memory: Option<oom::Evidence>,
}

/// The default of `--task-pids-max`.
pub const DEFAULT_PIDS_MAX: u64 = 4096;

impl Runtime {
    /// The tasks this runtime has (running, or ending while their output is copied).
    pub fn task_ids(&self) -> BTreeSet<String> {
        self.tasks.keys().cloned().collect()
    }

    /// Where each task's directory (and its logs) is.
    pub fn tasks_dir(&self) -> &Path {
        &self.dir
    }

    /// Tasks run as this user and group (the agent must be root to switch), from `/` so
    /// that they need no access to the agent's directories. `task_uids` takes precedence.
    pub fn run_as(mut self, uid: u32, gid: u32) -> Self {
        self.run_as = Some((uid, gid));
        self
    }

    /// Each task runs as a uid of its own from `first..=last` (and a group of the same
    /// number), unless its definition names a user: no task can read another's
    /// environment, processes or files. The agent must be root. The state directory and
    /// the tasks' directory become traversable (0711, never listable), so that each task
    /// reaches its own working directory.
    pub fn task_uids(mut self, first: u32, last: u32) -> Result<Self, RuntimeError> {
        use std::os::unix::fs::PermissionsExt;
        if first == 0 || first > last {
            return Err(RuntimeError::TaskUids(format!(
                "{first}-{last}: expected START-END with 0 < START <= END"
            )));
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(RuntimeError::TaskUids(
                "the agent must run as root to start tasks as uids of their own".into(),
            ));
        }
        let traversable = std::fs::Permissions::from_mode(0o711);
        for dir in [self.dir.parent(), Some(self.dir.as_path())]
            .into_iter()
            .flatten()
        {
            std::fs::set_permissions(dir, traversable.clone()).map_err(|source| {
                RuntimeError::StateDir {
                    path: dir.display().to_string(),
                    source,
                }
            })?;
        }
        // A task re-adopted before its uid was saved: its processes say which it has.
        for t in self.tasks.values_mut().filter(|t| t.uid.is_none()) {
            t.uid = t
                .procs
                .iter()
                .filter_map(|p| u32::try_from(p.pgid).ok())
                .find_map(confine::process_uid)
                .filter(|uid| (first..=last).contains(uid));
        }
        self.task_uids = Some((first, last));
        self.save();
        Ok(self)
    }

    /// The most processes and threads a task may have: its cgroup's `pids.max`, its
    /// containers' `PidsLimit`; 0: no limit.
    pub fn pids_max(mut self, max: u64) -> Self {
        self.pids_max = max;
        self
    }

    /// Runs each task in a cgroup of its own under `cgroups`, and says in the log what
    /// that enforces. Cgroups of tasks this agent no longer has (left by a previous run
    /// that crashed, or by processes that outlived their task) are killed and removed.
    pub fn cgroups(mut self, cgroups: Cgroups) -> Self {
        let cgroups = cgroups.for_agent(&self.mark);
        if cgroups.enforces_all() {
            tracing::info!(cgroups = %cgroups.describe(), "each task runs in a cgroup of its own");
        } else {
            tracing::warn!(cgroups = %cgroups.describe(), "task limits are not all enforced");
        }
        if !cgroups.usable() {
            return self;
        }
        let known: BTreeMap<String, String> = self
            .tasks
            .keys()
            .map(|id| (cgroup::cgroup_name(id), id.clone()))
            .collect();
        let names = cgroups.task_names();
        // A re-adopted task's processes are the ones in its cgroup: the agent's mark and a
        // task id in an environment are readable by the task and forgeable by any process,
        // its cgroup is not (only the agent moves processes into it).
        let unproven: Vec<String> = self
            .tasks
            .keys()
            .filter(|id| !names.contains(&cgroup::cgroup_name(id)))
            .cloned()
            .collect();
        for id in unproven {
            tracing::warn!(task = %id, "not re-adopted: its processes are not in its cgroup (a process that only claims to be the task)");
            self.tasks.remove(&id);
        }
        for name in names {
            let found = cgroups.named(&name);
            match known.get(&name).and_then(|id| self.tasks.get_mut(id)) {
                Some(t) => {
                    let inside = found.pids();
                    let before = t.procs.len();
                    t.procs
                        .retain(|p| u32::try_from(p.pgid).is_ok_and(|g| inside.contains(&g)));
                    if t.procs.len() < before {
                        tracing::warn!(task = %known[&name], left_out = before - t.procs.len(), "process groups that claim to be the task's but are outside its cgroup are not re-adopted");
                    }
                    t.cgroup = Some(found);
                }
                None => {
                    tracing::info!(cgroup = %found, "killing what is left in the cgroup of a task this agent no longer has");
                    found.kill();
                    if found.remove().is_err() {
                        self.debris.push((found, Instant::now()));
                    }
                }
            }
        }
        self.cgroups = Some(cgroups);
        self
    }

    /// What this runtime holds its tasks to here: the GPU device rule, cgroup limits and a
    /// uid per task (in that order), each with how or why not.
    pub fn enforcement(&self) -> [Capability; 3] {
        let devices = match self.cgroups.as_ref().map(Cgroups::gpu_devices) {
            Some(cgroup::GpuDevices::V1) => Capability::held(
                "process tasks open only their own GPUs' device nodes (v1 devices controller); containers get only their GPUs from the engine",
            ),
            Some(cgroup::GpuDevices::Program) => Capability::held(
                "process tasks open only their own GPUs' device nodes (a v2 device program per task); containers get only their GPUs from the engine",
            ),
            Some(cgroup::GpuDevices::None) => Capability::missing(
                "no cgroup can hold device rules here: a process task can open every GPU's device node (containers still get only their GPUs from the engine)",
            ),
            None => Capability::missing(
                "no cgroups (--cgroup-parent unset): a process task can open every GPU's device node (containers still get only their GPUs from the engine)",
            ),
        };
        let limits = match &self.cgroups {
            Some(c) if c.enforces_all() => Capability::held(c.describe()),
            Some(c) => Capability::missing(c.describe()),
            None => Capability::missing(
                "no cgroups (--cgroup-parent unset): tasks run without CPU, memory and pid limits, and a task's escaped processes cannot be killed",
            ),
        };
        let users = match (self.task_uids, self.run_as) {
            (Some((first, last)), _) => Capability::held(format!(
                "each task runs as a uid of its own ({first}-{last})"
            )),
            (None, Some((uid, _))) => Capability::missing(format!(
                "tasks share uid {uid}: they can read each other's environment (secrets) and signal each other (--task-uids)"
            )),
            (None, None) => Capability::missing(
                "tasks run as the agent's own uid: they can read each other's environment (secrets) (--task-uids)",
            ),
        };
        [devices, limits, users]
    }

    /// The host's GPUs are simulated: tasks get `TESSERA_SIMULATED_GPU_DIR`, a directory
    /// every task may write (sticky, as `/tmp`), where processes on one simulated GPU
    /// register the load they put on it.
    pub fn simulated_gpus(mut self, dir: PathBuf) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))?;
        self.simulated_gpus = Some(dir);
        Ok(self)
    }

    /// Looks for the host's GPU device nodes in `dir` rather than `/dev`.
    pub fn dev_dir(mut self, dir: PathBuf) -> Self {
        self.dev_dir = dir;
        self
    }

    /// The GPUs' device minors by UUID, as the probe reads them now.
    pub fn set_gpu_minors(&mut self, minors: HashMap<String, u32>) {
        self.gpu_minors = minors;
    }

    /// The device nodes task `w` may not open: every GPU node of the host but those of the
    /// GPUs its containers are given (all of them for a task given none, or a GPU whose
    /// node is unknown).
    pub(crate) fn denied_devices(&self, w: &WantedTask) -> Vec<cgroup::devices::Node> {
        let mut own = std::collections::BTreeSet::new();
        for gpu in w
            .containers
            .iter()
            .filter_map(|c| c.env.get("CUDA_VISIBLE_DEVICES"))
            .flat_map(|v| v.split(','))
            .filter(|g| !g.is_empty())
        {
            match self.gpu_minors.get(gpu) {
                Some(m) => {
                    own.insert(*m);
                }
                None if !self.gpu_minors.is_empty() => {
                    tracing::warn!(task = %w.task_id, %gpu, "the driver names no device node for this GPU: the task may open no GPU's node");
                }
                None => {}
            }
        }
        // The nodes there are now, and those of every GPU the driver reports (a node made
        // later, by nvidia-modprobe or for a GPU that comes back, is refused too).
        let mut host = cgroup::devices::gpu_nodes(&self.dev_dir);
        host.extend(
            self.gpu_minors
                .values()
                .map(|&minor| cgroup::devices::Node {
                    major: cgroup::devices::NVIDIA_MAJOR,
                    minor,
                }),
        );
        cgroup::devices::denied(&host, &own)
    }

    /// Dynamic host ports come from `from..=to`.
    pub fn port_range(mut self, from: u16, to: u16) -> Self {
        self.ports = PortAllocator::new((from, to));
        self
    }

    /// Notified whenever a task's health verdict changes.
    pub fn health_changes(&self) -> Arc<tokio::sync::Notify> {
        self.health_changed.clone()
    }

    /// Host ports held by this agent's tasks.
    fn held_ports(&self) -> BTreeSet<(u16, Protocol)> {
        self.tasks
            .values()
            .flat_map(|t| &t.ports)
            .filter_map(|p| p.host_port.map(|h| (h, p.protocol)))
            .collect()
    }

    /// Dynamic ports left in the range, for the server's placement.
    pub fn dynamic_ports_free(&mut self) -> u32 {
        let held = self.held_ports();
        self.ports.free_count(&held)
    }
}

/// The environment container `container` of `w` runs with: a few of the agent's own
/// variables, the task's (with its GPU and MPS limits), its id, and for MPS tasks the
/// pipe directory of its GPU's daemon (`pipe_dir`: the root of every GPU's).
/// Where a simulated host's tasks register the load they put on their simulated GPU.
pub const SIMULATED_GPU_DIR: &str = "TESSERA_SIMULATED_GPU_DIR";

pub fn task_environment(
    w: &WantedTask,
    container: usize,
    pipe_dir: Option<&Path>,
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = PASSED_THROUGH
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| ((*k).to_owned(), v)))
        .collect();
    env.extend(container_environment(w, container, pipe_dir));
    env
}

/// What a container gets whether it runs as a process or from an image (which brings
/// its own `PATH` and `HOME`): the task's variables and secrets, its id, and for MPS
/// tasks the daemon's pipe directory.
pub fn container_environment(
    w: &WantedTask,
    container: usize,
    pipe_dir: Option<&Path>,
) -> BTreeMap<String, String> {
    let mut env = w.containers[container].env.clone();
    env.extend(w.containers[container].secrets.0.clone());
    env.insert(TASK_ID.into(), w.task_id.clone());
    if let Some(pipe) = pipe_dir.and_then(|root| task_pipe(root, w)) {
        env.insert("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.display().to_string());
    }
    env
}

/// The pipe directory of the MPS daemon of an MPS task's GPU (the one its containers are
/// given in `CUDA_VISIBLE_DEVICES`), under `root`; `None` for a task without MPS.
pub fn task_pipe(root: &Path, w: &WantedTask) -> Option<PathBuf> {
    if !w.mps {
        return None;
    }
    let gpu = w
        .containers
        .iter()
        .filter_map(|c| c.env.get("CUDA_VISIBLE_DEVICES"))
        .flat_map(|v| v.split(','))
        .find(|g| !g.is_empty())?;
    crate::mps::pipe_dir(root, gpu)
}
