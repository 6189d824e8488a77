//! The work applications complete: where a task's application publishes it (Prometheus
//! text), what an agent measured of it per sync, what a service promises about it (a
//! latency target, alarms, autoscaling), and the read models built from it (rates over
//! time, interference between neighbours on one GPU, alarm and autoscaling states).

use crate::error::{FieldError, ValidationErrors};
use serde::{Deserialize, Serialize};

/// Where a task's application publishes its work, in the Prometheus text format (what
/// Triton, vLLM, TGI and TorchServe serve): the task's port `port` (by name), at `path`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkSpec {
    /// The name of one of the task's ports.
    #[cfg_attr(feature = "openapi", schema(max_length = 64))]
    pub port: String,
    #[serde(default = "default_metrics_path")]
    #[cfg_attr(feature = "openapi", schema(default = "/metrics", max_length = 256))]
    pub path: String,
    /// The counter of completed work (requests, tokens, images), summed over its series.
    #[cfg_attr(feature = "openapi", schema(max_length = 200))]
    pub completed: String,
    /// The counter of failed work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 200))]
    pub errors: Option<String>,
    /// A histogram of latency in seconds (its `_bucket` series), summed over its series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 200))]
    pub latency: Option<String>,
}

pub fn default_metrics_path() -> String {
    "/metrics".into()
}

/// A Prometheus metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        && s.len() <= 200
}

impl WorkSpec {
    /// Field errors under `at` (e.g. `work`); `ports` are the task's port names.
    pub fn check(&self, at: &str, ports: &[&str], errors: &mut Vec<FieldError>) {
        let mut err = |field: &str, message: String| {
            errors.push(FieldError {
                field: format!("{at}.{field}"),
                message,
            })
        };
        if !ports.contains(&self.port.as_str()) {
            err(
                "port",
                if ports.is_empty() {
                    format!(
                        "names port `{}`, but the task has no named port: give the port that serves the metrics a name",
                        self.port
                    )
                } else {
                    format!(
                        "names port `{}`, which the task does not have (its ports: {})",
                        self.port,
                        ports.join(", ")
                    )
                },
            );
        }
        if !self.path.starts_with('/')
            || self.path.len() > 256
            || self.path.chars().any(|c| !('!'..='~').contains(&c))
        {
            err(
                "path",
                format!(
                    "must be an absolute URL path of printable ASCII such as /metrics, got {:?}",
                    self.path
                ),
            );
        }
        for (field, name) in [
            ("completed", Some(&self.completed)),
            ("errors", self.errors.as_ref()),
            ("latency", self.latency.as_ref()),
        ] {
            if let Some(name) = name
                && !is_metric_name(name)
            {
                err(
                    field,
                    format!(
                        "must be a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), got {name:?}"
                    ),
                );
            }
        }
    }
}

/// One latency histogram bucket: how many observations took at most `le` seconds.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyBucket {
    /// The upper bound in seconds (`+Inf` is sent as `null`).
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub le: Option<f64>,
    /// Observations at most `le` in the interval (cumulative, as Prometheus counts them).
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub count: f64,
}

/// What an agent measured of one task's work since its previous scrape.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkSample {
    /// Seconds between the two scrapes compared.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.001, maximum = 3600.0))]
    pub interval_secs: f64,
    /// Work completed in the interval.
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub completed: f64,
    /// Work failed in the interval (absent: the task does not count failures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0))]
    pub errors: Option<f64>,
    /// The interval's latency histogram (bucket deltas; empty when nothing was observed
    /// or the task publishes no latency).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub latency: Vec<LatencyBucket>,
}

/// A sync's word on a task's work: measured, or unknown with the reason (the endpoint did
/// not answer in time, answered too much, was not Prometheus text, lacked the counter, a
/// counter went backwards: the application restarted).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkReport {
    Measured(WorkSample),
    Unknown {
        #[cfg_attr(
            feature = "openapi",
            schema(max_length = 512, pattern = "^[^\\u0000]*$")
        )]
        reason: String,
    },
}

