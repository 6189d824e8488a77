//! The HTTP client of the server's REST API: the server's URL (plain http:// only to this
//! machine unless asked), HTTPS with an extra CA, the API token, and refusals as [`Exit`].

use crate::login_store::load_login;
use crate::{Connection, Exit};
use anyhow::{Context, bail};
use std::path::Path;
use std::time::Duration;
use tessera_model::bodies::ErrorBody;

/// An API client with a token.
#[derive(Clone)]
pub struct Client {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
    pub(crate) token: String,
}

pub(crate) fn http_client(ca_cert: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .user_agent(concat!("tessera-cli/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = ca_cert {
        let pem =
            std::fs::read(path).with_context(|| format!("reading --ca-cert {}", path.display()))?;
        let cert = reqwest::Certificate::from_pem(&pem)
            .with_context(|| format!("--ca-cert {}: not a PEM certificate", path.display()))?;
        b = b.add_root_certificate(cert);
    }
    b.build().context("setting up HTTPS")
}

/// The server's URL without a trailing `/`. Plain `http://` only to this machine (or with
/// `insecure`): anything on the network between would read the password or token.
pub(crate) fn base_url(url: &str, insecure: bool) -> anyhow::Result<String> {
    let parsed = reqwest::Url::parse(url).with_context(|| {
        format!("{url:?} is not a URL: give one like https://tessera.example:3000")
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        bail!("{url:?}: only http:// and https:// servers");
    }
    let loopback = match parsed.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    };
    if parsed.scheme() == "http" && !loopback && !insecure {
        bail!(
            "{url:?}: credentials would cross the network in clear; use https:// (the server's --tls-cert), or pass --insecure-http if this network is yours alone"
        );
    }
    Ok(url.trim_end_matches('/').to_owned())
}

impl Client {
    /// From flags or the environment, else the stored login.
    pub fn new(conn: &Connection) -> anyhow::Result<Client> {
        let stored = load_login()?;
        let url = conn
            .url
            .clone()
            .or_else(|| stored.as_ref().map(|l| l.url.clone()))
            .context("no server: run `tessera login URL` first, or pass --url (TESSERA_URL)")?;
        let token = conn
            .token
            .as_ref()
            .map(|t| t.0.clone())
            .or_else(|| stored.as_ref().map(|l| l.token.clone()))
            .context("no token: run `tessera login URL` first, or pass --token (TESSERA_TOKEN)")?;
        let insecure = conn.insecure_http
            || stored
                .as_ref()
                .is_some_and(|l| l.insecure_http && l.url == url.trim_end_matches('/'));
        let ca = conn
            .ca_cert
            .clone()
            .or_else(|| stored.and_then(|l| l.ca_cert));
        Ok(Client {
            http: http_client(ca.as_deref())?,
            base: base_url(&url, insecure)?,
            token,
        })
    }

    /// A request; any answer but a success becomes an error that says what to do.
    pub async fn send<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<T> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = resp.status();
        let bytes = resp.bytes().await.context("reading the answer")?;
        if status.is_success() {
            let bytes = if bytes.is_empty() {
                &b"null"[..]
            } else {
                &bytes[..]
            };
            return serde_json::from_slice(bytes)
                .with_context(|| format!("{method} {path}: an answer this tessera cannot read"));
        }
        Err(api_error(status, &bytes).into())
    }

    pub async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.send(reqwest::Method::GET, path, None).await
    }

    /// A GET whose answer is read as it arrives (the live event stream), with the answer's
    /// status checked. The client's 60 s limit would cut a stream, so this one has an hour
    /// (the caller reconnects; it also gives up on a stream that goes quiet).
    pub(crate) async fn stream(&self, path: &str) -> anyhow::Result<reqwest::Response> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .timeout(Duration::from_secs(3600))
            .send()
            .await
            .with_context(|| format!("cannot reach {}", self.base))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let bytes = resp.bytes().await.unwrap_or_default();
        Err(api_error(status, &bytes).into())
    }
}

/// The server's refusal, with every field error and what to do.
pub(crate) fn api_error(status: reqwest::StatusCode, bytes: &[u8]) -> Exit {
    let body: Option<ErrorBody> = serde_json::from_slice(bytes).ok();
    let mut message = match &body {
        Some(b) => b.error.clone(),
        None => String::from_utf8_lossy(bytes).trim().to_owned(),
    };
    if let Some(errors) = body.as_ref().and_then(|b| b.errors.as_ref()) {
        for e in errors {
            message.push_str(&format!("\n  {}: {}", e.field, e.message));
        }
    }
    let hint = match status.as_u16() {
        401 => "\nthe token is missing, expired or deleted: run `tessera login URL`",
        403 => "\nyour token's role does not allow this: ask an admin",
        _ => "",
    };
    Exit {
        code: 1,
        message: format!("refused ({status}): {message}{hint}"),
        status: Some(status.as_u16()),
    }
}

#[cfg(test)]
mod tests {
    use super::base_url;

    #[test]
    fn credentials_cross_a_network_in_clear_only_when_asked_to() {
        for local in [
            "http://127.0.0.1:3000/",
            "http://localhost:3000",
            "http://[::1]:3000",
            "https://tessera.example",
        ] {
            assert!(base_url(local, false).is_ok(), "{local}");
        }
        let err = base_url("http://tessera.example:3000", false).expect_err("refused");
        assert!(err.to_string().contains("--insecure-http"), "{err}");
        assert!(base_url("http://10.0.0.5:3000", false).is_err());
        assert_eq!(
            base_url("http://10.0.0.5:3000/", true).expect("asked for"),
            "http://10.0.0.5:3000"
        );
    }
}
