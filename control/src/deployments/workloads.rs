//! Pools, task definitions and services: what operators create, change and delete, each
//! checked and written through the store; the reconcile loop acts on it.

use crate::deployments::Deployments;
use crate::error::ControlError;
use crate::error::StoreError;
use crate::inputs::{PoolInput, ServiceDetail, ServiceInput, ServicePatch};
use crate::store::EventFilter;
use serde_json::Value;
use tessera_model::fit::RightSize;
use tessera_model::service::{Service, TaskDefRef, TaskDefinition};
use tessera_model::taskdef::{Secret, ValidationErrors, parse_task_definition};
use tessera_model::{PoolInfo, PoolName};

/// The pool a fresh fleet has, and an agent joins unless told another.
pub const DEFAULT_POOL: &str = "default";

impl Deployments {
    // Pools.

    pub async fn create_pool(&self, input: &PoolInput) -> Result<PoolInfo, ControlError> {
        let pool = crate::inputs::validate_pool(input)?;
        if self.store.pool_exists(&pool.name).await? {
            return Err(ControlError::Conflict(format!(
                "a pool named {:?} already exists",
                pool.name.as_str()
            )));
        }
        self.store.upsert_pool(&pool).await?;
        self.scheduler.capacity_changed();
        Ok(pool)
    }

