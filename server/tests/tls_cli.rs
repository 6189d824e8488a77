//! `tessera tls`: the CA and server certificate it makes are what `tessera serve` serves
//! HTTPS with as they are, and what clients and agents that trust only the CA accept
//! (while one trusting another CA, or reaching the server by a name not in the
//! certificate, is refused); nothing is overwritten; keys are mode 0600; and the
//! `tessera` binary runs the commands.

use tessera_server::cli::tls;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tessera_agent::{Agent, AgentConfig};
use tessera_control::inputs::PoolInput;
use tessera_control::{Control, ControlConfig};
use tessera_model::{HostId, PoolName};
use tessera_server::{AppState, TlsFiles, run};
use tokio::sync::watch;

const JOIN: &str = "tls-cli-test-join-token-1";

/// A CA in `dir`, valid 30 days.
fn ca(dir: &Path) -> tls::Written {
    tls::create_ca(dir, "Test CA", 30).expect("CA")
}

/// A server certificate in `dir` for localhost and 127.0.0.1, signed by the CA in `dir`.
fn localhost_cert(dir: &Path) -> tls::Written {
    tls::create_server_cert(
        dir,
        &dir.join(tls::CA_CERT),
        &dir.join(tls::CA_KEY),
        &["localhost".to_owned()],
        &["127.0.0.1".parse().expect("address")],
        30,
    )
    .expect("server certificate")
}

/// `tessera_server::run` over HTTPS with `cert` and `key`, on a database in `dir`, with a
/// join token and a pool for agents.
struct Server {
    addr: SocketAddr,
    control: Control,
    _stop: watch::Sender<bool>,
}

async fn serve(dir: &Path, cert: &Path, key: &Path) -> Server {
    let store = tessera_control::open(&format!("sqlite://{}/server.db", dir.display()))
        .await
        .expect("store");
    let control = Control::new(
        store,
        ControlConfig {
            sync_interval: Duration::from_secs(1),
            lost_after_intervals: 3,
            tick: Duration::from_millis(100),
            ..ControlConfig::default()
        },
    );
    control
        .agents()
        .ensure_join_token(Some(JOIN))
        .await
        .expect("join token");
    control
        .deployments()
        .create_pool(&PoolInput::named("gpu"))
        .await
        .expect("pool");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stop_rx) = watch::channel(false);
    let tls = TlsFiles {
        cert: cert.to_owned(),
        key: key.to_owned(),
    };
    let mut s1 = stop_rx.clone();
    tokio::spawn(run(
        listener,
        AppState::new(control.clone(), addr),
        Some(tls),
        async move {
            let _ = s1.changed().await;
        },
    ));
    let (c, mut s2) = (control.clone(), stop_rx);
    tokio::spawn(async move {
        c.run(async move {
            let _ = s2.changed().await;
        })
        .await
    });
    Server {
        addr,
        control,
        _stop: stop,
    }
}

