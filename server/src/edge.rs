//! What a connection and a request may hold, so that slow or numerous clients cannot
//! starve the server, and above all not the agents' syncs (a fleet whose syncs time out
//! is declared lost and its tasks stopped):
//!
//! - connections per client address are capped at accept ([`ConnectionLimit`]);
//! - request headers must arrive within [`Limits::header_timeout`], a first request on
//!   a new connection too, and bodies may not pause longer than it ([`crate::run`]);
//! - agents' syncs (`/agent/…` with a valid agent token, registration aside) and every
//!   other request draw on separate budgets of requests handled at once, and the others
//!   also on a per-address budget ([`budget`]); the whole request, its body included,
//!   ends within [`Limits::request_timeout`];
//! - an agent's sync is one per host, a share per address, and its body whole within a
//!   short deadline before it takes a shared slot; an address whose agent tokens keep
//!   being wrong is refused without a lookup ([`budget`]).

use crate::AppState;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tessera_model::HostId;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The address a client's share is counted by: IPv6 addresses by their /64 (one client's
/// share, however many addresses it takes from its prefix), IPv4-mapped ones as IPv4.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

/// Hosts with an agent request in flight: one at a time each.
pub type OnePerHost = Shares<HostId>;

/// Addresses that sent wrong agent tokens lately: past [`WrongTokens::MAX`] in a minute,
/// an address is refused without a lookup until the minute is over.
#[derive(Debug, Clone, Default)]
pub struct WrongTokens {
    seen: Arc<Mutex<Recent>>,
}

/// Each address's wrong tokens in its current window, and when they were last pruned.
#[derive(Debug, Default)]
struct Recent {
    windows: HashMap<IpAddr, (u32, std::time::Instant)>,
    pruned: Option<std::time::Instant>,
}

impl WrongTokens {
    /// Wrong tokens an address may send in [`WrongTokens::WINDOW`].
    pub const MAX: u32 = 20;
    pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(60);
    /// Addresses remembered at most; past it the oldest windows are forgotten.
    const ADDRESSES: usize = 100_000;

    pub fn blocked(&self, ip: IpAddr) -> bool {
        let ip = client_key(ip);
        self.seen
            .lock()
            .windows
            .get(&ip)
            .is_some_and(|(n, since)| *n >= Self::MAX && since.elapsed() < Self::WINDOW)
    }

    pub fn record(&self, ip: IpAddr) {
        let ip = client_key(ip);
        let mut recent = self.seen.lock();
        let Recent { windows, pruned } = &mut *recent;
        if windows.len() >= Self::ADDRESSES && !windows.contains_key(&ip) {
            // At most one pass over them all a second: a flood of new addresses costs no
            // pass each. Still full of live windows, a new address goes uncounted.
            if pruned.is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(1)) {
                windows.retain(|_, (_, since)| since.elapsed() < Self::WINDOW);
                *pruned = Some(std::time::Instant::now());
            }
            if windows.len() >= Self::ADDRESSES {
                return;
            }
        }
        let entry = windows.entry(ip).or_insert((0, std::time::Instant::now()));
        if entry.1.elapsed() >= Self::WINDOW {
            *entry = (0, std::time::Instant::now());
        }
        entry.0 += 1;
    }
}

/// How many of something each key (a client address, a user, a host) holds at once.
#[derive(Debug, Clone)]
pub struct Shares<K: std::hash::Hash + Eq + Clone> {
    held: Arc<Mutex<HashMap<K, usize>>>,
    max: usize,
}

/// One held; given back when dropped.
#[derive(Debug)]
pub struct Held<K: std::hash::Hash + Eq + Clone> {
    held: Arc<Mutex<HashMap<K, usize>>>,
    key: K,
}

impl<K: std::hash::Hash + Eq + Clone> Drop for Held<K> {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Shares<K> {
    pub fn new(max: usize) -> Self {
        Shares {
            held: Arc::default(),
            max,
        }
    }

    /// One more for `key`, unless it holds `max` already.
    pub fn enter(&self, key: &K) -> Option<Held<K>> {
        let mut held = self.held.lock();
        let n = held.entry(key.clone()).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Held {
            held: self.held.clone(),
            key: key.clone(),
        })
    }
}

impl Default for Shares<HostId> {
    /// One each.
    fn default() -> Self {
        Shares::new(1)
    }
}

/// How many of something each client address holds at once: IPv6 addresses count by
/// their /64 (one client's share, however many addresses it takes from its prefix).
#[derive(Debug, Clone)]
pub struct PerAddress(Shares<IpAddr>);

impl PerAddress {
    pub fn new(max: usize) -> Self {
        PerAddress(Shares::new(max))
    }

