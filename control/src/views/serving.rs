//! Endpoints: where each task of a service is reached and whether it should get traffic,
//! as a read model of tasks, hosts and health (`GET /api/v1/services/{name}/endpoints`,
//! streamed like every other change); and the same for Prometheus's HTTP service
//! discovery (every task port named `metrics`).

use super::Views;
use crate::error::ControlError;
use crate::parts::FleetSnapshot;
use std::collections::{BTreeMap, HashMap};
use tessera_model::api::{Endpoint, EndpointHealth, EndpointList, PrometheusTargets};
use tessera_model::service::{Task, TaskHealth, TaskState};
use tessera_model::{HostId, HostInfo};

/// The port name Prometheus discovery lists.
pub const METRICS_PORT: &str = "metrics";

/// Whether a task should get traffic, from its state and health.
pub fn endpoint_health(t: &Task) -> Option<EndpointHealth> {
    Some(match (t.state, t.health) {
        (TaskState::Stopping, _) => EndpointHealth::Draining,
        (TaskState::Assigned, _) => EndpointHealth::Starting,
        (TaskState::Running, None | Some(TaskHealth::Healthy)) => EndpointHealth::Healthy,
        (TaskState::Running, Some(TaskHealth::Unknown)) => EndpointHealth::Starting,
        (TaskState::Running, Some(TaskHealth::Unhealthy)) => EndpointHealth::Unhealthy,
        (TaskState::Pending | TaskState::Stopped, _) => return None,
    })
}

/// One entry per task and bound port, ordered by task and port; a host without an
/// advertised address is reached at its id (its hostname).
pub fn endpoints_of<'a>(
    tasks: impl IntoIterator<Item = &'a Task>,
    hosts: &HashMap<HostId, &HostInfo>,
) -> Vec<Endpoint> {
    let mut out = Vec::new();
    for t in tasks {
        let (Some(health), Some(host)) = (endpoint_health(t), &t.host) else {
            continue;
        };
        let address = hosts
            .get(host)
            .and_then(|h| h.address.clone())
            .unwrap_or_else(|| host.to_string());
        let reason = match health {
            EndpointHealth::Unhealthy => t.health_output.clone(),
            EndpointHealth::Starting if t.state == TaskState::Assigned => Some(
                t.placement_message
                    .clone()
                    .unwrap_or_else(|| "starting on its host".into()),
            ),
            EndpointHealth::Starting => Some("its health check has not passed yet".into()),
            EndpointHealth::Draining => t.stop_reason.clone(),
            EndpointHealth::Healthy => None,
        };
        for p in &t.ports {
            let Some(port) = p.host_port else { continue };
            out.push(Endpoint {
                task: t.id.clone(),
                host: host.clone(),
                address: address.clone(),
                port,
                port_name: p.name.clone(),
                container_port: p.container_port,
                protocol: p.protocol,
                health,
                reason: reason.clone(),
                task_definition: t.task_definition.clone(),
            });
        }
    }
    out.sort();
    out
}

/// The hosts `tasks` are placed on, as the fleet read model has them.
fn hosts_of<'a>(
    fleet: &'a FleetSnapshot,
    tasks: impl IntoIterator<Item = &'a Task>,
) -> HashMap<HostId, &'a HostInfo> {
    tasks
        .into_iter()
        .filter_map(|t| t.host.as_ref())
        .filter_map(|h| Some((h.clone(), &fleet.host(h)?.host)))
        .collect()
}

impl Views {
    /// `GET /api/v1/services/{name}/tasks/{task}/last-output`: how task `task` of
    /// `service` ended and the last lines it wrote (`NotFound` when the service has no
    /// such task).
    pub async fn task_last_output(
        &self,
        service: &str,
        task: &str,
    ) -> Result<tessera_model::api::TaskLastOutput, ControlError> {
        let no_such = || ControlError::NotFound(format!("service {service} has no task {task}"));
        let t = match self.store.get_task(task).await {
            Ok(t) if t.service == service => t,
            Ok(_) | Err(crate::StoreError::NotFound { .. }) => return Err(no_such()),
            Err(e) => return Err(e.into()),
        };
        Ok(tessera_model::api::TaskLastOutput {
            last_output: self.store.task_last_output(&t.id).await?,
            task_id: t.id,
            service: t.service,
            state: t.state,
            host: t.host,
            exit_code: t.exit_code,
            stop_reason: t.stop_reason,
        })
    }

    /// `GET /api/v1/services/{name}/endpoints`.
    pub async fn endpoints(&self, service: &str) -> Result<EndpointList, ControlError> {
        self.store.get_service(service).await?;
        let fleet = self.fleet().await?;
        let tasks: Vec<&Task> = fleet.placed().filter(|t| t.service == service).collect();
        let by_id = hosts_of(&fleet, tasks.iter().copied());
        Ok(EndpointList {
            service: service.to_owned(),
            endpoints: endpoints_of(tasks, &by_id),
        })
    }

