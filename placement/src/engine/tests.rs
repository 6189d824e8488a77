use super::*;
use crate::snapshot::{GpuSpec, HostSpec, PoolLimits};
use tessera_model::{GpuUuid, HostId};

fn host(name: &str, gpus: usize, gpu_mib: u64) -> HostSpec {
    HostSpec {
        id: HostId::new(name).expect("valid"),
        cpu: MilliCpu(64_000),
        memory: MiB(256 * 1024),
        labels: Default::default(),
        active: true,
        gpus: (0..gpus)
            .map(|i| GpuSpec {
                uuid: GpuUuid::new(format!("GPU-{name}-{i}")).expect("valid"),
                model: "L4".into(),
                memory: MiB(gpu_mib),
                mps_client_limit: 48,
                healthy: true,
            })
            .collect(),
    }
}

fn engine(policy: Policy, hosts: Vec<HostSpec>) -> Engine {
    Engine::new(
        Snapshot::new(hosts, PoolLimits::default()),
        policy,
        &DemandProfile::default(),
        1,
    )
}

#[test]
fn binpack_fills_the_fullest_gpu_that_fits() {
    let mut e = engine(Policy::Binpack, vec![host("a", 2, 24 * 1024)]);
    let slot = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(16 * 1024), None);
    let first = e.place(&slot).expect("fits");
    e.assign(&first).expect("assign");
    let small = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(8 * 1024), None);
    let second = e.place(&small).expect("fits");
    assert_eq!(
        second.gpus[0].gpu, first.gpus[0].gpu,
        "8 GiB fits next to 16 GiB"
    );
}

#[test]
fn spread_gpu_uses_the_emptiest_gpu() {
    let mut e = engine(Policy::SpreadGpu, vec![host("a", 2, 24 * 1024)]);
    let slot = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(4 * 1024), None);
    let first = e.place(&slot).expect("fits");
    e.assign(&first).expect("assign");
    let second = e.place(&slot).expect("fits");
    assert_ne!(second.gpus[0].gpu, first.gpus[0].gpu);
}

#[test]
fn default_policy_does_not_leave_a_gap_nothing_will_fill() {
    // A workload of 470s, 320s, 650s and whole GPUs, nothing smaller. One GPU holds a
    // 470 (530 free), the other is idle, and a 320 arrives. Into the 530 it would leave
    // 210 that no task of this workload fits; on the idle GPU it leaves 680 for a 650.
    // FGD's measure alone prefers the 530 (an idle GPU stays whole for whole-GPU tasks).
    let slot = |share: u64| TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(share), None);
    let whole = TaskRequest::whole(MilliCpu(1000), MiB(1024), 1);
    let workload: Vec<TaskRequest> = [slot(470), slot(320), slot(650), whole]
        .into_iter()
        .flat_map(|r| std::iter::repeat_n(r, 10))
        .collect();
    let profile = DemandProfile::from_requests(&workload);
    let gpu_of = |policy: Policy| {
        let snapshot = Snapshot::new(vec![host("a", 2, 1000)], PoolLimits::default());
        let mut e = Engine::new(snapshot, policy, &profile, 1);
        let first = e.place(&slot(470)).expect("fits");
        e.assign(&first).expect("assign");
        let second = e.place(&slot(320)).expect("fits");
        (first.gpus[0].gpu, second.gpus[0].gpu)
    };
    let (fgd_first, fgd_second) = gpu_of(Policy::FgdSim);
    assert_eq!(fgd_second, fgd_first, "FGD alone fills the 530");
    let (first, second) = gpu_of(Policy::Fragmentation);
    assert_ne!(second, first, "the default policy keeps the 530 for a 470");
}

