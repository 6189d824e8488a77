//! PostgreSQL, for fleets that outgrow one machine: any number of `tessera serve`
//! processes on one database, which is the one source of truth.
//!
//! The queries are the ones in `src/sql/`, shared with SQLite; this module says what is
//! PostgreSQL's own: its types, its clock expression, how a write transaction excludes
//! other writers, and LISTEN/NOTIFY, which carries each server's changes to the others.
//!
//! Writes that span rows (a placement commit and its capacity re-check, a lost host and its
//! tasks, a lease change) run one at a time, whichever server makes them: each takes one
//! transaction-level advisory lock first, as SQLite's writers take its one write lock.
//! Reads never wait for it, and what a write reads after taking it is the latest committed
//! state (read committed), so a re-check sees every commit before its own and no GPU is
//! ever overcommitted by two servers committing at once.

// Compiled once per backend, against its own types: on purpose, not by accident.
#[allow(clippy::duplicate_mod)]
#[path = "../sql/mod.rs"]
mod sql;

use crate::error::StoreError;
use sqlx::postgres::{
    PgArguments, PgConnectOptions, PgListener, PgPoolOptions, PgQueryResult, PgRow,
};
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use std::str::FromStr;
use std::time::Duration;

/// The PostgreSQL store: a pool of connections shared by every request.
#[derive(Debug, Clone)]
pub struct PgStore {
    db: PgPool,
    /// Set on the store a lease holder's reconcile passes use: each of their writes checks
    /// it in its own transaction (see [`crate::store::ClusterStore::fenced`]).
    fence: Option<crate::store::Fence>,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// The advisory lock every write transaction takes ("tessera" in ASCII, then 1).
const WRITE_LOCK: i64 = 0x7465_7373_6572_6101;

/// The channel servers announce their changes on; the payload is the server's id.
const CHANNEL: &str = "tessera_changes";

impl PgStore {
    /// Connects to the database at `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`) and
    /// applies pending migrations (several servers starting at once apply them once: the
    /// migrator holds an advisory lock while it works).
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)?.application_name("tessera");
        // One connection first: a wrong address, password or database name is told as
        // PostgreSQL or the network tells it, at once (the pool would retry it until its
        // acquire timeout, then say only that it timed out).
        PgConnection::connect_with(&options).await?.close().await?;
        let db = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        sql::schema::migrate(&db, &MIGRATOR, tessera_model::version::Version::current()).await?;
        tracing::info!(
            database = %db.connect_options().get_database().unwrap_or("(default)"),
            host = %db.connect_options().get_host(),
            "store opened"
        );
        Ok(PgStore { db, fence: None })
    }

    /// A transaction holding the write lock: writes that span rows never interleave, and
    /// what they read after taking it is what they write over. The lock ends with the
    /// transaction, however it ends (a connection lost mid-way included).
    async fn lock_writes(&self) -> Result<sqlx::Transaction<'static, Postgres>, StoreError> {
        let mut tx = self.db.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(WRITE_LOCK)
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    /// The same store on the same connections, with `fence` on its writes.
    fn with_fence(&self, fence: crate::store::Fence) -> Self {
        PgStore {
            db: self.db.clone(),
            fence: Some(fence),
        }
    }

    /// NOTIFY: every server listening hears `from` once this statement's transaction (here
    /// its own) commits.
    async fn publish(&self, from: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(from)
            .execute(&self.db)
            .await?;
        Ok(())
    }

    /// LISTEN on a connection of its own, forwarded until the receiver is dropped. A lost
    /// connection is made again; what was published meanwhile is lost, which the receiver
    /// hears as `None`.
    async fn listen(
        &self,
    ) -> Result<Option<tokio::sync::mpsc::Receiver<Option<String>>>, StoreError> {
        let mut listener = PgListener::connect_with(&self.db).await?;
        listener.listen(CHANNEL).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        tokio::spawn(async move {
            loop {
                let news = match listener.try_recv().await {
                    Ok(Some(n)) => Some(n.payload().to_owned()),
                    Ok(None) => {
                        tracing::warn!(
                            "the connection listening for other servers' changes was lost; making it again"
                        );
                        None
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "listening for other servers' changes failed; trying again in a second");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        None
                    }
                };
                if tx.send(news).await.is_err() {
                    break;
                }
            }
        });
        Ok(Some(rx))
    }
}

type This = PgStore;
type Db = Postgres;
type DbRow = PgRow;
type DbConn = PgConnection;
type DbPool = PgPool;
type DbResult = PgQueryResult;
type DbArguments<'q> = PgArguments;

/// Now, as stored times are written (`crate::clock::stamp`).
const NOW: &str =
    r#"to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')"#;
/// `INSTR(haystack, needle)`: the needle's position, 0 when absent.
const INSTR: &str = "strpos";
/// Whether the table named by `$1` exists (in the connection's schema): 1 or 0.
const TABLE_EXISTS: &str =
    "SELECT COUNT(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = $1";
/// Where the fleet read model's next reading starts: the oldest transaction still running
/// (marks are transaction ids; see `0013_fleet_marks.sql`).
const FLEET_NEXT: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint";
