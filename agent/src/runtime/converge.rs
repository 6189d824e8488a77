//! Converging on what the server wants: starting what is missing and stopping what is not
//! wanted; polling for exits, finishing stops (SIGKILL after the timeout), and forgetting
//! tasks once nothing of them is left.

use super::docker::Phase;
use super::procfs::{Groups, live_groups};
use super::task::Ending;
use super::{CGROUP_REMOVAL, Ended, Runtime, health, oom};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tessera_model::agent::WantedTask;
use tessera_model::taskdef::Protocol;

impl Runtime {
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
                // What a command run in it starts with (its environment, its user).
                t.spec = Some(w.clone());
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
        // Ended tasks the server no longer lists have been heard of, those still finishing
        // too.
        self.ended.retain(|id, _| ids.contains(id.as_str()));
        for (id, t) in &self.tasks {
            if matches!(t.ending, Some((Ending::Exited(_), _))) && !ids.contains(id.as_str()) {
                self.heard.insert(id.clone());
            }
        }
        self.save();
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
            let mut copied = true;
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
                copied &= p.output_copied();
            }
            // Whether the kernel killed the container that ended the task, where the engine
            // says (a process's cgroup is read below).
            let mut engine_oom = None;
            for b in &t.boxes {
                let phase = b.phase();
                match &phase {
                    Phase::Exited(code)
                        if first_exit.is_none() && !t.optional.contains(&b.name) =>
                    {
                        first_exit = Some((b.name.clone(), *code));
                        engine_oom = Some(b.oom_killed());
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
                // Read now: its cgroup goes with it.
                if *code != Some(0) {
                    let kernel = match engine_oom {
                        // The engine does not say at which limit.
                        Some(killed) => killed.then_some(None),
                        None => t.cgroup.as_ref().and_then(|c| c.oom_killed(name)),
                    };
                    if kernel.is_some() {
                        tracing::warn!(task = %id, container = %name, "killed by the kernel's OOM killer at its memory limit");
                    }
                    t.out_of_memory = Some(oom::Evidence {
                        container: name.clone(),
                        kernel,
                        err_log: self.dir.join(id).join(format!("{name}.err.log")),
                    });
                }
                tracing::info!(task = %id, container = %name, ?code, "container exited; stopping the task");
                t.terminate();
                t.ending = Some((Ending::Exited(*code), now + t.stop_timeout));
            }
            if let Some((ending, deadline)) = t.ending {
                // Processes that left its process groups (`setsid`, double forks) are
                // still in its cgroup.
                let escaped = t.cgroup.as_ref().is_some_and(|c| !c.is_empty());
                // Its last lines are read from its files once it is gone: the copies of
                // its output reach the end first (not waited for past its deadline).
                if all_done && !escaped && (copied || now >= deadline) {
                    gone.push((id.clone(), ending, t.error.clone(), t.out_of_memory.clone()));
                } else if all_done && escaped {
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
        for (id, ending, error, out_of_memory) in gone {
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
            if self.heard.remove(&id) {
                continue;
            }
            if let Ending::Exited(code) = ending {
                self.ended.insert(
                    id,
                    Ended {
                        code,
                        error,
                        out_of_memory,
                    },
                );
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
