//! A fault stays with its source: one task's report that breaks every bound costs only
//! that task's figures, never its host's liveness or its neighbours; a host cannot grow
//! its inventory behind the admin's back, nor claim another host's GPU. Each test is the
//! attack first.

use tessera_control::store::{EventFilter, TaskFilter};
use tessera_control::testkit::*;
use tessera_model::agent::{HealthReport, TaskReport};
use tessera_model::auth::{Caller, CallerKind, Role};
use tessera_model::service::{TaskHealth, TaskPort, TaskState};
use tessera_model::work::{LatencyBucket, WorkReport, WorkSample};
use tessera_model::{HostStatus, MiB};

fn admin() -> Caller {
    Caller {
        name: "admin".into(),
        on_behalf_of: None,
        kind: CallerKind::Session,
        role: Role::Admin,
        token_id: None,
        projects: Default::default(),
        project: None,
    }
}

async fn events_of(c: &tessera_control::Control, service: Option<&str>) -> Vec<String> {
    c.views()
        .list_events(&EventFilter {
            service: service.map(str::to_owned),
            limit: 500,
            ..Default::default()
        })
        .await
        .expect("events")
        .into_iter()
        .map(|e| e.message)
        .collect()
}

/// A task's own metrics (a histogram of 200 buckets with a bound of -1), its health
/// output (10,000 characters and NUL), an SM share of 400 % and a port 0: the sync is
/// taken, the host stays active, the neighbour keeps running, the task itself keeps
/// running with its work unknown and the reason, and the service's events say what was
/// dropped (once, however often the agent sends it).
#[tokio::test]
async fn a_task_that_breaks_every_bound_costs_only_its_own_figures() {
    let env = env(fast()).await;
    let c = &env.control;
    let h = host(c, "h1", 1, 24).await;
    let def = register_def(c, "noisy", 2, 10).await;
    service(c, "noisy", &def, 2, Default::default()).await;
    c.reconcile_once().await.expect("pass");
    sync(c, &h).await;
    let running = tasks(c, "noisy", &[TaskState::Running]).await;
    assert_eq!(running.len(), 2, "both tasks run on h1");
    let (bad, neighbour) = (&running[0], &running[1]);
    let buckets: Vec<LatencyBucket> = (0..200)
        .map(|i| LatencyBucket {
            le: Some(if i == 0 { -1.0 } else { f64::from(i) }),
            count: 1.0,
        })
        .collect();
    let hostile = TaskReport {
        task_id: bad.id.clone(),
        running: true,
        sm_percent: Some(400),
        gpu_memory_mib: Some(MiB(u64::MAX / 2)),
        health: Some(HealthReport {
            status: TaskHealth::Unhealthy,
            output: Some(format!("{}\0", "x".repeat(10_000))),
        }),
        ports: vec![TaskPort {
            container: "main".into(),
            name: Some("\0".repeat(300)),
            container_port: 0,
            host_port: Some(0),
            protocol: Default::default(),
        }],
        work: Some(WorkReport::Measured(WorkSample {
            interval_secs: f64::NAN,
            completed: -1.0,
            errors: None,
            latency: buckets,
        })),
        error: Some("e".repeat(100_000)),
        ..Default::default()
    };
    let honest = TaskReport {
        task_id: neighbour.id.clone(),
        running: true,
        ..Default::default()
    };
    for _ in 0..3 {
        let answer = c
            .agents()
            .sync_agent(&h.id, &report(&h, vec![hostile.clone(), honest.clone()]))
            .await
            .expect("the sync is taken, whatever one task sends");
        assert_eq!(answer.tasks.len(), 2, "both tasks are still wanted");
    }
    c.agents().flush_heartbeats().await.expect("flushed");
    let host = c.views().get_host(&h.id).await.expect("host");
    assert_eq!(host.status, HostStatus::Active);
    assert_eq!(
        tasks(c, "noisy", &[TaskState::Running]).await.len(),
        2,
        "the neighbour and the noisy task itself keep running"
    );
    let stored = c
        .store()
        .list_tasks(&TaskFilter::default())
        .await
        .expect("tasks")
        .into_iter()
        .find(|t| t.id == bad.id)
        .expect("the task");
    assert_eq!(stored.measured.sm_percent, None, "400 % is not stored");
    assert!(
        stored
            .health_output
            .as_deref()
            .is_some_and(|o| o.chars().count() <= 1024 && !o.contains('\0')),
        "the output is cut to its bound"
    );
    let work = c
        .deployments()
        .service_work("noisy", "hour")
        .await
        .expect("work");
    let why = work
        .unknown
        .iter()
        .find(|(t, _)| *t == bad.id)
        .map(|(_, why)| why.clone())
        .expect("the noisy task's work is unknown");
    assert!(why.contains("interval_secs"), "{why}");
    let events = events_of(c, Some("noisy")).await;
    let dropped: Vec<&String> = events
        .iter()
        .filter(|e| e.contains("part of the agent's report was dropped"))
        .collect();
    assert_eq!(
        dropped.len(),
        1,
        "recorded once for three syncs: {events:#?}"
    );
    for field in ["sm_percent", "health.output", "work", "ports[0]", "error"] {
        assert!(dropped[0].contains(field), "{field} in {}", dropped[0]);
    }
}

