//! Notifications end to end: webhooks get what they asked for (kinds, pool), signed with
//! their secret; a receiver that is down loses nothing (its deliveries are retried with
//! backoff until it answers); a slow one holds up only its own deliveries; bad input is
//! named and stores nothing.

use std::sync::Arc;
use std::time::Duration;
use tessera_control::notify::{MAX_ATTEMPTS, signature};
use tessera_control::testkit::*;
use tessera_model::HostStatus;
use tessera_model::notify::{DeliveryStatus, NoticeBody, NoticeKind, WebhookFormat, WebhookInput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Mutex;

/// What a receiver got: each request's path, headers (lower-case names) and body.
type Got = Arc<Mutex<Vec<(String, Vec<(String, String)>, Vec<u8>)>>>;

/// A minimal HTTP/1.1 receiver on `listener` answering `status` after `delay`.
fn receive(listener: TcpListener, status: u16, delay: Duration) -> Got {
    let got: Got = Arc::default();
    let keep = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let keep = keep.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let (head_end, length) = loop {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (i + 4, length);
                    }
                };
                while buf.len() < head_end + length {
                    let n = conn.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                let mut lines = head.lines();
                let path = lines
                    .next()
                    .and_then(|l| l.split(' ').nth(1))
                    .unwrap_or_default()
                    .to_owned();
                let headers = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
                    .collect();
                keep.lock()
                    .await
                    .push((path, headers, buf[head_end..].to_vec()));
                tokio::time::sleep(delay).await;
                let _ = conn
                    .write_all(
                        format!(
                            "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    got
}

fn hook(name: &str, url: &str, kinds: Vec<NoticeKind>, pool: Option<&str>) -> WebhookInput {
    WebhookInput {
        name: name.into(),
        url: url.into(),
        format: WebhookFormat::Json,
        kinds,
        project: None,
        pool: pool.map(str::to_owned),
        service: None,
    }
}

/// Host `a` goes silent and is declared lost (host `b` keeps syncing).
async fn lose_a_host(env: &Env) -> Host {
    let c = &env.control;
    let a = host(c, "a", 1, 24).await;
    let b = host(c, "b", 1, 24).await;
    for _ in 0..12 {
        env.clock.advance(Duration::from_millis(300));
        sync(c, &b).await;
        c.reconcile_once().await.expect("pass");
    }
    assert_eq!(
        c.store().get_host(&a.id).await.expect("host").status,
        HostStatus::Lost
    );
    a
}

/// Runs the deliveries due now to their end.
async fn deliver(c: &tessera_control::Control) {
    for h in c.notifications().deliver_due().await.expect("due") {
        h.await.expect("a try");
    }
}

#[tokio::test]
async fn a_lost_host_is_posted_signed_to_the_webhooks_that_want_it_and_to_no_other() {
    let env = env(fast()).await;
    let c = &env.control;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let got = receive(listener, 200, Duration::ZERO);
    let wanted = c
        .notifications()
        .create_webhook(&hook(
            "on-call",
            &url,
            vec![NoticeKind::HostLost],
            Some("gpu"),
        ))
        .await
        .expect("webhook");
    // Another kind, another pool: neither gets this one.
    for (name, kinds, pool) in [
        ("rollbacks", vec![NoticeKind::DeploymentRolledBack], None),
        ("other-pool", vec![], Some("elsewhere")),
    ] {
        c.notifications()
            .create_webhook(&hook(name, &url, kinds, pool))
            .await
            .expect("webhook");
    }
    let a = lose_a_host(&env).await;
    deliver(c).await;
    let got = got.lock().await.clone();
    assert_eq!(got.len(), 1, "one delivery: {got:?}");
    let (path, headers, body) = &got[0];
    assert_eq!(path, "/hook");
    let header = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    // Signed with the secret given when it was made, over the time and the body.
    let sig = header("x-tessera-signature");
    let t: i64 = sig
        .strip_prefix("t=")
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .expect("a time");
    assert_eq!(sig, signature(&wanted.secret, t, body));
    assert_ne!(sig, signature("not-the-secret", t, body));
    let notice: NoticeBody = serde_json::from_slice(body).expect("Tessera's JSON");
    assert_eq!(notice.kind, NoticeKind::HostLost);
    assert_eq!(notice.host.as_deref(), Some(a.id.as_str()));
    assert_eq!(notice.pool.as_deref(), Some("gpu"));
    assert!(notice.message.contains("lost"), "{}", notice.message);
    assert_eq!(header("x-tessera-delivery"), notice.delivery.to_string());
    let listed = c
        .notifications()
        .deliveries(wanted.webhook.id)
        .await
        .expect("deliveries");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].status, DeliveryStatus::Delivered);
    assert_eq!(listed[0].attempts, 1);
    assert_eq!(listed[0].last_status, Some(200));
}

#[tokio::test]
async fn a_receiver_down_for_thirty_seconds_loses_nothing() {
    let env = env(fast()).await;
    let c = &env.control;
    // A port nobody listens on yet: bound and not listening, so connections are refused
    // and no other test running beside this one is given the port meanwhile.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("address"))
        .expect("bind");
    let addr = socket.local_addr().expect("addr");
    let made = c
        .notifications()
        .create_webhook(&hook("on-call", &format!("http://{addr}/"), vec![], None))
        .await
        .expect("webhook");
    lose_a_host(&env).await;
    // Tried, refused, tried again with backoff while it is down.
    let mut waited = Duration::ZERO;
    while waited < Duration::from_secs(30) {
        deliver(c).await;
        env.clock.advance(Duration::from_secs(1));
        waited += Duration::from_secs(1);
    }
    let d = c
        .notifications()
        .deliveries(made.webhook.id)
        .await
        .expect("list");
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].status, DeliveryStatus::Pending, "{:?}", d[0]);
    assert!(
        d[0].attempts >= 4 && d[0].attempts < MAX_ATTEMPTS,
        "{:?}",
        d[0]
    );
    assert!(d[0].last_error.is_some());
    // It comes back: the next try gets through, and nothing was lost.
    let listener = socket.listen(64).expect("listening on the same port");
    let got = receive(listener, 204, Duration::ZERO);
    for _ in 0..40 {
        env.clock.advance(Duration::from_secs(1));
        deliver(c).await;
        if !got.lock().await.is_empty() {
            break;
        }
    }
    assert_eq!(got.lock().await.len(), 1);
    let d = c
        .notifications()
        .deliveries(made.webhook.id)
        .await
        .expect("list");
    assert_eq!(d[0].status, DeliveryStatus::Delivered);
    assert_eq!(d[0].last_status, Some(204));
}

