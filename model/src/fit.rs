//! Fit evidence: whether a task's measured use fits the GPU budget it declared, and what
//! budget to declare instead. The rules are pure functions here, so the API, the console
//! and the tests read one definition.

use crate::MiB;
use serde::{Deserialize, Serialize};

/// How a task's (or a service's) measured peak compares with its memory budget.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The peak stays inside the budget with room to spare.
    Fits,
    /// Nothing measured yet.
    NoEvidence,
    /// The peak is at most half the budget, over enough evidence.
    Oversized,
    /// The peak is at least 90 % of the budget.
    NearBudget,
    /// The peak exceeded the budget, or an allocation failed at the limit.
    OverBudget,
}

impl Verdict {
    pub const ALL: [Verdict; 5] = [
        Verdict::OverBudget,
        Verdict::NearBudget,
        Verdict::Oversized,
        Verdict::Fits,
        Verdict::NoEvidence,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Fits => "fits",
            Verdict::NoEvidence => "no evidence yet",
            Verdict::Oversized => "oversized",
            Verdict::NearBudget => "near budget",
            Verdict::OverBudget => "over budget",
        }
    }

    /// A CSS-friendly name.
    pub fn slug(self) -> &'static str {
        match self {
            Verdict::Fits => "fits",
            Verdict::NoEvidence => "none",
            Verdict::Oversized => "oversized",
            Verdict::NearBudget => "near",
            Verdict::OverBudget => "over",
        }
    }

    /// Whether an operator should look at it (near or over budget).
    pub fn at_risk(self) -> bool {
        matches!(self, Verdict::NearBudget | Verdict::OverBudget)
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The thresholds behind the verdicts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FitRules {
    /// `near budget` from this share of the budget (0.9).
    pub near: f64,
    /// `oversized` up to this share of the budget (0.5) ...
    pub oversized: f64,
    /// ... over at least this much evidence (seconds; 6 hours).
    pub min_evidence_secs: u64,
    /// Suggested budget = peak × (1 + headroom) (0.15) ...
    pub headroom: f64,
    /// ... rounded up to a multiple of this (256 MiB).
    pub round_mib: u64,
}

impl Default for FitRules {
    fn default() -> Self {
        FitRules {
            near: 0.9,
            oversized: 0.5,
            min_evidence_secs: 6 * 3600,
            headroom: 0.15,
            round_mib: 256,
        }
    }
}

/// What was measured of a task (or of every task of a service taken together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The highest GPU memory measured.
    pub peak: Option<MiB>,
    /// The 95th percentile of SM use (percent of the GPU).
    pub sm_p95: Option<u32>,
    /// How long the evidence spans, in seconds.
    pub span_secs: u64,
    /// Allocations that failed at the memory limit.
    pub memory_errors: u64,
}

/// A verdict with the numbers behind it and what to declare instead.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judgement {
    pub verdict: Verdict,
    /// Why, in a sentence with the numbers.
    pub reason: String,
    /// Peak × (1 + headroom), rounded up; `None` without evidence.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub suggested_memory_mib: Option<MiB>,
    /// SM p95 × (1 + headroom), rounded up to 5 %; `None` without SM evidence.
    pub suggested_compute_percent: Option<u32>,
}

/// A duration in words, at the unit that reads best.
pub fn span_words(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 2 * 3600 => format!("{} min", s / 60),
        s if s < 2 * 86_400 => format!("{:.1} h", s as f64 / 3600.0),
        s => format!("{:.1} days", s as f64 / 86_400.0),
    }
}

