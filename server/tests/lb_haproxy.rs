//! `tessera lb haproxy` against a real HAProxy (the Debian package, /usr/sbin/haproxy):
//! the Runtime API client, plans applied to a live backend (requests reach the servers
//! added; a drained or deleted one gets none; a delete that waits on a connection closes
//! it), and the whole loop following a fake Tessera server's endpoints and live feed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_model::HostId;
use tessera_model::api::{Endpoint, EndpointHealth, EndpointList};
use tessera_model::taskdef::Protocol;
use tessera_server::cli::lb::{self, Admin, ServerState, Syncer};
use tessera_server::cli::{Client, Connection, Exit, Token};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const HAPROXY: &str = "/usr/sbin/haproxy";
const TASK_A: &str = "0f3c9a1e-77b2-4c1d-9e0a-1234567890ab";
const TASK_B: &str = "a1b2c3d4-e5f6-4789-8abc-def012345678";
const TASK_C: &str = "c0ffee00-0000-4000-8000-000000000000";

/// HAProxy in the foreground on a configuration of its own; killed when dropped, a
/// failed test included.
struct Haproxy {
    child: Child,
    dir: tempfile::TempDir,
    socket: PathBuf,
    /// The frontend's port.
    port: u16,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Haproxy {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("haproxy.log")).unwrap_or_default()
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("an address")
        .port()
}

