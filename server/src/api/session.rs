//! Signing in and out, API tokens, users and the audit log over REST.
//!
//! `POST /api/v1/session` takes JSON (`{"username","password"}`, answered with the user) or
//! the console's sign-in form (answered with a redirect), so signing in works before the
//! page's WASM has loaded.

use crate::AppState;
use crate::api::bodies::{AuditList, ErrorBody, TokenList, UserList};
use crate::api::{Params, Segment};
use crate::auth::Declaration;
use crate::auth::{Authn, start_session};
use crate::error::ApiError;
use axum::Json;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use std::net::SocketAddr;
use tessera_control::store::AuditFilter;
use tessera_model::api::not_null;
use tessera_model::auth::{Caller, NewApiToken, Role, UserInfo};
use tessera_model::schema::Username;
use tessera_model::urlenc::{encode, form_field};
use tower_sessions::Session;

/// Credentials, as JSON.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    username: String,
    password: String,
}

/// The console's sign-in form: credentials, and the page to go to after. A field left
/// empty or out is refused like a wrong password (`303` back to the form).
#[derive(utoipa::ToSchema)]
pub struct SignInForm {
    username: Option<String>,
    password: Option<String>,
    /// A page of the console (a local path); anything else goes to `/`.
    next: Option<String>,
}

/// A page of the console to go to after signing in: a local path only, never another site.
/// Checked as a browser will read it: the URL parser drops tabs and newlines anywhere
/// (`/\t/evil.example` is `//evil.example`, another site) and treats `\` as `/`; any other
/// control character is refused.
fn local_path(next: Option<&str>) -> String {
    let Some(raw) = next else {
        return "/".to_owned();
    };
    let p: String = raw
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    let local = p.starts_with('/')
        && !p.starts_with("//")
        && !p.contains('\\')
        && !p.chars().any(char::is_control);
    if local { p } else { "/".to_owned() }
}

fn session_of(req: &Request) -> Result<Session, ApiError> {
    req.extensions()
        .get::<Session>()
        .cloned()
        .ok_or_else(|| ApiError::BadRequest("sessions are not available on this route".into()))
}

/// The caller the authentication layer found.
pub(crate) fn caller_of(authn: Option<&Authn>) -> Result<Caller, ApiError> {
    match authn {
        Some(Authn::Caller(c)) => Ok(c.clone()),
        _ => Err(ApiError::Unauthorized("sign in first".into())),
    }
}

/// Sign in: JSON gets the user and a session cookie; the console's form gets a redirect
#[utoipa::path(post, path = "/api/v1/session", tag = "session",
    extensions(("x-access" = json!(Declaration::PUBLIC))),
    request_body(content(
        (SignIn = "application/json"),
        (SignInForm = "application/x-www-form-urlencoded"),
    )),
    responses(
        (status = 200, description = "Signed in (JSON)", body = UserInfo),
        (status = 303, description = "Signed in, or refused, from the form: to the next page or back to the sign-in page"),
        (status = 401, description = "Wrong username or password", body = ErrorBody),
        (status = 429, description = "Too many failed sign-ins from this address (see Retry-After)", body = ErrorBody),
    ))]
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
        let f = SignInForm {
            username: field("username"),
            password: field("password"),
            next: field("next"),
        };
        (
            SignIn {
                username: f.username.unwrap_or_default(),
                password: f.password.unwrap_or_default(),
            },
            Some(local_path(f.next.as_deref())),
        )
    } else {
        let read = serde_json::from_slice(&body)
            .map_err(|e| e.to_string())
            .and_then(super::strict::from_value::<SignIn>);
        match read {
            Ok(i) => (i, None),
            Err(e) => return ApiError::WrongShape(e).into_response(),
        }
    };
    let outcome = state
        .control
        .accounts()
        .sign_in(input.username.trim(), &input.password, address)
        .await;
    match (outcome, next) {
        (Ok((user, who)), next) => {
            if let Err(e) = start_session(&session, &who).await {
                return e.into_response();
            }
            state
                .control
                .accounts()
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

/// Who is calling
#[utoipa::path(get, path = "/api/v1/session", tag = "session",
    extensions(("x-access" = json!(Declaration::VIEW))),
    responses((status = 200, description = "The caller", body = Caller)))]
