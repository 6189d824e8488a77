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
    /// The booting machine of `pool` whose provider id is `provider_id` joined as host
    /// `host`: active from `at`. Whether one did.
    async fn join_machine(
        &self,
        pool: &PoolName,
        provider_id: &str,
        host: &HostId,
        at: &str,
    ) -> Result<bool, StoreError>;
}
