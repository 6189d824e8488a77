//! How hosts join: the fleet-wide join token (configured, or generated at first start and
//! then expiring), join tokens an admin mints for one rollout (a pool, an expiry, a number
//! of uses, or one revoked host), pools that hold new hosts for approval, and the
//! registration that checks all of it before a host is written.
//!
//! A host is who its agent token says; GPU UUIDs only find a machine that is already
//! known, and never let it back in: a revoked host rejoins with a token minted for it.

use super::AgentSync;
use crate::agents::{hash_token, new_token};
use crate::clock::{stamp, to_chrono};
use crate::error::ControlError;
use crate::store::Joined;
use std::ops::Not;
use std::time::Duration;
use tessera_model::agent::{RegisterRequest, RegisterResponse};
use tessera_model::auth::{Caller, JoinTokenInfo, JoinTokenInput, NewJoinToken};
use tessera_model::limits::accounts::{MAX_JOIN_TOKEN_SECS, MAX_JOIN_TOKEN_USES};
use tessera_model::provider::{Machine, MachineState};
use tessera_model::time::Timestamp;
use tessera_model::{
    Admission, GpuHealth, GpuInfo, HostId, HostInfo, HostStatus, PoolInfo, SharingMode,
};

const JOIN_TOKEN_SETTING: &str = "join_token_sha256";
/// The hash of the join token the configuration last gave (see `ensure_join_token`).
const JOIN_TOKEN_CONFIGURED: &str = "join_token_configured_sha256";
/// When the fleet-wide token stops working (RFC 3339), for the one generated at first
/// start; absent: it does not expire (configured, or rotated by an admin).
const JOIN_TOKEN_EXPIRES: &str = "join_token_expires_at";

/// How long the join token generated at first start works.
pub const BOOTSTRAP_TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// A minted token's default and longest life.
const DEFAULT_TOKEN_SECS: u64 = 24 * 3600;

/// Equal strings, compared in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A host id from a name an agent suggests: a DNS label.
fn host_id_from(name: Option<&str>) -> String {
    let base: String = name
        .unwrap_or("host")
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let base = base.trim_matches('-');
    let base = if base.is_empty() { "host" } else { base };
    base.chars().take(50).collect()
}

/// What a join token lets a registration do.
#[derive(Debug, Clone, Default)]
pub(crate) struct Grant {
    /// The minted token it came from (a use is taken when the host is written); `None`
    /// for the fleet-wide token and the in-process demo fleet.
    minted: Option<String>,
    /// The revoked host it rejoins, and nothing else.
    host: Option<HostId>,
    /// Admitted even where the pool holds new hosts.
    preapproved: bool,
}

impl AgentSync {
    /// Makes sure a join token exists. With `given`, that token is the join token from now
    /// on. Without, one is generated on first start and returned (to print once); it
    /// expires after [`BOOTSTRAP_TOKEN_TTL`]. Later starts return `None` (only its hash
    /// is stored).
    pub async fn ensure_join_token(
        &self,
        given: Option<&str>,
    ) -> Result<Option<String>, ControlError> {
        if let Some(token) = given {
            if token.len() < 16 {
                return Err(ControlError::invalid(
                    "join_token",
                    "must be at least 16 characters",
                ));
            }
            // The configuration's token takes effect when it is new to this database; the
            // same one configured again after an admin rotated the token (it leaked) does
            // not bring it back.
            let hash = hash_token(token);
            let configured = self.store.get_setting(JOIN_TOKEN_CONFIGURED).await?;
            let current = self.store.get_setting(JOIN_TOKEN_SETTING).await?;
            if current.is_some() && configured.as_deref() == Some(hash.as_str()) {
                if current.as_deref() != Some(hash.as_str()) {
                    tracing::warn!(
                        "the configured join token was rotated since it was set: agents join with the current one (drop --join-token / TESSERA_JOIN_TOKEN, or configure a new one)"
                    );
                }
                return Ok(None);
            }
            self.set_fleet_token(&hash, None).await?;
            self.store.set_setting(JOIN_TOKEN_CONFIGURED, &hash).await?;
            return Ok(None);
        }
        if self.store.get_setting(JOIN_TOKEN_SETTING).await?.is_some() {
            return Ok(None);
        }
        let token = new_token();
        let expires = stamp(self.core.now() + to_chrono(BOOTSTRAP_TOKEN_TTL));
        self.set_fleet_token(&hash_token(&token), Some(&expires))
            .await?;
        Ok(Some(token))
    }

