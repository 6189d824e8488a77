//! What projects hold and are owed, as pure functions the scheduler and the projects
//! component share: what a task reserves, what a pool offers, each project's use now and
//! over the fair-share window, the limits a pool's quotas set, and the fair order of
//! waiting services.

use std::collections::HashMap;
use tessera_model::project::{Amounts, DEFAULT_PROJECT, Project, Usage};
use tessera_model::service::{GpuAllocation, Service, Task};
use tessera_model::{HostInfo, HostStatus, MiB, MilliCpu};

/// What a task reserves, as quotas count it: its host CPU and memory, and each GPU slot's
/// memory and compute (a whole GPU counts as one GPU, all its memory and all its compute).
pub fn reserved(cpu: MilliCpu, memory: MiB, allocations: &[GpuAllocation]) -> Usage {
    let mut u = Usage {
        cpu_milli: cpu.0,
        memory_mib: memory.0,
        ..Default::default()
    };
    for a in allocations {
        u.gpus += u64::from(a.dedicated);
        u.gpu_memory_mib += a.memory.0;
        u.compute_milli += u64::from(a.compute.0);
    }
    u
}

/// What a task holding capacity reserves.
pub fn task_usage(t: &Task) -> Usage {
    reserved(t.cpu, t.memory, &t.allocations)
}

/// What a pool's hosts offer, as guarantees are checked against it: every host not lost.
pub fn pool_capacity<'a>(hosts: impl IntoIterator<Item = &'a HostInfo>) -> Usage {
    let mut c = Usage::default();
    for h in hosts.into_iter().filter(|h| h.status != HostStatus::Lost) {
        c.cpu_milli += h.cpu.0;
        c.memory_mib += h.memory.0;
        for g in &h.gpus {
            c.gpus += 1;
            c.gpu_memory_mib += g.memory.0;
            c.compute_milli += 1000;
        }
    }
    c
}

/// Each service's project, by service name.
pub(crate) fn project_of<'a>(
    services: impl IntoIterator<Item = &'a Service>,
) -> HashMap<String, String> {
    services
        .into_iter()
        .map(|s| (s.name.clone(), s.project.clone()))
        .collect()
}

/// Each project's use of one pool, from the tasks holding capacity there.
pub fn usage_by_project<'a>(
    holding: impl IntoIterator<Item = &'a Task>,
    project_of: &HashMap<String, String>,
) -> HashMap<String, Usage> {
    let mut used: HashMap<String, Usage> = HashMap::new();
    for t in holding {
        let project = project_of
            .get(&t.service)
            .map(String::as_str)
            .unwrap_or(DEFAULT_PROJECT);
        let u = used.entry(project.to_owned()).or_default();
        *u = u.plus(&task_usage(t));
    }
    used
}

/// Projects' use is sampled once per bucket of this many seconds.
pub const SAMPLE_SECS: i64 = 300;
/// Fair share compares projects' use over this many seconds (the samples in it and now).
pub const FAIR_SHARE_WINDOW_SECS: i64 = 3600;
/// Samples older than this many seconds are deleted.
pub const HISTORY_KEPT_SECS: i64 = 7 * 24 * 3600;

/// Each project's use over the fair-share window: the mean of `now` and each bucket
/// sampled in the window (a project missing from a bucket held nothing then). A project
/// that held much for the last hour goes after one that held little, even if both hold
/// the same now.
pub fn use_over_time(
    samples: &[tessera_model::project::UsageSample],
    now: &HashMap<String, Usage>,
) -> HashMap<String, Usage> {
    let buckets: std::collections::BTreeSet<i64> = samples.iter().map(|s| s.at).collect();
    let n = buckets.len() as u64 + 1;
    let mut sum: HashMap<String, Usage> = now.clone();
    for s in samples {
        let e = sum.entry(s.project.clone()).or_default();
        *e = e.plus(&s.used);
    }
    sum.into_iter()
        .map(|(p, u)| {
            // Rounded to the nearest, so a little held for a short while is not nothing.
            let mean = |v: u64| v.saturating_add(n / 2) / n;
            let mean = Usage {
                gpus: mean(u.gpus),
                gpu_memory_mib: mean(u.gpu_memory_mib),
                compute_milli: mean(u.compute_milli),
                cpu_milli: mean(u.cpu_milli),
                memory_mib: mean(u.memory_mib),
            };
            (p, mean)
        })
        .collect()
}

/// The limits projects set in `pool` (only those that set one).
pub(crate) fn limits_in<'a>(
    projects: &'a HashMap<String, Project>,
    pool: &str,
) -> HashMap<&'a str, Amounts> {
    projects
        .values()
        .filter_map(|p| Some((p.name.as_str(), p.quota(pool)?.limit)))
        .filter(|(_, l)| *l != Amounts::default())
        .collect()
}

/// The order in which services' waiting tasks are placed: higher priority classes first;
/// within a class, the project furthest below its fair share (its dominant share of the
/// pool over its weight) first; otherwise in the order their tasks were created. `used`
/// and `capacity` may be empty when one project waits (then only priority orders).
pub(crate) fn fair_order<T>(
    by_service: &mut [(String, T)],
    services: &HashMap<String, Service>,
    projects: &HashMap<String, Project>,
    used: &HashMap<String, Usage>,
    capacity: &Usage,
) {
    let key = |name: &String| {
        let s = services.get(name);
        let priority = s.map(|s| s.priority).unwrap_or_default();
        let project = s.map_or(DEFAULT_PROJECT, |s| s.project.as_str());
        let weight = projects.get(project).map_or(1, |p| p.weight);
        let share = tessera_placement::quota::weighted_share(
            &used.get(project).copied().unwrap_or_default(),
            capacity,
            weight,
        );
        (std::cmp::Reverse(priority), share)
    };
    // Stable: ties keep the order their tasks were created in.
    by_service.sort_by(|(a, _), (b, _)| {
        let (ka, kb) = (key(a), key(b));
        ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
    });
}
