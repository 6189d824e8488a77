//! Projects share a fleet: a service belongs to one (`default` unless it says), a project's
//! guarantees must fit in the pool, and placement never takes a project past its limit.
//! Runs on both databases (`TESSERA_TEST_STORE=postgres`).

use serde_json::json;
use tessera_control::ControlError;
use tessera_control::inputs::{ServiceInput, ServicePatch};
use tessera_control::testkit::*;
use tessera_model::project::{Amounts, DEFAULT_PROJECT, ProjectInput, ProjectSettings, Quota};
use tessera_model::service::{DeploymentConfig, TaskState};

fn quota(pool: &str, guaranteed: Amounts, limit: Amounts) -> Quota {
    Quota {
        pool: pool.into(),
        guaranteed,
        limit,
    }
}

fn gpu_memory_gib(gib: u64) -> Amounts {
    Amounts {
        gpu_memory_mib: Some(gib * 1024),
        ..Default::default()
    }
}

fn project(name: &str, quotas: Vec<Quota>) -> ProjectInput {
    ProjectInput {
        name: name.into(),
        weight: None,
        quotas,
    }
}

fn settings(quotas: Vec<Quota>) -> ProjectSettings {
    ProjectSettings {
        weight: None,
        quotas,
    }
}

fn fields(e: &ControlError) -> Vec<String> {
    match e {
        ControlError::Invalid(v) => v.errors.iter().map(|e| e.field.clone()).collect(),
        other => panic!("expected invalid input, got {other}"),
    }
}

#[tokio::test]
async fn every_service_has_a_project_and_guarantees_must_fit_in_the_pool() {
    let env = env(fast()).await;
    let c = &env.control;
    host(c, "a", 2, 24).await;
    let def = register_def(c, "infer", 10, 40).await;

    // A fresh fleet has the default project, and a service that names none is in it.
    service(c, "plain", &def, 1, DeploymentConfig::default()).await;
    let projects = c.projects().list_projects().await.expect("projects");
    assert_eq!(projects.len(), 1);
    assert_eq!(projects[0].project.name, DEFAULT_PROJECT);
    assert_eq!(projects[0].services, 1);
    assert_eq!(
        c.store()
            .get_service("plain")
            .await
            .expect("service")
            .project,
        DEFAULT_PROJECT
    );

    // A service naming a project that does not exist is refused, and nothing is stored.
    let err = c
        .deployments()
        .create_service(&ServiceInput {
            project: Some("nobody".into()),
            priority: None,
            ..serde_json::from_value(json!({"name": "x", "task_definition": def, "pool": "gpu"}))
                .expect("input")
        })
        .await
        .expect_err("no such project");
    assert_eq!(fields(&err), ["project"]);
    assert!(c.store().get_service("x").await.is_err());
    // Nor does a change that moves a service there, and what came with it is not taken.
    let err = c
        .deployments()
        .update_service(
            "plain",
            &ServicePatch {
                desired_count: Some(3),
                project: Some("nobody".into()),
                ..Default::default()
            },
        )
        .await
        .expect_err("no such project");
    assert_eq!(fields(&err), ["project"]);
    let plain = c.store().get_service("plain").await.expect("service");
    assert_eq!(
        (plain.desired_count, plain.project.as_str()),
        (1, DEFAULT_PROJECT)
    );

    // The pool has 48 GiB of GPU memory: guarantees may not add up to more, limits may.
    c.projects()
        .create_project(&project(
            "research",
            vec![quota("gpu", gpu_memory_gib(30), gpu_memory_gib(48))],
        ))
        .await
        .expect("fits");
    let err = c
        .projects()
        .create_project(&project(
            "prod",
            vec![quota("gpu", gpu_memory_gib(20), gpu_memory_gib(100))],
        ))
        .await
        .expect_err("30 + 20 GiB guaranteed of 48");
    assert_eq!(fields(&err), ["quotas[0].guaranteed.gpu_memory_mib"]);
    let ControlError::Invalid(v) = &err else {
        unreachable!()
    };
    assert!(
        v.errors[0]
            .message
            .starts_with("pool gpu: 2048 MiB of GPU memory short"),
        "{}",
        v.errors[0].message
    );
    assert!(
        c.store().get_project("prod").await.is_err(),
        "nothing stored"
    );
    c.projects()
        .create_project(&project(
            "prod",
            vec![quota("gpu", gpu_memory_gib(18), gpu_memory_gib(100))],
        ))
        .await
        .expect("18 + 30 fits, and limits may add up to more than the pool");

    // A quota in a pool that does not exist; a limit below its guarantee.
    let err = c
        .projects()
        .create_project(&project(
            "ops",
            vec![quota("nowhere", Amounts::default(), Amounts::default())],
        ))
        .await
        .expect_err("no such pool");
    assert_eq!(fields(&err), ["quotas[0].pool"]);
    let err = c
        .projects()
        .create_project(&project(
            "ops",
            vec![quota("gpu", gpu_memory_gib(2), gpu_memory_gib(1))],
        ))
        .await
        .expect_err("limit below guarantee");
    assert_eq!(fields(&err), ["quotas[0].limit.gpu_memory_mib"]);
    assert!(
        c.store().get_project("ops").await.is_err(),
        "nothing stored"
    );

    // Deleting: not the default project, not one with services, yes an empty one.
    assert!(matches!(
        c.projects().delete_project(DEFAULT_PROJECT).await,
        Err(ControlError::Conflict(_))
    ));
    service_with(c, "trainer", &def, 0, "research", "default").await;
    let err = c
        .projects()
        .delete_project("research")
        .await
        .expect_err("has a service");
    assert!(err.to_string().contains("1 service(s)"), "{err}");
    c.projects().delete_project("prod").await.expect("empty");
    assert!(c.store().get_project("prod").await.is_err());

    // A service moves to another project (one that exists); then research can go.
    let err = c
        .deployments()
        .update_service(
            "trainer",
            &ServicePatch {
                project: Some("prod".into()),
                ..Default::default()
            },
        )
        .await
        .expect_err("prod was deleted");
    assert_eq!(fields(&err), ["project"]);
    c.deployments()
        .update_service(
            "trainer",
            &ServicePatch {
                project: Some(DEFAULT_PROJECT.into()),
                ..Default::default()
            },
        )
        .await
        .expect("move");
    assert_eq!(
        c.store()
            .get_service("trainer")
            .await
            .expect("service")
            .project,
        DEFAULT_PROJECT
    );
    c.projects()
        .delete_project("research")
        .await
        .expect("no service left in it");
}

