//! Property tests of consolidation plans: whatever the fleet and the churn that left it
//! fragmented, replaying a plan's moves in order, start before stop (each replacement holds
//! its capacity while its original still holds its own), never overcommits anything, never
//! breaks a task's constraints, never moves a task that must stay, and frees what it says.

use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};
use tessera_model::{ComputeMilli, GpuUuid, HostId, MiB, MilliCpu, SharingMode};
use tessera_placement::consolidate::{Goal, Movable, gpu_bound, plan};
use tessera_placement::{
    DemandProfile, Engine, GpuSpec, HostSpec, Policy, PoolLimits, Snapshot, TaskRequest,
};

const MODELS: [(&str, u64); 2] = [("A16", 16), ("B80", 80)];

fn fleet() -> impl Strategy<Value = Vec<HostSpec>> {
    prop::collection::vec((8u64..64, 1usize..=8, 0usize..2), 2..8).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (cpu, gpus, model))| HostSpec {
                id: HostId::new(format!("host-{i}")).expect("valid"),
                cpu: MilliCpu(cpu * 1000),
                memory: MiB(512 * 1024),
                labels: Default::default(),
                active: true,
                gpus: (0..gpus)
                    .map(|g| GpuSpec {
                        uuid: GpuUuid::new(format!("GPU-{i}-{g}")).expect("valid"),
                        model: MODELS[model].0.to_owned(),
                        memory: MiB(MODELS[model].1 * 1024),
                        mps_client_limit: 8,
                        healthy: true,
                    })
                    .collect(),
            })
            .collect()
    })
}

/// A service: its task shape, whether it wants one GPU model, distinct hosts, whether its
/// tasks must stay (it cannot run an extra copy).
#[derive(Debug, Clone)]
struct Service {
    request: TaskRequest,
    fixed: bool,
}

fn service() -> impl Strategy<Value = Service> {
    (
        0u64..4,
        prop_oneof![
            4 => (1u64..16_000, prop::option::of(50u32..=600)).prop_map(|(m, c)| (Some((m, c)), 0u32)),
            1 => (1u32..3).prop_map(|n| (None, n)),
        ],
        0usize..3,
        any::<bool>(),
        0u32..10,
        prop::option::of(1u32..3),
        prop::option::of(1u32..4),
    )
        .prop_map(|(cpu, (shared, whole), model, distinct, fixed, per_gpu, per_host)| {
            let mut request = match shared {
                Some((m, c)) => TaskRequest::shared(
                    MilliCpu(cpu * 1000),
                    MiB(1024),
                    MiB(m),
                    c.map(ComputeMilli),
                ),
                None => TaskRequest::whole(MilliCpu(cpu * 1000), MiB(1024), whole),
            };
            if model < 2 {
                request.constraints.gpu_models = vec![MODELS[model].0.to_owned()];
            }
            request.constraints.distinct_hosts = distinct;
            request.constraints.max_per_gpu = per_gpu;
            request.constraints.max_per_host = per_host;
            Service {
                request,
                fixed: fixed == 0,
            }
        })
}

/// Checks that `to` obeys the request's constraints given where the group's other tasks
/// are (`group_hosts`, `group_gpus`: the task itself excluded).
fn obeys(
    req: &TaskRequest,
    to: &tessera_placement::Placement,
    models: &HashMap<GpuUuid, String>,
    group_hosts: &BTreeMap<HostId, u32>,
    group_gpus: &BTreeMap<GpuUuid, u32>,
) -> Result<(), String> {
    if let Some(cap) = req.constraints.max_per_host
        && group_hosts.get(&to.host_id).copied().unwrap_or(0) + 1 > cap
    {
        return Err(format!(
            "more than {cap} task(s) of a service on {}",
            to.host_id
        ));
    }
    for s in &to.gpus {
        if let Some(cap) = req.constraints.max_per_gpu
            && group_gpus.get(&s.uuid).copied().unwrap_or(0) + 1 > cap
        {
            return Err(format!(
                "more than {cap} task(s) of a service on {}",
                s.uuid
            ));
        }
    }
    for s in &to.gpus {
        let m = &models[&s.uuid];
        if !req.constraints.gpu_models.is_empty() && !req.constraints.gpu_models.contains(m) {
            return Err(format!(
                "moved onto model {m}, not in {:?}",
                req.constraints.gpu_models
            ));
        }
    }
    if req.constraints.distinct_hosts && group_hosts.get(&to.host_id).copied().unwrap_or(0) > 0 {
        return Err(format!(
            "two tasks of a distinct-hosts service on {}",
            to.host_id
        ));
    }
    Ok(())
}

