//! What to change in a backend: [`plan`] compares Tessera's servers with a service's
//! endpoints; each [`Change`] is the Runtime API commands that make it.

use super::PREFIX;
use crate::lb::runtime::{Admin, FDRAIN, FMAINT, ServerState, haproxy_address, server_name};
use std::collections::{BTreeMap, BTreeSet};
use tessera_model::api::{Endpoint, EndpointHealth};
use tessera_model::taskdef::Protocol;

/// One change to Tessera's servers in the backend; [`Change::commands`] are the Runtime
/// API commands that make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Adds a server for a healthy endpoint and lets it take traffic.
    Add {
        server: String,
        /// `address:port`.
        address: String,
        task: String,
    },
    /// Lets a server that is in maintenance or draining take traffic again.
    Ready { server: String, task: String },
    /// No new traffic for a server whose task is being stopped.
    Drain { server: String, task: String },
    /// Takes a server out and deletes it.
    Remove {
        server: String,
        /// `address:port`, for the message.
        address: String,
        why: String,
        /// Whether it must be put in maintenance first (delete refuses otherwise).
        maint: bool,
        /// Whether its sessions are closed first (it has waited long enough).
        shutdown: bool,
    },
}

/// How a command's answer says it worked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// `set server`, `shutdown sessions`: nothing.
    Nothing,
    /// `add server`.
    Registered,
    /// `del server` (a server already gone is as good).
    Deleted,
}

impl Expect {
    pub(super) fn accepts(self, answer: &str) -> bool {
        let answer = answer.trim();
        match self {
            Expect::Nothing => answer.is_empty(),
            Expect::Registered => answer.starts_with("New server registered"),
            Expect::Deleted => {
                answer.starts_with("Server deleted") || answer.starts_with("No such server")
            }
        }
    }
}

impl Change {
    /// The server it is about.
    pub fn server(&self) -> &str {
        match self {
            Change::Add { server, .. }
            | Change::Ready { server, .. }
            | Change::Drain { server, .. }
            | Change::Remove { server, .. } => server,
        }
    }

    /// The Runtime API commands, in order, for `backend`.
    pub fn commands(&self, backend: &str) -> Vec<String> {
        self.steps(backend).into_iter().map(|(c, _)| c).collect()
    }

    pub(super) fn steps(&self, backend: &str) -> Vec<(String, Expect)> {
        let target = format!("{backend}/{}", self.server());
        match self {
            Change::Add { address, .. } => vec![
                (format!("add server {target} {address}"), Expect::Registered),
                (format!("set server {target} state ready"), Expect::Nothing),
            ],
            Change::Ready { .. } => {
                vec![(format!("set server {target} state ready"), Expect::Nothing)]
            }
            Change::Drain { .. } => {
                vec![(format!("set server {target} state drain"), Expect::Nothing)]
            }
            Change::Remove {
                maint, shutdown, ..
            } => {
                let mut steps = Vec::new();
                if *maint {
                    steps.push((format!("set server {target} state maint"), Expect::Nothing));
                }
                if *shutdown {
                    steps.push((
                        format!("shutdown sessions server {target}"),
                        Expect::Nothing,
                    ));
                }
                steps.push((format!("del server {target}"), Expect::Deleted));
                steps
            }
        }
    }

    /// The line printed once it is made.
    pub fn describe(&self) -> String {
        match self {
            Change::Add {
                server,
                address,
                task,
            } => format!("added {server} {address} (task {task})"),
            Change::Ready { server, task } => format!("ready {server} (task {task})"),
            Change::Drain { server, task } => format!("draining {server} (task {task})"),
            Change::Remove {
                server,
                address,
                why,
                shutdown,
                ..
            } => format!(
                "removed {server} {address} ({why}{})",
                if *shutdown {
                    "; its sessions were closed"
                } else {
                    ""
                }
            ),
        }
    }
}

/// The commands of `changes`, in order.
pub fn commands(backend: &str, changes: &[Change]) -> Vec<String> {
    changes.iter().flat_map(|c| c.commands(backend)).collect()
}