impl WorkReport {
    /// What an agent may report: an interval of 1 ms to an hour, counts that are finite
    /// and not negative, at most 64 latency buckets with finite positive bounds, a reason
    /// of at most 512 characters. The server refuses a sync with anything else.
    pub fn check(&self) -> Result<(), String> {
        let count = |v: f64| v.is_finite() && v >= 0.0;
        match self {
            WorkReport::Unknown { reason } => {
                if reason.chars().count() > 512 || reason.contains('\0') {
                    return Err("the reason must be at most 512 characters without NUL".into());
                }
            }
            WorkReport::Measured(s) => {
                if !(s.interval_secs.is_finite() && (0.001..=3600.0).contains(&s.interval_secs)) {
                    return Err(format!(
                        "interval_secs must be from 0.001 to 3600, got {}",
                        s.interval_secs
                    ));
                }
                if !count(s.completed) || s.errors.is_some_and(|e| !count(e)) {
                    return Err("completed and errors must be counts: finite, at least 0".into());
                }
                if s.latency.len() > 64 {
                    return Err(format!(
                        "at most 64 latency buckets, got {}",
                        s.latency.len()
                    ));
                }
                if s.latency.iter().any(|b| {
                    !count(b.count) || b.le.is_some_and(|le| !(le.is_finite() && le > 0.0))
                }) {
                    return Err(
                        "latency buckets need a positive bound (or null for +Inf) and a count of at least 0"
                            .into(),
                    );
                }
            }
        }
        Ok(())
    }
}

/// Nearest-rank-interpolated percentile `q` (0–1) of a cumulative histogram, in seconds, as
/// Prometheus's `histogram_quantile` computes it: linear within the bucket it falls in; in
/// the `+Inf` bucket, the highest finite bound. `None` without observations.
pub fn histogram_quantile(q: f64, buckets: &[LatencyBucket]) -> Option<f64> {
    let mut sorted: Vec<LatencyBucket> = buckets.to_vec();
    sorted.sort_by(|a, b| {
        a.le.unwrap_or(f64::INFINITY)
            .total_cmp(&b.le.unwrap_or(f64::INFINITY))
    });
    let total = sorted.last()?.count;
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let mut lower_bound = 0.0;
    let mut lower_count = 0.0;
    for b in &sorted {
        if b.count >= rank {
            return Some(match b.le {
                None => lower_bound,
                Some(le) => {
                    let in_bucket = b.count - lower_count;
                    if in_bucket <= 0.0 {
                        le
                    } else {
                        lower_bound + (le - lower_bound) * (rank - lower_count) / in_bucket
                    }
                }
            });
        }
        if let Some(le) = b.le {
            lower_bound = le;
        }
        lower_count = b.count;
    }
    Some(lower_bound)
}

/// A task's work as its agent last measured it: rates over the last interval.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WorkNow {
    /// When (RFC 3339).
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_per_sec: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors_per_sec: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p95_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_ms: Option<f64>,
    /// Why nothing was measured this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

/// Rates are finite (never NaN: they are quotients of finite counts by a positive
/// interval), so equality is an equivalence and tasks that carry them stay `Eq`.
impl Eq for WorkNow {}

impl WorkNow {
    /// The rates of one sample.
    pub fn of(at: String, report: &WorkReport) -> WorkNow {
        match report {
            WorkReport::Unknown { reason } => WorkNow {
                at,
                unknown: Some(reason.clone()),
                ..WorkNow::default()
            },
            WorkReport::Measured(s) => {
                let secs = s.interval_secs.max(1e-3);
                let ms = |q| histogram_quantile(q, &s.latency).map(|v| v * 1000.0);
                WorkNow {
                    at,
                    completed_per_sec: Some(s.completed / secs),
                    errors_per_sec: s.errors.map(|e| e / secs),
                    latency_p50_ms: ms(0.5),
                    latency_p95_ms: ms(0.95),
                    latency_p99_ms: ms(0.99),
                    unknown: None,
                }
            }
        }
    }
}

