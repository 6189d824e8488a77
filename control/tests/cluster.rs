//! Several servers on one database: one schedules at a time, another takes over when its
//! lease runs out, and a former holder's writes are refused once a newer one exists.

use std::time::Duration;
use tessera_control::ControlConfig;
use tessera_control::error::StoreError;
use tessera_control::inputs::ServicePatch;
use tessera_control::store::Fence;
use tessera_control::testkit::*;
use tessera_model::service::{DeploymentConfig, TaskState};

fn config() -> ControlConfig {
    ControlConfig {
        lease_ttl: Duration::from_secs(10),
        ..fast()
    }
}

#[tokio::test]
async fn one_server_schedules_another_takes_over_and_the_old_one_is_fenced_off() {
    let env = env(config()).await;
    let a = env.control.clone();
    let b = env.restart(config()).await;
    let h = host(&a, "h", 2, 24).await;
    let def = register_def(&a, "infer", 10, 40).await;
    service(&a, "infer", &def, 2, DeploymentConfig::default()).await;

    // a takes the lease and schedules; b, on the same database, does not.
    assert_eq!(a.tick().await, Ok(true));
    assert_eq!(b.tick().await, Ok(false));
    assert_eq!(tasks(&a, "infer", &[TaskState::Assigned]).await.len(), 2);
    let view = b.cluster().await.expect("cluster");
    assert_eq!(view.servers.len(), 2);
    // Each says its version; the answer says the answering server's build.
    let version = tessera_model::version::VERSION;
    assert!(
        view.servers
            .iter()
            .all(|s| s.version.as_deref() == Some(version))
    );
    assert_eq!(view.answered_by.version, version);
    let holder: Vec<&str> = view
        .servers
        .iter()
        .filter(|s| s.scheduling)
        .map(|s| s.id.as_str())
        .collect();
    assert_eq!(holder, [a.server_id()]);
    assert!(
        view.servers
            .iter()
            .all(|s| s.scheduling == s.since.is_some())
    );

    // a stops (its machine froze); its agent carries on through b. Within the lease time b
    // still waits; after it, b takes over with a new epoch and schedules.
    sync(&b, &h).await;
    env.clock.advance(Duration::from_secs(5));
    sync(&b, &h).await;
    assert_eq!(b.tick().await, Ok(false), "a's lease has not run out");
    env.clock.advance(Duration::from_secs(6));
    sync(&b, &h).await;
    b.deployments()
        .update_service(
            "infer",
            &ServicePatch {
                desired_count: Some(4),
                task_definition: None,
                ..Default::default()
            },
        )
        .await
        .expect("scale");
    assert_eq!(b.tick().await, Ok(true));
    assert_eq!(
        tasks(&b, "infer", &[TaskState::Assigned, TaskState::Running])
            .await
            .len(),
        4
    );
    assert_no_overcommit(&b).await;
    let view = b.cluster().await.expect("cluster");
    let holder = view
        .servers
        .iter()
        .find(|s| s.scheduling)
        .expect("a holder");
    assert_eq!(holder.id, b.server_id());

    // a wakes up in the middle of its old pass: every write it makes with its old epoch
    // is refused, and nothing changes.
    let stale = a.store().fenced(Fence {
        holder: a.server_id().to_owned(),
        epoch: 1,
    });
    let running = tasks(&b, "infer", &[TaskState::Running]).await;
    let victim = &running[0].id;
    let refused = stale
        .request_task_stop(
            victim,
            &tessera_model::service::StopReason::Deleted,
            None,
            false,
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { epoch: 1, .. })),
        "{refused:?}"
    );
    let refused = stale.add_event(Some("infer"), None, "from the past").await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    let task = b.views().get_task(victim).await.expect("task");
    assert_eq!(task.state, TaskState::Running, "untouched");
    // Its next tick finds the lease taken: it does not schedule.
    assert_eq!(a.tick().await, Ok(false));
    // The holder's own epoch still writes.
    let epoch = b.store().lease().await.expect("lease").expect("held").epoch;
    assert_eq!(epoch, 2);
    let fresh = b.store().fenced(Fence {
        holder: b.server_id().to_owned(),
        epoch,
    });
    fresh
        .add_event(Some("infer"), None, "from the holder")
        .await
        .expect("the holder writes");
}