#[tokio::test]
async fn a_slow_receiver_holds_up_only_its_own_deliveries() {
    let env = env(fast()).await;
    let c = &env.control;
    let slow = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let slow_url = format!("http://{}/", slow.local_addr().expect("addr"));
    let _slow_got = receive(slow, 200, Duration::from_secs(3));
    let quick = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let quick_url = format!("http://{}/", quick.local_addr().expect("addr"));
    let quick_got = receive(quick, 200, Duration::ZERO);
    for (name, url) in [("slow", &slow_url), ("quick", &quick_url)] {
        c.notifications()
            .create_webhook(&hook(name, url, vec![], None))
            .await
            .expect("webhook");
    }
    lose_a_host(&env).await;
    let started = std::time::Instant::now();
    let tries = c.notifications().deliver_due().await.expect("due");
    assert_eq!(tries.len(), 2);
    // The quick one arrives while the slow one is still being answered.
    while quick_got.lock().await.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the quick receiver waited"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And a round started meanwhile does not send the slow one's again.
    assert!(
        c.notifications()
            .deliver_due()
            .await
            .expect("due")
            .is_empty()
    );
    for t in tries {
        t.await.expect("a try");
    }
}

#[tokio::test]
async fn bad_webhooks_are_named_and_nothing_is_stored() {
    let env = env(fast()).await;
    let c = &env.control;
    let e = c
        .notifications()
        .create_webhook(&hook("x", "ftp://example.com", vec![], None))
        .await
        .expect_err("refused");
    assert!(
        e.to_string().contains("url") || format!("{e:?}").contains("url"),
        "{e:?}"
    );
    c.notifications()
        .create_webhook(&hook("x", "https://example.com/a", vec![], None))
        .await
        .expect("made");
    let twice = c
        .notifications()
        .create_webhook(&hook("x", "https://example.com/b", vec![], None))
        .await
        .expect_err("a name taken");
    assert!(twice.to_string().contains("already exists"), "{twice}");
    assert_eq!(
        c.notifications().list_webhooks().await.expect("list").len(),
        1
    );
    assert!(c.notifications().deliveries(9999).await.is_err());
    assert!(c.notifications().delete_webhook(9999).await.is_err());
}
