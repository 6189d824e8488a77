//! Placement against the live fleet: builds a placement engine for a pool from the store
//! (hosts, GPUs and what live tasks hold, through [`crate::capacity`]), places pending
//! tasks and commits them in one transaction that re-checks them with the engine's own
//! rules; and previews placements without committing.

use crate::capacity::{Held, PoolCapacity};
use crate::control::Control;
use crate::error::ControlError;
use crate::parts::{CachedEngine, PoolEngine};
use crate::store::{PendingTask, PlacementCommit, TaskFilter};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use tessera_model::project::Project;
use tessera_model::service::{
    GpuAllocation, Service, ServiceConstraints, Task, TaskDefRef, TaskState,
};
use tessera_model::taskdef::{Protocol, TaskDefinitionSpec, TaskGpu};
use tessera_model::{HostId, PlacementPolicy, PoolInfo, PoolName};
use tessera_placement::{
    Constraints, DemandProfile, Engine, GpuDemand, LabelRule, Placement, Policy, TaskRequest,
    describe_request,
};

/// The request a task of `spec` makes under a service's constraints.
pub(crate) fn request_for(
    spec: &TaskDefinitionSpec,
    c: &ServiceConstraints,
    avoid: BTreeSet<HostId>,
) -> TaskRequest {
    TaskRequest {
        cpu: spec.cpu(),
        memory: spec.memory(),
        gpu: match spec.gpu() {
            TaskGpu::None => GpuDemand::None,
            TaskGpu::Whole { count } => GpuDemand::Whole { count },
            TaskGpu::Shared { memory, compute } => GpuDemand::Shared { memory, compute },
        },
        constraints: Constraints {
            gpu_models: c.gpu_models.clone(),
            labels: c
                .labels
                .iter()
                .map(|(k, v)| LabelRule::Equals {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            distinct_hosts: c.distinct_hosts,
            avoid_hosts: avoid,
            max_per_gpu: c.max_per_gpu,
            max_per_host: c.max_per_host,
            gpu_counts: Default::default(),
            host_counts: Default::default(),
            host_ports: spec.fixed_host_ports(),
            ports_in_use: Default::default(),
            dynamic_ports: spec.ports().count() as u32 - spec.fixed_host_ports().len() as u32,
            dynamic_free: Default::default(),
            avoid_gpus: Default::default(),
        },
    }
}

/// `req` with what the service's `live` tasks hold counted against its caps (and, with
/// distinct hosts, their hosts avoided).
pub(crate) fn with_live(mut req: TaskRequest, live: &[Task]) -> TaskRequest {
    let c = &mut req.constraints;
    for t in live.iter().filter(|t| t.state.holds_capacity()) {
        let Some(h) = &t.host else { continue };
        if c.distinct_hosts {
            c.avoid_hosts.insert(h.clone());
        }
        if c.max_per_host.is_some() {
            *c.host_counts.entry(h.clone()).or_default() += 1;
        }
        if c.max_per_gpu.is_some() {
            for a in &t.allocations {
                *c.gpu_counts.entry(a.gpu.clone()).or_default() += 1;
            }
        }
    }
    req
}

impl Control {
    /// The specs of task definitions `refs`, each loaded once however often it is named.
    pub async fn task_definition_specs(
        &self,
        refs: Vec<TaskDefRef>,
    ) -> Result<HashMap<TaskDefRef, TaskDefinitionSpec>, ControlError> {
        let mut out = HashMap::new();
        for r in refs {
            if let std::collections::hash_map::Entry::Vacant(slot) = out.entry(r) {
                let spec = self.spec_of(slot.key()).await?;
                slot.insert(TaskDefinitionSpec::clone(&spec));
            }
        }
        Ok(out)
    }

    /// A pool as stored now: its settings, its hosts, and the tasks holding capacity on it.
    pub(crate) async fn pool_state(
        &self,
        pool: &PoolName,
    ) -> Result<(PoolInfo, Vec<tessera_model::HostInfo>, Vec<Task>), ControlError> {
        let info = self.store.get_pool(pool).await?;
        let hosts: Vec<_> = self
            .store
            .list_hosts()
            .await?
            .into_iter()
            .filter(|h| &h.pool == pool)
            .collect();
        let holding = self
            .store
            .list_tasks(&TaskFilter {
                pool: Some(pool.clone()),
                states: TaskState::HOLDING.to_vec(),
                ..Default::default()
            })
            .await?;
        Ok((info, hosts, holding))
    }

    /// Builds the engine for `pool`: its hosts (only active ones take tasks), their GPUs,
    /// and every allocation of its live tasks. `extra` joins the workload profile.
    pub(crate) async fn pool_engine(
        &self,
        pool: &PoolName,
        policy: Option<PlacementPolicy>,
        extra: &[TaskRequest],
    ) -> Result<PoolEngine, ControlError> {
        let (info, hosts, holding) = self.pool_state(pool).await?;
        let capacity = PoolCapacity::build(&info, &hosts, holding.iter().filter_map(Held::of));
        // The workload profile: what the pool runs plus what is being placed.
        let specs_by_ref = self
            .task_definition_specs(holding.iter().map(|t| t.task_definition.clone()).collect())
            .await?;
        let mut profile_requests: Vec<TaskRequest> = holding
            .iter()
            .map(|t| {
                request_for(
                    &specs_by_ref[&t.task_definition],
                    &ServiceConstraints::default(),
                    BTreeSet::new(),
                )
            })
            .collect();
        profile_requests.extend(extra.iter().cloned());
        let profile = DemandProfile::from_requests(&profile_requests);
        let policy = Policy::from(policy.unwrap_or(info.policy));
        let engine = Engine::new(capacity.snapshot, policy, &profile, 0x7e55e7a);
        Ok(PoolEngine {
            engine,
            pool: info,
            profiled: holding.into_iter().map(|t| t.task_definition).collect(),
        })
    }

    /// Places every pending task and commits what fits.
    pub(crate) async fn schedule(&self) -> Result<usize, ControlError> {
        let pending = self.store.list_pending().await?;
        // Claims of tasks no longer waiting are spent.
        {
            let waiting: HashSet<&str> = pending.iter().map(|t| t.id.as_str()).collect();
            self.scheduling
                .claims
                .lock()
                .retain(|id, _| waiting.contains(id.as_str()));
        }
        if pending.is_empty() {
            return Ok(0);
        }
        let services: HashMap<String, Service> = self
            .store
            .list_services()
            .await?
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        let specs = self
            .task_definition_specs(pending.iter().map(|t| t.task_definition.clone()).collect())
            .await?;
        let mut by_pool: BTreeMap<PoolName, Vec<&PendingTask>> = BTreeMap::new();
        for t in &pending {
            by_pool.entry(t.pool.clone()).or_default().push(t);
        }
        // Every project, for limits (placement) and guarantees (preemption).
        let projects: HashMap<String, Project> = self
            .store
            .list_projects()
            .await?
            .into_iter()
            .map(|p| (p.name.clone(), p))
            .collect();
        let mut placed_total = 0;
        for (pool, tasks) in by_pool {
            let extra: Vec<TaskRequest> = tasks
                .iter()
                .map(|t| {
                    request_for(
                        &specs[&t.task_definition],
                        &ServiceConstraints::default(),
                        BTreeSet::new(),
                    )
                })
                .collect();
            let epoch = self.scheduling.epoch();
            let pending_refs: HashSet<TaskDefRef> =
                tasks.iter().map(|t| t.task_definition.clone()).collect();
            let kept = self
                .scheduling
                .engines
                .take(&pool)
                .filter(|c| c.epoch == epoch && pending_refs.is_subset(&c.built.profiled));
            let mut cached = match kept {
                Some(cached) => cached,
                None => {
                    let mut built = self.pool_engine(&pool, None, &extra).await?;
                    self.scheduling.built();
                    built.profiled.extend(pending_refs);
                    CachedEngine { built, epoch }
                }
            };
            let PoolEngine {
                engine, pool: info, ..
            } = &mut cached.built;
            // Host ports taken in the pool and dynamic ones left, read only when a pending
            // task has ports; each placement below adds its own.
            let (mut ports_in_use, mut dynamic_free) = if tasks
                .iter()
                .any(|t| specs[&t.task_definition].ports().next().is_some())
            {
                self.ports_in_use(&pool).await?
            } else {
                Default::default()
            };
            // One service at a time, in the order its tasks were created.
            let mut by_service: Vec<(String, Vec<&PendingTask>)> = Vec::new();
            for t in tasks {
                match by_service.iter_mut().find(|(s, _)| *s == t.service) {
                    Some((_, v)) => v.push(t),
                    None => by_service.push((t.service.clone(), vec![t])),
                }
            }
            let mut commits = Vec::new();
            let mut complaints: Vec<(String, Vec<String>, String)> = Vec::new();
            // Each service's tasks that found no room (not held by their project's limit):
            // preemption may make room for them once this pass commits.
            let mut short: Vec<crate::preemption::Short> = Vec::new();
            // What each project uses in the pool, read fresh (the cached engine does not
            // know projects) when a limit bounds placement here or several projects wait
            // (fair share orders them); each placement adds to it.
            let limits = crate::projects::limits_in(&projects, pool.as_str());
            let waiting: HashSet<&str> = by_service
                .iter()
                .filter_map(|(name, _)| services.get(name).map(|s| s.project.as_str()))
                .collect();
            let mut project_use = if limits.is_empty() && waiting.len() < 2 {
                HashMap::new()
            } else {
                self.project_use_in(&pool, &services).await?
            };
            let capacity = if waiting.len() < 2 {
                Default::default()
            } else {
                self.pool_capacity_of(&pool).await?
            };
            // Fair share weighs what projects held over the last hour, not only now.
            let over_time = if waiting.len() < 2 {
                HashMap::new()
            } else {
                self.project_use_over_time(&pool, &project_use).await?
            };
            crate::projects::fair_order(
                &mut by_service,
                &services,
                &projects,
                &over_time,
                &capacity,
            );
            // Tasks with claimed room go first (their services, then they within them),
            // so nothing else takes the room their victims left.
            let claims = self.scheduling.claims.lock().clone();
            if !claims.is_empty() {
                for (_, tasks) in by_service.iter_mut() {
                    tasks.sort_by_key(|t| !claims.contains_key(&t.id));
                }
                by_service
                    .sort_by_key(|(_, tasks)| !tasks.iter().any(|t| claims.contains_key(&t.id)));
            }

            for (name, tasks) in by_service {
                let Some(service) = services.get(&name) else {
                    continue;
                };
                engine.set_policy(Policy::from(service.strategy.unwrap_or(info.policy)));
                let c = &service.constraints;
                let live =
                    if c.distinct_hosts || c.max_per_gpu.is_some() || c.max_per_host.is_some() {
                        self.live_tasks(&name).await?
                    } else {
                        Vec::new()
                    };
                // What the service holds, counted against its constraints; each placement
                // below is added for the tasks after it.
                let mut placed: Vec<Placement> = Vec::new();
                let mut unplaced = Vec::new();
                let mut sentence = String::new();
                // Interference: GPUs where a neighbour measured to break a latency target
                // runs are kept off while anything else has room.
                let (avoid, conflicts) = self
                    .interference_avoid(service, &services.values().collect::<Vec<_>>())
                    .await?;
                let (mut kept_off, mut beside) = (0usize, 0usize);
                let mut wanting: Option<(TaskRequest, Vec<String>)> = None;
                for t in tasks {
                    let mut req = with_live(
                        request_for(&specs[&t.task_definition], c, BTreeSet::new()),
                        &live,
                    );
                    for p in &placed {
                        if c.distinct_hosts {
                            req.constraints.avoid_hosts.insert(p.host_id.clone());
                        }
                        req.constraints
                            .count(&p.host_id, p.gpus.iter().map(|s| &s.uuid), 1);
                    }
                    if !req.constraints.host_ports.is_empty() {
                        req.constraints.ports_in_use = ports_in_use.clone();
                    }
                    if req.constraints.dynamic_ports > 0 {
                        req.constraints.dynamic_free = dynamic_free.clone();
                    }
                    let claimed = claims
                        .get(&t.id)
                        .and_then(|c| tessera_placement::quota::claimable(engine, c, &req));
                    let mut result = match claimed {
                        Some(p) => Ok(p),
                        None => engine.place(&req),
                    };
                    if result
                        .as_ref()
                        .is_ok_and(|p| p.gpus.iter().any(|g| avoid.contains(&g.uuid)))
                    {
                        req.constraints.avoid_gpus = avoid.clone();
                        match engine.place(&req) {
                            Ok(p) => {
                                kept_off += 1;
                                result = Ok(p);
                            }
                            Err(_) => beside += 1,
                        }
                        req.constraints.avoid_gpus.clear();
                    }
                    // The project's limit in this pool: a placement past it is undone
                    // (the engine has not assigned it yet) and the task waits.
                    let limit = limits.get(service.project.as_str());
                    if let (Some(limit), Ok(p)) = (limit, &result) {
                        let used = project_use.entry(service.project.clone()).or_default();
                        let after = used.plus(&crate::projects::reserved(
                            req.cpu,
                            req.memory,
                            &allocations(p),
                        ));
                        if let Some(over) = after.exceeds(limit) {
                            if sentence.is_empty() {
                                sentence = format!(
                                    "unable to place task ({}): project `{}` is at its limit in pool `{}`: it would use {over}",
                                    describe_request(&req),
                                    service.project,
                                    pool
                                );
                            }
                            unplaced.push(t.id.clone());
                            continue;
                        }
                        *used = after;
                    }
                    match result {
                        Ok(p) => {
                            ports_in_use
                                .entry(p.host_id.clone())
                                .or_default()
                                .extend(req.constraints.host_ports.iter().copied());
                            if let Some(free) = dynamic_free.get_mut(&p.host_id) {
                                *free = free.saturating_sub(req.constraints.dynamic_ports);
                            }
                            engine
                                .assign(&p)
                                .expect("a fresh placement fits its own engine");
                            placed.push(p.clone());
                            commits.push(PlacementCommit {
                                task_id: t.id.clone(),
                                host: p.host_id.clone(),
                                allocations: allocations(&p),
                            });
                        }
                        Err(rejection) => {
                            if sentence.is_empty() {
                                sentence = rejection.to_string();
                            }
                            wanting
                                .get_or_insert_with(|| (req.clone(), Vec::new()))
                                .1
                                .push(t.id.clone());
                            unplaced.push(t.id.clone());
                        }
                    }
                }
                if kept_off + beside > 0 {
                    let why: Vec<&str> = conflicts.iter().map(|c| c.why.as_str()).collect();
                    let mut words = Vec::new();
                    if kept_off > 0 {
                        words.push(format!(
                            "{kept_off} task(s) placed away from the GPUs of {}",
                            conflicts
                                .iter()
                                .map(|c| format!("`{}`", c.neighbour))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                    if beside > 0 {
                        words.push(format!(
                            "{beside} task(s) placed beside them: no other GPU had room"
                        ));
                    }
                    self.event(
                        Some(&name),
                        None,
                        &format!(
                            "placement: {} (interference: {})",
                            words.join("; "),
                            why.join("; ")
                        ),
                    )
                    .await;
                }
                if let Some((request, tasks)) = wanting {
                    short.push(crate::preemption::Short {
                        service: name.clone(),
                        request,
                        tasks,
                    });
                }
                if !unplaced.is_empty() {
                    complaints.push((name, unplaced, sentence));
                } else {
                    self.service_state_changed(&name, |s| s.pending = None);
                }
            }
            let started = std::time::Instant::now();
            let committed = self.store.commit_placements(&commits).await?;
            metrics::histogram!("tessera_placement_commit_seconds")
                .record(started.elapsed().as_secs_f64());
            placed_total += committed.len();
            if committed.len() < commits.len() {
                tracing::warn!(
                    pool = %pool,
                    refused = commits.len() - committed.len(),
                    "the engine's picture drifted from the store (the commit's re-check refused placements); rebuilding it"
                );
                self.wake();
            } else {
                self.scheduling.engines.insert(pool.clone(), cached);
            }
            let waiting_here: Vec<String> = short.iter().flat_map(|s| s.tasks.clone()).collect();
            let renewed = self.preempt_in(&pool, short, &services, &projects).await?;
            // A claim this pass did not renew (its project left its guarantee, its class
            // changed, no plan makes room) no longer puts its task first.
            self.scheduling
                .claims
                .lock()
                .retain(|id, _| !waiting_here.contains(id) || renewed.contains(id));
            for (service, ids, sentence) in complaints {
                self.store.set_placement_message(&ids, &sentence).await?;
                if self.service_state_changed(&service, |s| s.pending = Some(sentence.clone())) {
                    self.event(
                        Some(&service),
                        None,
                        &format!("{} task(s) pending: {sentence}", ids.len()),
                    )
                    .await;
                }
            }
        }
        if placed_total > 0 {
            self.wake();
        }
        Ok(placed_total)
    }

    /// Host ports held on each host of `pool` by tasks holding capacity there, and the
    /// dynamic ports each host's agent has left (less those of tasks placed there that
    /// it has not bound yet).
    #[allow(clippy::type_complexity)]
    pub(crate) async fn ports_in_use(
        &self,
        pool: &PoolName,
    ) -> Result<
        (
            BTreeMap<HostId, BTreeSet<(u16, Protocol)>>,
            BTreeMap<HostId, u32>,
        ),
        ControlError,
    > {
        let mut out: BTreeMap<HostId, BTreeSet<(u16, Protocol)>> = BTreeMap::new();
        let mut free: BTreeMap<HostId, u32> = self
            .store
            .list_hosts()
            .await?
            .into_iter()
            .filter(|h| &h.pool == pool)
            .filter_map(|h| Some((h.id, h.dynamic_ports_free?)))
            .collect();
        for t in self
            .store
            .list_tasks(&TaskFilter {
                pool: Some(pool.clone()),
                states: TaskState::HOLDING.to_vec(),
                without_allocations: true,
                ..Default::default()
            })
            .await?
        {
            if let Some(h) = &t.host {
                out.entry(h.clone()).or_default().extend(
                    t.ports
                        .iter()
                        .filter_map(|p| p.host_port.map(|port| (port, p.protocol))),
                );
                let unbound = t.ports.iter().filter(|p| p.host_port.is_none()).count() as u32;
                if let Some(f) = free.get_mut(h) {
                    *f = f.saturating_sub(unbound);
                }
            }
        }
        Ok((out, free))
    }
}

/// The allocations a placement makes, as stored.
pub(crate) fn allocations(p: &Placement) -> Vec<GpuAllocation> {
    p.gpus
        .iter()
        .map(|s| GpuAllocation {
            gpu: s.uuid.clone(),
            index: s.index,
            memory: s.memory,
            compute: s.compute,
            dedicated: s.dedicated,
        })
        .collect()
}
