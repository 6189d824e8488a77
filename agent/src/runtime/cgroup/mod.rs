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
//! A task may open the device nodes of its own GPUs only ([`devices`]): through the v1
//! `devices` controller where the host has one, else a v2 device program.
//!
//! In every hierarchy used, the tree is `<--cgroup-parent>/<agent mark>/<task>/<container>`:
//! the agent's mark keeps two agents on one host (tests, the demo) from taking each other's
//! tasks for leftovers; the task's cgroup holds its pid limit, and each container that runs
//! as a process has a cgroup inside it with its CPU and memory limits (v2 lets processes
//! live only in leaves once controllers are handed down).

pub mod devices;
mod host;
mod task;

pub use task::Readback;
pub(crate) use task::TaskCgroup;

use std::path::{Component, Path, PathBuf};

/// Where the host's cgroup hierarchies are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

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
    /// The v1 `devices` controller: which device nodes a task may open.
    devices: bool,
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

/// How a task is kept to its own GPUs' device nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuDevices {
    /// The v1 `devices` controller's `devices.deny`.
    V1,
    /// A v2 device program attached to each task's cgroup.
    Program,
    /// Not at all: no cgroup holds the rules.
    None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

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
                "cgroup v2 (unified) at {} with cpu, memory, pids (cgroup.kill); GPU devices: each task its own (v2 device programs)",
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
                "hybrid: v1 controllers cpu, memory, pids + v2 at {} (cgroup.kill); GPU devices: each task its own (v2 device programs)",
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
        for c in ["cpu", "memory", "pids", "freezer", "devices"] {
            touch(&root.join(c).join("cgroup.procs"), "");
        }
        touch(&root.join("devices/devices.deny"), "");
        let cg = Cgroups::at(root, "tessera").for_agent("m1");
        assert_eq!(cg.layout(), Layout::V1);
        assert_eq!(cg.gpu_devices(), GpuDevices::V1);
        assert!(
            cg.describe()
                .contains("GPU devices: each task its own (v1 devices controller)"),
            "{}",
            cg.describe()
        );
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
        // The other GPUs' nodes refused, one rule a line, before any container's cgroup.
        task.deny_devices(&[
            devices::Node {
                major: 195,
                minor: 0,
            },
            devices::Node {
                major: 195,
                minor: 2,
            },
        ])
        .expect("denied");
        assert_eq!(
            read(&root.join("devices/tessera/m1/t/devices.deny")),
            "c 195:0 rwmc 195:2 rwm"
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
        assert_eq!(cg.gpu_devices(), GpuDevices::None);
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
