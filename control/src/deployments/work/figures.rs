//! A service's figures: now, from its running tasks' latest reports (what alarms and
//! autoscaling read), and over time, as its work per chart point.

use std::collections::HashMap;
use tessera_model::service::{Task, TaskState};
use tessera_model::work::{AlarmMetric, ScaleMetric, WorkPoint};

/// A service's figures from its tasks' latest reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Figures {
    /// Running tasks counted.
    pub tasks: usize,
    /// Tasks whose last report measured work.
    pub measured: usize,
    pub completed_per_sec: Option<f64>,
    pub errors_per_sec: Option<f64>,
    /// The completed-weighted mean of the tasks' p99s (each task's exact p99 comes from its
    /// own histogram; mixing them exactly would need the histograms themselves).
    pub latency_p99_ms: Option<f64>,
    pub sm_percent: Option<f64>,
    /// GPU memory in use ÷ reserved, percent, mean over the tasks that measured it.
    pub gpu_memory_percent: Option<f64>,
    /// When the oldest of the work reports counted was measured (unix seconds).
    pub measured_at: Option<i64>,
}

impl Figures {
    /// Over running `tasks`; `reserved_mib` gives each task's reserved GPU memory.
    pub(crate) fn of<'a>(
        tasks: impl IntoIterator<Item = &'a Task>,
        reserved_mib: impl Fn(&Task) -> u64,
    ) -> Figures {
        let mut f = Figures::default();
        let (mut completed, mut errors, mut weighted, mut weight) = (0.0, 0.0, 0.0, 0.0);
        let mut any_errors = false;
        let mut unweighted: Vec<f64> = Vec::new();
        let (mut sm, mut sm_n, mut mem, mut mem_n) = (0.0, 0usize, 0.0, 0usize);
        for t in tasks {
            if t.state != TaskState::Running {
                continue;
            }
            f.tasks += 1;
            if let Some(s) = t.measured.sm_percent {
                sm += f64::from(s);
                sm_n += 1;
            }
            let reserved = reserved_mib(t);
            if let Some(peak) = t.measured.gpu_memory_peak
                && reserved > 0
            {
                mem += 100.0 * peak.0 as f64 / reserved as f64;
                mem_n += 1;
            }
            let Some(w) = t.measured.work.as_ref().filter(|w| w.unknown.is_none()) else {
                continue;
            };
            let Some(c) = w.completed_per_sec else {
                continue;
            };
            f.measured += 1;
            let at = w.at.millis() / 1000;
            f.measured_at = Some(f.measured_at.map_or(at, |m| m.min(at)));
            completed += c;
            if let Some(e) = w.errors_per_sec {
                errors += e;
                any_errors = true;
            }
            if let Some(p) = w.latency_p99_ms {
                weighted += p * c;
                weight += c;
                unweighted.push(p);
            }
        }
        if f.measured > 0 {
            f.completed_per_sec = Some(completed);
            f.errors_per_sec = any_errors.then_some(errors);
        }
        f.latency_p99_ms = if weight > 0.0 {
            Some(weighted / weight)
        } else if !unweighted.is_empty() {
            Some(unweighted.iter().sum::<f64>() / unweighted.len() as f64)
        } else {
            None
        };
        f.sm_percent = (sm_n > 0).then(|| sm / sm_n as f64);
        f.gpu_memory_percent = (mem_n > 0).then(|| mem / mem_n as f64);
        f
    }

    pub(crate) fn error_rate(&self) -> Option<f64> {
        let e = self.errors_per_sec?;
        let total = self.completed_per_sec.unwrap_or(0.0) + e;
        Some(if total > 0.0 { e / total } else { 0.0 })
    }

    pub(crate) fn alarm_value(&self, metric: AlarmMetric) -> Option<f64> {
        match metric {
            AlarmMetric::LatencyP99Ms => self.latency_p99_ms,
            AlarmMetric::ErrorRate => self.error_rate(),
            AlarmMetric::CompletedPerSec => self.completed_per_sec,
        }
    }

    pub(crate) fn scale_value(&self, metric: ScaleMetric) -> Option<f64> {
        match metric {
            ScaleMetric::CompletedPerTaskPerSec => self
                .completed_per_sec
                .filter(|_| self.measured > 0)
                .map(|c| c / self.measured as f64),
            ScaleMetric::LatencyP99Ms => self.latency_p99_ms,
            ScaleMetric::SmPercent => self.sm_percent,
            ScaleMetric::GpuMemoryPercent => self.gpu_memory_percent,
        }
    }
}

