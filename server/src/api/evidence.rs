//! Fit evidence and consolidation: verdicts of measured use against budgets, right-sizing,
//! and consolidation plans.

use super::bodies::{ErrorBody, PlanList, RightSized};
use super::{Body, Params, Segment};
use crate::AppState;
use crate::auth::Declaration;
use crate::error::ApiError;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use tessera_model::consolidation::{ConsolidationPlan, PlanInput};
use tessera_model::fit::{PoolFit, RightSize, ServiceFit};
use tessera_model::schema::{PlanId, ServiceName};
use utoipa::IntoParams;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RangeQuery {
    /// The history's range: `hour` (the default), `day` or `month`.
    #[param(pattern = "^(hour|day|month)$")]
    range: Option<String>,
}

/// The work a service's applications complete: rates now (per second, per GPU-hour, per
/// GiB reserved), latency and errors over time, the latency target's verdict, what sharing
/// a GPU with each neighbour costs it (with the samples behind each estimate), its alarms
/// and its last autoscaling decision
#[utoipa::path(get, path = "/api/v1/services/{name}/work", tag = "evidence",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("name" = ServiceName, Path, description = "service"), RangeQuery),
    responses((status = 200, description = "Work", body = tessera_model::work::ServiceWork), (status = 404, description = "No such service", body = ErrorBody)))]
pub async fn service_work(
    State(state): State<AppState>,
    Segment(name): Segment,
    Params(q): Params<RangeQuery>,
) -> Result<Json<tessera_model::work::ServiceWork>, ApiError> {
    Ok(Json(
        state
            .control
            .deployments()
            .service_work(&name, q.range.as_deref().unwrap_or("hour"))
            .await?,
    ))
}

/// A service's fit: the verdict over its tasks' measured use with the numbers behind it, a
/// suggested budget, each task's verdict, and its usage history
#[utoipa::path(get, path = "/api/v1/services/{name}/fit", tag = "evidence",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("name" = ServiceName, Path, description = "service"), RangeQuery),
    responses((status = 200, description = "Fit", body = ServiceFit), (status = 404, description = "No such service", body = ErrorBody)))]
pub async fn service_fit(
    State(state): State<AppState>,
    Segment(name): Segment,
    Params(q): Params<RangeQuery>,
) -> Result<Json<ServiceFit>, ApiError> {
    Ok(Json(
        state
            .control
            .views()
            .service_fit(&name, q.range.as_deref().unwrap_or("hour"))
            .await?,
    ))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PoolQuery {
    /// The pool.
    #[param(max_length = 63, pattern = "^[a-z0-9][a-z0-9-]*$")]
    pool: String,
}

/// A pool's fit: tasks by verdict, GPU memory reserved against used, and what the pool
/// would hold with the suggested budgets (computed by the placement engine)
#[utoipa::path(get, path = "/api/v1/fit", tag = "evidence", params(PoolQuery),
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Fit", body = PoolFit), (status = 404, description = "No such pool", body = ErrorBody)))]
pub async fn pool_fit(
    State(state): State<AppState>,
    Params(q): Params<PoolQuery>,
) -> Result<Json<PoolFit>, ApiError> {
    Ok(Json(state.control.views().pool_fit(&q.pool).await?))
}

/// What right-sizing would register: the service's revision with the suggested GPU budget,
/// as a diff; nothing is stored
#[utoipa::path(get, path = "/api/v1/services/{name}/right-size", tag = "evidence",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("name" = ServiceName, Path, description = "service")),
    responses((status = 200, description = "The proposal", body = RightSize), (status = 404, description = "No such service", body = ErrorBody), (status = 409, description = "Nothing to right-size (no MPS slot, no evidence, or already at the suggestion)", body = ErrorBody)))]
pub async fn right_size_proposal(
    State(state): State<AppState>,
    Segment(name): Segment,
) -> Result<Json<RightSize>, ApiError> {
    Ok(Json(
        state.control.views().right_size_proposal(&name).await?,
    ))
}