/// Whether an endpoint is one this command handles: TCP, and the port `port_name` names
/// when one is given.
pub fn selected(endpoint: &Endpoint, port_name: Option<&str>) -> bool {
    endpoint.protocol == Protocol::Tcp
        && port_name.is_none_or(|p| endpoint.port_name.as_deref() == Some(p))
}

/// An endpoint that should have a server, and the address `add server` takes.
struct Wanted<'a> {
    endpoint: &'a Endpoint,
    address: String,
}

fn wanted<'a>(endpoints: &'a [Endpoint], port_name: Option<&str>) -> BTreeMap<String, Wanted<'a>> {
    let mut out = BTreeMap::new();
    for e in endpoints.iter().filter(|e| selected(e, port_name)) {
        let Some(address) = haproxy_address(&e.address, e.port) else {
            continue;
        };
        out.entry(server_name(&e.task, e.port)).or_insert(Wanted {
            endpoint: e,
            address,
        });
    }
    out
}

/// What to change so that the backend's Tessera servers (`current`, from `show servers
/// state`; servers without [`PREFIX`] are ignored) match `endpoints`:
/// - a healthy endpoint without a server: add it, then ready it;
/// - a server in maintenance or draining whose endpoint is healthy: ready it;
/// - a ready server whose endpoint is draining: drain it (one already in maintenance
///   stays there);
/// - a server whose endpoint is gone, unhealthy or starting: maintenance, then delete
///   (closing its sessions first when it is in `force_shutdown`);
/// - a server at another address or port than its endpoint: remove it, then add it again
///   if the endpoint is healthy.
///
/// Adds and readies come first and removals last, so that new servers take traffic
/// before old ones stop.
pub fn plan(
    current: &[ServerState],
    endpoints: &[Endpoint],
    port_name: Option<&str>,
    force_shutdown: &BTreeSet<String>,
) -> Vec<Change> {
    let wanted = wanted(endpoints, port_name);
    let ours: BTreeMap<&str, &ServerState> = current
        .iter()
        .filter(|s| s.name.starts_with(PREFIX))
        .map(|s| (s.name.as_str(), s))
        .collect();
    let add = |name: &str, w: &Wanted<'_>| Change::Add {
        server: name.to_owned(),
        address: w.address.clone(),
        task: w.endpoint.task.clone(),
    };
    let (mut adds, mut readies, mut drains, mut removes, mut readds) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (&name, &s) in &ours {
        let remove = |why: String| Change::Remove {
            server: name.to_owned(),
            address: s.shown_address(),
            why,
            maint: s.admin_state & FMAINT == 0,
            shutdown: force_shutdown.contains(name),
        };
        let Some(w) = wanted.get(name) else {
            removes.push(remove("task gone".to_owned()));
            continue;
        };
        let e = w.endpoint;
        if !s.is_at(&e.address, e.port) {
            removes.push(remove(format!("task {} moved to {}", e.task, w.address)));
            if e.health == EndpointHealth::Healthy {
                readds.push(add(name, w));
            }
            continue;
        }
        match e.health {
            EndpointHealth::Healthy => {
                if s.admin_state & (FMAINT | FDRAIN) != 0 {
                    readies.push(Change::Ready {
                        server: name.to_owned(),
                        task: e.task.clone(),
                    });
                }
            }
            EndpointHealth::Draining => {
                if s.admin() == Admin::Ready {
                    drains.push(Change::Drain {
                        server: name.to_owned(),
                        task: e.task.clone(),
                    });
                }
            }
            EndpointHealth::Unhealthy | EndpointHealth::Starting => {
                removes.push(remove(format!("task {} {}", e.task, e.health.as_str())));
            }
        }
    }
    for (name, w) in &wanted {
        if !ours.contains_key(name.as_str()) && w.endpoint.health == EndpointHealth::Healthy {
            adds.push(add(name, w));
        }
    }
    adds.into_iter()
        .chain(readies)
        .chain(drains)
        .chain(removes)
        .chain(readds)
        .collect()
}
