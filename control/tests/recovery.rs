//! Faults the control plane must survive: a restart longer than the lost timeout, tasks
//! left on a lost host, status changes that race, a service that cannot be reconciled.

use std::time::Duration;
use tessera_control::store::EventFilter;
use tessera_control::testkit::*;
use tessera_model::service::{DeploymentConfig, TaskState};
use tessera_model::{GpuHealth, GpuUuid, HostStatus};

async fn status(c: &tessera_control::Control, h: &Host) -> HostStatus {
    c.store().get_host(&h.id).await.expect("host").status
}

#[tokio::test]
async fn after_a_restart_hosts_get_one_lost_timeout_to_sync_before_they_are_lost() {
    let env = env(fast()).await; // lost after 2 s
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    deploy(c, &[&a], "web", 8, 20, 1).await;
    let before = tasks(c, "web", &[TaskState::Running]).await;
    assert_eq!(before.len(), 1);

    // The server is down for longer than the lost timeout, then starts again.
    env.clock.advance(Duration::from_millis(2500));
    let restarted = env.restart(fast()).await;
    restarted.reconcile_once().await.expect("pass");
    assert_eq!(
        status(&restarted, &a).await,
        HostStatus::Active,
        "not lost at once"
    );
    // The agent is back within the grace: its task was never restarted.
    let wanted = sync(&restarted, &a).await;
    assert_eq!(wanted.tasks.len(), 1);
    let b = host(&restarted, "b", 1, 24).await; // joins, then never syncs
    for _ in 0..8 {
        env.clock.advance(Duration::from_millis(300));
        sync(&restarted, &a).await;
        restarted.reconcile_once().await.expect("pass");
    }
    let after = tasks(&restarted, "web", &[TaskState::Running]).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].id, before[0].id, "the same task, never replaced");
    assert_eq!(status(&restarted, &a).await, HostStatus::Active);
    assert_eq!(
        status(&restarted, &b).await,
        HostStatus::Lost,
        "a host that stays silent past the grace is lost"
    );
}

#[tokio::test]
async fn tasks_left_on_a_lost_host_are_stopped_and_replaced() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    let b = host(c, "b", 1, 24).await;
    deploy(c, &[&a, &b], "web", 8, 20, 1).await;
    let old = tasks(c, "web", &[TaskState::Running]).await.remove(0);
    let on = old.host.clone().expect("placed");
    // As a crash between "host lost" and "its tasks stopped" used to leave it.
    c.store()
        .set_host_status(&on, HostStatus::Lost, Some("crashed between writes"))
        .await
        .expect("status");
    c.reconcile_once().await.expect("pass");
    let old = c.store().get_task(&old.id).await.expect("task");
    assert_eq!(old.state, TaskState::Stopped);
    assert_eq!(old.stop_reason.as_deref(), Some("host lost"));
    assert!(old.allocations.is_empty(), "its GPU memory is free again");
    let live = tasks(c, "web", LIVE).await;
    assert_eq!(live.len(), 1, "replaced");
    assert_ne!(live[0].host.as_ref(), Some(&on));
    assert_no_overcommit(c).await;
}

#[tokio::test]
async fn status_changes_are_compare_and_set() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    c.deployments().drain_host(&a.id).await.expect("drain");
    // A sync that read the host as active before the drain cannot undo it.
    let changed = c
        .store()
        .set_host_status_if(&a.id, HostStatus::Active, HostStatus::Impaired, Some("x"))
        .await
        .expect("store");
    assert!(!changed);
    assert_eq!(status(c, &a).await, HostStatus::Draining);
    // Marking lost only happens to a host still silent: one that just synced stays.
    sync(c, &a).await;
    let marked = c
        .store()
        .mark_host_lost(&a.id, "silent", &silent_for(c, 60))
        .await
        .expect("store");
    assert_eq!(marked, None);
    assert_eq!(status(c, &a).await, HostStatus::Draining);
}

