//! The REST API under `/api/v1`, and `/healthz`.

use crate::AppState;
use crate::error::ApiError;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tessera_model::HostInfo;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/api/v1/hosts", get(list_hosts))
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
}

/// Liveness plus a store round trip, so a broken database shows as unhealthy.
async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    state.store.list_pools().await?;
    Ok(Json(Health { status: "ok" }))
}

#[derive(Serialize)]
struct HostList {
    hosts: Vec<HostInfo>,
}

async fn list_hosts(State(state): State<AppState>) -> Result<Json<HostList>, ApiError> {
    Ok(Json(HostList {
        hosts: state.store.list_hosts().await?,
    }))
}
