//! `tessera migrate-store`: a fleet's SQLite database copied into a new PostgreSQL
//! database, to run several servers on it.
//!
//! Both are opened (and migrated) by this build first, so they hold the same schema; the
//! copy then reads the SQLite file in one read transaction (a consistent snapshot) and
//! writes every table in one PostgreSQL transaction: the target holds all of it or none.
//! Tables are written parents first (SQLite's foreign keys say which), every row checked
//! by count afterwards, and identity columns moved past the rows copied.

use crate::error::StoreError;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Connection, Row, TypeInfo, ValueRef};
use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

/// Tables whose rows say that a fleet lives in a database: a target holding any refuses.
const FLEET_TABLES: &[&str] = &[
    "pools",
    "hosts",
    "services",
    "tasks",
    "task_definitions",
    "users",
];

/// Kept per database, never copied: migrations and their record, SQLite's own counter for
/// the fleet read model (PostgreSQL marks rows with transaction ids), and the scheduler's
/// queue of changed services (the copy's own inserts fill it again, so the first pass on
/// the target reconciles every service).
const NOT_COPIED: &[&str] = &[
    "_sqlx_migrations",
    "schema_meta",
    "fleet_clock",
    "service_changes",
];

/// What a move copied: each table with its rows, in the order written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub tables: Vec<(String, u64)>,
}

impl Moved {
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|(_, n)| n).sum()
    }
}

fn failed(what: impl std::fmt::Display) -> StoreError {
    StoreError::Move(what.to_string())
}

/// Copies the fleet in the SQLite database at `from` into the PostgreSQL database at `to`,
/// which must hold no fleet yet. Stop the servers on `from` first: what they write after
/// the copy began is not carried.
pub async fn migrate_store(from: &str, to: &str) -> Result<Moved, StoreError> {
    if !from.starts_with("sqlite:") {
        return Err(StoreError::UnsupportedUrl {
            url: from.to_owned(),
            why: "--from must be the SQLite database: sqlite://PATH",
        });
    }
    if !(to.starts_with("postgres:") || to.starts_with("postgresql:")) {
        return Err(StoreError::UnsupportedUrl {
            url: to.to_owned(),
            why: "--to must be a PostgreSQL database: postgres://USER@HOST/DATABASE",
        });
    }
    let source_options = SqliteConnectOptions::from_str(from)?;
    let path = source_options.get_filename().to_path_buf();
    if !path.is_file() {
        return Err(failed(format!(
            "no SQLite database at {} (--from): nothing copied",
            path.display()
        )));
    }
    // Both at this build's schema (each refuses one newer than it keeps).
    drop(crate::sqlite::SqliteStore::open(from).await?);
    drop(crate::postgres::PgStore::open(to).await?);
    let source = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(source_options)
        .await?;
    let target = PgPoolOptions::new().max_connections(1).connect(to).await?;
    for table in FLEET_TABLES {
        let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(&target)
            .await?;
        if n > 0 {
            return Err(failed(format!(
                "the target database already holds a fleet ({table}: {n} rows): migrate-store copies into a new database only; nothing copied"
            )));
        }
    }
    let order: Vec<String> = tables_in_order(&source)
        .await?
        .into_iter()
        .filter(|t| !NOT_COPIED.contains(&t.as_str()))
        .collect();
    let columns = target_columns(&target).await?;
    let mut read = source.acquire().await?;
    let mut snapshot = read.begin().await?;
    let mut write = target.begin().await?;
    // A new database's seeds (the `default` project) give way to the fleet's own rows.
    for table in order.iter().rev().filter(|t| columns.contains_key(*t)) {
        sqlx::query(&format!("DELETE FROM {table}"))
            .execute(&mut *write)
            .await?;
    }
    let mut moved = Vec::new();
    for table in &order {
        let Some(target_cols) = columns.get(table) else {
            return Err(failed(format!(
                "table {table} has no counterpart in the PostgreSQL schema: nothing copied"
            )));
        };
        let copied = copy_table(&mut snapshot, &mut write, table, target_cols).await?;
        moved.push((table.clone(), copied));
    }
    for (table, cols) in &columns {
        for col in cols.iter().filter(|c| c.identity) {
            sqlx::query(&format!(
                "SELECT setval(pg_get_serial_sequence('{table}', '{name}'), \
                 COALESCE((SELECT MAX({name}) FROM {table}), 0) + 1, false)",
                name = col.name
            ))
            .execute(&mut *write)
            .await?;
        }
    }
    write.commit().await?;
    snapshot.rollback().await?;
    Ok(Moved { tables: moved })
}