#[tokio::test]
async fn placement_never_takes_a_project_past_its_limit_and_says_so() {
    let env = env(fast()).await;
    let c = &env.control;
    host(c, "a", 2, 24).await;
    let def = register_def(c, "infer", 10, 40).await;
    // research may use 20 GiB of GPU memory in the pool: two 10 GiB tasks, not three.
    c.projects()
        .create_project(&project(
            "research",
            vec![quota("gpu", Amounts::default(), gpu_memory_gib(20))],
        ))
        .await
        .expect("project");
    service_with(c, "trainer", &def, 3, "research", "default").await;
    // Another project's tasks are not held back by research's limit.
    service(c, "web", &def, 1, DeploymentConfig::default()).await;
    c.reconcile_once().await.expect("pass");

    assert_eq!(tasks(c, "trainer", &[TaskState::Assigned]).await.len(), 2);
    assert_eq!(tasks(c, "web", &[TaskState::Assigned]).await.len(), 1);
    let pending = tasks(c, "trainer", &[TaskState::Pending]).await;
    assert_eq!(pending.len(), 1);
    let why = pending[0].placement_message.as_deref().expect("explained");
    assert!(
        why.contains("project `research` is at its limit in pool `gpu`: it would use 30720 of 20480 MiB of GPU memory"),
        "{why}"
    );

    // The view: used, borrowed (all of it: no guarantee), pending.
    let research = c.projects().get_project("research").await.expect("project");
    let share = &research.pools[0];
    assert_eq!(share.pool, "gpu");
    assert_eq!(share.used.gpu_memory_mib, 20 * 1024);
    assert_eq!(share.used.gpus, 0, "shared slots are no whole GPUs");
    assert_eq!(share.borrowed, share.used);
    assert_eq!(share.pending, 1);
    // And which of its services wait, and why.
    assert_eq!(research.waiting.len(), 1, "{:?}", research.waiting);
    assert_eq!(
        (
            research.waiting[0].service.as_str(),
            research.waiting[0].tasks
        ),
        ("trainer", 1)
    );
    assert!(
        research.waiting[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("is at its limit")),
        "{:?}",
        research.waiting
    );

    // A higher limit lets the third task in on the next pass.
    c.projects()
        .replace_project(
            "research",
            &settings(vec![quota("gpu", gpu_memory_gib(10), gpu_memory_gib(30))]),
        )
        .await
        .expect("raise");
    c.reconcile_once().await.expect("pass");
    assert_eq!(tasks(c, "trainer", &[TaskState::Assigned]).await.len(), 3);
    let share = &c
        .projects()
        .get_project("research")
        .await
        .expect("project")
        .pools[0];
    assert_eq!(
        share.borrowed.gpu_memory_mib,
        20 * 1024,
        "30 used, 10 guaranteed"
    );
    assert_no_overcommit(c).await;

    // Scaling past the limit again leaves the new task pending; scaling down frees room.
    c.deployments()
        .update_service(
            "trainer",
            &ServicePatch {
                desired_count: Some(4),
                ..Default::default()
            },
        )
        .await
        .expect("scale");
    c.reconcile_once().await.expect("pass");
    assert_eq!(tasks(c, "trainer", &[TaskState::Pending]).await.len(), 1);
}

