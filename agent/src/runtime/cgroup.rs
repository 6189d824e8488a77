//! Cgroups: each task of this agent runs in a cgroup of its own, so that its CPU, memory
//! and pid limits hold, and so that stopping it kills every process it started, whatever
//! they did with `setsid`, double forks or new process groups (a process can leave its
//! process group and its session, never its cgroup).
//!
//! The host's layout is read once ([`Cgroups::detect`]): cgroup v2 alone (unified), v1
//! controllers with a v2 hierarchy beside them that holds no controller (hybrid, as on
//! older systemd hosts: v2 still tracks and kills processes), v1 alone, or nothing this
//! agent may write to (not root, a read-only `/sys`). Each limit is set in v2 where v2
//! has its controller, else in its v1 hierarchy.
//!
//! In every hierarchy used, the tree is `<--cgroup-parent>/<agent mark>/<task>/<container>`:
//! the agent's mark keeps two agents on one host (tests, the demo) from taking each other's
//! tasks for leftovers; the task's cgroup holds its pid limit, and each container that runs
//! as a process has a cgroup inside it with its CPU and memory limits (v2 lets processes
//! live only in leaves once controllers are handed down).

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// Where the host's cgroup hierarchies are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The CFS period CPU limits are given in: 100 ms, the kernel's default.
const PERIOD_US: u64 = 100_000;
/// The smallest quota the kernel accepts: 1 ms of each period.
const MIN_QUOTA_US: u64 = 1_000;
/// How deep the processes of a task's cgroup are looked for (its containers' cgroups, and
/// any a task running as root made inside them).
const MAX_DEPTH: usize = 8;

/// A controller whose limits the agent sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Controller {
    Cpu,
    Memory,
    Pids,
}

impl Controller {
    const ALL: [Controller; 3] = [Controller::Cpu, Controller::Memory, Controller::Pids];

    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Memory => "memory",
            Controller::Pids => "pids",
        }
    }
}

/// How the host's cgroups are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v2 alone, at the root (`cgroup.controllers` there).
    Unified,
    /// v1 controllers, and a v2 hierarchy at `<root>/unified` beside them.
    Hybrid,
    /// v1 alone.
    V1,
    /// Nothing this agent can use.
    None,
}

/// One hierarchy the agent's cgroups live in.
#[derive(Debug, Clone)]
struct Hierarchy {
    /// Its mount point.
    root: PathBuf,
    /// cgroup v2 (else v1).
    v2: bool,
    /// The limits it enforces.
    limits: Vec<Controller>,
    /// A v1 freezer: how a task is stopped from forking while it is killed.
    freezer: bool,
}

/// How every process of a task is killed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// v2's `cgroup.kill` (Linux 5.14): the kernel kills every process of the cgroup and
    /// its descendants, and none can fork its way out meanwhile.
    Whole,
    /// v2's `cgroup.freeze`: frozen, every process sent SIGKILL, thawed.
    Freeze2,
    /// The v1 freezer: frozen, every process sent SIGKILL, thawed.
    Freezer1,
    /// Every process sent SIGKILL, again at each poll until none is left (a process that
    /// forks as fast as it is killed is held by its pid limit).
    Signal,
}

/// The host's cgroups as this agent uses them.
#[derive(Debug, Clone)]
pub struct Cgroups {
    /// Where the hierarchies are mounted (`/sys/fs/cgroup`; a directory of one's own in
    /// tests).
    root: PathBuf,
    layout: Layout,
    hierarchies: Vec<Hierarchy>,
    /// The agent's cgroup in each hierarchy, relative to the hierarchy's root.
    parent: PathBuf,
    kill: Kill,
    /// Why cgroups cannot be used, or why a limit is not enforced.
    problems: Vec<String>,
}

/// What a container's cgroup is limited to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Thousandths of a core; 0: no limit.
    pub cpu_milli: u64,
    /// MiB; 0: no limit.
    pub memory_mib: u64,
    /// The memory is a reservation, not a limit: no hard limit is set.
    pub memory_soft: bool,
}

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

impl Cgroups {
    /// The host's cgroups (under `/sys/fs/cgroup`), with the agent's cgroup `parent` made
    /// ready in each hierarchy.
    pub fn detect(parent: &str) -> Cgroups {
        Cgroups::at(Path::new(CGROUP_ROOT), parent)
    }