#[tokio::test]
async fn a_service_that_cannot_be_reconciled_does_not_stop_the_others() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    let bad = register_def(c, "bad", 4, 10).await;
    let good = register_def(c, "good", 4, 10).await;
    // Reconciled first (by name), and its definition no longer parses.
    service(c, "a-broken", &bad, 1, DeploymentConfig::default()).await;
    service(c, "b-good", &good, 2, DeploymentConfig::default()).await;
    env.db
        .execute("UPDATE task_definitions SET spec = 'not json' WHERE family = 'bad'")
        .await;
    c.reconcile_once().await.expect("the pass goes on");
    sync(c, &a).await;
    assert_eq!(tasks(c, "b-good", &[TaskState::Running]).await.len(), 2);
    let events = c
        .store()
        .list_events(&EventFilter {
            service: Some("a-broken".into()),
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("events");
    assert!(
        events
            .iter()
            .any(|e| e.message.contains("reconciling service a-broken failed")),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_gpu_replaced_or_gone_has_its_tasks_replaced_and_the_rest_of_the_host_carries_on() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    let b = host(c, "b", 2, 24).await;
    deploy(c, &[&a, &b], "big", 20, 50, 3).await;
    let on = |gpu: &'static str| async move {
        tasks(c, "big", LIVE)
            .await
            .into_iter()
            .filter(|t| t.allocations.iter().any(|al| al.gpu.as_str() == gpu))
            .map(|t| t.id)
            .collect::<Vec<_>>()
    };
    let on_a0 = on("GPU-a-0").await;
    let on_b1 = on("GPU-b-1").await;
    let on_b0 = on("GPU-b-0").await;
    assert_eq!(
        on_a0.len() + on_b1.len() + on_b0.len() + on("GPU-a-1").await.len(),
        3
    );

    // A new device at a's index 0.
    let mut replaced = a.gpus.clone();
    replaced[0].uuid = GpuUuid::new("GPU-a-new").expect("valid");
    let a2 = Host {
        id: a.id.clone(),
        token: a.token.clone(),
        gpus: replaced,
    };
    sync(c, &a2).await;
    let host_a = c.store().get_host(&a.id).await.expect("host");
    assert_eq!(host_a.gpus[0].uuid.as_str(), "GPU-a-new");
    assert_eq!(host_a.gpus.len(), 2);
    for id in &on_a0 {
        let t = c.store().get_task(id).await.expect("task");
        assert_eq!(
            (t.state, t.stop_reason.as_deref()),
            (TaskState::Stopped, Some("GPU replaced"))
        );
    }
    // b's GPU 1 disappears from its reports.
    let b2 = Host {
        id: b.id.clone(),
        token: b.token.clone(),
        gpus: vec![b.gpus[0].clone()],
    };
    sync(c, &b2).await;
    let host_b = c.store().get_host(&b.id).await.expect("host");
    assert_eq!(
        host_b.status,
        HostStatus::Active,
        "the rest of the host carries on"
    );
    assert_eq!(host_b.gpus[1].health, GpuHealth::Unhealthy);
    for id in &on_b1 {
        let t = c.store().get_task(id).await.expect("task");
        assert_eq!(t.stop_reason.as_deref(), Some("GPU missing"));
    }
    for id in &on_b0 {
        assert_eq!(
            c.store().get_task(id).await.expect("task").state,
            TaskState::Running
        );
    }
    for _ in 0..3 {
        c.reconcile_once().await.expect("pass");
        sync(c, &a2).await;
        sync(c, &b2).await;
    }
    let running = tasks(c, "big", &[TaskState::Running]).await;
    assert_eq!(running.len(), 3, "replaced on the GPUs that are there");
    assert!(
        running
            .iter()
            .all(|t| t.allocations[0].gpu.as_str() != "GPU-b-1")
    );
    assert_no_overcommit(c).await;
}

#[tokio::test]
async fn a_task_that_keeps_failing_is_restarted_with_growing_delays() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    deploy(c, &[&a], "crashy", 8, 20, 1).await;
    let first = tasks(c, "crashy", &[TaskState::Running]).await.remove(0);
    // It exits with an error; there is no earlier revision to roll back to.
    sync_with(c, &a, true, &[(first.id.clone(), 1)]).await;
    c.reconcile_once().await.expect("pass");
    assert!(
        tasks(c, "crashy", LIVE).await.is_empty(),
        "not restarted at once after a failure"
    );
    env.clock.advance(Duration::from_millis(1100));
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "crashy", LIVE).await.len(),
        1,
        "restarted after 1 s"
    );
}