    /// One more for `ip`, unless it holds its share already.
    pub fn enter(&self, ip: IpAddr) -> Option<Held<IpAddr>> {
        self.0.enter(&client_key(ip))
    }
}

/// Refuses a connection from an address that holds its share already (an accept that
/// fails closes the connection at once, before TLS or HTTP cost anything).
#[derive(Debug, Clone)]
pub struct ConnectionLimit {
    pub addresses: PerAddress,
}

/// A connection that gives its address's place back when it closes.
#[derive(Debug)]
pub struct Counted<T> {
    inner: T,
    _held: Held<IpAddr>,
}

impl<S: Send + 'static> axum_server::accept::Accept<TcpStream, S> for ConnectionLimit {
    type Stream = Counted<TcpStream>;
    type Service = S;
    type Future = std::future::Ready<io::Result<(Self::Stream, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let ip = match stream.peer_addr() {
            Ok(a) => a.ip(),
            Err(e) => return std::future::ready(Err(e)),
        };
        std::future::ready(match self.addresses.enter(ip) {
            Some(held) => Ok((
                Counted {
                    inner: stream,
                    _held: held,
                },
                service,
            )),
            None => {
                tracing::debug!(%ip, "connection refused: too many from this address");
                Err(io::Error::other(format!("too many connections from {ip}")))
            }
        })
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The host whose agent token [`budget`] checked, for the handler.
#[derive(Debug, Clone)]
pub struct AgentHost(pub tessera_model::HostId);

/// An agent's stream requests in flight at once: a wait, and an output and an input for
/// each of its host's streams.
pub const STREAM_REQUESTS_PER_HOST: usize =
    2 * tessera_control::streams::relay::MAX_STREAMS_PER_HOST + 2;

/// Whether a request is an agent's for its streams (`/agent/v1/streams/…`): those have a
/// share per host of their own, and never wait for a sync's slot.
fn is_stream_route(path: &str) -> bool {
    path.starts_with("/agent/v1/streams/")
}

/// Whether a request is a registered agent's (its sync): those have their own budget.
/// Registration carries only a join token, so it waits with everyone else. The agent API
/// is POST only: another method waits with everyone else too, and the router answers it
/// `405`.
fn is_agent_route(method: &axum::http::Method, path: &str) -> bool {
    method == axum::http::Method::POST
        && path.starts_with("/agent/")
        && path != "/agent/v1/register"
}

/// A JSON error answer with `Retry-After`.
fn refuse(status: StatusCode, message: String, retry_after: Option<&'static str>) -> Response {
    let mut r = (status, axum::Json(serde_json::json!({ "error": message }))).into_response();
    if let Some(secs) = retry_after {
        r.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static(secs),
        );
    }
    r
}

/// The budgets: agents' requests wait only for other agents'; everyone else's for each
/// other's, and a client address may hold only its share of those (429 past it).
///
/// An agent's sync is judged by its source first: an address whose agent tokens keep
/// being wrong is refused without a lookup; an address holds at most its share of syncs;
/// a host has one sync in flight (another is refused at once); and its body must arrive
/// whole within [`crate::Limits::agent_body_timeout`] before it takes one of the slots
/// every agent shares. One compromised host, however slow its syncs, holds its own turn
/// and nothing of anyone else's.
pub async fn budget(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if is_agent_route(req.method(), req.uri().path()) {
        return agent_budget(state, req, next).await;
    }
    others_budget(state, req, next).await
}

