//! The agent API, server side: registration with the join token, and sync, which records
//! what an agent reports (GPUs, MPS health, its tasks and their measured use) and answers
//! with every task its host should run, environment included.

pub mod admission;
mod budget;
mod gateway;
pub mod usage;
mod work;

use crate::clock::stamp;
use crate::error::ControlError;
use crate::lifecycle;
use crate::parts::Core;
use crate::scheduler::Scheduler;
use crate::store::AgentStore;
use crate::store::{HostReport, TaskFilter};
use gateway::Gateway;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tessera_model::agent::{
    SecretEnv, SyncRequest, SyncResponse, TaskReport, WantedContainer, WantedTask,
};
use tessera_model::bounds::{Dropped, Owner};
use tessera_model::notify::NoticeKind;
use tessera_model::service::{Measured, StopReason, Task, TaskState};
use tessera_model::taskdef::{GpuRequirement, TaskDefinitionSpec};
use tessera_model::{GpuBudget, GpuHealth, GpuInfo, HostId, MiB};

/// The version an agent said (`None`: it said none, an agent before 0.2), if this server
/// serves it: an unreadable one is invalid input, one out of the compatibility policy a
/// conflict naming both versions and what to upgrade. Checked before anything is written.
pub(crate) fn served_agent(
    said: Option<&str>,
) -> Result<Option<tessera_model::version::Version>, ControlError> {
    use tessera_model::version::{Version, serves_agent};
    let agent = said
        .map(|s| s.parse::<Version>())
        .transpose()
        .map_err(|e| ControlError::invalid("agent_version", e))?;
    serves_agent(Version::current(), agent).map_err(ControlError::Conflict)?;
    Ok(agent)
}

/// SHA-256 of a token, hex; only hashes are stored.
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// 256 random bits as hex.
pub fn new_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The environment of each container of a task placed with `allocations`.
pub fn container_env(spec: &TaskDefinitionSpec, task: &Task) -> Vec<WantedContainer> {
    let mut whole_gpus = task.allocations.iter().filter(|a| a.dedicated);
    let shared = task.allocations.iter().find(|a| !a.dedicated);
    spec.containers
        .iter()
        .map(|c| {
            let mut env: BTreeMap<String, String> = c.env.clone();
            match c.gpu {
                Some(GpuRequirement::Gpus(n)) => {
                    let ids: Vec<String> = whole_gpus
                        .by_ref()
                        .take(n as usize)
                        .map(|a| a.gpu.to_string())
                        .collect();
                    env.insert("CUDA_VISIBLE_DEVICES".into(), ids.join(","));
                }
                Some(GpuRequirement::Mps {
                    memory_mib,
                    max_compute_percent,
                }) => {
                    if let Some(a) = shared {
                        env.insert("CUDA_VISIBLE_DEVICES".into(), a.gpu.to_string());
                    }
                    // Device 0 is the one GPU CUDA_VISIBLE_DEVICES leaves visible.
                    env.insert(
                        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
                        format!("0={}M", memory_mib.0),
                    );
                    if let Some(p) = max_compute_percent {
                        env.insert(
                            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
                            p.get().to_string(),
                        );
                    }
                }
                None => {
                    // No GPU asked for: none visible.
                    env.insert("CUDA_VISIBLE_DEVICES".into(), String::new());
                }
            }
            WantedContainer {
                name: c.name.clone(),
                ports: c.ports.clone(),
                security: c.security(),
                health_check: c.health_check.clone(),
                essential: c.essential,
                depends_on: c.depends_on.clone(),
                image: c.image.clone(),
                command: c.argv(),
                entry_point_words: c.entry_point.len(),
                cpu_milli: c.cpu_milli.0,
                memory_mib: c.memory_mib.0,
                // ECS: `memoryReservation` alone is a soft limit; `memory` a hard one.
                memory_soft: !c.ecs.contains_key("memory")
                    && c.ecs.contains_key("memoryReservation"),
                env,
                // The one place a secret's value leaves the control plane: the sync answer
                // to the agent of the host that runs the task.
                secrets: SecretEnv(
                    c.secrets
                        .iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.expose()?.to_owned())))
                        .collect(),
                ),
            }
        })
        .collect()
}

/// Agent sync: hosts joining (join tokens, registration, approval), their syncs (reports
/// judged item by item, GPUs, status, tasks' states and serving, the answer naming what
/// each host should run), what syncs leave to write (heartbeats, measured use, work) and
/// hosts' credentials. Its code: this file, `admission` (joining), `usage` (measured
/// use) and `work` (work figures).
#[derive(Clone)]
pub struct AgentSync {
    store: Arc<dyn AgentStore>,
    core: Core,
    /// Told when a sync changes capacity; asked for revisions' specs.
    scheduler: Scheduler,
    /// What syncs received here leave behind (see [`Gateway`]).
    gateway: Arc<Gateway>,
}

impl AgentSync {
    pub(crate) fn new(store: Arc<dyn AgentStore>, core: Core, scheduler: Scheduler) -> AgentSync {
        AgentSync {
            store,
            core,
            scheduler,
            gateway: Arc::default(),
        }
    }

