//! Console sessions: stored through the control plane with their ids hashed, behind an
//! HttpOnly, SameSite=Strict cookie with idle and absolute timeouts.

use super::*;

pub(super) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Console sessions stored through the control plane (the session id is stored hashed).
#[derive(Clone)]
pub struct ControlSessions(pub Control);

impl std::fmt::Debug for ControlSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlSessions")
    }
}

pub(super) fn backend(e: impl std::fmt::Display) -> session_store::Error {
    session_store::Error::Backend(e.to_string())
}

#[async_trait::async_trait]
impl SessionStore for ControlSessions {
    async fn create(&self, record: &mut Record) -> session_store::Result<()> {
        // 128 random bits: a collision is not a practical concern, but never overwrite one.
        while self
            .0
            .accounts()
            .load_session(&record.id.to_string())
            .await
            .map_err(backend)?
            .is_some()
        {
            record.id = Id::default();
        }
        self.save(record).await
    }

    async fn save(&self, record: &Record) -> session_store::Result<()> {
        let data = serde_json::to_string(record)
            .map_err(|e| session_store::Error::Encode(e.to_string()))?;
        self.0
            .accounts()
            .save_session(
                &record.id.to_string(),
                &data,
                record.expiry_date.unix_timestamp(),
            )
            .await
            .map_err(backend)
    }

    async fn load(&self, id: &Id) -> session_store::Result<Option<Record>> {
        match self
            .0
            .accounts()
            .load_session(&id.to_string())
            .await
            .map_err(backend)?
        {
            Some(data) => serde_json::from_str(&data)
                .map(Some)
                .map_err(|e| session_store::Error::Decode(e.to_string())),
            None => Ok(None),
        }
    }

    async fn delete(&self, id: &Id) -> session_store::Result<()> {
        self.0
            .accounts()
            .delete_session(&id.to_string())
            .await
            .map_err(backend)
    }
}

/// The session manager: HttpOnly, SameSite=Strict, Secure under TLS, idle expiry.
pub fn session_layer(control: Control, tls: bool) -> SessionManagerLayer<ControlSessions> {
    SessionManagerLayer::new(ControlSessions(control))
        .with_name(SESSION_COOKIE)
        .with_http_only(true)
        .with_same_site(tower_sessions::cookie::SameSite::Strict)
        .with_secure(tls)
        .with_path("/")
        .with_expiry(Expiry::OnInactivity(IDLE_TIMEOUT))
}

/// Starts a signed-in session: a new session id (against fixation), then who and when.
pub async fn start_session(session: &Session, user: &SessionUser) -> Result<(), ApiError> {
    session.cycle_id().await.map_err(ApiError::session)?;
    session
        .insert(SESSION_USER, user)
        .await
        .map_err(ApiError::session)?;
    session
        .insert(SESSION_SEEN, user.signed_in_at)
        .await
        .map_err(ApiError::session)
}
