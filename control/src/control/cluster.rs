//! Several servers on one database, one scheduler at a time.
//!
//! Every server serves the console, the API and the agent API. Each tick every server
//! announces itself, writes the times of the quiet syncs it received, and tries to take or
//! renew the scheduler lease (a row: holder, epoch, since, expiry). The holder renews it
//! every tick; when it dies, another server takes it once it expires (`lease_ttl`), with a
//! new epoch. Only the holder runs reconcile passes, and a pass writes through a fenced
//! store: each of its writes checks, in its own transaction, that the pass's epoch is
//! still the lease's, so a paused former holder can never commit after a newer one.
//!
//! Changes made through one server reach every other server's live views (and, when it
//! schedules, its reconcile loop) through the database: PostgreSQL's LISTEN/NOTIFY (see
//! [`Control::relay_changes`]).

use crate::clock::{stamp, to_chrono};
use crate::control::Control;
use crate::error::ControlError;
use crate::store::{Fence, Lease};
use tessera_model::views::{ClusterView, ServerView};

/// How long a one-row write may take before the database counts as having been
/// unavailable (hosts then get one lost timeout to sync again).
pub(crate) const SLOW_STORE: std::time::Duration = std::time::Duration::from_secs(2);

/// The topic of a change another server made (never published again).
pub(crate) const ELSEWHERE: &str = "elsewhere";

impl Control {
    /// This server's id among the servers sharing the database.
    pub fn server_id(&self) -> &str {
        self.core.membership().server_id()
    }

    /// One tick: announce this server, write the quiet syncs' times, take or renew the
    /// lease. Returns the control plane to run a pass with (its writes fenced by the
    /// lease's epoch) when this server holds the lease.
    pub(crate) async fn tick_cluster(&self) -> Option<Control> {
        // Reading the database's clock is the tick's first call to the database: a
        // database that keeps it waiting counts as one that kept the announcement waiting.
        let asked = std::time::Instant::now();
        self.core.read_db_clock().await;
        let now = self.core.now();
        let seen = self
            .store
            .server_seen(
                self.core.membership().server_id(),
                &self.core.config().address,
                &stamp(self.core.membership().started()),
                &stamp(now),
            )
            .await;
        if let Err(e) = &seen {
            tracing::warn!(error = %e, "announcing this server failed");
        }
        // A database that failed or kept this one-row write waiting (down, restarting,
        // unreachable: requests wait for a connection rather than fail at once) could not
        // record agents' syncs either.
        let failing = seen.is_err();
        let was_failing = self.core.membership().announcement_failed(failing);
        // ... and the first announcement that succeeds after failures marks when the
        // database came back: hosts get their lost timeout from then, not from the last
        // failure (up to a tick earlier).
        if failing || was_failing || asked.elapsed() > SLOW_STORE {
            self.core.membership().fell_behind(self.core.now());
        }
        let now = self.core.now();
        let announced = asked.elapsed();
        if let Err(e) = self.agents().flush_heartbeats().await {
            tracing::warn!(error = %e, "writing the last syncs' times failed");
        }
        let heartbeats = asked.elapsed() - announced;
        if let Err(e) = self.agents().flush_usage(false).await {
            tracing::warn!(error = %e, "writing usage buckets failed; they are written at the next tick");
        }
        tracing::debug!(
            ?announced,
            ?heartbeats,
            usage = ?(asked.elapsed() - announced - heartbeats),
            "tick: announced, wrote heartbeats and usage"
        );
        let lease = self.take_lease(now).await?;
        // The announcement failed fast but taking the lease waited on the database (it
        // came back meanwhile): the pass that follows must not judge hosts' silence by the
        // time before it. (The drill found hosts lost 1 s after PostgreSQL returned.)
        if asked.elapsed() > SLOW_STORE {
            self.core.membership().fell_behind(self.core.now());
        }
        Some(self.with_store(self.store.fenced(Fence {
            holder: lease.holder,
            epoch: lease.epoch,
        })))
    }

