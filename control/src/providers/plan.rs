//! What a pool's capacity provider should do next, as a pure function of what the pool
//! holds now (its hosts and what they run, the machines asked for and not yet joined, the
//! tasks that wait and how many hosts of the provider's shape would place them): table
//! tested without a store, a clock or a provider.

use tessera_model::project::Usage;
use tessera_model::provider::{HostShape, Provider, with_headroom};
use tessera_model::{HostId, HostStatus};
use tessera_placement::sizing::Sizing;

/// A host of the pool as the plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostNow {
    pub(crate) id: HostId,
    /// The machine it is (made by the provider), if it is one.
    pub(crate) machine: Option<String>,
    /// Tasks holding capacity on it.
    pub(crate) tasks: usize,
    /// How long it has held none (seconds), as this server saw.
    pub(crate) empty_for: Option<u64>,
    /// Its status now.
    pub(crate) status: HostStatus,
    /// How long it has been impaired or lost (seconds), as this server saw.
    pub(crate) bad_for: Option<u64>,
    /// What it offers (its GPUs, compute, CPU and memory), as projects' guarantees count.
    pub(crate) capacity: Usage,
}

/// A machine asked for and not joined yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Booting {
    pub(crate) machine: String,
    /// Seconds since it was asked for.
    pub(crate) age: u64,
}

/// The pool now.
#[derive(Debug, Clone)]
pub(crate) struct PoolNow<'a> {
    pub(crate) provider: &'a Provider,
    /// The shape new hosts have (given, or learnt from the pool's hosts).
    pub(crate) shape: Option<&'a HostShape>,
    pub(crate) hosts: Vec<HostNow>,
    pub(crate) booting: Vec<Booting>,
    /// What waits for room, in words, with its sizing (`None`: nothing waits).
    pub(crate) waiting: Option<(String, Sizing)>,
    /// Seconds since the last scale-out (`None`: never).
    pub(crate) since_scale_out: Option<u64>,
    /// Launches failed in a row, and seconds since the last one failed.
    pub(crate) failed_launches: (u32, Option<u64>),
    /// What projects are guaranteed in the pool, all together: scaling in never leaves
    /// the pool less.
    pub(crate) guaranteed: Usage,
}

/// One thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Ask the provider for `count` machines.
    Launch { count: u32, reason: String },
    /// A machine that did not join in time: terminate it, count a failed launch.
    Abandon { machine: String, reason: String },
    /// A broken host to terminate (its machine) and deregister: impaired past the repair
    /// delay with its tasks moved off, or lost past the lost delay.
    Replace {
        host: HostId,
        machine: String,
        reason: String,
    },
    /// An empty host to terminate (its machine) and deregister.
    ScaleIn {
        host: HostId,
        machine: String,
        reason: String,
    },
    /// Nothing can be done about something that should be said (once per change).
    Say(String),
}

/// Seconds to wait after `failures` launches failed in a row: 30 s doubling, at most 30
/// minutes.
pub(crate) fn launch_backoff(failures: u32) -> u64 {
    if failures == 0 {
        0
    } else {
        (30u64 << (failures - 1).min(6)).min(1800)
    }
}

/// The pool's counts the steps are decided on.
struct Counts {
    /// Hosts not lost.
    hosts: u32,
    /// Those plus machines coming (booting, not overdue).
    have: u32,
    /// Hosts running tasks.
    busy: u32,
}

/// What to do next in the pool: give up on machines that never joined, then grow (to
/// `min_hosts`, and for the tasks that wait) or, when nothing waits, shrink.
pub(crate) fn plan(now: &PoolNow<'_>) -> Vec<Step> {
    let p = now.provider;
    // Machines that never joined: given up on, and no longer coming capacity.
    let (overdue, coming): (Vec<&Booting>, Vec<&Booting>) = now
        .booting
        .iter()
        .partition(|b| b.age >= u64::from(p.boot_timeout_secs));
    let mut steps: Vec<Step> = overdue
        .iter()
        .map(|b| Step::Abandon {
            machine: b.machine.clone(),
            reason: format!(
                "machine {} did not join within its boot timeout of {} s",
                b.machine, p.boot_timeout_secs
            ),
        })
        .collect();
    replace(now, &mut steps);
    // Lost hosts and those being replaced are no capacity.
    let replaced: Vec<&HostId> = steps
        .iter()
        .filter_map(|s| match s {
            Step::Replace { host, .. } => Some(host),
            _ => None,
        })
        .collect();
    let live = now
        .hosts
        .iter()
        .filter(|h| h.status != HostStatus::Lost && !replaced.contains(&&h.id));
    let hosts = live.clone().count() as u32;
    let counts = Counts {
        hosts,
        have: hosts + coming.len() as u32,
        busy: live.filter(|h| h.tasks > 0).count() as u32,
    };
    // A machine given up on now is a failed launch too: the next waits its backoff.
    let failed = match now.failed_launches {
        (n, _) if !overdue.is_empty() => (n + overdue.len() as u32, Some(0)),
        known => known,
    };
    if scale_out(now, &counts, failed, &mut steps) || now.waiting.is_some() {
        return steps;
    }
    scale_in(now, &counts, &mut steps);
    steps
}

