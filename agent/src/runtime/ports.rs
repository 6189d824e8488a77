//! Host ports for tasks: fixed ones as the placement gave them, dynamic ones chosen from
//! the agent's range (`--port-range`, default 32768-60999). A dynamic port is one no task
//! of this agent holds, none released in the last minute (a load balancer may still send
//! it traffic meant for the task that had it), and free on the machine right now (several
//! simulated hosts, or other programs, share one machine): it is bound once to check.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};
use std::time::{Duration, Instant};
use tessera_model::agent::WantedTask;
use tessera_model::service::TaskPort;
use tessera_model::taskdef::Protocol;

/// How long a released port is not handed out again.
const QUARANTINE: Duration = Duration::from_secs(60);

/// The agent's dynamic range and what it has handed out.
#[derive(Debug)]
pub struct PortAllocator {
    range: (u16, u16),
    /// Ports released recently, with when.
    released: BTreeMap<(u16, Protocol), Instant>,
}

/// A task's ports could not be bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    #[error("no free host port for {protocol} in {from}-{to} (the agent's --port-range)", protocol = .protocol.as_str())]
    Exhausted {
        from: u16,
        to: u16,
        protocol: Protocol,
    },
    #[error("host port {port}/{protocol} is in use on this machine", protocol = .protocol.as_str())]
    InUse { port: u16, protocol: Protocol },
}

/// Whether `port` can be bound on every address right now.
pub fn free_on_machine(port: u16, protocol: Protocol) -> bool {
    let addr = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
    match protocol {
        Protocol::Tcp => TcpListener::bind(addr).is_ok(),
        Protocol::Udp => UdpSocket::bind(addr).is_ok(),
    }
}

impl PortAllocator {
    pub fn new(range: (u16, u16)) -> PortAllocator {
        PortAllocator {
            range: (range.0.min(range.1), range.0.max(range.1)),
            released: BTreeMap::new(),
        }
    }

    pub fn range(&self) -> (u16, u16) {
        self.range
    }

    /// Marks `ports` released now: not handed out again for a minute.
    pub fn release(&mut self, ports: &[TaskPort]) {
        let now = Instant::now();
        for p in ports {
            if let Some(h) = p.host_port {
                self.released.insert((h, p.protocol), now);
            }
        }
    }

    /// How many ports of the range are neither held (`held`) nor quarantined; what the
    /// agent reports so that placement stops sending tasks a host cannot give ports to.
    pub fn free_count(&mut self, held: &BTreeSet<(u16, Protocol)>) -> u32 {
        self.forget_old();
        let (from, to) = self.range;
        let size = u32::from(to - from) + 1;
        let taken = held
            .iter()
            .chain(self.released.keys())
            .filter(|(p, _)| (from..=to).contains(p))
            .map(|(p, _)| *p)
            .collect::<BTreeSet<u16>>()
            .len() as u32;
        size.saturating_sub(taken)
    }

    fn forget_old(&mut self) {
        self.released.retain(|_, at| at.elapsed() < QUARANTINE);
    }

    /// Host ports for every port of `w`: the ones the server already knows for it (its
    /// earlier report) and fixed ones as given; the rest from the range, none of `held`
    /// (ports this agent's other tasks hold), each free on the machine.
    pub fn bind(
        &mut self,
        w: &WantedTask,
        held: &BTreeSet<(u16, Protocol)>,
    ) -> Result<Vec<TaskPort>, PortError> {
        self.forget_old();
        let mut out = Vec::new();
        let mut mine: BTreeSet<(u16, Protocol)> = BTreeSet::new();
        for c in &w.containers {
            for p in &c.ports {
                let known = w
                    .bound_ports
                    .iter()
                    .find(|b| {
                        b.container == c.name
                            && b.container_port == p.container_port
                            && b.protocol == p.protocol
                    })
                    .and_then(|b| b.host_port);
                let fixed = p.host_port.or(w.host_network.then_some(p.container_port));
                let usable = |port: u16| {
                    !held.contains(&(port, p.protocol))
                        && !mine.contains(&(port, p.protocol))
                        && free_on_machine(port, p.protocol)
                };
                let host_port = match (fixed, known) {
                    (Some(port), _) if usable(port) => port,
                    (Some(port), _) => {
                        return Err(PortError::InUse {
                            port,
                            protocol: p.protocol,
                        });
                    }
                    (None, Some(port)) if usable(port) => port,
                    (None, _) => self.pick(&w.task_id, p.protocol, held, &mine)?,
                };
                mine.insert((host_port, p.protocol));
                out.push(TaskPort {
                    container: c.name.clone(),
                    name: p.name.clone(),
                    container_port: p.container_port,
                    host_port: Some(host_port),
                    protocol: p.protocol,
                });
            }
        }
        Ok(out)
    }

