//! Measured use received from agents and not written yet, gathered into buckets.

use crate::store::UsageRow;
use std::collections::HashMap;
use tessera_model::agent::TaskReport;
use tessera_model::service::Task;
use tessera_model::work::{LatencyBucket, WorkReport, histogram_quantile};
use tessera_model::{HostId, MiB};

/// SM use samples of one bucket, as a histogram over 0..=100 %: exact percentiles in
/// bounded memory.
#[derive(Debug, Clone)]
struct SmHistogram([u32; 101]);

impl Default for SmHistogram {
    fn default() -> Self {
        SmHistogram([0; 101])
    }
}

impl SmHistogram {
    fn add(&mut self, pct: u32) {
        self.0[pct.min(100) as usize] += 1;
    }

    fn count(&self) -> u64 {
        self.0.iter().map(|&c| u64::from(c)).sum()
    }

    /// Nearest-rank percentile `q`.
    fn percentile(&self, q: u32) -> Option<u32> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let rank = (u64::from(q.min(100)) * n).div_ceil(100).max(1);
        let mut seen = 0;
        for (pct, &c) in self.0.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return Some(pct as u32);
            }
        }
        Some(100)
    }

    fn max(&self) -> Option<u32> {
        self.0.iter().rposition(|&c| c > 0).map(|p| p as u32)
    }
}

/// One open bucket.
#[derive(Debug, Clone)]
struct Bucket {
    service: String,
    task_definition: tessera_model::service::TaskDefRef,
    host: Option<HostId>,
    memory_max: MiB,
    memory_last: MiB,
    sm: SmHistogram,
    samples: u32,
    memory_errors: u32,
    work: WorkAcc,
}

/// The work of one bucket: the intervals' sums and their merged latency histogram.
#[derive(Debug, Clone, Default)]
struct WorkAcc {
    secs: f64,
    completed: f64,
    errors: Option<f64>,
    /// Cumulative counts by upper bound (`f64::to_bits`; `+Inf` as `u64::MAX`).
    latency: std::collections::BTreeMap<u64, f64>,
    /// Percentiles put back after a failed write (their histogram is not kept).
    kept: [Option<f64>; 3],
    /// The services sharing its GPU: `Some` while every sample saw the same ones.
    neighbours: Option<Option<Vec<String>>>,
}

impl WorkAcc {
    fn add(&mut self, sample: &tessera_model::work::WorkSample) {
        self.secs += sample.interval_secs;
        self.completed += sample.completed;
        if let Some(e) = sample.errors {
            *self.errors.get_or_insert(0.0) += e;
        }
        for b in &sample.latency {
            let key = b.le.map_or(u64::MAX, f64::to_bits);
            *self.latency.entry(key).or_insert(0.0) += b.count;
        }
    }

    fn see_neighbours(&mut self, neighbours: &[String]) {
        match &self.neighbours {
            None => self.neighbours = Some(Some(neighbours.to_vec())),
            Some(Some(seen)) if seen.as_slice() != neighbours => self.neighbours = Some(None),
            _ => {}
        }
    }

    /// Latency percentiles (p50, p95, p99) in milliseconds.
    fn percentiles(&self) -> [Option<f64>; 3] {
        if self.latency.is_empty() {
            return self.kept;
        }
        let buckets: Vec<LatencyBucket> = self
            .latency
            .iter()
            .map(|(&k, &count)| LatencyBucket {
                le: (k != u64::MAX).then(|| f64::from_bits(k)),
                count,
            })
            .collect();
        [0.5, 0.95, 0.99].map(|q| histogram_quantile(q, &buckets).map(|s| s * 1000.0))
    }
}

/// The buckets not written yet, by (task, width, start).
#[derive(Debug, Default)]
pub(crate) struct UsageBuffer {
    open: HashMap<(String, i64, i64), Bucket>,
}

/// A bound on what the buffer holds (tasks × open buckets): past it, the oldest are written
/// at the next flush whatever their state.
const MAX_OPEN: usize = 400_000;

impl UsageBuffer {
    /// Adds one sync's report of `task` at `now` (unix seconds) to its buckets.
    /// `neighbours`: the services of the other tasks on its GPUs now.
    pub(crate) fn ingest(
        &mut self,
        now: i64,
        widths: [i64; 2],
        task: &Task,
        r: &TaskReport,
        neighbours: &[String],
    ) {
        let memory = r.gpu_memory_peak_mib.or(r.gpu_memory_mib);
        let work = match &r.work {
            Some(WorkReport::Measured(s)) => Some(s),
            _ => None,
        };
        if memory.is_none() && r.sm_percent.is_none() && r.memory_errors.is_none() && work.is_none()
        {
            return;
        }
        for width in widths {
            let start = now - now.rem_euclid(width);
            let b = self
                .open
                .entry((task.id.clone(), width, start))
                .or_insert_with(|| Bucket {
                    service: task.service.clone(),
                    task_definition: task.task_definition.clone(),
                    host: task.host.clone(),
                    memory_max: MiB::ZERO,
                    memory_last: MiB::ZERO,
                    sm: SmHistogram::default(),
                    samples: 0,
                    memory_errors: 0,
                    work: WorkAcc::default(),
                });
            b.work.see_neighbours(neighbours);
            if let Some(w) = work {
                b.work.add(w);
            }
            if let Some(m) = memory {
                b.memory_max = b.memory_max.max(m);
            }
            if let Some(m) = r.gpu_memory_mib.or(memory) {
                b.memory_last = m;
            }
            if let Some(s) = r.sm_percent {
                b.sm.add(s);
            }
            b.samples += 1;
            b.memory_errors = b.memory_errors.saturating_add(r.memory_errors.unwrap_or(0));
        }
    }

