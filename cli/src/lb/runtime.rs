//! HAProxy's Runtime API: one command sent to the admin socket, the answer to `show
//! servers state` read, and the names and addresses Tessera's servers get.

use super::{PREFIX, SOCKET_TIMEOUT};
use anyhow::{Context, bail};
use std::net::IpAddr;
use std::path::Path;

/// The most a Runtime API answer may hold (a backend's state is a line per server).
const ANSWER_LIMIT: u64 = 16 * 1024 * 1024;

/// `srv_admin_state` bits (HAProxy's `enum srv_admin`).
pub(super) const FMAINT: u32 = 0x01;
const IMAINT: u32 = 0x02;
const CMAINT: u32 = 0x04;
pub(super) const FDRAIN: u32 = 0x08;
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
pub(super) fn bare_host(address: &str) -> &str {
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
pub(super) fn valid_backend(name: &str) -> bool {
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
    pub(super) fn shown_address(&self) -> String {
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
