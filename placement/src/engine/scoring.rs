//! Scoring host states for the fragmentation-aware and spread policies, with scores
//! cached per task shape, and choosing the host and GPUs.

use super::*;

/// A task shape as far as scores are concerned (labels and host exclusions are checked per host).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct ShapeKey {
    pub(super) cpu: MilliCpu,
    pub(super) memory: MiB,
    pub(super) gpu: GpuDemand,
    pub(super) models: Vec<String>,
}

/// A cached score of one host state for one shape. `generation` ties it to the state.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cached {
    pub(super) generation: u32,
    pub(super) score: i64,
    /// The GPU (kind, free share) the score chose, for shared tasks.
    pub(super) pick: (u16, u16),
}

pub(super) const UNSCORED: Cached = Cached {
    generation: u32::MAX,
    score: 0,
    pick: (0, 0),
};

pub(super) const INFEASIBLE: i64 = i64::MIN;

/// Weight of the change in a GPU's gap value (see [`crate::gaps`]) against FGD's change in
/// fragmentation, for shared tasks under the default policy. On the openb default trace
/// (`replay`, seeds 42..51): 0 gives 4.18 % unallocated, 3 gives 3.99, 4 gives 3.91, 5 gives
/// 3.97.
pub(super) const GAP_WEIGHT: f64 = 4.0;

/// Weight of the growth in free GPU share that a host's CPU and memory could no longer
/// feed. Tuned across generated variants, never one trace (`replay --variants 40`, seed 42;
/// `default` at or below `fgd-sim` at 100 % / 130 % arrived, and the worst gap): 1 gives
/// 37/40 and 39/40 (worst +1.06 / +0.50 points), 0.5 gives 38/40 and 40/40, 0.35 39/40 and
/// 40/40 (+0.18 / −0.13), 0.25 39/40 and 40/40, 0 38/40 and 34/40 (and 4.74 % on the
/// default trace). On the held-out variants 41–80, 0.35 gives 40/40 at both. The openb
/// traces stay where they were (default 3.91 %, cpu100 3.97, gpushare40 5.40, gpuspec10
/// 3.88) but multigpu50, 2.35 → 2.50 (published FGD: 2.91). Re-checked once shapes were
/// kept off GPU kinds whose hosts cannot hold them (`PoolShape`): 0.25 gives 40/40 at both
/// (default trace 3.95 %), 0.35 40/40 at both (3.93 %), 0.5 39/40 at both.
pub(super) const STRAND_WEIGHT: f64 = 0.35;

/// Score of placing `req` on a host in state `key`, and the GPU (kind, free) it would use.
/// Higher is better; `INFEASIBLE` when the state cannot take it.
pub(super) fn score_state(
    policy: Policy,
    snap: &Snapshot,
    frag: Option<&FragTables>,
    key: &ClassKey,
    req: &TaskRequest,
) -> (i64, (u16, u16)) {
    if key.cpu_free < req.cpu || key.mem_free < req.memory {
        return (INFEASIBLE, (0, 0));
    }
    let allowed = |kind: u16| req.allows_model(&snap.models[kind as usize].0);
    let cpu_after = key.cpu_free - req.cpu;
    let frag_before = frag.map(|t| t.fragmentation(key.cpu_free, &key.gpus));
    // Candidate moves: (GPU entries changed, new free share), evaluated on a copy of the state.
    let mut after: Vec<(u16, u16)> = key.gpus.to_vec();
    let mut best = (INFEASIBLE, (0, 0));
    let mut consider = |after: &mut Vec<(u16, u16)>, gpu_after: i64, pick: (u16, u16)| {
        after.sort_unstable();
        let total_after: i64 = after.iter().map(|&(_, f)| i64::from(f)).sum();
        let score = match policy {
            Policy::FgdSim | Policy::Fragmentation => {
                let (Some(t), Some(before)) = (frag, frag_before) else {
                    return;
                };
                let mut delta = before - t.fragmentation(cpu_after, after);
                if policy == Policy::Fragmentation {
                    // Free GPU share that the host's CPU and memory could no longer feed
                    // is as lost as a fragment: count its growth against the move.
                    let mem_after = key.mem_free - req.memory;
                    delta -= STRAND_WEIGHT
                        * (t.stranded(cpu_after, mem_after, after)
                            - t.stranded(key.cpu_free, key.mem_free, &key.gpus));
                    // A shared task also changes one GPU's free share, from a gap the
                    // workload would fill to one it may never fill (or the reverse).
                    if let GpuDemand::Shared { .. } = req.gpu {
                        let (kind, free_before) = pick;
                        delta += GAP_WEIGHT
                            * (t.gap_value(kind, free_before)
                                - t.gap_value(kind, gpu_after as u16));
                    }
                }
                // FGD's coarse score: a sigmoid of the change cut to 100 levels. The
                // many ties it makes are broken at random, which spreads load usefully
                // (an exact score packs worse; see docs/placement.md).
                let level = ((1.0 / (1.0 + (-delta / 1000.0).exp())) * 100.0).floor() as i64;
                if policy == Policy::FgdSim {
                    level
                } else {
                    // Among equal levels, the tighter GPU fit first.
                    (level << 20) - gpu_after
                }
            }
            Policy::SpreadHost => total_after * 2000 + gpu_after,
            Policy::SpreadGpu => gpu_after * 1_000_000 + total_after,
            Policy::Binpack | Policy::BestFitSim => -(gpu_after * 1_000_000 + total_after),
        };
        if score > best.0 {
            best = (score, pick);
        }
    };
    match req.gpu {
        GpuDemand::None => consider(&mut after, 0, (0, 0)),
        GpuDemand::Whole { count } => {
            let mut taken = 0;
            for entry in after.iter_mut().rev() {
                if taken < count && entry.1 == 1000 && allowed(entry.0) {
                    entry.1 = 0;
                    taken += 1;
                }
            }
            if taken == count {
                consider(&mut after, 0, (0, 0));
            }
        }
        GpuDemand::Shared { .. } => {
            let mut last = None;
            for i in 0..key.gpus.len() {
                let (kind, free) = key.gpus[i];
                if last == Some((kind, free)) || !allowed(kind) {
                    continue;
                }
                last = Some((kind, free));
                let need = share_needed(req.gpu, snap.models[kind as usize].1);
                if need > free {
                    continue;
                }
                after.copy_from_slice(&key.gpus);
                after[i].1 = free - need;
                consider(&mut after, i64::from(free - need), (kind, free));
            }
        }
    }
    best
}

