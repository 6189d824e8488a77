//! Errors at the control plane's boundaries: the store's, and the one callers of
//! [`crate::Control`] see, which says what was wrong in terms the API can pass on.

use tessera_model::taskdef::ValidationErrors;

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL names a backend this build cannot use.
    #[error("unsupported database URL {url:?}: {why}")]
    UnsupportedUrl { url: String, why: &'static str },
    /// The named thing does not exist.
    #[error("{what} {id:?} not found")]
    NotFound { what: &'static str, id: String },
    /// A write would break a rule of the data (duplicate name, GPU UUID, ...).
    #[error("{0}")]
    Conflict(String),
    /// A stored value that no longer parses: a bug or a hand edit, never user input.
    #[error("stored {what} is invalid: {message}")]
    Corrupt { what: &'static str, message: String },
    #[error("could not create the data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A scheduler's write after another server took the scheduler lease: refused, so a
    /// paused former holder can never commit.
    #[error("refused: server {holder} no longer holds the scheduler lease (epoch {epoch})")]
    Fenced { holder: String, epoch: i64 },
}

impl StoreError {
    pub(crate) fn corrupt(what: &'static str, err: impl std::fmt::Display) -> Self {
        StoreError::Corrupt {
            what,
            message: err.to_string(),
        }
    }
}

/// What a control-plane operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The input breaks rules; every error names its field.
    #[error("invalid input: {0}")]
    Invalid(ValidationErrors),
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with the current state (name taken, definition inactive, ...).
    #[error("{0}")]
    Conflict(String),
    /// Missing or wrong credentials: join token, agent token, password, API token.
    #[error("{0}")]
    Unauthorized(String),
    /// Too many failed sign-ins; try again after this many seconds.
    #[error("too many sign-in attempts; try again in {retry_after} s")]
    TooManyAttempts { retry_after: u64 },
    /// A bounded resource is full for now (the queue of password checks); try again
    /// after this many seconds.
    #[error("too many {what} at once; try again in {retry_after} s")]
    Busy { retry_after: u64, what: String },
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for ControlError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { .. } => ControlError::NotFound(e.to_string()),
            StoreError::Conflict(m) => ControlError::Conflict(m),
            other => ControlError::Store(other),
        }
    }
}

impl From<ValidationErrors> for ControlError {
    fn from(e: ValidationErrors) -> Self {
        ControlError::Invalid(e)
    }
}

impl ControlError {
    /// One invalid field.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ControlError::Invalid(ValidationErrors {
            errors: vec![tessera_model::taskdef::FieldError {
                field: field.into(),
                message: message.into(),
            }],
        })
    }
}
