//! The control plane end to end: hosts registered through the agent API, services scaled,
//! rolled out and rolled back, hosts lost and impaired, and many clients at once.

use std::collections::HashSet;
use tessera_control::inputs::ServicePatch;
use tessera_control::testkit::*;
use tessera_model::HostStatus;
use tessera_model::service::{DeploymentConfig, DeploymentStatus, TaskState};

#[tokio::test]
async fn scaling_places_tasks_on_registered_hosts_and_agents_get_their_env() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    let b = host(c, "b", 2, 24).await;
    let def = register_def(c, "infer", 10, 40).await;
    service(c, "infer", &def, 8, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    // 4 GPUs × 24 GiB: two 10 GiB / 40 % slots per GPU fit; 8 tasks fill them exactly.
    let placed = tasks(c, "infer", &[TaskState::Assigned]).await;
    assert_eq!(placed.len(), 8);
    assert_no_overcommit(c).await;
    let per_gpu: HashSet<_> = placed
        .iter()
        .map(|t| t.allocations[0].gpu.clone())
        .collect();
    assert_eq!(per_gpu.len(), 4);

    let resp = sync(c, &a).await;
    assert_eq!(resp.tasks.len(), 4, "host a runs half");
    let env0 = &resp.tasks[0].containers[0].env;
    assert!(env0["CUDA_VISIBLE_DEVICES"].starts_with("GPU-a-"));
    assert_eq!(env0["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=10240M");
    assert_eq!(env0["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "40");
    assert!(resp.tasks[0].mps);
    sync(c, &a).await;
    sync(c, &b).await;
    assert_eq!(tasks(c, "infer", &[TaskState::Running]).await.len(), 8);

    // A ninth task fits nowhere: it stays pending with the reason.
    c.deployments()
        .update_service(
            "infer",
            &ServicePatch {
                desired_count: Some(9),
                task_definition: None,
                ..Default::default()
            },
        )
        .await
        .expect("scale");
    c.reconcile_once().await.expect("pass");
    let pending = tasks(c, "infer", &[TaskState::Pending]).await;
    assert_eq!(pending.len(), 1);
    let why = pending[0].placement_message.as_deref().expect("explained");
    assert!(why.contains("no GPU has room"), "{why}");

    // Scaling down stops tasks; the agent's next sync stops them.
    c.deployments()
        .update_service(
            "infer",
            &ServicePatch {
                desired_count: Some(2),
                task_definition: None,
                ..Default::default()
            },
        )
        .await
        .expect("scale");
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    sync(c, &b).await;
    assert_eq!(tasks(c, "infer", LIVE).await.len(), 2);
    assert_no_overcommit(c).await;
}

/// Runs reconcile passes and agent syncs until `done` or the step budget runs out,
/// checking the deployment bounds at every step.
async fn converge(
    c: &tessera_control::Control,
    hosts: &[&Host],
    desired: usize,
    min_running: usize,
    max_live: usize,
) {
    for _ in 0..30 {
        c.reconcile_once().await.expect("pass");
        let live = tasks(c, "web", LIVE).await;
        let counted = live
            .iter()
            .filter(|t| t.state != TaskState::Stopping)
            .count();
        assert!(
            counted <= max_live,
            "{counted} live tasks exceed maximum_percent"
        );
        let running = live
            .iter()
            .filter(|t| t.state == TaskState::Running)
            .count();
        assert!(
            running >= min_running,
            "{running} running tasks under minimum_healthy_percent"
        );
        for h in hosts {
            sync(c, h).await;
        }
        let deployments = c
            .store()
            .list_deployments("web")
            .await
            .expect("deployments");
        if deployments
            .iter()
            .all(|d| d.status != DeploymentStatus::Active)
            && tasks(c, "web", &[TaskState::Running]).await.len() == desired
            && tasks(c, "web", LIVE).await.len() == desired
        {
            return;
        }
    }
    panic!("the deployment did not converge");
}

#[tokio::test]
async fn rolling_deployment_respects_minimum_healthy_and_maximum_percent() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 4, 24).await;
    let b = host(c, "b", 4, 24).await;
    let v1 = register_def(c, "web", 4, 10).await;
    let v2 = register_def(c, "web", 5, 10).await;
    let config = DeploymentConfig {
        minimum_healthy_percent: 50,
        maximum_percent: 150,
    };
    service(c, "web", &v1, 4, config).await;
    converge(c, &[&a, &b], 4, 0, 4).await;
    assert!(
        tasks(c, "web", &[TaskState::Running])
            .await
            .iter()
            .all(|t| t.task_definition.to_string() == v1)
    );

    c.deployments()
        .update_service(
            "web",
            &ServicePatch {
                desired_count: None,
                task_definition: Some(v2.clone()),
                ..Default::default()
            },
        )
        .await
        .expect("deploy");
    // From here on: at least 2 running, at most 6 live (4 × 150 %).
    converge(c, &[&a, &b], 4, 2, 6).await;
    let running = tasks(c, "web", &[TaskState::Running]).await;
    assert!(
        running.iter().all(|t| t.task_definition.to_string() == v2),
        "all tasks on the new revision"
    );
    let deployments = c
        .store()
        .list_deployments("web")
        .await
        .expect("deployments");
    assert_eq!(deployments[0].status, DeploymentStatus::Primary);
    assert_eq!(deployments[1].status, DeploymentStatus::Completed);
    let events = c
        .store()
        .list_events(&tessera_control::store::EventFilter {
            service: Some("web".into()),
            limit: 50,
            ..Default::default()
        })
        .await
        .expect("events");
    assert!(
        events
            .iter()
            .any(|e| e.message.contains("deployment") && e.message.contains("started"))
    );
    assert!(events.iter().any(|e| e.message.contains("steady state")));
    assert!(
        events.iter().any(|e| e.message.contains("in progress")),
        "{events:?}"
    );
    assert_no_overcommit(c).await;
}

#[tokio::test]
async fn failing_deployment_is_rolled_back_by_the_circuit_breaker() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 4, 24).await;
    let v1 = register_def(c, "web", 4, 10).await;
    let v2 = register_def(c, "web", 4, 10).await;
    service(c, "web", &v1, 2, DeploymentConfig::default()).await;
    converge(c, &[&a], 2, 0, 2).await;
    c.deployments()
        .update_service(
            "web",
            &ServicePatch {
                desired_count: None,
                task_definition: Some(v2.clone()),
                ..Default::default()
            },
        )
        .await
        .expect("deploy");
    // Every task of the new revision exits with code 1 as soon as it starts.
    for _ in 0..20 {
        c.reconcile_once().await.expect("pass");
        let crashing: Vec<(String, i32)> =
            tasks(c, "web", &[TaskState::Assigned, TaskState::Running])
                .await
                .into_iter()
                .filter(|t| t.task_definition.to_string() == v2)
                .map(|t| (t.id, 1))
                .collect();
        sync_with(c, &a, true, &crashing).await;
        let service = c.store().get_service("web").await.expect("service");
        if service.task_definition.to_string() == v1 {
            break;
        }
    }
    let service = c.store().get_service("web").await.expect("service");
    assert_eq!(
        service.task_definition.to_string(),
        v1,
        "rolled back to the last good revision"
    );
    let deployments = c
        .store()
        .list_deployments("web")
        .await
        .expect("deployments");
    assert!(
        deployments
            .iter()
            .any(|d| d.status == DeploymentStatus::RolledBack && d.failed_tasks >= 3)
    );
    let events = c
        .store()
        .list_events(&tessera_control::store::EventFilter {
            service: Some("web".into()),
            limit: 50,
            ..Default::default()
        })
        .await
        .expect("events");
    assert!(
        events.iter().any(|e| e.message.contains("rolled back")),
        "{events:?}"
    );
    // The old revision kept running throughout (minimum healthy 100 %).
    assert_eq!(tasks(c, "web", &[TaskState::Running]).await.len(), 2);
}