/// Hosts to launch: up to `min_hosts`, and what the waiting tasks need (coming capacity
/// counted, the target capacity's headroom added), within `max_hosts`, the cooldown and
/// the backoff after failed launches. Whether the pool wants to grow.
fn scale_out(
    now: &PoolNow<'_>,
    c: &Counts,
    (failures, failed_ago): (u32, Option<u64>),
    steps: &mut Vec<Step>,
) -> bool {
    let p = now.provider;
    let mut launch = 0u32;
    let mut why = Vec::new();
    if c.have < p.min_hosts {
        launch = p.min_hosts - c.have;
        why.push(format!(
            "the pool has {} host(s), fewer than its min_hosts {}",
            c.have, p.min_hosts
        ));
    }
    if let Some((waiting, sizing)) = &now.waiting {
        if !sizing.unfit.is_empty() {
            steps.push(Step::Say(format!(
                "{} waiting task(s) fit no host of the provider's shape{}: more hosts will not place them",
                sizing.unfit.len(),
                now.shape.map_or(String::new(), |s| format!(" ({})", s.describe()))
            )));
        }
        // Coming capacity counts: no second request for the same tasks.
        let wanted = with_headroom(c.busy + sizing.hosts, p.target_capacity_percent)
            .max(c.hosts + sizing.hosts);
        let more = wanted.saturating_sub(c.have);
        if sizing.hosts > 0 && more > launch {
            launch = more;
            why.push(format!(
                "{waiting}; {} more host(s){} place them{}",
                sizing.hosts,
                now.shape
                    .map_or(String::new(), |s| format!(" of {}", s.describe())),
                if p.target_capacity_percent < 100 {
                    format!(" (target capacity {} %)", p.target_capacity_percent)
                } else {
                    String::new()
                }
            ));
        }
    }
    if launch == 0 {
        return false;
    }
    let room = p.max_hosts.saturating_sub(c.have);
    let cooling = now
        .since_scale_out
        .is_some_and(|ago| ago < u64::from(p.scale_out_cooldown_secs))
        && c.have >= p.min_hosts;
    if room == 0 {
        steps.push(Step::Say(format!(
            "held at max_hosts {}: {}",
            p.max_hosts,
            why.join("; ")
        )));
    } else if failed_ago.is_some_and(|ago| ago < launch_backoff(failures)) {
        steps.push(Step::Say(format!(
            "{failures} launch(es) failed in a row: the next in {} s",
            launch_backoff(failures).saturating_sub(failed_ago.unwrap_or(0))
        )));
    } else if !cooling {
        let count = launch.min(room);
        let capped = if count < launch {
            format!(" (held at max_hosts {})", p.max_hosts)
        } else {
            String::new()
        };
        steps.push(Step::Launch {
            count,
            reason: format!("{}{capped}", why.join("; ")),
        });
    }
    true
}

