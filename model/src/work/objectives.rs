//! What a service promises about its work: a latency target, alarms and autoscaling, with
//! their validation against what its task definition publishes.

use super::WorkSpec;
use crate::error::{FieldError, ValidationErrors};
use serde::{Deserialize, Serialize};

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

/// Fires when `metric` stays above `above` (or below `below`) for `for_secs`. Its schema is
/// written in `crate::schema` (at least one threshold).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alarm {
    pub metric: AlarmMetric,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below: Option<f64>,
    #[serde(default = "default_alarm_for")]
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
    /// The metric's value to hold. For `sm_percent` and `gpu_memory_percent` a percentage
    /// (at most 100); `min` at most `max`.
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
            if a.for_secs > crate::limits::ALARM_FOR_MAX_SECS {
                err(
                    format!("{at}.for_secs"),
                    format!(
                        "must be from 0 to {}, got {}",
                        crate::limits::ALARM_FOR_MAX_SECS,
                        a.for_secs
                    ),
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

#[cfg(test)]
mod tests {
    use super::*;

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
