//! The control plane's time. Every decision that depends on how long something has lasted
//! (a host silent past the lost timeout, the grace after a restart, a crash-looping task's
//! backoff, retention) reads [`Clock::now`], and the times those decisions compare against
//! (a host's last sync) are written from it too, so a test moves time forward with
//! [`ManualClock::advance`] instead of sleeping. (Times the database records for display and
//! retention, such as when a task stopped, come from the database's own clock; a manual
//! clock is never behind it.)

use chrono::{DateTime, SecondsFormat, Utc};
use parking_lot::Mutex;
use std::time::Duration;

/// A source of the current time: this machine's clock, which may be wrong.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> DateTime<Utc>;
    /// How far a test moved time forward for the whole fleet (the database included):
    /// added to the fleet's time, which is otherwise the database's.
    fn advanced(&self) -> chrono::Duration {
        chrono::Duration::zero()
    }
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
        *self.ahead.lock() += to_chrono(by);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + *self.ahead.lock()
    }

    fn advanced(&self) -> chrono::Duration {
        *self.ahead.lock()
    }
}

/// A machine clock that is wrong by a fixed amount (a server whose clock drifted): what
/// the fleet's time must be immune to.
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock(pub chrono::Duration);

impl Clock for SkewedClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.0
    }
}

/// The fleet's time, one for every server sharing the database: the database's clock,
/// read at each tick and carried forward by this machine's monotonic clock in between
/// (plus what a test advanced). Times that decide liveness and the lease (a host's last
/// sync, the lost cutoff, the lease's expiry) come from it, so a server whose own clock
/// is off neither declares healthy hosts lost nor takes a lease that has not expired.
/// It never moves backwards. Before the first reading it is the machine's clock.
#[derive(Debug)]
pub struct FleetClock {
    state: Mutex<FleetState>,
    /// When it was made, and what a test had advanced by then: its start, in the fleet's
    /// time, once a reading says what that is.
    created: std::time::Instant,
    advanced_at_creation: chrono::Duration,
}

#[derive(Debug, Default)]
struct FleetState {
    /// The database's time and the instant it was read (mid-way through the query).
    anchor: Option<(DateTime<Utc>, std::time::Instant)>,
    last: Option<DateTime<Utc>>,
    /// The fleet's time at the first reading: when this control plane started.
    started: Option<DateTime<Utc>>,
}

impl FleetClock {
    /// A fleet clock starting now, by `clock`.
    pub fn new(clock: &dyn Clock) -> FleetClock {
        FleetClock {
            state: Mutex::default(),
            created: std::time::Instant::now(),
            advanced_at_creation: clock.advanced(),
        }
    }

    /// Takes a reading of the database's clock, `db`, made at `at`.
    pub fn sample(&self, db: DateTime<Utc>, at: std::time::Instant) {
        let mut s = self.state.lock();
        s.anchor = Some((db, at));
        if s.started.is_none() {
            let ago = to_chrono(at.saturating_duration_since(self.created));
            s.started = Some(db - ago + self.advanced_at_creation);
        }
    }

    /// Now, by the fleet's clock.
    pub fn now(&self, clock: &dyn Clock) -> DateTime<Utc> {
        let mut s = self.state.lock();
        let t = match s.anchor {
            Some((db, at)) => db + to_chrono(at.elapsed()) + clock.advanced(),
            None => clock.now(),
        };
        let t = s.last.map_or(t, |last| last.max(t));
        s.last = Some(t);
        t
    }

    /// When this control plane started, by the fleet's clock (`None` before the first
    /// reading of the database's).
    pub fn started(&self) -> Option<DateTime<Utc>> {
        self.state.lock().started
    }
}

/// `t` as stored: RFC 3339 in UTC with milliseconds (`2026-11-30T12:00:00.000Z`), the form
/// the database writes itself, so stored times compare as text.
pub fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `t` as the model carries times: compared as a time, written as [`stamp`] writes it.
pub fn instant(t: DateTime<Utc>) -> tessera_model::time::Timestamp {
    tessera_model::time::Timestamp::from_utc(t)
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
    fn the_fleet_clock_follows_the_database_and_never_moves_back() {
        let skewed = SkewedClock(chrono::Duration::seconds(30));
        let fleet = FleetClock::new(&SystemClock);
        // Before a reading: the machine's clock, however wrong.
        assert!(fleet.now(&skewed) > Utc::now() + chrono::Duration::seconds(29));
        let db = Utc::now();
        fleet.sample(db, std::time::Instant::now());
        // Read after: not backwards (it stands still until the database catches up)...
        let held = fleet.now(&skewed);
        assert!(held >= db + chrono::Duration::seconds(29));
        // ...and a server reading the same database without skew agrees once it has.
        let other = FleetClock::new(&SystemClock);
        other.sample(db, std::time::Instant::now());
        let t = other.now(&SystemClock);
        assert!(since(t, db) < Duration::from_secs(1), "{t} vs {db}");
        // A test's advance moves the fleet's time.
        let manual = ManualClock::default();
        let f = FleetClock::new(&manual);
        f.sample(db, std::time::Instant::now());
        manual.advance(Duration::from_secs(60));
        assert!(since(f.now(&manual), db) >= Duration::from_secs(60));
        assert!(
            f.started()
                .is_some_and(|s| since(s, db) < Duration::from_secs(1))
        );
    }

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
