//! The store itself, on a fresh database: SQLite, or PostgreSQL with
//! `TESSERA_TEST_STORE=postgres` (see `tessera_control::testkit::TestDb`).

use std::collections::BTreeMap;
use tessera_control::store::{NewTask, PlacementCommit, StoredPlan, UsageQuery, UsageRow};
use tessera_control::testkit::{self, TestDb};
use tessera_control::{StoreError, open};
use tessera_model::ComputeMilli;
use tessera_model::service::{GpuAllocation, TaskDefRef};
use tessera_model::{
    GpuHealth, GpuInfo, GpuUuid, HostId, HostInfo, HostStatus, MiB, MilliCpu, PlacementPolicy,
    PoolInfo, PoolName, SharingMode,
};

fn pool(name: &str) -> PoolInfo {
    PoolInfo {
        name: PoolName::new(name).expect("valid"),
        policy: PlacementPolicy::Fragmentation,
        compute_overcommit: 1.0,
        mps_client_limit: None,
        admission: Default::default(),
        task_users: false,
        privileged: false,
        host_network: false,
        exec: false,
        preemption: Default::default(),
        gpu_budget: Default::default(),
        provider: None,
    }
}

fn host(id: &str, pool: &str, gpus: u32) -> HostInfo {
    HostInfo {
        id: HostId::new(id).expect("valid"),
        pool: PoolName::new(pool).expect("valid"),
        status: HostStatus::Active,
        held: false,
        simulated: true,
        cpu: MilliCpu(32_000),
        memory: MiB(128 * 1024),
        labels: BTreeMap::from([("zone".to_owned(), "a".to_owned())]),
        gpus: (0..gpus)
            .map(|i| GpuInfo {
                uuid: GpuUuid::new(format!("GPU-{id}-{i}")).expect("valid"),
                index: i,
                model: "NVIDIA L4".into(),
                memory: MiB(24 * 1024),
                mps_client_limit: 48,
                health: GpuHealth::Healthy,
                sharing_mode: SharingMode::Idle,
            })
            .collect(),
        status_reason: None,
        last_seen: None,
        mps_restarts: 0,
        address: None,
        dynamic_ports_free: None,
        pending_gpus: Vec::new(),
        capabilities: None,
        agent_version: None,
        provider_id: None,
    }
}

#[tokio::test]
async fn hosts_round_trip_and_survive_reopening_the_database() {
    let db = TestDb::new().await;
    {
        let store = db.open().await;
        store.upsert_pool(&pool("gpu-a")).await.expect("pool");
        store
            .upsert_host(&host("host-2", "gpu-a", 4))
            .await
            .expect("host");
        store
            .upsert_host(&host("host-1", "gpu-a", 2))
            .await
            .expect("host");
    }
    let store = db.open().await;
    let hosts = store.list_hosts().await.expect("list");
    assert_eq!(
        hosts.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(),
        ["host-1", "host-2"]
    );
    assert_eq!(hosts[1], host("host-2", "gpu-a", 4));
    assert_eq!(hosts[1].gpus[3].index, 3);

    store
        .set_host_status(
            &HostId::new("host-1").expect("valid"),
            HostStatus::Draining,
            Some("test"),
        )
        .await
        .expect("status");
    let h1 = store
        .get_host(&HostId::new("host-1").expect("valid"))
        .await
        .expect("get");
    assert_eq!(h1.status, HostStatus::Draining);
}

#[tokio::test]
async fn host_in_unknown_pool_is_refused_and_nothing_is_stored() {
    let db = TestDb::new().await;
    let store = db.open().await;
    let err = store
        .upsert_host(&host("host-1", "nope", 1))
        .await
        .expect_err("no such pool");
    assert!(
        matches!(err, StoreError::NotFound { what: "pool", .. }),
        "{err}"
    );
    assert!(store.list_hosts().await.expect("list").is_empty());
}

