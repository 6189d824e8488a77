//! The REST API under `/api/v1` (JSON; described at `/api/v1/openapi.json`), the agent API
//! under `/agent/v1`, and `/healthz`. Handlers translate HTTP to `Control` calls and answer
//! typed bodies; each carries its `#[utoipa::path]`, from which [`crate::openapi`] builds
//! the document.
//!
//! - `fleet`: hosts, pools, the join token. `workloads`: task definitions, services,
//!   placement preview, tasks, events, the live stream. `agents`: register and sync.
//! - `evidence`: fit verdicts, right-sizing, consolidation plans.
//! - `bodies`: the API's own response bodies and its error body.

pub mod agents;
pub mod bodies;
pub mod evidence;
pub mod fleet;
pub mod workloads;

use crate::AppState;
use crate::auth::{Access, Routes};
use crate::error::ApiError;
use agents::*;
use axum::Json;
use axum::extract::State;
use axum::http::Method;
use axum::response::IntoResponse;
use bodies::Health;
use evidence::*;
use fleet::*;
use tessera_model::HostId;
use tessera_model::auth::Role;
use workloads::*;

/// A JSON body whose parse errors come back as this API's JSON errors.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let Json(v) = Json::<T>::from_request(req, state).await?;
        Ok(Body(v))
    }
}

/// Query parameters whose parse errors come back as this API's JSON errors.
pub struct Params<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S>
    for Params<T>
{
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Params(q.0))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

