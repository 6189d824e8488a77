//! Servers sharing the database, and the scheduler lease.

use super::*;
use crate::store::{ClusterStore, Fence, Lease, ServerRow, Store};
use std::sync::Arc;

fn lease_from_row(row: &DbRow) -> Result<Lease, StoreError> {
    Ok(Lease {
        holder: row.try_get("holder")?,
        epoch: row.try_get("epoch")?,
        since: row.try_get("since")?,
        expires_at: row.try_get("expires_at")?,
    })
}

#[async_trait]
impl ClusterStore for This {
    async fn server_seen(
        &self,
        id: &str,
        address: &str,
        started_at: &str,
        now: &str,
    ) -> Result<(), StoreError> {
        // The version is this build's: a server announces only itself.
        sqlx::query(
            "INSERT INTO servers (id, address, started_at, last_seen_at, version) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO UPDATE SET address = excluded.address, last_seen_at = excluded.last_seen_at,
             version = excluded.version",
        )
        .bind(id)
        .bind(address)
        .bind(started_at)
        .bind(now)
        .bind(tessera_model::version::VERSION)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    async fn list_servers(&self, since: &str) -> Result<Vec<ServerRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, address, started_at, last_seen_at, version FROM servers WHERE last_seen_at >= $1 ORDER BY id",
        )
        .bind(since)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ServerRow {
                    id: r.try_get("id")?,
                    address: r.try_get("address")?,
                    started_at: r.try_get("started_at")?,
                    last_seen_at: r.try_get("last_seen_at")?,
                    version: r.try_get("version")?,
                })
            })
            .collect()
    }

    async fn db_now(&self) -> Result<String, StoreError> {
        let row = sqlx::query(&format!("SELECT {NOW} AS now"))
            .fetch_one(&self.db)
            .await?;
        Ok(row.try_get("now")?)
    }

    async fn acquire_lease(
        &self,
        holder: &str,
        held: Option<i64>,
        now: Timestamp,
        expires_at: Timestamp,
    ) -> Result<Option<Lease>, StoreError> {
        let mut tx = self.lock_writes().await?;
        let current = sqlx::query(
            "SELECT holder, epoch, since, expires_at FROM scheduler_lease WHERE one = 1",
        )
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| lease_from_row(&r))
        .transpose()?;
        let lease = match current {
            Some(l) if l.holder == holder && Some(l.epoch) == held => Lease { expires_at, ..l },
            Some(l) if l.holder != holder && l.expires_at >= now => {
                tx.commit().await?;
                return Ok(None);
            }
            other => Lease {
                holder: holder.to_owned(),
                epoch: other.map_or(1, |l| l.epoch + 1),
                since: now,
                expires_at,
            },
        };
        sqlx::query(
            "INSERT INTO scheduler_lease (one, holder, epoch, since, expires_at) VALUES (1, $1, $2, $3, $4)
             ON CONFLICT (one) DO UPDATE SET holder = excluded.holder, epoch = excluded.epoch,
                 since = excluded.since, expires_at = excluded.expires_at",
        )
        .bind(&lease.holder)
        .bind(lease.epoch)
        .bind(lease.since)
        .bind(lease.expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(lease))
    }

    async fn release_lease(&self, holder: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE scheduler_lease SET expires_at = $1 WHERE one = 1 AND holder = $2")
            .bind(Timestamp::EPOCH)
            .bind(holder)
            .execute(&self.db)
            .await?;
        Ok(())
    }

    async fn lease(&self) -> Result<Option<Lease>, StoreError> {
        sqlx::query("SELECT holder, epoch, since, expires_at FROM scheduler_lease WHERE one = 1")
            .fetch_optional(&self.db)
            .await?
            .map(|r| lease_from_row(&r))
            .transpose()
    }

    fn fenced(&self, fence: Fence) -> Arc<dyn Store> {
        Arc::new(self.with_fence(fence))
    }

    async fn publish_change(&self, from: &str) -> Result<(), StoreError> {
        self.publish(from).await
    }

    async fn listen_changes(
        &self,
    ) -> Result<Option<tokio::sync::mpsc::Receiver<Option<String>>>, StoreError> {
        self.listen().await
    }
}
