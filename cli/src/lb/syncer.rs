//! [`Syncer`]: one backend kept in step with a service's endpoints, round after round
//! (host names resolved, refusals retried, each problem told once).

use super::{SHUTDOWN_AFTER, SOCKET_TIMEOUT};
use crate::Exit;
use crate::lb::changes::{Change, Expect, plan, selected};
use crate::lb::runtime::{
    ServerState, bare_host, haproxy, haproxy_address, parse_servers_state, server_name,
};
use anyhow::{Context, bail};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tessera_model::api::Endpoint;

/// What one round did.
#[derive(Debug, Default)]
pub struct Round {
    /// A line per change made ([`Change::describe`]).
    pub changed: Vec<String>,
    /// Problems to tell the operator: refusals (retried next round), endpoints that cannot
    /// be used. Each is told once, not every round it lasts.
    pub notes: Vec<String>,
}

/// Keeps one backend in step with endpoints, round after round; remembers what it needs
/// between rounds (servers waiting to be deleted, problems already told).
pub struct Syncer {
    socket: PathBuf,
    backend: String,
    port_name: Option<String>,
    shutdown_after: Duration,
    /// Tessera's servers being removed, and since when.
    removing: HashMap<String, Instant>,
    /// Last round's problems, by subject: a problem is told when it starts or changes.
    told: BTreeMap<String, String>,
    /// Whether the backend was found once; until then, a missing one is a usage error.
    found_backend: bool,
}

impl Syncer {
    pub fn new(socket: &Path, backend: &str, port_name: Option<&str>) -> Syncer {
        Syncer {
            socket: socket.to_owned(),
            backend: backend.to_owned(),
            port_name: port_name.map(str::to_owned),
            shutdown_after: SHUTDOWN_AFTER,
            removing: HashMap::new(),
            told: BTreeMap::new(),
            found_backend: false,
        }
    }

    /// How long a removal waits on its connections before closing them (default
    /// [`SHUTDOWN_AFTER`]).
    pub fn with_shutdown_after(self, wait: Duration) -> Syncer {
        Syncer {
            shutdown_after: wait,
            ..self
        }
    }

    /// The backend's servers, all of them.
    pub async fn servers(&self) -> anyhow::Result<Vec<ServerState>> {
        let answer = haproxy(
            &self.socket,
            &format!("show servers state {}", self.backend),
        )
        .await?;
        if answer.trim_start().starts_with("Can't find backend") {
            let message = format!(
                "HAProxy ({}) has no backend {:?}: check --backend against its configuration",
                self.socket.display(),
                self.backend
            );
            if !self.found_backend {
                return Err(Exit::new(2, message).into());
            }
            bail!("{message} (it had one: was it reloaded with another configuration?)");
        }
        parse_servers_state(&answer)
            .with_context(|| format!("reading `show servers state {}`", self.backend))
    }

    /// One round: reads the backend, plans against `endpoints` (the service's, as the API
    /// gives them), applies. A change HAProxy refuses is a note and is retried next round;
    /// an unreachable HAProxy is the error.
    pub async fn sync(&mut self, endpoints: &[Endpoint]) -> anyhow::Result<Round> {
        let current = self.servers().await?;
        self.found_backend = true;
        let mut problems: BTreeMap<String, String> = BTreeMap::new();
        let endpoints = self.usable(endpoints, &current, &mut problems).await;

        let now = Instant::now();
        let force: BTreeSet<String> = self
            .removing
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= self.shutdown_after)
            .map(|(name, _)| name.clone())
            .collect();
        let changes = plan(&current, &endpoints, self.port_name.as_deref(), &force);
        let removing: BTreeSet<&str> = changes
            .iter()
            .filter(|c| matches!(c, Change::Remove { .. }))
            .map(Change::server)
            .collect();
        self.removing
            .retain(|name, _| removing.contains(name.as_str()));
        for name in &removing {
            self.removing.entry((*name).to_owned()).or_insert(now);
        }

        let mut round = Round::default();
        let mut refused: BTreeSet<String> = BTreeSet::new();
        for change in &changes {
            // A server whose removal failed is not added again under the same name.
            if refused.contains(change.server()) {
                continue;
            }
            match self.apply(change).await? {
                Ok(()) => {
                    if let Change::Remove { server, .. } = change {
                        self.removing.remove(server);
                    }
                    round.changed.push(change.describe());
                }
                Err(why) => {
                    refused.insert(change.server().to_owned());
                    let note = match change {
                        Change::Remove {
                            shutdown: false, ..
                        } if why.contains("connections") => {
                            format!(
                                "{}: still has connections; deleting it again each round, \
                                 and closing its sessions after {} s",
                                change.server(),
                                self.shutdown_after.as_secs()
                            )
                        }
                        _ => format!("{}: HAProxy refused {why}; trying again", change.server()),
                    };
                    problems.insert(format!("server {}", change.server()), note);
                }
            }
        }

