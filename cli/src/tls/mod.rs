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

mod certs;
mod files;

pub use certs::{Name, Written, create_agent_ca, create_ca, create_server_cert};

use clap::{Args, Subcommand};
use files::out_path;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

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
