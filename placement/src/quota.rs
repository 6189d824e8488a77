//! Projects' quotas as placement sees them: what a request or a placement counts against a
//! project, whether a project stays within its guarantee, its weighted share of a pool,
//! and the planner's inputs ([`crate::preempt`]) read from a snapshot.
//!
//! The control plane and the projects replay (`tessera-placement-lab`) both decide with
//! these, so the benchmark measures the rules the scheduler runs.

use crate::preempt::{self, Ask, Budget, GpuNeed, GpuRoom, HostRoom, Victim};
use crate::request::{GpuDemand, TaskRequest};
use crate::snapshot::{HostIdx, Placement, Snapshot};
use crate::{DemandProfile, Engine, Policy};
use tessera_model::project::{Amounts, Usage};

/// What a waiting task would add to its project's use: its host CPU and memory, whole
/// GPUs for whole GPUs, a shared slot's memory and compute cap.
pub fn demand(req: &TaskRequest) -> Usage {
    let mut u = Usage {
        cpu_milli: req.cpu.0,
        memory_mib: req.memory.0,
        ..Default::default()
    };
    match req.gpu {
        GpuDemand::None => {}
        GpuDemand::Whole { count } => u.gpus = u64::from(count),
        GpuDemand::Shared { memory, compute } => {
            u.gpu_memory_mib = memory.0;
            u.compute_milli = compute.map_or(0, |c| u64::from(c.0));
        }
    }
    u
}

/// What a placed task holds, as quotas count it: a whole GPU counts as one GPU, all its
/// memory and all its compute.
pub fn held(p: &Placement) -> Usage {
    let mut u = Usage {
        cpu_milli: p.cpu.0,
        memory_mib: p.memory.0,
        ..Default::default()
    };
    for s in &p.gpus {
        u.gpus += u64::from(s.dedicated);
        u.gpu_memory_mib += s.memory.0;
        u.compute_milli += u64::from(s.compute.0);
    }
    u
}

/// Whether a project that uses `mine` stays within its guarantee with `want` more: every
/// quantity its guarantee names holds, and the guarantee names one the task needs of a
/// GPU (whole GPUs for whole GPUs; GPU memory or compute for a shared slot), or for a task
/// without a GPU, its CPU or memory. A guarantee of CPU alone takes no GPU room back.
pub fn within_guarantee(mine: &Usage, want: &Usage, guaranteed: &Amounts) -> bool {
    let after = mine.plus(want);
    let holds = after
        .named()
        .into_iter()
        .zip(guaranteed.or_zero().named())
        .zip([
            guaranteed.gpus,
            guaranteed.gpu_memory_mib,
            guaranteed.compute_milli,
            guaranteed.cpu_milli,
            guaranteed.memory_mib,
        ])
        .all(|(((_, used), (_, g)), named)| named.is_none() || used <= g);
    holds && covers(want, guaranteed)
}

/// Whether `guaranteed` names what a task asking `want` needs (see [`within_guarantee`]):
/// a guarantee that names only GPU quantities covers no task without a GPU.
pub fn covers(want: &Usage, guaranteed: &Amounts) -> bool {
    let needs_gpu = want.gpus + want.gpu_memory_mib + want.compute_milli > 0;
    if needs_gpu {
        (want.gpus > 0 && guaranteed.gpus.is_some())
            || (want.gpu_memory_mib > 0 && guaranteed.gpu_memory_mib.is_some())
            || (want.compute_milli > 0 && guaranteed.compute_milli.is_some())
    } else {
        guaranteed.cpu_milli.is_some() || guaranteed.memory_mib.is_some()
    }
}

/// A project's dominant share of a pool (its largest share of any quantity), over its
/// weight: what fair share compares (the furthest below goes first).
pub fn weighted_share(used: &Usage, capacity: &Usage, weight: u32) -> f64 {
    let share = used
        .named()
        .into_iter()
        .zip(capacity.named())
        .filter(|(_, (_, cap))| *cap > 0)
        .map(|((_, u), (_, cap))| u as f64 / cap as f64)
        .fold(0.0, f64::max);
    share / f64::from(weight.max(1))
}

/// What a project that uses `used` may lose to preemption: what it borrows beyond its
/// guarantee (a quantity the guarantee does not name is all borrowed).
pub fn budget(used: &Usage, guaranteed: &Amounts) -> Budget {
    let b = used.above(&guaranteed.or_zero());
    Budget {
        gpu_memory: b.gpu_memory_mib,
        compute: b.compute_milli,
        gpus: b.gpus,
        cpu: b.cpu_milli,
        memory: b.memory_mib,
    }
}

/// What the planner needs to fit for `req`.
pub fn ask(req: &TaskRequest) -> Ask {
    Ask {
        gpu: match req.gpu {
            GpuDemand::None => GpuNeed::None,
            GpuDemand::Whole { count } => GpuNeed::Whole {
                count: count as usize,
            },
            GpuDemand::Shared { memory, compute } => GpuNeed::Shared {
                memory: memory.0,
                compute: compute.map_or(0, |c| u64::from(c.0)),
            },
        },
        cpu: req.cpu.0,
        memory: req.memory.0,
    }
}

