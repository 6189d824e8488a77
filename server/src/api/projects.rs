//! Projects (teams): their quotas per pool and what they use.

use super::bodies::{ErrorBody, ProjectList};
use super::{Body, Params, Segment, Segments};
use crate::AppState;
use crate::auth::Declaration;
use crate::error::ApiError;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use tessera_model::project::{MemberInput, Project, ProjectInput, ProjectSettings, ProjectView};

/// Every project with its quotas, and per pool what it uses, borrows and waits for
#[utoipa::path(get, path = "/api/v1/projects", tag = "projects",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Projects", body = ProjectList)))]
pub async fn list_projects(State(state): State<AppState>) -> Result<Json<ProjectList>, ApiError> {
    Ok(Json(ProjectList {
        projects: state.control.projects().list_projects().await?,
    }))
}

/// One project with its quotas and use
#[utoipa::path(get, path = "/api/v1/projects/{name}", tag = "projects",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("name" = tessera_model::schema::ProjectName, Path, description = "project name")),
    responses((status = 200, description = "Project", body = ProjectView), (status = 404, description = "No such project", body = ErrorBody)))]
pub async fn get_project(
    State(state): State<AppState>,
    Segment(name): Segment,
) -> Result<Json<ProjectView>, ApiError> {
    Ok(Json(state.control.projects().get_project(&name).await?))
}

/// Create a project. Guarantees in a pool, all projects' together, must fit in what its
/// hosts offer (`422` names the pool and the shortfall); limits may add up to more
#[utoipa::path(post, path = "/api/v1/projects", tag = "projects", request_body = ProjectInput,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 201, description = "Created", body = Project), (status = 409, description = "A project of that name exists", body = ErrorBody)))]
pub async fn create_project(
    State(state): State<AppState>,
    Body(input): Body<ProjectInput>,
) -> Result<(StatusCode, Json<Project>), ApiError> {
    let project = state.control.projects().create_project(&input).await?;
    Ok((StatusCode::CREATED, Json(project)))
}

/// Replace a project's weight and quotas
#[utoipa::path(put, path = "/api/v1/projects/{name}", tag = "projects", request_body = ProjectSettings,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("name" = tessera_model::schema::ProjectName, Path, description = "project name")),
    responses((status = 200, description = "Replaced", body = Project), (status = 404, description = "No such project", body = ErrorBody)))]
pub async fn replace_project(
    State(state): State<AppState>,
    Segment(name): Segment,
    Body(settings): Body<ProjectSettings>,
) -> Result<Json<Project>, ApiError> {
    Ok(Json(
        state
            .control
            .projects()
            .replace_project(&name, &settings)
            .await?,
    ))
}

/// Delete a project no service belongs to (`default` stays)
#[utoipa::path(delete, path = "/api/v1/projects/{name}", tag = "projects",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("name" = tessera_model::schema::ProjectName, Path, description = "project name")),
    responses((status = 204, description = "Deleted"), (status = 404, description = "No such project", body = ErrorBody), (status = 409, description = "Services belong to it, or it is `default`", body = ErrorBody)))]
pub async fn delete_project(
    State(state): State<AppState>,
    Segment(name): Segment,
) -> Result<StatusCode, ApiError> {
    state.control.projects().delete_project(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Give a user a role in a project (viewer or operator), replacing the one it had there:
/// an operator there manages the project's services whatever the user's fleet-wide role
#[utoipa::path(put, path = "/api/v1/projects/{name}/members/{username}", tag = "projects", request_body = MemberInput,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("name" = tessera_model::schema::ProjectName, Path, description = "project name"),
           ("username" = tessera_model::schema::Username, Path, description = "user")),
    responses((status = 200, description = "Given; the project as it is now", body = ProjectView), (status = 404, description = "No such project or user", body = ErrorBody)))]
pub async fn set_member(
    State(state): State<AppState>,
    Segments(name, username): Segments,
    Body(input): Body<MemberInput>,
) -> Result<Json<ProjectView>, ApiError> {
    state
        .control
        .projects()
        .set_project_member(&name, &username, input.role.into())
        .await?;
    Ok(Json(state.control.projects().get_project(&name).await?))
}