/// An HTTPS client that trusts the CA certificate in `ca` and nothing else, and reaches
/// the names `localhost` and `tessera.invalid` at `addr`.
fn client_trusting(ca: &Path, addr: SocketAddr) -> reqwest::Client {
    let pem = std::fs::read(ca).expect("CA certificate");
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("PEM"))
        .resolve("localhost", addr)
        .resolve("tessera.invalid", addr)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_serves_the_certificate_and_clients_trusting_only_the_ca_accept_it() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = dir.path().join("certs");
    ca(&certs);
    let made = localhost_cert(&certs);
    let server = serve(dir.path(), &made.cert, &made.key).await;
    let port = server.addr.port();

    let trusting = client_trusting(&certs.join(tls::CA_CERT), server.addr);
    for url in [
        format!("https://localhost:{port}/healthz"),
        format!("https://127.0.0.1:{port}/healthz"),
    ] {
        let answer = trusting
            .get(&url)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e:?}"));
        assert!(answer.status().is_success(), "{url}: {}", answer.status());
    }
    // A name the certificate is not for is refused, by the same client.
    let wrong_name = trusting
        .get(format!("https://tessera.invalid:{port}/healthz"))
        .send()
        .await;
    assert!(wrong_name.is_err(), "{wrong_name:?}");

    // A client trusting another CA refuses the server.
    let other = dir.path().join("other");
    ca(&other);
    let untrusting = client_trusting(&other.join(tls::CA_CERT), server.addr);
    let refused = untrusting
        .get(format!("https://localhost:{port}/healthz"))
        .send()
        .await;
    assert!(refused.is_err(), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_given_the_agent_ca_file_registers_over_https() {
    let dir = tempfile::tempdir().expect("dir");
    let certs = dir.path().join("certs");
    ca(&certs);
    let made = localhost_cert(&certs);
    let agent_ca = tls::create_agent_ca(&dir.path().join("agent"), &certs.join(tls::CA_CERT))
        .expect("agent CA file");
    let server = serve(dir.path(), &made.cert, &made.key).await;
    let config = AgentConfig {
        server: format!("https://localhost:{}", server.addr.port()),
        ca_cert: Some(agent_ca),
        insecure_http: false,
        join_token: Some(JOIN.into()),
        state_dir: dir.path().join("a"),
        pool: PoolName::new("gpu").expect("valid"),
        name: "a".into(),
        labels: Default::default(),
        resources: Some((
            tessera_model::MilliCpu(16_000),
            tessera_model::MiB(64 * 1024),
        )),
        simulate: Some("2xL4-24GB".into()),
        mps_control: Some(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/fake-mps-control"),
        ),
        max_mps_restarts: 0,
        no_mps: false,
        log_cap: 1 << 20,
        stop_tasks_on_exit: true,
        log_retention: Duration::from_secs(3600),
        run_as: None,
        containers: tessera_agent::ContainerRuntime::Process,
        advertise_address: Some("127.0.0.1".into()),
        port_range: (32768, 60999),
        provider_id: None,
    };
    let (stop, mut stop_rx) = watch::channel(false);
    let agent = Agent::new(config).expect("agent");
    let handle = tokio::spawn(async move {
        agent
            .run(async move {
                let _ = stop_rx.changed().await;
            })
            .await
            .expect("agent runs");
    });
    let host = HostId::new("a").expect("valid");
    tessera_control::testkit::wait_until("the agent to register over HTTPS", || {
        let store = server.control.store();
        let host = host.clone();
        async move { store.get_host(&host).await.is_ok() }
    })
    .await;
    let _ = stop.send(true);
    let _ = handle.await;
}

#[test]
fn the_server_file_is_the_certificate_then_the_ca_and_keys_are_private() {
    let dir = tempfile::tempdir().expect("dir");
    let ca_files = ca(dir.path());
    let made = localhost_cert(dir.path());
    assert_eq!(made.cert, dir.path().join(tls::SERVER_CERT));
    assert_eq!(made.key, dir.path().join(tls::SERVER_KEY));
    assert_eq!(
        made.names,
        vec![
            tls::Name::Dns("localhost".into()),
            tls::Name::Ip("127.0.0.1".parse().expect("address")),
        ]
    );
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&made.cert)
        .expect("open")
        .collect::<Result<_, _>>()
        .expect("PEM");
    let ca_der = CertificateDer::from_pem_file(&ca_files.cert).expect("CA PEM");
    assert_eq!(chain.len(), 2, "the certificate, then the CA's");
    assert_eq!(chain[1], ca_der);
    assert_ne!(chain[0], ca_der);

    assert_eq!(mode(&ca_files.key), 0o600);
    assert_eq!(mode(&made.key), 0o600);
    assert!(mode(&ca_files.cert) & 0o400 != 0);
    assert!(mode(&made.cert) & 0o400 != 0);
    for key in [&ca_files.key, &made.key] {
        let text = std::fs::read_to_string(key).expect("key");
        assert!(text.starts_with("-----BEGIN PRIVATE KEY-----"), "{text}");
    }
    for cert in [&ca_files.cert, &made.cert] {
        let text = std::fs::read_to_string(cert).expect("certificate");
        assert!(!text.contains("PRIVATE KEY"), "{text}");
    }
}

#[test]
fn nothing_is_overwritten() {
    let dir = tempfile::tempdir().expect("dir");
    let first = ca(dir.path());
    let before = std::fs::read(&first.cert).expect("CA");
    let e = tls::create_ca(dir.path(), "Another CA", 30).expect_err("refused");
    let e = format!("{e:#}");
    assert!(
        e.contains(tls::CA_CERT) && e.contains("already exists"),
        "{e}"
    );
    assert_eq!(std::fs::read(&first.cert).expect("CA"), before);

    localhost_cert(dir.path());
    let before = std::fs::read(dir.path().join(tls::SERVER_KEY)).expect("key");
    let e = tls::create_server_cert(
        dir.path(),
        &first.cert,
        &first.key,
        &["tessera.example".to_owned()],
        &[],
        30,
    )
    .expect_err("refused");
    let e = format!("{e:#}");
    assert!(
        e.contains(tls::SERVER_CERT) && e.contains("already exists"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(dir.path().join(tls::SERVER_KEY)).expect("key"),
        before
    );

    tls::create_agent_ca(dir.path(), &first.cert).expect("agent CA file");
    let e = tls::create_agent_ca(dir.path(), &first.cert).expect_err("refused");
    assert!(format!("{e:#}").contains(tls::AGENT_CA), "{e:#}");

    // A key alone already there stops the CA before anything is written.
    let other = tempfile::tempdir().expect("dir");
    std::fs::write(other.path().join(tls::CA_KEY), "mine").expect("key");
    let e = tls::create_ca(other.path(), "Test CA", 30).expect_err("refused");
    assert!(format!("{e:#}").contains(tls::CA_KEY), "{e:#}");
    assert!(!other.path().join(tls::CA_CERT).exists());
    assert_eq!(
        std::fs::read_to_string(other.path().join(tls::CA_KEY)).expect("key"),
        "mine"
    );
}

#[test]
fn the_agent_file_is_the_ca_certificate_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let ca_files = ca(dir.path());
    let path = tls::create_agent_ca(&dir.path().join("for-agents"), &ca_files.cert)
        .expect("agent CA file");
    assert_eq!(path, dir.path().join("for-agents").join(tls::AGENT_CA));
    let text = std::fs::read_to_string(&path).expect("file");
    assert!(!text.contains("PRIVATE KEY"), "{text}");
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<_, _>>()
        .expect("PEM");
    assert_eq!(
        certs,
        vec![CertificateDer::from_pem_file(&ca_files.cert).expect("CA PEM")]
    );
}