#[test]
fn switching_policies_sees_every_earlier_assignment() {
    // Each policy keeps only its own structure in step; after a switch the other one
    // must reflect what was assigned meanwhile.
    let whole = TaskRequest::whole(MilliCpu(1000), MiB(1024), 1);
    let mut e = engine(Policy::SpreadGpu, vec![host("a", 2, 24 * 1024)]);
    let first = e.place(&whole).expect("fits");
    e.assign(&first).expect("assign");
    e.set_policy(Policy::Binpack);
    let second = e.place(&whole).expect("fits");
    assert_ne!(second.gpus[0].gpu, first.gpus[0].gpu);
    e.assign(&second).expect("assign");
    for policy in [Policy::SpreadGpu, Policy::SpreadHost, Policy::Binpack] {
        e.set_policy(policy);
        assert!(
            e.try_place(&whole).is_none(),
            "{policy:?}: both GPUs are taken"
        );
    }
    e.release(&first).expect("release");
    e.set_policy(Policy::SpreadHost);
    let third = e.place(&whole).expect("the released GPU fits");
    assert_eq!(third.gpus[0].gpu, first.gpus[0].gpu);
}

#[test]
fn rejection_names_the_largest_free_gpu_memory() {
    let mut e = engine(Policy::Binpack, vec![host("host-3", 2, 16 * 1024)]);
    let big = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(24 * 1024), None);
    let err = e.place(&big).expect_err("24 GiB fits no 16 GiB GPU");
    assert_eq!(err.hosts_filtered.get(&FilterReason::GpuMemory), Some(&1));
    assert_eq!(err.gpus_filtered.get(&FilterReason::GpuMemory), Some(&2));
    let text = err.to_string();
    assert!(
        text.contains("largest free GPU memory 16 GiB on host-3/GPU 0"),
        "{text}"
    );
}

#[test]
fn whole_gpu_tasks_need_idle_gpus() {
    let mut e = engine(Policy::Fragmentation, vec![host("a", 2, 24 * 1024)]);
    let slot = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(1024), None);
    let p = e.place(&slot).expect("fits");
    e.assign(&p).expect("assign");
    let two = TaskRequest::whole(MilliCpu(1000), MiB(1024), 2);
    let err = e.place(&two).expect_err("one GPU is shared");
    assert_eq!(
        err.hosts_filtered.get(&FilterReason::NotEnoughIdleGpus),
        Some(&1)
    );
    let one = TaskRequest::whole(MilliCpu(1000), MiB(1024), 1);
    let p = e.place(&one).expect("one idle GPU left");
    assert!(p.gpus[0].dedicated);
}

#[test]
fn distinct_hosts_batch_uses_each_host_once() {
    let mut e = engine(
        Policy::Binpack,
        vec![host("a", 4, 1000), host("b", 4, 1000)],
    );
    let mut req = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(100), None);
    req.constraints.distinct_hosts = true;
    let out = e.place_batch(&[req.clone(), req.clone(), req]);
    assert_eq!(out.placed(), 2);
    let err = out.results[2].as_ref().expect_err("only two hosts");
    assert_eq!(err.hosts_filtered.get(&FilterReason::Constraint), Some(&2));
}

#[test]
fn a_mixed_batch_counts_every_earlier_placement_for_each_request() {
    // Requests that differ (here only in memory) take turns: each still sees every task of
    // the batch placed before it, not only those of equal requests next to it.
    let mut e = engine(
        Policy::Binpack,
        vec![host("a", 1, 1000), host("b", 1, 1000), host("c", 1, 1000)],
    );
    let mut small = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(100), None);
    small.constraints.distinct_hosts = true;
    let mut large = small.clone();
    large.memory = MiB(2048);
    let out = e.place_batch(&[small.clone(), large.clone(), small, large]);
    let hosts: Vec<_> = out
        .results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|p| p.host_id.as_str().to_owned())
        .collect();
    assert_eq!(hosts.len(), 3, "three hosts, one task each: {hosts:?}");
    let mut distinct = hosts.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{hosts:?}");
    assert!(out.results[3].is_err(), "the fourth finds every host used");
}

#[test]
fn inactive_hosts_are_skipped_and_counted() {
    let mut h = host("a", 1, 1000);
    h.active = false;
    let mut e = engine(Policy::SpreadHost, vec![h]);
    let err = e
        .place(&TaskRequest::whole(MilliCpu(1), MiB(1), 1))
        .expect_err("inactive");
    assert_eq!(err.dominant_reason(), Some(FilterReason::HostNotActive));
}

