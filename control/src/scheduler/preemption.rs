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

use super::Scheduler;
use crate::capacity::{Held, PoolCapacity};
use crate::error::ControlError;
use crate::projects::shares::usage_by_project;
use std::collections::{HashMap, HashSet};
use tessera_model::PreemptionMode;
use tessera_model::notify::NoticeKind;
use tessera_model::project::{DEFAULT_PROJECT, PreemptionState, Project, Usage};
use tessera_model::service::Task;
use tessera_model::service::{PriorityClass, Service, TaskState};
use tessera_model::{PoolInfo, PoolName};
use tessera_placement::quota::{self, Claims, within_guarantee};
use tessera_placement::{Placement, TaskRequest};

/// Tasks of one service that found no room in a pass (not held by their project's limit),
/// with the request the scheduler made for them.
pub(crate) struct Short {
    pub service: String,
    pub request: TaskRequest,
    pub tasks: Vec<String>,
}

/// Of `short`, the services whose tasks may take room from others in `pool`: a class
/// above batch, a project with a quota here, and another project running a lower class in
/// this pool. Checked on what is in memory before the pool is read (a task may wait for
/// many passes).
fn eligible<'s>(
    short: Vec<Short>,
    pool: &PoolName,
    services: &'s HashMap<String, Service>,
    projects: &HashMap<String, Project>,
) -> Vec<(&'s Service, Short)> {
    short
        .into_iter()
        .filter_map(|s| Some((services.get(&s.service)?, s)))
        .filter(|(service, _)| {
            service.priority > PriorityClass::Batch
                && projects
                    .get(&service.project)
                    .and_then(|p| p.quota(pool.as_str()))
                    .is_some()
                && services.values().any(|s| {
                    &s.pool == pool && s.project != service.project && s.priority < service.priority
                })
        })
        .collect()
}

/// What preemption did for a pool's waiting tasks in one pass.
#[derive(Debug, Default)]
pub(crate) struct Preempted {
    /// The tasks that hold a claim from this pass.
    pub renewed: HashSet<String>,
    /// Per service, why its waiting tasks cannot take room back although their class
    /// could: their project's guarantee does not name what they need.
    pub notes: HashMap<String, String>,
}

/// Where plans wait for approval: tasks with a proposal open keep their room in this
/// pass's plans without a new one; tasks whose proposal was declined take none; an
/// approved proposal is carried out if the fresh plan stops no other tasks.
#[derive(Default)]
struct Decisions {
    approve_mode: bool,
    open: HashSet<String>,
    declined: HashSet<String>,
    /// Approved proposals by task: their id and the victims they allow.
    approved: HashMap<String, (i64, HashSet<String>)>,
}

/// One plan: the tasks it stops, the room it claims, and what the room is worth.
struct Plan<'a> {
    stop: Vec<&'a Task>,
    record: Vec<tessera_model::project::Preempted>,
    placement: Placement,
}

/// A pool as preemption plans against it within one pass: what each project holds and
/// keeps, where each running task is, the room already claimed.
struct Room<'a> {
    pool: &'a str,
    services: &'a HashMap<String, Service>,
    projects: &'a HashMap<String, Project>,
    project_of: HashMap<String, String>,
    /// What each project holds and keeps: tasks already stopping count for nobody.
    kept: HashMap<String, Usage>,
    /// What limits count: every task holding capacity, stopping ones too (so no task is
    /// preempted for that its limit would then refuse).
    holding_use: HashMap<String, Usage>,
    snapshot: tessera_placement::Snapshot,
    /// Each task holding capacity with where it runs (tasks the snapshot could not take
    /// are in no plan).
    placed: Vec<(&'a Task, Placement)>,
    claims: Claims,
    stopped: HashSet<&'a str>,
    /// What the plans of this pass claimed for each project.
    claimed: HashMap<String, Usage>,
}