/// A service's work per chart point of `group` seconds: each task's rate while it was
/// measured, summed over tasks (a task measured for part of a point counts at its rate,
/// not diluted), and latency percentiles weighted by the work behind them.
pub(crate) fn work_series(rows: &[crate::store::UsageRow], group: i64) -> Vec<WorkPoint> {
    let group = group.max(1);
    // (point, task) → (secs, completed, errors, Σ p·w for p50/p95/p99, Σ w)
    type Acc = (f64, f64, Option<f64>, [f64; 3], f64);
    let mut by: std::collections::BTreeMap<i64, HashMap<&str, Acc>> = Default::default();
    for r in rows.iter().filter(|r| r.work_secs > 0.0) {
        let point = r.bucket_start - r.bucket_start.rem_euclid(group);
        let acc = by
            .entry(point)
            .or_default()
            .entry(r.task_id.as_str())
            .or_insert((0.0, 0.0, None, [0.0; 3], 0.0));
        acc.0 += r.work_secs;
        acc.1 += r.completed;
        if let Some(e) = r.errors {
            *acc.2.get_or_insert(0.0) += e;
        }
        if let [Some(a), Some(b), Some(c)] = r.latency_ms {
            let w = r.completed.max(1.0);
            acc.3[0] += a * w;
            acc.3[1] += b * w;
            acc.3[2] += c * w;
            acc.4 += w;
        }
    }
    by.into_iter()
        .map(|(at, tasks)| {
            let mut completed = 0.0;
            let mut errors: Option<f64> = None;
            let mut lat = [0.0; 3];
            let mut w = 0.0;
            for (secs, c, e, l, lw) in tasks.values() {
                completed += c / secs;
                if let Some(e) = e {
                    *errors.get_or_insert(0.0) += e / secs;
                }
                for i in 0..3 {
                    lat[i] += l[i];
                }
                w += lw;
            }
            let pct = |i: usize| (w > 0.0).then(|| lat[i] / w);
            WorkPoint {
                at,
                completed_per_sec: completed,
                error_rate: errors.map(|e| {
                    let total = completed + e;
                    if total > 0.0 { e / total } else { 0.0 }
                }),
                latency_p50_ms: pct(0),
                latency_p95_ms: pct(1),
                latency_p99_ms: pct(2),
                tasks: tasks.len() as u32,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::work::WorkNow;

    fn task(id: &str, work: Option<WorkNow>) -> Task {
        let mut t: Task = serde_json::from_value(serde_json::json!({
            "id": id, "service": "web", "deployment_id": 1,
            "task_definition": "web:1", "pool": "gpu",
            "cpu": 100, "memory": 100, "state": "running", "migrating": false,
            "host": null, "allocations": [], "placement_message": null, "stop_reason": null,
            "exit_code": null, "measured": {"gpu_memory_peak": 512, "sm_percent": 40},
            "ports": [], "created_at": "2026-12-05T00:00:00.000Z", "started_at": null, "stopped_at": null
        }))
        .expect("a task");
        t.measured.work = work;
        t
    }

    #[test]
    fn figures_sum_rates_and_weigh_latency_by_work() {
        let w = |c: f64, p99: f64| WorkNow {
            completed_per_sec: Some(c),
            errors_per_sec: Some(1.0),
            latency_p99_ms: Some(p99),
            ..WorkNow::default()
        };
        let tasks = [
            task("a", Some(w(30.0, 100.0))),
            task("b", Some(w(10.0, 300.0))),
            task(
                "c",
                Some(WorkNow {
                    unknown: Some("timeout".into()),
                    ..WorkNow::default()
                }),
            ),
        ];
        let f = Figures::of(&tasks, |_| 1024);
        assert_eq!(f.tasks, 3);
        assert_eq!(f.measured, 2);
        assert_eq!(f.completed_per_sec, Some(40.0));
        assert_eq!(f.latency_p99_ms, Some(150.0));
        assert_eq!(f.error_rate(), Some(2.0 / 42.0));
        assert_eq!(
            f.scale_value(ScaleMetric::CompletedPerTaskPerSec),
            Some(20.0)
        );
        assert_eq!(f.scale_value(ScaleMetric::GpuMemoryPercent), Some(50.0));
        assert_eq!(f.scale_value(ScaleMetric::SmPercent), Some(40.0));
    }
}
