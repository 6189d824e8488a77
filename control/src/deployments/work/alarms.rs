//! Deployment alarms (with a bake time): each alarm's watch, the state it shows, and the
//! pass's watch over a service's primary deployment, which asks for a rollback.

use super::figures::Figures;
use crate::deployments::Deployments;
use crate::deployments::passes::Watch;
use crate::error::ControlError;
use tessera_model::notify::NoticeKind;
use tessera_model::service::Task;
use tessera_model::time::Timestamp;
use tessera_model::work::{Alarm, AlarmState, trim_float};

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
    // No figure (no request completed since the last scrape, a task between scrapes) is
    // no evidence either way: a breach under way goes on, and nothing fires on it.
    if value.is_none() {
        return (
            Watch {
                value: None,
                ..before
            },
            false,
        );
    }
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
        since: since.and_then(|s| Timestamp::from_millis(s.saturating_mul(1000))),
    }
}

impl Deployments {
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
        let now = self.core.unix_now();
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
                self.core
                    .notify(NoticeKind::AlarmFired, (Some(name), None, None), &format!("{what} (the service is steady and past its bake time: nothing is rolled back)"))
                    .await;
            }
        }
        Ok(rollback)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::work::AlarmMetric;

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
        // A pass without a figure (nothing completed meanwhile) neither ends a breach
        // nor fires on it.
        let (w, _) = watch_alarm(&a, Watch::default(), Some(300.0), 300, 300);
        let (w, fired) = watch_alarm(&a, w, None, 305, 305);
        assert!(!fired && w.breaching_since == Some(300));
        assert_eq!(alarm_state(&a, Some(&w)).state, "insufficient_data");
        let (w, fired) = watch_alarm(&a, w, Some(300.0), 310, 310);
        assert!(
            fired && w.breaching_since == Some(300),
            "10 s since the breach began"
        );
        // A dip resets the clock.
        let (w, _) = watch_alarm(&a, Watch::default(), Some(300.0), 200, 200);
        let (w, _) = watch_alarm(&a, w, Some(100.0), 205, 205);
        let (w, fired) = watch_alarm(&a, w, Some(300.0), 211, 211);
        assert!(!fired && w.breaching_since == Some(211));
    }
}