/// Broken hosts the provider made: impaired past the provider's repair delay once no task is
/// left on them (their tasks moved start-before-stop, onto new hosts first if the pool had
/// no room), or lost past its lost delay; never more than a fifth of the pool's hosts
/// (at least one) in one pass.
fn replace(now: &PoolNow<'_>, steps: &mut Vec<Step>) {
    let mut broken: Vec<&HostNow> = now
        .hosts
        .iter()
        .filter(|h| h.machine.is_some())
        .filter(|h| match (h.status, h.bad_for) {
            (HostStatus::Impaired, Some(s)) => {
                h.tasks == 0 && s >= u64::from(now.provider.repair_delay_secs)
            }
            (HostStatus::Lost, Some(s)) => s >= u64::from(now.provider.lost_delay_secs),
            _ => false,
        })
        .collect();
    // Longest broken first; ties by id, so every server plans alike.
    broken.sort_by(|a, b| b.bad_for.cmp(&a.bad_for).then(a.id.cmp(&b.id)));
    let at_once = (now.hosts.len() / 5).max(1);
    for h in broken.into_iter().take(at_once) {
        let how = if h.status == HostStatus::Lost {
            "lost"
        } else {
            "impaired, its tasks moved off,"
        };
        steps.push(Step::Replace {
            host: h.id.clone(),
            machine: h.machine.clone().expect("filtered"),
            reason: format!(
                "host {} has been {how} for {} s: replaced",
                h.id,
                h.bad_for.unwrap_or(0)
            ),
        });
    }
}

