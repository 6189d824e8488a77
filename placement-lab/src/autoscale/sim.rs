//! The pass loop of one run: time moves in passes (multiples of the pass length); each
//! pass ends the tasks whose time is up, lets booting nodes that are due join, queues the
//! tasks that arrived, places what waits, then lets the scaling rule act. Passes in which
//! nothing can change (no arrival, end, join, or timer of the rule) are skipped: the
//! result is the same as running every one of them.

use super::fleet::{Fleet, Paid};
use super::{Job, NodeType, Settings};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};
use tessera_placement::DemandProfile;

/// A scaling rule: what it does in each pass after the tasks were placed.
pub trait Rule {
    /// Launches, terminations and moves at `now`.
    fn pass(&mut self, now: u64, fleet: &mut Fleet<'_>);
    /// The earliest time after `now` at which it would act with nothing else changing (a
    /// cooldown or a node's idle time running out).
    fn next_wake(&self, now: u64, fleet: &Fleet<'_>) -> Option<u64>;
}

/// A rule that does nothing: a fixed fleet.
pub struct Fixed;

impl Rule for Fixed {
    fn pass(&mut self, _: u64, _: &mut Fleet<'_>) {}
    fn next_wake(&self, _: u64, _: &Fleet<'_>) -> Option<u64> {
        None
    }
}

/// What one run did.
#[derive(Debug, Clone)]
pub struct Run {
    pub paid: Paid,
    /// Seconds each placed task waited for room (placement pass − arrival), in the order
    /// the tasks were placed.
    pub waits: Vec<u64>,
    /// Tasks still waiting when nothing more could change.
    pub never_placed: usize,
    /// When the last task ended (every node is paid up to then).
    pub end: u64,
    /// The node types of every node the run asked for, in order.
    pub launched_types: Vec<usize>,
    pub wall: Duration,
}

/// The first pass at or after `t`.
fn align_up(t: u64, pass: u64) -> u64 {
    t.div_ceil(pass) * pass
}

/// Runs `jobs` on `types` under `rule`, from a fleet of `initial` node types ready at the
/// first pass.
pub fn simulate(
    types: &[NodeType],
    jobs: &[Job],
    profile: &DemandProfile,
    settings: &Settings,
    rule: &mut dyn Rule,
    initial: &[usize],
) -> Run {
    let started = Instant::now();
    let pass = settings.pass.max(1);
    let mut fleet = Fleet::new(types, jobs, profile, settings.placement);
    let mut arrivals: Vec<usize> = (0..jobs.len()).collect();
    arrivals.sort_by_key(|&j| (jobs[j].created, j));
    let mut next_arrival = 0;
    let mut ends: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut waits = Vec::with_capacity(jobs.len());
    let Some(&first) = arrivals.first() else {
        return Run {
            paid: Paid::default(),
            waits,
            never_placed: 0,
            end: 0,
            launched_types: vec![],
            wall: started.elapsed(),
        };
    };
    let mut t = align_up(jobs[first].created, pass);
    for &ty in initial {
        fleet.launch(ty, t, 0);
    }
    loop {
        while let Some(&Reverse((e, j))) = ends.peek()
            && e <= t
        {
            ends.pop();
            fleet.release(j, t);
        }
        fleet.join_due(t);
        while next_arrival < arrivals.len() && jobs[arrivals[next_arrival]].created <= t {
            fleet.arrive(arrivals[next_arrival]);
            next_arrival += 1;
        }
        let mut placed = fleet.schedule();
        rule.pass(t, &mut fleet);
        // Nodes launched with no boot delay join in the same pass.
        if fleet.join_due(t) {
            placed.extend(fleet.schedule());
        }
        for j in placed {
            waits.push(t - jobs[j].created);
            ends.push(Reverse((jobs[j].end_after(t, settings.trace_end), j)));
        }
        let more_arrivals = next_arrival < arrivals.len();
        if !more_arrivals && !fleet.running() && fleet.waiting().is_empty() {
            break;
        }
        let next = [
            ends.peek().map(|Reverse((e, _))| *e),
            arrivals.get(next_arrival).map(|&j| jobs[j].created),
            fleet.next_join(),
            rule.next_wake(t, &fleet),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some(n) => {
                let next = align_up(n, pass).max(t + pass);
                fleet.account(next - t);
                t = next;
            }
            None => break,
        }
    }
    let never_placed = fleet.waiting().len();
    fleet.finish(t);
    Run {
        paid: fleet.paid().clone(),
        waits,
        never_placed,
        end: t,
        launched_types: fleet.nodes().iter().map(|n| n.ty).collect(),
        wall: started.elapsed(),
    }
}
