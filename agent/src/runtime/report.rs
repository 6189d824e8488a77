//! What the runtime tells: task reports for the server, the work targets to scrape, and
//! running tasks' processes for measuring.

use super::docker::{self, Phase};
use super::procfs::{self, group_born};
use super::task::{Ending, Task};
use super::{Ended, Runtime, TaskProcesses, cgroup, oom, work};
use std::collections::{BTreeMap, BTreeSet};
use tessera_model::agent::TaskReport;

impl Runtime {
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
            .filter(|(_, t)| {
                matches!(t.ending, None | Some((Ending::Requested, _))) || t.finishing_output()
            })
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
            .filter(|(id, t)| !self.heard.contains(*id) && !t.finishing_output())
            .filter_map(|(id, t)| match t.ending {
                Some((Ending::Exited(code), _)) => Some((
                    id.clone(),
                    Ended {
                        code,
                        error: t.error.clone(),
                        out_of_memory: t.out_of_memory.clone(),
                    },
                )),
                _ => None,
            })
            .chain(self.ended.iter().map(|(id, e)| (id.clone(), e.clone())))
            .map(|(task_id, e)| TaskReport {
                exit_code: e.code,
                error: e.error,
                out_of_memory: e.out_of_memory.as_ref().and_then(oom::Evidence::why),
                // Read when reported, not when it exited: by the next sync its output has
                // been copied to its log files whole.
                last_output: self.last_lines(&task_id),
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
        let live = |t: &Task| -> Vec<i32> {
            // Its live process groups only, each still led by the process it started (a
            // group id is reused once the group is gone: another task's process may hold
            // the number now, and must not be measured as this task's).
            t.procs
                .iter()
                .filter(|p| p.exit.is_none() && p.born.is_some() && group_born(p.pgid) == p.born)
                .map(|p| p.pgid)
                .collect()
        };
        let mains = |t: &Task| -> Vec<u32> {
            t.boxes
                .iter()
                .filter_map(|b| match b.phase() {
                    Phase::Running(pid) => pid,
                    _ => None,
                })
                .collect()
        };
        let running = || self.tasks.iter().filter(|(_, t)| t.ending.is_none());
        // Every process of those groups and of each container's cgroup, in one pass
        // over /proc: a worker a task's process started counts as the task's.
        let groups: BTreeSet<i32> = running().flat_map(|(_, t)| live(t)).collect();
        let container_cgroups: BTreeMap<u32, String> = running()
            .flat_map(|(_, t)| mains(t))
            .filter_map(|pid| Some((pid, procfs::cgroup_of(pid)?)))
            .collect();
        let members = procfs::members(&groups, &container_cgroups.values().cloned().collect());
        running()
            .map(|(id, t)| {
                let mut pids: Vec<u32> = Vec::new();
                for g in live(t) {
                    pids.push(g as u32);
                    pids.extend(members.groups.get(&g).into_iter().flatten());
                }
                for main in mains(t) {
                    pids.push(main);
                    let inside = container_cgroups
                        .get(&main)
                        .and_then(|c| members.cgroups.get(c));
                    pids.extend(inside.into_iter().flatten());
                }
                // Then every other process of its cgroup: a GPU process one of its
                // processes started is the task's, wherever it moved.
                pids.extend(t.cgroup.iter().flat_map(cgroup::TaskCgroup::pids));
                // Each once, its first process first (what a simulated GPU keys on).
                let mut seen = BTreeSet::new();
                pids.retain(|p| seen.insert(*p));
                TaskProcesses {
                    task_id: id.clone(),
                    pids,
                    env: t.env.clone(),
                }
            })
            .collect()
    }

    /// Tasks reported running: not ending, or exited with their output still being copied.
    pub fn running_count(&self) -> usize {
        self.tasks
            .values()
            .filter(|t| t.ending.is_none() || t.finishing_output())
            .count()
    }
}
