//! The client's address behind a load balancer (`--trusted-proxies CIDR,…`).
//!
//! Behind a balancer every request comes from the balancer's address: the per-address
//! budgets, the sign-in limit and the audit log would count one address for everyone. A
//! request from a trusted proxy has its client address taken from `Forwarded` (RFC 7239)
//! or, without it, `X-Forwarded-For`: the nearest address in the chain that is not itself
//! a trusted proxy (a client can write whatever it likes at the chain's start, never what
//! the proxies append after it). A request from any other peer keeps its peer address:
//! its headers are not believed. [`layer`] puts the address found where every part of the
//! server reads the client's address (`ConnectInfo`), once, before anything else runs.

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

/// A network in CIDR notation (`10.0.0.0/8`, `fd00::/8`; a bare address is one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address or a network (10.0.0.0/8, fd00::/8)"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Cidr { network, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4 client seen through an IPv6 socket (::ffff:a.b.c.d) is that IPv4 address.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.network, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// The proxies whose forwarding headers are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Arc<[Cidr]>);

impl TrustedProxies {
    pub fn new(networks: Vec<Cidr>) -> Self {
        TrustedProxies(networks.into())
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(ip))
    }

    /// The client's address for a request from `peer` with these headers.
    pub fn client(&self, peer: IpAddr, headers: &axum::http::HeaderMap) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let chain = forwarded_chain(headers);
        // From the nearest hop outwards: the first that is not a trusted proxy; when every
        // hop is one, the farthest.
        chain
            .iter()
            .rev()
            .find(|ip| !self.trusts(**ip))
            .or(chain.first())
            .copied()
            .unwrap_or(peer)
    }
}

/// The addresses a request passed through, farthest first: `Forwarded`'s `for=` when the
/// request has that header, else `X-Forwarded-For`. A hop that is not an address (`for=
/// unknown`, an obfuscated name) ends the chain there: what lies before it cannot be
/// placed.
fn forwarded_chain(headers: &axum::http::HeaderMap) -> Vec<IpAddr> {
    let forwarded: Vec<&str> = headers
        .get_all("forwarded")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let hops: Vec<String> = if !forwarded.is_empty() {
        forwarded
            .iter()
            .flat_map(|v| v.split(','))
            .filter_map(|element| {
                element.split(';').find_map(|pair| {
                    let (k, v) = pair.trim().split_once('=')?;
                    k.trim()
                        .eq_ignore_ascii_case("for")
                        .then(|| v.trim().trim_matches('"').to_owned())
                })
            })
            .collect()
    } else {
        headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|h| h.trim().to_owned())
            .collect()
    };
    let mut chain = Vec::new();
    for hop in hops.iter().rev() {
        match hop_address(hop) {
            Some(ip) => chain.push(ip),
            None => break,
        }
    }
    chain.reverse();
    chain
}

/// `192.0.2.1`, `192.0.2.1:4711`, `[2001:db8::1]`, `[2001:db8::1]:4711`, `2001:db8::1`.
fn hop_address(hop: &str) -> Option<IpAddr> {
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    hop.strip_prefix('[')
        .and_then(|h| h.split_once(']'))
        .and_then(|(ip, _)| ip.parse().ok())
}

/// Puts the client's address (see the module) where the server reads it.
pub async fn layer(
    State(trusted): State<TrustedProxies>,
    mut req: Request,
    next: Next,
) -> Response {
    if let Some(ConnectInfo(peer)) = req.extensions().get::<ConnectInfo<SocketAddr>>().copied() {
        let client = trusted.client(peer.ip(), req.headers());
        if client != peer.ip() {
            req.extensions_mut()
                .insert(ConnectInfo(SocketAddr::new(client, peer.port())));
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn networks_parse_and_hold_their_addresses_only() {
        let n: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(n.contains(ip("10.1.200.3")) && !n.contains(ip("10.2.0.1")));
        assert!(n.contains(ip("::ffff:10.1.0.9")), "IPv4 seen through IPv6");
        let one: Cidr = "192.0.2.7".parse().unwrap();
        assert!(one.contains(ip("192.0.2.7")) && !one.contains(ip("192.0.2.8")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("203.0.113.9")));
        for bad in ["10.0.0.0/33", "proxy", "10.0.0.0/x", "fd00::/129"] {
            let e = bad.parse::<Cidr>().unwrap_err();
            assert!(e.contains(bad.split('/').next().unwrap()), "{e}");
        }
    }

    #[test]
    fn only_a_trusted_proxys_headers_are_believed_and_only_what_it_appended() {
        let trusted = TrustedProxies::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let xff = headers(&[("x-forwarded-for", "198.51.100.1, 203.0.113.5")]);
        // From the balancer: the nearest untrusted hop.
        assert_eq!(trusted.client(ip("10.0.0.2"), &xff), ip("203.0.113.5"));
        // From anyone else: the peer, whatever the headers say.
        assert_eq!(trusted.client(ip("203.0.113.9"), &xff), ip("203.0.113.9"));
        // A client that writes its own header before the balancer's append cannot pick
        // the address: the balancer's appended hop is the one taken.
        let spoofed = headers(&[("x-forwarded-for", "1.2.3.4, 203.0.113.5, 10.0.0.3")]);
        assert_eq!(trusted.client(ip("10.0.0.2"), &spoofed), ip("203.0.113.5"));
        // Forwarded first, with ports and IPv6 in brackets.
        let fwd = headers(&[
            (
                "forwarded",
                "for=192.0.2.60;proto=https, for=\"[2001:db8::17]:4711\"",
            ),
            ("x-forwarded-for", "198.51.100.1"),
        ]);
        assert_eq!(trusted.client(ip("10.0.0.2"), &fwd), ip("2001:db8::17"));
        // An unplaceable hop ends the chain; no header: the peer.
        let unknown = headers(&[("forwarded", "for=192.0.2.60, for=unknown")]);
        assert_eq!(trusted.client(ip("10.0.0.2"), &unknown), ip("10.0.0.2"));
        assert_eq!(
            trusted.client(ip("10.0.0.2"), &HeaderMap::new()),
            ip("10.0.0.2")
        );
        // Nobody trusted (the default): never believed.
        assert_eq!(
            TrustedProxies::default().client(ip("10.0.0.2"), &xff),
            ip("10.0.0.2")
        );
    }
}