    /// The cgroups mounted under `root`, with the agent's cgroup `parent` (a relative path:
    /// `tessera`, `system.slice/tessera-tasks`) made ready in each hierarchy.
    pub fn at(root: &Path, parent: &str) -> Cgroups {
        let mut cgroups = Cgroups {
            root: root.to_path_buf(),
            layout: Layout::None,
            hierarchies: Vec::new(),
            parent: PathBuf::new(),
            kill: Kill::Signal,
            problems: Vec::new(),
        };
        let parent = match relative_cgroup(parent) {
            Ok(p) => p,
            Err(why) => {
                cgroups.unusable(why);
                return cgroups;
            }
        };
        if root.join("cgroup.controllers").is_file() {
            cgroups.layout = Layout::Unified;
            cgroups.hierarchies.push(Hierarchy {
                root: root.to_path_buf(),
                v2: true,
                limits: available(&root.join("cgroup.controllers")),
                freezer: false,
            });
        } else {
            let unified = root.join("unified");
            let v2 = unified.join("cgroup.controllers").is_file();
            if v2 {
                let limits = available(&unified.join("cgroup.controllers"));
                cgroups.hierarchies.push(Hierarchy {
                    root: unified,
                    v2: true,
                    limits,
                    freezer: false,
                });
            }
            // The pids hierarchy first: the one processes are listed from when there is no
            // v2. The freezer only where v2 cannot freeze or kill.
            for (name, controller) in [
                ("pids", Some(Controller::Pids)),
                ("memory", Some(Controller::Memory)),
                ("cpu", Some(Controller::Cpu)),
                ("freezer", None),
            ] {
                let dir = root.join(name);
                if !dir.join("cgroup.procs").is_file() || (controller.is_none() && v2) {
                    continue;
                }
                if let Some(c) = controller
                    && cgroups.hierarchies.iter().any(|h| h.limits.contains(&c))
                {
                    continue;
                }
                // `cpu` is often a link to `cpu,cpuacct`: one hierarchy, used once.
                let dir = dir.canonicalize().unwrap_or(dir);
                if let Some(h) = cgroups
                    .hierarchies
                    .iter_mut()
                    .find(|h| !h.v2 && h.root == dir)
                {
                    h.limits.extend(controller);
                    h.freezer |= controller.is_none();
                    continue;
                }
                cgroups.hierarchies.push(Hierarchy {
                    root: dir,
                    v2: false,
                    limits: controller.into_iter().collect(),
                    freezer: controller.is_none(),
                });
            }
            let v1 = cgroups.hierarchies.iter().any(|h| !h.v2);
            cgroups.layout = match (v2, v1) {
                (true, _) => Layout::Hybrid,
                (false, true) => Layout::V1,
                (false, false) => Layout::None,
            };
        }
        if cgroups.hierarchies.is_empty() {
            cgroups.unusable(format!(
                "no cgroup hierarchy is mounted at {}",
                root.display()
            ));
            return cgroups;
        }
        cgroups.settle(parent);
        cgroups
    }

    /// The same cgroups with this agent's own cgroup inside the parent (named by its
    /// mark), made ready.
    pub(crate) fn for_agent(&self, mark: &str) -> Cgroups {
        let mut mine = self.clone();
        if mine.usable() {
            let parent = mine.parent.join(cgroup_name(mark));
            mine.settle(parent);
        }
        mine
    }