    /// The same component writing through `store` (a pass's fenced store).
    pub(crate) fn with_store(
        &self,
        store: Arc<dyn AgentStore>,
        core: Core,
        scheduler: Scheduler,
    ) -> AgentSync {
        AgentSync {
            store,
            core,
            scheduler,
            gateway: self.gateway.clone(),
        }
    }
}

impl AgentSync {
    /// The host an agent token belongs to. Tokens found are remembered for a short while
    /// (a fleet's syncs then cost no lookup each); a token not remembered is looked up with
    /// at most a few other lookups at once, so clients sending made-up tokens cannot drive
    /// the database (they get `Busy` instead, as the honest agents they crowd out would,
    /// briefly, after a restart).
    pub async fn authenticate_agent(&self, token: &str) -> Result<HostId, ControlError> {
        let hash = hash_token(token);
        if let Some(host) = self.gateway.tokens.get(&hash) {
            return Ok(host);
        }
        let turn = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            self.gateway.token_lookups.acquire(),
        )
        .await;
        let Ok(Ok(_turn)) = turn else {
            return Err(ControlError::Busy {
                retry_after: 1,
                what: "agent token checks".into(),
            });
        };
        let host = self
            .store
            .host_by_token_hash(&hash)
            .await?
            .ok_or_else(|| ControlError::Unauthorized("unknown agent token".into()))?;
        self.gateway.tokens.insert(hash, host.clone());
        Ok(host)
    }

    /// Forgets the agent tokens remembered: one was revoked or its host deleted.
    pub(crate) fn forget_agent_tokens(&self) {
        self.gateway.tokens.clear();
    }

    /// Records that task `t` ended without being asked to (it exited, or vanished from its
    /// host), with an event that says why.
    async fn task_ended(
        &self,
        t: &Task,
        host_id: &HostId,
        reason: &StopReason,
        exit_code: Option<i32>,
        failed: bool,
    ) -> Result<(), ControlError> {
        self.store
            .mark_task_stopped(&t.id, reason, exit_code, failed)
            .await?;
        self.core
            .event(
                Some(&t.service),
                Some(host_id),
                &format!("task {} stopped: {reason}", t.id),
            )
            .await;
        Ok(())
    }

    /// `POST /agent/v1/sync` for `host` (already authenticated).
    ///
    /// A fleet syncs thousands of times a second, so a sync that changes nothing costs a
    /// handful of statements: the host and its tasks are read once (the answer is built
    /// from the same read), and only the time is written. A report that changes GPUs or
    /// measured use takes the full write transaction.
    pub async fn sync_agent(
        &self,
        host_id: &HostId,
        req: &SyncRequest,
    ) -> Result<SyncResponse, ControlError> {
        // An agent this server does not serve is refused before anything is taken.
        let agent_version = served_agent(req.agent_version.as_deref())?;
        // Judged item by item: what breaks a bound is dropped or cut and recorded on its
        // owner; the rest (the host's liveness above all) is taken.
        let mut req = req.clone();
        let dropped = req.sanitize();
        let host = self.store.get_host(host_id).await?;
        if !dropped.is_empty() {
            keep_stored_gpus(&mut req.gpus, &host.gpus, &dropped);
        }
        self.judge_inventory(&host, &mut req.gpus).await?;
        let req = &req;
        // What holds capacity on the host, with its allocations: what the report is checked
        // against, and (as it stands after the report) what the answer names.
        let mut mine = self.held_on(host_id).await?;
        if !dropped.is_empty() {
            self.record_dropped(host_id, &mine, &dropped).await;
        }
        self.record_reports(&mine, &req.tasks);
        self.record_work(&mine, &req.tasks);
        // Something to reconcile. Capacity changes (a GPU, the host's status, a task gone)
        // are also told at once to the scheduler, whose cached engine is then rebuilt.
        let mut changed = self.take_host_report(&host, req, &mut mine).await?;
        changed |= self.take_network(&host, req).await?;
        self.take_capabilities(&host, req).await?;
        self.take_agent_version(&host, agent_version).await?;
        changed |= self.take_status(&host, lifecycle::problem(req)).await?;
        changed |= self.take_task_reports(host_id, req, &mut mine).await?;
        if changed {
            self.core.wake();
        }
        Ok(SyncResponse {
            host_id: host_id.clone(),
            tasks: self.wanted_on(&host, &mine).await?,
            sync_interval_secs: self.core.config().sync_interval.as_secs().max(1) as u32,
            server_version: Some(tessera_model::version::VERSION.to_owned()),
        })
    }

    /// Records the agent's version where it changed (an upgrade, a downgrade), with an
    /// event saying from what to what.
    async fn take_agent_version(
        &self,
        host: &tessera_model::HostInfo,
        version: Option<tessera_model::version::Version>,
    ) -> Result<(), ControlError> {
        let said = version.map(|v| v.to_string());
        if host.agent_version == said {
            return Ok(());
        }
        self.store
            .set_host_agent_version(&host.id, said.as_deref())
            .await?;
        let name = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown (before 0.2)".into());
        let event = format!(
            "host {}: agent {} -> {}",
            host.id,
            name(&host.agent_version),
            name(&said)
        );
        self.core.event(None, Some(&host.id), &event).await;
        Ok(())
    }

    /// Takes what a sync reports of the host itself: its GPUs, the MPS daemon's restarts
    /// and tasks' measured use are written only when one changed (else only the time, in
    /// the heartbeat buffer). Whether capacity changed (then `mine` is read again: tasks
    /// on a replaced or missing GPU were stopped with it).
    async fn take_host_report(
        &self,
        host: &tessera_model::HostInfo,
        req: &SyncRequest,
        mine: &mut Vec<Task>,
    ) -> Result<bool, ControlError> {
        let usage: Vec<(String, Option<MiB>, Option<u32>)> = req
            .tasks
            .iter()
            .filter(|r| {
                mine.iter()
                    .any(|t| t.id == r.task_id && usage_is_new(&t.measured, r))
            })
            .map(|r| (r.task_id.clone(), r.gpu_memory_peak_mib, r.sm_percent))
            .collect();
        let seen_at = stamp(self.core.now());
        if usage.is_empty()
            && same_gpus(&host.gpus, &req.gpus)
            && req.mps.restarts.is_none_or(|r| r == host.mps_restarts)
        {
            self.gateway
                .heartbeats
                .lock()
                .insert(host.id.clone(), seen_at);
            return Ok(false);
        }
        let report = HostReport {
            gpus: req.gpus.clone(),
            seen_at,
            usage,
            mps_restarts: req.mps.restarts,
        };
        let gpu_changes = self.store.record_host_report(&host.id, &report).await?;
        for change in &gpu_changes {
            let said = format!("host {}: {change}", host.id);
            self.core.event(None, Some(&host.id), &said).await;
        }
        if gpu_changes.is_empty() {
            return Ok(false);
        }
        self.scheduler.capacity_changed();
        *mine = self.held_on(&host.id).await?;
        Ok(true)
    }

    /// Takes the host's advertised address and dynamic ports left, where they changed.
    /// Whether its address did (endpoints change).
    async fn take_network(
        &self,
        host: &tessera_model::HostInfo,
        req: &SyncRequest,
    ) -> Result<bool, ControlError> {
        let new_address = req
            .address
            .as_ref()
            .filter(|a| host.address.as_ref() != Some(*a));
        let new_free = req
            .dynamic_ports_free
            .filter(|f| host.dynamic_ports_free != Some(*f));
        if new_address.is_none() && new_free.is_none() {
            return Ok(false);
        }
        self.store
            .set_host_network(&host.id, new_address.map(String::as_str), new_free)
            .await?;
        Ok(new_address.is_some())
    }

    /// Takes what the agent says it can enforce, where it changed; what it newly cannot
    /// enforce is said in an event (an operator should not learn it from a task).
    async fn take_capabilities(
        &self,
        host: &tessera_model::HostInfo,
        req: &SyncRequest,
    ) -> Result<(), ControlError> {
        let Some(new) = req
            .capabilities
            .as_ref()
            .filter(|c| host.capabilities.as_ref() != Some(*c))
        else {
            return Ok(());
        };
        self.store.set_host_capabilities(&host.id, new).await?;
        let missing = |c: &tessera_model::agent::HostCapabilities| -> Vec<String> {
            c.named()
                .iter()
                .filter(|(_, cap)| !cap.held)
                .map(|(name, cap)| format!("{name} ({})", cap.detail))
                .collect()
        };
        let was = host.capabilities.as_ref().map(missing).unwrap_or_default();
        let lacks: Vec<String> = missing(new)
            .into_iter()
            .filter(|m| !was.contains(m))
            .collect();
        // A simulated host enforces nothing real; its page says so without an event.
        if !lacks.is_empty() && !host.simulated {
            let said = format!("host {} cannot enforce: {}", host.id, lacks.join("; "));
            self.core.event(None, Some(&host.id), &said).await;
        }
        Ok(())
    }

    /// Moves the host's status as a sync with `problem` (the MPS daemon down, no healthy
    /// GPU) makes it, from the status read at the start: an operator's drain that came in
    /// between wins. Whether it moved.
    async fn take_status(
        &self,
        host: &tessera_model::HostInfo,
        problem: Option<String>,
    ) -> Result<bool, ControlError> {
        let event = lifecycle::HostEvent::Synced {
            problem: problem.as_deref(),
            reason: host.status_reason.as_deref(),
        };
        let Some(t) = lifecycle::next(host.id.as_str(), host.status, event)
            .map_err(ControlError::Conflict)?
        else {
            return Ok(false);
        };
        if !self
            .store
            .set_host_status_if(&host.id, host.status, t.to, t.reason.as_deref())
            .await?
        {
            return Ok(false);
        }
        if t.to == tessera_model::HostStatus::Impaired {
            self.core
                .notify(
                    NoticeKind::HostImpaired,
                    (None, Some(&host.id), None),
                    &t.message,
                )
                .await;
        } else {
            self.core.event(None, Some(&host.id), &t.message).await;
        }
        self.scheduler.capacity_changed();
        Ok(true)
    }

    /// Takes each task's report: serving (ports, health) and state. Each one's new state
    /// is kept in `mine` for the answer. Whether anything changed.
    async fn take_task_reports(
        &self,
        host_id: &HostId,
        req: &SyncRequest,
        mine: &mut [Task],
    ) -> Result<bool, ControlError> {
        let reported: HashMap<&str, &TaskReport> =
            req.tasks.iter().map(|r| (r.task_id.as_str(), r)).collect();
        let mut changed = false;
        for t in mine.iter_mut() {
            let report = reported.get(t.id.as_str()).copied();
            if let Some(r) = report
                && r.running
                && t.state == TaskState::Running
                && self.hold_to_budget(host_id, t, r).await?
            {
                changed = true;
                continue;
            }
            if let Some(r) = report
                && serving_changed(t, r)
            {
                self.take_serving(host_id, t, r).await?;
                changed = true;
            }
            let step = task_step(t, report);
            // What it wrote last stays with it, said once: the first report of its end.
            if matches!(step, TaskStep::Stopped { .. } | TaskStep::Ended { .. })
                && let Some(text) = report.and_then(|r| r.last_output.as_deref())
            {
                self.store.set_task_last_output(&t.id, text).await?;
            }
            changed |= self.take_task_step(host_id, t, step).await?;
        }
        Ok(changed)
    }

    /// Holds a running task to its GPU memory budget by what its agent measured of all its
    /// processes (see [`budget`]); whether it was stopped for it.
    async fn hold_to_budget(
        &self,
        host_id: &HostId,
        t: &mut Task,
        r: &TaskReport,
    ) -> Result<bool, ControlError> {
        let Some(budget) = budget::budget_of(&t.allocations) else {
            return Ok(false);
        };
        let grace = self.core.config().gpu_budget_grace.as_millis() as i64;
        let measured = r.gpu_memory_mib.or(r.gpu_memory_peak_mib);
        let judged =
            self.gateway
                .budgets
                .judge(&t.id, budget, measured, self.core.instant(), grace);
        let budget::Judgement::PastGrace {
            measured,
            budget,
            secs,
            first,
        } = judged
        else {
            return Ok(false);
        };
        // A pool that cannot be read now is read again at the next sync: the rest of the
        // host's report is taken meanwhile.
        let pool = match self.store.get_pool(&t.pool).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(task = %t.id, pool = %t.pool, error = %e, "cannot read the pool's gpu_budget; judged again at the next sync");
                return Ok(false);
            }
        };
        match pool.gpu_budget {
            GpuBudget::Enforce => {
                let reason = StopReason::GpuMemoryOverBudget {
                    measured,
                    budget,
                    secs,
                };
                let gpus: Vec<String> = t.allocations.iter().map(|a| a.gpu.to_string()).collect();
                tracing::warn!(task = %t.id, host = %host_id, gpus = ?gpus, %reason, "task stopped");
                // Stopping, not stopped: its GPU memory stays held until its agent reports
                // it gone, so no replacement is placed into memory it still uses. Out of
                // its endpoints at once; its in-flight requests get the service's
                // deregistration delay, but never longer than the grace it already had
                // (its neighbours' memory comes first).
                let drain = match self.store.get_service(&t.service).await {
                    Ok(s) => budget::drain_secs(
                        s.deregistration_delay_secs,
                        self.core.config().gpu_budget_grace,
                    ),
                    Err(e) => {
                        tracing::warn!(task = %t.id, error = %e, "cannot read the task's service: stopped without draining");
                        0
                    }
                };
                let drain_until = (drain > 0)
                    .then(|| stamp(self.core.now() + chrono::Duration::seconds(i64::from(drain))));
                self.store
                    .request_task_stop(&t.id, &reason, drain_until.as_deref(), true)
                    .await?;
                self.core
                    .event(
                        Some(&t.service),
                        Some(host_id),
                        &format!("task {} on GPU {} stopped: {reason}", t.id, gpus.join(", ")),
                    )
                    .await;
                self.gateway.budgets.forget(&t.id);
                t.state = TaskState::Stopping;
                t.stop_reason = Some(reason.to_string());
                Ok(true)
            }
            GpuBudget::Warn => {
                if first {
                    let said = format!(
                        "task {}: gpu memory over budget: {} MiB measured against {} MiB, {} MiB over, for {secs} s; not stopped: pool {} only warns (gpu_budget: warn)",
                        t.id,
                        measured.0,
                        budget.0,
                        measured.0.saturating_sub(budget.0),
                        t.pool
                    );
                    self.core
                        .event(Some(&t.service), Some(host_id), &said)
                        .await;
                }
                Ok(false)
            }
        }
    }

    /// Takes a task's reported ports and health (a report without health leaves what is
    /// stored: a task whose definition has a check is never taken for one without, it
    /// would count as healthy), and says a change of health in its events.
    async fn take_serving(
        &self,
        host_id: &HostId,
        t: &mut Task,
        r: &TaskReport,
    ) -> Result<(), ControlError> {
        let health = match &r.health {
            Some(h) => Some((h.status, h.output.as_deref())),
            None => t.health.map(|s| (s, t.health_output.as_deref())),
        };
        let ports = if r.ports.is_empty() {
            &t.ports
        } else {
            &r.ports
        };
        self.store.record_task_serving(&t.id, ports, health).await?;
        if let Some(h) = &r.health
            && Some(h.status) != t.health
        {
            let why = h
                .output
                .as_deref()
                .map(|o| format!(": {o}"))
                .unwrap_or_default();
            let said = format!("task {} is {}{why}", t.id, h.status);
            self.core
                .event(Some(&t.service), Some(host_id), &said)
                .await;
        }
        if !r.ports.is_empty() {
            t.ports = r.ports.clone();
        }
        if let Some(h) = &r.health {
            t.health = Some(h.status);
            t.health_output = h.output.clone();
        }
        Ok(())
    }

    /// Carries out `step` for task `t`. Whether anything changed.
    async fn take_task_step(
        &self,
        host_id: &HostId,
        t: &mut Task,
        step: TaskStep,
    ) -> Result<bool, ControlError> {
        match step {
            TaskStep::Unchanged => return Ok(false),
            TaskStep::Started => {
                self.store.mark_task_running(&t.id).await?;
                t.state = TaskState::Running;
                return Ok(true);
            }
            TaskStep::Pulling(note) => {
                if t.placement_message.as_deref() == Some(note.as_str()) {
                    return Ok(false);
                }
                self.store
                    .set_placement_message(std::slice::from_ref(&t.id), &note)
                    .await?;
                t.placement_message = Some(note);
                return Ok(true);
            }
            TaskStep::Stopped { exit_code } => {
                self.store
                    .mark_task_stopped(&t.id, &StopReason::Stopped, exit_code, false)
                    .await?;
            }
            TaskStep::Ended {
                reason,
                exit_code,
                failed,
            } => {
                self.task_ended(t, host_id, &reason, exit_code, failed)
                    .await?;
            }
        }
        t.state = TaskState::Stopped;
        self.scheduler.capacity_changed();
        Ok(true)
    }

    /// What the answer to a sync names: everything `host` should run now, draining tasks
    /// included until their deregistration delay is over. A host held for approval runs
    /// nothing (and so learns no secret), whatever a store written before it was held says.
    async fn wanted_on(
        &self,
        host: &tessera_model::HostInfo,
        mine: &[Task],
    ) -> Result<Vec<WantedTask>, ControlError> {
        let now = self.core.instant();
        let wanted: Vec<&Task> = mine
            .iter()
            .filter(|_| !host.held)
            .filter(|t| match t.state {
                TaskState::Assigned | TaskState::Running => true,
                TaskState::Stopping => t.drain_until.is_some_and(|d| d > now),
                _ => false,
            })
            .collect();
        let stop_timeouts = self
            .stop_timeouts_of(wanted.iter().map(|t| t.deployment_id))
            .await?;
        let mut tasks = Vec::with_capacity(wanted.len());
        let mut pool = None;
        for t in wanted {
            // Specs are kept in memory (revisions never change).
            let spec = self.scheduler.spec_of(&t.task_definition).await?;
            // The last gate before a host runs it: what the pool allows of the host's
            // security now.
            if spec.host_network() || spec.containers.iter().any(|c| !c.security().is_default()) {
                if pool.is_none() {
                    pool = Some(self.store.get_pool(&host.pool).await?);
                }
                if let Some(Err(e)) = pool
                    .as_ref()
                    .map(|p| crate::workloads::allowed_in_pool(&spec, p))
                {
                    let reason = StopReason::RefusedByPool {
                        pool: host.pool.to_string(),
                        why: e.to_string(),
                    };
                    tracing::warn!(task = %t.id, %reason, "task not sent to its host");
                    self.task_ended(t, &host.id, &reason, None, true).await?;
                    continue;
                }
            }
            let timeout = stop_timeouts.get(&t.deployment_id).copied().unwrap_or(30);
            tasks.push(wanted_task(t, &spec, timeout));
        }
        Ok(tasks)
    }
}

