//! The simulated cluster of one run: the nodes asked of the provider (booting, ready,
//! terminated), the placement engine over the ready ones, where each task runs, the tasks
//! that wait for room (first come, first served), and what was paid (GPU-seconds from
//! each node's launch request to its termination).

use super::{Job, NodeType};
use std::collections::{BTreeMap, BTreeSet};
use tessera_model::{GpuUuid, HostId};
use tessera_placement::{
    DemandProfile, Engine, GpuSpec, HostIdx, HostSpec, Placement, Policy, PoolLimits, Snapshot,
};

/// One node asked of the provider.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its node type (index into the run's types).
    pub ty: usize,
    /// Its host as the engine sees it (named `node-<n>`).
    pub spec: HostSpec,
    /// When it was asked for (paid from then on).
    pub requested: u64,
    /// When it joins (asked for plus the boot delay).
    pub ready_at: u64,
    /// Whether it has joined.
    pub ready: bool,
    /// When it was terminated.
    pub ended: Option<u64>,
    /// Tasks placed on it.
    pub tasks: usize,
    /// Since when it has held no task (from joining), while it holds none.
    pub empty_since: Option<u64>,
    /// Its index in the engine's snapshot while it is ready.
    host: Option<HostIdx>,
}

impl Node {
    /// Asked for and neither joined nor terminated.
    pub fn booting(&self) -> bool {
        !self.ready && self.ended.is_none()
    }

    /// Joined and not terminated.
    pub fn live(&self) -> bool {
        self.ready && self.ended.is_none()
    }
}

/// What a run paid and did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Paid {
    /// GPUs × seconds from each node's launch request to its termination.
    pub gpu_seconds: u128,
    pub launched: usize,
    pub terminated: usize,
    /// The most nodes asked for and not terminated at once.
    pub peak_nodes: usize,
    /// Tasks moved from one node to another (drains, consolidation).
    pub moves: usize,
    /// Where the GPU-seconds went: on nodes booting, on ready nodes running nothing, on
    /// ready nodes running tasks; and the GPU share allocated there (GPU-seconds).
    pub booting_gpu_seconds: u128,
    pub empty_gpu_seconds: u128,
    pub busy_gpu_seconds: u128,
    pub allocated_gpu_seconds: f64,
}

/// The simulated cluster (see the module's documentation).
pub struct Fleet<'a> {
    types: &'a [NodeType],
    jobs: &'a [Job],
    profile: &'a DemandProfile,
    policy: Policy,
    nodes: Vec<Node>,
    /// Nodes not terminated.
    alive: BTreeSet<usize>,
    /// Snapshot host index → node.
    host_node: Vec<usize>,
    engine: Engine,
    /// Where each placed task runs: job → (node, placement).
    placed: BTreeMap<usize, (usize, Placement)>,
    /// Tasks waiting for room, in arrival order.
    waiting: Vec<usize>,
    /// Bumped by every change a decision could depend on.
    version: u64,
    paid: Paid,
}

/// A host of `ty` named `node-<n>`.
fn host_of(ty: &NodeType, n: usize) -> HostSpec {
    let id = format!("node-{n}");
    HostSpec {
        id: HostId::new(&id).expect("a valid host id"),
        gpus: ty
            .shape
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuSpec {
                uuid: GpuUuid::new(format!("GPU-{id}-{i}")).expect("a valid GPU UUID"),
                ..g.clone()
            })
            .collect(),
        ..ty.shape.clone()
    }
}

impl<'a> Fleet<'a> {
    /// An empty cluster placing with `policy` against `profile`.
    pub fn new(
        types: &'a [NodeType],
        jobs: &'a [Job],
        profile: &'a DemandProfile,
        policy: Policy,
    ) -> Self {
        Fleet {
            types,
            jobs,
            profile,
            policy,
            nodes: Vec::new(),
            alive: BTreeSet::new(),
            host_node: Vec::new(),
            engine: Engine::new(
                Snapshot::new(vec![], PoolLimits::default()),
                policy,
                profile,
                7,
            ),
            placed: BTreeMap::new(),
            waiting: Vec::new(),
            version: 0,
            paid: Paid::default(),
        }
    }

