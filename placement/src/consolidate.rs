//! Consolidation: moves that empty whole GPUs (or whole hosts) left partly used by churn,
//! computed with the engine's own placement and capacity rules.
//!
//! Sources are tried least used first. For each one, its tasks are placed elsewhere by the
//! engine (best fit, largest first; never onto another source or an idle GPU, which would
//! free nothing); then the moves are replayed in order as they will run, start before stop
//! (each replacement holds its capacity while its original still holds its own), and kept
//! only if every step fits. The engine ends in the state after the plan.

use crate::engine::{Engine, Policy};
use crate::request::{GpuDemand, TaskRequest};
use crate::snapshot::{GpuIdx, HostIdx, Placement, Snapshot};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tessera_model::{GpuUuid, HostId};

/// What a plan frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// Empty partly used GPUs (MPS tasks move; GPUs with a whole-GPU task stay).
    Gpus,
    /// Empty whole hosts (every task on them moves).
    Hosts,
}

/// A task a plan may move: where it is, and what it asks (constraints included; for a
/// service with distinct hosts, the planner adds its group's other hosts to avoid).
#[derive(Debug, Clone)]
pub struct Movable {
    pub placement: Placement,
    pub request: TaskRequest,
    /// Tasks of one group (a service) honour distinct hosts among themselves.
    pub group: u32,
    /// A task that must stay where it is (its service cannot run one extra copy while it
    /// moves); its GPU and host are never emptied.
    pub fixed: bool,
}

/// One move, in the order it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// Index into the tasks given.
    pub task: usize,
    pub from: Placement,
    pub to: Placement,
}

/// The moves and what they free.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub moves: Vec<Move>,
    pub freed_gpus: Vec<GpuIdx>,
    pub freed_hosts: Vec<HostIdx>,
}

/// The free GPU share on partly used GPUs, in whole GPUs (rounded down): what emptying
/// GPUs could free at best, whatever moves are made.
pub fn gpu_bound(snap: &Snapshot) -> u64 {
    let mut free = 0u64;
    for g in 0..snap.gpu_count() as GpuIdx {
        let u = snap.gpu_usage(g);
        if u.mode == tessera_model::SharingMode::Mps {
            let mem = u.memory_free.0 * 1000 / u.memory_capacity.0.max(1);
            let compute =
                u64::from(u.compute_free.0) * 1000 / u64::from(u.compute_capacity.0.max(1));
            free += mem.min(compute);
        }
    }
    free / 1000
}

/// How full a GPU is, per mille (the larger of memory and compute).
fn used_share(snap: &Snapshot, g: GpuIdx) -> u64 {
    let u = snap.gpu_usage(g);
    let mem = (u.memory_capacity.0 - u.memory_free.0) * 1000 / u.memory_capacity.0.max(1);
    let compute = u64::from(u.compute_capacity.0.saturating_sub(u.compute_free.0)) * 1000
        / u64::from(u.compute_capacity.0.max(1));
    mem.max(compute)
}

fn size(r: &TaskRequest) -> (u64, u64) {
    let gpu = match r.gpu {
        GpuDemand::Whole { count } => u64::from(count) << 40,
        GpuDemand::Shared { memory, .. } => memory.0,
        GpuDemand::None => 0,
    };
    (gpu, r.cpu.0)
}

struct Planner<'a> {
    engine: &'a mut Engine,
    tasks: &'a [Movable],
    /// Where each task is now.
    at: Vec<Placement>,
    /// Per group, how many of its tasks each host holds.
    group_hosts: HashMap<u32, BTreeMap<HostId, u32>>,
    /// Per group, how many of its tasks each GPU holds.
    group_gpus: HashMap<u32, BTreeMap<GpuUuid, u32>>,
    moves: Vec<Move>,
}

fn bump<K: Ord + Clone>(map: &mut BTreeMap<K, u32>, key: &K, delta: i32) {
    let n = map.entry(key.clone()).or_default();
    *n = n.saturating_add_signed(delta);
    if *n == 0 {
        map.remove(key);
    }
}