pub async fn who_am_i(req: Request) -> Result<Json<Caller>, ApiError> {
    Ok(Json(caller_of(req.extensions().get::<Authn>())?))
}

/// Sign out: ends the session, if any
#[utoipa::path(delete, path = "/api/v1/session", tag = "session",
    extensions(("x-access" = json!(Declaration::PUBLIC))),
    responses((status = 204, description = "Signed out")))]
pub async fn sign_out_api(req: Request) -> Response {
    sign_out(req).await
}

/// Credentials for a token (the command line's login).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenSignIn {
    #[schema(min_length = 1, max_length = 64)]
    username: String,
    #[schema(min_length = 1, max_length = 1024)]
    password: String,
    /// What the token is for (e.g. `cli alice@laptop`).
    #[schema(min_length = 1, max_length = 100, pattern = "\\S")]
    name: String,
    /// Scope the token to this project, with your role there (at most operator). Left
    /// out: the whole fleet, with your fleet-wide role.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false, value_type = Option<tessera_model::schema::ProjectName>)]
    project: Option<String>,
    /// Left out: it does not expire.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false, minimum = 1, maximum = 3650)]
    expires_in_days: Option<u32>,
}

/// Sign in for an API token of your own role (what `tessera login` keeps); its value is in
/// this answer only
#[utoipa::path(post, path = "/api/v1/session/token", tag = "session", request_body = TokenSignIn,
    extensions(("x-access" = json!(Declaration::PUBLIC))),
    responses(
        (status = 201, description = "Made", body = NewApiToken),
        (status = 401, description = "Wrong username or password", body = ErrorBody),
        (status = 429, description = "Too many failed sign-ins from this address (see Retry-After)", body = ErrorBody),
    ))]
pub async fn token_sign_in(
    State(state): State<AppState>,
    address: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    crate::api::Body(input): crate::api::Body<TokenSignIn>,
) -> Result<(StatusCode, Json<NewApiToken>), ApiError> {
    let token = state
        .control
        .accounts()
        .token_for_sign_in(
            input.username.trim(),
            &input.password,
            address.map(|a| a.0.0.ip()),
            &input.name,
            tessera_control::auth::TokenScope {
                project: input.project.as_deref(),
                expires_in_days: input.expires_in_days,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(token)))
}

/// Sign out from the console's form: to the sign-in page
#[utoipa::path(post, path = "/api/v1/session/end", tag = "session",
    extensions(("x-access" = json!(Declaration::PUBLIC))),
    responses((status = 303, description = "To the sign-in page")))]
pub async fn sign_out_form(req: Request) -> Response {
    sign_out(req).await
}

/// Ends the session (if any). A form post is sent to the sign-in page.
async fn sign_out(req: Request) -> Response {
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

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenInput {
    /// What the token is for.
    #[schema(min_length = 1, max_length = 100, pattern = "\\S")]
    name: String,
    /// At most the caller's own role.
    #[serde(default)]
    #[schema(default = "viewer")]
    role: Role,
    /// Scope it to this project: it acts only there, with `role` (viewer or operator),
    /// and reads as a viewer elsewhere. Left out: the whole fleet.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false, value_type = Option<tessera_model::schema::ProjectName>)]
    project: Option<String>,
    /// Left out: it does not expire.
    #[serde(default, deserialize_with = "not_null")]
    #[schema(nullable = false, minimum = 1, maximum = 3650)]
    expires_in_days: Option<u32>,
}

/// Make an API token; its value is in this answer only
#[utoipa::path(post, path = "/api/v1/tokens", tag = "session", request_body = TokenInput,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 201, description = "Made", body = NewApiToken)))]
pub async fn create_token(
    State(state): State<AppState>,
    axum::Extension(authn): axum::Extension<Authn>,
    crate::api::Body(input): crate::api::Body<TokenInput>,
) -> Result<(StatusCode, Json<NewApiToken>), ApiError> {
    let caller = caller_of(Some(&authn))?;
    let token = state
        .control
        .accounts()
        .create_api_token(
            &caller,
            &input.name,
            input.role,
            input.project.as_deref(),
            input.expires_in_days,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(token)))
}

