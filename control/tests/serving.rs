//! Serving end to end through the agent API: fixed host ports held by placement, ports and
//! health reported by agents, endpoints, draining for the deregistration delay, rollouts
//! gated on health and a revision that never becomes healthy rolled back.

use serde_json::json;
use tessera_control::inputs::{ServiceInput, ServicePatch};
use tessera_control::testkit::*;
use tessera_model::agent::{HealthReport, MpsReport, SyncRequest, SyncResponse, TaskReport};
use tessera_model::api::EndpointHealth;
use tessera_model::service::{
    DeploymentConfig, DeploymentStatus, ServiceConstraints, TaskHealth, TaskPort, TaskState,
};
use tessera_model::taskdef::Protocol;

/// A definition of an HTTP server on one port (`host_port` fixed or dynamic) with an
/// HTTP health check.
async fn web_def(c: &tessera_control::Control, family: &str, host_port: Option<u16>) -> String {
    let mut port = json!({"name": "http", "container_port": 8000});
    if let Some(h) = host_port {
        port["host_port"] = json!(h);
    }
    let def = c
        .deployments().register_task_definition(&json!({
            "family": family,
            "containers": [{"name": "main", "command": ["serve"], "cpu_milli": 100, "memory_mib": 64,
                "gpu": {"mps": {"memory_mib": 1024}},
                "ports": [port],
                "health_check": {"http": {"port": "http", "path": "/health"}, "interval_secs": 5}}]
        }))
        .await
        .expect("register");
    format!("{}:{}", def.family, def.revision)
}

async fn web_service(c: &tessera_control::Control, def: &str, count: u32, delay: u32) {
    c.deployments()
        .create_service(&ServiceInput {
            name: "web".into(),
            task_definition: def.into(),
            pool: "gpu".into(),
            project: None,
            priority: None,
            desired_count: count,
            strategy: None,
            constraints: ServiceConstraints::default(),
            deployment: Some(DeploymentConfig::default()),
            stop_timeout_secs: 5,
            deregistration_delay_secs: delay,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        })
        .await
        .expect("service");
}

/// One sync of an agent that runs every task the store has on `h` (assigned, running or
/// draining), each bound to its own port, with health `health(task)`; returns the answer.
async fn sync_serving(
    c: &tessera_control::Control,
    h: &Host,
    health: impl Fn(&str) -> TaskHealth,
) -> SyncResponse {
    let id = c
        .agents()
        .authenticate_agent(&h.token)
        .await
        .expect("token");
    let on_host = c
        .store()
        .list_tasks(&tessera_control::store::TaskFilter {
            host: Some(id.clone()),
            states: vec![TaskState::Assigned, TaskState::Running, TaskState::Stopping],
            ..Default::default()
        })
        .await
        .expect("tasks");
    let tasks = on_host
        .iter()
        .enumerate()
        .map(|(i, t)| TaskReport {
            task_id: t.id.clone(),
            running: true,
            ports: vec![TaskPort {
                container: "main".into(),
                name: Some("http".into()),
                container_port: 8000,
                host_port: Some(40000 + i as u16),
                protocol: Protocol::Tcp,
            }],
            health: Some(HealthReport {
                status: health(&t.id),
                output: (health(&t.id) == TaskHealth::Unhealthy).then(|| "GET /health: 503".into()),
            }),
            ..Default::default()
        })
        .collect();
    c.agents()
        .sync_agent(
            &id,
            &SyncRequest {
                address: Some(format!("10.0.0.{}", h.gpus.len())),
                dynamic_ports_free: Some(1000),
                capabilities: None,
                gpus: h.gpus.clone(),
                mps: MpsReport {
                    healthy: true,
                    reason: None,
                    restarts: None,
                },
                tasks,
                agent_version: None,
            },
        )
        .await
        .expect("sync")
}

/// The tasks the answer tells the agent to run.
fn told(answer: &SyncResponse) -> Vec<String> {
    answer.tasks.iter().map(|t| t.task_id.clone()).collect()
}

#[tokio::test]
async fn a_fixed_host_port_is_placed_like_capacity_and_explains_itself() {
    let env = env(fast()).await;
    let c = &env.control;
    host(c, "a", 2, 24).await;
    host(c, "b", 2, 24).await;
    let def = web_def(c, "web", Some(8080)).await;
    web_service(c, &def, 3, 0).await;
    c.reconcile_once().await.expect("pass");
    let placed = tasks(c, "web", &[TaskState::Assigned]).await;
    assert_eq!(
        placed.len(),
        2,
        "one task per host: both want host port 8080"
    );
    assert_ne!(placed[0].host, placed[1].host);
    assert_eq!(
        placed[0].ports[0].host_port,
        Some(8080),
        "a fixed port is known at placement"
    );
    let pending = tasks(c, "web", &[TaskState::Pending]).await;
    let why = pending[0].placement_message.clone().unwrap_or_default();
    assert!(
        why.contains("host port"),
        "the reason names the port: {why}"
    );
}

