//! Consolidation plans: moves computed by the placement engine
//! ([`tessera_placement::consolidate`]) that free whole GPUs or hosts of a pool, stored
//! without committing anything, and carried out on request by the scheduler's reconcile
//! pass one move at a time, start before stop: the replacement is placed on the planned
//! GPU (the commit re-checks capacity) and the original is marked as moving, so its service
//! stops it once the replacement runs. A move whose task no longer runs where the plan
//! found it, whose target has no room any more, or whose replacement fails halts the plan.

use crate::capacity::{Held, PoolCapacity};
use crate::control::Control;
use crate::error::ControlError;
use crate::inputs::Errors;
use crate::scheduler::{allocations, density, request_for};
use crate::store::{NewTask, PlacementCommit, StoredPlan};
use std::collections::{BTreeSet, HashMap};
use tessera_model::consolidation::{
    ConsolidationPlan, GpuBar, KeptService, MoveState, PlanInput, PlanStatus, PlannedMove,
};
use tessera_model::service::{GpuAllocation, Service, Task, TaskState};
use tessera_model::{GpuUuid, HostId, SharingMode};
use tessera_placement::consolidate::{Goal, Movable, plan};
use tessera_placement::{DemandProfile, Engine, GpuIdx, Policy};

/// The most moves one plan makes.
const MAX_MOVES: usize = 500;

/// Why a service's tasks stay where they are, if they must.
fn must_stay(service: &Service, tasks: &[&Task]) -> Option<String> {
    let desired = service.desired_count as usize;
    let max_total = (desired * service.deployment.maximum_percent as usize).div_ceil(100);
    if service.deleting {
        return Some("being deleted".into());
    }
    if max_total < desired + 1 {
        return Some(format!(
            "maximum_percent {} leaves no room for a replacement to start before its original stops",
            service.deployment.maximum_percent
        ));
    }
    if tasks.len() != desired
        || tasks.iter().any(|t| {
            t.state != TaskState::Running
                || t.migrating
                || t.task_definition != service.task_definition
        })
    {
        return Some("not steady (a deployment, a scale or a move is in progress)".into());
    }
    None
}

fn corrupt(message: String) -> ControlError {
    ControlError::Store(crate::StoreError::Corrupt {
        what: "consolidation plan",
        message,
    })
}

fn plan_body(p: &ConsolidationPlan) -> Result<StoredPlan, ControlError> {
    Ok(StoredPlan {
        id: p.id.clone(),
        pool: p.pool.clone(),
        goal: p.goal.clone(),
        status: p.status.as_str().to_owned(),
        created_at: p.created_at.clone(),
        body: serde_json::to_string(p).map_err(|e| corrupt(e.to_string()))?,
    })
}

fn from_stored(s: &StoredPlan) -> Result<ConsolidationPlan, ControlError> {
    serde_json::from_str(&s.body).map_err(|e| corrupt(format!("{}: {e}", s.id)))
}

