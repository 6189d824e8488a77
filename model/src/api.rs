//! Request and response bodies of the REST API that the console shares: service and pool
//! inputs, placement previews, service detail. Validation that needs the store lives in the
//! control plane.

use crate::ids::{HostId, PoolName};
use crate::inventory::PlacementPolicy;
use crate::service::{
    Deployment, DeploymentConfig, Event, Service, ServiceConstraints, TaskDefRef,
};
use serde::{Deserialize, Serialize};

pub use crate::limits::MAX_DESIRED;

fn default_stop_timeout() -> u32 {
    crate::limits::STOP_TIMEOUT_DEFAULT_SECS
}

fn default_desired() -> u32 {
    1
}

/// `POST /api/v1/pools`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolInput {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::name))]
    pub name: String,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_policy))]
    pub policy: Option<String>,
    /// 1.0 (the default): compute caps are reserved; up to 10.0 times a GPU.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1.0, maximum = 10.0))]
    pub compute_overcommit: Option<f64>,
    /// Overrides the GPUs' own MPS client limit.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 48))]
    pub mps_client_limit: Option<u32>,
    /// `auto` (the default): new hosts get tasks at once; `manual`: they wait for an
    /// admin's approval.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_admission))]
    pub admission: Option<String>,
    /// Task definitions may name the user their containers run as (default false: each
    /// task runs as a uid of its own).
    #[serde(default)]
    pub task_users: Option<bool>,
    /// Containers may be privileged (default false).
    #[serde(default)]
    pub privileged: Option<bool>,
    /// Tasks may use the host's network (`networkMode: host`) and add `NET_RAW` or
    /// `NET_ADMIN` (default false).
    #[serde(default)]
    pub host_network: Option<bool>,
    /// Operators of a task's project may run commands in it (`tessera exec`; default
    /// false).
    #[serde(default)]
    pub exec: Option<bool>,
    /// `automatic` (the default): preemption plans are carried out when found; `approve`:
    /// they wait for an operator's approval.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_preemption))]
    pub preemption: Option<String>,
    /// `enforce` (the default): a task whose measured GPU memory stays above its budget
    /// past the grace period is stopped; `warn`: its service's events say so.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_gpu_budget))]
    pub gpu_budget: Option<String>,
    /// What makes and removes the pool's machines (absent: none).
    #[serde(default)]
    pub provider: Option<crate::provider::ProviderInput>,
}

impl PoolInput {
    /// A pool with every setting at its default (fragmentation policy, compute caps
    /// reserved, the GPUs' own MPS client limit).
    pub fn named(name: impl Into<String>) -> PoolInput {
        PoolInput {
            name: name.into(),
            policy: None,
            compute_overcommit: None,
            mps_client_limit: None,
            admission: None,
            task_users: None,
            privileged: None,
            host_network: None,
            exec: None,
            preemption: None,
            gpu_budget: None,
            provider: None,
        }
    }
}

/// `PATCH /api/v1/pools/{name}`: what to change; a field left out keeps its value.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolPatch {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_policy))]
    pub policy: Option<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1.0, maximum = 10.0))]
    pub compute_overcommit: Option<f64>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 48))]
    pub mps_client_limit: Option<u32>,
    /// `auto`: new hosts get tasks at once; `manual`: they wait for an admin's approval
    /// (hosts already admitted stay admitted).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_admission))]
    pub admission: Option<String>,
    /// Task definitions may name the user their containers run as.
    #[serde(default)]
    pub task_users: Option<bool>,
    /// Containers may be privileged.
    #[serde(default)]
    pub privileged: Option<bool>,
    /// Tasks may use the host's network and add `NET_RAW` or `NET_ADMIN`.
    #[serde(default)]
    pub host_network: Option<bool>,
    /// Operators of a task's project may run commands in it (`tessera exec`).
    #[serde(default)]
    pub exec: Option<bool>,
    /// `automatic` or `approve` (preemption plans wait for an operator).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_preemption))]
    pub preemption: Option<String>,
    /// `enforce` (the default): a task whose measured GPU memory stays above its budget
    /// past the grace period is stopped; `warn`: its service's events say so.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_gpu_budget))]
    pub gpu_budget: Option<String>,
    /// Replaces the pool's capacity provider; `null` removes it (its hosts stay).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider: Option<Option<crate::provider::ProviderInput>>,
}

