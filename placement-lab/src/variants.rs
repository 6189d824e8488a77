//! Workload variants of a trace, made with a seed, to tune and test placement on workloads
//! it was not tuned on: a share of GPU tasks pinned to GPU models (in proportion to each
//! model's GPU count, as the published openb variants were made), CPU-only tasks scaled,
//! and the mix of shared, single-GPU and multi-GPU tasks changed.

use crate::openb::TraceTask;
use std::collections::BTreeMap;
use tessera_placement::request::GpuDemand;
use tessera_placement::rng::Rng;
use tessera_placement::snapshot::HostSpec;

/// How a variant differs from its source trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VariantSpec {
    pub seed: u64,
    /// Share of GPU tasks pinned to one GPU model (0 to 1).
    pub pin_share: f64,
    /// CPU-only tasks, as a multiple of the source's count.
    pub cpu_factor: f64,
    /// Share of GPU tasks that share a GPU (0 to 1).
    pub shared_share: f64,
    /// Share of whole-GPU tasks that ask for more than one GPU (0 to 1).
    pub multi_share: f64,
}

impl VariantSpec {
    /// A variant drawn from the ranges the benchmark covers: pinning 10–50 %, CPU-only
    /// tasks 1–3×, shared 20–100 %, multi-GPU 20–50 % of whole-GPU tasks.
    pub fn random(seed: u64) -> VariantSpec {
        let mut rng = Rng::new(seed ^ 0x5eed_a11a);
        let mut unit = || rng.below(1_000_001) as f64 / 1_000_000.0;
        VariantSpec {
            seed,
            pin_share: 0.1 + 0.4 * unit(),
            cpu_factor: 1.0 + 2.0 * unit(),
            shared_share: 0.2 + 0.8 * unit(),
            multi_share: 0.2 + 0.3 * unit(),
        }
    }

    /// The mix `tasks` has (its share of pinned, shared and multi-GPU tasks), with its
    /// CPU-only tasks scaled by `cpu_factor`: with a large factor, a variant in which host
    /// CPU rather than GPU is what runs short.
    pub fn of_trace(tasks: &[TraceTask], seed: u64, cpu_factor: f64) -> VariantSpec {
        let gpu: Vec<&TraceTask> = tasks
            .iter()
            .filter(|t| t.request.gpu != GpuDemand::None)
            .collect();
        let share = |f: &dyn Fn(&TraceTask) -> bool, of: &[&TraceTask]| {
            if of.is_empty() {
                0.0
            } else {
                of.iter().filter(|t| f(t)).count() as f64 / of.len() as f64
            }
        };
        let whole: Vec<&TraceTask> = gpu
            .iter()
            .copied()
            .filter(|t| matches!(t.request.gpu, GpuDemand::Whole { .. }))
            .collect();
        VariantSpec {
            seed,
            pin_share: share(&|t| !t.request.constraints.gpu_models.is_empty(), &gpu),
            cpu_factor,
            shared_share: share(&|t| matches!(t.request.gpu, GpuDemand::Shared { .. }), &gpu),
            multi_share: share(
                &|t| matches!(t.request.gpu, GpuDemand::Whole { count } if count > 1),
                &whole,
            ),
        }
    }

    /// `pin 30% · cpu 2.0× · shared 60% · multi 25%`.
    pub fn label(&self) -> String {
        format!(
            "pin {:.0}% · cpu {:.1}× · shared {:.0}% · multi {:.0}%",
            self.pin_share * 100.0,
            self.cpu_factor,
            self.shared_share * 100.0,
            self.multi_share * 100.0
        )
    }
}

fn pick<'a>(rng: &mut Rng, pool: &[&'a TraceTask], n: usize) -> Vec<&'a TraceTask> {
    if pool.is_empty() {
        return Vec::new();
    }
    (0..n).map(|_| pool[rng.below(pool.len())]).collect()
}

