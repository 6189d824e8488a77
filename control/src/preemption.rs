//! Preemption: when a task of a project within its guarantee cannot be placed, tasks of a
//! lower priority class that use borrowed capacity are stopped to make room for it.
//!
//! The scheduler asks after a pass's placements are committed, once per pool, for the
//! tasks that found no room, in the order it placed them. Each gets room of its own
//! (`tessera_placement::quota::Claims`): a plan (`tessera_placement::preempt`) stops the
//! fewest tasks, lowest priority then smallest, on one GPU or host, never takes a project
//! below its guarantee, and is checked by the engine on the plan's host (the task's
//! constraints). The room is then *claimed* for the task: later plans in the pass do not
//! count it as free, and the next passes place the task there first, before anything else
//! can take it. The victims stop as any stop does (out of the endpoint list first, then
//! signalled); their services start replacements, which wait like any other task. Stopping
//! tasks' room counts as free, so nothing more is stopped for a task whose room is coming.
//!
//! Claims live in the scheduler's memory: a server that restarts forgets them, and the
//! waiting tasks claim again on its first pass (their victims' room counts as free then).

use crate::capacity::{Held, PoolCapacity};
use crate::control::Control;
use crate::error::ControlError;
use crate::projects::usage_by_project;
use std::collections::{HashMap, HashSet};
use tessera_model::PoolName;
use tessera_model::PreemptionMode;
use tessera_model::project::{DEFAULT_PROJECT, Preempted, PreemptionState, Project, Usage};
use tessera_model::service::{PriorityClass, Service, TaskState};
use tessera_placement::quota::{self, Claims, within_guarantee};
use tessera_placement::{Placement, TaskRequest};

/// Tasks of one service that found no room in a pass (not held by their project's limit),
/// with the request the scheduler made for them.
pub(crate) struct Short {
    pub service: String,
    pub request: TaskRequest,
    pub tasks: Vec<String>,
}

