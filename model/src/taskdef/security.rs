//! How a container may run: ECS's `user`, `privileged`, `readonlyRootFilesystem` and
//! `linuxParameters.capabilities`, kept in the container's `ecs` as given and read here,
//! so that none of them is stored and then ignored.

use super::rules::Checker;
use super::*;

/// Linux capabilities a definition may add or drop, without the `CAP_` prefix (as Docker
/// and ECS name them).
pub const CAPABILITIES: &[&str] = &[
    "AUDIT_CONTROL",
    "AUDIT_READ",
    "AUDIT_WRITE",
    "BLOCK_SUSPEND",
    "BPF",
    "CHECKPOINT_RESTORE",
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "IPC_LOCK",
    "IPC_OWNER",
    "KILL",
    "LEASE",
    "LINUX_IMMUTABLE",
    "MAC_ADMIN",
    "MAC_OVERRIDE",
    "MKNOD",
    "NET_ADMIN",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_RAW",
    "PERFMON",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYSLOG",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_CHROOT",
    "SYS_MODULE",
    "SYS_NICE",
    "SYS_PACCT",
    "SYS_PTRACE",
    "SYS_RAWIO",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "WAKE_ALARM",
];

/// Capabilities a container may add in any pool: Docker's default set without `NET_RAW`,
/// none of which reaches past the container. The network ones ([`NETWORK_CAPABILITIES`])
/// need a pool that allows host networking; any other (`SYS_ADMIN`, `SYS_MODULE`,
/// `DAC_READ_SEARCH`, `SYS_PTRACE`, ...) is a way onto the host, and needs a pool that
/// allows privileged containers.
pub const UNPRIVILEGED_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Capabilities that act on a network (raw sockets see every packet of the namespace,
/// `NET_ADMIN` reconfigures it): a pool that allows host networking allows them.
pub const NETWORK_CAPABILITIES: &[&str] = &["NET_RAW", "NET_ADMIN"];

/// What a container asks of the host's security, read from its ECS fields. The default
/// (nothing asked) runs it as the task's own uid, unprivileged, every capability dropped.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSecurity {
    /// ECS `user`: `uid`, `uid:gid`, `name` or `name:group`. `None`: the agent gives the
    /// task a uid of its own. Naming one needs a pool that allows it (`task_users`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// ECS `privileged`: needs a pool that allows it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub privileged: bool,
    /// ECS `readonlyRootFilesystem`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub readonly_root_filesystem: bool,
    /// `linuxParameters.capabilities.add`: kept, of what would otherwise all be dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cap_add: Vec<String>,
}

impl ContainerSecurity {
    pub fn is_default(&self) -> bool {
        *self == ContainerSecurity::default()
    }

    /// What `pool`'s settings refuse of it: each field with what the pool lacks.
    pub fn refused_by(&self, pool: &crate::inventory::PoolInfo) -> Vec<(&'static str, String)> {
        let privileged = pool.privileged;
        let mut refused = Vec::new();
        if self.user.is_some() && !pool.task_users {
            refused.push(("user", "the pool does not let tasks choose their user (pool setting task_users); without it each task runs as a uid of its own".to_owned()));
        }
        if self.privileged && !privileged {
            refused.push((
                "privileged",
                "the pool does not allow privileged containers (pool setting privileged)"
                    .to_owned(),
            ));
        }
        let escalating: Vec<&str> = self
            .cap_add
            .iter()
            .map(String::as_str)
            .filter(|c| !UNPRIVILEGED_CAPABILITIES.contains(c))
            .filter(|c| !(pool.host_network && NETWORK_CAPABILITIES.contains(c)))
            .collect();
        if !escalating.is_empty() && !privileged {
            refused.push((
                "linuxParameters.capabilities.add",
                if escalating.iter().all(|c| NETWORK_CAPABILITIES.contains(c)) {
                    format!(
                        "{} act on the host's network: the pool does not allow host networking (pool setting host_network)",
                        escalating.join(", ")
                    )
                } else {
                    format!(
                        "{} reach past the container: the pool does not allow privileged containers (pool setting privileged)",
                        escalating.join(", ")
                    )
                },
            ));
        }
        refused
    }
}

/// A `user` as Docker and ECS take it: a name or number, optionally `:` a group.
fn valid_user(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty()
            && p.len() <= 32
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    match s.split_once(':') {
        Some((u, g)) => part(u) && part(g),
        None => part(s),
    }
}