        for (subject, note) in &problems {
            if self.told.get(subject) != Some(note) {
                round.notes.push(note.clone());
            }
        }
        self.told = problems;
        Ok(round)
    }

    /// The endpoints this command handles, host names resolved; what cannot be used is a
    /// problem.
    async fn usable(
        &self,
        endpoints: &[Endpoint],
        current: &[ServerState],
        problems: &mut BTreeMap<String, String>,
    ) -> Vec<Endpoint> {
        let port_name = self.port_name.as_deref();
        if let Some(p) = port_name
            && !endpoints.is_empty()
            && !endpoints.iter().any(|e| e.port_name.as_deref() == Some(p))
        {
            let names: BTreeSet<&str> = endpoints
                .iter()
                .filter_map(|e| e.port_name.as_deref())
                .collect();
            problems.insert(
                "port name".to_owned(),
                format!(
                    "no endpoint has a port named {p:?} (the service's port names: {})",
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.into_iter().collect::<Vec<_>>().join(", ")
                    }
                ),
            );
        }
        let mut resolved: HashMap<String, Result<Vec<IpAddr>, String>> = HashMap::new();
        let mut out = Vec::new();
        for e in endpoints.iter().filter(|e| selected(e, port_name)) {
            if haproxy_address(&e.address, e.port).is_none() {
                problems.insert(
                    format!("endpoint {} {}", e.task, e.port),
                    format!(
                        "task {}: address {:?} (host {}) is neither an IP address nor a host name; skipped",
                        e.task, e.address, e.host
                    ),
                );
                continue;
            }
            let host = bare_host(&e.address);
            if host.parse::<IpAddr>().is_ok() {
                out.push(e.clone());
                continue;
            }
            let cached = resolved.get(host).cloned();
            let found = match cached {
                Some(found) => found,
                None => {
                    let found = resolve(host).await;
                    resolved.insert(host.to_owned(), found.clone());
                    found
                }
            };
            let server = server_name(&e.task, e.port);
            let now = current.iter().find(|s| s.name == server);
            let address = match found {
                Ok(ips) => {
                    // The address it has, while the name still resolves to it (no
                    // churn when a name has several); else an IPv4 one, else any.
                    let kept = now
                        .and_then(|s| s.address.parse::<IpAddr>().ok())
                        .filter(|ip| ips.contains(ip));
                    kept.or_else(|| ips.iter().copied().find(IpAddr::is_ipv4))
                        .or_else(|| ips.first().copied())
                        .map(|ip| ip.to_string())
                }
                Err(why) => {
                    problems.insert(
                        format!("resolve {host}"),
                        format!(
                            "cannot resolve {host} (host {}): {why}; its servers are left as they are",
                            e.host
                        ),
                    );
                    // Left as it is rather than removed for a DNS hiccup.
                    now.map(|s| s.address.clone())
                }
            };
            if let Some(address) = address {
                let mut e = e.clone();
                e.address = address;
                out.push(e);
            }
        }
        out
    }

    /// Runs a change's commands; `Ok(Err(why))` when HAProxy refused one (the rest are
    /// not run), `Err` when HAProxy could not be reached.
    async fn apply(&self, change: &Change) -> anyhow::Result<Result<(), String>> {
        let mut shut = false;
        for (command, expect) in change.steps(&self.backend) {
            let mut answer = haproxy(&self.socket, &command).await?;
            // Sessions close a moment after `shutdown sessions` returns.
            let mut tries = 0;
            while shut && expect == Expect::Deleted && !expect.accepts(&answer) && tries < 20 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                answer = haproxy(&self.socket, &command).await?;
                tries += 1;
            }
            if !expect.accepts(&answer) {
                return Ok(Err(format!("`{command}`: {}", answer.trim())));
            }
            shut |= command.starts_with("shutdown sessions");
        }
        Ok(Ok(()))
    }
}

/// A host name's addresses, sorted.
async fn resolve(host: &str) -> Result<Vec<IpAddr>, String> {
    match tokio::time::timeout(SOCKET_TIMEOUT, tokio::net::lookup_host((host, 0))).await {
        Ok(Ok(found)) => {
            let mut ips: Vec<IpAddr> = found.map(|a| a.ip()).collect();
            ips.sort();
            ips.dedup();
            if ips.is_empty() {
                Err("no address".to_owned())
            } else {
                Ok(ips)
            }
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {} s", SOCKET_TIMEOUT.as_secs())),
    }
}