    async fn set_fleet_token(&self, hash: &str, expires: Option<&str>) -> Result<(), ControlError> {
        self.store.set_setting(JOIN_TOKEN_SETTING, hash).await?;
        // An empty expiry: none (settings have no delete).
        self.store
            .set_setting(JOIN_TOKEN_EXPIRES, expires.unwrap_or(""))
            .await?;
        Ok(())
    }

    /// A new fleet-wide join token, returned this once; the old one stops working at once.
    pub async fn rotate_join_token(&self) -> Result<String, ControlError> {
        let token = new_token();
        self.set_fleet_token(&hash_token(&token), None).await?;
        Ok(token)
    }

    /// `POST /api/v1/join-tokens`: a join token for one rollout, its value returned this
    /// once.
    pub async fn mint_join_token(
        &self,
        caller: &Caller,
        input: &JoinTokenInput,
    ) -> Result<NewJoinToken, ControlError> {
        let mut e = crate::inputs::Errors::default();
        if input.description.chars().count() > 200 {
            e.add("description", "at most 200 characters");
        }
        let secs = input.expires_in_secs.unwrap_or(DEFAULT_TOKEN_SECS);
        if !(60..=MAX_JOIN_TOKEN_SECS).contains(&secs) {
            e.add(
                "expires_in_secs",
                format!("must be between 60 and {MAX_JOIN_TOKEN_SECS} (30 days), got {secs}"),
            );
        }
        // A token for one host rejoins it once.
        let uses = if input.host.is_some() {
            1
        } else {
            input.uses.unwrap_or(1)
        };
        if !(1..=MAX_JOIN_TOKEN_USES).contains(&uses) {
            e.add(
                "uses",
                format!("must be between 1 and {MAX_JOIN_TOKEN_USES}, got {uses}"),
            );
        }
        let pool = match &input.pool {
            Some(p) => match tessera_model::PoolName::new(p.clone()) {
                Ok(name) if self.store.pool_exists(&name).await? => Some(name.to_string()),
                Ok(_) => {
                    e.add("pool", format!("no pool named {p:?}"));
                    None
                }
                Err(err) => {
                    e.add("pool", err.rule);
                    None
                }
            },
            None => None,
        };
        let host = match &input.host {
            Some(h) => match HostId::new(h.clone()) {
                Ok(id) => match self.store.get_host(&id).await {
                    Ok(_) if self.store.host_token_revoked(&id).await? => Some(id.to_string()),
                    Ok(_) => {
                        e.add(
                            "host",
                            format!("host {h} is still registered: revoke its agent token first (POST /api/v1/hosts/{h}/revoke)"),
                        );
                        None
                    }
                    Err(_) => {
                        e.add("host", format!("no host named {h:?}"));
                        None
                    }
                },
                Err(err) => {
                    e.add("host", err.rule);
                    None
                }
            },
            None => None,
        };
        e.finish()?;
        let now = self.core.now();
        let token = new_token();
        let info = JoinTokenInfo {
            id: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
            description: input.description.trim().to_owned(),
            pool,
            host,
            expires_at: crate::clock::instant(now + chrono::Duration::seconds(secs as i64)),
            uses_left: uses,
            uses: 0,
            preapproved: input.preapproved,
            created_by: caller.name.clone(),
            created_at: crate::clock::instant(now),
        };
        self.store
            .insert_join_token(&info, &hash_token(&token))
            .await?;
        Ok(NewJoinToken { info, token })
    }