#[test]
fn per_gpu_and_per_host_caps_spread_a_batch_whatever_the_policy() {
    for policy in [Policy::Binpack, Policy::Fragmentation, Policy::SpreadHost] {
        let mut e = engine(
            policy,
            vec![host("a", 2, 24 * 1024), host("b", 2, 24 * 1024)],
        );
        let mut req = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(1024), None);
        req.constraints.max_per_gpu = Some(1);
        req.constraints.max_per_host = Some(2);
        let out = e.place_batch(&vec![req.clone(); 5]);
        assert_eq!(out.placed(), 4, "{policy:?}: one per GPU, two per host");
        let mut gpus: Vec<_> = out
            .results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .map(|p| p.gpus[0].uuid.clone())
            .collect();
        gpus.sort();
        gpus.dedup();
        assert_eq!(gpus.len(), 4, "{policy:?}: every GPU once");
        let err = out.results[4].as_ref().expect_err("caps reached");
        assert!(
            err.to_string().contains("constraints"),
            "{policy:?}: the rejection names the constraint: {err}"
        );
        // What the service already holds counts: one task per GPU elsewhere frees nothing.
        let mut held = req.clone();
        held.constraints.gpu_counts = [(GpuUuid::new("GPU-a-0").expect("valid"), 1)].into();
        held.constraints.host_counts = [(HostId::new("b").expect("valid"), 2)].into();
        let mut fresh = engine(
            policy,
            vec![host("a", 2, 24 * 1024), host("b", 2, 24 * 1024)],
        );
        let p = fresh.place(&held).expect("GPU a-1 is free of the service");
        assert_eq!(p.gpus[0].uuid.as_str(), "GPU-a-1", "{policy:?}");
    }
}

#[test]
fn a_task_pinned_to_a_full_model_is_told_where_room_is_left() {
    let mut h100 = host("h100-1", 2, 80 * 1024);
    for g in &mut h100.gpus {
        g.model = "H100".into();
    }
    let mut e = engine(Policy::Binpack, vec![host("l4-1", 2, 24 * 1024), h100]);
    let whole = |models: &[&str]| {
        let mut r = TaskRequest::whole(MilliCpu(1000), MiB(1024), 1);
        r.constraints.gpu_models = models.iter().map(|m| (*m).to_owned()).collect();
        r
    };
    for _ in 0..2 {
        let p = e.place(&whole(&["L4"])).expect("an L4 is idle");
        e.assign(&p).expect("fits");
    }
    let err = e.place(&whole(&["L4"])).expect_err("both L4s are taken");
    assert_eq!(err.free_by_model["L4"].idle_gpus, 0);
    assert_eq!(err.free_by_model["H100"].idle_gpus, 2);
    assert_eq!(err.free_by_model["H100"].free_memory, MiB(160 * 1024));
    let text = err.to_string();
    assert!(
        text.contains("Free by GPU model: H100 2 of 2 GPUs idle, 160 GiB free; L4 0 of 2 GPUs idle, 0 MiB free"),
        "{text}"
    );
}

#[test]
fn a_fixed_host_port_is_held_like_capacity() {
    use tessera_model::taskdef::Protocol;
    for policy in [Policy::Binpack, Policy::Fragmentation, Policy::SpreadGpu] {
        let mut e = engine(
            policy,
            vec![host("a", 2, 24 * 1024), host("b", 2, 24 * 1024)],
        );
        let mut req = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(1024), None);
        req.constraints.host_ports = vec![(8000, Protocol::Tcp)];
        // Another task already holds 8000/tcp on host a; 8000/udp there is no conflict.
        req.constraints.ports_in_use = [(
            HostId::new("a").expect("valid"),
            [(8000, Protocol::Tcp), (9000, Protocol::Udp)].into(),
        )]
        .into();
        let out = e.place_batch(&vec![req.clone(); 2]);
        let first = out.results[0].as_ref().expect("host b is free");
        assert_eq!(first.host_id.as_str(), "b", "{policy:?}");
        let err = out.results[1]
            .as_ref()
            .expect_err("8000 taken on both hosts");
        assert_eq!(
            err.dominant_reason(),
            Some(FilterReason::HostPort),
            "{policy:?}"
        );
        assert!(err.to_string().contains("host port"), "{policy:?}: {err}");
        let mut udp = req.clone();
        udp.constraints.host_ports = vec![(9000, Protocol::Tcp)];
        assert!(
            e.place(&udp).is_ok(),
            "{policy:?}: another protocol is another port"
        );
    }
}