#[tokio::test]
async fn stopped_tasks_events_and_finished_deployments_are_pruned_after_the_retention() {
    let env = env(tessera_control::ControlConfig {
        retention: Duration::ZERO,
        ..fast()
    })
    .await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    deploy(c, &[&a], "web", 8, 20, 1).await;
    c.deployments()
        .update_service(
            "web",
            &tessera_control::inputs::ServicePatch {
                desired_count: Some(0),
                task_definition: None,
                ..Default::default()
            },
        )
        .await
        .expect("scale");
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    sync(c, &a).await;
    let all = || async move {
        c.store()
            .list_tasks(&Default::default())
            .await
            .expect("tasks")
            .len()
    };
    assert_eq!(all().await, 1, "the stopped task is history until pruned");
    env.clock.advance(Duration::from_millis(20));
    let pruned = c.deployments().prune().await.expect("prune");
    assert_eq!(pruned.tasks, 1);
    assert!(pruned.events > 0);
    assert_eq!(all().await, 0);
    assert_eq!(
        status(c, &a).await,
        HostStatus::Active,
        "nothing live is touched"
    );
}

#[tokio::test]
async fn a_machine_rejoins_under_its_old_id_only_once_its_old_token_is_revoked() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    let again = tessera_model::agent::RegisterRequest {
        address: None,
        join_token: JOIN.into(),
        pool: tessera_model::PoolName::new("gpu").expect("valid"),
        cpu_milli: tessera_model::MilliCpu(64_000),
        memory_mib: tessera_model::MiB(256 * 1024),
        simulated: true,
        labels: Default::default(),
        gpus: a.gpus.clone(),
        name: Some("a-reinstalled".into()),
        provider_id: None,
        agent_version: None,
    };
    // Its agent is still registered: a second agent for the same GPUs is refused.
    let refused = c
        .agents()
        .register_agent(&again)
        .await
        .expect_err("two agents, one host");
    assert!(refused.to_string().contains("revoke"), "{refused}");
    c.agents().revoke_host(&a.id).await.expect("revoke");
    // Not by presenting its GPU UUIDs (anyone can see them): with a token minted for it.
    let unminted = c
        .agents()
        .register_agent(&again)
        .await
        .expect_err("a revoked host rejoined with the fleet's token");
    assert!(unminted.to_string().contains("minted for it"), "{unminted}");
    let admin = tessera_model::auth::Caller {
        name: "admin".into(),
        on_behalf_of: None,
        kind: tessera_model::auth::CallerKind::Session,
        role: tessera_model::auth::Role::Admin,
        token_id: None,
        projects: Default::default(),
        project: None,
    };
    let minted = c
        .agents()
        .mint_join_token(
            &admin,
            &tessera_model::auth::JoinTokenInput {
                host: Some(a.id.to_string()),
                ..Default::default()
            },
        )
        .await
        .expect("minted");
    let again = tessera_model::agent::RegisterRequest {
        join_token: minted.token,
        ..again
    };
    let rejoined = c.agents().register_agent(&again).await.expect("rejoins");
    assert_eq!(rejoined.host_id, a.id, "under its old id");
    assert!(
        c.agents().authenticate_agent(&a.token).await.is_err(),
        "the old token is gone"
    );
    assert_eq!(
        c.agents()
            .authenticate_agent(&rejoined.agent_token)
            .await
            .expect("new token"),
        a.id
    );
    assert_eq!(c.store().list_hosts().await.expect("hosts").len(), 1);
}

/// The stored time `secs` seconds before now, by `c`'s clock.
fn silent_for(c: &tessera_control::Control, secs: u64) -> String {
    let d = tessera_control::clock::to_chrono(Duration::from_secs(secs));
    tessera_control::clock::stamp(c.config().clock.now() - d)
}

/// The database stalled (restarting, overloaded): agents could not have a sync recorded
/// anywhere meanwhile, so a host silent past the lost timeout gets one more timeout to sync
/// again before it is declared lost, as after the server's own restart.
#[tokio::test]
async fn after_the_database_stalled_hosts_get_a_lost_timeout_to_sync_again() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    sync(c, &a).await;
    // Past the grace after the control plane's start, and past the host's lost timeout.
    env.clock.advance(c.lost_timeout() + Duration::from_secs(1));
    // The database keeps this tick's write waiting past 2 s.
    let stall = env.db.stall(Duration::from_millis(2500)).await;
    c.tick().await.expect("tick");
    stall.await.expect("stall ends");
    c.tick().await.expect("tick");
    assert_eq!(
        status(c, &a).await,
        HostStatus::Active,
        "one more timeout to sync"
    );
    // Still silent a whole lost timeout after the stall: lost.
    env.clock.advance(c.lost_timeout() + Duration::from_secs(1));
    c.tick().await.expect("tick");
    assert_eq!(status(c, &a).await, HostStatus::Lost);
}

