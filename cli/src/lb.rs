//! `tessera lb haproxy`: keeps an HAProxy backend's servers equal to a service's healthy
//! endpoints, through HAProxy's Runtime API (its admin socket). Tessera carries no
//! traffic: this drives a load balancer operators already run.
//!
//! # How
//! - A round reads the service's endpoints (`GET /api/v1/services/{name}/endpoints`) and
//!   the backend's servers (`show servers state BACKEND`), then runs the commands [`plan`]
//!   returns. Rounds run at start, on each change the live feed (`GET /api/v1/live`)
//!   announces, and every 5 s regardless: HAProxy forgets servers added at runtime when it
//!   restarts or reloads, and the next round fills it again.
//! - Tessera's servers are the ones named `tsr-…` ([`server_name`]); the backend's other
//!   servers are never touched, so a backend can mix static servers and Tessera's.
//! - Only healthy endpoints get traffic. A draining endpoint's server is set to `drain`
//!   (no new connections, open ones finish); a gone, unhealthy or starting one's is put in
//!   maintenance and deleted. HAProxy refuses to delete a server that still has
//!   connections: the delete is retried each round, and once the server has been waiting
//!   for 30 s its sessions are closed (`shutdown sessions`).
//! - Endpoints are TCP ports. A task with several ports gets one server per port unless
//!   `--port-name` picks one: pass it when tasks have several ports.
//! - Servers added at runtime take IP addresses (HAProxy leaves a host name unresolved and
//!   sends it nothing), so hosts that advertise a name are resolved here.
//! - Stopping the command (SIGINT, SIGTERM) leaves the servers as they are: HAProxy keeps
//!   serving the last known endpoints.
//!
//! The backend needs a balancing algorithm that takes servers at runtime (`roundrobin`,
//! `leastconn`, `first`, `random`, or hashing with `hash-type consistent`); tested with
//! HAProxy 2.6.

use super::{Client, Exit};
use anyhow::{Context, bail};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tessera_model::api::{Endpoint, EndpointHealth, EndpointList};
use tessera_model::taskdef::Protocol;
use tokio::sync::Notify;

/// Tessera's servers' names start with this; no other server in the backend is touched.
pub const PREFIX: &str = "tsr-";

/// How long one Runtime API command may take, connecting included.
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// A round runs at least this often, whatever the live feed says.
pub const RESYNC: Duration = Duration::from_secs(5);

/// How long a server's removal may wait on its connections before they are closed.
pub const SHUTDOWN_AFTER: Duration = Duration::from_secs(30);

/// The live feed sends a keep-alive every 15 s: this long without a byte means it is
/// dead even if its connection looks open.
const LIVE_IDLE: Duration = Duration::from_secs(45);

/// The most a Runtime API answer may hold (a backend's state is a line per server).
const ANSWER_LIMIT: u64 = 16 * 1024 * 1024;

/// `srv_admin_state` bits (HAProxy's `enum srv_admin`).
const FMAINT: u32 = 0x01;
const IMAINT: u32 = 0x02;
const CMAINT: u32 = 0x04;
const FDRAIN: u32 = 0x08;
const IDRAIN: u32 = 0x10;
const RMAINT: u32 = 0x20;
const HMAINT: u32 = 0x40;

