//! Task definitions, services, the placement preview, tasks, events and the live stream.

use super::bodies::{
    EcsTaskDefinition, ErrorBody, EventList, FamilyList, RevisionList, ServiceList,
    TaskDefinitionAnswer, TaskDefinitionInput, TaskList,
};
use super::{Body, Params, Segment, Segments};
use crate::AppState;
use crate::auth::Declaration;
use crate::error::ApiError;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use tessera_control::inputs::{
    PreviewInput, PreviewResult, ServiceDetail, ServiceInput, ServicePatch,
};
use tessera_control::store::{EventFilter, TaskFilter};
use tessera_model::HostId;
use tessera_model::api::{EndpointList, PrometheusTargets, TaskDetail, TaskLastOutput};
use tessera_model::operations as ops;
use tessera_model::schema::{FamilyOrRef, ServiceName};
use tessera_model::service::{Service, TaskDefRef, TaskDefinition, TaskState};
use tessera_model::taskdef::{FieldError, to_ecs_json};
use utoipa::{IntoParams, ToSchema};

/// Register a task definition (Tessera's JSON or ECS's) as its family's next revision
#[utoipa::path(post, path = "/api/v1/task-definitions", tag = "workloads", request_body = TaskDefinitionInput,
    extensions(("x-access" = json!(Declaration::OPERATE))),
    responses((status = 201, description = "Registered", body = TaskDefinition)))]
pub async fn register_task_definition(
    State(state): State<AppState>,
    Body(input): Body<TaskDefinitionInput>,
) -> Result<(StatusCode, Json<TaskDefinition>), ApiError> {
    let def = state
        .control
        .deployments()
        .register_task_definition(&input.0)
        .await?;
    Ok((StatusCode::CREATED, Json(def)))
}

/// The newest revision of every family
#[utoipa::path(get, path = "/api/v1/task-definitions", tag = "workloads",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Families", body = FamilyList)))]
pub async fn list_families(State(state): State<AppState>) -> Result<Json<FamilyList>, ApiError> {
    Ok(Json(FamilyList {
        task_definitions: state
            .control
            .views()
            .list_task_definition_families()
            .await?,
    }))
}

/// The shape a described task definition comes in.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    #[default]
    Tessera,
    Ecs,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FormatQuery {
    /// `tessera` (the default) or `ecs`, for `family:revision`.
    #[param(value_type = Option<Format>)]
    format: Option<Format>,
}

/// A family's revisions (`{family}`), or one revision (`{family}:{revision}`)
#[utoipa::path(get, path = "/api/v1/task-definitions/{id}", tag = "workloads",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("id" = FamilyOrRef, Path, description = "family, or family:revision"), FormatQuery),
    responses((status = 200, description = "The revision (in the shape asked for), or the family's revisions", body = TaskDefinitionAnswer), (status = 404, description = "No such revision", body = ErrorBody)))]
pub async fn get_task_definition(
    State(state): State<AppState>,
    Segment(id): Segment,
    Params(q): Params<FormatQuery>,
) -> Result<Json<TaskDefinitionAnswer>, ApiError> {
    let control = &state.control;
    if id.contains(':') {
        let r: TaskDefRef = id
            .parse()
            .map_err(|e: tessera_model::service::TaskDefRefError| {
                ApiError::NotFound(e.to_string())
            })?;
        let def = control.views().get_task_definition(&r).await?;
        return Ok(Json(match q.format.unwrap_or_default() {
            Format::Tessera => TaskDefinitionAnswer::Revision(Box::new(def)),
            Format::Ecs => TaskDefinitionAnswer::Ecs(EcsTaskDefinition(to_ecs_json(&def.spec))),
        }));
    }
    Ok(Json(TaskDefinitionAnswer::Revisions(RevisionList {
        revisions: control.views().list_task_definition_revisions(&id).await?,
    })))
}

/// Deregister a revision: running tasks go on, no new ones start
#[utoipa::path(delete, path = "/api/v1/task-definitions/{id}", tag = "workloads",
    extensions(("x-access" = json!(Declaration::OPERATE))),
    params(("id" = TaskDefRef, Path, description = "family:revision")),
    responses((status = 200, description = "Deregistered", body = TaskDefinition), (status = 404, description = "No such revision", body = ErrorBody)))]
