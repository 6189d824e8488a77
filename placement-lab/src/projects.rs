//! The projects replay: the FGD protocol's arrivals (see `replay`) split between projects
//! of different priority classes, guarantees and limits, placed in reconcile passes by the
//! scheduler's rules, and the same arrivals placed without projects beside it.
//!
//! Each pass, as the control plane's scheduler does it:
//! 1. tasks stopped by the last pass's preemptions let go of their room, and a replacement
//!    of each waits (their services start one);
//! 2. the pass's arrivals join the waiting tasks;
//! 3. the waiting tasks are ordered: higher classes first, then the project furthest below
//!    its fair share ([`quota::weighted_share`]), then by when they started waiting;
//! 4. each is placed by the engine unless its project's limit refuses it;
//! 5. each task still waiting whose project stays within its guarantee with it may preempt
//!    ([`preempt::plan`], checked by the engine with the victims released): its victims
//!    stop, and it is placed on a later pass once they have let go.
//!
//! What it measures: the unallocated GPU share when arrivals reach 100 % and 130 % of the
//! cluster's GPUs; how many passes each task waited (by project); and the most passes in
//! a row a task waited that its project's guarantee covers while stopping tasks that
//! another project borrows would make room for it (a plan exists): how long another's
//! borrowing held a project below its guarantee. Where no plan exists (the room the task
//! may use is held by projects within their guarantees, by higher classes or by its own
//! project, or no single host could hold it), borrowing is not what holds it; those
//! passes are counted apart.

use crate::openb::{self, TraceTask};
use std::collections::{HashMap, HashSet};
use tessera_model::project::{Amounts, Usage};
use tessera_model::service::PriorityClass;
use tessera_placement::quota;
use tessera_placement::rng::Rng;
use tessera_placement::{
    DemandProfile, Engine, HostSpec, Placement, Policy, PoolLimits, Snapshot, TaskRequest,
};

/// A project of the replay.
#[derive(Debug, Clone)]
pub struct ProjectSpec {
    pub name: String,
    pub priority: PriorityClass,
    /// Its part of the arrivals, relative to the other projects' (drawn per arrival).
    pub share: u32,
    pub weight: u32,
    pub guaranteed: Amounts,
    pub limit: Amounts,
}

/// One run's setup. No projects: every task is of one project with neither guarantee nor
/// limit, of one class, so the order is first come first served and nothing is preempted.
#[derive(Debug, Clone)]
pub struct Setup {
    pub projects: Vec<ProjectSpec>,
    /// The GPU demand (thousandths) that arrives in each pass.
    pub arrivals_per_pass: u64,
    pub policy: Policy,
    pub seed: u64,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub passes: u32,
    pub unallocated_100: f64,
    pub unallocated_130: f64,
    /// Per project: passes each of its tasks waited (0: placed in the pass it arrived in;
    /// a task still waiting at the end counts with the passes it has waited so far), and
    /// how many were still waiting at the end.
    pub waits: Vec<Vec<u32>>,
    pub waiting_at_end: Vec<u32>,
    /// Per project: the most passes in a row one of its tasks was held below the
    /// project's guarantee by another's borrowing (its guarantee covered the task, a plan
    /// stopping borrowed tasks made room for it, and it was not placed yet).
    pub longest_hold: Vec<u32>,
    /// Per project: the most passes in a row one of its tasks that its guarantee covered
    /// waited with no plan able to make room (see the module's documentation).
    pub longest_without_plan: Vec<u32>,
    /// Preemption plans carried out, and the tasks they stopped.
    pub preemptions: u32,
    pub stopped: u32,
    /// Times a waiting task its guarantee covers found no plan (no one host where stopping
    /// borrowed tasks makes room that its constraints accept).
    pub no_plan: u32,
}