/// A path segment (percent-decoded) whose errors come back as this API's JSON errors.
pub struct Segment(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Segment {
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|p| Segment(p.0))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

/// Every REST route, each with the access it needs (see [`crate::auth`]).
pub fn routes() -> Routes {
    const VIEW: Access = Access::Role(Role::Viewer);
    const OPERATE: Access = Access::Role(Role::Operator);
    const ADMIN: Access = Access::Role(Role::Admin);
    Routes::default()
        .add(Method::GET, "/healthz", Access::Public, healthz)
        .add(Method::GET, "/metrics", VIEW, metrics)
        .add(
            Method::GET,
            "/api/v1/openapi.json",
            Access::Public,
            crate::openapi::spec,
        )
        .add(
            Method::POST,
            "/api/v1/session",
            Access::Public,
            crate::session::sign_in,
        )
        .add(
            Method::GET,
            "/api/v1/session",
            VIEW,
            crate::session::who_am_i,
        )
        .add(
            Method::DELETE,
            "/api/v1/session",
            Access::Public,
            crate::session::sign_out_api,
        )
        .add(
            Method::POST,
            "/api/v1/session/token",
            Access::Public,
            crate::session::token_sign_in,
        )
        .add(
            Method::POST,
            "/api/v1/session/end",
            Access::Public,
            crate::session::sign_out_form,
        )
        .add(Method::GET, "/api/v1/hosts", VIEW, list_hosts)
        .add(Method::GET, "/api/v1/hosts/{id}", VIEW, get_host)
        .add(Method::DELETE, "/api/v1/hosts/{id}", ADMIN, delete_host)
        .add(
            Method::POST,
            "/api/v1/hosts/{id}/drain",
            OPERATE,
            drain_host,
        )
        .add(
            Method::POST,
            "/api/v1/hosts/{id}/activate",
            OPERATE,
            activate_host,
        )
        .add(
            Method::POST,
            "/api/v1/hosts/{id}/revoke",
            ADMIN,
            revoke_host,
        )
        .add(
            Method::POST,
            "/api/v1/hosts/{id}/approve",
            ADMIN,
            approve_host,
        )
        .add(Method::POST, "/api/v1/join-token", ADMIN, rotate_join_token)
        .add(Method::GET, "/api/v1/join-tokens", ADMIN, list_join_tokens)
        .add(Method::POST, "/api/v1/join-tokens", ADMIN, mint_join_token)
        .add(
            Method::DELETE,
            "/api/v1/join-tokens/{id}",
            ADMIN,
            delete_join_token,
        )
        .add(Method::GET, "/api/v1/cluster", VIEW, cluster)
        .add(Method::GET, "/api/v1/pools", VIEW, list_pools)
        .add(Method::POST, "/api/v1/pools", ADMIN, create_pool)
        .add(Method::PATCH, "/api/v1/pools/{name}", ADMIN, update_pool)
        .add(Method::GET, "/api/v1/task-definitions", VIEW, list_families)
        .add(
            Method::POST,
            "/api/v1/task-definitions",
            OPERATE,
            register_task_definition,
        )
        .add(
            Method::GET,
            "/api/v1/task-definitions/{id}",
            VIEW,
            get_task_definition,
        )
        .add(
            Method::DELETE,
            "/api/v1/task-definitions/{id}",
            OPERATE,
            deregister_task_definition,
        )
        .add(Method::GET, "/api/v1/services", VIEW, list_services)
        .add(Method::POST, "/api/v1/services", OPERATE, create_service)
        .add(Method::GET, "/api/v1/services/{name}", VIEW, get_service)
        .add(
            Method::PATCH,
            "/api/v1/services/{name}",
            OPERATE,
            update_service,
        )
        .add(
            Method::DELETE,
            "/api/v1/services/{name}",
            OPERATE,
            delete_service,
        )
        .add(Method::POST, "/api/v1/placement-preview", OPERATE, preview)
        .add(
            Method::GET,
            "/api/v1/services/{name}/fit",
            VIEW,
            service_fit,
        )
        .add(Method::GET, "/api/v1/fit", VIEW, pool_fit)
        .add(
            Method::GET,
            "/api/v1/services/{name}/work",
            VIEW,
            service_work,
        )
        .add(
            Method::GET,
            "/api/v1/services/{name}/endpoints",
            VIEW,
            service_endpoints,
        )
        .add(
            Method::GET,
            "/api/v1/discovery/prometheus",
            VIEW,
            prometheus_discovery,
        )
        .add(
            Method::GET,
            "/api/v1/services/{name}/right-size",
            VIEW,
            right_size_proposal,
        )
        .add(
            Method::POST,
            "/api/v1/services/{name}/right-size",
            OPERATE,
            right_size,
        )
        .add(Method::GET, "/api/v1/consolidation-plans", VIEW, list_plans)
        .add(
            Method::POST,
            "/api/v1/consolidation-plans",
            OPERATE,
            plan_consolidation,
        )
        .add(
            Method::GET,
            "/api/v1/consolidation-plans/{id}",
            VIEW,
            get_plan,
        )
        .add(
            Method::POST,
            "/api/v1/consolidation-plans/{id}/execute",
            OPERATE,
            execute_plan,
        )
        .add(
            Method::POST,
            "/api/v1/consolidation-plans/{id}/cancel",
            OPERATE,
            cancel_plan,
        )
        .add(Method::GET, "/api/v1/tasks", VIEW, list_tasks)
        .add(Method::GET, "/api/v1/events", VIEW, list_events)
        .add(Method::GET, "/api/v1/live", VIEW, live)
        .add(
            Method::GET,
            "/api/v1/tokens",
            ADMIN,
            crate::session::list_tokens,
        )
        .add(
            Method::POST,
            "/api/v1/tokens",
            ADMIN,
            crate::session::create_token,
        )
        .add(
            Method::DELETE,
            "/api/v1/tokens/{id}",
            VIEW,
            crate::session::delete_token,
        )
        .add(
            Method::GET,
            "/api/v1/users",
            ADMIN,
            crate::session::list_users,
        )
        .add(
            Method::POST,
            "/api/v1/users",
            ADMIN,
            crate::session::add_user,
        )
        .add(
            Method::PATCH,
            "/api/v1/users/{username}",
            ADMIN,
            crate::session::update_user,
        )
        .add(
            Method::GET,
            "/api/v1/audit",
            ADMIN,
            crate::session::list_audit,
        )
        .add(
            Method::POST,
            "/agent/v1/register",
            Access::Agent,
            agent_register,
        )
        .add(Method::POST, "/agent/v1/sync", Access::Agent, agent_sync)
}

/// Liveness plus a store round trip, so a broken database shows as unhealthy.
#[utoipa::path(get, path = "/healthz", tag = "server",
    responses((status = 200, description = "The server and its store answer", body = Health)))]
pub async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    state.control.list_pools().await?;
    Ok(Json(Health {
        status: "ok".into(),
    }))
}

/// Prometheus metrics: the fleet's gauges (GPU memory and compute, tasks' measured use,
/// hosts, pending tasks, deployments) and the timings of passes, commits and syncs. Scrape
/// with a viewer's API token (`authorization: Bearer …`).
#[utoipa::path(get, path = "/metrics", tag = "server",
    responses((status = 200, description = "Prometheus text exposition format", content_type = "text/plain", body = String)))]
pub async fn metrics(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let text = crate::metrics::render(&state.control).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    ))
}

/// A host id from the path; one that cannot exist is simply not found.
fn host_id(raw: String) -> Result<HostId, ApiError> {
    HostId::new(raw).map_err(|e| ApiError::NotFound(e.to_string()))
}
