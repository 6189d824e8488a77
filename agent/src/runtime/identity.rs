//! Who a task runs as and where: its uid (`--task-uids`, shared by the MPS tasks of one GPU), its
//! directory and log files, and the confinement its processes (and their health checks)
//! start in: user, working directory, cgroup.

use super::confine::{self, Confinement};
use super::task::Task;
use super::{Runtime, WORK_DIR, cgroup, docker};
use std::collections::BTreeSet;
use std::path::PathBuf;
use tessera_model::agent::{WantedContainer, WantedTask};

impl Runtime {
    pub(super) fn log_files(
        &self,
        task_id: &str,
        container: &str,
        uid: Option<u32>,
    ) -> docker::LogFiles {
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
    pub(super) fn make_task_dir(&self, task_id: &str, uid: Option<u32>) -> std::io::Result<()> {
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

    /// The uid MPS task `w` runs as: its GPU's. MPS serves one Linux user at a time per
    /// daemon (nvidia-cuda-mps-control(1): a client of another user waits until every
    /// client of the running server is done), so the tasks of one GPU share a uid: the one
    /// a task of that GPU already has (running or ending, re-adopted ones included), else
    /// a fresh one of the range. Tasks of different GPUs never share one: they cannot read
    /// each other's environment or signal each other, and each GPU's pipe directory is its
    /// uid's alone ([`Runtime::own_pipe`]), so no task reaches another GPU's MPS server.
    pub(super) fn mps_uid(&mut self, w: &WantedTask) -> Result<Option<u32>, String> {
        if self.task_uids.is_none() {
            return Ok(None);
        }
        let pipe = self
            .mps_root
            .as_deref()
            .and_then(|root| super::task_pipe(root, w));
        let shared = pipe.as_ref().and_then(|pipe| {
            self.tasks
                .values()
                .filter(|t| t.mps_pipe.as_ref() == Some(pipe))
                .find_map(|t| t.uid)
        });
        match shared {
            Some(uid) => Ok(Some(uid)),
            None => self.allocate_uid(),
        }
    }

    /// Makes MPS task `w`'s pipe directory (its GPU's) the user's its tasks run as, alone
    /// (0700): its GPU's uid, else `--run-as`'s (tasks of the agent's own uid need
    /// nothing). A GPU's daemon makes the directory closed; tasks of other GPUs, of other
    /// uids, never reach this GPU's MPS server. Nothing to do before the daemon made it.
    pub(super) fn own_pipe(&self, w: &WantedTask, uid: Option<u32>) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let owner = uid.or(self.run_as.map(|(u, _)| u));
        let (Some(owner), Some(root)) = (owner, self.mps_root.as_deref()) else {
            return Ok(());
        };
        let Some(pipe) = super::task_pipe(root, w).filter(|p| p.is_dir()) else {
            return Ok(());
        };
        std::os::unix::fs::lchown(&pipe, Some(owner), Some(owner))
            .and_then(|()| std::fs::set_permissions(&pipe, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| {
                format!(
                    "cannot give the MPS pipe directory {} to uid {owner}: {e}",
                    pipe.display()
                )
            })
    }

    /// A uid of the range that no task of this agent has and that no account or group of
    /// this host has: the next after the last one handed out (wrapping around).
    pub(super) fn allocate_uid(&mut self) -> Result<Option<u32>, String> {
        let Some((first, last)) = self.task_uids else {
            return Ok(None);
        };
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
    pub(super) fn not_a_task_uid(&self, spec: &str, ids: &[u32]) -> Result<(), String> {
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
    pub(super) fn confinement(
        &self,
        w: &WantedTask,
        i: usize,
        task: &mut Task,
    ) -> Result<Confinement, String> {
        let c = &w.containers[i];
        let mut confine = self.identity(c, &w.task_id, task.uid)?;
        if let Some(cgroups) = &self.cgroups {
            if task.cgroup.is_none() {
                let made = cgroups.create(&w.task_id, self.pids_max)?;
                // Before its containers' cgroups are made: they inherit it.
                if let Err(why) = made.deny_devices(&self.denied_devices(w)) {
                    let _ = made.remove();
                    return Err(format!("cannot keep the task to its own GPUs: {why}"));
                }
                task.cgroup = Some(made);
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
    pub(super) fn readopted_confinement(
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
}