/// Hosts to terminate: those empty for the scale-in cooldown (longest first), never
/// below `min_hosts`, the spare room the target capacity keeps, or what projects are
/// guaranteed in the pool (an empty host that guarantees need stays, and that is said).
fn scale_in(now: &PoolNow<'_>, c: &Counts, steps: &mut Vec<Step>) {
    let p = now.provider;
    let keep = p
        .min_hosts
        .max(with_headroom(c.busy, p.target_capacity_percent));
    let removable = c.have.saturating_sub(keep) as usize;
    let mut idle: Vec<&HostNow> = now
        .hosts
        .iter()
        .filter(|h| {
            h.tasks == 0
                && h.machine.is_some()
                && h.status == HostStatus::Active
                && h.empty_for
                    .is_some_and(|s| s >= u64::from(p.scale_in_cooldown_secs))
        })
        .collect();
    // Longest empty first; ties by id, so every server plans alike.
    idle.sort_by(|a, b| b.empty_for.cmp(&a.empty_for).then(a.id.cmp(&b.id)));
    let mut capacity = now
        .hosts
        .iter()
        .filter(|h| h.status != HostStatus::Lost)
        .fold(Usage::default(), |sum, h| sum.plus(&h.capacity));
    let mut kept: Vec<(&HostId, Vec<String>)> = Vec::new();
    for h in idle {
        if steps
            .iter()
            .filter(|s| matches!(s, Step::ScaleIn { .. }))
            .count()
            >= removable
        {
            break;
        }
        let after = capacity.above(&h.capacity);
        let short = after.shortfalls(&now.guaranteed);
        if !short.is_empty() {
            kept.push((&h.id, short.into_iter().map(|(_, words)| words).collect()));
            continue;
        }
        capacity = after;
        steps.push(Step::ScaleIn {
            host: h.id.clone(),
            machine: h.machine.clone().expect("filtered"),
            reason: format!(
                "host {} has run no task for {} s (scale-in cooldown {} s)",
                h.id,
                h.empty_for.unwrap_or(0),
                p.scale_in_cooldown_secs
            ),
        });
    }
    if let Some((first, short)) = kept.first() {
        let ids: Vec<String> = kept.iter().map(|(id, _)| id.to_string()).collect();
        steps.push(Step::Say(format!(
            "empty host(s) {} kept: projects' guarantees in the pool need them (without {first}: {})",
            ids.join(", "),
            short.join("; ")
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::provider::{ProviderInput, validate};

    fn provider(min: u32, max: u32, target: u32) -> Provider {
        validate(&ProviderInput {
            kind: "demo".into(),
            min_hosts: Some(min),
            max_hosts: max,
            target_capacity_percent: Some(target),
            scale_in_cooldown_secs: Some(300),
            boot_timeout_secs: Some(120),
            ..Default::default()
        })
        .expect("valid")
    }

    fn host(id: &str, tasks: usize, empty_for: Option<u64>) -> HostNow {
        HostNow {
            id: HostId::new(id).expect("valid"),
            machine: Some(format!("m-{id}")),
            tasks,
            empty_for,
            status: HostStatus::Active,
            bad_for: None,
            capacity: Usage {
                gpus: 2,
                gpu_memory_mib: 49152,
                compute_milli: 2000,
                cpu_milli: 32000,
                memory_mib: 131072,
            },
        }
    }

    fn sizing(hosts: u32) -> Sizing {
        Sizing {
            hosts,
            enough: true,
            unfit: vec![],
        }
    }

    fn now<'a>(p: &'a Provider, hosts: Vec<HostNow>) -> PoolNow<'a> {
        PoolNow {
            provider: p,
            shape: None,
            hosts,
            booting: vec![],
            waiting: None,
            since_scale_out: None,
            failed_launches: (0, None),
            guaranteed: Usage::default(),
        }
    }

    fn launches(steps: &[Step]) -> u32 {
        steps
            .iter()
            .map(|s| match s {
                Step::Launch { count, .. } => *count,
                _ => 0,
            })
            .sum()
    }

    #[test]
    fn waiting_tasks_ask_for_the_hosts_that_place_them_less_what_is_coming() {
        let p = provider(0, 10, 100);
        let mut n = now(&p, vec![host("a", 3, None)]);
        n.waiting = Some((
            "3 task(s) of `chat` wait for 24 GiB of GPU memory".into(),
            sizing(2),
        ));
        let steps = plan(&n);
        assert_eq!(launches(&steps), 2);
        let Step::Launch { reason, .. } = &steps[0] else {
            panic!("{steps:?}")
        };
        assert!(reason.starts_with("3 task(s) of `chat` wait"), "{reason}");
        // Two already booting for them: nothing more.
        n.booting = vec![
            Booting {
                machine: "m1".into(),
                age: 10,
            },
            Booting {
                machine: "m2".into(),
                age: 10,
            },
        ];
        n.since_scale_out = Some(500);
        assert_eq!(launches(&plan(&n)), 0);
    }

    #[test]
    fn target_capacity_keeps_spare_hosts() {
        let p = provider(0, 10, 50);
        let mut n = now(&p, vec![host("a", 3, None)]);
        n.waiting = Some(("x".into(), sizing(1)));
        // Two hosts' worth of tasks at 50 %: four hosts.
        assert_eq!(launches(&plan(&n)), 3);
    }

    #[test]
    fn held_at_max_hosts_in_cooldown_and_backing_off() {
        let p = provider(0, 2, 100);
        let mut n = now(&p, vec![host("a", 3, None)]);
        n.waiting = Some(("x".into(), sizing(3)));
        let steps = plan(&n);
        assert_eq!(launches(&steps), 1, "capped: {steps:?}");
        n.booting = vec![Booting {
            machine: "m1".into(),
            age: 5,
        }];
        let steps = plan(&n);
        assert_eq!(launches(&steps), 0);
        assert!(
            matches!(&steps[0], Step::Say(s) if s.starts_with("held at max_hosts 2")),
            "{steps:?}"
        );
        let mut p = provider(0, 10, 100);
        p.scale_out_cooldown_secs = 60;
        let mut n = now(&p, vec![host("a", 3, None)]);
        n.waiting = Some(("x".into(), sizing(1)));
        n.since_scale_out = Some(10);
        assert_eq!(launches(&plan(&n)), 0, "in the scale-out cooldown");
        n.since_scale_out = None;
        n.failed_launches = (2, Some(30));
        let steps = plan(&n);
        assert_eq!(launches(&steps), 0, "backing off: {steps:?}");
        n.failed_launches = (2, Some(61));
        assert_eq!(launches(&plan(&n)), 1);
    }

    #[test]
    fn min_hosts_is_kept_and_late_machines_are_abandoned() {
        let p = provider(2, 10, 100);
        let mut n = now(&p, vec![]);
        n.booting = vec![Booting {
            machine: "late".into(),
            age: 121,
        }];
        let steps = plan(&n);
        assert!(
            matches!(&steps[0], Step::Abandon { machine, .. } if machine == "late"),
            "{steps:?}"
        );
        assert_eq!(
            launches(&steps),
            0,
            "a failed launch: the next waits its backoff"
        );
        n.booting.clear();
        n.failed_launches = (1, Some(31));
        assert_eq!(launches(&plan(&n)), 2, "the late one is not coming");
    }

    #[test]
    fn empty_hosts_go_after_the_cooldown_never_below_min_hosts_or_the_spare_room() {
        let p = provider(1, 10, 100);
        let n = now(
            &p,
            vec![
                host("a", 2, None),
                host("b", 0, Some(400)),
                host("c", 0, Some(900)),
                host("d", 0, Some(100)),
            ],
        );
        let steps = plan(&n);
        let gone: Vec<String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::ScaleIn { host, .. } => Some(host.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(gone, vec!["c", "b"], "longest empty first; d not yet");
        // Min hosts 2: one may go.
        let p = provider(2, 10, 100);
        let n = now(
            &p,
            vec![
                host("a", 2, None),
                host("b", 0, Some(400)),
                host("c", 0, Some(900)),
            ],
        );
        assert_eq!(plan(&n).len(), 1);
        // 50 % target: two busy hosts keep two spare.
        let p = provider(0, 10, 50);
        let n = now(
            &p,
            vec![
                host("a", 2, None),
                host("b", 2, None),
                host("c", 0, Some(900)),
                host("d", 0, Some(900)),
            ],
        );
        assert!(plan(&n).is_empty());
        // Nothing goes while tasks wait.
        let p = provider(0, 10, 100);
        let mut n = now(&p, vec![host("a", 0, Some(900))]);
        n.waiting = Some(("x".into(), sizing(0)));
        assert!(plan(&n).is_empty());
    }

    #[test]
    fn empty_hosts_that_projects_guarantees_need_stay_and_that_is_said() {
        let p = provider(0, 10, 100);
        // Four hosts of 2 GPUs; 5 GPUs guaranteed: of three empty hosts, one may go.
        let mut n = now(
            &p,
            vec![
                host("a", 1, None),
                host("b", 0, Some(900)),
                host("c", 0, Some(800)),
                host("d", 0, Some(700)),
            ],
        );
        n.guaranteed = Usage {
            gpus: 5,
            ..Usage::default()
        };
        let steps = plan(&n);
        let gone: Vec<String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::ScaleIn { host, .. } => Some(host.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(gone, vec!["b"]);
        let said: Vec<&String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Say(words) => Some(words),
                _ => None,
            })
            .collect();
        assert_eq!(said.len(), 1);
        assert!(said[0].contains("c, d kept"), "{}", said[0]);
        assert!(said[0].contains("1 whole GPUs short"), "{}", said[0]);
        // Guarantees of GPU memory count too; with none, every empty host goes.
        n.guaranteed = Usage {
            gpu_memory_mib: 49152 * 4,
            ..Usage::default()
        };
        assert!(!plan(&n).iter().any(|s| matches!(s, Step::ScaleIn { .. })));
        n.guaranteed = Usage::default();
        assert_eq!(plan(&n).len(), 3);
    }

    #[test]
    fn broken_hosts_are_replaced_once_their_tasks_moved_a_fifth_at_a_time() {
        let p = provider(0, 10, 100);
        let broken = |id: &str, status: HostStatus, tasks: usize, bad_for: u64| HostNow {
            status,
            bad_for: Some(bad_for),
            ..host(id, tasks, None)
        };
        let replaced = |n: &PoolNow<'_>| -> Vec<String> {
            plan(n)
                .into_iter()
                .filter_map(|s| match s {
                    Step::Replace { host, .. } => Some(host.to_string()),
                    _ => None,
                })
                .collect()
        };
        let n = now(
            &p,
            vec![
                host("a", 2, None),
                broken("i1", HostStatus::Impaired, 0, 400),
                broken("i2", HostStatus::Impaired, 1, 900),
                broken("i3", HostStatus::Impaired, 0, 100),
                broken("l1", HostStatus::Lost, 0, 1000),
            ],
        );
        // One of five at once: the longest broken whose tasks have gone.
        assert_eq!(replaced(&n), vec!["l1"]);
        let mut many = n.clone();
        many.hosts
            .extend((0..5).map(|i| host(&format!("x{i}"), 1, None)));
        assert_eq!(replaced(&many), vec!["l1", "i1"], "two of ten");
        // A lost host is no capacity: min_hosts counts without it.
        let p2 = provider(2, 10, 100);
        let n = now(
            &p2,
            vec![host("a", 1, None), broken("l1", HostStatus::Lost, 0, 10)],
        );
        assert_eq!(launches(&plan(&n)), 1);
    }

    #[test]
    fn backoff_doubles_to_half_an_hour() {
        assert_eq!(launch_backoff(0), 0);
        assert_eq!(launch_backoff(1), 30);
        assert_eq!(launch_backoff(2), 60);
        assert_eq!(launch_backoff(10), 1800);
    }
}
