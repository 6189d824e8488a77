//! The work applications complete, beside what the GPU sees: what agents scrape of each
//! task's own metrics (kept per task as its latest rates, and per usage bucket with the
//! services it shared its GPU with), a service's figures now and over time, interference
//! estimates from that history, and the two things that act on it: deployment alarms
//! (with a bake time) and target-tracking autoscaling. The decisions are pure functions,
//! table-tested here; the reconcile pass carries them out.

use crate::clock::stamp;
use crate::control::Control;
use crate::error::ControlError;
use crate::fit::Range;
use crate::interference::{ANY, Observation, alone_p99, estimate, predicted_p99};
use crate::parts::{Estimates, Watch};
use crate::store::{TaskFilter, UsageQuery};
use std::collections::BTreeSet;
use std::collections::HashMap;
use std::sync::Arc;
use tessera_model::GpuUuid;
use tessera_model::agent::TaskReport;
use tessera_model::service::Service;
use tessera_model::service::{Task, TaskState};
use tessera_model::work::Interference;
use tessera_model::work::{
    Alarm, AlarmMetric, AlarmState, Autoscaling, Objectives, ScaleMetric, ServiceWork, WorkNow,
    WorkPoint, trim_float,
};

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
            if let Ok(at) = chrono::DateTime::parse_from_rfc3339(&w.at) {
                let at = at.timestamp();
                f.measured_at = Some(f.measured_at.map_or(at, |m| m.min(at)));
            }
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

/// The next watch of `alarm` given its figure `value` measured at `at` and seen at `now`
/// (unix seconds), and whether it fired just now. A breach counts from when it was
/// measured, not from when a pass saw it: `for_secs` is the application's time past the
/// threshold.
pub(crate) fn watch_alarm(
    alarm: &Alarm,
    before: Watch,
    value: Option<f64>,
    at: i64,
    now: i64,
) -> (Watch, bool) {
    let breaching = value.is_some_and(|v| alarm.breached_by(v));
    if !breaching {
        return (
            Watch {
                breaching_since: None,
                fired_at: None,
                value,
            },
            false,
        );
    }
    let since = before.breaching_since.unwrap_or(at.min(now));
    let due = now - since >= i64::from(alarm.for_secs);
    let fired = due && before.fired_at.is_none();
    (
        Watch {
            breaching_since: Some(since),
            fired_at: if due {
                before.fired_at.or(Some(now))
            } else {
                None
            },
            value,
        },
        fired,
    )
}

/// The state an alarm shows.
pub(crate) fn alarm_state(alarm: &Alarm, w: Option<&Watch>) -> AlarmState {
    let (state, since) = match w {
        None => ("insufficient_data", None),
        Some(w) if w.value.is_none() => ("insufficient_data", None),
        Some(w) => match (w.fired_at, w.breaching_since) {
            (Some(at), _) => ("alarm", Some(at)),
            (None, Some(at)) => ("breaching", Some(at)),
            _ => ("ok", None),
        },
    };
    AlarmState {
        alarm: alarm.clone(),
        state: state.into(),
        value: w.and_then(|w| w.value),
        since: since
            .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
    }
}

/// What target tracking decides.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ScaleDecision {
    /// Set the desired count to `to`, for `why`.
    Scale { to: u32, why: String },
    /// Nothing to change, for `why` (shown on the service page).
    Hold(String),
}

/// How far from its target a metric may be before autoscaling acts (a fraction).
const TOLERANCE: f64 = 0.1;

