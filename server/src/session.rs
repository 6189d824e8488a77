//! Signing in and out, API tokens, users and the audit log over REST.
//!
//! `POST /api/v1/session` takes JSON (`{"username","password"}`, answered with the user) or
//! the console's sign-in form (answered with a redirect), so signing in works before the
//! page's WASM has loaded.

use crate::AppState;
use crate::auth::{Authn, start_session};
use crate::error::ApiError;
use axum::Json;
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::Value;
use std::net::SocketAddr;
use tessera_control::store::AuditFilter;
use tessera_model::auth::{Caller, Role};
use tessera_model::urlenc::{encode, form_field};
use tower_sessions::Session;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignIn {
    username: String,
    password: String,
}

/// A page of the console to go to after signing in: a local path only, never another site.
fn local_path(next: Option<&str>) -> String {
    match next {
        Some(p) if p.starts_with('/') && !p.starts_with("//") && !p.contains('\\') => p.to_owned(),
        _ => "/".to_owned(),
    }
}

fn session_of(req: &Request) -> Result<Session, ApiError> {
    req.extensions()
        .get::<Session>()
        .cloned()
        .ok_or_else(|| ApiError::BadRequest("sessions are not available on this route".into()))
}

/// The caller the authentication layer found.
fn caller_of(authn: Option<&Authn>) -> Result<Caller, ApiError> {
    match authn {
        Some(Authn::Caller(c)) => Ok(c.clone()),
        _ => Err(ApiError::Unauthorized("sign in first".into())),
    }
}

pub async fn sign_in(State(state): State<AppState>, req: Request) -> Response {
    let session = match session_of(&req) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let address = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let form = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let body = match axum::body::to_bytes(req.into_body(), 64 * 1024).await {
        Ok(b) => b,
        Err(_) => return ApiError::BadRequest("the body is too large".into()).into_response(),
    };
    let (input, next) = if form {
        let text = String::from_utf8_lossy(&body);
        let field = |name: &str| form_field(&text, name);
        (
            SignIn {
                username: field("username").unwrap_or_default(),
                password: field("password").unwrap_or_default(),
            },
            Some(local_path(field("next").as_deref())),
        )
    } else {
        match serde_json::from_slice::<SignIn>(&body) {
            Ok(i) => (i, None),
            Err(e) => return ApiError::WrongShape(e.to_string()).into_response(),
        }
    };
    let outcome = state
        .control
        .sign_in(input.username.trim(), &input.password, address)
        .await;
    match (outcome, next) {
        (Ok((user, who)), next) => {
            if let Err(e) = start_session(&session, &who).await {
                return e.into_response();
            }
            state
                .control
                .audit(tessera_control::store::NewAuditEntry {
                    actor: format!("user {}", user.username),
                    action: "sign in".into(),
                    target: None,
                    address: address.map(|a| a.to_string()),
                })
                .await;
            match next {
                Some(page) => Redirect::to(&page).into_response(),
                None => Json(user).into_response(),
            }
        }
        (Err(e), Some(page)) => {
            let why = match ApiError::from(e) {
                ApiError::TooManyAttempts(secs) => format!("limited&retry={secs}"),
                ApiError::Unauthorized(_) => "wrong".into(),
                other => return other.into_response(),
            };
            Redirect::to(&format!("/sign-in?error={why}&next={}", encode(&page))).into_response()
        }
        (Err(e), None) => ApiError::from(e).into_response(),
    }
}

/// `GET /api/v1/session`: who is calling.
pub async fn who_am_i(req: Request) -> Result<Json<Caller>, ApiError> {
    Ok(Json(caller_of(req.extensions().get::<Authn>())?))
}

/// Ends the session (if any). A form post is sent to the sign-in page.
pub async fn sign_out(req: Request) -> Response {
    let form = req.method() == axum::http::Method::POST;
    if let Some(session) = req.extensions().get::<Session>()
        && let Err(e) = session.flush().await
    {
        return ApiError::session(e).into_response();
    }
    if form {
        Redirect::to("/sign-in").into_response()
    } else {
        StatusCode::NO_CONTENT.into_response()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenInput {
    name: String,
    #[serde(default)]
    role: Role,
    expires_in_days: Option<u32>,
}

/// `POST /api/v1/tokens`: the token's value is in this answer only.
pub async fn create_token(
    State(state): State<AppState>,
    axum::Extension(authn): axum::Extension<Authn>,
    crate::api::Body(input): crate::api::Body<TokenInput>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let caller = caller_of(Some(&authn))?;
    let token = state
        .control
        .create_api_token(&caller, &input.name, input.role, input.expires_in_days)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::to_value(token).expect("tokens serialize")),
    ))
}

pub async fn list_tokens(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        serde_json::json!({ "tokens": state.control.list_api_tokens().await? }),
    ))
}

pub async fn delete_token(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.control.delete_api_token(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn list_users(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        serde_json::json!({ "users": state.control.list_users().await? }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserInput {
    username: String,
    password: String,
    #[serde(default)]
    role: Role,
}

pub async fn add_user(
    State(state): State<AppState>,
    crate::api::Body(input): crate::api::Body<UserInput>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let user = state
        .control
        .add_user(&input.username, &input.password, input.role)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::to_value(user).expect("users serialize")),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserPatch {
    role: Option<Role>,
    disabled: Option<bool>,
    password: Option<String>,
}

pub async fn update_user(
    State(state): State<AppState>,
    Path(username): Path<String>,
    crate::api::Body(patch): crate::api::Body<UserPatch>,
) -> Result<Json<Value>, ApiError> {
    let user = state
        .control
        .update_user(
            &username,
            patch.role,
            patch.disabled,
            patch.password.as_deref(),
        )
        .await?;
    Ok(Json(serde_json::to_value(user).expect("users serialize")))
}

#[derive(Deserialize)]
pub struct AuditQuery {
    actor: Option<String>,
    q: Option<String>,
    before: Option<i64>,
    limit: Option<u32>,
}

pub async fn list_audit(
    State(state): State<AppState>,
    Query(q): Query<AuditQuery>,
) -> Result<Json<Value>, ApiError> {
    let entries = state
        .control
        .list_audit(&AuditFilter {
            actor: q.actor.filter(|s| !s.is_empty()),
            text: q.q.filter(|s| !s.is_empty()),
            before: q.before,
            limit: q.limit.unwrap_or(100).min(1000),
        })
        .await?;
    Ok(Json(serde_json::json!({ "entries": entries })))
}
