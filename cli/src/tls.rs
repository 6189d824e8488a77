//! `tessera tls`: a private certificate authority and the certificates Tessera's HTTPS
//! needs, made in-process (rcgen) the way Nomad's and Consul's `tls` commands make them,
//! so that no `openssl` recipe is needed.
//!
//! - `tessera tls ca create` makes the CA: `tessera-ca.pem`, its certificate, which
//!   everyone who connects trusts (`tessera-agent --ca-cert`, `tessera login --ca-cert`),
//!   and `tessera-ca-key.pem`, its key (mode 0600), which only signs certificates: keep it
//!   off the servers.
//! - `tessera tls cert create --server NAME…` makes the server's certificate, signed by
//!   the CA, for those host names and addresses: `tessera-server.pem` (the certificate,
//!   then the CA's: the chain `tessera serve --tls-cert` takes) and
//!   `tessera-server-key.pem` (mode 0600, for `--tls-key`). It is an end-entity
//!   certificate (`CA:FALSE`, extended key usage serverAuth): rustls refuses a server
//!   certificate that is itself a CA. Before anything is written it is checked the way the
//!   agents check it (rustls, trusting only the CA) for each of its names.
//! - `tessera tls cert create --agent` writes `tessera-agent-ca.pem`, the CA's certificate
//!   alone, to copy to agent hosts for `--ca-cert`. Agents have no client certificates:
//!   they prove who they are with the join token and then the credentials the server gives
//!   them, and only check the server's certificate against the CA.
//!
//! Keys are ECDSA P-256, PKCS#8 PEM. Nothing is ever overwritten: a file already there is
//! named and the command stops before writing anything.

use anyhow::{Context, anyhow, bail, ensure};
use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, DnsName, ServerName, UnixTime};
use std::fmt;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use time::OffsetDateTime;

/// The CA's certificate.
pub const CA_CERT: &str = "tessera-ca.pem";
/// The CA's key.
pub const CA_KEY: &str = "tessera-ca-key.pem";
/// The server's certificate chain (its certificate, then the CA's).
pub const SERVER_CERT: &str = "tessera-server.pem";
/// The server's key.
pub const SERVER_KEY: &str = "tessera-server-key.pem";
/// The CA's certificate alone, for agents' `--ca-cert`.
pub const AGENT_CA: &str = "tessera-agent-ca.pem";

/// How long a CA is valid unless `--days` says otherwise (5 years).
pub const CA_DAYS: u32 = 1825;
/// How long a server certificate is valid unless `--days` says otherwise (what Apple's
/// platforms accept at most for a TLS server certificate).
pub const CERT_DAYS: u32 = 825;
/// The longest `--days` taken (100 years).
pub const MAX_DAYS: u32 = 36_500;

// `tessera tls …`.
#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// The private certificate authority that signs the server's certificate.
    Ca {
        #[command(subcommand)]
        command: CaCommand,
    },
    /// Certificates signed by the CA.
    Cert {
        #[command(subcommand)]
        command: CertCommand,
    },
}

// `tessera tls ca …`.
#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Make a CA: tessera-ca.pem (its certificate, for agents and clients to trust) and
    /// tessera-ca-key.pem (its key, mode 0600; it signs certificates: keep it off the
    /// servers).
    Create(CaCreate),
}

// `tessera tls ca create` (no doc comment: the variant's is the command's help).
#[derive(Debug, Args)]
pub struct CaCreate {
    /// Write the files in this directory (created if missing).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,
    /// The CA's name (its certificate's common name).
    #[arg(long, default_value = "Tessera CA")]
    pub name: String,
    /// Days the CA is valid.
    #[arg(long, default_value_t = CA_DAYS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_DAYS)))]
    pub days: u32,
}

// `tessera tls cert …`.
#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Make the server's certificate, signed by the CA (--server), or the CA file agents
    /// trust (--agent).
    ///
    /// --server writes tessera-server.pem (the certificate, then the CA's: pass it to
    /// `tessera serve --tls-cert`) and tessera-server-key.pem (mode 0600, for --tls-key).
    /// --agent writes tessera-agent-ca.pem, the CA's certificate alone, for
    /// `tessera-agent --ca-cert`.
    Create(CertCreate),
}

// `tessera tls cert create` (no doc comment: the variant's is the command's help).
#[derive(Debug, Args)]
pub struct CertCreate {
    /// A server certificate for these names: the host names (or IP addresses) that agents,
    /// browsers and the CLI put in the server's URL.
    #[arg(
        long,
        value_name = "NAME",
        num_args = 1..,
        required_unless_present = "agent",
        conflicts_with = "agent"
    )]
    pub server: Vec<String>,
    /// IP addresses the server certificate is also for.
    #[arg(long, value_name = "ADDR", num_args = 1.., requires = "server")]
    pub ip: Vec<IpAddr>,
    /// Write tessera-agent-ca.pem, the CA's certificate alone (no key), to copy to agent
    /// hosts for `tessera-agent --ca-cert`. Agents need no certificate of their own: the
    /// join token, then the credentials the server gives them, say who they are; they only
    /// check the server's certificate against the CA.
    #[arg(long)]
    pub agent: bool,
    /// Write the files in this directory (created if missing).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub dir: PathBuf,
    /// The CA's certificate [default: DIR/tessera-ca.pem].
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// The CA's key [default: DIR/tessera-ca-key.pem]; not needed with --agent.
    #[arg(long, value_name = "FILE", conflicts_with = "agent")]
    pub ca_key: Option<PathBuf>,
    /// Days the server certificate is valid.
    #[arg(long, default_value_t = CERT_DAYS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_DAYS)))]
    pub days: u32,
}