    /// `GET /api/v1/discovery/prometheus`: every running task's port named `metrics`,
    /// labelled with its service, revision, task, host, GPUs and pool.
    pub async fn prometheus_targets(&self) -> Result<Vec<PrometheusTargets>, ControlError> {
        let fleet = self.fleet().await?;
        let mut tasks: Vec<&Task> = fleet
            .placed()
            .filter(|t| matches!(t.state, TaskState::Running | TaskState::Stopping))
            .filter(|t| {
                t.ports
                    .iter()
                    .any(|p| p.name.as_deref() == Some(METRICS_PORT))
            })
            .collect();
        tasks.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        let by_id = hosts_of(&fleet, tasks.iter().copied());
        let mut out = Vec::new();
        for t in tasks {
            for e in endpoints_of(std::slice::from_ref(t), &by_id)
                .into_iter()
                .filter(|e| e.port_name.as_deref() == Some(METRICS_PORT))
            {
                let gpus: Vec<String> = t.allocations.iter().map(|a| a.gpu.to_string()).collect();
                out.push(PrometheusTargets {
                    targets: vec![format!("{}:{}", e.address, e.port)],
                    labels: BTreeMap::from([
                        ("service".to_owned(), t.service.clone()),
                        ("revision".to_owned(), t.task_definition.to_string()),
                        ("task".to_owned(), t.id.clone()),
                        ("host".to_owned(), e.host.to_string()),
                        ("gpu".to_owned(), gpus.join(",")),
                        ("pool".to_owned(), t.pool.to_string()),
                    ]),
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::service::{TaskDefRef, TaskPort};
    use tessera_model::taskdef::Protocol;
    use tessera_model::{MiB, MilliCpu, PoolName};

    fn task(id: &str, state: TaskState, health: Option<TaskHealth>) -> Task {
        Task {
            id: id.into(),
            service: "chat".into(),
            deployment_id: 1,
            task_definition: TaskDefRef {
                family: "chat".into(),
                revision: 2,
            },
            pool: PoolName::new("p").expect("valid"),
            cpu: MilliCpu(1),
            memory: MiB(1),
            state,
            migrating: false,
            host: Some(HostId::new("h1").expect("valid")),
            allocations: vec![],
            placement_message: None,
            stop_reason: Some("scaled down".into()),
            exit_code: None,
            measured: Default::default(),
            ports: vec![TaskPort {
                container: "main".into(),
                name: Some("http".into()),
                container_port: 8000,
                host_port: Some(40001),
                protocol: Protocol::Tcp,
            }],
            health,
            health_output: Some("GET /health: 503".into()),
            drain_until: None,
            created_at: tessera_model::time::Timestamp::EPOCH,
            started_at: None,
            stopped_at: None,
        }
    }

    #[test]
    fn each_state_and_verdict_has_its_endpoint_health() {
        let cases = [
            (TaskState::Running, None, Some(EndpointHealth::Healthy)),
            (
                TaskState::Running,
                Some(TaskHealth::Healthy),
                Some(EndpointHealth::Healthy),
            ),
            (
                TaskState::Running,
                Some(TaskHealth::Unknown),
                Some(EndpointHealth::Starting),
            ),
            (
                TaskState::Running,
                Some(TaskHealth::Unhealthy),
                Some(EndpointHealth::Unhealthy),
            ),
            (TaskState::Assigned, None, Some(EndpointHealth::Starting)),
            (
                TaskState::Stopping,
                Some(TaskHealth::Healthy),
                Some(EndpointHealth::Draining),
            ),
            (TaskState::Pending, None, None),
            (TaskState::Stopped, None, None),
        ];
        for (state, health, want) in cases {
            assert_eq!(
                endpoint_health(&task("t", state, health)),
                want,
                "{state} {health:?}"
            );
        }
    }

    #[test]
    fn endpoints_carry_the_hosts_address_and_why_one_is_unhealthy() {
        let host = HostInfo {
            id: HostId::new("h1").expect("valid"),
            pool: PoolName::new("p").expect("valid"),
            status: tessera_model::HostStatus::Active,
            held: false,
            simulated: true,
            cpu: MilliCpu(1),
            memory: MiB(1),
            labels: Default::default(),
            gpus: vec![],
            status_reason: None,
            last_seen: None,
            mps_restarts: 0,
            address: Some("10.0.0.7".into()),
            dynamic_ports_free: None,
            pending_gpus: Vec::new(),
            capabilities: None,
            agent_version: None,
            provider_id: None,
        };
        let hosts = HashMap::from([(host.id.clone(), &host)]);
        let mut unbound = task("c", TaskState::Assigned, None);
        unbound.ports[0].host_port = None;
        let list = endpoints_of(
            &[
                task("b", TaskState::Running, Some(TaskHealth::Unhealthy)),
                task("a", TaskState::Running, None),
                unbound,
            ],
            &hosts,
        );
        assert_eq!(list.len(), 2, "a port not bound yet has no endpoint");
        assert_eq!(
            (
                list[0].task.as_str(),
                list[0].address.as_str(),
                list[0].port
            ),
            ("a", "10.0.0.7", 40001)
        );
        assert_eq!(list[1].health, EndpointHealth::Unhealthy);
        assert_eq!(list[1].reason.as_deref(), Some("GET /health: 503"));
    }
}