/// Target tracking: the count that brings `metric` to its target, as ECS computes it
/// (current × value ÷ target, rounded up, within min and max), held back by the cooldowns
/// (`since_out`/`since_in`: seconds since the last scale-out / any scaling, `None`: never).
pub(crate) fn decide_scale(
    a: &Autoscaling,
    desired: u32,
    running: usize,
    value: Option<f64>,
    since_out: Option<i64>,
    since_any: Option<i64>,
) -> ScaleDecision {
    let clamp = |n: u32| n.clamp(a.min, a.max.max(a.min));
    if desired < a.min || desired > a.max {
        return ScaleDecision::Scale {
            to: clamp(desired),
            why: format!(
                "the desired count {desired} is outside autoscaling's {}..{}",
                a.min, a.max
            ),
        };
    }
    let Some(value) = value else {
        return ScaleDecision::Hold(format!(
            "no {} measured yet on the running tasks",
            a.metric.as_str()
        ));
    };
    if running == 0 {
        return ScaleDecision::Hold("no task runs yet".into());
    }
    let ratio = value / a.target;
    // Within 10 % of the target nothing moves: a service at its target does not flap
    // between counts on measurement noise.
    let wanted = if (1.0 - TOLERANCE..=1.0 + TOLERANCE).contains(&ratio) {
        desired
    } else {
        clamp(((running as f64) * ratio).ceil().max(1.0) as u32)
    };
    let figures = format!(
        "{} {} against target {} on {running} running task(s)",
        a.metric.as_str(),
        trim_float(value),
        trim_float(a.target)
    );
    if wanted > desired {
        if since_out.is_some_and(|s| s < i64::from(a.scale_out_cooldown_secs)) {
            return ScaleDecision::Hold(format!(
                "would scale out to {wanted} ({figures}), within the scale-out cooldown"
            ));
        }
        ScaleDecision::Scale {
            to: wanted,
            why: figures,
        }
    } else if wanted < desired && running as u32 >= desired {
        if since_any.is_some_and(|s| s < i64::from(a.scale_in_cooldown_secs)) {
            return ScaleDecision::Hold(format!(
                "would scale in to {wanted} ({figures}), within the scale-in cooldown"
            ));
        }
        ScaleDecision::Scale {
            to: wanted,
            why: figures,
        }
    } else {
        ScaleDecision::Hold(format!("on target: {figures}"))
    }
}

/// How long (seconds, by the control plane's clock) estimates are reused before they are
/// read again.
const ESTIMATES_TTL: i64 = 30;

/// Why a service's tasks should keep off the GPUs where `neighbour` runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Conflict {
    pub neighbour: String,
    pub why: String,
}

/// The neighbours a task of `service` should not share a GPU with: those whose established
/// estimate predicts its p99 past its target (`own`: its estimates and p99 alone), and those
/// it is predicted to push past theirs (`others`: each service with a target, its
/// estimates).
pub(crate) fn conflicts(
    service: &Service,
    own: &(Vec<Interference>, Option<f64>),
    others: &[(&Service, Estimates)],
) -> Vec<Conflict> {
    let mut out: Vec<Conflict> = Vec::new();
    let mut add = |neighbour: &str, why: String| {
        if !out.iter().any(|c| c.neighbour == neighbour) {
            out.push(Conflict {
                neighbour: neighbour.to_owned(),
                why,
            });
        }
    };
    if let (Some(slo), Some(alone)) = (&service.objectives.slo, own.1) {
        for e in own.0.iter().filter(|e| e.established && e.neighbour != ANY) {
            let p = predicted_p99(alone, &[e.neighbour.as_str()], &own.0);
            if p > slo.latency_p99_ms {
                add(
                    &e.neighbour,
                    format!(
                        "{}: {} predicted {} ms, past its {} ms target",
                        service.name,
                        e.summary,
                        p.round(),
                        trim_float(slo.latency_p99_ms)
                    ),
                );
            }
        }
    }
    for (other, est) in others {
        let (Some(slo), Some(alone)) = (&other.objectives.slo, est.1) else {
            continue;
        };
        if let Some(e) = est
            .0
            .iter()
            .find(|e| e.established && e.neighbour == service.name)
        {
            let p = predicted_p99(alone, &[service.name.as_str()], &est.0);
            if p > slo.latency_p99_ms {
                add(
                    &other.name,
                    format!(
                        "{}: {} predicted {} ms, past its {} ms target",
                        other.name,
                        e.summary,
                        p.round(),
                        trim_float(slo.latency_p99_ms)
                    ),
                );
            }
        }
    }
    out
}

impl Control {
    /// Keeps what a sync reported of its tasks' work, written with the next heartbeats
    /// when it says something new (see [`WorkLatest::offer`]).
    pub(crate) fn record_work(&self, tasks: &[Task], reports: &[TaskReport]) {
        let at = stamp(self.now());
        let now = self.unix_now();
        let mut latest = self.gateway.work.lock();
        for r in reports {
            let Some(w) = &r.work else { continue };
            if !tasks.iter().any(|t| t.id == r.task_id) {
                continue;
            }
            latest.offer(&r.task_id, WorkNow::of(at.clone(), w), now);
        }
    }

