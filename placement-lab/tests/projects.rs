//! The projects replay on a small made-up fleet: the run with projects preempts for its
//! production project and holds no task below its guarantee for more than one pass; the
//! run without projects preempts nothing.

use tessera_placement::Policy;
use tessera_placement_lab::openb;
use tessera_placement_lab::projects::{self, Setup};

fn fleet() -> (Vec<tessera_placement::HostSpec>, Vec<openb::TraceTask>) {
    let mut nodes = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
    for i in 0..16 {
        nodes.push_str(&format!("node-{i},96000,393216,4,V100\n"));
    }
    let mut tasks = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
    for (i, (num, milli)) in [(1, 1000), (1, 500), (1, 250), (2, 1000), (1, 750), (0, 0)]
        .iter()
        .cycle()
        .take(120)
        .enumerate()
    {
        tasks.push_str(&format!("p{i},4000,8192,{num},{milli},\n"));
    }
    (
        openb::parse_nodes("nodes.csv", &nodes).expect("nodes"),
        openb::parse_tasks("tasks.csv", &tasks).expect("tasks"),
    )
}

#[test]
fn projects_preempt_for_their_guarantee_and_no_projects_preempt_nothing() {
    let (hosts, tasks) = fleet();
    let per_pass = openb::capacity_milli(&hosts) / 50;
    for seed in 1..=5 {
        let setup = |projects| Setup {
            projects,
            arrivals_per_pass: per_pass,
            policy: Policy::Fragmentation,
            seed,
        };
        let without = projects::run(&hosts, &tasks, &setup(Vec::new()));
        assert_eq!((without.preemptions, without.stopped), (0, 0));
        assert_eq!(without.longest_hold, vec![0]);
        let specs = projects::three_projects(&hosts);
        let with = projects::run(&hosts, &tasks, &setup(specs.clone()));
        assert_eq!(
            with.passes, without.passes,
            "the same arrivals, pass by pass"
        );
        assert!(
            with.preemptions > 0,
            "seed {seed}: the cluster fills with batch work first"
        );
        assert!(with.stopped >= with.preemptions);
        for (p, spec) in specs.iter().enumerate() {
            assert!(
                with.longest_hold[p] <= 1,
                "seed {seed}: a task of {} held {} passes",
                spec.name,
                with.longest_hold[p]
            );
        }
        // prod is the production project: its tasks wait at most two passes (a task its
        // guarantee no longer covers waits like any other).
        let prod_wait = with.waits[0].iter().copied().max().unwrap_or(0);
        assert!(
            prod_wait <= 2,
            "seed {seed}: prod waited {prod_wait} passes: {:?}",
            with.waits[0]
        );
        // The batch project is never held: nothing is guaranteed to it.
        assert_eq!(with.longest_hold[2], 0);
    }
}
