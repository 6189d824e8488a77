//! The servers `--server` names and the HTTPS client for them; what a failed request
//! says, and which answers mean that another server should be tried.

use super::{AgentConfig, AgentError};
use std::time::Duration;

/// The servers `--server` names (one URL, or several separated by commas), each checked:
/// a plain `http://` server is refused unless it is on loopback or `--insecure-http` says
/// so.
pub(crate) fn server_urls(config: &AgentConfig) -> Result<Vec<reqwest::Url>, AgentError> {
    let mut urls = Vec::new();
    for raw in config
        .server
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let err = |why: String| AgentError::Server {
            server: raw.to_owned(),
            why,
        };
        let url = reqwest::Url::parse(raw).map_err(|e| err(format!("not a URL: {e}")))?;
        match url.scheme() {
            "https" => {}
            "http" => {
                let loopback = match url.host() {
                    Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                    Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                    Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                    None => false,
                };
                if !loopback && !config.insecure_http {
                    return Err(err(
                        "plain http:// would send tokens, commands and secrets in clear; use https:// (with --ca-cert for a private CA), or pass --insecure-http".into(),
                    ));
                }
            }
            other => return Err(err(format!("scheme {other:?}: use https:// or http://"))),
        }
        urls.push(url);
    }
    if urls.is_empty() {
        return Err(AgentError::Server {
            server: config.server.clone(),
            why: "names no server".into(),
        });
    }
    Ok(urls)
}

/// The HTTPS client for the servers: rustls, the system's roots plus `--ca-cert`.
pub(crate) fn http_client(
    config: &AgentConfig,
    urls: &[reqwest::Url],
) -> Result<reqwest::Client, AgentError> {
    let err = |why: String| AgentError::Server {
        server: config.server.clone(),
        why,
    };
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .https_only(urls.iter().all(|u| u.scheme() == "https"))
        .timeout(Duration::from_secs(10));
    if let Some(path) = &config.ca_cert {
        let pem = std::fs::read(path)
            .map_err(|e| err(format!("cannot read --ca-cert {}: {e}", path.display())))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(err(format!(
                "--ca-cert {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            )));
        }
        let cert = reqwest::Certificate::from_pem(&pem).map_err(|e| {
            err(format!(
                "--ca-cert {} is not a PEM certificate: {e}",
                path.display()
            ))
        })?;
        builder = builder.add_root_certificate(cert);
    }
    builder.build().map_err(|e| {
        err(format!(
            "cannot set up the HTTPS client (check --ca-cert): {e}"
        ))
    })
}

/// An error with its causes (a TLS failure says why: unknown issuer, wrong name, ...).
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Whether an answer says this server cannot serve now (another may): it is overloaded,
/// shutting down, or cut off from the database.
pub(super) fn server_unavailable(status: reqwest::StatusCode) -> bool {
    status.is_server_error()
        || status == reqwest::StatusCode::REQUEST_TIMEOUT
        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
}
