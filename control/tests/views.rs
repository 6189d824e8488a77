//! Read models: what the console and the API show of a GPU is the scheduler's own count,
//! with the pool's compute overcommit and MPS client limit.

use tessera_control::inputs::{PoolInput, ServiceInput};
use tessera_control::testkit::{self, JOIN, fast, gpus, register_def};
use tessera_model::agent::RegisterRequest;
use tessera_model::service::{DeploymentConfig, ServiceConstraints};
use tessera_model::views::HostQuery;
use tessera_model::{ComputeMilli, MiB, MilliCpu, PoolName, SharingMode};

#[tokio::test]
async fn a_gpu_is_shown_as_the_scheduler_counts_it_with_the_pools_overcommit() {
    let env = testkit::env(fast()).await;
    let control = &env.control;
    control
        .deployments()
        .create_pool(&PoolInput {
            compute_overcommit: Some(2.0),
            mps_client_limit: Some(3),
            ..PoolInput::named("over")
        })
        .await
        .expect("pool");
    control
        .agents()
        .register_agent(&RegisterRequest {
            address: None,
            join_token: JOIN.into(),
            pool: PoolName::new("over").expect("valid"),
            cpu_milli: MilliCpu(64_000),
            memory_mib: MiB(256 * 1024),
            simulated: true,
            labels: Default::default(),
            gpus: gpus("o", 1, 24),
            name: Some("o".into()),
            provider_id: None,
            agent_version: None,
        })
        .await
        .expect("register");
    // 80 % compute each: two fit under twice the GPU's compute, a third would not.
    let def = register_def(control, "heavy", 4, 80).await;
    control
        .deployments()
        .create_service(&ServiceInput {
            name: "heavy".into(),
            task_definition: def,
            pool: "over".into(),
            project: None,
            priority: None,
            desired_count: 3,
            strategy: None,
            constraints: ServiceConstraints::default(),
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
    control.reconcile_once().await.expect("pass");

    let page = control
        .views()
        .hosts_page(&HostQuery {
            pool: "over".into(),
            ..Default::default()
        })
        .await
        .expect("page");
    assert_eq!(page.hosts.len(), 1);
    let gpu = &page.hosts[0].gpus[0];
    assert_eq!(gpu.gpu.sharing_mode, SharingMode::Mps);
    assert_eq!(gpu.compute_capacity, ComputeMilli(2000));
    assert_eq!(gpu.compute_allocated, ComputeMilli(1600));
    assert_eq!(gpu.memory_allocated, MiB(8 * 1024));
    assert_eq!((gpu.clients, gpu.client_limit), (2, 3));
    assert_eq!(gpu.slots.len(), 2);
    // The API's host reads say the same: the mode follows from the allocations, before any
    // agent has synced.
    let id = &page.hosts[0].host.id;
    let host = control.views().get_host(id).await.expect("host");
    assert_eq!(host.gpus[0].sharing_mode, SharingMode::Mps);
    let listed = control.views().list_hosts().await.expect("hosts");
    let same = listed.iter().find(|h| &h.id == id).expect("listed");
    assert_eq!(same.gpus, host.gpus);

    let overview = control.views().overview().await.expect("overview");
    assert_eq!(
        overview.compute_total,
        ComputeMilli(2000),
        "only this pool has GPUs"
    );
    assert_eq!(overview.compute_allocated, ComputeMilli(1600));
    assert_eq!((overview.gpus_mps, overview.gpus_idle), (1, 0));
    assert_eq!(overview.pending.len(), 1);
    assert_eq!(overview.pending[0].count, 1);
    assert!(
        overview.pending[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("compute")),
        "{:?}",
        overview.pending[0].message
    );
}

#[tokio::test]
async fn a_deregistered_revision_is_refused_by_the_preview_as_by_the_service_forms() {
    let env = testkit::env(fast()).await;
    let control = &env.control;
    let def = register_def(control, "old", 4, 20).await;
    let r: tessera_model::service::TaskDefRef = def.parse().expect("valid");
    control
        .deployments()
        .deregister_task_definition(&r)
        .await
        .expect("deregister");
    let preview = control
        .scheduler()
        .preview(&tessera_control::inputs::PreviewInput {
            task_definition: def.clone(),
            pool: "gpu".into(),
            count: 1,
            strategy: None,
            constraints: ServiceConstraints::default(),
        })
        .await;
    let Err(tessera_control::ControlError::Invalid(errors)) = preview else {
        panic!("a preview of a deregistered revision: {preview:?}");
    };
    assert_eq!(errors.errors[0].field, "task_definition");
    assert!(errors.errors[0].message.contains("deregistered"));
}

#[tokio::test]
async fn the_hosts_page_is_read_a_page_at_a_time_with_its_filters() {
    let env = testkit::env(fast()).await;
    let control = &env.control;
    for i in 0..30 {
        testkit::host(control, &format!("h{i:02}"), 1, 24).await;
    }
    let page = |page: u32, status: &str| {
        let q = HostQuery {
            status: status.into(),
            page,
            ..Default::default()
        };
        async move { control.views().hosts_page(&q).await.expect("page") }
    };
    let first = page(0, "").await;
    assert_eq!((first.total, first.matched, first.pages), (30, 30, 2));
    assert_eq!(first.hosts.len(), 24);
    assert_eq!(first.hosts[0].host.id.as_str(), "h00");
    assert_eq!(first.hosts[0].gpus.len(), 1, "with its GPUs");
    assert_eq!(
        (first.pools.clone(), first.models.clone()),
        (vec!["gpu".to_owned()], vec!["NVIDIA L4".to_owned()])
    );
    let second = page(1, "").await;
    assert_eq!(second.hosts.len(), 6);
    assert_eq!(second.hosts[0].host.id.as_str(), "h24");
    let past = page(9, "").await;
    assert_eq!(
        (past.page, past.hosts.len()),
        (1, 6),
        "past the end: the last page"
    );
    let none = page(0, "draining").await;
    assert_eq!((none.matched, none.pages, none.hosts.len()), (0, 1, 0));
    control
        .deployments()
        .drain_host(&tessera_model::HostId::new("h07").expect("valid"))
        .await
        .expect("drain");
    let draining = page(0, "draining").await;
    assert_eq!(draining.hosts.len(), 1);
    assert_eq!(draining.hosts[0].host.id.as_str(), "h07");
}

/// The fleet read model, kept up to date from what changed, against one read from scratch
/// (a server started now) on the same database.
async fn assert_fleet_as_read_from_scratch(env: &testkit::Env, step: &str) {
    let kept = env.control.views().fleet().await.expect("fleet");
    let fresh = env
        .restart(fast())
        .await
        .views()
        .fleet()
        .await
        .expect("fleet from scratch");
    assert_eq!(*kept, *fresh, "after {step}");
}

#[tokio::test]
async fn the_fleet_model_kept_from_changes_is_the_fleet_read_from_scratch() {
    use tessera_model::agent::TaskReport;
    use tessera_model::api::{PoolPatch, ServicePatch};
    use tessera_model::service::TaskState;

    let env = testkit::env(fast()).await;
    let control = &env.control;
    assert_fleet_as_read_from_scratch(&env, "nothing").await;
    let a = testkit::host(control, "fa", 2, 24).await;
    let b = testkit::host(control, "fb", 4, 24).await;
    assert_fleet_as_read_from_scratch(&env, "two hosts registered").await;
    let def = register_def(control, "small", 4, 30).await;
    testkit::service(control, "small", &def, 8, DeploymentConfig::default()).await;
    assert_fleet_as_read_from_scratch(&env, "a service created").await;
    control.reconcile_once().await.expect("pass");
    assert_fleet_as_read_from_scratch(&env, "its tasks placed").await;
    assert_eq!(
        control
            .views()
            .fleet()
            .await
            .expect("fleet")
            .holding()
            .count(),
        8
    );

    // Both agents report their tasks running, with what they use.
    for h in [&a, &b] {
        let placed = testkit::tasks(control, "small", &[TaskState::Assigned]).await;
        let reports = placed
            .iter()
            .filter(|t| t.host.as_ref() == Some(&h.id))
            .map(|t| TaskReport {
                task_id: t.id.clone(),
                running: true,
                gpu_memory_peak_mib: Some(MiB(3000)),
                sm_percent: Some(25),
                ..Default::default()
            })
            .collect();
        control
            .agents()
            .sync_agent(&h.id, &testkit::report(h, reports))
            .await
            .expect("sync");
    }
    control.agents().flush_heartbeats().await.expect("flush");
    let fleet = control.views().fleet().await.expect("fleet");
    assert_eq!(fleet.pending().count(), 0);
    assert_eq!(
        fleet
            .holding()
            .filter(|t| t.measured.gpu_memory_peak == Some(MiB(3000)))
            .count(),
        8,
        "every task's measured peak is in the model"
    );
    assert_fleet_as_read_from_scratch(&env, "the agents' reports").await;

    control
        .deployments()
        .update_pool(
            &PoolName::new("gpu").expect("valid"),
            &PoolPatch {
                compute_overcommit: Some(2.0),
                ..Default::default()
            },
        )
        .await
        .expect("pool");
    assert_fleet_as_read_from_scratch(&env, "the pool's overcommit changed").await;

    control
        .deployments()
        .drain_host(&a.id)
        .await
        .expect("drain");
    control.reconcile_once().await.expect("pass");
    assert_fleet_as_read_from_scratch(&env, "a host drained").await;

    // Host b loses a GPU.
    let fewer = b.clone_with_gpus(b.gpus[..3].to_vec());
    testkit::sync(control, &fewer).await;
    control.agents().flush_heartbeats().await.expect("flush");
    assert_fleet_as_read_from_scratch(&env, "a GPU gone").await;
    let fleet = control.views().fleet().await.expect("fleet");
    let gone = &fleet.host(&b.id).expect("host b").host.gpus[3];
    assert_eq!(
        gone.health,
        tessera_model::GpuHealth::Unhealthy,
        "the GPU its agent no longer reports is shown unhealthy"
    );

    control
        .deployments()
        .update_service(
            "small",
            &ServicePatch {
                desired_count: Some(2),
                ..Default::default()
            },
        )
        .await
        .expect("scale in");
    control.reconcile_once().await.expect("pass");
    assert_fleet_as_read_from_scratch(&env, "the service scaled in").await;

    control
        .deployments()
        .delete_service("small")
        .await
        .expect("delete");
    for _ in 0..3 {
        control.reconcile_once().await.expect("pass");
        testkit::sync(control, &fewer).await;
        testkit::sync(control, &a).await;
    }
    assert_fleet_as_read_from_scratch(&env, "the service deleted").await;

    control
        .agents()
        .delete_host(&a.id)
        .await
        .expect("delete host");
    let fleet = control.views().fleet().await.expect("fleet");
    assert!(fleet.host(&a.id).is_none(), "a deleted host is gone");
    assert_eq!(fleet.hosts().count(), 1);
    assert_fleet_as_read_from_scratch(&env, "a host deleted").await;
}