#[tokio::test]
async fn a_whole_gpu_limit_counts_gpus_and_bad_replacements_are_refused() {
    let env = env(fast()).await;
    let c = &env.control;
    host(c, "a", 4, 24).await;
    let whole = c
        .deployments()
        .register_task_definition(&json!({
            "family": "train",
            "containers": [{"name": "main", "command": ["sleep", "infinity"], "cpu_milli": 1000,
                "memory_mib": 1024, "gpu": {"gpus": 1}}]
        }))
        .await
        .expect("register");
    c.projects()
        .create_project(&project(
            "research",
            vec![quota(
                "gpu",
                Amounts::default(),
                Amounts {
                    gpus: Some(2),
                    ..Default::default()
                },
            )],
        ))
        .await
        .expect("project");
    service_with(
        c,
        "trainer",
        &format!("train:{}", whole.revision),
        3,
        "research",
        "default",
    )
    .await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(tasks(c, "trainer", &[TaskState::Assigned]).await.len(), 2);
    let pending = tasks(c, "trainer", &[TaskState::Pending]).await;
    let why = pending[0].placement_message.as_deref().expect("explained");
    assert!(why.contains("it would use 3 of 2 whole GPUs"), "{why}");

    assert!(matches!(
        c.projects()
            .replace_project("ghost", &settings(vec![]))
            .await,
        Err(ControlError::NotFound(_))
    ));
    // An amount past what JSON clients read as an integer is refused.
    let err = c
        .projects()
        .replace_project(
            "research",
            &settings(vec![quota(
                "gpu",
                Amounts::default(),
                Amounts {
                    memory_mib: Some(u64::MAX),
                    ..Default::default()
                },
            )]),
        )
        .await
        .expect_err("too large");
    assert_eq!(fields(&err), ["quotas[0].limit.memory_mib"]);
}

async fn service_with(
    c: &tessera_control::Control,
    name: &str,
    def: &str,
    count: u32,
    project: &str,
    priority: &str,
) {
    c.deployments()
        .create_service(&ServiceInput {
            priority: Some(priority.parse().expect("a priority class")),
            ..serde_json::from_value(json!({
                "name": name, "task_definition": def, "pool": "gpu", "desired_count": count,
                "project": project, "stop_timeout_secs": 5, "deregistration_delay_secs": 0
            }))
            .expect("input")
        })
        .await
        .expect("service");
}

