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

pub mod cgroup;
mod confine;
pub mod docker;
mod health;
mod ports;
mod procfs;
#[cfg(test)]
mod tests;
pub(crate) mod work;

pub use cgroup::Cgroups;
use confine::Confinement;
use docker::Phase;
pub use docker::{Engine, default_socket};
pub use ports::{PortAllocator, port_environment};

use procfs::*;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_model::agent::{TaskReport, WantedContainer, WantedTask};
use tessera_model::service::TaskPort;
use tessera_model::taskdef::{DependencyCondition, Protocol};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

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

/// Writes `bytes` to `path` so that a crash leaves the old file or the new one, never a
/// mix: a temporary file, owner-only (0600), synced, renamed over, the directory synced.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// One process of a task.
struct Proc {
    name: String,
    /// Whether its exit ends the task.
    essential: bool,
    pgid: i32,
    /// `None` for a process adopted after an agent restart (not our child).
    child: Option<Child>,
    exit: Option<Option<i32>>,
    /// When the group's leader started (`None`: it was already gone when this agent
    /// took the group). A group id is reused only once the group is empty, by a new
    /// leader started later: one whose start differs is a stranger's, never signalled.
    born: Option<u64>,
}

impl Proc {
    /// Exit status if it has exited: `Some(code)`; `Some(None)` when the code is unknown.
    /// For an adopted process (not our child) that is when its group is empty.
    fn poll(&mut self, groups: &Groups) -> Option<Option<i32>> {
        if self.exit.is_none() {
            self.exit = match &mut self.child {
                Some(child) => match child.try_wait() {
                    Ok(Some(status)) => Some(status.code().or_else(|| {
                        use std::os::unix::process::ExitStatusExt;
                        status.signal().map(|s| 128 + s)
                    })),
                    Ok(None) => None,
                    Err(_) => Some(None),
                },
                None => (!self.alive_in(groups)).then_some(None),
            };
        }
        self.exit
    }

    /// Whether its process group is still there and still the one this agent started.
    fn alive_in(&self, groups: &Groups) -> bool {
        groups.get(&self.pgid).is_some_and(|g| self.owns(g))
    }

    fn owns(&self, group: &Group) -> bool {
        group.leader_start.is_none() || group.leader_start == self.born
    }

    /// Whether nothing of this container is left: its first process has exited and no
    /// process of its group remains (children that outlive it still hold the GPU).
    fn finished(&mut self, groups: &Groups) -> bool {
        self.poll(groups).is_some() && !self.alive_in(groups)
    }

    /// Signals the whole process group, as long as any of it is left and it is still
    /// this container's (checked by its leader's start time, not by its id alone).
    fn signal(&self, signal: Signal) {
        if let Some(leader) = u32::try_from(self.pgid).ok().and_then(proc_stat)
            && self.born != Some(leader.start)
            && leader.pgrp == self.pgid
        {
            tracing::warn!(
                pgid = self.pgid,
                "a task's process group id now belongs to another process; not signalled"
            );
            return;
        }
        if let Err(e) = killpg(Pid::from_raw(self.pgid), signal)
            && e != Errno::ESRCH
        {
            tracing::warn!(pgid = self.pgid, %signal, error = %e, "cannot signal a task's process group");
        }
    }
}

/// Why a task is going away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The server no longer wants it.
    Requested,
    /// A container exited on its own with this code.
    Exited(Option<i32>),
}

struct Task {
    procs: Vec<Proc>,
    /// Containers with an image, under the Docker engine.
    boxes: Vec<docker::Boxed>,
    /// Why it could not start (a refused pull, an engine's error).
    error: Option<String>,
    /// Environment of its first GPU container, for measuring use.
    env: BTreeMap<String, String>,
    stop_timeout: Duration,
    /// Set once it is being stopped: why, and when SIGKILL follows SIGTERM.
    ending: Option<(Ending, Instant)>,
    /// Its ports and the host ports they are bound to.
    ports: Vec<TaskPort>,
    /// Its containers' health checks, running.
    checkers: Vec<health::Checker>,
    /// What the server asked for, while some containers wait for others (`depends_on`).
    wanted: Option<WantedTask>,
    /// Containers not started yet, by index, waiting for their dependencies.
    waiting: Vec<usize>,
    /// Names of its containers that are not essential: their exit does not end it.
    optional: BTreeSet<String>,
    /// The verdict the state file kept, for a re-adopted task until its checks run again.
    resumed_health: Option<tessera_model::agent::HealthReport>,
    /// How many of its containers have a health check: until each has a checker running,
    /// the task is not healthy, whatever the ones running say.
    checks_expected: usize,
    /// Where its application publishes its work (learnt again from the server's answer
    /// after a restart).
    work: Option<tessera_model::work::WorkSpec>,
    /// Its own uid (and gid), from `--task-uids`.
    uid: Option<u32>,
    /// Its cgroup, once one of its containers runs as a process.
    cgroup: Option<cgroup::TaskCgroup>,
}

/// What the state file keeps per task.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Saved {
    tasks: BTreeMap<String, SavedTask>,
    /// The kernel's boot id when it was written: after a reboot nothing is re-adopted.
    #[serde(default)]
    boot_id: Option<String>,
    /// Where the next task uid is looked for (`--task-uids`).
    #[serde(default)]
    next_uid: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SavedTask {
    /// For the operator's eyes: adoption goes by the agent's mark in `/proc`.
    pgids: Vec<i32>,
    stop_timeout_secs: u64,
    /// Its host ports: a re-adopted task keeps them (and reports them again).
    #[serde(default)]
    ports: Vec<TaskPort>,
    /// Its last health verdict: a re-adopted task keeps it until a check says otherwise.
    #[serde(default)]
    health: Option<tessera_model::agent::HealthReport>,
    /// The container each process group runs, and whether it is essential: `/proc` does
    /// not say, and a re-adopted non-essential container's exit must not end its task.
    #[serde(default)]
    groups: Vec<(i32, String, bool)>,
    /// Names of its non-essential containers (those under Docker too).
    #[serde(default)]
    optional: Vec<String>,
    /// Containers still waiting for their dependencies, by index.
    #[serde(default)]
    waiting: Vec<usize>,
    /// Its own uid: a re-adopted task keeps it, and no other task is given it.
    #[serde(default)]
    uid: Option<u32>,
}

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
    mps_pipe_dir: Option<PathBuf>,
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
    ended: BTreeMap<String, (Option<i32>, Option<String>)>,
    /// Dynamic host ports.
    ports: PortAllocator,
    /// Notified when a health verdict changes, so the agent syncs at once.
    health_changed: Arc<tokio::sync::Notify>,
    /// Ports the state file kept, for containers re-adopted once the engine is attached.
    saved_ports: BTreeMap<String, Vec<TaskPort>>,
    /// Task uids the state file kept, for containers re-adopted once the engine is attached.
    saved_uids: BTreeMap<String, u32>,
    /// Each task runs as a uid of its own from this range (`--task-uids`), inclusive.
    task_uids: Option<(u32, u32)>,
    /// Where the next task uid is looked for: uids are handed out in turn, so that one
    /// comes back to a new task as late as possible (what a task leaves in `/tmp` or
    /// `/dev/shm` is its uid's).
    next_uid: Option<u32>,
    /// This agent's cgroups, where it can use them.
    cgroups: Option<Cgroups>,
    /// Cgroups of tasks gone that still held a process or that the kernel had not let go
    /// of: killed again and removed at each poll, given up on after a while.
    debris: Vec<(cgroup::TaskCgroup, Instant)>,
    /// The most processes and threads a task may have (`--task-pids-max`); 0: no limit.
    pids_max: u64,
}

