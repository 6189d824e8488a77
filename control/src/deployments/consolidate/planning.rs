//! Planning a consolidation: which tasks may move, the moves the placement engine finds,
//! what they free and their predicted effect on each moved service's work.

use super::plan_body;
use crate::capacity::{Held, PoolCapacity};
use crate::deployments::Deployments;
use crate::error::ControlError;
use crate::inputs::Errors;
use crate::scheduler::density;
use crate::scheduler::{allocations, request_for};
use std::collections::{BTreeSet, HashMap};
use tessera_model::consolidation::{
    ConsolidationPlan, GpuBar, KeptService, MoveState, PlanInput, PlanStatus, PlannedMove,
};
use tessera_model::service::{Service, Task, TaskState};
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

impl Deployments {
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
            let est = self.interference.estimates_of(service).await?;
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
        self.scheduler.existing_pool(&pool).await?;
        let plan = self.build_plan(&pool, goal, &input.goal, None).await?;
        self.store.save_plan(&plan_body(&plan)?).await?;
        Ok(plan)
    }

    /// A plan for `pool` (not stored): moves freeing as many whole GPUs or hosts as they
    /// can; with `only`, the tasks of other hosts stay where they are, so only those hosts
    /// are emptied.
    pub(super) async fn build_plan(
        &self,
        pool: &tessera_model::PoolName,
        goal: Goal,
        goal_name: &str,
        only: Option<&BTreeSet<HostId>>,
    ) -> Result<ConsolidationPlan, ControlError> {
        let (info, hosts, holding) = self.scheduler.pool_state(pool).await?;
        let services: Vec<Service> = self
            .store
            .list_services()
            .await?
            .into_iter()
            .filter(|s| &s.pool == pool)
            .collect();
        let capacity = PoolCapacity::build(&info, &hosts, holding.iter().filter_map(Held::of));
        let mut tasks = self.movables(&services, &holding, &capacity).await?;
        tasks.add_serviceless(&services, &holding, &capacity);
        if let Some(only) = only {
            for m in &mut tasks.movable {
                m.fixed |= !only.contains(&m.placement.host_id);
            }
        }
        let before = capacity.snapshot.clone();
        let mut engine = Engine::new(
            capacity.snapshot,
            Policy::Binpack,
            &DemandProfile::default(),
            0x7e55e7a,
        );
        let out = plan(&mut engine, &tasks.movable, goal, MAX_MOVES);
        let after = engine.snapshot();
        let gpu_names = gpu_names(&hosts, &before);
        let name = |g: &GpuIdx| {
            gpu_names
                .get(g)
                .map_or_else(String::new, |(h, i)| format!("{h}/GPU {i}"))
        };
        let moves = planned_moves(&out.moves, &tasks.task_of);
        let work_effects = self.work_effects(&moves, &holding, &tasks.avoided).await?;
        let plan = ConsolidationPlan {
            id: uuid::Uuid::new_v4().to_string(),
            pool: pool.to_string(),
            goal: goal_name.to_owned(),
            status: PlanStatus::Planned,
            created_at: self.core.instant(),
            moves,
            frees_gpus: out.freed_gpus.iter().map(name).collect(),
            frees_hosts: out
                .freed_hosts
                .iter()
                .map(|&h| before.host_id(h).to_string())
                .collect(),
            density_before: density(&before),
            density_after: density(after),
            gpus: gpu_bars(&before, after, &gpu_names),
            kept: tasks.kept,
            work_effects,
            finished_at: None,
            message: None,
        };
        Ok(plan)
    }

    /// Every task of `services` holding capacity in the snapshot, with the request a move
    /// of it makes (never onto a GPU where a neighbour measured to break a latency target
    /// runs); the tasks of services that must stay are fixed.
    async fn movables<'t>(
        &self,
        services: &[Service],
        holding: &'t [Task],
        capacity: &PoolCapacity,
    ) -> Result<Movables<'t>, ControlError> {
        let mut out = Movables::default();
        for (group, s) in services.iter().enumerate() {
            let mine: Vec<&Task> = holding.iter().filter(|t| t.service == s.name).collect();
            if mine.is_empty() {
                continue;
            }
            let spec = self.scheduler.spec_of(&s.task_definition).await?;
            // A move would have to find a fixed host port free on its target, which the
            // plan's engine does not track: such tasks stay where they are.
            let stay = must_stay(s, &mine).or_else(|| {
                (!spec.fixed_host_ports().is_empty())
                    .then(|| "its tasks hold fixed host ports".to_owned())
            });
            if let Some(why) = &stay {
                out.kept.push(KeptService {
                    service: s.name.clone(),
                    why: why.clone(),
                });
            }
            let mut req = request_for(&spec, &s.constraints, BTreeSet::new());
            let (avoid, conflicts) = self
                .interference
                .interference_avoid(s, &services.iter().collect::<Vec<_>>())
                .await?;
            req.constraints.avoid_gpus = avoid;
            out.avoided.extend(conflicts.into_iter().map(|c| c.why));
            for t in mine {
                out.add(t, capacity, req.clone(), group as u32, stay.is_some());
            }
        }
        Ok(out)
    }
}