/// A production task of a project within its guarantee takes room from batch tasks that
/// borrow: the fewest are stopped (two 12 GiB tasks on one GPU for 20 GiB), events say who
/// preempted whom, the batch service's replacements wait, and the production task is placed
/// once the victims have stopped. Nothing else is stopped meanwhile.
#[tokio::test]
async fn a_guaranteed_production_task_preempts_the_fewest_borrowing_batch_tasks() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    c.projects()
        .create_project(&project("lab", vec![]))
        .await
        .expect("no quota: all it uses is borrowed");
    c.projects()
        .create_project(&project(
            "prod",
            vec![quota("gpu", gpu_memory_gib(24), Amounts::default())],
        ))
        .await
        .expect("prod");
    let small = register_def(c, "crunch", 12, 40).await;
    let big = register_def(c, "api", 20, 50).await;
    service_with(c, "crunch", &small, 4, "lab", "batch").await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    assert_eq!(
        tasks(c, "crunch", &[TaskState::Running]).await.len(),
        4,
        "both GPUs full"
    );

    // A task of equal or lower priority never preempts: another batch service waits.
    service_with(c, "other", &big, 1, "prod", "batch").await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(tasks(c, "crunch", &[TaskState::Running]).await.len(), 4);
    c.deployments()
        .delete_service("other")
        .await
        .expect("delete");
    c.reconcile_once().await.expect("pass");

    service_with(c, "api", &big, 1, "prod", "production").await;
    c.reconcile_once().await.expect("pass");
    let stopping = tasks(c, "crunch", &[TaskState::Stopping, TaskState::Stopped]).await;
    assert_eq!(stopping.len(), 2, "the fewest that free 20 GiB on one GPU");
    let gpus: std::collections::HashSet<_> = stopping
        .iter()
        .map(|t| t.allocations.first().map(|a| a.gpu.clone()))
        .collect();
    assert!(gpus.len() <= 1, "both on one GPU");
    for t in &stopping {
        let why = t.stop_reason.as_deref().expect("a reason");
        assert!(
            why.contains("preempted: service api (project prod, production)"),
            "{why}"
        );
    }
    let events = c
        .store()
        .list_events(&tessera_control::store::EventFilter {
            service: Some("crunch".into()),
            limit: 50,
            ..Default::default()
        })
        .await
        .expect("events");
    assert!(
        events.iter().any(|e| e
            .message
            .contains("preempted for service api (project prod, production)")),
        "{events:?}"
    );
    // The preemption is on record, for both projects.
    let record = c
        .projects()
        .list_preemptions(Some("lab"), 10)
        .await
        .expect("preemptions");
    assert_eq!(record.len(), 1, "{record:?}");
    assert_eq!(
        (
            record[0].service.as_str(),
            record[0].project.as_str(),
            record[0].victims.len()
        ),
        ("api", "prod", 2)
    );
    assert!(
        record[0]
            .victims
            .iter()
            .all(|v| v.service == "crunch" && v.project == "lab")
    );
    assert_eq!(
        c.projects()
            .list_preemptions(Some("prod"), 10)
            .await
            .expect("preemptions"),
        record
    );
    assert!(
        c.projects()
            .list_preemptions(Some("default"), 10)
            .await
            .expect("preemptions")
            .is_empty()
    );
    // Until the victims let go, the next pass stops nothing more.
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "crunch", &[TaskState::Stopping, TaskState::Stopped])
            .await
            .len(),
        2
    );

    // The agent stops them; the production task gets the GPU; crunch's replacements wait.
    sync(c, &a).await;
    c.reconcile_once().await.expect("pass");
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "api", &[TaskState::Assigned, TaskState::Running])
            .await
            .len(),
        1
    );
    let crunch_live = tasks(c, "crunch", LIVE).await;
    assert_eq!(crunch_live.len(), 4, "replacements for the stopped ones");
    assert_eq!(
        crunch_live
            .iter()
            .filter(|t| t.state == TaskState::Pending)
            .count(),
        2,
        "they wait: the batch class takes nothing back"
    );
    assert_no_overcommit(c).await;
}

