//! Binpack's ordered index of hosts by free GPU share: a decision in O(log n).

use super::*;

/// Ordered indexes for binpack: O(log n) best fit.
#[derive(Debug, Clone, Default)]
pub(super) struct BestFitIndex {
    /// (kind, free memory, GPU) of GPUs that can take another shared task.
    shared: BTreeSet<(u16, MiB, u32)>,
    /// (kind of GPU 0, idle GPUs, host) of active hosts.
    idle: BTreeSet<(u16, u32, u32)>,
    /// (free CPU, host) of active hosts.
    cpu: BTreeSet<(MilliCpu, u32)>,
    /// What is in the sets now for each GPU and host, to remove it on change.
    gpu_entry: Vec<Option<(u16, MiB, u32)>>,
    host_entry: Vec<Option<HostEntry>>,
}

impl BestFitIndex {
    pub(super) fn build(snap: &Snapshot) -> Self {
        let mut index = BestFitIndex {
            gpu_entry: vec![None; snap.gpus.len()],
            host_entry: vec![None; snap.hosts.len()],
            ..Default::default()
        };
        for h in 0..snap.hosts.len() as HostIdx {
            index.refresh(snap, h);
        }
        index
    }

    pub(super) fn refresh(&mut self, snap: &Snapshot, h: HostIdx) {
        let active = snap.hosts[h as usize].active;
        for g in snap.host_gpus(h) {
            if let Some(old) = self.gpu_entry[g].take() {
                self.shared.remove(&old);
            }
            if active && snap.gpus[g].free_share() > 0 {
                let entry = (snap.gpus[g].model, snap.gpus[g].mem_free, g as u32);
                self.shared.insert(entry);
                self.gpu_entry[g] = Some(entry);
            }
        }
        if let Some((idle, cpu)) = self.host_entry[h as usize].take() {
            self.idle.remove(&idle);
            self.cpu.remove(&cpu);
        }
        if active {
            let range = snap.host_gpus(h);
            let kind = range.clone().next().map_or(0, |g| snap.gpus[g].model);
            let idle_count = range
                .filter(|&g| snap.gpus[g].is_idle() && snap.gpus[g].healthy)
                .count() as u32;
            let idle = (kind, idle_count, h);
            let cpu = (snap.hosts[h as usize].cpu_free, h);
            self.idle.insert(idle);
            self.cpu.insert(cpu);
            self.host_entry[h as usize] = Some((idle, cpu));
        }
    }
}

impl Engine {
    /// Binpack through the ordered indexes.
    pub(super) fn place_binpack(&mut self, req: &TaskRequest) -> Option<Placement> {
        let kinds = (0..self.snap.models.len() as u16)
            .filter(|&k| req.allows_model(&self.snap.models[k as usize].0));
        match req.gpu {
            GpuDemand::None => {
                let h = self
                    .index
                    .cpu
                    .range((req.cpu, 0)..)
                    .map(|&(_, h)| h)
                    .find(|&h| self.snap.check_host(h, req).is_ok())?;
                self.gpus_on_host(h, req, None)
            }
            GpuDemand::Whole { count } => {
                let mut best: Option<(u32, HostIdx)> = None;
                for kind in kinds {
                    let found = self
                        .index
                        .idle
                        .range((kind, count, 0)..(kind + 1, 0, 0))
                        .find(|&&(_, _, h)| self.host_fits(h, req, count));
                    if let Some(&(_, idle, h)) = found
                        && best.is_none_or(|b| (idle, h) < b)
                    {
                        best = Some((idle, h));
                    }
                }
                self.gpus_on_host(best?.1, req, None)
            }
            GpuDemand::Shared { memory, .. } => {
                let mut best: Option<(MiB, u32)> = None;
                for kind in kinds {
                    let found = self
                        .index
                        .shared
                        .range((kind, memory, 0)..(kind + 1, MiB::ZERO, 0))
                        .find(|&&(_, _, g)| {
                            let h = self.snap.gpus[g as usize].host;
                            self.snap.check_gpu(g as usize, req).is_ok()
                                && self.snap.check_host(h, req).is_ok()
                        });
                    if let Some(&(_, free, g)) = found
                        && best.is_none_or(|b| (free, g) < b)
                    {
                        best = Some((free, g));
                    }
                }
                let g = best?.1 as usize;
                let h = self.snap.gpus[g].host;
                Some(self.snap.make_placement(h, req, &[g]))
            }
        }
    }
}