#[tokio::test]
async fn endpoints_follow_health_and_a_stopped_task_drains_before_its_agent_stops_it() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    let def = web_def(c, "web", None).await;
    web_service(c, &def, 2, 5).await;
    c.reconcile_once().await.expect("pass");
    // Running, check not passed yet: starting, out of rotation.
    sync_serving(c, &a, |_| TaskHealth::Unknown).await;
    let list = c.views().endpoints("web").await.expect("endpoints");
    assert_eq!(list.endpoints.len(), 2);
    assert!(
        list.endpoints
            .iter()
            .all(|e| e.health == EndpointHealth::Starting)
    );
    assert!(
        list.endpoints.iter().all(|e| e.address == "10.0.0.2"),
        "the host's advertised address"
    );
    // Healthy: in rotation, with the dynamic port the agent bound.
    sync_serving(c, &a, |_| TaskHealth::Healthy).await;
    let list = c.views().endpoints("web").await.expect("endpoints");
    assert!(
        list.endpoints
            .iter()
            .all(|e| e.health == EndpointHealth::Healthy),
        "{list:?}"
    );
    assert!(list.endpoints.iter().all(|e| e.port >= 40000));
    // Scaled in: one task drains; the agent is still told to run it for the delay.
    c.deployments()
        .update_service(
            "web",
            &ServicePatch {
                desired_count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("scale");
    c.reconcile_once().await.expect("pass");
    let list = c.views().endpoints("web").await.expect("endpoints");
    let draining: Vec<_> = list
        .endpoints
        .iter()
        .filter(|e| e.health == EndpointHealth::Draining)
        .collect();
    assert_eq!(draining.len(), 1, "{list:?}");
    let answer = sync_serving(c, &a, |_| TaskHealth::Healthy).await;
    assert_eq!(told(&answer).len(), 2, "a draining task still runs");
    env.clock.advance(std::time::Duration::from_secs(6));
    let answer = sync_serving(c, &a, |_| TaskHealth::Healthy).await;
    assert_eq!(told(&answer).len(), 1, "after the delay its agent stops it");
    // Prometheus discovery lists only ports named metrics: none here.
    assert!(
        c.views()
            .prometheus_targets()
            .await
            .expect("targets")
            .is_empty()
    );
}

#[tokio::test]
async fn a_rollout_waits_for_health_and_a_never_healthy_revision_rolls_back() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 4, 24).await;
    let v1 = web_def(c, "web", None).await;
    web_service(c, &v1, 2, 0).await;
    c.reconcile_once().await.expect("pass");
    let old = told(&sync_serving(c, &a, |_| TaskHealth::Healthy).await);
    assert_eq!(old.len(), 2);
    let v2 = web_def(c, "web", None).await;
    c.deployments()
        .update_service(
            "web",
            &ServicePatch {
                task_definition: Some(v2.clone()),
                ..Default::default()
            },
        )
        .await
        .expect("deploy");
    // The new revision's tasks never pass their check: the old ones keep serving, then
    // the new ones are replaced until the circuit breaker rolls back.
    let mut fewest_healthy = usize::MAX;
    let mut rolled_back = false;
    for _ in 0..30 {
        c.reconcile_once().await.expect("pass");
        let health = |t: &str| {
            if old.iter().any(|o| o == t) {
                TaskHealth::Healthy
            } else {
                TaskHealth::Unhealthy
            }
        };
        sync_serving(c, &a, health).await;
        let healthy = c
            .views()
            .endpoints("web")
            .await
            .expect("endpoints")
            .endpoints
            .iter()
            .filter(|e| e.health == EndpointHealth::Healthy)
            .count();
        fewest_healthy = fewest_healthy.min(healthy);
        let deployments = c
            .store()
            .list_deployments("web")
            .await
            .expect("deployments");
        if deployments
            .iter()
            .any(|d| d.status == DeploymentStatus::RolledBack)
        {
            rolled_back = true;
            break;
        }
    }
    assert!(
        rolled_back,
        "the circuit breaker rolled the never-healthy revision back"
    );
    assert_eq!(
        fewest_healthy, 2,
        "never fewer healthy endpoints than the minimum (100 % of 2)"
    );
    let live = tasks(c, "web", &[TaskState::Running]).await;
    assert!(
        live.iter().all(|t| t.task_definition.to_string() == v1),
        "{live:?}"
    );
}

#[tokio::test]
async fn the_commit_refuses_a_fixed_host_port_already_held_on_the_host() {
    let env = env(fast()).await;
    let c = &env.control;
    let a = host(c, "a", 2, 24).await;
    let def = web_def(c, "web", Some(8080)).await;
    web_service(c, &def, 0, 0).await;
    let deployment = c
        .store()
        .list_deployments("web")
        .await
        .expect("deployments")[0]
        .id;
    let spec = c
        .store()
        .get_task_definition(&def.parse().expect("family:revision"))
        .await
        .expect("definition")
        .spec;
    let r: tessera_model::service::TaskDefRef = def.parse().expect("family:revision");
    let pool = tessera_model::PoolName::new("gpu").expect("valid");
    let tasks: Vec<tessera_control::store::NewTask> = (0..2)
        .map(|i| {
            tessera_control::store::NewTask::of(
                format!("t{i}"),
                "web",
                deployment,
                &r,
                &pool,
                &spec,
            )
        })
        .collect();
    c.store().create_tasks(&tasks).await.expect("tasks");
    let gpus = c.store().get_host(&a.id).await.expect("host").gpus;
    // Two placements on one host, each on its own GPU: capacity fits both, the port one.
    let commit = |i: usize| tessera_control::store::PlacementCommit {
        task_id: format!("t{i}"),
        host: a.id.clone(),
        allocations: vec![tessera_model::service::GpuAllocation {
            gpu: gpus[i].uuid.clone(),
            index: gpus[i].index,
            memory: tessera_model::MiB(1024),
            compute: tessera_model::ComputeMilli(0),
            dedicated: false,
        }],
    };
    let committed = c
        .store()
        .commit_placements(&[commit(0), commit(1)])
        .await
        .expect("commit");
    assert_eq!(
        committed,
        ["t0"],
        "the second would hold 8080 twice on host a"
    );
    let again = c
        .store()
        .commit_placements(&[commit(1)])
        .await
        .expect("commit");
    assert!(again.is_empty(), "8080 is held by t0 now");
}
