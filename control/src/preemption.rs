//! Preemption: when a task of a project within its guarantee cannot be placed, tasks of a
//! lower priority class that use borrowed capacity are stopped to make room for it.
//!
//! The scheduler asks after a pass's placements are committed, once per waiting service
//! and pool. The plan (`tessera_placement::preempt`) stops the fewest tasks, lowest
//! priority then smallest, on one GPU or host, and never takes a project below its
//! guarantee. The victims are stopped as any stop is (out of the endpoint list first,
//! then signalled); their services start replacements, which wait like any other task.
//! The waiting task is placed on a later pass, once the victims have let go; until then,
//! the stopping tasks' room counts as free, so nothing more is stopped for it.

use crate::capacity::{Held, PoolCapacity};
use crate::control::Control;
use crate::error::ControlError;
use crate::projects::usage_by_project;
use std::collections::HashMap;
use tessera_model::HostStatus;
use tessera_model::PoolName;
use tessera_model::project::{Amounts, Project, Usage};
use tessera_model::service::{PriorityClass, Service, TaskState};
use tessera_placement::preempt::{self, Ask, Budget, GpuNeed, GpuRoom, HostRoom, Victim};
use tessera_placement::{DemandProfile, Engine, GpuDemand, Policy, TaskRequest};

/// What the waiting task would add to its project's use.
fn demand(req: &TaskRequest) -> Usage {
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

/// Whether a project that uses `mine` stays within its guarantee with `want` more: every
/// quantity its guarantee names holds, and the guarantee names one the task needs of a
/// GPU (whole GPUs for whole GPUs; GPU memory or compute for a shared slot), or for a task
/// without a GPU, its CPU or memory. A guarantee of CPU alone takes no GPU room back.
fn within_guarantee(mine: &Usage, want: &Usage, guaranteed: &Amounts) -> bool {
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
    let needs_gpu = want.gpus + want.gpu_memory_mib + want.compute_milli > 0;
    let covers = if needs_gpu {
        (want.gpus > 0 && guaranteed.gpus.is_some())
            || (want.gpu_memory_mib > 0 && guaranteed.gpu_memory_mib.is_some())
            || (want.compute_milli > 0 && guaranteed.compute_milli.is_some())
    } else {
        guaranteed.cpu_milli.is_some() || guaranteed.memory_mib.is_some()
    };
    holds && covers
}

impl Control {
    /// Stops tasks to make room for a task of `service` that `req` describes, if the plan
    /// allows it; how many it stopped.
    pub(crate) async fn preempt_for(
        &self,
        pool: &PoolName,
        service: &Service,
        req: &TaskRequest,
        services: &HashMap<String, Service>,
        projects: &HashMap<String, Project>,
    ) -> Result<usize, ControlError> {
        if service.priority == PriorityClass::Batch {
            return Ok(0);
        }
        // Only a project within its guarantee here, with this task, takes room back.
        let Some(own) = projects
            .get(&service.project)
            .and_then(|p| p.quota(pool.as_str()))
        else {
            return Ok(0);
        };
        // Nothing to stop unless another project runs a lower class in this pool: checked
        // on what is in memory before the pool is read (a task may wait for many passes).
        if !services.values().any(|s| {
            &s.pool == pool && s.project != service.project && s.priority < service.priority
        }) {
            return Ok(0);
        }
        let (info, hosts, holding) = self.pool_state(pool).await?;
        let project_of = crate::projects::project_of(services.values());
        // What each project holds and keeps: tasks already stopping count for nobody.
        let kept: Vec<_> = holding
            .iter()
            .filter(|t| t.state != TaskState::Stopping)
            .cloned()
            .collect();
        let used = usage_by_project(&kept, &project_of);
        let mine = used.get(&service.project).copied().unwrap_or_default();
        let want = demand(req);
        if !within_guarantee(&mine, &want, &own.guaranteed)
            || mine.plus(&want).exceeds(&own.limit).is_some()
        {
            return Ok(0);
        }
        let capacity = PoolCapacity::build(&info, &hosts, holding.iter().filter_map(Held::of));
        let snap = &capacity.snapshot;
        // Each project may lose what it borrows beyond its guarantee (what it names; a
        // quantity it does not name is all borrowed).
        let mut project_index: HashMap<String, usize> = HashMap::new();
        let mut budgets = Vec::new();
        for (name, u) in &used {
            let guaranteed = projects
                .get(name)
                .and_then(|p| p.quota(pool.as_str()))
                .map(|q| q.guaranteed.or_zero())
                .unwrap_or_default();
            let b = u.above(&guaranteed);
            project_index.insert(name.clone(), budgets.len());
            budgets.push(Budget {
                gpu_memory: b.gpu_memory_mib,
                compute: b.compute_milli,
                gpus: b.gpus,
                cpu: b.cpu_milli,
                memory: b.memory_mib,
            });
        }
        // Room now, with what stopping tasks hold counted as free (it soon is).
        let mut rooms: Vec<HostRoom> = (0..snap.host_count())
            .map(|h| {
                let h = h as tessera_placement::HostIdx;
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
                                usable: true,
                            }
                        })
                        .collect(),
                    usable: false,
                }
            })
            .collect();
        for (h, host) in hosts.iter().enumerate() {
            if let Some(room) = rooms.get_mut(h) {
                room.usable = host.status == HostStatus::Active && !host.held;
                for (g, gpu) in host.gpus.iter().enumerate() {
                    if let Some(r) = room.gpus.get_mut(g) {
                        r.usable = gpu.health == tessera_model::GpuHealth::Healthy;
                    }
                }
            }
        }
        let mut victims = Vec::new();
        let mut victim_ids = Vec::new();
        for t in &holding {
            let Some(h) = Held::of(t) else { continue };
            if capacity.not_in_snapshot.contains(&t.id) {
                continue;
            }
            let Some(p) = capacity.placement(h.host, h.cpu, h.memory, h.allocations) else {
                continue;
            };
            let host = p.host as usize;
            let slot = |g: tessera_placement::GpuIdx| {
                snap.gpus_of(p.host)
                    .position(|x| x == g)
                    .expect("a placement's GPU is on its host")
            };
            if t.state == TaskState::Stopping {
                let room = &mut rooms[host];
                room.free_cpu += t.cpu.0;
                room.free_memory += t.memory.0;
                for s in &p.gpus {
                    let r = &mut room.gpus[slot(s.gpu)];
                    r.free_memory += s.memory.0;
                    r.free_compute += u64::from(s.compute.0);
                    r.free_clients += 1;
                }
                continue;
            }
            let owner = services.get(&t.service);
            // Never its own project's tasks, and only lower classes.
            let lower = owner
                .is_some_and(|s| s.priority < service.priority && s.project != service.project);
            let project = owner.map_or(tessera_model::project::DEFAULT_PROJECT, |s| {
                s.project.as_str()
            });
            match project_index.get(project) {
                Some(&pi) if lower && !t.migrating => {
                    victims.push(Victim {
                        host,
                        slots: p
                            .gpus
                            .iter()
                            .map(|s| (slot(s.gpu), s.memory.0, u64::from(s.compute.0)))
                            .collect(),
                        cpu: t.cpu.0,
                        memory: t.memory.0,
                        whole: p.gpus.iter().any(|s| s.dedicated),
                        priority: owner.map_or(0, |s| s.priority as u32),
                        project: pi,
                    });
                    victim_ids.push(t);
                }
                _ => {
                    for s in &p.gpus {
                        rooms[host].gpus[slot(s.gpu)].pinned = true;
                    }
                }
            }
        }
        let ask = Ask {
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
        };
        let Some(plan) = preempt::plan(&rooms, &victims, &budgets, &ask) else {
            return Ok(0);
        };
        // Nothing to stop: the room is there, or will be once stopping tasks let go.
        if plan.stop.is_empty() {
            return Ok(0);
        }
        // The planner knows room, not the task's constraints (models, labels, spread,
        // ports): only a plan after which the engine itself places the task is carried out.
        let mut check = Engine::new(
            capacity.snapshot.clone(),
            Policy::Binpack,
            &DemandProfile::default(),
            1,
        );
        let stopping = holding.iter().filter(|t| t.state == TaskState::Stopping);
        let victims_of_plan = plan.stop.iter().map(|&v| victim_ids[v]);
        for t in stopping.chain(victims_of_plan) {
            if let Some(h) = Held::of(t)
                && !capacity.not_in_snapshot.contains(&t.id)
                && let Some(p) = capacity.placement(h.host, h.cpu, h.memory, h.allocations)
            {
                let _ = check.release(&p);
            }
        }
        if check.try_place(req).is_none() {
            tracing::debug!(service = %service.name, "a preemption plan would not let the task in (its constraints): none carried out");
            return Ok(0);
        }
        for &v in &plan.stop {
            let t = victim_ids[v];
            let owner = services.get(&t.service);
            let reason = format!(
                "preempted: service {} (project {}, {}) needs the room",
                service.name, service.project, service.priority
            );
            let drain = owner.filter(|s| s.deregistration_delay_secs > 0).map(|s| {
                crate::clock::stamp(
                    self.now() + chrono::Duration::seconds(i64::from(s.deregistration_delay_secs)),
                )
            });
            self.store
                .request_task_stop(&t.id, &reason, drain.as_deref(), false)
                .await?;
            self.event(
                Some(&t.service),
                Some(&hosts[plan.host].id),
                &format!(
                    "task {} of {} (project {}, {}) preempted for service {} (project {}, {}): its project borrows beyond its guarantee",
                    t.id,
                    t.service,
                    owner.map_or(tessera_model::project::DEFAULT_PROJECT, |s| s.project.as_str()),
                    owner.map_or(PriorityClass::Default, |s| s.priority),
                    service.name,
                    service.project,
                    service.priority
                ),
            )
            .await;
        }
        self.event(
            Some(&service.name),
            Some(&hosts[plan.host].id),
            &format!(
                "preempting {} task(s) on host {} to make room for a task of {}",
                plan.stop.len(),
                hosts[plan.host].id,
                service.name
            ),
        )
        .await;
        self.wake();
        Ok(plan.stop.len())
    }
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
}
