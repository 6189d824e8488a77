//! `tessera backup FILE`: an online, consistent copy of the embedded SQLite database.
//!
//! The database runs in WAL mode, so copying its file alone can miss what the log holds
//! or catch a page half written. `VACUUM INTO` writes a consistent copy from one read
//! transaction while the server goes on serving (its writers are not held up). The copy
//! is written beside the file named, checked (`PRAGMA integrity_check`), made readable by
//! its owner only (it holds password and token hashes and task secrets), flushed, and
//! only then renamed to the name given: a failure (a full disk) leaves nothing under that
//! name, and no partial file beside it.

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Why a backup was not made.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// Asked for what a backup does not do (overwrite a file, a PostgreSQL database).
    #[error("{0}")]
    Refused(String),
    /// Making it failed; nothing was left at the file named.
    #[error("the backup failed, and nothing was left at {file}: {why}")]
    Failed { file: String, why: String },
}

/// A backup made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    pub file: PathBuf,
    pub bytes: u64,
    /// The newest migration the copy holds: a server at least this new reads it.
    pub schema_version: i64,
}

/// Copies the SQLite database at `url` into the new file `to`.
pub async fn backup(url: &str, to: &Path) -> Result<Backup, BackupError> {
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        return Err(BackupError::Refused(
            "tessera backup copies the embedded SQLite database; back up PostgreSQL with its own tools: pg_dump --format=custom --file FILE URL (restore: pg_restore --clean --dbname URL FILE)".into(),
        ));
    }
    if to.exists() {
        return Err(BackupError::Refused(format!(
            "{} exists: a backup never writes over a file; name a new one",
            to.display()
        )));
    }
    let (Some(dir), Some(name)) = (to.parent(), to.file_name()) else {
        return Err(BackupError::Refused(format!(
            "{} is not a file name",
            to.display()
        )));
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    if !dir.is_dir() {
        return Err(BackupError::Refused(format!(
            "{} is not a directory: create it first",
            dir.display()
        )));
    }
    let options = SqliteConnectOptions::from_str(url)
        .map_err(|e| BackupError::Refused(format!("{url:?} is not a SQLite URL: {e}")))?;
    let source = options.get_filename().to_path_buf();
    if !source.is_file() {
        return Err(BackupError::Refused(format!(
            "no database at {}: is --data-dir (or --database) the server's?",
            source.display()
        )));
    }
    let partial = dir.join(format!(".{}.partial", name.to_string_lossy()));
    let made = copy(options, &partial, to).await;
    if made.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    made.map_err(|why| BackupError::Failed {
        file: to.display().to_string(),
        why,
    })
}

/// The copy into `partial`, checked, then renamed to `to`.
async fn copy(options: SqliteConnectOptions, partial: &Path, to: &Path) -> Result<Backup, String> {
    // A partial file left by a backup that was killed is this backup's to replace.
    let _ = std::fs::remove_file(partial);
    let mut db = options
        .read_only(true)
        .connect()
        .await
        .map_err(|e| format!("opening the database: {e}"))?;
    sqlx::query("VACUUM INTO ?")
        .bind(partial.to_string_lossy().into_owned())
        .execute(&mut db)
        .await
        .map_err(|e| format!("copying: {e}"))?;
    db.close().await.map_err(|e| e.to_string())?;
    let mut copy = SqliteConnectOptions::new()
        .filename(partial)
        .read_only(true)
        .connect()
        .await
        .map_err(|e| format!("opening the copy: {e}"))?;
    let verdict: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut copy)
        .await
        .map_err(|e| format!("checking the copy: {e}"))?;
    if verdict != "ok" {
        return Err(format!("the copy does not check: {verdict}"));
    }
    let schema_version: i64 =
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations")
            .fetch_one(&mut copy)
            .await
            .map_err(|e| format!("reading the copy's schema version: {e}"))?;
    copy.close().await.map_err(|e| e.to_string())?;
    use std::os::unix::fs::PermissionsExt;
    let file = std::fs::File::open(partial).map_err(|e| e.to_string())?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("making the copy its owner's only: {e}"))?;
    file.sync_all()
        .map_err(|e| format!("flushing the copy: {e}"))?;
    let bytes = file.metadata().map_err(|e| e.to_string())?.len();
    // Never over a file that appeared meanwhile.
    std::fs::hard_link(partial, to).map_err(|e| format!("naming the copy: {e}"))?;
    std::fs::remove_file(partial).map_err(|e| e.to_string())?;
    if let Some(dir) = to.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(Backup {
        file: to.to_path_buf(),
        bytes,
        schema_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::PoolInput;

    #[tokio::test]
    async fn a_backup_of_a_live_database_holds_what_was_written_and_writes_over_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/tessera.db", dir.path().display());
        let control = crate::Control::new(crate::open(&url).await.unwrap(), Default::default());
        control
            .deployments()
            .create_pool(&PoolInput::named("kept"))
            .await
            .unwrap();
        let to = dir.path().join("backup.db");
        // The server goes on running: its pool stays open while the copy is made.
        let made = backup(&url, &to).await.unwrap();
        assert!(made.bytes > 0 && made.schema_version > 0, "{made:?}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&to).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let copy = crate::Control::new(
            crate::open(&format!("sqlite://{}", to.display()))
                .await
                .unwrap(),
            Default::default(),
        );
        let pools = copy.views().list_pools().await.unwrap();
        assert!(pools.iter().any(|p| p.name.as_str() == "kept"), "{pools:?}");

        // Never over a file; a missing directory or database and PostgreSQL are refused,
        // each saying what to do, and nothing is left behind.
        let again = backup(&url, &to).await.unwrap_err().to_string();
        assert!(again.contains("never writes over"), "{again}");
        let nowhere = backup(&url, &dir.path().join("no/such/dir/b.db"))
            .await
            .unwrap_err()
            .to_string();
        assert!(nowhere.contains("create it first"), "{nowhere}");
        let missing = format!("sqlite://{}/nothing.db", dir.path().display());
        let none = backup(&missing, &dir.path().join("b.db"))
            .await
            .unwrap_err()
            .to_string();
        assert!(none.contains("no database at"), "{none}");
        let pg = backup("postgres://u@h/db", &dir.path().join("c.db"))
            .await
            .unwrap_err()
            .to_string();
        assert!(pg.contains("pg_dump"), "{pg}");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".partial") || n == "b.db" || n == "c.db")
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn a_backup_that_cannot_be_written_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/tessera.db", dir.path().display());
        let _store = crate::open(&url).await.unwrap();
        // A file in the way of the partial copy's name: the copy cannot be made there.
        let to = dir.path().join("b.db");
        std::fs::create_dir(dir.path().join(".b.db.partial")).unwrap();
        let failed = backup(&url, &to).await.unwrap_err().to_string();
        assert!(failed.contains("nothing was left"), "{failed}");
        assert!(!to.exists());
    }
}
