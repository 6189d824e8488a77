//! Users, API tokens, console sessions, the audit log.

use super::*;
use crate::store::{AuditFilter, AuthStore, NewAuditEntry, NewToken, UserChange, UserCredentials};
use tessera_model::auth::{ApiTokenInfo, AuditEntry, Role, UserInfo};

fn role(row: &DbRow) -> Result<Role, StoreError> {
    let raw: String = row.try_get("role")?;
    raw.parse().map_err(|e| StoreError::corrupt("role", e))
}

fn user_from_row(row: &DbRow) -> Result<UserInfo, StoreError> {
    Ok(UserInfo {
        username: row.try_get("username")?,
        role: role(row)?,
        disabled: row.try_get::<i64, _>("disabled")? != 0,
        created_at: row.try_get("created_at")?,
    })
}

fn token_from_row(row: &DbRow) -> Result<ApiTokenInfo, StoreError> {
    Ok(ApiTokenInfo {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        role: role(row)?,
        project: row.try_get("project")?,
        created_by: row.try_get("created_by")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
    })
}

const USER_COLUMNS: &str = "username, role, disabled, created_at";
const TOKEN_COLUMNS: &str =
    "t.id, t.name, t.role, t.project, t.created_by, t.created_at, t.expires_at";

#[async_trait]
impl AuthStore for This {
    async fn count_users(&self) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM users")
            .fetch_one(&self.db)
            .await?
            .try_get("n")?;
        Ok(n as u64)
    }

    async fn insert_user(
        &self,
        username: &str,
        role: Role,
        password_hash: &str,
    ) -> Result<UserInfo, StoreError> {
        let row = sqlx::query(&format!(
            "INSERT INTO users (username, role, password_hash) VALUES ($1, $2, $3)
             ON CONFLICT (username) DO NOTHING RETURNING {USER_COLUMNS}"
        ))
        .bind(username)
        .bind(role.as_str())
        .bind(password_hash)
        .fetch_optional(&self.db)
        .await?
        .ok_or_else(|| StoreError::Conflict(format!("a user named {username:?} already exists")))?;
        user_from_row(&row)
    }

    async fn user_credentials(
        &self,
        username: &str,
    ) -> Result<Option<UserCredentials>, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT {USER_COLUMNS}, password_hash, sessions_after FROM users WHERE username = $1"
        ))
        .bind(username)
        .fetch_optional(&self.db)
        .await?;
        row.map(|row| {
            Ok(UserCredentials {
                user: user_from_row(&row)?,
                password_hash: row.try_get("password_hash")?,
                sessions_after: row.try_get("sessions_after")?,
            })
        })
        .transpose()
    }

    async fn list_users(&self) -> Result<Vec<UserInfo>, StoreError> {
        sqlx::query(&format!(
            "SELECT {USER_COLUMNS} FROM users ORDER BY username"
        ))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(user_from_row)
        .collect()
    }

    async fn update_user(&self, username: &str, change: &UserChange) -> Result<(), StoreError> {
        let role = change.role.map(Role::as_str);
        let disabled = change.disabled.map(i64::from);
        // One statement, so two admins demoting each other at once cannot both succeed:
        // the change applies unless it would leave no enabled admin.
        let done = self
            .write_one(
                sqlx::query(
                    "UPDATE users SET
                 role = COALESCE($1, role),
                 disabled = COALESCE($2, disabled),
                 password_hash = COALESCE($3, password_hash),
                 sessions_after = CASE WHEN $3 IS NULL THEN sessions_after ELSE $5 END
             WHERE username = $4
               AND NOT (role = 'admin' AND disabled = 0
                        AND (COALESCE($1, role) != 'admin' OR COALESCE($2, disabled) = 1)
                        AND (SELECT COUNT(*) FROM users u
                             WHERE u.role = 'admin' AND u.disabled = 0 AND u.username != $4) = 0)",
                )
                .bind(role)
                .bind(disabled)
                .bind(change.password_hash.as_deref())
                .bind(username)
                .bind(chrono::Utc::now().timestamp()),
            )
            .await?;
        if done.rows_affected() == 0 && self.user_credentials(username).await?.is_some() {
            return Err(StoreError::Conflict(format!(
                "{username} is the last enabled admin; make another admin first"
            )));
        }
        updated(done, "user", username)
    }

    async fn insert_api_token(&self, token: &NewToken<'_>) -> Result<ApiTokenInfo, StoreError> {
        let row = sqlx::query(
            "INSERT INTO api_tokens (id, name, role, project, created_by, token_hash, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             RETURNING id, name, role, project, created_by, created_at, expires_at",
        )
        .bind(token.id)
        .bind(token.name)
        .bind(token.role.as_str())
        .bind(token.project)
        .bind(token.created_by)
        .bind(token.token_hash)
        .bind(token.expires_in_days.map(|days| {
            crate::clock::stamp(chrono::Utc::now() + chrono::Duration::days(i64::from(days)))
        }))
        .fetch_one(&self.db)
        .await?;
        token_from_row(&row)
    }

    async fn valid_api_token(&self, token_hash: &str) -> Result<Option<ApiTokenInfo>, StoreError> {
        let Some(row) = sqlx::query(&format!(
            "SELECT {TOKEN_COLUMNS}, u.role AS user_role, m.role AS member_role
             FROM api_tokens t JOIN users u ON u.username = t.created_by
             LEFT JOIN project_members m ON m.project = t.project AND m.username = t.created_by
             WHERE t.token_hash = $1 AND u.disabled = 0
               AND (t.expires_at IS NULL OR t.expires_at > $2)"
        ))
        .bind(token_hash)
        .bind(crate::clock::stamp(chrono::Utc::now()))
        .fetch_optional(&self.db)
        .await?
        else {
            return Ok(None);
        };
        let mut token = token_from_row(&row)?;
        // Worth no more than its user is now: a demoted user's tokens are demoted too. A
        // token scoped to a project is worth what its user was given there (an admin's
        // stays an admin's): a fleet-wide role alone gives it nothing to act with.
        let parse = |raw: String| {
            raw.parse::<Role>()
                .map_err(|e| StoreError::corrupt("user role", e))
        };
        let mut user = parse(row.try_get("user_role")?)?;
        if token.project.is_some() && user != Role::Admin {
            user = match row.try_get::<Option<String>, _>("member_role")? {
                Some(member) => parse(member)?,
                None => Role::Viewer,
            };
        }
        if !user.allows(token.role) {
            token.role = user;
        }
        Ok(Some(token))
    }

    async fn set_project_member(
        &self,
        project: &str,
        username: &str,
        role: Role,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO project_members (project, username, role) VALUES ($1, $2, $3)
             ON CONFLICT (project, username) DO UPDATE SET role = excluded.role",
        )
        .bind(project)
        .bind(username)
        .bind(role.as_str())
        .execute(&self.db)
        .await?;
        Ok(())
    }

    async fn remove_project_member(&self, project: &str, username: &str) -> Result<(), StoreError> {
        let done = self
            .write_one(
                sqlx::query("DELETE FROM project_members WHERE project = $1 AND username = $2")
                    .bind(project)
                    .bind(username),
            )
            .await?;
        updated(done, "project member", username)
    }

    async fn project_members(&self) -> Result<Vec<(String, String, Role)>, StoreError> {
        sqlx::query(
            "SELECT project, username, role FROM project_members ORDER BY project, username",
        )
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(|r| Ok((r.try_get("project")?, r.try_get("username")?, role(r)?)))
        .collect()
    }

    async fn roles_of(
        &self,
        username: &str,
    ) -> Result<std::collections::BTreeMap<String, Role>, StoreError> {
        sqlx::query("SELECT project, role FROM project_members WHERE username = $1")
            .bind(username)
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(|r| Ok((r.try_get("project")?, role(r)?)))
            .collect()
    }

    async fn list_api_tokens(&self) -> Result<Vec<ApiTokenInfo>, StoreError> {
        sqlx::query(&format!(
            "SELECT {TOKEN_COLUMNS} FROM api_tokens t ORDER BY t.created_at, t.id"
        ))
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(token_from_row)
        .collect()
    }

    async fn delete_api_token(&self, id: &str) -> Result<(), StoreError> {
        let done = self
            .write_one(sqlx::query("DELETE FROM api_tokens WHERE id = $1").bind(id))
            .await?;
        updated(done, "API token", id)
    }

    async fn count_sign_in_attempt(
        &self,
        keys: &[String],
        now: &str,
        window_cutoff: &str,
    ) -> Result<Vec<(u64, String)>, StoreError> {
        let mut counted = Vec::with_capacity(keys.len());
        for key in keys {
            let row = sqlx::query(
                "INSERT INTO sign_in_attempts (key, window_start, attempts) VALUES ($1, $2, 1)
                 ON CONFLICT (key) DO UPDATE SET
                     attempts = CASE WHEN sign_in_attempts.window_start < $3 THEN 1
                                     ELSE sign_in_attempts.attempts + 1 END,
                     window_start = CASE WHEN sign_in_attempts.window_start < $3 THEN $2
                                         ELSE sign_in_attempts.window_start END
                 RETURNING attempts, window_start",
            )
            .bind(key)
            .bind(now)
            .bind(window_cutoff)
            .fetch_one(&self.db)
            .await?;
            counted.push((
                row.try_get::<i64, _>("attempts")?.max(0) as u64,
                row.try_get("window_start")?,
            ));
        }
        Ok(counted)
    }

    async fn clear_sign_in_attempts(&self, key: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM sign_in_attempts WHERE key = $1")
            .bind(key)
            .execute(&self.db)
            .await?;
        Ok(())
    }

    async fn delete_api_tokens_of(&self, username: &str) -> Result<u64, StoreError> {
        Ok(self
            .write_one(sqlx::query("DELETE FROM api_tokens WHERE created_by = $1").bind(username))
            .await?
            .rows_affected())
    }

    async fn refund_sign_in_attempt(&self, key: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE sign_in_attempts SET attempts = attempts - 1 WHERE key = $1 AND attempts > 0",
        )
        .bind(key)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    async fn load_session(&self, id_hash: &str, now: i64) -> Result<Option<String>, StoreError> {
        let row = sqlx::query("SELECT data FROM sessions WHERE id_hash = $1 AND expires_at > $2")
            .bind(id_hash)
            .bind(now)
            .fetch_optional(&self.db)
            .await?;
        Ok(row.map(|r| r.try_get("data")).transpose()?)
    }

    async fn save_session(
        &self,
        id_hash: &str,
        data: &str,
        expires_at: i64,
        now: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.db.begin().await?;
        sqlx::query("DELETE FROM sessions WHERE expires_at <= $1")
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO sessions (id_hash, data, expires_at) VALUES ($1, $2, $3)
             ON CONFLICT (id_hash) DO UPDATE SET data = excluded.data, expires_at = excluded.expires_at",
        )
        .bind(id_hash)
        .bind(data)
        .bind(expires_at)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn delete_session(&self, id_hash: &str) -> Result<(), StoreError> {
        self.write_one(sqlx::query("DELETE FROM sessions WHERE id_hash = $1").bind(id_hash))
            .await?;
        Ok(())
    }

    async fn add_audit(&self, e: &NewAuditEntry) -> Result<(), StoreError> {
        self.write_one(
            sqlx::query(
                "INSERT INTO audit_log (actor, action, target, address) VALUES ($1, $2, $3, $4)",
            )
            .bind(&e.actor)
            .bind(&e.action)
            .bind(e.target.as_deref())
            .bind(e.address.as_deref()),
        )
        .await?;
        Ok(())
    }

    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError> {
        let mut q = QueryBuilder::<Db>::new(
            "SELECT id, at, actor, action, target, address FROM audit_log WHERE 1 = 1",
        );
        if let Some(actor) = &filter.actor {
            q.push(format_args!(" AND {INSTR}(actor, "))
                .push_bind(actor.clone())
                .push(") > 0");
        }
        if let Some(text) = &filter.text {
            q.push(format_args!(" AND ({INSTR}(action, "))
                .push_bind(text.clone())
                .push(format_args!(") > 0 OR {INSTR}(COALESCE(target, ''), "))
                .push_bind(text.clone())
                .push(") > 0)");
        }
        if let Some(before) = filter.before {
            q.push(" AND id < ").push_bind(before);
        }
        q.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(filter.limit.max(1)));
        q.build()
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(|row| {
                Ok(AuditEntry {
                    id: row.try_get("id")?,
                    at: row.try_get("at")?,
                    actor: row.try_get("actor")?,
                    action: row.try_get("action")?,
                    target: row.try_get("target")?,
                    address: row.try_get("address")?,
                })
            })
            .collect()
    }
}