    /// Takes the buckets that ended by `now` (all of them with `all`) as rows to write.
    pub(crate) fn take_closed(&mut self, now: i64, all: bool) -> Vec<UsageRow> {
        let crowded = self.open.len() > MAX_OPEN;
        let closed: Vec<(String, i64, i64)> = self
            .open
            .keys()
            .filter(|(_, width, start)| all || crowded || start + width <= now)
            .cloned()
            .collect();
        closed
            .into_iter()
            .filter_map(|key| {
                let b = self.open.remove(&key)?;
                let [p50, p95, p99] = b.work.percentiles();
                Some(UsageRow {
                    task_id: key.0,
                    width_secs: key.1,
                    bucket_start: key.2,
                    service: b.service,
                    task_definition: b.task_definition,
                    host: b.host,
                    memory_max: b.memory_max,
                    memory_last: b.memory_last,
                    sm_p50: b.sm.percentile(50),
                    sm_p95: b.sm.percentile(95),
                    sm_max: b.sm.max(),
                    samples: b.samples,
                    memory_errors: b.memory_errors,
                    work_secs: b.work.secs,
                    completed: b.work.completed,
                    errors: b.work.errors,
                    latency_ms: [p50, p95, p99],
                    neighbours: b.work.neighbours.flatten(),
                })
            })
            .collect()
    }

    /// Puts rows back after a failed write, so the next flush tries again.
    pub(crate) fn put_back(&mut self, rows: Vec<UsageRow>) {
        for r in rows {
            let mut sm = SmHistogram::default();
            for p in [r.sm_p50, r.sm_p95, r.sm_max].into_iter().flatten() {
                sm.add(p);
            }
            self.open
                .entry((r.task_id, r.width_secs, r.bucket_start))
                .or_insert(Bucket {
                    service: r.service,
                    task_definition: r.task_definition,
                    host: r.host,
                    memory_max: r.memory_max,
                    memory_last: r.memory_last,
                    sm,
                    samples: r.samples,
                    memory_errors: r.memory_errors,
                    work: WorkAcc {
                        secs: r.work_secs,
                        completed: r.completed,
                        errors: r.errors,
                        latency: Default::default(),
                        kept: r.latency_ms,
                        neighbours: Some(r.neighbours),
                    },
                });
        }
    }
}

/// The services of the other tasks that share a GPU with `task` (sorted, once each; its
/// own service when another of its replicas is there).
pub(crate) fn neighbours_of(task: &Task, on_host: &[Task]) -> Vec<String> {
    let mut out: Vec<String> = on_host
        .iter()
        .filter(|o| o.id != task.id && o.state.holds_capacity())
        .filter(|o| {
            o.allocations
                .iter()
                .any(|a| task.allocations.iter().any(|b| a.gpu == b.gpu))
        })
        .map(|o| o.service.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: &str) -> Task {
        Task {
            cpu: tessera_model::MilliCpu(100),
            memory: MiB(100),
            ..crate::test_values::task(id, "web")
        }
    }

    fn report(peak: u64, sm: u32, errors: u32) -> TaskReport {
        TaskReport {
            task_id: "t1".into(),
            running: true,
            gpu_memory_peak_mib: Some(MiB(peak)),
            gpu_memory_mib: Some(MiB(peak - 1)),
            sm_percent: Some(sm),
            memory_errors: (errors > 0).then_some(errors),
            ..Default::default()
        }
    }

    #[test]
    fn buckets_close_at_their_end_with_percentiles_and_the_peak() {
        let mut b = UsageBuffer::default();
        let t = task("t1");
        for (i, sm) in (0..20).zip([10u32, 20, 30, 40, 50, 60, 70, 80, 90, 100].iter().cycle()) {
            b.ingest(
                120 + i,
                [60, 3600],
                &t,
                &report(1000 + i as u64, *sm, 0),
                &[],
            );
        }
        b.ingest(130, [60, 3600], &t, &report(500, 10, 2), &[]);
        assert!(b.take_closed(179, false).is_empty(), "nothing ended yet");
        let rows = b.take_closed(180, false);
        assert_eq!(rows.len(), 1, "the minute bucket ended, the hour did not");
        let r = &rows[0];
        assert_eq!((r.width_secs, r.bucket_start), (60, 120));
        assert_eq!(r.memory_max, MiB(1019));
        assert_eq!(r.samples, 21);
        assert_eq!(r.memory_errors, 2);
        assert_eq!(r.sm_max, Some(100));
        assert_eq!(r.sm_p50, Some(50));
        assert_eq!(r.sm_p95, Some(100));
        let rest = b.take_closed(180, true);
        assert_eq!(rest.len(), 1);
        assert_eq!((rest[0].width_secs, rest[0].bucket_start), (3600, 0));
    }

    #[test]
    fn a_report_without_measures_adds_nothing() {
        let mut b = UsageBuffer::default();
        let mut r = report(10, 10, 0);
        r.gpu_memory_peak_mib = None;
        r.gpu_memory_mib = None;
        r.sm_percent = None;
        b.ingest(5, [60, 3600], &task("t1"), &r, &[]);
        assert!(b.take_closed(10_000, true).is_empty());
    }
}