/// What a host is told to run of task `t` (of `spec`).
fn wanted_task(t: &Task, spec: &TaskDefinitionSpec, stop_timeout_secs: u32) -> WantedTask {
    WantedTask {
        task_id: t.id.clone(),
        containers: container_env(spec, t),
        mps: t.allocations.iter().any(|a| !a.dedicated),
        stop_timeout_secs,
        host_network: spec.host_network(),
        draining: t.state == TaskState::Stopping,
        bound_ports: t
            .ports
            .iter()
            .filter(|p| p.host_port.is_some())
            .cloned()
            .collect(),
        work: spec.work.clone(),
    }
}

/// What a sync's report of a task (or its absence) does to it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TaskStep {
    Unchanged,
    /// An assigned task runs.
    Started,
    /// An assigned task waits for its image: the note its placement message becomes.
    Pulling(String),
    /// A stopping task stopped, as asked.
    Stopped {
        exit_code: Option<i32>,
    },
    /// It ended by itself, or a running task is gone from its host.
    Ended {
        reason: StopReason,
        exit_code: Option<i32>,
        failed: bool,
    },
}

/// The step `report` (`None`: the host no longer names the task) takes task `t` by.
fn task_step(t: &Task, report: Option<&TaskReport>) -> TaskStep {
    match (report, t.state) {
        (Some(r), TaskState::Assigned) if r.running => TaskStep::Started,
        (Some(r), _) if r.running => TaskStep::Unchanged,
        (Some(r), TaskState::Assigned) if r.pulling.is_some() => TaskStep::Pulling(format!(
            "pulling image {}",
            r.pulling.as_deref().unwrap_or("")
        )),
        (Some(r), TaskState::Stopping) => TaskStep::Stopped {
            exit_code: r.exit_code,
        },
        (Some(r), _) => TaskStep::Ended {
            reason: match (&r.error, &r.out_of_memory) {
                (Some(why), _) => StopReason::CannotStart(why.clone()),
                (None, Some(why)) => StopReason::OutOfMemory {
                    why: why.clone(),
                    code: r.exit_code,
                },
                (None, None) => StopReason::Exited(r.exit_code),
            },
            exit_code: r.exit_code,
            failed: r.exit_code != Some(0),
        },
        (None, TaskState::Stopping) => TaskStep::Stopped { exit_code: None },
        (None, TaskState::Running) => TaskStep::Ended {
            reason: StopReason::Vanished,
            exit_code: None,
            failed: true,
        },
        (None, _) => TaskStep::Unchanged,
    }
}