impl Engine {
    /// Score every distinct host state, then choose a host among the best states.
    pub(super) fn place_by_class(&mut self, req: &TaskRequest) -> Option<Placement> {
        let shape = self.shape_of(req);
        if self.scores[shape].len() < self.classes.slots.len() {
            self.scores[shape].resize(self.classes.slots.len(), UNSCORED);
        }
        let mut scored: Vec<(i64, u32)> = Vec::new();
        for i in 0..self.classes.nonempty.len() {
            let slot = self.classes.nonempty[i];
            let class = &self.classes.slots[slot as usize];
            let cached = self.scores[shape][slot as usize];
            let cached = if cached.generation == class.generation {
                cached
            } else {
                let (score, pick) =
                    score_state(self.policy, &self.snap, self.frag.as_ref(), &class.key, req);
                let fresh = Cached {
                    generation: class.generation,
                    score,
                    pick,
                };
                self.scores[shape][slot as usize] = fresh;
                fresh
            };
            if cached.score != INFEASIBLE {
                scored.push((cached.score, slot));
            }
        }
        // Best score first; ties are resolved below (by lowest host or at random).
        scored.sort_unstable_by_key(|&(score, _)| std::cmp::Reverse(score));
        let mut start = 0;
        while start < scored.len() {
            let best = scored[start].0;
            let end = start
                + scored[start..]
                    .iter()
                    .take_while(|(s, _)| *s == best)
                    .count();
            let group: Vec<u32> = scored[start..end].iter().map(|&(_, slot)| slot).collect();
            if let Some(h) = self.choose_host(&group, req) {
                let pick = group
                    .iter()
                    .find(|&&s| {
                        self.classes.slots[s as usize]
                            .members
                            .binary_search(&h)
                            .is_ok()
                    })
                    .map(|&s| self.scores[shape][s as usize].pick)
                    .unwrap_or((0, 0));
                if let Some(p) = self.gpus_on_host(h, req, Some(pick)) {
                    return Some(p);
                }
            }
            start = end;
        }
        None
    }

    /// A host from the members of `group` that passes the per-host filters: the lowest
    /// index, or uniformly at random for policies with random ties.
    pub(super) fn choose_host(&mut self, group: &[u32], req: &TaskRequest) -> Option<HostIdx> {
        let ok = |snap: &Snapshot, h: HostIdx| snap.check_host(h, req).is_ok();
        if self.policy.random_ties() {
            let total: usize = group
                .iter()
                .map(|&s| self.classes.slots[s as usize].members.len())
                .sum();
            // A few random probes find a host almost always; a reservoir over all is the fallback.
            for _ in 0..8 {
                let mut r = self.rng.below(total);
                for &s in group {
                    let members = &self.classes.slots[s as usize].members;
                    if r < members.len() {
                        if ok(&self.snap, members[r]) {
                            return Some(members[r]);
                        }
                        break;
                    }
                    r -= members.len();
                }
            }
            let mut chosen = None;
            let mut seen = 0;
            for &s in group {
                for &h in &self.classes.slots[s as usize].members {
                    if ok(&self.snap, h) {
                        seen += 1;
                        if self.rng.below(seen) == 0 {
                            chosen = Some(h);
                        }
                    }
                }
            }
            chosen
        } else {
            group
                .iter()
                .filter_map(|&s| {
                    self.classes.slots[s as usize]
                        .members
                        .iter()
                        .copied()
                        .find(|&h| ok(&self.snap, h))
                })
                .min()
        }
    }

