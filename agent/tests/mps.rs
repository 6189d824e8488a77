//! The MPS supervisor against a stand-in control program that can be made to die, fail to
//! start, or hang.

use std::path::PathBuf;
use std::time::Duration;
use tessera_agent::mps::{MpsConfig, MpsHealth, MpsSupervisor};

fn fake() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake-mps-control")
}

fn supervisor(dir: &std::path::Path, max_restarts: u32) -> MpsSupervisor {
    let mut config = MpsConfig::new(fake(), dir);
    config.check_timeout = Duration::from_millis(500);
    config.max_restarts = max_restarts;
    MpsSupervisor::new(config)
}

fn kill_daemon(dir: &std::path::Path) {
    kill_daemon_in(&dir.join("mps-pipe"));
}

/// Kills the stand-in daemon whose pipe directory is `pipe`, and waits until it is dead.
fn kill_daemon_in(pipe: &std::path::Path) {
    let pid = std::fs::read_to_string(pipe.join("fake-daemon.pid")).expect("daemon pid");
    let pid = pid.trim();
    let status = std::process::Command::new("kill")
        .arg(pid)
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !dead(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon {pid} did not end"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` has ended, as the stand-in control program judges it: gone, or a
/// zombie that nothing reaped.
fn dead(pid: &str) -> bool {
    let signalled = std::process::Command::new("kill")
        .args(["-0", pid])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    !signalled
        || std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
            s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
}

#[tokio::test]
async fn starts_checks_restarts_within_limits_and_quits() {
    let dir = tempfile::tempdir().expect("dir");
    let mut mps = supervisor(dir.path(), 1);
    assert_eq!(mps.start().await, MpsHealth::Healthy);
    assert_eq!(mps.supervise().await, MpsHealth::Healthy);

    // The daemon dies: one restart is allowed, and it comes back.
    kill_daemon(dir.path());
    assert_eq!(mps.supervise().await, MpsHealth::Healthy);

    // It dies again: the budget is spent, so the host must be reported unhealthy.
    kill_daemon(dir.path());
    match mps.supervise().await {
        MpsHealth::Unhealthy(reason) => {
            assert!(
                reason.contains("Cannot find MPS control daemon process"),
                "{reason}"
            );
            assert!(reason.contains("not restarting again"), "{reason}");
        }
        MpsHealth::Healthy => panic!("a dead daemon was reported healthy"),
    }
}

#[tokio::test]
async fn the_daemon_gets_a_minimal_environment() {
    let dir = tempfile::tempdir().expect("dir");
    let mut mps = supervisor(dir.path(), 0);
    assert_eq!(mps.start().await, MpsHealth::Healthy);
    let env = std::fs::read_to_string(dir.path().join("mps-pipe/daemon.env")).expect("env");
    // Cargo sets CARGO_* for this test process: none of it may reach the daemon.
    assert!(!env.contains("CARGO_"), "{env}");
    assert!(env.contains("CUDA_MPS_PIPE_DIRECTORY="), "{env}");
    mps.shutdown().await;
}

#[tokio::test]
async fn a_hanging_daemon_is_unhealthy_after_the_timeout() {
    let dir = tempfile::tempdir().expect("dir");
    let mut mps = supervisor(dir.path(), 0);
    assert_eq!(mps.start().await, MpsHealth::Healthy);
    std::fs::write(dir.path().join("mps-pipe/hang"), "").expect("marker");
    let started = std::time::Instant::now();
    match mps.supervise().await {
        MpsHealth::Unhealthy(reason) => assert!(reason.contains("no answer within"), "{reason}"),
        MpsHealth::Healthy => panic!("a hanging daemon was reported healthy"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the check gave up at its timeout"
    );
}

#[tokio::test]
async fn a_daemon_that_cannot_start_says_why_and_quit_stops_it() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::create_dir_all(dir.path().join("mps-pipe")).expect("dir");
    std::fs::write(dir.path().join("mps-pipe/broken"), "").expect("marker");
    let mut mps = supervisor(dir.path(), 3);
    match mps.start().await {
        MpsHealth::Unhealthy(reason) => {
            assert!(reason.contains("cannot start the daemon"), "{reason}")
        }
        MpsHealth::Healthy => panic!("reported healthy"),
    }
    std::fs::remove_file(dir.path().join("mps-pipe/broken")).expect("marker");
    assert_eq!(
        mps.supervise().await,
        MpsHealth::Healthy,
        "restarted once it can start"
    );
    mps.shutdown().await;
    assert!(
        !dir.path().join("mps-pipe/fake-daemon.pid").exists(),
        "quit stopped the daemon"
    );
}

/// One daemon per GPU: each started seeing its GPU alone, in directories of its own; one
/// failing for good makes MPS unhealthy naming that GPU; a GPU gone has its daemon quit.
#[tokio::test]
async fn each_gpu_gets_a_daemon_of_its_own() {
    use tessera_agent::mps::{MpsDaemons, pipe_dir};
    let dir = tempfile::tempdir().expect("dir");
    let mut template = MpsConfig::new(fake(), dir.path());
    template.check_timeout = Duration::from_millis(500);
    template.max_restarts = 0;
    let mut daemons = MpsDaemons::new(template, dir.path());
    let gpus = ["GPU-aaaa".to_owned(), "GPU-bbbb".to_owned()];
    assert_eq!(daemons.start(&gpus).await, MpsHealth::Healthy);
    for g in &gpus {
        let pipe = pipe_dir(daemons.root(), g).expect("a directory");
        assert_eq!(pipe, dir.path().join("mps").join(g).join("pipe"));
        let env = std::fs::read_to_string(pipe.join("daemon.env")).expect("env");
        assert!(
            env.contains(&format!("CUDA_VISIBLE_DEVICES={g}\n")),
            "{env}"
        );
        assert!(
            env.contains(&format!("CUDA_MPS_PIPE_DIRECTORY={}\n", pipe.display())),
            "{env}"
        );
    }

    // GPU-bbbb's daemon dies and cannot come back: the host's MPS is unhealthy, naming it.
    let b = dir.path().join("mps/GPU-bbbb");
    std::fs::write(b.join("pipe/broken"), "").expect("marker");
    kill_daemon_in(&b.join("pipe"));
    match daemons.supervise(&gpus).await {
        MpsHealth::Unhealthy(reason) => {
            assert!(reason.starts_with("GPU GPU-bbbb: "), "{reason}");
            assert!(!reason.contains("GPU-aaaa"), "{reason}");
        }
        MpsHealth::Healthy => panic!("a dead daemon was reported healthy"),
    }

    // GPU-bbbb is gone from the host: its daemon is forgotten, the other one serves on.
    assert_eq!(
        daemons.supervise(&gpus[..1]).await,
        MpsHealth::Healthy,
        "only GPU-aaaa is left"
    );
    daemons.shutdown().await;
    assert!(
        !dir.path()
            .join("mps/GPU-aaaa/pipe/fake-daemon.pid")
            .exists()
    );
}