/// What a consolidation may move: each task with its placement and request, and the
/// task each index names.
#[derive(Default)]
struct Movables<'t> {
    kept: Vec<KeptService>,
    /// Why moves were kept off neighbours' GPUs.
    avoided: Vec<String>,
    movable: Vec<Movable>,
    task_of: Vec<&'t Task>,
}

impl<'t> Movables<'t> {
    /// Adds task `t` where the snapshot holds it (a task the snapshot could not take
    /// cannot be moved in it either).
    fn add(
        &mut self,
        t: &'t Task,
        capacity: &PoolCapacity,
        request: tessera_placement::TaskRequest,
        group: u32,
        fixed: bool,
    ) {
        let Some(h) = Held::of(t) else { return };
        if capacity.not_in_snapshot.contains(&t.id) {
            return;
        }
        let Some(placement) = capacity.placement(h.host, h.cpu, h.memory, h.allocations) else {
            return;
        };
        self.movable.push(Movable {
            placement,
            request,
            group,
            fixed,
        });
        self.task_of.push(t);
    }

    /// Tasks of no service (none today) stay where they are.
    fn add_serviceless(
        &mut self,
        services: &[Service],
        holding: &'t [Task],
        capacity: &PoolCapacity,
    ) {
        for t in holding
            .iter()
            .filter(|t| !services.iter().any(|s| s.name == t.service))
        {
            let request = tessera_placement::TaskRequest::cpu_only(t.cpu, t.memory);
            self.add(t, capacity, request, u32::MAX, true);
        }
    }
}

/// Each GPU of `snap` by its host's name and device index (`hosts` in the snapshot's
/// order).
fn gpu_names(
    hosts: &[tessera_model::HostInfo],
    snap: &tessera_placement::Snapshot,
) -> HashMap<GpuIdx, (HostId, u32)> {
    let mut names = HashMap::new();
    for (hi, h) in hosts.iter().enumerate() {
        for (g, gpu) in snap.gpus_of(hi as u32).zip(&h.gpus) {
            names.insert(g, (h.id.clone(), gpu.index));
        }
    }
    names
}

/// Each GPU the moves change, its memory used before and after.
fn gpu_bars(
    before: &tessera_placement::Snapshot,
    after: &tessera_placement::Snapshot,
    names: &HashMap<GpuIdx, (HostId, u32)>,
) -> Vec<GpuBar> {
    let used = |u: tessera_placement::GpuUsage| {
        if u.mode == SharingMode::Dedicated {
            u.memory_capacity.0
        } else {
            u.memory_capacity.0 - u.memory_free.0
        }
    };
    (0..before.gpu_count() as GpuIdx)
        .filter(|&g| before.gpu_usage(g) != after.gpu_usage(g))
        .filter_map(|g| {
            let (host, index) = names.get(&g)?;
            Some(GpuBar {
                host: host.to_string(),
                index: *index,
                capacity_mib: before.gpu_usage(g).memory_capacity.0,
                before_mib: used(before.gpu_usage(g)),
                after_mib: used(after.gpu_usage(g)),
            })
        })
        .collect()
}

/// The plan's moves as stored, `task_of` naming each move's task.
fn planned_moves(
    moves: &[tessera_placement::consolidate::Move],
    task_of: &[&Task],
) -> Vec<PlannedMove> {
    moves
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
        .collect()
}