impl AgentSync {
    /// Brings the reported GPUs to what the host may have (`inventory_growth`): what is new
    /// waits for approval in a manual pool, or is refused, and is said in the host's events.
    async fn judge_inventory(
        &self,
        host: &tessera_model::HostInfo,
        gpus: &mut Vec<tessera_model::agent::GpuReport>,
    ) -> Result<(), ControlError> {
        let as_admitted = gpus.iter().all(|g| {
            host.gpus
                .iter()
                .any(|k| k.uuid == g.uuid && k.model == g.model && k.memory == g.memory_mib)
        });
        let mut pending = Vec::new();
        if !as_admitted {
            let pool = self.store.get_pool(&host.pool).await?;
            // Who else has the new UUIDs: one query, however many a report makes up.
            let new: Vec<tessera_model::GpuUuid> = gpus
                .iter()
                .filter(|g| !host.gpus.iter().any(|k| k.uuid == g.uuid))
                .map(|g| g.uuid.clone())
                .collect();
            let elsewhere: BTreeMap<_, _> = self
                .store
                .gpu_owners(&new)
                .await?
                .into_iter()
                .filter(|(_, owner)| *owner != host.id)
                .collect();
            let judged = crate::inventory_growth::judge(
                &host.gpus,
                gpus,
                pool.admission == tessera_model::Admission::Manual,
                &elsewhere,
            );
            *gpus = judged.gpus;
            pending = judged.pending;
            for r in judged.refused {
                self.event_once(None, &host.id, &format!("host {}: {r}", host.id))
                    .await;
            }
        }
        if pending != host.pending_gpus {
            self.store.set_pending_gpus(&host.id, &pending).await?;
            if !pending.is_empty() {
                let what: Vec<String> = pending.iter().map(|p| p.why.clone()).collect();
                // Once an hour for the same list: a report that flips between lists does
                // not flood the host's events.
                self.event_once(
                    None,
                    &host.id,
                    &format!(
                        "host {}: {} GPU(s) wait for an admin's approval before they are capacity: {}",
                        host.id,
                        pending.len(),
                        what.join("; ")
                    ),
                )
                .await;
            }
        }
        Ok(())
    }