#[test]
fn a_key_that_is_not_the_cas_and_bad_names_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let first = ca(&one);
    let second = ca(&two);
    let out = dir.path().join("out");
    let e = tls::create_server_cert(
        &out,
        &first.cert,
        &second.key,
        &["localhost".to_owned()],
        &[],
        30,
    )
    .expect_err("refused");
    let e = format!("{e:#}");
    assert!(e.contains("is not the key"), "{e}");
    assert!(!out.join(tls::SERVER_CERT).exists());
    assert!(!out.join(tls::SERVER_KEY).exists());

    for bad in [
        "https://tessera.example",
        "tessera.example:3443",
        "*.example",
        "",
    ] {
        let e = tls::create_server_cert(&out, &first.cert, &first.key, &[bad.to_owned()], &[], 30)
            .expect_err(bad);
        assert!(
            format!("{e:#}").contains("neither a host name"),
            "{bad}: {e:#}"
        );
    }
    let e =
        tls::create_server_cert(&out, &first.cert, &first.key, &[], &[], 30).expect_err("no names");
    assert!(format!("{e:#}").contains("at least one name"), "{e:#}");
    let e = tls::create_server_cert(
        &out,
        &first.cert,
        &first.key,
        &["localhost".to_owned()],
        &[],
        0,
    )
    .expect_err("no days");
    assert!(format!("{e:#}").contains("--days"), "{e:#}");
    // A bracketed IPv6 address, as in URLs, is an address.
    assert_eq!(
        tls::Name::parse("[::1]").expect("address"),
        tls::Name::Ip("::1".parse().expect("address"))
    );
    assert_eq!(
        tls::Name::parse("Tessera.Example.").expect("name"),
        tls::Name::Dns("tessera.example".into())
    );
}

#[test]
fn the_tessera_binary_runs_the_commands() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().to_str().expect("UTF-8 path");
    let tessera = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(args)
            .output()
            .expect("tessera runs")
    };
    let out = tessera(&["tls", "ca", "create", "--dir", d, "--name", "Test CA"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(tls::CA_CERT),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = tessera(&[
        "tls",
        "cert",
        "create",
        "--server",
        "localhost",
        "tessera.example",
        "--ip",
        "127.0.0.1",
        "--dir",
        d,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "--tls-cert",
        "--tls-key",
        "--ca-cert",
        "localhost, tessera.example, 127.0.0.1",
        tls::SERVER_CERT,
        tls::SERVER_KEY,
    ] {
        assert!(stdout.contains(expected), "{expected:?} in {stdout}");
    }
    assert!(dir.path().join(tls::SERVER_CERT).exists());
    assert_eq!(mode(&dir.path().join(tls::SERVER_KEY)), 0o600);

    let out = tessera(&["tls", "cert", "create", "--agent", "--dir", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join(tls::AGENT_CA).exists());

    // Neither --server nor --agent, or both: a usage error.
    for args in [
        &["tls", "cert", "create", "--dir", d][..],
        &[
            "tls", "cert", "create", "--agent", "--server", "x", "--dir", d,
        ][..],
    ] {
        let out = tessera(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }

    // Again: refused, naming the file, which is left as it was.
    let before = std::fs::read(dir.path().join(tls::CA_KEY)).expect("key");
    let out = tessera(&["tls", "ca", "create", "--dir", d]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(tls::CA_CERT) && stderr.contains("already exists"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(dir.path().join(tls::CA_KEY)).expect("key"),
        before
    );
}
