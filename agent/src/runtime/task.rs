//! One task as the runtime holds it: its processes (each a process group, known by its
//! leader's start time), its containers under Docker, why it is ending; and how each is
//! polled and signalled.

use super::procfs::{Group, Groups, proc_stat};
use super::{cgroup, docker, health};
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tessera_model::agent::WantedTask;
use tessera_model::service::TaskPort;
use tokio::process::Child;

/// One process of a task.
pub(super) struct Proc {
    pub(super) name: String,
    /// Whether its exit ends the task.
    pub(super) essential: bool,
    pub(super) pgid: i32,
    /// `None` for a process adopted after an agent restart (not our child).
    pub(super) child: Option<Child>,
    pub(super) exit: Option<Option<i32>>,
    /// When the group's leader started (`None`: it was already gone when this agent
    /// took the group). A group id is reused only once the group is empty, by a new
    /// leader started later: one whose start differs is a stranger's, never signalled.
    pub(super) born: Option<u64>,
    /// The copies of its output to its log files: done once they read to the end (the
    /// task's last lines are read from the files after).
    pub(super) pumps: Vec<tokio::task::JoinHandle<()>>,
}

impl Proc {
    /// Exit status if it has exited: `Some(code)`; `Some(None)` when the code is unknown.
    /// For an adopted process (not our child) that is when its group is empty.
    pub(super) fn poll(&mut self, groups: &Groups) -> Option<Option<i32>> {
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
    pub(super) fn finished(&mut self, groups: &Groups) -> bool {
        self.poll(groups).is_some() && !self.alive_in(groups)
    }

    /// Whether everything it wrote is in its log files.
    pub(super) fn output_copied(&self) -> bool {
        self.pumps.iter().all(tokio::task::JoinHandle::is_finished)
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
pub(super) enum Ending {
    /// The server no longer wants it.
    Requested,
    /// A container exited on its own with this code.
    Exited(Option<i32>),
}

pub(super) struct Task {
    pub(super) procs: Vec<Proc>,
    /// Containers with an image, under the Docker engine.
    pub(super) boxes: Vec<docker::Boxed>,
    /// Why it could not start (a refused pull, an engine's error).
    pub(super) error: Option<String>,
    /// The MPS pipe directory it was given (its GPU's): tasks of one GPU share a uid.
    pub(super) mps_pipe: Option<std::path::PathBuf>,
    /// Whether its essential container that failed ran out of memory.
    pub(super) out_of_memory: Option<super::oom::Evidence>,
    /// Environment of its first GPU container, for measuring use.
    pub(super) env: BTreeMap<String, String>,
    pub(super) stop_timeout: Duration,
    /// Set once it is being stopped: why, and when SIGKILL follows SIGTERM.
    pub(super) ending: Option<(Ending, Instant)>,
    /// Its ports and the host ports they are bound to.
    pub(super) ports: Vec<TaskPort>,
    /// Its containers' health checks, running.
    pub(super) checkers: Vec<health::Checker>,
    /// What the server asked for, while some containers wait for others (`depends_on`).
    pub(super) wanted: Option<WantedTask>,
    /// What the server last said it runs (for commands run in it: its environment, its
    /// containers); learnt again from every answer, so a re-adopted task has it too.
    pub(super) spec: Option<WantedTask>,
    /// Containers not started yet, by index, waiting for their dependencies.
    pub(super) waiting: Vec<usize>,
    /// Names of its containers that are not essential: their exit does not end it.
    pub(super) optional: BTreeSet<String>,
    /// The verdict the state file kept, for a re-adopted task until its checks run again.
    pub(super) resumed_health: Option<tessera_model::agent::HealthReport>,
    /// How many of its containers have a health check: until each has a checker running,
    /// the task is not healthy, whatever the ones running say.
    pub(super) checks_expected: usize,
    /// Where its application publishes its work (learnt again from the server's answer
    /// after a restart).
    pub(super) work: Option<tessera_model::work::WorkSpec>,
    /// Its own uid (and gid), from `--task-uids`.
    pub(super) uid: Option<u32>,
    /// Its cgroup, once one of its containers runs as a process.
    pub(super) cgroup: Option<cgroup::TaskCgroup>,
}

impl Task {
    /// Exited on its own, with its output still being copied to its files (for at most
    /// its stop timeout): reported as still running until then, so that the report of its
    /// end, the one the server keeps, carries its last lines whole.
    pub(super) fn finishing_output(&self) -> bool {
        matches!(self.ending, Some((Ending::Exited(_), deadline)) if std::time::Instant::now() < deadline)
            && !self.procs.iter().all(Proc::output_copied)
    }

    /// What its checks say: `unknown` while a container with a check has none running
    /// yet (it waits for a dependency, or the agent has just restarted), unless the state
    /// file kept a verdict for it.
    pub(super) fn health(&self) -> Option<tessera_model::agent::HealthReport> {
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
    pub(super) fn terminate(&self) {
        for p in &self.procs {
            p.signal(Signal::SIGTERM);
        }
        for b in &self.boxes {
            b.stop(self.stop_timeout);
        }
    }

    /// SIGKILL to everything of it that is left: its process groups, and every process
    /// in its cgroup.
    pub(super) fn kill(&self) {
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