    /// Records `message` as an event of `host` (and `service`), unless the same was
    /// recorded within the hour (`DROPS_REMEMBERED`): an agent that keeps sending the same
    /// fault every sync does not flood the events.
    async fn event_once(&self, service: Option<&str>, host: &HostId, message: &str) {
        let key = format!("{host}\n{message}");
        if self.gateway.said.get(&key).is_some() {
            return;
        }
        self.gateway.said.insert(key, ());
        tracing::warn!(%host, "{message}");
        self.core.event(service, Some(host), message).await;
    }

    /// Records what the bounds dropped from a host's report: on the task's service (and
    /// the host) for a task's item, on the host for the host's or a GPU's; each once an
    /// hour however often it comes again.
    async fn record_dropped(&self, host_id: &HostId, mine: &[Task], dropped: &[Dropped]) {
        let mut by_owner: BTreeMap<&Owner, Vec<String>> = BTreeMap::new();
        for d in dropped {
            by_owner.entry(&d.owner).or_default().push(d.to_string());
        }
        for (owner, what) in by_owner {
            let what = what.join("; ");
            let (service, subject) = match owner {
                Owner::Task(id) => match mine.iter().find(|t| &t.id == id) {
                    Some(t) => (Some(t.service.as_str()), format!("task {id}")),
                    // Not a task of this host: the host's report is what was wrong.
                    None => (
                        None,
                        format!("host {host_id} (a report of task {id}, not one of its tasks)"),
                    ),
                },
                Owner::Gpu(uuid) => (None, format!("host {host_id}, GPU {uuid}")),
                Owner::Host => (None, format!("host {host_id}")),
            };
            self.event_once(
                service,
                host_id,
                &format!("{subject}: part of the agent's report was dropped or cut: {what}"),
            )
            .await;
        }
    }

