//! What the runtime tells: task reports for the server, the work targets to scrape, and
//! running tasks' processes for measuring.

use super::docker::{self, Phase};
use super::procfs::group_born;
use super::task::Ending;
use super::{Ended, Runtime, TaskProcesses, cgroup, oom, work};
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
                // Its live process groups only, each still led by the process it started
                // (a group id is reused once the group is gone: another task's process
                // may hold the number now, and must not be measured as this task's).
                let mut pids: Vec<u32> = t
                    .procs
                    .iter()
                    .filter(|p| {
                        p.exit.is_none() && p.born.is_some() && group_born(p.pgid) == p.born
                    })
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

    pub fn running_count(&self) -> usize {
        self.tasks.values().filter(|t| t.ending.is_none()).count()
    }
}
