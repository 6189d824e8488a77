//! The small pieces the components share or are built from. Each owns its state behind
//! private fields and locks that do not poison (`parking_lot`: a panic while one is held
//! does not take later callers down), and none knows `Control` or a component, so each
//! can be read alone.
//!
//! - [`Core`]: what every component shares: the configuration, the fleet's time, waking the
//!   loop, live views' notifications, events.
//! - [`Membership`]: this server among the servers on one database: its id, the scheduler
//!   lease, the fleet's clock, outages and late ticks (kept in the core; the cluster code
//!   of `Control` and lost-host detection read it).
//! - [`ServiceStates`]: what the passes last said of each service (the scheduler says why
//!   tasks wait, deployments the rest), so an event is written when it changes.
//! - [`HashQueue`]: the bounded queue of password checks (the accounts component's).
//! - [`FleetModel`]: the fleet read model (hosts with their GPUs' figures and tasks,
//!   tasks waiting), kept up to date from the rows changed since its last reading (the
//!   read models' component owns it).
//! - `UsageBuffer`: measured use gathered into buckets until they close (agent sync's).

mod core;
mod fleet;
mod hash_queue;
mod membership;
mod service_states;
mod usage_buffer;

pub(crate) use core::Core;
pub(crate) use fleet::FleetModel;
pub use fleet::{FleetSnapshot, GpuFigures, HostBlock};
pub(crate) use hash_queue::HashQueue;
pub(crate) use membership::Membership;
pub(crate) use service_states::ServiceStates;
pub(crate) use usage_buffer::{UsageBuffer, neighbours_of};
