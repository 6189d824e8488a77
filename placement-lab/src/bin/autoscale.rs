//! `autoscale`: the autoscaling benchmark over an openb task list with creation and
//! deletion times ([`tessera_placement_lab::autoscale`]).
//!
//! The GPU tasks arrive at their creation times and run for their trace durations once
//! placed, on nodes of the trace's node types that a provider launches with a boot delay.
//! In one run: the lower bound (at each instant the fewest GPUs that hold the live tasks),
//! a static fleet (the nodes a fleet growing for every task that waits ends with, there
//! from the start), a cluster-autoscaler-like rule, Tessera's capacity-provider rule as
//! the control plane applies it (`tessera`: what-if sizing, and consolidation of hosts
//! not needed for the scale-in cooldown), and beside it the rule without consolidation
//! (`tessera-no-consolidation`). Prints, per rule, GPU-hours provisioned (launch
//! request to termination, booting
//! included), against the bound and against the cluster-autoscaler-like rule, time
//! waiting for room (p50, p99), tasks placed and never placed, nodes launched and
//! terminated, the most nodes at once and tasks moved; then the goals, PASS or MISS. It
//! is a benchmark: it exits 0 whatever the figures.
//!
//! ```text
//! autoscale --nodes FILE --tasks FILE [--boot-delay 300] [--pass 1] [--limit N] [--json]
//!           [--node-choice smallest|roomy] [--placement default]
//!           [--target-capacity 100] [--scale-out-cooldown 0] [--scale-in-cooldown 600]
//! ```
//!
//! `--pass` defaults to the control plane's reconcile tick (1 s), which runs the provider
//! pass; the provider settings (`--target-capacity`, the cooldowns) and Tessera's
//! placement policy default to the product's. `--node-choice` is how every rule picks
//! between node types that place as much with as few GPUs: `smallest` (least CPU, then
//! memory: Cluster Autoscaler's least-waste) or `roomy` (most CPU, then memory, per GPU).
//! `--limit N` keeps the first N GPU tasks by creation time.

use std::process::ExitCode;
use std::time::Instant;
use tessera_placement_lab::autoscale::{self, Config, Report, Row, Workload};
use tessera_placement_lab::openb;

const USAGE: &str =
    "usage: autoscale --nodes FILE --tasks FILE [--boot-delay 300] [--pass 1] [--limit N] [--json]
                 [--node-choice smallest|roomy] [--placement default]
                 [--target-capacity 100] [--scale-out-cooldown 0] [--scale-in-cooldown 600]";

/// Tessera's goals: within this share above the lower bound, at least this share below
/// the cluster-autoscaler-like rule.
const WITHIN_BOUND: f64 = 0.15;
const BELOW_CA: f64 = 0.20;
/// The rows the goals are read on: the product's rule, and the rule without
/// consolidation beside it.
const TESSERA_ROWS: [&str; 2] = ["tessera", "tessera-no-consolidation"];

struct Args {
    nodes: String,
    tasks: String,
    limit: Option<usize>,
    json: bool,
    config: Config,
}

