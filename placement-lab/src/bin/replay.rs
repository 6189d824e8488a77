//! `replay`: the placement benchmark over the Alibaba openb trace, following the FGD paper's
//! protocol (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
//! Fragmentation Gradient Descent", USENIX ATC 2023).
//!
//! For each seed: shuffle the tasks, add tasks sampled with replacement until the GPU
//! requests reach 1.3× the cluster's GPUs, place them one at a time (never deleting,
//! skipping what does not fit), and read the unallocated GPU share when the arrived
//! requests reach 100 % and 130 % of capacity. Several policies run side by side, and a
//! last row (`floor`) gives the least unallocated share that any engine could reach on the
//! same arrivals ([`tessera_placement_lab::bound`]).
//!
//! ```text
//! replay --nodes FILE --tasks FILE [--policy NAME[,NAME...]] [--seeds 42..51] [--scale N]
//!        [--placements FILE] [--json] [--diagnose] [--variants N [--first-variant K]]
//! ```
//!
//! With `--variants N`, it makes N variants of the task list (`tessera_placement_lab::variants`,
//! variant k from seed k, k from `--first-variant`, default 1: a range never tuned on is a
//! held-out test) and prints, for each, every policy's unallocated share at 100 %
//! and 130 % (mean over `--seeds`) and the floor, then on how many variants the first
//! policy is at or below each of the others.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Instant;
use tessera_model::{GpuUuid, HostId, SharingMode};
use tessera_placement::{DemandProfile, Engine, HostSpec, Policy, PoolLimits, Snapshot};
use tessera_placement_lab::bound;
use tessera_placement_lab::openb::{self, TraceTask};

const USAGE: &str = "usage: replay --nodes FILE --tasks FILE [--policy NAME[,NAME...]] [--seeds 42..51] [--scale N] [--placements FILE] [--json] [--diagnose] [--variants N [--first-variant K]]
policies: default (= fragmentation), fgd-sim, bestfit-sim, binpack, spread_host, spread_gpu";