/// The three projects of the default replay, sized on `hosts`: `prod` (production, 20 % of
/// arrivals, 30 % of the pool guaranteed), `research` (default class, 30 % of arrivals,
/// 30 % guaranteed, limited to 60 %) and `lab` (batch, half the arrivals, nothing
/// guaranteed, no limit: it borrows what the others leave). A share of the pool is that
/// share of its GPUs, GPU memory, host CPU and host memory: a guarantee that named GPUs
/// alone would cover no task without a GPU (`quota::within_guarantee`), and a project's
/// CPU-only tasks would wait behind batch tasks wherever host CPU runs short.
pub fn three_projects(hosts: &[HostSpec]) -> Vec<ProjectSpec> {
    let gpus = hosts.iter().map(|h| h.gpus.len() as u64).sum::<u64>();
    // In the trace's units a GPU's memory is 1000.
    let cpu = hosts.iter().map(|h| h.cpu.0).sum::<u64>();
    let memory = hosts.iter().map(|h| h.memory.0).sum::<u64>();
    let part = |percent: u64| Amounts {
        gpus: Some(gpus * percent / 100),
        gpu_memory_mib: Some(gpus * openb::GPU_UNITS * percent / 100),
        compute_milli: None,
        cpu_milli: Some(cpu * percent / 100),
        memory_mib: Some(memory * percent / 100),
    };
    vec![
        ProjectSpec {
            name: "prod".into(),
            priority: PriorityClass::Production,
            share: 20,
            weight: 1,
            guaranteed: part(30),
            limit: Amounts::default(),
        },
        ProjectSpec {
            name: "research".into(),
            priority: PriorityClass::Default,
            share: 30,
            weight: 1,
            guaranteed: part(30),
            limit: part(60),
        },
        ProjectSpec {
            name: "lab".into(),
            priority: PriorityClass::Batch,
            share: 50,
            weight: 1,
            guaranteed: Amounts::default(),
            limit: Amounts::default(),
        },
    ]
}

/// A task of the replay: an arrival (its trace row) or a preempted task's replacement.
struct Waiting {
    task: usize,
    project: usize,
    since: u32,
    /// Passes it has been held below its project's guarantee by another's borrowing, in a
    /// row, and passes its guarantee covered it with no plan to make room, in a row.
    held: u32,
    without_plan: u32,
    /// The room a preemption plan claimed for it, its own once the victims let go.
    claim: Option<Placement>,
}

struct Running {
    task: usize,
    project: usize,
    placement: Placement,
}

/// The pool's capacity as quotas count it.
fn capacity_of(hosts: &[HostSpec]) -> Usage {
    let mut c = Usage::default();
    for h in hosts {
        c.cpu_milli += h.cpu.0;
        c.memory_mib += h.memory.0;
        for g in &h.gpus {
            c.gpus += 1;
            c.gpu_memory_mib += g.memory.0;
            c.compute_milli += 1000;
        }
    }
    c
}

