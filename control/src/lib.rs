//! Tessera's control plane: the store that holds the fleet's state, and the logic on top of
//! it that the HTTP server, the console and the agents call.
//!
//! # Layout
//! - [`store`]: the `Store` interface every backend implements ([`open`] picks one from
//!   a database URL).
//! - [`sqlite`]: the embedded SQLite backend (the default), with its migrations.
//! - [`postgres`]: the PostgreSQL backend, for several servers on one database.
//! - [`control`]: `Control`, the entry point: the parts it is made of, and the helpers every
//!   operation shares (the time, events, waking the loop).
//! - `config`: `ControlConfig`, the timings and limits.
//! - `workloads`: pools, task definitions and services as operators change them.
//! - `work`: the work applications complete (scraped by agents): a service's figures,
//!   interference estimates, deployment alarms and target-tracking autoscaling.
//! - `hosts`: operators' host operations (drain, activate).
//! - `preemption`: stopping lower-priority tasks that use borrowed capacity so that a
//!   waiting task of a project within its guarantee fits.
//! - [`projects`]: projects and their quotas: guarantees checked against pools, what each
//!   project uses, the limit the scheduler holds placements to.
//! - `run`: the reconcile loop (ticks, the lease, supervised passes).
//! - `cache`: the one bounded cache type every cache uses.
//! - `parts`: the parts `Control` is made of, each owning its state: scheduling, the agent
//!   gateway, membership (id, lease, clock), the passes' memory, accounts.
//! - `inventory_growth`: what of a sync's GPUs becomes capacity (bounded by what the host
//!   was admitted with; new GPUs wait for approval in manual pools).
//! - `lifecycle`: a host's status as a state machine (sync, drain, activate, silence).
//! - `plan`: what a service needs next (stops, starts, rollback), as a pure function.
//! - `reconcile`: one reconcile pass: lost hosts, migrations, services and deployments.
//! - [`capacity`]: the one place capacity is counted: a pool's hosts and what tasks hold,
//!   as the engine's snapshot; the commit's re-check and every usage figure come from it.
//! - [`clock`]: the control plane's time (the machine's, or a test's manual clock).
//! - `cluster`: several servers on one database: announcements, the scheduler lease and
//!   the fenced store its holder's passes write through; `Control::cluster`.
//! - `scheduler`: placement against the live fleet through `tessera-placement` (priority,
//!   fair share, project limits), commits that re-check capacity; its pure steps (order,
//!   each service's batch, limits, ports) in `scheduler::steps`.
//! - [`auth`]: operators' accounts, sign-in limits, API tokens, session records, the audit
//!   log, and hosts' credentials (revoke, delete, rotate the join token).
//! - [`agents`]: the agent API, server side: join token, registration, sync.
//! - [`admission`]: how hosts join: join tokens (fleet-wide and minted), pools that hold
//!   new hosts for approval, rejoining a revoked host.
//! - `interference`: what sharing a GPU with another service costs it, estimated from its
//!   measured work (Welch's t-test on log p99).
//! - `serving`: endpoints (where each task is reached and whether it should get traffic)
//!   and Prometheus service discovery, as read models.
//! - `views`: read models of the console's pages (hosts with GPU segments, the overview,
//!   a service's tasks), as `Control` methods.
//! - [`usage`]: usage history: agents' measures gathered into buckets, written and pruned.
//! - `fit`: fit verdicts per task, service and pool, with what suggested budgets would free.
//! - `consolidate`: consolidation plans (moves that free GPUs or hosts) and their execution.
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
mod cluster;
mod config;
mod consolidate;
pub mod control;
pub mod error;
mod hosts;
pub mod inputs;
mod interference;
mod inventory_growth;
mod lifecycle;
mod parts;
mod plan;
pub mod postgres;
pub mod projects;
mod reconcile;
mod run;
mod scheduler;
pub mod sqlite;
pub mod store;
#[cfg(test)]
mod test_values;
#[cfg(feature = "testing")]
pub mod testkit;
pub mod views;
mod work;
mod workloads;

pub use agents::{admission, usage};
pub use config::ControlConfig;
pub use control::Control;
pub use error::{ControlError, StoreError};
pub use parts::{FleetSnapshot, GpuFigures, HostBlock};
pub use scheduler::{density, density_of};
pub use store::{AuthStore, Store};
/// A GPU's usage, as `density_of` reads it.
pub use tessera_placement::GpuUsage;
pub(crate) use views::fit;
pub use workloads::DEFAULT_POOL;

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
