//! The REST API under `/api/v1` (JSON; described at `/api/v1/openapi.json`), the agent API
//! under `/agent/v1`, and `/healthz`. Handlers translate HTTP to `Control` calls.

use crate::AppState;
use crate::error::ApiError;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_control::inputs::{PoolInput, PreviewInput, ServiceInput, ServicePatch};
use tessera_control::store::{EventFilter, TaskFilter};
use tessera_model::agent::{RegisterRequest, SyncRequest};
use tessera_model::service::{TaskDefRef, TaskState};
use tessera_model::taskdef::to_ecs_json;
use tessera_model::{HostId, HostInfo};

/// A JSON body whose parse errors come back as this API's JSON errors.
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let Json(v) = Json::<T>::from_request(req, state).await?;
        Ok(Body(v))
    }
}

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/api/v1/openapi.json", get(crate::openapi::spec))
        .route("/api/v1/hosts", get(list_hosts))
        .route("/api/v1/hosts/{id}", get(get_host))
        .route("/api/v1/hosts/{id}/drain", post(drain_host))
        .route("/api/v1/hosts/{id}/activate", post(activate_host))
        .route("/api/v1/pools", get(list_pools).post(create_pool))
        .route(
            "/api/v1/task-definitions",
            get(list_families).post(register_task_definition),
        )
        .route(
            "/api/v1/task-definitions/{id}",
            get(get_task_definition).delete(deregister_task_definition),
        )
        .route("/api/v1/services", get(list_services).post(create_service))
        .route(
            "/api/v1/services/{name}",
            get(get_service)
                .patch(update_service)
                .delete(delete_service),
        )
        .route("/api/v1/placement-preview", post(preview))
        .route("/api/v1/tasks", get(list_tasks))
        .route("/api/v1/events", get(list_events))
        .route("/api/v1/live", get(live))
        .route("/agent/v1/register", post(agent_register))
        .route("/agent/v1/sync", post(agent_sync))
}

#[derive(Serialize)]
struct Health {
    status: &'static str,
}

/// Liveness plus a store round trip, so a broken database shows as unhealthy.
async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    state.control.store().list_pools().await?;
    Ok(Json(Health { status: "ok" }))
}

fn host_id(raw: String) -> Result<HostId, ApiError> {
    HostId::new(raw).map_err(|e| ApiError::NotFound(e.to_string()))
}

async fn list_hosts(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let hosts: Vec<HostInfo> = state.control.store().list_hosts().await?;
    Ok(Json(serde_json::json!({ "hosts": hosts })))
}

async fn get_host(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = host_id(id)?;
    let host = state.control.store().get_host(&id).await?;
    let tasks = state
        .control
        .store()
        .list_tasks(&TaskFilter {
            host: Some(id),
            states: vec![TaskState::Assigned, TaskState::Running, TaskState::Stopping],
            ..Default::default()
        })
        .await?;
    let mut v = serde_json::to_value(&host).expect("hosts serialize");
    v["tasks"] = serde_json::to_value(&tasks).expect("tasks serialize");
    Ok(Json(v))
}

async fn drain_host(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<HostInfo>, ApiError> {
    let id = host_id(id)?;
    state.control.drain_host(&id).await?;
    Ok(Json(state.control.store().get_host(&id).await?))
}

async fn activate_host(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<HostInfo>, ApiError> {
    let id = host_id(id)?;
    state.control.activate_host(&id).await?;
    Ok(Json(state.control.store().get_host(&id).await?))
}

async fn list_pools(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        serde_json::json!({ "pools": state.control.store().list_pools().await? }),
    ))
}

async fn create_pool(
    State(state): State<AppState>,
    Body(input): Body<PoolInput>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let pool = state.control.create_pool(&input).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::to_value(pool).expect("pools serialize")),
    ))
}

async fn register_task_definition(
    State(state): State<AppState>,
    Body(input): Body<Value>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let def = state.control.register_task_definition(&input).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::to_value(def).expect("definitions serialize")),
    ))
}

async fn list_families(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        serde_json::json!({ "task_definitions": state.control.store().list_task_definition_families().await? }),
    ))
}

#[derive(Deserialize)]
struct FormatQuery {
    format: Option<String>,
}

/// `{family}` lists its revisions; `{family}:{revision}` describes one.
async fn get_task_definition(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<FormatQuery>,
) -> Result<Json<Value>, ApiError> {
    let store = state.control.store();
    if id.contains(':') {
        let r: TaskDefRef = id
            .parse()
            .map_err(|e: tessera_model::service::TaskDefRefError| {
                ApiError::NotFound(e.to_string())
            })?;
        let def = store.get_task_definition(&r).await?;
        return match q.format.as_deref() {
            None | Some("tessera") => Ok(Json(
                serde_json::to_value(def).expect("definitions serialize"),
            )),
            Some("ecs") => Ok(Json(to_ecs_json(&def.spec))),
            Some(other) => Err(ApiError::Invalid(vec![
                tessera_model::taskdef::FieldError {
                    field: "format".into(),
                    message: format!("{other:?} is not a format: use ecs or tessera"),
                },
            ])),
        };
    }
    Ok(Json(
        serde_json::json!({ "revisions": store.list_task_definition_revisions(&id).await? }),
    ))
}