pub async fn deregister_task_definition(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<Json<TaskDefinition>, ApiError> {
    let r: TaskDefRef = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("DELETE needs family:revision, got {id:?}")))?;
    Ok(Json(
        state
            .control
            .deployments()
            .deregister_task_definition(&r)
            .await?,
    ))
}

/// Whether the caller may ask for the priority class it asks for
/// ([`tessera_model::project::may_set_class`], a rule the console's server functions share);
/// its role in the projects acted on the layer checked (`ops::CREATE_SERVICE`,
/// `ops::UPDATE_SERVICE`).
fn may_set_class(
    caller: &tessera_model::auth::Caller,
    priority: Option<tessera_model::inventory::PriorityClass>,
    changes_class: bool,
) -> Result<(), ApiError> {
    tessera_model::project::may_set_class(caller, priority, changes_class)
        .map_err(ApiError::Forbidden)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ServiceQuery {
    /// Only this project's services.
    #[param(value_type = Option<tessera_model::schema::ProjectName>)]
    project: Option<String>,
}

/// Every service (or one project's) with its task counts, deployments and recent events
#[utoipa::path(get, path = "/api/v1/services", tag = "workloads", params(ServiceQuery),
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Services", body = ServiceList)))]
pub async fn list_services(
    State(state): State<AppState>,
    Params(q): Params<ServiceQuery>,
) -> Result<Json<ServiceList>, ApiError> {
    let mut services = state.control.views().service_details().await?;
    if let Some(p) = &q.project {
        services.retain(|s| &s.service.project == p);
    }
    Ok(Json(ServiceList { services }))
}

/// Create a service: its tasks are placed at once
#[utoipa::path(post, path = "/api/v1/services", tag = "workloads", request_body = ServiceInput,
    extensions(("x-access" = json!(ops::CREATE_SERVICE))),
    responses((status = 201, description = "Created", body = Service), (status = 409, description = "A service of that name exists", body = ErrorBody)))]
pub async fn create_service(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<tessera_model::auth::Caller>,
    Body(input): Body<ServiceInput>,
) -> Result<(StatusCode, Json<Service>), ApiError> {
    // Only `production` takes room from others; `batch` and `default` an operator gives.
    may_set_class(&caller, input.priority, false)?;
    let s = state.control.deployments().create_service(&input).await?;
    Ok((StatusCode::CREATED, Json(s)))
}

/// One service with its task counts, deployments and recent events
#[utoipa::path(get, path = "/api/v1/services/{name}", tag = "workloads",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("name" = ServiceName, Path, description = "service")),
    responses((status = 200, description = "Service", body = ServiceDetail), (status = 404, description = "No such service", body = ErrorBody)))]
pub async fn get_service(
    State(state): State<AppState>,
    Segment(name): Segment,
) -> Result<Json<ServiceDetail>, ApiError> {
    Ok(Json(
        state.control.deployments().service_detail(&name).await?,
    ))
}

/// Where a service's tasks are reached, one entry per task and port, with whether each
/// should get traffic (`healthy`) or not (`starting`, `unhealthy`, `draining`)
#[utoipa::path(get, path = "/api/v1/services/{name}/endpoints", tag = "workloads",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("name" = ServiceName, Path, description = "service")),
    responses((status = 200, description = "Endpoints", body = EndpointList), (status = 404, description = "No such service", body = ErrorBody)))]
pub async fn service_endpoints(
    State(state): State<AppState>,
    Segment(name): Segment,
) -> Result<Json<EndpointList>, ApiError> {
    Ok(Json(state.control.views().endpoints(&name).await?))
}

/// How a task of the service ended, and the last lines it wrote (its agent sends them with
/// its stop report; kept once its host is gone). An operator in the service's project;
/// every read is audited
#[utoipa::path(get, path = "/api/v1/services/{name}/tasks/{task}/last-output", tag = "workloads",
    extensions(("x-access" = json!(ops::READ_SERVICE_OUTPUT))),
    params(("name" = ServiceName, Path, description = "service"),
           ("task" = String, Path, description = "task id")),
    responses((status = 200, description = "How it ended", body = TaskLastOutput),
              (status = 404, description = "No such service, or no such task of it", body = ErrorBody)))]
pub async fn task_last_output(
    State(state): State<AppState>,
    Segments(name, task): Segments,
) -> Result<Json<TaskLastOutput>, ApiError> {
    Ok(Json(
        state.control.views().task_last_output(&name, &task).await?,
    ))
}

