//! How a task's process starts: in its cgroup, as its user, from its working directory;
//! and which user that is (the one its definition names, or a uid of its own from
//! `--task-uids`).
//!
//! The cgroup is joined in the child between `fork` and `exec`, before the task's program
//! runs: nothing it starts can be outside its cgroup, not even for a moment (writing the
//! pid after `spawn` would leave a window in which it forks and `setsid`s away). That hook
//! and the bpf(2) calls that attach a device program (`cgroup::devices`) are the only
//! unsafe code of this crate.

use nix::unistd::{Gid, Uid};
use std::path::PathBuf;

/// Where and as whom one process of a task starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Confinement {
    /// The `cgroup.procs` file of each cgroup it joins (one per hierarchy).
    pub(crate) procs: Vec<PathBuf>,
    /// The user and group it runs as (with no supplementary groups); `None`: the agent's.
    pub(crate) user: Option<(u32, u32)>,
    /// Where it starts; `None`: the agent's own working directory.
    pub(crate) cwd: Option<PathBuf>,
    /// Its `HOME`, replacing the agent's (a task of its own uid cannot write root's).
    pub(crate) home: Option<PathBuf>,
}

impl Confinement {
    /// Sets `cmd` up to start confined (after its environment is set: `HOME` is
    /// replaced): the cgroups' files are opened now (an error names the one that cannot
    /// be), and written in the child before it runs the program.
    #[allow(unsafe_code)]
    pub(crate) fn apply(&self, cmd: &mut tokio::process::Command) -> std::io::Result<()> {
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd);
        }
        if let Some(home) = &self.home {
            cmd.env("HOME", home);
        }
        // Even without a cgroup to join (or a user to take), the hook runs: the umask is
        // set for every task's process.
        let files = self
            .procs
            .iter()
            .map(|p| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(p)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))
            })
            .collect::<std::io::Result<Vec<std::fs::File>>>()?;
        let user = self
            .user
            .map(|(uid, gid)| (Uid::from_raw(uid), Gid::from_raw(gid)));
        let root = nix::unistd::geteuid().is_root();
        // SAFETY: the hook runs in the forked child, where only async-signal-safe calls
        // are allowed. It makes nothing but write(2), setgroups(2), setgid(2), setuid(2)
        // and umask(2) calls, on file descriptors and ids prepared before the fork, and
        // allocates nothing (its errors are raw OS errors). The files are close-on-exec.
        unsafe {
            cmd.pre_exec(move || enter(&files, user, root));
        }
        Ok(())
    }
}

/// In the child, between fork and exec: joins the cgroups (`0` is the writer itself),
/// then takes the task's user, then sets the umask. Joining first: the cgroups' files are the agent's, and a
/// kernel before 5.16 checks the writer's own rights when the pid is moved.
fn enter(files: &[std::fs::File], user: Option<(Uid, Gid)>, root: bool) -> std::io::Result<()> {
    use std::io::Write;
    for mut file in files {
        file.write_all(b"0")?;
    }
    if let Some((uid, gid)) = user {
        if root {
            // Not root's supplementary groups.
            nix::unistd::setgroups(&[])?;
        }
        nix::unistd::setgid(gid)?;
        nix::unistd::setuid(uid)?;
    }
    // What it creates in /tmp or /dev/shm is its own, not every other task's to read:
    // always, whether or not cgroups or uids of its own could be had.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    Ok(())
}

/// The user and group a process on the host runs as, from a definition's `user`: a uid
/// or a user name, optionally `:` a gid or group name (the user's own group otherwise).
/// Root, as user or group, is refused: a task's process on the host never runs as root.
pub(crate) fn resolve_user(spec: &str) -> Result<(u32, u32), String> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let (uid, primary) = match user.parse::<u32>() {
        Ok(uid) => {
            // A bare uid needs no account; with one, its group is the account's.
            let gid = nix::unistd::User::from_uid(Uid::from_raw(uid))
                .ok()
                .flatten()
                .map_or(uid, |u| u.gid.as_raw());
            (uid, gid)
        }
        Err(_) => {
            let u = nix::unistd::User::from_name(user)
                .map_err(|e| format!("user {user:?}: cannot look it up: {e}"))?
                .ok_or_else(|| format!("user {user:?}: no such user on this host"))?;
            (u.uid.as_raw(), u.gid.as_raw())
        }
    };
    let gid = match group {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => nix::unistd::Group::from_name(g)
                .map_err(|e| format!("group {g:?}: cannot look it up: {e}"))?
                .ok_or_else(|| format!("group {g:?}: no such group on this host"))?
                .gid
                .as_raw(),
        },
    };
    if uid == 0 {
        return Err(format!(
            "user {spec:?} is root: a container without an image runs on the host and never as root"
        ));
    }
    if gid == 0 {
        return Err(format!(
            "user {spec:?} runs with group root (gid 0): a container without an image runs on the host and never with root's group"
        ));
    }
    let me = nix::unistd::geteuid();
    if !me.is_root() && uid != me.as_raw() {
        return Err(format!(
            "user {spec:?}: this agent does not run as root and cannot start a process as another user"
        ));
    }
    Ok((uid, gid))
}

/// Whether `id` is already some account's uid or some group's gid on this host: a task
/// given it would share that account's files.
pub(crate) fn id_taken(id: u32) -> bool {
    nix::unistd::User::from_uid(Uid::from_raw(id))
        .ok()
        .flatten()
        .is_some()
        || nix::unistd::Group::from_gid(Gid::from_raw(id))
            .ok()
            .flatten()
            .is_some()
}

/// The uids of every live process: a uid one of them still has (a task's process that
/// outlived it where no cgroup could kill it) is not handed to a new task, which it could
/// then read.
pub(crate) fn uids_alive() -> std::collections::BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Default::default();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(process_uid)
        .collect()
}

/// The uid of process `pid` (its real uid), from `/proc`.
pub(crate) fn process_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_never_a_process_user() {
        for spec in ["0", "root", "0:0", "1000:0"] {
            let err = resolve_user(spec).expect_err(spec);
            assert!(err.contains("root"), "{spec}: {err}");
        }
        assert!(
            resolve_user("no-such-user-here")
                .expect_err("unknown")
                .contains("no such user")
        );
        if nix::unistd::geteuid().is_root() {
            assert_eq!(
                resolve_user("4321"),
                Ok((4321, 4321)),
                "a bare uid needs no account"
            );
            assert_eq!(resolve_user("4321:4322"), Ok((4321, 4322)));
        }
    }
}