/// API tokens (never their values)
#[utoipa::path(get, path = "/api/v1/tokens", tag = "session",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 200, description = "Tokens", body = TokenList)))]
pub async fn list_tokens(State(state): State<AppState>) -> Result<Json<TokenList>, ApiError> {
    Ok(Json(TokenList {
        tokens: state.control.accounts().list_api_tokens().await?,
    }))
}

/// Delete an API token: it stops working at once. An admin may delete any; anyone else
/// the tokens they made (`tessera logout` deletes its own)
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", tag = "session",
    extensions(("x-access" = json!(Declaration::VIEW))),
    params(("id" = tessera_model::schema::TokenId, Path, description = "token id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "Someone else's token, and the caller is not an admin", body = ErrorBody),
        (status = 404, description = "No such token", body = ErrorBody),
    ))]
pub async fn delete_token(
    State(state): State<AppState>,
    axum::Extension(authn): axum::Extension<Authn>,
    Segment(id): Segment,
) -> Result<StatusCode, ApiError> {
    let caller = caller_of(Some(&authn))?;
    let tokens = state.control.accounts().list_api_tokens().await?;
    let Some(t) = tokens.iter().find(|t| t.id == id) else {
        return Err(ApiError::NotFound(format!("no API token {id}")));
    };
    let owner = caller.on_behalf_of.as_deref().unwrap_or(&caller.name);
    if caller.kind == tessera_model::auth::CallerKind::Token
        && !caller.role.allows(Role::Operator)
        && caller.token_id.as_deref() != Some(id.as_str())
    {
        // A read-only token changes nothing but itself (`tessera logout`).
        return Err(ApiError::Forbidden(
            "a viewer token may delete only itself; use a credential of at least the operator role"
                .into(),
        ));
    }
    if !caller.role.allows(Role::Admin) && t.created_by != owner {
        return Err(ApiError::Forbidden(
            "you may delete only the tokens you made; ask an admin".into(),
        ));
    }
    if !caller.role.allows(t.role) {
        // A credential mutates nothing above its own role: a viewer token its admin made
        // does not delete that admin's other tokens.
        return Err(ApiError::Forbidden(format!(
            "a {} credential cannot delete a {} token; use one of at least that role",
            caller.role, t.role
        )));
    }
    state.control.accounts().delete_api_token(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Operators' accounts
#[utoipa::path(get, path = "/api/v1/users", tag = "session",
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 200, description = "Users", body = UserList)))]
pub async fn list_users(State(state): State<AppState>) -> Result<Json<UserList>, ApiError> {
    Ok(Json(UserList {
        users: state.control.accounts().list_users().await?,
    }))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserInput {
    #[schema(schema_with = tessera_model::schema::name)]
    username: String,
    #[schema(schema_with = tessera_model::schema::password)]
    password: String,
    #[serde(default)]
    #[schema(default = "viewer")]
    role: Role,
}

/// Add a user
#[utoipa::path(post, path = "/api/v1/users", tag = "session", request_body = UserInput,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 201, description = "Added", body = UserInfo), (status = 409, description = "A user of that name exists", body = ErrorBody)))]
pub async fn add_user(
    State(state): State<AppState>,
    crate::api::Body(input): crate::api::Body<UserInput>,
) -> Result<(StatusCode, Json<UserInfo>), ApiError> {
    let user = state
        .control
        .accounts()
        .add_user(&input.username, &input.password, input.role)
        .await?;
    Ok((StatusCode::CREATED, Json(user)))
}

/// What to change about a user: at least one of the four.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserPatch {
    #[serde(default, deserialize_with = "not_null")]
    role: Option<Role>,
    #[serde(default, deserialize_with = "not_null")]
    disabled: Option<bool>,
    #[serde(default, deserialize_with = "not_null")]
    password: Option<String>,
    /// Delete the user's API tokens too (a password that leaked may have made some).
    #[serde(default, deserialize_with = "not_null")]
    revoke_tokens: Option<bool>,
}