/// Prometheus HTTP service discovery: every running task's port named `metrics`, labelled
/// with service, revision, task, host, GPU and pool
#[utoipa::path(get, path = "/api/v1/discovery/prometheus", tag = "workloads",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Target groups", body = Vec<PrometheusTargets>)))]
pub async fn prometheus_discovery(
    State(state): State<AppState>,
) -> Result<Json<Vec<PrometheusTargets>>, ApiError> {
    Ok(Json(state.control.views().prometheus_targets().await?))
}

/// Scale a service and/or deploy a new revision (rolling)
#[utoipa::path(patch, path = "/api/v1/services/{name}", tag = "workloads", request_body = ServicePatch,
    extensions(("x-access" = json!(ops::UPDATE_SERVICE))),
    params(("name" = ServiceName, Path, description = "service")),
    responses((status = 200, description = "Updated", body = Service), (status = 404, description = "No such service", body = ErrorBody), (status = 409, description = "The service is being deleted", body = ErrorBody)))]
pub async fn update_service(
    State(state): State<AppState>,
    axum::Extension(caller): axum::Extension<tessera_model::auth::Caller>,
    Segment(name): Segment,
    Body(patch): Body<ServicePatch>,
) -> Result<Json<Service>, ApiError> {
    may_set_class(&caller, patch.priority, true)?;
    Ok(Json(
        state
            .control
            .deployments()
            .update_service(&name, &patch)
            .await?,
    ))
}

/// Delete a service: it drains to zero tasks, then goes
#[utoipa::path(delete, path = "/api/v1/services/{name}", tag = "workloads",
    extensions(("x-access" = json!(ops::DELETE_SERVICE))),
    params(("name" = ServiceName, Path, description = "service")),
    responses((status = 202, description = "Draining"), (status = 404, description = "No such service", body = ErrorBody)))]
pub async fn delete_service(
    State(state): State<AppState>,
    Segment(name): Segment,
) -> Result<StatusCode, ApiError> {
    state.control.deployments().delete_service(&name).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Where `count` tasks would go now, and the packing before and after; nothing is stored
#[utoipa::path(post, path = "/api/v1/placement-preview", tag = "workloads", request_body = PreviewInput,
    extensions(("x-access" = json!(Declaration::OPERATE))),
    responses((status = 200, description = "Preview", body = PreviewResult)))]
pub async fn preview(
    State(state): State<AppState>,
    Body(input): Body<PreviewInput>,
) -> Result<Json<PreviewResult>, ApiError> {
    Ok(Json(state.control.scheduler().preview(&input).await?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskQuery {
    /// Only this service's tasks.
    service: Option<String>,
    /// Only tasks of this project's services.
    #[param(value_type = Option<tessera_model::schema::ProjectName>)]
    project: Option<String>,
    /// Only tasks on this host.
    #[param(value_type = Option<HostId>)]
    host: Option<String>,
    /// States, comma-separated.
    #[param(
        pattern = "^(pending|assigned|running|stopping|stopped)(,(pending|assigned|running|stopping|stopped))*$"
    )]
    state: Option<String>,
    /// At most this many (default 1000).
    #[param(minimum = 0, maximum = 10000)]
    limit: Option<u32>,
}

/// Tasks, filtered
#[utoipa::path(get, path = "/api/v1/tasks", tag = "workloads", params(TaskQuery),
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Tasks", body = TaskList)))]
pub async fn list_tasks(
    State(state): State<AppState>,
    Params(q): Params<TaskQuery>,
) -> Result<Json<TaskList>, ApiError> {
    let mut errors = Vec::new();
    let states = match q.state.as_deref() {
        None => vec![],
        Some(s) => s
            .split(',')
            .filter_map(|x| match x.parse::<TaskState>() {
                Ok(st) => Some(st),
                Err(e) => {
                    errors.push(FieldError {
                        field: "state".into(),
                        message: e.to_string(),
                    });
                    None
                }
            })
            .collect(),
    };
    let host = super::query_host(q.host)
        .map_err(|e| errors.push(e))
        .ok()
        .flatten();
    let limit = super::limit(q.limit, 1000, 10_000)
        .map_err(|e| errors.push(e))
        .unwrap_or_default();
    if !errors.is_empty() {
        return Err(ApiError::Invalid(errors));
    }
    let tasks = state
        .control
        .views()
        .list_tasks(&TaskFilter {
            service: q.service,
            project: q.project,
            host,
            states,
            limit: Some(limit),
            ..Default::default()
        })
        .await?;
    Ok(Json(TaskList { tasks }))
}

/// One task: its states, placement, health, budget and measured use, its deployment's
/// failures and the events that name it (its output is read apart, by operators)
#[utoipa::path(get, path = "/api/v1/tasks/{id}", tag = "workloads",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("id" = tessera_model::schema::TaskId, Path, description = "task id")),
    responses((status = 200, description = "The task", body = TaskDetail),
              (status = 404, description = "No such task", body = ErrorBody)))]