    /// Whether tasks can run in cgroups of their own.
    pub fn usable(&self) -> bool {
        self.layout != Layout::None
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether `controller`'s limits are set.
    pub fn enforces(&self, controller: Controller) -> bool {
        self.hierarchies
            .iter()
            .any(|h| h.limits.contains(&controller))
    }

    /// Whether cpu, memory and pid limits are all set.
    pub fn enforces_all(&self) -> bool {
        self.usable() && Controller::ALL.iter().all(|c| self.enforces(*c))
    }

    /// One line for the agent's log at start: what is enforced, and how.
    pub fn describe(&self) -> String {
        let names = |limits: &mut dyn Iterator<Item = Controller>| {
            let mut v: Vec<&str> = limits.map(Controller::name).collect();
            v.sort_unstable();
            v.dedup();
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(", ")
            }
        };
        let kill = match self.kill {
            Kill::Whole => "cgroup.kill",
            Kill::Freeze2 => "no cgroup.kill: a stop freezes the task, then kills each process",
            Kill::Freezer1 => "a stop freezes the task, then kills each process",
            Kill::Signal => "no freezer: a stop kills each process until none is left",
        };
        let v2 = self.hierarchies.iter().find(|h| h.v2);
        let mut line = match self.layout {
            Layout::None => {
                return format!(
                    "no cgroups writable ({}): tasks run without CPU/memory/pid limits and a task's escaped processes cannot be killed (run the agent as root on a host with cgroup v2)",
                    self.problems.join("; ")
                );
            }
            Layout::Unified => format!(
                "cgroup v2 (unified) at {} with {} ({kill})",
                self.root.display(),
                names(
                    &mut self
                        .hierarchies
                        .iter()
                        .flat_map(|h| h.limits.iter().copied())
                )
            ),
            Layout::Hybrid => {
                let mut v1: Vec<&str> = self
                    .hierarchies
                    .iter()
                    .filter(|h| !h.v2)
                    .flat_map(|h| h.limits.iter().map(|c| c.name()))
                    .collect();
                v1.sort_unstable();
                let own = v2.map(|h| h.limits.to_vec()).unwrap_or_default();
                format!(
                    "hybrid: v1 controllers {} + v2 at {}{} ({kill})",
                    if v1.is_empty() {
                        "none".to_owned()
                    } else {
                        v1.join(", ")
                    },
                    v2.map_or_else(String::new, |h| h.root.display().to_string()),
                    if own.is_empty() {
                        String::new()
                    } else {
                        format!(" with {}", names(&mut own.into_iter()))
                    }
                )
            }
            Layout::V1 => format!(
                "cgroup v1: controllers {}{} ({kill})",
                names(
                    &mut self
                        .hierarchies
                        .iter()
                        .flat_map(|h| h.limits.iter().copied())
                ),
                if self.hierarchies.iter().any(|h| h.freezer) {
                    ", freezer"
                } else {
                    ""
                }
            ),
        };
        let missing: Vec<&str> = Controller::ALL
            .iter()
            .filter(|c| !self.enforces(**c))
            .map(|c| c.name())
            .collect();
        if !missing.is_empty() {
            line.push_str(&format!(
                "; no {} controller: tasks run without {} limits",
                missing.join(", "),
                missing.join(", ")
            ));
        }
        for p in &self.problems {
            line.push_str("; ");
            line.push_str(p);
        }
        line
    }

    /// Gives up on cgroups, saying why.
    fn unusable(&mut self, why: String) {
        self.layout = Layout::None;
        self.hierarchies.clear();
        self.problems.push(why);
    }

    /// Makes `parent` the agent's cgroup in every hierarchy: created, and in v2 with the
    /// controllers of the limits handed down from the root to it (each cgroup gives its
    /// children only what it was given). A hierarchy where that fails keeps tracking and
    /// killing processes but sets none of those limits, and says so.
    fn settle(&mut self, parent: PathBuf) {
        self.parent = parent;
        let mut problems = Vec::new();
        let mut failed = None;
        for h in &mut self.hierarchies {
            let dir = h.root.join(&self.parent);
            if let Err(e) = std::fs::create_dir_all(&dir) {
                // Not root, or a read-only /sys (inside a container): nothing is usable.
                failed = Some(format!("cannot create {}: {e}", dir.display()));
                break;
            }
            if !h.v2 || h.limits.is_empty() {
                continue;
            }
            let line = enable_line(&h.limits);
            let mut level = h.root.clone();
            let mut levels = vec![level.clone()];
            for part in self.parent.components() {
                level.push(part);
                levels.push(level.clone());
            }
            for level in &levels {
                let file = level.join("cgroup.subtree_control");
                if let Err(e) = std::fs::write(&file, &line) {
                    problems.push(format!(
                        "cannot enable {} in {}: {e}",
                        line.trim(),
                        file.display()
                    ));
                    break;
                }
            }
            let enabled =
                std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
            let enabled: BTreeSet<&str> = enabled
                .split_whitespace()
                .map(|c| c.trim_start_matches('+'))
                .collect();
            h.limits.retain(|c| enabled.contains(c.name()));
        }
        if let Some(why) = failed {
            self.unusable(why);
            return;
        }
        self.problems.extend(problems);
        self.kill = match self.hierarchies.iter().find(|h| h.v2) {
            Some(h) if h.root.join(&self.parent).join("cgroup.kill").exists() => Kill::Whole,
            Some(h) if h.root.join(&self.parent).join("cgroup.freeze").exists() => Kill::Freeze2,
            _ if self.hierarchies.iter().any(|h| h.freezer) => Kill::Freezer1,
            _ => Kill::Signal,
        };
    }

