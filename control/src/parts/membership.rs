//! This server among the servers on one database: its id, the scheduler lease as it last
//! took it, the fleet's clock, and when it last could not work on time.

use crate::clock::FleetClock;
use crate::store::Lease;
use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// This server's place in the cluster.
pub(crate) struct Membership {
    /// This server's id among the servers sharing the database.
    server_id: Box<str>,
    /// When this control plane started, by this machine's clock (what the cluster view
    /// shows).
    started: DateTime<Utc>,
    /// The fleet's time (the database's clock): what liveness and the lease are decided
    /// by. Hosts are not declared lost for one lost timeout after it started, since their
    /// agents could not reach a server that was down.
    fleet_clock: FleetClock,
    /// The scheduler lease as this server last took or renewed it.
    lease: Mutex<Option<Lease>>,
    /// Whether the database carries the other servers' changes to this one (see
    /// `Control::relay_changes`); without it, a scheduler with company rebuilds its
    /// engines every pass.
    relayed: AtomicBool,
    /// When this server last found itself unable to do its work on time: the database
    /// failed or stalled (agents could not have a sync recorded through any server
    /// meanwhile), or a tick came late. Hosts get one lost timeout after it too.
    store_failed_at: Mutex<Option<DateTime<Utc>>>,
    /// Whether the last announcement failed: the first that succeeds after it marks the
    /// database back, and the hosts' lost timeout counts from then (agents backing off
    /// may not sync again for two intervals after it returns).
    store_failing: AtomicBool,
    /// When the last tick began.
    last_tick: Mutex<Option<std::time::Instant>>,
}

impl Membership {
    pub fn new(address: &str, clock: &dyn crate::clock::Clock) -> Self {
        Membership {
            server_id: server_id(address).into(),
            started: clock.now(),
            fleet_clock: FleetClock::new(clock),
            lease: Mutex::default(),
            relayed: AtomicBool::new(false),
            store_failed_at: Mutex::default(),
            store_failing: AtomicBool::new(false),
            last_tick: Mutex::default(),
        }
    }

    /// This server's id among the servers sharing the database.
    pub fn server_id(&self) -> &str {
        &self.server_id
    }

    /// When this control plane started, by this machine's clock.
    pub fn started(&self) -> DateTime<Utc> {
        self.started
    }

    /// The fleet's time (the database's clock).
    pub fn fleet_clock(&self) -> &FleetClock {
        &self.fleet_clock
    }

    /// The epoch of the lease as this server last took it, if it holds it.
    pub fn lease_epoch(&self) -> Option<i64> {
        self.lease.lock().as_ref().map(|l| l.epoch)
    }

    /// Whether this server holds the scheduler lease (as it last took it).
    pub fn holds_lease(&self) -> bool {
        self.lease.lock().is_some()
    }

    /// Records the lease as taken or renewed; true when it is newly taken (none held, or
    /// another epoch).
    pub fn took_lease(&self, lease: &Lease) -> bool {
        let mut held = self.lease.lock();
        let taken = held.as_ref().is_none_or(|l| l.epoch != lease.epoch);
        *held = Some(lease.clone());
        taken
    }

    /// Forgets the lease; true when it was held.
    pub fn lost_lease(&self) -> bool {
        self.lease.lock().take().is_some()
    }

    /// Whether the database carries the other servers' changes to this one.
    pub fn relayed(&self) -> bool {
        self.relayed.load(Ordering::SeqCst)
    }

    pub fn set_relayed(&self, relayed: bool) {
        self.relayed.store(relayed, Ordering::SeqCst);
    }

    /// Notes that this server could not work on time at `at` (hosts get one lost timeout
    /// after it).
    pub fn fell_behind(&self, at: DateTime<Utc>) {
        *self.store_failed_at.lock() = Some(at);
    }

    /// When this server last could not work on time.
    pub fn fell_behind_at(&self) -> Option<DateTime<Utc>> {
        *self.store_failed_at.lock()
    }

    /// Records whether the last announcement failed; whether the one before did.
    pub fn announcement_failed(&self, failing: bool) -> bool {
        self.store_failing.swap(failing, Ordering::SeqCst)
    }

    /// Records that a tick began at `at`; when the last one began.
    pub fn tick_began(&self, at: std::time::Instant) -> Option<std::time::Instant> {
        self.last_tick.lock().replace(at)
    }
}

/// This machine's name, for server ids that say where a server runs.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "server".to_owned())
}

/// A server's id: its machine and address, so a restarted server is the same server (it
/// takes its lease back at once, with a new epoch that fences off its earlier run); one
/// without an address (tests, tools) gets a random one.
pub(crate) fn server_id(address: &str) -> String {
    let address = address.split("://").last().unwrap_or(address);
    if address.is_empty() {
        format!(
            "{}-{}",
            host_name(),
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        )
    } else {
        format!("{}/{address}", host_name())
    }
}
