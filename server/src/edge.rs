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
//!   ends within [`Limits::request_timeout`].

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
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How many of something each client address holds at once.
#[derive(Debug, Clone)]
pub struct PerAddress {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max: usize,
}

/// One held; given back when dropped.
#[derive(Debug)]
pub struct Held {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.held.lock();
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

impl PerAddress {
    pub fn new(max: usize) -> Self {
        PerAddress {
            held: Arc::default(),
            max,
        }
    }

    /// One more for `ip`, unless it holds `max` already. IPv6 addresses count by their
    /// /64 (one client's share, however many addresses it takes from its prefix).
    pub fn enter(&self, ip: IpAddr) -> Option<Held> {
        let ip = match ip {
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => {
                    let s = v6.segments();
                    IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
                }
            },
            v4 => v4,
        };
        let mut held = self.held.lock();
        let n = held.entry(ip).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Held {
            held: self.held.clone(),
            ip,
        })
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
    _held: Held,
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

/// Whether a request is a registered agent's (its sync): those have their own budget.
/// Registration carries only a join token, so it waits with everyone else. The agent API
/// is POST only: another method waits with everyone else too, and the router answers it
/// `405`.
fn is_agent_route(method: &axum::http::Method, path: &str) -> bool {
    method == axum::http::Method::POST
        && path.starts_with("/agent/")
        && path != "/agent/v1/register"
}

/// The budgets: agents' requests wait only for other agents'; everyone else's for each
/// other's, and a client address may hold only its share of those (429 past it).
pub async fn budget(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if is_agent_route(req.method(), req.uri().path()) {
        // Only an agent's own token takes an agent's slot: without one, slow requests
        // could hold them all.
        let token = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let known = match token {
            Some(t) => state.control.authenticate_agent(t).await,
            None => Err(tessera_control::ControlError::Unauthorized(
                "no agent token".into(),
            )),
        };
        match known {
            // The handler acts for this host: the token is checked once per sync.
            Ok(host) => {
                req.extensions_mut().insert(AgentHost(host));
            }
            // Refused only for a token that is not one: a database that cannot answer
            // now is a 503 (the agent keeps its credentials and tries again), never a 401
            // (which would have it drop them).
            Err(tessera_control::ControlError::Unauthorized(m)) => {
                return (
                    StatusCode::UNAUTHORIZED,
                    axum::Json(serde_json::json!({ "error": m })),
                )
                    .into_response();
            }
            Err(e) => {
                tracing::warn!(error = %e, "checking an agent token failed");
                return crate::error::ApiError::Unavailable(
                    "the server cannot check agent tokens now; try again".into(),
                )
                .into_response();
            }
        }
        let Ok(_slot) = state.agent_slots.clone().acquire_owned().await else {
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        };
        return next.run(req).await;
    }
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let _mine = match ip {
        Some(ip) => match state.request_addresses.enter(ip) {
            Some(held) => Some(held),
            None => {
                let mut r = (
                    StatusCode::TOO_MANY_REQUESTS,
                    axum::Json(serde_json::json!({
                        "error": format!("too many requests at once from {ip}; wait for the ones in flight")
                    })),
                )
                    .into_response();
                r.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from_static("1"),
                );
                return r;
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
