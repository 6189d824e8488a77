//! Tests of the autoscaling benchmark on small hand-made traces.

use super::ca::CaLike;
use super::sim::{Rule, Run, simulate};
use super::tessera::Tessera;
use super::*;
use crate::openb::{parse_nodes, parse_tasks};
use proptest::prelude::*;

/// One node type: 1 T4, 32 cores, 128 GiB.
const ONE_GPU: &str = "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,131072,1,T4\n";

/// A workload of `ONE_GPU`-like nodes and tasks given as (GPUs, thousandths of each,
/// created, duration).
fn workload_of(nodes: &str, tasks: &[(u32, u32, u64, u64)]) -> Workload {
    let mut csv =
        String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time,deletion_time\n");
    for (i, (gpus, milli, created, duration)) in tasks.iter().enumerate() {
        csv.push_str(&format!(
            "p{i},1000,1024,{gpus},{milli},{created},{}\n",
            created + duration
        ));
    }
    let hosts = parse_nodes("n.csv", nodes).expect("valid nodes");
    let tasks = parse_tasks("t.csv", &csv).expect("valid tasks");
    workload(&hosts, &tasks, None).expect("a workload")
}

fn settings(w: &Workload, cfg: &Config, placement: Policy) -> Settings {
    Settings {
        boot_delay: cfg.boot_delay,
        pass: cfg.pass,
        placement,
        trace_end: w.trace_end,
    }
}

fn tessera(cfg: &Config) -> Tessera {
    Tessera::new(
        cfg.provider.clone(),
        cfg.boot_delay,
        cfg.placement,
        cfg.node_choice,
    )
}

fn run_rule(w: &Workload, cfg: &Config, placement: Policy, rule: &mut dyn Rule) -> Run {
    simulate(
        &w.types,
        &w.jobs,
        &w.profile,
        &settings(w, cfg, placement),
        rule,
        &[],
    )
}

#[test]
fn node_types_group_the_trace_smallest_first() {
    let hosts = parse_nodes(
        "n.csv",
        "sn,cpu_milli,memory_mib,gpu,model\na,96000,393216,8,G2\nb,8000,32768,1,V100M16\nc,96000,393216,8,G2\nd,0,0,0,\n",
    )
    .expect("valid");
    let types = node_types(&hosts);
    assert_eq!(types.len(), 2);
    assert_eq!(
        (types[0].label(), types[0].in_trace),
        ("1×V100M16 8c 32G".into(), 1)
    );
    assert_eq!(
        (types[1].label(), types[1].in_trace),
        ("8×G2 96c 384G".into(), 2)
    );
}

#[test]
fn tasks_without_gpus_or_that_no_node_holds_are_left_out() {
    let w = workload_of(ONE_GPU, &[(0, 0, 0, 10), (2, 1000, 0, 10), (1, 500, 5, 10)]);
    assert_eq!((w.jobs.len(), w.cpu_only, w.unfit.len()), (1, 1, 1));
    assert_eq!((w.jobs[0].share, w.jobs[0].duration), (500, Some(10)));
}

#[test]
fn the_l2_bound_counts_shares_that_cannot_pair() {
    let bound = |items: &[(u16, u32)]| lower::shared_bound(&items.iter().copied().collect());
    assert_eq!(bound(&[]), 0);
    assert_eq!(bound(&[(600, 3)]), 3, "no two fit one GPU");
    assert_eq!(bound(&[(400, 3)]), 2);
    assert_eq!(bound(&[(800, 1), (300, 3)]), 2);
    assert_eq!(bound(&[(510, 2), (490, 2)]), 2, "they pair");
    assert_eq!(bound(&[(510, 2), (500, 2)]), 3);
}

#[test]
fn the_lower_bound_integrates_the_fewest_gpus_over_time() {
    // Two GPUs for 100 s; two 600s overlap for 50 s (two GPUs, not 1.2).
    let w = workload_of(
        "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,131072,2,T4\n",
        &[(2, 1000, 0, 100), (1, 600, 200, 100), (1, 600, 250, 100)],
    );
    let s = lower::gpu_seconds(&w.jobs, w.trace_end);
    assert_eq!(s, 200 + 50 + 2 * 50 + 50);
}

#[test]
fn a_task_that_fits_nowhere_waits_one_boot_delay_then_runs() {
    let w = workload_of(ONE_GPU, &[(1, 1000, 100, 1000)]);
    let cfg = Config::new(300, 1);
    for run in [
        run_rule(&w, &cfg, cfg.placement, &mut tessera(&cfg)),
        run_rule(
            &w,
            &cfg,
            Policy::Binpack,
            &mut CaLike::new(50, 600, 300, NodeChoice::Smallest),
        ),
    ] {
        assert_eq!(run.waits, vec![300]);
        assert_eq!(run.never_placed, 0);
        assert_eq!(run.end, 100 + 300 + 1000, "it runs its whole duration");
        // One GPU paid from the launch (at its arrival) to the end, booting included.
        assert_eq!(run.paid.gpu_seconds, 1300);
        assert_eq!(run.paid.booting_gpu_seconds, 300);
    }
}

