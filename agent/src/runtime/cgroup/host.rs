//! Reading the host's cgroup layout, making the agent's own cgroup ready in each
//! hierarchy (controllers handed down), and finding or creating task cgroups under it.

use super::task::TaskCgroup;
use super::{
    CGROUP_ROOT, Cgroups, Controller, GpuDevices, Hierarchy, Kill, Layout, cgroup_name, make_dir,
    relative_cgroup, write,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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
                devices: false,
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
                    devices: false,
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
                    devices: false,
                });
            }
            // Which device nodes a task may open: v1's controller wherever it is mounted.
            let devices = root.join("devices");
            if devices.join("devices.deny").is_file() {
                let dir = devices.canonicalize().unwrap_or(devices);
                match cgroups
                    .hierarchies
                    .iter_mut()
                    .find(|h| !h.v2 && h.root == dir)
                {
                    Some(h) => h.devices = true,
                    None => cgroups.hierarchies.push(Hierarchy {
                        root: dir,
                        v2: false,
                        limits: Vec::new(),
                        freezer: false,
                        devices: true,
                    }),
                }
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
                    "no cgroups writable ({}): tasks run without CPU/memory/pid limits, a task's escaped processes cannot be killed and a process task can open every GPU's device node (run the agent as root on a host with cgroup v2)",
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
        line.push_str(match self.gpu_devices() {
            GpuDevices::V1 => "; GPU devices: each task its own (v1 devices controller)",
            GpuDevices::Program => "; GPU devices: each task its own (v2 device programs)",
            GpuDevices::None => {
                "; GPU devices: not enforced (no cgroup to hold the rules): a process task can open every GPU's device node"
            }
        });
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

    /// How a task is kept to its own GPUs' device nodes here.
    pub fn gpu_devices(&self) -> GpuDevices {
        if !self.usable() {
            GpuDevices::None
        } else if self.hierarchies.iter().any(|h| h.devices) {
            GpuDevices::V1
        } else if self.hierarchies.iter().any(|h| h.v2) {
            GpuDevices::Program
        } else {
            GpuDevices::None
        }
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
