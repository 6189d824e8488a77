//! `/api/v1/webhooks`: where notices go (admins), and each webhook's recent deliveries.

use super::{Body, Segment};
use crate::AppState;
use crate::auth::Declaration;
use crate::error::ApiError;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tessera_model::notify::{DeliveryList, WebhookCreated, WebhookInput, WebhookList};

/// A webhook's id from the path; one that is not a number names no webhook.
fn webhook_id(s: &str) -> Result<i64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::NotFound(format!("no webhook {s:?}")))
}

/// Webhooks
#[utoipa::path(get, path = "/api/v1/webhooks", tag = "notifications",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 200, description = "Webhooks (without their secrets)", body = WebhookList)))]
pub async fn list_webhooks(State(state): State<AppState>) -> Result<Json<WebhookList>, ApiError> {
    Ok(Json(WebhookList {
        webhooks: state.control.notifications().list_webhooks().await?,
    }))
}

/// Add a webhook: notices of its kinds (all when none are named), about its project, pool
/// or service when it names one, are posted to it, signed with the secret in the answer
/// (shown this once)
#[utoipa::path(post, path = "/api/v1/webhooks", tag = "notifications", request_body = WebhookInput,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 201, description = "Added, with its signing secret", body = WebhookCreated),
              (status = 409, description = "A webhook of that name exists", body = crate::api::bodies::ErrorBody)))]
pub async fn create_webhook(
    State(state): State<AppState>,
    Body(input): Body<WebhookInput>,
) -> Result<(StatusCode, Json<WebhookCreated>), ApiError> {
    let created = state.control.notifications().create_webhook(&input).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Delete a webhook and its deliveries
#[utoipa::path(delete, path = "/api/v1/webhooks/{id}", tag = "notifications",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("id" = i64, Path, description = "webhook id")),
    responses((status = 204, description = "Deleted"),
              (status = 404, description = "No such webhook", body = crate::api::bodies::ErrorBody)))]
pub async fn delete_webhook(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<StatusCode, ApiError> {
    state
        .control
        .notifications()
        .delete_webhook(webhook_id(&id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A webhook's latest deliveries, newest first: status, tries, the receiver's last answer
#[utoipa::path(get, path = "/api/v1/webhooks/{id}/deliveries", tag = "notifications",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("id" = i64, Path, description = "webhook id")),
    responses((status = 200, description = "Deliveries", body = DeliveryList),
              (status = 404, description = "No such webhook", body = crate::api::bodies::ErrorBody)))]
pub async fn list_deliveries(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<Json<DeliveryList>, ApiError> {
    Ok(Json(DeliveryList {
        deliveries: state
            .control
            .notifications()
            .deliveries(webhook_id(&id)?)
            .await?,
    }))
}
