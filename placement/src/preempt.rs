//! Preemption plans: which running tasks to stop so that one waiting task fits.
//!
//! A task of a project within its guarantee may take room from tasks that use borrowed
//! capacity and have a lower priority. The caller says which tasks may be stopped (the
//! *victims*, each with its priority rank and its project) and how much each project may
//! lose (what it borrows: a plan never takes a project below its guarantee). The planner
//! answers with the fewest victims whose stop makes room, on one host:
//! - for a shared (MPS) slot, on one GPU: its memory, compute and a client slot, and the
//!   host's CPU and memory;
//! - for whole GPUs, that many GPUs of one host left with nothing on them, and the host's
//!   CPU and memory.
//!
//! Among plans that stop equally few, it prefers the lowest priorities, then the least
//! capacity freed beyond the need (the smallest tasks). Freeing 20 GiB on one GPU is a
//! plan as much as freeing a whole GPU.
//!
//! The search is exact: plans of 0, 1, 2, ... victims are tried in turn, with each branch
//! cut as soon as the victims left cannot make up what is missing, so the first size that
//! works is the least. A property test checks it against trying every subset.

/// Room on one GPU now, before anything is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuRoom {
    pub free_memory: u64,
    pub free_compute: u64,
    /// MPS clients it can still take.
    pub free_clients: u32,
    /// It runs tasks that may not be stopped (it can never be left empty).
    pub pinned: bool,
    /// Healthy and taking tasks.
    pub usable: bool,
}

/// Room on one host now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoom {
    pub free_cpu: u64,
    pub free_memory: u64,
    pub gpus: Vec<GpuRoom>,
    /// Active and taking tasks.
    pub usable: bool,
}

/// A task that may be stopped, as it holds capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    pub host: usize,
    /// Its slots: (GPU index on its host, memory, compute).
    pub slots: Vec<(usize, u64, u64)>,
    pub cpu: u64,
    pub memory: u64,
    /// Its slots are whole GPUs (each counts against its project's whole GPUs).
    pub whole: bool,
    /// Lower goes first.
    pub priority: u32,
    /// Index into the budgets.
    pub project: usize,
}

/// What a project may lose to preemption: what it borrows beyond its guarantee, per
/// quantity (GPU memory, compute, whole GPUs, CPU, memory). `u64::MAX` where unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub gpu_memory: u64,
    pub compute: u64,
    pub gpus: u64,
    pub cpu: u64,
    pub memory: u64,
}

impl Budget {
    pub const UNBOUNDED: Budget = Budget {
        gpu_memory: u64::MAX,
        compute: u64::MAX,
        gpus: u64::MAX,
        cpu: u64::MAX,
        memory: u64::MAX,
    };
}

/// What the waiting task needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuNeed {
    None,
    /// One MPS slot on one GPU.
    Shared {
        memory: u64,
        compute: u64,
    },
    /// That many GPUs of one host, each with nothing on it.
    Whole {
        count: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub gpu: GpuNeed,
    pub cpu: u64,
    pub memory: u64,
}

/// Which victims to stop (indices into the victims given), and where the task then fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub host: usize,
    /// The GPUs the task gets (one for a shared slot, `count` for whole GPUs).
    pub gpus: Vec<usize>,
    pub stop: Vec<usize>,
}

/// How many search steps one plan may take in all: past it, the best plan found so far
/// stands (or none). Small cases never reach it; a pool of hosts each shared by dozens of
/// small victims can, and then the plan may stop more tasks than the fewest.
pub const SEARCH_BUDGET: usize = 200_000;

/// The most choices of whole GPUs tried on one host; past it, the GPUs with the fewest
/// tasks on them are chosen.
pub const MAX_GPU_CHOICES: usize = 1_000;

