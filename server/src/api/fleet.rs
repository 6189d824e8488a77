//! Hosts, pools and the join token.

use super::bodies::{HostDetail, HostList, JoinToken, JoinTokenList, MachineList, PoolList};
use super::{Body, Segment, host_id};
use crate::AppState;
use crate::auth::Declaration;
use crate::error::ApiError;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tessera_control::inputs::PoolInput;
use tessera_control::store::TaskFilter;
use tessera_model::auth::{JoinTokenInput, NewJoinToken};
use tessera_model::service::TaskState;
use tessera_model::views::ClusterView;
use tessera_model::{HostId, HostInfo, PoolInfo};

/// Every host with its GPUs
#[utoipa::path(get, path = "/api/v1/hosts", tag = "fleet",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Hosts", body = HostList)))]
pub async fn list_hosts(State(state): State<AppState>) -> Result<Json<HostList>, ApiError> {
    Ok(Json(HostList {
        hosts: state.control.views().list_hosts().await?,
    }))
}

/// One host and the tasks that hold capacity on it
#[utoipa::path(get, path = "/api/v1/hosts/{id}", tag = "fleet",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("id" = HostId, Path, description = "host id")),
    responses((status = 200, description = "Host", body = HostDetail), (status = 404, description = "No such host", body = crate::api::bodies::ErrorBody)))]
pub async fn get_host(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<Json<HostDetail>, ApiError> {
    let id = host_id(id)?;
    let host = state.control.views().get_host(&id).await?;
    let tasks = state
        .control
        .views()
        .list_tasks(&TaskFilter {
            host: Some(id),
            states: TaskState::HOLDING.to_vec(),
            ..Default::default()
        })
        .await?;
    Ok(Json(HostDetail { host, tasks }))
}

/// Drain a host: no new tasks; its tasks are replaced elsewhere first, then stopped
#[utoipa::path(post, path = "/api/v1/hosts/{id}/drain", tag = "fleet",
    extensions(("x-access" = json!(Declaration::OPERATE))),
    params(("id" = HostId, Path, description = "host id")),
    responses((status = 200, description = "Host", body = HostInfo), (status = 404, description = "No such host", body = crate::api::bodies::ErrorBody), (status = 409, description = "Not possible in the host's state", body = crate::api::bodies::ErrorBody)))]
pub async fn drain_host(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<Json<HostInfo>, ApiError> {
    let id = host_id(id)?;
    state.control.deployments().drain_host(&id).await?;
    Ok(Json(state.control.views().get_host(&id).await?))
}

/// Make a drained host active again
#[utoipa::path(post, path = "/api/v1/hosts/{id}/activate", tag = "fleet",
    extensions(("x-access" = json!(Declaration::OPERATE))),
    params(("id" = HostId, Path, description = "host id")),
    responses((status = 200, description = "Host", body = HostInfo), (status = 404, description = "No such host", body = crate::api::bodies::ErrorBody), (status = 409, description = "Not possible in the host's state", body = crate::api::bodies::ErrorBody)))]
pub async fn activate_host(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<Json<HostInfo>, ApiError> {
    let id = host_id(id)?;
    state.control.deployments().activate_host(&id).await?;
    Ok(Json(state.control.views().get_host(&id).await?))
}

/// Revoke the host's agent token: the agent must register again
#[utoipa::path(post, path = "/api/v1/hosts/{id}/revoke", tag = "fleet",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("id" = HostId, Path, description = "host id")),
    responses((status = 200, description = "Host", body = HostInfo), (status = 404, description = "No such host", body = crate::api::bodies::ErrorBody)))]
