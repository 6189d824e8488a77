//! The agent API: a host registers with the join token, then syncs with its own token.

use super::Body;
use crate::AppState;
use crate::auth::Declaration;
use crate::error::ApiError;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tessera_model::agent::{RegisterRequest, RegisterResponse, SyncRequest, SyncResponse};

/// Register a host with the join token
#[utoipa::path(post, path = "/agent/v1/register", tag = "agents", request_body = RegisterRequest,
    extensions(("x-access" = json!(Declaration::AGENT))),
    responses(
        (status = 201, description = "Registered: the agent's token, shown once", body = RegisterResponse),
        (status = 401, description = "Wrong join token", body = crate::api::bodies::ErrorBody),
        (status = 409, description = "These GPUs belong to another host whose agent is still registered, or an agent version this server does not serve", body = crate::api::bodies::ErrorBody),
    ))]
pub async fn agent_register(
    State(state): State<AppState>,
    Body(req): Body<RegisterRequest>,
) -> Result<(StatusCode, Json<RegisterResponse>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(state.control.agents().register_agent(&req).await?),
    ))
}

/// The agent token from `Authorization: Bearer ...`.
fn bearer(headers: &HeaderMap) -> Result<&str, ApiError> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| ApiError::Unauthorized("missing Authorization: Bearer <agent token>".into()))
}

/// Report the host's state; the answer is every task it should run
#[utoipa::path(post, path = "/agent/v1/sync", tag = "agents", request_body = SyncRequest,
    extensions(("x-access" = json!(Declaration::AGENT))),
    responses(
        (status = 200, description = "The tasks to run", body = SyncResponse),
        (status = 409, description = "An agent version this server does not serve: the versions, and what to upgrade", body = crate::api::bodies::ErrorBody),
    ))]
pub async fn agent_sync(
    State(state): State<AppState>,
    headers: HeaderMap,
    checked: Option<axum::Extension<crate::edge::AgentHost>>,
    Body(req): Body<SyncRequest>,
) -> Result<Json<SyncResponse>, ApiError> {
    let started = std::time::Instant::now();
    let host = agent_of(&state, checked, &headers).await?;
    let answer = state.control.agents().sync_agent(&host, &req).await?;
    metrics::histogram!("tessera_agent_sync_seconds").record(started.elapsed().as_secs_f64());
    Ok(Json(answer))
}

/// The host an agent's request acts for: the one the edge checked its token for, else
/// (no edge in front) its token checked here.
pub(super) async fn agent_of(
    state: &AppState,
    checked: Option<axum::Extension<crate::edge::AgentHost>>,
    headers: &HeaderMap,
) -> Result<tessera_model::HostId, ApiError> {
    Ok(match checked {
        Some(axum::Extension(crate::edge::AgentHost(host))) => host,
        None => {
            state
                .control
                .agents()
                .authenticate_agent(bearer(headers)?)
                .await?
        }
    })
}
