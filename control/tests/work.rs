//! Work end to end through the agent API, with the control plane's clock moved by the test:
//! agents report what their tasks' applications completed; the server finds which
//! neighbour slows a service (and no false pair), keeps new tasks off that neighbour's
//! GPUs, rolls back a deployment whose latency alarm fires (and completes one whose
//! latency is fine after its bake time), and scales a service to its load and back.

use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use tessera_control::Control;
use tessera_control::inputs::{ServiceInput, ServicePatch};
use tessera_control::testkit::*;
use tessera_model::agent::{MpsReport, RegisterRequest, SyncRequest, TaskReport};
use tessera_model::service::{
    DeploymentConfig, DeploymentStatus, ServiceConstraints, Task, TaskPort, TaskState,
};
use tessera_model::taskdef::Protocol;
use tessera_model::work::{
    Alarm, AlarmMetric, Autoscaling, LatencyBucket, ScaleMetric, Slo, WorkReport, WorkSample,
};
use tessera_model::{MiB, MilliCpu, PoolName};

/// A host with one GPU and `labels` (services pin themselves to hosts by label).
async fn labelled_host(c: &Control, name: &str, labels: &[&str]) -> Host {
    let gpus = gpus(name, 1, 80);
    let resp = c
        .agents()
        .register_agent(&RegisterRequest {
            address: Some("10.0.0.1".into()),
            join_token: JOIN.into(),
            pool: PoolName::new("gpu").expect("valid"),
            cpu_milli: MilliCpu(64_000),
            memory_mib: MiB(256 * 1024),
            simulated: true,
            labels: labels
                .iter()
                .map(|l| ((*l).to_owned(), "yes".to_owned()))
                .collect(),
            gpus: gpus.clone(),
            name: Some(name.into()),
            provider_id: None,
            agent_version: None,
        })
        .await
        .expect("register");
    Host {
        id: resp.host_id,
        token: resp.agent_token,
        gpus,
    }
}

async fn def(c: &Control, family: &str, work_ms: u32) -> String {
    let d = c
        .deployments().register_task_definition(&json!({
            "family": family,
            "containers": [{"name": "main", "command": ["serve"], "cpu_milli": 100, "memory_mib": 64,
                "env": {"EXAMPLE_WORK_MS": work_ms.to_string()},
                "gpu": {"mps": {"memory_mib": 4096}},
                "ports": [{"name": "http", "container_port": 8000}]}],
            "work": {"port": "http", "completed": "requests_total", "errors": "errors_total",
                "latency": "request_seconds"}
        }))
        .await
        .expect("register");
    format!("{}:{}", d.family, d.revision)
}

fn input(name: &str, def: &str, count: u32, label: &str) -> ServiceInput {
    ServiceInput {
        name: name.into(),
        task_definition: def.into(),
        pool: "gpu".into(),
        project: None,
        priority: None,
        desired_count: count,
        strategy: Some("binpack".into()),
        constraints: ServiceConstraints {
            labels: BTreeMap::from([(label.to_owned(), "yes".to_owned())]),
            max_per_host: Some(1),
            ..Default::default()
        },
        deployment: Some(DeploymentConfig::default()),
        stop_timeout_secs: 5,
        deregistration_delay_secs: 0,
        slo: None,
        alarms: Vec::new(),
        bake_secs: 0,
        autoscaling: None,
    }
}

/// A latency histogram whose observations sit around `p99_ms` (one bucket just above it).
fn histogram(n: f64, p99_ms: f64) -> Vec<LatencyBucket> {
    let le = p99_ms / 1000.0;
    vec![
        LatencyBucket {
            le: Some(le * 0.5),
            count: 0.0,
        },
        LatencyBucket {
            le: Some(le * 1.0101),
            count: n,
        },
        LatencyBucket { le: None, count: n },
    ]
}

