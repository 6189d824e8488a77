//! `tessera-agent check`: every prerequisite of running the agent on this host, each
//! with a verdict and what to do, before the host joins: the driver and NVML, the GPUs'
//! compute mode, the MPS control program, root and the tasks' uids, the cgroup layout and
//! controllers, Docker with the NVIDIA runtime (where containers are used), and each
//! server reachable with its certificate trusted. It changes nothing on the host.

use crate::agent::{AgentConfig, ContainerRuntime};
use crate::probe::{GpuProbe, Inventory, NvmlProbe, SimulatedProbe};
use crate::runtime::cgroup::{Cgroups, GpuDevices};
use std::path::{Path, PathBuf};

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// The agent runs, with less than it could (said what).
    Warn,
    /// The agent cannot run as configured.
    Fail,
    /// Not used as configured (`--no-mps`, simulated GPUs, process tasks only).
    Skipped,
}

/// One prerequisite and its verdict; `detail` says what was found and, unless it is
/// fine, what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub what: &'static str,
    pub verdict: Verdict,
    pub detail: String,
}

fn found(what: &'static str, verdict: Verdict, detail: impl Into<String>) -> Finding {
    Finding {
        what,
        verdict,
        detail: detail.into(),
    }
}

/// What the checks are told besides the agent's configuration.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The uids tasks get (`--task-uids`, or the default as root).
    pub task_uids: Option<(u32, u32)>,
    /// The agent's cgroup (`--cgroup-parent`).
    pub cgroup_parent: String,
    /// Where account names and uids are listed (`/etc/passwd`).
    pub passwd: PathBuf,
}

/// Every check, in the order an operator fixes them.
pub async fn check(config: &AgentConfig, options: &CheckOptions) -> Vec<Finding> {
    let mut findings = gpus(config);
    findings.push(mps(config));
    findings.push(root());
    findings.push(task_uids(options));
    findings.extend(cgroups(&options.cgroup_parent));
    findings.extend(containers(&config.containers).await);
    findings.extend(servers(config).await);
    findings
}

/// The findings as lines (`ok    gpus: …`), and whether the agent can run (no `FAIL`).
pub fn report(findings: &[Finding]) -> (String, bool) {
    let mut text = String::new();
    for f in findings {
        let tag = match f.verdict {
            Verdict::Ok => "ok  ",
            Verdict::Warn => "warn",
            Verdict::Fail => "FAIL",
            Verdict::Skipped => "skip",
        };
        text.push_str(&format!("{tag}  {}: {}\n", f.what, f.detail));
    }
    let can_run = findings.iter().all(|f| f.verdict != Verdict::Fail);
    text.push_str(if can_run {
        "the agent can run on this host\n"
    } else {
        "the agent cannot run on this host as configured: fix what says FAIL\n"
    });
    (text, can_run)
}

/// The driver and NVML, and each GPU's compute and MIG modes.
fn gpus(config: &AgentConfig) -> Vec<Finding> {
    if let Some(spec) = &config.simulate {
        return match SimulatedProbe::parse(spec, &config.name).and_then(|mut p| p.inventory()) {
            Ok(inv) => vec![found(
                "gpus",
                Verdict::Skipped,
                format!(
                    "simulated ({} GPUs from --simulate {spec}): NVML not used",
                    inv.gpus.len()
                ),
            )],
            Err(e) => vec![found(
                "gpus",
                Verdict::Fail,
                format!("--simulate {spec}: {e}"),
            )],
        };
    }
    let inventory = NvmlProbe::new().and_then(|mut p| p.inventory());
    match inventory {
        Err(e) => vec![found(
            "gpus",
            Verdict::Fail,
            format!(
                "{e}. Install the NVIDIA driver (it provides libnvidia-ml.so.1); `nvidia-smi` must list the GPUs"
            ),
        )],
        Ok(inv) if inv.gpus.is_empty() => vec![found(
            "gpus",
            Verdict::Fail,
            "NVML answers but finds no GPU: check `nvidia-smi`",
        )],
        Ok(inv) => gpu_findings(&inv),
    }
}