    pub fn types(&self) -> &'a [NodeType] {
        self.types
    }

    pub fn jobs(&self) -> &'a [Job] {
        self.jobs
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The nodes not terminated (booting or ready), by index.
    pub fn alive(&self) -> impl Iterator<Item = (usize, &Node)> + '_ {
        self.alive.iter().map(|&i| (i, &self.nodes[i]))
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine's snapshot host of a ready node.
    pub fn host(&self, node: usize) -> Option<HostIdx> {
        self.nodes[node].host
    }

    /// The node behind a snapshot host.
    pub fn node_of_host(&self, h: HostIdx) -> usize {
        self.host_node[h as usize]
    }

    pub fn waiting(&self) -> &[usize] {
        &self.waiting
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn paid(&self) -> &Paid {
        &self.paid
    }

    /// Whether any task runs.
    pub fn running(&self) -> bool {
        !self.placed.is_empty()
    }

    /// The tasks on `node` with their placements, by job.
    pub fn tasks_on(&self, node: usize) -> Vec<(usize, Placement)> {
        self.placed
            .iter()
            .filter(|(_, (n, _))| *n == node)
            .map(|(&j, (_, p))| (j, p.clone()))
            .collect()
    }

    /// Every running task: (job, node, placement), by job.
    pub fn placements(&self) -> impl Iterator<Item = (usize, usize, &Placement)> + '_ {
        self.placed.iter().map(|(&j, (n, p))| (j, *n, p))
    }

    /// Moves a running task to `to` (a placement on this fleet's engine, made for the
    /// fleet as it is once the moves before it are made).
    pub fn move_task(&mut self, job: usize, to: Placement, now: u64) {
        self.give_back(job, now);
        self.take(job, to);
        self.paid.moves += 1;
        self.version += 1;
    }

    /// Thousandths of a GPU allocated on a ready node (1000 per GPU fully used).
    pub fn used_milli(&self, node: usize) -> u64 {
        let Some(h) = self.nodes[node].host else {
            return 0;
        };
        let snap = self.engine.snapshot();
        snap.gpus_of(h)
            .map(|g| {
                let u = snap.gpu_usage(g);
                let cap = u.memory_capacity.0.max(1);
                (cap - u.memory_free.0) * 1000 / cap
            })
            .sum()
    }

    /// Asks for a node of type `ty` at `now`, joining after `delay` seconds.
    pub fn launch(&mut self, ty: usize, now: u64, delay: u64) -> usize {
        let n = self.nodes.len();
        self.nodes.push(Node {
            ty,
            spec: host_of(&self.types[ty], n),
            requested: now,
            ready_at: now + delay,
            ready: false,
            ended: None,
            tasks: 0,
            empty_since: None,
            host: None,
        });
        self.paid.launched += 1;
        self.alive.insert(n);
        self.paid.peak_nodes = self.paid.peak_nodes.max(self.alive.len());
        self.version += 1;
        n
    }

    /// The earliest time a booting node joins.
    pub fn next_join(&self) -> Option<u64> {
        self.alive()
            .filter(|(_, n)| n.booting())
            .map(|(_, n)| n.ready_at)
            .min()
    }

    /// Nodes due by `now` join; whether any did.
    pub fn join_due(&mut self, now: u64) -> bool {
        let mut any = false;
        for &i in &self.alive {
            let n = &mut self.nodes[i];
            if n.booting() && n.ready_at <= now {
                n.ready = true;
                n.empty_since = Some(n.ready_at);
                any = true;
            }
        }
        if any {
            self.rebuild();
        }
        any
    }

    /// The engine afresh over the live nodes, every running task where it is.
    fn rebuild(&mut self) {
        let live: Vec<usize> = self
            .alive
            .iter()
            .copied()
            .filter(|&n| self.nodes[n].live())
            .collect();
        let specs = live.iter().map(|&n| self.nodes[n].spec.clone()).collect();
        let mut engine = Engine::new(
            Snapshot::new(specs, PoolLimits::default()),
            self.policy,
            self.profile,
            7,
        );
        for &n in &self.alive {
            self.nodes[n].host = None;
        }
        for (h, &n) in live.iter().enumerate() {
            self.nodes[n].host = Some(h as HostIdx);
        }
        for (_, p) in self.placed.values_mut() {
            let moved = engine
                .snapshot()
                .resolve(p)
                .expect("a running task's node is live");
            engine.assign(&moved).expect("it fitted before");
            *p = moved;
        }
        self.engine = engine;
        self.host_node = live;
        self.version += 1;
    }

    /// A task arrives and waits for room.
    pub fn arrive(&mut self, job: usize) {
        self.waiting.push(job);
        self.version += 1;
    }

    /// Places what waits, first come first served (a task that does not fit waits and
    /// those after it are still tried): each task placed, by job.
    pub fn schedule(&mut self) -> Vec<usize> {
        let mut placed = Vec::new();
        let mut still = Vec::new();
        for j in std::mem::take(&mut self.waiting) {
            match self.engine.try_place(&self.jobs[j].request) {
                Some(p) => {
                    self.take(j, p);
                    placed.push(j);
                }
                None => still.push(j),
            }
        }
        self.waiting = still;
        if !placed.is_empty() {
            self.version += 1;
        }
        placed
    }

    fn take(&mut self, job: usize, p: Placement) {
        self.engine
            .assign(&p)
            .expect("the engine's own placement fits");
        let node = self.host_node[p.host as usize];
        let n = &mut self.nodes[node];
        n.tasks += 1;
        n.empty_since = None;
        self.placed.insert(job, (node, p));
    }

    fn give_back(&mut self, job: usize, now: u64) -> Placement {
        let (node, p) = self.placed.remove(&job).expect("a running task");
        self.engine.release(&p).expect("it was assigned");
        let n = &mut self.nodes[node];
        n.tasks -= 1;
        if n.tasks == 0 {
            n.empty_since = Some(now);
        }
        p
    }

    /// A running task ends.
    pub fn release(&mut self, job: usize, now: u64) {
        self.give_back(job, now);
        self.version += 1;
    }

    /// Moves every task off `node` onto other live nodes, never onto `avoid`, through the
    /// engine's placement; all or nothing. Whether they moved.
    pub fn drain(&mut self, node: usize, avoid: &[usize], now: u64) -> bool {
        let Some(h) = self.nodes[node].host else {
            return false;
        };
        let cordon: Vec<HostIdx> = std::iter::once(h)
            .chain(avoid.iter().filter_map(|&n| self.nodes[n].host))
            .collect();
        for &c in &cordon {
            self.engine.set_host_active(c, false);
        }
        let tasks = self.tasks_on(node);
        let mut moved: Vec<(usize, Placement)> = Vec::new();
        for (j, _) in &tasks {
            self.give_back(*j, now);
        }
        for (j, _) in &tasks {
            match self.engine.try_place(&self.jobs[*j].request) {
                Some(p) => {
                    self.take(*j, p.clone());
                    moved.push((*j, p));
                }
                None => break,
            }
        }
        let all = moved.len() == tasks.len();
        if !all {
            for (j, _) in &moved {
                self.give_back(*j, now);
            }
            for (j, p) in &tasks {
                self.take(*j, p.clone());
            }
        }
        for &c in &cordon {
            self.engine.set_host_active(c, true);
        }
        if all {
            self.paid.moves += tasks.len();
            self.version += 1;
        }
        all
    }

    /// Terminates a node that runs nothing (booting or ready), paying up to `now`.
    pub fn terminate(&mut self, node: usize, now: u64) {
        let n = &mut self.nodes[node];
        assert_eq!(n.tasks, 0, "a node is terminated only empty");
        assert!(n.ended.is_none(), "terminated once");
        n.ended = Some(now);
        self.paid.gpu_seconds += u128::from(now - n.requested) * n.spec.gpus.len() as u128;
        self.paid.terminated += 1;
        self.alive.remove(&node);
        if let Some(h) = n.host.take() {
            self.engine.set_host_active(h, false);
        }
        self.version += 1;
    }

    /// The end of the run: every node still there is paid up to `now` (not counted as
    /// terminated).
    pub fn finish(&mut self, now: u64) {
        for i in std::mem::take(&mut self.alive) {
            let n = &mut self.nodes[i];
            n.ended = Some(now);
            self.paid.gpu_seconds +=
                u128::from(now.saturating_sub(n.requested)) * n.spec.gpus.len() as u128;
        }
    }

    /// Counts `dt` seconds of the fleet as it is in the breakdown of what was paid.
    pub fn account(&mut self, dt: u64) {
        let (mut booting, mut empty, mut busy, mut allocated) = (0u128, 0u128, 0u128, 0u64);
        for (i, n) in self.alive() {
            let gpus = n.spec.gpus.len() as u128;
            if !n.ready {
                booting += gpus;
            } else if n.tasks == 0 {
                empty += gpus;
            } else {
                busy += gpus;
                allocated += self.used_milli(i);
            }
        }
        let p = &mut self.paid;
        p.booting_gpu_seconds += booting * u128::from(dt);
        p.empty_gpu_seconds += empty * u128::from(dt);
        p.busy_gpu_seconds += busy * u128::from(dt);
        p.allocated_gpu_seconds += allocated as f64 / 1000.0 * dt as f64;
    }
}
