//! The embedded SQLite backend: one file, created on first start, migrated at open.
//!
//! The queries are the ones in `src/sql/`, shared with the PostgreSQL backend; this
//! module says what is SQLite's own: its types, its clock expression, and how a write
//! transaction takes the database's one write lock.

pub mod backup;

// Compiled once per backend, against its own types: on purpose, not by accident.
#[allow(clippy::duplicate_mod)]
#[path = "../sql/mod.rs"]
mod sql;

use crate::error::StoreError;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteQueryResult,
    SqliteRow,
};
use sqlx::{Sqlite, SqliteConnection, SqlitePool};
use std::str::FromStr;

/// The SQLite store. The pool of connections is shared by every request; SQLite in WAL mode
/// lets readers run beside the one writer, and writes that re-check capacity take the
/// write lock up front (`BEGIN IMMEDIATE`) so two of them can never interleave.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    db: SqlitePool,
    /// Set on the store a lease holder's reconcile passes use: each of their writes checks
    /// it in its own transaction (see [`crate::store::ClusterStore::fenced`]).
    fence: Option<crate::store::Fence>,
}

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` (`sqlite://PATH` or `sqlite::memory:`)
    /// and applies pending migrations.
    pub async fn open(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(std::time::Duration::from_secs(10))
            .journal_mode(SqliteJournalMode::Wal);
        let path = options.get_filename().to_path_buf();
        let in_memory = url.contains(":memory:");
        // The database holds password, token and session hashes and task secrets: a
        // directory made for it is its owner's alone (one that existed is left as it is),
        // and so is the file.
        use std::os::unix::fs::PermissionsExt;
        let data_dir = |dir: &std::path::Path, source| StoreError::DataDir {
            path: dir.display().to_string(),
            source,
        };
        if let Some(dir) = path
            .parent()
            .filter(|d| !in_memory && !d.as_os_str().is_empty() && !d.exists())
        {
            std::fs::create_dir_all(dir).map_err(|e| data_dir(dir, e))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| data_dir(dir, e))?;
        }
        // An in-memory database lives as long as its one connection.
        let max = if in_memory { 1 } else { 8 };
        let db = SqlitePoolOptions::new()
            .max_connections(max)
            // A connection handed back inside a transaction (one dropped before it ended
            // still rolls back; see `lock_writes` for one that would not) is closed, which
            // rolls it back, rather than kept: it could hold the write lock. Not for an
            // in-memory database, which its one connection is.
            .after_release(move |conn, _| {
                Box::pin(async move {
                    let open = !in_memory && sqlx::Connection::is_in_transaction(conn);
                    if open {
                        tracing::debug!("a connection came back inside a transaction: closed");
                    }
                    Ok(!open)
                })
            })
            .connect_with(options)
            .await?;
        if !in_memory
            && let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        {
            // Another user's file that this one may write (a shared group): said, not fatal.
            tracing::warn!(path = %path.display(), error = %e, "cannot make the database file owner-only (0600)");
        }
        // SQLite gives its -wal and -shm files the database file's mode.
        sql::schema::migrate(&db, &MIGRATOR, tessera_model::version::Version::current()).await?;
        tracing::info!(path = %path.display(), "store opened");
        Ok(SqliteStore { db, fence: None })
    }

    /// A transaction holding SQLite's write lock from its first statement: writes that
    /// span rows never interleave, and what they read is what they write over.
    ///
    /// The `BEGIN IMMEDIATE` runs to its end in a task of its own. sqlx starts a custom
    /// `BEGIN` in two steps (the statement, then a check that it took); a caller that
    /// gives up between them (a request past its timeout while another writer holds the
    /// lock) would leave its connection inside a transaction that no `Transaction` owns,
    /// back in the pool and holding the write lock: every later write would wait on it
    /// for good. Run apart, the transaction is always made, and rolled back when the
    /// caller is gone.
    async fn lock_writes(&self) -> Result<sqlx::Transaction<'static, Sqlite>, StoreError> {
        let db = self.db.clone();
        tokio::spawn(async move { db.begin_with("BEGIN IMMEDIATE").await })
            .await
            .map_err(|e| {
                StoreError::Database(sqlx::Error::Protocol(format!("beginning a write: {e}")))
            })?
            .map_err(StoreError::from)
    }

    /// The same store on the same connections, with `fence` on its writes.
    fn with_fence(&self, fence: crate::store::Fence) -> Self {
        SqliteStore {
            db: self.db.clone(),
            fence: Some(fence),
        }
    }
}

type This = SqliteStore;
type Db = Sqlite;
type DbRow = SqliteRow;
type DbConn = SqliteConnection;
type DbPool = SqlitePool;
type DbResult = SqliteQueryResult;
type DbArguments<'q> = SqliteArguments<'q>;

/// Now, as stored times are written (`crate::clock::stamp`).
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";
/// `INSTR(haystack, needle)`: the needle's position, 0 when absent.
const INSTR: &str = "instr";
/// Whether the table named by `$1` exists: 1 or 0.
const TABLE_EXISTS: &str = "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1";
/// Where the fleet read model's next reading starts: the counter, moved on (a write between
/// two writers' transactions; see `0017_fleet_marks.sql`).
const FLEET_NEXT: &str = "UPDATE fleet_clock SET mark = mark + 1 RETURNING mark";

/// Servers sharing one SQLite file (one machine) tell each other nothing: their live
/// views follow their own changes and the scheduler's ticks.
impl This {
    async fn publish(&self, _from: &str) -> Result<(), StoreError> {
        Ok(())
    }