struct Args {
    nodes: String,
    tasks: String,
    policies: Vec<(String, Policy)>,
    seeds: Vec<u64>,
    scale: usize,
    placements: Option<String>,
    json: bool,
    diagnose: bool,
    variants: u64,
    first_variant: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        nodes: String::new(),
        tasks: String::new(),
        policies: vec![("default".into(), Policy::Fragmentation)],
        seeds: (42..=51).collect(),
        scale: 1,
        placements: None,
        json: false,
        diagnose: false,
        variants: 0,
        first_variant: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "--nodes" => args.nodes = value("--nodes")?,
            "--tasks" => args.tasks = value("--tasks")?,
            "--policy" => {
                args.policies = value("--policy")?
                    .split(',')
                    .map(|name| {
                        Policy::parse(name)
                            .map(|p| (name.to_owned(), p))
                            .ok_or_else(|| format!("--policy: unknown policy {name:?}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--seeds" => args.seeds = parse_seeds(&value("--seeds")?)?,
            "--scale" => {
                args.scale = value("--scale")?
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or("--scale: a whole number of at least 1")?
            }
            "--placements" => args.placements = Some(value("--placements")?),
            "--json" => args.json = true,
            "--diagnose" => args.diagnose = true,
            "--variants" => {
                args.variants = value("--variants")?
                    .parse()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or("--variants: a whole number of at least 1")?
            }
            "--first-variant" => {
                args.first_variant = value("--first-variant")?
                    .parse()
                    .ok()
                    .ok_or("--first-variant: a whole number")?
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.nodes.is_empty() || args.tasks.is_empty() {
        return Err("--nodes and --tasks are required".into());
    }
    Ok(args)
}

/// `42..51` (inclusive) or `42,43,50`.
fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let bad = || format!("--seeds: {s:?} is not A..B (inclusive) or a comma-separated list");
    if let Some((a, b)) = s.split_once("..") {
        let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        if a > b {
            return Err(bad());
        }
        Ok((a..=b).collect())
    } else {
        s.split(',').map(|x| x.parse().map_err(|_| bad())).collect()
    }
}

/// The node list replicated `scale` times (copies renamed `-r1`, `-r2`, ...).
fn scaled(hosts: &[HostSpec], scale: usize) -> Vec<HostSpec> {
    let mut out = Vec::with_capacity(hosts.len() * scale);
    for r in 0..scale {
        for h in hosts {
            let mut h = h.clone();
            if r > 0 {
                let name = format!("{}-r{r}", h.id);
                for g in &mut h.gpus {
                    let idx = g.uuid.as_str().rsplit('/').next().unwrap_or("0").to_owned();
                    g.uuid = GpuUuid::new(format!("{name}/{idx}")).expect("non-empty");
                }
                h.id = HostId::new(name).expect("suffix keeps the name valid");
            }
            out.push(h);
        }
    }
    out
}

/// The GPU demand that has arrived when arrivals reach 100 % and 130 % of the cluster's
/// GPUs, for a seed ([`bound::Demand`], one per task).
fn arrived_demand(
    tasks: &[TraceTask],
    seed: u64,
    capacity: u64,
) -> (Vec<bound::Demand>, Vec<bound::Demand>) {
    let target = capacity * 13 / 10;
    let (mut demand, mut arrived, mut at_100) = (Vec::new(), 0u64, None);
    for i in openb::arrival_order(tasks, seed, target) {
        let t = &tasks[i];
        arrived += t.gpu_request_milli();
        if t.num_gpu > 0 {
            let share = t.gpu_milli.min(1000) as u16;
            demand.push(bound::Demand::new(share, f64::from(t.num_gpu)));
        }
        if at_100.is_none() && arrived >= capacity {
            at_100 = Some(demand.clone());
        }
        if arrived >= target {
            break;
        }
    }
    (at_100.unwrap_or_else(|| demand.clone()), demand)
}

/// The least unallocated share (%) any engine could reach with `demand` on `hosts`
/// ([`bound::allocation_ceiling`]: host CPU, memory, GPU models and arrival order left
/// out); `None` when the tasks that must all be placed cannot be.
fn floor(hosts: &[HostSpec], demand: &[bound::Demand]) -> Option<f64> {
    let capacity = openb::capacity_milli(hosts) as f64;
    bound::allocation_ceiling(demand, capacity / 1000.0).map(|c| 100.0 - 100.0 * c / capacity)
}

/// [`floor`] of demand that may all be left out.
fn floor_any(hosts: &[HostSpec], demand: &[bound::Demand]) -> f64 {
    floor(hosts, demand).expect("nothing must be placed")
}

struct SeedResult {
    unalloc_100: f64,
    unalloc_130: f64,
    latencies_ns: Vec<u64>,
    placements_csv: Option<String>,
}

struct RunOptions {
    record: bool,
    diagnose: bool,
}

fn run_seed(
    hosts: &[HostSpec],
    tasks: &[TraceTask],
    profile: &DemandProfile,
    policy: Policy,
    seed: u64,
    opts: RunOptions,
) -> SeedResult {
    let RunOptions { record, diagnose } = opts;
    let capacity_milli = openb::capacity_milli(hosts);
    let target = capacity_milli * 13 / 10;
    let order = openb::arrival_order(tasks, seed, target);
    let mut engine = Engine::new(
        Snapshot::new(hosts.to_vec(), PoolLimits::default()),
        policy,
        profile,
        seed,
    );
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let (mut at_100, mut at_130) = (None, None);
    let mut latencies_ns = Vec::with_capacity(order.len());
    let mut csv = record.then(|| String::from("seq,task_row,node,gpus,gpu_milli\n"));
    let mut seq = 0;
    let mut failed: BTreeMap<&str, u64> = BTreeMap::new();
    for &i in &order {
        let task = &tasks[i];
        arrived += task.gpu_request_milli();
        let start = Instant::now();
        let placed = engine.try_place(&task.request);
        if let Some(p) = &placed {
            engine
                .assign(p)
                .expect("the engine's own placement fits its snapshot");
        }
        latencies_ns.push(start.elapsed().as_nanos() as u64);
        if let Some(p) = &placed {
            allocated += task.gpu_request_milli();
            if let Some(csv) = csv.as_mut() {
                let gpus: Vec<String> = p.gpus.iter().map(|s| s.index.to_string()).collect();
                let node = hosts[p.host as usize].id.as_str();
                let _ = writeln!(
                    csv,
                    "{seq},{},{node},{},{}",
                    task.row,
                    gpus.join(";"),
                    task.gpu_milli
                );
                seq += 1;
            }
        }
        if diagnose && placed.is_none() && arrived < capacity_milli {
            *failed.entry(shape_class(task)).or_insert(0) += task.gpu_request_milli();
        }
        let unalloc = 100.0 - 100.0 * allocated as f64 / capacity_milli as f64;
        if at_100.is_none() && arrived >= capacity_milli {
            if diagnose {
                print_diagnosis(policy, seed, &engine, &failed);
            }
            at_100 = Some(unalloc);
        }
        if at_130.is_none() && arrived >= target {
            at_130 = Some(unalloc);
        }
    }
    let last = 100.0 - 100.0 * allocated as f64 / capacity_milli as f64;
    SeedResult {
        unalloc_100: at_100.unwrap_or(last),
        unalloc_130: at_130.unwrap_or(last),
        latencies_ns,
        placements_csv: csv,
    }
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("replay: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let (hosts, tasks) = match openb::load(&args.nodes, &args.tasks) {
        Ok(x) => x,
        Err(msg) => {
            eprintln!("replay: {msg}");
            return ExitCode::from(1);
        }
    };
    let hosts = scaled(&hosts, args.scale);
    if args.variants > 0 {
        return run_variants(&args, &hosts, &tasks);
    }
    let gpus: usize = hosts.iter().map(|h| h.gpus.len()).sum();
    // The workload's shape, as FGD defines it: the trace's distinct task types by frequency.
    let profile = DemandProfile::from_requests(tasks.iter().map(|t| &t.request));
    if !args.json {
        println!(
            "replay: {} nodes, {gpus} GPUs, {} tasks ({} shapes), seeds {:?}",
            hosts.len(),
            tasks.len(),
            profile.entries.len(),
            args.seeds
        );
        println!(
            "{:<14} {:>20} {:>20} {:>12} {:>9} {:>9}",
            "policy", "unalloc@100% (sd)", "unalloc@130% (sd)", "decisions/s", "p50 µs", "p99 µs"
        );
    }
    let mut json_rows = Vec::new();
    for (i, (name, policy)) in args.policies.iter().enumerate() {
        let mut u100 = Vec::new();
        let mut u130 = Vec::new();
        let mut lat: Vec<u64> = Vec::new();
        for (k, &seed) in args.seeds.iter().enumerate() {
            let opts = RunOptions {
                record: i == 0 && k == 0 && args.placements.is_some(),
                diagnose: args.diagnose,
            };
            let r = run_seed(&hosts, &tasks, &profile, *policy, seed, opts);
            if let (Some(path), Some(csv)) = (&args.placements, &r.placements_csv)
                && let Err(e) = std::fs::write(path, csv)
            {
                eprintln!("replay: cannot write {path}: {e}");
                return ExitCode::from(1);
            }
            u100.push(r.unalloc_100);
            u130.push(r.unalloc_130);
            lat.extend(r.latencies_ns);
        }
        let total_s = lat.iter().sum::<u64>() as f64 / 1e9;
        let per_sec = lat.len() as f64 / total_s.max(1e-12);
        lat.sort_unstable();
        let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
        let (m100, s100) = mean_sd(&u100);
        let (m130, s130) = mean_sd(&u130);
        let (p50, p99) = (pct(0.50), pct(0.99));
        if args.json {
            json_rows.push(format!(
                "{{\"policy\":\"{name}\",\"seeds\":{},\"unallocated_pct_100\":{{\"mean\":{m100:.4},\"sd\":{s100:.4}}},\"unallocated_pct_130\":{{\"mean\":{m130:.4},\"sd\":{s130:.4}}},\"decisions_per_sec\":{per_sec:.0},\"p50_us\":{p50:.2},\"p99_us\":{p99:.2}}}",
                args.seeds.len()
            ));
        } else {
            println!(
                "{:<14} {:>12.2} ({:>4.2}) {:>12.2} ({:>4.2}) {:>12.0} {:>9.1} {:>9.1}",
                name, m100, s100, m130, s130, per_sec, p50, p99
            );
        }
    }
    let (mut f100, mut f130, mut shared) = (Vec::new(), Vec::new(), Some(Vec::new()));
    for &seed in &args.seeds {
        let (at_100, at_130) = arrived_demand(&tasks, seed, openb::capacity_milli(&hosts));
        f100.push(floor_any(&hosts, &at_100));
        f130.push(floor_any(&hosts, &at_130));
        // The same for an engine that places every shared task and skips only whole-GPU
        // ones; none when the shared tasks cannot all be placed.
        let shared_placed: Vec<bound::Demand> = at_100
            .iter()
            .map(|d| bound::Demand {
                all_placed: d.share < 1000,
                ..*d
            })
            .collect();
        shared = shared
            .zip(floor(&hosts, &shared_placed))
            .map(|(mut xs, f)| {
                xs.push(f);
                xs
            });
    }
    let ((m100, s100), (m130, s130)) = (mean_sd(&f100), mean_sd(&f130));
    let shared = shared.map(|xs| mean_sd(&xs));
    if args.json {
        let shared = shared.map_or("null".to_owned(), |(m, sd)| {
            format!("{{\"mean\":{m:.4},\"sd\":{sd:.4}}}")
        });
        println!(
            "{{\"results\":[{}],\"floor\":{{\"unallocated_pct_100\":{{\"mean\":{m100:.4},\"sd\":{s100:.4}}},\"unallocated_pct_130\":{{\"mean\":{m130:.4},\"sd\":{s130:.4}}},\"unallocated_pct_100_shared_placed\":{shared}}}}}",
            json_rows.join(",")
        );
    } else {
        println!(
            "{:<14} {:>12.2} ({:>4.2}) {:>12.2} ({:>4.2})   no engine goes below (configuration LP)",
            "floor", m100, s100, m130, s130
        );
        if let Some((m, sd)) = shared {
            println!(
                "{:<14} {:>12.2} ({:>4.2}) {:>20}   nor one that places every shared task",
                "floor, shared", m, sd, ""
            );
        }
    }
    ExitCode::SUCCESS
}

/// `--variants N`: each policy on each generated variant, side by side.
fn run_variants(args: &Args, hosts: &[HostSpec], tasks: &[TraceTask]) -> ExitCode {
    use tessera_placement_lab::variants::{VariantSpec, make_variant};
    println!(
        "replay: {} variants of {} ({} nodes), seeds {:?}; unallocated GPU share in % at 100 % / 130 % arrived",
        args.variants,
        args.tasks,
        hosts.len(),
        args.seeds
    );
    let header: Vec<String> = args
        .policies
        .iter()
        .map(|(n, _)| format!("{n:>17}"))
        .collect();
    println!(
        "{:<4} {:<44} {} {:>17}",
        "var",
        "workload",
        header.join(" "),
        "floor"
    );
    let first = &args.policies[0].0;
    let mut wins = vec![(0u64, 0u64); args.policies.len()];
    for v in args.first_variant..args.first_variant + args.variants {
        let spec = VariantSpec::random(v);
        let variant = make_variant(tasks, hosts, &spec);
        let profile = DemandProfile::from_requests(variant.iter().map(|t| &t.request));
        let results: Vec<(f64, f64)> = args
            .policies
            .iter()
            .map(|(_, policy)| {
                let runs: Vec<SeedResult> = args
                    .seeds
                    .iter()
                    .map(|&seed| {
                        run_seed(
                            hosts,
                            &variant,
                            &profile,
                            *policy,
                            seed,
                            RunOptions {
                                record: false,
                                diagnose: args.diagnose,
                            },
                        )
                    })
                    .collect();
                let n = runs.len() as f64;
                (
                    runs.iter().map(|r| r.unalloc_100).sum::<f64>() / n,
                    runs.iter().map(|r| r.unalloc_130).sum::<f64>() / n,
                )
            })
            .collect();
        for (i, r) in results.iter().enumerate() {
            wins[i].0 += u64::from(results[0].0 <= r.0 + 1e-9);
            wins[i].1 += u64::from(results[0].1 <= r.1 + 1e-9);
        }
        let cells: Vec<String> = results
            .iter()
            .map(|(a, b)| format!("{:>8.2} /{:>7.2}", a, b))
            .collect();
        let n = args.seeds.len() as f64;
        let (f100, f130) = args.seeds.iter().fold((0.0, 0.0), |(a, b), &seed| {
            let (at_100, at_130) = arrived_demand(&variant, seed, openb::capacity_milli(hosts));
            (
                a + floor_any(hosts, &at_100) / n,
                b + floor_any(hosts, &at_130) / n,
            )
        });
        println!(
            "{v:<4} {:<44} {} {:>8.2} /{:>7.2}",
            spec.label(),
            cells.join(" "),
            f100,
            f130
        );
    }
    for (i, (name, _)) in args.policies.iter().enumerate().skip(1) {
        println!(
            "{first} at or below {name}: {} of {} variants at 100 %, {} of {} at 130 %",
            wins[i].0, args.variants, wins[i].1, args.variants
        );
    }
    ExitCode::SUCCESS
}

fn shape_class(t: &TraceTask) -> &'static str {
    match (t.num_gpu, t.gpu_milli) {
        (0, _) => "cpu-only",
        (1, m) if m < 1000 => "shared",
        (1, _) => "one-gpu",
        _ => "multi-gpu",
    }
}

/// Where the unallocated capacity sits when arrivals reach 100 %: on idle GPUs or as
/// fragments of shared GPUs (by size), on hosts short of CPU, and what failed before.
fn print_diagnosis(policy: Policy, seed: u64, engine: &Engine, failed: &BTreeMap<&str, u64>) {
    let snap = engine.snapshot();
    let (mut idle, mut fragments, mut cpu_short) = (0u64, 0u64, 0u64);
    let mut by_size: BTreeMap<u64, u64> = BTreeMap::new();
    // Per model: (GPUs, free share in thousandths).
    let mut by_model: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for h in 0..snap.host_count() as u32 {
        let mut host_free = 0;
        for g in snap.gpus_of(h) {
            let u = snap.gpu_usage(g);
            host_free += u.memory_free.0;
            let m = by_model.entry(snap.gpu_model(g)).or_insert((0, 0));
            m.0 += 1;
            m.1 += u.memory_free.0;
            if u.mode == SharingMode::Idle {
                idle += u.memory_free.0;
            } else if u.memory_free.0 > 0 {
                fragments += u.memory_free.0;
                *by_size.entry(u.memory_free.0 / 100 * 100).or_insert(0) += u.memory_free.0;
            }
        }
        if snap.host_free(h).0.0 < 2000 {
            cpu_short += host_free;
        }
    }
    let gpus = |milli: u64| format!("{:.1}", milli as f64 / 1000.0);
    let sizes: Vec<String> = by_size
        .iter()
        .map(|(k, v)| format!("{k}-{}: {}", k + 99, gpus(*v)))
        .collect();
    let failed: Vec<String> = failed
        .iter()
        .map(|(k, v)| format!("{k} {}", gpus(*v)))
        .collect();
    let models: Vec<String> = by_model
        .iter()
        .map(|(m, (n, free))| {
            format!(
                "{m} {} of {n} ({:.1} %)",
                gpus(*free),
                100.0 * *free as f64 / (*n as f64 * 1000.0)
            )
        })
        .collect();
    println!(
        "  {} seed {seed} at 100%: free GPUs-worth {} idle + {} in fragments [{}]; {} on hosts with < 2 vCPU free; free by GPU model: {}; failed before 100%: {}",
        policy.name(),
        gpus(idle),
        gpus(fragments),
        sizes.join(", "),
        gpus(cpu_short),
        models.join(", "),
        failed.join(", ")
    );
}
