//! The shared vocabulary of Tessera: the words every other crate uses to talk about GPU
//! hosts, their devices and what runs on them.
//!
//! Nothing here does I/O, so the same types are used by the control plane, the agents and
//! the browser side of the console (this crate compiles to WASM).
//!
//! # Layout
//! - [`units`]: quantities with their unit in the type (`MiB`, `Percent`, `MilliCpu`, `ComputeMilli`).
//! - [`ids`]: identifiers (`HostId`, `GpuUuid`, `PoolName`) and their validation.
//! - [`inventory`]: hosts, GPUs, pools and their statuses, as the store and the API see them.
//! - [`service`]: services, deployments, tasks and their states, events.
//! - [`api`]: REST bodies the console shares: service and pool inputs, previews, service detail.
//! - [`consolidation`]: consolidation plans: moves that free GPUs or hosts.
//! - [`fit`]: fit evidence: verdicts of measured use against budgets, suggested budgets.
//! - [`error`]: `FieldError` and `ValidationErrors`, every validator's answer.
//! - [`project`]: projects (teams), their quotas per pool and what they use.
//! - [`provider`]: pools' capacity providers (kinds, settings and their validation, host
//!   shapes) and the machines asked of them.
//! - [`notify`]: notifications: their kinds, webhooks (their input and validation, body
//!   formats) and deliveries.
//! - [`auth`]: roles, operators' accounts, API tokens, callers and the audit log.
//! - [`operations`]: what each operation needs (role, project scope, audit), declared once
//!   and read by the router, the OpenAPI document, the console and the access tests.
//! - [`agent`]: the agent protocol (register, sync) spoken over `/agent/v1`.
//! - [`bounds`]: the bounds of a sync report, applied item by item by agent and server.
//! - [`version`]: this build's version and the compatibility policy between servers,
//!   agents and schemas.
//! - [`views`]: read models of the console's pages (hosts with GPU segments, overview).
//! - `schema` (feature `openapi`): the JSON Schemas of the API's bodies, with the validators' rules.
//! - [`validate`]: the rules of pool and service bodies (the server's and the browser's).
//! - [`urlenc`]: percent-encoding of query values and form fields.
//! - [`work`]: the work applications complete (Prometheus metrics), service objectives
//!   (latency target, alarms, autoscaling) and the read models built from them.
//! - [`taskdef`]: task definitions, their validation (errors name their field) and the ECS JSON shape.
//! - [`bodies`]: the REST API's own response bodies (wrapped lists, the error body).
//! - [`limits`]: the bounds requests and reports are checked against, each declared once.
//! - [`range`]: the time ranges histories are read over, parsed in one place.
//! - [`time`]: `Timestamp`, an instant compared as a time and written as RFC 3339.

#![forbid(unsafe_code)]
#![recursion_limit = "256"]

pub mod agent;
pub mod api;
pub mod auth;
pub mod bodies;
pub mod bounds;
pub mod consolidation;
pub mod error;
pub mod fit;
pub mod ids;
pub mod inventory;
pub mod limits;
pub mod notify;
pub mod operations;
pub mod project;
pub mod provider;
pub mod range;
#[cfg(feature = "openapi")]
pub mod schema;
pub mod service;
pub mod taskdef;
pub mod time;
pub mod units;
pub mod urlenc;
pub mod validate;
pub mod version;
pub mod views;
pub mod work;

pub use ids::{GpuUuid, HostId, IdError, PoolName};
pub use inventory::{
    Admission, GpuBudget, GpuHealth, GpuInfo, HostInfo, HostStatus, ParseEnumError, PendingGpu,
    PlacementPolicy, PoolInfo, PreemptionMode, SharingMode,
};
pub use units::{ComputeMilli, MiB, MilliCpu, Percent};