/// A service's latency target: placement keeps its tasks away from neighbours measured to
/// push it past the target, and consolidation refuses moves predicted to.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slo {
    #[cfg_attr(
        feature = "openapi",
        schema(exclusive_minimum = 0.0, maximum = 3_600_000.0)
    )]
    pub latency_p99_ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0.0, maximum = 1.0))]
    pub max_error_rate: Option<f64>,
}

/// A figure of a service's work an alarm watches.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlarmMetric {
    /// The p99 latency over the service's tasks (of the deployment being watched).
    LatencyP99Ms,
    /// Errors ÷ (completed + errors).
    ErrorRate,
    /// Completed work per second, summed over the tasks.
    CompletedPerSec,
}

impl AlarmMetric {
    pub fn as_str(self) -> &'static str {
        match self {
            AlarmMetric::LatencyP99Ms => "latency_p99_ms",
            AlarmMetric::ErrorRate => "error_rate",
            AlarmMetric::CompletedPerSec => "completed_per_sec",
        }
    }
}

/// Fires when `metric` stays above `above` (or below `below`) for `for_secs`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alarm {
    pub metric: AlarmMetric,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below: Option<f64>,
    #[serde(default = "default_alarm_for")]
    #[cfg_attr(feature = "openapi", schema(default = 30, minimum = 0, maximum = 3600))]
    pub for_secs: u32,
}

fn default_alarm_for() -> u32 {
    30
}

impl Alarm {
    /// Whether `value` breaches it.
    pub fn breached_by(&self, value: f64) -> bool {
        self.above.is_some_and(|a| value > a) || self.below.is_some_and(|b| value < b)
    }

    /// `latency_p99_ms above 200 for 30 s`.
    pub fn describe(&self) -> String {
        let (word, v) = match (self.above, self.below) {
            (Some(a), _) => ("above", a),
            (None, Some(b)) => ("below", b),
            (None, None) => ("above", f64::NAN),
        };
        format!(
            "{} {word} {} for {} s",
            self.metric.as_str(),
            trim_float(v),
            self.for_secs
        )
    }
}

/// `12.5`, `200` (no trailing zeros).
pub fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// What autoscaling tracks.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleMetric {
    /// Completed work per second per running task.
    CompletedPerTaskPerSec,
    /// The service's p99 latency.
    LatencyP99Ms,
    /// SM use of its tasks, mean.
    SmPercent,
    /// GPU memory used ÷ reserved, percent, mean over its tasks.
    GpuMemoryPercent,
}

impl ScaleMetric {
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleMetric::CompletedPerTaskPerSec => "completed_per_task_per_sec",
            ScaleMetric::LatencyP99Ms => "latency_p99_ms",
            ScaleMetric::SmPercent => "sm_percent",
            ScaleMetric::GpuMemoryPercent => "gpu_memory_percent",
        }
    }
}

/// Target tracking: the desired count follows `metric` toward `target`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Autoscaling {
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 100_000))]
    pub min: u32,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100_000))]
    pub max: u32,
    pub metric: ScaleMetric,
    #[cfg_attr(feature = "openapi", schema(exclusive_minimum = 0.0))]
    pub target: f64,
    #[serde(default = "default_scale_out_cooldown")]
    #[cfg_attr(
        feature = "openapi",
        schema(default = 60, minimum = 0, maximum = 86_400)
    )]
    pub scale_out_cooldown_secs: u32,
    #[serde(default = "default_scale_in_cooldown")]
    #[cfg_attr(
        feature = "openapi",
        schema(default = 300, minimum = 0, maximum = 86_400)
    )]
    pub scale_in_cooldown_secs: u32,
}

fn default_scale_out_cooldown() -> u32 {
    60
}

fn default_scale_in_cooldown() -> u32 {
    300
}

/// What a service promises about its work: a latency target, alarms watched during
/// deployments (and their bake time), autoscaling. Stored with the service.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Objectives {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<Slo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 20))]
    pub alarms: Vec<Alarm>,
    /// How long after a deployment reaches its steady state its alarms still roll it back.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(
        feature = "openapi",
        schema(default = 0, minimum = 0, maximum = 86_400)
    )]
    pub bake_secs: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
}