    /// The cgroup task `task_id` has (or would have) here; nothing is created.
    pub(crate) fn task(&self, task_id: &str) -> TaskCgroup {
        self.named(&cgroup_name(task_id))
    }

    /// The task cgroup named `name` here (one of [`Cgroups::task_names`]).
    pub(crate) fn named(&self, name: &str) -> TaskCgroup {
        TaskCgroup {
            homes: self
                .hierarchies
                .iter()
                .map(|h| (h.root.join(&self.parent).join(name), h.clone()))
                .collect(),
            kill: self.kill,
        }
    }

    /// Creates task `task_id`'s cgroup in every hierarchy, with its pid limit (none for 0).
    pub(crate) fn create(&self, task_id: &str, pids_max: u64) -> Result<TaskCgroup, String> {
        let cgroup = self.task(task_id);
        let made = cgroup.homes.iter().try_for_each(|(dir, h)| {
            make_dir(dir)?;
            if h.v2 && !h.limits.is_empty() {
                // Its containers' cgroups get the controllers of their limits.
                write(&dir.join("cgroup.subtree_control"), &enable_line(&h.limits))?;
            }
            if h.limits.contains(&Controller::Pids) && pids_max > 0 {
                write(&dir.join("pids.max"), &pids_max.to_string())?;
            }
            Ok::<(), String>(())
        });
        match made {
            Ok(()) => Ok(cgroup),
            Err(why) => {
                let _ = cgroup.remove();
                Err(format!("cannot set up the task's cgroup: {why}"))
            }
        }
    }

    /// Task cgroups under this agent's, by name, in any hierarchy: those of its tasks, and
    /// leftovers of tasks it no longer has.
    pub(crate) fn task_names(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for h in &self.hierarchies {
            let Ok(entries) = std::fs::read_dir(h.root.join(&self.parent)) else {
                continue;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir())
                    && let Some(name) = e.file_name().to_str()
                {
                    names.insert(name.to_owned());
                }
            }
        }
        names
    }

    /// Removes this agent's cgroup (and the parent, when no other agent's is left), once
    /// empty; what still holds something stays.
    #[cfg(test)]
    pub(crate) fn remove_agent_cgroup(&self) {
        for h in &self.hierarchies {
            let mut dir = h.root.join(&self.parent);
            while dir != h.root && std::fs::remove_dir(&dir).is_ok() {
                if !dir.pop() {
                    break;
                }
            }
        }
    }
}

