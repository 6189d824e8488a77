//! Placement against the live fleet: builds a placement engine for a pool from the store
//! (hosts, GPUs and what live tasks hold, through [`crate::capacity`]), places pending
//! tasks and commits them in one transaction that re-checks them with the engine's own
//! rules; and previews placements without committing.

mod limits;
mod preemption;
mod preview;
mod sizing;
mod state;
mod steps;

pub use preview::{density, density_of};
pub(crate) use state::{CachedEngine, PoolEngine, Scheduling};

pub(crate) use steps::{allocations, request_for};

use crate::capacity::{Held, PoolCapacity};
use crate::error::ControlError;
use crate::parts::{Core, ServiceStates};
use crate::store::{PendingTask, PlacementCommit, SchedulerStore, TaskFilter};
use crate::work::InterferenceModel;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use steps::{PortBook, ProjectLedger, ServiceBatch};
use tessera_model::project::Project;
use tessera_model::service::{
    Service, ServiceConstraints, Task, TaskDefRef, TaskDefinition, TaskState,
};
use tessera_model::taskdef::{Protocol, TaskDefinitionSpec};
use tessera_model::{HostId, PlacementPolicy, PoolInfo, PoolName};
use tessera_placement::{DemandProfile, Engine, Policy, TaskRequest};

/// The scheduler: places pending tasks against the live fleet, holds them to projects'
/// limits, preempts, and keeps what it learnt between passes (each pool's engine, the
/// capacity epoch that makes them stale, revisions' specs).
#[derive(Clone)]
pub struct Scheduler {
    store: Arc<dyn SchedulerStore>,
    core: Core,
    /// What it keeps between passes (see [`Scheduling`]).
    state: Arc<Scheduling>,
    /// Where it says why a service's tasks wait (an event when that changes).
    service_states: Arc<ServiceStates>,
    /// Asked which GPUs a service should keep off.
    interference: InterferenceModel,
}

impl Scheduler {
    pub(crate) fn new(
        store: Arc<dyn SchedulerStore>,
        core: Core,
        service_states: Arc<ServiceStates>,
        interference: InterferenceModel,
    ) -> Self {
        Scheduler {
            store,
            core,
            state: Arc::default(),
            service_states,
            interference,
        }
    }

    /// The same scheduler writing through `store` (a pass's fenced store) and asking
    /// `interference` (built on the same store); its state is shared.
    pub(crate) fn with_store(
        &self,
        store: Arc<dyn SchedulerStore>,
        core: Core,
        interference: InterferenceModel,
    ) -> Self {
        Scheduler {
            store,
            core,
            state: self.state.clone(),
            service_states: self.service_states.clone(),
            interference,
        }
    }

    /// Capacity changed outside the scheduler: its cached engines are rebuilt next pass,
    /// and the other servers on this database hear of it (theirs are too).
    pub(crate) fn capacity_changed(&self) {
        self.state.capacity_changed();
        self.core.publish("capacity");
    }

    /// How many engines were built from the store (tests: a pass reused its engine).
    #[cfg(test)]
    pub(crate) fn engine_builds(&self) -> u64 {
        self.state.builds()
    }

    /// Capacity may have changed on another server: the cached engines are rebuilt next
    /// pass (the change is not published again).
    pub(crate) fn capacity_changed_elsewhere(&self) {
        self.state.capacity_changed();
    }

    /// The spec of revision `r`, from memory after the first read (revisions are
    /// immutable; only whether new tasks may use them changes).
    pub(crate) async fn spec_of(
        &self,
        r: &TaskDefRef,
    ) -> Result<Arc<TaskDefinitionSpec>, ControlError> {
        if let Some(spec) = self.state.specs.get(r) {
            return Ok(spec);
        }
        let spec = Arc::new(self.store.get_task_definition(r).await?.spec);
        self.state.specs.insert(r.clone(), spec.clone());
        Ok(spec)
    }

    /// The definition `r` names, if new tasks may use it (registered and active); the error
    /// names the `task_definition` field. The one check the API, the console, the preview
    /// and the scheduler's inputs share.
    pub(crate) async fn usable_definition(
        &self,
        r: &TaskDefRef,
    ) -> Result<TaskDefinition, ControlError> {
        let def = self.store.get_task_definition(r).await.map_err(|_| {
            ControlError::invalid(
                "task_definition",
                format!("no task definition {r} is registered"),
            )
        })?;
        if !def.active {
            return Err(ControlError::invalid(
                "task_definition",
                format!("{r} is deregistered; use an active revision"),
            ));
        }
        Ok(def)
    }

    /// The pool named `name`, or an error naming the `pool` field.
    pub(crate) async fn existing_pool(&self, name: &PoolName) -> Result<PoolInfo, ControlError> {
        self.store.get_pool(name).await.map_err(|_| {
            ControlError::invalid("pool", format!("no pool named {:?}", name.as_str()))
        })
    }

