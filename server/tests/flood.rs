//! The attack: a flood of slow clients from several addresses (headers that never end,
//! bodies that trickle a byte at a time into sign-in) against the real HTTP stack, while
//! agents sync every second with a 3 s lost timeout. What must hold: no host is declared
//! lost, agents' syncs keep answering, and the console's other routes still answer a
//! client from another address.

#[allow(dead_code)]
mod common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use tessera_control::inputs::PoolInput;
use tessera_control::{Control, ControlConfig};
use tessera_model::HostStatus;
use tessera_server::{AppState, run};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

const JOIN: &str = "flood-test-join-token-000";
/// Attacking addresses, and connections from each (under the per-address cap, so every
/// one is accepted and the budgets, not the cap, must hold). The first `BODY_ATTACKERS`
/// trickle bodies (1,100 of them: more than the 1,024 requests the other routes may have
/// in flight): sign-ins, and from the last two of them agents' syncs with a made-up
/// token; the others send headers that never end.
const ATTACKERS: u8 = 13;
const BODY_ATTACKERS: u8 = 11;
const SYNC_ATTACKERS: u8 = 2;
const PER_ATTACKER: usize = 100;

#[derive(Clone, Copy)]
enum Slow {
    Headers,
    SignIn,
    Sync,
}

/// A slow client: headers cut short (`slow_headers`), or a sign-in whose body arrives one
/// byte every 2 s. Returns whether the server closed it before the flood ended.
async fn slow_client(server: SocketAddr, from: IpAddr, how: Slow, until: Instant) -> bool {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    if socket.bind(SocketAddr::new(from, 0)).is_err() {
        return false;
    }
    let Ok(mut stream) = socket.connect(server).await else {
        return true;
    };
    let head = match how {
        Slow::Headers => "GET /api/v1/hosts HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
        Slow::SignIn => {
            "POST /api/v1/session HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{"
        }
        Slow::Sync => {
            "POST /agent/v1/sync HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer made-up-agent-token\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{"
        }
    };
    if stream.write_all(head.as_bytes()).await.is_err() {
        return true;
    }
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if stream.write_all(b"a").await.is_err() {
            return true;
        }
    }
    false
}

#[tokio::test]
async fn a_flood_of_slow_clients_costs_no_host_and_no_sync() {
    let secs: u64 = std::env::var("TESSERA_FLOOD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let store = tessera_control::open("sqlite::memory:")
        .await
        .expect("store");
    let control = Control::new(
        store,
        ControlConfig {
            sync_interval: Duration::from_secs(1),
            lost_after_intervals: 3,
            tick: Duration::from_millis(200),
            ..ControlConfig::default()
        },
    );
    control.ensure_join_token(Some(JOIN)).await.expect("join");
    control
        .create_pool(&PoolInput::named("inference"))
        .await
        .expect("pool");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stop_rx) = watch::channel(false);
    let mut s1 = stop_rx.clone();
    tokio::spawn(run(
        listener,
        AppState::new(control.clone(), addr),
        None,
        async move {
            let _ = s1.changed().await;
        },
    ));
    let (c, mut s2) = (control.clone(), stop_rx.clone());
    tokio::spawn(async move {
        c.run(async move {
            let _ = s2.changed().await;
        })
        .await
    });

    // Three stand-in agents speaking the agent protocol over HTTP, from 127.0.0.1.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let base = format!("http://{addr}");
    let mut agents = Vec::new();
    for i in 0..3 {
        let name = format!("steady-{i}");
        let r: serde_json::Value = http
            .post(format!("{base}/agent/v1/register"))
            .json(&common::register_body(JOIN, &name))
            .send()
            .await
            .expect("register")
            .json()
            .await
            .expect("answer");
        let token = r["agent_token"].as_str().expect("token").to_owned();
        let host = tessera_model::HostId::new(r["host_id"].as_str().expect("id")).expect("id");
        let body = common::sync_body(&control, &host).await;
        agents.push((token, body));
    }
    let until = Instant::now() + Duration::from_secs(secs);
    let syncing = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed, mut slowest) = (0u32, 0u32, Duration::ZERO);
            while Instant::now() < until {
                for (token, body) in &agents {
                    let asked = Instant::now();
                    let answer = http
                        .post(format!("{base}/agent/v1/sync"))
                        .bearer_auth(token)
                        .json(body)
                        .send()
                        .await;
                    slowest = slowest.max(asked.elapsed());
                    match answer {
                        Ok(r) if r.status().is_success() => ok += 1,
                        _ => failed += 1,
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            (ok, failed, slowest)
        })
    };

    // The flood, from 127.0.0.2 on.
    let mut flood = tokio::task::JoinSet::new();
    for a in 0..ATTACKERS {
        let from = IpAddr::from([127, 0, 0, 2 + a]);
        let how = if a >= BODY_ATTACKERS {
            Slow::Headers
        } else if a >= BODY_ATTACKERS - SYNC_ATTACKERS {
            Slow::Sync
        } else {
            Slow::SignIn
        };
        for _ in 0..PER_ATTACKER {
            flood.spawn(slow_client(addr, from, how, until));
        }
    }
    // Meanwhile the console answers someone else.
    tokio::time::sleep(Duration::from_secs(secs / 2)).await;
    let health = http
        .get(format!("{base}/healthz"))
        .send()
        .await
        .map(|r| r.status().as_u16());
    let (ok, failed, slowest) = syncing.await.expect("syncing");
    let closed = flood.join_all().await.into_iter().filter(|c| *c).count();
    let hosts = control.list_hosts().await.expect("hosts");
    let lost = hosts
        .iter()
        .filter(|h| h.status == HostStatus::Lost)
        .count();
    println!(
        "flood: {} slow connections from {ATTACKERS} addresses for {secs} s ({closed} closed by the server early); agents' syncs: {ok} answered, {failed} failed, slowest {:.0} ms; /healthz from another address: {health:?}; hosts lost: {lost} of {}",
        usize::from(ATTACKERS) * PER_ATTACKER,
        slowest.as_secs_f64() * 1000.0,
        hosts.len()
    );
    let _ = stop.send(true);
    assert_eq!(lost, 0, "hosts were declared lost during the flood");
    assert_eq!(failed, 0, "agents' syncs failed during the flood");
    assert!(slowest < Duration::from_secs(2), "a sync took {slowest:?}");
    assert_eq!(health.ok(), Some(200));
    assert!(
        closed > 0,
        "slow headers were never cut off: the header timeout does not hold"
    );
}
