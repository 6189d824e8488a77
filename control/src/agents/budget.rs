//! GPU memory budgets held by measurement. MPS holds each client *process* to the pinned
//! memory limit a task is started with; a task of several CUDA processes could use its
//! budget once per process. The agent measures every process of a task (NVML's per-process
//! accounting, summed per task): a task whose sum stays above its budget for longer than
//! the grace period is stopped (`enforce`) or reported once (`warn`), by its pool's
//! `gpu_budget`.
//!
//! What a task was last seen over is kept here, in memory, per server: a server that
//! restarts (or another that takes a host's syncs) starts the grace period again, which
//! only ever delays a stop, never makes one early.

use parking_lot::Mutex;
use std::collections::HashMap;
use tessera_model::service::GpuAllocation;
use tessera_model::time::Timestamp;
use tessera_model::units::MiB;

/// How far past its budget a task's measure may be before it counts as over: 5 % of the
/// budget or 64 MiB, whichever is more. NVML counts a process's CUDA context with what it
/// allocated, and MPS's pinned limit does not, so a task filled to its budget measures a
/// little above it; the check on a GPU (`scripts/gpu-check.sh`) holds measures within
/// this of what a task allocated.
pub(crate) fn over_budget(measured: MiB, budget: MiB) -> bool {
    measured.0 > budget.0 + (budget.0 / 20).max(64)
}

/// Tasks not seen over their budget for this long are forgotten (their host went quiet).
const FORGET_AFTER_MS: i64 = 3_600_000;

/// How long a task stopped over its budget keeps serving its in-flight requests out of its
/// endpoints: its service's deregistration delay, never longer than the grace it already
/// had over budget.
pub(crate) fn drain_secs(deregistration_delay_secs: u32, grace: std::time::Duration) -> u32 {
    deregistration_delay_secs.min(u32::try_from(grace.as_secs()).unwrap_or(u32::MAX))
}

/// A task's GPU memory budget: what it holds of shared GPUs. A task with a whole GPU has
/// no co-tenant to protect and no budget here (`None`).
pub(crate) fn budget_of(allocations: &[GpuAllocation]) -> Option<MiB> {
    // Called for every running task of every sync: no allocation.
    let mut shared = allocations.iter().filter(|a| !a.dedicated).peekable();
    shared.peek()?;
    Some(MiB(shared.map(|a| a.memory.0).sum()))
}

/// What one measurement of a task means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judgement {
    /// Within its budget (or nothing measured).
    Within,
    /// Over it, for less than the grace period so far.
    Over,
    /// Over it for `secs`, past the grace period: stop it, or say so (once) where the pool
    /// only warns.
    PastGrace {
        measured: MiB,
        budget: MiB,
        secs: u64,
        /// Whether this is the first time past the grace period (a warning is said once).
        first: bool,
    },
}

#[derive(Debug, Clone, Copy)]
struct Over {
    since: Timestamp,
    seen: Timestamp,
    said: bool,
}

/// The tasks over their budget, as this server's syncs measured them.
#[derive(Debug, Default)]
pub(crate) struct Budgets {
    over: Mutex<HashMap<String, Over>>,
}

impl Budgets {
    /// Judges task `id`'s measurement `measured` against `budget` at `now`.
    pub(crate) fn judge(
        &self,
        id: &str,
        budget: MiB,
        measured: Option<MiB>,
        now: Timestamp,
        grace_ms: i64,
    ) -> Judgement {
        let mut over = self.over.lock();
        let Some(measured) = measured.filter(|m| over_budget(*m, budget)) else {
            over.remove(id);
            return Judgement::Within;
        };
        let entry = over.entry(id.to_owned()).or_insert(Over {
            since: now,
            seen: now,
            said: false,
        });
        entry.seen = now;
        let for_ms = now.millis_since(entry.since);
        if for_ms < grace_ms {
            return Judgement::Over;
        }
        let first = !entry.said;
        entry.said = true;
        Judgement::PastGrace {
            measured,
            budget,
            secs: (for_ms / 1000).max(0) as u64,
            first,
        }
    }

