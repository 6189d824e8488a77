//! The agent API, server side: registration with the join token, and sync, which records
//! what an agent reports (GPUs, MPS health, its tasks and their measured use) and answers
//! with every task its host should run, environment included.

use crate::clock::stamp;
use crate::control::Control;
use crate::error::ControlError;
use crate::lifecycle;
use crate::store::{HostReport, TaskFilter};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use tessera_model::agent::{
    RegisterRequest, RegisterResponse, SecretEnv, SyncRequest, SyncResponse, WantedContainer,
    WantedTask,
};
use tessera_model::service::{Measured, Task, TaskState};
use tessera_model::taskdef::{GpuRequirement, TaskDefinitionSpec};
use tessera_model::{GpuHealth, GpuInfo, HostId, HostInfo, HostStatus, MiB, SharingMode};

const JOIN_TOKEN_SETTING: &str = "join_token_sha256";
/// The hash of the join token the configuration last gave (see `ensure_join_token`).
const JOIN_TOKEN_CONFIGURED: &str = "join_token_configured_sha256";

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

/// Equal strings, compared in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A host id from a name an agent suggests: a DNS label.
fn host_id_from(name: Option<&str>) -> String {
    let base: String = name
        .unwrap_or("host")
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let base = base.trim_matches('-');
    let base = if base.is_empty() { "host" } else { base };
    base.chars().take(50).collect()
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

impl Control {
    /// Makes sure a join token exists. With `given`, that token is the join token from now
    /// on. Without, one is generated on first start and returned (to print once); later
    /// starts return `None` (only its hash is stored).
    pub async fn ensure_join_token(
        &self,
        given: Option<&str>,
    ) -> Result<Option<String>, ControlError> {
        if let Some(token) = given {
            if token.len() < 16 {
                return Err(ControlError::invalid(
                    "join_token",
                    "must be at least 16 characters",
                ));
            }
            // The configuration's token takes effect when it is new to this database; the
            // same one configured again after an admin rotated the token (it leaked) does
            // not bring it back.
            let hash = hash_token(token);
            let configured = self.store.get_setting(JOIN_TOKEN_CONFIGURED).await?;
            let current = self.store.get_setting(JOIN_TOKEN_SETTING).await?;
            if current.is_some() && configured.as_deref() == Some(hash.as_str()) {
                if current.as_deref() != Some(hash.as_str()) {
                    tracing::warn!(
                        "the configured join token was rotated since it was set: agents join with the current one (drop --join-token / TESSERA_JOIN_TOKEN, or configure a new one)"
                    );
                }
                return Ok(None);
            }
            self.store.set_setting(JOIN_TOKEN_SETTING, &hash).await?;
            self.store.set_setting(JOIN_TOKEN_CONFIGURED, &hash).await?;
            return Ok(None);
        }
        if self.store.get_setting(JOIN_TOKEN_SETTING).await?.is_some() {
            return Ok(None);
        }
        let token = new_token();
        self.store
            .set_setting(JOIN_TOKEN_SETTING, &hash_token(&token))
            .await?;
        Ok(Some(token))
    }

    /// Makes `token` the join token now (a rotation), whatever the configuration gave.
    pub(crate) async fn replace_join_token(&self, token: &str) -> Result<(), ControlError> {
        Ok(self
            .store
            .set_setting(JOIN_TOKEN_SETTING, &hash_token(token))
            .await?)
    }

    /// `POST /agent/v1/register`: checks the join token, then admits the host.
    pub async fn register_agent(
        &self,
        req: &RegisterRequest,
    ) -> Result<RegisterResponse, ControlError> {
        req.validate().map_err(ControlError::Invalid)?;
        let stored = self.store.get_setting(JOIN_TOKEN_SETTING).await?;
        match stored {
            Some(hash) if same(&hash, &hash_token(&req.join_token)) => self.admit_host(req).await,
            _ => Err(ControlError::Unauthorized(
                "the join token is not valid for this server".into(),
            )),
        }
    }

    /// Registers a host and issues its agent token. The one way hosts join, for agents
    /// (after `register_agent` checked the join token) and the in-process demo fleet.
    pub(crate) async fn admit_host(
        &self,
        req: &RegisterRequest,
    ) -> Result<RegisterResponse, ControlError> {
        if !self.store.pool_exists(&req.pool).await? {
            return Err(ControlError::invalid(
                "pool",
                format!("no pool named {:?}", req.pool.as_str()),
            ));
        }
        // A machine whose GPUs are already known: the same host, reinstalled or with its
        // credentials lost. It rejoins under its old id once an admin has revoked the old
        // token; otherwise it is refused, since two agents would answer for one host.
        let uuids: Vec<_> = req.gpus.iter().map(|g| g.uuid.clone()).collect();
        if let Some((owner, revoked)) = self.store.host_with_gpus(&uuids).await? {
            if !revoked {
                return Err(ControlError::Conflict(format!(
                    "this machine's GPUs belong to host {owner}, whose agent is still registered; if it is that machine, an admin revokes the old token (POST /api/v1/hosts/{owner}/revoke) and it rejoins as {owner}, or deletes the host"
                )));
            }
            let token = new_token();
            self.store
                .reissue_agent_token(&owner, &hash_token(&token))
                .await?;
            self.event(
                None,
                Some(&owner),
                &format!("host {owner} rejoined with a new agent token"),
            )
            .await;
            self.wake();
            return Ok(RegisterResponse {
                host_id: owner,
                agent_token: token,
                sync_interval_secs: self.config.sync_interval.as_secs().max(1) as u32,
            });
        }
        let base = host_id_from(req.name.as_deref());
        let mut id =
            HostId::new(base.clone()).map_err(|e| ControlError::invalid("name", e.to_string()))?;
        while self.store.get_host(&id).await.is_ok() {
            let suffix = &uuid::Uuid::new_v4().simple().to_string()[..6];
            id = HostId::new(format!("{base}-{suffix}"))
                .map_err(|e| ControlError::invalid("name", e.to_string()))?;
        }
        let host = HostInfo {
            id: id.clone(),
            pool: req.pool.clone(),
            status: HostStatus::Active,
            simulated: req.simulated,
            cpu: req.cpu_milli,
            memory: req.memory_mib,
            labels: req.labels.clone(),
            gpus: req
                .gpus
                .iter()
                .map(|g| GpuInfo {
                    uuid: g.uuid.clone(),
                    index: g.index,
                    model: g.model.clone(),
                    memory: g.memory_mib,
                    mps_client_limit: g.mps_client_limit,
                    health: if g.healthy {
                        GpuHealth::Healthy
                    } else {
                        GpuHealth::Unhealthy
                    },
                    sharing_mode: SharingMode::Idle,
                })
                .collect(),
            status_reason: None,
            last_seen: None,
            mps_restarts: 0,
            address: req.address.clone(),
            dynamic_ports_free: None,
        };
        let token = new_token();
        self.store
            .register_host(&host, &hash_token(&token), &stamp(self.now()))
            .await?;
        self.capacity_changed();
        let kind = if req.simulated {
            "simulated host"
        } else {
            "host"
        };
        self.event(
            None,
            Some(&id),
            &format!(
                "{kind} {id} registered in pool {} with {} GPU(s)",
                req.pool,
                req.gpus.len()
            ),
        )
        .await;
        self.wake();
        Ok(RegisterResponse {
            host_id: id,
            agent_token: token,
            sync_interval_secs: self.config.sync_interval.as_secs().max(1) as u32,
        })
    }

    /// The host an agent token belongs to.
    pub async fn authenticate_agent(&self, token: &str) -> Result<HostId, ControlError> {
        self.store
            .host_by_token_hash(&hash_token(token))
            .await?
            .ok_or_else(|| ControlError::Unauthorized("unknown agent token".into()))
    }

    /// Records that task `t` ended without being asked to (it exited, or vanished from its
    /// host), with an event that says why.
    async fn task_ended(
        &self,
        t: &Task,
        host_id: &HostId,
        reason: &str,
        exit_code: Option<i32>,
        failed: bool,
    ) -> Result<(), ControlError> {
        self.store
            .mark_task_stopped(&t.id, reason, exit_code, failed)
            .await?;
        self.event(
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
        req.validate().map_err(ControlError::Invalid)?;
        let host = self.store.get_host(host_id).await?;
        // What holds capacity on the host, with its allocations: what the report is checked
        // against, and (as it stands after the report) what the answer names.
        let mut mine = self.held_on(host_id).await?;
        // Something to reconcile. Capacity changes (a GPU, the host's status, a task gone)
        // are also told at once to the scheduler, whose cached engine is then rebuilt.
        let mut changed = false;
        let problem = lifecycle::problem(req);
        let usage: Vec<(String, Option<MiB>, Option<u32>)> = req
            .tasks
            .iter()
            .filter(|r| {
                mine.iter()
                    .any(|t| t.id == r.task_id && usage_is_new(&t.measured, r))
            })
            .map(|r| (r.task_id.clone(), r.gpu_memory_peak_mib, r.sm_percent))
            .collect();
        self.record_reports(&mine, &req.tasks);
        self.record_work(&mine, &req.tasks);
        let seen_at = stamp(self.now());
        if usage.is_empty()
            && same_gpus(&host.gpus, &req.gpus)
            && req.mps.restarts.is_none_or(|r| r == host.mps_restarts)
        {
            self.heartbeats
                .lock()
                .expect("not poisoned")
                .insert(host_id.clone(), seen_at);
        } else {
            let gpu_changes = self
                .store
                .record_host_report(
                    host_id,
                    &HostReport {
                        gpus: req.gpus.clone(),
                        seen_at,
                        usage,
                        mps_restarts: req.mps.restarts,
                    },
                )
                .await?;
            for change in &gpu_changes {
                self.event(None, Some(host_id), &format!("host {host_id}: {change}"))
                    .await;
            }
            if !gpu_changes.is_empty() {
                changed = true;
                self.capacity_changed();
                // Tasks on a replaced or missing GPU were stopped with it.
                mine = self.held_on(host_id).await?;
            }
        }
        let new_address = req
            .address
            .as_ref()
            .filter(|a| host.address.as_ref() != Some(*a));
        let new_free = req
            .dynamic_ports_free
            .filter(|f| host.dynamic_ports_free != Some(*f));
        if new_address.is_some() || new_free.is_some() {
            self.store
                .set_host_network(host_id, new_address.map(String::as_str), new_free)
                .await?;
            if new_address.is_some() {
                changed = true;
            }
        }
        let event = lifecycle::HostEvent::Synced {
            problem: problem.as_deref(),
            reason: host.status_reason.as_deref(),
        };
        if let Some(t) =
            lifecycle::next(host_id.as_str(), host.status, event).map_err(ControlError::Conflict)?
        {
            // Only from the status read above: an operator's drain that came in between wins.
            if self
                .store
                .set_host_status_if(host_id, host.status, t.to, t.reason.as_deref())
                .await?
            {
                self.event(None, Some(host_id), &t.message).await;
                changed = true;
                self.capacity_changed();
            }
        }
        // Tasks: each one's new state is kept in `mine` for the answer.
        let reported: HashMap<&str, &tessera_model::agent::TaskReport> =
            req.tasks.iter().map(|r| (r.task_id.as_str(), r)).collect();
        for t in &mut mine {
            if let Some(r) = reported.get(t.id.as_str())
                && serving_changed(t, r)
            {
                // A report without health leaves what is stored: a task whose definition
                // has a check is never taken for one without (it would count as healthy).
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
                if r.health.as_ref().map(|h| h.status) != t.health
                    && let Some(h) = &r.health
                {
                    let why = h
                        .output
                        .as_deref()
                        .map(|o| format!(": {o}"))
                        .unwrap_or_default();
                    self.event(
                        Some(&t.service),
                        Some(host_id),
                        &format!("task {} is {}{why}", t.id, h.status),
                    )
                    .await;
                }
                if !r.ports.is_empty() {
                    t.ports = r.ports.clone();
                }
                if let Some(h) = &r.health {
                    t.health = Some(h.status);
                    t.health_output = h.output.clone();
                }
                changed = true;
            }
            let gone = match (reported.get(t.id.as_str()), t.state) {
                (Some(r), TaskState::Assigned) if r.running => {
                    self.store.mark_task_running(&t.id).await?;
                    t.state = TaskState::Running;
                    changed = true;
                    false
                }
                (Some(r), _) if r.running => false,
                (Some(r), TaskState::Assigned) if r.pulling.is_some() => {
                    let note = format!("pulling image {}", r.pulling.as_deref().unwrap_or(""));
                    if t.placement_message.as_deref() != Some(note.as_str()) {
                        self.store
                            .set_placement_message(std::slice::from_ref(&t.id), &note)
                            .await?;
                        t.placement_message = Some(note);
                        changed = true;
                    }
                    false
                }
                (Some(r), TaskState::Stopping) => {
                    self.store
                        .mark_task_stopped(&t.id, "stopped", r.exit_code, false)
                        .await?;
                    true
                }
                (Some(r), _) => {
                    let code = r.exit_code.map_or("unknown".to_owned(), |c| c.to_string());
                    let reason = match &r.error {
                        Some(why) => format!("cannot start: {why}"),
                        None => format!("essential container exited with code {code}"),
                    };
                    let failed = r.exit_code != Some(0);
                    self.task_ended(t, host_id, &reason, r.exit_code, failed)
                        .await?;
                    true
                }
                (None, TaskState::Stopping) => {
                    self.store
                        .mark_task_stopped(&t.id, "stopped", None, false)
                        .await?;
                    true
                }
                (None, TaskState::Running) => {
                    self.task_ended(t, host_id, "task no longer running on its host", None, true)
                        .await?;
                    true
                }
                (None, _) => false,
            };
            if gone {
                t.state = TaskState::Stopped;
                changed = true;
                self.capacity_changed();
            }
        }
        if changed {
            self.wake();
        }
        // The answer: everything this host should run now, draining tasks included until
        // their deregistration delay is over.
        let now = stamp(self.now());
        let wanted: Vec<&Task> = mine
            .iter()
            .filter(|t| match t.state {
                TaskState::Assigned | TaskState::Running => true,
                TaskState::Stopping => t.drain_until.as_deref().is_some_and(|d| d > now.as_str()),
                _ => false,
            })
            .collect();
        let stop_timeouts = self
            .stop_timeouts_of(wanted.iter().map(|t| t.deployment_id))
            .await?;
        let mut tasks = Vec::with_capacity(wanted.len());
        for t in wanted {
            // Specs are kept in memory (revisions never change).
            let spec = self.spec_of(&t.task_definition).await?;
            tasks.push(WantedTask {
                task_id: t.id.clone(),
                containers: container_env(&spec, t),
                mps: t.allocations.iter().any(|a| !a.dedicated),
                stop_timeout_secs: stop_timeouts.get(&t.deployment_id).copied().unwrap_or(30),
                host_network: spec.host_network(),
                draining: t.state == TaskState::Stopping,
                bound_ports: t
                    .ports
                    .iter()
                    .filter(|p| p.host_port.is_some())
                    .cloned()
                    .collect(),
                work: spec.work.clone(),
            });
        }
        Ok(SyncResponse {
            host_id: host_id.clone(),
            tasks,
            sync_interval_secs: self.config.sync_interval.as_secs().max(1) as u32,
        })
    }
}

impl Control {
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
        let seen: Vec<(HostId, String)> =
            std::mem::take(&mut *self.heartbeats.lock().expect("not poisoned"))
                .into_iter()
                .collect();
        if seen.is_empty() {
            return self.flush_work().await;
        }
        if let Err(e) = self.store.touch_hosts(&seen).await {
            let mut pending = self.heartbeats.lock().expect("not poisoned");
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
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        {
            let known = self.stop_timeouts.lock().expect("not poisoned");
            for d in deployments {
                match known.get(&d) {
                    Some(&secs) => {
                        out.insert(d, secs);
                    }
                    None => missing.push(d),
                }
            }
        }
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            let read = self.store.stop_timeouts(&missing).await?;
            let mut known = self.stop_timeouts.lock().expect("not poisoned");
            if known.len() > 100_000 {
                known.clear();
            }
            known.extend(read.iter().map(|(&d, &s)| (d, s)));
            out.extend(read);
        }
        Ok(out)
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
    use tessera_model::service::{GpuAllocation, Measured, TaskDefRef};
    use tessera_model::taskdef::ContainerSpec;
    use tessera_model::{ComputeMilli, GpuUuid, MiB, MilliCpu, Percent, PoolName};

    fn task(allocations: Vec<GpuAllocation>) -> Task {
        Task {
            id: "t".into(),
            service: "s".into(),
            deployment_id: 1,
            task_definition: TaskDefRef {
                family: "f".into(),
                revision: 1,
            },
            pool: PoolName::new("p").expect("valid"),
            cpu: MilliCpu(1000),
            memory: MiB(64),
            state: TaskState::Assigned,
            migrating: false,
            host: None,
            allocations,
            placement_message: None,
            stop_reason: None,
            exit_code: None,
            measured: Measured::default(),
            ports: vec![],
            health: None,
            health_output: None,
            drain_until: None,
            created_at: String::new(),
            started_at: None,
            stopped_at: None,
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

    #[test]
    fn tokens_hash_and_compare() {
        let t = new_token();
        assert_eq!(t.len(), 64);
        assert_ne!(t, new_token());
        assert!(same(&hash_token(&t), &hash_token(&t)));
        assert!(!same(&hash_token(&t), &hash_token("other")));
        assert_eq!(host_id_from(Some("GPU_Node.01")), "gpu-node-01");
    }
}
