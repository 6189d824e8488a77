//! Machines asked of pools' capacity providers: the `MachineStore` trait.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::provider::{Machine, MachineState};
use tessera_model::{HostId, PoolName};

#[async_trait]
/// Machines a pool's provider was asked for, and what became of each. Written by the
/// scheduler lease's holder only (through its fenced store).
pub trait MachineStore: Send + Sync + 'static {
    /// Records machines just asked for (booting).
    async fn add_machines(&self, machines: &[Machine]) -> Result<(), StoreError>;
    /// A pool's machines (every pool's with `None`), newest first; those that ended only
    /// when `ended` (the most recent `limit` of them).
    async fn list_machines(
        &self,
        pool: Option<&PoolName>,
        ended: bool,
        limit: u32,
    ) -> Result<Vec<Machine>, StoreError>;
    /// Moves machine `id` from `from` to `to` (compare-and-set), with why; `ended_at` is
    /// written when `to` is terminated or failed. Whether it moved.
    async fn set_machine_state(
        &self,
        id: &str,
        from: MachineState,
        to: MachineState,
        reason: &str,
        at: &str,
    ) -> Result<bool, StoreError>;
    /// The provider's id for machine `id`, once the provider says it.
    async fn set_machine_provider_id(&self, id: &str, provider_id: &str) -> Result<(), StoreError>;
    /// Host `host` joined `pool` saying it is the provider's machine `provider_id`: the
    /// booting machine with that id becomes active as it; failing that, a live machine
    /// with that id (the host rejoining) is it now; failing that, the oldest booting
    /// machine whose id the provider never said (an Auto Scaling group names its instances
    /// only once they run) takes the id and becomes active. `at` is the time.
    async fn join_machine(
        &self,
        pool: &PoolName,
        provider_id: &str,
        host: &HostId,
        at: &str,
    ) -> Result<Joined, StoreError>;
}

/// How a host that said its provider id became one of its pool's machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// It is machine `0`, asked for under that provider id.
    Asked(String),
    /// It is machine `0` again (it had joined before).
    Again(String),
    /// It is machine `0`, asked for before the provider said its id.
    Claimed(String),
    /// No machine of the pool was waiting for it.
    Unknown,
}
