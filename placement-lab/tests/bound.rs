//! Property test of the allocation ceiling (`bound`): no policy ever allocates more than it,
//! and an engine that placed every shared task allocates no more than the ceiling for
//! engines that do. A ceiling below what a real engine reached would make `replay`'s floor
//! a false claim.

use proptest::prelude::*;
use std::fmt::Write as _;
use tessera_placement::{DemandProfile, Engine, GpuDemand, Policy, PoolLimits, Snapshot};
use tessera_placement_lab::bound::{Demand, allocation_ceiling};
use tessera_placement_lab::openb::{parse_nodes, parse_tasks};

const POLICIES: [Policy; 4] = [
    Policy::Fragmentation,
    Policy::FgdSim,
    Policy::Binpack,
    Policy::SpreadGpu,
];

/// (GPUs per node) and tasks as (GPUs, thousandths of each).
fn workload() -> impl Strategy<Value = (Vec<u32>, Vec<(u32, u32)>)> {
    let nodes = prop::collection::vec(prop_oneof![Just(1u32), Just(2), Just(4), Just(8)], 1..6);
    let task = prop_oneof![
        Just((0u32, 0u32)),
        // A few distinct shares, as real workloads have (each search step is a knapsack
        // over them).
        prop::sample::select(vec![50u32, 110, 160, 230, 320, 470, 550, 650, 810, 999])
            .prop_map(|m| (1, m)),
        (1u32..1000).prop_map(|m| (1, m)),
        (1u32..=4).prop_map(|n| (n, 1000)),
    ];
    (nodes, prop::collection::vec(task, 1..40))
}

fn csvs(nodes: &[u32], tasks: &[(u32, u32)]) -> (String, String) {
    let mut n = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
    for (i, gpus) in nodes.iter().enumerate() {
        let _ = writeln!(n, "node-{i},1000000,10000000,{gpus},G2");
    }
    let mut t = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
    for (i, (num, milli)) in tasks.iter().enumerate() {
        let _ = writeln!(t, "task-{i},1000,1024,{num},{milli},");
    }
    (n, t)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn no_policy_allocates_more_than_the_ceiling((nodes, tasks) in workload(), seed in 0u64..1000) {
        let (n, t) = csvs(&nodes, &tasks);
        let hosts = parse_nodes("nodes.csv", &n).expect("valid nodes");
        let tasks = parse_tasks("tasks.csv", &t).expect("valid tasks");
        let gpus: u32 = nodes.iter().sum();
        let demand: Vec<Demand> = tasks
            .iter()
            .filter(|t| t.num_gpu > 0)
            .map(|t| Demand::new(t.gpu_milli as u16, f64::from(t.num_gpu)))
            .collect();
        let ceiling = allocation_ceiling(&demand, f64::from(gpus)).expect("nothing forced");
        let shared_placed: Vec<Demand> = demand
            .iter()
            .map(|d| Demand { all_placed: d.share < 1000, ..*d })
            .collect();
        let ceiling_shared = allocation_ceiling(&shared_placed, f64::from(gpus));
        let profile = DemandProfile::from_requests(tasks.iter().map(|t| &t.request));
        for policy in POLICIES {
            let mut engine = Engine::new(
                Snapshot::new(hosts.clone(), PoolLimits::default()),
                policy,
                &profile,
                seed,
            );
            let (mut allocated, mut every_shared) = (0.0, true);
            for task in &tasks {
                match engine.try_place(&task.request) {
                    Some(p) => {
                        engine.assign(&p).expect("fits its own snapshot");
                        allocated += task.gpu_request_milli() as f64;
                    }
                    None => {
                        every_shared &= !matches!(task.request.gpu, GpuDemand::Shared { .. });
                    }
                }
            }
            prop_assert!(
                allocated <= ceiling + 0.5,
                "{policy:?} allocated {allocated} above the ceiling {ceiling}"
            );
            if every_shared {
                let Some(c) = ceiling_shared else {
                    return Err(TestCaseError::fail(format!(
                        "{policy:?} placed every shared task, yet the ceiling says they cannot all fit"
                    )));
                };
                prop_assert!(
                    allocated <= c + 0.5,
                    "{policy:?} placed every shared task and allocated {allocated}, above {c}"
                );
            }
        }
    }
}
