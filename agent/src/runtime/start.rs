//! Starting a task: its ports, then each container as a process (confined, its output to
//! capped logs) or under Docker, with its health check; containers that wait for others
//! (`depends_on`) start once what they wait for is reached.

use super::confine::Confinement;
use super::docker::{self, Phase};
use super::logs::copy_capped;
use super::procfs::{Groups, group_born};
use super::task::{Ending, Proc, Task};
use super::{
    AGENT_MARK, Runtime, SIMULATED_GPU_DIR, container_environment, health, port_environment,
    task_environment,
};
use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tessera_model::agent::WantedTask;
use tessera_model::service::TaskPort;
use tessera_model::taskdef::{DependencyCondition, Protocol};
use tokio::process::Command;

impl Runtime {
    /// The health checker of container `i` of `w`, if it has a check: Docker's own for a
    /// command check of a container with an image, else the agent's (HTTP on its host
    /// port, or the command confined as the container is: its user, its cgroup, in its
    /// environment; none without `confine`).
    pub(super) fn checker(
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
            let mut env = task_environment(w, i, self.mps_root.as_deref());
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

    pub(super) fn start(&mut self, w: &WantedTask, fixed: &BTreeSet<(u16, Protocol)>) {
        let task_dir = self.dir.join(&w.task_id);
        let allocated = if w.mps {
            // Its GPU's uid, and its GPU's pipe directory that uid's alone.
            self.mps_uid(w)
                .and_then(|uid| self.own_pipe(w, uid).map(|()| uid))
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
            out_of_memory: None,
            mps_pipe: self
                .mps_root
                .as_deref()
                .and_then(|root| super::task_pipe(root, w)),
            env,
            stop_timeout,
            ending: None,
            ports: Vec::new(),
            checkers: Vec::new(),
            wanted: None,
            spec: Some(w.clone()),
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
            let mut env = container_environment(w, i, self.mps_root.as_deref());
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
                mps_pipe_dir: self
                    .mps_root
                    .as_deref()
                    .and_then(|root| super::task_pipe(root, w)),
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
            .envs(task_environment(w, i, self.mps_root.as_deref()))
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
                let mut pumps = Vec::new();
                if let Some(out) = child.stdout.take() {
                    pumps.push(tokio::spawn(copy_capped(
                        out,
                        log.clone(),
                        self.log_cap,
                        task.uid,
                    )));
                }
                if let Some(err) = child.stderr.take() {
                    pumps.push(tokio::spawn(copy_capped(
                        err,
                        task_dir.join(format!("{}.err.log", c.name)),
                        self.log_cap,
                        task.uid,
                    )));
                }
                task.procs.push(Proc {
                    name: c.name.clone(),
                    essential: c.essential,
                    pgid,
                    child: Some(child),
                    exit: None,
                    born: group_born(pgid),
                    pumps,
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

    /// Starts the waiting containers whose dependencies are met; ends a task one of whose
    /// containers can never start (what it waits for exited, or failed where it had to
    /// succeed).
    pub(super) fn start_waiting(&mut self, groups: &Groups) {
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