async fn agent_budget(state: AppState, mut req: Request, next: Next) -> Response {
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    if let Some(ip) = ip
        && state.wrong_tokens.blocked(ip)
    {
        return refuse(
            StatusCode::TOO_MANY_REQUESTS,
            format!("too many wrong agent tokens from {ip}; wait a minute"),
            Some("60"),
        );
    }
    let _address = match ip {
        Some(ip) => match state.agent_addresses.enter(ip) {
            Some(held) => Some(held),
            None => {
                return refuse(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("too many agent requests at once from {ip}"),
                    Some("1"),
                );
            }
        },
        None => None,
    };
    // Only an agent's own token takes an agent's slot: without one, slow requests
    // could hold them all.
    let token = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let known = match token {
        Some(t) => state.control.agents().authenticate_agent(t).await,
        None => Err(tessera_control::ControlError::Unauthorized(
            "no agent token".into(),
        )),
    };
    let host = match known {
        Ok(host) => host,
        // Refused only for a token that is not one: a database that cannot answer
        // now is a 503 (the agent keeps its credentials and tries again), never a 401
        // (which would have it drop them).
        Err(tessera_control::ControlError::Unauthorized(m)) => {
            if let Some(ip) = ip {
                state.wrong_tokens.record(ip);
            }
            return refuse(StatusCode::UNAUTHORIZED, m, None);
        }
        Err(tessera_control::ControlError::Busy { what, .. }) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("too many {what} at once; try again"),
                Some("1"),
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "checking an agent token failed");
            return crate::error::ApiError::Unavailable(
                "the server cannot check agent tokens now; try again".into(),
            )
            .into_response();
        }
    };
    let streams = is_stream_route(req.uri().path());
    let _turn = if streams {
        let Some(turn) = state.agent_streams.enter(&host) else {
            return refuse(
                StatusCode::TOO_MANY_REQUESTS,
                format!("host {host} has too many stream requests in flight"),
                Some("1"),
            );
        };
        turn
    } else {
        let Some(turn) = state.agent_hosts.enter(&host) else {
            return refuse(
                StatusCode::TOO_MANY_REQUESTS,
                format!("host {host} has a sync in flight already; one at a time"),
                Some("1"),
            );
        };
        turn
    };
    // The whole body, within the deadline, before a shared slot is taken.
    let (parts, body) = req.into_parts();
    let limit = crate::api::MAX_AGENT_BODY;
    let bytes = match tokio::time::timeout(
        state.limits.agent_body_timeout,
        axum::body::to_bytes(body, limit),
    )
    .await
    {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(_)) => {
            return refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than {limit} bytes, or was cut off"),
                None,
            );
        }
        Err(_) => {
            tracing::warn!(%host, "an agent's body did not arrive within the deadline");
            return refuse(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {} s",
                    state.limits.agent_body_timeout.as_secs()
                ),
                None,
            );
        }
    };
    req = Request::from_parts(parts, axum::body::Body::from(bytes));
    // The handler acts for this host: the token is checked once per sync.
    req.extensions_mut().insert(AgentHost(host));
    if streams {
        // Streams wait on clients and never hold a sync's slot.
        return next.run(req).await;
    }
    let Ok(_slot) = state.agent_slots.clone().acquire_owned().await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    next.run(req).await
}

async fn others_budget(state: AppState, req: Request, next: Next) -> Response {
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let _mine = match ip {
        Some(ip) => match state.request_addresses.enter(ip) {
            Some(held) => Some(held),
            None => {
                return refuse(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("too many requests at once from {ip}; wait for the ones in flight"),
                    Some("1"),
                );
            }
        },
        None => None,
    };
    let Ok(_slot) = state.request_slots.clone().acquire_owned().await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_with_too_many_wrong_tokens_is_refused_and_no_other() {
        let w = WrongTokens::default();
        let ip: IpAddr = "10.0.0.9".parse().expect("ip");
        for _ in 0..WrongTokens::MAX - 1 {
            w.record(ip);
        }
        assert!(!w.blocked(ip), "below the limit");
        w.record(ip);
        assert!(w.blocked(ip), "at the limit");
        assert!(!w.blocked("10.0.0.10".parse().expect("ip")));
        let one = Shares::<HostId>::default();
        let h = HostId::new("h1").expect("valid");
        let turn = one.enter(&h).expect("first");
        assert!(one.enter(&h).is_none(), "one sync in flight per host");
        drop(turn);
        assert!(one.enter(&h).is_some());
    }

    #[test]
    fn an_address_holds_at_most_its_share_and_gives_it_back() {
        let a = PerAddress::new(2);
        let ip: IpAddr = "10.0.0.1".parse().expect("ip");
        let other: IpAddr = "10.0.0.2".parse().expect("ip");
        let one = a.enter(ip).expect("first");
        let _two = a.enter(ip).expect("second");
        assert!(a.enter(ip).is_none(), "a third is refused");
        assert!(a.enter(other).is_some(), "another address is not");
        drop(one);
        assert!(a.enter(ip).is_some(), "given back when dropped");
        let v6 = |s: &str| s.parse::<IpAddr>().expect("ip");
        let b = PerAddress::new(1);
        let _one = b.enter(v6("2001:db8::1")).expect("first");
        assert!(
            b.enter(v6("2001:db8::ffff")).is_none(),
            "another address of the same /64 shares its share"
        );
        assert!(b.enter(v6("2001:db8:0:1::1")).is_some(), "another /64");
        let post = axum::http::Method::POST;
        assert!(is_agent_route(&post, "/agent/v1/sync"));
        assert!(!is_agent_route(&post, "/agent/v1/register"));
        assert!(!is_agent_route(&post, "/api/v1/agent/v1"));
        assert!(
            !is_agent_route(&axum::http::Method::GET, "/agent/v1/sync"),
            "the agent API is POST only: a GET gets the router's 405"
        );
    }
}