    pub async fn list_join_tokens(&self) -> Result<Vec<JoinTokenInfo>, ControlError> {
        Ok(self.store.list_join_tokens().await?)
    }

    pub async fn delete_join_token(&self, id: &str) -> Result<(), ControlError> {
        self.store.delete_join_token(id).await?;
        Ok(())
    }

    /// `POST /api/v1/hosts/{id}/approve`: a held host gets tasks from now on, and the GPUs
    /// it reports beyond what it was admitted with become capacity.
    pub async fn approve_host(&self, caller: &Caller, id: &HostId) -> Result<(), ControlError> {
        let host = self.store.get_host(id).await?;
        if !host.held && host.pending_gpus.is_empty() {
            return Err(ControlError::Conflict(format!(
                "host {id} is not waiting for approval"
            )));
        }
        if host.held {
            self.store.set_host_held(id, false).await?;
            self.core
                .event(
                    None,
                    Some(id),
                    &format!("host {id} approved by {}: it takes tasks now", caller.name),
                )
                .await;
        }
        if !host.pending_gpus.is_empty() {
            let gpus = crate::inventory_growth::approved(&host.gpus, &host.pending_gpus);
            // Written as a sync's report would be (a replaced GPU's tasks stop with it),
            // without making the host look seen now.
            let seen_at = stamp(
                host.last_seen
                    .map_or_else(|| self.core.now(), |t| t.to_utc()),
            );
            let changes = self
                .store
                .record_host_report(
                    id,
                    &crate::store::HostReport {
                        gpus,
                        seen_at,
                        usage: Vec::new(),
                        mps_restarts: None,
                    },
                )
                .await?;
            self.store.set_pending_gpus(id, &[]).await?;
            for change in &changes {
                self.core
                    .event(None, Some(id), &format!("host {id}: {change}"))
                    .await;
            }
            let uuids: Vec<String> = host
                .pending_gpus
                .iter()
                .map(|p| p.uuid.to_string())
                .collect();
            self.core
                .event(
                    None,
                    Some(id),
                    &format!(
                        "host {id}: {} GPU(s) approved by {}: {}",
                        uuids.len(),
                        caller.name,
                        uuids.join(", ")
                    ),
                )
                .await;
        }
        self.scheduler.capacity_changed();
        self.core.wake();
        Ok(())
    }

    /// What `token` lets a registration do, or why it lets it do nothing.
    async fn grant_of(&self, token: &str, pool: &str) -> Result<Grant, ControlError> {
        let hash = hash_token(token);
        let now = self.core.instant();
        if let Some(fleet) = self.store.get_setting(JOIN_TOKEN_SETTING).await?
            && same(&fleet, &hash)
        {
            let expires = self.store.get_setting(JOIN_TOKEN_EXPIRES).await?;
            // A stored expiry that is not a time is taken as passed: fail closed.
            let expired = |e: &str| e.parse::<Timestamp>().is_ok_and(|e| e > now).not();
            return match expires.filter(|e| !e.is_empty()) {
                Some(e) if expired(&e) => Err(ControlError::Unauthorized(format!(
                    "the join token printed at first start expired at {e}: an admin mints one (tessera join-token create --pool POOL)"
                ))),
                _ => Ok(Grant::default()),
            };
        }
        let Some(t) = self.store.join_token_by_hash(&hash).await? else {
            return Err(ControlError::Unauthorized(
                "the join token is not valid for this server".into(),
            ));
        };
        if t.expires_at <= now {
            return Err(ControlError::Unauthorized(format!(
                "join token {} expired at {}",
                t.id, t.expires_at
            )));
        }
        if t.uses_left == 0 {
            return Err(ControlError::Unauthorized(format!(
                "join token {} is used up ({} registration(s))",
                t.id, t.uses
            )));
        }
        if let Some(p) = t.pool.as_deref().filter(|p| *p != pool) {
            return Err(ControlError::Unauthorized(format!(
                "join token {} registers hosts in pool {p} only, not {pool}",
                t.id
            )));
        }
        Ok(Grant {
            host: t.host.map(HostId::new).transpose().map_err(|e| {
                ControlError::Store(crate::error::StoreError::corrupt("join token host", e))
            })?,
            minted: Some(t.id),
            preapproved: t.preapproved,
        })
    }

