//! The parts `Control` is made of. Each owns its state behind locks that do not poison
//! (`parking_lot`: a panic while one is held does not take later callers down), and none
//! knows `Control`, so each can be read alone. `Control` composes them; the operations (the
//! `impl Control` blocks of the other modules) work through them.
//!
//! - [`Scheduling`]: each pool's engine kept between passes, the capacity epoch that
//!   invalidates them, revisions' specs.
//! - [`Gateway`]: what agents' syncs leave to write (heartbeats, usage, work) and the stop
//!   timeouts their answers carry.
//! - [`Membership`]: this server among the servers on one database: its id, the scheduler
//!   lease, the fleet's clock, outages and late ticks.
//! - [`Passes`]: what the reconcile passes remember: each service's state, crash-loop
//!   backoff, the changes read, alarm watches.
//! - [`Core`]: what every component shares: the configuration, the fleet's time, waking the
//!   loop, live views' notifications, events.
//! - [`HashQueue`]: the bounded queue of password checks (the accounts component's).
//! - [`FleetModel`]: the fleet read model (hosts with their GPUs' figures and tasks,
//!   tasks waiting), kept up to date from the rows changed since its last reading.

mod core;
mod fleet;
mod gateway;
mod hash_queue;
mod membership;
mod passes;
mod service_states;
mod usage_buffer;

pub(crate) use core::Core;
pub(crate) use fleet::FleetModel;
pub use fleet::{FleetSnapshot, GpuFigures, HostBlock};
pub(crate) use gateway::Gateway;
#[cfg(test)]
pub(crate) use gateway::{WORK_REFRESH, WorkLatest};
pub(crate) use hash_queue::HashQueue;
pub(crate) use membership::Membership;
pub(crate) use passes::{Estimates, Passes, ServiceState, Watch};
pub(crate) use service_states::ServiceStates;
pub(crate) use usage_buffer::neighbours_of;
