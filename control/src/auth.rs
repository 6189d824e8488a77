//! Who may do what, server side: operators' accounts (argon2id hashes), sign-in with a limit on
//! failures, API tokens (only their hashes are kept), console session records, the audit
//! log, and the admin's controls over hosts' credentials and the join token.
//!
//! Authentication itself (cookies, bearer tokens, which route needs which role) is a layer
//! of the HTTP server; this module is what it stores and checks through.

use crate::agents::{hash_token, new_token};
use crate::error::ControlError;
use crate::parts::{Core, HashQueue};
use crate::store::{AuditFilter, AuthStore, NewAuditEntry, ProjectStore, UserChange};
use argon2::Argon2;
use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tessera_model::auth::{
    ApiTokenInfo, AuditEntry, Caller, CallerKind, NewApiToken, Role, UserInfo,
};
use tessera_model::ids::{NAME_RULE, is_valid_name};

/// The account made on first start.
pub const ADMIN_USER: &str = "admin";
use tessera_model::limits::accounts::MAX_TOKEN_DAYS;
pub use tessera_model::limits::accounts::{MAX_ATTEMPTS, MIN_PASSWORD_LEN};
/// What every API token starts with, so a leaked one is recognisable (and so the server
/// tells them from agent tokens without a lookup).
pub const API_TOKEN_PREFIX: &str = "tsr_";
/// A key's window starts at its first attempt.
pub const ATTEMPT_WINDOW: Duration = Duration::from_secs(60);

/// What a token made at sign-in is for: the whole fleet or one project, and how long.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenScope<'a> {
    /// Scoped to this project (the user's role there), or `None` for the whole fleet.
    pub project: Option<&'a str>,
    pub expires_in_days: Option<u32>,
}

/// What a console session holds: who signed in, and when (for the absolute expiry and for
/// ending sessions when the password changes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionUser {
    pub username: String,
    /// Unix seconds.
    pub signed_in_at: i64,
}

/// An argon2id hash (PHC string) of `password`.
pub fn hash_password(password: &str) -> Result<String, ControlError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| ControlError::invalid("password", format!("cannot be hashed: {e}")))
}