/// One sync of `h`'s agent: every task it holds runs; `work(task)` says what it completed
/// in the last second: (requests, p99 in ms).
async fn sync_work(c: &Control, h: &Host, work: &impl Fn(&Task) -> (f64, f64)) {
    let on_host = tasks_on(c, h).await;
    let reports = on_host
        .iter()
        .map(|t| {
            let (n, p99) = work(t);
            TaskReport {
                task_id: t.id.clone(),
                running: true,
                ports: vec![TaskPort {
                    container: "main".into(),
                    name: Some("http".into()),
                    container_port: 8000,
                    host_port: Some(40000),
                    protocol: Protocol::Tcp,
                }],
                work: Some(WorkReport::Measured(WorkSample {
                    interval_secs: 1.0,
                    completed: n,
                    errors: Some(0.0),
                    latency: histogram(n, p99),
                })),
                ..Default::default()
            }
        })
        .collect();
    c.agents()
        .sync_agent(
            &h.id,
            &SyncRequest {
                address: Some("10.0.0.1".into()),
                dynamic_ports_free: Some(1000),
                capabilities: None,
                gpus: h.gpus.clone(),
                mps: MpsReport {
                    healthy: true,
                    reason: None,
                    restarts: None,
                },
                tasks: reports,
                agent_version: None,
            },
        )
        .await
        .expect("sync");
}

async fn tasks_on(c: &Control, h: &Host) -> Vec<Task> {
    c.store()
        .list_tasks(&tessera_control::store::TaskFilter {
            host: Some(h.id.clone()),
            states: vec![TaskState::Assigned, TaskState::Running],
            ..Default::default()
        })
        .await
        .expect("tasks")
}

/// A deterministic noise factor around 1 (±`spread`).
fn noise(seed: &mut u64, spread: f64) -> f64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    1.0 + spread * ((*seed % 2001) as f64 / 1000.0 - 1.0)
}

