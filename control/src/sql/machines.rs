//! Machines asked of pools' capacity providers.
use super::*;
use crate::store::{Joined, MachineStore};
use tessera_model::provider::{Machine, MachineState};

const MACHINE_COLUMNS: &str =
    "id, pool, provider_id, host_id, state, reason, asked_at, joined_at, ended_at";

fn machine_from_row(row: &DbRow) -> Result<Machine, StoreError> {
    Ok(Machine {
        id: row.try_get("id")?,
        pool: PoolName::new(row.try_get::<String, _>("pool")?)
            .map_err(|e| StoreError::corrupt("machine pool", e))?,
        provider_id: row.try_get("provider_id")?,
        host_id: row
            .try_get::<Option<String>, _>("host_id")?
            .map(host_id)
            .transpose()?,
        state: parse::<MachineState>("machine state", row.try_get("state")?)?,
        reason: row.try_get("reason")?,
        asked_at: row.try_get("asked_at")?,
        joined_at: row.try_get("joined_at")?,
        ended_at: row.try_get("ended_at")?,
    })
}

#[async_trait]
impl MachineStore for This {
    async fn add_machines(&self, machines: &[Machine]) -> Result<(), StoreError> {
        if machines.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin_immediate().await?;
        for m in machines {
            sqlx::query(
                "INSERT INTO machines (id, pool, provider_id, host_id, state, reason, asked_at, joined_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(&m.id)
            .bind(m.pool.as_str())
            .bind(m.provider_id.as_deref())
            .bind(m.host_id.as_ref().map(HostId::as_str))
            .bind(m.state.as_str())
            .bind(&m.reason)
            .bind(m.asked_at)
            .bind(m.joined_at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn list_machines(
        &self,
        pool: Option<&PoolName>,
        ended: bool,
        limit: u32,
    ) -> Result<Vec<Machine>, StoreError> {
        let mut q = QueryBuilder::<Db>::new(format!(
            "SELECT {MACHINE_COLUMNS} FROM machines WHERE 1 = 1"
        ));
        if let Some(p) = pool {
            q.push(" AND pool = ").push_bind(p.to_string());
        }
        if !ended {
            q.push(" AND state IN ('booting', 'active', 'terminating')");
        }
        q.push(" ORDER BY asked_at DESC, id DESC LIMIT ")
            .push_bind(i64::from(limit.max(1)));
        q.build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(machine_from_row)
            .collect()
    }

    async fn set_machine_state(
        &self,
        id: &str,
        from: MachineState,
        to: MachineState,
        reason: &str,
        at: &str,
    ) -> Result<bool, StoreError> {
        let ended = (!to.live()).then_some(at);
        let done = self
            .write_one(
                sqlx::query(
                    "UPDATE machines SET state = $1, reason = $2, ended_at = COALESCE($3, ended_at) WHERE id = $4 AND state = $5",
                )
                .bind(to.as_str())
                .bind(reason)
                .bind(ended)
                .bind(id)
                .bind(from.as_str()),
            )
            .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn set_machine_provider_id(&self, id: &str, provider_id: &str) -> Result<(), StoreError> {
        self.write_one(
            sqlx::query("UPDATE machines SET provider_id = $1 WHERE id = $2")
                .bind(provider_id)
                .bind(id),
        )
        .await?;
        Ok(())
    }

    async fn join_machine(
        &self,
        pool: &PoolName,
        provider_id: &str,
        host: &HostId,
        at: &str,
    ) -> Result<Joined, StoreError> {
        let mut tx = self.begin_immediate().await?;
        let known: Option<(String, String)> = sqlx::query_as(
            "SELECT id, state FROM machines WHERE pool = $1 AND provider_id = $2 AND state IN ('booting', 'active') ORDER BY asked_at DESC LIMIT 1",
        )
        .bind(pool.as_str())
        .bind(provider_id)
        .fetch_optional(&mut *tx)
        .await?;
        let unnamed: Option<(String,)> = match &known {
            Some(_) => None,
            None => {
                sqlx::query_as(
                    "SELECT id FROM machines WHERE pool = $1 AND provider_id IS NULL AND state = 'booting' ORDER BY asked_at, id LIMIT 1",
                )
                .bind(pool.as_str())
                .fetch_optional(&mut *tx)
                .await?
            }
        };
        let (id, joined): (String, fn(String) -> Joined) = match (known, unnamed) {
            (Some((id, state)), _) if state == "booting" => (id, Joined::Asked),
            (Some((id, _)), _) => (id, Joined::Again),
            (None, Some((id,))) => (id, Joined::Claimed),
            (None, None) => return Ok(Joined::Unknown),
        };
        sqlx::query(
            "UPDATE machines SET state = 'active', host_id = $1, provider_id = $2, joined_at = COALESCE(joined_at, $3) WHERE id = $4",
        )
        .bind(host.as_str())
        .bind(provider_id)
        .bind(at)
        .bind(&id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(joined(id))
    }
}
