//! What the reconcile passes remember from one to the next.

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};

/// The reconcile passes' memory.
#[derive(Default)]
pub(crate) struct Passes {
    /// Serialises passes: the loop and tests calling `reconcile_once` directly.
    pub(super) pass: tokio::sync::Mutex<()>,
    /// Per deployment: the failures already answered with a delay, and until when new
    /// tasks wait (crash-loop backoff).
    pub(super) restart_backoff: Mutex<HashMap<i64, Backoff>>,
    /// When old rows were last pruned.
    pub(super) last_prune: Mutex<Option<DateTime<Utc>>>,
    /// The changes read, to look only at what changed.
    pub(super) memory: Mutex<PassMemory>,
    /// Alarm watches and autoscaling memory of the services this server reconciles.
    pub(super) watches: Mutex<Watches>,
    /// Pools with a capacity provider: their hosts consolidation could free, and since when.
    pub(super) freeable: Mutex<HashMap<tessera_model::PoolName, super::consolidate::Freeable>>,
}

/// A deployment's crash-loop backoff: the failures already answered with a delay, and
/// until when its new tasks wait.
pub(crate) type Backoff = (u32, DateTime<Utc>);

/// What the reconcile passes remember from one to the next, to look at what changed.
#[derive(Debug, Default)]
pub(crate) struct PassMemory {
    /// The newest change read; `None` until the first (full) pass.
    pub(super) seen: Option<i64>,
    /// Changes inside the late-commit window already acted on.
    pub(super) acted: HashSet<i64>,
    /// Services every pass looks at (they move with time).
    pub(super) every_pass: BTreeSet<String>,
    /// When the last full pass began.
    pub(super) last_full: Option<std::time::Instant>,
    /// When the changes read were last deleted, and whether some have been read since.
    pub(super) last_forget: Option<std::time::Instant>,
    pub(super) unforgotten: bool,
    /// The last pass: whether it was full, and how many services it looked at.
    pub(super) last_scope: (bool, usize),
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
    pub(super) breaching_since: Option<i64>,
    pub(super) fired_at: Option<i64>,
    pub(super) value: Option<f64>,
}

/// Each service's alarm watches and autoscaling memory (kept by the server that
/// reconciles; a new one starts watching afresh).
#[derive(Debug, Default)]
pub(crate) struct Watches {
    pub(super) alarms: HashMap<(String, usize), Watch>,
    /// (last scale-out, last scaling of either kind), unix seconds.
    pub(super) scaled: HashMap<String, (Option<i64>, Option<i64>)>,
    /// The last autoscaling decision, in words.
    pub(super) scaling: HashMap<String, String>,
    /// When each primary deployment reached its steady state (for the bake time).
    pub(super) steady_at: HashMap<i64, i64>,
}
