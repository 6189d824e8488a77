//! What callers send to the control plane and get back, beyond the model's own types:
//! request bodies with their validation, and computed views (service detail, preview).

use crate::error::ControlError;
use serde::{Deserialize, Serialize};
use tessera_model::service::{
    Deployment, DeploymentConfig, Event, Service, ServiceConstraints, TaskDefRef,
};
use tessera_model::taskdef::{FieldError, ValidationErrors};
use tessera_model::{HostId, PlacementPolicy, PoolInfo, PoolName};

/// Collects field errors, then fails with all of them.
#[derive(Default)]
pub(crate) struct Errors(Vec<FieldError>);

impl Errors {
    pub fn add(&mut self, field: &str, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.to_owned(),
            message: message.into(),
        });
    }

    pub fn finish(self) -> Result<(), ControlError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ControlError::Invalid(ValidationErrors { errors: self.0 }))
        }
    }
}

/// `POST /api/v1/pools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolInput {
    pub name: String,
    #[serde(default)]
    pub policy: Option<String>,
    #[serde(default)]
    pub compute_overcommit: Option<f64>,
    #[serde(default)]
    pub mps_client_limit: Option<u32>,
}

impl PoolInput {
    pub fn validate(&self) -> Result<PoolInfo, ControlError> {
        let mut e = Errors::default();
        let name = PoolName::new(self.name.clone())
            .map_err(|err| e.add("name", err.rule))
            .ok();
        let policy = match &self.policy {
            None => Some(PlacementPolicy::default()),
            Some(p) => p
                .parse()
                .map_err(|err: tessera_model::ParseEnumError| e.add("policy", err.to_string()))
                .ok(),
        };
        let overcommit = self.compute_overcommit.unwrap_or(1.0);
        if !(1.0..=10.0).contains(&overcommit) {
            e.add(
                "compute_overcommit",
                format!("must be between 1.0 (caps reserved) and 10.0, got {overcommit}"),
            );
        }
        if let Some(l) = self.mps_client_limit.filter(|l| !(1..=48).contains(l)) {
            e.add(
                "mps_client_limit",
                format!("must be between 1 and 48 (MPS's own limit), got {l}"),
            );
        }
        e.finish()?;
        Ok(PoolInfo {
            name: name.expect("validated"),
            policy: policy.expect("validated"),
            compute_overcommit: overcommit,
            mps_client_limit: self.mps_client_limit,
        })
    }
}

fn default_desired() -> u32 {
    1
}

fn default_stop_timeout() -> u32 {
    30
}

/// `POST /api/v1/services`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceInput {
    pub name: String,
    /// `family:revision`.
    pub task_definition: String,
    pub pool: String,
    #[serde(default = "default_desired")]
    pub desired_count: u32,
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub constraints: ServiceConstraints,
    #[serde(default)]
    pub deployment: Option<DeploymentConfig>,
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_secs: u32,
}

/// Most tasks one service may ask for.
pub const MAX_DESIRED: u32 = 100_000;

pub(crate) fn valid_service_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
}

impl ServiceInput {
    /// Checks the fields that need no store; returns the service to store.
    pub(crate) fn validate(&self) -> Result<Service, ControlError> {
        let mut e = Errors::default();
        if !valid_service_name(&self.name) {
            e.add(
                "name",
                "use 1 to 63 lowercase letters, digits or '-', starting with a letter or digit",
            );
        }
        let task_definition = self
            .task_definition
            .parse::<TaskDefRef>()
            .map_err(|err| e.add("task_definition", err.to_string()))
            .ok();
        let pool = PoolName::new(self.pool.clone())
            .map_err(|err| e.add("pool", err.rule))
            .ok();
        if self.desired_count > MAX_DESIRED {
            e.add(
                "desired_count",
                format!("must be at most {MAX_DESIRED}, got {}", self.desired_count),
            );
        }
        let strategy = match &self.strategy {
            None => None,
            Some(s) => s
                .parse::<PlacementPolicy>()
                .map_err(|err| e.add("strategy", err.to_string()))
                .ok(),
        };
        let deployment = self.deployment.unwrap_or_default();
        check_deployment(&mut e, &deployment);
        if !(1..=600).contains(&self.stop_timeout_secs) {
            e.add(
                "stop_timeout_secs",
                format!(
                    "must be between 1 and 600 seconds, got {}",
                    self.stop_timeout_secs
                ),
            );
        }
        for k in self.constraints.labels.keys() {
            if k.is_empty() {
                e.add("constraints.labels", "label keys must not be empty");
            }
        }
        e.finish()?;
        Ok(Service {
            name: self.name.clone(),
            task_definition: task_definition.expect("validated"),
            pool: pool.expect("validated"),
            desired_count: self.desired_count,
            strategy,
            constraints: self.constraints.clone(),
            deployment,
            stop_timeout_secs: self.stop_timeout_secs,
            deleting: false,
            created_at: String::new(),
        })
    }
}