fn gpu_findings(inv: &Inventory) -> Vec<Finding> {
    let models: Vec<String> = inv
        .gpus
        .iter()
        .map(|g| format!("{} {}", g.index, g.model))
        .collect();
    let mut out = vec![found(
        "gpus",
        Verdict::Ok,
        format!(
            "{} GPUs ({}); driver {}, CUDA {}",
            inv.gpus.len(),
            models.join(", "),
            inv.driver_version.as_deref().unwrap_or("?"),
            inv.cuda_version.as_deref().unwrap_or("?")
        ),
    )];
    let unhealthy: Vec<String> = inv
        .gpus
        .iter()
        .filter(|g| !g.healthy)
        .map(|g| g.index.to_string())
        .collect();
    if !unhealthy.is_empty() {
        out.push(found(
            "gpu health",
            Verdict::Warn,
            format!(
                "GPU {} reported unhealthy (XID errors or lost): no task is placed on it",
                unhealthy.join(", ")
            ),
        ));
    }
    let shared: Vec<String> = inv
        .gpus
        .iter()
        .filter(|g| {
            g.compute_mode
                .as_deref()
                .is_some_and(|m| m != "ExclusiveProcess")
        })
        .map(|g| format!("{} ({})", g.index, g.compute_mode.as_deref().unwrap_or("?")))
        .collect();
    out.push(if shared.is_empty() {
        found("compute mode", Verdict::Ok, "every GPU is EXCLUSIVE_PROCESS, as MPS wants")
    } else {
        found(
            "compute mode",
            Verdict::Warn,
            format!(
                "GPU {} not EXCLUSIVE_PROCESS: processes outside MPS can share it too. As root: nvidia-smi -i INDEX -c EXCLUSIVE_PROCESS",
                shared.join(", ")
            ),
        )
    });
    let mig: Vec<String> = inv
        .gpus
        .iter()
        .filter(|g| g.mig_enabled == Some(true))
        .map(|g| g.index.to_string())
        .collect();
    if !mig.is_empty() {
        out.push(found(
            "mig",
            Verdict::Warn,
            format!("GPU {} has MIG on: MPS shares whole GPUs here; turn MIG off (nvidia-smi -i INDEX -mig 0)", mig.join(", ")),
        ));
    }
    out
}

/// The MPS control program, where the agent would start it.
fn mps(config: &AgentConfig) -> Finding {
    if config.no_mps {
        return found(
            "mps",
            Verdict::Skipped,
            "--no-mps: tasks share GPUs without MPS limits",
        );
    }
    let program = match (&config.mps_control, config.simulate.is_some()) {
        (Some(p), _) => p.clone(),
        (None, true) => return found("mps", Verdict::Skipped, "simulated GPUs: no MPS daemon"),
        (None, false) => PathBuf::from("nvidia-cuda-mps-control"),
    };
    match find_program(&program) {
        Some(at) => found(
            "mps",
            Verdict::Ok,
            format!("{} found at {}", program.display(), at.display()),
        ),
        None => found(
            "mps",
            Verdict::Fail,
            format!(
                "{} not found: install it (the NVIDIA driver's utilities or the CUDA toolkit), name it with --mps-control PATH, or run without MPS (--no-mps)",
                program.display()
            ),
        ),
    }
}

/// `program` as a path, or the first executable of that name on `PATH`.
fn find_program(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 {
        return executable(program).then(|| program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| executable(p))
}

fn root() -> Finding {
    if nix::unistd::geteuid().is_root() {
        found("root", Verdict::Ok, "running as root")
    } else {
        found(
            "root",
            Verdict::Warn,
            "not root: tasks run as this user, without uids, cgroups or GPU device rules of their own (run the agent as root, as its unit does)",
        )
    }
}

/// The tasks' uid range holds no account's uid.
fn task_uids(options: &CheckOptions) -> Finding {
    let Some((start, end)) = options.task_uids else {
        return found(
            "task uids",
            Verdict::Skipped,
            "tasks run as one user (--run-as, or not root)",
        );
    };
    let passwd = std::fs::read_to_string(&options.passwd).unwrap_or_default();
    let taken = passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let uid: u32 = fields.nth(1)?.parse().ok()?;
        (start..=end).contains(&uid).then(|| (name.to_owned(), uid))
    });
    match taken {
        Some((name, uid)) => found(
            "task uids",
            Verdict::Fail,
            format!(
                "uid {uid} of the range {start}-{end} is account {name}'s: a task could act as it; pick a free range (--task-uids START-END)"
            ),
        ),
        None => found(
            "task uids",
            Verdict::Ok,
            format!(
                "{start}-{end}: no account in {} has one",
                options.passwd.display()
            ),
        ),
    }
}

