//! How an agent runs: its settings (`AgentConfig`), how tasks are kept apart
//! (`Isolation`), how containers with an image run, and the address it advertises.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use tessera_model::{MiB, MilliCpu, PoolName};

/// How an agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The control plane's base URL, e.g. `https://tessera.example:3000`, or several
    /// separated by commas: servers of one control plane (one database), used one at a
    /// time; when one does not answer, the next is tried at once.
    pub server: String,
    /// A PEM file of the CA (or self-signed certificate) that the server's certificate
    /// must chain to, for a private CA; the system's roots are trusted as well.
    pub ca_cert: Option<PathBuf>,
    /// Allow `http://` to a server that is not on loopback: tokens, commands and secrets
    /// would cross the network in clear.
    pub insecure_http: bool,
    /// Needed only until the agent has registered.
    pub join_token: Option<String>,
    pub state_dir: PathBuf,
    pub pool: PoolName,
    /// Suggested host id (the hostname by default).
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// CPU and memory to offer, when not all of this machine's (a simulated host's own
    /// size, or a reserve kept for the system).
    pub resources: Option<(MilliCpu, MiB)>,
    /// Simulated GPUs (`8xH100-80GB`) instead of NVML.
    pub simulate: Option<String>,
    /// The MPS control program. Unset: `nvidia-cuda-mps-control` on real GPUs, none on
    /// simulated ones (their MPS is simulated too and always healthy).
    pub mps_control: Option<PathBuf>,
    pub max_mps_restarts: u32,
    /// No MPS on real GPUs: they are time-shared, and no MPS limit holds (a host where MPS
    /// cannot run, or a check of what runs without it).
    pub no_mps: bool,
    /// Bytes per task log before it starts over.
    pub log_cap: u64,
    /// Stop every task when the agent exits (the demo); a real agent leaves them running
    /// and re-adopts them when it starts again.
    pub stop_tasks_on_exit: bool,
    /// Log directories of tasks this agent no longer has are deleted once untouched this long.
    pub log_retention: Duration,
    /// Run tasks as this user and group (uid, gid) instead of the agent's own.
    pub run_as: Option<(u32, u32)>,
    /// How containers that have an image run.
    pub containers: ContainerRuntime,
    /// The address tasks on this host are reached at (`--advertise-address`).
    pub advertise_address: Option<String>,
    /// Dynamic host ports come from this range (`--port-range`).
    pub port_range: (u16, u16),
    /// The provider's id of this machine (`--provider-id`, e.g. its EC2 instance id),
    /// said when it joins: how a pool's capacity provider knows the host it asked for.
    pub provider_id: Option<String>,
}

/// How tasks are kept apart on this host (`--task-uids`, `--cgroup-parent`,
/// `--task-pids-max`); applied with [`Agent::isolate`](super::Agent::isolate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    /// Each task runs as a uid of its own from this range, inclusive (and a group of the
    /// same number), unless its definition names a user. Needs root; takes precedence
    /// over `run_as`.
    pub task_uids: Option<(u32, u32)>,
    /// Each task runs in a cgroup of its own under this one (relative to the root of each
    /// cgroup hierarchy); `None`: no cgroups.
    pub cgroup_parent: Option<String>,
    /// The most processes and threads one task may have; 0: no limit.
    pub pids_max: u64,
}

impl Default for Isolation {
    fn default() -> Isolation {
        Isolation {
            task_uids: None,
            cgroup_parent: Some("tessera".into()),
            pids_max: crate::runtime::DEFAULT_PIDS_MAX,
        }
    }
}

/// This machine's primary address: the one a packet to the outside would leave from (a
/// UDP socket is connected, nothing is sent); loopback when there is no route.
pub fn primary_address() -> String {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("192.0.2.1:9")?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .ok()
        .filter(|ip| !ip.is_unspecified())
        .map_or_else(|| "127.0.0.1".to_owned(), |ip| ip.to_string())
}

/// How containers that have an image run (`--runtime`); one without an image always
/// runs as a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerRuntime {
    /// Images are refused: the task fails with the reason in its log.
    Process,
    /// Through the Docker engine on this socket; the agent does not start without it.
    Docker(PathBuf),
    /// Docker where this socket answers when the agent starts, else as `Process`.
    Auto(PathBuf),
}
