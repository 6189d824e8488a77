//! What the reconcile passes remember from one to the next.

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use tessera_model::work::Interference;

/// The reconcile passes' memory.
#[derive(Default)]
pub(crate) struct Passes {
    /// Serialises passes: the loop and tests calling `reconcile_once` directly.
    pub pass: tokio::sync::Mutex<()>,
    /// Per deployment: the failures already answered with a delay, and until when new
    /// tasks wait (crash-loop backoff).
    pub restart_backoff: Mutex<HashMap<i64, Backoff>>,
    /// When old rows were last pruned.
    pub last_prune: Mutex<Option<DateTime<Utc>>>,
    /// The changes read, to look only at what changed.
    pub memory: Mutex<PassMemory>,
    /// Alarm watches and autoscaling memory of the services this server reconciles.
    pub watches: Mutex<Watches>,
}

/// What the reconcile passes last reported of one service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServiceState {
    /// Why its pending tasks could not be placed.
    pub pending: Option<String>,
    /// Why the last pass could not reconcile it.
    pub failure: Option<String>,
    /// Failures of the primary deployment already answered with a restart delay.
    pub backoff: Option<u32>,
    /// During a rollout: (deployment, its running tasks) as last reported.
    pub progress: Option<(i64, usize)>,
    /// Every desired task runs the primary revision.
    pub steady: bool,
}

/// A deployment's crash-loop backoff: the failures already answered with a delay, and
/// until when its new tasks wait.
pub(crate) type Backoff = (u32, DateTime<Utc>);

/// What the reconcile passes remember from one to the next, to look at what changed.
#[derive(Debug, Default)]
pub(crate) struct PassMemory {
    /// The newest change read; `None` until the first (full) pass.
    pub seen: Option<i64>,
    /// Changes inside the late-commit window already acted on.
    pub acted: HashSet<i64>,
    /// Services every pass looks at (they move with time).
    pub every_pass: BTreeSet<String>,
    /// When the last full pass began.
    pub last_full: Option<std::time::Instant>,
    /// When the changes read were last deleted, and whether some have been read since.
    pub last_forget: Option<std::time::Instant>,
    pub unforgotten: bool,
    /// The last pass: whether it was full, and how many services it looked at.
    pub last_scope: (bool, usize),
}

impl PassMemory {
    pub(crate) fn full_due(&self, every: std::time::Duration) -> bool {
        self.seen.is_none() || self.last_full.is_none_or(|t| t.elapsed() >= every)
    }

    /// The next pass looks at everything (the scheduler lease changed hands: another
    /// server's passes may have deleted changes this one has not read).
    pub(crate) fn forget(&mut self) {
        self.seen = None;
    }
}

/// One alarm's watch: since when its figure breaches, and since when it is in alarm.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Watch {
    pub breaching_since: Option<i64>,
    pub fired_at: Option<i64>,
    pub value: Option<f64>,
}

/// A service's interference estimates and its p99 alone, cached (they come from a day of
/// usage buckets).
pub(crate) type Estimates = Arc<(Vec<Interference>, Option<f64>)>;

/// Each service's alarm watches and autoscaling memory (kept by the server that
/// reconciles; a new one starts watching afresh).
#[derive(Debug, Default)]
pub(crate) struct Watches {
    pub alarms: HashMap<(String, usize), Watch>,
    /// (last scale-out, last scaling of either kind), unix seconds.
    pub scaled: HashMap<String, (Option<i64>, Option<i64>)>,
    /// The last autoscaling decision, in words.
    pub scaling: HashMap<String, String>,
    /// When each primary deployment reached its steady state (for the bake time).
    pub steady_at: HashMap<i64, i64>,
}
