//! `tessera lb haproxy`: keeps an HAProxy backend's servers equal to a service's healthy
//! endpoints, through HAProxy's Runtime API (its admin socket). Tessera carries no
//! traffic: this drives a load balancer operators already run.
//!
//! # How
//! - A round reads the service's endpoints (`GET /api/v1/services/{name}/endpoints`) and
//!   the backend's servers (`show servers state BACKEND`), then runs the commands [`plan`]
//!   returns. Rounds run at start, on each change the live feed (`GET /api/v1/live`)
//!   announces, and every 5 s regardless: HAProxy forgets servers added at runtime when it
//!   restarts or reloads, and the next round fills it again.
//! - Tessera's servers are the ones named `tsr-…` ([`server_name`]); the backend's other
//!   servers are never touched, so a backend can mix static servers and Tessera's.
//! - Only healthy endpoints get traffic. A draining endpoint's server is set to `drain`
//!   (no new connections, open ones finish); a gone, unhealthy or starting one's is put in
//!   maintenance and deleted. HAProxy refuses to delete a server that still has
//!   connections: the delete is retried each round, and once the server has been waiting
//!   for 30 s its sessions are closed (`shutdown sessions`).
//! - Endpoints are TCP ports. A task with several ports gets one server per port unless
//!   `--port-name` picks one: pass it when tasks have several ports.
//! - Servers added at runtime take IP addresses (HAProxy leaves a host name unresolved and
//!   sends it nothing), so hosts that advertise a name are resolved here.
//! - Stopping the command (SIGINT, SIGTERM) leaves the servers as they are: HAProxy keeps
//!   serving the last known endpoints.
//!
//! The backend needs a balancing algorithm that takes servers at runtime (`roundrobin`,
//! `leastconn`, `first`, `random`, or hashing with `hash-type consistent`); tested with
//! HAProxy 2.6.

mod changes;
mod runtime;
mod syncer;

pub use changes::{Change, commands, plan, selected};
pub use runtime::{
    Admin, ServerState, haproxy, haproxy_address, host_port, parse_servers_state, server_name,
};
pub use syncer::{Round, Syncer};

use super::{Client, Exit};
use anyhow::{Context, bail};
use runtime::valid_backend;
use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};
use tessera_model::api::EndpointList;
use tokio::sync::Notify;

/// Tessera's servers' names start with this; no other server in the backend is touched.
pub const PREFIX: &str = "tsr-";

/// How long one Runtime API command may take, connecting included.
pub const SOCKET_TIMEOUT: Duration = Duration::from_secs(5);

/// A round runs at least this often, whatever the live feed says.
pub const RESYNC: Duration = Duration::from_secs(5);

/// How long a server's removal may wait on its connections before they are closed.
pub const SHUTDOWN_AFTER: Duration = Duration::from_secs(30);

/// The live feed sends a keep-alive every 15 s: this long without a byte means it is
/// dead even if its connection looks open.
const LIVE_IDLE: Duration = Duration::from_secs(45);

/// Whether a line of the live feed announces a change (any `data:` line does; comments,
/// which start with `:`, are keep-alives).
pub fn live_line_is_change(line: &str) -> bool {
    line.trim_end_matches(['\r', '\n']).starts_with("data:")
}

/// Retries wait 1 s, 2 s, 4 s, … up to 30 s.
fn backoff(failures: u32) -> Duration {
    let millis = 500u64.saturating_mul(1u64 << failures.min(6));
    Duration::from_millis(millis).min(Duration::from_secs(30))
}

/// Whether an error is the operator's to fix (the service does not exist, the token does
/// not work, the backend does not exist) rather than one to wait out.
fn is_fatal(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<Exit>())
        .any(|x| x.status.is_none_or(|s| matches!(s, 400 | 401 | 403 | 404)))
}

/// `tessera lb haproxy`: keeps `backend` of the HAProxy whose admin socket is `socket`
/// equal to `service`'s healthy endpoints until SIGINT or SIGTERM. Returns an error only
/// for what waiting does not fix (the service is unknown, the token is refused, the
/// backend does not exist); an unreachable server or HAProxy is told on stderr and
/// retried.
pub async fn run_haproxy(
    c: &Client,
    socket: &Path,
    backend: &str,
    service: &str,
    port_name: Option<&str>,
) -> anyhow::Result<()> {
    run_haproxy_until(c, socket, backend, service, port_name, signalled()).await
}