/// Where host CPU, not GPU, runs short: a production task without a GPU, of a project
/// whose guarantee names CPU, takes room back from batch tasks that borrow it (the fewest,
/// on one host), and is placed once they stop. A guarantee that names only GPU quantities
/// covers no task without a GPU: such a task waits like any other.
#[tokio::test]
async fn a_guaranteed_task_short_of_host_cpu_preempts_batch_tasks_that_borrow_it() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    c.projects()
        .create_project(&project("lab", vec![]))
        .await
        .expect("no quota: all it uses is borrowed");
    let cpu = |milli: u64| Amounts {
        cpu_milli: Some(milli),
        ..Default::default()
    };
    c.projects()
        .create_project(&project(
            "prod",
            vec![quota("gpu", cpu(16_000), Amounts::default())],
        ))
        .await
        .expect("prod");
    c.projects()
        .create_project(&project(
            "ops",
            vec![quota("gpu", gpu_memory_gib(8), Amounts::default())],
        ))
        .await
        .expect("ops");
    let cpu_only = |family: &str, milli: u64| {
        json!({"family": family, "containers": [{"name": "main", "command": ["sleep", "infinity"],
            "cpu_milli": milli, "memory_mib": 1024}]})
    };
    for (family, milli) in [("churn", 16_000), ("api", 12_000), ("cron", 12_000)] {
        c.deployments()
            .register_task_definition(&cpu_only(family, milli))
            .await
            .expect("definition");
    }
    service_with(c, "churn", "churn:1", 4, "lab", "batch").await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    assert_eq!(
        tasks(c, "churn", &[TaskState::Running]).await.len(),
        4,
        "the host's 64 CPUs taken, its GPUs idle"
    );

    // A guarantee of GPU memory does not cover a task without a GPU.
    service_with(c, "cron", "cron:1", 1, "ops", "production").await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(tasks(c, "churn", &[TaskState::Running]).await.len(), 4);
    let cron = tasks(c, "cron", &[TaskState::Pending]).await;
    assert_eq!(cron.len(), 1);
    let said = cron[0]
        .placement_message
        .as_deref()
        .expect("a pending reason");
    assert!(
        said.contains("project `ops`'s guarantee in pool `gpu` names none of host CPU or memory"),
        "{said}"
    );
    c.deployments()
        .delete_service("cron")
        .await
        .expect("delete");
    c.reconcile_once().await.expect("pass");

    service_with(c, "api", "api:1", 1, "prod", "production").await;
    c.reconcile_once().await.expect("pass");
    let stopping = tasks(c, "churn", &[TaskState::Stopping, TaskState::Stopped]).await;
    assert_eq!(stopping.len(), 1, "one 16-CPU task frees the 12 CPUs asked");
    let why = stopping[0].stop_reason.as_deref().expect("a reason");
    assert!(
        why.contains("preempted: service api (project prod, production)"),
        "{why}"
    );
    sync(c, &a).await;
    c.reconcile_once().await.expect("pass");
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "api", &[TaskState::Assigned, TaskState::Running])
            .await
            .len(),
        1,
        "placed in the room its victim left"
    );
    assert_eq!(
        tasks(c, "churn", &[TaskState::Pending]).await.len(),
        1,
        "the batch replacement waits"
    );
    assert_no_overcommit(c).await;
}

/// Several waiting tasks each get room of their own in one pass (a plan's room is claimed
/// for its task, not counted free for the next), and once the victims let go nothing
/// else takes it: not even a task of the same class whose project is further below its
/// fair share.
#[tokio::test]
async fn each_waiting_task_claims_room_of_its_own_and_keeps_it() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 3, 24).await;
    for p in ["lab", "ops"] {
        c.projects()
            .create_project(&project(p, vec![]))
            .await
            .expect("no quota: all it uses is borrowed");
    }
    c.projects()
        .create_project(&project(
            "prod",
            vec![quota("gpu", gpu_memory_gib(72), Amounts::default())],
        ))
        .await
        .expect("prod");
    let small = register_def(c, "crunch", 12, 40).await;
    let big = register_def(c, "api", 20, 50).await;
    // prod holds one GPU (so a project using nothing comes before it by fair share); lab
    // borrows the other two.
    service_with(c, "base", &big, 1, "prod", "production").await;
    c.reconcile_once().await.expect("pass");
    service_with(c, "crunch", &small, 4, "lab", "batch").await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    assert_eq!(tasks(c, "crunch", &[TaskState::Running]).await.len(), 4);

    service_with(c, "api", &big, 2, "prod", "production").await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "crunch", &[TaskState::Stopping, TaskState::Stopped])
            .await
            .len(),
        4,
        "both api tasks made room in the same pass, one GPU each"
    );
    // A production task of a project using nothing (first by fair share) arrives while
    // the victims stop.
    service_with(c, "intruder", &big, 1, "ops", "production").await;
    sync(c, &a).await;
    c.reconcile_once().await.expect("pass");
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "api", &[TaskState::Assigned, TaskState::Running])
            .await
            .len(),
        2,
        "the claimed room went to the tasks it was made for"
    );
    assert_eq!(tasks(c, "intruder", &[TaskState::Pending]).await.len(), 1);
    assert_no_overcommit(c).await;
}

