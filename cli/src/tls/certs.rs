//! The certificates `tessera tls` makes: the CA, the server's (checked the way agents
//! check it before it is written) and the CA's certificate alone for agents.

use super::{AGENT_CA, CA_CERT, CA_KEY, MAX_DAYS, SERVER_CERT, SERVER_KEY};
use crate::tls::files::{create_dir, out_path, refuse_existing, write_new, write_pair};
use anyhow::{Context, anyhow, bail, ensure};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, DnsName, ServerName, UnixTime};
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use time::OffsetDateTime;

/// What a `create` wrote.
#[derive(Debug, Clone)]
pub struct Written {
    /// The certificate (for a server: the chain, its certificate then the CA's).
    pub cert: PathBuf,
    /// Its private key (mode 0600).
    pub key: PathBuf,
    /// The names the certificate is for (empty for a CA).
    pub names: Vec<Name>,
    /// The day (UTC) the certificate expires.
    pub expires: time::Date,
}

/// A name a server certificate is for: a subject alternative name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Name {
    /// A host name, lower case.
    Dns(String),
    /// An IP address.
    Ip(IpAddr),
}

impl Name {
    /// A `--server` value: an IP address (also `[v6]`, as in URLs) or a host name.
    pub fn parse(raw: &str) -> anyhow::Result<Name> {
        let s = raw.trim();
        let unbracketed = s
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .unwrap_or(s);
        if let Ok(ip) = unbracketed.parse::<IpAddr>() {
            return Ok(Name::Ip(ip));
        }
        let dns = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        if DnsName::try_from(dns.as_str()).is_err() {
            bail!(
                "--server {raw:?} is neither a host name (such as tessera.example; no scheme, port or wildcard) nor an IP address"
            );
        }
        Ok(Name::Dns(dns))
    }

    fn san(&self) -> anyhow::Result<SanType> {
        Ok(match self {
            Name::Dns(name) => SanType::DnsName(
                rcgen::string::Ia5String::try_from(name.as_str())
                    .with_context(|| format!("the host name {name:?}"))?,
            ),
            Name::Ip(ip) => SanType::IpAddress(*ip),
        })
    }