    /// The tasks of `service` not stopped (pending ones included), without allocations.
    pub(crate) async fn live_tasks(
        &self,
        service: &str,
    ) -> Result<Vec<tessera_model::service::Task>, ControlError> {
        Ok(self
            .store
            .list_tasks(&TaskFilter {
                service: Some(service.to_owned()),
                states: vec![
                    TaskState::Pending,
                    TaskState::Assigned,
                    TaskState::Running,
                    TaskState::Stopping,
                ],
                without_allocations: true,
                ..Default::default()
            })
            .await?)
    }
}

/// What a scheduling pass reads once for every pool.
struct PassInputs {
    services: HashMap<String, Service>,
    specs: HashMap<TaskDefRef, TaskDefinitionSpec>,
    projects: HashMap<String, Project>,
}

impl Scheduler {
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
            self.state
                .claims
                .lock()
                .retain(|id, _| waiting.contains(id.as_str()));
        }
        if pending.is_empty() {
            return Ok(0);
        }
        let pass = PassInputs {
            services: self
                .store
                .list_services()
                .await?
                .into_iter()
                .map(|s| (s.name.clone(), s))
                .collect(),
            specs: self
                .task_definition_specs(pending.iter().map(|t| t.task_definition.clone()).collect())
                .await?,
            // Every project, for limits (placement) and guarantees (preemption).
            projects: self
                .store
                .list_projects()
                .await?
                .into_iter()
                .map(|p| (p.name.clone(), p))
                .collect(),
        };
        let mut placed_total = 0;
        for (pool, tasks) in steps::by_pool(&pending) {
            placed_total += self.schedule_pool(&pool, tasks, &pass).await?;
        }
        if placed_total > 0 {
            self.core.wake();
        }
        Ok(placed_total)
    }

    /// One pool's part of a pass: order its services, place their tasks, commit, and plan
    /// preemption for what found no room.
    async fn schedule_pool(
        &self,
        pool: &PoolName,
        tasks: Vec<&PendingTask>,
        pass: &PassInputs,
    ) -> Result<usize, ControlError> {
        let mut cached = self.pass_engine(pool, &tasks, &pass.specs).await?;
        // Host ports taken in the pool and dynamic ones left, read only when a pending
        // task has ports; each placement below adds its own.
        let mut ports = if tasks
            .iter()
            .any(|t| pass.specs[&t.task_definition].ports().next().is_some())
        {
            let (in_use, dynamic_free) = self.ports_in_use(pool).await?;
            PortBook {
                in_use,
                dynamic_free,
            }
        } else {
            PortBook::default()
        };
        let mut by_service = steps::by_service(tasks);
        let mut ledger = self.order_services(pool, &mut by_service, pass).await?;
        let claims = self.state.claims.lock().clone();
        steps::claims_first(&mut by_service, &claims);

        let mut commits = Vec::new();
        // Each service's placements (their range in `commits`), and what chose them, for
        // its events.
        let mut placed_by_service: Vec<(String, String, std::ops::Range<usize>)> = Vec::new();
        let mut complaints: Vec<(String, Vec<String>, String)> = Vec::new();
        // Each service's tasks that found no room (not held by their project's limit):
        // preemption may make room for them once this pass commits.
        let mut short: Vec<preemption::Short> = Vec::new();
        let PoolEngine {
            engine, pool: info, ..
        } = &mut cached.built;
        for (name, tasks) in by_service {
            let Some(service) = pass.services.get(&name) else {
                continue;
            };
            let policy = service.strategy.unwrap_or(info.policy);
            engine.set_policy(Policy::from(policy));
            let live = if steps::counts_live(&service.constraints) {
                self.live_tasks(&name).await?
            } else {
                Vec::new()
            };
            // Interference: GPUs where a neighbour measured to break a latency target
            // runs are kept off while anything else has room.
            let (avoid, conflicts) = self
                .interference
                .interference_avoid(service, &pass.services.values().collect::<Vec<_>>())
                .await?;
            let mut batch = ServiceBatch::new(pool, service, &live, avoid);
            for t in tasks {
                let spec = &pass.specs[&t.task_definition];
                batch.place(engine, t, spec, claims.get(&t.id), &mut ports, &mut ledger);
            }
            let conflicts: Vec<(&str, &str)> = conflicts
                .iter()
                .map(|c| (c.neighbour.as_str(), c.why.as_str()))
                .collect();
            if let Some(said) = batch.interference_said(&conflicts) {
                self.core.event(Some(&name), None, &said).await;
            }
            let from = commits.len();
            commits.append(&mut batch.commits);
            if commits.len() > from {
                let why = match service.strategy {
                    Some(_) => format!("the service's {policy} strategy"),
                    None => format!("pool {pool}'s {policy} policy"),
                };
                placed_by_service.push((name.clone(), why, from..commits.len()));
            }
            if let Some((request, tasks)) = batch.wanting {
                short.push(preemption::Short {
                    service: name.clone(),
                    request,
                    tasks,
                });
            }
            if !batch.unplaced.is_empty() {
                complaints.push((name, batch.unplaced, batch.sentence));
            } else {
                self.service_states.changed(&name, |s| s.pending = None);
            }
        }
        let committed = self.commit_pass(pool, cached, &commits).await?;
        for (service, why, mine) in placed_by_service {
            if let Some(said) = steps::placed_said(&commits[mine], &committed, &why) {
                self.core.event(Some(&service), None, &said).await;
            }
        }
        self.after_pass(pool, short, complaints, pass).await?;
        Ok(committed.len())
    }

    /// The engine a pass places `tasks` of `pool` with: the one kept from the last pass
    /// when nothing changed capacity since and its profile knows every pending revision,
    /// else one built from the store.
    async fn pass_engine(
        &self,
        pool: &PoolName,
        tasks: &[&PendingTask],
        specs: &HashMap<TaskDefRef, TaskDefinitionSpec>,
    ) -> Result<CachedEngine, ControlError> {
        let epoch = self.state.epoch();
        let pending_refs: HashSet<TaskDefRef> =
            tasks.iter().map(|t| t.task_definition.clone()).collect();
        let kept = self
            .state
            .engines
            .take(pool)
            .filter(|c| c.epoch == epoch && pending_refs.is_subset(&c.built.profiled));
        if let Some(cached) = kept {
            return Ok(cached);
        }
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
        let mut built = self.pool_engine(pool, None, &extra).await?;
        self.state.built();
        built.profiled.extend(pending_refs);
        Ok(CachedEngine { built, epoch })
    }

    /// Orders `by_service` fairly (priority, then projects' weighted share over time) and
    /// returns the ledger that holds the pass to projects' limits in `pool`. What each
    /// project uses is read fresh (the cached engine does not know projects) only when a
    /// limit bounds placement here or several projects wait.
    async fn order_services<'p>(
        &self,
        pool: &PoolName,
        by_service: &mut [(String, Vec<&PendingTask>)],
        pass: &'p PassInputs,
    ) -> Result<ProjectLedger<'p>, ControlError> {
        let limits = crate::projects::shares::limits_in(&pass.projects, pool.as_str());
        let waiting: HashSet<&str> = by_service
            .iter()
            .filter_map(|(name, _)| pass.services.get(name).map(|s| s.project.as_str()))
            .collect();
        let several = waiting.len() >= 2;
        let used = if limits.is_empty() && !several {
            HashMap::new()
        } else {
            self.project_use_in(pool, &pass.services).await?
        };
        // Fair share weighs what projects held over the last hour, not only now; with one
        // project waiting only priority orders.
        let (over_time, capacity) = if several {
            (
                self.project_use_over_time(pool, &used).await?,
                self.pool_capacity_of(pool).await?,
            )
        } else {
            Default::default()
        };
        crate::projects::shares::fair_order(
            by_service,
            &pass.services,
            &pass.projects,
            &over_time,
            &capacity,
        );
        Ok(ProjectLedger::new(limits, used))
    }

    /// Commits a pass's placements in `pool`; keeps its engine for the next pass only if
    /// every one was committed (else the engine's picture drifted from the store).
    async fn commit_pass(
        &self,
        pool: &PoolName,
        cached: CachedEngine,
        commits: &[PlacementCommit],
    ) -> Result<HashSet<String>, ControlError> {
        let started = std::time::Instant::now();
        let committed = self.store.commit_placements(commits).await?;
        metrics::histogram!("tessera_placement_commit_seconds")
            .record(started.elapsed().as_secs_f64());
        if committed.len() < commits.len() {
            tracing::warn!(
                pool = %pool,
                refused = commits.len() - committed.len(),
                "the engine's picture drifted from the store (the commit's re-check refused placements); rebuilding it"
            );
            self.core.wake();
        } else {
            self.state.engines.insert(pool.clone(), cached);
        }
        Ok(committed.into_iter().collect())
    }

    /// After a pool's commit: preemption plans room for the tasks that found none, claims
    /// it did not renew are dropped, and each waiting service says why.
    async fn after_pass(
        &self,
        pool: &PoolName,
        short: Vec<preemption::Short>,
        complaints: Vec<(String, Vec<String>, String)>,
        pass: &PassInputs,
    ) -> Result<(), ControlError> {
        let waiting_here: HashSet<String> = short.iter().flat_map(|s| s.tasks.clone()).collect();
        let preempted = self
            .preempt_in(pool, short, &pass.services, &pass.projects)
            .await?;
        let renewed = preempted.renewed;
        // A claim this pass did not renew (its project left its guarantee, its class
        // changed, no plan makes room) no longer puts its task first.
        self.state
            .claims
            .lock()
            .retain(|id, _| !waiting_here.contains(id) || renewed.contains(id));
        for (service, ids, mut sentence) in complaints {
            if let Some(note) = preempted.notes.get(&service) {
                sentence = format!("{sentence}; {note}");
            }
            self.store.set_placement_message(&ids, &sentence).await?;
            if self
                .service_states
                .changed(&service, |s| s.pending = Some(sentence.clone()))
            {
                self.core
                    .event(
                        Some(&service),
                        None,
                        &format!("{} task(s) pending: {sentence}", ids.len()),
                    )
                    .await;
            }
        }
        Ok(())
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
