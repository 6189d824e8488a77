//! The schema's migrations under the compatibility policy (`tessera_model::version`):
//! migrations only add, so a server of the previous minor version runs on the schema a
//! newer one wrote; an older one is refused before it writes anything.

use super::*;
use sqlx::migrate::Migrator;
use tessera_model::version::{Version, oldest_server_for};

/// The `schema_meta` rows: the newest server that migrated the schema, and the oldest
/// version that may still run on it.
const WRITTEN_BY: &str = "written_by";
const OLDEST_SERVER: &str = "oldest_server";

/// Applies `migrator`'s pending migrations to `db` as this build (`this`) may:
/// - a schema no newer than this build knows is migrated, and says this build wrote it
///   (unless a newer server already did);
/// - a schema with migrations this build does not know is used as it is when the newer
///   server that wrote it keeps this version ([`oldest_server_for`]), and refused
///   otherwise ([`StoreError::SchemaTooNew`]), with nothing written.
pub(crate) async fn migrate(
    db: &DbPool,
    migrator: &Migrator,
    this: Version,
) -> Result<(), StoreError> {
    let known = migrator
        .migrations
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    let applied = newest_applied(db).await?;
    let meta = read_meta(db).await?;
    if let Some(newest) = applied.filter(|&n| n > known) {
        let written_by = meta
            .get(WRITTEN_BY)
            .cloned()
            .unwrap_or_else(|| "unknown".into());
        let keeps = meta
            .get(OLDEST_SERVER)
            .and_then(|v| v.parse::<Version>().ok());
        if keeps.is_none_or(|oldest| this < oldest) {
            return Err(StoreError::SchemaTooNew {
                newest,
                known,
                written_by,
                keeps: keeps.map_or_else(|| "unknown".into(), |v| v.to_string()),
                this: this.to_string(),
            });
        }
        tracing::warn!(
            newest_migration = newest,
            known_up_to = known,
            %written_by,
            "the schema is newer than this server knows; it keeps this version, so this server runs on it (upgrade it soon)"
        );
        let lenient = Migrator {
            migrations: migrator.migrations.clone(),
            ignore_missing: true,
            locking: migrator.locking,
            no_tx: migrator.no_tx,
        };
        lenient.run(db).await?;
        return Ok(());
    }
    migrator.run(db).await?;
    let newer_wrote = meta
        .get(WRITTEN_BY)
        .and_then(|v| v.parse::<Version>().ok())
        .is_some_and(|v| v > this);
    if !newer_wrote {
        for (key, value) in [
            (WRITTEN_BY, this.to_string()),
            (OLDEST_SERVER, oldest_server_for(this).to_string()),
        ] {
            sqlx::query(
                "INSERT INTO schema_meta (key, value) VALUES ($1, $2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )
            .bind(key)
            .bind(value)
            .execute(db)
            .await?;
        }
    }
    Ok(())
}

/// The newest migration applied (`None`: a new database, none yet).
async fn newest_applied(db: &DbPool) -> Result<Option<i64>, StoreError> {
    if !table_exists(db, "_sqlx_migrations").await? {
        return Ok(None);
    }
    Ok(
        sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
            .fetch_one(db)
            .await?,
    )
}

/// `schema_meta`'s rows (none before the migration that made it).
async fn read_meta(db: &DbPool) -> Result<HashMap<String, String>, StoreError> {
    if !table_exists(db, "schema_meta").await? {
        return Ok(HashMap::new());
    }
    Ok(sqlx::query_as("SELECT key, value FROM schema_meta")
        .fetch_all(db)
        .await?
        .into_iter()
        .collect())
}

async fn table_exists(db: &DbPool, table: &str) -> Result<bool, StoreError> {
    let n: i64 = sqlx::query_scalar(TABLE_EXISTS)
        .bind(table)
        .fetch_one(db)
        .await?;
    Ok(n > 0)
}