/// Its numbers are validated finite (`check`), so equality is an equivalence.
impl Eq for Objectives {}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// What a task definition's `work` publishes, for checking what a service asks of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Published {
    pub work: bool,
    pub errors: bool,
    pub latency: bool,
    pub gpu: bool,
}

impl Published {
    pub fn of(work: Option<&WorkSpec>, gpu: bool) -> Published {
        Published {
            work: work.is_some(),
            errors: work.is_some_and(|w| w.errors.is_some()),
            latency: work.is_some_and(|w| w.latency.is_some()),
            gpu,
        }
    }
}

fn finite_positive(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

impl Objectives {
    /// Every field error, named as the API's fields are (`slo.latency_p99_ms`,
    /// `alarms[0].metric`, `autoscaling.max`); `published` is what the service's task
    /// definition measures: an alarm or a target on a figure it does not publish is refused.
    pub fn check(&self, published: Published) -> Result<(), ValidationErrors> {
        let mut errors = Vec::new();
        let mut err = |field: String, message: String| errors.push(FieldError { field, message });
        let needs = |metric: &str, latency: bool, errors: bool| -> Option<String> {
            if !published.work {
                Some(format!(
                    "{metric} needs the task definition to say where its work is measured (`work`), and it does not"
                ))
            } else if latency && !published.latency {
                Some(format!(
                    "{metric} needs a latency histogram, and the task definition's `work` names none (`work.latency`)"
                ))
            } else if errors && !published.errors {
                Some(format!(
                    "{metric} needs an error counter, and the task definition's `work` names none (`work.errors`)"
                ))
            } else {
                None
            }
        };
        if let Some(slo) = &self.slo {
            if !finite_positive(slo.latency_p99_ms) || slo.latency_p99_ms > 3_600_000.0 {
                err(
                    "slo.latency_p99_ms".into(),
                    format!(
                        "must be a number of milliseconds above 0 and at most 3600000, got {}",
                        slo.latency_p99_ms
                    ),
                );
            } else if let Some(m) = needs("a latency target", true, false) {
                err("slo.latency_p99_ms".into(), m);
            }
            if let Some(r) = slo.max_error_rate {
                if !(0.0..=1.0).contains(&r) {
                    err(
                        "slo.max_error_rate".into(),
                        format!("must be a fraction from 0 to 1, got {r}"),
                    );
                } else if let Some(m) = needs("an error-rate target", false, true) {
                    err("slo.max_error_rate".into(), m);
                }
            }
        }
        if self.alarms.len() > 20 {
            err(
                "alarms".into(),
                format!("at most 20 alarms, got {}", self.alarms.len()),
            );
        }
        for (i, a) in self.alarms.iter().enumerate() {
            let at = format!("alarms[{i}]");
            match (a.above, a.below) {
                (None, None) => err(at.clone(), "needs a threshold: `above` or `below`".into()),
                (Some(_), Some(_)) => err(
                    at.clone(),
                    "give `above` or `below`, not both (make two alarms)".into(),
                ),
                (Some(v), None) | (None, Some(v)) if !v.is_finite() || v < 0.0 => err(
                    format!("{at}.{}", if a.above.is_some() { "above" } else { "below" }),
                    format!("must be a number of at least 0, got {v}"),
                ),
                _ => {}
            }
            if a.for_secs > 3600 {
                err(
                    format!("{at}.for_secs"),
                    format!("must be from 0 to 3600, got {}", a.for_secs),
                );
            }
            let missing = match a.metric {
                AlarmMetric::LatencyP99Ms => needs("an alarm on latency_p99_ms", true, false),
                AlarmMetric::ErrorRate => needs("an alarm on error_rate", false, true),
                AlarmMetric::CompletedPerSec => {
                    needs("an alarm on completed_per_sec", false, false)
                }
            };
            if let Some(m) = missing {
                err(format!("{at}.metric"), m);
            }
        }
        if self.bake_secs > 86_400 {
            err(
                "bake_secs".into(),
                format!("must be from 0 to 86400, got {}", self.bake_secs),
            );
        }
        if let Some(s) = &self.autoscaling {
            if s.max == 0 || s.max > 100_000 {
                err(
                    "autoscaling.max".into(),
                    format!("must be from 1 to 100000, got {}", s.max),
                );
            }
            if s.min > s.max {
                err(
                    "autoscaling.min".into(),
                    format!("must be at most max ({}), got {}", s.max, s.min),
                );
            }
            if !finite_positive(s.target) {
                err(
                    "autoscaling.target".into(),
                    format!("must be a number above 0, got {}", s.target),
                );
            } else if matches!(
                s.metric,
                ScaleMetric::SmPercent | ScaleMetric::GpuMemoryPercent
            ) && s.target > 100.0
            {
                err(
                    "autoscaling.target".into(),
                    format!("is a percentage: at most 100, got {}", s.target),
                );
            }
            for (field, v) in [
                ("scale_out_cooldown_secs", s.scale_out_cooldown_secs),
                ("scale_in_cooldown_secs", s.scale_in_cooldown_secs),
            ] {
                if v > 86_400 {
                    err(
                        format!("autoscaling.{field}"),
                        format!("must be from 0 to 86400, got {v}"),
                    );
                }
            }
            let missing = match s.metric {
                ScaleMetric::CompletedPerTaskPerSec => {
                    needs("scaling on completed_per_task_per_sec", false, false)
                }
                ScaleMetric::LatencyP99Ms => needs("scaling on latency_p99_ms", true, false),
                ScaleMetric::SmPercent | ScaleMetric::GpuMemoryPercent => (!published.gpu)
                    .then(|| {
                        format!(
                            "scaling on {} needs tasks with a GPU, and the task definition asks for none",
                            s.metric.as_str()
                        )
                    }),
            };
            if let Some(m) = missing {
                err("autoscaling.metric".into(), m);
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors { errors })
        }
    }
}

/// A service's work over one bucket of time (summed over its tasks).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkPoint {
    /// Unix seconds at the bucket's start.
    pub at: i64,
    pub completed_per_sec: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p95_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_ms: Option<f64>,
    /// Tasks that reported work in the bucket.
    pub tasks: u32,
}