#[tokio::test]
async fn a_gpu_uuid_cannot_belong_to_two_hosts() {
    let db = TestDb::new().await;
    let store = db.open().await;
    store.upsert_pool(&pool("gpu-a")).await.expect("pool");
    store
        .upsert_host(&host("host-1", "gpu-a", 1))
        .await
        .expect("host");
    let mut twin = host("host-2", "gpu-a", 1);
    twin.gpus[0].uuid = GpuUuid::new("GPU-host-1-0").expect("valid");
    let err = store.upsert_host(&twin).await.expect_err("duplicate UUID");
    assert!(err.to_string().contains("already registered"), "{err}");
    let ids: Vec<String> = store
        .list_hosts()
        .await
        .expect("list")
        .iter()
        .map(|h| h.id.to_string())
        .collect();
    assert_eq!(ids, ["host-1"], "the failed host was rolled back");
}

#[tokio::test]
async fn sqlite_creates_its_file_and_directories() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}/nested/deeper/tessera.db", dir.path().display());
    let store = open(&url).await.expect("opens and creates the file");
    store.upsert_pool(&pool("gpu-a")).await.expect("pool");
    assert!(dir.path().join("nested/deeper/tessera.db").is_file());
}

#[tokio::test]
async fn unusable_urls_get_clear_errors() {
    let err = open("mysql://localhost/tessera")
        .await
        .err()
        .expect("no such backend");
    assert!(
        err.to_string()
            .contains("expected sqlite://PATH or postgres://"),
        "{err}"
    );
    // Nothing listens on port 1.
    let err = open("postgres://tessera@127.0.0.1:1/tessera")
        .await
        .err()
        .expect("no server");
    assert!(matches!(err, StoreError::Database(_)), "{err}");
    assert!(
        err.to_string().contains("refused"),
        "the cause, at once: {err}"
    );
}

/// Two servers on one database commit placements on the same GPU at the same moment: the
/// commits' re-checks run one after the other, so the GPU's memory is never overcommitted.
#[tokio::test]
async fn racing_commits_from_two_stores_never_overcommit_a_gpu() {
    let env = testkit::env(testkit::fast()).await;
    let h = testkit::host(&env.control, "h1", 1, 24).await;
    let def = testkit::register_def(&env.control, "racer", 1, 1).await;
    testkit::service(&env.control, "svc", &def, 0, Default::default()).await;
    let a = env.control.store().clone();
    let b = env.db.open().await;
    let deployment = a.list_deployments("svc").await.expect("deployments")[0].id;
    let r: TaskDefRef = def.parse().expect("family:revision");
    // 40 tasks of 1 GiB each; the GPU has 24 GiB.
    let tasks: Vec<NewTask> = (0..40)
        .map(|i| NewTask {
            id: format!("task-{i:02}"),
            service: "svc".into(),
            deployment_id: deployment,
            task_definition: r.clone(),
            pool: PoolName::new("gpu").expect("valid"),
            cpu: MilliCpu(10),
            memory: MiB(16),
            ports: vec![],
            health: None,
        })
        .collect();
    a.create_tasks(&tasks).await.expect("tasks");
    let gpu = a.get_host(&h.id).await.expect("host").gpus[0].uuid.clone();
    let commit = |i: usize| PlacementCommit {
        task_id: format!("task-{i:02}"),
        host: h.id.clone(),
        allocations: vec![GpuAllocation {
            gpu: gpu.clone(),
            index: 0,
            memory: MiB(1024),
            compute: ComputeMilli(0),
            dedicated: false,
        }],
    };
    // Each store commits 20 placements, one at a time, both at once: 40 GiB asked of 24.
    let run = |store: std::sync::Arc<dyn tessera_control::Store>, offset: usize| {
        let commits: Vec<PlacementCommit> = (offset..offset + 20).map(commit).collect();
        async move {
            let mut committed = 0;
            for c in commits {
                committed += store.commit_placements(&[c]).await.expect("commit").len();
            }
            committed
        }
    };
    let (na, nb) = tokio::join!(tokio::spawn(run(a.clone(), 0)), tokio::spawn(run(b, 20)));
    let committed = na.expect("a") + nb.expect("b");
    assert_eq!(committed, 24, "exactly what fits was committed");
    let placed = a
        .list_tasks(&tessera_control::store::TaskFilter {
            host: Some(h.id.clone()),
            ..Default::default()
        })
        .await
        .expect("tasks");
    let held: u64 = placed
        .iter()
        .flat_map(|t| &t.allocations)
        .map(|a| a.memory.0)
        .sum();
    assert_eq!(held, 24 * 1024);
    testkit::assert_no_overcommit(&env.control).await;
}