/// The source's tables, each after every table its foreign keys name.
async fn tables_in_order(source: &sqlx::SqlitePool) -> Result<Vec<String>, StoreError> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )
    .fetch_all(source)
    .await?;
    let mut parents: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for name in &names {
        let refs: Vec<String> =
            sqlx::query_scalar("SELECT DISTINCT \"table\" FROM pragma_foreign_key_list($1)")
                .bind(name)
                .fetch_all(source)
                .await?;
        parents.insert(
            name.clone(),
            refs.into_iter().filter(|r| r != name).collect(),
        );
    }
    let mut order: Vec<String> = Vec::new();
    while order.len() < names.len() {
        let next = names
            .iter()
            .find(|n| {
                !order.contains(n)
                    && parents[*n]
                        .iter()
                        .all(|p| order.contains(p) || !names.contains(p))
            })
            .ok_or_else(|| failed("the tables' foreign keys form a circle"))?;
        order.push(next.clone());
    }
    Ok(order)
}

struct TargetColumn {
    name: String,
    /// The PostgreSQL type a value is cast to (`bigint`, `integer`, `text`, ...).
    cast: String,
    identity: bool,
}

async fn target_columns(
    target: &sqlx::PgPool,
) -> Result<BTreeMap<String, Vec<TargetColumn>>, StoreError> {
    let rows = sqlx::query(
        "SELECT table_name::text AS t, column_name::text AS c, data_type::text AS ty, is_identity::text AS id
         FROM information_schema.columns WHERE table_schema = current_schema()
         ORDER BY table_name, ordinal_position",
    )
    .fetch_all(target)
    .await?;
    let mut out: BTreeMap<String, Vec<TargetColumn>> = BTreeMap::new();
    for r in rows {
        out.entry(r.try_get("t")?).or_default().push(TargetColumn {
            name: r.try_get("c")?,
            cast: r.try_get("ty")?,
            identity: r.try_get::<String, _>("id")? == "YES",
        });
    }
    Ok(out)
}

/// A value as SQLite holds it.
enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// Rows of `table` from `source` into `target`, in batches; the count written, checked
/// against the source's.
async fn copy_table(
    source: &mut sqlx::SqliteConnection,
    target: &mut sqlx::PgConnection,
    table: &str,
    target_cols: &[TargetColumn],
) -> Result<u64, StoreError> {
    let source_cols: Vec<String> = sqlx::query_scalar("SELECT name FROM pragma_table_info($1)")
        .bind(table)
        .fetch_all(&mut *source)
        .await?;
    // Columns only the source has would be lost: refused, naming them.
    let lost: Vec<&String> = source_cols
        .iter()
        .filter(|c| !target_cols.iter().any(|t| &t.name == *c))
        .filter(|c| c.as_str() != "fleet_mark")
        .collect();
    if !lost.is_empty() {
        return Err(failed(format!(
            "{table}: the PostgreSQL schema has no column {lost:?}: nothing copied"
        )));
    }
    // The fleet mark is each database's own (written by its triggers).
    let cols: Vec<&TargetColumn> = target_cols
        .iter()
        .filter(|t| source_cols.contains(&t.name) && t.name != "fleet_mark")
        .collect();
    let names: Vec<&str> = cols.iter().map(|c| c.name.as_str()).collect();
    let rows = sqlx::query(&format!("SELECT {} FROM {table}", names.join(", ")))
        .fetch_all(&mut *source)
        .await?;
    let per_batch = (30_000 / cols.len().max(1)).max(1);
    for chunk in rows.chunks(per_batch) {
        let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(format!(
            "INSERT INTO {table} ({}) ",
            names.join(", ")
        ));
        q.push_values(chunk, |mut b, row| {
            for (i, col) in cols.iter().enumerate() {
                let v = match row.try_get_raw(i) {
                    Ok(raw) if raw.is_null() => Value::Null,
                    Ok(raw) => match raw.type_info().name() {
                        "INTEGER" => row.try_get(i).map_or(Value::Null, Value::Int),
                        "REAL" => row.try_get(i).map_or(Value::Null, Value::Real),
                        "BLOB" => row.try_get(i).map_or(Value::Null, Value::Blob),
                        _ => row.try_get(i).map_or(Value::Null, Value::Text),
                    },
                    Err(_) => Value::Null,
                };
                let cast = format!("::{}", col.cast);
                match v {
                    Value::Null => b.push_bind(None::<String>).push_unseparated(cast),
                    Value::Int(n) => b.push_bind(n).push_unseparated(cast),
                    Value::Real(x) => b.push_bind(x).push_unseparated(cast),
                    Value::Text(s) => b.push_bind(s).push_unseparated(cast),
                    Value::Blob(bytes) => b.push_bind(bytes).push_unseparated(cast),
                };
            }
        });
        q.build()
            .execute(&mut *target)
            .await
            .map_err(|e| failed(format!("copying {table}: {e}: nothing copied")))?;
    }
    let written: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(&mut *target)
        .await?;
    if written as usize != rows.len() {
        return Err(failed(format!(
            "{table}: {} rows read, {written} in the target: nothing copied",
            rows.len()
        )));
    }
    Ok(rows.len() as u64)
}