    /// Writes the work received since the last flush that says something new.
    pub(crate) async fn flush_work(&self) -> Result<(), ControlError> {
        let work = self.gateway.work.lock().take(self.unix_now());
        if work.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.store.set_task_work(&work).await {
            self.gateway.work.lock().put_back(work);
            return Err(e.into());
        }
        Ok(())
    }

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

    /// The service's work history: task-buckets of the fine width over the last
    /// `since_secs`, as interference observations.
    pub(crate) async fn observations(
        &self,
        service: &str,
        since_secs: i64,
    ) -> Result<Vec<Observation>, ControlError> {
        let [fine, _] = self.config.usage.widths();
        let rows = self
            .store
            .list_usage(&UsageQuery {
                service: Some(service.to_owned()),
                width_secs: fine,
                since: self.unix_now() - since_secs,
            })
            .await?;
        Ok(rows
            .into_iter()
            .filter(|r| r.work_secs > 0.0)
            .filter_map(|r| {
                Some(Observation {
                    service: r.service,
                    neighbours: r.neighbours?,
                    completed_per_sec: r.completed / r.work_secs,
                    latency_p99_ms: r.latency_ms[2],
                })
            })
            .collect())
    }

    /// `GET /api/v1/services/{name}/work`.
    pub async fn service_work(&self, name: &str, range: &str) -> Result<ServiceWork, ControlError> {
        let range = Range::parse(range)?;
        let service = self.store.get_service(name).await?;
        let spec = self.spec_of(&service.task_definition).await?;
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
        let verdict = match (&service.objectives.slo, figures.latency_p99_ms) {
            (Some(slo), Some(p99)) => Some(if p99 <= slo.latency_p99_ms {
                format!(
                    "p99 within target ({} ms ≤ {} ms)",
                    trim_float(p99.round()),
                    trim_float(slo.latency_p99_ms)
                )
            } else {
                format!(
                    "p99 over target ({} ms > {} ms)",
                    trim_float(p99.round()),
                    trim_float(slo.latency_p99_ms)
                )
            }),
            _ => None,
        };
        let (width, group) = self.grouping(range);
        let rows = self
            .store
            .list_usage(&UsageQuery {
                service: Some(name.to_owned()),
                width_secs: width,
                since: self.unix_now() - range.secs(),
            })
            .await?;
        let series = work_series(&rows, group);
        let observations = self
            .observations(name, self.config.usage.fine_keep.as_secs() as i64)
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
            note: self.config.usage.time_note.clone(),
        })
    }

    /// Watches the service's alarms against the figures of the tasks of its primary
    /// deployment. True when one fired while the deployment is still watched (rolling out,
    /// or within its bake time): the caller rolls it back.
    pub(crate) async fn watch_alarms(
        &self,
        service: &tessera_model::service::Service,
        tasks: &[Task],
        primary: i64,
        steady: bool,
        age_secs: i64,
    ) -> Result<Option<String>, ControlError> {
        let name = service.name.as_str();
        let o = &service.objectives;
        if o.alarms.is_empty() {
            return Ok(None);
        }
        let now = self.unix_now();
        // The live tasks the pass already read: alarm figures need no reserved memory.
        let figures = Figures::of(tasks.iter().filter(|t| t.deployment_id == primary), |_| 0);
        let mut fired_now = Vec::new();
        let watched = {
            let mut w = self.passes.watches.lock();
            let steady_at = if steady {
                // First seen steady by this server: a deployment older than its bake time
                // (steady before this server started watching) is past it.
                let first = if age_secs > i64::from(o.bake_secs) {
                    now - i64::from(o.bake_secs)
                } else {
                    now
                };
                Some(*w.steady_at.entry(primary).or_insert(first))
            } else {
                w.steady_at.remove(&primary);
                None
            };
            for (i, alarm) in o.alarms.iter().enumerate() {
                let key = (name.to_owned(), i);
                let before = w.alarms.get(&key).copied().unwrap_or_default();
                let (after, fired) = watch_alarm(
                    alarm,
                    before,
                    figures.alarm_value(alarm.metric),
                    figures.measured_at.unwrap_or(now),
                    now,
                );
                w.alarms.insert(key, after);
                if fired {
                    fired_now.push((alarm.clone(), after.value.unwrap_or_default()));
                }
            }
            steady_at.is_none_or(|at| now - at < i64::from(o.bake_secs))
        };
        let mut rollback = None;
        for (alarm, value) in fired_now {
            let what = format!(
                "alarm `{}` fired: {} is {}",
                alarm.describe(),
                alarm.metric.as_str(),
                trim_float((value * 1000.0).round() / 1000.0)
            );
            if watched && rollback.is_none() {
                rollback = Some(what);
            } else {
                self.event(Some(name), None, &format!("{what} (the service is steady and past its bake time: nothing is rolled back)"))
                    .await;
            }
        }
        Ok(rollback)
    }

    /// A service's interference estimates and p99 alone, read at most every 30 s.
    pub(crate) async fn estimates_of(&self, service: &str) -> Result<Estimates, ControlError> {
        if let Some((at, e)) = self.passes.watches.lock().estimates.get(service)
            && self.unix_now() - at < ESTIMATES_TTL
        {
            return Ok(e.clone());
        }
        let obs = self
            .observations(service, self.config.usage.fine_keep.as_secs() as i64)
            .await?;
        let e: Estimates = Arc::new((estimate(service, &obs), alone_p99(service, &obs)));
        self.passes
            .watches
            .lock()
            .estimates
            .insert(service.to_owned(), (self.unix_now(), e.clone()));
        Ok(e)
    }

    /// The GPUs a task of `service` should keep off (where its conflicting neighbours run),
    /// with the reasons; empty when no service of its pool has a latency target.
    pub(crate) async fn interference_avoid(
        &self,
        service: &Service,
        services: &[&Service],
    ) -> Result<(BTreeSet<GpuUuid>, Vec<Conflict>), ControlError> {
        let with_target: Vec<&Service> = services
            .iter()
            .copied()
            .filter(|s| {
                s.pool == service.pool && s.objectives.slo.is_some() && s.name != service.name
            })
            .collect();
        if with_target.is_empty() && service.objectives.slo.is_none() {
            return Ok(Default::default());
        }
        let own = if service.objectives.slo.is_some() {
            self.estimates_of(&service.name).await?
        } else {
            Arc::new((Vec::new(), None))
        };
        let mut others = Vec::with_capacity(with_target.len());
        for s in with_target {
            others.push((s, self.estimates_of(&s.name).await?));
        }
        let found = conflicts(service, &own, &others);
        let mut gpus = BTreeSet::new();
        for c in &found {
            let tasks = self
                .store
                .list_tasks(&TaskFilter {
                    service: Some(c.neighbour.clone()),
                    states: TaskState::HOLDING.to_vec(),
                    ..Default::default()
                })
                .await?;
            gpus.extend(
                tasks
                    .iter()
                    .flat_map(|t| t.allocations.iter().map(|a| a.gpu.clone())),
            );
        }
        Ok((gpus, found))
    }

    /// Forgets the service's alarm watches (after a rollback, the revision rolled back to
    /// is watched afresh).
    pub(crate) fn forget_alarms(&self, name: &str) {
        self.passes
            .watches
            .lock()
            .alarms
            .retain(|(s, _), _| s != name);
    }

    /// Target tracking for a steady service: sets its desired count when its metric asks.
    pub(crate) async fn autoscale(
        &self,
        service: &tessera_model::service::Service,
        tasks: &[Task],
        rolling_out: bool,
    ) -> Result<(), ControlError> {
        let Some(a) = &service.objectives.autoscaling else {
            return Ok(());
        };
        let name = service.name.as_str();
        if rolling_out {
            self.passes
                .watches
                .lock()
                .scaling
                .insert(name.to_owned(), "held: a deployment is under way".into());
            return Ok(());
        }
        // The live tasks the pass already read; only GPU memory use against what is
        // reserved needs their allocations.
        let figures = if a.metric == ScaleMetric::GpuMemoryPercent {
            self.figures_now(name).await?
        } else {
            Figures::of(tasks, |_| 0)
        };
        let now = self.unix_now();
        let (last_out, last_any) = self
            .passes
            .watches
            .lock()
            .scaled
            .get(name)
            .copied()
            .unwrap_or_default();
        let decision = decide_scale(
            a,
            service.desired_count,
            figures.tasks,
            figures.scale_value(a.metric),
            last_out.map(|t| now - t),
            last_any.map(|t| now - t),
        );
        match decision {
            ScaleDecision::Hold(why) => {
                self.passes
                    .watches
                    .lock()
                    .scaling
                    .insert(name.to_owned(), why);
            }
            ScaleDecision::Scale { to, why } => {
                self.store.set_desired_count(name, to).await?;
                let out = to > service.desired_count;
                {
                    let mut w = self.passes.watches.lock();
                    let entry = w.scaled.entry(name.to_owned()).or_default();
                    if out {
                        entry.0 = Some(now);
                    }
                    entry.1 = Some(now);
                    w.scaling.insert(
                        name.to_owned(),
                        format!(
                            "scaled {} from {} to {to} at {}: {why}",
                            if out { "out" } else { "in" },
                            service.desired_count,
                            stamp(self.now())
                        ),
                    );
                }
                self.event(
                    Some(name),
                    None,
                    &format!(
                        "autoscaling: desired count {} → {to} ({why})",
                        service.desired_count
                    ),
                )
                .await;
                self.wake();
            }
        }
        Ok(())
    }

    /// How long ago (seconds) `at` was, by the control plane's clock.
    pub(crate) fn age_of(&self, at: &str) -> Option<i64> {
        let t = chrono::DateTime::parse_from_rfc3339(at).ok()?;
        Some((self.now() - t.with_timezone(&chrono::Utc)).num_seconds())
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
    use crate::parts::{WORK_REFRESH, WorkLatest};

    fn alarm(above: f64, for_secs: u32) -> Alarm {
        Alarm {
            metric: AlarmMetric::LatencyP99Ms,
            above: Some(above),
            below: None,
            for_secs,
        }
    }

    #[test]
    fn an_alarm_fires_once_after_its_figure_breaches_for_its_time() {
        let a = alarm(200.0, 10);
        let (w, fired) = watch_alarm(&a, Watch::default(), Some(150.0), 100, 100);
        assert!(!fired && w.breaching_since.is_none());
        let (w, fired) = watch_alarm(&a, w, Some(250.0), 101, 101);
        assert!(!fired);
        assert_eq!(w.breaching_since, Some(101));
        assert_eq!(alarm_state(&a, Some(&w)).state, "breaching");
        let (w, fired) = watch_alarm(&a, w, Some(260.0), 110, 110);
        assert!(!fired, "9 s of breach is not 10");
        let (w, fired) = watch_alarm(&a, w, Some(260.0), 111, 111);
        assert!(fired);
        assert_eq!(alarm_state(&a, Some(&w)).state, "alarm");
        let (w, fired) = watch_alarm(&a, w, Some(270.0), 112, 112);
        assert!(!fired, "it fires once");
        let (w, _) = watch_alarm(&a, w, Some(100.0), 113, 113);
        assert_eq!(alarm_state(&a, Some(&w)).state, "ok");
        let (w, _) = watch_alarm(&a, w, None, 114, 114);
        assert_eq!(alarm_state(&a, Some(&w)).state, "insufficient_data");
        // A breach counts from when it was measured, however late a pass sees it.
        let (w, fired) = watch_alarm(&a, Watch::default(), Some(300.0), 90, 100);
        assert!(fired && w.breaching_since == Some(90));
        // A dip resets the clock.
        let (w, _) = watch_alarm(&a, Watch::default(), Some(300.0), 200, 200);
        let (w, _) = watch_alarm(&a, w, Some(100.0), 205, 205);
        let (w, fired) = watch_alarm(&a, w, Some(300.0), 211, 211);
        assert!(!fired && w.breaching_since == Some(211));
    }

    #[test]
    fn work_is_written_when_it_moves_or_grows_old() {
        let w = |c: f64, p99: f64| WorkNow {
            completed_per_sec: Some(c),
            latency_p99_ms: Some(p99),
            ..WorkNow::default()
        };
        let mut l = WorkLatest::default();
        l.offer("t", w(100.0, 50.0), 0);
        assert_eq!(l.take(0).len(), 1, "the first report");
        l.offer("t", w(105.0, 52.0), 1);
        assert!(l.take(1).is_empty(), "within 10 %: not written");
        l.offer("t", w(105.0, 60.0), 2);
        assert_eq!(l.take(2).len(), 1, "p99 moved by 20 %");
        l.offer("t", w(105.0, 60.0), 2 + WORK_REFRESH);
        assert_eq!(l.take(2 + WORK_REFRESH).len(), 1, "refreshed");
        l.offer(
            "t",
            WorkNow {
                unknown: Some("timeout".into()),
                ..WorkNow::default()
            },
            3 + WORK_REFRESH,
        );
        assert_eq!(l.take(3 + WORK_REFRESH).len(), 1, "turned unknown");
    }

    fn scaling() -> Autoscaling {
        Autoscaling {
            min: 1,
            max: 10,
            metric: ScaleMetric::CompletedPerTaskPerSec,
            target: 20.0,
            scale_out_cooldown_secs: 60,
            scale_in_cooldown_secs: 300,
        }
    }

    #[test]
    fn target_tracking_scales_toward_the_target_within_bounds_and_cooldowns() {
        let a = scaling();
        // 2 tasks at 100/s each: 10 tasks would do 20/s each.
        assert_eq!(
            decide_scale(&a, 2, 2, Some(100.0), None, None),
            ScaleDecision::Scale {
                to: 10,
                why: "completed_per_task_per_sec 100 against target 20 on 2 running task(s)".into()
            }
        );
        // Capped at max.
        assert!(matches!(
            decide_scale(&a, 2, 2, Some(1000.0), None, None),
            ScaleDecision::Scale { to: 10, .. }
        ));
        // Within the scale-out cooldown: held.
        assert!(matches!(
            decide_scale(&a, 2, 2, Some(100.0), Some(30), Some(30)),
            ScaleDecision::Hold(w) if w.contains("scale-out cooldown")
        ));
        // Load fell: 10 tasks at 4/s → 2; held while the scale-in cooldown runs.
        assert!(matches!(
            decide_scale(&a, 10, 10, Some(4.0), Some(100), Some(100)),
            ScaleDecision::Hold(w) if w.contains("scale-in cooldown")
        ));
        assert!(matches!(
            decide_scale(&a, 10, 10, Some(4.0), Some(400), Some(400)),
            ScaleDecision::Scale { to: 2, .. }
        ));
        // Not all desired tasks run yet: no scale-in on a partial count.
        assert!(matches!(
            decide_scale(&a, 10, 6, Some(4.0), None, None),
            ScaleDecision::Hold(_)
        ));
        // On target, and within 10 % of it either way: held.
        for v in [19.0, 21.5, 18.5] {
            assert!(matches!(
                decide_scale(&a, 5, 5, Some(v), None, None),
                ScaleDecision::Hold(w) if w.starts_with("on target")
            ));
        }
        assert!(matches!(
            decide_scale(&a, 1, 1, Some(23.0), None, None),
            ScaleDecision::Scale { to: 2, .. }
        ));
        // Nothing measured: held, with the reason.
        assert!(matches!(
            decide_scale(&a, 5, 5, None, None, None),
            ScaleDecision::Hold(w) if w.contains("no completed_per_task_per_sec")
        ));
        // A desired count outside the bounds is brought inside.
        assert!(matches!(
            decide_scale(&a, 0, 0, None, None, None),
            ScaleDecision::Scale { to: 1, .. }
        ));
    }

    fn task(id: &str, work: Option<WorkNow>) -> Task {
        let mut t: Task = serde_json::from_value(serde_json::json!({
            "id": id, "service": "web", "deployment_id": 1,
            "task_definition": "web:1", "pool": "gpu",
            "cpu": 100, "memory": 100, "state": "running", "migrating": false,
            "host": null, "allocations": [], "placement_message": null, "stop_reason": null,
            "exit_code": null, "measured": {"gpu_memory_peak": 512, "sm_percent": 40},
            "ports": [], "created_at": "", "started_at": null, "stopped_at": null
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