/// `POST /api/v1/services`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceInput {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::name))]
    pub name: String,
    /// `family:revision`.
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::task_def_ref))]
    pub task_definition: String,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::name))]
    pub pool: String,
    /// The project it belongs to (default `default`): its quotas bound the service's tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_name))]
    pub project: Option<String>,
    /// `batch`, `default` (the default) or `production`: a waiting task of a higher class
    /// may take room from tasks of a lower one that use borrowed capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_priority))]
    pub priority: Option<crate::inventory::PriorityClass>,
    #[serde(default = "default_desired")]
    #[cfg_attr(
        feature = "openapi",
        schema(default = 1, minimum = 0, maximum = 100_000)
    )] // MAX_DESIRED
    pub desired_count: u32,
    /// Overrides the pool's placement policy.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_policy))]
    pub strategy: Option<String>,
    #[serde(default, deserialize_with = "object_only")]
    pub constraints: ServiceConstraints,
    #[serde(default, deserialize_with = "object_only")]
    pub deployment: Option<DeploymentConfig>,
    /// How long a task gets between SIGTERM and SIGKILL.
    #[serde(default = "default_stop_timeout")]
    #[cfg_attr(feature = "openapi", schema(default = 30, minimum = 1, maximum = 600))]
    pub stop_timeout_secs: u32,
    /// How long a task stopped on purpose stays running out of the endpoint list before
    /// its stop signal.
    #[serde(default = "crate::service::default_deregistration_delay")]
    #[cfg_attr(feature = "openapi", schema(default = 5, minimum = 0, maximum = 3600))]
    pub deregistration_delay_secs: u32,
    /// A latency target: placement keeps the tasks away from neighbours measured to push
    /// them past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<crate::work::Slo>,
    /// Alarms on its own work, watched during deployments and their bake time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "openapi", schema(max_items = 20))]
    pub alarms: Vec<crate::work::Alarm>,
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(default = 0, minimum = 0, maximum = 86_400)
    )]
    pub bake_secs: u32,
    /// Target tracking: the desired count follows a metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<crate::work::Autoscaling>,
}

impl ServiceInput {
    /// Its objectives, as the service keeps them.
    pub fn objectives(&self) -> crate::work::Objectives {
        crate::work::Objectives {
            slo: self.slo.clone(),
            alarms: self.alarms.clone(),
            bake_secs: self.bake_secs,
            autoscaling: self.autoscaling.clone(),
        }
    }
}

/// `PATCH /api/v1/services/{name}`: at least one field (its schema is in `crate::schema`).
/// Every field left out stays as it is; the pool never changes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePatch {
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub desired_count: Option<u32>,
    /// `family:revision`; a new revision starts a rolling deployment.
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub task_definition: Option<String>,
    /// The project it belongs to from now on (its tasks count against that project's
    /// quotas from the next pass).
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub project: Option<String>,
    /// Its priority class from now on (`batch`, `default`, `production`).
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub priority: Option<crate::inventory::PriorityClass>,
    /// The placement policy for the service's next placements; `null`: the pool's.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub strategy: Option<Option<String>>,
    /// Where its next tasks may run (tasks already placed stay).
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub constraints: Option<ServiceConstraints>,
    /// How its next rollouts replace tasks.
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub deployment: Option<DeploymentConfig>,
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub stop_timeout_secs: Option<u32>,
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub deregistration_delay_secs: Option<u32>,
    /// `null` removes the target.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub slo: Option<Option<crate::work::Slo>>,
    /// Replaces every alarm (`[]`: none).
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub alarms: Option<Vec<crate::work::Alarm>>,
    #[serde(
        default,
        deserialize_with = "not_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub bake_secs: Option<u32>,
    /// `null` turns autoscaling off (the desired count stays where it is).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub autoscaling: Option<Option<crate::work::Autoscaling>>,
}

impl ServicePatch {
    /// Whether it changes more than the count and the revision.
    pub fn changes_settings(&self) -> bool {
        self.project.is_some()
            || self.priority.is_some()
            || self.strategy.is_some()
            || self.constraints.is_some()
            || self.deployment.is_some()
            || self.stop_timeout_secs.is_some()
            || self.deregistration_delay_secs.is_some()
            || self.changes_objectives()
    }

    /// Whether it changes the latency target, alarms, bake time or autoscaling.
    pub fn changes_objectives(&self) -> bool {
        self.slo.is_some()
            || self.alarms.is_some()
            || self.bake_secs.is_some()
            || self.autoscaling.is_some()
    }

    /// `current` with this patch's objectives applied.
    pub fn objectives_over(&self, current: &crate::work::Objectives) -> crate::work::Objectives {
        crate::work::Objectives {
            slo: self.slo.clone().unwrap_or_else(|| current.slo.clone()),
            alarms: self
                .alarms
                .clone()
                .unwrap_or_else(|| current.alarms.clone()),
            bake_secs: self.bake_secs.unwrap_or(current.bake_secs),
            autoscaling: self
                .autoscaling
                .clone()
                .unwrap_or_else(|| current.autoscaling.clone()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.desired_count.is_none() && self.task_definition.is_none() && !self.changes_settings()
    }
}

/// Reads a field that may be left out but not given as `null` (the schema's type has no
/// null): `"desired_count": null` is refused, where serde's derive would read it as left
/// out and silently change nothing.
pub fn not_null<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A field that is present, `null` included (`Some(None)`), as opposed to left out (`None`).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Reads a field as serde's derive would, but only from a JSON object (or null): the
/// derive also reads a struct from an array of its fields in order, which the published
/// schema does not allow and no client means.
fn object_only<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::Error;
    let v = serde_json::Value::deserialize(d)?;
    if !(v.is_object() || v.is_null()) {
        return Err(D::Error::custom(format!(
            "must be an object, got {}",
            crate::taskdef::kind(&v)
        )));
    }
    T::deserialize(v).map_err(D::Error::custom)
}

/// `POST /api/v1/placement-preview`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewInput {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::task_def_ref))]
    pub task_definition: String,
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::name))]
    pub pool: String,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub count: u32,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::optional_policy))]
    pub strategy: Option<String>,
    #[serde(default)]
    pub constraints: ServiceConstraints,
}

