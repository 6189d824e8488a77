//! Who is calling and whether they may: the authentication layer in front of every route.
//!
//! - Callers prove who they are with a console session (a cookie from `tower-sessions`, its
//!   records stored through `Control`) or an API token (`Authorization: Bearer tsr_...`);
//!   agents use their own tokens on `/agent/v1`, checked by those handlers.
//! - Deny by default: REST routes can only be added through [`Routes::route`], which reads the
//!   [`Declaration`] the handler's `#[utoipa::path]` names (`x-access`) and refuses a handler
//!   without one; a server function without its declaration (`tessera_app::access::guard!`)
//!   is refused. Console pages need a session, except the sign-in page.
//! - An operation in a project ([`Access::InProject`]) is checked here against the project
//!   its declaration's scope names ([`scope`]): a service's, or the one a service is put
//!   into. Handlers never check a project's role.
//! - A state-changing request (a WebSocket's handshake included) that does not carry a
//!   bearer token must come from the console's own origin (`Sec-Fetch-Site` or
//!   `Origin`), and every request must name an allowed
//!   `Host` (against DNS rebinding).
//! - Every accepted mutation is written to the audit log: who, what, on what, from where;
//!   so is every read an operation declares audited ([`Audit::Always`]).

mod scope;
mod sessions;

use sessions::unix_now;
pub use sessions::{ControlSessions, session_layer, start_session};
use tessera_model::limits::http::MAX_BODY;

use crate::AppState;
use crate::error::ApiError;
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::OnceLock;
use tessera_control::Control;
use tessera_control::auth::SessionUser;
use tessera_control::store::NewAuditEntry;
use tessera_model::auth::{Caller, CallerKind};
use tessera_model::urlenc::form_field;
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{self, SessionStore};
use tower_sessions::{Expiry, Session, SessionManagerLayer};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};

/// Where the session keeps who signed in.
pub const SESSION_USER: &str = "user";
/// When the session was last used (unix seconds), refreshed at most once a minute.
const SESSION_SEEN: &str = "seen";
/// A console session ends after this long without a request...
pub const IDLE_TIMEOUT: time::Duration = time::Duration::hours(1);
/// ...and after this long in any case.
pub const ABSOLUTE_TIMEOUT_SECS: i64 = 12 * 3600;
/// The session cookie's name.
pub const SESSION_COOKIE: &str = "tessera_session";

pub use tessera_model::auth::Access;
pub use tessera_model::operations::{Audit, Declaration};

/// Settings of the layer, from the command line.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// Host names (without port) requests may name; `*` allows any.
    pub allowed_hosts: Vec<String>,
    /// Whether the server speaks HTTPS: session cookies are then `Secure`.
    pub tls: bool,
}

impl AuthSettings {
    /// The bind address's host and the names of loopback.
    pub fn for_bind(bind: SocketAddr, tls: bool) -> Self {
        let mut allowed_hosts = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
        ];
        if !bind.ip().is_unspecified() {
            allowed_hosts.push(bind.ip().to_string());
        }
        AuthSettings { allowed_hosts, tls }
    }

    fn host_allowed(&self, host: &str) -> bool {
        self.allowed_hosts
            .iter()
            .any(|h| h == "*" || h.eq_ignore_ascii_case(host))
    }
}

/// What the layer found out about the caller, for the routes' own checks.
#[derive(Debug, Clone)]
pub enum Authn {
    Caller(Caller),
    /// No credentials.
    Anonymous,
    /// An API token that is unknown, expired or revoked.
    BadToken,
}

impl Authn {
    fn caller(&self) -> Option<&Caller> {
        match self {
            Authn::Caller(c) => Some(c),
            _ => None,
        }
    }

    /// Whether the caller may do what `access` requires. For an operation in a project
    /// ([`Access::InProject`]), a caller with the role in some project passes here; the
    /// project acted on is checked next ([`scope::check`]).
    pub fn check(&self, access: Access) -> Result<(), ApiError> {
        let Some(needed) = access.role() else {
            return Ok(());
        };
        let has = |c: &Caller| match access {
            Access::InProject(_) => c.best_role(),
            _ => c.role,
        };
        match self {
            Authn::Caller(c) if has(c).allows(needed) => Ok(()),
            Authn::Caller(c) => Err(ApiError::Forbidden(format!(
                "this needs the {needed} role; {} has {}",
                c.actor(),
                has(c)
            ))),
            Authn::BadToken => Err(ApiError::Unauthorized(
                "the API token is unknown, expired or revoked".into(),
            )),
            Authn::Anonymous => Err(ApiError::Unauthorized(
                "sign in, or send Authorization: Bearer <API token>".into(),
            )),
        }
    }
}