/// Ten minutes of one-second syncs: `web`'s p99 is 50 ms (±10 %) and 1.6 times that beside
/// `heavy`; `a`, `b` and `c` share with `web` and change nothing. The estimate finds the
/// pair and no other; a new `heavy` task is kept off `web`'s GPUs.
#[tokio::test]
async fn interference_is_found_for_the_pair_that_causes_it_and_no_other() {
    let env = env(fast()).await;
    let c = &env.control;
    let hosts = [
        labelled_host(c, "h1", &["web", "heavy"]).await,
        labelled_host(c, "h2", &["web", "a"]).await,
        labelled_host(c, "h3", &["web", "b"]).await,
        labelled_host(c, "h4", &["web"]).await,
        labelled_host(c, "h5", &["web", "c"]).await,
    ];
    let mut web = input("web", &def(c, "web", 50).await, 5, "web");
    web.slo = Some(Slo {
        latency_p99_ms: 70.0,
        max_error_rate: None,
    });
    c.deployments().create_service(&web).await.expect("web");
    for name in ["heavy", "a", "b", "c"] {
        c.deployments()
            .create_service(&input(name, &def(c, name, 5).await, 1, name))
            .await
            .expect("service");
    }
    c.reconcile_once().await.expect("placed");
    let mut seed = 0x5eed_u64;
    for _ in 0..600 {
        env.clock.advance(Duration::from_secs(1));
        for h in &hosts {
            let on_host = tasks_on(c, h).await;
            let heavy_here = on_host.iter().any(|t| t.service == "heavy");
            let mut factors = Vec::new();
            for _ in &on_host {
                factors.push(noise(&mut seed, 0.1));
            }
            let by_id: BTreeMap<String, f64> = on_host
                .iter()
                .zip(factors)
                .map(|(t, f)| (t.id.clone(), f))
                .collect();
            sync_work(c, h, &|t: &Task| {
                let f = by_id.get(&t.id).copied().unwrap_or(1.0);
                match t.service.as_str() {
                    "web" if heavy_here => (20.0, 80.0 * f),
                    "web" => (20.0, 50.0 * f),
                    _ => (10.0, 20.0 * f),
                }
            })
            .await;
        }
        c.reconcile_once().await.expect("pass");
    }
    c.agents().flush_usage(true).await.expect("flushed");
    let work = c
        .deployments()
        .service_work("web", "hour")
        .await
        .expect("work");
    let established: Vec<&str> = work
        .interference
        .iter()
        .filter(|e| e.established)
        .map(|e| e.neighbour.as_str())
        .collect();
    assert!(established.contains(&"heavy"), "{:#?}", work.interference);
    for benign in ["a", "b", "c"] {
        assert!(
            !established.contains(&benign),
            "a false pair: {benign} {:#?}",
            work.interference
        );
    }
    let heavy = work
        .interference
        .iter()
        .find(|e| e.neighbour == "heavy")
        .expect("heavy");
    let change = heavy.latency_p99_change.expect("latency");
    assert!((0.4..0.8).contains(&change), "p99 +{change}");
    assert!(
        heavy.summary.contains("sharing with heavy: p99 +"),
        "{}",
        heavy.summary
    );
    println!(
        "interference from 600 one-second syncs: {}",
        work.interference
            .iter()
            .map(|e| e.summary.clone())
            .collect::<Vec<_>>()
            .join("; ")
    );
    assert_eq!(work.tasks_measured, 5);
    assert_eq!(work.completed_per_sec, Some(100.0));
    assert!(
        work.verdict.as_deref().is_some_and(|v| v.contains("p99")),
        "{:?}",
        work.verdict
    );
    for name in ["a", "b", "c"] {
        let w = c
            .deployments()
            .service_work(name, "hour")
            .await
            .expect("work");
        assert!(
            w.interference.iter().all(|e| !e.established),
            "{name}: {:#?}",
            w.interference
        );
    }
    // A second host where heavy may run, with no web on it: heavy's next task goes there,
    // not beside web on h1 (binpack alone would fill h1's GPU first).
    let h6 = labelled_host(c, "h6", &["heavy"]).await;
    let mut two = input("heavy", "heavy:1", 2, "heavy");
    two.constraints.max_per_host = None;
    c.deployments()
        .update_service(
            "heavy",
            &ServicePatch {
                desired_count: Some(2),
                constraints: Some(two.constraints.clone()),
                ..Default::default()
            },
        )
        .await
        .expect("scaled");
    c.reconcile_once().await.expect("placed");
    let on_h6 = tasks_on(c, &h6).await;
    assert_eq!(on_h6.len(), 1, "the new heavy task was kept off web's GPU");
    let events = c
        .store()
        .list_events(&tessera_control::store::EventFilter {
            service: Some("heavy".into()),
            limit: 20,
            ..Default::default()
        })
        .await
        .expect("events");
    assert!(
        events
            .iter()
            .any(|e| e.message.contains("placed away from the GPUs of `web`")),
        "{events:#?}"
    );
}

/// Syncs every host once a second for `secs` seconds, then a reconcile pass.
async fn run_for(
    env: &Env,
    hosts: &[Host],
    secs: u64,
    work: &impl Fn(&Task) -> (f64, f64),
    until: impl AsyncFn(&Control) -> bool,
) -> Option<u64> {
    for s in 1..=secs {
        env.clock.advance(Duration::from_secs(1));
        for h in hosts {
            sync_work(&env.control, h, work).await;
        }
        env.control.reconcile_once().await.expect("pass");
        if until(&env.control).await {
            return Some(s);
        }
    }
    None
}

async fn deployments(c: &Control) -> Vec<tessera_model::service::Deployment> {
    c.store()
        .list_deployments("web")
        .await
        .expect("deployments")
}