// By hand: utoipa 5.5 writes `min_properties` out as `maxProperties`.
impl utoipa::PartialSchema for UserPatch {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        tessera_model::schema::from_json(serde_json::json!({
            "type": "object",
            "description": "What to change about a user: at least one of the four. `revoke_tokens`: delete the user's API tokens too.",
            "minProperties": 1,
            "additionalProperties": false,
            "properties": {
                "role": {"$ref": "#/components/schemas/Role"},
                "disabled": {"type": "boolean"},
                "password": tessera_model::schema::password(),
                "revoke_tokens": {"type": "boolean"},
            }
        }))
        .into()
    }
}
impl utoipa::ToSchema for UserPatch {}

/// Change a user's role, password or disabled flag (the last enabled admin stays)
#[utoipa::path(patch, path = "/api/v1/users/{username}", tag = "session", request_body = UserPatch,
    extensions(("x-access" = json!(Declaration::ADMIN))),
    params(("username" = Username, Path, description = "user")),
    responses((status = 200, description = "Changed", body = UserInfo), (status = 404, description = "No such user", body = ErrorBody), (status = 409, description = "It would leave no enabled admin", body = ErrorBody)))]
pub async fn update_user(
    State(state): State<AppState>,
    Segment(username): Segment,
    crate::api::Body(patch): crate::api::Body<UserPatch>,
) -> Result<Json<UserInfo>, ApiError> {
    let changes = patch.role.is_some() || patch.disabled.is_some() || patch.password.is_some();
    if !changes && patch.revoke_tokens.is_none() {
        return Err(tessera_control::ControlError::invalid(
            "(body)",
            "give role, disabled, password and/or revoke_tokens",
        )
        .into());
    }
    let user = if changes {
        state
            .control
            .accounts()
            .update_user(
                &username,
                patch.role,
                patch.disabled,
                patch.password.as_deref(),
            )
            .await?
    } else {
        state.control.accounts().get_user(&username).await?
    };
    if patch.revoke_tokens == Some(true) {
        let n = state
            .control
            .accounts()
            .revoke_user_tokens(&username)
            .await?;
        tracing::info!(user = %username, tokens = n, "API tokens revoked");
    }
    Ok(Json(user))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Who (a substring of the actor).
    actor: Option<String>,
    /// A substring of the action or target.
    q: Option<String>,
    /// Only entries with ids below this.
    before: Option<i64>,
    /// At most this many (default 100).
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<u32>,
}

/// Accepted changes, newest first
#[utoipa::path(get, path = "/api/v1/audit", tag = "session", params(AuditQuery),
    extensions(("x-access" = json!(Declaration::ADMIN))),
    responses((status = 200, description = "Entries", body = AuditList)))]
pub async fn list_audit(
    State(state): State<AppState>,
    Params(q): Params<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    let entries = state
        .control
        .accounts()
        .list_audit(&AuditFilter {
            actor: q.actor.filter(|s| !s.is_empty()),
            text: q.q.filter(|s| !s.is_empty()),
            before: q.before,
            limit: super::limit(q.limit, 100, 1000)?,
        })
        .await?;
    Ok(Json(AuditList { entries }))
}

#[cfg(test)]
mod tests {
    use super::local_path;

    #[test]
    fn next_is_a_local_path_as_a_browser_reads_it() {
        assert_eq!(
            local_path(Some("/services/web?range=day")),
            "/services/web?range=day"
        );
        for other_site in [
            "//evil.example",
            "/\\evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "\t//evil.example",
            "https://evil.example",
            "/\r\n/evil.example",
            "/\u{0}x",
        ] {
            assert_eq!(local_path(Some(other_site)), "/", "{other_site:?}");
        }
        assert_eq!(
            local_path(Some("/hosts\t")),
            "/hosts",
            "tabs dropped as the browser does"
        );
        assert_eq!(local_path(None), "/");
    }
}
