//! The rules of the request bodies that are not task definitions (those are in
//! [`crate::taskdef`]): pools and services. They need no store, so the server, the command
//! line and the console in the browser check a body with the same code; every error names
//! its field. The bounds are [`crate::limits`]'s, which the schemas read too.

use crate::api::{PoolInput, ServiceInput};
use crate::error::{FieldError, ValidationErrors};
use crate::limits::{
    COMPUTE_OVERCOMMIT_MAX, DEREGISTRATION_DELAY_MAX_SECS, MAX_DESIRED, MAX_PER_HOST_MAX,
    MPS_CLIENT_LIMIT_MAX, STOP_TIMEOUT_MAX_SECS, STOP_TIMEOUT_MIN_SECS,
};
use crate::service::{DeploymentConfig, Service, TaskDefRef};
use crate::time::Timestamp;
use crate::{Admission, ParseEnumError, PlacementPolicy, PoolInfo, PoolName, ids};

/// Collects field errors, then fails with all of them.
#[derive(Debug, Default)]
pub struct Errors(Vec<FieldError>);

impl Errors {
    pub fn add(&mut self, field: &str, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.to_owned(),
            message: message.into(),
        });
    }

    /// A `family:revision` field.
    pub fn task_definition(&mut self, raw: &str) -> Option<TaskDefRef> {
        raw.parse::<TaskDefRef>()
            .map_err(|err| self.add("task_definition", err.to_string()))
            .ok()
    }

    /// A pool name field.
    pub fn pool(&mut self, raw: &str) -> Option<PoolName> {
        PoolName::new(raw)
            .map_err(|err| self.add("pool", err.rule))
            .ok()
    }

    /// An optional strategy field; `Some(None)` when it is absent.
    pub fn strategy(&mut self, raw: Option<&String>) -> Option<Option<PlacementPolicy>> {
        match raw {
            None => Some(None),
            Some(s) => s
                .parse::<PlacementPolicy>()
                .map(Some)
                .map_err(|err| self.add("strategy", err.to_string()))
                .ok(),
        }
    }

    /// The desired count of a service.
    pub fn desired_count(&mut self, n: u32) {
        if n > MAX_DESIRED {
            self.add(
                "desired_count",
                format!("must be at most {MAX_DESIRED}, got {n}"),
            );
        }
    }

    /// A service's placement constraints (a service's, or a placement preview's).
    pub fn constraints(&mut self, c: &crate::service::ServiceConstraints) {
        if c.max_per_gpu
            .is_some_and(|n| !(1..=MPS_CLIENT_LIMIT_MAX).contains(&n))
        {
            self.add(
                "constraints.max_per_gpu",
                format!(
                    "must be between 1 and {MPS_CLIENT_LIMIT_MAX} (an MPS server's most clients)"
                ),
            );
        }
        if c.max_per_host
            .is_some_and(|n| !(1..=MAX_PER_HOST_MAX).contains(&n))
        {
            self.add(
                "constraints.max_per_host",
                format!("must be between 1 and {MAX_PER_HOST_MAX}"),
            );
        }
        if c.labels.keys().any(String::is_empty) {
            self.add("constraints.labels", "label keys must not be empty");
        }
    }

    pub fn finish(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors { errors: self.0 })
        }
    }
}

/// Checks a pool body; returns the pool to store.
pub fn pool(input: &PoolInput) -> Result<PoolInfo, ValidationErrors> {
    let mut e = Errors::default();
    let name = PoolName::new(input.name.clone())
        .map_err(|err| e.add("name", err.rule))
        .ok();
    let policy = match &input.policy {
        None => Some(PlacementPolicy::default()),
        Some(p) => p
            .parse()
            .map_err(|err: ParseEnumError| e.add("policy", err.to_string()))
            .ok(),
    };
    let overcommit = input.compute_overcommit.unwrap_or(1.0);
    if !(1.0..=COMPUTE_OVERCOMMIT_MAX).contains(&overcommit) {
        e.add(
            "compute_overcommit",
            format!(
                "must be between 1.0 (caps reserved) and {COMPUTE_OVERCOMMIT_MAX:.1}, got {overcommit}"
            ),
        );
    }
    if let Some(l) = input
        .mps_client_limit
        .filter(|l| !(1..=MPS_CLIENT_LIMIT_MAX).contains(l))
    {
        e.add(
            "mps_client_limit",
            format!("must be between 1 and {MPS_CLIENT_LIMIT_MAX} (MPS's own limit), got {l}"),
        );
    }
    let admission = match &input.admission {
        None => Some(Admission::default()),
        Some(a) => a
            .parse()
            .map_err(|err: ParseEnumError| e.add("admission", err.to_string()))
            .ok(),
    };
    let preemption = match &input.preemption {
        None => Some(crate::inventory::PreemptionMode::default()),
        Some(a) => a
            .parse()
            .map_err(|err: ParseEnumError| e.add("preemption", err.to_string()))
            .ok(),
    };
    let gpu_budget = match &input.gpu_budget {
        None => Some(crate::inventory::GpuBudget::default()),
        Some(a) => a
            .parse()
            .map_err(|err: ParseEnumError| e.add("gpu_budget", err.to_string()))
            .ok(),
    };
    let provider = match &input.provider {
        None => None,
        Some(p) => match crate::provider::validate(p) {
            Ok(p) => Some(p),
            Err(errors) => {
                for f in errors.errors {
                    e.add(&f.field, f.message);
                }
                None
            }
        },
    };
    e.finish()?;
    Ok(PoolInfo {
        name: name.expect("validated"),
        policy: policy.expect("validated"),
        compute_overcommit: overcommit,
        mps_client_limit: input.mps_client_limit,
        admission: admission.expect("validated"),
        task_users: input.task_users.unwrap_or(false),
        privileged: input.privileged.unwrap_or(false),
        exec: input.exec.unwrap_or(false),
        host_network: input.host_network.unwrap_or(false),
        preemption: preemption.expect("validated"),
        gpu_budget: gpu_budget.expect("validated"),
        provider,
    })
}

