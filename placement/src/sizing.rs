//! What-if sizing: how many more hosts of a capacity provider's shape would place the
//! tasks that wait for room. The answer comes from the engine itself (hypothetical hosts
//! added to the pool's snapshot, the waiting tasks placed as one batch through the one fit
//! rule), never from a formula of its own, so it counts CPU, memory, MPS clients, compute
//! caps, whole GPUs, constraints and caps exactly as a placement would.

use crate::engine::{Engine, Policy};
use crate::profile::DemandProfile;
use crate::request::TaskRequest;
use crate::snapshot::{GpuSpec, HostSpec, PoolLimits, Snapshot};
use tessera_model::{GpuUuid, HostId};

/// The answer of [`hosts_needed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizing {
    /// Hosts of the shape to add: the fewest that place every placeable waiting task (0:
    /// they fit as things are), or `max_new` when even that many do not.
    pub hosts: u32,
    /// Whether `hosts` more place every waiting task that a host of the shape can hold.
    pub enough: bool,
    /// Waiting tasks (by index) that not even an empty host of the shape holds (a GPU
    /// model it lacks, more memory than it has): more hosts of it would not help them.
    pub unfit: Vec<usize>,
}

/// A hypothetical host of `shape`, named `whatif-<n>` (its GPUs `GPU-whatif-<n>-<i>`).
fn hypothetical(shape: &HostSpec, n: u32) -> HostSpec {
    let id = format!("whatif-{n}");
    HostSpec {
        id: HostId::new(&id).expect("a valid host id"),
        active: true,
        gpus: shape
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuSpec {
                uuid: GpuUuid::new(format!("GPU-{id}-{i}")).expect("a valid GPU UUID"),
                healthy: true,
                ..g.clone()
            })
            .collect(),
        ..shape.clone()
    }
}

/// Whether `k` more hosts of `shape` place every task of `requests` (as one batch).
fn places_all(
    base: &Snapshot,
    limits: PoolLimits,
    shape: &HostSpec,
    requests: &[TaskRequest],
    k: u32,
    policy: Policy,
) -> bool {
    let mut snap = base.clone();
    for n in 1..=k {
        snap.add_host(hypothetical(shape, n), limits);
    }
    let mut engine = Engine::new(snap, policy, &DemandProfile::default(), 0);
    engine.place_batch(requests).placed() == requests.len()
}