/// The planner's view of `snap`'s room now: what is free on each host and GPU, which
/// hosts take tasks (active) and which GPUs (healthy, in service).
pub fn rooms(snap: &Snapshot) -> Vec<HostRoom> {
    (0..snap.host_count())
        .map(|h| {
            let h = h as HostIdx;
            let (cpu, memory) = snap.host_free(h);
            HostRoom {
                free_cpu: cpu.0,
                free_memory: memory.0,
                gpus: snap
                    .gpus_of(h)
                    .map(|g| {
                        let u = snap.gpu_usage(g);
                        GpuRoom {
                            free_memory: u.memory_free.0,
                            free_compute: u64::from(u.compute_free.0),
                            free_clients: u.client_limit.saturating_sub(u.clients),
                            pinned: false,
                            usable: snap.gpu_available(g),
                        }
                    })
                    .collect(),
                usable: snap.host_active(h),
            }
        })
        .collect()
}

/// The position of each of `p`'s GPUs among its host's GPUs (the planner's slot index).
fn slots<'a>(snap: &'a Snapshot, p: &'a Placement) -> impl Iterator<Item = usize> + 'a {
    p.gpus.iter().map(move |s| {
        snap.gpus_of(p.host)
            .position(|g| g == s.gpu)
            .expect("a placement's GPU is on its host")
    })
}

/// Counts what `p` holds as free in `rooms`: a task already stopping soon lets go of it.
pub fn count_free(rooms: &mut [HostRoom], snap: &Snapshot, p: &Placement) {
    let room = &mut rooms[p.host as usize];
    room.free_cpu += p.cpu.0;
    room.free_memory += p.memory.0;
    for (slot, s) in slots(snap, p).zip(&p.gpus) {
        let r = &mut room.gpus[slot];
        r.free_memory += s.memory.0;
        r.free_compute += u64::from(s.compute.0);
        r.free_clients += 1;
    }
}

/// Takes the room of `p` out of `rooms`: a waiting task has claimed it (it will have it
/// once the victims let go), so a plan for the next waiting task does not count it as
/// free and each waiting task gets room of its own. Its GPUs can no longer be emptied.
pub fn claim(rooms: &mut [HostRoom], snap: &Snapshot, p: &Placement) {
    let room = &mut rooms[p.host as usize];
    room.free_cpu = room.free_cpu.saturating_sub(p.cpu.0);
    room.free_memory = room.free_memory.saturating_sub(p.memory.0);
    for (slot, s) in slots(snap, p).zip(&p.gpus) {
        let r = &mut room.gpus[slot];
        r.free_memory = r.free_memory.saturating_sub(s.memory.0);
        r.free_compute = r.free_compute.saturating_sub(u64::from(s.compute.0));
        r.free_clients = r.free_clients.saturating_sub(1);
        r.pinned = true;
    }
}

/// Marks `p`'s GPUs as running a task that may not be stopped.
pub fn pin(rooms: &mut [HostRoom], snap: &Snapshot, p: &Placement) {
    for slot in slots(snap, p) {
        rooms[p.host as usize].gpus[slot].pinned = true;
    }
}

/// A task at `p` that may be stopped: its priority rank (lower goes first) and its
/// project's index into the budgets.
pub fn victim(snap: &Snapshot, p: &Placement, priority: u32, project: usize) -> Victim {
    Victim {
        host: p.host as usize,
        slots: slots(snap, p)
            .zip(&p.gpus)
            .map(|(slot, s)| (slot, s.memory.0, u64::from(s.compute.0)))
            .collect(),
        cpu: p.cpu.0,
        memory: p.memory.0,
        whole: p.gpus.iter().any(|s| s.dedicated),
        priority,
        project,
    }
}

/// One pass's preemption plans in a pool, made one waiting task after another, each with
/// room of its own: the room as the planner sees it (stopping tasks' counted as free,
/// earlier plans' victims freed and their tasks' claims taken), and an engine holding the
/// same, which checks each plan against the task's constraints and says where it goes.
pub struct Claims {
    rooms: Vec<HostRoom>,
    engine: Engine,
}

