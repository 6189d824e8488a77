//! What `/proc` says: process groups and their leaders' start times, the processes that
//! carry this agent's mark, and this boot's id.

use super::*;

/// What `/proc` shows of one process group.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Group {
    /// Its live (not zombie) processes.
    pub(super) live: usize,
    /// When its leader (the process whose id is the group's) started, in clock ticks
    /// since boot; `None` while the leader is gone and others of the group live on.
    pub(super) leader_start: Option<u64>,
}

pub(super) type Groups = std::collections::HashMap<i32, Group>;

/// Live process groups, read once per poll from `/proc`.
pub(super) fn live_groups() -> Groups {
    let mut groups = Groups::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return groups;
    };
    for pid in dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        if let Some(stat) = proc_stat(pid)
            && stat.state != 'Z'
        {
            let group = groups.entry(stat.pgrp).or_default();
            group.live += 1;
            if i64::from(pid) == i64::from(stat.pgrp) {
                group.leader_start = Some(stat.start);
            }
        }
    }
    groups
}

/// The live processes of some process groups and of some cgroups, found in one pass over
/// `/proc`: what a task's GPU use is summed over.
#[derive(Debug, Default)]
pub(super) struct Members {
    /// By process group.
    pub(super) groups: HashMap<i32, Vec<u32>>,
    /// By the text of `/proc/<pid>/cgroup` (a container's main process's).
    pub(super) cgroups: HashMap<String, Vec<u32>>,
}

/// The cgroup membership of a process, as `/proc/<pid>/cgroup` says it.
pub(super) fn cgroup_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()
}

/// Every live process of the process groups `groups` and of the cgroups `cgroups` (each
/// as `/proc/<pid>/cgroup` of one of its processes reads). A cgroup the agent itself is
/// in names no container of its own (a stand-in engine, a process not in one): left out.
pub(super) fn members(groups: &BTreeSet<i32>, cgroups: &BTreeSet<String>) -> Members {
    let mut found = Members::default();
    if groups.is_empty() && cgroups.is_empty() {
        return found;
    }
    let own = cgroup_of(std::process::id());
    let cgroups: BTreeSet<&String> = cgroups
        .iter()
        .filter(|c| Some(*c) != own.as_ref())
        .collect();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for pid in dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let Some(stat) = proc_stat(pid).filter(|s| s.state != 'Z') else {
            continue;
        };
        if groups.contains(&stat.pgrp) {
            found.groups.entry(stat.pgrp).or_default().push(pid);
        }
        if !cgroups.is_empty()
            && let Some(c) = cgroup_of(pid).filter(|c| cgroups.contains(c))
        {
            found.cgroups.entry(c).or_default().push(pid);
        }
    }
    found
}

/// What `/proc/<pid>/stat` says of a process.
pub(super) struct Stat {
    pub(super) state: char,
    pub(super) pgrp: i32,
    /// Clock ticks after boot when it started: with the boot id, a process's identity,
    /// which its id alone is not (ids are reused).
    pub(super) start: u64,
}

pub(super) fn proc_stat(pid: u32) -> Option<Stat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // Fields from `state` on: state(0) ppid(1) pgrp(2) ... starttime(19).
    Some(Stat {
        state: fields.first()?.chars().next()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// When the leader of group `pgid` started, if it is alive and leads that group.
pub(super) fn group_born(pgid: i32) -> Option<u64> {
    let stat = proc_stat(u32::try_from(pgid).ok()?)?;
    (stat.pgrp == pgid).then_some(stat.start)
}

/// Processes that carry `mark` in their environment, by task: their process groups and
/// the environment of one of them.
pub(super) fn marked_processes(
    mark: &str,
) -> BTreeMap<String, (BTreeSet<i32>, BTreeMap<String, String>)> {
    let mut found: BTreeMap<String, (BTreeSet<i32>, BTreeMap<String, String>)> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for pid in dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let Some(Stat { state, pgrp, .. }) = proc_stat(pid) else {
            continue;
        };
        if state == 'Z' {
            continue;
        }
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let env: BTreeMap<String, String> = raw
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = std::str::from_utf8(kv).ok()?;
                let (k, v) = kv.split_once('=')?;
                Some((k.to_owned(), v.to_owned()))
            })
            .collect();
        if env.get(AGENT_MARK).map(String::as_str) != Some(mark) {
            continue;
        }
        let Some(task) = env.get(TASK_ID).cloned() else {
            continue;
        };
        let entry = found.entry(task).or_insert_with(|| (BTreeSet::new(), env));
        entry.0.insert(pgrp);
    }
    found
}

/// This agent's mark: a hash of its state directory's canonical path.
pub(super) fn agent_mark(state_dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let path = state_dir
        .canonicalize()
        .unwrap_or_else(|_| state_dir.to_path_buf());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// This boot of the machine (`/proc/sys/kernel/random/boot_id`).
pub(super) fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
}