/// Counts placement `p` into (or, with -1, out of) a service's hosts and GPUs.
fn count(
    hosts: &mut BTreeMap<HostId, u32>,
    gpus: &mut BTreeMap<GpuUuid, u32>,
    p: &tessera_placement::Placement,
    delta: i32,
) {
    let n = hosts.entry(p.host_id.clone()).or_default();
    *n = n.saturating_add_signed(delta);
    if *n == 0 {
        hosts.remove(&p.host_id);
    }
    for s in &p.gpus {
        let n = gpus.entry(s.uuid.clone()).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            gpus.remove(&s.uuid);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn plans_keep_capacity_constraints_and_start_before_stop(
        hosts in fleet(),
        services in prop::collection::vec(service(), 1..5),
        arrivals in prop::collection::vec((0usize..5, any::<bool>()), 1..80),
        goal_hosts in any::<bool>(),
    ) {
        let models: HashMap<GpuUuid, String> = hosts
            .iter()
            .flat_map(|h| h.gpus.iter().map(|g| (g.uuid.clone(), g.model.clone())))
            .collect();
        // Spread placement, then churn: a fragmented fleet.
        let mut engine = Engine::new(
            Snapshot::new(hosts.clone(), PoolLimits::default()),
            Policy::SpreadGpu,
            &DemandProfile::default(),
            7,
        );
        let mut live: Vec<(usize, tessera_placement::Placement)> = Vec::new();
        let mut group_hosts: Vec<BTreeMap<HostId, u32>> = vec![BTreeMap::new(); services.len()];
        let mut group_gpus: Vec<BTreeMap<GpuUuid, u32>> = vec![BTreeMap::new(); services.len()];
        for (s, leaves) in &arrivals {
            let s = s % services.len();
            let mut req = services[s].request.clone();
            if req.constraints.distinct_hosts {
                req.constraints.avoid_hosts.extend(group_hosts[s].keys().cloned());
            }
            req.constraints.host_counts = group_hosts[s].clone();
            req.constraints.gpu_counts = group_gpus[s].clone();
            if let Some(p) = engine.try_place(&req) {
                engine.assign(&p).expect("fits");
                count(&mut group_hosts[s], &mut group_gpus[s], &p, 1);
                live.push((s, p));
            }
            if *leaves && live.len() > 1 {
                let (s, p) = live.remove(live.len() / 2);
                engine.release(&p).expect("held");
                count(&mut group_hosts[s], &mut group_gpus[s], &p, -1);
            }
        }
        let before = engine.snapshot().clone();
        let tasks: Vec<Movable> = live
            .iter()
            .map(|(s, p)| Movable {
                placement: p.clone(),
                request: services[*s].request.clone(),
                group: *s as u32,
                fixed: services[*s].fixed,
            })
            .collect();
        let goal = if goal_hosts { Goal::Hosts } else { Goal::Gpus };
        let out = plan(&mut engine, &tasks, goal, usize::MAX);

        // Replay in order on the state before, start before stop.
        let mut snap = before.clone();
        let mut at: Vec<tessera_placement::Placement> =
            tasks.iter().map(|t| t.placement.clone()).collect();
        let mut groups = group_hosts.clone();
        let mut gpu_groups = group_gpus.clone();
        for m in &out.moves {
            let t = &tasks[m.task];
            prop_assert!(!t.fixed, "a task that must stay was moved");
            prop_assert_eq!(&m.from, &at[m.task], "a move starts where the task is");
            let mut others = groups[t.group as usize].clone();
            let mut other_gpus = gpu_groups[t.group as usize].clone();
            count(&mut others, &mut other_gpus, &m.from, -1);
            if let Err(why) = obeys(&t.request, &m.to, &models, &others, &other_gpus) {
                prop_assert!(false, "{}", why);
            }
            prop_assert!(snap.assign(&m.to).is_ok(), "the replacement does not fit while its original runs");
            // Start before stop, one move at a time: while a move runs its service has one
            // task more than before (never fewer: minimum healthy holds at 100 %).
            let live = |gs: &Vec<BTreeMap<HostId, u32>>| gs[t.group as usize].values().sum::<u32>();
            let during = live(&groups) + 1;
            prop_assert_eq!(during, live(&group_hosts) + 1);
            snap.release(&m.from).expect("the original held this");
            let (g, gg) = (&mut groups[t.group as usize], &mut gpu_groups[t.group as usize]);
            count(g, gg, &m.to, 1);
            count(g, gg, &m.from, -1);
            at[m.task] = m.to.clone();
        }
        // The replay ends where the planner's engine does, and what it frees is empty.
        for g in 0..snap.gpu_count() as u32 {
            prop_assert_eq!(snap.gpu_usage(g), engine.snapshot().gpu_usage(g));
        }
        for &g in &out.freed_gpus {
            prop_assert_eq!(before.gpu_usage(g).mode, SharingMode::Mps, "only partly used GPUs are freed");
            prop_assert_eq!(snap.gpu_usage(g).mode, SharingMode::Idle);
        }
        for &h in &out.freed_hosts {
            prop_assert!(at.iter().all(|p| p.host != h), "a freed host still holds a task");
        }
    }
}

/// One host with two 16 GiB GPUs, spreading tasks over them.
fn two_gpu_host() -> Engine {
    let host = HostSpec {
        id: HostId::new("h").expect("valid"),
        cpu: MilliCpu(64_000),
        memory: MiB(256 * 1024),
        labels: Default::default(),
        active: true,
        gpus: (0..2)
            .map(|g| GpuSpec {
                uuid: GpuUuid::new(format!("GPU-{g}")).expect("valid"),
                model: "A16".into(),
                memory: MiB(16 * 1024),
                mps_client_limit: 8,
                healthy: true,
            })
            .collect(),
    };
    Engine::new(
        Snapshot::new(vec![host], PoolLimits::default()),
        Policy::SpreadGpu,
        &DemandProfile::default(),
        1,
    )
}

#[test]
fn two_half_empty_gpus_become_one() {
    let mut engine = two_gpu_host();
    let req = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(6 * 1024), None);
    let tasks: Vec<Movable> = (0..2)
        .map(|_| {
            let p = engine.try_place(&req).expect("room");
            engine.assign(&p).expect("fits");
            Movable {
                placement: p,
                request: req.clone(),
                group: 0,
                fixed: false,
            }
        })
        .collect();
    assert_ne!(
        tasks[0].placement.gpus[0].gpu, tasks[1].placement.gpus[0].gpu,
        "spread"
    );
    assert_eq!(gpu_bound(engine.snapshot()), 1);
    let out = plan(&mut engine, &tasks, Goal::Gpus, 10);
    assert_eq!(out.moves.len(), 1);
    assert_eq!(out.freed_gpus.len(), 1);
}