#[tokio::test]
async fn a_latency_alarm_rolls_a_deployment_back_and_a_good_one_completes_after_its_bake_time() {
    let env = env(fast()).await;
    let c = &env.control;
    let hosts = [
        labelled_host(c, "h1", &["web"]).await,
        labelled_host(c, "h2", &["web"]).await,
        labelled_host(c, "h3", &["web"]).await,
    ];
    let v1 = def(c, "web", 20).await;
    let mut web = input("web", &v1, 2, "web");
    web.alarms = vec![Alarm {
        metric: AlarmMetric::LatencyP99Ms,
        above: Some(150.0),
        below: None,
        for_secs: 5,
    }];
    web.bake_secs = 20;
    c.deployments().create_service(&web).await.expect("web");
    // Latency as the revision's EXAMPLE_WORK_MS says (v2 is slow).
    let latency = |t: &Task| {
        (
            10.0,
            match t.task_definition.revision {
                2 => 300.0,
                _ => 20.0,
            },
        )
    };
    let steady = async |c: &Control| {
        let d = deployments(c).await;
        d.iter()
            .filter(|d| d.status == DeploymentStatus::Primary)
            .all(|p| p.running == 2)
            && d.iter().all(|d| d.status != DeploymentStatus::Active)
    };
    run_for(&env, &hosts, 30, &latency, steady)
        .await
        .expect("steady on v1");
    let v2 = def(c, "web", 300).await;
    c.deployments()
        .update_service(
            "web",
            &ServicePatch {
                task_definition: Some(v2.clone()),
                ..Default::default()
            },
        )
        .await
        .expect("deploy v2");
    let rolled_back = async |c: &Control| {
        deployments(c)
            .await
            .iter()
            .any(|d| d.status == DeploymentStatus::RolledBack)
    };
    let secs = run_for(&env, &hosts, 60, &latency, rolled_back)
        .await
        .expect("v2 rolled back");
    // Its tasks ran from the first pass; the alarm needs 5 s of breach, then two syncs.
    println!("latency alarm: rollback started {secs} s after the deployment began");
    assert!(secs <= 5 + 2 + 2, "rolled back after {secs} s");
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
        events.iter().any(|e| e
            .message
            .contains("rolled back: alarm `latency_p99_ms above 150 for 5 s` fired")),
        "{events:#?}"
    );
    run_for(&env, &hosts, 30, &latency, steady)
        .await
        .expect("steady on v1 again");
    // A fine revision: steady, then its bake time passes without a rollback.
    let v3 = def(c, "web", 20).await;
    c.deployments()
        .update_service(
            "web",
            &ServicePatch {
                task_definition: Some(v3.clone()),
                ..Default::default()
            },
        )
        .await
        .expect("deploy v3");
    run_for(&env, &hosts, 30, &latency, steady)
        .await
        .expect("v3 steady");
    assert!(
        run_for(&env, &hosts, 25, &latency, async |_| false)
            .await
            .is_none()
    );
    let d = deployments(c).await;
    let primary = d
        .iter()
        .find(|d| d.status == DeploymentStatus::Primary)
        .expect("primary");
    assert_eq!(primary.task_definition.to_string(), v3);
    assert_eq!(
        d.iter()
            .filter(|d| d.status == DeploymentStatus::RolledBack)
            .count(),
        1,
        "only v2 was rolled back"
    );
    let work = c
        .deployments()
        .service_work("web", "hour")
        .await
        .expect("work");
    assert_eq!(work.alarms[0].state, "ok");
}