fn number<T: std::str::FromStr>(flag: &str, value: Option<String>) -> Result<T, String> {
    let v = value.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a whole number"))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        nodes: String::new(),
        tasks: String::new(),
        limit: None,
        json: false,
        config: Config::new(300, 1),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let c = &mut args.config;
        match flag.as_str() {
            "--nodes" => args.nodes = it.next().ok_or("--nodes needs a value")?,
            "--tasks" => args.tasks = it.next().ok_or("--tasks needs a value")?,
            "--boot-delay" => c.boot_delay = number("--boot-delay", it.next())?,
            "--pass" => {
                c.pass = number("--pass", it.next())?;
                if c.pass == 0 {
                    return Err("--pass: at least 1 second".into());
                }
            }
            "--limit" => args.limit = Some(number("--limit", it.next())?),
            "--json" => args.json = true,
            "--node-choice" => {
                let name = it.next().ok_or("--node-choice needs a value")?;
                c.node_choice = autoscale::NodeChoice::parse(&name)
                    .ok_or_else(|| format!("--node-choice: {name:?} is not smallest or roomy"))?;
            }
            "--placement" => {
                let name = it.next().ok_or("--placement needs a value")?;
                c.placement = tessera_placement::Policy::parse(&name)
                    .ok_or_else(|| format!("--placement: unknown policy {name:?}"))?;
            }
            "--target-capacity" => {
                let t: u32 = number("--target-capacity", it.next())?;
                if !(1..=100).contains(&t) {
                    return Err("--target-capacity: a percentage from 1 to 100".into());
                }
                c.provider.target_capacity_percent = t;
            }
            "--scale-out-cooldown" => {
                c.provider.scale_out_cooldown_secs = number("--scale-out-cooldown", it.next())?
            }
            "--scale-in-cooldown" => {
                c.provider.scale_in_cooldown_secs = number("--scale-in-cooldown", it.next())?
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

fn main() -> ExitCode {
    let started = Instant::now();
    let args = match parse_args() {
        Ok(a) => a,
        Err(msg) => {
            if !msg.is_empty() {
                eprintln!("autoscale: {msg}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let loaded = openb::load(&args.nodes, &args.tasks).and_then(|(hosts, tasks)| {
        autoscale::workload(&hosts, &tasks, args.limit).map_err(|e| match e {
            autoscale::WorkloadError::NoGpuNode => format!("{}: {e}", args.nodes),
            autoscale::WorkloadError::NoCreationTime { .. } => format!("{}: {e}", args.tasks),
        })
    });
    let w = match loaded {
        Ok(w) => w,
        Err(msg) => {
            eprintln!("autoscale: {msg}");
            return ExitCode::from(1);
        }
    };
    let report = autoscale::run(&w, &args.config);
    let wall = started.elapsed().as_secs_f64();
    if args.json {
        println!("{}", json(&args, &w, &report, wall));
    } else {
        print_text(&args, &w, &report, wall);
    }
    ExitCode::SUCCESS
}

/// The goals for rule `name` (a Tessera row): (what, its figure in words, met).
fn goals(cfg: &Config, r: &Report, name: &str) -> Vec<(String, String, bool)> {
    let tessera = row(r, name);
    let ca = row(r, "ca-like");
    let ratio = tessera.gpu_hours / r.lower_gpu_hours.max(1e-9);
    let fewer = 1.0 - tessera.gpu_hours / ca.gpu_hours.max(1e-9);
    let limit = cfg.boot_delay + cfg.pass;
    let p99 = tessera.wait_percentile(99.0);
    vec![
        (
            format!(
                "{name} within {:.0} % of the lower bound",
                WITHIN_BOUND * 100.0
            ),
            format!("{:+.1} %", (ratio - 1.0) * 100.0),
            ratio <= 1.0 + WITHIN_BOUND,
        ),
        (
            format!(
                "{name} at least {:.0} % fewer GPU-hours than ca-like",
                BELOW_CA * 100.0
            ),
            format!("{:.1} % fewer", fewer * 100.0),
            fewer >= BELOW_CA,
        ),
        (
            format!("{name} wait p99 at most boot delay + one pass ({limit} s)"),
            format!("{p99} s"),
            p99 <= limit,
        ),
    ]
}

fn row<'a>(r: &'a Report, name: &str) -> &'a Row {
    r.rows
        .iter()
        .find(|x| x.policy == name)
        .expect("every rule runs")
}

fn print_text(args: &Args, w: &Workload, r: &Report, wall: f64) {
    print_header(args, w, r);
    print_table(w, r);
    print_details(w, r);
    print_goals(&args.config, r);
    println!("wall time: {wall:.1} s (the rules run side by side, in threads)");
}

/// What was replayed, and each rule's settings.
fn print_header(args: &Args, w: &Workload, r: &Report) {
    let c = &args.config;
    println!(
        "autoscale: {} GPU tasks of {} ({} without GPUs skipped, {} that no node type holds, {} beyond --limit); {:.0} h of trace; boot delay {} s, pass {} s",
        w.jobs.len(),
        args.tasks,
        w.cpu_only,
        w.unfit.len(),
        w.beyond_limit,
        w.trace_end
            .saturating_sub(w.jobs.first().map_or(0, |j| j.created)) as f64
            / 3600.0,
        c.boot_delay,
        c.pass
    );
    let types: Vec<String> = w.types.iter().map(|t| t.label()).collect();
    println!(
        "node types ({} of {}): {}",
        w.types.len(),
        args.nodes,
        types.join(", ")
    );
    println!(
        "node choice {}; tessera: placement {}, target capacity {} %, scale-out cooldown {} s, scale-in cooldown {} s; ca-like: best fit, under {} % allocated for {} s; static: {} GPUs",
        c.node_choice.name(),
        c.placement.name(),
        c.provider.target_capacity_percent,
        c.provider.scale_out_cooldown_secs,
        c.provider.scale_in_cooldown_secs,
        c.ca_threshold_pct,
        c.ca_unneeded_secs,
        r.static_gpus
    );
}

/// One row per rule.
fn print_table(w: &Workload, r: &Report) {
    println!(
        "{:<24} {:>10} {:>8} {:>11} {:>7} {:>7} {:>7} {:>6} {:>8} {:>8} {:>6} {:>6} {:>7}",
        "policy",
        "GPU-hours",
        "× bound",
        "vs ca-like",
        "p50 s",
        "p99 s",
        "placed",
        "never",
        "launched",
        "termin.",
        "peak",
        "moves",
        "wall s"
    );
    let ca = row(r, "ca-like").gpu_hours;
    let fewer = |h: f64| format!("{:+.1} %", (h / ca.max(1e-9) - 1.0) * 100.0);
    println!(
        "{:<24} {:>10.1} {:>8.3} {:>11} {:>7} {:>7} {:>7} {:>6} {:>8} {:>8} {:>6} {:>6} {:>7}",
        "lower-bound",
        r.lower_gpu_hours,
        1.0,
        fewer(r.lower_gpu_hours),
        0,
        0,
        w.jobs.len(),
        0,
        "-",
        "-",
        "-",
        "-",
        "-"
    );
    for x in &r.rows {
        println!(
            "{:<24} {:>10.1} {:>8.3} {:>11} {:>7} {:>7} {:>7} {:>6} {:>8} {:>8} {:>6} {:>6} {:>7.1}",
            x.policy,
            x.gpu_hours,
            x.gpu_hours / r.lower_gpu_hours.max(1e-9),
            fewer(x.gpu_hours),
            x.wait_percentile(50.0),
            x.wait_percentile(99.0),
            x.waits.len(),
            x.never_placed,
            x.paid.launched,
            x.paid.terminated,
            x.paid.peak_nodes,
            x.paid.moves,
            x.wall.as_secs_f64()
        );
    }
}

/// Where each rule's GPU-hours went, and the node types it launched.
fn print_details(w: &Workload, r: &Report) {
    println!(
        "where the GPU-hours went (booting / ready and empty / unallocated on busy nodes / allocated):"
    );
    for x in &r.rows {
        let (booting, empty, unallocated, allocated) = breakdown(x);
        println!(
            "  {:<24} {booting:>9.1} / {empty:>9.1} / {unallocated:>9.1} / {allocated:>9.1}",
            x.policy
        );
    }
    println!("nodes launched by type:");
    for x in &r.rows {
        let used: Vec<String> = launched_by_type(w, x)
            .into_iter()
            .map(|(label, n)| format!("{label} {n}"))
            .collect();
        println!("  {:<24} {}", x.policy, used.join(", "));
    }
}

/// The goals, PASS or MISS.
fn print_goals(c: &Config, r: &Report) {
    for (what, figure, met) in TESSERA_ROWS.iter().flat_map(|name| goals(c, r, name)) {
        println!(
            "goal: {what}: {figure}: {}",
            if met { "PASS" } else { "MISS" }
        );
    }
    let floor = 1.0 - r.lower_gpu_hours / row(r, "ca-like").gpu_hours.max(1e-9);
    if floor < BELOW_CA {
        println!(
            "note: the lower bound itself is {:.1} % below ca-like: no rule can be {:.0} % below it on this trace",
            floor * 100.0,
            BELOW_CA * 100.0
        );
    }
}

/// GPU-hours booting, on ready nodes running nothing, unallocated on nodes running
/// tasks, and allocated.
fn breakdown(x: &Row) -> (f64, f64, f64, f64) {
    let p = &x.paid;
    let h = |s: u128| s as f64 / 3600.0;
    let allocated = p.allocated_gpu_seconds / 3600.0;
    (
        h(p.booting_gpu_seconds),
        h(p.empty_gpu_seconds),
        h(p.busy_gpu_seconds) - allocated,
        allocated,
    )
}

/// The node types a rule launched, with how many of each.
fn launched_by_type(w: &Workload, x: &Row) -> Vec<(String, usize)> {
    x.by_type
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(t, n)| (w.types[t].label(), *n))
        .collect()
}

/// A JSON string literal.
fn quoted(s: &str) -> String {
    let mut out = String::from('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json(args: &Args, w: &Workload, r: &Report, wall: f64) -> String {
    let c = &args.config;
    let rows: Vec<String> = r
        .rows
        .iter()
        .map(|x| {
            let (booting, empty, unallocated, allocated) = breakdown(x);
            let by_type: Vec<String> = launched_by_type(w, x)
                .into_iter()
                .map(|(label, n)| format!("{}:{n}", quoted(&label)))
                .collect();
            format!(
                "{{\"policy\":{},\"gpu_hours\":{:.3},\"booting_gpu_hours\":{booting:.3},\"empty_gpu_hours\":{empty:.3},\"unallocated_gpu_hours\":{unallocated:.3},\"allocated_gpu_hours\":{allocated:.3},\"ratio_to_bound\":{:.5},\"wait_p50_s\":{},\"wait_p99_s\":{},\"placed\":{},\"never_placed\":{},\"launched\":{},\"terminated\":{},\"peak_nodes\":{},\"moves\":{},\"launched_by_type\":{{{}}},\"wall_s\":{:.3}}}",
                quoted(x.policy),
                x.gpu_hours,
                x.gpu_hours / r.lower_gpu_hours.max(1e-9),
                x.wait_percentile(50.0),
                x.wait_percentile(99.0),
                x.waits.len(),
                x.never_placed,
                x.paid.launched,
                x.paid.terminated,
                x.paid.peak_nodes,
                x.paid.moves,
                by_type.join(","),
                x.wall.as_secs_f64()
            )
        })
        .collect();
    let goals: Vec<String> = TESSERA_ROWS
        .iter()
        .flat_map(|name| goals(c, r, name))
        .map(|(what, figure, met)| {
            format!(
                "{{\"goal\":{},\"figure\":{},\"met\":{met}}}",
                quoted(&what),
                quoted(&figure)
            )
        })
        .collect();
    format!(
        "{{\"nodes\":{},\"tasks\":{},\"gpu_tasks\":{},\"skipped_without_gpu\":{},\"unfit\":{},\"beyond_limit\":{},\"node_types\":{},\"boot_delay_s\":{},\"pass_s\":{},\"node_choice\":{},\"placement\":{},\"target_capacity_percent\":{},\"scale_out_cooldown_s\":{},\"scale_in_cooldown_s\":{},\"static_gpus\":{},\"lower_bound_gpu_hours\":{:.3},\"results\":[{}],\"goals\":[{}],\"wall_s\":{wall:.3}}}",
        quoted(&args.nodes),
        quoted(&args.tasks),
        w.jobs.len(),
        w.cpu_only,
        w.unfit.len(),
        w.beyond_limit,
        w.types.len(),
        c.boot_delay,
        c.pass,
        quoted(c.node_choice.name()),
        quoted(c.placement.name()),
        c.provider.target_capacity_percent,
        c.provider.scale_out_cooldown_secs,
        c.provider.scale_in_cooldown_secs,
        r.static_gpus,
        r.lower_gpu_hours,
        rows.join(","),
        goals.join(",")
    )
}