/// Runs `tessera tls …` and prints what it wrote and how to use it.
pub fn run(command: TlsCommand) -> anyhow::Result<()> {
    match command {
        TlsCommand::Ca {
            command: CaCommand::Create(args),
        } => {
            let ca = create_ca(&args.dir, &args.name, args.days)?;
            println!(
                "Wrote the CA certificate {} (valid until {}) and its key {} (mode 0600).",
                ca.cert.display(),
                ca.expires,
                ca.key.display()
            );
            println!(
                "The key signs certificates: keep it safe and off the servers. Agents and clients trust the certificate."
            );
            let dir = if args.dir == Path::new(".") {
                String::new()
            } else {
                format!(" --dir {}", args.dir.display())
            };
            println!(
                "Next, the server's certificate, for the names agents and browsers reach it by:"
            );
            println!("  tessera tls cert create --server tessera.example [--ip ADDR]{dir}");
        }
        TlsCommand::Cert {
            command: CertCommand::Create(args),
        } => {
            let ca_cert = args.ca.unwrap_or_else(|| out_path(&args.dir, CA_CERT));
            if args.agent {
                let path = create_agent_ca(&args.dir, &ca_cert)?;
                println!(
                    "Wrote {}: the CA certificate of {} alone (no key), for agents.",
                    path.display(),
                    ca_cert.display()
                );
                println!("Copy it to each agent host and start the agent with:");
                println!(
                    "  tessera-agent --server https://tessera.example:3443 --ca-cert {} --join-token-file FILE --pool …",
                    path.display()
                );
                println!(
                    "(or TESSERA_AGENT_CA_CERT). Agents need no certificate of their own: the join token, then the credentials the server gives them, say who they are."
                );
            } else {
                let ca_key = args.ca_key.unwrap_or_else(|| out_path(&args.dir, CA_KEY));
                let made = create_server_cert(
                    &args.dir,
                    &ca_cert,
                    &ca_key,
                    &args.server,
                    &args.ip,
                    args.days,
                )?;
                let names: Vec<String> = made.names.iter().map(|n| n.to_string()).collect();
                println!(
                    "Wrote {} (the certificate for {}, then the CA's; valid until {}) and its key {} (mode 0600).",
                    made.cert.display(),
                    names.join(", "),
                    made.expires,
                    made.key.display()
                );
                println!("Serve HTTPS with them (--allowed-hosts: the names clients use):");
                println!(
                    "  tessera serve --tls-cert {} --tls-key {} --bind 0.0.0.0:3443 --allowed-hosts {}",
                    made.cert.display(),
                    made.key.display(),
                    names.join(",")
                );
                let host = made.names[0].url_host();
                println!("Agents and the CLI trust the CA's certificate (never copy its key):");
                println!(
                    "  tessera-agent --server https://{host}:3443 --ca-cert {} --join-token-file FILE --pool …",
                    ca_cert.display()
                );
                println!(
                    "  tessera login https://{host}:3443 --ca-cert {}",
                    ca_cert.display()
                );
                println!(
                    "(`tessera tls cert create --agent` writes a copy of the CA certificate alone, to hand out.)"
                );
            }
        }
    }
    Ok(())
}

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
    fn url_host(&self) -> String {
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

/// `dir/name`, or just `name` in the current directory (for shorter messages).
fn out_path(dir: &Path, name: &str) -> PathBuf {
    if dir == Path::new(".") || dir.as_os_str().is_empty() {
        PathBuf::from(name)
    } else {
        dir.join(name)
    }
}

fn create_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.as_os_str().is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// Stops before anything is made if one of `paths` is there already.
fn refuse_existing(paths: &[&Path]) -> anyhow::Result<()> {
    for path in paths {
        match std::fs::symlink_metadata(path) {
            Ok(_) => bail!(
                "{} already exists; not overwriting it (move it away, or pass another --dir)",
                path.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
        }
    }
    Ok(())
}

/// Writes the key (mode 0600), then the certificate (0644); a failure on the certificate
/// removes the key just written.
fn write_pair(cert_path: &Path, cert: &str, key_path: &Path, key: &str) -> anyhow::Result<()> {
    write_new(key_path, key, 0o600)?;
    if let Err(e) = write_new(cert_path, cert, 0o644) {
        let _ = std::fs::remove_file(key_path);
        return Err(e);
    }
    Ok(())
}

/// Creates `path` with `mode` (less the umask) and writes `contents`; never replaces a
/// file (`O_EXCL`), so nothing is overwritten nor a key left readable through one that was
/// there.
fn write_new(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow!(
                    "{} already exists; not overwriting it (move it away, or pass another --dir)",
                    path.display()
                )
            } else {
                anyhow::Error::new(e).context(format!("creating {}", path.display()))
            }
        })?;
    let written = file
        .write_all(contents.as_bytes())
        .and_then(|()| file.sync_all());
    if let Err(e) = written {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}
