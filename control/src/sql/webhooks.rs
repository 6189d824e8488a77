//! Webhooks and their deliveries; a notice's deliveries are made with its event
//! (`add_notice`, in `events.rs`).
use super::*;
use crate::store::{Attempt, Target, WebhookStore};
use tessera_model::notify::{
    Delivery, DeliveryStatus, NoticeBody, NoticeKind, Webhook, WebhookFormat, WebhookInput,
};

const WEBHOOK_COLUMNS: &str = "id, name, url, format, kinds, project, pool, service, created_at";
const DELIVERY_COLUMNS: &str = "d.id, d.webhook_id, d.kind, d.at, d.message, d.service, d.host_id, d.pool, d.status, d.attempts, d.next_at, d.last_status, d.last_error, d.delivered_at";

/// Kinds as stored: `,a,b,` (`,` for every kind), so one is matched with `LIKE '%,a,%'`.
pub(super) fn stored_kinds(kinds: &[NoticeKind]) -> String {
    let mut s = String::from(",");
    for k in kinds {
        s.push_str(k.as_str());
        s.push(',');
    }
    s
}

fn webhook_from_row(row: &DbRow) -> Result<Webhook, StoreError> {
    let kinds: String = row.try_get("kinds")?;
    Ok(Webhook {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        url: row.try_get("url")?,
        format: parse::<WebhookFormat>("webhook format", &row.try_get::<String, _>("format")?)?,
        kinds: kinds
            .split(',')
            .filter(|k| !k.is_empty())
            .map(|k| parse::<NoticeKind>("notification kind", k))
            .collect::<Result<_, _>>()?,
        project: row.try_get("project")?,
        pool: row.try_get("pool")?,
        service: row.try_get("service")?,
        created_at: row.try_get("created_at")?,
    })
}

fn delivery_from_row(row: &DbRow) -> Result<Delivery, StoreError> {
    let id: i64 = row.try_get("id")?;
    Ok(Delivery {
        id,
        webhook_id: row.try_get("webhook_id")?,
        notice: NoticeBody {
            delivery: id,
            kind: parse::<NoticeKind>("notification kind", &row.try_get::<String, _>("kind")?)?,
            at: row.try_get("at")?,
            message: row.try_get("message")?,
            service: row.try_get("service")?,
            host: row.try_get("host_id")?,
            pool: row.try_get("pool")?,
        },
        status: parse::<DeliveryStatus>("delivery status", &row.try_get::<String, _>("status")?)?,
        attempts: row
            .try_get::<i64, _>("attempts")?
            .clamp(0, i64::from(u32::MAX)) as u32,
        last_status: row
            .try_get::<Option<i64>, _>("last_status")?
            .and_then(|s| u16::try_from(s).ok()),
        last_error: row.try_get("last_error")?,
        next_at: row.try_get("next_at")?,
        delivered_at: row.try_get("delivered_at")?,
    })
}

#[async_trait]
impl WebhookStore for This {
    async fn create_webhook(
        &self,
        input: &WebhookInput,
        secret: &str,
        at: Timestamp,
    ) -> Result<Webhook, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let row = sqlx::query(&format!(
            "INSERT INTO webhooks (name, url, format, kinds, project, pool, service, secret, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (name) DO NOTHING RETURNING {WEBHOOK_COLUMNS}"
        ))
        .bind(input.name.trim())
        .bind(input.url.trim())
        .bind(input.format.as_str())
        .bind(stored_kinds(&input.kinds))
        .bind(input.project.as_deref())
        .bind(input.pool.as_deref())
        .bind(input.service.as_deref())
        .bind(secret)
        .bind(at)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| {
            StoreError::Conflict(format!("a webhook named {:?} already exists", input.name.trim()))
        })?;
        let hook = webhook_from_row(&row)?;
        tx.commit().await?;
        Ok(hook)
    }

    async fn list_webhooks(&self) -> Result<Vec<Webhook>, StoreError> {
        sqlx::query(&format!(
            "SELECT {WEBHOOK_COLUMNS} FROM webhooks ORDER BY name"
        ))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(webhook_from_row)
        .collect()
    }

    async fn delete_webhook(&self, id: i64) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        sqlx::query("DELETE FROM webhook_deliveries WHERE webhook_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let gone = sqlx::query("DELETE FROM webhooks WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if gone == 0 {
            return Err(StoreError::NotFound {
                what: "webhook",
                id: id.to_string(),
            });
        }
        tx.commit().await?;
        Ok(())
    }

    async fn due_deliveries(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<(Delivery, Target)>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS}, w.url, w.format AS target_format, w.secret
             FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id
             WHERE d.status = 'pending' AND d.next_at <= $1 ORDER BY d.next_at, d.id LIMIT $2"
        ))
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|row| {
                Ok((
                    delivery_from_row(row)?,
                    Target {
                        url: row.try_get("url")?,
                        format: parse::<WebhookFormat>(
                            "webhook format",
                            &row.try_get::<String, _>("target_format")?,
                        )?,
                        secret: row.try_get("secret")?,
                    },
                ))
            })
            .collect()
    }

    async fn record_attempt(
        &self,
        id: i64,
        at: Timestamp,
        attempt: &Attempt,
    ) -> Result<(), StoreError> {
        let (status, code, error, next_at, delivered) = match attempt {
            Attempt::Delivered { status } => (
                DeliveryStatus::Delivered,
                Some(*status),
                None,
                None,
                Some(at),
            ),
            Attempt::Retry {
                status,
                error,
                next_at,
            } => (
                DeliveryStatus::Pending,
                *status,
                Some(error.as_str()),
                Some(*next_at),
                None,
            ),
            Attempt::GaveUp { status, error } => (
                DeliveryStatus::Failed,
                *status,
                Some(error.as_str()),
                None,
                None,
            ),
        };
        self.write_one(
            sqlx::query(
                "UPDATE webhook_deliveries SET status = $2, attempts = attempts + 1, last_status = $3,
                 last_error = $4, next_at = $5, delivered_at = $6 WHERE id = $1 AND status = 'pending'",
            )
            .bind(id)
            .bind(status.as_str())
            .bind(code.map(i64::from))
            .bind(error)
            .bind(next_at)
            .bind(delivered),
        )
        .await?;
        Ok(())
    }

    async fn list_deliveries(&self, webhook: i64, limit: u32) -> Result<Vec<Delivery>, StoreError> {
        sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d WHERE d.webhook_id = $1 ORDER BY d.id DESC LIMIT $2"
        ))
        .bind(webhook)
        .bind(i64::from(limit.max(1)))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(delivery_from_row)
        .collect()
    }
}