impl Control {
    /// Each moved service's predicted change of latency and completed work: its tasks'
    /// neighbours after the moves against before, through the established interference
    /// estimates (a service without enough evidence is said to have none).
    async fn work_effects(
        &self,
        moves: &[PlannedMove],
        holding: &[Task],
        avoided: &[String],
    ) -> Result<Vec<String>, ControlError> {
        let gpus_of = |t: &Task| -> BTreeSet<GpuUuid> {
            t.allocations.iter().map(|a| a.gpu.clone()).collect()
        };
        let moved: HashMap<&str, BTreeSet<GpuUuid>> = moves
            .iter()
            .map(|m| {
                (
                    m.task_id.as_str(),
                    m.allocations.iter().map(|a| a.gpu.clone()).collect(),
                )
            })
            .collect();
        let after = |t: &Task| {
            moved
                .get(t.id.as_str())
                .cloned()
                .unwrap_or_else(|| gpus_of(t))
        };
        let neighbours = |t: &Task, gpus: &BTreeSet<GpuUuid>, moved_view: bool| -> Vec<String> {
            let mut n: Vec<String> = holding
                .iter()
                .filter(|o| o.id != t.id)
                .filter(|o| {
                    let theirs = if moved_view { after(o) } else { gpus_of(o) };
                    !theirs.is_disjoint(gpus)
                })
                .map(|o| o.service.clone())
                .collect();
            n.sort();
            n.dedup();
            n
        };
        let mut by_service: std::collections::BTreeMap<&str, Vec<&Task>> = Default::default();
        for m in moves {
            if let Some(t) = holding.iter().find(|t| t.id == m.task_id) {
                by_service.entry(t.service.as_str()).or_default().push(t);
            }
        }
        let mut out = Vec::new();
        for (service, tasks) in by_service {
            let est = self.estimates_of(service).await?;
            let factor = |names: &[String]| -> (f64, f64) {
                let mut lat = 1.0;
                let mut work = 1.0;
                for e in est
                    .0
                    .iter()
                    .filter(|e| e.established && names.contains(&e.neighbour))
                {
                    lat *= 1.0 + e.latency_p99_change.unwrap_or(0.0);
                    work *= 1.0 + e.completed_change.unwrap_or(0.0);
                }
                (lat, work)
            };
            let (mut lat, mut work) = (0.0, 0.0);
            for t in &tasks {
                let (lb, wb) = factor(&neighbours(t, &gpus_of(t), false));
                let (la, wa) = factor(&neighbours(t, &after(t), true));
                lat += la / lb - 1.0;
                work += wa / wb - 1.0;
            }
            let n = tasks.len() as f64;
            let pct = |v: f64| format!("{:+.0} %", v * 100.0);
            let measured = est.0.iter().any(|e| e.established);
            out.push(if measured {
                format!(
                    "{service}: {} task(s) move; predicted p99 {} and completed work {} per moved task",
                    tasks.len(),
                    pct(lat / n),
                    pct(work / n)
                )
            } else {
                format!(
                    "{service}: {} task(s) move; no established interference with their new neighbours (not enough evidence to predict a change)",
                    tasks.len()
                )
            });
        }
        let mut avoided = avoided.to_vec();
        avoided.sort();
        avoided.dedup();
        for why in avoided {
            out.push(format!(
                "moves onto GPUs shared with a conflicting neighbour were not planned ({why})"
            ));
        }
        Ok(out)
    }

