//! This server among the servers on one database: its id, the scheduler lease as it last
//! took it, the fleet's clock, and when it last could not work on time.

use crate::clock::FleetClock;
use crate::store::Lease;
use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use std::sync::atomic::AtomicBool;

/// This server's place in the cluster.
pub(crate) struct Membership {
    /// This server's id among the servers sharing the database.
    pub server_id: Box<str>,
    /// When this control plane started, by this machine's clock (what the cluster view
    /// shows).
    pub started: DateTime<Utc>,
    /// The fleet's time (the database's clock): what liveness and the lease are decided
    /// by. Hosts are not declared lost for one lost timeout after it started, since their
    /// agents could not reach a server that was down.
    pub fleet_clock: FleetClock,
    /// The scheduler lease as this server last took or renewed it.
    pub lease: Mutex<Option<Lease>>,
    /// Whether the database carries the other servers' changes to this one (see
    /// `Control::relay_changes`); without it, a scheduler with company rebuilds its
    /// engines every pass.
    pub relayed: AtomicBool,
    /// When this server last found itself unable to do its work on time: the database
    /// failed or stalled (agents could not have a sync recorded through any server
    /// meanwhile), or a tick came late. Hosts get one lost timeout after it too.
    pub store_failed_at: Mutex<Option<DateTime<Utc>>>,
    /// Whether the last announcement failed: the first that succeeds after it marks the
    /// database back, and the hosts' lost timeout counts from then (agents backing off
    /// may not sync again for two intervals after it returns).
    pub store_failing: AtomicBool,
    /// When the last tick began.
    pub last_tick: Mutex<Option<std::time::Instant>>,
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
