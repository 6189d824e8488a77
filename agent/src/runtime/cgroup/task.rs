//! A task's cgroup: its containers' cgroups with their CPU and memory limits, the
//! processes in it, killing them all at once, and removing it.

use super::{Controller, Hierarchy, Kill, Limits, cgroup_name, make_dir, write};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::path::{Path, PathBuf};

/// The CFS period CPU limits are given in: 100 ms, the kernel's default.
const PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts: 1 ms of each period.
const MIN_QUOTA_US: u64 = 1_000;
/// How deep the processes of a task's cgroup are looked for (its containers' cgroups, and
/// any a task running as root made inside them).
const MAX_DEPTH: usize = 8;

/// What a task's cgroup files say now, read back from the kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readback {
    /// The container's CPU quota per 100 ms period, in µs (`None`: no limit).
    pub cpu_quota_us: Option<u64>,
    /// The container's hard memory limit in bytes (`None`: no limit).
    pub memory_bytes: Option<u64>,
    /// The task's most processes and threads (`None`: no limit).
    pub pids_max: Option<u64>,
    /// How many forks the pid limit refused.
    pub pids_refused: u64,
}

/// A task's cgroup: its directory in each hierarchy (the one processes are listed from
/// first), with one inside for each of its containers that runs as a process.
#[derive(Debug, Clone)]
pub(crate) struct TaskCgroup {
    pub(super) homes: Vec<(PathBuf, Hierarchy)>,
    pub(super) kill: Kill,
}

impl std::fmt::Display for TaskCgroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.homes.first() {
            Some((dir, _)) => write!(f, "{}", dir.display()),
            None => f.write_str("(no cgroup)"),
        }
    }
}

impl TaskCgroup {
    /// Refuses the task every device node of `nodes` (the host's other GPUs): before its
    /// containers' cgroups are made, which inherit it. Through the v1 `devices` controller
    /// where the host has one, else a device program on its v2 cgroup; with neither,
    /// nothing (the agent said so when it started).
    pub(crate) fn deny_devices(&self, nodes: &[super::devices::Node]) -> Result<(), String> {
        if nodes.is_empty() {
            return Ok(());
        }
        if let Some((dir, _)) = self.homes.iter().find(|(_, h)| h.devices) {
            use std::io::Write;
            // One rule per write, as the kernel reads them.
            for n in nodes {
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(dir.join("devices.deny"))
                    .and_then(|mut f| f.write_all(format!("{n} rwm").as_bytes()))
                    .map_err(|e| format!("denying {n} in {}: {e}", dir.display()))?;
            }
            return Ok(());
        }
        match self.homes.iter().find(|(_, h)| h.v2) {
            Some((dir, _)) => super::devices::attach(dir, nodes),
            None => Ok(()),
        }
    }