    /// `POST /api/v1/consolidation-plans`: moves that free as many whole GPUs (or hosts) of
    /// `input.pool` as they can, honouring every service's constraints and deployment
    /// limits; stored, nothing committed.
    pub async fn plan_consolidation(
        &self,
        input: &PlanInput,
    ) -> Result<ConsolidationPlan, ControlError> {
        let mut e = Errors::default();
        let pool = e.pool(&input.pool);
        let goal = match input.goal.as_str() {
            "gpus" => Some(Goal::Gpus),
            "hosts" => Some(Goal::Hosts),
            other => {
                e.add("goal", format!("must be gpus or hosts, got {other:?}"));
                None
            }
        };
        e.finish()?;
        let (pool, goal) = (pool.expect("validated"), goal.expect("validated"));
        self.existing_pool(&pool).await?;
        let (info, hosts, holding) = self.pool_state(&pool).await?;
        let services: Vec<Service> = self
            .store
            .list_services()
            .await?
            .into_iter()
            .filter(|s| s.pool == pool)
            .collect();
        let capacity = PoolCapacity::build(&info, &hosts, holding.iter().filter_map(Held::of));
        let before = capacity.snapshot.clone();
        let mut kept = Vec::new();
        let mut avoided: Vec<String> = Vec::new();
        let mut movable = Vec::new();
        let mut task_of = Vec::new();
        for (group, s) in services.iter().enumerate() {
            let mine: Vec<&Task> = holding.iter().filter(|t| t.service == s.name).collect();
            if mine.is_empty() {
                continue;
            }
            let spec = self.spec_of(&s.task_definition).await?;
            // A move would have to find a fixed host port free on its target, which the
            // plan's engine does not track: such tasks stay where they are.
            let stay = must_stay(s, &mine).or_else(|| {
                (!spec.fixed_host_ports().is_empty())
                    .then(|| "its tasks hold fixed host ports".to_owned())
            });
            if let Some(why) = &stay {
                kept.push(KeptService {
                    service: s.name.clone(),
                    why: why.clone(),
                });
            }
            let mut req = request_for(&spec, &s.constraints, BTreeSet::new());
            // Never onto a GPU where a neighbour measured to break a latency target runs.
            let (avoid, conflicts) = self
                .interference_avoid(s, &services.iter().collect::<Vec<_>>())
                .await?;
            req.constraints.avoid_gpus = avoid;
            for c in conflicts {
                avoided.push(c.why);
            }
            for t in mine {
                let Some(h) = Held::of(t) else { continue };
                let Some(p) = capacity.placement(h.host, h.cpu, h.memory, h.allocations) else {
                    continue;
                };
                movable.push(Movable {
                    placement: p,
                    request: req.clone(),
                    group: group as u32,
                    fixed: stay.is_some(),
                });
                task_of.push(t);
            }
        }
        // Tasks of no service (none today) and tasks not counted above stay too.
        for t in holding
            .iter()
            .filter(|t| !services.iter().any(|s| s.name == t.service))
        {
            if let Some(h) = Held::of(t)
                && let Some(p) = capacity.placement(h.host, h.cpu, h.memory, h.allocations)
            {
                movable.push(Movable {
                    request: tessera_placement::TaskRequest::cpu_only(p.cpu, p.memory),
                    placement: p,
                    group: u32::MAX,
                    fixed: true,
                });
                task_of.push(t);
            }
        }
        let mut engine = Engine::new(
            capacity.snapshot,
            Policy::Binpack,
            &DemandProfile::default(),
            0x7e55e7a,
        );
        let out = plan(&mut engine, &movable, goal, MAX_MOVES);
        let after = engine.snapshot();
        // Each GPU's host and device index.
        let mut gpu_names: HashMap<GpuIdx, (HostId, u32)> = HashMap::new();
        for (hi, h) in hosts.iter().enumerate() {
            for (g, gpu) in before.gpus_of(hi as u32).zip(&h.gpus) {
                gpu_names.insert(g, (h.id.clone(), gpu.index));
            }
        }
        let used = |u: tessera_placement::GpuUsage| {
            if u.mode == SharingMode::Dedicated {
                u.memory_capacity.0
            } else {
                u.memory_capacity.0 - u.memory_free.0
            }
        };
        let gpus = (0..before.gpu_count() as GpuIdx)
            .filter(|&g| before.gpu_usage(g) != after.gpu_usage(g))
            .filter_map(|g| {
                let (host, index) = gpu_names.get(&g)?;
                Some(GpuBar {
                    host: host.to_string(),
                    index: *index,
                    capacity_mib: before.gpu_usage(g).memory_capacity.0,
                    before_mib: used(before.gpu_usage(g)),
                    after_mib: used(after.gpu_usage(g)),
                })
            })
            .collect();
        let name = |g: &GpuIdx| {
            gpu_names
                .get(g)
                .map_or_else(String::new, |(h, i)| format!("{h}/GPU {i}"))
        };
        let moves: Vec<PlannedMove> = out
            .moves
            .iter()
            .map(|m| {
                let t = task_of[m.task];
                PlannedMove {
                    task_id: t.id.clone(),
                    service: t.service.clone(),
                    from_host: m.from.host_id.to_string(),
                    from_gpus: m.from.gpus.iter().map(|s| s.index).collect(),
                    to_host: m.to.host_id.to_string(),
                    to_gpus: m.to.gpus.iter().map(|s| s.index).collect(),
                    allocations: allocations(&m.to),
                    state: MoveState::Pending,
                    replacement: None,
                    message: None,
                    started_at: None,
                }
            })
            .collect();
        let work_effects = self.work_effects(&moves, &holding, &avoided).await?;
        let plan = ConsolidationPlan {
            id: uuid::Uuid::new_v4().to_string(),
            pool: pool.to_string(),
            goal: input.goal.clone(),
            status: PlanStatus::Planned,
            created_at: crate::clock::stamp(self.now()),
            moves,
            frees_gpus: out.freed_gpus.iter().map(name).collect(),
            frees_hosts: out
                .freed_hosts
                .iter()
                .map(|&h| before.host_id(h).to_string())
                .collect(),
            density_before: density(&before),
            density_after: density(after),
            gpus,
            kept,
            work_effects,
            finished_at: None,
            message: None,
        };
        self.store.save_plan(&plan_body(&plan)?).await?;
        Ok(plan)
    }

    pub async fn consolidation_plan(&self, id: &str) -> Result<ConsolidationPlan, ControlError> {
        from_stored(&self.store.get_plan(id).await?)
    }

    /// The newest plans first.
    pub async fn consolidation_plans(&self) -> Result<Vec<ConsolidationPlan>, ControlError> {
        self.store
            .list_plans(20)
            .await?
            .iter()
            .map(from_stored)
            .collect()
    }