    async fn listen(
        &self,
    ) -> Result<Option<tokio::sync::mpsc::Receiver<Option<String>>>, StoreError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row;

    /// The columns of `table`.
    async fn columns(db: &SqlitePool, table: &str) -> Vec<String> {
        sqlx::query(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .fetch_all(db)
            .await
            .expect("columns")
            .iter()
            .map(|r| r.get::<String, _>(0))
            .collect()
    }

    /// The schema's rows that say what it is: migrations applied, and `schema_meta`.
    async fn schema_rows(db: &SqlitePool) -> (i64, Vec<(String, String)>) {
        let applied = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations")
            .fetch_one(db)
            .await
            .expect("migrations");
        let meta = sqlx::query_as("SELECT key, value FROM schema_meta ORDER BY key")
            .fetch_all(db)
            .await
            .expect("meta");
        (applied, meta)
    }

    /// A schema a newer server wrote: a server it keeps runs on it (and leaves the newer
    /// server's words); one it does not keep is refused, naming the versions, with
    /// nothing written.
    #[tokio::test]
    async fn a_newer_schema_runs_the_servers_it_keeps_and_refuses_the_rest_writing_nothing() {
        use tessera_model::version::Version;
        let dir = tempfile::tempdir().expect("dir");
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let this = Version::current();
        let store = SqliteStore::open(&url).await.expect("store");
        let (_, meta) = schema_rows(&store.db).await;
        assert_eq!(
            meta,
            vec![
                ("oldest_server".into(), this.previous_minor().to_string()),
                ("written_by".into(), this.to_string()),
            ]
        );
        // A newer server's migration, and its words on which servers it keeps.
        let newer = Version {
            minor: this.minor + 1,
            patch: 0,
            ..this
        };
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (99999, 'from the future', 1, x'00', 1)",
        )
        .execute(&store.db)
        .await
        .expect("a newer migration");
        sqlx::query("UPDATE schema_meta SET value = $1 WHERE key = 'written_by'")
            .bind(newer.to_string())
            .execute(&store.db)
            .await
            .expect("written by");
        sqlx::query("UPDATE schema_meta SET value = $1 WHERE key = 'oldest_server'")
            .bind(this.to_string())
            .execute(&store.db)
            .await
            .expect("keeps");
        store.db.close().await;
        let before = {
            let s = SqliteStore::open(&url).await.expect("kept: it runs on it");
            let rows = schema_rows(&s.db).await;
            assert_eq!(rows.1[1], ("written_by".into(), newer.to_string()));
            s.db.close().await;
            rows
        };

        // Then a newer server keeps only its own minor version.
        {
            let s = SqliteStore::open(&url).await.expect("store");
            sqlx::query("UPDATE schema_meta SET value = $1 WHERE key = 'oldest_server'")
                .bind(newer.to_string())
                .execute(&s.db)
                .await
                .expect("keeps no longer");
            s.db.close().await;
        }
        let refused = SqliteStore::open(&url).await.expect_err("not kept");
        let said = refused.to_string();
        assert!(
            matches!(refused, StoreError::SchemaTooNew { newest: 99999, .. }),
            "{said}"
        );
        for part in [
            "migration 99999".to_owned(),
            format!("applied by tessera {newer}"),
            format!("keeps servers from {newer} on"),
            format!("this is tessera {this}"),
            "nothing was written".to_owned(),
        ] {
            assert!(said.contains(&part), "{part:?} in {said}");
        }
        let db = SqlitePool::connect(&url).await.expect("read");
        let after = schema_rows(&db).await;
        assert_eq!(after.0, before.0, "no migration written");
        assert_eq!(after.1[0], ("oldest_server".into(), newer.to_string()));
        assert_eq!(after.1[1], before.1[1], "its words left as they were");
    }

    /// The fleet read model's change marks (`0017_fleet_marks.sql`) name their columns one
    /// by one on SQLite: every column of `tasks`, `hosts` and `gpus` is either in its update
    /// trigger or left out on purpose, so a column added later cannot be forgotten.
    #[tokio::test]
    async fn every_column_the_fleet_model_shows_marks_its_row() {
        let store = SqliteStore::open("sqlite::memory:").await.expect("store");
        for (table, trigger, left_out) in [
            (
                "tasks",
                "tasks_mark_update",
                &[
                    "id",
                    "created_at",
                    "work",
                    "gpu_memory_peak_mib",
                    "sm_percent",
                    "fleet_mark",
                    // Read on request only (operators), never by the fleet model.
                    "last_output",
                ][..],
            ),
            (
                "hosts",
                "hosts_mark_update",
                &[
                    "id",
                    "created_at",
                    "last_seen_at",
                    "agent_token_hash",
                    "fleet_mark",
                    // Written with the host's row, never changed.
                    "provider_id",
                ][..],
            ),
            ("gpus", "gpus_mark_update", &["uuid"][..]),
        ] {
            let sql: String =
                sqlx::query("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = $1")
                    .bind(trigger)
                    .fetch_one(&store.db)
                    .await
                    .expect("the trigger")
                    .get(0);
            for column in columns(&store.db, table).await {
                let watched = sql.contains(&format!("NEW.{column} IS NOT OLD.{column}"));
                assert!(
                    watched != left_out.contains(&column.as_str()),
                    "{table}.{column}: in {trigger}'s WHEN clause: {watched}; left out on purpose: {}",
                    !watched
                );
            }
        }
    }
}
