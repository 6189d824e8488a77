//! What every component of the control plane shares and none owns: the configuration, the
//! fleet's time, waking the reconcile loop, telling live views of a change, and recording
//! an event.

use crate::config::ControlConfig;
use crate::parts::Membership;
use crate::store::CoreStore;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;
use tessera_model::HostId;
use tokio::sync::{Notify, broadcast};

/// The common ground of the components. Cheap to clone; clones share everything. Events
/// go through the store it was made with, so a pass's core (on the fenced store) records
/// nothing once its server lost the scheduler lease.
#[derive(Clone)]
pub(crate) struct Core {
    config: Arc<ControlConfig>,
    membership: Arc<Membership>,
    /// Wakes the reconcile loop when something changed (a scale, a sync with news).
    wake: Arc<Notify>,
    /// Tells live views (SSE) that state changed; the payload is a coarse topic.
    changes: broadcast::Sender<&'static str>,
    /// Events are recorded and the database's clock read through it.
    store: Arc<dyn CoreStore>,
}

impl Core {
    pub(crate) fn new(config: ControlConfig, store: Arc<dyn CoreStore>) -> Core {
        let (changes, _) = broadcast::channel(64);
        Core {
            membership: Arc::new(Membership::new(&config.address, &*config.clock)),
            config: Arc::new(config),
            wake: Arc::new(Notify::new()),
            changes,
            store,
        }
    }

    /// The same core, recording events through `store` (a fenced store).
    pub(crate) fn with_store(&self, store: Arc<dyn CoreStore>) -> Core {
        Core {
            store,
            ..self.clone()
        }
    }

    pub(crate) fn config(&self) -> &ControlConfig {
        &self.config
    }

    /// This server among the servers on the database.
    pub(crate) fn membership(&self) -> &Membership {
        &self.membership
    }

    /// Now, by the fleet's clock (the database's; see [`crate::clock::FleetClock`]).
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.membership.fleet_clock().now(&*self.config.clock)
    }

    /// Now by the fleet's clock, as the model carries times.
    pub(crate) fn instant(&self) -> tessera_model::time::Timestamp {
        crate::clock::instant(self.now())
    }

    /// Now in Unix seconds, by the fleet's clock.
    pub(crate) fn unix_now(&self) -> i64 {
        crate::clock::since_epoch(self.now())
    }

    /// How long a host may go without a sync before it is lost.
    pub(crate) fn lost_timeout(&self) -> Duration {
        self.config.sync_interval * self.config.lost_after_intervals
    }

    /// Asks the reconcile loop to run soon, and tells live views something changed.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
        let _ = self.changes.send("changed");
    }

    /// Asks the reconcile loop to run soon, telling live views nothing (they heard of the
    /// change already).
    pub(crate) fn nudge(&self) {
        self.wake.notify_one();
    }

    /// Waits until something asks the reconcile loop to run.
    pub(crate) async fn woken(&self) {
        self.wake.notified().await
    }

    /// Tells live views (and, through the database, other servers) of a change.
    pub(crate) fn publish(&self, topic: &'static str) {
        let _ = self.changes.send(topic);
    }

    /// Change notifications for live views.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<&'static str> {
        self.changes.subscribe()
    }

    /// Records an event on a service and/or a host; a failure to record is logged.
    pub(crate) async fn event(&self, service: Option<&str>, host: Option<&HostId>, message: &str) {
        tracing::info!(service, host = host.map(HostId::as_str), "{message}");
        if let Err(e) = self.store.add_event(service, host, message).await {
            tracing::error!(error = %e, "recording an event failed");
        }
        self.publish("event");
    }

    /// Records an event that on-call people must hear of, about a service, a host and/or a
    /// pool (found from the service or host when not given): the event, and a delivery to
    /// each webhook that wants notices of `kind` about its service, host, pool or project
    /// (sent by [`crate::notify::Notifications`]); a failure to record is logged.
    pub(crate) async fn notify(
        &self,
        kind: tessera_model::notify::NoticeKind,
        (service, host, pool): (Option<&str>, Option<&HostId>, Option<&str>),
        message: &str,
    ) {
        tracing::warn!(
            service,
            host = host.map(HostId::as_str),
            pool,
            kind = kind.as_str(),
            "{message}"
        );
        if let Err(e) = self
            .store
            .add_notice(kind, (service, host, pool), message)
            .await
        {
            tracing::error!(error = %e, "recording a notice failed");
        }
        self.publish("event");
    }

    /// Reads the database's clock for [`Core::now`]; a failure keeps the last reading
    /// (carried forward by this machine's monotonic clock).
    pub(crate) async fn read_db_clock(&self) {
        let asked = std::time::Instant::now();
        match self.store.db_now().await {
            // A reading that took long (a database coming back, a queue for connections)
            // says little about when it was taken: kept only when quick, and placed at
            // its answer, so that an error makes the fleet's time lag (it waits for the
            // database to catch up) rather than run ahead (declaring hosts lost early).
            Ok(_) if asked.elapsed() > std::time::Duration::from_millis(500) => {
                tracing::debug!("a slow reading of the database's clock is not used");
            }
            Ok(t) => match chrono::DateTime::parse_from_rfc3339(&t) {
                Ok(db) => {
                    self.membership
                        .fleet_clock()
                        .sample(db.with_timezone(&Utc), std::time::Instant::now());
                }
                Err(e) => {
                    tracing::warn!(error = %e, time = t, "the database's clock is unreadable")
                }
            },
            Err(e) => tracing::debug!(error = %e, "reading the database's clock failed"),
        }
    }
}
