//! Property tests: whatever the fleet, the requests and the policy, no GPU is ever
//! overcommitted, dedicated GPUs are never shared, release gives back exactly what assign
//! took, and the same input and seed give the same decisions.

use proptest::prelude::*;
use std::collections::HashMap;
use tessera_model::{ComputeMilli, GpuUuid, HostId, MiB, MilliCpu, SharingMode};
use tessera_placement::{
    DemandProfile, Engine, GpuSpec, HostSpec, Placement, Policy, PoolLimits, Snapshot, TaskRequest,
};

const POLICIES: [Policy; 6] = [
    Policy::Fragmentation,
    Policy::Binpack,
    Policy::SpreadHost,
    Policy::SpreadGpu,
    Policy::FgdSim,
    Policy::BestFitSim,
];

#[derive(Debug, Clone)]
enum Op {
    Place(Box<TaskRequest>),
    /// Release the live placement at this position (modulo their number).
    Release(usize),
}

fn hosts() -> impl Strategy<Value = Vec<HostSpec>> {
    prop::collection::vec(
        (
            1u64..64,
            1u64..256,
            1usize..=8,
            prop_oneof![Just(16u64), Just(24), Just(80)],
            any::<bool>(),
            1u32..6,
        ),
        1..6,
    )
    .prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (cpu, mem, gpus, gib, healthy, limit))| HostSpec {
                id: HostId::new(format!("host-{i}")).expect("valid"),
                cpu: MilliCpu(cpu * 1000),
                memory: MiB(mem * 1024),
                labels: Default::default(),
                active: true,
                gpus: (0..gpus)
                    .map(|g| GpuSpec {
                        uuid: GpuUuid::new(format!("GPU-{i}-{g}")).expect("valid"),
                        model: format!("M{gib}"),
                        memory: MiB(gib * 1024),
                        mps_client_limit: limit,
                        // Some hosts have one unhealthy GPU.
                        healthy: healthy || g != 0,
                    })
                    .collect(),
            })
            .collect()
    })
}

fn request() -> impl Strategy<Value = TaskRequest> {
    let cpu = (0u64..16).prop_map(|c| MilliCpu(c * 1000));
    let mem = (0u64..64).prop_map(|m| MiB(m * 1024));
    prop_oneof![
        (cpu.clone(), mem.clone()).prop_map(|(c, m)| TaskRequest::cpu_only(c, m)),
        (cpu.clone(), mem.clone(), 1u32..4).prop_map(|(c, m, n)| TaskRequest::whole(c, m, n)),
        (cpu, mem, 1u64..40_000, prop::option::of(1u32..=1000))
            .prop_map(|(c, m, g, k)| { TaskRequest::shared(c, m, MiB(g), k.map(ComputeMilli)) }),
    ]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => request().prop_map(|r| Op::Place(Box::new(r))),
            1 => any::<usize>().prop_map(Op::Release),
        ],
        1..60,
    )
}

/// Runs `ops`, checking capacity after every step; returns every decision made.
fn run(hosts: &[HostSpec], policy: Policy, seed: u64, ops: &[Op]) -> Vec<Option<Placement>> {
    let requests: Vec<TaskRequest> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Place(r) => Some((**r).clone()),
            Op::Release(_) => None,
        })
        .collect();
    let profile = DemandProfile::from_requests(&requests);
    let mut engine = Engine::new(
        Snapshot::new(hosts.to_vec(), PoolLimits::default()),
        policy,
        &profile,
        seed,
    );
    let initial = usage(&engine);
    let mut live: Vec<Placement> = Vec::new();
    let mut decisions = Vec::new();
    for op in ops {
        match op {
            Op::Place(req) => {
                let placed = engine.place(req).ok();
                if let Some(p) = &placed {
                    engine.assign(p).expect("a fresh placement fits");
                    live.push(p.clone());
                }
                decisions.push(placed);
            }
            Op::Release(i) if !live.is_empty() => {
                let p = live.swap_remove(i % live.len());
                engine.release(&p).expect("releasing a live placement");
            }
            Op::Release(_) => {}
        }
        check_capacity(&engine, &live, hosts);
    }
    for p in live.drain(..) {
        engine.release(&p).expect("releasing a live placement");
    }
    assert_eq!(
        usage(&engine),
        initial,
        "releasing everything restores the empty snapshot"
    );
    decisions
}

