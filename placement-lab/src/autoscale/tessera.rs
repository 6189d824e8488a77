//! Tessera's capacity-provider rule, as the control plane applies it each pass
//! (`control/src/providers/plan.rs`, sized by `control/src/scheduler/sizing.rs`):
//!
//! - Tasks wait: the fewest more hosts that place them, found by the placement engine's
//!   what-if sizing ([`tessera_placement::sizing::hosts_needed`]) on the pool as it is,
//!   machines asked for and not joined yet counted as coming capacity; the target
//!   capacity's headroom added (`with_headroom`); nothing launched within the scale-out
//!   cooldown of the last launch; nothing scaled in while anything waits.
//! - Nothing waits: hosts empty for the scale-in cooldown are terminated (longest empty
//!   first), never below what the target capacity keeps spare. A host running a task is
//!   never terminated.
//!
//! The product's provider has one host shape; here the provider offers every node type of
//! the trace, so sizing runs on each and takes the type that places the most waiting tasks
//! with the fewest GPUs, ties broken by the run's [`NodeChoice`] (then those it cannot
//! hold, on the next type): the same rule per shape, with a choice among shapes the product
//! does not make yet. Coming capacity is
//! counted by adding the booting machines to the sized pool, which for one shape is
//! exactly the product's "hosts needed less machines coming".

use super::NodeChoice;
use super::consolidation::Consolidation;
use super::fleet::Fleet;
use super::sim::Rule;
use tessera_model::provider::{Provider, with_headroom};
use tessera_placement::sizing::hosts_needed;
use tessera_placement::{Policy, PoolLimits};

/// Tessera's rule (see the module's documentation).
pub struct Tessera {
    provider: Provider,
    /// How long a machine takes to join.
    boot_delay: u64,
    /// Whether empty hosts are terminated (off: a fleet that only grows).
    scale_in: bool,
    /// The policy sizing places with (the pool's).
    policy: Policy,
    choice: NodeChoice,
    last_launch: Option<u64>,
    /// The last sizing, and the fleet version it was made on: (node type, hosts) to add.
    sized: Option<(u64, Vec<(usize, u32)>)>,
    /// The consolidation of [`super::consolidation`], when it is on.
    consolidation: Option<Consolidation>,
}

impl Tessera {
    /// The rule with `provider`'s settings (target capacity, cooldowns, min and max hosts).
    pub fn new(provider: Provider, boot_delay: u64, policy: Policy, choice: NodeChoice) -> Self {
        Tessera {
            provider,
            boot_delay,
            scale_in: true,
            policy,
            choice,
            last_launch: None,
            sized: None,
            consolidation: None,
        }
    }

    /// The rule with consolidation run by the provider pass (as the control plane does, see
    /// [`super::consolidation`]).
    pub fn with_consolidation(self) -> Self {
        let cooldown = u64::from(self.provider.scale_in_cooldown_secs);
        Tessera {
            consolidation: Some(Consolidation::new(cooldown)),
            ..self
        }
    }

    /// A fleet that grows for every task that waits, at once, and never shrinks: what
    /// sizes the static fleet.
    pub fn grow_only(provider: Provider, policy: Policy, choice: NodeChoice) -> Self {
        let provider = Provider {
            scale_out_cooldown_secs: 0,
            target_capacity_percent: 100,
            ..provider
        };
        Tessera {
            scale_in: false,
            ..Tessera::new(provider, 0, policy, choice)
        }
    }

    fn cooling(&self, now: u64) -> bool {
        self.last_launch
            .is_some_and(|at| now < at + u64::from(self.provider.scale_out_cooldown_secs))
    }