/// [`run_haproxy`] until `stop` resolves (tests stop it without signals).
pub async fn run_haproxy_until(
    c: &Client,
    socket: &Path,
    backend: &str,
    service: &str,
    port_name: Option<&str>,
    stop: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<()> {
    if !valid_backend(backend) {
        return Err(Exit::new(
            2,
            format!(
                "--backend {backend:?}: a backend name is letters, digits, '-', '_', '.' and ':'"
            ),
        )
        .into());
    }
    let mut syncer = Syncer::new(socket, backend, port_name);
    let wake = Notify::new();
    tokio::select! {
        r = sync_loop(c, &mut syncer, service, &wake) => r,
        never = follow_live(c, &wake) => match never {},
        r = stop => {
            r?;
            eprintln!("tessera lb: stopping; HAProxy keeps its servers as they are");
            Ok(())
        }
    }
}

/// SIGINT or SIGTERM.
async fn signalled() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("listening for SIGINT"),
        _ = term.recv() => Ok(()),
    }
}

/// Rounds, at start, when woken and every [`RESYNC`]; transient failures are told once
/// and retried.
async fn sync_loop(
    c: &Client,
    syncer: &mut Syncer,
    service: &str,
    wake: &Notify,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/services/{}/endpoints", super::seg(service));
    let mut failures: u32 = 0;
    let mut last_error: Option<String> = None;
    loop {
        let round = async {
            let list: EndpointList = c
                .get(&path)
                .await
                .with_context(|| format!("reading service {service}'s endpoints"))?;
            syncer.sync(&list.endpoints).await
        };
        match round.await {
            Ok(round) => {
                for note in &round.notes {
                    eprintln!("tessera lb: {}", crate::printable(note));
                }
                for line in &round.changed {
                    say!("{line}");
                }
                if last_error.take().is_some() {
                    eprintln!("tessera lb: in step again");
                }
                failures = 0;
            }
            Err(e) if is_fatal(&e) => return Err(e),
            Err(e) => {
                let text = format!("{e:#}");
                if last_error.as_deref() != Some(text.as_str()) {
                    eprintln!("tessera lb: {}; trying again", crate::printable(&text));
                }
                last_error = Some(text);
                failures = failures.saturating_add(1);
            }
        }
        let wait = if failures == 0 {
            RESYNC
        } else {
            backoff(failures).min(RESYNC)
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Follows the live feed for ever, waking `wake` on each change and on each reconnection
/// (changes may have been missed meanwhile); reconnects with a backoff, telling a failure
/// once rather than at every try.
async fn follow_live(c: &Client, wake: &Notify) -> Infallible {
    let mut failures: u32 = 0;
    let mut last_error: Option<String> = None;
    loop {
        let started = Instant::now();
        let result = read_live(c, wake).await;
        // A feed that lasted starts the backoff again, and its end is news.
        if started.elapsed() > Duration::from_secs(60) {
            failures = 0;
            last_error = None;
        }
        match result {
            Ok(()) => last_error = None,
            Err(e) => {
                let text = format!("{e:#}");
                if last_error.as_deref() != Some(text.as_str()) {
                    eprintln!(
                        "tessera lb: the live feed dropped ({text}); rounds run every {} s \
                         until it is back",
                        RESYNC.as_secs()
                    );
                }
                last_error = Some(text);
            }
        }
        failures = failures.saturating_add(1);
        tokio::time::sleep(backoff(failures)).await;
    }
}

/// One connection to the live feed, until it ends.
async fn read_live(c: &Client, wake: &Notify) -> anyhow::Result<()> {
    let mut response = tokio::time::timeout(Duration::from_secs(30), c.stream("/api/v1/live"))
        .await
        .context("no answer within 30 s")??;
    wake.notify_one();
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let chunk = match tokio::time::timeout(LIVE_IDLE, response.chunk()).await {
            Err(_) => bail!(
                "nothing, not even a keep-alive, for {} s",
                LIVE_IDLE.as_secs()
            ),
            // The request's own time limit: reconnect without a word.
            Ok(Err(e)) if e.is_timeout() => return Ok(()),
            Ok(Err(e)) => return Err(anyhow::Error::new(e).context("reading the live feed")),
            Ok(Ok(None)) => return Ok(()),
            Ok(Ok(Some(chunk))) => chunk,
        };
        pending.extend_from_slice(&chunk);
        let mut changed = false;
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            changed |= live_line_is_change(&String::from_utf8_lossy(&line));
        }
        if changed {
            wake.notify_one();
        }
        if pending.len() > 64 * 1024 {
            bail!("the live feed sent a line longer than 64 KiB");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lb::changes::Expect;
    use crate::lb::runtime::{FDRAIN, FMAINT};
    use std::collections::BTreeSet;
    use tessera_model::HostId;
    use tessera_model::api::{Endpoint, EndpointHealth};
    use tessera_model::taskdef::Protocol;

    const TASK_A: &str = "0f3c9a1e-77b2-4c1d-9e0a-1234567890ab";
    const TASK_B: &str = "a1b2c3d4-e5f6-4789-8abc-def012345678";

    fn endpoint(task: &str, address: &str, port: u16, health: EndpointHealth) -> Endpoint {
        Endpoint {
            task: task.to_owned(),
            host: HostId::new("gpu-1").expect("a host id"),
            address: address.to_owned(),
            port,
            port_name: Some("http".to_owned()),
            container_port: 8000,
            protocol: Protocol::Tcp,
            health,
            reason: None,
            task_definition: "chat:3".parse().expect("family:revision"),
        }
    }

    fn server(name: &str, address: &str, port: u16, admin_state: u32) -> ServerState {
        ServerState {
            name: name.to_owned(),
            address: address.to_owned(),
            fqdn: None,
            port,
            admin_state,
            running: true,
        }
    }

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    #[test]
    fn names_are_short_deterministic_and_legal() {
        let n = server_name(TASK_A, 32801);
        assert_eq!(n, "tsr-0f3c9a1e77b2-32801");
        assert_eq!(server_name(TASK_A, 32801), n);
        assert_ne!(server_name(TASK_A, 32802), n);
        assert_ne!(server_name(TASK_B, 32801), n);
        let odd = server_name("Task;with spaces/and\nmore", 1);
        assert!(
            odd.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)),
            "{odd}"
        );
    }

    #[test]
    fn addresses_are_ip_or_host_names_with_ipv6_in_brackets() {
        assert_eq!(
            haproxy_address("10.0.0.5", 80).as_deref(),
            Some("10.0.0.5:80")
        );
        assert_eq!(haproxy_address("::1", 80).as_deref(), Some("[::1]:80"));
        assert_eq!(
            haproxy_address("[fe80::1]", 80).as_deref(),
            Some("[fe80::1]:80")
        );
        assert_eq!(
            haproxy_address("gpu-1.example", 80).as_deref(),
            Some("gpu-1.example:80")
        );
        for bad in ["", "a b", "x;del server web/s", "-x", "a\nb"] {
            assert_eq!(haproxy_address(bad, 80), None, "{bad:?}");
        }
        assert_eq!(host_port("::1", 9), "[::1]:9");
        assert_eq!(host_port("10.0.0.5", 9), "10.0.0.5:9");
    }

    #[test]
    fn a_healthy_endpoint_without_a_server_is_added_then_readied() {
        let eps = [endpoint(TASK_A, "10.0.0.5", 32801, EndpointHealth::Healthy)];
        let changes = plan(&[], &eps, None, &none());
        assert_eq!(
            commands("web", &changes),
            [
                "add server web/tsr-0f3c9a1e77b2-32801 10.0.0.5:32801",
                "set server web/tsr-0f3c9a1e77b2-32801 state ready",
            ]
        );
        assert_eq!(
            changes[0].describe(),
            format!("added tsr-0f3c9a1e77b2-32801 10.0.0.5:32801 (task {TASK_A})")
        );
    }

    #[test]
    fn endpoints_that_should_get_no_traffic_are_not_added() {
        let eps = [
            endpoint(TASK_A, "10.0.0.5", 1, EndpointHealth::Starting),
            endpoint(TASK_A, "10.0.0.5", 2, EndpointHealth::Unhealthy),
            endpoint(TASK_A, "10.0.0.5", 3, EndpointHealth::Draining),
        ];
        assert!(plan(&[], &eps, None, &none()).is_empty());
    }

    #[test]
    fn a_server_in_step_is_left_alone() {
        let eps = [
            endpoint(TASK_A, "10.0.0.5", 32801, EndpointHealth::Healthy),
            endpoint(TASK_B, "10.0.0.6", 32802, EndpointHealth::Draining),
        ];
        let current = [
            server(&server_name(TASK_A, 32801), "10.0.0.5", 32801, 0),
            server(&server_name(TASK_B, 32802), "10.0.0.6", 32802, FDRAIN),
        ];
        assert!(plan(&current, &eps, None, &none()).is_empty());
    }

    #[test]
    fn a_server_out_of_rotation_whose_endpoint_is_healthy_is_readied() {
        let eps = [
            endpoint(TASK_A, "10.0.0.5", 32801, EndpointHealth::Healthy),
            endpoint(TASK_B, "10.0.0.6", 32802, EndpointHealth::Healthy),
        ];
        let current = [
            // Added, but the ready step did not happen (or someone set it).
            server(&server_name(TASK_A, 32801), "10.0.0.5", 32801, FMAINT),
            server(&server_name(TASK_B, 32802), "10.0.0.6", 32802, FDRAIN),
        ];
        let changes = plan(&current, &eps, None, &none());
        assert_eq!(
            commands("web", &changes),
            [
                "set server web/tsr-0f3c9a1e77b2-32801 state ready",
                "set server web/tsr-a1b2c3d4e5f6-32802 state ready",
            ]
        );
    }

    #[test]
    fn a_draining_endpoint_drains_its_server_once() {
        let eps = [endpoint(
            TASK_A,
            "10.0.0.5",
            32801,
            EndpointHealth::Draining,
        )];
        let ready = [server(&server_name(TASK_A, 32801), "10.0.0.5", 32801, 0)];
        let changes = plan(&ready, &eps, None, &none());
        assert_eq!(
            commands("web", &changes),
            ["set server web/tsr-0f3c9a1e77b2-32801 state drain"]
        );
        assert!(
            changes[0]
                .describe()
                .starts_with("draining tsr-0f3c9a1e77b2-32801")
        );
        let drained = [server(
            &server_name(TASK_A, 32801),
            "10.0.0.5",
            32801,
            FDRAIN,
        )];
        assert!(plan(&drained, &eps, None, &none()).is_empty());
        let maint = [server(
            &server_name(TASK_A, 32801),
            "10.0.0.5",
            32801,
            FMAINT,
        )];
        assert!(plan(&maint, &eps, None, &none()).is_empty());
    }

    #[test]
    fn a_server_whose_endpoint_is_gone_unhealthy_or_starting_is_removed() {
        let eps = [
            endpoint(TASK_B, "10.0.0.6", 2, EndpointHealth::Unhealthy),
            endpoint(TASK_B, "10.0.0.6", 3, EndpointHealth::Starting),
        ];
        let current = [
            server(&server_name(TASK_A, 1), "10.0.0.5", 1, 0),
            server(&server_name(TASK_B, 2), "10.0.0.6", 2, 0),
            // Already in maintenance (a delete that was refused): no second maint.
            server(&server_name(TASK_B, 3), "10.0.0.6", 3, FMAINT),
        ];
        let changes = plan(&current, &eps, None, &none());
        assert_eq!(
            commands("web", &changes),
            [
                "set server web/tsr-0f3c9a1e77b2-1 state maint",
                "del server web/tsr-0f3c9a1e77b2-1",
                "set server web/tsr-a1b2c3d4e5f6-2 state maint",
                "del server web/tsr-a1b2c3d4e5f6-2",
                "del server web/tsr-a1b2c3d4e5f6-3",
            ]
        );
        assert_eq!(
            changes[0].describe(),
            "removed tsr-0f3c9a1e77b2-1 10.0.0.5:1 (task gone)"
        );
        assert_eq!(
            changes[1].describe(),
            format!("removed tsr-a1b2c3d4e5f6-2 10.0.0.6:2 (task {TASK_B} unhealthy)")
        );
    }

    #[test]
    fn a_removal_that_waited_long_enough_closes_the_sessions_first() {
        let name = server_name(TASK_A, 1);
        let current = [server(&name, "10.0.0.5", 1, FMAINT)];
        let force: BTreeSet<String> = [name.clone()].into();
        let changes = plan(&current, &[], None, &force);
        assert_eq!(
            commands("web", &changes),
            [
                format!("shutdown sessions server web/{name}"),
                format!("del server web/{name}"),
            ]
        );
    }

    #[test]
    fn a_server_at_another_address_is_removed_then_added_again() {
        let eps = [endpoint(TASK_A, "10.0.0.9", 32801, EndpointHealth::Healthy)];
        let current = [server(&server_name(TASK_A, 32801), "10.0.0.5", 32801, 0)];
        assert_eq!(
            commands("web", &plan(&current, &eps, None, &none())),
            [
                "set server web/tsr-0f3c9a1e77b2-32801 state maint",
                "del server web/tsr-0f3c9a1e77b2-32801",
                "add server web/tsr-0f3c9a1e77b2-32801 10.0.0.9:32801",
                "set server web/tsr-0f3c9a1e77b2-32801 state ready",
            ]
        );
        // Moved and not healthy: only removed.
        let eps = [endpoint(
            TASK_A,
            "10.0.0.9",
            32801,
            EndpointHealth::Draining,
        )];
        assert_eq!(
            commands("web", &plan(&current, &eps, None, &none())),
            [
                "set server web/tsr-0f3c9a1e77b2-32801 state maint",
                "del server web/tsr-0f3c9a1e77b2-32801",
            ]
        );
        // IPv6 written differently is the same address.
        let eps = [endpoint(TASK_A, "[::1]", 32801, EndpointHealth::Healthy)];
        let current = [server(
            &server_name(TASK_A, 32801),
            "0:0:0:0:0:0:0:1",
            32801,
            0,
        )];
        assert!(plan(&current, &eps, None, &none()).is_empty());
    }

    #[test]
    fn servers_without_the_prefix_are_never_touched() {
        let current = [
            server("static-1", "10.0.0.1", 80, 0),
            server("tsr", "10.0.0.2", 80, 0),
            server("web-tsr-x", "10.0.0.3", 80, FMAINT),
        ];
        assert!(plan(&current, &[], None, &none()).is_empty());
    }

    #[test]
    fn udp_endpoints_are_ignored() {
        let mut udp = endpoint(TASK_A, "10.0.0.5", 5353, EndpointHealth::Healthy);
        udp.protocol = Protocol::Udp;
        assert!(plan(&[], std::slice::from_ref(&udp), None, &none()).is_empty());
        // Even a server of ours at that port goes: udp is never served.
        let current = [server(&server_name(TASK_A, 5353), "10.0.0.5", 5353, 0)];
        assert_eq!(
            commands("web", &plan(&current, &[udp], None, &none())),
            [
                "set server web/tsr-0f3c9a1e77b2-5353 state maint",
                "del server web/tsr-0f3c9a1e77b2-5353",
            ]
        );
    }

    #[test]
    fn port_name_picks_one_port_of_each_task() {
        let mut metrics = endpoint(TASK_A, "10.0.0.5", 32802, EndpointHealth::Healthy);
        metrics.port_name = Some("metrics".to_owned());
        let eps = [
            endpoint(TASK_A, "10.0.0.5", 32801, EndpointHealth::Healthy),
            metrics,
        ];
        assert_eq!(plan(&[], &eps, None, &none()).len(), 2);
        assert_eq!(
            commands("web", &plan(&[], &eps, Some("http"), &none()))[0],
            "add server web/tsr-0f3c9a1e77b2-32801 10.0.0.5:32801"
        );
        assert_eq!(plan(&[], &eps, Some("http"), &none()).len(), 1);
    }

    #[test]
    fn new_servers_come_before_removals() {
        let eps = [endpoint(TASK_B, "10.0.0.6", 2, EndpointHealth::Healthy)];
        let current = [server(&server_name(TASK_A, 1), "10.0.0.5", 1, 0)];
        let changes = plan(&current, &eps, None, &none());
        assert!(matches!(changes[0], Change::Add { .. }), "{changes:?}");
        assert!(matches!(changes[1], Change::Remove { .. }), "{changes:?}");
    }

    const STATE: &str = "1\n\
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n\
3 web 1 static 127.0.0.1 0 5 1 1 12 1 0 0 0 0 0 0 - 9 - 0 0 - - 0\n\
3 web 2 tsr-0f3c9a1e77b2-32801 10.0.0.5 2 0 1 1 3 1 0 0 0 0 0 0 - 32801 - 0 0 - - 0\n\
3 web 3 tsr-a1b2c3d4e5f6-32802 10.0.0.6 2 8 1 1 3 1 0 0 0 0 0 0 - 32802 - 0 0 - - 0\n\
3 web 4 h - 0 1 1 1 0 1 0 0 0 0 0 0 gpu-1.example 19002 - 0 0 - - 0\n\
\n";

    #[test]
    fn server_state_is_parsed_by_column_name() {
        let servers = parse_servers_state(STATE).expect("parses");
        assert_eq!(servers.len(), 4);
        assert_eq!(servers[0].name, "static");
        assert_eq!(servers[0].admin(), Admin::Maint);
        assert!(!servers[0].running);
        assert_eq!(
            servers[1],
            ServerState {
                name: "tsr-0f3c9a1e77b2-32801".into(),
                address: "10.0.0.5".into(),
                fqdn: None,
                port: 32801,
                admin_state: 0,
                running: true,
            }
        );
        assert_eq!(servers[1].admin(), Admin::Ready);
        assert_eq!(servers[2].admin(), Admin::Drain);
        assert_eq!(servers[3].address, "-");
        assert_eq!(servers[3].fqdn.as_deref(), Some("gpu-1.example"));
        assert!(servers[3].is_at("gpu-1.example", 19002));
        assert_eq!(servers[3].shown_address(), "gpu-1.example:19002");
    }

    #[test]
    fn an_empty_backend_and_an_error_answer() {
        let empty =
            "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_port\n\n";
        assert!(parse_servers_state(empty).expect("parses").is_empty());
        let err = parse_servers_state("Can't find backend.\n\n").expect_err("an error");
        assert!(err.to_string().contains("Can't find backend"), "{err}");
        // Without the `#` line, 2.6's columns are assumed.
        let bare = "1\n3 web 2 tsr-x 10.0.0.5 2 0 1 1 3 1 0 0 0 0 0 0 - 32801 -\n";
        assert_eq!(parse_servers_state(bare).expect("parses")[0].port, 32801);
    }

    #[test]
    fn only_data_lines_of_the_feed_are_changes() {
        assert!(live_line_is_change("data: change\n"));
        assert!(live_line_is_change("data: change\r\n"));
        assert!(!live_line_is_change(": keep-alive\n"));
        assert!(!live_line_is_change("\n"));
        assert!(!live_line_is_change("event: x\n"));
    }

    #[test]
    fn refusals_are_told_by_their_text() {
        assert!(Expect::Registered.accepts("New server registered.\n\n"));
        assert!(
            !Expect::Registered.accepts("Already exists a server with the same name in backend.\n")
        );
        assert!(Expect::Nothing.accepts("\n"));
        assert!(!Expect::Nothing.accepts("No such server.\n\n"));
        assert!(Expect::Deleted.accepts("Server deleted.\n"));
        assert!(Expect::Deleted.accepts("No such server.\n"));
        assert!(
            !Expect::Deleted
                .accepts("Server still has connections attached to it, cannot remove it.\n")
        );
        assert!(!Expect::Deleted.accepts("Only servers in maintenance mode can be deleted.\n"));
    }

    #[test]
    fn only_operator_errors_are_fatal() {
        let refused = |status| Exit {
            code: 1,
            message: "refused".into(),
            status: Some(status),
        };
        assert!(is_fatal(
            &anyhow::Error::new(refused(404)).context("reading")
        ));
        assert!(is_fatal(&anyhow::Error::from(Exit::new(2, "no backend"))));
        assert!(!is_fatal(&anyhow::Error::new(refused(503))));
        assert!(!is_fatal(&anyhow::anyhow!("cannot reach the server")));
    }

    #[test]
    fn backoff_grows_to_a_ceiling() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(100), Duration::from_secs(30));
    }

    #[test]
    fn backend_names_that_cannot_smuggle_a_command() {
        assert!(valid_backend("web"));
        assert!(valid_backend("be_chat.v2:x-1"));
        assert!(!valid_backend(""));
        assert!(!valid_backend("web; del server web/x"));
        assert!(!valid_backend("web\nshow info"));
    }
}