/// Runs the replay of `tasks` on `hosts` (see the module's documentation).
pub fn run(hosts: &[HostSpec], tasks: &[TraceTask], setup: &Setup) -> Outcome {
    let no_projects = [ProjectSpec {
        name: "default".into(),
        priority: PriorityClass::Default,
        share: 1,
        weight: 1,
        guaranteed: Amounts::default(),
        limit: Amounts::default(),
    }];
    let projects: &[ProjectSpec] = if setup.projects.is_empty() {
        &no_projects
    } else {
        &setup.projects
    };
    let capacity_milli = openb::capacity_milli(hosts);
    let target = capacity_milli * 13 / 10;
    let order = openb::arrival_order(tasks, setup.seed, target);
    // Projects are drawn apart from the arrivals, so both runs see the same tasks.
    let mut draw = Rng::new(setup.seed ^ 0x5052_4f4a);
    let total_share: u32 = projects.iter().map(|p| p.share.max(1)).sum();
    let project_of: Vec<usize> = order
        .iter()
        .map(|_| {
            let mut x = draw.below(total_share as usize) as u32;
            projects
                .iter()
                .position(|p| {
                    let hit = x < p.share.max(1);
                    x = x.saturating_sub(p.share.max(1));
                    hit
                })
                .unwrap_or(0)
        })
        .collect();
    let profile = DemandProfile::from_requests(tasks.iter().map(|t| &t.request));
    let mut engine = Engine::new(
        Snapshot::new(hosts.to_vec(), PoolLimits::default()),
        setup.policy,
        &profile,
        setup.seed,
    );
    let capacity = capacity_of(hosts);
    let n = projects.len();
    let mut out = Outcome {
        waits: vec![Vec::new(); n],
        waiting_at_end: vec![0; n],
        longest_hold: vec![0; n],
        longest_without_plan: vec![0; n],
        ..Default::default()
    };
    let mut used = vec![Usage::default(); n];
    let mut running: HashMap<usize, Running> = HashMap::new();
    let mut stopping: Vec<Running> = Vec::new();
    let mut waiting: Vec<Waiting> = Vec::new();
    let (mut next, mut arrived, mut allocated, mut id) = (0usize, 0u64, 0u64, 0usize);
    let (mut at_100, mut at_130) = (None, None);
    let mut pass = 0u32;
    while at_130.is_none() {
        // 1. The last pass's victims let go; their replacements wait.
        for r in stopping.drain(..) {
            engine.release(&r.placement).expect("a running task's room");
            used[r.project] = used[r.project].above(&quota::held(&r.placement));
            allocated -= tasks[r.task].gpu_request_milli();
            waiting.push(Waiting {
                task: r.task,
                project: r.project,
                since: pass,
                held: 0,
                without_plan: 0,
                claim: None,
            });
        }
        // 2. Arrivals.
        let pass_target = arrived + setup.arrivals_per_pass;
        while next < order.len() && arrived < pass_target.min(target) {
            let task = order[next];
            arrived += tasks[task].gpu_request_milli();
            waiting.push(Waiting {
                task,
                project: project_of[next],
                since: pass,
                held: 0,
                without_plan: 0,
                claim: None,
            });
            next += 1;
        }
        // 3. Order: tasks with a claim, class, fair share, then waiting time (stable).
        let share: Vec<f64> = (0..n)
            .map(|p| quota::weighted_share(&used[p], &capacity, projects[p].weight))
            .collect();
        waiting.sort_by(|a, b| {
            let (pa, pb) = (&projects[a.project], &projects[b.project]);
            b.claim
                .is_some()
                .cmp(&a.claim.is_some())
                .then(pb.priority.cmp(&pa.priority))
                .then(share[a.project].total_cmp(&share[b.project]))
        });
        // 4. Place. A request that found no room stays without room for the rest of the
        // pass (nothing is released until the next), so it is not tried again.
        let mut no_room: HashSet<&TaskRequest> = HashSet::new();
        let mut still = Vec::new();
        for mut w in waiting.drain(..) {
            let req = &tasks[w.task].request;
            // Its claim first: the room its victims left.
            let claimed = w
                .claim
                .take()
                .and_then(|c| quota::claimable(&mut engine, &c, req));
            let placed = if claimed.is_some() {
                claimed
            } else if no_room.contains(req) {
                None
            } else {
                engine.try_place(req)
            };
            let Some(p) = placed else {
                no_room.insert(req);
                still.push(w);
                continue;
            };
            let after = used[w.project].plus(&quota::held(&p));
            if after.exceeds(&projects[w.project].limit).is_some() {
                still.push(w);
                continue;
            }
            engine.assign(&p).expect("the engine's own placement fits");
            used[w.project] = after;
            allocated += tasks[w.task].gpu_request_milli();
            out.waits[w.project].push(pass - w.since);
            running.insert(
                id,
                Running {
                    task: w.task,
                    project: w.project,
                    placement: p,
                },
            );
            id += 1;
        }
        waiting = still;
        // 5. Preempt for the tasks still waiting, in the same order. The room a plan
        // finds is claimed for its task, so each gets room of its own.
        let mut kept = kept_use(&used, &stopping);
        let mut claimed = vec![Usage::default(); n];
        let mut claims =
            quota::Claims::new(engine.snapshot(), stopping.iter().map(|r| &r.placement));
        for w in &mut waiting {
            let spec = &projects[w.project];
            let want = quota::demand(&tasks[w.task].request);
            let mine = kept[w.project].plus(&claimed[w.project]);
            let (held, without_plan) = (
                std::mem::take(&mut w.held),
                std::mem::take(&mut w.without_plan),
            );
            if spec.priority == PriorityClass::Batch
                || !quota::within_guarantee(&mine, &want, &spec.guaranteed)
                || mine.plus(&want).exceeds(&spec.limit).is_some()
            {
                continue;
            }
            let others_borrow = (0..n).any(|q| {
                q != w.project && !kept[q].above(&projects[q].guaranteed.or_zero()).is_zero()
            });
            if !others_borrow {
                continue;
            }
            // Victims: running tasks of lower classes of other projects; each project
            // loses at most what it borrows.
            let budgets: Vec<_> = (0..n)
                .map(|p| quota::budget(&kept[p], &projects[p].guaranteed))
                .collect();
            let mut ids: Vec<usize> = running.keys().copied().collect();
            ids.sort_unstable();
            let (mut victims, mut at, mut victim_ids, mut pinned) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for id in ids {
                let r = &running[&id];
                let theirs = &projects[r.project];
                if r.project != w.project && theirs.priority < spec.priority {
                    victims.push(quota::victim(
                        engine.snapshot(),
                        &r.placement,
                        theirs.priority as u32,
                        r.project,
                    ));
                    at.push(&r.placement);
                    victim_ids.push(id);
                } else {
                    pinned.push(&r.placement);
                }
            }
            let request = &tasks[w.task].request;
            let Some((stop, placement)) = claims.plan(&victims, &at, pinned, &budgets, request)
            else {
                out.no_plan += 1;
                w.without_plan = without_plan + 1;
                let longest = &mut out.longest_without_plan[w.project];
                *longest = (*longest).max(w.without_plan);
                continue;
            };
            // Held below its guarantee by another's borrowing this pass: the plan's room
            // is its own from the next.
            w.held = held + 1;
            out.longest_hold[w.project] = out.longest_hold[w.project].max(w.held);
            if !stop.is_empty() {
                out.preemptions += 1;
                out.stopped += stop.len() as u32;
            }
            for v in stop {
                let r = running.remove(&victim_ids[v]).expect("a victim runs");
                kept[r.project] = kept[r.project].above(&quota::held(&r.placement));
                stopping.push(r);
            }
            w.claim = Some(placement);
            claimed[w.project] = claimed[w.project].plus(&want);
        }
        pass += 1;
        let unallocated = 100.0 - 100.0 * allocated as f64 / capacity_milli as f64;
        if at_100.is_none() && arrived >= capacity_milli {
            at_100 = Some(unallocated);
        }
        if arrived >= target || next >= order.len() {
            at_130 = Some(unallocated);
        }
    }
    // Tasks still waiting count with the passes they have waited so far.
    for w in &waiting {
        out.waiting_at_end[w.project] += 1;
        out.waits[w.project].push(pass - w.since);
    }
    out.passes = pass;
    out.unallocated_100 = at_100.unwrap_or_default();
    out.unallocated_130 = at_130.unwrap_or_default();
    out
}

/// Each project's use without what its stopping tasks hold (they count for nobody).
fn kept_use(used: &[Usage], stopping: &[Running]) -> Vec<Usage> {
    let mut kept = used.to_vec();
    for r in stopping {
        kept[r.project] = kept[r.project].above(&quota::held(&r.placement));
    }
    kept
}
