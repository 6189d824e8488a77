//! Events and settings.
use super::*;

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