fn verify_password(password: &str, hash: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| {
        Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

/// A hash to verify against when the user does not exist, so that answering "no such user"
/// takes as long as "wrong password".
fn decoy_hash() -> &'static str {
    static DECOY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DECOY.get_or_init(|| hash_password("decoy password for timing").unwrap_or_default())
}

fn check_password(password: &str) -> Result<(), ControlError> {
    if password.chars().count() < MIN_PASSWORD_LEN {
        return Err(ControlError::invalid(
            "password",
            format!("must be at least {MIN_PASSWORD_LEN} characters"),
        ));
    }
    Ok(())
}

fn check_username(username: &str) -> Result<(), ControlError> {
    if !is_valid_name(username) {
        return Err(ControlError::invalid("username", NAME_RULE));
    }
    Ok(())
}

/// A password to print once: 24 characters from an alphabet without look-alikes.
pub fn generate_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let raw = uuid::Uuid::new_v4().into_bytes();
    let more = uuid::Uuid::new_v4().into_bytes();
    raw.iter()
        .chain(more.iter())
        .take(24)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Operators' accounts, API tokens, console sessions and the audit log: what the HTTP
/// layer's authentication stores and checks through. Holds the accounts' store and the
/// queue password checks wait in; nothing else.
#[derive(Clone)]
pub struct Accounts {
    store: Arc<dyn AuthStore>,
    /// Only to check that a scoped token's project exists.
    projects: Arc<dyn ProjectStore>,
    core: Core,
    /// Password checks running and waiting (see [`HashQueue`]).
    hash_queue: Arc<HashQueue>,
}

impl Accounts {
    pub(crate) fn new(
        store: Arc<dyn AuthStore>,
        projects: Arc<dyn ProjectStore>,
        core: Core,
    ) -> Accounts {
        Accounts {
            store,
            projects,
            core,
            hash_queue: Arc::default(),
        }
    }

    /// The same accounts writing through `store` (a pass's fenced store); the queue of
    /// password checks is shared.
    pub(crate) fn with_store(&self, store: Arc<dyn crate::store::Store>, core: Core) -> Accounts {
        Accounts {
            store: store.clone(),
            projects: store,
            core,
            hash_queue: self.hash_queue.clone(),
        }
    }

    /// Makes sure the `admin` account exists. With `given`, that is its password from now on
    /// (created, or its password reset; a disabled or demoted admin stays so). Without, on first start (no users at all) it gets a
    /// generated password, returned to be printed once; with `regenerate` (the demo) a new
    /// one is set on every start.
    pub async fn ensure_admin(
        &self,
        given: Option<&str>,
        regenerate: bool,
    ) -> Result<Option<String>, ControlError> {
        let (password, generated) = match given {
            Some(p) => (p.to_owned(), false),
            None if regenerate || self.store.count_users().await? == 0 => {
                (generate_password(), true)
            }
            None => return Ok(None),
        };
        check_password(&password)?;
        let hash = hash_password(&password)?;
        if let Some(existing) = self.store.user_credentials(ADMIN_USER).await? {
            // Its password only: a configured password that re-enabled a disabled admin,
            // or restored a demoted one's role, would undo an administrator's decision on
            // every restart (`tessera user enable admin` does that on purpose).
            if existing.user.disabled {
                tracing::warn!(
                    "the admin account is disabled: the configured password is set, but it stays disabled (`tessera user enable admin` enables it)"
                );
            }
            self.store
                .update_user(
                    ADMIN_USER,
                    &UserChange {
                        role: None,
                        disabled: None,
                        password_hash: Some(hash),
                    },
                )
                .await?;
        } else {
            self.store
                .insert_user(ADMIN_USER, Role::Admin, &hash)
                .await?;
        }
        Ok(generated.then_some(password))
    }

    pub async fn add_user(
        &self,
        username: &str,
        password: &str,
        role: Role,
    ) -> Result<UserInfo, ControlError> {
        check_username(username)?;
        check_password(password)?;
        let hash = self.hash_of(password).await?;
        Ok(self.store.insert_user(username, role, &hash).await?)
    }

    pub async fn list_users(&self) -> Result<Vec<UserInfo>, ControlError> {
        Ok(self.store.list_users().await?)
    }

    /// Changes a user's role, enabled state and/or password. The last enabled admin cannot
    /// be demoted or disabled (the store refuses it atomically), so the fleet never loses
    /// its administrator.
    pub async fn update_user(
        &self,
        username: &str,
        role: Option<Role>,
        disabled: Option<bool>,
        password: Option<&str>,
    ) -> Result<UserInfo, ControlError> {
        if role.is_none() && disabled.is_none() && password.is_none() {
            return Err(ControlError::invalid(
                "(body)",
                "give role, disabled and/or password",
            ));
        }
        let password_hash = match password {
            Some(p) => {
                check_password(p)?;
                Some(self.hash_of(p).await?)
            }
            None => None,
        };
        self.store
            .update_user(
                username,
                &UserChange {
                    role,
                    disabled,
                    password_hash,
                },
            )
            .await?;
        Ok(self
            .store
            .user_credentials(username)
            .await?
            .ok_or_else(|| ControlError::NotFound(format!("user {username:?} not found")))?
            .user)
    }

    /// An argon2id hash of `password`, made in the hashing queue.
    async fn hash_of(&self, password: &str) -> Result<String, ControlError> {
        let password = password.to_owned();
        self.hash_queue
            .run(move || hash_password(&password))
            .await?
    }

    /// Checks a password sign-in. Attempts are limited per user and per client address
    /// ([`MAX_ATTEMPTS`] per [`ATTEMPT_WINDOW`], then `TooManyAttempts`), counted before
    /// the password is hashed; hashing waits in a bounded queue (`Busy` when it is full).
    /// Failures are logged without the password. Unknown users, wrong passwords and
    /// disabled accounts all get the same answer, in the same time.
    pub async fn sign_in(
        &self,
        username: &str,
        password: &str,
        address: Option<IpAddr>,
    ) -> Result<(UserInfo, SessionUser), ControlError> {
        // A sprayed name is bounded in what it stores.
        let user_key = format!("user:{}", username.chars().take(128).collect::<String>());
        let mut keys = vec![user_key.clone()];
        if let Some(a) = address {
            keys.push(format!("addr:{a}"));
        }
        let now = self.core.now();
        let counted = self
            .store
            .count_sign_in_attempt(
                &keys,
                &crate::clock::stamp(now),
                &crate::clock::stamp(now - crate::clock::to_chrono(ATTEMPT_WINDOW)),
            )
            .await?;
        let over = counted
            .iter()
            .filter(|(n, _)| *n > MAX_ATTEMPTS)
            .map(|(_, start)| {
                let end = chrono::DateTime::parse_from_rfc3339(start)
                    .map(|s| s.with_timezone(&chrono::Utc))
                    .unwrap_or(now)
                    + crate::clock::to_chrono(ATTEMPT_WINDOW);
                crate::clock::since(end, now).as_secs() + 1
            })
            .max();
        if let Some(retry_after) = over {
            tracing::warn!(username, ?address, "sign-in refused: too many attempts");
            return Err(ControlError::TooManyAttempts { retry_after });
        }
        let creds = self.store.user_credentials(username).await?;
        let hash = creds
            .as_ref()
            .map_or_else(|| decoy_hash().to_owned(), |c| c.password_hash.clone());
        let password_ok = self
            .hash_queue
            .run({
                let password = password.to_owned();
                move || verify_password(&password, &hash)
            })
            .await?;
        match creds {
            Some(c) if password_ok && !c.user.disabled => {
                // Counted before the check, so a burst cannot slip past; given back once it
                // succeeds: only failures use up the allowance.
                self.store.clear_sign_in_attempts(&user_key).await?;
                for key in keys.iter().skip(1) {
                    self.store.refund_sign_in_attempt(key).await?;
                }
                Ok((
                    c.user.clone(),
                    SessionUser {
                        username: c.user.username,
                        signed_in_at: unix_now(),
                    },
                ))
            }
            _ => {
                tracing::warn!(username, ?address, "sign-in failed");
                Err(ControlError::Unauthorized(
                    "wrong username or password, or the account is disabled".into(),
                ))
            }
        }
    }

    /// The caller a console session stands for, if it is still valid: the user exists, is
    /// enabled, and signed in after its last password change.
    pub async fn session_caller(
        &self,
        session: &SessionUser,
    ) -> Result<Option<Caller>, ControlError> {
        let Some(c) = self
            .store
            .user_credentials(&session.username)
            .await?
            .filter(|c| !c.user.disabled && session.signed_in_at >= c.sessions_after)
        else {
            return Ok(None);
        };
        let projects = self.store.roles_of(&c.user.username).await?;
        Ok(Some(Caller {
            name: c.user.username,
            on_behalf_of: None,
            kind: CallerKind::Session,
            role: c.user.role,
            token_id: None,
            projects,
            project: None,
        }))
    }

    /// Makes an API token with a role no higher than its creator's (in `project`, for a
    /// token scoped to one); its value is returned this once.
    pub async fn create_api_token(
        &self,
        creator: &Caller,
        name: &str,
        role: Role,
        project: Option<&str>,
        expires_in_days: Option<u32>,
    ) -> Result<NewApiToken, ControlError> {
        let mut e = crate::inputs::Errors::default();
        if name.trim().is_empty() || name.chars().count() > 100 {
            e.add("name", "give the token a name of 1 to 100 characters");
        }
        match project {
            Some(p) => {
                if matches!(
                    self.projects.get_project(p).await,
                    Err(crate::error::StoreError::NotFound { .. })
                ) {
                    e.add("project", format!("no project named {p:?}"));
                } else if role == Role::Admin {
                    e.add(
                        "role",
                        "a token scoped to a project is a viewer or an operator there",
                    );
                } else {
                    match creator.role_in(p) {
                        Some(mine) if mine.allows(role) => {}
                        Some(mine) => e.add(
                            "role",
                            format!("cannot be above your own role in project {p} ({mine}); ask an admin"),
                        ),
                        None => e.add("project", format!("you act in project {} only", creator.project.as_deref().unwrap_or_default())),
                    }
                }
            }
            None if creator.project.is_some() => e.add(
                "project",
                "a token scoped to a project makes tokens scoped to that project only",
            ),
            None if !creator.role.allows(role) => e.add(
                "role",
                format!(
                    "cannot be above your own role ({}); ask an admin",
                    creator.role
                ),
            ),
            None => {}
        }
        if expires_in_days.is_some_and(|d| d == 0 || d > MAX_TOKEN_DAYS) {
            e.add(
                "expires_in_days",
                format!("must be between 1 and {MAX_TOKEN_DAYS}, or left out for no expiry"),
            );
        }
        e.finish()?;
        // A token makes tokens on behalf of the user who made it.
        let owner = creator.on_behalf_of.as_deref().unwrap_or(&creator.name);
        let token = format!("{API_TOKEN_PREFIX}{}", new_token());
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let info = self
            .store
            .insert_api_token(&crate::store::NewToken {
                id: &id,
                name: name.trim(),
                role,
                created_by: owner,
                project,
                expires_in_days,
                token_hash: &hash_token(&token),
            })
            .await?;
        Ok(NewApiToken { info, token })
    }

    /// Signs a user in (with the sign-in's limits on failures) and makes them an API token
    /// of their own role: what the command line's `tessera login` keeps.
    pub async fn token_for_sign_in(
        &self,
        username: &str,
        password: &str,
        address: Option<IpAddr>,
        name: &str,
        scope: TokenScope<'_>,
    ) -> Result<NewApiToken, ControlError> {
        let (user, _) = self.sign_in(username, password, address).await?;
        let caller = Caller {
            name: user.username.clone(),
            on_behalf_of: None,
            kind: CallerKind::Session,
            role: user.role,
            token_id: None,
            projects: self.store.roles_of(&user.username).await?,
            project: None,
        };
        // Scoped to a project: the user's role there (a scoped token is at most an
        // operator); otherwise the user's fleet-wide role.
        let role = match scope.project {
            Some(p) => caller
                .role_in(p)
                .unwrap_or(Role::Viewer)
                .min(Role::Operator),
            None => user.role,
        };
        let token = self
            .create_api_token(&caller, name, role, scope.project, scope.expires_in_days)
            .await?;
        self.audit(NewAuditEntry {
            actor: caller.actor(),
            action: "sign in for an API token".into(),
            target: Some(format!("token {}", token.info.name)),
            address: address.map(|a| a.to_string()),
        })
        .await;
        Ok(token)
    }

    pub async fn list_api_tokens(&self) -> Result<Vec<ApiTokenInfo>, ControlError> {
        Ok(self.store.list_api_tokens().await?)
    }

    /// Deletes every API token `username` made (after their password leaked, say);
    /// returns how many.
    pub async fn revoke_user_tokens(&self, username: &str) -> Result<u64, ControlError> {
        self.get_user(username).await?;
        Ok(self.store.delete_api_tokens_of(username).await?)
    }

    pub async fn get_user(&self, username: &str) -> Result<UserInfo, ControlError> {
        Ok(self
            .store
            .user_credentials(username)
            .await?
            .ok_or_else(|| ControlError::NotFound(format!("user {username:?} not found")))?
            .user)
    }

    pub async fn delete_api_token(&self, id: &str) -> Result<(), ControlError> {
        Ok(self.store.delete_api_token(id).await?)
    }

    /// The caller an `Authorization: Bearer` API token stands for, if it is valid now.
    pub async fn token_caller(&self, token: &str) -> Result<Option<Caller>, ControlError> {
        if !token.starts_with(API_TOKEN_PREFIX) {
            return Ok(None);
        }
        Ok(self
            .store
            .valid_api_token(&hash_token(token))
            .await?
            .map(|t| match t.project {
                // Its role is its project's; elsewhere it reads, as a viewer.
                Some(p) => Caller {
                    name: t.name,
                    on_behalf_of: Some(t.created_by),
                    kind: CallerKind::Token,
                    role: Role::Viewer,
                    token_id: Some(t.id),
                    projects: [(p.clone(), t.role)].into(),
                    project: Some(p),
                },
                None => Caller {
                    name: t.name,
                    on_behalf_of: Some(t.created_by),
                    kind: CallerKind::Token,
                    role: t.role,
                    token_id: Some(t.id),
                    projects: Default::default(),
                    project: None,
                },
            }))
    }

    // Console sessions, as records the HTTP layer's session manager reads and writes. The
    // session id is stored hashed.

    pub async fn load_session(&self, id: &str) -> Result<Option<String>, ControlError> {
        Ok(self.store.load_session(&hash_token(id), unix_now()).await?)
    }

    pub async fn save_session(
        &self,
        id: &str,
        data: &str,
        expires_at: i64,
    ) -> Result<(), ControlError> {
        Ok(self
            .store
            .save_session(&hash_token(id), data, expires_at, unix_now())
            .await?)
    }

    pub async fn delete_session(&self, id: &str) -> Result<(), ControlError> {
        Ok(self.store.delete_session(&hash_token(id)).await?)
    }

    /// Records an accepted mutation. A failure to record is logged, not passed on: the
    /// mutation has already happened.
    pub async fn audit(&self, entry: NewAuditEntry) {
        tracing::info!(
            actor = %entry.actor,
            action = %entry.action,
            target = entry.target.as_deref(),
            address = entry.address.as_deref(),
            "audit"
        );
        if let Err(e) = self.store.add_audit(&entry).await {
            tracing::error!(error = %e, "recording an audit entry failed");
        }
    }

    pub async fn list_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, ControlError> {
        Ok(self.store.list_audit(filter).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parts::HashQueue;

    #[tokio::test]
    async fn the_hash_queue_is_bounded() {
        let q = std::sync::Arc::new(HashQueue::new(1, 1));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        // One runs (blocked), one waits; a third is refused at once.
        let mut held = Vec::new();
        for _ in 0..2 {
            let (q, rx) = (q.clone(), rx.clone());
            held.push(tokio::spawn(async move {
                q.run(move || rx.lock().expect("lock").recv().is_ok()).await
            }));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let refused = q.run(|| true).await;
        assert!(
            matches!(refused, Err(ControlError::Busy { .. })),
            "{refused:?}"
        );
        tx.send(()).expect("send");
        tx.send(()).expect("send");
        for h in held {
            assert!(h.await.expect("joined").expect("ran"));
        }
        assert!(q.run(|| true).await.expect("room again"));
    }

    #[test]
    fn passwords_hash_with_argon2id_and_verify() {
        let h = hash_password("correct horse battery").expect("hashes");
        assert!(h.starts_with("$argon2id$"), "{h}");
        assert!(verify_password("correct horse battery", &h));
        assert!(!verify_password("wrong horse battery", &h));
        assert!(!verify_password("x", "not a hash"));
        assert_eq!(generate_password().len(), 24);
    }
}
