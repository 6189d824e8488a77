//! The REST API under `/api/v1` (JSON; described at `/api/v1/openapi.json`), the agent API
//! under `/agent/v1`, and `/healthz`. Handlers translate HTTP to `Control` calls and answer
//! typed bodies; each carries its `#[utoipa::path]`, from which [`openapi`] builds
//! the document.
//!
//! - `fleet`: hosts, pools, the join token. `workloads`: task definitions, services,
//!   placement preview, tasks, events, the live stream. `agents`: register and sync.
//! - `evidence`: fit verdicts, right-sizing, consolidation plans. `projects`: projects
//!   and their quotas.
//! - `bodies`: the API's own response bodies and its error body.

pub mod agents;
pub mod bodies;
pub mod evidence;
pub mod fleet;
pub mod notify;
pub mod openapi;
pub mod projects;
pub mod session;
pub mod streams;
pub mod strict;
pub mod workloads;

use crate::AppState;
use crate::auth::Declaration;
use crate::auth::Routes;
use crate::error::ApiError;
use agents::*;
use axum::Json;
use axum::extract::State;
use axum::response::IntoResponse;
use bodies::Health;
use evidence::*;
use fleet::*;
use notify::*;
use tessera_model::HostId;
use tessera_model::error::FieldError;
use utoipa_axum::routes;
use workloads::*;

/// A JSON body, read as its published schema reads it ([`strict`]), whose errors come back
/// as this API's JSON errors.
pub struct Body<T>(pub T);

pub use tessera_model::limits::http::MAX_AGENT_BODY;

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let Json(v) = Json::<serde_json::Value>::from_request(req, state).await?;
        strict::from_value(v).map(Body).map_err(|e| {
            ApiError::WrongShape(format!(
                "Failed to deserialize the JSON body into the target type: {e}"
            ))
        })
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

/// Two path segments (percent-decoded), as [`Segment`].
pub struct Segments(pub String, pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Segments {
    type Rejection = ApiError;
    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map(|p| Segments(p.0.0, p.0.1))
            .map_err(|e| ApiError::BadRequest(e.body_text()))
    }
}

/// Every REST route. Each handler's `#[utoipa::path]` is its one declaration: method, path,
/// documentation and the access it needs (the `x-access` extension: a
/// [`tessera_model::operations::Declaration`]). [`Routes::route`] reads them, guards the
/// route with that access (in the project its scope names) and adds the operation to the
/// OpenAPI document.
pub fn routes() -> Routes {
    Routes::default()
        .route(routes!(healthz))
        .route(routes!(metrics))
        .route(routes!(crate::api::openapi::spec))
        .route(routes!(crate::api::session::sign_in))
        .route(routes!(crate::api::session::who_am_i))
        .route(routes!(crate::api::session::sign_out_api))
        .route(routes!(crate::api::session::token_sign_in))
        .route(routes!(crate::api::session::sign_out_form))
        .route(routes!(list_hosts))
        .route(routes!(get_host))
        .route(routes!(delete_host))
        .route(routes!(drain_host))
        .route(routes!(activate_host))
        .route(routes!(revoke_host))
        .route(routes!(approve_host))
        .route(routes!(rotate_join_token))
        .route(routes!(list_join_tokens))
        .route(routes!(mint_join_token))
        .route(routes!(delete_join_token))
        .route(routes!(cluster))
        .route(routes!(list_pools))
        .route(routes!(create_pool))
        .route(routes!(update_pool))
        .route(routes!(list_machines))
        .route(routes!(projects::list_projects))
        .route(routes!(projects::create_project))
        .route(routes!(projects::get_project))
        .route(routes!(projects::replace_project))
        .route(routes!(projects::delete_project))
        .route(routes!(projects::set_member))
        .route(routes!(projects::remove_member))
        .route(routes!(projects::list_preemptions))
        .route(routes!(projects::approve_preemption))
        .route(routes!(projects::decline_preemption))
        .route(routes!(projects::project_usage))
        .route(routes!(list_families))
        .route(routes!(register_task_definition))
        .route(routes!(get_task_definition))
        .route(routes!(deregister_task_definition))
        .route(routes!(list_services))
        .route(routes!(create_service))
        .route(routes!(get_service))
        .route(routes!(update_service))
        .route(routes!(delete_service))
        .route(routes!(preview))
        .route(routes!(service_fit))
        .route(routes!(pool_fit))
        .route(routes!(service_work))
        .route(routes!(service_endpoints))
        .route(routes!(task_last_output))
        .route(routes!(prometheus_discovery))
        .route(routes!(right_size_proposal))
        .route(routes!(right_size))
        .route(routes!(list_plans))
        .route(routes!(plan_consolidation))
        .route(routes!(get_plan))
        .route(routes!(execute_plan))
        .route(routes!(cancel_plan))
        .route(routes!(list_tasks))
        .route(routes!(get_task))
        .route(routes!(list_webhooks))
        .route(routes!(create_webhook))
        .route(routes!(delete_webhook))
        .route(routes!(list_deliveries))
        .route(routes!(list_events))
        .route(routes!(live))
        .route(routes!(crate::api::session::list_tokens))
        .route(routes!(crate::api::session::create_token))
        .route(routes!(crate::api::session::delete_token))
        .route(routes!(crate::api::session::list_users))
        .route(routes!(crate::api::session::add_user))
        .route(routes!(crate::api::session::update_user))
        .route(routes!(crate::api::session::list_audit))
        .route(routes!(agent_register))
        .route(routes!(agent_sync))
        .route(routes!(streams::task_logs))
        .route(routes!(streams::task_exec))
        .route(routes!(streams::agent_stream_wait))
        .route(routes!(streams::agent_stream_outputs))
        .route(routes!(streams::agent_stream_output))
        .route(routes!(streams::agent_stream_end))
        .route(routes!(streams::agent_stream_input))
}

