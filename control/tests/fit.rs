//! Fit evidence through the control plane: agents' reports gathered into buckets, verdicts
//! as evidence builds up, right-sizing in one step, and what a pool would hold.

use std::time::Duration;
use tessera_control::ControlConfig;
use tessera_control::testkit::*;
use tessera_control::usage::UsageConfig;
use tessera_model::MiB;
use tessera_model::agent::{MpsReport, SyncRequest, TaskReport};
use tessera_model::fit::{FitRules, Verdict};
use tessera_model::service::{DeploymentConfig, TaskState};

/// The tasks placed on host `h` (assigned or running): what its agent reports.
async fn placed_on(c: &tessera_control::Control, h: &Host) -> Vec<tessera_model::service::Task> {
    c.store()
        .list_tasks(&tessera_control::store::TaskFilter {
            host: Some(h.id.clone()),
            states: vec![TaskState::Assigned, TaskState::Running],
            ..Default::default()
        })
        .await
        .expect("tasks")
}

/// The events of `service` (at most 100).
async fn events_of(
    c: &tessera_control::Control,
    service: &str,
) -> Vec<tessera_model::service::Event> {
    c.views()
        .list_events(&tessera_control::store::EventFilter {
            service: Some(service.into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("events")
}

/// One sync of host `h` reporting every task it runs as using `peak` MiB and `sm` % SM,
/// and `errors` refused allocations.
async fn report(c: &tessera_control::Control, h: &Host, peak: u64, sm: u32, errors: u32) {
    let running = placed_on(c, h).await;
    c.agents()
        .sync_agent(
            &h.id,
            &SyncRequest {
                agent_version: None,
                address: None,
                dynamic_ports_free: None,
                capabilities: None,
                gpus: h.gpus.clone(),
                mps: MpsReport {
                    healthy: true,
                    reason: None,
                    restarts: None,
                },
                tasks: running
                    .iter()
                    .map(|t| TaskReport {
                        task_id: t.id.clone(),
                        running: true,
                        gpu_memory_peak_mib: Some(MiB(peak)),
                        gpu_memory_mib: Some(MiB(peak - 100)),
                        sm_percent: Some(sm),
                        memory_errors: (errors > 0).then_some(errors),
                        ..Default::default()
                    })
                    .collect(),
            },
        )
        .await
        .expect("sync");
}

fn config() -> ControlConfig {
    ControlConfig {
        usage: UsageConfig {
            rules: FitRules {
                min_evidence_secs: 600,
                ..FitRules::default()
            },
            ..UsageConfig::default()
        },
        ..fast()
    }
}

#[tokio::test]
async fn verdicts_follow_the_evidence_and_right_sizing_rolls_out_a_smaller_budget() {
    let e = env(config()).await;
    let c = &e.control;
    let h = host(c, "h1", 2, 24).await;
    let def = register_def(c, "infer", 8, 40).await;
    service(c, "infer", &def, 2, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("placed");
    sync(c, &h).await;
    let fit = c.views().service_fit("infer", "hour").await.expect("fit");
    assert_eq!(fit.judgement.verdict, Verdict::NoEvidence);
    assert_eq!(fit.budget_mib, MiB(8192));
    assert_eq!(fit.compute_cap_percent, Some(40));
    assert!(fit.shared);
    assert!(fit.history.is_empty());

    // Twelve minutes of a third of the budget, a sync every 30 s.
    for _ in 0..24 {
        report(c, &h, 2700, 12, 0).await;
        e.clock.advance(Duration::from_secs(30));
        c.agents().flush_usage(false).await.expect("flushed");
    }
    let fit = c.views().service_fit("infer", "hour").await.expect("fit");
    assert_eq!(fit.judgement.verdict, Verdict::Oversized, "{fit:?}");
    // 2700 × 1.15 = 3105 → 3328 (13 × 256); SM p95 12 × 1.15 = 13.8 → 15.
    assert_eq!(fit.judgement.suggested_memory_mib, Some(MiB(3328)));
    assert_eq!(fit.judgement.suggested_compute_percent, Some(15));
    assert_eq!(fit.tasks.len(), 2);
    assert!(
        fit.tasks
            .iter()
            .all(|t| t.judgement.verdict == Verdict::Oversized)
    );
    assert!(
        fit.history.len() >= 10,
        "a point a minute: {}",
        fit.history.len()
    );
    let last = fit.history.last().expect("history");
    assert_eq!((last.memory_max_mib, last.tasks), (2700, 2));
    assert_eq!(fit.reserved_mib, MiB(2 * 8192));
    assert_eq!(fit.used_mib, MiB(2 * 2700));

    // The pool: both tasks fit one GPU with the suggestion; room for more of them.
    let pool = c.views().pool_fit("gpu").await.expect("pool fit");
    assert_eq!(pool.gpus_total, 2);
    assert_eq!(pool.gpus_in_use_suggested, 1);
    assert!(pool.services[0].extra_tasks > 0, "{pool:?}");
    assert_eq!(pool.by_verdict[0].verdict, Verdict::Oversized);
    assert!(c.views().pool_fit("nope").await.is_err());

    // Right-size: the diff, then one step to a rolling deployment.
    let proposal = c
        .views()
        .right_size_proposal("infer")
        .await
        .expect("proposal");
    assert_eq!(proposal.current, "infer:1");
    let fields: Vec<(&str, &str, &str)> = proposal
        .changes
        .iter()
        .map(|f| (f.field.as_str(), f.from.as_str(), f.to.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            ("containers[0].gpu.mps.memory_mib", "8192", "3328"),
            ("containers[0].gpu.mps.max_compute_percent", "40", "15"),
        ]
    );
    let (_, def2) = c
        .deployments()
        .right_size("infer")
        .await
        .expect("right-sized");
    assert_eq!(def2.revision, 2);
    let detail = c
        .deployments()
        .service_detail("infer")
        .await
        .expect("detail");
    assert_eq!(detail.service.task_definition.to_string(), "infer:2");
    assert!(
        detail
            .deployments
            .iter()
            .any(|d| d.task_definition.to_string() == "infer:2")
    );
}

#[tokio::test]
async fn refused_allocations_make_a_service_over_budget_and_an_unknown_range_is_refused() {
    let e = env(config()).await;
    let c = &e.control;
    let h = host(c, "h1", 1, 24).await;
    let def = register_def(c, "tight", 4, 20).await;
    service(c, "tight", &def, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("placed");
    sync(c, &h).await;
    report(c, &h, 3900, 20, 0).await;
    e.clock.advance(Duration::from_secs(61));
    c.agents().flush_usage(false).await.expect("flushed");
    let fit = c.views().service_fit("tight", "hour").await.expect("fit");
    assert_eq!(fit.judgement.verdict, Verdict::NearBudget, "{fit:?}");
    report(c, &h, 4096, 20, 3).await;
    e.clock.advance(Duration::from_secs(61));
    c.agents().flush_usage(false).await.expect("flushed");
    let fit = c.views().service_fit("tight", "day").await.expect("fit");
    assert_eq!(fit.judgement.verdict, Verdict::OverBudget);
    assert!(
        fit.judgement
            .reason
            .contains("3 GPU memory allocation(s) failed")
    );
    assert!(c.views().service_fit("tight", "week").await.is_err());
    assert!(c.views().service_fit("nope", "hour").await.is_err());
}

#[tokio::test]
async fn the_mps_daemons_restarts_are_recorded_with_the_host() {
    let e = env(config()).await;
    let c = &e.control;
    let h = host(c, "h1", 1, 24).await;
    sync(c, &h).await;
    assert_eq!(
        c.views().get_host(&h.id).await.expect("host").mps_restarts,
        0
    );
    for restarts in [2, 2, 3] {
        c.agents()
            .sync_agent(
                &h.id,
                &SyncRequest {
                    address: None,
                    dynamic_ports_free: None,
                    capabilities: None,
                    gpus: h.gpus.clone(),
                    mps: MpsReport {
                        healthy: true,
                        reason: None,
                        restarts: Some(restarts),
                    },
                    tasks: vec![],
                    agent_version: None,
                },
            )
            .await
            .expect("sync");
        assert_eq!(
            c.views().get_host(&h.id).await.expect("host").mps_restarts,
            restarts
        );
    }
}

#[tokio::test]
async fn a_per_gpu_cap_spreads_a_service_and_the_preview_explains_what_it_refuses() {
    let e = env(config()).await;
    let c = &e.control;
    let h = host(c, "h1", 2, 24).await;
    let def = register_def(c, "capped", 2, 10).await;
    let constraints = tessera_model::service::ServiceConstraints {
        max_per_gpu: Some(1),
        ..Default::default()
    };
    let preview = c
        .scheduler()
        .preview(&tessera_control::inputs::PreviewInput {
            task_definition: def.clone(),
            pool: "gpu".into(),
            count: 3,
            strategy: None,
            constraints: constraints.clone(),
        })
        .await
        .expect("preview");
    assert_eq!((preview.placed, preview.unplaced), (2, 1));
    let why = preview.tasks[2].message.clone().expect("explained");
    assert!(why.contains("constraints"), "{why}");
    c.deployments()
        .create_service(&tessera_control::inputs::ServiceInput {
            name: "capped".into(),
            task_definition: def,
            pool: "gpu".into(),
            project: None,
            priority: None,
            desired_count: 3,
            strategy: Some("binpack".into()),
            constraints,
            deployment: Some(DeploymentConfig::default()),
            stop_timeout_secs: 5,
            deregistration_delay_secs: 0,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        })
        .await
        .expect("service");
    c.reconcile_once().await.expect("placed");
    sync(c, &h).await;
    let placed = tasks(c, "capped", &[TaskState::Assigned, TaskState::Running]).await;
    assert_eq!(
        placed.len(),
        2,
        "binpack would stack them; the cap spreads them"
    );
    let gpus: std::collections::BTreeSet<u32> =
        placed.iter().map(|t| t.allocations[0].index).collect();
    assert_eq!(gpus.len(), 2);
    let pending = tasks(c, "capped", &[TaskState::Pending]).await;
    assert_eq!(pending.len(), 1);
    assert!(
        pending[0]
            .placement_message
            .as_deref()
            .is_some_and(|m| m.contains("constraints")),
        "{:?}",
        pending[0].placement_message
    );
    // A cap out of range is refused with its field.
    let bad = c
        .deployments()
        .create_service(&tessera_control::inputs::ServiceInput {
            name: "bad".into(),
            task_definition: "capped:1".into(),
            pool: "gpu".into(),
            project: None,
            priority: None,
            desired_count: 1,
            strategy: None,
            constraints: tessera_model::service::ServiceConstraints {
                max_per_gpu: Some(0),
                ..Default::default()
            },
            deployment: None,
            stop_timeout_secs: 5,
            deregistration_delay_secs: 0,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        })
        .await
        .expect_err("refused");
    assert!(
        bad.to_string().contains("max_per_gpu") || format!("{bad:?}").contains("max_per_gpu"),
        "{bad:?}"
    );
}

/// One sync of `h` reporting each task's GPU memory now (`mib` by task id; the others
/// report nothing measured).
async fn measured(c: &tessera_control::Control, h: &Host, mib: &[(&str, u64)]) {
    let running = placed_on(c, h).await;
    let tasks: Vec<TaskReport> = running
        .iter()
        .map(|t| TaskReport {
            task_id: t.id.clone(),
            running: true,
            gpu_memory_mib: mib.iter().find(|(id, _)| *id == t.id).map(|(_, m)| MiB(*m)),
            ..Default::default()
        })
        .collect();
    c.agents()
        .sync_agent(&h.id, &tessera_control::testkit::report(h, tasks))
        .await
        .expect("sync");
}

/// A task whose processes together hold more GPU memory than its budget (MPS holds each
/// process alone to it) is stopped once the grace period has passed, its service's events
/// saying by how much; its neighbour on the same GPU runs on. A pool that only warns says
/// so once and stops nothing.
#[tokio::test]
async fn a_task_over_its_gpu_memory_budget_is_stopped_after_the_grace_period() {
    let e = env(ControlConfig {
        gpu_budget_grace: Duration::from_secs(30),
        ..config()
    })
    .await;
    let c = &e.control;
    let h = host(c, "h1", 1, 24).await;
    let def = register_def(c, "infer", 4, 25).await;
    service(c, "infer", &def, 2, DeploymentConfig::default()).await;
    c.deployments()
        .update_service(
            "infer",
            &tessera_model::api::ServicePatch {
                deregistration_delay_secs: Some(5),
                ..Default::default()
            },
        )
        .await
        .expect("a deregistration delay");
    c.reconcile_once().await.expect("placed");
    sync(c, &h).await;
    let running = tasks(c, "infer", &[TaskState::Running]).await;
    assert_eq!(running.len(), 2, "both share the GPU");
    assert_eq!(running[0].allocations[0].gpu, running[1].allocations[0].gpu);
    let (hog, neighbour) = (running[0].id.clone(), running[1].id.clone());

    // Two processes of 3 GiB each: 6 GiB against a 4 GiB budget, within MPS's limit each.
    measured(c, &h, &[(&hog, 6144), (&neighbour, 3000)]).await;
    e.clock.advance(Duration::from_secs(20));
    measured(c, &h, &[(&hog, 6144), (&neighbour, 3000)]).await;
    assert_eq!(
        tasks(c, "infer", &[TaskState::Running]).await.len(),
        2,
        "within the grace period nothing is stopped"
    );
    e.clock.advance(Duration::from_secs(11));
    measured(c, &h, &[(&hog, 6144), (&neighbour, 3000)]).await;
    // Stopping: its GPU memory stays held until its agent reports it gone.
    let stopping = tasks(c, "infer", &[TaskState::Stopping]).await;
    assert_eq!(stopping.len(), 1);
    assert_eq!(stopping[0].id, hog);
    assert!(!stopping[0].allocations.is_empty(), "still holding its GPU");
    // Out of its endpoints, its in-flight requests get the service's deregistration delay
    // (5 s here; never more than the grace it already had).
    let drain = stopping[0].drain_until.expect("drains");
    let now =
        tessera_model::time::Timestamp::from_utc(tessera_control::clock::Clock::now(&*e.clock));
    assert!(
        (3_000..=5_000).contains(&drain.millis_since(now)),
        "{drain} against {now}"
    );
    measured(c, &h, &[(&neighbour, 3000)]).await;
    let stopped = tasks(c, "infer", &[TaskState::Stopped]).await;
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0].id, hog);
    let reason = stopped[0].stop_reason.clone().expect("a reason");
    assert!(
        reason.starts_with(
            "gpu memory over budget: 6144 MiB measured against 4096 MiB, 2048 MiB over, for 31 s"
        ),
        "{reason}"
    );
    let still: Vec<String> = tasks(c, "infer", &[TaskState::Running])
        .await
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(still, vec![neighbour.clone()], "the neighbour runs on");
    let events = events_of(c, "infer").await;
    assert!(
        events
            .iter()
            .any(|ev| ev.message.contains(&hog) && ev.message.contains("2048 MiB over")),
        "{events:?}"
    );

    // Where the pool only warns: said once, nothing stopped.
    c.deployments()
        .update_pool(
            &tessera_model::PoolName::new("gpu").expect("valid"),
            &tessera_model::api::PoolPatch {
                gpu_budget: Some("warn".into()),
                ..Default::default()
            },
        )
        .await
        .expect("warn mode");
    for _ in 0..3 {
        measured(c, &h, &[(&neighbour, 9000)]).await;
        e.clock.advance(Duration::from_secs(31));
    }
    measured(c, &h, &[(&neighbour, 9000)]).await;
    assert!(
        tasks(c, "infer", &[TaskState::Running])
            .await
            .iter()
            .any(|t| t.id == neighbour),
        "a warning stops nothing"
    );
    let events = events_of(c, "infer").await;
    let warned = events
        .iter()
        .filter(|ev| ev.message.contains(&neighbour) && ev.message.contains("only warns"))
        .count();
    assert_eq!(warned, 1, "said once: {events:?}");
}

/// A pool's `gpu_budget` is `enforce` or `warn`, and anything else is refused naming the
/// field, with nothing changed.
#[tokio::test]
async fn a_pools_gpu_budget_is_enforce_or_warn() {
    let e = env(config()).await;
    let c = &e.control;
    let gpu = tessera_model::PoolName::new("gpu").expect("valid");
    let pool = c.store().get_pool(&gpu).await.expect("pool");
    assert_eq!(
        pool.gpu_budget,
        tessera_model::GpuBudget::Enforce,
        "the default"
    );
    let err = c
        .deployments()
        .update_pool(
            &gpu,
            &tessera_model::api::PoolPatch {
                gpu_budget: Some("ignore".into()),
                ..Default::default()
            },
        )
        .await
        .expect_err("refused");
    let said = err.to_string();
    assert!(
        said.contains("gpu_budget") && said.contains("enforce warn"),
        "{said}"
    );
    assert_eq!(c.store().get_pool(&gpu).await.expect("pool"), pool);
}