/// The fewest victims to stop so that `ask` fits, or `None` when no choice of them makes
/// room (see the module's documentation).
pub fn plan(hosts: &[HostRoom], victims: &[Victim], budgets: &[Budget], ask: &Ask) -> Option<Plan> {
    let mut best: Option<(Cost, Plan)> = None;
    let mut steps = 0usize;
    for (h, host) in hosts.iter().enumerate().filter(|(_, h)| h.usable) {
        let on_host: Vec<usize> = (0..victims.len())
            .filter(|&v| victims[v].host == h)
            .collect();
        for (gpus, mandatory) in targets(host, victims, &on_host, ask.gpu) {
            if steps > SEARCH_BUDGET {
                break;
            }
            let Some(stop) = cover(
                host, &gpus, victims, &on_host, &mandatory, budgets, ask, &mut steps,
            ) else {
                continue;
            };
            let cost = Cost::of(&stop, victims);
            if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                best = Some((
                    cost,
                    Plan {
                        host: h,
                        gpus,
                        stop,
                    },
                ));
            }
        }
    }
    best.map(|(_, mut p)| {
        p.stop.sort_unstable();
        p
    })
}

/// Lexicographic: fewest stopped, lowest priorities, least freed beyond the need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    count: usize,
    priorities: u64,
    freed: u64,
}

impl Cost {
    fn of(stop: &[usize], victims: &[Victim]) -> Cost {
        Cost {
            count: stop.len(),
            priorities: stop.iter().map(|&v| u64::from(victims[v].priority)).sum(),
            freed: stop
                .iter()
                .map(|&v| victims[v].slots.iter().map(|s| s.1).sum::<u64>())
                .sum(),
        }
    }
}

/// Where on `host` the task could go, each with the victims that must stop for it: one
/// GPU for a shared slot (none must), `count` unpinned GPUs for whole ones (everything on
/// them must), the host alone for a task without GPUs.
fn targets(
    host: &HostRoom,
    victims: &[Victim],
    on_host: &[usize],
    need: GpuNeed,
) -> Vec<(Vec<usize>, Vec<usize>)> {
    let usable: Vec<usize> = (0..host.gpus.len())
        .filter(|&g| host.gpus[g].usable)
        .collect();
    match need {
        GpuNeed::None => vec![(Vec::new(), Vec::new())],
        GpuNeed::Shared { .. } => usable.into_iter().map(|g| (vec![g], Vec::new())).collect(),
        GpuNeed::Whole { count } => {
            let mut free: Vec<usize> = usable
                .into_iter()
                .filter(|&g| !host.gpus[g].pinned)
                .collect();
            let choices = if choose(free.len(), count) <= MAX_GPU_CHOICES {
                combinations(free.len(), count)
            } else {
                // Too many to try: the GPUs with the fewest tasks on them.
                let tasks_on = |g: usize| {
                    on_host
                        .iter()
                        .filter(|&&v| victims[v].slots.iter().any(|s| s.0 == g))
                        .count()
                };
                free.sort_by_key(|&g| (tasks_on(g), g));
                vec![(0..count).collect()]
            };
            choices
                .into_iter()
                .map(|pick| {
                    let gpus: Vec<usize> = pick.iter().map(|&i| free[i]).collect();
                    let must: Vec<usize> = on_host
                        .iter()
                        .copied()
                        .filter(|&v| victims[v].slots.iter().any(|s| gpus.contains(&s.0)))
                        .collect();
                    (gpus, must)
                })
                .collect()
        }
    }
}

/// n choose k (`usize::MAX` past what a usize holds).
fn choose(n: usize, k: usize) -> usize {
    if k > n {
        return 0;
    }
    let exact = (0..k).fold(1u128, |acc, i| acc * (n - i) as u128 / (i as u128 + 1));
    usize::try_from(exact).unwrap_or(usize::MAX)
}

fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    if k > n {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut pick: Vec<usize> = (0..k).collect();
    loop {
        out.push(pick.clone());
        let Some(i) = (0..k).rev().find(|&i| pick[i] < n - k + i) else {
            return out;
        };
        pick[i] += 1;
        for j in i + 1..k {
            pick[j] = pick[j - 1] + 1;
        }
    }
}