    /// `POST /agent/v1/register`: checks the join token, then admits the host.
    pub async fn register_agent(
        &self,
        req: &RegisterRequest,
    ) -> Result<RegisterResponse, ControlError> {
        req.validate().map_err(ControlError::Invalid)?;
        super::served_agent(req.agent_version.as_deref())?;
        let grant = self.grant_of(&req.join_token, req.pool.as_str()).await?;
        self.admit_host(req, &grant).await
    }

    /// The use of the minted token behind `grant`, if any, for the store to take with
    /// the host's write (a refused or failed registration costs none).
    fn token_use(&self, grant: &Grant) -> Option<crate::store::JoinTokenUse> {
        grant.minted.as_ref().map(|id| crate::store::JoinTokenUse {
            id: id.clone(),
            now: stamp(self.core.now()),
        })
    }

    /// Registers a host and issues its agent token. The one way hosts join, for agents
    /// (after `register_agent` checked the join token) and the in-process demo fleet.
    pub(crate) async fn admit_host(
        &self,
        req: &RegisterRequest,
        grant: &Grant,
    ) -> Result<RegisterResponse, ControlError> {
        let pool = self.store.get_pool(&req.pool).await.map_err(|_| {
            ControlError::invalid("pool", format!("no pool named {:?}", req.pool.as_str()))
        })?;
        if let Some(owner) = self.rejoining(req, grant).await? {
            return self.rejoin(owner, grant).await;
        }
        let held = pool.admission == Admission::Manual && !grant.preapproved;
        let mut host = new_host(req, self.free_host_id(req.name.as_deref()).await?, held);
        let token = new_token();
        let token_use = self.token_use(grant);
        // Another registration may take the id between the look and the write: then
        // another id, never its row.
        for attempt in 0.. {
            match self
                .store
                .register_host(
                    &host,
                    &hash_token(&token),
                    &stamp(self.core.now()),
                    token_use.as_ref(),
                )
                .await
            {
                Err(crate::error::StoreError::Conflict(m))
                    if m.starts_with(crate::store::HOST_ID_TAKEN) && attempt < 5 =>
                {
                    host.id = self.free_host_id(req.name.as_deref()).await?;
                }
                other => {
                    other.map_err(spent)?;
                    break;
                }
            }
        }
        let id = host.id.clone();
        self.scheduler.capacity_changed();
        let kind = if req.simulated {
            "simulated host"
        } else {
            "host"
        };
        let how = grant
            .minted
            .as_deref()
            .map_or(String::new(), |t| format!(" with join token {t}"));
        let held_note = if held {
            "; held until an admin approves it (the pool's admission is manual)"
        } else {
            ""
        };
        let said = format!(
            "{kind} {id} registered in pool {}{how} with {} GPU(s){held_note}",
            req.pool,
            req.gpus.len()
        );
        self.core.event(None, Some(&id), &said).await;
        if let Some(machine) = &req.provider_id {
            self.join_machine(&pool, machine, &id).await?;
        }
        self.core.wake();
        Ok(RegisterResponse {
            host_id: id,
            agent_token: token,
            sync_interval_secs: self.core.config().sync_interval.as_secs().max(1) as u32,
        })
    }