impl Control {
    /// Makes room, where the rules allow it, for the tasks in `short` (in the order given)
    /// by stopping tasks that use borrowed capacity, and claims it for them; returns the
    /// tasks that hold a claim from this pass.
    pub(crate) async fn preempt_in(
        &self,
        pool: &PoolName,
        short: Vec<Short>,
        services: &HashMap<String, Service>,
        projects: &HashMap<String, Project>,
    ) -> Result<HashSet<String>, ControlError> {
        // Only a task of a class above batch, of a project with a quota here, and only
        // when another project runs a lower class in this pool: checked on what is in
        // memory before the pool is read (a task may wait for many passes).
        let short: Vec<(&Service, Short)> = short
            .into_iter()
            .filter_map(|s| Some((services.get(&s.service)?, s)))
            .filter(|(service, _)| {
                service.priority > PriorityClass::Batch
                    && projects
                        .get(&service.project)
                        .and_then(|p| p.quota(pool.as_str()))
                        .is_some()
                    && services.values().any(|s| {
                        &s.pool == pool
                            && s.project != service.project
                            && s.priority < service.priority
                    })
            })
            .collect();
        let mut renewed = HashSet::new();
        if short.is_empty() {
            return Ok(renewed);
        }
        let (info, hosts, holding) = self.pool_state(pool).await?;
        // Where plans wait for approval: tasks with a proposal open keep their room in this
        // pass's plans without a new one; tasks whose proposal was declined take none; an
        // approved proposal is carried out if the fresh plan stops no other tasks.
        let approve_mode = info.preemption == PreemptionMode::Approve;
        let (mut open, mut declined, mut approved) =
            (HashSet::new(), HashSet::new(), HashMap::new());
        if approve_mode {
            for p in self.store.open_preemptions(Some(pool.as_str())).await? {
                match p.state {
                    PreemptionState::Proposed => {
                        open.insert(p.task);
                    }
                    PreemptionState::Declined => {
                        declined.insert(p.task);
                    }
                    PreemptionState::Approved => {
                        let allowed: HashSet<String> =
                            p.victims.into_iter().map(|v| v.task).collect();
                        approved.insert(p.task, (p.id, allowed));
                    }
                    _ => {}
                }
            }
        }
        let project_of = crate::projects::project_of(services.values());
        let guaranteed = |project: &str| {
            projects
                .get(project)
                .and_then(|p| p.quota(pool.as_str()))
                .map(|q| q.guaranteed)
                .unwrap_or_default()
        };
        // What each project holds and keeps: tasks already stopping count for nobody.
        let kept_tasks: Vec<_> = holding
            .iter()
            .filter(|t| t.state != TaskState::Stopping)
            .cloned()
            .collect();
        let mut kept = usage_by_project(&kept_tasks, &project_of);
        // Limits count what placement counts: every task holding capacity, stopping ones
        // too (so no task is preempted for that its limit would then refuse).
        let holding_use = usage_by_project(&holding, &project_of);
        let capacity = PoolCapacity::build(&info, &hosts, holding.iter().filter_map(Held::of));
        let snap = &capacity.snapshot;
        // Each running task with where it runs (tasks the snapshot could not take are in
        // no plan).
        let placed: Vec<(&tessera_model::service::Task, Placement)> = holding
            .iter()
            .filter(|t| !capacity.not_in_snapshot.contains(&t.id))
            .filter_map(|t| {
                let h = Held::of(t)?;
                Some((
                    t,
                    capacity.placement(h.host, h.cpu, h.memory, h.allocations)?,
                ))
            })
            .collect();
        let mut claims = Claims::new(
            snap,
            placed
                .iter()
                .filter(|(t, _)| t.state == TaskState::Stopping)
                .map(|(_, p)| p),
        );
        let mut stopped: HashSet<&str> = HashSet::new();
        let mut claimed: HashMap<&str, Usage> = HashMap::new();
        let mut total = 0;
        for (service, s) in &short {
            let own = guaranteed(&service.project);
            let limit = projects
                .get(&service.project)
                .and_then(|p| p.quota(pool.as_str()))
                .map(|q| q.limit)
                .unwrap_or_default();
            let mut req = s.request.clone();
            for task_id in &s.tasks {
                if declined.contains(task_id) {
                    continue;
                }
                let want = quota::demand(&req);
                let mine = kept
                    .get(&service.project)
                    .copied()
                    .unwrap_or_default()
                    .plus(
                        &claimed
                            .get(service.project.as_str())
                            .copied()
                            .unwrap_or_default(),
                    );
                let claimed_here = claimed
                    .get(service.project.as_str())
                    .copied()
                    .unwrap_or_default();
                let held = holding_use
                    .get(&service.project)
                    .copied()
                    .unwrap_or_default()
                    .plus(&claimed_here);
                if !within_guarantee(&mine, &want, &own)
                    || held.plus(&want).exceeds(&limit).is_some()
                {
                    break;
                }
                // Each project may lose what it borrows beyond its guarantee (what it
                // names; a quantity it does not name is all borrowed).
                let mut project_index: HashMap<&str, usize> = HashMap::new();
                let mut budgets = Vec::new();
                for (name, u) in &kept {
                    project_index.insert(name.as_str(), budgets.len());
                    budgets.push(quota::budget(u, &guaranteed(name)));
                }
                let (mut victims, mut at, mut victim_tasks, mut pinned) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for (t, p) in &placed {
                    if t.state == TaskState::Stopping || stopped.contains(t.id.as_str()) {
                        continue;
                    }
                    let owner = services.get(&t.service);
                    // Never its own project's tasks, and only lower classes.
                    let lower = owner.is_some_and(|o| {
                        o.priority < service.priority && o.project != service.project
                    });
                    let project = owner.map_or(DEFAULT_PROJECT, |o| o.project.as_str());
                    match project_index.get(project) {
                        Some(&pi) if lower && !t.migrating => {
                            let priority = owner.map_or(0, |o| o.priority as u32);
                            victims.push(quota::victim(snap, p, priority, pi));
                            at.push(p);
                            victim_tasks.push(*t);
                        }
                        _ => pinned.push(p),
                    }
                }
                let Some((stop, placement)) = claims.plan(&victims, &at, pinned, &budgets, &req)
                else {
                    tracing::debug!(service = %service.name, "no preemption plan makes room (or the task's constraints refuse it)");
                    break;
                };
                let record: Vec<Preempted> = stop
                    .iter()
                    .map(|&v| {
                        let t = victim_tasks[v];
                        let owner = services.get(&t.service);
                        Preempted {
                            task: t.id.clone(),
                            service: t.service.clone(),
                            project: owner
                                .map_or(DEFAULT_PROJECT, |o| o.project.as_str())
                                .to_owned(),
                            priority: owner.map_or(PriorityClass::Default, |o| o.priority),
                        }
                    })
                    .collect();
                for &v in &stop {
                    let t = victim_tasks[v];
                    stopped.insert(t.id.as_str());
                    if let Some(u) = kept.get_mut(
                        project_of
                            .get(&t.service)
                            .map_or(DEFAULT_PROJECT, String::as_str),
                    ) {
                        *u = u.above(&quota::held(at[v]));
                    }
                }
                // The room this task asks for counts in this pass's later plans, whether
                // it is taken now or proposed.
                let u = claimed.entry(service.project.as_str()).or_default();
                *u = u.plus(&want);
                if req.constraints.distinct_hosts {
                    req.constraints
                        .avoid_hosts
                        .insert(placement.host_id.clone());
                }
                req.constraints.count(
                    &placement.host_id,
                    placement.gpus.iter().map(|s| &s.uuid),
                    1,
                );
                let host = placement.host_id.clone();
                // The record of this plan, in `state`.
                let entry = |state, victims| tessera_model::project::Preemption {
                    id: 0,
                    state,
                    task: task_id.clone(),
                    at: String::new(),
                    pool: pool.to_string(),
                    host: host.to_string(),
                    service: service.name.clone(),
                    project: service.project.clone(),
                    priority: service.priority,
                    victims,
                };
                if approve_mode && !stop.is_empty() {
                    let carried_out = match approved.remove(task_id) {
                        Some((id, allowed)) if record.iter().all(|v| allowed.contains(&v.task)) => {
                            self.store
                                .set_preemption_state(
                                    id,
                                    PreemptionState::Approved,
                                    PreemptionState::Done,
                                )
                                .await?
                        }
                        Some((id, _)) => {
                            // The approved plan no longer holds: a new one is proposed.
                            self.store
                                .set_preemption_state(
                                    id,
                                    PreemptionState::Approved,
                                    PreemptionState::Expired,
                                )
                                .await?;
                            false
                        }
                        None => false,
                    };
                    if !carried_out {
                        if !open.contains(task_id) {
                            let id = self
                                .store
                                .add_preemption(&entry(PreemptionState::Proposed, record))
                                .await?;
                            open.insert(task_id.clone());
                            self.event(
                                Some(&service.name),
                                Some(&host),
                                &format!(
                                    "preemption {id} proposed: stopping {} task(s) on host {host} would make room for a task of {}; it waits for an operator's approval (pool {pool})",
                                    stop.len(),
                                    service.name
                                ),
                            )
                            .await;
                        }
                        // Nothing is stopped or claimed until it is approved.
                        continue;
                    }
                }
                if !stop.is_empty() {
                    // Stopped first, then recorded: the record says what was done.
                    for &v in &stop {
                        let t = victim_tasks[v];
                        self.stop_for(t, services.get(&t.service), service).await?;
                    }
                    if !approve_mode {
                        self.store
                            .add_preemption(&entry(PreemptionState::Done, record))
                            .await?;
                    }
                    self.event(
                        Some(&service.name),
                        Some(&host),
                        &format!(
                            "preempting {} task(s) on host {host} to make room for a task of {}",
                            stop.len(),
                            service.name
                        ),
                    )
                    .await;
                } else if let Some((id, _)) = approved.remove(task_id) {
                    // Its room is there already: nothing left to stop.
                    self.store
                        .set_preemption_state(id, PreemptionState::Approved, PreemptionState::Done)
                        .await?;
                }
                total += stop.len();
                self.scheduling
                    .claims
                    .lock()
                    .insert(task_id.clone(), placement);
                renewed.insert(task_id.clone());
            }
        }
        if total > 0 {
            self.wake();
        }
        Ok(renewed)
    }