fn usage_row(task: &str, width: i64, start: i64, memory: u64, errors: u32) -> UsageRow {
    UsageRow {
        task_id: task.into(),
        width_secs: width,
        bucket_start: start,
        service: "web".into(),
        task_definition: TaskDefRef {
            family: "web".into(),
            revision: 1,
        },
        host: Some(HostId::new("host-1").expect("valid")),
        memory_max: MiB(memory),
        memory_last: MiB(memory / 2),
        sm_p50: Some(10),
        sm_p95: Some(memory as u32 % 100),
        sm_max: None,
        samples: 6,
        memory_errors: errors,
        work_secs: 30.0,
        completed: 300.0 + f64::from(errors),
        errors: (errors > 0).then_some(f64::from(errors)),
        latency_ms: [Some(10.0), Some(20.0), Some(memory as f64 / 10.0)],
        neighbours: Some(if errors > 1 {
            vec!["embed".into()]
        } else {
            Vec::new()
        }),
    }
}

#[tokio::test]
async fn usage_buckets_merge_when_written_twice_and_are_pruned_by_age() {
    let db = TestDb::new().await;
    let store = db.open().await;
    store
        .record_usage(&[
            usage_row("t1", 60, 600, 1000, 0),
            usage_row("t1", 60, 660, 1200, 0),
            usage_row("t2", 60, 600, 500, 1),
            usage_row("t1", 3600, 0, 1200, 0),
        ])
        .await
        .expect("written");
    // The same bucket from another server (an agent that failed over mid-minute).
    store
        .record_usage(&[usage_row("t1", 60, 600, 1500, 2)])
        .await
        .expect("merged");
    let q = |since| UsageQuery {
        service: Some("web".into()),
        task: None,
        width_secs: 60,
        since,
    };
    let rows = store.list_usage(&q(0)).await.expect("rows");
    assert_eq!(rows.len(), 3, "{rows:?}");
    let merged = rows
        .iter()
        .find(|r| r.task_id == "t1" && r.bucket_start == 600)
        .expect("t1's first minute");
    assert_eq!(merged.memory_max, MiB(1500), "the larger peak wins");
    assert_eq!(merged.samples, 12, "samples add up");
    assert_eq!(merged.memory_errors, 2, "errors add up");
    assert_eq!(merged.sm_p95, Some(0), "NULL-safe larger of 0 and 0");
    assert_eq!(merged.sm_max, None);
    assert_eq!(merged.work_secs, 60.0, "seconds of work measured add up");
    assert_eq!(merged.completed, 602.0, "work completed adds up");
    assert_eq!(merged.errors, Some(2.0), "failed work adds up, NULL-safe");
    assert_eq!(merged.latency_ms[2], Some(150.0), "the larger p99 wins");
    assert_eq!(
        merged.neighbours, None,
        "neighbours that differ between the two writes are not known for the whole bucket"
    );
    let alone = rows
        .iter()
        .find(|r| r.task_id == "t1" && r.bucket_start == 660)
        .expect("t1's second minute");
    assert_eq!(alone.neighbours, Some(Vec::new()), "alone, and stored so");
    assert_eq!(store.list_usage(&q(660)).await.expect("rows").len(), 1);
    let other = UsageQuery {
        service: Some("other".into()),
        ..q(0)
    };
    assert!(store.list_usage(&other).await.expect("rows").is_empty());
    // Summed up by the database: one row per task, one per time group.
    let mut summary = store.usage_summary(&q(0)).await.expect("summary");
    summary.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    assert_eq!(summary.len(), 2);
    assert_eq!(
        (summary[0].peak, summary[0].first, summary[0].memory_errors),
        (MiB(1500), 600, 2)
    );
    assert_eq!((summary[1].peak, summary[1].memory_errors), (MiB(500), 1));
    let history = store.usage_history(&q(0), 60).await.expect("history");
    assert_eq!(history.len(), 2, "{history:?}");
    assert_eq!(history[0].start, 600);
    assert_eq!(history[0].memory_max, MiB(1500));
    assert_eq!(history[0].memory_mean, MiB(1000), "(1500 + 500) / 2");
    assert_eq!(history[0].tasks, 2);
    assert_eq!(
        (history[1].start, history[1].memory_max, history[1].tasks),
        (660, MiB(1200), 1)
    );
    let grouped = store.usage_history(&q(0), 120).await.expect("history");
    assert_eq!(grouped.len(), 1, "600 and 660 fall in one 2-minute group");
    assert_eq!(
        grouped[0].memory_mean,
        MiB(1067),
        "(1500 + 1200 + 500) / 3, rounded"
    );
    assert_eq!(store.prune_usage(60, 660).await.expect("pruned"), 2);
    assert_eq!(store.list_usage(&q(0)).await.expect("rows").len(), 1);
    let hours = UsageQuery {
        width_secs: 3600,
        ..q(0)
    };
    assert_eq!(
        store.list_usage(&hours).await.expect("rows").len(),
        1,
        "another width is left alone"
    );
}