    /// What holds capacity on a host, with its allocations.
    async fn held_on(&self, host: &HostId) -> Result<Vec<Task>, ControlError> {
        Ok(self
            .store
            .list_tasks(&TaskFilter {
                host: Some(host.clone()),
                states: TaskState::HOLDING.to_vec(),
                ..Default::default()
            })
            .await?)
    }

    /// Writes the times of the quiet syncs received since the last call, in one statement.
    /// On failure they are kept for the next call (a newer time for a host wins).
    pub async fn flush_heartbeats(&self) -> Result<(), ControlError> {
        self.gateway.budgets.prune(self.core.instant());
        let seen: Vec<(HostId, String)> = std::mem::take(&mut *self.gateway.heartbeats.lock())
            .into_iter()
            .collect();
        if seen.is_empty() {
            return self.flush_work().await;
        }
        if let Err(e) = self.store.touch_hosts(&seen).await {
            let mut pending = self.gateway.heartbeats.lock();
            for (id, at) in seen {
                pending.entry(id).or_insert(at);
            }
            return Err(e.into());
        }
        self.flush_work().await
    }

    /// Each deployment's stop timeout: from memory, the rest in one read.
    async fn stop_timeouts_of(
        &self,
        deployments: impl Iterator<Item = i64>,
    ) -> Result<HashMap<i64, u32>, ControlError> {
        let (mut out, missing) = self.gateway.stop_timeouts.get_many(deployments);
        if !missing.is_empty() {
            let read = self.store.stop_timeouts(&missing).await?;
            for (&d, &secs) in &read {
                self.gateway.stop_timeouts.insert(d, secs);
            }
            out.extend(read);
        }
        Ok(out)
    }
}