async fn deregister_task_definition(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let r: TaskDefRef = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("DELETE needs family:revision, got {id:?}")))?;
    let def = state.control.deregister_task_definition(&r).await?;
    Ok(Json(
        serde_json::to_value(def).expect("definitions serialize"),
    ))
}

async fn list_services(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let mut out = Vec::new();
    for s in state.control.store().list_services().await? {
        out.push(state.control.service_detail(&s.name).await?);
    }
    Ok(Json(serde_json::json!({ "services": out })))
}

async fn create_service(
    State(state): State<AppState>,
    Body(input): Body<ServiceInput>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let s = state.control.create_service(&input).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::to_value(s).expect("services serialize")),
    ))
}

async fn get_service(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        serde_json::to_value(state.control.service_detail(&name).await?)
            .expect("services serialize"),
    ))
}

async fn update_service(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Body(patch): Body<ServicePatch>,
) -> Result<Json<Value>, ApiError> {
    let s = state.control.update_service(&name, &patch).await?;
    Ok(Json(serde_json::to_value(s).expect("services serialize")))
}

async fn delete_service(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.control.delete_service(&name).await?;
    Ok(StatusCode::ACCEPTED)
}

async fn preview(
    State(state): State<AppState>,
    Body(input): Body<PreviewInput>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        serde_json::to_value(state.control.preview(&input).await?).expect("previews serialize"),
    ))
}

#[derive(Deserialize)]
struct TaskQuery {
    service: Option<String>,
    host: Option<String>,
    state: Option<String>,
    limit: Option<u32>,
}

async fn list_tasks(
    State(state): State<AppState>,
    Query(q): Query<TaskQuery>,
) -> Result<Json<Value>, ApiError> {
    let mut errors = Vec::new();
    let states = match q.state.as_deref() {
        None => vec![],
        Some(s) => s
            .split(',')
            .filter_map(|x| match x.parse::<TaskState>() {
                Ok(st) => Some(st),
                Err(e) => {
                    errors.push(tessera_model::taskdef::FieldError {
                        field: "state".into(),
                        message: e.to_string(),
                    });
                    None
                }
            })
            .collect(),
    };
    let host = match q.host {
        None => None,
        Some(h) => match HostId::new(h) {
            Ok(h) => Some(h),
            Err(e) => {
                errors.push(tessera_model::taskdef::FieldError {
                    field: "host".into(),
                    message: e.to_string(),
                });
                None
            }
        },
    };
    if !errors.is_empty() {
        return Err(ApiError::Invalid(errors));
    }
    let tasks = state
        .control
        .store()
        .list_tasks(&TaskFilter {
            service: q.service,
            host,
            states,
            limit: Some(q.limit.unwrap_or(1000).min(10_000)),
            ..Default::default()
        })
        .await?;
    Ok(Json(serde_json::json!({ "tasks": tasks })))
}

#[derive(Deserialize)]
struct EventQuery {
    service: Option<String>,
    host: Option<String>,
    after: Option<i64>,
    limit: Option<u32>,
}

async fn list_events(
    State(state): State<AppState>,
    Query(q): Query<EventQuery>,
) -> Result<Json<Value>, ApiError> {
    let host = q.host.map(host_id).transpose()?;
    let events = state
        .control
        .store()
        .list_events(&EventFilter {
            service: q.service,
            host,
            after: q.after,
            limit: q.limit.unwrap_or(100).min(1000),
        })
        .await?;
    Ok(Json(serde_json::json!({ "events": events })))
}

async fn agent_register(
    State(state): State<AppState>,
    Body(req): Body<RegisterRequest>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let resp = state.control.register_agent(&req).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::to_value(resp).expect("responses serialize")),
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

async fn agent_sync(
    State(state): State<AppState>,
    headers: HeaderMap,
    Body(req): Body<SyncRequest>,
) -> Result<Json<Value>, ApiError> {
    let host = state.control.authenticate_agent(bearer(&headers)?).await?;
    let resp = state.control.sync_agent(&host, &req).await?;
    Ok(Json(
        serde_json::to_value(resp).expect("responses serialize"),
    ))
}

/// `GET /api/v1/live`: server-sent events, one `change` message whenever the fleet's state
/// changed (bursts within 300 ms are coalesced), so the console refreshes without a reload.
async fn live(
    State(state): State<AppState>,
) -> axum::response::sse::Sse<
    impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    use tokio::sync::broadcast::error::RecvError;
    let rx = state.control.subscribe();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(_) | Err(RecvError::Lagged(_)) => {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                while rx.try_recv().is_ok() {}
                Some((Ok(Event::default().data("change")), rx))
            }
            Err(RecvError::Closed) => None,
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
