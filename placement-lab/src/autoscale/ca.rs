//! A cluster-autoscaler-like rule, after Kubernetes' Cluster Autoscaler with its default
//! settings:
//!
//! - Scale-up: the pending pods that would not fit on the nodes still booting (upcoming
//!   nodes count) are packed first fit, largest first, onto new template nodes of each
//!   node type (the binpacking estimator); the type with the least wasted GPU share wins
//!   (the least-waste expander, on GPUs; ties by fewer GPUs, then the run's node choice,
//!   the smallest by default), then the same again for the pods it cannot hold.
//!   No scale-down in a pass that scaled up.
//! - Scale-down: a ready node whose allocated GPU share is under the threshold (50 %) and
//!   whose pods all fit on other nodes (not on other nodes being removed) is unneeded; one
//!   unneeded for the unneeded time (10 minutes) is removed, its pods drained and placed
//!   elsewhere: every such empty node at once, at most one with pods per pass.
//!
//! Pods are placed by best fit (the engine's `binpack`, like the scheduler's
//! `MostAllocated` scoring that autoscaled clusters use; the default `LeastAllocated`
//! would spread them and keep more nodes up).

use super::NodeChoice;
use super::fleet::Fleet;
use super::sim::Rule;
use std::collections::{BTreeMap, BTreeSet};
use tessera_placement::{DemandProfile, Engine, Policy, PoolLimits, Snapshot};

/// The cluster-autoscaler-like rule (see the module's documentation).
pub struct CaLike {
    /// Under this allocated share of its GPUs (%), a node may be unneeded.
    threshold_pct: u64,
    /// How long a node stays unneeded before it is removed.
    unneeded_secs: u64,
    boot_delay: u64,
    choice: NodeChoice,
    /// Unneeded nodes, since when.
    unneeded: BTreeMap<usize, u64>,
    /// The fleet versions the unneeded nodes and the last scale-up were decided on.
    seen_down: Option<u64>,
    seen_up: Option<u64>,
    /// A node with pods was due and left for the next pass (one drain per pass).
    more_due: bool,
}

impl CaLike {
    /// The rule with its threshold (%), unneeded time, the provider's boot delay, and the
    /// tie-break between node types that waste as little.
    pub fn new(
        threshold_pct: u64,
        unneeded_secs: u64,
        boot_delay: u64,
        choice: NodeChoice,
    ) -> Self {
        CaLike {
            threshold_pct,
            unneeded_secs,
            boot_delay,
            choice,
            unneeded: BTreeMap::new(),
            seen_down: None,
            seen_up: None,
            more_due: false,
        }
    }