/// Take a user's role in a project away (its fleet-wide role stays)
#[utoipa::path(delete, path = "/api/v1/projects/{name}/members/{username}", tag = "projects",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("name" = tessera_model::schema::ProjectName, Path, description = "project name"),
           ("username" = tessera_model::schema::Username, Path, description = "user")),
    responses((status = 204, description = "Taken away"), (status = 404, description = "The user has no role in the project", body = ErrorBody)))]
pub async fn remove_member(
    State(state): State<AppState>,
    Segments(name, username): Segments,
) -> Result<StatusCode, ApiError> {
    state
        .control
        .projects()
        .remove_project_member(&name, &username)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PreemptionQuery {
    /// Only preemptions this project took room in or lost tasks to.
    #[param(value_type = Option<tessera_model::schema::ProjectName>)]
    project: Option<String>,
    /// At most this many (default 50).
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<u32>,
}

/// Preemptions carried out, newest first: who took room, on which host, and the tasks it
/// stopped
#[utoipa::path(get, path = "/api/v1/preemptions", tag = "projects", params(PreemptionQuery),
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Preemptions", body = tessera_model::bodies::PreemptionList)))]
pub async fn list_preemptions(
    State(state): State<AppState>,
    Params(q): Params<PreemptionQuery>,
) -> Result<Json<tessera_model::bodies::PreemptionList>, ApiError> {
    let limit = super::limit(q.limit, 50, 1000).map_err(|e| ApiError::Invalid(vec![e]))?;
    Ok(Json(tessera_model::bodies::PreemptionList {
        preemptions: state
            .control
            .projects()
            .list_preemptions(q.project.as_deref(), limit)
            .await?,
    }))
}

#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// `hour`, `day` (default) or `week`.
    #[param(pattern = "^(hour|day|week)$")]
    range: Option<String>,
}

/// What a project held in each pool over time (sampled every 5 minutes), with each pool's
/// capacity now: what fair share compares over its last hour
#[utoipa::path(get, path = "/api/v1/projects/{name}/usage", tag = "projects", params(
        ("name" = tessera_model::schema::ProjectName, Path, description = "project name"),
        UsageQuery),
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Use over time", body = tessera_model::project::UsageHistory), (status = 404, description = "No such project", body = ErrorBody)))]
pub async fn project_usage(
    State(state): State<AppState>,
    Segment(name): Segment,
    Params(q): Params<UsageQuery>,
) -> Result<Json<tessera_model::project::UsageHistory>, ApiError> {
    Ok(Json(
        state
            .control
            .projects()
            .project_usage_history(Some(&name), q.range.as_deref().unwrap_or("day"))
            .await?,
    ))
}

fn preemption_id(raw: &str) -> Result<i64, ApiError> {
    raw.parse()
        .map_err(|_| ApiError::NotFound(format!("no preemption {raw:?}")))
}

/// Approve a proposed preemption (a pool whose preemption is `approve`): its victims still
/// running stop, and the waiting task it was made for takes the room on a later pass
#[utoipa::path(post, path = "/api/v1/preemptions/{id}/approve", tag = "projects",
    extensions(("x-access" = json!(Declaration::OPERATE))),
    params(("id" = i64, Path, description = "preemption id")),
    responses((status = 204, description = "Approved: its victims stop"), (status = 404, description = "No such preemption", body = ErrorBody), (status = 409, description = "Not proposed, or its task no longer waits", body = ErrorBody)))]
pub async fn approve_preemption(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<StatusCode, ApiError> {
    state
        .control
        .scheduler()
        .approve_preemption(preemption_id(&id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Decline a proposed preemption: nothing stops, and its task proposes no other
#[utoipa::path(post, path = "/api/v1/preemptions/{id}/decline", tag = "projects",
    extensions(("x-access" = json!(Declaration::OPERATE))),
    params(("id" = i64, Path, description = "preemption id")),
    responses((status = 204, description = "Declined"), (status = 404, description = "No such preemption", body = ErrorBody), (status = 409, description = "Not proposed", body = ErrorBody)))]
pub async fn decline_preemption(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<StatusCode, ApiError> {
    state
        .control
        .scheduler()
        .decline_preemption(preemption_id(&id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
