//! Target-tracking autoscaling: the decision, a pure function, and the pass that carries
//! it out on a steady service.

use super::figures::Figures;
use crate::clock::stamp;
use crate::deployments::Deployments;
use crate::error::ControlError;
use tessera_model::notify::NoticeKind;
use tessera_model::service::Task;
use tessera_model::work::{Autoscaling, ScaleMetric, trim_float};

/// What target tracking decides.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ScaleDecision {
    /// Set the desired count to `to`, for `why`.
    Scale { to: u32, why: String },
    /// Nothing to change, for `why` (shown on the service page).
    Hold(String),
    /// At its maximum while its metric asks for more: held there, for `why` (on-call
    /// people are told: the service needs a larger maximum, or more capacity).
    AtMax(String),
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
    } else if desired == a.max && ratio > 1.0 + TOLERANCE {
        let unclamped = ((running as f64) * ratio).ceil() as u64;
        ScaleDecision::AtMax(format!(
            "held at its maximum of {}: it would scale out to {unclamped} ({figures})",
            a.max
        ))
    } else {
        ScaleDecision::Hold(format!("on target: {figures}"))
    }
}

impl Deployments {
    /// Autoscaling of service `name` held at its maximum for `why`: noted for its page,
    /// and on-call people told once when it gets there (not on every pass it stays).
    async fn held_at_max(&self, name: &str, why: String) {
        let before = self
            .passes
            .watches
            .lock()
            .scaling
            .insert(name.to_owned(), why.clone());
        if !before.is_some_and(|b| b.starts_with("held at its maximum")) {
            self.core
                .notify(
                    NoticeKind::AutoscalingAtMax,
                    (Some(name), None, None),
                    &format!("autoscaling: {why}"),
                )
                .await;
        }
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
        let now = self.core.unix_now();
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
            ScaleDecision::AtMax(why) => self.held_at_max(name, why).await,
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
                            stamp(self.core.now())
                        ),
                    );
                }
                self.core
                    .event(
                        Some(name),
                        None,
                        &format!(
                            "autoscaling: desired count {} → {to} ({why})",
                            service.desired_count
                        ),
                    )
                    .await;
                self.core.wake();
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // At max and still asking for more: held there, and said so.
        assert_eq!(
            decide_scale(&a, 10, 10, Some(40.0), None, None),
            ScaleDecision::AtMax(
                "held at its maximum of 10: it would scale out to 20 (completed_per_task_per_sec 40 against target 20 on 10 running task(s))".into()
            )
        );
        assert!(matches!(
            decide_scale(&a, 10, 10, Some(20.0), None, None),
            ScaleDecision::Hold(_)
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
}
