//! Events and settings: the `EventStore` trait and which events to list.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::HostId;
use tessera_model::notify::NoticeKind;
use tessera_model::service::Event;

/// Which events to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub service: Option<String>,
    pub host: Option<HostId>,
    /// Only events whose message names this task (with `service`, those of its service).
    pub task: Option<String>,
    /// Only events with a larger id (for live updates).
    pub after: Option<i64>,
    pub limit: u32,
}

#[async_trait]
/// Events and settings.
pub trait EventStore: Send + Sync + 'static {
    // Events and settings.
    async fn add_event(
        &self,
        service: Option<&str>,
        host: Option<&HostId>,
        message: &str,
    ) -> Result<(), StoreError>;
    /// Records an event that on-call people must hear of: the event, and in the same
    /// transaction a delivery to each webhook whose kinds and project, pool and service
    /// match. `about` is its service, host and pool (when no pool is given: the service's,
    /// or the host's).
    async fn add_notice(
        &self,
        kind: NoticeKind,
        about: (Option<&str>, Option<&HostId>, Option<&str>),
        message: &str,
    ) -> Result<(), StoreError>;
    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<Event>, StoreError>;
    async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError>;
    async fn set_setting(&self, key: &str, value: &str) -> Result<(), StoreError>;
}
