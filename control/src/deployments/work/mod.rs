//! The work applications complete, beside what the GPU sees: what agents scrape of each
//! task's own metrics (kept per task as its latest rates, and per usage bucket with the
//! services it shared its GPU with), a service's figures now and over time, interference
//! estimates from that history, and the two things that act on it: deployment alarms
//! (with a bake time) and target-tracking autoscaling. The decisions are pure functions,
//! table-tested here; the reconcile pass carries them out.
//!
//! - `figures`: a service's figures now and its work per chart point.
//! - `alarms`: deployment alarms and their watches.
//! - `autoscale`: target-tracking autoscaling.
//! - `conflicts`: interference estimates acted on: the neighbours a service keeps off.

mod alarms;
mod autoscale;
mod conflicts;
pub(crate) use conflicts::InterferenceModel;
mod figures;

use crate::deployments::Deployments;
use crate::deployments::passes::Watch;
use crate::error::ControlError;
use crate::fit::usage_range;
use crate::interference::estimate;
use crate::store::{TaskFilter, UsageQuery};
use alarms::alarm_state;
use figures::{Figures, work_series};
use std::collections::HashMap;
use tessera_model::service::{Task, TaskState};
use tessera_model::work::{Alarm, Objectives, ServiceWork, trim_float};

/// An event's words for a service's objectives.
pub(crate) fn describe_objectives(o: &Objectives) -> String {
    let mut parts = Vec::new();
    match &o.slo {
        Some(s) => parts.push(format!(
            "latency target p99 {} ms",
            trim_float(s.latency_p99_ms)
        )),
        None => parts.push("no latency target".into()),
    }
    if o.alarms.is_empty() {
        parts.push("no alarms".into());
    } else {
        parts.push(format!(
            "alarms: {}",
            o.alarms
                .iter()
                .map(Alarm::describe)
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if o.bake_secs > 0 {
        parts.push(format!("bake time {} s", o.bake_secs));
    }
    match &o.autoscaling {
        Some(a) => parts.push(format!(
            "autoscaling {}..{} tasks on {} toward {}",
            a.min,
            a.max,
            a.metric.as_str(),
            trim_float(a.target)
        )),
        None => parts.push("no autoscaling".into()),
    }
    parts.join(", ")
}

impl Deployments {
    /// Running tasks of `service` with their allocations, and each one's reserved GPU
    /// memory and share of its GPUs (by memory).
    async fn running_with_shares(
        &self,
        service: &str,
    ) -> Result<(Vec<Task>, HashMap<String, (u64, f64)>), ControlError> {
        let tasks = self
            .store
            .list_tasks(&TaskFilter {
                service: Some(service.to_owned()),
                states: vec![TaskState::Running],
                ..Default::default()
            })
            .await?;
        let mut gpu_memory: HashMap<tessera_model::GpuUuid, u64> = HashMap::new();
        let mut hosts_read = std::collections::HashSet::new();
        for t in &tasks {
            if let Some(h) = &t.host
                && !t.allocations.is_empty()
                && hosts_read.insert(h.clone())
                && let Ok(host) = self.store.get_host(h).await
            {
                for g in host.gpus {
                    gpu_memory.insert(g.uuid.clone(), g.memory.0);
                }
            }
        }
        let shares = tasks
            .iter()
            .map(|t| {
                let reserved: u64 = t.allocations.iter().map(|a| a.memory.0).sum();
                let share: f64 = t
                    .allocations
                    .iter()
                    .map(|a| match gpu_memory.get(&a.gpu) {
                        _ if a.dedicated => 1.0,
                        Some(&total) if total > 0 => a.memory.0 as f64 / total as f64,
                        _ => 0.0,
                    })
                    .sum();
                (t.id.clone(), (reserved, share))
            })
            .collect();
        Ok((tasks, shares))
    }

    /// A service's figures now, from its running tasks' last reports.
    pub(crate) async fn figures_now(&self, service: &str) -> Result<Figures, ControlError> {
        let (tasks, shares) = self.running_with_shares(service).await?;
        Ok(Figures::of(&tasks, |t| {
            shares.get(&t.id).map_or(0, |s| s.0)
        }))
    }

    /// `GET /api/v1/services/{name}/work`.
    pub async fn service_work(&self, name: &str, range: &str) -> Result<ServiceWork, ControlError> {
        let range = usage_range(range)?;
        let service = self.store.get_service(name).await?;
        let spec = self.scheduler.spec_of(&service.task_definition).await?;
        let (tasks, shares) = self.running_with_shares(name).await?;
        let figures = Figures::of(&tasks, |t| shares.get(&t.id).map_or(0, |s| s.0));
        let unknown: Vec<(String, String)> = tasks
            .iter()
            .filter_map(|t| {
                let w = t.measured.work.as_ref()?;
                Some((t.id.clone(), w.unknown.clone()?))
            })
            .collect();
        // What the tasks whose work was measured reserve: MiB, and shares of GPUs.
        let (measured_mib, measured_share) = tasks
            .iter()
            .filter(|t| {
                t.measured
                    .work
                    .as_ref()
                    .is_some_and(|w| w.unknown.is_none())
            })
            .filter_map(|t| shares.get(&t.id))
            .fold((0u64, 0.0f64), |(mib, share), s| (mib + s.0, share + s.1));
        let verdict = latency_verdict(service.objectives.slo.as_ref(), figures.latency_p99_ms);
        let (width, group) = self.views.grouping(range);
        let rows = self
            .store
            .list_usage(&UsageQuery {
                service: Some(name.to_owned()),
                task: None,
                width_secs: width,
                since: self.core.unix_now() - range.secs(),
            })
            .await?;
        let series = work_series(&rows, group);
        let observations = self
            .interference
            .observations(name, self.core.config().usage.fine_keep.as_secs() as i64)
            .await?;
        let watches = self.passes.watches.lock();
        let alarms = service
            .objectives
            .alarms
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let w = watches
                    .alarms
                    .get(&(name.to_owned(), i))
                    .copied()
                    .or_else(|| {
                        // Not watched by this server: what its figure says now.
                        let value = figures.alarm_value(a.metric);
                        Some(Watch {
                            breaching_since: None,
                            fired_at: None,
                            value,
                        })
                    });
                alarm_state(a, w.as_ref())
            })
            .collect();
        let autoscaling = service
            .objectives
            .autoscaling
            .as_ref()
            .and_then(|_| watches.scaling.get(name).cloned());
        drop(watches);
        Ok(ServiceWork {
            service: name.to_owned(),
            spec: spec.work.clone(),
            objectives: service.objectives.clone(),
            completed_per_sec: figures.completed_per_sec,
            completed_per_gpu_hour: figures
                .completed_per_sec
                .filter(|_| measured_share > 0.0)
                .map(|c| c * 3600.0 / measured_share),
            completed_per_sec_per_gib: figures
                .completed_per_sec
                .filter(|_| measured_mib > 0)
                .map(|c| c / (measured_mib as f64 / 1024.0)),
            error_rate: figures.error_rate(),
            latency_p99_ms: figures.latency_p99_ms,
            tasks_measured: figures.measured as u32,
            tasks_unknown: unknown.len() as u32,
            unknown,
            verdict,
            series,
            bucket_secs: group,
            interference: estimate(name, &observations),
            alarms,
            autoscaling,
            note: self.core.config().usage.time_note.clone(),
        })
    }

    /// How long ago (seconds) `at` was, by the control plane's clock.
    pub(crate) fn age_of(&self, at: tessera_model::time::Timestamp) -> i64 {
        self.core.instant().millis_since(at) / 1000
    }
}

/// What the service's p99 says against its latency target, where both are known.
fn latency_verdict(slo: Option<&tessera_model::work::Slo>, p99: Option<f64>) -> Option<String> {
    let (slo, p99) = (slo?, p99?);
    let (p99_said, target) = (trim_float(p99.round()), trim_float(slo.latency_p99_ms));
    Some(if p99 <= slo.latency_p99_ms {
        format!("p99 within target ({p99_said} ms ≤ {target} ms)")
    } else {
        format!("p99 over target ({p99_said} ms > {target} ms)")
    })
}
