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

pub mod docker;
mod health;
mod ports;
mod procfs;
#[cfg(test)]
mod tests;
pub(crate) mod work;

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
use tessera_model::agent::{TaskReport, WantedTask};
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
}

/// What the state file keeps per task.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Saved {
    tasks: BTreeMap<String, SavedTask>,
    /// The kernel's boot id when it was written: after a reboot nothing is re-adopted.
    #[serde(default)]
    boot_id: Option<String>,
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
}

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
            let logs = self.log_files(&task_id, &name);
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

    fn log_files(&self, task_id: &str, container: &str) -> docker::LogFiles {
        let dir = self.dir.join(task_id);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::error!(task = %task_id, error = %e, "cannot create the task's log directory");
        }
        docker::LogFiles {
            out: dir.join(format!("{container}.log")),
            err: dir.join(format!("{container}.err.log")),
            cap: self.log_cap,
        }
    }

    /// Tasks run as this user and group (the agent must be root to switch), from `/` so
    /// that they need no access to the agent's directories.
    pub fn run_as(mut self, uid: u32, gid: u32) -> Self {
        self.run_as = Some((uid, gid));
        self
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
                        let boxed = t.boxes.iter().find(|b| b.name == w.containers[i].name);
                        self.checker(w, i, &t.ports, boxed, resumed.clone())
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
    /// port, or the command as the task's user in its environment).
    fn checker(
        &self,
        w: &WantedTask,
        i: usize,
        ports: &[TaskPort],
        boxed: Option<&docker::Boxed>,
        resumed: Option<health::Verdict>,
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
                run_as: self.run_as,
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
        if let Err(e) = std::fs::create_dir_all(&task_dir) {
            tracing::error!(task = %w.task_id, error = %e, "cannot create the task's log directory");
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
        };
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
            };
            let logs = self.log_files(&w.task_id, &c.name);
            let boxed = docker::Boxed::launch(engine, launch, logs);
            if let Some(checker) = self.checker(w, i, &task.ports, Some(&boxed), None) {
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
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid).current_dir("/");
        }
        match cmd.spawn() {
            Ok(mut child) => {
                let pgid = child.id().map_or(0, |p| p as i32);
                let log = task_dir.join(format!("{}.log", c.name));
                if let Some(out) = child.stdout.take() {
                    tokio::spawn(copy_capped(out, log.clone(), self.log_cap));
                }
                if let Some(err) = child.stderr.take() {
                    tokio::spawn(copy_capped(
                        err,
                        task_dir.join(format!("{}.err.log", c.name)),
                        self.log_cap,
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
                if let Some(checker) = self.checker(w, i, &task.ports, None, None) {
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
                if all_done {
                    gone.push((id.clone(), ending, t.error.clone()));
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
            }
            if let Ending::Exited(code) = ending {
                self.ended.insert(id, (code, error));
            }
        }
        self.save();
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
            .map(|(id, t)| TaskProcesses {
                task_id: id.clone(),
                pids: t
                    .procs
                    .iter()
                    .map(|p| p.pgid as u32)
                    .chain(t.boxes.iter().filter_map(|b| match b.phase() {
                        Phase::Running(pid) => pid,
                        _ => None,
                    }))
                    .collect(),
                env: t.env.clone(),
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

    /// SIGKILL to everything of it that is left.
    fn kill(&self) {
        for p in &self.procs {
            p.signal(Signal::SIGKILL);
        }
        for b in &self.boxes {
            b.kill();
        }
    }
}

/// A task's log file that starts over (keeping one `.1` file) whenever it would exceed
/// its cap; opened on the first write.
pub(crate) struct CappedLog {
    path: PathBuf,
    cap: u64,
    file: Option<tokio::fs::File>,
    written: u64,
}

impl CappedLog {
    pub(crate) fn new(path: PathBuf, cap: u64) -> CappedLog {
        CappedLog {
            path,
            cap: cap.max(1),
            file: None,
            written: 0,
        }
    }

    async fn open(&mut self) -> std::io::Result<()> {
        let f = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .await?;
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

/// Copies a process's output to a capped log at `path`.
async fn copy_capped(mut from: impl AsyncRead + Unpin, path: PathBuf, cap: u64) {
    let mut log = CappedLog::new(path, cap);
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
