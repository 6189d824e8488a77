//! Operators' host operations: drain and activate, through the lifecycle state machine.

use crate::deployments::Deployments;
use crate::error::ControlError;
use crate::lifecycle::{self, HostEvent};
use tessera_model::HostId;

/// A host whose status changed between reading and writing it (a sync, a lost timeout).
fn changed_meanwhile(id: &HostId) -> ControlError {
    ControlError::Conflict(format!(
        "host {id} changed status meanwhile; look again and retry"
    ))
}

impl Deployments {
    // Hosts.

    /// Operator drain: no new tasks; running ones move elsewhere (start before stop).
    pub async fn drain_host(&self, id: &HostId) -> Result<(), ControlError> {
        self.operate_host(id, HostEvent::Drain).await
    }

    /// Operator activate: the host takes new tasks again.
    pub async fn activate_host(&self, id: &HostId) -> Result<(), ControlError> {
        self.operate_host(id, HostEvent::Activate).await
    }

    /// An operator's change of a host's status, by the host lifecycle's rules, written
    /// only over the status it read.
    async fn operate_host(&self, id: &HostId, event: HostEvent<'_>) -> Result<(), ControlError> {
        let host = self.store.get_host(id).await?;
        let Some(t) =
            lifecycle::next(id.as_str(), host.status, event).map_err(ControlError::Conflict)?
        else {
            return Ok(());
        };
        if !self
            .store
            .set_host_status_if(id, host.status, t.to, t.reason.as_deref())
            .await?
        {
            return Err(changed_meanwhile(id));
        }
        self.scheduler.capacity_changed();
        self.core.event(None, Some(id), &t.message).await;
        self.core.wake();
        Ok(())
    }
}