/// An approved host in an automatic pool reports 64 made-up H100s: none becomes capacity,
/// and the host's events say so. The same in a manual pool: they wait for approval (the
/// console's badge reads `pending_gpus`), and an admin's approval makes them capacity.
#[tokio::test]
async fn a_host_cannot_grow_its_inventory_behind_the_admins_back() {
    let env = env(fast()).await;
    let c = &env.control;
    let h = host(c, "grower", 1, 24).await;
    let mut grown = h.clone_with_gpus(gpus_of("fake", "NVIDIA H100 80GB HBM3", 64, 80));
    grown.gpus[0] = h.gpus[0].clone();
    sync(c, &grown).await;
    let after = c.views().get_host(&h.id).await.expect("host");
    assert_eq!(after.gpus.len(), 1, "made-up GPUs became capacity");
    assert!(
        after.pending_gpus.is_empty(),
        "an automatic pool has nothing to approve"
    );
    let events = events_of(c, None).await;
    assert!(
        events
            .iter()
            .any(|e| e.contains("is new") && e.contains("refused")),
        "{events:#?}"
    );

    c.deployments()
        .update_pool(
            &tessera_model::PoolName::new("gpu").expect("name"),
            &tessera_model::api::PoolPatch {
                admission: Some("manual".into()),
                ..Default::default()
            },
        )
        .await
        .expect("manual");
    let mut two = h.clone_with_gpus(gpus("grower", 2, 24));
    two.gpus[1].uuid = tessera_model::GpuUuid::new("GPU-hot-added").expect("valid");
    sync(c, &two).await;
    let held = c.views().get_host(&h.id).await.expect("host");
    assert_eq!(held.gpus.len(), 1, "not capacity before approval");
    assert_eq!(held.pending_gpus.len(), 1);
    assert_eq!(held.pending_gpus[0].uuid.as_str(), "GPU-hot-added");
    c.agents()
        .approve_host(&admin(), &h.id)
        .await
        .expect("approved");
    let approved = c.views().get_host(&h.id).await.expect("host");
    assert_eq!(approved.gpus.len(), 2, "approved GPUs are capacity");
    assert!(approved.pending_gpus.is_empty());
    sync(c, &two).await;
    assert_eq!(c.views().get_host(&h.id).await.expect("host").gpus.len(), 2);
}

/// A host reports a GPU UUID another host has: refused, the other host keeps it.
#[tokio::test]
async fn a_gpu_of_another_host_is_refused() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    let b = host(c, "b", 1, 24).await;
    let mut thief = b.clone_with_gpus(b.gpus.clone());
    let mut stolen = a.gpus[0].clone();
    stolen.index = 1;
    thief.gpus.push(stolen);
    sync(c, &thief).await;
    let hb = c.views().get_host(&b.id).await.expect("b");
    assert_eq!(hb.gpus.len(), 1, "b took a's GPU");
    let ha = c.views().get_host(&a.id).await.expect("a");
    assert_eq!(ha.gpus.len(), 1);
    let events = events_of(c, None).await;
    assert!(
        events
            .iter()
            .any(|e| e.contains(&format!("is a GPU of host {}", a.id))),
        "{events:#?}"
    );
}