    /// Host `id` joined `pool` saying it is the provider's machine `provider_id`: the
    /// machine asked for (by that id, or the oldest whose id the provider never said)
    /// becomes active as it; a host the provider made without being asked (a group's
    /// first instances) becomes one of the pool's machines too, so it is scaled in and
    /// replaced like the others. Said in an event.
    async fn join_machine(
        &self,
        pool: &PoolInfo,
        provider_id: &str,
        id: &HostId,
    ) -> Result<(), ControlError> {
        if pool.provider.is_none() {
            return Ok(());
        }
        let at = self.core.now();
        let said = match self
            .store
            .join_machine(&pool.name, provider_id, id, &stamp(at))
            .await?
        {
            Joined::Asked(m) | Joined::Claimed(m) => format!(
                "host {id} joined as machine {m} ({provider_id}), which pool {}'s provider was asked for",
                pool.name
            ),
            Joined::Again(m) => format!("host {id} is machine {m} ({provider_id}) again"),
            Joined::Unknown => {
                let m = format!(
                    "m-{}-{}",
                    pool.name,
                    &uuid::Uuid::new_v4().simple().to_string()[..8]
                );
                let reason = format!("joined as {provider_id} without being asked for");
                self.store
                    .add_machines(&[Machine {
                        id: m.clone(),
                        pool: pool.name.clone(),
                        provider_id: Some(provider_id.to_owned()),
                        host_id: Some(id.clone()),
                        state: MachineState::Active,
                        reason: reason.clone(),
                        asked_at: Timestamp::from_utc(at),
                        joined_at: Some(Timestamp::from_utc(at)),
                        ended_at: None,
                    }])
                    .await?;
                format!(
                    "host {id} ({provider_id}) joined pool {} without being asked for: it is machine {m} of the pool's provider now",
                    pool.name
                )
            }
        };
        self.core.event(None, Some(id), &said).await;
        Ok(())
    }

    /// The host this registration rejoins, if any. A machine whose GPUs are already known
    /// is that host, reinstalled or with its credentials lost: refused while its agent is
    /// registered (two agents would answer for one host), and let back in only with a
    /// token minted for it once revoked.
    async fn rejoining(
        &self,
        req: &RegisterRequest,
        grant: &Grant,
    ) -> Result<Option<HostId>, ControlError> {
        let uuids: Vec<_> = req.gpus.iter().map(|g| g.uuid.clone()).collect();
        let known = self.store.host_with_gpus(&uuids).await?;
        match (&grant.host, known) {
            (_, Some((owner, false))) => Err(ControlError::Conflict(format!(
                "this machine's GPUs belong to host {owner}, whose agent is still registered; if it is that machine, an admin revokes the old token (POST /api/v1/hosts/{owner}/revoke) and mints a join token for it (tessera join-token create --host {owner})"
            ))),
            (Some(for_host), Some((owner, true))) if *for_host != owner => {
                Err(ControlError::Conflict(format!(
                    "this join token rejoins host {for_host}, but this machine's GPUs belong to host {owner}"
                )))
            }
            (None, Some((owner, true))) => Err(ControlError::Unauthorized(format!(
                "this machine's GPUs belong to host {owner}, whose agent token was revoked: it rejoins only with a join token minted for it (tessera join-token create --host {owner})"
            ))),
            (Some(for_host), _) => {
                if !self.store.host_token_revoked(for_host).await? {
                    return Err(ControlError::Conflict(format!(
                        "this join token rejoins host {for_host}, whose agent is registered again"
                    )));
                }
                Ok(Some(for_host.clone()))
            }
            (None, None) => Ok(None),
        }
    }

    /// Lets host `owner` back in with a new agent token.
    async fn rejoin(&self, owner: HostId, grant: &Grant) -> Result<RegisterResponse, ControlError> {
        let token = new_token();
        self.store
            .reissue_agent_token(&owner, &hash_token(&token), self.token_use(grant).as_ref())
            .await
            .map_err(spent)?;
        let said =
            format!("host {owner} rejoined with a join token minted for it and a new agent token");
        self.core.event(None, Some(&owner), &said).await;
        self.core.wake();
        Ok(RegisterResponse {
            host_id: owner,
            agent_token: token,
            sync_interval_secs: self.core.config().sync_interval.as_secs().max(1) as u32,
        })
    }