#[tokio::test]
async fn a_server_that_stops_cleanly_hands_the_lease_over_at_once() {
    let env = env(config()).await;
    let a = env.control.clone();
    let b = env.restart(config()).await;
    // One turn of a's loop, then shutdown: it lets go of the lease.
    a.run(async {}).await;
    let lease = a.store().lease().await.expect("lease").expect("taken");
    assert_eq!(lease.holder, a.server_id());
    assert_eq!(b.tick().await, Ok(true), "no wait for the lease time");
    let lease = b.store().lease().await.expect("lease").expect("taken");
    assert_eq!((lease.holder.as_str(), lease.epoch), (b.server_id(), 2));
}

#[tokio::test]
async fn a_restarted_server_takes_its_lease_back_at_once_and_fences_off_its_earlier_run() {
    let same = ControlConfig {
        address: "http://127.0.0.1:3000".into(),
        ..config()
    };
    let env = env(same.clone()).await;
    let first = env.control.clone();
    assert_eq!(first.tick().await, Ok(true));
    // Killed, and started again on the same address: no wait for the lease time.
    let second = env.restart(same).await;
    assert_eq!(second.server_id(), first.server_id());
    assert_eq!(second.tick().await, Ok(true));
    let lease = second.store().lease().await.expect("lease").expect("held");
    assert_eq!(lease.epoch, 2, "a new epoch for the new run");
    // The earlier run, if it was only frozen, can no longer write.
    let stale = first.store().fenced(Fence {
        holder: first.server_id().to_owned(),
        epoch: 1,
    });
    let refused = stale.add_event(None, None, "from the earlier run").await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    assert_eq!(second.tick().await, Ok(true), "renewed, same epoch");
    let again = second.store().lease().await.expect("lease").expect("held");
    assert_eq!(again.epoch, 2);
}

/// A change made through one server reaches the live views of another on the same
/// PostgreSQL database (LISTEN/NOTIFY), and wakes the scheduler there. SQLite's servers
/// share one file on one machine and carry no such news.
#[tokio::test]
async fn a_change_made_through_one_server_reaches_the_live_views_of_another() {
    let env = env(config()).await;
    let a = env.control.clone();
    let b = env.restart(config()).await;
    if !env.db.is_postgres() {
        let news = a.store().listen_changes().await.expect("listen");
        assert!(news.is_none(), "SQLite carries no news between servers");
        return;
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = |c: tessera_control::Control| {
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            c.run(async move {
                let _ = stop.changed().await;
            })
            .await
        })
    };
    let (ra, rb) = (run(a.clone()), run(b.clone()));
    let mut live_b = b.subscribe();
    // Both loops listen once they run: each starts listening before its first tick, which
    // announces it.
    wait_until("both servers' loops running", || async {
        b.cluster().await.is_ok_and(|view| view.servers.len() == 2)
    })
    .await;
    // The loops' own news (announcing, taking the lease) must not count as the change's:
    // drain until the stream has been quiet for a while.
    while tokio::time::timeout(Duration::from_millis(500), live_b.recv())
        .await
        .is_ok()
    {}
    let def = register_def(&a, "infer", 10, 40).await;
    service(&a, "infer", &def, 1, DeploymentConfig::default()).await;
    let heard = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if live_b.recv().await.expect("open") == "elsewhere" {
                break;
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "b's live views heard of a's change");
    stop_tx.send(true).expect("stop");
    ra.await.expect("a stops");
    rb.await.expect("b stops");
}