/// Sends one command to HAProxy's Runtime API at `socket` and returns its answer.
///
/// HAProxy answers errors with text, not a status (`No such server.`), so callers judge
/// the text. One command per connection: HAProxy closes it after answering.
pub async fn haproxy(socket: &Path, command: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A newline or `;` would make a second command.
    if command.contains(['\n', '\r', ';']) {
        bail!("{command:?} is more than one Runtime API command");
    }
    let talk = async {
        let mut stream = tokio::net::UnixStream::connect(socket)
            .await
            .with_context(|| format!("connecting to HAProxy's socket {}", socket.display()))?;
        stream
            .write_all(format!("{command}\n").as_bytes())
            .await
            .with_context(|| format!("sending `{command}` to {}", socket.display()))?;
        let mut answer = Vec::new();
        stream
            .take(ANSWER_LIMIT)
            .read_to_end(&mut answer)
            .await
            .with_context(|| format!("reading HAProxy's answer to `{command}`"))?;
        anyhow::Ok(answer)
    };
    let answer = tokio::time::timeout(SOCKET_TIMEOUT, talk)
        .await
        .with_context(|| {
            format!(
                "HAProxy's socket {} did not answer `{command}` within {} s",
                socket.display(),
                SOCKET_TIMEOUT.as_secs()
            )
        })??;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// The name of the server for `task`'s host port `port`: [`PREFIX`], the task id's first
/// 12 letters and digits (a UUID's first 48 random bits), the port. Deterministic, so
/// that each round finds the servers the last one added, and within HAProxy's name
/// rules (letters, digits, `-`, `_`, `.`, `:`).
pub fn server_name(task: &str, port: u16) -> String {
    let short: String = task
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    format!("{PREFIX}{short}-{port}")
}

/// `address:port`, with an IPv6 address in brackets.
pub fn host_port(address: &str, port: u16) -> String {
    let bare = bare_host(address);
    if bare.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{bare}]:{port}")
    } else {
        format!("{bare}:{port}")
    }
}

/// An address without the brackets an IPv6 one may come in.
fn bare_host(address: &str) -> &str {
    address
        .strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .unwrap_or(address)
}

/// `address:port` as `add server` takes it, or `None` for an address that is neither an
/// IP address nor a host name (it must not smuggle a second command in).
pub fn haproxy_address(address: &str, port: u16) -> Option<String> {
    let bare = bare_host(address);
    if bare.parse::<IpAddr>().is_ok() {
        return Some(host_port(bare, port));
    }
    let host_name = !bare.is_empty()
        && bare.len() <= 253
        && !bare.starts_with(['-', '.'])
        && bare
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    host_name.then(|| format!("{bare}:{port}"))
}

/// Whether a backend name can go into a command as it is (HAProxy's own rule for names).
fn valid_backend(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// Whether a server takes new traffic, from its `srv_admin_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admin {
    Ready,
    /// Only connections that stick to it (persistence); open ones go on.
    Drain,
    /// Nothing new; open connections go on until they end or are shut.
    Maint,
}

impl Admin {
    /// Any maintenance bit (forced, inherited, configured, resolution, host name) wins
    /// over drain.
    pub fn from_bits(bits: u32) -> Admin {
        if bits & (FMAINT | IMAINT | CMAINT | RMAINT | HMAINT) != 0 {
            Admin::Maint
        } else if bits & (FDRAIN | IDRAIN) != 0 {
            Admin::Drain
        } else {
            Admin::Ready
        }
    }
}

/// One server of a backend, from `show servers state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerState {
    pub name: String,
    /// The IP address, or `-` when it has none (a host name HAProxy did not resolve).
    pub address: String,
    /// The host name it was given, if any.
    pub fqdn: Option<String>,
    pub port: u16,
    /// `srv_admin_state`: a bit field (0x01 forced maintenance, 0x08 forced drain, …).
    pub admin_state: u32,
    /// `srv_op_state` 2: running (HAProxy's own checks, if any, pass).
    pub running: bool,
}

impl ServerState {
    pub fn admin(&self) -> Admin {
        Admin::from_bits(self.admin_state)
    }

    /// Whether it points at `address`:`port`.
    pub fn is_at(&self, address: &str, port: u16) -> bool {
        if self.port != port {
            return false;
        }
        let want = bare_host(address);
        match (want.parse::<IpAddr>(), self.address.parse::<IpAddr>()) {
            (Ok(a), Ok(b)) => a == b,
            _ => {
                self.address.eq_ignore_ascii_case(want)
                    || self
                        .fqdn
                        .as_deref()
                        .is_some_and(|f| f.eq_ignore_ascii_case(want))
            }
        }
    }

    /// `address:port` for messages.
    fn shown_address(&self) -> String {
        let host = match (&self.fqdn, self.address.as_str()) {
            (Some(f), "-") => f.as_str(),
            _ => self.address.as_str(),
        };
        host_port(host, self.port)
    }
}