#[tokio::test]
async fn autoscaling_follows_the_load_out_and_back_in_after_its_cooldown() {
    let env = env(fast()).await;
    let c = &env.control;
    let hosts: Vec<Host> = {
        let mut v = Vec::new();
        for i in 0..10 {
            v.push(labelled_host(c, &format!("h{i}"), &["web"]).await);
        }
        v
    };
    let mut web = input("web", &def(c, "web", 20).await, 1, "web");
    web.autoscaling = Some(Autoscaling {
        min: 1,
        max: 10,
        metric: ScaleMetric::CompletedPerTaskPerSec,
        target: 20.0,
        scale_out_cooldown_secs: 10,
        scale_in_cooldown_secs: 30,
    });
    c.deployments().create_service(&web).await.expect("web");
    // `load` requests a second, spread over the running tasks.
    let running = |c: &Control| {
        let c = c.clone();
        async move { tasks(&c, "web", &[TaskState::Running]).await.len() }
    };
    let at_load = |load: f64, n: usize| move |_: &Task| (load / n.max(1) as f64, 20.0);
    let mut n = 1usize;
    let desired_at = |c: &Control| {
        let c = c.clone();
        async move {
            c.store()
                .get_service("web")
                .await
                .expect("service")
                .desired_count
        }
    };
    // 20 requests a second: one task is on target.
    for _ in 0..20 {
        env.clock.advance(Duration::from_secs(1));
        for h in &hosts {
            sync_work(c, h, &at_load(20.0, n)).await;
        }
        c.reconcile_once().await.expect("pass");
        n = running(c).await;
    }
    assert_eq!(desired_at(c).await, 1);
    // 200 a second: ten tasks of 20.
    let mut out_secs = None;
    for s in 1..=120u64 {
        env.clock.advance(Duration::from_secs(1));
        for h in &hosts {
            sync_work(c, h, &at_load(200.0, n)).await;
        }
        c.reconcile_once().await.expect("pass");
        n = running(c).await;
        if n == 10 && desired_at(c).await == 10 {
            out_secs = Some(s);
            break;
        }
    }
    let out_secs = out_secs.expect("scaled out to 10");
    println!("autoscaling 20 → 200 requests/s: 10 tasks running after {out_secs} s");
    // Back to 20 a second: in again once the cooldown has passed.
    let mut in_secs = None;
    for s in 1..=200u64 {
        env.clock.advance(Duration::from_secs(1));
        for h in &hosts {
            sync_work(c, h, &at_load(20.0, n)).await;
        }
        c.reconcile_once().await.expect("pass");
        n = running(c).await;
        if n == 1 && desired_at(c).await == 1 {
            in_secs = Some(s);
            break;
        }
    }
    let in_secs = in_secs.expect("scaled back in to 1");
    println!("autoscaling 200 → 20 requests/s: 1 task running after {in_secs} s");
    assert!(
        out_secs + in_secs >= 30,
        "not before the scale-in cooldown (30 s after the last scaling): {in_secs} s"
    );
    let events = c
        .store()
        .list_events(&tessera_control::store::EventFilter {
            service: Some("web".into()),
            limit: 100,
            ..Default::default()
        })
        .await
        .expect("events");
    assert!(
        events.iter().any(|e| e
            .message
            .starts_with("autoscaling: desired count 1 → 10 (completed_per_task_per_sec 200")),
        "{events:#?}"
    );
}

#[tokio::test]
async fn objectives_asking_for_figures_a_task_does_not_publish_are_refused() {
    let env = env(fast()).await;
    let c = &env.control;
    let plain = register_def(c, "plain", 1, 10).await;
    let mut s = input("web", &plain, 1, "web");
    s.alarms = vec![Alarm {
        metric: AlarmMetric::LatencyP99Ms,
        above: Some(100.0),
        below: None,
        for_secs: 10,
    }];
    let err = c
        .deployments()
        .create_service(&s)
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("alarms[0].metric"), "{err}");
    assert!(
        c.store().get_service("web").await.is_err(),
        "nothing stored"
    );
    let with_work = def(c, "web", 20).await;
    s.task_definition = with_work;
    c.deployments().create_service(&s).await.expect("created");
    // A revision without `work` cannot be deployed under that alarm.
    let err = c
        .deployments()
        .update_service(
            "web",
            &ServicePatch {
                task_definition: Some(plain),
                ..Default::default()
            },
        )
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("alarms[0].metric"), "{err}");
}