/// Checks the fields of a service body (all but whether its task definition and pool
/// exist, which need the store); returns the service to store.
pub fn service(input: &ServiceInput) -> Result<Service, ValidationErrors> {
    let mut e = Errors::default();
    if !ids::is_valid_name(&input.name) {
        e.add("name", ids::NAME_RULE);
    }
    let task_definition = e.task_definition(&input.task_definition);
    let pool = e.pool(&input.pool);
    let project = input
        .project
        .clone()
        .unwrap_or_else(|| crate::service::DEFAULT_PROJECT.to_owned());
    if !ids::is_valid_name(&project) {
        e.add("project", ids::NAME_RULE);
    }
    let priority = input.priority.unwrap_or_default();
    e.desired_count(input.desired_count);
    let strategy = e.strategy(input.strategy.as_ref());
    let deployment = input.deployment.unwrap_or_default();
    check_deployment(&mut e, &deployment);
    if !(STOP_TIMEOUT_MIN_SECS..=STOP_TIMEOUT_MAX_SECS).contains(&input.stop_timeout_secs) {
        e.add(
            "stop_timeout_secs",
            format!(
                "must be between {STOP_TIMEOUT_MIN_SECS} and {STOP_TIMEOUT_MAX_SECS} seconds, got {}",
                input.stop_timeout_secs
            ),
        );
    }
    if input.deregistration_delay_secs > DEREGISTRATION_DELAY_MAX_SECS {
        e.add(
            "deregistration_delay_secs",
            format!(
                "must be between 0 and {DEREGISTRATION_DELAY_MAX_SECS} seconds, got {}",
                input.deregistration_delay_secs
            ),
        );
    }
    e.constraints(&input.constraints);
    e.finish()?;
    Ok(Service {
        name: input.name.clone(),
        task_definition: task_definition.expect("validated"),
        pool: pool.expect("validated"),
        project,
        priority,
        desired_count: input.desired_count,
        strategy: strategy.expect("validated"),
        constraints: input.constraints.clone(),
        deployment,
        stop_timeout_secs: input.stop_timeout_secs,
        deregistration_delay_secs: input.deregistration_delay_secs,
        objectives: input.objectives(),
        deleting: false,
        created_at: Timestamp::EPOCH,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PoolInput;
    use crate::service::ServiceConstraints;

    #[test]
    fn service_input_reports_every_bad_field() {
        let input = ServiceInput {
            name: "Bad Name".into(),
            task_definition: "nope".into(),
            pool: "".into(),
            project: None,
            priority: None,
            desired_count: MAX_DESIRED + 1,
            strategy: Some("random".into()),
            constraints: ServiceConstraints::default(),
            deployment: Some(DeploymentConfig {
                minimum_healthy_percent: 150,
                maximum_percent: 50,
            }),
            stop_timeout_secs: 0,
            deregistration_delay_secs: 3601,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        };
        let Err(errs) = service(&input) else {
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
                "stop_timeout_secs",
                "deregistration_delay_secs"
            ]
        );
    }

    #[test]
    fn pool_input_defaults_and_limits() {
        let ok = pool(&PoolInput::named("gpu-a")).expect("valid");
        assert_eq!(ok.policy, PlacementPolicy::Fragmentation);
        assert_eq!(ok.compute_overcommit, 1.0);
        let bad = pool(&PoolInput {
            name: "gpu-a".into(),
            policy: Some("fifo".into()),
            compute_overcommit: Some(0.5),
            mps_client_limit: Some(64),
            admission: Some("sometimes".into()),
            task_users: None,
            privileged: None,
            host_network: None,
            exec: None,
            preemption: Some("later".into()),
            gpu_budget: Some("ignore".into()),
            provider: Some(crate::provider::ProviderInput {
                kind: "demo".into(),
                max_hosts: 0,
                ..Default::default()
            }),
        });
        let Err(errs) = bad else { panic!("accepted") };
        assert_eq!(errs.errors.len(), 7);
        assert!(
            errs.errors.iter().any(|e| e.field == "provider.max_hosts"),
            "{errs:?}"
        );
        assert!(
            errs.errors
                .iter()
                .any(|e| e.field == "gpu_budget" && e.message.contains("enforce warn")),
            "{errs:?}"
        );
        assert!(
            errs.errors
                .iter()
                .any(|e| e.field == "preemption" && e.message.contains("automatic approve")),
            "{errs:?}"
        );
        assert!(
            errs.errors
                .iter()
                .any(|e| e.field == "admission" && e.message.contains("auto manual")),
            "{errs:?}"
        );
    }
}