    /// Approves proposed preemption `id` (a pool whose plans wait for approval): the next
    /// pass carries it out if its task still waits and a fresh plan, under the same rules,
    /// stops none but its tasks (otherwise it expires and a new plan is proposed).
    /// `Conflict` when it is not proposed, its pool no longer waits for approval, or its
    /// task no longer waits (it is then expired).
    pub async fn approve_preemption(&self, id: i64) -> Result<(), ControlError> {
        let p = self.proposed(id).await?;
        let pool = self
            .store
            .get_pool(
                &PoolName::new(p.pool.clone())
                    .map_err(|e| ControlError::Conflict(e.to_string()))?,
            )
            .await?;
        if pool.preemption != PreemptionMode::Approve {
            return Err(ControlError::Conflict(format!(
                "pool {} carries out preemption plans by itself now",
                p.pool
            )));
        }
        let waiting = matches!(
            self.store.get_task(&p.task).await,
            Ok(t) if t.state == TaskState::Pending
        );
        if !waiting {
            self.store
                .set_preemption_state(id, PreemptionState::Proposed, PreemptionState::Expired)
                .await?;
            return Err(ControlError::Conflict(format!(
                "preemption {id} is expired: its task {} no longer waits",
                p.task
            )));
        }
        self.decide(id, PreemptionState::Approved).await?;
        self.event(
            Some(&p.service),
            None,
            &format!(
                "preemption {id} approved: the next pass stops its {} task(s) if the plan still holds",
                p.victims.len()
            ),
        )
        .await;
        self.wake();
        Ok(())
    }

