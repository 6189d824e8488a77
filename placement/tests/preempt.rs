//! Preemption plans against an exhaustive search: on small random fleets, the planner
//! stops exactly as few tasks as the best of every subset of victims that makes room, and
//! every plan it gives really makes room within every project's budget.

use proptest::prelude::*;
use tessera_placement::preempt::{Ask, Budget, GpuNeed, GpuRoom, HostRoom, Plan, Victim, plan};

/// Whether stopping `stop` lets `ask` fit on `host` at `gpus`, within the budgets: written
/// from the rules, apart from the planner's own code.
fn makes_room(
    hosts: &[HostRoom],
    victims: &[Victim],
    budgets: &[Budget],
    ask: &Ask,
    host: usize,
    gpus: &[usize],
    stop: &[usize],
) -> bool {
    let h = &hosts[host];
    if !h.usable || stop.iter().any(|&v| victims[v].host != host) {
        return false;
    }
    // Budgets: what each project loses.
    let mut lost = vec![[0u64; 5]; budgets.len()];
    for &v in stop {
        let t = &victims[v];
        let l = &mut lost[t.project];
        l[0] += t.slots.iter().map(|s| s.1).sum::<u64>();
        l[1] += t.slots.iter().map(|s| s.2).sum::<u64>();
        l[2] += if t.whole { t.slots.len() as u64 } else { 0 };
        l[3] += t.cpu;
        l[4] += t.memory;
    }
    for (l, b) in lost.iter().zip(budgets) {
        let b = [b.gpu_memory, b.compute, b.gpus, b.cpu, b.memory];
        if (0..5).any(|i| l[i] > b[i]) {
            return false;
        }
    }
    let cpu = h.free_cpu + stop.iter().map(|&v| victims[v].cpu).sum::<u64>();
    let memory = h.free_memory + stop.iter().map(|&v| victims[v].memory).sum::<u64>();
    if cpu < ask.cpu || memory < ask.memory {
        return false;
    }
    match ask.gpu {
        GpuNeed::None => gpus.is_empty(),
        GpuNeed::Shared { memory, compute } => {
            let [g] = gpus else { return false };
            let room = &h.gpus[*g];
            let on_g = |v: &usize| victims[*v].slots.iter().filter(|s| s.0 == *g).count();
            let freed_mem: u64 = stop
                .iter()
                .flat_map(|&v| victims[v].slots.iter().filter(|s| s.0 == *g).map(|s| s.1))
                .sum();
            let freed_comp: u64 = stop
                .iter()
                .flat_map(|&v| victims[v].slots.iter().filter(|s| s.0 == *g).map(|s| s.2))
                .sum();
            let freed_clients: usize = stop.iter().map(on_g).sum();
            room.usable
                && room.free_memory + freed_mem >= memory
                && room.free_compute + freed_comp >= compute
                && room.free_clients as usize + freed_clients >= 1
        }
        GpuNeed::Whole { count } => {
            gpus.len() == count
                && gpus.iter().all(|&g| {
                    let room = &h.gpus[g];
                    room.usable
                        && !room.pinned
                        && (0..victims.len())
                            .filter(|&v| victims[v].host == host)
                            .filter(|&v| victims[v].slots.iter().any(|s| s.0 == g))
                            .all(|v| stop.contains(&v))
                })
        }
    }
}

/// The fewest victims of any plan, trying every host, target and subset.
fn exhaustive(
    hosts: &[HostRoom],
    victims: &[Victim],
    budgets: &[Budget],
    ask: &Ask,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (h, host) in hosts.iter().enumerate() {
        let on_host: Vec<usize> = (0..victims.len())
            .filter(|&v| victims[v].host == h)
            .collect();
        let targets: Vec<Vec<usize>> = match ask.gpu {
            GpuNeed::None => vec![vec![]],
            GpuNeed::Shared { .. } => (0..host.gpus.len()).map(|g| vec![g]).collect(),
            GpuNeed::Whole { count } => (0u32..1 << host.gpus.len())
                .filter(|m| m.count_ones() as usize == count)
                .map(|m| (0..host.gpus.len()).filter(|g| m & (1 << g) != 0).collect())
                .collect(),
        };
        for gpus in &targets {
            for mask in 0u32..1 << on_host.len() {
                let stop: Vec<usize> = (0..on_host.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| on_host[i])
                    .collect();
                if best.is_some_and(|b| stop.len() >= b) {
                    continue;
                }
                if makes_room(hosts, victims, budgets, ask, h, gpus, &stop) {
                    best = Some(stop.len());
                }
            }
        }
    }
    best
}