/// In a pool whose preemption waits for approval, a plan is proposed (shown, nothing
/// stopped, proposed once), carried out when an operator approves it, and a declined one
/// stops nothing and is not proposed again.
#[tokio::test]
async fn in_an_approve_pool_a_preemption_waits_for_an_operator() {
    use tessera_model::project::PreemptionState;
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    c.deployments()
        .update_pool(
            &tessera_model::PoolName::new("gpu").expect("valid"),
            &tessera_model::api::PoolPatch {
                preemption: Some("approve".into()),
                ..Default::default()
            },
        )
        .await
        .expect("approve mode");
    c.projects()
        .create_project(&project("lab", vec![]))
        .await
        .expect("lab");
    c.projects()
        .create_project(&project(
            "prod",
            vec![quota("gpu", gpu_memory_gib(48), Amounts::default())],
        ))
        .await
        .expect("prod");
    let small = register_def(c, "crunch", 12, 40).await;
    let big = register_def(c, "api", 20, 50).await;
    service_with(c, "crunch", &small, 4, "lab", "batch").await;
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    service_with(c, "api", &big, 1, "prod", "production").await;
    for _ in 0..2 {
        c.reconcile_once().await.expect("pass");
    }
    let stopping = || async {
        tasks(c, "crunch", &[TaskState::Stopping, TaskState::Stopped])
            .await
            .len()
    };
    assert_eq!(stopping().await, 0, "nothing stops before approval");
    let record = c
        .projects()
        .list_preemptions(Some("prod"), 10)
        .await
        .expect("list");
    assert_eq!(record.len(), 1, "proposed once: {record:?}");
    assert_eq!(record[0].state, PreemptionState::Proposed);
    assert_eq!(record[0].victims.len(), 2);
    c.scheduler()
        .approve_preemption(record[0].id)
        .await
        .expect("approved");
    c.scheduler()
        .approve_preemption(record[0].id)
        .await
        .expect_err("approved once");
    c.reconcile_once().await.expect("pass");
    assert_eq!(stopping().await, 2, "the next pass stops its victims");
    let record = c
        .projects()
        .list_preemptions(Some("prod"), 10)
        .await
        .expect("list");
    assert_eq!(record[0].state, PreemptionState::Done, "{record:?}");
    sync(c, &a).await;
    c.reconcile_once().await.expect("pass");
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "api", &[TaskState::Assigned, TaskState::Running])
            .await
            .len(),
        1
    );

    // Another production task: proposed, declined, and then left alone.
    service_with(c, "api2", &big, 1, "prod", "production").await;
    c.reconcile_once().await.expect("pass");
    let open: Vec<_> = c
        .projects()
        .list_preemptions(Some("prod"), 10)
        .await
        .expect("list")
        .into_iter()
        .filter(|p| p.state == PreemptionState::Proposed)
        .collect();
    assert_eq!(open.len(), 1, "{open:?}");
    c.scheduler()
        .decline_preemption(open[0].id)
        .await
        .expect("declined");
    let before = stopping().await;
    for _ in 0..2 {
        c.reconcile_once().await.expect("pass");
    }
    assert_eq!(stopping().await, before, "a declined plan stops nothing");
    let after = c
        .projects()
        .list_preemptions(Some("prod"), 10)
        .await
        .expect("list");
    assert!(
        after.iter().all(|p| p.state != PreemptionState::Proposed),
        "not proposed again: {after:?}"
    );
    assert_eq!(tasks(c, "api2", &[TaskState::Pending]).await.len(), 1);
    c.scheduler()
        .approve_preemption(open[0].id)
        .await
        .expect_err("declined is final");
    // Back to automatic: what was open expires, and plans are carried out at once.
    c.deployments()
        .update_pool(
            &tessera_model::PoolName::new("gpu").expect("valid"),
            &tessera_model::api::PoolPatch {
                preemption: Some("automatic".into()),
                ..Default::default()
            },
        )
        .await
        .expect("automatic");
    let expired = c
        .projects()
        .list_preemptions(Some("prod"), 10)
        .await
        .expect("list");
    assert!(
        expired.iter().all(|p| p.state != PreemptionState::Declined),
        "{expired:?}"
    );
    c.reconcile_once().await.expect("pass");
    assert!(stopping().await > before, "api2 preempts now");
    assert_no_overcommit(c).await;
}