/// HAProxy with an admin socket, a frontend on a free port and an empty `backend web`
/// (besides one disabled static server that must stay untouched), once its socket
/// answers; `None` (the test skipped) without HAProxy.
async fn start_haproxy() -> Option<Haproxy> {
    if !Path::new(HAPROXY).exists() {
        eprintln!("skipped: no HAProxy at {HAPROXY} (apt-get install haproxy)");
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("lb")
        .tempdir()
        .expect("a temporary directory");
    let socket = dir.path().join("admin.sock");
    let port = free_port();
    let config = format!(
        "global
    stats socket {socket} mode 600 level admin
    stats timeout 10s

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s

frontend fe
    bind 127.0.0.1:{port}
    default_backend web

backend web
    balance roundrobin
    retries 3
    option redispatch
    server static 127.0.0.1:9 disabled
",
        socket = socket.display()
    );
    let path = dir.path().join("haproxy.cfg");
    std::fs::write(&path, config).expect("write haproxy.cfg");
    let log = std::fs::File::create(dir.path().join("haproxy.log")).expect("a log file");
    let child = Command::new(HAPROXY)
        .arg("-f")
        .arg(&path)
        .arg("-db")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("the log file again"))
        .stderr(log)
        .spawn()
        .expect("start haproxy");
    let mut h = Haproxy {
        child,
        dir,
        socket,
        port,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(answer) = lb::haproxy(&h.socket, "show servers state web").await
            && lb::parse_servers_state(&answer).is_ok()
        {
            return Some(h);
        }
        if let Ok(Some(status)) = h.child.try_wait() {
            panic!("haproxy ended ({status}):\n{}", h.log());
        }
        assert!(
            Instant::now() < deadline,
            "haproxy's socket did not answer within 10 s:\n{}",
            h.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A tiny HTTP server that answers its name and closes; `/slow` waits a minute first (a
/// connection that stays open). Counts the requests it got.
async fn backend(name: &'static str) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("an address").port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let Some(request) = read_head(&mut stream).await else {
                    return;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                if request.starts_with("GET /slow") {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                    name.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (port, hits)
}

/// A request's head, up to the blank line.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head: Vec<u8> = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// One request through HAProxy's frontend: the answer's body (a backend's name, or
/// HAProxy's error page).
async fn fetch(port: u16, path: &'static str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the frontend");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send a request");
    let mut answer = String::new();
    // A session HAProxy shuts ends without an answer.
    let _ = stream.read_to_string(&mut answer).await;
    match answer.split_once("\r\n\r\n") {
        Some((_, body)) => body.to_owned(),
        None => answer.clone(),
    }
}

fn endpoint(task: &str, port: u16, health: EndpointHealth) -> Endpoint {
    Endpoint {
        task: task.to_owned(),
        host: HostId::new("gpu-1").expect("a host id"),
        address: "127.0.0.1".to_owned(),
        port,
        port_name: Some("http".to_owned()),
        container_port: 8000,
        protocol: Protocol::Tcp,
        health,
        reason: None,
        task_definition: "chat:1".parse().expect("family:revision"),
    }
}

fn state_of(servers: &[ServerState], name: &str) -> Option<Admin> {
    servers
        .iter()
        .find(|s| s.name == name)
        .map(ServerState::admin)
}

/// Polls `show servers state web` until `ok` holds (10 s at most).
async fn wait_for(socket: &Path, what: &str, ok: impl Fn(&[ServerState]) -> bool) {
    let ok = &ok;
    tessera_control::testkit::wait_for(what, Duration::from_secs(10), || async move {
        let answer = lb::haproxy(socket, "show servers state web")
            .await
            .expect("HAProxy answers");
        let servers = lb::parse_servers_state(&answer).expect("a backend's state");
        if ok(&servers) {
            Ok(())
        } else {
            Err(format!("{servers:?}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_applied_to_a_live_haproxy() {
    let Some(h) = start_haproxy().await else {
        return;
    };
    let (port_a, hits_a) = backend("a").await;
    let (port_b, hits_b) = backend("b").await;
    let mut udp = endpoint(TASK_C, port_a, EndpointHealth::Healthy);
    udp.protocol = Protocol::Udp;
    let mut eps = vec![
        endpoint(TASK_A, port_a, EndpointHealth::Healthy),
        endpoint(TASK_B, port_b, EndpointHealth::Healthy),
        endpoint(TASK_C, free_port(), EndpointHealth::Starting),
        udp,
    ];
    let a = lb::server_name(TASK_A, port_a);
    let b = lb::server_name(TASK_B, port_b);

    // HAProxy's errors are text.
    let answer = lb::haproxy(&h.socket, "show servers state nope")
        .await
        .expect("an answer");
    assert!(answer.contains("Can't find backend"), "{answer:?}");
    // A backend HAProxy does not have is the operator's to fix.
    let missing = Syncer::new(&h.socket, "nope", None)
        .sync(&eps)
        .await
        .expect_err("no such backend");
    let exit = missing.downcast_ref::<Exit>().expect("a usage error");
    assert_eq!(exit.code, 2, "{exit}");

    // The healthy TCP endpoints are added, ready; the starting and the UDP one are not.
    let mut syncer = Syncer::new(&h.socket, "web", None).with_shutdown_after(Duration::ZERO);
    let round = syncer.sync(&eps).await.expect("a round");
    assert_eq!(
        round.changed,
        [
            format!("added {a} 127.0.0.1:{port_a} (task {TASK_A})"),
            format!("added {b} 127.0.0.1:{port_b} (task {TASK_B})"),
        ]
    );
    assert!(round.notes.is_empty(), "{round:?}");
    let again = syncer.sync(&eps).await.expect("a round");
    assert!(again.changed.is_empty(), "in step already: {again:?}");
    let servers = syncer.servers().await.expect("the servers");
    assert_eq!(state_of(&servers, &a), Some(Admin::Ready));
    assert_eq!(state_of(&servers, &b), Some(Admin::Ready));
    // Not Tessera's: untouched.
    assert_eq!(state_of(&servers, "static"), Some(Admin::Maint));
    assert_eq!(servers.len(), 3, "{servers:?}");

    // Requests reach both.
    let mut seen = BTreeSet::new();
    for _ in 0..6 {
        seen.insert(fetch(h.port, "/").await);
    }
    assert_eq!(
        seen,
        BTreeSet::from(["a".to_owned(), "b".to_owned()]),
        "{}",
        h.log()
    );

    // b's task drains: new requests go to a only.
    eps[1].health = EndpointHealth::Draining;
    let round = syncer.sync(&eps).await.expect("a round");
    assert_eq!(round.changed, [format!("draining {b} (task {TASK_B})")]);
    let servers = syncer.servers().await.expect("the servers");
    assert_eq!(state_of(&servers, &b), Some(Admin::Drain));
    let before = hits_b.load(Ordering::SeqCst);
    for _ in 0..4 {
        assert_eq!(fetch(h.port, "/").await, "a");
    }
    assert_eq!(hits_b.load(Ordering::SeqCst), before);

    // b's task is gone: its server is deleted.
    eps.retain(|e| e.task != TASK_B);
    let round = syncer.sync(&eps).await.expect("a round");
    assert_eq!(
        round.changed,
        [format!("removed {b} 127.0.0.1:{port_b} (task gone)")]
    );
    let servers = syncer.servers().await.expect("the servers");
    assert_eq!(state_of(&servers, &b), None);
    assert_eq!(state_of(&servers, &a), Some(Admin::Ready));

    // a holds a connection open when its task goes: HAProxy refuses the delete; the next
    // round (the wait is zero here, 30 s for real) closes its sessions and deletes it.
    let before = hits_a.load(Ordering::SeqCst);
    let slow = tokio::spawn(fetch(h.port, "/slow"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while hits_a.load(Ordering::SeqCst) == before {
        assert!(
            Instant::now() < deadline,
            "the slow request did not reach a"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eps.retain(|e| e.task != TASK_A);
    let round = syncer.sync(&eps).await.expect("a round");
    assert!(round.changed.is_empty(), "{round:?}");
    assert!(
        round
            .notes
            .iter()
            .any(|n| n.contains(&a) && n.contains("still has connections")),
        "{round:?}"
    );
    let servers = syncer.servers().await.expect("the servers");
    assert_eq!(state_of(&servers, &a), Some(Admin::Maint));
    let round = syncer.sync(&eps).await.expect("a round");
    assert_eq!(
        round.changed,
        [format!(
            "removed {a} 127.0.0.1:{port_a} (task gone; its sessions were closed)"
        )]
    );
    let servers = syncer.servers().await.expect("the servers");
    let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["static"]);
    slow.abort();
}

/// A Tessera server's two routes that `tessera lb haproxy` reads: one service's
/// endpoints, and the live feed (`data: change` on each `changed`).
struct Fake {
    endpoints: Mutex<EndpointList>,
    changed: tokio::sync::broadcast::Sender<()>,
}

const TOKEN: &str = "test-token";

async fn fake_tessera(fake: Arc<Fake>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("an address"));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer(stream, fake.clone()));
        }
    });
    url
}

async fn answer(mut stream: TcpStream, fake: Arc<Fake>) {
    use tokio::sync::broadcast::error::RecvError;
    let Some(head) = read_head(&mut stream).await else {
        return;
    };
    let head = head.to_lowercase();
    let path = head
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let reply = |status: &str, body: &str| {
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let text = if !head.contains(&format!("authorization: bearer {TOKEN}")) {
        reply("401 Unauthorized", r#"{"error":"no token"}"#)
    } else if path == "/api/v1/live" {
        let mut changes = fake.changed.subscribe();
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                    Cache-Control: no-cache\r\nConnection: close\r\n\r\n: hello\n\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        loop {
            match changes.recv().await {
                Ok(()) => {
                    if stream.write_all(b"data: change\n\n").await.is_err() {
                        return;
                    }
                }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            }
        }
    } else if path == "/api/v1/services/chat/endpoints" {
        let body = serde_json::to_string(&*fake.endpoints.lock().expect("the endpoints"))
            .expect("endpoints as JSON");
        reply("200 OK", &body)
    } else {
        reply("404 Not Found", r#"{"error":"no service named nope"}"#)
    };
    let _ = stream.write_all(text.as_bytes()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_follows_the_live_feed_and_ends_on_operator_errors() {
    let Some(h) = start_haproxy().await else {
        return;
    };
    let (port_a, _) = backend("a").await;
    let (port_b, _) = backend("b").await;
    let (changed, _) = tokio::sync::broadcast::channel(16);
    let fake = Arc::new(Fake {
        endpoints: Mutex::new(EndpointList {
            service: "chat".to_owned(),
            endpoints: vec![endpoint(TASK_A, port_a, EndpointHealth::Healthy)],
        }),
        changed,
    });
    let url = fake_tessera(fake.clone()).await;
    let client = Client::new(&Connection {
        url: Some(url),
        token: Some(Token(TOKEN.to_owned())),
        ca_cert: None,
        insecure_http: false,
    })
    .expect("a client");
    let a = lb::server_name(TASK_A, port_a);
    let b = lb::server_name(TASK_B, port_b);

    let checks = async {
        wait_for(&h.socket, "a added at start", |s| {
            state_of(s, &a) == Some(Admin::Ready)
        })
        .await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while fake.changed.receiver_count() == 0 {
            assert!(Instant::now() < deadline, "the live feed was not followed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A change is followed at once, not at the next 5 s round.
        fake.endpoints
            .lock()
            .expect("the endpoints")
            .endpoints
            .push(endpoint(TASK_B, port_b, EndpointHealth::Healthy));
        let sent = Instant::now();
        fake.changed.send(()).expect("a follower");
        wait_for(&h.socket, "b added on the change", |s| {
            state_of(s, &b) == Some(Admin::Ready)
        })
        .await;
        assert!(
            sent.elapsed() < Duration::from_secs(3),
            "b was added {:?} after the change",
            sent.elapsed()
        );
    };
    tokio::select! {
        r = lb::run_haproxy_until(
            &client,
            &h.socket,
            "web",
            "chat",
            None,
            std::future::pending::<anyhow::Result<()>>(),
        ) => panic!("the loop ended: {r:?}"),
        () = checks => {}
    }

    // What waiting does not fix ends the command, with the reason.
    let unknown = tokio::time::timeout(
        Duration::from_secs(10),
        lb::run_haproxy_until(
            &client,
            &h.socket,
            "web",
            "nope",
            None,
            std::future::pending::<anyhow::Result<()>>(),
        ),
    )
    .await
    .expect("an unknown service ends the command")
    .expect_err("an unknown service is an error");
    let exit = unknown
        .chain()
        .find_map(|c| c.downcast_ref::<Exit>())
        .expect("the server's refusal");
    assert_eq!(exit.status, Some(404), "{unknown:#}");
    assert!(
        exit.message.contains("no service named nope"),
        "{unknown:#}"
    );

    for backend in ["nosuch", "web; show info"] {
        let wrong = tokio::time::timeout(
            Duration::from_secs(10),
            lb::run_haproxy_until(
                &client,
                &h.socket,
                backend,
                "chat",
                None,
                std::future::pending::<anyhow::Result<()>>(),
            ),
        )
        .await
        .expect("a wrong backend ends the command")
        .expect_err("a wrong backend is an error");
        let exit = wrong
            .chain()
            .find_map(|c| c.downcast_ref::<Exit>())
            .expect("a usage error");
        assert_eq!(exit.code, 2, "{wrong:#}");
    }
}