/// A GPU whose entry the bounds dropped says nothing new this time: what is stored of it
/// stands (it is not taken for a GPU that disappeared, and its tasks keep running).
fn keep_stored_gpus(
    reported: &mut Vec<tessera_model::agent::GpuReport>,
    stored: &[GpuInfo],
    dropped: &[Dropped],
) {
    for d in dropped {
        let Owner::Gpu(uuid) = &d.owner else { continue };
        let Some(k) = stored.iter().find(|k| &k.uuid == uuid) else {
            continue;
        };
        if reported
            .iter()
            .any(|g| &g.uuid == uuid || g.index == k.index)
        {
            continue;
        }
        reported.push(crate::inventory_growth::stored_as_report(
            k,
            k.health == GpuHealth::Healthy,
            k.mps_client_limit,
        ));
    }
}

/// Whether a report changes what is stored of a task's ports or health. Ports the agent
/// has not bound yet (an empty list) leave the planned ones.
fn serving_changed(t: &Task, r: &tessera_model::agent::TaskReport) -> bool {
    (!r.ports.is_empty() && r.ports != t.ports)
        || r.health
            .as_ref()
            .is_some_and(|h| Some(h.status) != t.health || h.output != t.health_output)
}

/// Whether a report says more than what is stored of a task's use: a higher peak, or
/// another SM share.
fn usage_is_new(stored: &Measured, r: &tessera_model::agent::TaskReport) -> bool {
    r.gpu_memory_peak_mib
        .is_some_and(|p| stored.gpu_memory_peak.is_none_or(|old| p > old))
        || r.sm_percent.is_some_and(|s| stored.sm_percent != Some(s))
}