/// Judges `evidence` against a memory `budget`.
pub fn judge(budget: MiB, evidence: &Evidence, rules: &FitRules) -> Judgement {
    let suggested_memory_mib = evidence.peak.map(|p| {
        let raw = (p.0 as f64 * (1.0 + rules.headroom)).ceil() as u64;
        let round = rules.round_mib.max(1);
        MiB(raw.div_ceil(round).max(1) * round)
    });
    let suggested_compute_percent = evidence.sm_p95.map(|p| {
        let raw = (p as f64 * (1.0 + rules.headroom)).ceil() as u32;
        (raw.div_ceil(5) * 5).clamp(5, 100)
    });
    let share = |p: MiB| {
        if budget.0 == 0 {
            f64::INFINITY
        } else {
            p.0 as f64 / budget.0 as f64
        }
    };
    let (verdict, reason) = match evidence.peak {
        _ if evidence.memory_errors > 0 => (
            Verdict::OverBudget,
            format!(
                "{} GPU memory allocation(s) failed at the {} MiB limit",
                evidence.memory_errors, budget.0
            ),
        ),
        None => (Verdict::NoEvidence, "no GPU memory measured yet".to_owned()),
        Some(p) if p > budget => (
            Verdict::OverBudget,
            format!(
                "peak {} MiB is above the {} MiB budget ({:.0} %)",
                p.0,
                budget.0,
                share(p) * 100.0
            ),
        ),
        Some(p) if share(p) >= rules.near => (
            Verdict::NearBudget,
            format!(
                "peak {} MiB is {:.0} % of the {} MiB budget (near from {:.0} %)",
                p.0,
                share(p) * 100.0,
                budget.0,
                rules.near * 100.0
            ),
        ),
        Some(p) if share(p) <= rules.oversized && evidence.span_secs >= rules.min_evidence_secs => {
            (
                Verdict::Oversized,
                format!(
                    "peak {} MiB is {:.0} % of the {} MiB budget over {}",
                    p.0,
                    share(p) * 100.0,
                    budget.0,
                    span_words(evidence.span_secs)
                ),
            )
        }
        Some(p) if share(p) <= rules.oversized => (
            Verdict::Fits,
            format!(
                "peak {} MiB is {:.0} % of the {} MiB budget; {} of evidence so far, oversized is judged after {}",
                p.0,
                share(p) * 100.0,
                budget.0,
                span_words(evidence.span_secs),
                span_words(rules.min_evidence_secs)
            ),
        ),
        Some(p) => (
            Verdict::Fits,
            format!(
                "peak {} MiB is {:.0} % of the {} MiB budget",
                p.0,
                share(p) * 100.0,
                budget.0
            ),
        ),
    };
    Judgement {
        verdict,
        reason,
        suggested_memory_mib,
        suggested_compute_percent,
    }
}

/// Percentile `q` (0..=100) of `values`, nearest rank; `None` when empty.
pub fn percentile(values: &mut [u32], q: u32) -> Option<u32> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = ((q.min(100) as usize * values.len()).div_ceil(100)).max(1);
    Some(values[rank - 1])
}

/// One task's fit.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFit {
    pub task_id: String,
    pub host: Option<String>,
    /// The GPU memory it reserves (its MPS budget, or its whole GPUs' memory).
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub budget_mib: MiB,
    /// Its compute cap, percent of a GPU, where it has one.
    pub compute_cap_percent: Option<u32>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub peak_mib: Option<MiB>,
    pub sm_p95: Option<u32>,
    pub evidence_secs: u64,
    pub memory_errors: u64,
    pub judgement: Judgement,
}

/// How many tasks have one verdict.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictCount {
    pub verdict: Verdict,
    pub tasks: u32,
}

/// One field a right-sized revision changes.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldChange {
    /// Where in the task definition, e.g. `containers[0].gpu.mps.memory_mib`.
    pub field: String,
    pub from: String,
    pub to: String,
}

/// What right-sizing a service would register: its current revision with the suggested
/// GPU budget, as a diff.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RightSize {
    pub service: String,
    /// The revision it runs now.
    pub current: String,
    pub verdict: Verdict,
    pub reason: String,
    pub changes: Vec<FieldChange>,
    /// The new revision's definition (Tessera's JSON; secrets kept as they are).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub definition: serde_json::Value,
}

/// One point of a service's usage history: across its tasks in one bucket.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsagePoint {
    /// Bucket start, unix seconds.
    pub t: i64,
    /// Mean across tasks of each task's highest memory in the bucket.
    pub memory_mean_mib: u64,
    /// The highest memory of any task in the bucket.
    pub memory_max_mib: u64,
    /// Mean across tasks of the SM median.
    pub sm_mean: Option<u32>,
    /// The highest SM p95 of any task.
    pub sm_p95: Option<u32>,
    pub tasks: u32,
}

/// A service's fit: the verdict over all its tasks' evidence, each task's, and the history.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceFit {
    pub service: String,
    pub pool: String,
    /// The revision the service runs.
    pub task_definition: String,
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub budget_mib: MiB,
    pub compute_cap_percent: Option<u32>,
    /// Whether the budget is an MPS slot (right-sizing applies) or whole GPUs.
    pub shared: bool,
    pub judgement: Judgement,
    pub tasks: Vec<TaskFit>,
    /// Tasks by verdict, worst first; verdicts with no task are left out.
    pub by_verdict: Vec<VerdictCount>,
    /// GPU memory its live tasks reserve, and the sum of their peaks.
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub reserved_mib: MiB,
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub used_mib: MiB,
    /// `hour`, `day` or `month`.
    pub range: String,
    /// Bucket width of `history`, seconds.
    pub bucket_secs: u64,
    pub history: Vec<UsagePoint>,
    /// How long evidence must span before `oversized` is judged (seconds).
    pub min_evidence_secs: u64,
    /// Set when time is compressed (the demo): what to read the figures as.
    pub time_note: Option<String>,
}