impl<'a> Room<'a> {
    fn new(
        pool: &'a PoolName,
        (info, hosts, holding): (&PoolInfo, &[tessera_model::HostInfo], &'a [Task]),
        services: &'a HashMap<String, Service>,
        projects: &'a HashMap<String, Project>,
    ) -> Room<'a> {
        let project_of = crate::projects::shares::project_of(services.values());
        let kept_tasks: Vec<_> = holding
            .iter()
            .filter(|t| t.state != TaskState::Stopping)
            .cloned()
            .collect();
        let capacity = PoolCapacity::build(info, hosts, holding.iter().filter_map(Held::of));
        let placed: Vec<(&Task, Placement)> = holding
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
        let claims = Claims::new(
            &capacity.snapshot,
            placed
                .iter()
                .filter(|(t, _)| t.state == TaskState::Stopping)
                .map(|(_, p)| p),
        );
        Room {
            pool: pool.as_str(),
            services,
            projects,
            kept: usage_by_project(&kept_tasks, &project_of),
            holding_use: usage_by_project(holding, &project_of),
            project_of,
            snapshot: capacity.snapshot,
            placed,
            claims,
            stopped: HashSet::new(),
            claimed: HashMap::new(),
        }
    }

    fn quota(&self, project: &str) -> Option<&tessera_model::project::Quota> {
        self.projects.get(project)?.quota(self.pool)
    }

    /// Whether a task of `service` asking `want` may take room from others: its project
    /// stays within its guarantee and its limit, counting what this pass claimed for it.
    fn may_take(&self, service: &Service, want: &Usage) -> bool {
        let project = service.project.as_str();
        let quota = self.quota(project);
        let claimed = self.claimed.get(project).copied().unwrap_or_default();
        let mine = self
            .kept
            .get(project)
            .copied()
            .unwrap_or_default()
            .plus(&claimed);
        let held = self
            .holding_use
            .get(project)
            .copied()
            .unwrap_or_default()
            .plus(&claimed);
        let (own, limit) = quota.map_or_else(Default::default, |q| (q.guaranteed, q.limit));
        within_guarantee(&mine, want, &own) && held.plus(want).exceeds(&limit).is_none()
    }

    /// The plan that makes room for a task of `service` asking `req`, if the rules allow
    /// one: the fewest tasks of lower classes in other projects, within what each project
    /// borrows beyond its guarantee (what it names; a quantity it does not name is all
    /// borrowed).
    fn plan(&mut self, service: &Service, req: &TaskRequest) -> Option<Plan<'a>> {
        let want = quota::demand(req);
        if !self.may_take(service, &want) {
            return None;
        }
        let mut project_index: HashMap<&str, usize> = HashMap::new();
        let mut budgets = Vec::new();
        for (name, u) in &self.kept {
            project_index.insert(name.as_str(), budgets.len());
            let own = self.quota(name).map(|q| q.guaranteed).unwrap_or_default();
            budgets.push(quota::budget(u, &own));
        }
        let (mut victims, mut at, mut victim_tasks, mut pinned) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (t, p) in &self.placed {
            if t.state == TaskState::Stopping || self.stopped.contains(t.id.as_str()) {
                continue;
            }
            let owner = self.services.get(&t.service);
            // Never its own project's tasks, and only lower classes.
            let lower = owner
                .is_some_and(|o| o.priority < service.priority && o.project != service.project);
            let project = owner.map_or(DEFAULT_PROJECT, |o| o.project.as_str());
            match project_index.get(project) {
                Some(&pi) if lower && !t.migrating => {
                    let priority = owner.map_or(0, |o| o.priority as u32);
                    victims.push(quota::victim(&self.snapshot, p, priority, pi));
                    at.push(p);
                    victim_tasks.push(*t);
                }
                _ => pinned.push(p),
            }
        }
        let (stop, placement) = self.claims.plan(&victims, &at, pinned, &budgets, req)?;
        let held: Vec<Usage> = stop.iter().map(|&v| quota::held(at[v])).collect();
        let stop: Vec<&'a Task> = stop.iter().map(|&v| victim_tasks[v]).collect();
        let record = stop.iter().map(|t| self.preempted(t)).collect();
        // The victims leave their projects' budgets; the room counts in this pass's
        // later plans, whether it is taken now or proposed.
        for (t, held) in stop.iter().zip(held) {
            self.stopped.insert(t.id.as_str());
            let project = self
                .project_of
                .get(&t.service)
                .map_or(DEFAULT_PROJECT, String::as_str);
            if let Some(u) = self.kept.get_mut(project) {
                *u = u.above(&held);
            }
        }
        let u = self.claimed.entry(service.project.clone()).or_default();
        *u = u.plus(&want);
        Some(Plan {
            stop,
            record,
            placement,
        })
    }

    /// Why the guarantee of `service`'s project in this pool does not cover a task asking
    /// `req`, if it does not: it names nothing the task needs.
    fn uncovered(&self, service: &Service, req: &TaskRequest) -> Option<String> {
        let quota = self.quota(&service.project)?;
        if quota::covers(&quota::demand(req), &quota.guaranteed) {
            return None;
        }
        let needs = if matches!(req.gpu, tessera_placement::GpuDemand::None) {
            "host CPU or memory"
        } else {
            "the GPU room it asks"
        };
        Some(format!(
            "it takes no room back by preemption: project `{}`'s guarantee in pool `{}` names none of {needs}",
            service.project, self.pool
        ))
    }

    /// The record of stopping `t`.
    fn preempted(&self, t: &Task) -> tessera_model::project::Preempted {
        let owner = self.services.get(&t.service);
        tessera_model::project::Preempted {
            task: t.id.clone(),
            service: t.service.clone(),
            project: owner
                .map_or(DEFAULT_PROJECT, |o| o.project.as_str())
                .to_owned(),
            priority: owner.map_or(PriorityClass::Default, |o| o.priority),
        }
    }
}