    /// Creates the pool `default` when the fleet has no pool at all (a fresh database), so
    /// that an agent started with its defaults has a pool to join. True when it created
    /// it; another server creating it at the same moment is not an error.
    pub async fn ensure_default_pool(&self) -> Result<bool, ControlError> {
        if !self.store.list_pools().await?.is_empty() {
            return Ok(false);
        }
        match self.create_pool(&PoolInput::named(DEFAULT_POOL)).await {
            Ok(_) => Ok(true),
            Err(ControlError::Conflict(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `PATCH /api/v1/pools/{name}`: the pool with what `patch` gives changed. Services
    /// already running keep their definitions; a stricter pool applies to their next
    /// deployment.
    pub async fn update_pool(
        &self,
        name: &PoolName,
        patch: &tessera_model::api::PoolPatch,
    ) -> Result<PoolInfo, ControlError> {
        let pool = self.store.get_pool(name).await?;
        let merged = PoolInput {
            name: pool.name.to_string(),
            policy: Some(
                patch
                    .policy
                    .clone()
                    .unwrap_or_else(|| pool.policy.as_str().to_owned()),
            ),
            compute_overcommit: Some(patch.compute_overcommit.unwrap_or(pool.compute_overcommit)),
            mps_client_limit: patch.mps_client_limit.or(pool.mps_client_limit),
            admission: Some(
                patch
                    .admission
                    .clone()
                    .unwrap_or_else(|| pool.admission.as_str().to_owned()),
            ),
            task_users: Some(patch.task_users.unwrap_or(pool.task_users)),
            privileged: Some(patch.privileged.unwrap_or(pool.privileged)),
            host_network: Some(patch.host_network.unwrap_or(pool.host_network)),
            exec: Some(patch.exec.unwrap_or(pool.exec)),
            preemption: Some(
                patch
                    .preemption
                    .clone()
                    .unwrap_or_else(|| pool.preemption.as_str().to_owned()),
            ),
            gpu_budget: Some(
                patch
                    .gpu_budget
                    .clone()
                    .unwrap_or_else(|| pool.gpu_budget.as_str().to_owned()),
            ),
            provider: match &patch.provider {
                Some(replaced) => replaced.clone(),
                None => pool.provider.as_ref().map(Into::into),
            },
        };
        let updated = crate::inputs::validate_pool(&merged)?;
        self.store.upsert_pool(&updated).await?;
        // Plans proposed, approved or declined under the other mode are its no longer.
        if updated.preemption != pool.preemption {
            let n = self
                .store
                .expire_open_preemptions(updated.name.as_str())
                .await?;
            if n > 0 {
                self.core
                    .event(
                        None,
                        None,
                        &format!(
                            "pool {}: preemption is {} now; {n} open preemption(s) expired",
                            updated.name,
                            updated.preemption.as_str()
                        ),
                    )
                    .await;
            }
        }
        self.scheduler.capacity_changed();
        self.core.wake();
        Ok(updated)
    }

    // Task definitions.

    /// Validates `input` (Tessera's JSON or ECS's) and stores it as the family's next revision.
    /// A secret sent back as `{"set": true}` (as descriptions show it) keeps the value the
    /// family's latest revision has for it.
    pub async fn register_task_definition(
        &self,
        input: &Value,
    ) -> Result<TaskDefinition, ControlError> {
        let mut spec = parse_task_definition(input).map_err(ControlError::Invalid)?;
        let keeps_secrets = spec
            .containers
            .iter()
            .any(|c| c.secrets.values().any(|v| *v == Secret::Unchanged));
        if keeps_secrets {
            let previous = match self
                .store
                .list_task_definition_revisions(&spec.family)
                .await
            {
                Ok(revisions) => revisions
                    .last()
                    .map(|d| d.spec.secret_values())
                    .unwrap_or_default(),
                Err(StoreError::NotFound { .. }) => Default::default(),
                Err(e) => return Err(e.into()),
            };
            let missing = spec.fill_secrets(&previous);
            if !missing.is_empty() {
                return Err(ControlError::Invalid(ValidationErrors { errors: missing }));
            }
        }
        Ok(self.store.register_task_definition(&spec).await?)
    }

    /// Marks a revision inactive: still describable, no new tasks; running ones go on.
    pub async fn deregister_task_definition(
        &self,
        r: &TaskDefRef,
    ) -> Result<TaskDefinition, ControlError> {
        self.store.set_task_definition_active(r, false).await?;
        Ok(self.store.get_task_definition(r).await?)
    }

    // Services.

    pub async fn create_service(&self, input: &ServiceInput) -> Result<Service, ControlError> {
        let service = crate::inputs::validate_service(input)?;
        let def = self
            .scheduler
            .usable_definition(&service.task_definition)
            .await?;
        service
            .objectives
            .check(def.spec.published())
            .map_err(ControlError::Invalid)?;
        let pool = self.scheduler.existing_pool(&service.pool).await?;
        allowed_in_pool(&def.spec, &pool)?;
        match self.store.create_service(&service).await {
            Err(StoreError::NotFound {
                what: "project", ..
            }) => {
                return Err(ControlError::invalid(
                    "project",
                    format!("no project named {:?}", service.project),
                ));
            }
            other => other?,
        }
        self.core
            .event(
                Some(&service.name),
                None,
                &format!(
                    "service {} created: {} tasks of {} in pool {}",
                    service.name, service.desired_count, service.task_definition, service.pool
                ),
            )
            .await;
        self.core.wake();
        Ok(self.store.get_service(&service.name).await?)
    }

    /// Scales a service and/or starts a rolling deployment of a new revision.
    pub async fn update_service(
        &self,
        name: &str,
        patch: &ServicePatch,
    ) -> Result<Service, ControlError> {
        let service = self.store.get_service(name).await?;
        if service.deleting {
            return Err(ControlError::Conflict(format!(
                "service {name} is being deleted"
            )));
        }
        let mut e = crate::inputs::Errors::default();
        if let Some(d) = patch.desired_count {
            e.desired_count(d);
        }
        let new_def = patch
            .task_definition
            .as_deref()
            .and_then(|raw| e.task_definition(raw));
        if patch.is_empty() {
            e.add(
                "(body)",
                "give desired_count, task_definition, project, priority, strategy, constraints, deployment, stop_timeout_secs, deregistration_delay_secs, slo, alarms, bake_secs or autoscaling",
            );
        }
        e.finish()?;
        let settings = patched_settings(&service, patch)?;
        self.check_objectives(&service, settings.as_ref(), patch, new_def.as_ref())
            .await?;
        // Only what the patch gives and changes is written, and nothing before all of it
        // is checked.
        let change = settings
            .as_ref()
            .map(|new| settings_change(&service, new, patch));
        if let Some((change, _)) = &change
            && let Some(project) = &change.project
        {
            self.existing_project(project).await?;
        }
        if let Some(d) = patch.desired_count.filter(|&d| d != service.desired_count) {
            self.store.set_desired_count(name, d).await?;
            let said = format!(
                "desired count changed from {} to {d}",
                service.desired_count
            );
            self.core.event(Some(name), None, &said).await;
        }
        if let Some((change, changed)) = change
            && !changed.is_empty()
        {
            self.store.update_service_settings(name, &change).await?;
            let said = format!("settings changed: {}", changed.join(", "));
            self.core.event(Some(name), None, &said).await;
            self.scheduler.capacity_changed();
        }
        if let Some(r) = new_def.filter(|r| *r != service.task_definition) {
            let id = self.store.start_deployment(name, &r, false).await?;
            let said = format!("deployment {id} started: {} → {r}", service.task_definition);
            self.core.event(Some(name), None, &said).await;
        }
        self.core.wake();
        Ok(self.store.get_service(name).await?)
    }

    /// The project named `name`, or an error naming the `project` field.
    async fn existing_project(&self, name: &str) -> Result<(), ControlError> {
        match self.store.get_project(name).await {
            Err(StoreError::NotFound { .. }) => Err(ControlError::invalid(
                "project",
                format!("no project named {name:?}"),
            )),
            other => other.map(|_| ()).map_err(Into::into),
        }
    }

    /// Objectives ask for figures the (new) revision must publish, and a new revision must
    /// be one the service's pool allows.
    async fn check_objectives(
        &self,
        service: &Service,
        settings: Option<&Service>,
        patch: &ServicePatch,
        new_def: Option<&TaskDefRef>,
    ) -> Result<(), ControlError> {
        if !patch.changes_objectives() && new_def.is_none() {
            return Ok(());
        }
        let r = new_def.unwrap_or(&service.task_definition);
        let def = if new_def.is_some() {
            self.scheduler.usable_definition(r).await?
        } else {
            self.store.get_task_definition(r).await?
        };
        let objectives = settings.map_or(&service.objectives, |s| &s.objectives);
        objectives
            .check(def.spec.published())
            .map_err(ControlError::Invalid)?;
        if new_def.is_some() {
            allowed_in_pool(
                &def.spec,
                &self.scheduler.existing_pool(&service.pool).await?,
            )?;
        }
        Ok(())
    }

    /// Drains the service to zero tasks; the reconciler removes it then.
    pub async fn delete_service(&self, name: &str) -> Result<(), ControlError> {
        self.store.mark_service_deleting(name).await?;
        self.core
            .event(
                Some(name),
                None,
                "service deletion requested: draining to 0 tasks",
            )
            .await;
        self.core.wake();
        Ok(())
    }

    pub async fn service_detail(&self, name: &str) -> Result<ServiceDetail, ControlError> {
        let service = self.store.get_service(name).await?;
        let deployments = self.store.list_deployments(name).await?;
        let events = self
            .store
            .list_events(&EventFilter {
                service: Some(name.to_owned()),
                limit: 20,
                ..Default::default()
            })
            .await?;
        Ok(ServiceDetail {
            running: deployments.iter().map(|d| d.running).sum(),
            pending: deployments.iter().map(|d| d.pending).sum(),
            service,
            deployments,
            events,
        })
    }
}

/// Whether `spec`'s containers ask only what `pool` allows of a host's security (a user of
/// their choosing, privileges, capabilities that reach past the container): a `422` naming
/// the container's field otherwise. Checked on create and deploy, and again for every task
/// a sync would send (a rollback, a pool made stricter, a definition stored before).
pub(crate) fn allowed_in_pool(
    spec: &tessera_model::taskdef::TaskDefinitionSpec,
    pool: &PoolInfo,
) -> Result<(), ControlError> {
    let mut errors: Vec<_> = spec
        .containers
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            c.security()
                .refused_by(pool)
                .into_iter()
                .map(move |(field, message)| tessera_model::taskdef::FieldError {
                    field: format!("task_definition.containers[{i}].{field}"),
                    message: format!("{message} (pool {})", pool.name),
                })
        })
        .collect();
    if spec.host_network() && !pool.host_network && !pool.privileged {
        errors.push(tessera_model::taskdef::FieldError {
            field: "task_definition.networkMode".into(),
            message: format!(
                "host networking lets a task see the host's loopback and LAN: the pool does not allow it (pool setting host_network) (pool {})",
                pool.name
            ),
        });
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ControlError::Invalid(
            tessera_model::taskdef::ValidationErrors { errors },
        ))
    }
}

/// The service's settings as `patch` would leave them, through the same rules as a new
/// service's (`None` when it changes no setting).
fn patched_settings(
    service: &Service,
    patch: &ServicePatch,
) -> Result<Option<Service>, ControlError> {
    if !patch.changes_settings() {
        return Ok(None);
    }
    let input = ServiceInput {
        name: service.name.clone(),
        task_definition: service.task_definition.to_string(),
        pool: service.pool.to_string(),
        project: Some(
            patch
                .project
                .clone()
                .unwrap_or_else(|| service.project.clone()),
        ),
        priority: Some(patch.priority.unwrap_or(service.priority)),
        desired_count: service.desired_count,
        strategy: match &patch.strategy {
            Some(s) => s.clone(),
            None => service.strategy.map(|p| p.as_str().to_owned()),
        },
        constraints: patch
            .constraints
            .clone()
            .unwrap_or_else(|| service.constraints.clone()),
        deployment: Some(patch.deployment.unwrap_or(service.deployment)),
        stop_timeout_secs: patch.stop_timeout_secs.unwrap_or(service.stop_timeout_secs),
        deregistration_delay_secs: patch
            .deregistration_delay_secs
            .unwrap_or(service.deregistration_delay_secs),
        slo: None,
        alarms: Vec::new(),
        bake_secs: 0,
        autoscaling: None,
    };
    let mut new = crate::inputs::validate_service(&input)?;
    new.objectives = patch.objectives_over(&service.objectives);
    Ok(Some(new))
}

/// What of `new` (the settings `patch` leaves) is to be written over `service`'s: only
/// what the patch gives and changes; and each change as the event says it.
fn settings_change(
    service: &Service,
    new: &Service,
    patch: &ServicePatch,
) -> (crate::store::SettingsChange, Vec<String>) {
    let mut change = crate::store::SettingsChange::default();
    let mut changed = Vec::new();
    if patch.project.is_some() && new.project != service.project {
        changed.push(format!("project {}", new.project));
        change.project = Some(new.project.clone());
    }
    if patch.priority.is_some() && new.priority != service.priority {
        changed.push(format!("priority {}", new.priority));
        change.priority = Some(new.priority);
    }
    if patch.strategy.is_some() && new.strategy != service.strategy {
        changed.push(format!(
            "strategy {}",
            new.strategy.map_or("the pool's", |p| p.as_str())
        ));
        change.strategy = Some(new.strategy);
    }
    if patch.constraints.is_some() && new.constraints != service.constraints {
        changed.push("constraints".to_owned());
        change.constraints = Some(new.constraints.clone());
    }
    if patch.deployment.is_some() && new.deployment != service.deployment {
        changed.push(format!(
            "deployment minimum healthy {}% maximum {}%",
            new.deployment.minimum_healthy_percent, new.deployment.maximum_percent
        ));
        change.deployment = Some(new.deployment);
    }
    if patch.stop_timeout_secs.is_some() && new.stop_timeout_secs != service.stop_timeout_secs {
        changed.push(format!("stop timeout {} s", new.stop_timeout_secs));
        change.stop_timeout_secs = Some(new.stop_timeout_secs);
    }
    if patch.deregistration_delay_secs.is_some()
        && new.deregistration_delay_secs != service.deregistration_delay_secs
    {
        changed.push(format!(
            "deregistration delay {} s",
            new.deregistration_delay_secs
        ));
        change.deregistration_delay_secs = Some(new.deregistration_delay_secs);
    }
    if patch.changes_objectives() && new.objectives != service.objectives {
        changed.push(crate::work::describe_objectives(&new.objectives));
        change.objectives = Some(new.objectives.clone());
    }
    (change, changed)
}

impl Deployments {
    /// Right-sizes service `name` in one step: registers the proposal as its family's next
    /// revision and rolls it out through the service's normal deployment.
    pub async fn right_size(
        &self,
        name: &str,
    ) -> Result<(RightSize, tessera_model::service::TaskDefinition), ControlError> {
        let proposal = self.views.right_size_proposal(name).await?;
        let def = self.register_task_definition(&proposal.definition).await?;
        self.update_service(
            name,
            &crate::inputs::ServicePatch {
                desired_count: None,
                task_definition: Some(def.reference().to_string()),
                ..Default::default()
            },
        )
        .await?;
        self.core
            .event(
                Some(name),
                None,
                &format!(
                    "right-sized: {} registered from {} ({}), rolling out",
                    def.reference(),
                    proposal.current,
                    proposal
                        .changes
                        .iter()
                        .map(|c| format!("{} {} → {}", c.field, c.from, c.to))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
            .await;
        Ok((proposal, def))
    }
}