/// The fewest hosts like `shape` that, added to `base` (the pool as it is, its tasks
/// placed), let every task of `waiting` be placed, trying at most `max_new`. Tasks that
/// no empty host of the shape holds are left out and named in [`Sizing::unfit`].
///
/// Found by doubling then bisecting on the number of hosts, each try a real batch
/// placement: the answer places them, and one host fewer was tried and does not (more
/// hosts of one shape never place fewer tasks under the engine's policies).
pub fn hosts_needed(
    base: &Snapshot,
    limits: PoolLimits,
    shape: &HostSpec,
    waiting: &[TaskRequest],
    max_new: u32,
    policy: Policy,
) -> Sizing {
    let alone = Snapshot::new(vec![hypothetical(shape, 1)], limits);
    let mut unfit = Vec::new();
    let mut fit = Vec::new();
    for (i, r) in waiting.iter().enumerate() {
        let mut e = Engine::new(alone.clone(), policy, &DemandProfile::default(), 0);
        // Alone, without the batch's own constraints against itself.
        if e.try_place(r).is_some() {
            fit.push(r.clone());
        } else {
            unfit.push(i);
        }
    }
    let tries = |k| places_all(base, limits, shape, &fit, k, policy);
    if fit.is_empty() || tries(0) {
        return Sizing {
            hosts: 0,
            enough: true,
            unfit,
        };
    }
    // `lo` does not place them all, `hi` does (once found).
    let mut lo = 0u32;
    let mut hi = 1u32.min(max_new);
    loop {
        if hi == 0 || hi > max_new {
            return Sizing {
                hosts: max_new,
                enough: false,
                unfit,
            };
        }
        if tries(hi) {
            break;
        }
        if hi == max_new {
            return Sizing {
                hosts: max_new,
                enough: false,
                unfit,
            };
        }
        lo = hi;
        hi = (hi * 2).min(max_new);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if tries(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Sizing {
        hosts: hi,
        enough: true,
        unfit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Constraints;
    use proptest::prelude::*;
    use tessera_model::{MiB, MilliCpu};

    fn shape(gpus: usize, gpu_gib: u64) -> HostSpec {
        HostSpec {
            id: HostId::new("shape").expect("valid"),
            cpu: MilliCpu(64_000),
            memory: MiB(256 * 1024),
            labels: Default::default(),
            active: true,
            gpus: (0..gpus)
                .map(|i| GpuSpec {
                    uuid: GpuUuid::new(format!("GPU-shape-{i}")).expect("valid"),
                    model: "NVIDIA L4".into(),
                    memory: MiB(gpu_gib * 1024),
                    mps_client_limit: 48,
                    healthy: true,
                })
                .collect(),
        }
    }

    fn slot(gib: u64) -> TaskRequest {
        TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(gib * 1024), None)
    }

    fn pool(hosts: usize) -> Snapshot {
        let specs = (0..hosts)
            .map(|h| HostSpec {
                id: HostId::new(format!("h{h}")).expect("valid"),
                gpus: shape(2, 24)
                    .gpus
                    .into_iter()
                    .enumerate()
                    .map(|(i, g)| GpuSpec {
                        uuid: GpuUuid::new(format!("GPU-h{h}-{i}")).expect("valid"),
                        ..g
                    })
                    .collect(),
                ..shape(2, 24)
            })
            .collect();
        Snapshot::new(specs, PoolLimits::default())
    }

    #[test]
    fn tasks_that_fit_now_need_no_host() {
        let s = hosts_needed(
            &pool(1),
            PoolLimits::default(),
            &shape(2, 24),
            &[slot(10), slot(10)],
            10,
            Policy::Binpack,
        );
        assert_eq!(
            s,
            Sizing {
                hosts: 0,
                enough: true,
                unfit: vec![]
            }
        );
    }

    #[test]
    fn the_fewest_hosts_of_the_shape_that_place_every_waiting_task() {
        // One host of 2 × 24 GiB holds four 12 GiB slots; nine need three hosts.
        let waiting = vec![slot(12); 9];
        let s = hosts_needed(
            &pool(0),
            PoolLimits::default(),
            &shape(2, 24),
            &waiting,
            10,
            Policy::Fragmentation,
        );
        assert_eq!(s.hosts, 3);
        assert!(s.enough);
        // Capped: as many as allowed, and said not to be enough.
        let s = hosts_needed(
            &pool(0),
            PoolLimits::default(),
            &shape(2, 24),
            &waiting,
            2,
            Policy::Binpack,
        );
        assert_eq!((s.hosts, s.enough), (2, false));
    }

    #[test]
    fn a_task_no_host_of_the_shape_holds_is_named_and_asks_for_nothing() {
        let too_big = slot(40);
        let mut other_model = slot(4);
        other_model.constraints = Constraints {
            gpu_models: vec!["NVIDIA H100 80GB HBM3".into()],
            ..Default::default()
        };
        let s = hosts_needed(
            &pool(1),
            PoolLimits::default(),
            &shape(2, 24),
            &[too_big, other_model],
            10,
            Policy::Binpack,
        );
        assert_eq!(
            s,
            Sizing {
                hosts: 0,
                enough: true,
                unfit: vec![0, 1]
            }
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The hosts asked for do place the waiting tasks, and one fewer does not.
        #[test]
        fn the_answer_places_them_and_one_fewer_does_not(
            existing in 0usize..3,
            sizes in proptest::collection::vec(1u64..=24, 1..24),
            binpack in any::<bool>(),
        ) {
            let policy = if binpack { Policy::Binpack } else { Policy::Fragmentation };
            let base = pool(existing);
            let shape = shape(2, 24);
            let waiting: Vec<TaskRequest> = sizes.iter().map(|g| slot(*g)).collect();
            let s = hosts_needed(&base, PoolLimits::default(), &shape, &waiting, 64, policy);
            prop_assert!(s.enough);
            prop_assert!(s.unfit.is_empty());
            prop_assert!(places_all(&base, PoolLimits::default(), &shape, &waiting, s.hosts, policy));
            if s.hosts > 0 {
                prop_assert!(!places_all(&base, PoolLimits::default(), &shape, &waiting, s.hosts - 1, policy));
            }
        }
    }
}