#[test]
fn tessera_scales_out_within_its_cooldown_and_counts_coming_capacity() {
    // Two whole-GPU tasks 10 s apart: the second launch waits for a 60 s cooldown.
    let w = workload_of(ONE_GPU, &[(1, 1000, 0, 1000), (1, 1000, 10, 1000)]);
    let mut cfg = Config::new(300, 1);
    cfg.provider.scale_out_cooldown_secs = 60;
    let run = run_rule(&w, &cfg, cfg.placement, &mut tessera(&cfg));
    assert_eq!(run.waits, vec![300, 350]);
    assert_eq!(run.paid.launched, 2);
    cfg.provider.scale_out_cooldown_secs = 0;
    let run = run_rule(&w, &cfg, cfg.placement, &mut tessera(&cfg));
    assert_eq!(run.waits, vec![300, 300]);
    // Two shared tasks 10 s apart that one host holds: the booting host is coming
    // capacity, so the second asks for nothing.
    let w = workload_of(ONE_GPU, &[(1, 400, 0, 1000), (1, 400, 10, 1000)]);
    let run = run_rule(&w, &cfg, cfg.placement, &mut tessera(&cfg));
    assert_eq!(run.paid.launched, 1);
    assert_eq!(run.waits, vec![300, 290]);
}

#[test]
fn tessera_scales_in_an_empty_host_after_its_cooldown_never_one_running_a_task() {
    // A long task keeps its host from 0 to its end; a short one's host goes 600 s after
    // it empties; a later task gets a new host.
    let w = workload_of(
        ONE_GPU,
        &[
            (1, 1000, 0, 20_000),
            (1, 1000, 0, 100),
            (1, 1000, 5_000, 100),
        ],
    );
    let cfg = Config::new(300, 1);
    let run = run_rule(&w, &cfg, cfg.placement, &mut tessera(&cfg));
    assert_eq!(run.end, 20_300);
    assert_eq!((run.paid.launched, run.paid.terminated), (3, 2));
    // Long: 0..20300; short: 0..(400 + 600); later: 5000..(5400 + 600).
    assert_eq!(run.paid.gpu_seconds, 20_300 + 1_000 + 1_000);
}

#[test]
fn ca_like_drains_a_node_under_half_used_after_ten_minutes() {
    // Whole-GPU-ish 700 and 100 share a GPU; 400 goes to a second node. When the 700 ends
    // (at 1300) the first node holds 10 %: unneeded, and at 1900 its task moves to the
    // second node (40 %, which received it) and the node goes.
    let w = workload_of(
        ONE_GPU,
        &[(1, 700, 0, 1000), (1, 400, 0, 20_000), (1, 100, 0, 20_000)],
    );
    let cfg = Config::new(300, 1);
    let mut rule = CaLike::new(50, 600, 300, NodeChoice::Smallest);
    let run = run_rule(&w, &cfg, Policy::Binpack, &mut rule);
    assert_eq!((run.paid.launched, run.paid.terminated), (2, 1));
    assert_eq!(run.paid.moves, 1);
    assert_eq!(run.paid.gpu_seconds, 1_900 + 20_300);
}

#[test]
fn consolidation_frees_a_host_whose_tasks_fit_elsewhere() {
    // After the 700 ends, two hosts hold 300 each: the product keeps both until their
    // tasks end; consolidation moves one after the scale-in cooldown and scales it in.
    let w = workload_of(
        ONE_GPU,
        &[(1, 700, 0, 1000), (1, 300, 0, 20_000), (1, 300, 0, 20_000)],
    );
    let cfg = Config::new(300, 1);
    let product = run_rule(&w, &cfg, Policy::Binpack, &mut tessera(&cfg));
    assert_eq!(product.paid.gpu_seconds, 2 * 20_300);
    let mut rule = tessera(&cfg).with_consolidation();
    let run = run_rule(&w, &cfg, Policy::Binpack, &mut rule);
    assert_eq!(run.paid.moves, 1);
    assert_eq!(run.paid.gpu_seconds, 1_900 + 20_300);
}

#[test]
fn percentiles_are_nearest_rank() {
    let v: Vec<u64> = (1..=100).collect();
    assert_eq!(
        (
            percentile(&v, 50.0),
            percentile(&v, 99.0),
            percentile(&v, 100.0)
        ),
        (50, 99, 100)
    );
    assert_eq!(percentile(&[], 50.0), 0);
    assert_eq!(percentile(&[7], 99.0), 7);
}

/// Random small traces: (GPUs, thousandths, created, duration).
fn tasks() -> impl Strategy<Value = Vec<(u32, u32, u64, u64)>> {
    let demand = prop_oneof![
        prop::sample::select(vec![150u32, 300, 450, 600, 850]).prop_map(|m| (1, m)),
        (1u32..=2).prop_map(|n| (n, 1000)),
    ];
    prop::collection::vec(
        (demand, 0u64..4_000, 0u64..3_000).prop_map(|((n, m), c, d)| (n, m, c, d)),
        1..14,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// No rule provisions fewer GPU-hours than the lower bound, each places every task,
    /// and no rule terminates a node that runs a task (the fleet refuses, panicking). (The
    /// static fleet may make a task wait: with every node there from the start, tasks can
    /// land elsewhere than on the fleet that grew for them.)
    #[test]
    fn the_lower_bound_is_below_every_rule(
        tasks in tasks(),
        boot in prop::sample::select(vec![0u64, 120, 300]),
        roomy in any::<bool>(),
    ) {
        let nodes = "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,131072,1,T4\nn2,64000,262144,2,T4\nn3,8000,16384,1,T4\n";
        let w = workload_of(nodes, &tasks);
        let mut cfg = Config::new(boot, 1);
        if roomy {
            cfg.node_choice = NodeChoice::Roomy;
        }
        let report = run(&w, &cfg);
        for row in &report.rows {
            prop_assert!(
                row.gpu_hours + 1e-9 >= report.lower_gpu_hours,
                "{}: {} < {}", row.policy, row.gpu_hours, report.lower_gpu_hours
            );
            prop_assert_eq!(row.waits.len(), w.jobs.len(), "{}", row.policy);
            prop_assert_eq!(row.never_placed, 0);
        }
    }
}