/// A task whose placement the snapshot does not hold (the caller's picture drifted: its
/// host now reports less than it holds) is never released from it: the plan leaves its
/// source alone instead of panicking.
#[test]
fn a_task_missing_from_the_snapshot_stays_and_nothing_panics() {
    let mut engine = two_gpu_host();
    let req = TaskRequest::shared(MilliCpu(1000), MiB(1024), MiB(6 * 1024), None);
    let placed = engine.try_place(&req).expect("room");
    engine.assign(&placed).expect("fits");
    // The second task's placement never reached the snapshot.
    let mut missing = engine.try_place(&req).expect("room");
    missing.gpus[0].gpu = placed.gpus[0].gpu;
    missing.gpus[0].uuid = placed.gpus[0].uuid.clone();
    missing.gpus[0].index = placed.gpus[0].index;
    let tasks: Vec<Movable> = [placed, missing]
        .into_iter()
        .map(|p| Movable {
            placement: p,
            request: req.clone(),
            group: 0,
            fixed: false,
        })
        .collect();
    let before = engine.snapshot().clone();
    let out = plan(&mut engine, &tasks, Goal::Gpus, 10);
    assert!(out.moves.is_empty(), "{:?}", out.moves);
    assert_eq!(
        engine.snapshot().gpu_usage(tasks[0].placement.gpus[0].gpu),
        before.gpu_usage(tasks[0].placement.gpus[0].gpu),
        "the snapshot is as it was"
    );
}