    /// Declines proposed preemption `id`: nothing is stopped, and its task proposes no
    /// other.
    pub async fn decline_preemption(&self, id: i64) -> Result<(), ControlError> {
        let p = self.proposed(id).await?;
        self.decide(id, PreemptionState::Declined).await?;
        self.event(
            Some(&p.service),
            None,
            &format!(
                "preemption {id} declined: task {} of {} waits without it",
                p.task, p.service
            ),
        )
        .await;
        Ok(())
    }

    /// Moves proposed preemption `id` to `to` (compare-and-set: `Conflict` when another
    /// decision came first).
    async fn decide(&self, id: i64, to: PreemptionState) -> Result<(), ControlError> {
        if self
            .store
            .set_preemption_state(id, PreemptionState::Proposed, to)
            .await?
        {
            Ok(())
        } else {
            Err(ControlError::Conflict(format!(
                "preemption {id} was decided meanwhile"
            )))
        }
    }

    /// Preemption `id`, if it is proposed.
    async fn proposed(&self, id: i64) -> Result<tessera_model::project::Preemption, ControlError> {
        let p = self.store.get_preemption(id).await?;
        if p.state != PreemptionState::Proposed {
            return Err(ControlError::Conflict(format!(
                "preemption {id} is {}, not proposed",
                p.state
            )));
        }
        Ok(p)
    }

    /// Stops `t` (of `owner`) to make room for a task of `service`: out of the endpoint
    /// list first, then signalled, with a reason and an event naming who took the room.
    async fn stop_for(
        &self,
        t: &tessera_model::service::Task,
        owner: Option<&Service>,
        service: &Service,
    ) -> Result<(), ControlError> {
        let reason = format!(
            "preempted: service {} (project {}, {}) needs the room",
            service.name, service.project, service.priority
        );
        let drain = owner.filter(|s| s.deregistration_delay_secs > 0).map(|s| {
            crate::clock::stamp(
                self.now() + chrono::Duration::seconds(i64::from(s.deregistration_delay_secs)),
            )
        });
        self.store
            .request_task_stop(&t.id, &reason, drain.as_deref(), false)
            .await?;
        self.event(
            Some(&t.service),
            t.host.as_ref(),
            &format!(
                "task {} of {} (project {}, {}) preempted for service {} (project {}, {}): its project borrows beyond its guarantee",
                t.id,
                t.service,
                owner.map_or(DEFAULT_PROJECT, |s| s.project.as_str()),
                owner.map_or(PriorityClass::Default, |s| s.priority),
                service.name,
                service.project,
                service.priority
            ),
        )
        .await;
        Ok(())
    }
}