fn cgroups(parent: &str) -> Vec<Finding> {
    let cgroups = Cgroups::detect(parent);
    let mut out = vec![found(
        "cgroups",
        if cgroups.usable() && cgroups.enforces_all() {
            Verdict::Ok
        } else {
            Verdict::Warn
        },
        cgroups.describe(),
    )];
    if cgroups.usable() && cgroups.gpu_devices() == GpuDevices::None {
        out.push(found(
            "gpu device rules",
            Verdict::Warn,
            "no cgroup can keep a task to its own GPUs' device nodes (the v1 devices controller, or cgroup v2 with BPF)",
        ));
    }
    out
}

/// The container engine, where tasks with an image run, and its NVIDIA runtime.
async fn containers(runtime: &ContainerRuntime) -> Vec<Finding> {
    let (socket, required) = match runtime {
        ContainerRuntime::Process => {
            return vec![found(
                "docker",
                Verdict::Skipped,
                "--runtime process: tasks run as processes",
            )];
        }
        ContainerRuntime::Docker(s) => (s, true),
        ContainerRuntime::Auto(s) => (s, false),
    };
    let engine = match crate::runtime::docker::Engine::connect(socket).await {
        Ok(e) => e,
        Err(e) if required => {
            return vec![found(
                "docker",
                Verdict::Fail,
                format!("{e}: start Docker, or name its socket with --docker-socket"),
            )];
        }
        Err(e) => {
            return vec![found(
                "docker",
                Verdict::Warn,
                format!(
                    "{e}: tasks with an image cannot run here (process tasks can); install Docker, or pass --runtime process"
                ),
            )];
        }
    };
    let mut out = vec![found(
        "docker",
        Verdict::Ok,
        format!("{} answers", socket.display()),
    )];
    out.push(match engine.runtimes().await {
        Ok(r) if r.iter().any(|n| n == "nvidia") => found("nvidia runtime", Verdict::Ok, "Docker has the nvidia runtime"),
        Ok(r) => found(
            "nvidia runtime",
            if required { Verdict::Fail } else { Verdict::Warn },
            format!(
                "Docker's runtimes are {}: containers cannot reach the GPUs. Install nvidia-container-toolkit and run `nvidia-ctk runtime configure --runtime=docker`",
                r.join(", ")
            ),
        ),
        Err(e) => found("nvidia runtime", Verdict::Warn, format!("cannot ask Docker: {e}")),
    });
    out
}

