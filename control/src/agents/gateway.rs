//! The agent gateway's state: what syncs leave to write at the next tick, and what their
//! answers need often.

use crate::cache::Cache;
use crate::parts::UsageBuffer;
use parking_lot::Mutex;
use std::collections::HashMap;
use tessera_model::HostId;
use tessera_model::work::WorkNow;

/// Each deployment's stop timeout is cached; past this many, the oldest are read again.
const MAX_DEPLOYMENTS_CACHED: usize = 100_000;

/// How long a drop recorded as an event is not recorded again, and how many are kept.
pub(crate) const DROPS_REMEMBERED: std::time::Duration = std::time::Duration::from_secs(3600);
const MAX_DROPS_REMEMBERED: usize = 100_000;

/// How long an agent token found stays trusted without a lookup, and how many are kept.
pub(crate) const TOKEN_REMEMBERED: std::time::Duration = std::time::Duration::from_secs(30);
const MAX_TOKENS_REMEMBERED: usize = 200_000;
/// Lookups of tokens not remembered at once, at most.
const TOKEN_LOOKUPS: usize = 32;

/// What agents' syncs received here leave behind.
pub(crate) struct Gateway {
    /// When each host last synced with nothing else to say, not yet written: written
    /// together every tick, and at the start of every pass (before lost hosts are looked
    /// for), so a quiet sync costs no write of its own.
    pub(super) heartbeats: Mutex<HashMap<HostId, String>>,
    /// Each deployment's stop timeout (its service's, which never changes; deployment ids
    /// are never reused).
    pub(super) stop_timeouts: Cache<i64, u32>,
    /// Measured use received and not written yet.
    pub(super) usage: Mutex<UsageBuffer>,
    /// Each task's work as its syncs here reported it: written with the heartbeats when it
    /// says something new.
    pub(super) work: Mutex<WorkLatest>,
    /// The faults of reports recorded as events lately (a drop, a refused GPU), each
    /// recorded once an hour however often its agent sends it again.
    pub(super) said: Cache<String, ()>,
    /// Agent tokens found (their hashes) and their hosts, for [`TOKEN_REMEMBERED`]: a
    /// revoked token works on another server for at most that long (on this one, not at
    /// all: revoking forgets them).
    pub(super) tokens: Cache<String, HostId>,
    /// Lookups of agent tokens not remembered, running at once.
    pub(super) token_lookups: tokio::sync::Semaphore,
    /// The tasks measured over their GPU memory budget, and since when.
    pub(super) budgets: super::budget::Budgets,
}

impl Default for Gateway {
    fn default() -> Self {
        Gateway {
            heartbeats: Mutex::default(),
            stop_timeouts: Cache::new(MAX_DEPLOYMENTS_CACHED),
            usage: Mutex::default(),
            work: Mutex::default(),
            said: Cache::with_max_age(MAX_DROPS_REMEMBERED, DROPS_REMEMBERED),
            tokens: Cache::with_max_age(MAX_TOKENS_REMEMBERED, TOKEN_REMEMBERED),
            token_lookups: tokio::sync::Semaphore::new(TOKEN_LOOKUPS),
            budgets: Default::default(),
        }
    }
}

/// Work reports received by this server: the ones to write, and what was last written of
/// each task. A report is written when it says something new: a rate or percentile that
/// moved by more than [`WORK_CHANGE`], work turning unknown or known, or the last write
/// older than [`WORK_REFRESH`] s. A steady fleet's syncs then cost no write each, and what
/// the store holds is never further than that from what was measured.
#[derive(Debug, Default)]
pub(crate) struct WorkLatest {
    pending: HashMap<String, String>,
    /// Per task: when its stored figures were written (unix seconds), and them.
    written: HashMap<String, (i64, WorkNow)>,
}

/// How far (a fraction) a figure may move before it is written again.
const WORK_CHANGE: f64 = 0.1;
/// How old (seconds) a task's stored work may get while it says the same.
pub(crate) const WORK_REFRESH: i64 = 30;

/// Whether `new` says something `old` does not, by [`WORK_CHANGE`].
fn work_moved(old: &WorkNow, new: &WorkNow) -> bool {
    let moved = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => (a - b).abs() > WORK_CHANGE * a.abs().max(b.abs()).max(1e-9),
        (None, None) => false,
        _ => true,
    };
    old.unknown.is_some() != new.unknown.is_some()
        || moved(old.completed_per_sec, new.completed_per_sec)
        || moved(old.errors_per_sec, new.errors_per_sec)
        || moved(old.latency_p50_ms, new.latency_p50_ms)
        || moved(old.latency_p95_ms, new.latency_p95_ms)
        || moved(old.latency_p99_ms, new.latency_p99_ms)
}

impl WorkLatest {
    /// A task's new report, measured at `now`: kept to write when it says something new.
    pub(crate) fn offer(&mut self, task: &str, work: WorkNow, now: i64) {
        let due = match self.written.get(task) {
            None => true,
            Some((at, old)) => now - at >= WORK_REFRESH || work_moved(old, &work),
        };
        if !due {
            return;
        }
        if let Ok(json) = serde_json::to_string(&work) {
            self.pending.insert(task.to_owned(), json);
            self.written.insert(task.to_owned(), (now, work));
        }
    }

    /// The reports to write now; tasks not heard of for long are forgotten.
    pub(crate) fn take(&mut self, now: i64) -> Vec<(String, String)> {
        self.written
            .retain(|_, (at, _)| now - *at < 10 * WORK_REFRESH);
        std::mem::take(&mut self.pending).into_iter().collect()
    }

    /// Reports whose write failed, to try again.
    pub(crate) fn put_back(&mut self, work: Vec<(String, String)>) {
        for (id, w) in work {
            self.pending.entry(id).or_insert(w);
        }
    }
}
