//! Operators' side of the store: users, API tokens, console sessions, sign-in limits and
//! the audit log.

use crate::error::StoreError;
use async_trait::async_trait;
use tessera_model::auth::{ApiTokenInfo, AuditEntry, Role, UserInfo};

/// What to change of a user; `None` leaves it as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserChange {
    pub role: Option<Role>,
    pub disabled: Option<bool>,
    /// A new password's hash; sessions signed in before the change end.
    pub password_hash: Option<String>,
}

/// A user as sign-in sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserCredentials {
    pub user: UserInfo,
    pub password_hash: String,
    /// Unix seconds; sessions signed in before this are void.
    pub sessions_after: i64,
}

/// An accepted mutation to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditEntry {
    pub actor: String,
    pub action: String,
    pub target: Option<String>,
    pub address: Option<String>,
}

/// Which audit entries to list, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Entries whose actor contains this.
    pub actor: Option<String>,
    /// Entries whose action or target contains this.
    pub text: Option<String>,
    /// Only entries with a smaller id (the next page).
    pub before: Option<i64>,
    pub limit: u32,
}

/// Operators, their API tokens, console sessions and the audit log.
/// A token to store: its hash only, never its value.
pub struct NewToken<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub role: Role,
    pub created_by: &'a str,
    /// Scoped to this project, or `None` for the whole fleet.
    pub project: Option<&'a str>,
    pub expires_in_days: Option<u32>,
    pub token_hash: &'a str,
}

#[async_trait]
pub trait AuthStore: Send + Sync + 'static {
    async fn count_users(&self) -> Result<u64, StoreError>;

    /// A new user; `Conflict` when the name is taken.
    async fn insert_user(
        &self,
        username: &str,
        role: Role,
        password_hash: &str,
    ) -> Result<UserInfo, StoreError>;
    async fn user_credentials(&self, username: &str)
    -> Result<Option<UserCredentials>, StoreError>;
    async fn list_users(&self) -> Result<Vec<UserInfo>, StoreError>;
    async fn update_user(&self, username: &str, change: &UserChange) -> Result<(), StoreError>;

    /// Stores a token (its hash only) and returns it as lists show it.
    async fn insert_api_token(&self, token: &NewToken<'_>) -> Result<ApiTokenInfo, StoreError>;
    /// The token with this hash, if it is valid now: not expired, its creator not disabled;
    /// its role no higher than its creator's now (in its project, for a scoped token).
    async fn valid_api_token(&self, token_hash: &str) -> Result<Option<ApiTokenInfo>, StoreError>;
    /// Gives `username` `role` in `project` (replacing what it had there).
    async fn set_project_member(
        &self,
        project: &str,
        username: &str,
        role: Role,
    ) -> Result<(), StoreError>;
    async fn remove_project_member(&self, project: &str, username: &str) -> Result<(), StoreError>;
    /// Every role given in a project: (project, username, role), by project then user.
    async fn project_members(&self) -> Result<Vec<(String, String, Role)>, StoreError>;
    /// The roles `username` was given, by project.
    async fn roles_of(
        &self,
        username: &str,
    ) -> Result<std::collections::BTreeMap<String, Role>, StoreError>;
    async fn list_api_tokens(&self) -> Result<Vec<ApiTokenInfo>, StoreError>;
    async fn delete_api_token(&self, id: &str) -> Result<(), StoreError>;
    /// Deletes the tokens `username` made; returns how many.
    async fn delete_api_tokens_of(&self, username: &str) -> Result<u64, StoreError>;

    /// A session's data, if it exists and has not expired at `now` (unix seconds).
    async fn load_session(&self, id_hash: &str, now: i64) -> Result<Option<String>, StoreError>;
    /// Creates or replaces a session; also forgets sessions expired at `now`.
    async fn save_session(
        &self,
        id_hash: &str,
        data: &str,
        expires_at: i64,
        now: i64,
    ) -> Result<(), StoreError>;
    async fn delete_session(&self, id_hash: &str) -> Result<(), StoreError>;

    /// Counts one sign-in attempt against each of `keys`, checked and counted in one
    /// statement per key (so a burst across servers cannot slip past the limit): a key's
    /// window restarts when it began before `window_cutoff`. Returns, per key, the
    /// attempts counted in its window (this one included) and when that window began.
    async fn count_sign_in_attempt(
        &self,
        keys: &[String],
        now: &str,
        window_cutoff: &str,
    ) -> Result<Vec<(u64, String)>, StoreError>;
    /// Forgets the attempts counted against `key` (after a successful sign-in).
    async fn clear_sign_in_attempts(&self, key: &str) -> Result<(), StoreError>;
    /// Gives back one attempt counted against `key` (a sign-in that succeeded: only
    /// failures use up an address's allowance).
    async fn refund_sign_in_attempt(&self, key: &str) -> Result<(), StoreError>;

    async fn add_audit(&self, entry: &NewAuditEntry) -> Result<(), StoreError>;
    async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, StoreError>;
}
