//! The control plane's time. Every decision that depends on how long something has lasted
//! (a host silent past the lost timeout, the grace after a restart, a crash-looping task's
//! backoff, retention) reads [`Clock::now`], and the times those decisions compare against
//! (a host's last sync) are written from it too, so a test moves time forward with
//! [`ManualClock::advance`] instead of sleeping. (Times the database records for display and
//! retention, such as when a task stopped, come from the database's own clock; a manual
//! clock is never behind it.)

use chrono::{DateTime, SecondsFormat, Utc};
use std::sync::Mutex;
use std::time::Duration;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> DateTime<Utc>;
}

/// The machine's clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// The machine's clock moved forward by however much a test has [`advance`]d it: a test
/// crosses a timeout in one step instead of sleeping through it, and the clock is never
/// behind the times the database writes itself (created, stopped, event times).
///
/// [`advance`]: ManualClock::advance
#[derive(Debug, Default)]
pub struct ManualClock {
    ahead: Mutex<chrono::Duration>,
}

impl ManualClock {
    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.ahead.lock().expect("not poisoned") += to_chrono(by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + *self.ahead.lock().expect("not poisoned")
    }
}

/// `t` as stored: RFC 3339 in UTC with milliseconds (`2026-11-30T12:00:00.000Z`), the form
/// the database writes itself, so stored times compare as text.
pub fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `d` as a chrono duration (saturating at about 292 years).
pub fn to_chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// How long from `earlier` to `later`, zero if `later` is not later.
pub fn since(later: DateTime<Utc>, earlier: DateTime<Utc>) -> Duration {
    (later - earlier).to_std().unwrap_or_default()
}

/// Unix seconds of `t`.
pub fn since_epoch(t: DateTime<Utc>) -> i64 {
    t.timestamp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_sort_as_times_and_match_what_the_database_writes() {
        let clock = ManualClock::default();
        let a = stamp(clock.now());
        clock.advance(Duration::from_millis(1500));
        let b = stamp(clock.now());
        assert!(a < b);
        assert!(since(clock.now(), Utc::now()) > Duration::from_millis(1400));
        assert_eq!(a.len(), "2026-11-30T12:00:00.000Z".len(), "{a}");
        assert!(a.ends_with('Z'));
        assert_eq!(
            since(Utc::now(), clock.now()),
            Duration::ZERO,
            "never behind"
        );
    }
}