/// A task's cgroup: its directory in each hierarchy (the one processes are listed from
/// first), with one inside for each of its containers that runs as a process.
#[derive(Debug, Clone)]
pub(crate) struct TaskCgroup {
    homes: Vec<(PathBuf, Hierarchy)>,
    kill: Kill,
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
    /// Creates (or finds) container `name`'s cgroup inside the task's, with its CPU and
    /// memory limits; returns the `cgroup.procs` files its processes join, one per
    /// hierarchy.
    pub(crate) fn container(&self, name: &str, limits: &Limits) -> Result<Vec<PathBuf>, String> {
        let leaf = cgroup_name(name);
        let mut procs = Vec::new();
        for (dir, h) in &self.homes {
            let dir = dir.join(&leaf);
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

/// The cgroup name for a task id or container name: letters, digits, `_` and `-` (never
/// a `.`: the kernel's own files all have one). A name that had to change carries a hash
/// of the original, so two ids never share a cgroup.
pub(crate) fn cgroup_name(id: &str) -> String {
    let clean: String = id
        .chars()
        .take(180)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean == id && !clean.is_empty() {
        return clean;
    }
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut h);
    format!("{clean}-{:08x}", h.finish() as u32)
}

/// `--cgroup-parent`: a relative path of plain names.
pub fn relative_cgroup(parent: &str) -> Result<PathBuf, String> {
    let path = Path::new(parent.trim_matches('/'));
    let mut clean = PathBuf::new();
    for part in path.components() {
        match part {
            Component::Normal(name)
                if name.to_str().is_some_and(|n| {
                    n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
                }) =>
            {
                clean.push(name);
            }
            _ => {
                return Err(format!(
                    "--cgroup-parent {parent:?}: a cgroup path of names (letters, digits, '-', '_', '.', '@') separated by '/'"
                ));
            }
        }
    }
    if clean.as_os_str().is_empty() {
        return Err("--cgroup-parent is empty: tasks' cgroups need a parent of their own".into());
    }
    Ok(clean)
}

/// The controllers among cpu, memory and pids that a `cgroup.controllers` file lists.
fn available(file: &Path) -> Vec<Controller> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let listed: BTreeSet<&str> = text.split_whitespace().collect();
    Controller::ALL
        .into_iter()
        .filter(|c| listed.contains(c.name()))
        .collect()
}

/// What `cgroup.subtree_control` is written to hand `limits` down: `+cpu +memory +pids`.
fn enable_line(limits: &[Controller]) -> String {
    limits
        .iter()
        .map(|c| format!("+{}", c.name()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn make_dir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("creating {}: {e}", dir.display())),
    }
}

fn write(file: &Path, value: &str) -> Result<(), String> {
    std::fs::write(file, value).map_err(|e| format!("writing {value:?} to {}: {e}", file.display()))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path, text: &str) {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("dir");
        }
        std::fs::write(path, text).expect("write");
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_owned()
    }

    const LIMITS: Limits = Limits {
        cpu_milli: 500,
        memory_mib: 256,
        memory_soft: false,
    };

    #[test]
    fn a_unified_host_gets_its_controllers_handed_down_and_limits_in_v2_files() {
        let root = tempfile::tempdir().expect("dir");
        let root = root.path();
        touch(
            &root.join("cgroup.controllers"),
            "cpuset cpu io memory hugetlb pids\n",
        );
        // The kernel's own files of the agent's cgroup, as a real v2 has them.
        touch(&root.join("tessera/m1/cgroup.kill"), "");
        let cg = Cgroups::at(root, "tessera").for_agent("m1");
        assert_eq!(cg.layout(), Layout::Unified);
        assert!(cg.enforces_all(), "{}", cg.describe());
        assert_eq!(
            cg.describe(),
            format!(
                "cgroup v2 (unified) at {} with cpu, memory, pids (cgroup.kill)",
                root.display()
            )
        );
        for level in ["", "tessera", "tessera/m1"] {
            assert_eq!(
                read(&root.join(level).join("cgroup.subtree_control")),
                "+cpu +memory +pids",
                "{level}"
            );
        }
        let task = cg.create("svc-1", 64).expect("create");
        let dir = root.join("tessera/m1/svc-1");
        assert_eq!(read(&dir.join("pids.max")), "64");
        assert_eq!(
            read(&dir.join("cgroup.subtree_control")),
            "+cpu +memory +pids"
        );
        let procs = task.container("main", &LIMITS).expect("container");
        assert_eq!(procs, vec![dir.join("main/cgroup.procs")]);
        assert_eq!(read(&dir.join("main/cpu.max")), "50000 100000");
        assert_eq!(
            read(&dir.join("main/memory.max")),
            (256u64 << 20).to_string()
        );
        // A reservation is no hard limit.
        task.container(
            "soft",
            &Limits {
                memory_soft: true,
                ..LIMITS
            },
        )
        .expect("container");
        assert!(!dir.join("soft/memory.max").exists());
        task.kill();
        assert_eq!(read(&dir.join("cgroup.kill")), "1");
        assert_eq!(
            cg.task_names(),
            BTreeSet::from(["svc-1".to_owned()]),
            "the task's cgroup is found again after a restart"
        );
    }

    #[test]
    fn a_hybrid_host_sets_limits_in_v1_and_kills_through_the_unified_hierarchy() {
        let root = tempfile::tempdir().expect("dir");
        let root = root.path();
        touch(&root.join("unified/cgroup.controllers"), "hugetlb\n");
        touch(&root.join("unified/tessera/m1/cgroup.kill"), "");
        for c in ["cpu", "memory", "pids", "freezer", "blkio"] {
            touch(&root.join(c).join("cgroup.procs"), "");
        }
        let cg = Cgroups::at(root, "tessera").for_agent("m1");
        assert_eq!(cg.layout(), Layout::Hybrid);
        assert!(cg.enforces_all());
        assert_eq!(
            cg.describe(),
            format!(
                "hybrid: v1 controllers cpu, memory, pids + v2 at {} (cgroup.kill)",
                root.join("unified").display()
            )
        );
        let task = cg.create("t/1", 128).expect("create");
        let name = cgroup_name("t/1");
        assert!(name.starts_with("t_1-"), "{name}");
        assert_eq!(
            read(&root.join("pids/tessera/m1").join(&name).join("pids.max")),
            "128"
        );
        let procs = task.container("main", &LIMITS).expect("container");
        assert_eq!(procs.len(), 4, "unified, pids, memory and cpu: {procs:?}");
        let leaf = |c: &str| root.join(c).join("tessera/m1").join(&name).join("main");
        assert_eq!(read(&leaf("cpu").join("cpu.cfs_quota_us")), "50000");
        assert_eq!(read(&leaf("cpu").join("cpu.cfs_period_us")), "100000");
        assert_eq!(
            read(&leaf("memory").join("memory.limit_in_bytes")),
            (256u64 << 20).to_string()
        );
        assert!(
            !root.join("freezer/tessera").exists(),
            "v2 kills: no freezer needed"
        );
        task.kill();
        assert_eq!(
            read(
                &root
                    .join("unified/tessera/m1")
                    .join(&name)
                    .join("cgroup.kill")
            ),
            "1"
        );
    }

    #[test]
    fn a_v1_host_freezes_to_kill_and_a_tiny_cpu_share_gets_the_kernels_minimum() {
        let root = tempfile::tempdir().expect("dir");
        let root = root.path();
        for c in ["cpu", "memory", "pids", "freezer"] {
            touch(&root.join(c).join("cgroup.procs"), "");
        }
        let cg = Cgroups::at(root, "tessera").for_agent("m1");
        assert_eq!(cg.layout(), Layout::V1);
        assert!(
            cg.describe()
                .starts_with("cgroup v1: controllers cpu, memory, pids, freezer"),
            "{}",
            cg.describe()
        );
        let task = cg.create("t", 0).expect("create");
        assert!(
            !root.join("pids/tessera/m1/t/pids.max").exists(),
            "0: no pid limit"
        );
        task.container(
            "main",
            &Limits {
                cpu_milli: 1,
                ..Limits::default()
            },
        )
        .expect("container");
        assert_eq!(
            read(&root.join("cpu/tessera/m1/t/main/cpu.cfs_quota_us")),
            "1000"
        );
        assert!(
            !root
                .join("memory/tessera/m1/t/main/memory.limit_in_bytes")
                .exists()
        );
        task.kill();
        assert_eq!(
            read(&root.join("freezer/tessera/m1/t/freezer.state")),
            "THAWED"
        );
    }

    #[test]
    fn without_cgroups_the_agent_says_what_it_cannot_do() {
        let root = tempfile::tempdir().expect("dir");
        let cg = Cgroups::at(root.path(), "tessera");
        assert!(!cg.usable());
        let line = cg.describe();
        assert!(line.starts_with("no cgroups writable"), "{line}");
        assert!(
            line.contains("escaped processes cannot be killed"),
            "{line}"
        );
        assert!(!Cgroups::at(root.path(), "../etc").usable());
        assert!(relative_cgroup("system.slice/tessera-tasks").is_ok());
        assert!(relative_cgroup("a/../b").is_err());
        assert!(relative_cgroup("/").is_err());
    }

    #[test]
    fn names_keep_to_safe_characters_and_never_collide() {
        assert_eq!(cgroup_name("svc-1_a"), "svc-1_a");
        assert_ne!(cgroup_name("a.b"), cgroup_name("a_b"));
        assert!(!cgroup_name("cgroup.procs").contains('.'));
        assert!(!cgroup_name("").is_empty());
    }
}
