//! The REST API under `/api/v1` (JSON; described at `/api/v1/openapi.json`), the agent API
//! under `/agent/v1`, and `/healthz`. Handlers translate HTTP to `Control` calls.

use crate::AppState;
use crate::auth::{Access, Routes};
use crate::error::ApiError;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tessera_control::inputs::{PoolInput, PreviewInput, ServiceInput, ServicePatch};
use tessera_control::store::{EventFilter, TaskFilter};
use tessera_model::agent::{RegisterRequest, SyncRequest};
use tessera_model::auth::Role;
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

/// Every REST route, each with the access it needs (see [`crate::auth`]).
pub fn routes() -> Routes {
    const VIEW: Access = Access::Role(Role::Viewer);
    const OPERATE: Access = Access::Role(Role::Operator);
    const ADMIN: Access = Access::Role(Role::Admin);
    Routes::default()
        .add(Method::GET, "/healthz", Access::Public, healthz)
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
            crate::session::sign_out,
        )
        .add(
            Method::POST,
            "/api/v1/session/end",
            Access::Public,
            crate::session::sign_out,
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
        .add(Method::POST, "/api/v1/join-token", ADMIN, rotate_join_token)
        .add(Method::GET, "/api/v1/pools", VIEW, list_pools)
        .add(Method::POST, "/api/v1/pools", ADMIN, create_pool)
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
            ADMIN,
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

#[derive(Serialize)]
struct Health {
    status: &'static str,
}

/// Liveness plus a store round trip, so a broken database shows as unhealthy.
async fn healthz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    state.control.list_pools().await?;
    Ok(Json(Health { status: "ok" }))
}

fn host_id(raw: String) -> Result<HostId, ApiError> {
    HostId::new(raw).map_err(|e| ApiError::NotFound(e.to_string()))
}

async fn list_hosts(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let hosts: Vec<HostInfo> = state.control.list_hosts().await?;
    Ok(Json(serde_json::json!({ "hosts": hosts })))
}

async fn get_host(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = host_id(id)?;
    let host = state.control.get_host(&id).await?;
    let tasks = state
        .control
        .list_tasks(&TaskFilter {
            host: Some(id),
            states: TaskState::HOLDING.to_vec(),
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
    Ok(Json(state.control.get_host(&id).await?))
}

async fn activate_host(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<HostInfo>, ApiError> {
    let id = host_id(id)?;
    state.control.activate_host(&id).await?;
    Ok(Json(state.control.get_host(&id).await?))
}

async fn revoke_host(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<HostInfo>, ApiError> {
    let id = host_id(id)?;
    state.control.revoke_host(&id).await?;
    Ok(Json(state.control.get_host(&id).await?))
}

async fn delete_host(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.control.delete_host(&host_id(id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A new join token, shown this once; the old one stops working at once.
async fn rotate_join_token(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let token = state.control.rotate_join_token().await?;
    Ok(Json(serde_json::json!({ "join_token": token })))
}

async fn list_pools(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        serde_json::json!({ "pools": state.control.list_pools().await? }),
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
        serde_json::json!({ "task_definitions": state.control.list_task_definition_families().await? }),
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
    let control = &state.control;
    if id.contains(':') {
        let r: TaskDefRef = id
            .parse()
            .map_err(|e: tessera_model::service::TaskDefRefError| {
                ApiError::NotFound(e.to_string())
            })?;
        let def = control.get_task_definition(&r).await?;
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
        serde_json::json!({ "revisions": control.list_task_definition_revisions(&id).await? }),
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
    let out = state.control.service_details().await?;
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
/// At most `AppState::live_slots` streams are open at once; past that, `503` (the console
/// then simply refreshes on navigation).
async fn live(
    State(state): State<AppState>,
) -> Result<
    axum::response::sse::Sse<
        impl futures_util::Stream<Item = Result<axum::response::sse::Event, std::convert::Infallible>>,
    >,
    ApiError,
> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    use tokio::sync::broadcast::error::RecvError;
    let Ok(slot) = state.live_slots.clone().try_acquire_owned() else {
        return Err(ApiError::Unavailable(
            "too many live event streams are open; try again later".into(),
        ));
    };
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
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