    /// How the name is written in a URL's host.
    pub(super) fn url_host(&self) -> String {
        match self {
            Name::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Name::Dns(name) => f.write_str(name),
            Name::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Makes a CA in `dir`: [`CA_CERT`] and [`CA_KEY`] (mode 0600). A CA certificate
/// (path length 0: it signs end-entity certificates only; key usages keyCertSign and
/// cRLSign) named `name`, valid from an hour ago (for clocks a little behind) for `days`.
pub fn create_ca(dir: &Path, name: &str, days: u32) -> anyhow::Result<Written> {
    let name = name.trim();
    ensure!(!name.is_empty(), "the CA needs a name (--name)");
    let (cert_path, key_path) = (out_path(dir, CA_CERT), out_path(dir, CA_KEY));
    refuse_existing(&[cert_path.as_path(), key_path.as_path()])?;
    let (not_before, not_after) = validity(days)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = not_before;
    params.not_after = not_after;
    let key = KeyPair::generate().context("generating the CA's key")?;
    let cert = params
        .self_signed(&key)
        .context("signing the CA certificate")?;
    create_dir(dir)?;
    write_pair(&cert_path, &cert.pem(), &key_path, &key.serialize_pem())?;
    Ok(Written {
        cert: cert_path,
        key: key_path,
        names: Vec::new(),
        expires: not_after.date(),
    })
}

/// Makes a server certificate in `dir`, signed by the CA in `ca_cert` and `ca_key`:
/// [`SERVER_CERT`] (the certificate, then the CA's) and [`SERVER_KEY`] (mode 0600).
///
/// Its subject alternative names are `names` (host names, or IP addresses) and `ips`, in
/// that order and without repeats; its common name is the first. It is not a CA, has key
/// usage digitalSignature and extended key usage serverAuth, and is valid from an hour ago
/// for `days`. Before anything is written it is verified as rustls verifies it on the
/// agents, trusting only the CA, for each of its names.
pub fn create_server_cert(
    dir: &Path,
    ca_cert: &Path,
    ca_key: &Path,
    names: &[String],
    ips: &[IpAddr],
    days: u32,
) -> anyhow::Result<Written> {
    let mut sans: Vec<Name> = Vec::new();
    for name in names
        .iter()
        .map(|n| Name::parse(n))
        .chain(ips.iter().map(|ip| Ok(Name::Ip(*ip))))
    {
        let name = name?;
        if !sans.contains(&name) {
            sans.push(name);
        }
    }
    let Some(first) = sans.first() else {
        bail!("a server certificate needs at least one name (--server NAME)");
    };
    let (cert_path, key_path) = (out_path(dir, SERVER_CERT), out_path(dir, SERVER_KEY));
    refuse_existing(&[cert_path.as_path(), key_path.as_path()])?;
    let ca = Ca::load(ca_cert, ca_key)?;
    let (not_before, not_after) = validity(days)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(&first.to_string());
    params.subject_alt_names = sans.iter().map(Name::san).collect::<anyhow::Result<_>>()?;
    params.is_ca = IsCa::ExplicitNoCa;
    // ECDSA keys only sign (RFC 5480: no keyEncipherment).
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    let key = KeyPair::generate().context("generating the server's key")?;
    let cert = params
        .signed_by(&key, &ca.issuer)
        .context("signing the server certificate")?;
    check_accepted(&ca, cert.der(), &sans)?;
    let mut chain = cert.pem();
    if !chain.ends_with('\n') {
        chain.push('\n');
    }
    chain.push_str(&ca.pem);
    chain.push('\n');
    create_dir(dir)?;
    write_pair(&cert_path, &chain, &key_path, &key.serialize_pem())?;
    Ok(Written {
        cert: cert_path,
        key: key_path,
        names: sans,
        expires: not_after.date(),
    })
}

/// Writes [`AGENT_CA`] in `dir`: the CA certificate of `ca_cert` alone (its first
/// certificate, as it is there; never a key), for agents' `--ca-cert`. Checked to be a
/// certificate rustls takes as a trust anchor first.
pub fn create_agent_ca(dir: &Path, ca_cert: &Path) -> anyhow::Result<PathBuf> {
    let path = out_path(dir, AGENT_CA);
    refuse_existing(&[path.as_path()])?;
    let (der, pem) = read_ca_cert(ca_cert)?;
    trust_only(ca_cert, der)?;
    create_dir(dir)?;
    write_new(&path, &format!("{pem}\n"), 0o644)?;
    Ok(path)
}

/// A CA loaded to sign with.
struct Ca {
    /// Where its certificate came from, for messages.
    path: PathBuf,
    der: CertificateDer<'static>,
    /// Its certificate's PEM block, as it is in the file.
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn load(cert_path: &Path, key_path: &Path) -> anyhow::Result<Ca> {
        let (der, pem) = read_ca_cert(cert_path)?;
        let key_pem = std::fs::read_to_string(key_path)
            .with_context(|| format!("reading the CA key {}", key_path.display()))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| {
            anyhow!(
                "{}: not a key this can sign with ({e}); it must be an unencrypted PKCS#8 key (-----BEGIN PRIVATE KEY-----; `openssl pkcs8 -topk8 -nocrypt` converts others)",
                key_path.display()
            )
        })?;
        // The certificate holds its public key's SubjectPublicKeyInfo as it is encoded.
        let spki = key.subject_public_key_info();
        ensure!(
            der.windows(spki.len()).any(|w| w == spki.as_slice()),
            "{} is not the key of the CA certificate {} (pass the CA's own key with --ca-key)",
            key_path.display(),
            cert_path.display()
        );
        let issuer = Issuer::from_ca_cert_der(&der, key)
            .with_context(|| format!("reading the CA certificate {}", cert_path.display()))?;
        // No key usage extension at all allows every use; one without keyCertSign does not.
        ensure!(
            issuer.key_usages().is_empty()
                || issuer.key_usages().contains(&KeyUsagePurpose::KeyCertSign),
            "{} is not a CA certificate: its key usage does not allow signing certificates",
            cert_path.display()
        );
        Ok(Ca {
            path: cert_path.to_owned(),
            der,
            pem,
            issuer,
        })
    }
}

/// The first certificate in the PEM file at `path`: its DER and its PEM block.
fn read_ca_cert(path: &Path) -> anyhow::Result<(CertificateDer<'static>, String)> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the CA certificate {}", path.display()))?;
    let block = text.find(BEGIN).and_then(|start| {
        let end = start + text[start..].find(END)? + END.len();
        Some(&text[start..end])
    });
    let Some(block) = block else {
        bail!(
            "{} holds no PEM certificate ({BEGIN}); make a CA with `tessera tls ca create`",
            path.display()
        );
    };
    let der = CertificateDer::from_pem_slice(block.as_bytes())
        .with_context(|| format!("{}: a certificate that is not valid PEM", path.display()))?;
    Ok((der, block.to_owned()))
}

/// A root store trusting the certificate at `path` (`der`) alone.
fn trust_only(path: &Path, der: CertificateDer<'static>) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).with_context(|| {
        format!(
            "{}: not a certificate TLS clients can trust",
            path.display()
        )
    })?;
    Ok(roots)
}

/// Verifies `leaf` as the agents do (rustls, webpki), trusting only `ca`, for each name:
/// a certificate that would be refused is never written.
fn check_accepted(ca: &Ca, leaf: &CertificateDer<'_>, names: &[Name]) -> anyhow::Result<()> {
    let roots = trust_only(&ca.path, ca.der.clone())?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .context("setting up the certificate check")?;
    for name in names {
        let server_name = match name {
            Name::Ip(ip) => ServerName::from(*ip),
            Name::Dns(dns) => ServerName::try_from(dns.as_str())
                .map_err(|e| anyhow!("the host name {dns:?}: {e}"))?,
        };
        verifier
            .verify_server_cert(leaf, &[], &server_name, &[], UnixTime::now())
            .with_context(|| {
                format!(
                    "the new certificate does not verify for {name} against the CA {} (expired CA?)",
                    ca.path.display()
                )
            })?;
    }
    Ok(())
}

/// From an hour ago (clocks a little behind) to `days` from now.
fn validity(days: u32) -> anyhow::Result<(OffsetDateTime, OffsetDateTime)> {
    ensure!(
        (1..=MAX_DAYS).contains(&days),
        "--days must be from 1 to {MAX_DAYS}, not {days}"
    );
    let now = OffsetDateTime::now_utc();
    Ok((
        now - time::Duration::hours(1),
        now + time::Duration::days(i64::from(days)),
    ))
}

fn common_name(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}