/// Liveness plus a store round trip, so a broken database shows as unhealthy.
#[utoipa::path(get, path = "/healthz", tag = "server",
    extensions(("x-access" = json!(Declaration::PUBLIC))),
    responses((status = 200, description = "The server and its store answer", body = Health)))]
pub async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    state.control.views().list_pools().await?;
    Ok(Json(Health {
        status: "ok".into(),
    }))
}

/// Prometheus metrics: the fleet's gauges (GPU memory and compute, tasks' measured use,
/// hosts, pending tasks, deployments) and the timings of passes, commits and syncs. Scrape
/// with a viewer's API token (`authorization: Bearer …`).
#[utoipa::path(get, path = "/metrics", tag = "server",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses(
        (status = 200, description = "Prometheus text exposition format", content_type = "text/plain", body = String),
        (status = 503, description = "This user has two scrapes in flight already", body = crate::api::bodies::ErrorBody),
    ))]
pub async fn metrics(
    State(state): State<AppState>,
    caller: Option<axum::Extension<tessera_model::auth::Caller>>,
) -> Result<impl IntoResponse, ApiError> {
    let user = caller.map(|axum::Extension(c)| c.name).unwrap_or_default();
    let body = state.metrics.body(&state.control, &user).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    ))
}

/// A host id from the path; one that cannot exist is simply not found.
fn host_id(raw: String) -> Result<HostId, ApiError> {
    HostId::new(raw).map_err(|e| ApiError::NotFound(e.to_string()))
}

/// A host id given as the query parameter `host`: one that cannot be a host id is invalid
/// input (`422`), as any other query parameter that breaks its rule; in a path it is `404`.
fn query_host(raw: Option<String>) -> Result<Option<HostId>, FieldError> {
    raw.map(|h| HostId::new(h).map_err(|e| field_error("host", e.to_string())))
        .transpose()
}

/// A query's `limit`: `default` when left out; above `max` (the maximum its schema
/// documents) is invalid input, not quietly lowered.
fn limit(given: Option<u32>, default: u32, max: u32) -> Result<u32, FieldError> {
    match given {
        None => Ok(default),
        Some(n) if n <= max => Ok(n),
        Some(n) => Err(field_error(
            "limit",
            format!("must be at most {max}, got {n}"),
        )),
    }
}

fn field_error(field: &str, message: String) -> FieldError {
    FieldError {
        field: field.into(),
        message,
    }
}