#[tokio::test]
async fn consolidation_plans_are_stored_and_listed_newest_first() {
    let db = TestDb::new().await;
    let store = db.open().await;
    for (id, at) in [
        ("p1", "2026-01-01T00:00:00.000Z"),
        ("p2", "2026-01-02T00:00:00.000Z"),
    ] {
        store
            .save_plan(&StoredPlan {
                id: id.into(),
                pool: "gpu".into(),
                goal: "gpus".into(),
                status: "planned".into(),
                created_at: at.into(),
                body: "{}".into(),
            })
            .await
            .expect("saved");
    }
    let mut p1 = store.get_plan("p1").await.expect("p1");
    p1.status = "executing".into();
    p1.body = "{\"moves\":[]}".into();
    store.save_plan(&p1).await.expect("updated");
    let listed = store.list_plans(10).await.expect("listed");
    assert_eq!(
        listed.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        ["p2", "p1"]
    );
    assert_eq!(listed[1].status, "executing");
    assert_eq!(listed[1].body, "{\"moves\":[]}");
    assert!(matches!(
        store.get_plan("nope").await,
        Err(StoreError::NotFound { .. })
    ));
    // Compare-and-set: only from the status it was read in.
    let mut p2 = store.get_plan("p2").await.expect("p2");
    p2.status = "cancelled".into();
    assert!(!store.update_plan(&p2, "executing").await.expect("checked"));
    assert_eq!(store.get_plan("p2").await.expect("p2").status, "planned");
    assert!(store.update_plan(&p2, "planned").await.expect("updated"));
    assert_eq!(store.get_plan("p2").await.expect("p2").status, "cancelled");
}

/// Writers that give up at any moment (a request past its timeout), many at once, leave
/// no connection inside a transaction holding the write lock: the writes after them go
/// through at once.
#[tokio::test]
async fn writers_that_give_up_midway_leave_no_lock_behind() {
    let db = TestDb::new().await;
    let store = db.open().await;
    for round in 0..30u64 {
        let tries: Vec<_> = (0..16u64)
            .map(|i| {
                let s = store.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(
                        std::time::Duration::from_micros(37 * i + 11 * round),
                        s.add_event(None, None, "a write that may be given up on"),
                    )
                    .await;
                })
            })
            .collect();
        for t in tries {
            t.await.expect("a writer");
        }
    }
    for _ in 0..16 {
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            store.add_event(None, None, "after them"),
        )
        .await
        .expect("no write lock was left behind")
        .expect("written");
    }
}