impl Planner<'_> {
    /// Counts placement `p` of a task of `group` in (`delta` 1) or out (-1).
    fn count(&mut self, group: u32, p: &Placement, delta: i32) {
        bump(
            self.group_hosts.entry(group).or_default(),
            &p.host_id,
            delta,
        );
        let gpus = self.group_gpus.entry(group).or_default();
        for s in &p.gpus {
            bump(gpus, &s.uuid, delta);
        }
    }

    /// The request of task `i` as it moves: distinct hosts avoid its group's other hosts,
    /// and its caps count where its group's other tasks are.
    fn request(&self, i: usize) -> TaskRequest {
        let t = &self.tasks[i];
        let mut req = t.request.clone();
        let c = &mut req.constraints;
        if let Some(hosts) = self.group_hosts.get(&t.group) {
            if c.distinct_hosts {
                c.avoid_hosts.extend(hosts.keys().cloned());
            }
            if c.max_per_host.is_some() {
                c.host_counts = hosts.clone();
            }
        }
        if c.max_per_gpu.is_some()
            && let Some(gpus) = self.group_gpus.get(&t.group)
        {
            c.gpu_counts = gpus.clone();
        }
        req
    }

    /// Takes source `src` out of service (`closed`) or puts it back.
    fn close(&mut self, goal: Goal, src: u32, closed: bool) {
        match goal {
            Goal::Gpus => self.engine.set_gpu_available(src, !closed),
            Goal::Hosts => self.engine.set_host_active(src, !closed),
        }
    }

    /// Tries to move every task of `ids` off source `src`; keeps the moves only if they all
    /// fit, and fit in order start before stop. The source stays out of service if so.
    fn try_empty(&mut self, goal: Goal, src: u32, ids: &[usize]) -> bool {
        let mut order = ids.to_vec();
        order.sort_by_key(|&i| std::cmp::Reverse(size(&self.tasks[i].request)));
        // Where each would go, with all of them gone.
        for (n, &i) in order.iter().enumerate() {
            if self.engine.release(&self.at[i]).is_err() {
                // Its placement is not in the snapshot (the caller's picture of the pool
                // drifted): the source stays as it is.
                for &j in order[..n].iter().rev() {
                    self.engine
                        .assign(&self.at[j])
                        .expect("what was just released fits again");
                    self.count(self.tasks[j].group, &self.at[j].clone(), 1);
                }
                return false;
            }
            self.count(self.tasks[i].group, &self.at[i].clone(), -1);
        }
        self.close(goal, src, true);
        let mut placed: Vec<(usize, Placement)> = Vec::new();
        let mut ok = true;
        for &i in &order {
            let req = self.request(i);
            match self.engine.try_place(&req) {
                Some(p) => {
                    self.engine.assign(&p).expect("a fresh placement fits");
                    self.count(self.tasks[i].group, &p.clone(), 1);
                    placed.push((i, p));
                }
                None => {
                    ok = false;
                    break;
                }
            }
        }
        // Back to the state before, then replay as the moves will run.
        for (i, p) in placed.iter().rev() {
            self.engine.release(p).expect("just assigned");
            self.count(self.tasks[*i].group, &p.clone(), -1);
        }
        self.close(goal, src, false);
        for &i in &order {
            self.engine
                .assign(&self.at[i])
                .expect("what was just released fits again");
            self.count(self.tasks[i].group, &self.at[i].clone(), 1);
        }
        if !ok {
            return false;
        }
        let mut done = 0;
        for (i, p) in &placed {
            if self.engine.assign(p).is_err() {
                break;
            }
            self.engine.release(&self.at[*i]).expect("held until now");
            done += 1;
        }
        if done < placed.len() {
            for (i, p) in placed[..done].iter().rev() {
                self.engine.release(p).expect("just assigned");
                self.engine.assign(&self.at[*i]).expect("just released");
            }
            return false;
        }
        self.close(goal, src, true);
        for (i, p) in placed {
            self.count(self.tasks[i].group, &self.at[i].clone(), -1);
            self.count(self.tasks[i].group, &p.clone(), 1);
            self.moves.push(Move {
                task: i,
                from: self.at[i].clone(),
                to: p.clone(),
            });
            self.at[i] = p;
        }
        true
    }
}

/// Plans moves on `engine` (which holds every task of `tasks` where its placement says)
/// that free as many GPUs or hosts as `goal` asks, at most `max_moves`. The engine is left
/// in the state after the plan, placing by best fit.
pub fn plan(engine: &mut Engine, tasks: &[Movable], goal: Goal, max_moves: usize) -> Plan {
    plan_ordered(engine, tasks, goal, max_moves, true)
}