    /// Creates (or finds) container `name`'s cgroup inside the task's, with its CPU and
    /// memory limits; returns the `cgroup.procs` files its processes join, one per
    /// hierarchy.
    pub(crate) fn container(&self, name: &str, limits: &Limits) -> Result<Vec<PathBuf>, String> {
        let leaf = cgroup_name(name);
        let mut procs = Vec::new();
        for (dir, h) in &self.homes {
            let dir = dir.join(&leaf);
            // The task's own directory is missing in a hierarchy the agent took up after
            // the task started (re-adopted across an upgrade): made on the way.
            if !dir.parent().is_some_and(Path::is_dir) {
                std::fs::create_dir_all(dir.parent().unwrap_or(&dir))
                    .map_err(|e| format!("creating {}: {e}", dir.display()))?;
            }
            make_dir(&dir)?;
            for c in &h.limits {
                match c {
                    Controller::Cpu if limits.cpu_milli > 0 => {
                        let quota = limits.cpu_milli.saturating_mul(100).max(MIN_QUOTA_US);
                        if h.v2 {
                            write(&dir.join("cpu.max"), &format!("{quota} {PERIOD_US}"))?;
                        } else {
                            write(&dir.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                            write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
                        }
                    }
                    // A reservation (ECS `memoryReservation`) is no hard limit.
                    Controller::Memory if limits.memory_mib > 0 && !limits.memory_soft => {
                        let bytes = limits.memory_mib.saturating_mul(1024 * 1024).to_string();
                        let file = if h.v2 {
                            "memory.max"
                        } else {
                            "memory.limit_in_bytes"
                        };
                        write(&dir.join(file), &bytes)?;
                    }
                    _ => {}
                }
            }
            procs.push(dir.join("cgroup.procs"));
        }
        Ok(procs)
    }

    /// The `cgroup.procs` files of container `name`'s cgroup, if it is there (a task
    /// re-adopted after a restart).
    pub(crate) fn container_procs(&self, name: &str) -> Option<Vec<PathBuf>> {
        let leaf = cgroup_name(name);
        let procs: Vec<PathBuf> = self
            .homes
            .iter()
            .map(|(dir, _)| dir.join(&leaf).join("cgroup.procs"))
            .collect();
        procs.iter().all(|p| p.is_file()).then_some(procs)
    }

    /// Every process in the task's cgroup, its containers' included.
    pub(crate) fn pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        if let Some((dir, _)) = self.homes.first() {
            collect_pids(dir, &mut pids, 0);
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Whether no process is left in it (a cgroup already removed is empty).
    pub(crate) fn is_empty(&self) -> bool {
        let Some((dir, h)) = self.homes.first() else {
            return true;
        };
        if h.v2
            && let Ok(events) = std::fs::read_to_string(dir.join("cgroup.events"))
        {
            return !events.lines().any(|l| l.trim() == "populated 1");
        }
        self.pids().is_empty()
    }

    /// Kills every process in it, wherever it moved among sessions and process groups.
    pub(crate) fn kill(&self) {
        let Some((dir, _)) = self.homes.first() else {
            return;
        };
        match self.kill {
            Kill::Whole => {
                if let Err(e) = std::fs::write(dir.join("cgroup.kill"), "1")
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(cgroup = %dir.display(), error = %e, "cannot kill a task's cgroup");
                }
            }
            Kill::Freeze2 => self.frozen(&dir.join("cgroup.freeze"), "1", "0"),
            Kill::Freezer1 => {
                if let Some((dir, _)) = self.homes.iter().find(|(_, h)| h.freezer) {
                    self.frozen(&dir.join("freezer.state"), "FROZEN", "THAWED");
                } else {
                    self.signal_all();
                }
            }
            Kill::Signal => self.signal_all(),
        }
    }

    /// Freezes the cgroup (no process of it forks meanwhile), sends SIGKILL to each of its
    /// processes, and thaws it so that they die.
    fn frozen(&self, file: &Path, freeze: &str, thaw: &str) {
        let froze = std::fs::write(file, freeze).is_ok();
        self.signal_all();
        if froze && let Err(e) = std::fs::write(file, thaw) {
            tracing::warn!(cgroup = %file.display(), error = %e, "cannot thaw a task's cgroup after killing it");
        }
    }

    fn signal_all(&self) {
        for pid in self.pids() {
            if let Ok(pid) = i32::try_from(pid)
                && pid > 0
            {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }

    /// Removes its directories (its containers' first); `Err` while a process is left in
    /// it (the kernel refuses) or the kernel has not let go of it yet.
    pub(crate) fn remove(&self) -> Result<(), String> {
        let mut failed = None;
        for (dir, _) in &self.homes {
            if let Err(e) = remove_tree(dir, 0) {
                failed.get_or_insert_with(|| format!("{}: {e}", dir.display()));
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Whether the kernel's OOM killer killed a process of container `name` at its memory
    /// limit, and that limit (MiB) where one is set: v2's `memory.events`, v1's
    /// `memory.oom_control` (Linux 4.13+), in its container's cgroup.
    pub(crate) fn oom_killed(&self, name: &str) -> Option<Option<u64>> {
        let leaf = cgroup_name(name);
        for (dir, h) in &self.homes {
            if !h.limits.contains(&Controller::Memory) {
                continue;
            }
            let dir = dir.join(&leaf);
            let (events, limit) = if h.v2 {
                ("memory.events", "memory.max")
            } else {
                ("memory.oom_control", "memory.limit_in_bytes")
            };
            let kills = std::fs::read_to_string(dir.join(events))
                .ok()
                .and_then(|s| oom_kills(&s))
                .unwrap_or(0);
            if kills > 0 {
                let mib = std::fs::read_to_string(dir.join(limit))
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    // v1 says "no limit" with the largest page-aligned number, v2 "max".
                    .filter(|b| *b < 1 << 62)
                    .map(|b| b / (1024 * 1024));
                return Some(mib);
            }
        }
        None
    }

    /// What its files say now, for container `name`.
    #[cfg(test)]
    pub(crate) fn readback(&self, name: &str) -> Readback {
        let leaf = cgroup_name(name);
        let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
        // v1 says "no memory limit" with the largest page-aligned number.
        let limit = |s: &str| s.parse::<u64>().ok().filter(|n| *n < 1 << 62);
        let mut back = Readback::default();
        for (dir, h) in &self.homes {
            for c in &h.limits {
                match (c, h.v2) {
                    (Controller::Cpu, true) => {
                        back.cpu_quota_us = read(dir.join(&leaf).join("cpu.max"))
                            .and_then(|s| s.split_whitespace().next().and_then(|q| q.parse().ok()));
                    }
                    (Controller::Cpu, false) => {
                        back.cpu_quota_us = read(dir.join(&leaf).join("cpu.cfs_quota_us"))
                            .and_then(|s| s.parse::<i64>().ok())
                            .and_then(|q| u64::try_from(q).ok());
                    }
                    (Controller::Memory, v2) => {
                        let file = if v2 {
                            "memory.max"
                        } else {
                            "memory.limit_in_bytes"
                        };
                        back.memory_bytes =
                            read(dir.join(&leaf).join(file)).and_then(|s| limit(&s));
                    }
                    (Controller::Pids, _) => {
                        back.pids_max = read(dir.join("pids.max")).and_then(|s| limit(&s));
                        back.pids_refused = read(dir.join("pids.events"))
                            .and_then(|s| {
                                s.lines().find_map(|l| {
                                    l.strip_prefix("max ").and_then(|n| n.trim().parse().ok())
                                })
                            })
                            .unwrap_or(0);
                    }
                }
            }
        }
        back
    }
}

fn collect_pids(dir: &Path, into: &mut Vec<u32>, depth: usize) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        into.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    if depth >= MAX_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_pids(&e.path(), into, depth + 1);
        }
    }
}

/// Removes a cgroup directory and the cgroups inside it, deepest first (a cgroup's own
/// files go with it; `rmdir` is all cgroupfs allows).
fn remove_tree(dir: &Path, depth: usize) -> std::io::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            if depth < MAX_DEPTH {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        remove_tree(&e.path(), depth + 1)?;
                    }
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The `oom_kill` count of a `memory.events` or `memory.oom_control` file.
pub(crate) fn oom_kills(file: &str) -> Option<u64> {
    file.lines().find_map(|l| {
        let (key, n) = l.split_once(' ')?;
        (key == "oom_kill").then(|| n.trim().parse().ok())?
    })
}