/// The columns `show servers state` had in HAProxy 2.6, for an answer without its `#`
/// line.
const STATE_COLUMNS: &[&str] = &[
    "be_id",
    "be_name",
    "srv_id",
    "srv_name",
    "srv_addr",
    "srv_op_state",
    "srv_admin_state",
    "srv_uweight",
    "srv_iweight",
    "srv_time_since_last_change",
    "srv_check_status",
    "srv_check_result",
    "srv_check_health",
    "srv_check_state",
    "srv_agent_state",
    "bk_f_forced_id",
    "srv_f_forced_id",
    "srv_fqdn",
    "srv_port",
    "srvrecord",
];

fn field<'a>(columns: &[&str], fields: &[&'a str], name: &str) -> Option<&'a str> {
    let i = columns.iter().position(|c| *c == name)?;
    fields.get(i).copied()
}

/// Parses the answer to `show servers state [BACKEND]`: a version line, a `#` line naming
/// the columns, then a line per server (columns are found by name, so versions that add
/// some still parse). An answer that does not start with a version is HAProxy's error
/// text, returned as the error.
pub fn parse_servers_state(answer: &str) -> anyhow::Result<Vec<ServerState>> {
    let mut lines = answer.lines().map(str::trim).filter(|l| !l.is_empty());
    let version = lines.next().unwrap_or_default();
    if version.parse::<u32>().is_err() {
        bail!("HAProxy answered {:?}", answer.trim());
    }
    let mut columns: Vec<&str> = STATE_COLUMNS.to_vec();
    let mut servers = Vec::new();
    for line in lines {
        if let Some(header) = line.strip_prefix('#') {
            columns = header.split_whitespace().collect();
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let get = |name: &str| {
            field(&columns, &fields, name)
                .with_context(|| format!("no {name} in the server line {line:?}"))
        };
        let name = get("srv_name")?;
        let port = get("srv_port")?;
        let admin = get("srv_admin_state")?;
        let op = get("srv_op_state")?;
        servers.push(ServerState {
            name: name.to_owned(),
            address: get("srv_addr")?.to_owned(),
            fqdn: field(&columns, &fields, "srv_fqdn")
                .filter(|f| *f != "-")
                .map(str::to_owned),
            port: port
                .parse()
                .with_context(|| format!("server {name}: port {port:?} is not a number"))?,
            admin_state: admin
                .parse()
                .with_context(|| format!("server {name}: admin state {admin:?} is not a number"))?,
            running: op == "2",
        });
    }
    Ok(servers)
}

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
enum Expect {
    /// `set server`, `shutdown sessions`: nothing.
    Nothing,
    /// `add server`.
    Registered,
    /// `del server` (a server already gone is as good).
    Deleted,
}

impl Expect {
    fn accepts(self, answer: &str) -> bool {
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

    fn steps(&self, backend: &str) -> Vec<(String, Expect)> {
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

/// Whether a line of the live feed announces a change (any `data:` line does; comments,
/// which start with `:`, are keep-alives).
pub fn live_line_is_change(line: &str) -> bool {
    line.trim_end_matches(['\r', '\n']).starts_with("data:")
}

/// Retries wait 1 s, 2 s, 4 s, … up to 30 s.
fn backoff(failures: u32) -> Duration {
    let millis = 500u64.saturating_mul(1u64 << failures.min(6));
    Duration::from_millis(millis).min(Duration::from_secs(30))
}

/// Whether an error is the operator's to fix (the service does not exist, the token does
/// not work, the backend does not exist) rather than one to wait out.
fn is_fatal(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<Exit>())
        .any(|x| x.status.is_none_or(|s| matches!(s, 400 | 401 | 403 | 404)))
}

/// `tessera lb haproxy`: keeps `backend` of the HAProxy whose admin socket is `socket`
/// equal to `service`'s healthy endpoints until SIGINT or SIGTERM. Returns an error only
/// for what waiting does not fix (the service is unknown, the token is refused, the
/// backend does not exist); an unreachable server or HAProxy is told on stderr and
/// retried.
pub async fn run_haproxy(
    c: &Client,
    socket: &Path,
    backend: &str,
    service: &str,
    port_name: Option<&str>,
) -> anyhow::Result<()> {
    run_haproxy_until(c, socket, backend, service, port_name, signalled()).await
}

/// [`run_haproxy`] until `stop` resolves (tests stop it without signals).
pub async fn run_haproxy_until(
    c: &Client,
    socket: &Path,
    backend: &str,
    service: &str,
    port_name: Option<&str>,
    stop: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    if !valid_backend(backend) {
        return Err(Exit::new(
            2,
            format!(
                "--backend {backend:?}: a backend name is letters, digits, '-', '_', '.' and ':'"
            ),
        )
        .into());
    }
    let mut syncer = Syncer::new(socket, backend, port_name);
    let wake = Notify::new();
    tokio::select! {
        r = sync_loop(c, &mut syncer, service, &wake) => r,
        never = follow_live(c, &wake) => match never {},
        r = stop => {
            r?;
            eprintln!("tessera lb: stopping; HAProxy keeps its servers as they are");
            Ok(())
        }
    }
}

/// SIGINT or SIGTERM.
async fn signalled() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("listening for SIGINT"),
        _ = term.recv() => Ok(()),
    }
}

/// Rounds, at start, when woken and every [`RESYNC`]; transient failures are told once
/// and retried.
async fn sync_loop(
    c: &Client,
    syncer: &mut Syncer,
    service: &str,
    wake: &Notify,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/services/{}/endpoints", super::seg(service));
    let mut failures: u32 = 0;
    let mut last_error: Option<String> = None;
    loop {
        let round = async {
            let list: EndpointList = c
                .get(&path)
                .await
                .with_context(|| format!("reading service {service}'s endpoints"))?;
            syncer.sync(&list.endpoints).await
        };
        match round.await {
            Ok(round) => {
                for note in &round.notes {
                    eprintln!("tessera lb: {note}");
                }
                for line in &round.changed {
                    say!("{line}");
                }
                if last_error.take().is_some() {
                    eprintln!("tessera lb: in step again");
                }
                failures = 0;
            }
            Err(e) if is_fatal(&e) => return Err(e),
            Err(e) => {
                let text = format!("{e:#}");
                if last_error.as_deref() != Some(text.as_str()) {
                    eprintln!("tessera lb: {text}; trying again");
                }
                last_error = Some(text);
                failures = failures.saturating_add(1);
            }
        }
        let wait = if failures == 0 {
            RESYNC
        } else {
            backoff(failures).min(RESYNC)
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Follows the live feed for ever, waking `wake` on each change and on each reconnection
/// (changes may have been missed meanwhile); reconnects with a backoff, telling a failure
/// once rather than at every try.
async fn follow_live(c: &Client, wake: &Notify) -> Infallible {
    let mut failures: u32 = 0;
    let mut last_error: Option<String> = None;
    loop {
        let started = Instant::now();
        let result = read_live(c, wake).await;
        // A feed that lasted starts the backoff again, and its end is news.
        if started.elapsed() > Duration::from_secs(60) {
            failures = 0;
            last_error = None;
        }
        match result {
            Ok(()) => last_error = None,
            Err(e) => {
                let text = format!("{e:#}");
                if last_error.as_deref() != Some(text.as_str()) {
                    eprintln!(
                        "tessera lb: the live feed dropped ({text}); rounds run every {} s \
                         until it is back",
                        RESYNC.as_secs()
                    );
                }
                last_error = Some(text);
            }
        }
        failures = failures.saturating_add(1);
        tokio::time::sleep(backoff(failures)).await;
    }
}

/// One connection to the live feed, until it ends.
async fn read_live(c: &Client, wake: &Notify) -> anyhow::Result<()> {
    let mut response = tokio::time::timeout(Duration::from_secs(30), c.stream("/api/v1/live"))
        .await
        .context("no answer within 30 s")??;
    wake.notify_one();
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let chunk = match tokio::time::timeout(LIVE_IDLE, response.chunk()).await {
            Err(_) => bail!(
                "nothing, not even a keep-alive, for {} s",
                LIVE_IDLE.as_secs()
            ),
            // The request's own time limit: reconnect without a word.
            Ok(Err(e)) if e.is_timeout() => return Ok(()),
            Ok(Err(e)) => return Err(anyhow::Error::new(e).context("reading the live feed")),
            Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(chunk))) => chunk,
        };
        pending.extend_from_slice(&chunk);
        let mut changed = false;
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            changed |= live_line_is_change(&String::from_utf8_lossy(&line));
        }
        if changed {
            wake.notify_one();
        }
        if pending.len() > 64 * 1024 {
            bail!("the live feed sent a line longer than 64 KiB");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::HostId;

    const TASK_A: &str = "0f3c9a1e-77b2-4c1d-9e0a-1234567890ab";
    const TASK_B: &str = "a1b2c3d4-e5f6-4789-8abc-def012345678";

    fn endpoint(task: &str, address: &str, port: u16, health: EndpointHealth) -> Endpoint {
        Endpoint {
            task: task.to_owned(),
            host: HostId::new("gpu-1").expect("a host id"),
            address: address.to_owned(),
            port,
            port_name: Some("http".to_owned()),
            container_port: 8000,
            protocol: Protocol::Tcp,
            health,
            reason: None,
            task_definition: "chat:3".parse().expect("family:revision"),
        }
    }

    fn server(name: &str, address: &str, port: u16, admin_state: u32) -> ServerState {
        ServerState {
            name: name.to_owned(),
            address: address.to_owned(),
            fqdn: None,
            port,
            admin_state,
            running: true,
        }
    }

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    #[test]
    fn names_are_short_deterministic_and_legal() {
        let n = server_name(TASK_A, 32801);
        assert_eq!(n, "tsr-0f3c9a1e77b2-32801");
        assert_eq!(server_name(TASK_A, 32801), n);
        assert_ne!(server_name(TASK_A, 32802), n);
        assert_ne!(server_name(TASK_B, 32801), n);
        let odd = server_name("Task;with spaces/and\nmore", 1);
        assert!(
            odd.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)),
            "{odd}"
        );
    }

    #[test]
    fn addresses_are_ip_or_host_names_with_ipv6_in_brackets() {
        assert_eq!(
            haproxy_address("10.0.0.5", 80).as_deref(),
            Some("10.0.0.5:80")
        );
        assert_eq!(haproxy_address("::1", 80).as_deref(), Some("[::1]:80"));
        assert_eq!(
            haproxy_address("[fe80::1]", 80).as_deref(),
            Some("[fe80::1]:80")
        );
        assert_eq!(
            haproxy_address("gpu-1.example", 80).as_deref(),
            Some("gpu-1.example:80")
        );
        for bad in ["", "a b", "x;del server web/s", "-x", "a\nb"] {
            assert_eq!(haproxy_address(bad, 80), None, "{bad:?}");
        }
        assert_eq!(host_port("::1", 9), "[::1]:9");
        assert_eq!(host_port("10.0.0.5", 9), "10.0.0.5:9");
    }

    #[test]
    fn a_healthy_endpoint_without_a_server_is_added_then_readied() {
        let eps = [endpoint(TASK_A, "10.0.0.5", 32801, EndpointHealth::Healthy)];
        let changes = plan(&[], &eps, None, &none());
        assert_eq!(
            commands("web", &changes),
            [
                "add server web/tsr-0f3c9a1e77b2-32801 10.0.0.5:32801",
                "set server web/tsr-0f3c9a1e77b2-32801 state ready",
            ]
        );
        assert_eq!(
            changes[0].describe(),
            format!("added tsr-0f3c9a1e77b2-32801 10.0.0.5:32801 (task {TASK_A})")
        );
    }

    #[test]
    fn endpoints_that_should_get_no_traffic_are_not_added() {
        let eps = [
            endpoint(TASK_A, "10.0.0.5", 1, EndpointHealth::Starting),
            endpoint(TASK_A, "10.0.0.5", 2, EndpointHealth::Unhealthy),
            endpoint(TASK_A, "10.0.0.5", 3, EndpointHealth::Draining),
        ];
        assert!(plan(&[], &eps, None, &none()).is_empty());
    }

    #[test]
    fn a_server_in_step_is_left_alone() {
        let eps = [
            endpoint(TASK_A, "10.0.0.5", 32801, EndpointHealth::Healthy),
            endpoint(TASK_B, "10.0.0.6", 32802, EndpointHealth::Draining),
        ];
        let current = [
            server(&server_name(TASK_A, 32801), "10.0.0.5", 32801, 0),
            server(&server_name(TASK_B, 32802), "10.0.0.6", 32802, FDRAIN),
        ];
        assert!(plan(&current, &eps, None, &none()).is_empty());
    }

    #[test]
    fn a_server_out_of_rotation_whose_endpoint_is_healthy_is_readied() {
        let eps = [
            endpoint(TASK_A, "10.0.0.5", 32801, EndpointHealth::Healthy),
            endpoint(TASK_B, "10.0.0.6", 32802, EndpointHealth::Healthy),
        ];
        let current = [
            // Added, but the ready step did not happen (or someone set it).
            server(&server_name(TASK_A, 32801), "10.0.0.5", 32801, FMAINT),
            server(&server_name(TASK_B, 32802), "10.0.0.6", 32802, FDRAIN),
        ];
        let changes = plan(&current, &eps, None, &none());
        assert_eq!(
            commands("web", &changes),
            [
                "set server web/tsr-0f3c9a1e77b2-32801 state ready",
                "set server web/tsr-a1b2c3d4e5f6-32802 state ready",
            ]
        );
    }

    #[test]
    fn a_draining_endpoint_drains_its_server_once() {
        let eps = [endpoint(
            TASK_A,
            "10.0.0.5",
            32801,
            EndpointHealth::Draining,
        )];
        let ready = [server(&server_name(TASK_A, 32801), "10.0.0.5", 32801, 0)];
        let changes = plan(&ready, &eps, None, &none());
        assert_eq!(
            commands("web", &changes),
            ["set server web/tsr-0f3c9a1e77b2-32801 state drain"]
        );
        assert!(
            changes[0]
                .describe()
                .starts_with("draining tsr-0f3c9a1e77b2-32801")
        );
        let drained = [server(
            &server_name(TASK_A, 32801),
            "10.0.0.5",
            32801,
            FDRAIN,
        )];
        assert!(plan(&drained, &eps, None, &none()).is_empty());
        let maint = [server(
            &server_name(TASK_A, 32801),
            "10.0.0.5",
            32801,
            FMAINT,
        )];
        assert!(plan(&maint, &eps, None, &none()).is_empty());
    }

    #[test]
    fn a_server_whose_endpoint_is_gone_unhealthy_or_starting_is_removed() {
        let eps = [
            endpoint(TASK_B, "10.0.0.6", 2, EndpointHealth::Unhealthy),
            endpoint(TASK_B, "10.0.0.6", 3, EndpointHealth::Starting),
        ];
        let current = [
            server(&server_name(TASK_A, 1), "10.0.0.5", 1, 0),
            server(&server_name(TASK_B, 2), "10.0.0.6", 2, 0),
            // Already in maintenance (a delete that was refused): no second maint.
            server(&server_name(TASK_B, 3), "10.0.0.6", 3, FMAINT),
        ];
        let changes = plan(&current, &eps, None, &none());
        assert_eq!(
            commands("web", &changes),
            [
                "set server web/tsr-0f3c9a1e77b2-1 state maint",
                "del server web/tsr-0f3c9a1e77b2-1",
                "set server web/tsr-a1b2c3d4e5f6-2 state maint",
                "del server web/tsr-a1b2c3d4e5f6-2",
                "del server web/tsr-a1b2c3d4e5f6-3",
            ]
        );
        assert_eq!(
            changes[0].describe(),
            "removed tsr-0f3c9a1e77b2-1 10.0.0.5:1 (task gone)"
        );
        assert_eq!(
            changes[1].describe(),
            format!("removed tsr-a1b2c3d4e5f6-2 10.0.0.6:2 (task {TASK_B} unhealthy)")
        );
    }

    #[test]
    fn a_removal_that_waited_long_enough_closes_the_sessions_first() {
        let name = server_name(TASK_A, 1);
        let current = [server(&name, "10.0.0.5", 1, FMAINT)];
        let force: BTreeSet<String> = [name.clone()].into();
        let changes = plan(&current, &[], None, &force);
        assert_eq!(
            commands("web", &changes),
            [
                format!("shutdown sessions server web/{name}"),
                format!("del server web/{name}"),
            ]
        );
    }

    #[test]
    fn a_server_at_another_address_is_removed_then_added_again() {
        let eps = [endpoint(TASK_A, "10.0.0.9", 32801, EndpointHealth::Healthy)];
        let current = [server(&server_name(TASK_A, 32801), "10.0.0.5", 32801, 0)];
        assert_eq!(
            commands("web", &plan(&current, &eps, None, &none())),
            [
                "set server web/tsr-0f3c9a1e77b2-32801 state maint",
                "del server web/tsr-0f3c9a1e77b2-32801",
                "add server web/tsr-0f3c9a1e77b2-32801 10.0.0.9:32801",
                "set server web/tsr-0f3c9a1e77b2-32801 state ready",
            ]
        );
        // Moved and not healthy: only removed.
        let eps = [endpoint(
            TASK_A,
            "10.0.0.9",
            32801,
            EndpointHealth::Draining,
        )];
        assert_eq!(
            commands("web", &plan(&current, &eps, None, &none())),
            [
                "set server web/tsr-0f3c9a1e77b2-32801 state maint",
                "del server web/tsr-0f3c9a1e77b2-32801",
            ]
        );
        // IPv6 written differently is the same address.
        let eps = [endpoint(TASK_A, "[::1]", 32801, EndpointHealth::Healthy)];
        let current = [server(
            &server_name(TASK_A, 32801),
            "0:0:0:0:0:0:0:1",
            32801,
            0,
        )];
        assert!(plan(&current, &eps, None, &none()).is_empty());
    }

    #[test]
    fn servers_without_the_prefix_are_never_touched() {
        let current = [
            server("static-1", "10.0.0.1", 80, 0),
            server("tsr", "10.0.0.2", 80, 0),
            server("web-tsr-x", "10.0.0.3", 80, FMAINT),
        ];
        assert!(plan(&current, &[], None, &none()).is_empty());
    }

    #[test]
    fn udp_endpoints_are_ignored() {
        let mut udp = endpoint(TASK_A, "10.0.0.5", 5353, EndpointHealth::Healthy);
        udp.protocol = Protocol::Udp;
        assert!(plan(&[], std::slice::from_ref(&udp), None, &none()).is_empty());
        // Even a server of ours at that port goes: udp is never served.
        let current = [server(&server_name(TASK_A, 5353), "10.0.0.5", 5353, 0)];
        assert_eq!(
            commands("web", &plan(&current, &[udp], None, &none())),
            [
                "set server web/tsr-0f3c9a1e77b2-5353 state maint",
                "del server web/tsr-0f3c9a1e77b2-5353",
            ]
        );
    }

    #[test]
    fn port_name_picks_one_port_of_each_task() {
        let mut metrics = endpoint(TASK_A, "10.0.0.5", 32802, EndpointHealth::Healthy);
        metrics.port_name = Some("metrics".to_owned());
        let eps = [
            endpoint(TASK_A, "10.0.0.5", 32801, EndpointHealth::Healthy),
            metrics,
        ];
        assert_eq!(plan(&[], &eps, None, &none()).len(), 2);
        assert_eq!(
            commands("web", &plan(&[], &eps, Some("http"), &none()))[0],
            "add server web/tsr-0f3c9a1e77b2-32801 10.0.0.5:32801"
        );
        assert_eq!(plan(&[], &eps, Some("http"), &none()).len(), 1);
    }

    #[test]
    fn new_servers_come_before_removals() {
        let eps = [endpoint(TASK_B, "10.0.0.6", 2, EndpointHealth::Healthy)];
        let current = [server(&server_name(TASK_A, 1), "10.0.0.5", 1, 0)];
        let changes = plan(&current, &eps, None, &none());
        assert!(matches!(changes[0], Change::Add { .. }), "{changes:?}");
        assert!(matches!(changes[1], Change::Remove { .. }), "{changes:?}");
    }

    const STATE: &str = "1\n\
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n\
3 web 1 static 127.0.0.1 0 5 1 1 12 1 0 0 0 0 0 0 - 9 - 0 0 - - 0\n\
3 web 2 tsr-0f3c9a1e77b2-32801 10.0.0.5 2 0 1 1 3 1 0 0 0 0 0 0 - 32801 - 0 0 - - 0\n\
3 web 3 tsr-a1b2c3d4e5f6-32802 10.0.0.6 2 8 1 1 3 1 0 0 0 0 0 0 - 32802 - 0 0 - - 0\n\
3 web 4 h - 0 1 1 1 0 1 0 0 0 0 0 0 gpu-1.example 19002 - 0 0 - - 0\n\
\n";

    #[test]
    fn server_state_is_parsed_by_column_name() {
        let servers = parse_servers_state(STATE).expect("parses");
        assert_eq!(servers.len(), 4);
        assert_eq!(servers[0].name, "static");
        assert_eq!(servers[0].admin(), Admin::Maint);
        assert!(!servers[0].running);
        assert_eq!(
            servers[1],
            ServerState {
                name: "tsr-0f3c9a1e77b2-32801".into(),
                address: "10.0.0.5".into(),
                fqdn: None,
                port: 32801,
                admin_state: 0,
                running: true,
            }
        );
        assert_eq!(servers[1].admin(), Admin::Ready);
        assert_eq!(servers[2].admin(), Admin::Drain);
        assert_eq!(servers[3].address, "-");
        assert_eq!(servers[3].fqdn.as_deref(), Some("gpu-1.example"));
        assert!(servers[3].is_at("gpu-1.example", 19002));
        assert_eq!(servers[3].shown_address(), "gpu-1.example:19002");
    }

    #[test]
    fn an_empty_backend_and_an_error_answer() {
        let empty =
            "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_port\n\n";
        assert!(parse_servers_state(empty).expect("parses").is_empty());
        let err = parse_servers_state("Can't find backend.\n\n").expect_err("an error");
        assert!(err.to_string().contains("Can't find backend"), "{err}");
        // Without the `#` line, 2.6's columns are assumed.
        let bare = "1\n3 web 2 tsr-x 10.0.0.5 2 0 1 1 3 1 0 0 0 0 0 0 - 32801 -\n";
        assert_eq!(parse_servers_state(bare).expect("parses")[0].port, 32801);
    }

    #[test]
    fn only_data_lines_of_the_feed_are_changes() {
        assert!(live_line_is_change("data: change\n"));
        assert!(live_line_is_change("data: change\r\n"));
        assert!(!live_line_is_change(": keep-alive\n"));
        assert!(!live_line_is_change("\n"));
        assert!(!live_line_is_change("event: x\n"));
    }

    #[test]
    fn refusals_are_told_by_their_text() {
        assert!(Expect::Registered.accepts("New server registered.\n\n"));
        assert!(
            !Expect::Registered.accepts("Already exists a server with the same name in backend.\n")
        );
        assert!(Expect::Nothing.accepts("\n"));
        assert!(!Expect::Nothing.accepts("No such server.\n\n"));
        assert!(Expect::Deleted.accepts("Server deleted.\n"));
        assert!(Expect::Deleted.accepts("No such server.\n"));
        assert!(
            !Expect::Deleted
                .accepts("Server still has connections attached to it, cannot remove it.\n")
        );
        assert!(!Expect::Deleted.accepts("Only servers in maintenance mode can be deleted.\n"));
    }

    #[test]
    fn only_operator_errors_are_fatal() {
        let refused = |status| Exit {
            code: 1,
            message: "refused".into(),
            status: Some(status),
        };
        assert!(is_fatal(
            &anyhow::Error::new(refused(404)).context("reading")
        ));
        assert!(is_fatal(&anyhow::Error::from(Exit::new(2, "no backend"))));
        assert!(!is_fatal(&anyhow::Error::new(refused(503))));
        assert!(!is_fatal(&anyhow::anyhow!("cannot reach the server")));
    }

    #[test]
    fn backoff_grows_to_a_ceiling() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(100), Duration::from_secs(30));
    }

    #[test]
    fn backend_names_that_cannot_smuggle_a_command() {
        assert!(valid_backend("web"));
        assert!(valid_backend("be_chat.v2:x-1"));
        assert!(!valid_backend(""));
        assert!(!valid_backend("web; del server web/x"));
        assert!(!valid_backend("web\nshow info"));
    }
}