    /// Starts carrying out a planned plan (`Conflict` in any other status).
    pub async fn execute_consolidation_plan(
        &self,
        id: &str,
    ) -> Result<ConsolidationPlan, ControlError> {
        let mut plan = self.consolidation_plan(id).await?;
        if plan.status != PlanStatus::Planned {
            return Err(ControlError::Conflict(format!(
                "consolidation plan {id} is {}; only a planned plan can be executed",
                plan.status.as_str()
            )));
        }
        plan.status = PlanStatus::Executing;
        self.store_plan_if(&plan, PlanStatus::Planned).await?;
        self.event(
            None,
            None,
            &format!(
                "consolidation plan {id} in pool {}: executing {} move(s), start before stop",
                plan.pool,
                plan.moves.len()
            ),
        )
        .await;
        self.wake();
        Ok(plan)
    }

    /// Stops a plan: no further move starts (one already started finishes).
    pub async fn cancel_consolidation_plan(
        &self,
        id: &str,
    ) -> Result<ConsolidationPlan, ControlError> {
        let mut plan = self.consolidation_plan(id).await?;
        if !matches!(plan.status, PlanStatus::Planned | PlanStatus::Executing) {
            return Err(ControlError::Conflict(format!(
                "consolidation plan {id} is {} already",
                plan.status.as_str()
            )));
        }
        let was = plan.status;
        plan.status = PlanStatus::Cancelled;
        plan.message = Some("cancelled by an operator".into());
        self.store_plan_if(&plan, was).await?;
        self.event(None, None, &format!("consolidation plan {id} cancelled"))
            .await;
        Ok(plan)
    }

    /// One step of every executing plan (from the reconcile pass): start the next move,
    /// or see whether the move under way finished.
    pub(crate) async fn advance_consolidation(&self) -> Result<(), ControlError> {
        for stored in self.store.list_plans(20).await? {
            let executing = stored.status == PlanStatus::Executing.as_str();
            if !executing && stored.status != PlanStatus::Done.as_str() {
                continue;
            }
            let mut plan = from_stored(&stored)?;
            let before = plan.clone();
            // A moved service whose alarm fires after its move: its moves are undone (while
            // the plan executes, and for the service's bake time after it is done).
            let undone = self.undo_on_alarm(&mut plan).await?;
            if executing && !undone {
                self.advance_plan(&mut plan).await?;
            }
            if plan != before
                && !self
                    .store
                    .update_plan(&plan_body(&plan)?, &stored.status)
                    .await?
            {
                // Cancelled meanwhile: the cancel stands (a move it started finishes).
                tracing::info!(plan = %plan.id, "consolidation plan changed meanwhile; its step is not recorded");
            }
        }
        Ok(())
    }

    /// Stores `plan` if its stored status is still `expected` (`Conflict` otherwise: an
    /// execute, a cancel or a pass changed it meanwhile).
    async fn store_plan_if(
        &self,
        plan: &ConsolidationPlan,
        expected: PlanStatus,
    ) -> Result<(), ControlError> {
        if self
            .store
            .update_plan(&plan_body(plan)?, expected.as_str())
            .await?
        {
            Ok(())
        } else {
            Err(ControlError::Conflict(format!(
                "consolidation plan {} changed meanwhile; look again and retry",
                plan.id
            )))
        }
    }