type Usage = Vec<(MilliCpu, MiB, Vec<tessera_placement::GpuUsage>)>;

fn usage(engine: &Engine) -> Usage {
    let snap = engine.snapshot();
    (0..snap.host_count() as u32)
        .map(|h| {
            let (cpu, mem) = snap.host_free(h);
            (
                cpu,
                mem,
                snap.gpus_of(h).map(|g| snap.gpu_usage(g)).collect(),
            )
        })
        .collect()
}

/// Recomputes every GPU's load from the live placements and compares with the snapshot.
fn check_capacity(engine: &Engine, live: &[Placement], hosts: &[HostSpec]) {
    let snap = engine.snapshot();
    let mut mem: HashMap<u32, u64> = HashMap::new();
    let mut compute: HashMap<u32, u32> = HashMap::new();
    let mut clients: HashMap<u32, u32> = HashMap::new();
    let mut dedicated: HashMap<u32, u32> = HashMap::new();
    let mut cpu: HashMap<u32, u64> = HashMap::new();
    for p in live {
        *cpu.entry(p.host).or_default() += p.cpu.0;
        for s in &p.gpus {
            if s.dedicated {
                *dedicated.entry(s.gpu).or_default() += 1;
            } else {
                *mem.entry(s.gpu).or_default() += s.memory.0;
                *compute.entry(s.gpu).or_default() += s.compute.0;
                *clients.entry(s.gpu).or_default() += 1;
            }
        }
    }
    for (h, spec) in hosts.iter().enumerate() {
        let h = h as u32;
        assert!(
            cpu.get(&h).copied().unwrap_or(0) <= spec.cpu.0,
            "host CPU overcommitted"
        );
        for g in snap.gpus_of(h) {
            let u = snap.gpu_usage(g);
            let d = dedicated.get(&g).copied().unwrap_or(0);
            let c = clients.get(&g).copied().unwrap_or(0);
            assert!(d <= 1, "GPU {g} dedicated twice");
            assert!(d == 0 || c == 0, "dedicated GPU {g} is also shared");
            assert!(
                mem.get(&g).copied().unwrap_or(0) <= u.memory_capacity.0,
                "GPU {g} memory overcommitted"
            );
            assert!(
                compute.get(&g).copied().unwrap_or(0) <= u.compute_capacity.0,
                "GPU {g} compute overcommitted"
            );
            assert!(c <= u.client_limit, "GPU {g} over its MPS client limit");
            assert_eq!(u.clients, c);
            let expected_mode = if d == 1 {
                SharingMode::Dedicated
            } else if c > 0 {
                SharingMode::Mps
            } else {
                SharingMode::Idle
            };
            assert_eq!(u.mode, expected_mode);
            if d == 0 {
                assert_eq!(
                    u.memory_free.0,
                    u.memory_capacity.0 - mem.get(&g).copied().unwrap_or(0)
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn no_policy_ever_overcommits(hosts in hosts(), ops in ops(), policy in 0usize..6, seed in any::<u64>()) {
        run(&hosts, POLICIES[policy], seed, &ops);
    }

    #[test]
    fn same_input_and_seed_same_decisions(hosts in hosts(), ops in ops(), policy in 0usize..6, seed in any::<u64>()) {
        let a = run(&hosts, POLICIES[policy], seed, &ops);
        let b = run(&hosts, POLICIES[policy], seed, &ops);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn a_rejected_task_really_fits_nowhere(hosts in hosts(), req in request(), policy in 0usize..6) {
        let mut engine = Engine::new(
            Snapshot::new(hosts.clone(), PoolLimits::default()),
            POLICIES[policy],
            &DemandProfile::from_requests([&req]),
            1,
        );
        if let Err(rejection) = engine.place(&req) {
            // Binpack over an empty fleet is exact: if it also finds nothing, nothing fits.
            let mut binpack = Engine::new(Snapshot::new(hosts, PoolLimits::default()), Policy::Binpack, &DemandProfile::default(), 1);
            prop_assert!(binpack.place(&req).is_err(), "{} rejected what binpack placed: {}", POLICIES[policy].name(), rejection);
            prop_assert_eq!(rejection.hosts_filtered.values().sum::<u32>(), rejection.hosts_evaluated);
        }
    }
}
