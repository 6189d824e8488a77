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
    /// The database holds migrations this server does not know, written by a server that
    /// does not keep this version (the compatibility policy): nothing was written.
    #[error(
        "the database's schema is newer than this server: migration {newest} was applied by tessera {written_by}, which keeps servers from {keeps} on, and this is tessera {this} (migrations up to {known}); nothing was written: run tessera {written_by} or newer against it"
    )]
    SchemaTooNew {
        newest: i64,
        known: i64,
        written_by: String,
        keeps: String,
        this: String,
    },
    /// `tessera migrate-store` refused or failed, with what and that nothing was copied.
    #[error("migrate-store: {0}")]
    Move(String),
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

/// What an operator is told of a failed operation: the one mapping the REST API (its
/// status and body) and the console (its message or its form's field errors) both read.
/// What they can act on is told in words; a store's failure is [`Told::Internal`], whose
/// words say nothing of its cause (it can name tables, paths and the database's own
/// words), and whose cause the caller logs.
#[derive(Debug)]
pub enum Told {
    /// Every invalid field with its rule (REST: 422).
    Invalid(Vec<tessera_model::taskdef::FieldError>),
    /// REST: 404.
    NotFound(String),
    /// REST: 409.
    Conflict(String),
    /// REST: 401.
    Unauthorized(String),
    /// REST: 429, with when to try again.
    TooManyAttempts { retry_after: u64 },
    /// A bounded resource is full for now (REST: 503).
    Busy(String),
    /// Not the operator's to act on (REST: 500): the error, to be logged.
    Internal(ControlError),
}

impl std::fmt::Display for Told {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Told::Invalid(errors) => {
                let fields: Vec<String> = errors
                    .iter()
                    .map(|e| format!("{}: {}", e.field, e.message))
                    .collect();
                write!(f, "invalid input: {}", fields.join("; "))
            }
            Told::NotFound(m) | Told::Conflict(m) | Told::Unauthorized(m) | Told::Busy(m) => {
                f.write_str(m)
            }
            Told::TooManyAttempts { retry_after } => {
                write!(f, "too many sign-in attempts; try again in {retry_after} s")
            }
            Told::Internal(_) => f.write_str("the server could not answer; its log has the cause"),
        }
    }
}

impl ControlError {
    /// What an operator is told of this error (see [`Told`]).
    pub fn told(self) -> Told {
        match self {
            ControlError::Invalid(v) => Told::Invalid(v.errors),
            ControlError::NotFound(m) => Told::NotFound(m),
            ControlError::Conflict(m) => Told::Conflict(m),
            ControlError::Unauthorized(m) => Told::Unauthorized(m),
            ControlError::TooManyAttempts { retry_after } => Told::TooManyAttempts { retry_after },
            e @ ControlError::Busy { .. } => Told::Busy(e.to_string()),
            e @ ControlError::Store(_) => Told::Internal(e),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_an_operator_is_told_keeps_a_store_failure_to_the_log() {
        let leaked = "no such table: tasks_secret_column at /var/lib/tessera/tessera.db";
        let told = ControlError::Store(StoreError::Corrupt {
            what: "task",
            message: leaked.into(),
        })
        .told();
        assert!(matches!(told, Told::Internal(_)));
        assert!(!told.to_string().contains("tasks_secret"), "{told}");
        let told = ControlError::invalid("pool", "no pool named \"x\"").told();
        assert_eq!(told.to_string(), "invalid input: pool: no pool named \"x\"");
        assert!(matches!(told, Told::Invalid(ref f) if f[0].field == "pool"));
        let told = ControlError::Busy {
            retry_after: 1,
            what: "password checks".into(),
        }
        .told();
        assert_eq!(
            told.to_string(),
            "too many password checks at once; try again in 1 s"
        );
        assert!(matches!(
            StoreError::Conflict("name taken".into()).into(),
            ControlError::Conflict(_)
        ));
    }
}