#[tokio::test]
async fn a_lost_host_has_its_tasks_replaced_elsewhere_and_stopped_if_it_returns() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    let b = host(c, "b", 2, 24).await;
    let def = register_def(c, "web", 8, 20).await;
    service(c, "web", &def, 2, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    sync(c, &b).await;
    let on_a: Vec<String> = tasks(c, "web", LIVE)
        .await
        .into_iter()
        .filter(|t| t.host.as_ref() == Some(&a.id))
        .map(|t| t.id)
        .collect();
    // Host a stops syncing; b keeps going. Lost after 2 intervals of 1 s.
    for _ in 0..12 {
        env.clock.advance(std::time::Duration::from_millis(300));
        sync(c, &b).await;
        c.reconcile_once().await.expect("pass");
    }
    assert_eq!(
        c.store().get_host(&a.id).await.expect("host").status,
        HostStatus::Lost
    );
    let live = tasks(c, "web", LIVE).await;
    assert_eq!(live.len(), 2);
    assert!(
        live.iter().all(|t| t.host.as_ref() == Some(&b.id)),
        "replacements run on b"
    );
    for id in &on_a {
        let t = c.store().get_task(id).await.expect("task");
        assert_eq!(t.state, TaskState::Stopped);
        assert_eq!(t.stop_reason.as_deref(), Some("host lost"));
    }
    // When a returns it is told to run nothing: its old tasks are stopped.
    let resp = sync(c, &a).await;
    assert!(resp.tasks.is_empty());
    assert_eq!(
        c.store().get_host(&a.id).await.expect("host").status,
        HostStatus::Active
    );
}