/// A variant of `tasks` (on `hosts`) as `spec` says; the same spec gives the same variant.
/// GPU tasks keep their number; each class is sampled with replacement from the source's
/// tasks of that class.
pub fn make_variant(tasks: &[TraceTask], hosts: &[HostSpec], spec: &VariantSpec) -> Vec<TraceTask> {
    let mut rng = Rng::new(spec.seed);
    let class = |t: &TraceTask| match t.request.gpu {
        GpuDemand::None => 0,
        GpuDemand::Shared { .. } => 1,
        GpuDemand::Whole { count: 1 } => 2,
        GpuDemand::Whole { .. } => 3,
    };
    let of = |k| tasks.iter().filter(|t| class(t) == k).collect::<Vec<_>>();
    let (cpu, shared, single, multi) = (of(0), of(1), of(2), of(3));
    let gpu_tasks = shared.len() + single.len() + multi.len();
    let n_shared = (spec.shared_share.clamp(0.0, 1.0) * gpu_tasks as f64).round() as usize;
    let whole = gpu_tasks - n_shared;
    let n_multi = (spec.multi_share.clamp(0.0, 1.0) * whole as f64).round() as usize;
    let n_cpu = (spec.cpu_factor.max(0.0) * cpu.len() as f64).round() as usize;
    let mut out: Vec<TraceTask> = Vec::new();
    out.extend(pick(&mut rng, &cpu, n_cpu).into_iter().cloned());
    let mut gpu: Vec<TraceTask> = Vec::new();
    gpu.extend(pick(&mut rng, &shared, n_shared).into_iter().cloned());
    gpu.extend(
        pick(&mut rng, &single, whole - n_multi)
            .into_iter()
            .cloned(),
    );
    gpu.extend(pick(&mut rng, &multi, n_multi).into_iter().cloned());
    // GPU models by their GPU count, and the most GPUs one host of each model has.
    let mut models: BTreeMap<String, (usize, u32)> = BTreeMap::new();
    for h in hosts {
        for g in &h.gpus {
            let e = models.entry(g.model.clone()).or_default();
            e.0 += 1;
            e.1 = e.1.max(h.gpus.len() as u32);
        }
    }
    let models: Vec<(String, usize, u32)> = models
        .into_iter()
        .map(|(m, (n, most))| (m, n, most))
        .collect();
    for t in &mut gpu {
        t.request.constraints.gpu_models.clear();
        if rng.below(1_000_000) as f64 >= spec.pin_share * 1_000_000.0 {
            continue;
        }
        let needs = match t.request.gpu {
            GpuDemand::Whole { count } => count,
            _ => 1,
        };
        let fitting: Vec<&(String, usize, u32)> = models
            .iter()
            .filter(|(_, _, most)| *most >= needs)
            .collect();
        let total: usize = fitting.iter().map(|(_, n, _)| n).sum();
        if total == 0 {
            continue;
        }
        let mut r = rng.below(total);
        for (m, n, _) in fitting {
            if r < *n {
                t.request.constraints.gpu_models = vec![m.clone()];
                break;
            }
            r -= n;
        }
    }
    out.extend(gpu);
    rng.shuffle(&mut out);
    for (i, t) in out.iter_mut().enumerate() {
        t.row = i;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openb::{parse_nodes, parse_tasks};

    fn sample() -> (Vec<HostSpec>, Vec<TraceTask>) {
        let hosts = parse_nodes(
            "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model\na,64000,262144,8,V100\nb,64000,262144,2,T4\nc,64000,262144,2,T4\n",
        )
        .expect("nodes");
        let mut csv = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
        for i in 0..100 {
            let (n, m) = match i % 4 {
                0 => (0, 0),
                1 => (1, 500),
                2 => (1, 1000),
                _ => (4, 1000),
            };
            csv.push_str(&format!("p{i},1000,1024,{n},{m},\n"));
        }
        (hosts, parse_tasks("t.csv", &csv).expect("tasks"))
    }

    #[test]
    fn a_variant_has_the_mix_it_asks_for_and_the_same_seed_gives_the_same_one() {
        let (hosts, tasks) = sample();
        let spec = VariantSpec {
            seed: 7,
            pin_share: 0.5,
            cpu_factor: 2.0,
            shared_share: 0.6,
            multi_share: 0.25,
        };
        let v = make_variant(&tasks, &hosts, &spec);
        let count = |f: &dyn Fn(&TraceTask) -> bool| v.iter().filter(|t| f(t)).count();
        assert_eq!(count(&|t| t.request.gpu == GpuDemand::None), 50, "2 × 25");
        let gpu = count(&|t| t.request.gpu != GpuDemand::None);
        assert_eq!(gpu, 75, "GPU tasks keep their number");
        assert_eq!(
            count(&|t| matches!(t.request.gpu, GpuDemand::Shared { .. })),
            45
        );
        assert_eq!(
            count(&|t| matches!(t.request.gpu, GpuDemand::Whole { count } if count > 1)),
            8
        );
        let pinned = count(&|t| !t.request.constraints.gpu_models.is_empty());
        assert!((25..=50).contains(&pinned), "about half of 75: {pinned}");
        // A 4-GPU task is only pinned to a model whose hosts have 4 GPUs.
        assert!(
            v.iter()
                .all(|t| !matches!(t.request.gpu, GpuDemand::Whole { count: 4 })
                    || t.request.constraints.gpu_models.iter().all(|m| m == "V100"))
        );
        assert_eq!(make_variant(&tasks, &hosts, &spec), v, "deterministic");
        assert_ne!(
            make_variant(&tasks, &hosts, &VariantSpec { seed: 8, ..spec }),
            v
        );
        let rows: Vec<usize> = v.iter().map(|t| t.row).collect();
        assert_eq!(rows, (0..v.len()).collect::<Vec<_>>());
    }

    #[test]
    fn a_variant_of_the_trace_keeps_its_mix_and_scales_its_cpu_only_tasks() {
        let (hosts, tasks) = sample();
        let spec = VariantSpec::of_trace(&tasks, 3, 4.0);
        assert_eq!(spec.pin_share, 0.0);
        assert!((spec.shared_share - 1.0 / 3.0).abs() < 1e-9, "{spec:?}");
        assert!((spec.multi_share - 0.5).abs() < 1e-9, "{spec:?}");
        let v = make_variant(&tasks, &hosts, &spec);
        let cpu_only = v
            .iter()
            .filter(|t| t.request.gpu == GpuDemand::None)
            .count();
        assert_eq!(
            (cpu_only, v.len() - cpu_only),
            (100, 75),
            "4 × 25, and 75 GPU tasks"
        );
    }

    #[test]
    fn random_specs_stay_in_their_ranges() {
        for seed in 0..200 {
            let s = VariantSpec::random(seed);
            assert!((0.1..=0.5).contains(&s.pin_share), "{s:?}");
            assert!((1.0..=3.0).contains(&s.cpu_factor), "{s:?}");
            assert!((0.2..=1.0).contains(&s.shared_share), "{s:?}");
            assert!((0.2..=0.5).contains(&s.multi_share), "{s:?}");
        }
        assert_ne!(VariantSpec::random(1), VariantSpec::random(2));
        // Spread over the ranges, not bunched.
        let mean = (0..400)
            .map(|seed| VariantSpec::random(seed).pin_share)
            .sum::<f64>()
            / 400.0;
        assert!((0.27..0.33).contains(&mean), "pinning averages {mean}");
    }
}