impl Scheduler {
    /// Makes room, where the rules allow it, for the tasks in `short` (in the order given)
    /// by stopping tasks that use borrowed capacity, and claims it for them; returns the
    /// tasks that hold a claim from this pass.
    pub(crate) async fn preempt_in(
        &self,
        pool: &PoolName,
        short: Vec<Short>,
        services: &HashMap<String, Service>,
        projects: &HashMap<String, Project>,
    ) -> Result<Preempted, ControlError> {
        let short = eligible(short, pool, services, projects);
        let mut outcome = Preempted::default();
        if short.is_empty() {
            return Ok(outcome);
        }
        let (info, hosts, holding) = self.pool_state(pool).await?;
        let mut decisions = self.decisions(pool, info.preemption).await?;
        let mut room = Room::new(pool, (&info, &hosts, &holding), services, projects);
        let mut total = 0;
        for (service, s) in &short {
            let mut req = s.request.clone();
            for task_id in &s.tasks {
                if decisions.declined.contains(task_id) {
                    continue;
                }
                let Some(plan) = room.plan(service, &req) else {
                    tracing::debug!(service = %service.name, "no preemption plan makes room (or the task's constraints refuse it)");
                    if let Some(why) = room.uncovered(service, &req) {
                        outcome.notes.insert(service.name.clone(), why);
                    }
                    break;
                };
                if req.constraints.distinct_hosts {
                    req.constraints
                        .avoid_hosts
                        .insert(plan.placement.host_id.clone());
                }
                req.constraints.count(
                    &plan.placement.host_id,
                    plan.placement.gpus.iter().map(|s| &s.uuid),
                    1,
                );
                if !self
                    .carry_out(pool, service, task_id, &plan, (&mut decisions, services))
                    .await?
                {
                    continue;
                }
                total += plan.stop.len();
                self.state
                    .claims
                    .lock()
                    .insert(task_id.clone(), plan.placement);
                outcome.renewed.insert(task_id.clone());
            }
        }
        if total > 0 {
            self.core.wake();
        }
        Ok(outcome)
    }