/// Dimensions a stop frees, against what is missing: GPU memory, compute and a client on
/// the target GPU (shared), host CPU, host memory.
const DIMS: usize = 5;

fn gains(v: &Victim, gpu: Option<usize>) -> [u64; DIMS] {
    let (mut mem, mut comp, mut clients) = (0, 0, 0);
    if let Some(g) = gpu {
        for s in v.slots.iter().filter(|s| s.0 == g) {
            mem += s.1;
            comp += s.2;
            clients += 1;
        }
    }
    [mem, comp, clients, v.cpu, v.memory]
}

/// What a victim takes from its project's budget: GPU memory, compute, whole GPUs, CPU,
/// memory.
fn charge(v: &Victim) -> [u64; 5] {
    [
        v.slots.iter().map(|s| s.1).sum(),
        v.slots.iter().map(|s| s.2).sum(),
        if v.whole { v.slots.len() as u64 } else { 0 },
        v.cpu,
        v.memory,
    ]
}

fn budget_vec(b: &Budget) -> [u64; 5] {
    [b.gpu_memory, b.compute, b.gpus, b.cpu, b.memory]
}

/// The fewest victims beyond `mandatory` (all of which stop) that make up what `ask` still
/// misses on `host` with `gpus` as its target, within every project's budget; `None` when
/// no choice does.
#[allow(clippy::too_many_arguments)]
fn cover(
    host: &HostRoom,
    gpus: &[usize],
    victims: &[Victim],
    on_host: &[usize],
    mandatory: &[usize],
    budgets: &[Budget],
    ask: &Ask,
    steps: &mut usize,
) -> Option<Vec<usize>> {
    let shared_gpu = match ask.gpu {
        GpuNeed::Shared { .. } => Some(gpus[0]),
        _ => None,
    };
    let mut missing: [i128; DIMS] = [0; DIMS];
    if let (GpuNeed::Shared { memory, compute }, Some(g)) = (ask.gpu, shared_gpu) {
        let room = &host.gpus[g];
        missing[0] = i128::from(memory) - i128::from(room.free_memory);
        missing[1] = i128::from(compute) - i128::from(room.free_compute);
        missing[2] = 1 - i128::from(room.free_clients);
    }
    missing[3] = i128::from(ask.cpu) - i128::from(host.free_cpu);
    missing[4] = i128::from(ask.memory) - i128::from(host.free_memory);
    let mut spent: Vec<[u64; 5]> = vec![[0; 5]; budgets.len()];
    for &v in mandatory {
        if !take(&mut spent, budgets, &victims[v]) {
            return None;
        }
        for (m, g) in missing.iter_mut().zip(gains(&victims[v], shared_gpu)) {
            *m -= i128::from(g);
        }
    }
    // The victims that could still help, most useful first (lowest priority, then largest),
    // so that good plans are met early.
    let mut optional: Vec<usize> = on_host
        .iter()
        .copied()
        .filter(|v| !mandatory.contains(v))
        .filter(|&v| {
            let g = gains(&victims[v], shared_gpu);
            g.iter().zip(missing).any(|(g, m)| *g > 0 && m > 0)
        })
        .collect();
    optional.sort_by_key(|&v| {
        let g = gains(&victims[v], shared_gpu);
        (victims[v].priority, std::cmp::Reverse(g))
    });
    let mut search = Search {
        victims,
        optional: &optional,
        gpu: shared_gpu,
        budgets,
        steps: *steps,
        best: None,
    };
    let mut found = None;
    for size in 0..=optional.len() {
        let mut chosen = Vec::new();
        search.go(0, size, missing, &mut spent.clone(), &mut chosen);
        if let Some(f) = search.best.take() {
            found = Some(mandatory.iter().copied().chain(f).collect());
            break;
        }
        if search.steps > SEARCH_BUDGET {
            break;
        }
    }
    *steps = search.steps;
    found
}