/// [`plan`], trying sources least used first (`least_first`) or most used first (the
/// benchmark's baseline).
pub fn plan_ordered(
    engine: &mut Engine,
    tasks: &[Movable],
    goal: Goal,
    max_moves: usize,
    least_first: bool,
) -> Plan {
    let old_policy = engine.policy();
    engine.set_policy(Policy::Binpack);
    let snap = engine.snapshot();
    let mut on_gpu: HashMap<GpuIdx, Vec<usize>> = HashMap::new();
    let mut on_host: HashMap<HostIdx, Vec<usize>> = HashMap::new();
    let mut stuck_gpus: BTreeSet<GpuIdx> = BTreeSet::new();
    let mut stuck_hosts: BTreeSet<HostIdx> = BTreeSet::new();
    for (i, t) in tasks.iter().enumerate() {
        on_host.entry(t.placement.host).or_default().push(i);
        for s in &t.placement.gpus {
            on_gpu.entry(s.gpu).or_default().push(i);
            if s.dedicated || t.fixed {
                stuck_gpus.insert(s.gpu);
            }
        }
        if t.fixed {
            stuck_hosts.insert(t.placement.host);
        }
    }
    let idle_gpus: Vec<GpuIdx> = (0..snap.gpu_count() as GpuIdx)
        .filter(|&g| snap.gpu_usage(g).mode == tessera_model::SharingMode::Idle)
        .filter(|&g| snap.gpu_available(g))
        .collect();
    let empty_hosts: Vec<HostIdx> = (0..snap.host_count() as HostIdx)
        .filter(|h| !on_host.contains_key(h) && snap.host_active(*h))
        .collect();
    // Sources, least used first.
    let mut sources: Vec<(u64, u32)> = match goal {
        Goal::Gpus => on_gpu
            .keys()
            .filter(|g| !stuck_gpus.contains(g))
            .map(|&g| (used_share(snap, g), g))
            .collect(),
        Goal::Hosts => on_host
            .keys()
            .filter(|h| !stuck_hosts.contains(h))
            .map(|&h| {
                let used: u64 = snap.gpus_of(h).map(|g| used_share(snap, g)).sum();
                let (cpu_free, _) = snap.host_free(h);
                (used * 1000 + 1000 - cpu_free.0.min(1000), h)
            })
            .collect(),
    };
    sources.sort_unstable();
    if !least_first {
        sources.reverse();
    }
    let mut planner = Planner {
        at: tasks.iter().map(|t| t.placement.clone()).collect(),
        group_hosts: HashMap::new(),
        group_gpus: HashMap::new(),
        engine,
        tasks,
        moves: Vec::new(),
    };
    for t in tasks {
        planner.count(t.group, &t.placement, 1);
    }
    // Moving onto an idle GPU or an empty host frees nothing.
    match goal {
        Goal::Gpus => idle_gpus
            .iter()
            .for_each(|&g| planner.engine.set_gpu_available(g, false)),
        Goal::Hosts => empty_hosts
            .iter()
            .for_each(|&h| planner.engine.set_host_active(h, false)),
    }
    let mut received: BTreeSet<u32> = BTreeSet::new();
    let mut freed_gpus = Vec::new();
    let mut freed_hosts = Vec::new();
    for (_, src) in sources {
        if received.contains(&src) {
            continue;
        }
        let ids: Vec<usize> = match goal {
            Goal::Gpus => on_gpu[&src]
                .iter()
                .copied()
                .filter(|&i| planner.at[i].gpus.iter().any(|s| s.gpu == src))
                .collect(),
            Goal::Hosts => on_host[&src]
                .iter()
                .copied()
                .filter(|&i| planner.at[i].host == src)
                .collect(),
        };
        if ids.is_empty() || planner.moves.len() + ids.len() > max_moves {
            continue;
        }
        let before = planner.moves.len();
        if planner.try_empty(goal, src, &ids) {
            for m in &planner.moves[before..] {
                match goal {
                    Goal::Gpus => received.extend(m.to.gpus.iter().map(|s| s.gpu)),
                    Goal::Hosts => {
                        received.insert(m.to.host);
                    }
                }
            }
            match goal {
                Goal::Gpus => freed_gpus.push(src),
                Goal::Hosts => freed_hosts.push(src),
            }
        }
    }
    // Everything taken out of service comes back.
    for &g in idle_gpus.iter().chain(&freed_gpus) {
        planner.engine.set_gpu_available(g, true);
    }
    for &h in empty_hosts.iter().chain(&freed_hosts) {
        planner.engine.set_host_active(h, true);
    }
    let moves = planner.moves;
    planner.engine.set_policy(old_policy);
    Plan {
        moves,
        freed_gpus,
        freed_hosts,
    }
}