    async fn advance_plan(&self, plan: &mut ConsolidationPlan) -> Result<(), ControlError> {
        let id = plan.id.clone();
        let Some(i) = plan.moves.iter().position(|m| m.state != MoveState::Done) else {
            plan.status = PlanStatus::Done;
            plan.finished_at = Some(self.unix_now());
            self.event(
                None,
                None,
                &format!(
                    "consolidation plan {id} done: {} move(s); freed {}",
                    plan.moves.len(),
                    if plan.goal == "hosts" {
                        format!("{} host(s)", plan.frees_hosts.len())
                    } else {
                        format!("{} GPU(s)", plan.frees_gpus.len())
                    }
                ),
            )
            .await;
            return Ok(());
        };
        let m = plan.moves[i].clone();
        let fail = |plan: &mut ConsolidationPlan, why: String| {
            plan.moves[i].state = MoveState::Failed;
            plan.moves[i].message = Some(why.clone());
            plan.status = PlanStatus::Failed;
            plan.message = Some(format!(
                "halted at move {} of {}: {why}",
                i + 1,
                plan.moves.len()
            ));
        };
        match m.state {
            MoveState::Pending => {
                let task = match self.store.get_task(&m.task_id).await {
                    Ok(t) => Some(t),
                    Err(crate::StoreError::NotFound { .. }) => None,
                    Err(e) => return Err(e.into()),
                };
                let Some(t) = task.filter(|t| {
                    t.state == TaskState::Running
                        && !t.migrating
                        && t.host.as_ref().map(HostId::as_str) == Some(m.from_host.as_str())
                }) else {
                    fail(
                        plan,
                        format!(
                            "task {} no longer runs on {} as planned",
                            m.task_id, m.from_host
                        ),
                    );
                    self.plan_event(plan, &m).await;
                    return Ok(());
                };
                let to = HostId::new(m.to_host.clone()).map_err(|e| corrupt(e.to_string()))?;
                let replacement = uuid::Uuid::new_v4().to_string();
                // One transaction: the replacement placed on the target and the original
                // marked as moving, or nothing (a crash between them would leave the
                // service a task over, and a restarted plan would start a second one).
                let started = self
                    .store
                    .start_move(
                        &t.id,
                        t.host.as_ref().expect("a running task has a host"),
                        &NewTask::of(
                            replacement.clone(),
                            &t.service,
                            t.deployment_id,
                            &t.task_definition,
                            &t.pool,
                            &*self.spec_of(&t.task_definition).await?,
                        ),
                        &PlacementCommit {
                            task_id: replacement.clone(),
                            host: to.clone(),
                            allocations: m.allocations.clone(),
                        },
                    )
                    .await?;
                if !started {
                    fail(
                        plan,
                        format!(
                            "{}/GPU {:?} no longer has room for task {} (or the task changed meanwhile)",
                            m.to_host, m.to_gpus, m.task_id
                        ),
                    );
                    self.plan_event(plan, &m).await;
                    return Ok(());
                }
                self.capacity_changed();
                let mv = &mut plan.moves[i];
                mv.state = MoveState::Starting;
                mv.replacement = Some(replacement.clone());
                mv.started_at = Some(self.unix_now());
                self.event(
                    Some(&t.service),
                    Some(&to),
                    &format!(
                        "consolidation plan {id}: moving task {} from {}/GPU {:?} to {}/GPU {:?}; replacement {replacement} starts first",
                        t.id, m.from_host, m.from_gpus, m.to_host, m.to_gpus
                    ),
                )
                .await;
            }
            MoveState::Starting => {
                let Some(rid) = m.replacement.clone() else {
                    fail(plan, "a started move has no replacement".into());
                    return Ok(());
                };
                let replacement = self.store.get_task(&rid).await?;
                let original = self.store.get_task(&m.task_id).await.ok();
                if replacement.state == TaskState::Stopped {
                    if let Some(o) = original.as_ref().filter(|o| o.state.is_live()) {
                        self.store.set_task_migrating(&o.id, false).await?;
                    }
                    fail(
                        plan,
                        format!(
                            "replacement {rid} stopped: {}",
                            replacement
                                .stop_reason
                                .as_deref()
                                .unwrap_or("unknown reason")
                        ),
                    );
                    self.plan_event(plan, &m).await;
                } else if original.is_none_or(|o| o.state == TaskState::Stopped) {
                    plan.moves[i].state = MoveState::Done;
                    self.event(
                        Some(&m.service),
                        None,
                        &format!(
                            "consolidation plan {id}: task {} moved to {}/GPU {:?} as {rid} ({} of {})",
                            m.task_id,
                            m.to_host,
                            m.to_gpus,
                            i + 1,
                            plan.moves.len()
                        ),
                    )
                    .await;
                }
            }
            MoveState::Done | MoveState::Failed | MoveState::Undone => {}
        }
        Ok(())
    }