    /// The preemption proposals open, declined and approved in `pool`, where its plans
    /// wait for approval (none otherwise).
    async fn decisions(
        &self,
        pool: &PoolName,
        mode: PreemptionMode,
    ) -> Result<Decisions, ControlError> {
        let mut d = Decisions {
            approve_mode: mode == PreemptionMode::Approve,
            ..Default::default()
        };
        if !d.approve_mode {
            return Ok(d);
        }
        for p in self.store.open_preemptions(Some(pool.as_str())).await? {
            match p.state {
                PreemptionState::Proposed => {
                    d.open.insert(p.task);
                }
                PreemptionState::Declined => {
                    d.declined.insert(p.task);
                }
                PreemptionState::Approved => {
                    let allowed = p.victims.into_iter().map(|v| v.task).collect();
                    d.approved.insert(p.task, (p.id, allowed));
                }
                _ => {}
            }
        }
        Ok(d)
    }

    /// Carries out `plan` for task `task_id` of `service`: stops its victims and records
    /// it, or, where plans wait for approval, proposes it (once) unless an approval it
    /// still matches is on record. Whether the room is claimed now.
    async fn carry_out(
        &self,
        pool: &PoolName,
        service: &Service,
        task_id: &str,
        plan: &Plan<'_>,
        (d, owners): (&mut Decisions, &HashMap<String, Service>),
    ) -> Result<bool, ControlError> {
        let host = &plan.placement.host_id;
        // The record of this plan, in `state`.
        let entry = |state| tessera_model::project::Preemption {
            id: 0,
            state,
            task: task_id.to_owned(),
            at: tessera_model::time::Timestamp::EPOCH,
            pool: pool.to_string(),
            host: host.to_string(),
            service: service.name.clone(),
            project: service.project.clone(),
            priority: service.priority,
            victims: plan.record.clone(),
        };
        let stops = !plan.stop.is_empty();
        if d.approve_mode && stops && !self.approved(task_id, plan, d).await? {
            if !d.open.contains(task_id) {
                let id = self
                    .store
                    .add_preemption(&entry(PreemptionState::Proposed))
                    .await?;
                d.open.insert(task_id.to_owned());
                self.core.notify(
                    NoticeKind::Preemption,
                    (Some(&service.name), Some(host), None),
                    &format!(
                        "preemption {id} proposed: stopping {} task(s) on host {host} would make room for a task of {}; it waits for an operator's approval (pool {pool})",
                        plan.stop.len(),
                        service.name
                    ),
                )
                .await;
            }
            // Nothing is stopped or claimed until it is approved.
            return Ok(false);
        }
        if stops {
            // Stopped first, then recorded: the record says what was done.
            for t in &plan.stop {
                self.stop_for(t, owners.get(&t.service), service).await?;
            }
            if !d.approve_mode {
                self.store
                    .add_preemption(&entry(PreemptionState::Done))
                    .await?;
            }
            self.core
                .notify(
                    NoticeKind::Preemption,
                    (Some(&service.name), Some(host), None),
                    &format!(
                        "preempting {} task(s) on host {host} to make room for a task of {}",
                        plan.stop.len(),
                        service.name
                    ),
                )
                .await;
        } else if let Some((id, _)) = d.approved.remove(task_id) {
            // Its room is there already: nothing left to stop.
            self.store
                .set_preemption_state(id, PreemptionState::Approved, PreemptionState::Done)
                .await?;
        }
        Ok(true)
    }

    /// Whether an approval of task `task_id`'s proposal allows `plan` (it stops none but
    /// the approved victims): it is then done; one that no longer holds expires, and a new
    /// plan is proposed.
    async fn approved(
        &self,
        task_id: &str,
        plan: &Plan<'_>,
        d: &mut Decisions,
    ) -> Result<bool, ControlError> {
        let Some((id, allowed)) = d.approved.remove(task_id) else {
            return Ok(false);
        };
        let holds = plan.record.iter().all(|v| allowed.contains(&v.task));
        let to = if holds {
            PreemptionState::Done
        } else {
            PreemptionState::Expired
        };
        let moved = self
            .store
            .set_preemption_state(id, PreemptionState::Approved, to)
            .await?;
        Ok(holds && moved)
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
        self.core.event(
            Some(&p.service),
            None,
            &format!(
                "preemption {id} approved: the next pass stops its {} task(s) if the plan still holds",
                p.victims.len()
            ),
        )
        .await;
        self.core.wake();
        Ok(())
    }