/// One REST route and what it needs: the list the deny-by-default test walks.
#[derive(Debug, Clone)]
pub struct RouteRule {
    pub method: Method,
    pub path: String,
    pub declared: Declaration,
}

impl RouteRule {
    pub fn access(&self) -> Access {
        self.declared.access
    }
}

/// The REST router under construction, with the OpenAPI document of what it serves. A route
/// is added from its handler's `#[utoipa::path]`, which must name its declaration (the
/// `x-access` extension, `json!(Declaration::VIEW)` or `json!(ops::UPDATE_SERVICE)`): a
/// handler without one, or with one that cannot be enforced (a project role without a
/// scope, a scope naming a path parameter the path lacks), is a programming error and stops
/// the server before it serves anything.
#[derive(Default)]
pub struct Routes {
    router: OpenApiRouter<AppState>,
    rules: Vec<RouteRule>,
}

impl Routes {
    /// One handler, as `utoipa_axum::routes!(handler)` reads it.
    pub fn route(mut self, (schemas, paths, method_router): UtoipaMethodRouter<AppState>) -> Self {
        let mut found = Vec::new();
        for (path, item) in &paths.paths {
            for (method, op) in [
                (Method::GET, &item.get),
                (Method::POST, &item.post),
                (Method::PUT, &item.put),
                (Method::PATCH, &item.patch),
                (Method::DELETE, &item.delete),
            ] {
                let Some(op) = op else { continue };
                let raw = op.extensions.as_ref().and_then(|e| e.get("x-access"));
                let declared = match raw.map(|v| serde_json::from_value::<Declaration>(v.clone())) {
                    Some(Ok(declared)) => declared,
                    Some(Err(why)) => {
                        panic!("{method} {path}: its x-access {raw:?} is not a declaration: {why}")
                    }
                    None => panic!(
                        "{method} {path}: its #[utoipa::path] must declare extensions((\"x-access\" = json!(Declaration::VIEW))) or a declaration of tessera_model::operations"
                    ),
                };
                for sc in declared.scope.iter() {
                    if let Some(p) = sc.path_parameter() {
                        assert!(
                            path.contains(&format!("{{{p}}}")),
                            "{method} {path}: its scope reads {{{p}}}, which the path lacks"
                        );
                    }
                }
                found.push(RouteRule {
                    method,
                    path: path.clone(),
                    declared,
                });
            }
        }
        let [rule] = <[RouteRule; 1]>::try_from(found)
            .unwrap_or_else(|d| panic!("add one operation at a time, not {d:?}"));
        let declared = std::sync::Arc::new(rule.declared.clone());
        let method_router = method_router.route_layer(axum::middleware::from_fn(
            move |req: Request, next: Next| require(declared.clone(), req, next),
        ));
        self.router = self.router.routes((schemas, paths, method_router));
        self.rules.push(rule);
        self
    }

    pub fn rules(&self) -> &[RouteRule] {
        &self.rules
    }

    /// The router and the OpenAPI document of its operations.
    pub fn split(self) -> (Router<AppState>, utoipa::openapi::OpenApi) {
        self.router.split_for_parts()
    }

    pub fn into_router(self) -> Router<AppState> {
        self.split().0
    }
}

/// The route layer: refuses a caller without the access the route declares, in the project
/// its scope names; marks the answer of a read declared audited for [`authenticate`].
async fn require(declared: std::sync::Arc<Declaration>, req: Request, next: Next) -> Response {
    let authn = req
        .extensions()
        .get::<Authn>()
        .cloned()
        .unwrap_or(Authn::Anonymous);
    if let Err(e) = authn.check(declared.access) {
        return e.into_response();
    }
    let req = match rest_in_scope(&declared, req).await {
        Ok(req) => req,
        Err(e) => return e.into_response(),
    };
    let mut response = next.run(req).await;
    if declared.audit == Audit::Always {
        response.extensions_mut().insert(AuditedRead);
    }
    response
}

/// The answer of a read whose operation is declared [`Audit::Always`].
#[derive(Clone, Copy)]
struct AuditedRead;

/// The control plane, for the route layer's project checks.
#[derive(Clone)]
struct Projects(Control);