    /// The hosts to add, by node type, for what waits: sizing on each type, the one that
    /// places the most tasks with the fewest GPUs taken, then the same for the tasks no
    /// host of it holds.
    fn size(&self, fleet: &Fleet<'_>) -> Vec<(usize, u32)> {
        let limits = PoolLimits::default();
        let mut base = fleet.engine().snapshot().clone();
        for (_, n) in fleet.alive().filter(|(_, n)| n.booting()) {
            base.add_host(n.spec.clone(), limits);
        }
        let max_new = self.provider.max_hosts.max(1);
        let mut remaining: Vec<usize> = fleet.waiting().to_vec();
        let mut out = Vec::new();
        while !remaining.is_empty() {
            let requests: Vec<_> = remaining
                .iter()
                .map(|&j| fleet.jobs()[j].request.clone())
                .collect();
            // (tasks left out, GPUs taken, tie-break) → the sizing.
            type Key = (usize, u64, (u64, u64, usize));
            let mut best: Option<(Key, Vec<usize>, u32)> = None;
            for (ty, t) in fleet.types().iter().enumerate() {
                let s = hosts_needed(&base, limits, &t.shape, &requests, max_new, self.policy);
                let fit = requests.len() - s.unfit.len();
                if fit == 0 {
                    continue;
                }
                let gpus = u64::from(s.hosts) * u64::from(t.gpus);
                let key = (s.unfit.len(), gpus, self.choice.tie(fleet.types(), ty));
                if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
                    best = Some((key, s.unfit, s.hosts));
                }
            }
            let Some(((_, _, (_, _, ty)), unfit, hosts)) = best else {
                break;
            };
            if hosts > 0 {
                out.push((ty, hosts));
            }
            remaining = unfit.into_iter().map(|i| remaining[i]).collect();
        }
        out
    }

    fn scale_out(&mut self, now: u64, fleet: &mut Fleet<'_>) {
        let version = fleet.version();
        if self.sized.as_ref().is_none_or(|(v, _)| *v != version) {
            self.sized = Some((version, self.size(fleet)));
        }
        let Some((_, sized)) = &self.sized else {
            return;
        };
        let more: u32 = sized.iter().map(|(_, h)| h).sum();
        if more == 0 || self.cooling(now) {
            return;
        }
        let (hosts, coming, busy) = counts(fleet);
        let p = &self.provider;
        // The product sizes against joined hosts; `more` was sized with the coming ones in.
        let needed = more + coming;
        let wanted = with_headroom(busy + needed, p.target_capacity_percent).max(hosts + needed);
        let launch = wanted
            .saturating_sub(hosts + coming)
            .min(p.max_hosts.saturating_sub(hosts + coming));
        let mut plan = sized.clone();
        // Headroom hosts are of the first type sized.
        if let Some(first) = plan.first_mut() {
            first.1 += launch.saturating_sub(more);
        }
        let mut left = launch;
        for (ty, n) in plan {
            for _ in 0..n.min(left) {
                fleet.launch(ty, now, self.boot_delay);
            }
            left -= n.min(left);
        }
        self.last_launch = Some(now);
    }

    fn scale_in(&mut self, now: u64, fleet: &mut Fleet<'_>) {
        let emptied = match &mut self.consolidation {
            Some(c) => c.pass(now, fleet),
            None => Vec::new(),
        };
        let (hosts, coming, busy) = counts(fleet);
        let p = &self.provider;
        let keep = p
            .min_hosts
            .max(with_headroom(busy, p.target_capacity_percent));
        let removable = (hosts + coming).saturating_sub(keep) as usize;
        let cooldown = u64::from(p.scale_in_cooldown_secs);
        let mut idle: Vec<(u64, usize)> = fleet
            .alive()
            .filter(|(_, n)| n.live() && n.tasks == 0)
            .filter_map(|(i, n)| n.empty_since.map(|e| (e, i)))
            .filter(|(e, _)| now >= e + cooldown)
            .collect();
        // Emptied by consolidation (unneeded for the cooldown), then longest empty first;
        // ties by id.
        idle.retain(|(_, n)| !emptied.contains(n));
        idle.sort_unstable();
        idle.splice(0..0, emptied.into_iter().map(|n| (0, n)));
        for (_, node) in idle.into_iter().take(removable) {
            fleet.terminate(node, now);
        }
    }
}

/// Hosts joined, machines coming, hosts running tasks.
fn counts(fleet: &Fleet<'_>) -> (u32, u32, u32) {
    let (mut hosts, mut coming, mut busy) = (0, 0, 0);
    for (_, n) in fleet.alive() {
        if n.booting() {
            coming += 1;
        } else {
            hosts += 1;
            busy += u32::from(n.tasks > 0);
        }
    }
    (hosts, coming, busy)
}

impl Rule for Tessera {
    fn pass(&mut self, now: u64, fleet: &mut Fleet<'_>) {
        if !fleet.waiting().is_empty() {
            self.scale_out(now, fleet);
        } else if self.scale_in {
            self.scale_in(now, fleet);
        }
    }

    fn next_wake(&self, now: u64, fleet: &Fleet<'_>) -> Option<u64> {
        if !fleet.waiting().is_empty() {
            let wants = self
                .sized
                .as_ref()
                .is_some_and(|(v, s)| *v == fleet.version() && !s.is_empty());
            return self
                .last_launch
                .map(|at| at + u64::from(self.provider.scale_out_cooldown_secs))
                .filter(|&t| wants && t > now);
        }
        if !self.scale_in {
            return None;
        }
        let cooldown = u64::from(self.provider.scale_in_cooldown_secs);
        fleet
            .alive()
            .filter(|(_, n)| n.live() && n.tasks == 0)
            .filter_map(|(_, n)| n.empty_since.map(|e| e + cooldown))
            .filter(|&t| t > now)
            .chain(self.consolidation.as_ref().and_then(|c| c.next_wake(now)))
            .min()
    }
}