/// Where one previewed task would go, or why it would not.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviewTask {
    pub index: u32,
    pub host: Option<HostId>,
    /// Device indices on the host.
    pub gpus: Vec<u32>,
    /// The rejection sentence when it would not fit.
    pub message: Option<String>,
}

/// How densely a pool is packed.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Density {
    pub gpus: u32,
    pub gpus_in_use: u32,
    /// A lower bound on the GPUs that could hold the current allocations.
    pub gpus_needed_at_least: u32,
    pub tasks_on_gpus: u32,
    pub tasks_per_gpu_in_use: f64,
    /// Allocated GPU memory as a share of all GPU memory, in %.
    pub memory_allocated_pct: f64,
}

#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreviewResult {
    pub task_definition: TaskDefRef,
    pub pool: PoolName,
    pub policy: PlacementPolicy,
    pub placed: u32,
    pub unplaced: u32,
    pub tasks: Vec<PreviewTask>,
    pub density_before: Density,
    pub density_after: Density,
}

/// `GET /api/v1/services/{name}`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceDetail {
    #[serde(flatten)]
    pub service: Service,
    pub running: u32,
    pub pending: u32,
    pub deployments: Vec<Deployment>,
    pub events: Vec<Event>,
}

/// Where one port of one task is reached, and whether it should get traffic.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Endpoint {
    pub task: String,
    pub host: HostId,
    /// The host's advertised address.
    pub address: String,
    /// The host port.
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_name: Option<String>,
    pub container_port: u16,
    pub protocol: crate::taskdef::Protocol,
    pub health: EndpointHealth,
    /// Why it is unhealthy (the last check's output), or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `family:revision` it runs.
    pub task_definition: TaskDefRef,
}

/// Whether an endpoint should get traffic: only `healthy` ones should.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointHealth {
    /// Running, and its health check passes (or it has none).
    Healthy,
    /// Its health check fails.
    Unhealthy,
    /// Not running yet, or its check has not passed yet.
    Starting,
    /// Being stopped on purpose: out of rotation for the deregistration delay, then stopped.
    Draining,
}

impl EndpointHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointHealth::Healthy => "healthy",
            EndpointHealth::Unhealthy => "unhealthy",
            EndpointHealth::Starting => "starting",
            EndpointHealth::Draining => "draining",
        }
    }
}

/// `GET /api/v1/services/{name}/endpoints`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointList {
    pub service: String,
    pub endpoints: Vec<Endpoint>,
}

/// One target group of `GET /api/v1/discovery/prometheus` (Prometheus's HTTP service
/// discovery format).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrometheusTargets {
    /// `address:port`.
    pub targets: Vec<String>,
    pub labels: std::collections::BTreeMap<String, String>,
}

/// `GET /api/v1/tasks/{id}`: one task as its page shows it. Its output is not here: logs
/// and last lines may hold secrets, and are read apart, by operators of its project.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskDetail {
    pub task: crate::service::Task,
    /// Its service's project; absent once the service is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// The revision its service runs now (absent once the service is deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_revision: Option<TaskDefRef>,
    /// Its host's status now (`lost`: its log files cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_status: Option<crate::HostStatus>,
    /// The GPU memory it reserves, the budget its measured use is judged against.
    pub budget_mib: crate::MiB,
    /// Its compute cap (MPS active thread percentage), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_cap_percent: Option<u32>,
    /// What was measured of it, bucket by bucket (the finest kept), oldest first.
    pub usage: Vec<crate::fit::UsagePoint>,
    /// Its deployment's tasks that failed (exited non-zero on their own), and how long a
    /// new one waits before it starts: a service crash-looping stands out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<DeploymentFailures>,
    /// Events that name it, newest first.
    pub events: Vec<Event>,
    /// The server's clock when this was read (unix seconds): where its charts end.
    pub now: i64,
}

/// A deployment whose tasks keep failing.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentFailures {
    pub deployment: i64,
    pub failed_tasks: u32,
    /// How long each new task waits after the latest failure before it starts (doubling
    /// with each failure, up to the server's `max_restart_delay`); 0 while the deployment
    /// can roll back instead.
    pub restart_delay_secs: u64,
}

/// `GET /api/v1/services/{name}/tasks/{task}/last-output`: how a task ended and the last
/// lines it wrote, as its agent sent them with its stop report (kept once its host and
/// its log files are gone).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskLastOutput {
    pub task_id: String,
    pub service: String,
    pub state: crate::service::TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Each container's standard error, then its standard output, under a `==> main.err.log
    /// <==` line each; absent while it runs, or when it ended without a word (or before its
    /// agent sent them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_output: Option<String>,
}