/// A REST request whose declaration has a scope: the caller's role in each project it
/// names, before the handler runs; the request as it came (its body read once).
async fn rest_in_scope(declared: &Declaration, req: Request) -> Result<Request, ApiError> {
    if declared.scope.is_empty() {
        return Ok(req);
    }
    let (caller, control) = match (
        req.extensions().get::<Caller>(),
        req.extensions().get::<Projects>(),
    ) {
        (Some(c), Some(p)) => (c.clone(), p.0.clone()),
        _ => return Err(ApiError::Unauthorized("sign in first".into())),
    };
    let (mut parts, body) = req.into_parts();
    let path = <axum::extract::Path<HashMap<String, String>> as axum::extract::FromRequestParts<
        (),
    >>::from_request_parts(&mut parts, &())
    .await
    .map(|p| p.0)
    .map_err(|e| ApiError::BadRequest(format!("the path {}: {e}", parts.uri.path())))?;
    let (body, bytes) = if scope::reads_body(declared) {
        let bytes = read_body(body).await?;
        let json = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::BadRequest(format!(
                "the body is not the JSON this operation reads: {e}"
            ))
        })?;
        (Some(json), bytes)
    } else {
        (None, read_body(body).await?)
    };
    scope::check(
        &control,
        &caller,
        declared,
        &scope::Arguments::Rest { path, body },
    )
    .await?;
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

async fn read_body(body: Body) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(format!("the body is larger than {MAX_BODY} bytes")))
}

pub use tessera_app::access::Rule as ServerFnRule;

/// Every server function of the console and what it needs, as each declares it beside
/// itself (`tessera_app::access`). A server function missing here is refused (the test walks
/// the registered ones).
pub fn server_fn_rules() -> &'static HashMap<&'static str, (String, &'static ServerFnRule)> {
    static RULES: OnceLock<HashMap<&'static str, (String, &'static ServerFnRule)>> =
        OnceLock::new();
    RULES.get_or_init(|| {
        let mut rules = HashMap::new();
        for r in tessera_app::access::rules() {
            if let Err(why) = r.declared.check() {
                panic!("server function {}: {why}", r.name);
            }
            let earlier = rules.insert(r.path, (r.function(), r));
            // Fail closed: one declaration must not quietly replace another.
            assert!(earlier.is_none(), "{} declares its access twice", r.path);
        }
        rules
    })
}

/// Paths served to anyone: the sign-in page, the WASM and CSS, static files.
fn is_public_asset(path: &str) -> bool {
    path == "/sign-in" || is_static_file(path)
}

/// The console's files: the WASM, scripts and styles under `/pkg/`, and files of `public/`
/// (a name with an extension). No API route, page or server function has a dot in its
/// last segment.
fn is_static_file(path: &str) -> bool {
    !path.starts_with("/api/")
        && !path.starts_with("/agent/")
        && (path.starts_with("/pkg/")
            || path
                .rsplit('/')
                .next()
                .is_some_and(|last| last.contains('.')))
}

/// What the request was sent to: the Host header (HTTP/1.1) or the URI's authority
/// (HTTP/2's :authority).
fn authority(req: &Request) -> Option<axum::http::uri::Authority> {
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse().ok())
        .or_else(|| req.uri().authority().cloned())
}

/// Whether a request that may carry the session cookie comes from the console's own pages;
/// `authority` is what the request was sent to (the Host header, or HTTP/2's :authority).
fn same_origin(headers: &HeaderMap, authority: &str, tls: bool) -> Result<(), &'static str> {
    if let Some(site) = headers.get("sec-fetch-site") {
        return match site.as_bytes() {
            b"same-origin" | b"none" => Ok(()),
            _ => Err("a cross-site request may not change anything"),
        };
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else {
        return Err(
            "a request signed in with a session must carry Origin; scripts should use an API token",
        );
    };
    let scheme = if tls { "https" } else { "http" };
    if origin.eq_ignore_ascii_case(&format!("{scheme}://{authority}")) {
        Ok(())
    } else {
        Err("a cross-origin request may not change anything")
    }
}

fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn client_address(req: &Request) -> Option<IpAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// The caller a bearer token (the `Authorization` header's value) or the session stands for.
async fn resolve(
    control: &Control,
    authorization: Option<String>,
    session: Option<Session>,
) -> Result<Authn, ApiError> {
    if let Some(auth) = authorization {
        let token = auth.strip_prefix("Bearer ").unwrap_or_default();
        if !token.starts_with(tessera_control::auth::API_TOKEN_PREFIX) {
            // An agent's token: its handlers check it.
            return Ok(Authn::Anonymous);
        }
        return Ok(match control.accounts().token_caller(token).await? {
            Some(c) => Authn::Caller(c),
            None => Authn::BadToken,
        });
    }
    let Some(session) = session else {
        return Ok(Authn::Anonymous);
    };
    let Ok(Some(user)) = session.get::<SessionUser>(SESSION_USER).await else {
        return Ok(Authn::Anonymous);
    };
    let now = unix_now();
    if now - user.signed_in_at > ABSOLUTE_TIMEOUT_SECS {
        let _ = session.flush().await;
        return Ok(Authn::Anonymous);
    }
    match control.accounts().session_caller(&user).await? {
        Some(caller) => {
            // Sliding idle expiry: a changed session is saved with a new expiry date.
            let seen: i64 = session.get(SESSION_SEEN).await.ok().flatten().unwrap_or(0);
            if now - seen >= 60 {
                let _ = session.insert(SESSION_SEEN, now).await;
            }
            Ok(Authn::Caller(caller))
        }
        None => {
            let _ = session.flush().await;
            Ok(Authn::Anonymous)
        }
    }
}