#[tokio::test]
async fn an_impaired_host_has_its_tasks_started_elsewhere_before_they_stop() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    let def = register_def(c, "web", 8, 20).await;
    service(c, "web", &def, 2, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    let b = host(c, "b", 2, 24).await;
    // a's MPS daemon fails.
    sync_with(c, &a, false, &[]).await;
    assert_eq!(
        c.store().get_host(&a.id).await.expect("host").status,
        HostStatus::Impaired
    );
    c.reconcile_once().await.expect("pass");
    // Replacements are placed on b while a's tasks still run.
    let live = tasks(c, "web", LIVE).await;
    assert_eq!(
        live.iter()
            .filter(|t| t.host.as_ref() == Some(&b.id))
            .count(),
        2
    );
    assert_eq!(
        live.iter()
            .filter(|t| t.host.as_ref() == Some(&a.id) && t.state == TaskState::Running)
            .count(),
        2
    );
    sync(c, &b).await;
    c.reconcile_once().await.expect("pass");
    // Now the old tasks stop.
    let resp = sync_with(c, &a, false, &[]).await;
    assert!(resp.tasks.is_empty(), "a is told to stop everything");
    let live = tasks(c, "web", LIVE).await;
    assert_eq!(live.len(), 2);
    assert!(
        live.iter()
            .all(|t| t.host.as_ref() == Some(&b.id) && t.state == TaskState::Running)
    );
}

