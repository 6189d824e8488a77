//! The store's error type: what callers can act on, with the database's detail kept for logs.

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database URL names a backend this build cannot use.
    #[error("unsupported database URL {url:?}: {why}")]
    UnsupportedUrl { url: String, why: &'static str },
    /// The named thing does not exist.
    #[error("{what} {id:?} not found")]
    NotFound { what: &'static str, id: String },
    /// A write would break a rule of the data (unknown pool, duplicate GPU UUID, ...).
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
}

impl StoreError {
    pub(crate) fn corrupt(what: &'static str, err: impl std::fmt::Display) -> Self {
        StoreError::Corrupt {
            what,
            message: err.to_string(),
        }
    }
}
