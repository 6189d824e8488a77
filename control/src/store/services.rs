//! Task definitions, services and their deployments: the `ServiceStore` trait and the
//! settings a service changes in place.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::service::{Deployment, DeploymentStatus, Service, TaskDefRef, TaskDefinition};
use tessera_model::taskdef::TaskDefinitionSpec;

/// Settings of a service that change in place, each `None` when it stays.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SettingsChange {
    /// The project it moves to.
    pub project: Option<String>,
    pub priority: Option<tessera_model::service::PriorityClass>,
    /// `Some(None)`: back to the pool's policy.
    pub strategy: Option<Option<tessera_model::PlacementPolicy>>,
    pub constraints: Option<tessera_model::service::ServiceConstraints>,
    pub deployment: Option<tessera_model::service::DeploymentConfig>,
    pub stop_timeout_secs: Option<u32>,
    pub deregistration_delay_secs: Option<u32>,
    pub objectives: Option<tessera_model::work::Objectives>,
}

#[async_trait]
/// Task definitions, services and their deployments: what should run.
pub trait ServiceStore: Send + Sync + 'static {
    // Task definitions.
    /// Stores `spec` as the next revision of its family.
    async fn register_task_definition(
        &self,
        spec: &TaskDefinitionSpec,
    ) -> Result<TaskDefinition, StoreError>;
    /// The latest revision of every family.
    async fn list_task_definition_families(&self) -> Result<Vec<TaskDefinition>, StoreError>;
    async fn list_task_definition_revisions(
        &self,
        family: &str,
    ) -> Result<Vec<TaskDefinition>, StoreError>;
    async fn get_task_definition(&self, r: &TaskDefRef) -> Result<TaskDefinition, StoreError>;
    async fn set_task_definition_active(
        &self,
        r: &TaskDefRef,
        active: bool,
    ) -> Result<(), StoreError>;

    // Services and deployments.
    /// Stores a new service and its first (primary) deployment.
    async fn create_service(&self, service: &Service) -> Result<(), StoreError>;
    async fn list_services(&self) -> Result<Vec<Service>, StoreError>;
    async fn get_service(&self, name: &str) -> Result<Service, StoreError>;
    /// The stop timeout of each deployment's service, in one read (deployments not found
    /// are left out).
    async fn stop_timeouts(
        &self,
        deployments: &[i64],
    ) -> Result<std::collections::HashMap<i64, u32>, StoreError>;
    async fn set_desired_count(&self, name: &str, desired: u32) -> Result<(), StoreError>;
    /// Writes the placement and rollout settings `change` gives, and only those (a
    /// concurrent change of another setting is kept); the service's name, pool, count and
    /// revision stay.
    async fn update_service_settings(
        &self,
        name: &str,
        change: &SettingsChange,
    ) -> Result<(), StoreError>;
    /// Points the service at `r` and makes a new primary deployment for it; the old
    /// primary becomes `active` (or `rolled_back` when `rollback_from` names it).
    async fn start_deployment(
        &self,
        name: &str,
        r: &TaskDefRef,
        failed_primary: bool,
    ) -> Result<i64, StoreError>;
    async fn mark_service_deleting(&self, name: &str) -> Result<(), StoreError>;
    async fn delete_service(&self, name: &str) -> Result<(), StoreError>;
    /// Deployments of a service, newest first, with their task counts.
    async fn list_deployments(&self, service: &str) -> Result<Vec<Deployment>, StoreError>;
    /// Every service's deployments, newest first.
    async fn list_all_deployments(&self) -> Result<Vec<Deployment>, StoreError>;
    async fn set_deployment_status(
        &self,
        id: i64,
        status: DeploymentStatus,
    ) -> Result<(), StoreError>;

    // What changed, by service (rows the database's triggers add; see the migration
    // `service_changes`).
    /// Changes numbered above `after`, and those recorded at or after `recent` (a
    /// transaction that took its number earlier may commit later): (number, service).
    async fn service_changes(
        &self,
        after: i64,
        recent: &str,
    ) -> Result<Vec<(i64, String)>, StoreError>;
    /// The newest change's number; 0 when there is none.
    async fn last_service_change(&self) -> Result<i64, StoreError>;
    /// Deletes the changes numbered up to `upto` recorded before `before`.
    async fn forget_service_changes(&self, upto: i64, before: &str) -> Result<(), StoreError>;
}