/// What a pool would hold with every service at its suggested budget.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolFit {
    pub pool: String,
    pub services: Vec<ServiceFitSummary>,
    /// Tasks by verdict over the pool, worst first.
    pub by_verdict: Vec<VerdictCount>,
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub reserved_mib: MiB,
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub used_mib: MiB,
    /// GPUs that hold a task now.
    pub gpus_in_use: u32,
    /// GPUs that would hold a task if the pool's tasks were placed afresh with the suggested
    /// budgets (by the placement engine, best fit, on the pool's hosts).
    pub gpus_in_use_suggested: u32,
    pub gpus_freed: u32,
    pub gpus_total: u32,
}

/// A service's line in a pool's fit.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceFitSummary {
    pub service: String,
    pub verdict: Verdict,
    pub tasks: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = u64))]
    pub budget_mib: MiB,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>))]
    pub suggested_memory_mib: Option<MiB>,
    /// More tasks of this service the pool could take after the re-pack with suggested
    /// budgets (each service counted alone).
    pub extra_tasks: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(peak: Option<u64>, span_h: u64, errors: u64) -> Evidence {
        Evidence {
            peak: peak.map(MiB),
            sm_p95: Some(40),
            span_secs: span_h * 3600,
            memory_errors: errors,
        }
    }

    #[test]
    fn verdicts_follow_the_table() {
        let r = FitRules::default();
        let budget = MiB(10_000);
        let cases = [
            // (peak, hours of evidence, allocation failures, verdict)
            (None, 0, 0, Verdict::NoEvidence),
            (None, 10, 0, Verdict::NoEvidence),
            (None, 1, 2, Verdict::OverBudget),
            (Some(10_001), 1, 0, Verdict::OverBudget),
            (Some(10_000), 1, 0, Verdict::NearBudget),
            (Some(9_000), 1, 0, Verdict::NearBudget),
            (Some(8_999), 1, 0, Verdict::Fits),
            (Some(5_001), 48, 0, Verdict::Fits),
            (Some(5_000), 6, 0, Verdict::Oversized),
            (Some(1_000), 48, 0, Verdict::Oversized),
            (Some(1_000), 5, 0, Verdict::Fits),
            (Some(4_000), 6, 1, Verdict::OverBudget),
        ];
        for (peak, hours, errors, want) in cases {
            let j = judge(budget, &ev(peak, hours, errors), &r);
            assert_eq!(
                j.verdict, want,
                "peak {peak:?}, {hours} h, {errors} errors: {j:?}"
            );
            assert!(!j.reason.is_empty());
        }
    }

    #[test]
    fn suggestions_add_headroom_and_round_up() {
        let r = FitRules::default();
        let j = judge(MiB(20_480), &ev(Some(4_000), 24, 0), &r);
        // 4000 × 1.15 = 4600 → 4608 (18 × 256).
        assert_eq!(j.suggested_memory_mib, Some(MiB(4_608)));
        // 40 × 1.15 = 46 → 50.
        assert_eq!(j.suggested_compute_percent, Some(50));
        let exact = judge(MiB(1024), &ev(Some(0), 1, 0), &r);
        assert_eq!(exact.suggested_memory_mib, Some(MiB(256)), "never zero");
        let none = judge(MiB(1024), &ev(None, 1, 0), &r);
        assert_eq!(none.suggested_memory_mib, None);
        let full = judge(
            MiB(1024),
            &Evidence {
                sm_p95: Some(99),
                ..ev(Some(100), 1, 0)
            },
            &r,
        );
        assert_eq!(full.suggested_compute_percent, Some(100), "capped at 100 %");
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        assert_eq!(percentile(&mut [], 50), None);
        assert_eq!(percentile(&mut [7], 95), Some(7));
        let mut v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&mut v, 50), Some(50));
        assert_eq!(percentile(&mut v, 95), Some(95));
        assert_eq!(percentile(&mut v, 100), Some(100));
        assert_eq!(percentile(&mut [3, 1, 2], 0), Some(1));
    }
}