impl Claims {
    /// The pool `snap` shows, with the tasks at `stopping` as good as gone.
    pub fn new<'a>(snap: &Snapshot, stopping: impl IntoIterator<Item = &'a Placement>) -> Claims {
        let mut rooms = rooms(snap);
        let mut engine = Engine::new(snap.clone(), Policy::Binpack, &DemandProfile::default(), 1);
        for p in stopping {
            count_free(&mut rooms, snap, p);
            engine.release(p).expect("a stopping task holds its room");
        }
        Claims { rooms, engine }
    }

    /// The fewest of `victims` (each with where it runs) to stop so that `req` fits,
    /// never taking a project below its guarantee (`budgets`); the tasks at `kept` may not
    /// be stopped. The planner's choice is checked by the engine on the plan's host (the
    /// task's constraints) and the task's room claimed. Returns the victims to stop
    /// (indices into `victims`, none when the room is already there) and the task's
    /// placement once they have; `None` when no plan makes room.
    pub fn plan<'a>(
        &mut self,
        victims: &[Victim],
        at: &[&Placement],
        kept: impl IntoIterator<Item = &'a Placement>,
        budgets: &[Budget],
        req: &TaskRequest,
    ) -> Option<(Vec<usize>, Placement)> {
        let snap = self.engine.snapshot();
        let mut rooms = self.rooms.clone();
        for p in kept {
            pin(&mut rooms, snap, p);
        }
        // Only hosts and GPUs the task's constraints accept (models, labels, spread,
        // ports): no plan frees room it could not use.
        for (h, room) in rooms.iter_mut().enumerate() {
            let h = h as HostIdx;
            if snap.check_host_rules(h, req).is_err() {
                room.usable = false;
                continue;
            }
            for (slot, g) in snap.gpus_of(h).enumerate() {
                if snap.check_gpu_rules(g as usize, req).is_err() {
                    room.gpus[slot].usable = false;
                }
            }
        }
        let plan = preempt::plan(&rooms, victims, budgets, &ask(req))?;
        let mut on_host = req.clone();
        on_host.constraints.avoid_hosts.extend(
            (0..snap.host_count())
                .filter(|&h| h != plan.host)
                .map(|h| snap.host_id(h as HostIdx).clone()),
        );
        for &v in &plan.stop {
            self.engine.release(at[v]).expect("a victim holds its room");
        }
        let Some(placed) = self.engine.try_place(&on_host) else {
            for &v in &plan.stop {
                self.engine
                    .assign(at[v])
                    .expect("a victim's room was just released");
            }
            return None;
        };
        self.engine
            .assign(&placed)
            .expect("the engine's own placement fits");
        let snap = self.engine.snapshot();
        for &v in &plan.stop {
            count_free(&mut self.rooms, snap, at[v]);
        }
        claim(&mut self.rooms, snap, &placed);
        Some((plan.stop, placed))
    }
}

/// Whether the task a claim was made for can have it now: its room resolved on `engine`'s
/// picture ([`Snapshot::resolve`]), allowed by the task's request as it is now (host and
/// GPU rules: labels, spread, caps, ports, models) and free there (checked by taking and
/// giving it back).
pub fn claimable(engine: &mut Engine, claim: &Placement, req: &TaskRequest) -> Option<Placement> {
    let p = engine.snapshot().resolve(claim)?;
    let snap = engine.snapshot();
    if snap.check_host_rules(p.host, req).is_err()
        || p.gpus
            .iter()
            .any(|s| snap.check_gpu_rules(s.gpu as usize, req).is_err())
    {
        return None;
    }
    engine.assign(&p).ok()?;
    engine.release(&p).expect("gives back what it just took");
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(gpus: u64, gpu_memory_mib: u64, cpu_milli: u64) -> Usage {
        Usage {
            gpus,
            gpu_memory_mib,
            cpu_milli,
            ..Default::default()
        }
    }

    #[test]
    fn only_a_guarantee_of_what_the_task_needs_takes_room_back() {
        let memory = Amounts {
            gpu_memory_mib: Some(24 * 1024),
            ..Default::default()
        };
        let shared = usage(0, 20 * 1024, 1000);
        assert!(within_guarantee(&Usage::default(), &shared, &memory));
        assert!(
            !within_guarantee(&usage(0, 8 * 1024, 0), &shared, &memory),
            "28 GiB of 24"
        );
        let cpu_only = Amounts {
            cpu_milli: Some(64_000),
            ..Default::default()
        };
        assert!(
            !within_guarantee(&Usage::default(), &shared, &cpu_only),
            "a CPU guarantee takes no GPU room back"
        );
        let whole = usage(1, 0, 1000);
        assert!(
            !within_guarantee(&Usage::default(), &whole, &memory),
            "GPU memory is not whole GPUs"
        );
        let gpus = Amounts {
            gpus: Some(2),
            ..Default::default()
        };
        assert!(within_guarantee(&usage(1, 0, 0), &whole, &gpus));
        assert!(!within_guarantee(&usage(2, 0, 0), &whole, &gpus));
        assert!(within_guarantee(
            &Usage::default(),
            &usage(0, 0, 4000),
            &cpu_only
        ));
    }

    #[test]
    fn the_share_is_the_largest_of_any_quantity_over_the_weight() {
        let capacity = usage(10, 1000, 100);
        assert_eq!(weighted_share(&usage(1, 500, 10), &capacity, 1), 0.5);
        assert_eq!(weighted_share(&usage(1, 500, 10), &capacity, 2), 0.25);
        assert_eq!(
            weighted_share(&usage(1, 0, 0), &Usage::default(), 1),
            0.0,
            "a pool with nothing gives no share"
        );
    }

    #[test]
    fn a_budget_is_what_is_used_beyond_the_guarantee() {
        let g = Amounts {
            gpu_memory_mib: Some(400),
            ..Default::default()
        };
        let b = budget(&usage(2, 1000, 0), &g);
        assert_eq!((b.gpu_memory, b.gpus, b.cpu), (600, 2, 0));
    }
}