    /// A dynamic port: tried from a place that depends on the task (so agents sharing a
    /// machine rarely race for one), skipping held, quarantined and busy ones.
    fn pick(
        &self,
        task_id: &str,
        protocol: Protocol,
        held: &BTreeSet<(u16, Protocol)>,
        mine: &BTreeSet<(u16, Protocol)>,
    ) -> Result<u16, PortError> {
        let (from, to) = self.range;
        let size = u32::from(to - from) + 1;
        let start = task_id
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
            % size;
        for i in 0..size {
            let port = from + ((start + i) % size) as u16;
            let key = (port, protocol);
            if held.contains(&key) || mine.contains(&key) || self.released.contains_key(&key) {
                continue;
            }
            if free_on_machine(port, protocol) {
                return Ok(port);
            }
        }
        Err(PortError::Exhausted { from, to, protocol })
    }
}

/// The environment a process gets for its ports: `PORT` (its container's first port) and
/// `TESSERA_PORT_<NAME>` for every named port of the task.
pub fn port_environment(container: &str, ports: &[TaskPort]) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if let Some(first) = ports.iter().find(|p| p.container == container)
        && let Some(h) = first.host_port
    {
        env.insert("PORT".to_owned(), h.to_string());
    }
    for p in ports {
        if let (Some(name), Some(h)) = (&p.name, p.host_port) {
            env.insert(
                format!(
                    "TESSERA_PORT_{}",
                    name.to_ascii_uppercase().replace('-', "_")
                ),
                h.to_string(),
            );
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::agent::WantedContainer;
    use tessera_model::taskdef::PortSpec;

    fn wanted(id: &str, ports: Vec<PortSpec>) -> WantedTask {
        WantedTask {
            task_id: id.into(),
            containers: vec![WantedContainer {
                name: "main".into(),
                image: None,
                command: vec!["true".into()],
                entry_point_words: 0,
                cpu_milli: 0,
                memory_mib: 0,
                memory_soft: false,
                env: Default::default(),
                secrets: Default::default(),
                ports,
                security: Default::default(),
                health_check: None,
                essential: true,
                depends_on: vec![],
            }],
            mps: false,
            stop_timeout_secs: 1,
            host_network: false,
            bound_ports: vec![],
            work: None,
            draining: false,
        }
    }

    fn port(name: &str, container_port: u16, host_port: Option<u16>) -> PortSpec {
        PortSpec {
            name: Some(name.into()),
            container_port,
            host_port,
            protocol: Protocol::Tcp,
        }
    }

    #[test]
    fn dynamic_ports_skip_held_released_and_busy_ones() {
        // A range of three ports; one is held by another task, one is busy on the machine.
        let busy = TcpListener::bind("0.0.0.0:0").expect("bind");
        let b = busy.local_addr().expect("addr").port();
        let mut a = PortAllocator::new((b - 1, b + 1));
        let held: BTreeSet<_> = [(b - 1, Protocol::Tcp)].into();
        let got = a
            .bind(&wanted("t1", vec![port("http", 8000, None)]), &held)
            .expect("one is free");
        let chosen = got[0].host_port.expect("bound");
        if free_on_machine(b + 1, Protocol::Tcp) {
            assert_eq!(chosen, b + 1, "the only port neither held nor busy");
        }
        assert_eq!(a.free_count(&held), 2, "one held of three");
        // Released: quarantined, so the range is out of ports for the next task.
        a.release(&got);
        assert_eq!(a.free_count(&held), 1);
        let err = a
            .bind(&wanted("t2", vec![port("http", 8000, None)]), &held)
            .expect_err("exhausted");
        assert!(matches!(err, PortError::Exhausted { .. }), "{err}");
        assert!(err.to_string().contains("--port-range"), "{err}");
        drop(busy);
    }

    #[test]
    fn fixed_and_known_ports_are_kept_and_a_fixed_busy_one_is_refused() {
        let mut a = PortAllocator::new((40000, 40100));
        let mut w = wanted(
            "t",
            vec![port("http", 8000, None), port("metrics", 9100, None)],
        );
        // What the server already knows (an agent that lost its state file) is kept.
        w.bound_ports = vec![TaskPort {
            container: "main".into(),
            name: Some("http".into()),
            container_port: 8000,
            host_port: Some(40050),
            protocol: Protocol::Tcp,
        }];
        let got = a.bind(&w, &BTreeSet::new()).expect("binds");
        assert_eq!(got[0].host_port, Some(40050));
        assert_ne!(
            got[1].host_port,
            Some(40050),
            "two ports of one task differ"
        );
        let env = port_environment("main", &got);
        assert_eq!(env["PORT"], "40050");
        assert_eq!(
            env["TESSERA_PORT_METRICS"],
            got[1].host_port.expect("bound").to_string()
        );
        let busy = TcpListener::bind("0.0.0.0:0").expect("bind");
        let b = busy.local_addr().expect("addr").port();
        let err = a
            .bind(
                &wanted("u", vec![port("http", 8000, Some(b))]),
                &BTreeSet::new(),
            )
            .expect_err("in use");
        assert_eq!(
            err,
            PortError::InUse {
                port: b,
                protocol: Protocol::Tcp
            }
        );
    }
}