/// A consolidation move watched by the moved service's alarm: two tasks of `web` on two
/// GPUs are packed onto one, where (as the test's agents report) they slow each other past
/// the alarm; the move is undone: the task goes back to the GPU it left.
#[tokio::test]
async fn a_consolidation_move_is_undone_when_the_moved_services_alarm_fires() {
    let env = env(fast()).await;
    let c = &env.control;
    let hosts = [
        labelled_host(c, "h1", &["web"]).await,
        labelled_host(c, "h2", &["web"]).await,
    ];
    let mut web = input("web", &def(c, "web", 20).await, 2, "web");
    web.strategy = Some("spread_gpu".into());
    web.constraints.max_per_host = None;
    web.alarms = vec![Alarm {
        metric: AlarmMetric::LatencyP99Ms,
        above: Some(100.0),
        below: None,
        for_secs: 3,
    }];
    web.bake_secs = 60;
    c.deployments().create_service(&web).await.expect("web");
    // Two tasks of web on one GPU slow each other (300 ms); alone, 20 ms.
    let crowded = |c: &Control| {
        let c = c.clone();
        async move {
            let mut per_gpu: BTreeMap<String, usize> = BTreeMap::new();
            for t in tasks(&c, "web", &[TaskState::Running, TaskState::Assigned]).await {
                for a in &t.allocations {
                    *per_gpu.entry(a.gpu.to_string()).or_default() += 1;
                }
            }
            per_gpu
        }
    };
    let mut shared = BTreeMap::new();
    let spread = async |c: &Control| {
        let running = tasks(c, "web", &[TaskState::Running]).await;
        running.len() == 2
            && running
                .iter()
                .map(|t| t.host.clone())
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                == 2
    };
    run_for(&env, &hosts, 20, &|_: &Task| (10.0, 20.0), spread)
        .await
        .expect("one task on each GPU");
    let plan = c
        .deployments()
        .plan_consolidation(&tessera_model::consolidation::PlanInput {
            pool: "gpu".into(),
            goal: "gpus".into(),
        })
        .await
        .expect("plan");
    assert_eq!(plan.moves.len(), 1, "{plan:#?}");
    let left = plan.moves[0].from_host.clone();
    c.deployments()
        .execute_consolidation_plan(&plan.id)
        .await
        .expect("execute");
    let mut undone_after = None;
    for s in 1..=60u64 {
        env.clock.advance(Duration::from_secs(1));
        let now_shared = crowded(c).await;
        shared.clone_from(&now_shared);
        let on_gpu = |t: &Task| {
            t.allocations
                .iter()
                .any(|a| shared.get(&a.gpu.to_string()).copied().unwrap_or(0) > 1)
        };
        for h in &hosts {
            sync_work(c, h, &|t: &Task| {
                (10.0, if on_gpu(t) { 300.0 } else { 20.0 })
            })
            .await;
        }
        c.reconcile_once().await.expect("pass");
        let p = c
            .deployments()
            .consolidation_plan(&plan.id)
            .await
            .expect("plan");
        if p.moves[0].state == tessera_model::consolidation::MoveState::Undone {
            undone_after = Some(s);
            assert!(
                p.message
                    .as_deref()
                    .is_some_and(|m| m.contains("alarm `latency_p99_ms above 100 for 3 s`")),
                "{p:#?}"
            );
            break;
        }
    }
    let s = undone_after.expect("the move was undone");
    println!("consolidation move undone {s} s after the plan started executing");
    // The task goes back where it was: one on each host again.
    run_for(&env, &hosts, 30, &|_: &Task| (10.0, 20.0), spread)
        .await
        .expect("back on both GPUs");
    let running = tasks(c, "web", &[TaskState::Running]).await;
    assert!(
        running
            .iter()
            .any(|t| t.host.as_ref().map(|h| h.to_string()) == Some(left.clone())),
        "a task runs again on {left}: {running:#?}"
    );
}