    /// Declines proposed preemption `id`: nothing is stopped, and its task proposes no
    /// other.
    pub async fn decline_preemption(&self, id: i64) -> Result<(), ControlError> {
        let p = self.proposed(id).await?;
        self.decide(id, PreemptionState::Declined).await?;
        self.core
            .event(
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
        let reason = tessera_model::service::StopReason::Preempted {
            service: service.name.clone(),
            project: service.project.clone(),
            priority: service.priority,
        };
        let drain = owner.filter(|s| s.deregistration_delay_secs > 0).map(|s| {
            crate::clock::stamp(
                self.core.now() + chrono::Duration::seconds(i64::from(s.deregistration_delay_secs)),
            )
        });
        self.store
            .request_task_stop(&t.id, &reason, drain.as_deref(), false)
            .await?;
        self.core.event(
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

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::project::{Amounts, Quota};

    fn service(name: &str, project: &str, priority: PriorityClass, pool: &str) -> Service {
        Service {
            pool: PoolName::new(pool).expect("valid"),
            project: project.into(),
            priority,
            ..crate::test_values::service(name)
        }
    }

    fn short(service: &str) -> Short {
        Short {
            service: service.into(),
            request: TaskRequest::cpu_only(tessera_model::MilliCpu(1), tessera_model::MiB(1)),
            tasks: vec![format!("{service}-1")],
        }
    }

    #[test]
    fn only_a_class_above_batch_with_a_quota_here_and_a_lower_class_beside_it_may_preempt() {
        let gpu = PoolName::new("gpu").expect("valid");
        let services: HashMap<String, Service> = [
            service("api", "prod", PriorityClass::Production, "gpu"),
            service("train", "lab", PriorityClass::Batch, "gpu"),
            service("sweep", "lab", PriorityClass::Batch, "gpu"),
            service("elsewhere", "prod", PriorityClass::Production, "cpu"),
            service("ad-hoc", "none", PriorityClass::Production, "gpu"),
            service("notebook", "prod", PriorityClass::Default, "gpu"),
        ]
        .into_iter()
        .map(|s| (s.name.clone(), s))
        .collect();
        let with_quota = |name: &str, pool: &str| Project {
            name: name.into(),
            weight: 1,
            quotas: vec![Quota {
                pool: pool.into(),
                guaranteed: Amounts {
                    gpus: Some(1),
                    ..Default::default()
                },
                limit: Amounts::default(),
            }],
            created_at: tessera_model::time::Timestamp::EPOCH,
        };
        let projects: HashMap<String, Project> =
            [with_quota("prod", "gpu"), with_quota("lab", "gpu")]
                .into_iter()
                .map(|p| (p.name.clone(), p))
                .collect();
        let names = |s: Vec<Short>| -> Vec<String> {
            eligible(s, &gpu, &services, &projects)
                .into_iter()
                .map(|(s, _)| s.name.clone())
                .collect()
        };
        assert_eq!(
            names(vec![
                short("api"),
                short("train"),
                short("ad-hoc"),
                short("notebook"),
                short("gone"),
            ]),
            ["api", "notebook"],
            "batch never preempts; a project without a quota here, or a service no longer there, neither"
        );
        // Without a lower class of another project in the pool, nothing to take from.
        let alone: HashMap<String, Service> = services
            .iter()
            .filter(|(_, s)| s.project != "lab")
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        assert!(eligible(vec![short("api")], &gpu, &alone, &projects).is_empty());
    }
}
