//! Events and settings.
use super::*;
use tessera_model::notify::NoticeKind;

#[async_trait]
impl EventStore for This {
    async fn add_event(
        &self,
        service: Option<&str>,
        host: Option<&HostId>,
        message: &str,
    ) -> Result<(), StoreError> {
        self.write_one(
            sqlx::query("INSERT INTO events (service, host_id, message) VALUES ($1, $2, $3)")
                .bind(service)
                .bind(host.map(HostId::as_str))
                .bind(message),
        )
        .await?;
        Ok(())
    }

    async fn add_notice(
        &self,
        kind: NoticeKind,
        (service, host, pool): (Option<&str>, Option<&HostId>, Option<&str>),
        message: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_immediate().await?;
        let at: Timestamp = sqlx::query_scalar(
            "INSERT INTO events (service, host_id, message) VALUES ($1, $2, $3) RETURNING at",
        )
        .bind(service)
        .bind(host.map(HostId::as_str))
        .bind(message)
        .fetch_one(&mut *tx)
        .await?;
        // Where it is: its service's pool and project, or its host's pool.
        let (mut pool, mut project): (Option<String>, Option<String>) =
            (pool.map(str::to_owned), None);
        if let Some(s) = service
            && let Some((p, pr)) = sqlx::query_as::<_, (String, String)>(
                "SELECT pool, project FROM services WHERE name = $1",
            )
            .bind(s)
            .fetch_optional(&mut *tx)
            .await?
        {
            pool = pool.or(Some(p));
            project = Some(pr);
        }
        if pool.is_none()
            && let Some(h) = host
        {
            pool = sqlx::query_scalar("SELECT pool FROM hosts WHERE id = $1")
                .bind(h.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        }
        sqlx::query(
            "INSERT INTO webhook_deliveries (webhook_id, kind, at, message, service, host_id, pool, status, next_at)
             SELECT id, $1, $2, $3, $4, $5, $6, 'pending', $2 FROM webhooks
             WHERE (kinds = ',' OR kinds LIKE $7)
               AND (service IS NULL OR service = $4)
               AND (pool IS NULL OR pool = $6)
               AND (project IS NULL OR project = $8)",
        )
        .bind(kind.as_str())
        .bind(at)
        .bind(message)
        .bind(service)
        .bind(host.map(HostId::as_str))
        .bind(pool.as_deref())
        .bind(format!("%,{},%", kind.as_str()))
        .bind(project.as_deref())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_events(&self, filter: &EventFilter) -> Result<Vec<Event>, StoreError> {
        let mut q = QueryBuilder::<Db>::new(
            "SELECT id, at, service, host_id, message FROM events WHERE 1 = 1",
        );
        if let Some(s) = &filter.service {
            q.push(" AND service = ").push_bind(s.clone());
        }
        if let Some(h) = &filter.host {
            q.push(" AND host_id = ").push_bind(h.to_string());
        }
        if let Some(t) = &filter.task {
            let escaped = t
                .replace('\\', "\\\\")
                .replace('%', "\\%")
                .replace('_', "\\_");
            q.push(" AND message LIKE ")
                .push_bind(format!("%{escaped}%"))
                .push(" ESCAPE '\\'");
        }
        if let Some(after) = filter.after {
            q.push(" AND id > ").push_bind(after);
        }
        q.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(filter.limit.max(1)));
        q.build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(event_from_row)
            .collect()
    }

    async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.db)
            .await?;
        Ok(row.map(|r| r.try_get("value")).transpose()?)
    }

    async fn set_setting(&self, key: &str, value: &str) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
            .bind(key)
            .bind(value)
            .execute(&self.db)
            .await?;
        Ok(())
    }
}
