//! How failures become HTTP responses: a 4xx names what was wrong (every invalid field with
//! its rule), a 5xx logs its cause and tells the client nothing internal.

use crate::api::bodies::ErrorBody;
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tessera_control::{ControlError, StoreError, Told};
use tessera_model::taskdef::FieldError;

/// The API's error.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON, or the request line is wrong.
    #[error("{0}")]
    BadRequest(String),
    /// JSON of the wrong shape: a missing, unknown or mistyped field (the message names it).
    #[error("{0}")]
    WrongShape(String),
    #[error("invalid input")]
    Invalid(Vec<FieldError>),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// No or bad credentials.
    #[error("{0}")]
    Unauthorized(String),
    /// Known caller without the role, or a cross-site request.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("too many sign-in attempts; try again in {0} s")]
    TooManyAttempts(u64),
    /// A limit is reached for now (open event streams).
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Internal(ControlError),
}

impl ApiError {
    /// A session that could not be read or written: the store's fault.
    pub fn session(e: tower_sessions::session::Error) -> Self {
        ApiError::Internal(ControlError::Conflict(format!("session store: {e}")))
    }
}

/// The control plane's one mapping of its errors ([`Told`]), as HTTP.
impl From<ControlError> for ApiError {
    fn from(e: ControlError) -> Self {
        match e.told() {
            Told::Invalid(fields) => ApiError::Invalid(fields),
            Told::NotFound(m) => ApiError::NotFound(m),
            Told::Conflict(m) => ApiError::Conflict(m),
            Told::Unauthorized(m) => ApiError::Unauthorized(m),
            Told::TooManyAttempts { retry_after } => ApiError::TooManyAttempts(retry_after),
            Told::Busy(m) => ApiError::Unavailable(m),
            Told::Internal(e) => ApiError::Internal(e),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::from(ControlError::from(e))
    }
}

impl From<tessera_model::error::FieldError> for ApiError {
    fn from(e: tessera_model::error::FieldError) -> Self {
        ApiError::Invalid(vec![e])
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::JsonDataError(e) => ApiError::WrongShape(e.body_text()),
            other => ApiError::BadRequest(other.body_text()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = |error: String| ErrorBody {
            error,
            errors: None,
        };
        let (status, body) = match self {
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, body(m)),
            ApiError::WrongShape(m) => (StatusCode::UNPROCESSABLE_ENTITY, body(m)),
            ApiError::Invalid(errors) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorBody {
                    error: "invalid input".into(),
                    errors: Some(errors),
                },
            ),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, body(m)),
            ApiError::Conflict(m) => (StatusCode::CONFLICT, body(m)),
            ApiError::Unauthorized(m) => (StatusCode::UNAUTHORIZED, body(m)),
            ApiError::Forbidden(m) => (StatusCode::FORBIDDEN, body(m)),
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, body(m)),
            ApiError::PayloadTooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, body(m)),
            ApiError::TooManyAttempts(secs) => {
                let message = ApiError::TooManyAttempts(secs).to_string();
                let mut r = (StatusCode::TOO_MANY_REQUESTS, Json(body(message))).into_response();
                r.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from(secs),
                );
                return r;
            }
            ApiError::Internal(e) => {
                tracing::error!(error = %e, "request failed");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    body("internal error; the server log has the cause".into()),
                )
            }
        };
        (status, Json(body)).into_response()
    }
}
