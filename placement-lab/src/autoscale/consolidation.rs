//! What the control plane does in pools with a capacity provider
//! (`control/src/deployments/consolidate/auto.rs`): Tessera's consolidation planner
//! ([`tessera_placement::consolidate::plan`], goal hosts: least used hosts first, their
//! tasks placed elsewhere by best fit, start before stop) run by the provider pass
//! without an operator's request. (The control plane looks every 15 s and moves tasks
//! one at a time; here a look follows every change and moves take no time.) A host the planner could free, pass after pass,
//! for the scale-in cooldown has its tasks moved by a plan that frees only such hosts
//! (every other task fixed), and is then scaled in at once: it has not been needed for
//! the cooldown, as an empty host must not have been.

use super::fleet::Fleet;
use std::collections::{BTreeMap, BTreeSet};
use tessera_placement::consolidate::{Goal, Movable, plan};

/// The most moves one plan makes (the control plane's planning limit).
const MAX_MOVES: usize = 500;

/// Hosts freeable by consolidation, with since when (see the module's documentation).
pub struct Consolidation {
    cooldown: u64,
    freeable: BTreeMap<usize, u64>,
    /// The fleet version `freeable` was found on.
    seen: Option<u64>,
}

/// The fleet's running tasks as the planner takes them (those on nodes `fixed` says
/// stay), with their jobs.
fn movable(fleet: &Fleet<'_>, fixed: impl Fn(usize) -> bool) -> (Vec<Movable>, Vec<usize>) {
    fleet
        .placements()
        .map(|(j, node, p)| {
            let m = Movable {
                placement: p.clone(),
                request: fleet.jobs()[j].request.clone(),
                group: j as u32,
                fixed: fixed(node),
            };
            (m, j)
        })
        .unzip()
}

impl Consolidation {
    pub fn new(cooldown: u64) -> Self {
        Consolidation {
            cooldown,
            freeable: BTreeMap::new(),
            seen: None,
        }
    }

    /// The nodes a plan would free now, keeping since when each has been freeable.
    fn refresh(&mut self, now: u64, fleet: &Fleet<'_>) {
        if self.seen == Some(fleet.version()) {
            return;
        }
        self.seen = Some(fleet.version());
        let (tasks, _) = movable(fleet, |_| false);
        let mut engine = fleet.engine().clone();
        let found = plan(&mut engine, &tasks, Goal::Hosts, MAX_MOVES);
        self.freeable = found
            .freed_hosts
            .iter()
            .map(|&h| fleet.node_of_host(h))
            .map(|n| (n, self.freeable.get(&n).copied().unwrap_or(now)))
            .collect();
    }

    /// Moves the tasks off the nodes freeable for the cooldown (only those emptied); the
    /// nodes it emptied.
    pub fn pass(&mut self, now: u64, fleet: &mut Fleet<'_>) -> Vec<usize> {
        self.refresh(now, fleet);
        let due: BTreeSet<usize> = self
            .freeable
            .iter()
            .filter(|&(_, &since)| now >= since + self.cooldown)
            .map(|(&n, _)| n)
            .collect();
        if due.is_empty() {
            return Vec::new();
        }
        let (tasks, jobs) = movable(fleet, |n| !due.contains(&n));
        let mut engine = fleet.engine().clone();
        let found = plan(&mut engine, &tasks, Goal::Hosts, MAX_MOVES);
        for m in found.moves {
            fleet.move_task(jobs[m.task], m.to, now);
        }
        let emptied: Vec<usize> = found
            .freed_hosts
            .iter()
            .map(|&h| fleet.node_of_host(h))
            .collect();
        for n in &emptied {
            self.freeable.remove(n);
        }
        emptied
    }

    /// When the next freeable node is due.
    pub fn next_wake(&self, now: u64) -> Option<u64> {
        self.freeable
            .values()
            .map(|&since| since + self.cooldown)
            .filter(|&t| t > now)
            .min()
    }
}
