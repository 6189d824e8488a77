//! Why a task fits nowhere: the rejection report, and a request in words.

use super::*;

/// The reason most of host `h`'s GPUs turn `req` down.
pub(super) fn most_common_gpu_reason(
    snap: &Snapshot,
    h: HostIdx,
    req: &TaskRequest,
) -> FilterReason {
    let mut counts: HashMap<FilterReason, u32> = HashMap::new();
    for g in snap.host_gpus(h) {
        if let Err(r) = snap.check_gpu(g, req) {
            *counts.entry(r).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(r, n)| (n, std::cmp::Reverse(r)))
        .map_or(FilterReason::GpuMemory, |(r, _)| r)
}

/// The request in an operator's words.
pub fn describe_request(req: &TaskRequest) -> String {
    let gpu = match req.gpu {
        GpuDemand::None => "no GPU".to_owned(),
        GpuDemand::Whole { count: 1 } => "1 whole GPU".to_owned(),
        GpuDemand::Whole { count } => format!("{count} whole GPUs"),
        GpuDemand::Shared {
            memory,
            compute: Some(c),
        } => format!("1 GPU slot with {memory} and {c} compute"),
        GpuDemand::Shared {
            memory,
            compute: None,
        } => format!("1 GPU slot with {memory}"),
    };
    let mut s = format!("{gpu}, {}, {} host memory", req.cpu, req.memory);
    if !req.constraints.gpu_models.is_empty() {
        s.push_str(&format!(
            ", GPU model {}",
            req.constraints.gpu_models.join(" or ")
        ));
    }
    s
}

impl Engine {
    /// Why `req` fits nowhere: every host and GPU counted by the reason that excluded it.
    pub fn explain(&self, req: &TaskRequest) -> Rejection {
        let mut rejection = Rejection {
            request: describe_request(req),
            hosts_evaluated: 0,
            gpus_evaluated: 0,
            hosts_filtered: Default::default(),
            gpus_filtered: Default::default(),
            largest_free: LargestFree::default(),
            free_by_model: Default::default(),
        };
        for h in 0..self.snap.hosts.len() as HostIdx {
            rejection.hosts_evaluated += 1;
            let host = &self.snap.hosts[h as usize];
            if host.active {
                let lf = &mut rejection.largest_free;
                lf.host_cpu = lf.host_cpu.max(host.cpu_free);
                lf.host_memory = lf.host_memory.max(host.mem_free);
                // Every model's free capacity, whatever this task may use.
                for g in self.snap.host_gpus(h) {
                    let gpu = &self.snap.gpus[g];
                    let model = rejection
                        .free_by_model
                        .entry(self.snap.models[usize::from(gpu.model)].0.clone())
                        .or_default();
                    model.gpus += 1;
                    if gpu.healthy && !gpu.dedicated {
                        model.free_memory = MiB(model.free_memory.0 + gpu.mem_free.0);
                        model.idle_gpus += u32::from(gpu.is_idle());
                    }
                }
            }
            if let Err(reason) = self.snap.check_host(h, req) {
                *rejection.hosts_filtered.entry(reason).or_default() += 1;
                continue;
            }
            let mut fitting = 0u32;
            let mut idle = 0u32;
            for g in self.snap.host_gpus(h) {
                rejection.gpus_evaluated += 1;
                let gpu = &self.snap.gpus[g];
                if gpu.healthy && !gpu.dedicated {
                    let lf = &mut rejection.largest_free;
                    if lf
                        .gpu_memory
                        .as_ref()
                        .is_none_or(|(m, _)| gpu.mem_free > *m)
                    {
                        lf.gpu_memory =
                            Some((gpu.mem_free, format!("{}/GPU {}", host.id, gpu.index)));
                    }
                    lf.gpu_compute =
                        Some(lf.gpu_compute.map_or(ComputeMilli(gpu.compute_free), |c| {
                            c.max(ComputeMilli(gpu.compute_free))
                        }));
                    if gpu.is_idle() {
                        idle += 1;
                    }
                }
                match self.snap.check_gpu(g, req) {
                    Ok(()) => fitting += 1,
                    Err(reason) => *rejection.gpus_filtered.entry(reason).or_default() += 1,
                }
            }
            rejection.largest_free.idle_gpus_on_one_host =
                rejection.largest_free.idle_gpus_on_one_host.max(idle);
            let needed = match req.gpu {
                GpuDemand::None => 0,
                GpuDemand::Whole { count } => count,
                GpuDemand::Shared { .. } => 1,
            };
            if fitting < needed {
                let reason = match req.gpu {
                    GpuDemand::Whole { .. } => FilterReason::NotEnoughIdleGpus,
                    _ => most_common_gpu_reason(&self.snap, h, req),
                };
                *rejection.hosts_filtered.entry(reason).or_default() += 1;
            }
        }
        rejection
    }
}