pub async fn get_task(
    State(state): State<AppState>,
    Segment(id): Segment,
) -> Result<Json<TaskDetail>, ApiError> {
    Ok(Json(state.control.views().task_detail(&id).await?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventQuery {
    /// Only this service's events.
    service: Option<String>,
    /// Only this host's events.
    #[param(value_type = Option<HostId>)]
    host: Option<String>,
    /// Only events that name this task.
    task: Option<String>,
    /// Only events with ids above this.
    after: Option<i64>,
    /// At most this many (default 100).
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<u32>,
}

/// Recent events, newest first
#[utoipa::path(get, path = "/api/v1/events", tag = "workloads", params(EventQuery),
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "Events", body = EventList)))]
pub async fn list_events(
    State(state): State<AppState>,
    Params(q): Params<EventQuery>,
) -> Result<Json<EventList>, ApiError> {
    let host = super::query_host(q.host)?;
    let limit = super::limit(q.limit, 100, 1000)?;
    let events = state
        .control
        .views()
        .list_events(&EventFilter {
            service: q.service,
            host,
            task: q.task,
            after: q.after,
            limit,
        })
        .await?;
    Ok(Json(EventList { events }))
}

/// Server-sent events: `change` whenever the fleet's state changed (bursts within 300 ms
/// are coalesced), so the console refreshes without a reload. At most
/// `AppState::live_slots` streams are open at once; past that, `503` (the console then
/// simply refreshes on navigation).
#[utoipa::path(get, path = "/api/v1/live", tag = "workloads",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "A stream of `change` events", content_type = "text/event-stream", body = crate::api::bodies::LiveEvent), (status = 503, description = "Too many streams are open", body = ErrorBody)))]
pub async fn live(
    State(state): State<AppState>,
    caller: Option<axum::Extension<tessera_model::auth::Caller>>,
    address: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
) -> Result<
    axum::response::sse::Sse<
        impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
    >,
    ApiError,
> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    use tokio::sync::broadcast::error::RecvError;
    // Per user and per address first: one viewer cannot hold every stream.
    let mine = match &caller {
        Some(axum::Extension(c)) => Some(state.live_users.enter(&c.name).ok_or_else(|| {
            ApiError::Unavailable(format!(
                "{} has {} live event streams open already; close one",
                c.name, state.limits.live_streams_per_user
            ))
        })?),
        None => None,
    };
    let here = match &address {
        Some(axum::Extension(axum::extract::ConnectInfo(a))) => {
            Some(state.live_addresses.enter(a.ip()).ok_or_else(|| {
                ApiError::Unavailable(format!(
                    "{} has {} live event streams open already; close one",
                    a.ip(),
                    state.limits.live_streams_per_address
                ))
            })?)
        }
        None => None,
    };
    let Ok(slot) = state.live_slots.clone().try_acquire_owned() else {
        return Err(ApiError::Unavailable(
            "too many live event streams are open; try again later".into(),
        ));
    };
    let slot = (slot, mine, here);
    let rx = state.control.subscribe();
    // The slot lives as long as the stream: a closed connection frees it.
    let stream = futures_util::stream::unfold((rx, slot), |(mut rx, slot)| async move {
        match rx.recv().await {
            Ok(_) | Err(RecvError::Lagged(_)) => {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                while rx.try_recv().is_ok() {}
                Some((Ok(Event::default().data("change")), (rx, slot)))
            }
            Err(RecvError::Closed) => None,
        }
    });
    Ok(Sse::new(futures_util::StreamExt::fuse(stream)).keep_alive(KeepAlive::default()))
}
