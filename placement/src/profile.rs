//! The workload's shape, and how fragmented a host's free capacity is for it.
//!
//! Fragmentation follows FGD (Weng et al., USENIX ATC 2023): for each typical task shape,
//! free GPU share that the shape could not use counts as fragmented; a host's
//! fragmentation is the sum over shapes, weighted by how common each shape is. Placing a
//! task where it raises fragmentation least keeps free capacity in usable shapes.

use crate::request::{GpuDemand, TaskRequest};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use tessera_model::{MiB, MilliCpu};

/// One typical task shape and its share of the workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileEntry {
    pub cpu: MilliCpu,
    /// Host memory.
    pub memory: MiB,
    pub gpu: GpuDemand,
    /// Allowed GPU models; empty means any.
    pub gpu_models: Vec<String>,
    /// Fraction of the workload, summing to 1 over the profile.
    pub weight: f64,
}

/// The distribution of task shapes a pool expects.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DemandProfile {
    pub entries: Vec<ProfileEntry>,
}

impl DemandProfile {
    /// Distinct shapes of `requests`, each weighted by its share of them.
    pub fn from_requests<'a>(requests: impl IntoIterator<Item = &'a TaskRequest>) -> Self {
        let mut counts: HashMap<(MilliCpu, MiB, GpuDemand, Vec<String>), usize> = HashMap::new();
        let mut order = Vec::new();
        let mut total = 0usize;
        for r in requests {
            let key = (r.cpu, r.memory, r.gpu, r.constraints.gpu_models.clone());
            let n = counts.entry(key.clone()).or_insert(0);
            if *n == 0 {
                order.push(key);
            }
            *n += 1;
            total += 1;
        }
        let entries = order
            .into_iter()
            .map(|key| {
                let n = counts[&key];
                ProfileEntry {
                    cpu: key.0,
                    memory: key.1,
                    gpu: key.2,
                    gpu_models: key.3,
                    weight: n as f64 / total as f64,
                }
            })
            .collect();
        DemandProfile { entries }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A profile entry prepared for one snapshot's GPU kinds.
#[derive(Debug, Clone)]
pub(crate) struct CompiledEntry {
    /// GPUs it needs; 0 for CPU-only shapes.
    pub gpus: u32,
    /// Share of one GPU it needs, per interned GPU kind; `u16::MAX` where the kind is not
    /// allowed or too small. 1000 means an idle GPU.
    pub need: Vec<u16>,
    pub cpu: MilliCpu,
    pub memory: MiB,
    pub weight: f64,
    /// Per GPU kind, the weight of this shape among the tasks that kind will receive (see
    /// [`demand_by_kind`]); 0 where it cannot land. CPU-only shapes keep their weight.
    pub on_kind: Vec<f64>,
}

/// Share (thousandths of a GPU) that `demand` needs on a GPU kind of `kind_memory`,
/// rounded down like free shares are, so a GPU with exactly enough memory still fits; the
/// final choice always passes the exact checks of the snapshot.
pub(crate) fn share_needed(demand: GpuDemand, kind_memory: MiB) -> u16 {
    match demand {
        GpuDemand::None => 0,
        GpuDemand::Whole { .. } => 1000,
        GpuDemand::Shared { memory, compute } => {
            let mem = memory.0.saturating_mul(1000) / kind_memory.0.max(1);
            let share = mem.max(u64::from(compute.map_or(0, |c| c.0)));
            if share > 1000 {
                u16::MAX
            } else {
                share.max(1) as u16
            }
        }
    }
}

/// What the fragmentation tables need to know of a pool besides its GPU kinds.
#[derive(Debug, Clone, Default)]
pub(crate) struct PoolShape {
    /// GPUs of each kind.
    pub gpus_per_kind: Vec<u32>,
    /// The most GPUs on one host.
    pub max_gpus: usize,
    /// Per kind, the distinct sizes (CPU, memory, GPUs of that kind) of the hosts that have
    /// such GPUs; empty when unknown (every shape is then taken to fit some host).
    pub hosts_per_kind: Vec<Vec<(MilliCpu, MiB, u32)>>,
}

impl PoolShape {
    pub fn of(snap: &crate::Snapshot) -> PoolShape {
        let kinds = snap.models.len();
        let mut pool = PoolShape {
            gpus_per_kind: vec![0; kinds],
            max_gpus: 0,
            hosts_per_kind: vec![Vec::new(); kinds],
        };
        for h in &snap.hosts {
            pool.max_gpus = pool.max_gpus.max(h.gpu_count as usize);
            let mut here = vec![0u32; kinds];
            for g in h.first_gpu..h.first_gpu + h.gpu_count {
                here[usize::from(snap.gpus[g as usize].model)] += 1;
            }
            for (k, &n) in here.iter().enumerate().filter(|(_, n)| **n > 0) {
                pool.gpus_per_kind[k] += n;
                pool.hosts_per_kind[k].push((h.cpu_cap, h.mem_cap, n));
            }
        }
        for sizes in &mut pool.hosts_per_kind {
            sizes.sort_unstable();
            sizes.dedup();
        }
        pool
    }

    /// A pool known only by its GPUs per kind.
    #[cfg(test)]
    pub fn gpus(gpus_per_kind: &[u32], max_gpus: usize) -> PoolShape {
        PoolShape {
            gpus_per_kind: gpus_per_kind.to_vec(),
            max_gpus,
            hosts_per_kind: Vec::new(),
        }
    }

    /// Whether some host with GPUs of `kind` could hold the shape when empty.
    fn fits_some_host(&self, kind: usize, e: &CompiledEntry) -> bool {
        self.hosts_per_kind.get(kind).is_none_or(|sizes| {
            sizes
                .iter()
                .any(|&(cpu, mem, gpus)| cpu >= e.cpu && mem >= e.memory && gpus >= e.gpus)
        })
    }
}

/// The profile's shapes on a pool's GPU kinds (`(model, memory)`), with the demand each
/// kind receives.
///
/// `by_kind: false` keeps every shape's whole weight on every kind it may use, as FGD does.
#[cfg(test)]
pub(crate) fn compile(
    profile: &DemandProfile,
    kinds: &[(String, MiB)],
    pool: &PoolShape,
    by_kind: bool,
) -> Vec<CompiledEntry> {
    compile_with_room(profile, kinds, pool, by_kind).0
}

/// [`compile`], and per kind the weight of pinned demand that cannot use it beyond what
/// even pinning would give (see [`demand_by_kind`]; 0 without `by_kind`).
fn compile_with_room(
    profile: &DemandProfile,
    kinds: &[(String, MiB)],
    pool: &PoolShape,
    by_kind: bool,
) -> (Vec<CompiledEntry>, Vec<f64>) {
    let mut entries = compile_shapes(profile, kinds);
    let room = if by_kind {
        // A shape no host of a kind could hold (too much CPU or memory, or more GPUs than
        // its hosts have) is no demand there: it is as pinned to the kinds that can as a
        // shape that names them.
        let mut pinned: Vec<bool> = profile
            .entries
            .iter()
            .map(|p| !p.gpu_models.is_empty())
            .collect();
        for (e, pinned) in entries.iter_mut().zip(&mut pinned) {
            for k in 0..kinds.len() {
                if e.gpus > 0 && e.need[k] <= 1000 && !pool.fits_some_host(k, e) {
                    e.need[k] = u16::MAX;
                    *pinned = true;
                }
            }
        }
        demand_by_kind(&mut entries, &pinned, &pool.gpus_per_kind)
    } else {
        for e in &mut entries {
            e.on_kind = vec![e.weight; kinds.len()];
        }
        vec![0.0; kinds.len()]
    };
    (entries, room)
}

fn compile_shapes(profile: &DemandProfile, kinds: &[(String, MiB)]) -> Vec<CompiledEntry> {
    profile
        .entries
        .iter()
        .map(|e| CompiledEntry {
            gpus: match e.gpu {
                GpuDemand::None => 0,
                GpuDemand::Whole { count } => count,
                GpuDemand::Shared { .. } => 1,
            },
            need: kinds
                .iter()
                .map(|(name, mem)| {
                    if e.gpu_models.is_empty() || e.gpu_models.iter().any(|m| m == name) {
                        share_needed(e.gpu, *mem)
                    } else {
                        u16::MAX
                    }
                })
                .collect(),
            cpu: e.cpu,
            memory: e.memory,
            weight: e.weight,
            on_kind: Vec::new(),
        })
        .collect()
}

/// Which share of each shape's demand each GPU kind receives, as per-kind weights of the
/// same scale as the profile's. A shape pinned to GPU models (or that fits only some) is
/// demand on those kinds only, spread over them by their GPUs; unpinned demand goes where
/// pinned demand leaves most room, so that every kind's expected load per GPU is as even as
/// the pinned demand allows (water-filling). Each kind's GPU shapes are then scaled to the
/// profile's total GPU weight, so fragmentation on every kind is measured against the mix
/// of tasks that will actually arrive there, on one scale. `gpus_per_kind`: how many GPUs
/// of each kind the pool has.
///
/// Returns, per kind, how much less pinned demand it carries than its share of the GPUs
/// would (the profile's pinned weight minus the kind's pinned weight per share of GPUs,
/// at least 0): free capacity there is what the pinned tasks elsewhere cannot use, so
/// filling it first keeps the kinds pinned tasks need for them. Even pinning gives 0
/// everywhere.
pub(crate) fn demand_by_kind(
    entries: &mut [CompiledEntry],
    pinned: &[bool],
    gpus_per_kind: &[u32],
) -> Vec<f64> {
    let kinds = gpus_per_kind.len();
    let cap: Vec<f64> = gpus_per_kind.iter().map(|&n| f64::from(n)).collect();
    let allowed = |e: &CompiledEntry, k: usize| e.gpus > 0 && e.need[k] <= 1000 && cap[k] > 0.0;
    // GPUs' worth of demand a shape puts on kind k.
    let size = |e: &CompiledEntry, k: usize| {
        if e.gpus == 1 {
            f64::from(e.need[k]) / 1000.0
        } else {
            f64::from(e.gpus)
        }
    };
    let spread = |e: &CompiledEntry, by: &[f64]| -> Vec<f64> {
        let total: f64 = (0..kinds).filter(|&k| allowed(e, k)).map(|k| by[k]).sum();
        (0..kinds)
            .map(|k| {
                if allowed(e, k) && total > 0.0 {
                    by[k] / total
                } else {
                    0.0
                }
            })
            .collect()
    };
    // Pinned load per kind, and the unpinned demand to place.
    let mut load = vec![0.0; kinds];
    let mut pinned_weight = vec![0.0; kinds];
    let mut unpinned = 0.0;
    for (e, &is_pinned) in entries.iter().zip(pinned) {
        if e.gpus == 0 {
            continue;
        }
        if is_pinned {
            for (k, f) in spread(e, &cap).into_iter().enumerate() {
                load[k] += e.weight * f * size(e, k);
                pinned_weight[k] += e.weight * f;
            }
        } else {
            let fits: Vec<usize> = (0..kinds).filter(|&k| allowed(e, k)).collect();
            if !fits.is_empty() {
                unpinned +=
                    e.weight * fits.iter().map(|&k| size(e, k)).sum::<f64>() / fits.len() as f64;
            }
        }
    }
    // Water level: sum over kinds of max(0, level × GPUs − pinned load) = unpinned demand.
    let room = |level: f64| -> f64 {
        (0..kinds)
            .map(|k| (level * cap[k] - load[k]).max(0.0))
            .sum()
    };
    let (mut lo, mut hi) = (0.0, 1.0);
    while room(hi) < unpinned && hi < 1e12 {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if room(mid) < unpinned {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let unpinned_share: Vec<f64> = (0..kinds)
        .map(|k| (hi * cap[k] - load[k]).max(0.0))
        .collect();
    let has_unpinned_room = unpinned_share.iter().any(|&x| x > 0.0);
    for (e, &is_pinned) in entries.iter_mut().zip(pinned) {
        e.on_kind = if e.gpus == 0 {
            vec![e.weight; kinds]
        } else {
            let by = if is_pinned || !has_unpinned_room {
                &cap
            } else {
                &unpinned_share
            };
            // Fall back to GPUs when no room is left on the kinds this shape fits.
            let mut f = spread(e, by);
            if f.iter().all(|&x| x == 0.0) {
                f = spread(e, &cap);
            }
            f.into_iter().map(|x| e.weight * x).collect()
        };
    }
    // Per kind, GPU shapes scaled to the profile's GPU weight.
    let gpu_weight: f64 = entries
        .iter()
        .filter(|e| e.gpus > 0)
        .map(|e| e.weight)
        .sum();
    for k in 0..kinds {
        let here: f64 = entries
            .iter()
            .filter(|e| e.gpus > 0)
            .map(|e| e.on_kind[k])
            .sum();
        if here > 0.0 {
            for e in entries.iter_mut().filter(|e| e.gpus > 0) {
                e.on_kind[k] *= gpu_weight / here;
            }
        }
    }
    let all_pinned: f64 = pinned_weight.iter().sum();
    let gpus: f64 = cap.iter().sum();
    (0..kinds)
        .map(|k| {
            if cap[k] > 0.0 {
                (all_pinned - pinned_weight[k] * gpus / cap[k]).max(0.0)
            } else {
                0.0
            }
        })
        .collect()
}

/// Fragmentation of a host with `cpu_free` and GPUs `(kind, free share)`, for `profile`.
pub(crate) fn fragmentation(
    profile: &[CompiledEntry],
    cpu_free: MilliCpu,
    gpus: &[(u16, u16)],
) -> f64 {
    let total: u32 = gpus.iter().map(|&(_, f)| u32::from(f)).sum();
    if total == 0 {
        return 0.0;
    }
    // A host of one GPU kind is measured against the demand that kind receives; a mixed
    // one against the whole workload's.
    let kind = gpus[0].0;
    let one_kind = gpus.iter().all(|&(k, _)| k == kind);
    let mut acc = 0.0;
    for e in profile {
        let weight = if one_kind {
            e.on_kind
                .get(usize::from(kind))
                .copied()
                .unwrap_or(e.weight)
        } else {
            e.weight
        };
        let unusable = if e.gpus == 0 || cpu_free < e.cpu {
            total
        } else {
            let mut fits = 0;
            let mut stranded = 0;
            for &(kind, free) in gpus {
                if free >= e.need[kind as usize] {
                    fits += 1;
                } else {
                    stranded += u32::from(free);
                }
            }
            if fits >= e.gpus { stranded } else { total }
        };
        acc += weight * f64::from(unusable);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::ComputeMilli;

    fn kinds() -> Vec<(String, MiB)> {
        vec![("T4".into(), MiB(1000))]
    }

    #[test]
    fn share_needed_rounds_up_and_takes_the_larger_dimension() {
        let demand = GpuDemand::Shared {
            memory: MiB(8 * 1024),
            compute: Some(ComputeMilli(250)),
        };
        assert_eq!(share_needed(demand, MiB(80 * 1024)), 250);
        assert_eq!(share_needed(demand, MiB(24 * 1024)), 333);
        assert_eq!(share_needed(demand, MiB(4 * 1024)), u16::MAX);
    }

    #[test]
    fn free_share_too_small_for_the_workload_is_fragmented() {
        // Every task wants 600: a GPU with 500 free is all fragment, a fresh one is not.
        let profile = DemandProfile {
            entries: vec![ProfileEntry {
                cpu: MilliCpu(1000),
                memory: MiB(1024),
                gpu: GpuDemand::Shared {
                    memory: MiB(600),
                    compute: None,
                },
                gpu_models: vec![],
                weight: 1.0,
            }],
        };
        let compiled = compile(&profile, &kinds(), &PoolShape::gpus(&[4], 8), true);
        assert_eq!(
            fragmentation(&compiled, MilliCpu(4000), &[(0, 500), (0, 1000)]),
            500.0
        );
        assert_eq!(fragmentation(&compiled, MilliCpu(4000), &[(0, 1000)]), 0.0);
        // Without CPU for the shape, everything free is stranded.
        assert_eq!(
            fragmentation(&compiled, MilliCpu(500), &[(0, 500), (0, 1000)]),
            1500.0
        );
    }

    #[test]
    fn each_gpu_kind_is_measured_against_the_demand_it_receives() {
        // Kind 0 ("T4", 100 GPUs) carries a pinned shape; kind 1 ("G2", 300 GPUs) none.
        let shared = |gib: u64| GpuDemand::Shared {
            memory: MiB(gib),
            compute: None,
        };
        let entry = |gpu, models: &[&str], weight| ProfileEntry {
            cpu: MilliCpu(1000),
            memory: MiB(1),
            gpu,
            gpu_models: models.iter().map(|m| (*m).to_owned()).collect(),
            weight,
        };
        let profile = DemandProfile {
            entries: vec![
                entry(shared(500), &["T4"], 0.2),
                entry(shared(300), &[], 0.6),
                entry(GpuDemand::None, &[], 0.2),
            ],
        };
        let kinds = vec![("T4".to_owned(), MiB(1000)), ("G2".to_owned(), MiB(1000))];
        let (entries, room) =
            compile_with_room(&profile, &kinds, &PoolShape::gpus(&[100, 300], 8), true);
        // The pinned shape is demand on T4 only; G2's mix is the unpinned shape alone.
        assert_eq!(entries[0].on_kind[1], 0.0);
        assert!(entries[0].on_kind[0] > 0.0);
        let gpu_weight = 0.8;
        for k in 0..2 {
            let sum: f64 = entries[..2].iter().map(|e| e.on_kind[k]).sum();
            assert!((sum - gpu_weight).abs() < 1e-9, "kind {k}: {sum}");
        }
        assert!((entries[1].on_kind[1] - gpu_weight).abs() < 1e-9);
        // CPU-only demand weighs the same on every kind.
        assert_eq!(entries[2].on_kind, vec![0.2, 0.2]);
        // Pinned demand that G2 cannot serve makes its free share count as unusable; T4,
        // which carries more than its share of GPUs' worth, gets none.
        assert_eq!(room[0], 0.0);
        assert!((room[1] - 0.2).abs() < 1e-9, "{room:?}");
        // Pinning in proportion to the GPUs leaves nothing extra anywhere.
        let even = DemandProfile {
            entries: vec![
                entry(shared(500), &["T4"], 0.1),
                entry(shared(500), &["G2"], 0.3),
                entry(shared(300), &[], 0.6),
            ],
        };
        let (_, room) = compile_with_room(&even, &kinds, &PoolShape::gpus(&[100, 300], 8), true);
        assert!(room.iter().all(|r| r.abs() < 1e-9), "{room:?}");
        // As FGD does: every shape's whole weight wherever it may go.
        let (fgd, room) =
            compile_with_room(&profile, &kinds, &PoolShape::gpus(&[100, 300], 8), false);
        assert_eq!(fgd[0].on_kind, vec![0.2, 0.2]);
        assert_eq!(room, vec![0.0, 0.0]);
    }

    #[test]
    fn a_shape_no_host_of_a_kind_could_hold_is_no_demand_there() {
        use crate::{GpuSpec, HostSpec, PoolLimits, Snapshot};
        use tessera_model::{GpuUuid, HostId};
        // T4s on 2-GPU hosts of 16 cores, G2s on 8-GPU hosts of 96 cores.
        let host = |name: &str, model: &str, gpus: usize, cores: u64| HostSpec {
            id: HostId::new(name).expect("valid"),
            cpu: MilliCpu(cores * 1000),
            memory: MiB(512 * 1024),
            labels: Default::default(),
            active: true,
            gpus: (0..gpus)
                .map(|g| GpuSpec {
                    uuid: GpuUuid::new(format!("{name}/{g}")).expect("valid"),
                    model: model.to_owned(),
                    memory: MiB(1000),
                    mps_client_limit: 8,
                    healthy: true,
                })
                .collect(),
        };
        let snap = Snapshot::new(
            vec![
                host("t4-a", "T4", 2, 16),
                host("t4-b", "T4", 2, 16),
                host("g2-a", "G2", 8, 96),
            ],
            PoolLimits::default(),
        );
        let pool = PoolShape::of(&snap);
        assert_eq!(pool.gpus_per_kind, vec![4, 8]);
        assert_eq!(pool.max_gpus, 8);
        assert_eq!(
            pool.hosts_per_kind[0],
            vec![(MilliCpu(16_000), MiB(512 * 1024), 2)]
        );
        let entry = |cpu: u64, gpu| ProfileEntry {
            cpu: MilliCpu(cpu * 1000),
            memory: MiB(1024),
            gpu,
            gpu_models: vec![],
            weight: 0.25,
        };
        let shared = GpuDemand::Shared {
            memory: MiB(500),
            compute: None,
        };
        let profile = DemandProfile {
            entries: vec![
                // Fits both kinds.
                entry(4, shared),
                // Eight GPUs: only the G2 host has them.
                entry(32, GpuDemand::Whole { count: 8 }),
                // One GPU but 64 cores: only the G2 host has them.
                entry(64, shared),
                entry(4, GpuDemand::Whole { count: 1 }),
            ],
        };
        let (entries, room) = compile_with_room(&profile, &snap.models, &pool, true);
        assert!(entries[0].on_kind[0] > 0.0);
        for restricted in &entries[1..3] {
            assert_eq!(restricted.need[0], u16::MAX);
            assert_eq!(restricted.on_kind[0], 0.0);
            assert!(restricted.on_kind[1] > 0.0);
        }
        // As with a shape pinned to G2 by name: T4's free share is what they cannot use,
        // so it is filled first.
        assert!(room[0] > 0.0 && room[1] == 0.0, "{room:?}");
        // FGD's weights stay as published: every shape on every kind its GPUs allow.
        let (fgd, _) = compile_with_room(&profile, &snap.models, &pool, false);
        assert_eq!(fgd[1].on_kind, vec![0.25, 0.25]);
        assert_eq!(fgd[1].need[0], 1000);
    }

    #[test]
    fn profile_weights_follow_request_counts() {
        let a = TaskRequest::whole(MilliCpu(1000), MiB(1), 1);
        let b = TaskRequest::cpu_only(MilliCpu(1000), MiB(1));
        let p = DemandProfile::from_requests([&a, &a, &a, &b]);
        assert_eq!(p.entries.len(), 2);
        assert_eq!(p.entries[0].weight, 0.75);
        assert_eq!(p.entries[1].weight, 0.25);
    }
}

/// Precomputed cumulative weights that make a host's fragmentation cost O(its GPUs)
/// instead of O(profile × GPUs): the inner loop of every fragmentation-aware decision.
#[derive(Debug, Clone)]
pub(crate) struct FragTables {
    entries: Vec<CompiledEntry>,
    /// Distinct CPU requests of the profile, ascending. A host's level is how many of them
    /// its free CPU covers; an entry fits the host's CPU when the level passes its own.
    cpu_levels: Vec<MilliCpu>,
    /// Per GPU kind, `(levels + 1) × 1001`: weight of one-GPU entries with CPU level ≤ c
    /// and share need ≤ n.
    one_gpu: Vec<Vec<f64>>,
    /// Per GPU kind, `(levels + 1) × (max_gpus + 1)`: weight of multi-GPU entries with CPU
    /// level ≤ c needing at most k idle GPUs.
    multi_gpu: Vec<Vec<f64>>,
    max_gpus: usize,
    /// Per GPU kind, the weight of the shapes it receives (CPU-only ones included).
    total_weight: Vec<f64>,
    /// Per GPU kind: host CPU and host memory the workload asks for per thousandth of a
    /// GPU, so free GPU share beyond what a host's free CPU or memory can feed is known to
    /// be stranded.
    cpu_per_share: Vec<f64>,
    mem_per_share: Vec<f64>,
    /// Per GPU kind, `V(free share)`: the share a GPU with that much free is expected to
    /// leave unused once the workload has filled it (see [`crate::gaps`]). Learned on
    /// first use: only shared tasks need it.
    gap_value: Vec<OnceLock<Arc<Vec<f64>>>>,
}

const SHARES: usize = 1001;

impl FragTables {
    pub fn new(
        profile: &DemandProfile,
        kinds: &[(String, MiB)],
        pool: &PoolShape,
        by_kind: bool,
    ) -> FragTables {
        let max_gpus = pool.max_gpus;
        let (entries, room) = compile_with_room(profile, kinds, pool, by_kind);
        let mut cpu_levels: Vec<MilliCpu> = entries.iter().map(|e| e.cpu).collect();
        cpu_levels.sort_unstable();
        cpu_levels.dedup();
        let rows = cpu_levels.len() + 1;
        let level_of = |cpu: MilliCpu| cpu_levels.partition_point(|&t| t < cpu) + 1;
        let mut one_gpu = Vec::with_capacity(kinds.len());
        let mut multi_gpu = Vec::with_capacity(kinds.len());
        for kind in 0..kinds.len() {
            let mut one = vec![0.0; rows * SHARES];
            let mut multi = vec![0.0; rows * (max_gpus + 1)];
            for e in &entries {
                let need = e.need[kind];
                if e.gpus == 0 || need > 1000 {
                    continue;
                }
                let level = level_of(e.cpu);
                let weight = e.on_kind[kind];
                if e.gpus == 1 {
                    one[level * SHARES + need as usize] += weight;
                } else if (e.gpus as usize) <= max_gpus {
                    multi[level * (max_gpus + 1) + e.gpus as usize] += weight;
                }
            }
            prefix_2d(&mut one, rows, SHARES);
            prefix_2d(&mut multi, rows, max_gpus + 1);
            one_gpu.push(one);
            multi_gpu.push(multi);
        }
        // Pinned demand elsewhere that cannot use a kind's free share counts as unusable
        // there, like shapes that fit no GPU of it.
        let total_weight = (0..kinds.len())
            .map(|k| entries.iter().map(|e| e.on_kind[k]).sum::<f64>() + room[k])
            .collect();
        let (mut cpu_per_share, mut mem_per_share) = (Vec::new(), Vec::new());
        for kind in 0..kinds.len() {
            let (mut cpu, mut mem, mut share) = (0.0, 0.0, 0.0);
            for e in entries
                .iter()
                .filter(|e| e.gpus > 0 && e.need[kind] <= 1000)
            {
                let w = e.on_kind[kind];
                cpu += w * e.cpu.0 as f64;
                mem += w * e.memory.0 as f64;
                share += w * f64::from(e.need[kind]) * f64::from(e.gpus);
            }
            let ratio = |x: f64| if share > 0.0 { x / share } else { 0.0 };
            cpu_per_share.push(ratio(cpu));
            mem_per_share.push(ratio(mem));
        }
        let gap_value = (0..kinds.len()).map(|_| OnceLock::new()).collect();
        FragTables {
            entries,
            cpu_levels,
            one_gpu,
            multi_gpu,
            max_gpus,
            total_weight,
            cpu_per_share,
            mem_per_share,
            gap_value,
        }
    }

    /// The share a GPU of `kind` with `free` share is expected to leave unused.
    pub fn gap_value(&self, kind: u16, free: u16) -> f64 {
        let values = self.gap_value[kind as usize].get_or_init(|| {
            let shapes = self.shared_shapes(kind as usize);
            // Kinds of one memory size see the same shapes: learn their values once.
            let same = (0..self.gap_value.len()).find_map(|other| {
                let learned = self.gap_value[other].get()?;
                same_shapes(&self.shared_shapes(other), &shapes).then(|| Arc::clone(learned))
            });
            same.unwrap_or_else(|| Arc::new(crate::gaps::gap_values(&shapes)))
        });
        values[usize::from(free.min(1000))]
    }

    /// `(share needed, weight)` of the profile's shared shapes on GPU kind `kind`.
    fn shared_shapes(&self, kind: usize) -> Vec<(u16, f64)> {
        self.entries
            .iter()
            .filter(|e| e.gpus == 1 && e.need[kind] < 1000 && e.on_kind[kind] > 0.0)
            .map(|e| (e.need[kind], e.on_kind[kind]))
            .collect()
    }

    /// Free GPU share (thousandths) that the host's free CPU and memory cannot feed at the
    /// workload's usual CPU and memory per unit of GPU.
    pub fn stranded(&self, cpu_free: MilliCpu, mem_free: MiB, gpus: &[(u16, u16)]) -> f64 {
        let Some(&(kind, _)) = gpus.first() else {
            return 0.0;
        };
        let total: f64 = gpus.iter().map(|&(_, f)| f64::from(f)).sum();
        let (c, m) = (
            self.cpu_per_share[kind as usize],
            self.mem_per_share[kind as usize],
        );
        let by_cpu = if c > 0.0 {
            cpu_free.0 as f64 / c
        } else {
            f64::INFINITY
        };
        let by_mem = if m > 0.0 {
            mem_free.0 as f64 / m
        } else {
            f64::INFINITY
        };
        (total - by_cpu.min(by_mem)).max(0.0)
    }

    /// Fragmentation of a host state; `gpus` sorted by (kind, free share).
    pub fn fragmentation(&self, cpu_free: MilliCpu, gpus: &[(u16, u16)]) -> f64 {
        let Some(&(kind, max_free)) = gpus.last() else {
            return 0.0;
        };
        if gpus[0].0 != kind {
            return fragmentation(&self.entries, cpu_free, gpus);
        }
        let level = self.cpu_levels.partition_point(|&t| t <= cpu_free);
        let one = &self.one_gpu[kind as usize][level * SHARES..(level + 1) * SHARES];
        let fit_one = one[max_free as usize];
        let mut total = 0u32;
        let mut partial = 0u32;
        let mut idle = 0usize;
        let mut stranded_one = 0.0;
        for &(_, free) in gpus {
            total += u32::from(free);
            if free == 1000 {
                idle += 1;
            } else {
                partial += u32::from(free);
            }
            stranded_one += f64::from(free) * (fit_one - one[free as usize]);
        }
        let fit_multi =
            self.multi_gpu[kind as usize][level * (self.max_gpus + 1) + idle.min(self.max_gpus)];
        stranded_one
            + fit_multi * f64::from(partial)
            + f64::from(total) * (self.total_weight[kind as usize] - fit_one - fit_multi).max(0.0)
    }
}

/// Whether two kinds see the same shared shapes: the same sizes, with weights equal but for
/// rounding (per-kind weights of an unpinned workload differ only in their last bits).
fn same_shapes(a: &[(u16, f64)], b: &[(u16, f64)]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.0 == y.0 && (x.1 - y.1).abs() <= 1e-9 * x.1.abs().max(y.1.abs()))
}

/// In-place 2-D prefix sum over a `rows × cols` grid.
fn prefix_2d(grid: &mut [f64], rows: usize, cols: usize) {
    for r in 0..rows {
        for c in 1..cols {
            grid[r * cols + c] += grid[r * cols + c - 1];
        }
    }
    for r in 1..rows {
        for c in 0..cols {
            grid[r * cols + c] += grid[(r - 1) * cols + c];
        }
    }
}

#[cfg(test)]
mod table_tests {
    use super::*;
    use crate::rng::Rng;
    use tessera_model::ComputeMilli;

    #[test]
    fn tables_agree_with_the_direct_sum() {
        let mut rng = Rng::new(3);
        let mut requests = Vec::new();
        for _ in 0..60 {
            let cpu = MilliCpu(1000 * (1 + rng.below(16) as u64));
            let r = match rng.below(4) {
                0 => TaskRequest::cpu_only(cpu, MiB(1)),
                1 => TaskRequest::whole(cpu, MiB(1), 1 + rng.below(4) as u32),
                _ => TaskRequest::shared(
                    cpu,
                    MiB(1),
                    MiB(1 + rng.below(999) as u64),
                    Some(ComputeMilli(rng.below(500) as u32)),
                ),
            };
            requests.push(r);
        }
        let profile = DemandProfile::from_requests(&requests);
        let kinds = vec![("A".to_owned(), MiB(1000)), ("B".to_owned(), MiB(2000))];
        for by_kind in [false, true] {
            let pool = PoolShape::gpus(&[30, 10], 8);
            let tables = FragTables::new(&profile, &kinds, &pool, by_kind);
            let compiled = compile(&profile, &kinds, &pool, by_kind);
            for _ in 0..500 {
                let kind = rng.below(2) as u16;
                let n = 1 + rng.below(8);
                let mut gpus: Vec<(u16, u16)> = (0..n)
                    .map(|_| {
                        (
                            kind,
                            if rng.below(3) == 0 {
                                1000
                            } else {
                                rng.below(1000) as u16
                            },
                        )
                    })
                    .collect();
                gpus.sort_unstable();
                let cpu = MilliCpu(rng.below(20_000) as u64);
                let fast = tables.fragmentation(cpu, &gpus);
                let slow = fragmentation(&compiled, cpu, &gpus);
                assert!(
                    (fast - slow).abs() < 1e-6,
                    "fast {fast} slow {slow} for {gpus:?} cpu {cpu:?}"
                );
            }
        }
    }
}