/// The default of `--task-pids-max`.
pub const DEFAULT_PIDS_MAX: u64 = 4096;

impl Runtime {
    /// Opens the runtime over `state_dir`, re-adopting tasks a previous run left running.
    pub fn open(
        state_dir: &Path,
        log_cap: u64,
        mps_pipe_dir: Option<PathBuf>,
    ) -> Result<Runtime, RuntimeError> {
        let dir = state_dir.join("tasks");
        std::fs::create_dir_all(&dir).map_err(|source| RuntimeError::StateDir {
            path: dir.display().to_string(),
            source,
        })?;
        let state_file = state_dir.join("runtime.json");
        let saved: Saved = std::fs::read(&state_file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        let mut runtime = Runtime {
            dir,
            state_file,
            mark: agent_mark(state_dir),
            run_as: None,
            log_cap,
            mps_pipe_dir,
            simulated_gpus: None,
            engine: None,
            saved_timeouts: saved
                .tasks
                .iter()
                .map(|(id, t)| (id.clone(), Duration::from_secs(t.stop_timeout_secs.max(1))))
                .collect(),
            tasks: BTreeMap::new(),
            ended: BTreeMap::new(),
            ports: PortAllocator::new((32768, 60999)),
            health_changed: Arc::new(tokio::sync::Notify::new()),
            saved_ports: saved
                .tasks
                .iter()
                .map(|(id, t)| (id.clone(), t.ports.clone()))
                .collect(),
            saved_uids: saved
                .tasks
                .iter()
                .filter_map(|(id, t)| Some((id.clone(), t.uid?)))
                .collect(),
            task_uids: None,
            next_uid: saved.next_uid,
            cgroups: None,
            debris: Vec::new(),
            pids_max: DEFAULT_PIDS_MAX,
        };
        // What runs with this agent's mark is ours, whether or not the state file had
        // time to record it; nothing else is, whatever process ids the file remembers.
        // After a reboot nothing is: no task survives one.
        let rebooted = saved.boot_id.is_some() && saved.boot_id != boot_id();
        if rebooted {
            tracing::info!(
                "the machine restarted since the state file was written; nothing to re-adopt"
            );
        }
        let adoptable = if rebooted {
            BTreeMap::new()
        } else {
            marked_processes(&runtime.mark)
        };
        for (id, (pgids, env)) in adoptable {
            let stop_timeout = saved.tasks.get(&id).map_or(Duration::from_secs(10), |t| {
                Duration::from_secs(t.stop_timeout_secs.max(1))
            });
            tracing::info!(task = %id, groups = pgids.len(), "re-adopted a task left running by the previous agent");
            let ports = saved
                .tasks
                .get(&id)
                .map(|t| t.ports.clone())
                .unwrap_or_default();
            let resumed_health = saved.tasks.get(&id).and_then(|t| t.health.clone());
            let kept = saved.tasks.get(&id);
            let group_of = |pgid: i32| {
                kept.and_then(|t| t.groups.iter().find(|(g, _, _)| *g == pgid))
                    .map_or(("adopted".to_owned(), true), |(_, name, essential)| {
                        (name.clone(), *essential)
                    })
            };
            let optional: BTreeSet<String> = kept
                .map(|t| t.optional.iter().cloned().collect())
                .unwrap_or_default();
            let waiting = kept.map(|t| t.waiting.clone()).unwrap_or_default();
            runtime.tasks.insert(
                id,
                Task {
                    procs: pgids
                        .into_iter()
                        .map(|pgid| Proc {
                            name: group_of(pgid).0,
                            essential: group_of(pgid).1,
                            pgid,
                            child: None,
                            exit: None,
                            born: group_born(pgid),
                        })
                        .collect(),
                    boxes: Vec::new(),
                    error: None,
                    env,
                    stop_timeout,
                    ending: None,
                    ports,
                    checkers: Vec::new(),
                    wanted: None,
                    waiting,
                    optional,
                    resumed_health,
                    checks_expected: 0,
                    work: None,
                    uid: kept.and_then(|t| t.uid),
                    cgroup: None,
                },
            );
        }
        runtime.save();
        Ok(runtime)
    }

    /// Runs containers that have an image through `engine` from now on, re-adopting the
    /// containers a previous run of this agent left (running or ended while it was away).
    pub async fn attach_engine(&mut self, engine: Engine) -> Result<(), String> {
        for (task_id, name, docker_name) in engine.marked(&self.mark).await? {
            tracing::info!(task = %task_id, container = %name, "re-adopted a container left by the previous agent");
            let uid = self
                .tasks
                .get(&task_id)
                .and_then(|t| t.uid)
                .or_else(|| self.saved_uids.get(&task_id).copied());
            let logs = self.log_files(&task_id, &name, uid);
            let boxed = docker::Boxed::adopt(&engine, name, docker_name, logs).await;
            let stop_timeout = self
                .saved_timeouts
                .get(&task_id)
                .copied()
                .unwrap_or(Duration::from_secs(10));
            self.tasks
                .entry(task_id)
                .or_insert_with(|| Task {
                    procs: Vec::new(),
                    boxes: Vec::new(),
                    error: None,
                    env: BTreeMap::new(),
                    stop_timeout,
                    ending: None,
                    ports: Vec::new(),
                    checkers: Vec::new(),
                    wanted: None,
                    waiting: Vec::new(),
                    optional: BTreeSet::new(),
                    resumed_health: None,
                    checks_expected: 0,
                    work: None,
                    uid,
                    cgroup: None,
                })
                .boxes
                .push(boxed);
        }
        for (id, t) in &mut self.tasks {
            if t.ports.is_empty()
                && let Some(p) = self.saved_ports.get(id)
            {
                t.ports = p.clone();
            }
        }
        self.engine = Some(engine);
        self.save();
        Ok(())
    }

    fn log_files(&self, task_id: &str, container: &str, uid: Option<u32>) -> docker::LogFiles {
        if let Err(e) = self.make_task_dir(task_id, uid) {
            tracing::error!(task = %task_id, error = %e, "cannot create the task's log directory");
        }
        let dir = self.dir.join(task_id);
        docker::LogFiles {
            out: dir.join(format!("{container}.log")),
            err: dir.join(format!("{container}.err.log")),
            cap: self.log_cap,
            group: uid,
        }
    }

    /// Creates task `task_id`'s directory: its logs, which the agent writes and which no
    /// other task can open (0750, the agent's, in the task's own group when it has a uid of
    /// its own, else the agent's); with a uid of its own, its working directory inside
    /// (0700, the task's). The task cannot write the directory itself, so it cannot
    /// replace a log file with a link to where the agent should not write.
    fn make_task_dir(&self, task_id: &str, uid: Option<u32>) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let dir = self.dir.join(task_id);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750))?;
        let Some(uid) = uid else {
            return Ok(());
        };
        std::os::unix::fs::lchown(&dir, None, Some(uid))?;
        let work = dir.join(WORK_DIR);
        match std::fs::DirBuilder::new().mode(0o700).create(&work) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        std::os::unix::fs::lchown(&work, Some(uid), Some(uid))?;
        std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o700))
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
        for name in cgroups.task_names() {
            let found = cgroups.named(&name);
            match known.get(&name).and_then(|id| self.tasks.get_mut(id)) {
                Some(t) => t.cgroup = Some(found),
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

    /// The uid every MPS task of this host runs as: the first of the range. MPS serves
    /// one Linux user at a time (nvidia-cuda-mps-control(1): a client of another user waits
    /// until every client of the running server is done), so tasks that share GPUs through
    /// it share a uid too; containers keep them apart with their own PID namespaces.
    fn mps_uid(&self) -> Option<u32> {
        self.task_uids.map(|(first, _)| first)
    }

    /// A uid of the range that no task of this agent has and that no account or group of
    /// this host has: the next after the last one handed out (wrapping around). The
    /// range's first is the MPS tasks' (see [`Runtime::mps_uid`]).
    fn allocate_uid(&mut self) -> Result<Option<u32>, String> {
        let Some((first, last)) = self.task_uids else {
            return Ok(None);
        };
        let first = first + 1;
        if first > last {
            return Err(format!(
                "--task-uids {}-{last} holds only the MPS tasks' uid: give a range of at least two",
                first - 1
            ));
        }
        let mut held: BTreeSet<u32> = self.tasks.values().filter_map(|t| t.uid).collect();
        held.extend(confine::uids_alive());
        let span = u64::from(last - first) + 1;
        let start = self
            .next_uid
            .filter(|u| (first..=last).contains(u))
            .unwrap_or(first);
        for step in 0..span {
            let offset = (u64::from(start - first) + step) % span;
            let Ok(uid) = u32::try_from(u64::from(first) + offset) else {
                continue;
            };
            if held.contains(&uid) || confine::id_taken(uid) {
                continue;
            }
            self.next_uid = Some(if uid == last { first } else { uid + 1 });
            return Ok(Some(uid));
        }
        Err(format!(
            "no uid left in --task-uids {first}-{last}: each is held by a task of this agent or is an account's or a group's"
        ))
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

    fn save(&self) {
        let saved = Saved {
            boot_id: boot_id(),
            next_uid: self.next_uid,
            tasks: self
                .tasks
                .iter()
                .map(|(id, t)| {
                    (
                        id.clone(),
                        SavedTask {
                            pgids: t.procs.iter().map(|p| p.pgid).collect(),
                            stop_timeout_secs: t.stop_timeout.as_secs(),
                            ports: t.ports.clone(),
                            health: health::combined(&t.checkers)
                                .or_else(|| t.resumed_health.clone()),
                            groups: t
                                .procs
                                .iter()
                                .map(|p| (p.pgid, p.name.clone(), p.essential))
                                .collect(),
                            optional: t.optional.iter().cloned().collect(),
                            waiting: t.waiting.clone(),
                            uid: t.uid,
                        },
                    )
                })
                .collect(),
        };
        let written = serde_json::to_vec_pretty(&saved)
            .map_err(std::io::Error::other)
            .and_then(|bytes| write_private(&self.state_file, &bytes));
        if let Err(e) = written {
            tracing::error!(error = %e, "cannot write the runtime state file");
        }
    }

    /// Starts what is wanted and missing; stops what runs and is not wanted.
    pub fn converge(&mut self, wanted: &[WantedTask]) {
        let ids: BTreeSet<&str> = wanted.iter().map(|w| w.task_id.as_str()).collect();
        // Fixed host ports of every wanted task are held before any dynamic one is picked:
        // a task of this answer not started yet must find its own port free.
        let fixed: BTreeSet<(u16, Protocol)> = wanted
            .iter()
            .flat_map(|w| {
                w.containers.iter().flat_map(move |c| {
                    c.ports.iter().filter_map(move |p| {
                        p.host_port
                            .or(w.host_network.then_some(p.container_port))
                            .map(|h| (h, p.protocol))
                    })
                })
            })
            .collect();
        for w in wanted {
            if let Some(t) = self.tasks.get_mut(&w.task_id) {
                // A task re-adopted after a restart learns again what `/proc` cannot say.
                t.checks_expected = w
                    .containers
                    .iter()
                    .filter(|c| c.health_check.is_some())
                    .count();
                if !t.waiting.is_empty() && t.wanted.is_none() {
                    t.wanted = Some(w.clone());
                }
                if t.ports.is_empty() && !w.bound_ports.is_empty() {
                    t.ports = w.bound_ports.clone();
                }
                t.work.clone_from(&w.work);
            }
            if !self.tasks.contains_key(&w.task_id) && !self.ended.contains_key(&w.task_id) {
                // A draining task is on its way out: one that is not running is not
                // started again.
                if !w.draining {
                    self.start(w, &fixed);
                }
            } else if let Some(t) = self.tasks.get(&w.task_id)
                && t.ending.is_none()
                && t.checkers.is_empty()
                && t.waiting.is_empty()
                && w.containers.iter().any(|c| c.health_check.is_some())
            {
                // Re-adopted after a restart: its checks start again.
                let resumed = t.resumed_health.as_ref().map(|h| health::Verdict {
                    status: h.status,
                    output: h.output.clone(),
                });
                let checkers: Vec<health::Checker> = (0..w.containers.len())
                    .filter_map(|i| {
                        let c = &w.containers[i];
                        let boxed = t.boxes.iter().find(|b| b.name == c.name);
                        // A command check the agent runs runs as its container does.
                        let by_agent = boxed.is_none()
                            && c.health_check.as_ref().is_some_and(|h| h.http.is_none());
                        let confine = if by_agent {
                            match self.readopted_confinement(&w.task_id, c, t) {
                                Ok(confine) => Some(confine),
                                Err(why) => {
                                    tracing::warn!(task = %w.task_id, container = %c.name, error = %why, "cannot run a re-adopted container's health check");
                                    None
                                }
                            }
                        } else {
                            None
                        };
                        self.checker(w, i, &t.ports, boxed, resumed.clone(), confine.as_ref())
                    })
                    .collect();
                if let Some(t) = self.tasks.get_mut(&w.task_id) {
                    t.checkers = checkers;
                }
            }
        }
        let now = Instant::now();
        for (id, t) in &mut self.tasks {
            if t.ending.is_none() && !ids.contains(id.as_str()) {
                tracing::info!(task = %id, "stopping a task the server no longer wants");
                t.terminate();
                t.ending = Some((Ending::Requested, now + t.stop_timeout));
            }
        }
        // Ended tasks the server no longer lists have been heard of.
        self.ended.retain(|id, _| ids.contains(id.as_str()));
        self.save();
    }

    /// The health checker of container `i` of `w`, if it has a check: Docker's own for a
    /// command check of a container with an image, else the agent's (HTTP on its host
    /// port, or the command confined as the container is: its user, its cgroup, in its
    /// environment; none without `confine`).
    fn checker(
        &self,
        w: &WantedTask,
        i: usize,
        ports: &[TaskPort],
        boxed: Option<&docker::Boxed>,
        resumed: Option<health::Verdict>,
        confine: Option<&Confinement>,
    ) -> Option<health::Checker> {
        let c = &w.containers[i];
        let check = c.health_check.clone()?;
        let probe = if let Some(http) = &check.http {
            let port = ports
                .iter()
                .find(|p| p.container == c.name && p.name.as_deref() == Some(http.port.as_str()))
                .and_then(|p| p.host_port)?;
            health::Probe::Http(format!("http://127.0.0.1:{port}{}", http.path))
        } else if let Some(b) = boxed {
            let (engine, docker_name) = b.probe_target();
            health::Probe::Docker {
                engine,
                docker_name,
            }
        } else {
            let mut env = task_environment(w, i, self.mps_pipe_dir.as_deref());
            env.extend(port_environment(&c.name, ports));
            health::Probe::Command {
                argv: health::command_argv(&check)?,
                env,
                confine: confine?.clone(),
            }
        };
        Some(health::Checker::start(
            c.name.clone(),
            check,
            probe,
            self.health_changed.clone(),
            resumed,
            c.secrets
                .0
                .values()
                .filter(|v| !v.is_empty())
                .cloned()
                .collect(),
        ))
    }

    fn start(&mut self, w: &WantedTask, fixed: &BTreeSet<(u16, Protocol)>) {
        let task_dir = self.dir.join(&w.task_id);
        let allocated = if w.mps {
            Ok(self.mps_uid())
        } else {
            self.allocate_uid()
        };
        let (uid, mut refused) = match allocated {
            Ok(uid) => (uid, None),
            Err(why) => (None, Some(why)),
        };
        if let Err(e) = self.make_task_dir(&w.task_id, uid) {
            tracing::error!(task = %w.task_id, error = %e, "cannot create the task's log directory");
            // A task of its own uid would start nowhere it may be.
            if uid.is_some() {
                refused.get_or_insert_with(|| {
                    format!(
                        "cannot prepare the task's directory {}: {e}",
                        task_dir.display()
                    )
                });
            }
        }
        let env = w
            .containers
            .iter()
            .find(|c| {
                c.env
                    .get("CUDA_VISIBLE_DEVICES")
                    .is_some_and(|v| !v.is_empty())
            })
            .or(w.containers.first())
            .map(|c| c.env.clone())
            .unwrap_or_default();
        let stop_timeout = Duration::from_secs(u64::from(w.stop_timeout_secs.max(1)));
        let mut task = Task {
            procs: Vec::new(),
            boxes: Vec::new(),
            error: None,
            env,
            stop_timeout,
            ending: None,
            ports: Vec::new(),
            checkers: Vec::new(),
            wanted: None,
            waiting: Vec::new(),
            optional: w
                .containers
                .iter()
                .filter(|c| !c.essential)
                .map(|c| c.name.clone())
                .collect(),
            resumed_health: None,
            checks_expected: w
                .containers
                .iter()
                .filter(|c| c.health_check.is_some())
                .count(),
            work: w.work.clone(),
            uid,
            cgroup: None,
        };
        if let Some(why) = refused {
            tracing::warn!(task = %w.task_id, error = %why, "cannot start a task");
            task.error = Some(why);
            task.ending = Some((Ending::Exited(Some(125)), Instant::now()));
            self.tasks.insert(w.task_id.clone(), task);
            return;
        }
        // Held: this agent's tasks' ports, and the fixed ports of other wanted tasks.
        let mine: BTreeSet<(u16, Protocol)> = w
            .containers
            .iter()
            .flat_map(|c| {
                c.ports
                    .iter()
                    .filter_map(|p| p.host_port.map(|h| (h, p.protocol)))
            })
            .collect();
        let mut held = self.held_ports();
        held.extend(fixed.difference(&mine).copied());
        match self.ports.bind(w, &held) {
            Ok(ports) => task.ports = ports,
            Err(e) => {
                tracing::warn!(task = %w.task_id, error = %e, "cannot bind the task's ports");
                let _ = std::fs::write(task_dir.join("ports.err.log"), format!("{e}\n"));
                task.error = Some(e.to_string());
                task.ending = Some((Ending::Exited(Some(125)), Instant::now()));
                self.tasks.insert(w.task_id.clone(), task);
                return;
            }
        }
        // Containers that wait for none start now; the others once what they wait for is
        // reached (`poll`).
        let (now, later): (Vec<usize>, Vec<usize>) =
            (0..w.containers.len()).partition(|&i| w.containers[i].depends_on.is_empty());
        for i in now {
            if let Err(code) = self.start_container(w, i, &mut task) {
                task.kill();
                for b in &task.boxes {
                    b.stop(Duration::from_secs(1));
                }
                task.ending = Some((Ending::Exited(Some(code)), Instant::now()));
                self.tasks.insert(w.task_id.clone(), task);
                return;
            }
        }
        if !later.is_empty() {
            task.waiting = later;
            task.wanted = Some(w.clone());
        }
        tracing::info!(task = %w.task_id, processes = task.procs.len(), containers = task.boxes.len(), waiting = task.waiting.len(), "task started");
        self.tasks.insert(w.task_id.clone(), task);
    }

    /// Starts container `i` of `w` into `task`; `Err` with the exit code the task ends
    /// with when it cannot.
    fn start_container(&self, w: &WantedTask, i: usize, task: &mut Task) -> Result<(), i32> {
        let c = &w.containers[i];
        let task_dir = self.dir.join(&w.task_id);
        if let (Some(image), Some(engine)) = (&c.image, &self.engine) {
            if let Some(spec) = &c.security.user {
                let ids: Vec<u32> = spec.split(':').filter_map(|id| id.parse().ok()).collect();
                if let Err(why) = self.not_a_task_uid(spec, &ids) {
                    tracing::warn!(task = %w.task_id, container = %c.name, error = %why, "cannot start a container");
                    let _ = std::fs::write(
                        task_dir.join(format!("{}.err.log", c.name)),
                        format!("cannot start image {image:?}: {why}\n"),
                    );
                    task.error.get_or_insert(why);
                    return Err(125);
                }
            }
            let entry = c.entry_point_words.min(c.command.len());
            let mut env = container_environment(w, i, self.mps_pipe_dir.as_deref());
            if w.host_network {
                env.extend(port_environment(&c.name, &task.ports));
            }
            let launch = docker::Launch {
                task_id: w.task_id.clone(),
                name: c.name.clone(),
                image: image.clone(),
                entry_point: c.command[..entry].to_vec(),
                command: c.command[entry..].to_vec(),
                env,
                gpus: c
                    .env
                    .get("CUDA_VISIBLE_DEVICES")
                    .map(|v| {
                        v.split(',')
                            .filter(|g| !g.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default(),
                mps_pipe_dir: if w.mps {
                    self.mps_pipe_dir.clone()
                } else {
                    None
                },
                cpu_milli: c.cpu_milli,
                memory_mib: c.memory_mib,
                memory_soft: c.memory_soft,
                mark: self.mark.clone(),
                ports: task
                    .ports
                    .iter()
                    .filter(|p| p.container == c.name)
                    .filter_map(|p| Some((p.container_port, p.host_port?, p.protocol)))
                    .collect(),
                host_network: w.host_network,
                health_check: c.health_check.clone(),
                // The user its definition names, else its task's own uid.
                user: c
                    .security
                    .user
                    .clone()
                    .or_else(|| task.uid.map(|uid| format!("{uid}:{uid}"))),
                security: c.security.clone(),
                pids_limit: (self.pids_max > 0)
                    .then(|| i64::try_from(self.pids_max).unwrap_or(i64::MAX)),
            };
            let logs = self.log_files(&w.task_id, &c.name, task.uid);
            let boxed = docker::Boxed::launch(engine, launch, logs);
            if let Some(checker) = self.checker(w, i, &task.ports, Some(&boxed), None, None) {
                task.checkers.push(checker);
            }
            task.boxes.push(boxed);
            return Ok(());
        }
        // Without an engine this runtime starts processes only.
        if let Some(image) = &c.image {
            tracing::warn!(task = %w.task_id, container = %c.name, %image, "a container image needs a container runtime");
            let _ = std::fs::write(
                task_dir.join(format!("{}.err.log", c.name)),
                format!(
                    "cannot start image {image:?}: this agent runs processes only; images need a container runtime\n"
                ),
            );
            return Err(127);
        }
        let Some((program, args)) = c.command.split_first() else {
            return Ok(());
        };
        let confine = match self.confinement(w, i, task) {
            Ok(confine) => confine,
            Err(why) => {
                tracing::warn!(task = %w.task_id, container = %c.name, error = %why, "cannot start a container");
                let _ = std::fs::write(
                    task_dir.join(format!("{}.err.log", c.name)),
                    format!("cannot start {program:?}: {why}\n"),
                );
                task.error.get_or_insert(why);
                return Err(125);
            }
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(task_environment(w, i, self.mps_pipe_dir.as_deref()))
            .envs(port_environment(&c.name, &task.ports))
            .envs(
                self.simulated_gpus
                    .as_ref()
                    .map(|d| (SIMULATED_GPU_DIR, d.display().to_string())),
            )
            .env(AGENT_MARK, &self.mark)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        let spawned = confine.apply(&mut cmd).and_then(|()| cmd.spawn());
        match spawned {
            Ok(mut child) => {
                let pgid = child.id().map_or(0, |p| p as i32);
                let log = task_dir.join(format!("{}.log", c.name));
                if let Some(out) = child.stdout.take() {
                    tokio::spawn(copy_capped(out, log.clone(), self.log_cap, task.uid));
                }
                if let Some(err) = child.stderr.take() {
                    tokio::spawn(copy_capped(
                        err,
                        task_dir.join(format!("{}.err.log", c.name)),
                        self.log_cap,
                        task.uid,
                    ));
                }
                task.procs.push(Proc {
                    name: c.name.clone(),
                    essential: c.essential,
                    pgid,
                    child: Some(child),
                    exit: None,
                    born: group_born(pgid),
                });
                if let Some(checker) = self.checker(w, i, &task.ports, None, None, Some(&confine)) {
                    task.checkers.push(checker);
                }
                Ok(())
            }
            Err(e) => {
                tracing::warn!(task = %w.task_id, container = %c.name, error = %e, "cannot start a container");
                let _ = std::fs::write(
                    task_dir.join(format!("{}.err.log", c.name)),
                    format!("cannot start {program:?}: {e}\n"),
                );
                Err(127)
            }
        }
    }

    /// The user container `c` of a task with uid `uid` runs as on the host, where it
    /// starts, and its `HOME`: the user its definition names (never root; from `/`), else
    /// the task's own uid (in its working directory, which is also its `HOME` unless the
    /// definition sets one), else `--run-as` (from `/`), else the agent's own.
    fn identity(
        &self,
        c: &WantedContainer,
        task_id: &str,
        uid: Option<u32>,
    ) -> Result<Confinement, String> {
        if let Some(spec) = &c.security.user {
            let (user, group) = confine::resolve_user(spec)?;
            self.not_a_task_uid(spec, &[user, group])?;
            return Ok(Confinement {
                user: Some((user, group)),
                cwd: Some(PathBuf::from("/")),
                ..Confinement::default()
            });
        }
        if let Some(uid) = uid {
            let work = self.dir.join(task_id).join(WORK_DIR);
            let own_home = c.env.contains_key("HOME") || c.secrets.0.contains_key("HOME");
            return Ok(Confinement {
                user: Some((uid, uid)),
                home: (!own_home).then(|| work.clone()),
                cwd: Some(work),
                ..Confinement::default()
            });
        }
        Ok(Confinement {
            user: self.run_as,
            cwd: self.run_as.map(|_| PathBuf::from("/")),
            ..Confinement::default()
        })
    }

    /// Refuses a `user` whose uid or gid is in `--task-uids`: those are other tasks', and
    /// a task that named one could read their secrets and files.
    fn not_a_task_uid(&self, spec: &str, ids: &[u32]) -> Result<(), String> {
        match self.task_uids {
            Some((first, last)) if ids.iter().any(|id| (first..=last).contains(id)) => {
                Err(format!(
                    "user {spec:?}: ids {first}-{last} are this host's task uids (--task-uids), each another task's"
                ))
            }
            _ => Ok(()),
        }
    }

    /// How container `i` of `w` starts as a process: its identity, and with cgroups the
    /// task's cgroup (created with the first such container) and the container's own
    /// inside it, made now with its limits.
    fn confinement(
        &self,
        w: &WantedTask,
        i: usize,
        task: &mut Task,
    ) -> Result<Confinement, String> {
        let c = &w.containers[i];
        let mut confine = self.identity(c, &w.task_id, task.uid)?;
        if let Some(cgroups) = &self.cgroups {
            if task.cgroup.is_none() {
                task.cgroup = Some(cgroups.create(&w.task_id, self.pids_max)?);
            }
            if let Some(own) = &task.cgroup {
                confine.procs = own.container(
                    &c.name,
                    &cgroup::Limits {
                        cpu_milli: c.cpu_milli,
                        memory_mib: c.memory_mib,
                        memory_soft: c.memory_soft,
                    },
                )?;
            }
        }
        Ok(confine)
    }

    /// How the health check of container `c` of re-adopted task `t` runs: as the
    /// container does, in the container's cgroup when it has one.
    fn readopted_confinement(
        &self,
        task_id: &str,
        c: &WantedContainer,
        t: &Task,
    ) -> Result<Confinement, String> {
        let mut confine = self.identity(c, task_id, t.uid)?;
        if let Some(procs) = t.cgroup.as_ref().and_then(|cg| cg.container_procs(&c.name)) {
            confine.procs = procs;
        }
        Ok(confine)
    }

    /// Starts the waiting containers whose dependencies are met; ends a task one of whose
    /// containers can never start (what it waits for exited, or failed where it had to
    /// succeed).
    fn start_waiting(&mut self, groups: &Groups) {
        let ids: Vec<String> = self
            .tasks
            .iter()
            .filter(|(_, t)| !t.waiting.is_empty() && t.ending.is_none() && t.wanted.is_some())
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let Some(mut task) = self.tasks.remove(&id) else {
                continue;
            };
            let w = task
                .wanted
                .clone()
                .expect("a task with waiting containers keeps what it wants");
            let mut still = Vec::new();
            let mut failed = None;
            for i in std::mem::take(&mut task.waiting) {
                match dependencies_met(&w, i, &mut task, groups) {
                    Some(true) => {
                        if let Err(code) = self.start_container(&w, i, &mut task) {
                            failed = Some(code);
                        }
                    }
                    Some(false) => still.push(i),
                    None => {
                        tracing::info!(task = %id, container = %w.containers[i].name, "a container can never start: what it waits for ended otherwise");
                        failed = Some(1);
                    }
                }
            }
            task.waiting = still;
            if task.waiting.is_empty() {
                task.wanted = None;
            }
            if let Some(code) = failed {
                task.error.get_or_insert_with(|| {
                    "a container's dependency was not met (depends_on)".into()
                });
                task.terminate();
                task.ending = Some((
                    Ending::Exited(Some(code)),
                    Instant::now() + task.stop_timeout,
                ));
            }
            self.tasks.insert(id, task);
        }
    }

    /// Notices exits, finishes stops (SIGKILL after the timeout), and forgets tasks whose
    /// processes are all gone.
    pub fn poll(&mut self) {
        let now = Instant::now();
        self.sweep_cgroups(now);
        let mut gone = Vec::new();
        // Reap first, then look: an exited child we have not waited for is a zombie.
        for t in self.tasks.values_mut() {
            for p in t.procs.iter_mut().filter(|p| p.child.is_some()) {
                p.poll(&Groups::new());
            }
        }
        // Nothing to look up in /proc for an agent with no tasks.
        let groups = if self.tasks.is_empty() {
            Groups::new()
        } else {
            live_groups()
        };
        self.start_waiting(&groups);
        for (id, t) in &mut self.tasks {
            let mut first_exit = None;
            let mut all_done = true;
            for p in &mut t.procs {
                if let Some(code) = p.poll(&groups)
                    && first_exit.is_none()
                    && p.essential
                {
                    first_exit = Some((p.name.clone(), code));
                }
                if !p.finished(&groups) {
                    all_done = false;
                }
            }
            for b in &t.boxes {
                let phase = b.phase();
                match &phase {
                    Phase::Exited(code)
                        if first_exit.is_none() && !t.optional.contains(&b.name) =>
                    {
                        first_exit = Some((b.name.clone(), *code));
                    }
                    // Docker's code for a container that could not run.
                    Phase::Failed(why) if first_exit.is_none() => {
                        t.error.get_or_insert_with(|| why.clone());
                        first_exit = Some((b.name.clone(), Some(125)));
                    }
                    _ => {}
                }
                if !phase.ended() {
                    all_done = false;
                }
            }
            if t.ending.is_none()
                && let Some((name, code)) = &first_exit
            {
                tracing::info!(task = %id, container = %name, ?code, "container exited; stopping the task");
                t.terminate();
                t.ending = Some((Ending::Exited(*code), now + t.stop_timeout));
            }
            if let Some((ending, deadline)) = t.ending {
                // Processes that left its process groups (`setsid`, double forks) are
                // still in its cgroup.
                let escaped = t.cgroup.as_ref().is_some_and(|c| !c.is_empty());
                if all_done && !escaped {
                    gone.push((id.clone(), ending, t.error.clone()));
                } else if all_done {
                    // Its containers have ended: whatever is left of it goes now, and
                    // its checks start nothing more in its cgroup.
                    t.checkers.clear();
                    if let Some(c) = &t.cgroup {
                        tracing::info!(task = %id, cgroup = %c, "killing what the task left running outside its process groups");
                        c.kill();
                    }
                } else if now >= deadline {
                    t.kill();
                }
            }
        }
        for (id, ending, error) in gone {
            if let Some(t) = self.tasks.remove(&id) {
                // Not handed out again for a while: a load balancer may still send it
                // traffic meant for this task.
                self.ports.release(&t.ports);
                if let Some(c) = t.cgroup
                    && c.remove().is_err()
                {
                    self.debris.push((c, now));
                }
            }
            if let Ending::Exited(code) = ending {
                self.ended.insert(id, (code, error));
            }
        }
        self.save();
    }

    /// Cgroups of tasks gone that could not be removed yet: removed once empty, killed
    /// again meanwhile, and left (with a warning) after [`CGROUP_REMOVAL`].
    fn sweep_cgroups(&mut self, now: Instant) {
        self.debris.retain(|(c, since)| {
            if c.remove().is_ok() {
                return false;
            }
            if now.duration_since(*since) >= CGROUP_REMOVAL {
                tracing::warn!(cgroup = %c, pids = ?c.pids(), "cannot remove the cgroup of a task gone: something is still in it");
                return false;
            }
            c.kill();
            true
        });
    }

    /// What to tell the server: tasks running, and tasks that exited on their own.
    pub fn reports(&self) -> Vec<TaskReport> {
        let report = |task_id: &str| TaskReport {
            task_id: task_id.to_owned(),
            running: false,
            ..Default::default()
        };
        // A task whose containers are still being created is not reported yet (the
        // server keeps it assigned); one pulling its image says so.
        // A task being stopped is still running until its last process is gone: the server
        // keeps it (and its ports) until then.
        let running = self
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t.ending, None | Some((Ending::Requested, _))))
            .filter_map(|(id, t)| {
                let phases: Vec<Phase> = t.boxes.iter().map(docker::Boxed::phase).collect();
                let pulling = phases.iter().find_map(|p| match p {
                    Phase::Pulling(image) => Some(image.clone()),
                    _ => None,
                });
                if pulling.is_some() {
                    return Some(TaskReport {
                        pulling,
                        ..report(id)
                    });
                }
                if phases.contains(&Phase::Starting) {
                    return None;
                }
                Some(TaskReport {
                    running: true,
                    ports: t.ports.clone(),
                    health: t.health(),
                    ..report(id)
                })
            });
        let exited = self
            .tasks
            .iter()
            .filter_map(|(id, t)| match t.ending {
                Some((Ending::Exited(code), _)) => Some((id.clone(), code, t.error.clone())),
                _ => None,
            })
            .chain(
                self.ended
                    .iter()
                    .map(|(id, (code, error))| (id.clone(), *code, error.clone())),
            )
            .map(|(task_id, exit_code, error)| TaskReport {
                exit_code,
                error,
                ..report(&task_id)
            });
        running.chain(exited).collect()
    }

    /// Running tasks that publish their work: (task, the URL of their metrics, what to
    /// read there). Scraped on the host's loopback, where their host port listens.
    pub fn work_targets(&self) -> Vec<(String, String, tessera_model::work::WorkSpec)> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.ending.is_none())
            .filter_map(|(id, t)| {
                let spec = t.work.as_ref()?;
                let port = t
                    .ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(spec.port.as_str()))?
                    .host_port?;
                Some((
                    id.clone(),
                    work::metrics_url("127.0.0.1", port, &spec.path),
                    spec.clone(),
                ))
            })
            .collect()
    }

    /// Running tasks with their process ids, for measuring.
    pub fn processes(&self) -> Vec<TaskProcesses> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.ending.is_none())
            .map(|(id, t)| {
                let mut pids: Vec<u32> = t
                    .procs
                    .iter()
                    .map(|p| p.pgid as u32)
                    .chain(t.boxes.iter().filter_map(|b| match b.phase() {
                        Phase::Running(pid) => pid,
                        _ => None,
                    }))
                    .collect();
                // Then every other process of its cgroup: a GPU process one of its
                // processes started is the task's, wherever it moved.
                for pid in t.cgroup.iter().flat_map(cgroup::TaskCgroup::pids) {
                    if !pids.contains(&pid) {
                        pids.push(pid);
                    }
                }
                TaskProcesses {
                    task_id: id.clone(),
                    pids,
                    env: t.env.clone(),
                }
            })
            .collect()
    }

    /// Removes the log directories of tasks this runtime no longer has, once nothing in
    /// them changed for `older_than`; returns how many.
    pub fn prune_logs(&self, older_than: Duration) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let newest = |dir: &Path| -> Option<std::time::SystemTime> {
            let own = std::fs::metadata(dir).and_then(|m| m.modified()).ok();
            std::fs::read_dir(dir)
                .ok()?
                .flatten()
                .filter_map(|f| f.metadata().and_then(|m| m.modified()).ok())
                .chain(own)
                .max()
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let id = e.file_name().to_string_lossy().into_owned();
            if self.tasks.contains_key(&id) || self.ended.contains_key(&id) {
                continue;
            }
            let old = newest(&e.path())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= older_than);
            if old && std::fs::remove_dir_all(e.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    pub fn running_count(&self) -> usize {
        self.tasks.values().filter(|t| t.ending.is_none()).count()
    }

    /// Stops every task and waits for them (used when the demo shuts down).
    pub async fn stop_all(&mut self) {
        self.converge(&[]);
        for _ in 0..100 {
            self.poll();
            if self.tasks.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for t in self.tasks.values() {
            t.kill();
        }
    }
}

/// Whether what container `i` of `w` waits for has been reached: `Some(true)` yes,
/// `Some(false)` not yet, `None` never (it ended without reaching it).
fn dependencies_met(w: &WantedTask, i: usize, task: &mut Task, groups: &Groups) -> Option<bool> {
    let mut all = true;
    for d in &w.containers[i].depends_on {
        // Started (`None` not yet), and its exit code once ended.
        let state: Option<Option<Option<i32>>> =
            if let Some(p) = task.procs.iter_mut().find(|p| p.name == d.container) {
                Some(p.poll(groups))
            } else if let Some(b) = task.boxes.iter().find(|b| b.name == d.container) {
                match b.phase() {
                    Phase::Running(_) => Some(None),
                    Phase::Exited(code) => Some(Some(code)),
                    Phase::Failed(_) => Some(Some(Some(125))),
                    Phase::Pulling(_) | Phase::Starting => None,
                }
            } else {
                None
            };
        let healthy = || {
            task.checkers.iter().any(|c| {
                c.container == d.container
                    && c.verdict().status == tessera_model::service::TaskHealth::Healthy
            })
        };
        let met = match (d.condition, state) {
            (_, None) => Some(false),
            (DependencyCondition::Start, Some(_)) => Some(true),
            (DependencyCondition::Complete, Some(exit)) => Some(exit.is_some()),
            (DependencyCondition::Success, Some(Some(Some(0)))) => Some(true),
            (DependencyCondition::Success, Some(Some(_))) => None,
            (DependencyCondition::Success, Some(None)) => Some(false),
            (DependencyCondition::Healthy, Some(Some(_))) => None,
            (DependencyCondition::Healthy, Some(None)) => Some(healthy()),
        };
        match met {
            None => return None,
            Some(false) => all = false,
            Some(true) => {}
        }
    }
    Some(all)
}

impl Task {
    /// What its checks say: `unknown` while a container with a check has none running
    /// yet (it waits for a dependency, or the agent has just restarted), unless the state
    /// file kept a verdict for it.
    fn health(&self) -> Option<tessera_model::agent::HealthReport> {
        if self.checkers.is_empty()
            && let Some(kept) = &self.resumed_health
        {
            return Some(kept.clone());
        }
        if self.checkers.len() < self.checks_expected {
            return Some(tessera_model::agent::HealthReport {
                status: tessera_model::service::TaskHealth::Unknown,
                output: None,
            });
        }
        health::combined(&self.checkers)
    }

    /// SIGTERM to its processes; its containers are stopped with its stop timeout.
    fn terminate(&self) {
        for p in &self.procs {
            p.signal(Signal::SIGTERM);
        }
        for b in &self.boxes {
            b.stop(self.stop_timeout);
        }
    }

    /// SIGKILL to everything of it that is left: its process groups, and every process
    /// in its cgroup.
    fn kill(&self) {
        for p in &self.procs {
            p.signal(Signal::SIGKILL);
        }
        if let Some(c) = &self.cgroup {
            c.kill();
        }
        for b in &self.boxes {
            b.kill();
        }
    }
}

/// A task's log file that starts over (keeping one `.1` file) whenever it would exceed
/// its cap; opened on the first write. Readable by the agent and, with `group`, by the
/// task's own group; by no one else (0640).
pub(crate) struct CappedLog {
    path: PathBuf,
    cap: u64,
    file: Option<tokio::fs::File>,
    written: u64,
    group: Option<u32>,
}

impl CappedLog {
    pub(crate) fn new(path: PathBuf, cap: u64) -> CappedLog {
        CappedLog {
            path,
            cap: cap.max(1),
            file: None,
            written: 0,
            group: None,
        }
    }

    /// The file belongs to this group (its task's own gid) besides the agent.
    pub(crate) fn group(mut self, group: Option<u32>) -> CappedLog {
        self.group = group;
        self
    }

    async fn open(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let f = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(&self.path)
            .await?;
        // A file from before (an agent restart) gets the same rights.
        f.set_permissions(std::fs::Permissions::from_mode(0o640))
            .await?;
        if let Some(gid) = self.group {
            std::os::unix::fs::fchown(&f, None, Some(gid))?;
        }
        self.written = f.metadata().await.map_or(0, |m| m.len());
        self.file = Some(f);
        Ok(())
    }

    pub(crate) async fn write(&mut self, mut chunk: &[u8]) -> std::io::Result<()> {
        if self.file.is_none() {
            self.open().await?;
        }
        while !chunk.is_empty() {
            if self.written >= self.cap {
                self.flush().await;
                let _ = tokio::fs::rename(&self.path, self.path.with_extension("log.1")).await;
                self.open().await?;
            }
            let take = chunk.len().min((self.cap - self.written) as usize);
            let Some(file) = &mut self.file else {
                return Ok(());
            };
            file.write_all(&chunk[..take]).await?;
            self.written += take as u64;
            chunk = &chunk[take..];
        }
        Ok(())
    }

    pub(crate) async fn flush(&mut self) {
        if let Some(f) = &mut self.file {
            let _ = f.flush().await;
        }
    }
}

/// Copies a process's output to a capped log at `path`, in `group` (its task's own gid).
async fn copy_capped(
    mut from: impl AsyncRead + Unpin,
    path: PathBuf,
    cap: u64,
    group: Option<u32>,
) {
    let mut log = CappedLog::new(path, cap).group(group);
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if log.write(&buf[..n]).await.is_err() {
            return;
        }
    }
    log.flush().await;
}

/// The environment container `container` of `w` runs with: a few of the agent's own
/// variables, the task's (with its GPU and MPS limits), its id, and for MPS tasks the
/// daemon's pipe directory.
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
    if let (true, Some(pipe)) = (w.mps, pipe_dir) {
        env.insert("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.display().to_string());
    }
    env
}