fn check_deployment(e: &mut Errors, d: &DeploymentConfig) {
    if d.minimum_healthy_percent > 100 {
        e.add(
            "deployment.minimum_healthy_percent",
            format!(
                "must be between 0 and 100, got {}",
                d.minimum_healthy_percent
            ),
        );
    }
    if !(100..=200).contains(&d.maximum_percent) {
        e.add(
            "deployment.maximum_percent",
            format!("must be between 100 and 200, got {}", d.maximum_percent),
        );
    }
    if d.minimum_healthy_percent == 100 && d.maximum_percent == 100 {
        e.add(
            "deployment.maximum_percent",
            "with minimum_healthy_percent 100, maximum_percent must exceed 100 or a deployment can never replace a task",
        );
    }
}

/// `PATCH /api/v1/services/{name}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServicePatch {
    #[serde(default)]
    pub desired_count: Option<u32>,
    /// `family:revision`; a new revision starts a rolling deployment.
    #[serde(default)]
    pub task_definition: Option<String>,
}

/// `POST /api/v1/placement-preview`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewInput {
    pub task_definition: String,
    pub pool: String,
    pub count: u32,
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub constraints: ServiceConstraints,
}

/// Where one previewed task would go, or why it would not.
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceDetail {
    #[serde(flatten)]
    pub service: Service,
    pub running: u32,
    pub pending: u32,
    pub deployments: Vec<Deployment>,
    pub events: Vec<Event>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_input_reports_every_bad_field() {
        let input = ServiceInput {
            name: "Bad Name".into(),
            task_definition: "nope".into(),
            pool: "".into(),
            desired_count: MAX_DESIRED + 1,
            strategy: Some("random".into()),
            constraints: ServiceConstraints::default(),
            deployment: Some(DeploymentConfig {
                minimum_healthy_percent: 150,
                maximum_percent: 50,
            }),
            stop_timeout_secs: 0,
        };
        let Err(ControlError::Invalid(errs)) = input.validate() else {
            panic!("invalid input accepted");
        };
        let fields: Vec<&str> = errs.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "name",
                "task_definition",
                "pool",
                "desired_count",
                "strategy",
                "deployment.minimum_healthy_percent",
                "deployment.maximum_percent",
                "stop_timeout_secs"
            ]
        );
    }

    #[test]
    fn pool_input_defaults_and_limits() {
        let ok = PoolInput {
            name: "gpu-a".into(),
            policy: None,
            compute_overcommit: None,
            mps_client_limit: None,
        }
        .validate()
        .expect("valid");
        assert_eq!(ok.policy, PlacementPolicy::Fragmentation);
        assert_eq!(ok.compute_overcommit, 1.0);
        let bad = PoolInput {
            name: "gpu-a".into(),
            policy: Some("fifo".into()),
            compute_overcommit: Some(0.5),
            mps_client_limit: Some(64),
        }
        .validate();
        let Err(ControlError::Invalid(errs)) = bad else {
            panic!("accepted")
        };
        assert_eq!(errs.errors.len(), 3);
    }
}
