//! The state file, and the runtime opened over it: what it keeps per task (written
//! atomically, owner-only), and the processes and containers a previous run left running,
//! re-adopted.

use super::procfs::{agent_mark, boot_id, group_born, marked_processes};
use super::task::{Proc, Task};
use super::{DEFAULT_PIDS_MAX, Engine, PortAllocator, Runtime, RuntimeError, docker, health};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tessera_model::service::TaskPort;

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
    /// The MPS pipe directory it was given (its GPU's): the tasks of one GPU share a uid.
    #[serde(default)]
    mps_pipe: Option<PathBuf>,
}

impl Runtime {
    /// Opens the runtime over `state_dir`, re-adopting tasks a previous run left running.
    pub fn open(
        state_dir: &Path,
        log_cap: u64,
        mps_root: Option<PathBuf>,
    ) -> Result<Runtime, RuntimeError> {
        // `mps_root`: where each GPU's MPS daemon keeps its pipe directory.
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
            mps_root,
            simulated_gpus: None,
            engine: None,
            saved_timeouts: saved
                .tasks
                .iter()
                .map(|(id, t)| (id.clone(), Duration::from_secs(t.stop_timeout_secs.max(1))))
                .collect(),
            tasks: BTreeMap::new(),
            ended: BTreeMap::new(),
            heard: BTreeSet::new(),
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
            saved_pipes: saved
                .tasks
                .iter()
                .filter_map(|(id, t)| Some((id.clone(), t.mps_pipe.clone()?)))
                .collect(),
            task_uids: None,
            next_uid: saved.next_uid,
            cgroups: None,
            gpu_minors: HashMap::new(),
            dev_dir: PathBuf::from("/dev"),
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
        for (id, (mut pgids, env)) in adoptable {
            // A task given a uid of its own runs as that uid: a process of another uid that
            // carries its id (and the readable mark) is not the task's.
            if let Some(uid) = saved.tasks.get(&id).and_then(|t| t.uid) {
                pgids.retain(|&pgid| process_uid(pgid) == Some(uid));
                if pgids.is_empty() {
                    tracing::warn!(task = %id, uid, "not re-adopted: no process of its own uid carries its id");
                    continue;
                }
            }
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
                            pumps: Vec::new(),
                        })
                        .collect(),
                    boxes: Vec::new(),
                    error: None,
                    out_of_memory: None,
                    // An older agent's state file does not say: the pipe its processes were
                    // started with does (read once, then kept in the state file).
                    mps_pipe: kept
                        .and_then(|t| t.mps_pipe.clone())
                        .or_else(|| env.get("CUDA_MPS_PIPE_DIRECTORY").map(PathBuf::from)),
                    env,
                    stop_timeout,
                    ending: None,
                    ports,
                    checkers: Vec::new(),
                    wanted: None,
                    spec: None,
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
            let mps_pipe = self.saved_pipes.get(&task_id).cloned();
            self.tasks
                .entry(task_id)
                .or_insert_with(|| Task {
                    procs: Vec::new(),
                    boxes: Vec::new(),
                    error: None,
                    out_of_memory: None,
                    mps_pipe: mps_pipe.clone(),
                    env: BTreeMap::new(),
                    stop_timeout,
                    ending: None,
                    ports: Vec::new(),
                    checkers: Vec::new(),
                    wanted: None,
                    spec: None,
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

    pub(super) fn save(&self) {
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
                            mps_pipe: t.mps_pipe.clone(),
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
}

/// The uid a process runs as (the owner of its `/proc` entry).
fn process_uid(pid: i32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}