fn take(spent: &mut [[u64; 5]], budgets: &[Budget], v: &Victim) -> bool {
    let limit = budget_vec(&budgets[v.project]);
    let c = charge(v);
    let s = &mut spent[v.project];
    if (0..5).any(|i| s[i].saturating_add(c[i]) > limit[i]) {
        return false;
    }
    for (s, c) in s.iter_mut().zip(c) {
        *s += c;
    }
    true
}

struct Search<'a> {
    victims: &'a [Victim],
    optional: &'a [usize],
    gpu: Option<usize>,
    budgets: &'a [Budget],
    steps: usize,
    /// The best plan of the size being tried: lowest priorities, then least freed.
    best: Option<Vec<usize>>,
}

impl Search<'_> {
    fn score(&self, chosen: &[usize]) -> (u64, u64) {
        (
            chosen
                .iter()
                .map(|&v| u64::from(self.victims[v].priority))
                .sum(),
            chosen
                .iter()
                .map(|&v| self.victims[v].slots.iter().map(|s| s.1).sum::<u64>())
                .sum(),
        )
    }

    /// Exactly `left` more victims from `optional[from..]`.
    fn go(
        &mut self,
        from: usize,
        left: usize,
        missing: [i128; DIMS],
        spent: &mut Vec<[u64; 5]>,
        chosen: &mut Vec<usize>,
    ) {
        self.steps += 1;
        if self.steps > SEARCH_BUDGET {
            return;
        }
        if left == 0 {
            if missing.iter().all(|m| *m <= 0)
                && self
                    .best
                    .as_ref()
                    .is_none_or(|b| self.score(chosen) < self.score(b))
            {
                self.best = Some(chosen.clone());
            }
            return;
        }
        let rest = &self.optional[from..];
        if rest.len() < left {
            return;
        }
        // Cut: even the `left` largest gains left cannot make up a missing dimension.
        for (d, &want) in missing.iter().enumerate() {
            if want <= 0 {
                continue;
            }
            let mut g: Vec<u64> = rest
                .iter()
                .map(|&v| gains(&self.victims[v], self.gpu)[d])
                .collect();
            g.sort_unstable_by(|a, b| b.cmp(a));
            let most: i128 = g.iter().take(left).map(|&x| i128::from(x)).sum();
            if most < want {
                return;
            }
        }
        for i in from..self.optional.len() {
            if self.optional.len() - i < left {
                break;
            }
            let v = self.optional[i];
            let before = spent[self.victims[v].project];
            if !take(spent, self.budgets, &self.victims[v]) {
                continue;
            }
            let g = gains(&self.victims[v], self.gpu);
            let mut next = missing;
            for (n, g) in next.iter_mut().zip(g) {
                *n -= i128::from(g);
            }
            chosen.push(v);
            self.go(i + 1, left - 1, next, spent, chosen);
            chosen.pop();
            spent[self.victims[v].project] = before;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(free_memory: u64, free_compute: u64) -> GpuRoom {
        GpuRoom {
            free_memory,
            free_compute,
            free_clients: 10,
            pinned: false,
            usable: true,
        }
    }

    fn host(gpus: Vec<GpuRoom>) -> HostRoom {
        HostRoom {
            free_cpu: 64_000,
            free_memory: 256 * 1024,
            gpus,
            usable: true,
        }
    }

    fn shared(host: usize, gpu: usize, memory: u64, priority: u32) -> Victim {
        Victim {
            host,
            slots: vec![(gpu, memory, 100)],
            cpu: 1000,
            memory: 1024,
            whole: false,
            priority,
            project: 0,
        }
    }

    fn ask(memory: u64) -> Ask {
        Ask {
            gpu: GpuNeed::Shared {
                memory,
                compute: 100,
            },
            cpu: 1000,
            memory: 1024,
        }
    }

    #[test]
    fn one_large_task_is_stopped_rather_than_two_small_ones() {
        // GPU 0: two 8 GiB tasks; GPU 1: one 20 GiB task. 20 GiB are needed.
        let hosts = [host(vec![gpu(4096, 500), gpu(4096, 500)])];
        let victims = [
            shared(0, 0, 8192, 0),
            shared(0, 0, 8192, 0),
            shared(0, 1, 20480, 0),
        ];
        let p = plan(&hosts, &victims, &[Budget::UNBOUNDED], &ask(20480)).expect("a plan");
        assert_eq!(p.stop, [2]);
        assert_eq!(p.gpus, [1]);
    }

    #[test]
    fn among_equally_few_the_lowest_priority_then_the_smallest_goes() {
        let hosts = [host(vec![gpu(0, 500), gpu(0, 500), gpu(0, 500)])];
        let victims = [
            shared(0, 0, 10240, 2),
            shared(0, 1, 10240, 1),
            shared(0, 2, 30720, 1),
        ];
        let p = plan(&hosts, &victims, &[Budget::UNBOUNDED], &ask(10240)).expect("a plan");
        assert_eq!(p.stop, [1], "priority 1 and 10 GiB: enough and smallest");
    }

    #[test]
    fn a_project_is_never_taken_below_its_guarantee() {
        let hosts = [host(vec![gpu(0, 500)])];
        let mut victims = vec![shared(0, 0, 10240, 0), shared(0, 0, 10240, 0)];
        victims[1].project = 1;
        let budgets = [
            Budget {
                gpu_memory: 5000,
                ..Budget::UNBOUNDED
            },
            Budget::UNBOUNDED,
        ];
        let p = plan(&hosts, &victims, &budgets, &ask(10240)).expect("a plan");
        assert_eq!(
            p.stop,
            [1],
            "project 0 borrows only 5000 MiB: its task stays"
        );
        let none = [Budget {
            gpu_memory: 5000,
            ..Budget::UNBOUNDED
        }; 2];
        assert_eq!(plan(&hosts, &victims, &none, &ask(10240)), None);
    }

    #[test]
    fn whole_gpus_are_freed_on_one_host_and_a_pinned_gpu_is_never_chosen() {
        let mut pinned = gpu(0, 0);
        pinned.pinned = true;
        let hosts = [
            host(vec![gpu(0, 0), pinned]),
            host(vec![gpu(0, 0), gpu(0, 0)]),
        ];
        let victims = [
            shared(0, 0, 10240, 0),
            shared(1, 0, 10240, 0),
            shared(1, 0, 10240, 0),
            shared(1, 1, 10240, 0),
        ];
        let two = Ask {
            gpu: GpuNeed::Whole { count: 2 },
            cpu: 0,
            memory: 0,
        };
        let p = plan(&hosts, &victims, &[Budget::UNBOUNDED], &two).expect("host 1");
        assert_eq!((p.host, p.stop.clone()), (1, vec![1, 2, 3]));
        let one = Ask {
            gpu: GpuNeed::Whole { count: 1 },
            ..two
        };
        let p = plan(&hosts, &victims, &[Budget::UNBOUNDED], &one).expect("one GPU");
        assert_eq!(p.stop.len(), 1, "host 0's GPU 0 or host 1's GPU 1");
    }

    #[test]
    fn no_plan_when_stopping_everything_is_not_enough() {
        let hosts = [host(vec![gpu(0, 500)])];
        let victims = [shared(0, 0, 4096, 0)];
        assert_eq!(
            plan(&hosts, &victims, &[Budget::UNBOUNDED], &ask(10240)),
            None
        );
        assert_eq!(combinations(4, 2).len(), 6);
        assert_eq!(combinations(2, 3).len(), 0);
        assert_eq!(choose(4, 2), 6);
        assert_eq!(choose(64, 16), 488_526_937_079_580);
    }
}