    /// Takes or renews the scheduler lease at `now`; `None` when another server holds it
    /// (or the database could not say). A lease newly taken, or held among other live
    /// servers, makes this server's engines stale.
    async fn take_lease(&self, now: chrono::DateTime<chrono::Utc>) -> Option<Lease> {
        let expires = crate::clock::instant(now + to_chrono(self.core.config().lease_ttl));
        let held = self.core.membership().lease_epoch();
        let lease = match self
            .store
            .acquire_lease(
                self.core.membership().server_id(),
                held,
                crate::clock::instant(now),
                expires,
            )
            .await
        {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                if self.core.membership().lost_lease() {
                    tracing::warn!("another server holds the scheduler lease now");
                }
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "taking the scheduler lease failed");
                return None;
            }
        };
        let taken = self.core.membership().took_lease(&lease);
        if taken {
            tracing::info!(epoch = lease.epoch, "this server holds the scheduler lease");
            // Others may have scheduled since this server's engines were built, and read
            // (and deleted) changes its passes have not.
            self.scheduler.capacity_changed();
            self.deployments.read_everything_next();
        } else if !self.core.membership().relayed() && self.others_alive().await {
            // Other servers' agents change capacity too (tasks ending, GPUs going), and
            // this database does not tell this one: with company, each pass builds its
            // engines afresh. (Where it does, `relay_changes` marks them stale on each
            // change another server makes.)
            self.scheduler.capacity_changed();
        }
        Some(lease)
    }

    /// Whether another server announced itself within a lease time.
    async fn others_alive(&self) -> bool {
        let since = stamp(self.core.now() - to_chrono(self.core.config().lease_ttl));
        self.store.list_servers(&since).await.map_or(true, |s| {
            s.iter()
                .any(|s| *s.id != *self.core.membership().server_id())
        })
    }

    /// Carries changes between the servers on this database, until the returned tasks are
    /// aborted: this server's changes are published (one notice per 100 ms at most, however
    /// many there were), and every other server's wake this one's live views and, while it
    /// holds the lease, its reconcile loop (a scale made through another server is acted on
    /// at once, not at the next tick). Nothing to do where the database carries no news
    /// (SQLite).
    pub(crate) async fn relay_changes(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let mut news = match self.store.listen_changes().await {
            Ok(Some(news)) => news,
            Ok(None) => return Vec::new(),
            Err(e) => {
                tracing::warn!(error = %e, "listening for other servers' changes failed; live views show this server's changes only");
                return Vec::new();
            }
        };
        self.core.membership().set_relayed(true);
        let listen = {
            let control = self.clone();
            tokio::spawn(async move {
                while let Some(from) = news.recv().await {
                    // `None`: notices may have been lost; look again, as for a change.
                    if from.as_deref() == Some(control.core.membership().server_id()) {
                        continue;
                    }
                    // Capacity may have changed there: this server's engines are stale.
                    control.scheduler.capacity_changed_elsewhere();
                    if control.core.membership().holds_lease() {
                        control.core.nudge();
                    }
                    control.core.publish(ELSEWHERE);
                }
            })
        };
        let publish = {
            let control = self.clone();
            let mut changes = self.subscribe();
            tokio::spawn(async move {
                use tokio::sync::broadcast::error::RecvError;
                loop {
                    match changes.recv().await {
                        Ok(ELSEWHERE) => continue,
                        Ok(_) | Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => break,
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    while changes.try_recv().is_ok() {}
                    if let Err(e) = control
                        .store
                        .publish_change(control.core.membership().server_id())
                        .await
                    {
                        tracing::warn!(error = %e, "telling the other servers of a change failed");
                    }
                }
            })
        };
        vec![listen, publish]
    }

    /// Lets go of the lease on a clean shutdown, so another server takes over at its next
    /// tick instead of after the lease time.
    pub(crate) async fn let_go_of_lease(&self) {
        if self.core.membership().lost_lease()
            && let Err(e) = self
                .store
                .release_lease(self.core.membership().server_id())
                .await
        {
            tracing::warn!(error = %e, "letting go of the scheduler lease failed");
        }
    }

    /// `GET /api/v1/cluster`: the servers seen within three lease times, and which one
    /// schedules since when.
    pub async fn cluster(&self) -> Result<ClusterView, ControlError> {
        let now = self.core.now();
        let since = stamp(now - to_chrono(self.core.config().lease_ttl * 3));
        let lease = self
            .store
            .lease()
            .await?
            .filter(|l| l.expires_at >= crate::clock::instant(now));
        let servers = self
            .store
            .list_servers(&since)
            .await?
            .into_iter()
            .map(|s| {
                let scheduling = lease.as_ref().filter(|l| l.holder == s.id);
                ServerView {
                    scheduling: scheduling.is_some(),
                    since: scheduling.map(|l| l.since),
                    id: s.id,
                    address: s.address,
                    started_at: s.started_at,
                    last_seen: s.last_seen_at,
                    version: s.version,
                }
            })
            .collect();
        Ok(ClusterView {
            servers,
            answered_by: tessera_model::version::BuildInfo::this(),
        })
    }
}