#[tokio::test]
async fn many_clients_scaling_at_once_never_overcommit_a_gpu() {
    // No agent syncs here: hosts must not be declared lost while the clients contend.
    let env = env(tessera_control::ControlConfig {
        sync_interval: std::time::Duration::from_secs(60),
        ..fast()
    })
    .await;
    let c = env.control.clone();
    let mut hosts = Vec::new();
    for i in 0..4 {
        hosts.push(host(&c, &format!("h{i}"), 4, 24).await);
    }
    for i in 0..6 {
        let def = register_def(&c, &format!("svc{i}"), 3 + i as u64 * 2, 10).await;
        service(&c, &format!("svc{i}"), &def, 1, DeploymentConfig::default()).await;
    }
    let mut handles = Vec::new();
    for client in 0..12u32 {
        let c = c.clone();
        handles.push(tokio::spawn(async move {
            for step in 0..8u32 {
                let name = format!("svc{}", (client + step) % 6);
                let count = (client * 7 + step * 5) % 16;
                c.deployments()
                    .update_service(
                        &name,
                        &ServicePatch {
                            desired_count: Some(count),
                            task_definition: None,
                            ..Default::default()
                        },
                    )
                    .await
                    .expect("scale");
                c.reconcile_once().await.expect("pass");
            }
        }));
    }
    let checker = {
        let c = c.clone();
        tokio::spawn(async move {
            for _ in 0..20 {
                assert_no_overcommit(&c).await;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
    };
    for h in handles {
        h.await.expect("client");
    }
    checker.await.expect("checker");
    c.reconcile_once().await.expect("pass");
    assert_no_overcommit(&c).await;
    let placed = c
        .store()
        .list_tasks(&tessera_control::store::TaskFilter {
            states: vec![TaskState::Assigned],
            ..Default::default()
        })
        .await
        .expect("tasks");
    assert!(!placed.is_empty(), "the contest placed something");
}

#[tokio::test]
async fn a_sync_that_changes_nothing_still_counts_and_new_use_or_gpus_are_recorded() {
    use tessera_model::agent::{MpsReport, SyncRequest, TaskReport};
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    let def = register_def(c, "infer", 10, 40).await;
    service(c, "infer", &def, 2, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    let first = sync(c, &a).await;
    assert_eq!(first.tasks.len(), 2);
    let seen = c.views().get_host(&a.id).await.expect("host").last_seen;
    let report = |peak: u64, sm: u32| SyncRequest {
        agent_version: None,
        address: None,
        dynamic_ports_free: None,
        capabilities: None,
        gpus: a.gpus.clone(),
        mps: MpsReport {
            healthy: true,
            reason: None,
            restarts: None,
        },
        tasks: first
            .tasks
            .iter()
            .map(|t| TaskReport {
                task_id: t.task_id.clone(),
                running: true,
                gpu_memory_peak_mib: Some(tessera_model::MiB(peak)),
                sm_percent: Some(sm),
                ..Default::default()
            })
            .collect(),
    };
    let measured = || async {
        tasks(c, "infer", &[TaskState::Running])
            .await
            .iter()
            .map(|t| {
                (
                    t.measured.gpu_memory_peak.map(|m| m.0),
                    t.measured.sm_percent,
                )
            })
            .collect::<Vec<_>>()
    };
    // Use is recorded: a peak only grows, the SM share is the latest.
    env.clock.advance(std::time::Duration::from_secs(1));
    c.agents()
        .sync_agent(&a.id, &report(3000, 20))
        .await
        .expect("sync");
    assert_eq!(measured().await, [(Some(3000), Some(20)); 2]);
    env.clock.advance(std::time::Duration::from_secs(1));
    let again = c
        .agents()
        .sync_agent(&a.id, &report(2000, 30))
        .await
        .expect("sync");
    assert_eq!(measured().await, [(Some(3000), Some(30)); 2]);
    // Nothing new: only the time is written, and the answer is the same.
    env.clock.advance(std::time::Duration::from_secs(1));
    let same = c
        .agents()
        .sync_agent(&a.id, &report(3000, 30))
        .await
        .expect("sync");
    assert_eq!(same, again);
    assert_eq!(measured().await, [(Some(3000), Some(30)); 2]);
    // Its time is written with the others' at the start of the next pass.
    c.reconcile_once().await.expect("pass");
    let later = c.views().get_host(&a.id).await.expect("host").last_seen;
    assert!(later > seen, "{later:?} after {seen:?}");
    // A GPU that goes missing is still caught, and its tasks stop with it.
    let mut one_gone = report(3000, 30);
    let gone = one_gone.gpus.remove(0);
    let after = c.agents().sync_agent(&a.id, &one_gone).await.expect("sync");
    let host = c.views().get_host(&a.id).await.expect("host");
    let g = host
        .gpus
        .iter()
        .find(|g| g.uuid == gone.uuid)
        .expect("kept");
    assert_eq!(g.health, tessera_model::GpuHealth::Unhealthy);
    assert!(
        after
            .tasks
            .iter()
            .all(|t| !t.containers[0].env["CUDA_VISIBLE_DEVICES"].contains(gone.uuid.as_str())),
        "no task left on the missing GPU in the answer"
    );
}

#[tokio::test]
async fn a_task_pulling_its_image_stays_assigned_and_says_so_and_a_refused_pull_fails_it() {
    use tessera_model::agent::{MpsReport, SyncRequest, TaskReport};
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    let def = register_def(c, "infer", 10, 40).await;
    service(c, "infer", &def, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    let assigned = tasks(c, "infer", &[TaskState::Assigned]).await;
    assert_eq!(assigned.len(), 1);
    let id = assigned[0].id.clone();
    let report = |pulling: Option<&str>, error: Option<&str>| SyncRequest {
        agent_version: None,
        address: None,
        dynamic_ports_free: None,
        capabilities: None,
        gpus: a.gpus.clone(),
        mps: MpsReport {
            healthy: true,
            reason: None,
            restarts: None,
        },
        tasks: vec![TaskReport {
            task_id: id.clone(),
            running: false,
            exit_code: error.map(|_| 125),
            pulling: pulling.map(str::to_owned),
            error: error.map(str::to_owned),
            ..Default::default()
        }],
    };
    let answer = c
        .agents()
        .sync_agent(&a.id, &report(Some("registry.example/llm:1"), None))
        .await
        .expect("sync");
    assert_eq!(answer.tasks.len(), 1, "still wanted while it pulls");
    let t = c.views().get_task(&id).await.expect("task");
    assert_eq!(t.state, TaskState::Assigned);
    assert_eq!(
        t.placement_message.as_deref(),
        Some("pulling image registry.example/llm:1")
    );
    let why = "pull access denied for registry.example/llm";
    let answer = c
        .agents()
        .sync_agent(&a.id, &report(None, Some(why)))
        .await
        .expect("sync");
    assert!(answer.tasks.is_empty());
    let t = c.views().get_task(&id).await.expect("task");
    assert_eq!(t.state, TaskState::Stopped);
    assert_eq!(t.exit_code, Some(125));
    assert_eq!(
        t.stop_reason.as_deref(),
        Some(format!("cannot start: {why}").as_str())
    );
}

#[tokio::test]
async fn a_services_settings_change_in_place_by_the_rules_of_a_new_one() {
    use tessera_control::inputs::ServicePatch;
    use tessera_model::service::ServiceConstraints;
    let env = env(fast()).await;
    let c = &env.control;
    let _a = host(c, "a", 2, 24).await;
    let def = register_def(c, "infer", 10, 40).await;
    service(c, "infer", &def, 1, DeploymentConfig::default()).await;
    let patched = c
        .deployments()
        .update_service(
            "infer",
            &ServicePatch {
                strategy: Some(Some("spread_gpu".into())),
                constraints: Some(ServiceConstraints {
                    max_per_gpu: Some(1),
                    ..Default::default()
                }),
                stop_timeout_secs: Some(45),
                ..Default::default()
            },
        )
        .await
        .expect("patched");
    assert_eq!(patched.stop_timeout_secs, 45);
    assert_eq!(patched.constraints.max_per_gpu, Some(1));
    assert_eq!(patched.strategy.map(|p| p.as_str()), Some("spread_gpu"));
    // Back to the pool's policy with null.
    let back = c
        .deployments()
        .update_service(
            "infer",
            &ServicePatch {
                strategy: Some(None),
                ..Default::default()
            },
        )
        .await
        .expect("patched");
    assert_eq!(back.strategy, None);
    assert_eq!(back.stop_timeout_secs, 45, "what is left out stays");
    // The same rules as a new service: every broken one named, nothing written.
    let err = c
        .deployments()
        .update_service(
            "infer",
            &ServicePatch {
                stop_timeout_secs: Some(0),
                strategy: Some(Some("tightest".into())),
                ..Default::default()
            },
        )
        .await
        .expect_err("refused");
    let text = format!("{err:?}");
    assert!(
        text.contains("stop_timeout_secs") && text.contains("strategy"),
        "{text}"
    );
    assert_eq!(
        c.store()
            .get_service("infer")
            .await
            .unwrap()
            .stop_timeout_secs,
        45
    );
    // An empty patch says what it may hold.
    assert!(
        c.deployments()
            .update_service("infer", &ServicePatch::default())
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_fresh_fleet_gets_the_default_pool_once_and_a_fleet_with_pools_none() {
    let db = TestDb::new().await;
    let control = tessera_control::Control::new(db.open().await, fast());
    assert!(
        control
            .deployments()
            .ensure_default_pool()
            .await
            .expect("first start")
    );
    assert!(
        !control
            .deployments()
            .ensure_default_pool()
            .await
            .expect("second start")
    );
    let names: Vec<String> = control
        .views()
        .list_pools()
        .await
        .expect("pools")
        .into_iter()
        .map(|p| p.name.to_string())
        .collect();
    assert_eq!(names, ["default"]);
    // An agent started with its defaults joins it.
    control
        .agents()
        .ensure_join_token(Some(JOIN))
        .await
        .expect("join token");
    let joined = control
        .agents()
        .register_agent(&tessera_model::agent::RegisterRequest {
            address: None,
            join_token: JOIN.into(),
            pool: tessera_model::PoolName::new("default").expect("valid"),
            cpu_milli: tessera_model::MilliCpu(1_000),
            memory_mib: tessera_model::MiB(1024),
            simulated: true,
            labels: Default::default(),
            gpus: gpus("d", 1, 24),
            name: Some("first".into()),
            provider_id: None,
            agent_version: None,
        })
        .await;
    assert!(joined.is_ok(), "{joined:?}");
    // A fleet that already has pools (the test harness's `gpu`) gets no `default`.
    let env = env(fast()).await;
    assert!(
        !env.control
            .deployments()
            .ensure_default_pool()
            .await
            .expect("ensure")
    );
}

#[tokio::test]
async fn a_pass_looks_only_at_services_that_changed_whoever_changed_them() {
    let env = env(fast()).await;
    let c = &env.control;
    let h = host(c, "a", 2, 24).await;
    let def = register_def(c, "infer", 10, 40).await;
    service(c, "infer", &def, 2, DeploymentConfig::default()).await;
    service(c, "other", &def, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        c.deployments().last_pass_scope(),
        (true, 2),
        "the first pass is full"
    );
    // The tasks start (the agent's sync changes their state), the services settle.
    sync(c, &h).await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        c.deployments().last_pass_scope(),
        (false, 2),
        "both services' tasks changed"
    );
    c.reconcile_once().await.expect("pass");
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        c.deployments().last_pass_scope(),
        (false, 0),
        "an unchanged, steady fleet: no service looked at"
    );
    // A change made through another server on the same database is recorded by the
    // database, and this server's next pass acts on it.
    let other = env.restart(fast()).await;
    other
        .deployments()
        .update_service(
            "infer",
            &ServicePatch {
                desired_count: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("scale through the other server");
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        c.deployments().last_pass_scope(),
        (false, 1),
        "only the scaled service"
    );
    let live = tasks(c, "infer", LIVE).await;
    assert_eq!(live.len(), 3, "{live:?}");
    // Deleted services drop out; a full pass comes round at its interval.
    let c2 = tessera_control::Control::new(
        env.db.open().await,
        tessera_control::ControlConfig {
            full_pass_every: std::time::Duration::ZERO,
            ..fast()
        },
    );
    c2.reconcile_once().await.expect("pass");
    c2.reconcile_once().await.expect("pass");
    assert_eq!(
        c2.deployments().last_pass_scope(),
        (true, 2),
        "every pass full when asked"
    );
}

#[tokio::test]
async fn a_service_that_cannot_be_read_holds_up_no_other_and_is_looked_at_again() {
    let env = env(fast()).await;
    let c = &env.control;
    let h = host(c, "a", 2, 24).await;
    let def = register_def(c, "infer", 4, 10).await;
    service(c, "aaa-broken", &def, 1, DeploymentConfig::default()).await;
    service(c, "bbb", &def, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    sync(c, &h).await;
    c.reconcile_once().await.expect("pass");
    c.reconcile_once().await.expect("pass");
    assert_eq!(c.deployments().last_pass_scope(), (false, 0), "settled");
    // A row that no longer parses (a hand edit), and a scale of another service: the
    // pass reads both changes and reconciles the one it can.
    env.db
        .execute("UPDATE services SET constraints = 'not json' WHERE name = 'aaa-broken'")
        .await;
    c.deployments()
        .update_service(
            "bbb",
            &ServicePatch {
                desired_count: Some(2),
                ..Default::default()
            },
        )
        .await
        .expect("scale");
    // (The pass itself still fails later, where scheduling reads every service: a row
    // that does not parse stops placements until it is mended.)
    let _ = c.reconcile_once().await;
    assert_eq!(
        tasks(c, "bbb", LIVE).await.len(),
        2,
        "bbb scaled past the broken service"
    );
    // Mended by hand (with a new desired count): reconciled as usual.
    env.db
        .execute(
            "UPDATE services SET constraints = '{}', desired_count = 2 WHERE name = 'aaa-broken'",
        )
        .await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "aaa-broken", LIVE).await.len(),
        2,
        "aaa-broken reconciled again"
    );
}

#[tokio::test]
async fn what_an_agent_cannot_enforce_is_kept_on_its_host_and_said_once() {
    use tessera_model::agent::{Capability, HostCapabilities};
    let env = env(fast()).await;
    let c = &env.control;
    let mut reg = registration(JOIN, "gpu", "real", gpus("real", 1, 24));
    reg.simulated = false;
    let resp = c.agents().register_agent(&reg).await.expect("register");
    let id = c
        .agents()
        .authenticate_agent(&resp.agent_token)
        .await
        .expect("token");
    let h = Host {
        id: id.clone(),
        token: resp.agent_token,
        gpus: gpus("real", 1, 24),
    };
    let caps = |devices: Capability| HostCapabilities {
        gpu_discovery: Capability::held("NVML"),
        mps: Capability::held("a control daemon per GPU"),
        gpu_devices: devices,
        limits: Capability::held("cgroup v2"),
        task_users: Capability::held("each task runs as a uid of its own"),
        containers: Capability::missing("no Docker engine"),
    };
    let said = || async {
        c.store()
            .list_events(&tessera_control::store::EventFilter {
                host: Some(id.clone()),
                limit: 50,
                ..Default::default()
            })
            .await
            .expect("events")
            .into_iter()
            .filter(|e| e.message.contains("cannot enforce"))
            .map(|e| e.message)
            .collect::<Vec<_>>()
    };
    let sync_caps = |caps: HostCapabilities| {
        let mut r = report(&h, Vec::new());
        r.capabilities = Some(caps);
        r
    };
    let first = sync_caps(caps(Capability::held("v2 device programs")));
    c.agents().sync_agent(&id, &first).await.expect("sync");
    let host = c.store().get_host(&id).await.expect("host");
    assert_eq!(host.capabilities, first.capabilities, "kept as said");
    let events = said().await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].contains("Container images (no Docker engine)"),
        "{events:?}"
    );
    // The same again: nothing new is said.
    c.agents().sync_agent(&id, &first).await.expect("sync");
    assert_eq!(said().await.len(), 1);
    // Device isolation lost (an agent restarted without cgroups): said, naming only it.
    let second = sync_caps(caps(Capability::missing("no cgroups")));
    c.agents().sync_agent(&id, &second).await.expect("sync");
    let events = said().await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(
        events
            .iter()
            .any(|e| e.contains("GPU device isolation (no cgroups)")
                && !e.contains("Container images")),
        "{events:?}"
    );
    assert_eq!(
        c.store().get_host(&id).await.expect("host").capabilities,
        second.capabilities
    );
    // An agent older than the field says nothing: what is known is kept.
    c.agents()
        .sync_agent(&id, &report(&h, Vec::new()))
        .await
        .expect("sync");
    assert_eq!(
        c.store().get_host(&id).await.expect("host").capabilities,
        second.capabilities
    );
}

#[tokio::test]
async fn a_task_that_ends_out_of_memory_says_so_in_its_stop_reason() {
    use tessera_model::agent::TaskReport;
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    let def = register_def(c, "infer", 4, 25).await;
    service(c, "infer", &def, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    let task = tasks(c, "infer", &[TaskState::Running]).await.remove(0);
    let why = "container main ran out of GPU memory; its output says: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";
    let ended = report(
        &a,
        vec![TaskReport {
            task_id: task.id.clone(),
            running: false,
            exit_code: Some(1),
            out_of_memory: Some(why.into()),
            ..Default::default()
        }],
    );
    c.agents().sync_agent(&a.id, &ended).await.expect("sync");
    let stopped = c.store().get_task(&task.id).await.expect("task");
    assert_eq!(stopped.state, TaskState::Stopped);
    assert_eq!(
        stopped.stop_reason.as_deref(),
        Some(format!("out of memory: {why} (exit code 1)").as_str())
    );
    assert_eq!(stopped.exit_code, Some(1));
}

#[tokio::test]
async fn a_task_that_ends_keeps_the_last_lines_its_agent_sent_apart_from_the_task() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    let def = register_def(c, "crash", 10, 40).await;
    service(c, "crash", &def, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    let t = tasks(c, "crash", &[TaskState::Running]).await.remove(0);
    let id = c
        .agents()
        .authenticate_agent(&a.token)
        .await
        .expect("token");
    let last = "==> main.err.log <==\nTraceback (most recent call last):\nRuntimeError: CUDA error: out of memory";
    c.agents()
        .sync_agent(
            &id,
            &report(
                &a,
                vec![tessera_model::agent::TaskReport {
                    task_id: t.id.clone(),
                    running: false,
                    exit_code: Some(1),
                    last_output: Some(last.into()),
                    ..Default::default()
                }],
            ),
        )
        .await
        .expect("sync");
    let got = c
        .views()
        .task_last_output("crash", &t.id)
        .await
        .expect("its last lines");
    assert_eq!(got.state, TaskState::Stopped);
    assert_eq!(got.exit_code, Some(1));
    assert_eq!(got.last_output.as_deref(), Some(last));
    // Not with the task, which every viewer reads.
    let listed =
        serde_json::to_string(&c.store().get_task(&t.id).await.expect("task")).expect("json");
    assert!(!listed.contains("Traceback"), "{listed}");
    // Another service's task, or none: not found.
    for (service, task) in [("other", t.id.as_str()), ("crash", "no-such-task")] {
        let e = c
            .views()
            .task_last_output(service, task)
            .await
            .expect_err("not found");
        assert!(
            matches!(e, tessera_control::ControlError::NotFound(_)),
            "{e}"
        );
    }
}

/// A task's page: a crash loop stands out (its deployment's failures and the delay before
/// the next start), the events that name it are its own, the newest failures are listed
/// first on its service's page however many came before, and an unknown id is not found.
#[tokio::test]
async fn a_crash_looping_task_has_a_page_with_its_failures_and_its_own_events() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    let def = register_def(c, "crash", 10, 40).await;
    service(c, "crash", &def, 1, DeploymentConfig::default()).await;
    let mut failed = Vec::new();
    for _ in 0..40 {
        if failed.len() == 3 {
            break;
        }
        // One pass starts a task once its delay is over, the next places it; the host
        // keeps syncing while time goes by.
        c.reconcile_once().await.expect("pass");
        c.reconcile_once().await.expect("pass");
        sync(c, &a).await;
        if let Some(t) = tasks(c, "crash", &[TaskState::Running]).await.pop() {
            sync_with(c, &a, true, &[(t.id.clone(), 3)]).await;
            failed.push(t.id);
        }
        env.clock.advance(std::time::Duration::from_millis(500));
    }
    assert_eq!(failed.len(), 3, "tasks failed: {failed:?}");
    let last = failed.last().expect("a failure").clone();
    let page = c.views().task_detail(&last).await.expect("its page");
    assert_eq!(page.task.state, TaskState::Stopped);
    assert_eq!(page.task.exit_code, Some(3));
    assert_eq!(page.project.as_deref(), Some("default"));
    assert_eq!(
        page.service_revision.as_ref(),
        Some(&page.task.task_definition)
    );
    let f = page.failures.expect("its deployment's failures");
    assert_eq!(f.failed_tasks as usize, failed.len());
    assert_eq!(f.restart_delay_secs, 1 << (failed.len() - 1));
    assert!(page.budget_mib.0 > 0);
    // Its events name it, and no other task.
    assert!(!page.events.is_empty());
    for e in &page.events {
        assert!(e.message.contains(&last), "{}", e.message);
    }
    // Where it was placed and what chose it, as said at the time.
    assert!(
        page.events.iter().any(|e| e
            .message
            .contains("placed by pool gpu's fragmentation policy")
            && e.message.contains(&format!("task {last} on a GPU 0"))),
        "{:?}",
        page.events
    );
    // The service's page lists the newest failure first among the stopped tasks.
    let listed = c.views().service_tasks("crash").await.expect("tasks");
    let stopped: Vec<&str> = listed
        .iter()
        .filter(|t| t.state == TaskState::Stopped)
        .map(|t| t.id.as_str())
        .collect();
    assert_eq!(stopped.first(), Some(&last.as_str()));
    // The overview names the service and its latest failed task.
    let o = c.views().overview().await.expect("overview");
    let crash = o
        .failing
        .iter()
        .find(|s| s.service == "crash")
        .expect("the failing service");
    assert_eq!(crash.last_task.as_deref(), Some(last.as_str()));
    assert!(
        crash
            .last_exit
            .as_deref()
            .is_some_and(|e| e.starts_with("exit code 3"))
    );
    let e = c
        .views()
        .task_detail("no-such-task")
        .await
        .expect_err("none");
    assert!(
        matches!(e, tessera_control::ControlError::NotFound(_)),
        "{e}"
    );
}