/// Each server answers `/healthz` over a connection the agent trusts.
async fn servers(config: &AgentConfig) -> Vec<Finding> {
    let urls = match crate::agent::client::server_urls(config) {
        Ok(u) => u,
        Err(e) => return vec![found("server", Verdict::Fail, e.to_string())],
    };
    let http = match crate::agent::client::http_client(config, &urls) {
        Ok(h) => h,
        Err(e) => return vec![found("server", Verdict::Fail, e.to_string())],
    };
    let mut out = Vec::new();
    for url in urls {
        let health = url.join("healthz").expect("a path joins a base URL");
        let answer = http.get(health).send().await;
        out.push(match answer {
            Ok(r) if r.status().is_success() => found(
                "server",
                Verdict::Ok,
                format!("{url} answers{}", if url.scheme() == "https" { ", its certificate trusted" } else { "" }),
            ),
            Ok(r) => found("server", Verdict::Fail, format!("{url} answers {} to /healthz: is it a Tessera server, and is its database up?", r.status())),
            Err(e) => {
                let why = crate::agent::client::with_causes(&e);
                let hint = if why.contains("certificate") || why.contains("UnknownIssuer") {
                    "its certificate is not trusted: pass the CA file the server's `tessera tls` made (--ca-cert)"
                } else {
                    "check the address, the port, and what stands between (firewall, proxy)"
                };
                found("server", Verdict::Fail, format!("{url}: {why}: {hint}"))
            }
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_fails_only_on_a_failure() {
        let ok = vec![
            found("gpus", Verdict::Ok, "2 GPUs"),
            found("mps", Verdict::Skipped, "--no-mps"),
            found("root", Verdict::Warn, "not root"),
        ];
        let (text, can) = report(&ok);
        assert!(can, "{text}");
        assert!(text.contains("warn  root: not root"), "{text}");
        let mut bad = ok.clone();
        bad.push(found("server", Verdict::Fail, "http://x: refused"));
        let (text, can) = report(&bad);
        assert!(!can);
        assert!(
            text.contains("FAIL  server") && text.contains("cannot run"),
            "{text}"
        );
    }

    #[test]
    fn a_uid_range_holding_an_account_fails_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            "root:x:0:0::/root:/bin/sh\nalice:x:200500:200500::/home/alice:/bin/sh\n",
        )
        .unwrap();
        let options = |range| CheckOptions {
            task_uids: Some(range),
            cgroup_parent: "tessera".into(),
            passwd: passwd.clone(),
        };
        let taken = task_uids(&options((200_000, 265_535)));
        assert_eq!(taken.verdict, Verdict::Fail);
        assert!(
            taken.detail.contains("alice") && taken.detail.contains("--task-uids"),
            "{}",
            taken.detail
        );
        assert_eq!(
            task_uids(&options((1_000_000_000, 1_000_065_535))).verdict,
            Verdict::Ok
        );
    }

    #[test]
    fn gpus_outside_exclusive_process_mig_or_unhealthy_are_warned_of() {
        let gpu = |index: u32, mode: &str, mig: bool, healthy: bool| crate::probe::GpuStatus {
            uuid: tessera_model::GpuUuid::new(format!("GPU-{index}")).unwrap(),
            index,
            model: "NVIDIA H100".into(),
            memory_total: tessera_model::MiB(81_559),
            memory_used: tessera_model::MiB(0),
            utilization_pct: None,
            compute_mode: Some(mode.into()),
            mps_client_limit: 48,
            healthy,
            minor: Some(index),
            ecc_enabled: Some(true),
            mig_enabled: Some(mig),
        };
        let inventory = |gpus| Inventory {
            source: "nvml",
            driver_version: Some("550.54".into()),
            cuda_version: Some("12.4".into()),
            gpus,
        };
        let fine = gpu_findings(&inventory(vec![gpu(0, "ExclusiveProcess", false, true)]));
        assert!(fine.iter().all(|f| f.verdict == Verdict::Ok), "{fine:?}");
        assert!(
            fine[0]
                .detail
                .contains("1 GPUs (0 NVIDIA H100); driver 550.54"),
            "{fine:?}"
        );
        let mixed = gpu_findings(&inventory(vec![
            gpu(0, "ExclusiveProcess", false, true),
            gpu(1, "Default", true, false),
        ]));
        let said = |what: &str| mixed.iter().find(|f| f.what == what).cloned().unwrap();
        assert_eq!(said("compute mode").verdict, Verdict::Warn);
        assert!(said("compute mode").detail.contains("GPU 1 (Default)"));
        assert!(
            said("compute mode")
                .detail
                .contains("nvidia-smi -i INDEX -c EXCLUSIVE_PROCESS")
        );
        assert_eq!(said("mig").verdict, Verdict::Warn);
        assert_eq!(said("gpu health").verdict, Verdict::Warn);
        assert!(report(&mixed).1, "warnings alone: the agent runs");
    }

    #[test]
    fn a_missing_mps_program_fails_saying_what_to_do() {
        assert!(find_program(Path::new("sh")).is_some());
        assert!(find_program(Path::new("/no/such/nvidia-cuda-mps-control")).is_none());
        assert!(find_program(Path::new("no-such-program-tessera")).is_none());
    }
}