/// What sharing a GPU with `neighbour` costs a service, against its samples without it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interference {
    /// A service name, or `*` for "any neighbour" against running alone.
    pub neighbour: String,
    /// Samples (task-buckets) with and without the neighbour.
    pub samples_with: u32,
    pub samples_without: u32,
    /// Relative change of the latency p99 (0.38 = +38 %), when both sides have latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_change: Option<f64>,
    /// Relative change of completed work per task per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_change: Option<f64>,
    /// Confidence that the latency change is real (1 − the two-sided p-value of Welch's
    /// t-test on log latency), or of the completed change when there is no latency.
    pub confidence: f64,
    /// Enough samples and confidence to act on (placement and consolidation use only
    /// these); otherwise shown as "not enough evidence".
    pub established: bool,
    /// `sharing with embed: p99 +38 % (n = 412)`.
    pub summary: String,
}

/// An alarm and what it sees now.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlarmState {
    pub alarm: Alarm,
    /// `ok`, `breaching` (past the threshold, not yet for `for_secs`), `alarm`, or
    /// `insufficient_data`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// Since when it is in this state (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// `GET /api/v1/services/{name}/work`: the work a service completes, now and over time.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceWork {
    pub service: String,
    /// The task definition's `work`, or absent (then nothing below is measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<WorkSpec>,
    pub objectives: Objectives,
    /// Summed over running tasks' last reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_per_sec: Option<f64>,
    /// Completed work per hour of reserved GPU (each task's share of its GPUs by memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_per_gpu_hour: Option<f64>,
    /// Completed work per second per GiB of reserved GPU memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_per_sec_per_gib: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_ms: Option<f64>,
    /// Tasks whose last report measured work / could not.
    pub tasks_measured: u32,
    pub tasks_unknown: u32,
    /// Why work is unknown, per task with no measurement (task id, reason).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<(String, String)>,
    /// The latency target's verdict: `p99 within target` / `p99 over target` / absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    pub series: Vec<WorkPoint>,
    pub bucket_secs: i64,
    pub interference: Vec<Interference>,
    pub alarms: Vec<AlarmState>,
    /// The last autoscaling decision, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<String>,
    /// Set where the figures are simulated (the demo).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(le: Option<f64>, count: f64) -> LatencyBucket {
        LatencyBucket { le, count }
    }

    #[test]
    fn quantiles_interpolate_within_buckets_as_prometheus_does() {
        let h = [
            b(Some(0.1), 50.0),
            b(Some(0.2), 90.0),
            b(Some(0.5), 100.0),
            b(None, 100.0),
        ];
        assert!((histogram_quantile(0.5, &h).unwrap() - 0.1).abs() < 1e-9);
        assert!((histogram_quantile(0.7, &h).unwrap() - 0.15).abs() < 1e-9);
        assert!((histogram_quantile(0.99, &h).unwrap() - 0.47).abs() < 1e-9);
        assert_eq!(histogram_quantile(0.5, &[b(None, 0.0)]), None);
        // Everything in +Inf: the highest finite bound.
        assert_eq!(
            histogram_quantile(0.99, &[b(Some(1.0), 0.0), b(None, 10.0)]),
            Some(1.0)
        );
    }

    #[test]
    fn an_agent_reports_plausible_work_or_is_refused() {
        let ok = WorkReport::Measured(WorkSample {
            interval_secs: 5.0,
            completed: 10.0,
            errors: Some(0.0),
            latency: vec![b(Some(0.1), 10.0), b(None, 10.0)],
        });
        assert!(ok.check().is_ok());
        for bad in [
            WorkSample {
                interval_secs: 0.0,
                completed: 1.0,
                errors: None,
                latency: vec![],
            },
            WorkSample {
                interval_secs: 1.0,
                completed: -1.0,
                errors: None,
                latency: vec![],
            },
            WorkSample {
                interval_secs: 1.0,
                completed: 1.0,
                errors: None,
                latency: vec![b(Some(-0.5), 1.0)],
            },
            WorkSample {
                interval_secs: 1.0,
                completed: 1.0,
                errors: None,
                latency: vec![b(None, 1.0); 65],
            },
        ] {
            assert!(
                WorkReport::Measured(bad.clone()).check().is_err(),
                "{bad:?}"
            );
        }
        let long = WorkReport::Unknown {
            reason: "x".repeat(513),
        };
        assert!(long.check().is_err());
    }

    #[test]
    fn objectives_name_the_field_and_refuse_unpublished_figures() {
        let o = Objectives {
            slo: Some(Slo {
                latency_p99_ms: 200.0,
                max_error_rate: Some(2.0),
            }),
            alarms: vec![Alarm {
                metric: AlarmMetric::ErrorRate,
                above: Some(0.1),
                below: None,
                for_secs: 10,
            }],
            bake_secs: 0,
            autoscaling: Some(Autoscaling {
                min: 3,
                max: 2,
                metric: ScaleMetric::SmPercent,
                target: 50.0,
                scale_out_cooldown_secs: 60,
                scale_in_cooldown_secs: 300,
            }),
        };
        let published = Published {
            work: true,
            errors: false,
            latency: true,
            gpu: false,
        };
        let e = o.check(published).unwrap_err();
        let fields: Vec<&str> = e.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "slo.max_error_rate",
                "alarms[0].metric",
                "autoscaling.min",
                "autoscaling.metric"
            ]
        );
        assert!(e.errors[1].message.contains("work.errors"));
        let fine = Objectives {
            alarms: vec![Alarm {
                metric: AlarmMetric::LatencyP99Ms,
                above: Some(250.0),
                below: None,
                for_secs: 5,
            }],
            ..Objectives::default()
        };
        assert!(fine.check(published).is_ok());
        assert!(fine.check(Published::default()).is_err());
    }
}