pub async fn revoke_host(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<Json<HostInfo>, ApiError> {
    let id = host_id(id)?;
    state.control.agents().revoke_host(&id).await?;
    Ok(Json(state.control.views().get_host(&id).await?))
}

/// Forget a host that holds no tasks
#[utoipa::path(delete, path = "/api/v1/hosts/{id}", tag = "fleet",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("id" = HostId, Path, description = "host id")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "No such host", body = crate::api::bodies::ErrorBody), (status = 409, description = "Tasks still hold capacity on it", body = crate::api::bodies::ErrorBody)))]
pub async fn delete_host(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<StatusCode, ApiError> {
    state.control.agents().delete_host(&host_id(id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The servers sharing the database, and which one schedules since when
#[utoipa::path(get, path = "/api/v1/cluster", tag = "fleet",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Servers", body = ClusterView)))]
pub async fn cluster(State(state): State<AppState>) -> Result<Json<ClusterView>, ApiError> {
    Ok(Json(state.control.cluster().await?))
}

/// A new join token, shown this once; the old one stops working at once
#[utoipa::path(post, path = "/api/v1/join-token", tag = "fleet",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 200, description = "Join token", body = JoinToken)))]
pub async fn rotate_join_token(State(state): State<AppState>) -> Result<Json<JoinToken>, ApiError> {
    Ok(Json(JoinToken {
        join_token: state.control.agents().rotate_join_token().await?,
    }))
}

/// Join tokens an admin minted, without their values
#[utoipa::path(get, path = "/api/v1/join-tokens", tag = "fleet",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 200, description = "Join tokens", body = JoinTokenList)))]
pub async fn list_join_tokens(
    State(state): State<AppState>,
) -> Result<Json<JoinTokenList>, ApiError> {
    Ok(Json(JoinTokenList {
        join_tokens: state.control.agents().list_join_tokens().await?,
    }))
}

/// Mint a join token for a pool, an expiry and a number of uses (or to rejoin one revoked host); its value is in this answer only
#[utoipa::path(post, path = "/api/v1/join-tokens", tag = "fleet", request_body = JoinTokenInput,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 201, description = "Minted", body = NewJoinToken), (status = 422, description = "Invalid scope", body = crate::api::bodies::ErrorBody)))]
pub async fn mint_join_token(
    State(state): State<AppState>,
    axum::Extension(authn): axum::Extension<crate::auth::Authn>,
    Body(input): Body<JoinTokenInput>,
) -> Result<(StatusCode, Json<NewJoinToken>), ApiError> {
    let caller = crate::api::session::caller_of(Some(&authn))?;
    let token = state
        .control
        .agents()
        .mint_join_token(&caller, &input)
        .await?;
    Ok((StatusCode::CREATED, Json(token)))
}

/// Delete a join token: hosts can no longer register with it (hosts it registered stay)
#[utoipa::path(delete, path = "/api/v1/join-tokens/{id}", tag = "fleet",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("id" = tessera_model::schema::JoinTokenId, Path, description = "join token id")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "No such join token", body = crate::api::bodies::ErrorBody)))]
pub async fn delete_join_token(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<StatusCode, ApiError> {
    state.control.agents().delete_join_token(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Approve a host held by its pool's manual admission: it takes tasks from now on
#[utoipa::path(post, path = "/api/v1/hosts/{id}/approve", tag = "fleet",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("id" = HostId, Path, description = "host id")),
    responses((status = 200, description = "Host", body = HostInfo), (status = 404, description = "No such host", body = crate::api::bodies::ErrorBody), (status = 409, description = "Not waiting for approval", body = crate::api::bodies::ErrorBody)))]
pub async fn approve_host(
    State(state): State<AppState>,
    axum::Extension(authn): axum::Extension<crate::auth::Authn>,
    Segment(id): Segment,
) -> Result<Json<HostInfo>, ApiError> {
    let caller = crate::api::session::caller_of(Some(&authn))?;
    let id = host_id(id)?;
    state.control.agents().approve_host(&caller, &id).await?;
    Ok(Json(state.control.views().get_host(&id).await?))
}

/// Change a pool's placement policy, limits, admission or what its tasks may ask of a host
#[utoipa::path(patch, path = "/api/v1/pools/{name}", tag = "fleet", request_body = tessera_model::api::PoolPatch,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("name" = tessera_model::PoolName, Path, description = "pool name")),
    responses((status = 200, description = "Changed", body = PoolInfo), (status = 404, description = "No such pool", body = crate::api::bodies::ErrorBody), (status = 422, description = "Invalid settings", body = crate::api::bodies::ErrorBody)))]
pub async fn update_pool(
    State(state): State<AppState>,
    Segment(name): Segment,
    Body(patch): Body<tessera_model::api::PoolPatch>,
) -> Result<Json<PoolInfo>, ApiError> {
    let name = tessera_model::PoolName::new(name)
        .map_err(|e| ApiError::NotFound(format!("no pool named {:?}", e.value)))?;
    Ok(Json(
        state
            .control
            .deployments()
            .update_pool(&name, &patch)
            .await?,
    ))
}

/// The machines a pool's capacity provider was asked for: booting, active and
/// terminating ones, then the last that ended (failed launches with why), newest first
#[utoipa::path(get, path = "/api/v1/pools/{name}/machines", tag = "fleet",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("name" = tessera_model::PoolName, Path, description = "pool name")),
    responses((status = 200, description = "Machines", body = MachineList), (status = 404, description = "No such pool", body = crate::api::bodies::ErrorBody)))]
pub async fn list_machines(
    State(state): State<AppState>,
    Segment(name): Segment,
) -> Result<Json<MachineList>, ApiError> {
    let name = tessera_model::PoolName::new(name)
        .map_err(|e| ApiError::NotFound(format!("no pool named {:?}", e.value)))?;
    if !state
        .control
        .views()
        .list_pools()
        .await?
        .iter()
        .any(|p| p.name == name)
    {
        return Err(ApiError::NotFound(format!(
            "no pool named {:?}",
            name.as_str()
        )));
    }
    Ok(Json(MachineList {
        machines: state
            .control
            .providers()
            .machines(Some(&name), true)
            .await?,
    }))
}

/// Pools and their placement policies
#[utoipa::path(get, path = "/api/v1/pools", tag = "fleet",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Pools", body = PoolList)))]
pub async fn list_pools(State(state): State<AppState>) -> Result<Json<PoolList>, ApiError> {
    Ok(Json(PoolList {
        pools: state.control.views().list_pools().await?,
    }))
}

/// Create a pool
#[utoipa::path(post, path = "/api/v1/pools", tag = "fleet", request_body = PoolInput,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 201, description = "Created", body = PoolInfo), (status = 409, description = "A pool of that name exists", body = crate::api::bodies::ErrorBody)))]
pub async fn create_pool(
    State(state): State<AppState>,
    Body(input): Body<PoolInput>,
) -> Result<(StatusCode, Json<PoolInfo>), ApiError> {
    let pool = state.control.deployments().create_pool(&input).await?;
    Ok((StatusCode::CREATED, Json(pool)))
}