    /// A host id no host has: from the name the agent asked for (or `host`), with a random
    /// suffix where it is taken.
    async fn free_host_id(&self, name: Option<&str>) -> Result<HostId, ControlError> {
        let base = host_id_from(name);
        let mut id =
            HostId::new(base.clone()).map_err(|e| ControlError::invalid("name", e.to_string()))?;
        while self.store.get_host(&id).await.is_ok() {
            let suffix = &uuid::Uuid::new_v4().simple().to_string()[..6];
            id = HostId::new(format!("{base}-{suffix}"))
                .map_err(|e| ControlError::invalid("name", e.to_string()))?;
        }
        Ok(id)
    }
}

/// The host a registration makes, as stored: active (held for approval if `held`), its
/// GPUs idle.
fn new_host(req: &RegisterRequest, id: HostId, held: bool) -> HostInfo {
    HostInfo {
        id,
        pool: req.pool.clone(),
        status: HostStatus::Active,
        held,
        simulated: req.simulated,
        cpu: req.cpu_milli,
        memory: req.memory_mib,
        labels: req.labels.clone(),
        gpus: req
            .gpus
            .iter()
            .map(|g| GpuInfo {
                uuid: g.uuid.clone(),
                index: g.index,
                model: g.model.clone(),
                memory: g.memory_mib,
                mps_client_limit: g.mps_client_limit,
                health: if g.healthy {
                    GpuHealth::Healthy
                } else {
                    GpuHealth::Unhealthy
                },
                sharing_mode: SharingMode::Idle,
            })
            .collect(),
        status_reason: None,
        last_seen: None,
        mps_restarts: 0,
        address: req.address.clone(),
        dynamic_ports_free: None,
        pending_gpus: Vec::new(),
        capabilities: None,
        provider_id: req.provider_id.clone(),
        agent_version: req.agent_version.clone(),
    }
}

/// A store error, with a join token that had no use left said as the credential problem
/// it is.
fn spent(e: crate::error::StoreError) -> ControlError {
    match e {
        crate::error::StoreError::Conflict(m) if m.starts_with(crate::store::JOIN_TOKEN_SPENT) => {
            ControlError::Unauthorized(format!(
                "join token{} was used up or expired meanwhile",
                &m[crate::store::JOIN_TOKEN_SPENT.len()..]
            ))
        }
        other => other.into(),
    }
}

impl AgentSync {
    // Hosts' credentials.

    /// Forgets a host's agent token: its agent is refused until it registers again.
    pub async fn revoke_host(&self, id: &HostId) -> Result<(), ControlError> {
        self.store.revoke_agent_token(id).await?;
        self.forget_agent_tokens();
        self.core
            .event(
                None,
                Some(id),
                &format!("host {id}: agent token revoked; the agent must register again"),
            )
            .await;
        Ok(())
    }

    /// Removes a host that runs nothing, freeing its GPU UUIDs for a reinstalled machine.
    pub async fn delete_host(&self, id: &HostId) -> Result<(), ControlError> {
        self.store.delete_host(id).await?;
        self.forget_agent_tokens();
        self.scheduler.capacity_changed();
        self.core
            .event(None, Some(id), &format!("host {id} deleted"))
            .await;
        self.core.wake();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_hash_and_compare() {
        let t = new_token();
        assert_eq!(t.len(), 64);
        assert_ne!(t, new_token());
        assert!(same(&hash_token(&t), &hash_token(&t)));
        assert!(!same(&hash_token(&t), &hash_token("other")));
        assert_eq!(host_id_from(Some("GPU_Node.01")), "gpu-node-01");
    }
}