/// Whether the reported GPUs are the stored ones, as the store keeps them (index, model,
/// client limit, health); anything else takes the full report path.
fn same_gpus(stored: &[GpuInfo], reported: &[tessera_model::agent::GpuReport]) -> bool {
    stored.len() == reported.len()
        && reported.iter().all(|g| {
            stored.iter().any(|k| {
                k.uuid == g.uuid
                    && k.index == g.index
                    && k.model == g.model
                    && k.mps_client_limit == g.mps_client_limit
                    && (k.health == GpuHealth::Healthy) == g.healthy
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::service::GpuAllocation;
    use tessera_model::taskdef::ContainerSpec;
    use tessera_model::{ComputeMilli, GpuUuid, MiB, MilliCpu, Percent};

    fn task(allocations: Vec<GpuAllocation>) -> Task {
        Task {
            state: TaskState::Assigned,
            memory: MiB(64),
            allocations,
            ..crate::test_values::task("t", "s")
        }
    }

    #[test]
    fn each_report_moves_a_task_by_one_step() {
        let in_state = |state| Task {
            state,
            ..task(vec![])
        };
        let report = |r: TaskReport| Some(r);
        let running = TaskReport {
            task_id: "t".into(),
            running: true,
            ..Default::default()
        };
        let exited = |code| TaskReport {
            task_id: "t".into(),
            exit_code: code,
            ..Default::default()
        };
        use TaskState::*;
        let cases: Vec<(TaskState, Option<TaskReport>, TaskStep)> = vec![
            (Assigned, report(running.clone()), TaskStep::Started),
            (Running, report(running.clone()), TaskStep::Unchanged),
            (Stopping, report(running), TaskStep::Unchanged),
            (
                Assigned,
                report(TaskReport {
                    pulling: Some("nginx:1".into()),
                    ..exited(None)
                }),
                TaskStep::Pulling("pulling image nginx:1".into()),
            ),
            (
                Stopping,
                report(exited(Some(137))),
                TaskStep::Stopped {
                    exit_code: Some(137),
                },
            ),
            (
                Running,
                report(exited(Some(0))),
                TaskStep::Ended {
                    reason: StopReason::Exited(Some(0)),
                    exit_code: Some(0),
                    failed: false,
                },
            ),
            (
                Assigned,
                report(TaskReport {
                    error: Some("no such image".into()),
                    ..exited(None)
                }),
                TaskStep::Ended {
                    reason: StopReason::CannotStart("no such image".into()),
                    exit_code: None,
                    failed: true,
                },
            ),
            (Stopping, None, TaskStep::Stopped { exit_code: None }),
            (
                Running,
                None,
                TaskStep::Ended {
                    reason: StopReason::Vanished,
                    exit_code: None,
                    failed: true,
                },
            ),
            (Assigned, None, TaskStep::Unchanged),
        ];
        for (state, r, want) in cases {
            assert_eq!(
                task_step(&in_state(state), r.as_ref()),
                want,
                "{state:?}, {r:?}"
            );
        }
    }

    fn container(name: &str, gpu: Option<GpuRequirement>) -> ContainerSpec {
        ContainerSpec {
            name: name.into(),
            command: vec!["sleep".into(), "60".into()],
            env: BTreeMap::from([("APP".to_owned(), "1".to_owned())]),
            secrets: BTreeMap::from([(
                "TOKEN".to_owned(),
                tessera_model::taskdef::Secret::Value("s3cret-value".into()),
            )]),
            cpu_milli: MilliCpu(500),
            memory_mib: MiB(32),
            gpu,
            image: None,
            entry_point: vec![],
            ports: vec![],
            health_check: None,
            essential: true,
            depends_on: vec![],
            ecs: Default::default(),
        }
    }

    #[test]
    fn mps_containers_get_their_limits_and_the_gpu() {
        let spec = TaskDefinitionSpec {
            family: "f".into(),
            ecs: Default::default(),
            work: None,
            containers: vec![
                container(
                    "main",
                    Some(GpuRequirement::Mps {
                        memory_mib: MiB(8192),
                        max_compute_percent: Some(Percent::new(25).expect("valid")),
                    }),
                ),
                container("side", None),
            ],
        };
        let t = task(vec![GpuAllocation {
            gpu: GpuUuid::new("GPU-a").expect("valid"),
            index: 3,
            memory: MiB(8192),
            compute: ComputeMilli(250),
            dedicated: false,
        }]);
        let env = container_env(&spec, &t);
        assert_eq!(env[0].env["CUDA_VISIBLE_DEVICES"], "GPU-a");
        assert_eq!(env[0].env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=8192M");
        assert_eq!(env[0].env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
        assert_eq!(env[0].env["APP"], "1");
        assert_eq!(env[0].secrets.0["TOKEN"], "s3cret-value");
        assert!(
            !env[0].env.contains_key("TOKEN"),
            "secrets travel apart from env"
        );
        assert_eq!(
            env[1].env["CUDA_VISIBLE_DEVICES"], "",
            "a container without a GPU sees none"
        );
    }

    #[test]
    fn whole_gpus_are_split_among_containers_in_order() {
        let spec = TaskDefinitionSpec {
            family: "f".into(),
            ecs: Default::default(),
            work: None,
            containers: vec![
                container("a", Some(GpuRequirement::Gpus(1))),
                container("b", Some(GpuRequirement::Gpus(2))),
            ],
        };
        let alloc = |u: &str, i| GpuAllocation {
            gpu: GpuUuid::new(u).expect("valid"),
            index: i,
            memory: MiB(1),
            compute: ComputeMilli(1000),
            dedicated: true,
        };
        let t = task(vec![
            alloc("GPU-0", 0),
            alloc("GPU-1", 1),
            alloc("GPU-2", 2),
        ]);
        let env = container_env(&spec, &t);
        assert_eq!(env[0].env["CUDA_VISIBLE_DEVICES"], "GPU-0");
        assert_eq!(env[1].env["CUDA_VISIBLE_DEVICES"], "GPU-1,GPU-2");
        assert!(!env[0].env.contains_key("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"));
    }
}