/// A fleet on SQLite moved into a new PostgreSQL database (`tessera migrate-store`): the
/// servers started on it know every host (their agents' tokens still work), every task
/// where it runs, the accounts, and go on writing (identities past the copied rows). A
/// second move into it is refused with nothing changed. Runs where the tests have
/// PostgreSQL (TESSERA_TEST_STORE=postgres); the refusals that need none run always.
#[tokio::test]
async fn a_fleet_moves_from_sqlite_to_a_new_postgres_database_whole() {
    use tessera_control::move_store::migrate_store;
    let dir = tempfile::tempdir().expect("dir");
    let from = format!("sqlite://{}/fleet.db", dir.path().display());
    let missing = format!("sqlite://{}/none.db", dir.path().display());
    let err = migrate_store(&missing, "postgres://nobody@127.0.0.1:1/none")
        .await
        .expect_err("no source");
    assert!(err.to_string().contains("no SQLite database at"), "{err}");
    let err = migrate_store(&from, "sqlite:///tmp/x.db")
        .await
        .expect_err("not postgres");
    assert!(
        err.to_string()
            .contains("--to must be a PostgreSQL database"),
        "{err}"
    );

    let target = TestDb::new().await;
    if !target.is_postgres() {
        eprintln!("skipped the move itself: it runs with TESSERA_TEST_STORE=postgres");
        return;
    }
    let c =
        tessera_control::Control::new(tessera_control::open(&from).await.expect("sqlite"), fast());
    c.agents()
        .ensure_join_token(Some(JOIN))
        .await
        .expect("join");
    c.deployments()
        .create_pool(&tessera_control::inputs::PoolInput::named("gpu"))
        .await
        .expect("pool");
    let a = host(&c, "a", 2, 24).await;
    let b = host(&c, "b", 2, 24).await;
    deploy(&c, &[&a, &b], "web", 8, 20, 3).await;
    c.accounts()
        .add_user(
            "ops",
            "ops-long-password",
            tessera_model::auth::Role::Operator,
        )
        .await
        .expect("user");
    let before: Vec<(String, Option<tessera_model::HostId>)> =
        tasks(&c, "web", &[TaskState::Running])
            .await
            .into_iter()
            .map(|t| (t.id, t.host))
            .collect();
    assert_eq!(before.len(), 3);
    drop(c);

    let moved = migrate_store(&from, &target.url).await.expect("moved");
    let count = |t: &str| moved.tables.iter().find(|(n, _)| n == t).map(|(_, n)| *n);
    assert_eq!(count("hosts"), Some(2));
    assert_eq!(count("tasks"), Some(3));
    assert_eq!(
        count("fleet_clock"),
        None,
        "SQLite's own counter stays behind"
    );
    assert!(count("events").is_some_and(|n| n > 0));

    let moved_to = tessera_control::Control::new(target.open().await, fast());
    let after: Vec<(String, Option<tessera_model::HostId>)> =
        tasks(&moved_to, "web", &[TaskState::Running])
            .await
            .into_iter()
            .map(|t| (t.id, t.host))
            .collect();
    assert_eq!(after, before, "every task where it ran");
    let id = moved_to
        .agents()
        .authenticate_agent(&a.token)
        .await
        .expect("the agent's token still works");
    assert_eq!(id, a.id);
    assert_eq!(
        sync(&moved_to, &a).await.tasks.len(),
        before
            .iter()
            .filter(|(_, h)| h.as_ref() == Some(&a.id))
            .count()
    );
    moved_to
        .accounts()
        .sign_in("ops", "ops-long-password", None)
        .await
        .expect("the account moved with its password");
    // It goes on writing: new rows take identities past the copied ones.
    deploy(&moved_to, &[&a, &b], "batch", 4, 10, 1).await;
    assert_eq!(
        tasks(&moved_to, "batch", &[TaskState::Running]).await.len(),
        1
    );

    let again = migrate_store(&from, &target.url)
        .await
        .expect_err("not new");
    assert!(
        again.to_string().contains("already holds a fleet"),
        "{again}"
    );
    assert_eq!(
        tasks(&moved_to, "web", &[TaskState::Running]).await.len(),
        3
    );
}
