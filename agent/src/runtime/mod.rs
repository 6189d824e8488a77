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
mod procfs;
#[cfg(test)]
mod tests;

use docker::Phase;
pub use docker::{Engine, default_socket};

use procfs::*;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tessera_model::agent::{TaskReport, WantedTask};
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
    /// Runs containers that have an image; without it they are refused.
    engine: Option<Engine>,
    /// Stop timeouts the state file kept, for containers re-adopted once the engine is
    /// attached.
    saved_timeouts: BTreeMap<String, Duration>,
    tasks: BTreeMap<String, Task>,
    /// Tasks that exited on their own, with their code and why they could not start,
    /// until the server has heard.
    ended: BTreeMap<String, (Option<i32>, Option<String>)>,
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
            engine: None,
            saved_timeouts: saved
                .tasks
                .iter()
                .map(|(id, t)| (id.clone(), Duration::from_secs(t.stop_timeout_secs.max(1))))
                .collect(),
            tasks: BTreeMap::new(),
            ended: BTreeMap::new(),
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
            runtime.tasks.insert(
                id,
                Task {
                    procs: pgids
                        .into_iter()
                        .map(|pgid| Proc {
                            name: String::from("adopted"),
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
                })
                .boxes
                .push(boxed);
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
        for w in wanted {
            if !self.tasks.contains_key(&w.task_id) && !self.ended.contains_key(&w.task_id) {
                self.start(w);
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

    fn start(&mut self, w: &WantedTask) {
        let task_dir = self.dir.join(&w.task_id);
        if let Err(e) = std::fs::create_dir_all(&task_dir) {
            tracing::error!(task = %w.task_id, error = %e, "cannot create the task's log directory");
        }
        let mut procs = Vec::new();
        let mut boxes = Vec::new();
        let mut failed = None;
        for (i, c) in w.containers.iter().enumerate() {
            if let (Some(image), Some(engine)) = (&c.image, &self.engine) {
                let entry = c.entry_point_words.min(c.command.len());
                let launch = docker::Launch {
                    task_id: w.task_id.clone(),
                    name: c.name.clone(),
                    image: image.clone(),
                    entry_point: c.command[..entry].to_vec(),
                    command: c.command[entry..].to_vec(),
                    env: container_environment(w, i, self.mps_pipe_dir.as_deref()),
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
                };
                let logs = self.log_files(&w.task_id, &c.name);
                boxes.push(docker::Boxed::launch(engine, launch, logs));
                continue;
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
                failed = Some(127);
                break;
            }
            let Some((program, args)) = c.command.split_first() else {
                continue;
            };
            let mut cmd = Command::new(program);
            cmd.args(args)
                .env_clear()
                .envs(task_environment(w, i, self.mps_pipe_dir.as_deref()))
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
                    procs.push(Proc {
                        name: c.name.clone(),
                        pgid,
                        child: Some(child),
                        exit: None,
                        born: group_born(pgid),
                    });
                }
                Err(e) => {
                    tracing::warn!(task = %w.task_id, container = %c.name, error = %e, "cannot start a container");
                    let _ = std::fs::write(
                        task_dir.join(format!("{}.err.log", c.name)),
                        format!("cannot start {program:?}: {e}\n"),
                    );
                    failed = Some(127);
                    break;
                }
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
            procs,
            boxes,
            error: None,
            env,
            stop_timeout,
            ending: None,
        };
        if let Some(code) = failed {
            task.kill();
            for b in &task.boxes {
                b.stop(Duration::from_secs(1));
            }
            task.ending = Some((Ending::Exited(Some(code)), Instant::now()));
        } else {
            tracing::info!(task = %w.task_id, processes = task.procs.len(), containers = task.boxes.len(), "task started");
        }
        self.tasks.insert(w.task_id.clone(), task);
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
        for (id, t) in &mut self.tasks {
            let mut first_exit = None;
            let mut all_done = true;
            for p in &mut t.procs {
                if let Some(code) = p.poll(&groups)
                    && first_exit.is_none()
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
                    Phase::Exited(code) if first_exit.is_none() => {
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
            self.tasks.remove(&id);
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
        let running = self
            .tasks
            .iter()
            .filter(|(_, t)| t.ending.is_none())
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

impl Task {
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
