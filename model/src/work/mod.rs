//! The work applications complete: where a task's application publishes it (Prometheus
//! text), what an agent measured of it per sync, what a service promises about it (a
//! latency target, alarms, autoscaling), and the read models built from it (rates over
//! time, interference between neighbours on one GPU, alarm and autoscaling states).
//!
//! - `measured`: where an application publishes its work, what an agent reports of it, and
//!   a task's rates now.
//! - `objectives`: what a service promises (latency target, alarms, autoscaling), checked.
//! - Here: the read models of a service's work.

mod measured;
mod objectives;

pub use measured::{
    LatencyBucket, WorkNow, WorkReport, WorkSample, WorkSpec, default_metrics_path,
    histogram_quantile, is_metric_name,
};
pub use objectives::{
    Alarm, AlarmMetric, Autoscaling, Objectives, Published, ScaleMetric, Slo, trim_float,
};

use crate::time::Timestamp;
use serde::{Deserialize, Serialize};

/// A service's work over one bucket of time (summed over its tasks).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkPoint {
    /// Unix seconds at the bucket's start.
    pub at: i64,
    pub completed_per_sec: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p95_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_ms: Option<f64>,
    /// Tasks that reported work in the bucket.
    pub tasks: u32,
}

/// What sharing a GPU with `neighbour` costs a service, against its samples without it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Interference {
    /// A service name, or `*` for "any neighbour" against running alone.
    pub neighbour: String,
    /// Samples (task-buckets) with and without the neighbour.
    pub samples_with: u32,
    pub samples_without: u32,
    /// Relative change of the latency p99 (0.38 = +38 %), when both sides have latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_change: Option<f64>,
    /// Relative change of completed work per task per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_change: Option<f64>,
    /// Confidence that the latency change is real (1 − the two-sided p-value of Welch's
    /// t-test on log latency), or of the completed change when there is no latency.
    pub confidence: f64,
    /// Enough samples and confidence to act on (placement and consolidation use only
    /// these); otherwise shown as "not enough evidence".
    pub established: bool,
    /// `sharing with embed: p99 +38 % (n = 412)`.
    pub summary: String,
}

/// An alarm and what it sees now.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlarmState {
    pub alarm: Alarm,
    /// `ok`, `breaching` (past the threshold, not yet for `for_secs`), `alarm`, or
    /// `insufficient_data`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// Since when it is in this state (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
}

/// `GET /api/v1/services/{name}/work`: the work a service completes, now and over time.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceWork {
    pub service: String,
    /// The task definition's `work`, or absent (then nothing below is measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<WorkSpec>,
    pub objectives: Objectives,
    /// Summed over running tasks' last reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_per_sec: Option<f64>,
    /// Completed work per hour of reserved GPU (each task's share of its GPUs by memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_per_gpu_hour: Option<f64>,
    /// Completed work per second per GiB of reserved GPU memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_per_sec_per_gib: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_p99_ms: Option<f64>,
    /// Tasks whose last report measured work / could not.
    pub tasks_measured: u32,
    pub tasks_unknown: u32,
    /// Why work is unknown, per task with no measurement (task id, reason).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<(String, String)>,
    /// The latency target's verdict: `p99 within target` / `p99 over target` / absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    pub series: Vec<WorkPoint>,
    pub bucket_secs: i64,
    pub interference: Vec<Interference>,
    pub alarms: Vec<AlarmState>,
    /// The last autoscaling decision, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<String>,
    /// Set where the figures are simulated (the demo).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}
