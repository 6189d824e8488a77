//! `consolidate`: the consolidation benchmark over the Alibaba openb trace.
//!
//! Places every task of the trace in creation order with the chosen policy, then lets
//! tasks leave in the order of their deletion times until half of them have left, then
//! plans consolidation to free whole GPUs. Prints what the churn left
//! (partly used GPUs and the bound: their free GPU share, in whole GPUs), then the plan:
//! GPUs freed against the bound, moves, and planning time. A baseline runs beside it in
//! the same run: the same planner with the most used GPUs tried first.
//!
//! ```text
//! consolidate --nodes FILE --tasks FILE [--policy NAME] [--leave-share 0.5]
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;
use tessera_placement::consolidate::{Goal, Movable, gpu_bound, plan};
use tessera_placement::{DemandProfile, Engine, Placement, Policy, PoolLimits, Snapshot};
use tessera_placement_lab::openb;

const USAGE: &str =
    "usage: consolidate --nodes FILE --tasks FILE [--policy NAME] [--leave-share 0.5]";

fn main() -> ExitCode {
    let mut nodes = String::new();
    let mut tasks_path = String::new();
    let mut policy = ("default".to_owned(), Policy::Fragmentation);
    let mut leave_share = 0.5f64;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_default();
        match flag.as_str() {
            "--nodes" => nodes = value(),
            "--tasks" => tasks_path = value(),
            "--policy" => {
                let name = value();
                match Policy::parse(&name) {
                    Some(p) => policy = (name, p),
                    None => {
                        eprintln!("consolidate: unknown policy {name:?}\n{USAGE}");
                        return ExitCode::from(2);
                    }
                }
            }
            "--leave-share" => match value().parse::<f64>() {
                Ok(s) if (0.0..1.0).contains(&s) => leave_share = s,
                _ => {
                    eprintln!(
                        "consolidate: --leave-share takes a number from 0 to below 1\n{USAGE}"
                    );
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("consolidate: unknown argument {flag:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    if nodes.is_empty() || tasks_path.is_empty() {
        eprintln!("consolidate: --nodes and --tasks are required\n{USAGE}");
        return ExitCode::from(2);
    }
    let read = |p: &str| std::fs::read_to_string(p).map_err(|e| format!("cannot read {p}: {e}"));
    let loaded = read(&nodes).and_then(|n| {
        let t = read(&tasks_path)?;
        Ok((
            openb::parse_nodes(&nodes, &n).map_err(|e| e.to_string())?,
            openb::parse_tasks(&tasks_path, &t).map_err(|e| e.to_string())?,
        ))
    });
    let (hosts, tasks) = match loaded {
        Ok(x) => x,
        Err(e) => {
            eprintln!("consolidate: {e}");
            return ExitCode::from(1);
        }
    };
    if tasks.iter().any(|t| t.created.is_none()) {
        eprintln!("consolidate: {tasks_path} has no creation_time for every task");
        return ExitCode::from(1);
    }
    let profile = DemandProfile::from_requests(tasks.iter().map(|t| &t.request));
    let mut engine = Engine::new(
        Snapshot::new(hosts.clone(), PoolLimits::default()),
        policy.1,
        &profile,
        42,
    );
    // Every task arrives, in creation order; then tasks leave in deletion order until the
    // share asked for has left. (Interleaved in the trace's own times, tasks leave so soon
    // after arriving that a few dozen are live when half have left: nothing to consolidate.)
    let mut arrivals: Vec<usize> = (0..tasks.len()).collect();
    arrivals.sort_by_key(|&i| (tasks[i].created, i));
    let mut live: BTreeMap<usize, Placement> = BTreeMap::new();
    let (mut placed, mut left, mut refused) = (0usize, 0usize, 0usize);
    for i in arrivals {
        match engine.try_place(&tasks[i].request) {
            Some(p) => {
                engine.assign(&p).expect("fits");
                live.insert(i, p);
                placed += 1;
            }
            None => refused += 1,
        }
    }
    let mut departures: Vec<usize> = live.keys().copied().collect();
    departures.sort_by_key(|&i| (tasks[i].deleted.unwrap_or(u64::MAX), i));
    let leaving = (leave_share * placed as f64).round() as usize;
    for i in departures.into_iter().take(leaving) {
        let p = live.remove(&i).expect("live");
        engine.release(&p).expect("held");
        left += 1;
    }
    let snap = engine.snapshot();
    let partly = (0..snap.gpu_count() as u32)
        .filter(|&g| snap.gpu_usage(g).mode == tessera_model::SharingMode::Mps)
        .count();
    let bound = gpu_bound(snap);
    let ideal = ideal_repack(snap, &live, &tasks);
    println!(
        "consolidate: {} nodes, {} GPUs; {} tasks in the trace, {placed} placed by {} ({refused} refused), {left} left; {} live",
        hosts.len(),
        snap.gpu_count(),
        tasks.len(),
        policy.0,
        live.len()
    );
    println!(
        "after churn: {partly} partly used GPUs; bound (their free share, in whole GPUs): {bound}; \
         an ideal repack of their tasks (first fit decreasing, GPU share only) frees {ideal}"
    );
    let movable: Vec<Movable> = live
        .iter()
        .map(|(&i, p)| Movable {
            placement: p.clone(),
            request: tasks[i].request.clone(),
            group: 0,
            fixed: false,
        })
        .collect();
    println!(
        "{:<28} {:>11} {:>10} {:>10} {:>8} {:>12}",
        "planner", "GPUs freed", "of bound", "of ideal", "moves", "plan time"
    );
    let mut exit = ExitCode::SUCCESS;
    for (name, least_first) in [
        ("least used first (Tessera)", true),
        ("most used first (baseline)", false),
    ] {
        let mut e = engine.clone();
        let started = Instant::now();
        let out = if least_first {
            plan(&mut e, &movable, Goal::Gpus, usize::MAX)
        } else {
            tessera_placement::consolidate::plan_ordered(
                &mut e,
                &movable,
                Goal::Gpus,
                usize::MAX,
                false,
            )
        };
        let took = started.elapsed();
        let share = if bound == 0 {
            100.0
        } else {
            100.0 * out.freed_gpus.len() as f64 / bound as f64
        };
        let of_ideal = if ideal == 0 {
            100.0
        } else {
            100.0 * out.freed_gpus.len() as f64 / ideal as f64
        };
        println!(
            "{name:<28} {:>11} {:>9.1}% {:>9.1}% {:>8} {:>9.0} ms",
            out.freed_gpus.len(),
            share,
            of_ideal,
            out.moves.len(),
            took.as_secs_f64() * 1000.0
        );
        if out.moves.iter().any(|m| m.from == m.to) {
            eprintln!("consolidate: a move that goes nowhere");
            exit = ExitCode::from(1);
        }
    }
    exit
}

/// GPUs an ideal repack would free: the shared tasks of partly used GPUs packed afresh
/// by first fit decreasing on GPU share alone (no host CPU, no GPU model, no move order).
fn ideal_repack(
    snap: &Snapshot,
    live: &BTreeMap<usize, Placement>,
    tasks: &[openb::TraceTask],
) -> usize {
    let partly: std::collections::HashSet<u32> = (0..snap.gpu_count() as u32)
        .filter(|&g| snap.gpu_usage(g).mode == tessera_model::SharingMode::Mps)
        .collect();
    let mut items: Vec<u32> = live
        .iter()
        .filter(|(_, p)| p.gpus.len() == 1 && partly.contains(&p.gpus[0].gpu))
        .map(|(&i, _)| tasks[i].gpu_milli)
        .collect();
    items.sort_unstable_by(|a, b| b.cmp(a));
    let mut bins: Vec<u32> = Vec::new();
    for it in items {
        match bins.iter_mut().find(|b| **b + it <= 1000) {
            Some(b) => *b += it,
            None => bins.push(it),
        }
    }
    partly.len().saturating_sub(bins.len())
}
