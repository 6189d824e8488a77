//! What applications publish and agents measure: where a task's work is scraped from
//! (`WorkSpec`), a sync's report of it, latency histograms, and a task's rates now.

use crate::error::FieldError;
use crate::time::Timestamp;
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
    /// of at most 512 characters (`crate::bounds`). Anything else is made `unknown` with
    /// the reason, by the agent before it sends and by the server again.
    pub fn check(&self) -> Result<(), String> {
        let count = |v: f64| v.is_finite() && v >= 0.0;
        match self {
            WorkReport::Unknown { reason } => {
                if !crate::bounds::text_ok(reason, crate::limits::report::MAX_WORK_REASON_CHARS) {
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
                if s.latency.len() > crate::limits::report::MAX_LATENCY_BUCKETS {
                    return Err(format!(
                        "at most {} latency buckets, got {}",
                        crate::limits::report::MAX_LATENCY_BUCKETS,
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
    /// When.
    pub at: Timestamp,
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
    pub fn of(at: crate::time::Timestamp, report: &WorkReport) -> WorkNow {
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
}