    /// Forgets task `id` (it stopped).
    pub(crate) fn forget(&self, id: &str) {
        self.over.lock().remove(id);
    }

    /// Forgets the tasks not measured over their budget for an hour.
    pub(crate) fn prune(&self, now: Timestamp) {
        self.over
            .lock()
            .retain(|_, o| now.millis_since(o.seen) < FORGET_AFTER_MS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_over_budget_task_drains_no_longer_than_its_grace() {
        let grace = std::time::Duration::from_secs(30);
        assert_eq!(drain_secs(5, grace), 5);
        assert_eq!(drain_secs(300, grace), 30);
        assert_eq!(drain_secs(0, grace), 0);
    }
    use tessera_model::GpuUuid;
    use tessera_model::units::ComputeMilli;

    fn at(s: u64) -> Timestamp {
        Timestamp::from_millis(1_800_000_000_000 + s as i64 * 1000).expect("a time")
    }

    fn alloc(memory: u64, dedicated: bool) -> GpuAllocation {
        GpuAllocation {
            gpu: GpuUuid::new("GPU-1").expect("uuid"),
            index: 0,
            memory: MiB(memory),
            compute: ComputeMilli(250),
            dedicated,
        }
    }

    #[test]
    fn a_budget_is_what_a_task_holds_of_shared_gpus() {
        assert_eq!(
            budget_of(&[alloc(4096, false), alloc(2048, false)]),
            Some(MiB(6144))
        );
        assert_eq!(budget_of(&[alloc(80_000, true)]), None);
        assert_eq!(budget_of(&[]), None);
    }

    #[test]
    fn over_past_the_grace_period_only_and_said_once() {
        let b = Budgets::default();
        let grace = 30_000;
        let j = |s, m| b.judge("t", MiB(4096), m, at(s), grace);
        assert_eq!(j(0, Some(MiB(4096))), Judgement::Within, "at the budget");
        assert_eq!(j(0, Some(MiB(4300))), Judgement::Within, "within 5 %");
        assert_eq!(j(1, Some(MiB(5000))), Judgement::Over);
        assert_eq!(j(20, Some(MiB(5200))), Judgement::Over);
        assert_eq!(
            j(31, Some(MiB(5200))),
            Judgement::PastGrace {
                measured: MiB(5200),
                budget: MiB(4096),
                secs: 30,
                first: true
            }
        );
        assert!(matches!(
            j(40, Some(MiB(5200))),
            Judgement::PastGrace { first: false, .. }
        ));
    }

    #[test]
    fn dropping_under_the_budget_starts_the_grace_period_again() {
        let b = Budgets::default();
        let j = |s, m| b.judge("t", MiB(1000), m, at(s), 10_000);
        assert_eq!(j(0, Some(MiB(2000))), Judgement::Over);
        assert_eq!(j(9, Some(MiB(900))), Judgement::Within);
        assert_eq!(j(12, Some(MiB(2000))), Judgement::Over, "a new spell");
        assert_eq!(j(15, None), Judgement::Within, "nothing measured");
        assert_eq!(j(21, Some(MiB(2000))), Judgement::Over);
    }

    #[test]
    fn tasks_are_judged_apart_and_forgotten() {
        let b = Budgets::default();
        assert_eq!(
            b.judge("a", MiB(100), Some(MiB(200)), at(0), 0),
            Judgement::PastGrace {
                measured: MiB(200),
                budget: MiB(100),
                secs: 0,
                first: true
            }
        );
        assert_eq!(
            b.judge("b", MiB(100), Some(MiB(164)), at(0), 0),
            Judgement::Within,
            "64 MiB over a small budget is within"
        );
        b.forget("a");
        assert!(matches!(
            b.judge("a", MiB(100), Some(MiB(200)), at(1), 0),
            Judgement::PastGrace { first: true, .. }
        ));
        b.prune(at(3601));
        assert!(b.over.lock().is_empty(), "not seen for an hour");
    }
}
