//! What the fleet read model (`crate::parts::FleetModel`) reads: the rows changed since its
//! last reading, found by the change marks the database's triggers keep (see the
//! migrations `*_fleet_marks.sql`), and the `FleetStore` trait.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::service::{Measured, Task};
use tessera_model::{HostId, HostInfo, PoolInfo};

/// Where a reading of the fleet starts: nothing read yet.
pub const FLEET_FROM_START: i64 = 0;

/// What changed since a mark.
#[derive(Debug, Clone, Default)]
pub struct FleetChanges {
    /// The mark the next reading starts from (rows already read may be read again; none
    /// changed after this reading is missed).
    pub next: i64,
    /// Every pool (there are few; a change of limits changes every host's figures).
    pub pools: Vec<PoolInfo>,
    /// Hosts changed (their GPUs included), in no particular order.
    pub hosts: Vec<HostInfo>,
    /// Tasks changed, in any state, with their allocations when they hold capacity (and
    /// without their `work`); on a first reading, every task not stopped.
    pub tasks: Vec<Task>,
    /// How many hosts there are now (a host deleted leaves no row to read).
    pub host_count: u64,
}

#[async_trait]
pub trait FleetStore: Send + Sync + 'static {
    /// What changed since `since` (a `next` of an earlier reading, or
    /// [`FLEET_FROM_START`]).
    async fn fleet_changes(&self, since: i64) -> Result<FleetChanges, StoreError>;
    /// The id of every host.
    async fn host_ids(&self) -> Result<Vec<HostId>, StoreError>;
    /// What was last measured of every task holding capacity (its peak GPU memory and SM
    /// use; not its work), by task id: the figures that move with nearly every sync, which
    /// change marks leave out.
    async fn measured_figures(&self) -> Result<Vec<(String, Measured)>, StoreError>;
}
