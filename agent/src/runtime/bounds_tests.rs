//! Whatever a task sends through its agent (its metrics text, its health checks' output, an
//! engine's error), the report the agent builds from it is one the server takes whole: it
//! survives JSON, and the server's bounds (the same ones, from `tessera_model::bounds`)
//! find nothing more to drop. A secret of the task never survives into it.

use super::health::shown_output;
use super::work::{WorkTracker, totals};
use proptest::prelude::*;
use std::time::{Duration, Instant};
use tessera_model::agent::{HealthReport, MpsReport, SyncRequest, TaskReport};
use tessera_model::service::TaskHealth;
use tessera_model::work::WorkSpec;

fn spec() -> WorkSpec {
    WorkSpec {
        port: "metrics".into(),
        path: "/metrics".into(),
        completed: "done_total".into(),
        errors: Some("failed_total".into()),
        latency: Some("lat_seconds".into()),
    }
}

/// A value as an application might print one, right or wrong.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u32..1_000_000).prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        Just("NaN".to_owned()),
        Just("+Inf".to_owned()),
        Just("-Inf".to_owned()),
        Just("-1".to_owned()),
        Just("1e309".to_owned()),
        "\\PC{0,12}",
    ]
}

/// One line of metrics text: a sample of a configured metric (with hostile labels and
/// values), or anything at all.
fn line() -> impl Strategy<Value = String> {
    let name = prop_oneof![
        Just("done_total"),
        Just("failed_total"),
        Just("lat_seconds_bucket"),
        Just("other_metric"),
    ];
    prop_oneof![
        (name, "\\PC{0,20}", value(), value())
            .prop_map(|(n, l, le, v)| format!("{n}{{{l},le=\"{le}\"}} {v}")),
        (value(), value()).prop_map(|(le, v)| format!("lat_seconds_bucket{{le=\"{le}\"}} {v}")),
        value().prop_map(|v| format!("done_total {v}")),
        "\\PC{0,80}",
        Just("# TYPE lat_seconds histogram".to_owned()),
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(line(), 0..300).prop_map(|l| l.join("\n"))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_report_the_agent_builds_is_taken_whole(
        first in text(),
        second in text(),
        output in "\\PC{0,3000}",
        secret in "[a-z]{6,12}",
        error in "\\PC{0,5000}",
        many_buckets in 0usize..200,
    ) {
        // Two scrapes make a work report (a histogram of many buckets among them).
        let mut second = second;
        for i in 0..many_buckets {
            second.push_str(&format!("\nlat_seconds_bucket{{le=\"{}\"}} {i}", i + 1));
        }
        let t0 = Instant::now();
        let mut tracker = WorkTracker::default();
        let _ = tracker.observe(t0, totals(&first, &spec()));
        let work = tracker.observe(t0 + Duration::from_secs(5), totals(&second, &spec()));
        // A check that prints the secret somewhere in a long output.
        let raw = format!("{output}{secret}{output}");
        let shown = shown_output(raw, std::slice::from_ref(&secret));
        prop_assert!(!shown.contains(&secret), "the secret was shown: {shown}");
        let mut req = SyncRequest {
            agent_version: None,
            gpus: Vec::new(),
            mps: MpsReport { healthy: true, reason: None, restarts: None },
            tasks: vec![TaskReport {
                task_id: "t-1".into(),
                running: true,
                health: Some(HealthReport { status: TaskHealth::Unhealthy, output: Some(shown) }),
                work,
                error: Some(error),
                ..Default::default()
            }],
            address: None,
            dynamic_ports_free: None,
            capabilities: None,
        };
        // What the agent does before sending.
        let _ = req.sanitize();
        let json = serde_json::to_string(&req).expect("a report serializes");
        let mut arrived: SyncRequest = serde_json::from_str(&json)
            .map_err(|e| TestCaseError::fail(format!("the server cannot read the report: {e}: {json}")))?;
        let dropped = arrived.sanitize();
        prop_assert!(dropped.is_empty(), "the server dropped {dropped:?} of {json}");
        prop_assert_eq!(arrived.tasks.len(), 1);
    }
}