fn gpu_room() -> impl Strategy<Value = GpuRoom> {
    (
        0u64..4,
        0u64..4,
        0u32..2,
        any::<bool>(),
        prop::bool::weighted(0.9),
    )
        .prop_map(|(m, c, clients, pinned, usable)| GpuRoom {
            free_memory: m * 4096,
            free_compute: c * 250,
            free_clients: clients,
            pinned,
            usable,
        })
}

fn fleet() -> impl Strategy<Value = (Vec<HostRoom>, Vec<Victim>, Vec<Budget>, Ask)> {
    let hosts = prop::collection::vec(
        (
            prop::collection::vec(gpu_room(), 1..4),
            0u64..4,
            0u64..4,
            prop::bool::weighted(0.9),
        )
            .prop_map(|(gpus, cpu, mem, usable)| HostRoom {
                free_cpu: cpu * 1000,
                free_memory: mem * 1024,
                gpus,
                usable,
            }),
        1..4,
    );
    hosts.prop_flat_map(|hosts| {
        let n_hosts = hosts.len();
        let gpus_of: Vec<usize> = hosts.iter().map(|h| h.gpus.len()).collect();
        let victim = (
            0..n_hosts,
            0usize..3,
            any::<bool>(),
            1u64..5,
            1u64..4,
            0u64..3,
            0u64..3,
            0u32..3,
            0usize..2,
        )
            .prop_map(
                move |(h, g, whole, mem, comp, cpu, memory, priority, project)| {
                    let g = g % gpus_of[h];
                    Victim {
                        host: h,
                        slots: if whole {
                            vec![(g, 24576, 1000)]
                        } else {
                            vec![(g, mem * 4096, comp * 250)]
                        },
                        cpu: cpu * 1000,
                        memory: memory * 1024,
                        whole,
                        priority,
                        project,
                    }
                },
            );
        let budget = prop_oneof![
            Just(Budget::UNBOUNDED),
            (0u64..6).prop_map(|m| Budget {
                gpu_memory: m * 8192,
                ..Budget::UNBOUNDED
            }),
            (0u64..2).prop_map(|g| Budget {
                gpus: g,
                ..Budget::UNBOUNDED
            }),
        ];
        let ask = prop_oneof![
            (1u64..5, 1u64..4, 0u64..3, 0u64..3).prop_map(|(m, c, cpu, mem)| Ask {
                gpu: GpuNeed::Shared {
                    memory: m * 4096,
                    compute: c * 250,
                },
                cpu: cpu * 1000,
                memory: mem * 1024,
            }),
            (1usize..3, 0u64..3).prop_map(|(count, cpu)| Ask {
                gpu: GpuNeed::Whole { count },
                cpu: cpu * 1000,
                memory: 0,
            }),
            (1u64..6, 1u64..6).prop_map(|(cpu, mem)| Ask {
                gpu: GpuNeed::None,
                cpu: cpu * 1000,
                memory: mem * 1024,
            }),
        ];
        (
            Just(hosts),
            prop::collection::vec(victim, 0..8),
            prop::collection::vec(budget, 2..3),
            ask,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_plan_stops_as_few_as_the_best_of_every_subset((hosts, victims, budgets, ask) in fleet()) {
        let found = plan(&hosts, &victims, &budgets, &ask);
        let least = exhaustive(&hosts, &victims, &budgets, &ask);
        prop_assert_eq!(found.as_ref().map(|p| p.stop.len()), least, "plan {:?}", found);
        if let Some(Plan { host, gpus, stop }) = &found {
            prop_assert!(
                makes_room(&hosts, &victims, &budgets, &ask, *host, gpus, stop),
                "the plan makes room"
            );
        }
    }
}