/// The layer every request passes: allowed host, caller, cross-site check, server
/// functions' and pages' access, and the audit log.
pub async fn authenticate(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let authority = match authority(&req) {
        Some(a)
            if state
                .auth
                .host_allowed(a.host().trim_start_matches('[').trim_end_matches(']')) =>
        {
            a
        }
        other => {
            tracing::warn!(host = ?other, "request for a host name this server does not serve");
            return ApiError::BadRequest(
                "the Host header names no host this server serves (see --allowed-hosts)".into(),
            )
            .into_response();
        }
    };
    // The console's own files (its WASM, scripts, styles) are everyone's, and never wait
    // on the database: a session is not looked up for them (or written back). A page
    // whose scripts wait behind a busy database fails to load, and the WASM that loads
    // them stops the page.
    if is_safe(req.method()) && is_static_file(req.uri().path()) {
        req.extensions_mut().insert(Authn::Anonymous);
        return next.run(req).await;
    }
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let session = req.extensions().get::<Session>().cloned();
    let authn = match resolve(&state.control, authorization, session).await {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let bearer = req.headers().contains_key(header::AUTHORIZATION);
    // A WebSocket (exec) acts, whatever its method: browsers open one to any site with
    // that site's cookies, so it must come from the console's own origin too.
    let websocket = req
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if (!is_safe(&method) || websocket) && !bearer {
        // Without a bearer token the browser may have attached the session cookie.
        let signed_in = matches!(&authn, Authn::Caller(c) if c.kind == CallerKind::Session);
        let browser = req.headers().contains_key("sec-fetch-site")
            || req.headers().contains_key(header::ORIGIN);
        if (signed_in || browser)
            && let Err(why) = same_origin(req.headers(), authority.as_str(), state.auth.tls)
        {
            tracing::warn!(%method, %path, "cross-site request refused: {why}");
            return ApiError::Forbidden(why.into()).into_response();
        }
    }
    let server_fn = if path.starts_with("/api/") && !path.starts_with("/api/v1/") {
        let Some((name, rule)) = server_fn_rules().get(path.as_str()) else {
            return ApiError::Forbidden(format!("{path} has no access rule")).into_response();
        };
        if let Err(e) = authn.check(rule.declared.access) {
            return refuse_server_fn(e);
        }
        Some((name, *rule))
    } else {
        None
    };
    let is_page = server_fn.is_none()
        && !path.starts_with("/api/")
        && !path.starts_with("/agent/")
        && path != "/healthz"
        && path != "/metrics"
        && !is_public_asset(&path);
    if is_page && authn.caller().is_none() {
        let next_page = req
            .uri()
            .path_and_query()
            .map_or("/".to_owned(), |p| p.to_string());
        return Redirect::to(&format!(
            "/sign-in?next={}",
            tessera_model::urlenc::encode(&next_page)
        ))
        .into_response();
    }
    if let Some(c) = authn.caller() {
        // For the console's server functions and pages, which see the model's type only.
        req.extensions_mut().insert(c.clone());
    }
    req.extensions_mut().insert(Projects(state.control.clone()));
    let actor = authn.caller().map(Caller::actor);
    req.extensions_mut().insert(authn);
    let Some(actor) = actor else {
        return next.run(req).await;
    };
    let address = client_address(&req);
    let changes = !is_safe(&method);
    let scoped_fn = server_fn.filter(|(_, r)| !r.declared.scope.is_empty());
    // Read the body once (to name the target in the audit log, and for a server function in
    // a project to find the project), then pass it on.
    let (req, target) = if changes || scoped_fn.is_some() {
        let (parts, body) = req.into_parts();
        let bytes = match read_body(body).await {
            Ok(b) => b,
            Err(e) => return e.into_response(),
        };
        if let Some((name, rule)) = scoped_fn
            && let Err(e) = server_fn_in_scope(&state.control, &parts, &bytes, name, rule).await
        {
            return refuse_server_fn(e);
        }
        let target = audit_target(&path, &bytes);
        (Request::from_parts(parts, Body::from(bytes)), target)
    } else {
        (req, audit_target(&path, &[]))
    };
    let declared_audited = match server_fn {
        Some((_, r)) => r.declared.audited(changes),
        None => changes,
    };
    let response = next.run(req).await;
    let audited = declared_audited || response.extensions().get::<AuditedRead>().is_some();
    if audited && (response.status().is_success() || response.status().is_redirection()) {
        let action = match server_fn {
            Some((name, _)) => format!("server function {name}"),
            None => format!("{method} {path}"),
        };
        state
            .control
            .accounts()
            .audit(NewAuditEntry {
                actor,
                action,
                target,
                address: address.map(|a| a.to_string()),
            })
            .await;
    }
    response
}

/// A server function whose declaration has a scope: the caller's role in each project it
/// names, from the arguments as the function's own decoder reads them (its query and body,
/// whatever the request's content type says).
async fn server_fn_in_scope(
    control: &Control,
    parts: &axum::http::request::Parts,
    bytes: &[u8],
    name: &str,
    rule: &ServerFnRule,
) -> Result<(), ApiError> {
    let caller = parts
        .extensions
        .get::<Caller>()
        .ok_or_else(|| ApiError::Unauthorized("sign in first".into()))?;
    let query = parts.uri.query().unwrap_or_default();
    let args = (rule.arguments)(query, bytes).map_err(|e| {
        ApiError::BadRequest(format!("the arguments of {name} cannot be read: {e}"))
    })?;
    let args = scope::Arguments::server_fn(args, rule.body)?;
    scope::check(control, caller, &rule.declared, &args).await
}

/// A refusal of a server function in the form the console's client reads (a server
/// function's error, with the refusal's status), so the operator sees why.
fn refuse_server_fn(e: ApiError) -> Response {
    use leptos::server_fn::error::FromServerFnError;
    let message = match &e {
        ApiError::Internal(cause) => {
            tracing::error!(error = %cause, "checking a server function's access failed");
            "the server could not answer; its log has the cause".to_owned()
        }
        other => other.to_string(),
    };
    let status = e.into_response().status();
    let refusal: leptos::prelude::ServerFnError =
        leptos::prelude::ServerFnError::ServerError(message);
    let body = refusal.ser();
    (status, body).into_response()
}

/// What a mutation acted on: a name, id or family from its body (never other values, which
/// may be secret), else the path's last segment.
fn audit_target(path: &str, body: &[u8]) -> Option<String> {
    const KEYS: [&str; 6] = ["name", "id", "family", "username", "reference", "input"];
    let pick = |v: &serde_json::Value| -> Option<String> {
        let o = v.as_object()?;
        for k in KEYS {
            match o.get(k) {
                Some(serde_json::Value::String(s)) if k != "input" => return Some(s.clone()),
                Some(serde_json::Value::Number(n)) if k != "input" => return Some(n.to_string()),
                Some(inner @ serde_json::Value::Object(_)) => {
                    if let Some(o) = inner.as_object() {
                        for k in ["name", "family", "id"] {
                            if let Some(serde_json::Value::String(s)) = o.get(k) {
                                return Some(s.clone());
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        None
    };
    let from_json = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| pick(&v));
    let from_form = || {
        let text = std::str::from_utf8(body).ok()?;
        ["name", "id", "family", "username"]
            .into_iter()
            .find_map(|k| form_field(text, k))
    };
    let from_path = || {
        path.strip_prefix("/api/v1/")
            .and_then(|rest| rest.split('/').nth(1))
            .map(str::to_owned)
    };
    from_json.or_else(from_form).or_else(from_path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa_axum::routes;

    /// Declares its access.
    #[utoipa::path(post, path = "/declared", extensions(("x-access" = json!(Declaration::OPERATE))),
        responses((status = 204, description = "Done")))]
    async fn declared() {}

    /// Forgets its access.
    #[utoipa::path(get, path = "/forgotten", responses((status = 204, description = "Done")))]
    async fn forgotten() {}

    /// Misspells it.
    #[utoipa::path(get, path = "/misspelt", extensions(("x-access" = json!({"role": "operatr"}))),
        responses((status = 204, description = "Done")))]
    async fn misspelt() {}

    /// Declares a project role but not where the project is.
    #[utoipa::path(post, path = "/unscoped", extensions(("x-access" = json!({"role": "project-operator"}))),
        responses((status = 204, description = "Done")))]
    async fn unscoped() {}

    /// Reads the project of a service named by a path parameter it does not have.
    #[utoipa::path(delete, path = "/services/{id}",
        extensions(("x-access" = json!(tessera_model::operations::DELETE_SERVICE))),
        responses((status = 204, description = "Done")))]
    async fn misscoped() {}

    #[test]
    fn a_route_carries_the_access_its_handler_declares() {
        let routes = Routes::default().route(routes!(declared));
        let rule = &routes.rules()[0];
        assert_eq!(
            (rule.method.clone(), rule.path.as_str(), rule.access()),
            (Method::POST, "/declared", Access::OPERATE)
        );
        let (_, doc) = routes.split();
        assert!(doc.paths.paths["/declared"].post.is_some());
    }

    #[test]
    #[should_panic(expected = "must declare")]
    fn a_handler_that_declares_no_access_cannot_be_routed() {
        let _ = Routes::default().route(routes!(forgotten));
    }

    #[test]
    #[should_panic(expected = "unknown role \"operatr\"")]
    fn a_handler_whose_access_is_misspelt_cannot_be_routed() {
        let _ = Routes::default().route(routes!(misspelt));
    }

    #[test]
    #[should_panic(expected = "needs a scope")]
    fn a_project_role_without_a_scope_cannot_be_routed() {
        let _ = Routes::default().route(routes!(unscoped));
    }

    #[test]
    #[should_panic(expected = "which the path lacks")]
    fn a_scope_on_a_path_parameter_the_path_lacks_cannot_be_routed() {
        let _ = Routes::default().route(routes!(misscoped));
    }

    #[test]
    fn audit_targets_never_take_other_fields() {
        let body = br#"{"family":"db","containers":[{"secrets":{"P":"hunter2"}}]}"#;
        assert_eq!(
            audit_target("/api/v1/task-definitions", body).as_deref(),
            Some("db")
        );
        let body = br#"{"input":{"name":"web","desired_count":3}}"#;
        assert_eq!(
            audit_target("/api/create_service123", body).as_deref(),
            Some("web")
        );
        assert_eq!(
            audit_target("/api/v1/hosts/h-1/drain", b"").as_deref(),
            Some("h-1")
        );
        assert_eq!(
            audit_target("/api/x", b"id=sim-l4-1&drain=true").as_deref(),
            Some("sim-l4-1")
        );
    }

    #[test]
    fn same_origin_needs_the_console_origin() {
        let mut h = HeaderMap::new();
        assert!(
            same_origin(&h, "127.0.0.1:3000", false).is_err(),
            "no Origin at all"
        );
        h.insert(
            header::ORIGIN,
            "http://127.0.0.1:3000".parse().expect("valid"),
        );
        assert!(same_origin(&h, "127.0.0.1:3000", false).is_ok());
        assert!(
            same_origin(&h, "127.0.0.1:3000", true).is_err(),
            "scheme differs"
        );
        h.insert(
            header::ORIGIN,
            "http://evil.example".parse().expect("valid"),
        );
        assert!(same_origin(&h, "127.0.0.1:3000", false).is_err());
        h.insert("sec-fetch-site", "cross-site".parse().expect("valid"));
        assert!(same_origin(&h, "127.0.0.1:3000", false).is_err());
        h.insert("sec-fetch-site", "same-origin".parse().expect("valid"));
        assert!(same_origin(&h, "127.0.0.1:3000", false).is_ok());
    }
}