    /// Undoes the moves of a moved service whose alarm fired after its first move started,
    /// while the plan is watched (executing, or done less than the service's bake time
    /// ago): done moves are moved back to their original GPUs (replacement first, as any
    /// move), a starting move's replacement is stopped, and an executing plan halts.
    /// Whether anything was undone.
    async fn undo_on_alarm(&self, plan: &mut ConsolidationPlan) -> Result<bool, ControlError> {
        let now = self.unix_now();
        let services: BTreeSet<String> = plan
            .moves
            .iter()
            .filter(|m| matches!(m.state, MoveState::Starting | MoveState::Done))
            .map(|m| m.service.clone())
            .collect();
        let mut undone = false;
        for name in services {
            let Ok(service) = self.store.get_service(&name).await else {
                continue;
            };
            if service.objectives.alarms.is_empty() {
                continue;
            }
            if plan.status == PlanStatus::Done
                && plan
                    .finished_at
                    .is_none_or(|f| now - f > i64::from(service.objectives.bake_secs))
            {
                continue;
            }
            let first = plan
                .moves
                .iter()
                .filter(|m| m.service == name)
                .filter_map(|m| m.started_at)
                .min()
                .unwrap_or(now);
            let fired = {
                let watches = self.passes.watches.lock();
                service
                    .objectives
                    .alarms
                    .iter()
                    .enumerate()
                    .find_map(|(i, a)| {
                        let w = watches.alarms.get(&(name.clone(), i))?;
                        let at = w.fired_at.filter(|&at| at >= first)?;
                        Some((a.describe(), w.value, at))
                    })
            };
            let Some((alarm, value, _)) = fired else {
                continue;
            };
            let why = format!(
                "alarm `{alarm}` of {name} fired after its tasks moved{}",
                value
                    .map(|v| format!(
                        " ({})",
                        tessera_model::work::trim_float((v * 10.0).round() / 10.0)
                    ))
                    .unwrap_or_default()
            );
            let mut back = 0;
            for i in 0..plan.moves.len() {
                let m = plan.moves[i].clone();
                if m.service != name {
                    continue;
                }
                match m.state {
                    MoveState::Done => {
                        if self.move_back(&m).await? {
                            back += 1;
                            plan.moves[i].state = MoveState::Undone;
                            plan.moves[i].message = Some(format!("moved back: {why}"));
                        } else {
                            plan.moves[i].message = Some(format!(
                                "{why}; not moved back: its original GPU has no room now"
                            ));
                        }
                    }
                    MoveState::Starting => {
                        if let Some(rid) = &m.replacement {
                            self.store
                                .request_task_stop(
                                    rid,
                                    "its move was undone: an alarm fired",
                                    None,
                                    false,
                                )
                                .await?;
                        }
                        if let Ok(o) = self.store.get_task(&m.task_id).await
                            && o.state.is_live()
                        {
                            self.store.set_task_migrating(&o.id, false).await?;
                        }
                        plan.moves[i].state = MoveState::Undone;
                        plan.moves[i].message = Some(format!("cancelled: {why}"));
                    }
                    _ => {}
                }
            }
            if plan.status == PlanStatus::Executing {
                plan.status = PlanStatus::Failed;
            }
            plan.message = Some(format!("halted: {why}; {back} move(s) moved back"));
            self.event(
                Some(&name),
                None,
                &format!(
                    "consolidation plan {}: {why}: {back} of its task(s) moved back",
                    plan.id
                ),
            )
            .await;
            self.capacity_changed();
            self.wake();
            undone = true;
        }
        Ok(undone)
    }

    /// Starts the moved task of `m` again on the GPUs it left (its replacement there
    /// starts first). False when they no longer have room.
    async fn move_back(&self, m: &PlannedMove) -> Result<bool, ControlError> {
        let Some(rid) = &m.replacement else {
            return Ok(false);
        };
        let Ok(moved) = self.store.get_task(rid).await else {
            return Ok(false);
        };
        let from = HostId::new(m.from_host.clone()).map_err(|e| corrupt(e.to_string()))?;
        let to = HostId::new(m.to_host.clone()).map_err(|e| corrupt(e.to_string()))?;
        let host = self.store.get_host(&from).await?;
        let allocations: Vec<GpuAllocation> = m
            .from_gpus
            .iter()
            .zip(&m.allocations)
            .filter_map(|(&index, a)| {
                let gpu = host.gpus.iter().find(|g| g.index == index)?;
                Some(GpuAllocation {
                    gpu: gpu.uuid.clone(),
                    index,
                    memory: a.memory,
                    compute: a.compute,
                    dedicated: a.dedicated,
                })
            })
            .collect();
        if allocations.len() != m.allocations.len() {
            return Ok(false);
        }
        let back = uuid::Uuid::new_v4().to_string();
        Ok(self
            .store
            .start_move(
                &moved.id,
                &to,
                &NewTask::of(
                    back.clone(),
                    &moved.service,
                    moved.deployment_id,
                    &moved.task_definition,
                    &moved.pool,
                    &*self.spec_of(&moved.task_definition).await?,
                ),
                &PlacementCommit {
                    task_id: back,
                    host: from,
                    allocations,
                },
            )
            .await?)
    }

    async fn plan_event(&self, plan: &ConsolidationPlan, m: &PlannedMove) {
        let message = format!(
            "consolidation plan {} {}",
            plan.id,
            plan.message.as_deref().unwrap_or("failed")
        );
        self.event(Some(&m.service), None, &message).await;
    }
}