/// Right-size in one step: register the proposal as a new revision and roll it out
#[utoipa::path(post, path = "/api/v1/services/{name}/right-size", tag = "evidence",
    extensions(("x-access" = json!(Declaration::OPERATE))),
    params(("name" = ServiceName, Path, description = "service")),
    responses((status = 201, description = "Registered and rolling out", body = RightSized), (status = 404, description = "No such service", body = ErrorBody), (status = 409, description = "Nothing to right-size", body = ErrorBody)))]
pub async fn right_size(
    State(state): State<AppState>,
    Segment(name): Segment,
) -> Result<(StatusCode, Json<RightSized>), ApiError> {
    let (proposal, task_definition) = state.control.deployments().right_size(&name).await?;
    Ok((
        StatusCode::CREATED,
        Json(RightSized {
            proposal,
            task_definition,
        }),
    ))
}

/// Plan consolidation: moves that free whole GPUs or hosts of a pool, honouring every
/// service's constraints and deployment limits; nothing is committed
#[utoipa::path(post, path = "/api/v1/consolidation-plans", tag = "evidence", request_body = PlanInput,
    extensions(("x-access" = json!(Declaration::OPERATE))),
    responses((status = 201, description = "Planned", body = ConsolidationPlan), (status = 404, description = "No such pool", body = ErrorBody)))]
pub async fn plan_consolidation(
    State(state): State<AppState>,
    Body(input): Body<PlanInput>,
) -> Result<(StatusCode, Json<ConsolidationPlan>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(
            state
                .control
                .deployments()
                .plan_consolidation(&input)
                .await?,
        ),
    ))
}

/// The newest consolidation plans
#[utoipa::path(get, path = "/api/v1/consolidation-plans", tag = "evidence",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Plans", body = PlanList)))]
pub async fn list_plans(State(state): State<AppState>) -> Result<Json<PlanList>, ApiError> {
    Ok(Json(PlanList {
        plans: state.control.deployments().consolidation_plans().await?,
    }))
}

/// One consolidation plan, with how far its execution got
#[utoipa::path(get, path = "/api/v1/consolidation-plans/{id}", tag = "evidence",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("id" = PlanId, Path, description = "plan id")),
    responses((status = 200, description = "Plan", body = ConsolidationPlan), (status = 404, description = "No such plan", body = ErrorBody)))]
pub async fn get_plan(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<Json<ConsolidationPlan>, ApiError> {
    Ok(Json(
        state.control.deployments().consolidation_plan(&id).await?,
    ))
}

/// Carry out a plan: one move at a time, each replacement running before its original
/// stops; halts on the first failure
#[utoipa::path(post, path = "/api/v1/consolidation-plans/{id}/execute", tag = "evidence",
    extensions(("x-access" = json!(Declaration::OPERATE))),
    params(("id" = PlanId, Path, description = "plan id")),
    responses((status = 202, description = "Executing", body = ConsolidationPlan), (status = 404, description = "No such plan", body = ErrorBody), (status = 409, description = "The plan is not in the planned state", body = ErrorBody)))]
pub async fn execute_plan(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<(StatusCode, Json<ConsolidationPlan>), ApiError> {
    Ok((
        StatusCode::ACCEPTED,
        Json(
            state
                .control
                .deployments()
                .execute_consolidation_plan(&id)
                .await?,
        ),
    ))
}

/// Cancel a plan: no further move starts (one under way finishes)
#[utoipa::path(post, path = "/api/v1/consolidation-plans/{id}/cancel", tag = "evidence",
    extensions(("x-access" = json!(Declaration::OPERATE))),
    params(("id" = PlanId, Path, description = "plan id")),
    responses((status = 200, description = "Cancelled", body = ConsolidationPlan), (status = 404, description = "No such plan", body = ErrorBody), (status = 409, description = "The plan already ended", body = ErrorBody)))]
pub async fn cancel_plan(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<Json<ConsolidationPlan>, ApiError> {
    Ok(Json(
        state
            .control
            .deployments()
            .cancel_consolidation_plan(&id)
            .await?,
    ))
}