impl ContainerSpec {
    /// Its security settings; what [`check_security`] accepted reads without loss.
    pub fn security(&self) -> ContainerSecurity {
        let caps = |key: &str| -> Vec<String> {
            self.ecs
                .get("linuxParameters")
                .and_then(|l| l.get("capabilities"))
                .and_then(|c| c.get(key))
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(|s| s.trim_start_matches("CAP_").to_ascii_uppercase())
                        .collect()
                })
                .unwrap_or_default()
        };
        let flag = |key: &str| self.ecs.get(key).and_then(Value::as_bool).unwrap_or(false);
        // Dropping is what happens to every capability not added; an add that is also
        // dropped is not kept.
        let drop = caps("drop");
        let all_dropped = drop.iter().any(|c| c == "ALL");
        ContainerSecurity {
            user: self
                .ecs
                .get("user")
                .and_then(Value::as_str)
                .map(str::to_owned),
            privileged: flag("privileged"),
            readonly_root_filesystem: flag("readonlyRootFilesystem"),
            cap_add: caps("add")
                .into_iter()
                .filter(|c| !all_dropped && !drop.contains(c))
                .collect(),
        }
    }
}

/// Checks the security fields of container `i`: wrong types and unknown capabilities are
/// errors that name the field, never ignored.
pub(super) fn check_security(c: &mut Checker, p: &str, ct: &ContainerSpec) {
    match ct.ecs.get("user") {
        None | Some(Value::Null) => {}
        Some(Value::String(u)) if valid_user(u) => {
            if matches!(ct.gpu, Some(GpuRequirement::Mps { .. })) {
                // MPS serves one Linux user at a time: a client of another user waits
                // until every client of the running server is done.
                c.err(
                    format!("{p}.user"),
                    "a container sharing a GPU through MPS runs as the host's MPS user (MPS serves one Linux user at a time); remove user",
                );
            } else if ct.image.is_none() && u.contains(':') {
                // A process runs as a user's primary group; a group of its own is a
                // container's.
                c.err(
                    format!("{p}.user"),
                    "a container without an image runs as a user name or uid, without ':group'",
                );
            }
        }
        Some(v) => c.err(
            format!("{p}.user"),
            format!(
                "must be a user name or uid, optionally ':' a group (\"1000\", \"1000:1000\", \"app\"); got {}",
                if v.is_string() { v.to_string() } else { rules::kind(v).to_string() }
            ),
        ),
    }
    for key in ["privileged", "readonlyRootFilesystem"] {
        match ct.ecs.get(key) {
            None | Some(Value::Null) | Some(Value::Bool(_)) => {}
            Some(v) => c.err(
                format!("{p}.{key}"),
                format!("must be true or false, got {}", rules::kind(v)),
            ),
        }
    }
    if ct.image.is_none() {
        for key in ["privileged", "readonlyRootFilesystem"] {
            if ct.ecs.get(key).and_then(Value::as_bool) == Some(true) {
                c.err(
                    format!("{p}.{key}"),
                    "applies to containers with an image; a process on the host has neither",
                );
            }
        }
    }
    let Some(lp) = ct.ecs.get("linuxParameters") else {
        return;
    };
    let Some(caps) = lp.get("capabilities") else {
        return;
    };
    let Some(caps) = caps.as_object() else {
        c.err(
            format!("{p}.linuxParameters.capabilities"),
            format!(
                "must be an object with add and drop, got {}",
                rules::kind(caps)
            ),
        );
        return;
    };
    for (key, v) in caps {
        let f = format!("{p}.linuxParameters.capabilities.{key}");
        if key != "add" && key != "drop" {
            c.err(f, "is not a capabilities field (add, drop)");
            continue;
        }
        let Some(list) = v.as_array() else {
            c.err(
                f,
                format!("must be a list of capability names, got {}", rules::kind(v)),
            );
            continue;
        };
        for (j, cap) in list.iter().enumerate() {
            let name = cap
                .as_str()
                .map(|s| s.trim_start_matches("CAP_").to_ascii_uppercase());
            match name {
                Some(n) if CAPABILITIES.contains(&n.as_str()) => {
                    if ct.image.is_none() && key == "add" {
                        c.err(
                            format!("{f}[{j}]"),
                            "a process on the host runs without capabilities; adding one needs a container with an image",
                        );
                    }
                }
                Some(n) if n == "ALL" && key == "drop" => {}
                _ => c.err(
                    format!("{f}[{j}]"),
                    format!("{cap} is not a Linux capability (e.g. NET_BIND_SERVICE, SYS_PTRACE)"),
                ),
            }
        }
    }
}