    /// Launches for the pending pods; whether any node was launched.
    fn scale_up(&mut self, now: u64, fleet: &mut Fleet<'_>) -> bool {
        let jobs = fleet.jobs();
        let types = fleet.types();
        // Upcoming nodes take what they can first.
        let booting: Vec<_> = fleet
            .alive()
            .filter(|(_, n)| n.booting())
            .map(|(_, n)| n.spec.clone())
            .collect();
        let mut upcoming = engine_of(booting);
        let mut pods: Vec<usize> = fleet
            .waiting()
            .iter()
            .copied()
            .filter(|&j| match upcoming.try_place(&jobs[j].request) {
                Some(p) => {
                    upcoming.assign(&p).expect("fits");
                    false
                }
                None => true,
            })
            .collect();
        pods.sort_by_key(|&j| {
            let r = &jobs[j];
            (std::cmp::Reverse((r.gpu_milli(), r.request.cpu.0)), j)
        });
        let mut launched = false;
        while !pods.is_empty() {
            // (waste per mille, GPUs, tie-break) → (pods helped, nodes).
            type Key = (u64, u64, (u64, u64, usize));
            let mut best: Option<(Key, Vec<usize>, u32)> = None;
            for (ty, t) in types.iter().enumerate() {
                let (helped, nodes) = estimate(fleet, ty, &pods);
                if helped.is_empty() {
                    continue;
                }
                let gpus = u64::from(nodes) * u64::from(t.gpus);
                let used: u64 = helped.iter().map(|&j| jobs[j].gpu_milli()).sum();
                let waste = (gpus * 1000 - used.min(gpus * 1000)) * 1000 / (gpus * 1000).max(1);
                let key = (waste, gpus, self.choice.tie(types, ty));
                if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
                    best = Some((key, helped, nodes));
                }
            }
            let Some(((_, _, (_, _, ty)), helped, nodes)) = best else {
                break;
            };
            for _ in 0..nodes {
                fleet.launch(ty, now, self.boot_delay);
            }
            launched = true;
            let helped: BTreeSet<usize> = helped.into_iter().collect();
            pods.retain(|j| !helped.contains(j));
        }
        launched
    }

    /// The nodes unneeded now: under the threshold, their pods placed elsewhere in a
    /// simulation (not onto nodes found unneeded before them, nor do those take pods).
    fn find_unneeded(&mut self, now: u64, fleet: &Fleet<'_>) {
        let mut sim = fleet.engine().clone();
        let mut candidates: Vec<(u64, usize)> = fleet
            .alive()
            .filter(|(_, n)| n.live())
            .filter_map(|(i, n)| {
                let cap = n.spec.gpus.len() as u64 * 1000;
                let used = fleet.used_milli(i);
                (used * 100 < self.threshold_pct * cap).then(|| (used * 1000 / cap.max(1), i))
            })
            .collect();
        candidates.sort_unstable();
        let mut received = BTreeSet::new();
        let mut found = BTreeMap::new();
        for (_, node) in candidates {
            let h = fleet.host(node).expect("live");
            if received.contains(&h) {
                continue;
            }
            sim.set_host_active(h, false);
            let tasks = fleet.tasks_on(node);
            for (_, p) in &tasks {
                sim.release(p).expect("placed");
            }
            let mut moved = Vec::new();
            for (j, _) in &tasks {
                match sim.try_place(&fleet.jobs()[*j].request) {
                    Some(p) => {
                        sim.assign(&p).expect("fits");
                        moved.push(p);
                    }
                    None => break,
                }
            }
            if moved.len() == tasks.len() {
                received.extend(moved.iter().map(|p| p.host));
                found.insert(node, self.unneeded.get(&node).copied().unwrap_or(now));
            } else {
                for p in &moved {
                    sim.release(p).expect("assigned");
                }
                for (_, p) in &tasks {
                    sim.assign(p).expect("it was there");
                }
                sim.set_host_active(h, true);
            }
        }
        self.unneeded = found;
    }

    /// Removes the nodes unneeded long enough.
    fn scale_down(&mut self, now: u64, fleet: &mut Fleet<'_>) {
        let due: Vec<usize> = self
            .unneeded
            .iter()
            .filter(|&(_, &since)| now >= since + self.unneeded_secs)
            .map(|(&n, _)| n)
            .collect();
        let mut drained_one = false;
        self.more_due = false;
        for &node in &due {
            if fleet.nodes()[node].ended.is_some() {
                continue;
            }
            if fleet.nodes()[node].tasks > 0 {
                let others: Vec<usize> = due.iter().copied().filter(|&n| n != node).collect();
                if drained_one {
                    self.more_due = true;
                    continue;
                }
                if !fleet.drain(node, &others, now) {
                    continue;
                }
                drained_one = true;
            }
            fleet.terminate(node, now);
            self.unneeded.remove(&node);
        }
    }
}

/// An engine placing by best fit over `hosts` (empty).
fn engine_of(hosts: Vec<tessera_placement::HostSpec>) -> Engine {
    Engine::new(
        Snapshot::new(hosts, PoolLimits::default()),
        Policy::Binpack,
        &DemandProfile::default(),
        0,
    )
}

/// The binpacking estimator: `pods` (in order) first fit onto new nodes of type `ty`,
/// a node added when none of those holds the next; the pods placed and the nodes.
fn estimate(fleet: &Fleet<'_>, ty: usize, pods: &[usize]) -> (Vec<usize>, u32) {
    let shape = &fleet.types()[ty].shape;
    let mut nodes: Vec<Engine> = Vec::new();
    let mut helped = Vec::new();
    for &j in pods {
        let req = &fleet.jobs()[j].request;
        let mut placed = false;
        for e in &mut nodes {
            if let Some(p) = e.try_place(req) {
                e.assign(&p).expect("fits");
                placed = true;
                break;
            }
        }
        if !placed {
            let mut e = engine_of(vec![shape.clone()]);
            let Some(p) = e.try_place(req) else {
                continue;
            };
            e.assign(&p).expect("fits");
            nodes.push(e);
        }
        helped.push(j);
    }
    (helped, nodes.len() as u32)
}

impl Rule for CaLike {
    fn pass(&mut self, now: u64, fleet: &mut Fleet<'_>) {
        if !fleet.waiting().is_empty() && self.seen_up != Some(fleet.version()) {
            let launched = self.scale_up(now, fleet);
            self.seen_up = Some(fleet.version());
            if launched {
                return;
            }
        }
        if self.seen_down != Some(fleet.version()) {
            self.find_unneeded(now, fleet);
            self.seen_down = Some(fleet.version());
        }
        self.scale_down(now, fleet);
    }

    fn next_wake(&self, now: u64, _: &Fleet<'_>) -> Option<u64> {
        if self.more_due {
            return Some(now + 1);
        }
        self.unneeded
            .values()
            .map(|&since| since + self.unneeded_secs)
            .filter(|&t| t > now)
            .min()
    }
}