/// When room is short, the project furthest below its fair share goes first (its share of
/// the pool over its weight), whatever the order its tasks were created in; a higher
/// priority class goes before both.
#[tokio::test]
async fn the_project_furthest_below_its_fair_share_is_placed_first() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    for p in ["alpha", "beta"] {
        c.projects()
            .create_project(&project(p, vec![]))
            .await
            .expect("project");
    }
    let def = register_def(c, "half", 12, 40).await;
    service_with(c, "a1", &def, 1, "alpha", "default").await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "a1", &[TaskState::Assigned]).await.len(),
        1,
        "alpha holds half"
    );
    // One slot is left; alpha and beta each want it in the same pass.
    c.deployments()
        .update_service(
            "a1",
            &ServicePatch {
                desired_count: Some(2),
                ..Default::default()
            },
        )
        .await
        .expect("scale");
    service_with(c, "b1", &def, 1, "beta", "default").await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "b1", &[TaskState::Assigned]).await.len(),
        1,
        "beta uses nothing yet: it is furthest below its share"
    );
    assert_eq!(tasks(c, "a1", &[TaskState::Pending]).await.len(), 1);

    // A production service goes first, whatever its project already uses.
    c.deployments()
        .update_service(
            "a1",
            &ServicePatch {
                desired_count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("scale down");
    c.deployments().delete_service("b1").await.expect("delete");
    c.reconcile_once().await.expect("pass");
    sync(c, &a).await;
    c.reconcile_once().await.expect("pass");
    service_with(c, "b2", &def, 1, "beta", "default").await;
    service_with(c, "a2", &def, 1, "alpha", "production").await;
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "a2", &[TaskState::Assigned]).await.len(),
        1,
        "production first"
    );
    assert_eq!(tasks(c, "b2", &[TaskState::Pending]).await.len(), 1);
}

/// Fair share weighs what projects held over the last hour: of two projects holding
/// nothing now, the one that held the pool for the last hour goes after the other, even
/// when its task waited first.
#[tokio::test]
async fn fair_share_counts_what_each_project_held_over_the_last_hour() {
    use tessera_model::project::Usage;
    let env = env(fast()).await;
    let c = &env.control;
    host(c, "a", 1, 24).await;
    for p in ["alpha", "beta"] {
        c.projects()
            .create_project(&project(p, vec![]))
            .await
            .expect("project");
    }
    let now = chrono::Utc::now().timestamp();
    let full = Usage {
        gpu_memory_mib: 24 * 1024,
        ..Default::default()
    };
    for ago in [600, 1200, 1800] {
        c.store()
            .record_project_usage(
                now - ago,
                &[
                    ("alpha".into(), "gpu".into(), full),
                    ("beta".into(), "gpu".into(), Usage::default()),
                ],
            )
            .await
            .expect("sample");
    }
    let def = register_def(c, "big", 20, 40).await;
    // One slot; alpha's task is older.
    service_with(c, "a1", &def, 0, "alpha", "default").await;
    service_with(c, "b1", &def, 0, "beta", "default").await;
    for name in ["a1", "b1"] {
        c.deployments()
            .update_service(
                name,
                &ServicePatch {
                    desired_count: Some(1),
                    ..Default::default()
                },
            )
            .await
            .expect("scale");
    }
    c.reconcile_once().await.expect("pass");
    assert_eq!(
        tasks(c, "b1", &[TaskState::Assigned]).await.len(),
        1,
        "beta held nothing this last hour"
    );
    assert_eq!(tasks(c, "a1", &[TaskState::Pending]).await.len(), 1);
    // The history shows what was sampled, and the pass's own sample.
    let history = c
        .projects()
        .project_usage_history(Some("alpha"), "day")
        .await
        .expect("history");
    assert!(history.samples.len() >= 3, "{history:?}");
    assert!(history.samples.iter().all(|s| s.project == "alpha"));
    let err = c
        .projects()
        .project_usage_history(None, "year")
        .await
        .expect_err("not a range");
    assert_eq!(fields(&err), vec!["range"]);
}