    /// The GPUs `req` takes on host `h`: for a shared task the GPU matching `pick` (or the
    /// best fit if none does), for whole GPUs the first idle ones.
    pub(super) fn gpus_on_host(
        &self,
        h: HostIdx,
        req: &TaskRequest,
        pick: Option<(u16, u16)>,
    ) -> Option<Placement> {
        if self.snap.check_host(h, req).is_err() {
            return None;
        }
        let fitting = self
            .snap
            .host_gpus(h)
            .filter(|&g| self.snap.check_gpu(g, req).is_ok());
        let gpus: Vec<usize> = match req.gpu {
            GpuDemand::None => Vec::new(),
            GpuDemand::Whole { count } => {
                let idle: Vec<usize> = fitting.take(count as usize).collect();
                if idle.len() < count as usize {
                    return None;
                }
                idle
            }
            GpuDemand::Shared { .. } => {
                let picked = pick.and_then(|(kind, free)| {
                    self.snap
                        .host_gpus(h)
                        .filter(|&g| self.snap.check_gpu(g, req).is_ok())
                        .find(|&g| {
                            self.snap.gpus[g].model == kind
                                && self.snap.gpus[g].free_share() == free
                        })
                });
                let g =
                    picked.or_else(|| fitting.min_by_key(|&g| (self.snap.gpus[g].mem_free, g)))?;
                vec![g]
            }
        };
        Some(self.snap.make_placement(h, req, &gpus))
    }

    /// Whether host `h` passes the host filters and has `gpus` GPUs that fit `req`.
    pub(super) fn host_fits(&self, h: HostIdx, req: &TaskRequest, gpus: u32) -> bool {
        self.snap.check_host(h, req).is_ok()
            && self
                .snap
                .host_gpus(h)
                .filter(|&g| self.snap.check_gpu(g, req).is_ok())
                .take(gpus as usize)
                .count()
                == gpus as usize
    }

    /// The published simulator's BestFit: a full scan, node score from CPU and GPU share
    /// left, truncated to an integer, random among the best.
    pub(super) fn place_bestfit_sim(&mut self, req: &TaskRequest) -> Option<Placement> {
        let (num, milli) = match req.gpu {
            GpuDemand::None => (0, 0),
            GpuDemand::Whole { count } => (count, 1000),
            GpuDemand::Shared { .. } => (1, 0),
        };
        let mut best = i64::MIN;
        let mut chosen: Option<Placement> = None;
        let mut ties = 0;
        for h in 0..self.snap.hosts.len() as HostIdx {
            let Some(p) = self.gpus_on_host(h, req, None) else {
                continue;
            };
            let host = &self.snap.hosts[h as usize];
            let gpu_left: u64 = self
                .snap
                .host_gpus(h)
                .map(|g| u64::from(self.snap.gpus[g].free_share()))
                .sum();
            let take = match req.gpu {
                GpuDemand::Shared { .. } => u64::from(share_needed(
                    req.gpu,
                    self.snap.models[self.snap.gpus[p.gpus[0].gpu as usize].model as usize].1,
                )),
                _ => u64::from(num) * milli,
            };
            let s = 0.5 * (host.cpu_free.0 - req.cpu.0) as f64 / 128_000.0
                + 0.5 * (gpu_left.saturating_sub(take)) as f64 / 8000.0;
            let score = ((1.0 - s) * 100.0).floor() as i64;
            if score > best {
                best = score;
                chosen = Some(p);
                ties = 1;
            } else if score == best {
                ties += 1;
                if self.rng.below(ties) == 0 {
                    chosen = Some(p);
                }
            }
        }
        chosen
    }

    /// Exact best fit over every host: the fallback when share rounding hid a fit.
    pub(super) fn place_exact_scan(&self, req: &TaskRequest) -> Option<Placement> {
        (0..self.snap.hosts.len() as HostIdx)
            .filter_map(|h| self.gpus_on_host(h, req, None))
            .min_by_key(|p| {
                let free: u64 = p
                    .gpus
                    .iter()
                    .map(|s| self.snap.gpus[s.gpu as usize].mem_free.0)
                    .sum();
                (free, p.host)
            })
    }
}
