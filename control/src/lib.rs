//! Tessera's control plane: the store that holds the fleet's state, and the logic on top of
//! it that the HTTP server, the console and the agents call.
//!
//! # Layout
//! The control plane is components, each owning its state behind private fields and
//! holding only the store traits it needs (see `docs/architecture.md`); [`Control`] is the
//! façade that wires them.
//!
//! Components:
//! - [`auth`]: `Accounts`: operators' accounts, sign-in limits, API tokens, session
//!   records, the audit log.
//! - [`agents`]: `AgentSync`: hosts joining ([`admission`]: join tokens, pools that hold new
//!   hosts for approval, rejoining a revoked host), syncs, measured use ([`usage`]) and work
//!   kept until the next tick, GPU memory budgets held by what is measured, hosts'
//!   credentials.
//! - `scheduler`: `Scheduler`: placement against the live fleet through
//!   `tessera-placement` (priority, fair share, project limits, preemption, previews),
//!   commits that re-check capacity; its pure steps in `scheduler::steps`.
//! - [`deployments`]: `Deployments`: pools, task definitions and services as operators
//!   change them, host operations, the reconcile pass (`reconcile`), work figures, alarms
//!   and autoscaling (`work`, with `InterferenceModel`), consolidation (`consolidate`).
//! - [`projects`]: `Projects`: projects and their quotas, members, use over time.
//! - [`providers`]: `Providers`: pools' capacity providers: what-if sizing of the tasks
//!   that wait (through the scheduler), machines launched, given up on and scaled in, each
//!   recorded in the store before the provider is asked.
//! - [`notify`]: `Notifications`: webhooks an admin registers and the delivery of notices
//!   (a rollback, an alarm, a host impaired or lost, a crash loop, a preemption,
//!   autoscaling at its maximum, a provider failing) to them: signed, retried, listed.
//! - [`streams`]: `TaskStreams`: a task's logs and commands run in it, relayed between
//!   the client and the agent of the task's host (which opens every connection).
//! - [`views`]: `Views`: the read models (pages, lists, the fleet read model, endpoints,
//!   Prometheus discovery, fit).
//!
//! The rest:
//! - [`control`]: `Control`, the façade: the components' accessors, the reconcile loop
//!   (`run`) and several servers on one database (`cluster`: announcements, the scheduler
//!   lease, the fenced store a pass writes through).
//! - `parts`: the pieces components share or are built from: `Core` (configuration, the
//!   fleet's time, waking the loop, events), membership, what passes say of services, the
//!   password-check queue, the fleet read model, the usage buffer.
//! - [`store`]: the `Store` interface every backend implements ([`open`] picks one from
//!   a database URL), and the components' bundles of its traits.
//! - [`sqlite`]: the embedded SQLite backend (the default), with its migrations.
//! - [`postgres`]: the PostgreSQL backend, for several servers on one database.
//! - [`move_store`]: `tessera migrate-store`, a fleet's SQLite database copied into a new
//!   PostgreSQL one.
//! - `config`: `ControlConfig`, the timings and limits.
//! - `cache`: the one bounded cache type every cache uses.
//! - `inventory_growth`: what of a sync's GPUs becomes capacity (bounded by what the host
//!   was admitted with; new GPUs wait for approval in manual pools).
//! - `lifecycle`: a host's status as a state machine (sync, drain, activate, silence).
//! - `plan`: what a service needs next (stops, starts, rollback), as a pure function.
//! - [`capacity`]: the one place capacity is counted: a pool's hosts and what tasks hold,
//!   as the engine's snapshot; the commit's re-check and every usage figure come from it.
//! - [`clock`]: the control plane's time (the machine's, or a test's manual clock).
//! - `interference`: what sharing a GPU with another service costs it, estimated from its
//!   measured work (Welch's t-test on log p99).
//! - [`inputs`]: request bodies and computed views, with their validation.
//! - [`error`]: `StoreError` and `ControlError`.
//! - `bench` (feature `bench`): the simulated fleet and arguments the benchmark programs
//!   share.
//! - `test_values` (unit tests only): a plain task and service to build test values from.
//! - `testkit` (feature `testing`): the harness and builders the control plane's and the
//!   server's tests share (a test database, a control plane, hosts, agents' syncs,
//!   services, waiting on a condition).

#![forbid(unsafe_code)]

pub mod agents;
pub mod auth;
#[cfg(feature = "bench")]
pub mod bench;
mod cache;
pub mod capacity;
pub mod clock;
mod config;
pub mod control;
pub mod deployments;
pub mod error;
pub mod inputs;
mod interference;
mod inventory_growth;
mod lifecycle;
pub mod move_store;
pub mod notify;
mod parts;
mod plan;
pub mod postgres;
pub mod projects;
pub mod providers;
mod scheduler;
pub mod sqlite;
pub mod store;
pub mod streams;
#[cfg(test)]
mod test_values;
#[cfg(feature = "testing")]
pub mod testkit;
pub mod views;

pub use agents::{admission, usage};
pub use config::ControlConfig;
pub use control::Control;
pub use deployments::workloads::DEFAULT_POOL;
pub(crate) use deployments::{work, workloads};
pub use error::{ControlError, StoreError, Told};
pub use parts::{FleetSnapshot, GpuFigures, HostBlock};
pub use scheduler::{density, density_of};
pub use store::{AuthStore, Store};
/// A GPU's usage, as `density_of` reads it.
pub use tessera_placement::GpuUsage;
pub(crate) use views::fit;

/// Opens the store named by `url`, applying pending migrations: `sqlite://PATH` (the file
/// and its directory are created if missing) or `postgres://USER@HOST[:PORT]/DATABASE`
/// (the database must exist).
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(std::sync::Arc::new(sqlite::SqliteStore::open(url).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(std::sync::Arc::new(postgres::PgStore::open(url).await?))
    } else {
        Err(StoreError::UnsupportedUrl {
            url: url.to_owned(),
            why: "expected sqlite://PATH or postgres://USER@HOST/DATABASE",
        })
    }
}