/// Roles given in projects are stored (on both databases), bound what a token scoped to
/// the project is worth, and go with the project; a scoped token made by a project
/// operator is no more than an operator there.
#[tokio::test]
async fn roles_in_projects_are_kept_and_bound_scoped_tokens() {
    use tessera_model::auth::{Caller, CallerKind, Role};
    let env = env(fast()).await;
    let c = &env.control;
    c.projects()
        .create_project(&project("research", vec![]))
        .await
        .expect("project");
    c.accounts()
        .add_user("rita", "rita-password-123", Role::Viewer)
        .await
        .expect("user");
    let err = c
        .projects()
        .set_project_member("research", "rita", Role::Admin)
        .await
        .expect_err("admins are fleet-wide");
    assert_eq!(fields(&err), vec!["role"]);
    c.projects()
        .set_project_member("research", "nobody", Role::Operator)
        .await
        .expect_err("no such user");
    c.projects()
        .set_project_member("research", "rita", Role::Operator)
        .await
        .expect("given");
    let view = c.projects().get_project("research").await.expect("view");
    assert_eq!(view.members.len(), 1);
    assert_eq!(view.members[0].role, Role::Operator);

    // Rita's session sees her role in research.
    let rita = c
        .accounts()
        .session_caller(&tessera_control::auth::SessionUser {
            username: "rita".into(),
            signed_in_at: i64::MAX / 2,
        })
        .await
        .expect("read")
        .expect("valid");
    assert_eq!(rita.role_in("research"), Some(Role::Operator));
    assert_eq!(rita.role_in("default"), Some(Role::Viewer));
    // She makes a token scoped to research: an operator there, at most.
    let err = c
        .accounts()
        .create_api_token(&rita, "too-much", Role::Admin, Some("research"), None)
        .await
        .expect_err("admin is not a project role");
    assert_eq!(fields(&err), vec!["role"]);
    let err = c
        .accounts()
        .create_api_token(&rita, "elsewhere", Role::Operator, None, None)
        .await
        .expect_err("fleet-wide she is a viewer");
    assert_eq!(fields(&err), vec!["role"]);
    let made = c
        .accounts()
        .create_api_token(&rita, "ci", Role::Operator, Some("research"), None)
        .await
        .expect("scoped");
    let ci: Caller = c
        .accounts()
        .token_caller(&made.token)
        .await
        .expect("read")
        .expect("valid");
    assert_eq!(ci.kind, CallerKind::Token);
    assert_eq!(
        (ci.role, ci.role_in("research")),
        (Role::Viewer, Some(Role::Operator))
    );
    assert_eq!(ci.role_in("default"), None);
    // Her role taken away, the token is worth what she is there now: a viewer.
    c.projects()
        .remove_project_member("research", "rita")
        .await
        .expect("taken");
    let ci = c
        .accounts()
        .token_caller(&made.token)
        .await
        .expect("read")
        .expect("valid");
    assert_eq!(ci.role_in("research"), Some(Role::Viewer));
    c.projects()
        .remove_project_member("research", "rita")
        .await
        .expect_err("nothing to take");
    // The project goes, and its tokens with it.
    c.projects()
        .delete_project("research")
        .await
        .expect("deleted");
    assert!(
        c.accounts()
            .token_caller(&made.token)
            .await
            .expect("read")
            .is_none()
    );
}

/// The store keeps the newest preemptions decided for good, and every open one however
/// old (a proposal waiting for an operator must not vanish under busy pools).
#[tokio::test]
async fn open_preemptions_are_never_pruned() {
    use tessera_model::project::{Preemption, PreemptionState};
    use tessera_model::service::PriorityClass;
    let env = env(fast()).await;
    let store = env.control.store();
    let record = |state, task: &str| Preemption {
        id: 0,
        state,
        task: task.into(),
        at: tessera_model::time::Timestamp::EPOCH,
        pool: "gpu".into(),
        host: "a".into(),
        service: "api".into(),
        project: "prod".into(),
        priority: PriorityClass::Production,
        victims: vec![],
    };
    let open = store
        .add_preemption(&record(PreemptionState::Proposed, "t-open"))
        .await
        .expect("recorded");
    let kept = tessera_control::store::PREEMPTIONS_KEPT as usize;
    for i in 0..=kept {
        store
            .add_preemption(&record(PreemptionState::Done, &format!("t-{i}")))
            .await
            .expect("recorded");
    }
    let all = store
        .list_preemptions(10 * kept as u32)
        .await
        .expect("listed");
    assert_eq!(all.len(), kept + 1, "the oldest decided one went");
    assert_eq!(
        store.get_preemption(open).await.expect("kept").state,
        PreemptionState::Proposed
    );
    assert_eq!(
        store
            .open_preemptions(Some("gpu"))
            .await
            .expect("open")
            .len(),
        1
    );
    assert_eq!(
        store.expire_open_preemptions("gpu").await.expect("expired"),
        1
    );
    assert!(store.open_preemptions(None).await.expect("open").is_empty());
}
