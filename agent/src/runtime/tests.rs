use super::*;
use tessera_model::agent::WantedContainer;

fn wanted(id: &str, command: &[&str], mps: bool) -> WantedTask {
    WantedTask {
        task_id: id.into(),
        containers: vec![WantedContainer {
            name: "main".into(),
            image: None,
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            entry_point_words: 0,
            cpu_milli: 0,
            memory_mib: 0,
            memory_soft: false,
            env: BTreeMap::from([
                ("CUDA_VISIBLE_DEVICES".to_owned(), "GPU-1".to_owned()),
                (
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_owned(),
                    "0=4096M".to_owned(),
                ),
            ]),
            secrets: Default::default(),
            ports: vec![],
            health_check: None,
            essential: true,
            depends_on: vec![],
        }],
        mps,
        stop_timeout_secs: 1,
        host_network: false,
        bound_ports: vec![],
        work: None,
        draining: false,
    }
}

#[test]
fn mps_tasks_get_the_pipe_directory_and_nothing_else_leaks() {
    let env = task_environment(
        &wanted("t1", &["true"], true),
        0,
        Some(Path::new("/run/mps")),
    );
    assert_eq!(env["CUDA_MPS_PIPE_DIRECTORY"], "/run/mps");
    assert_eq!(env["CUDA_VISIBLE_DEVICES"], "GPU-1");
    assert_eq!(env["TESSERA_TASK_ID"], "t1");
    assert!(env.keys().all(|k| PASSED_THROUGH.contains(&k.as_str())
        || k.starts_with("CUDA_")
        || k == "TESSERA_TASK_ID"));
    let whole = task_environment(
        &wanted("t2", &["true"], false),
        0,
        Some(Path::new("/run/mps")),
    );
    assert!(
        !whole.contains_key("CUDA_MPS_PIPE_DIRECTORY"),
        "whole-GPU tasks bypass MPS"
    );
}

async fn until(runtime: &mut Runtime, done: impl Fn(&Runtime) -> bool) {
    for _ in 0..100 {
        runtime.poll();
        if done(runtime) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("condition not reached");
}

#[tokio::test]
async fn exits_are_reported_with_their_code_until_heard() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    let w = wanted("t1", &["sh", "-c", "echo hello; exit 3"], false);
    rt.converge(std::slice::from_ref(&w));
    until(&mut rt, |rt| rt.running_count() == 0).await;
    let reports = rt.reports();
    assert_eq!(reports.len(), 1);
    assert!(!reports[0].running);
    assert_eq!(reports[0].exit_code, Some(3));
    // Still wanted (the server has not heard yet): not started again.
    rt.converge(std::slice::from_ref(&w));
    assert_eq!(rt.running_count(), 0);
    // The server stops listing it: forgotten.
    rt.converge(&[]);
    assert!(rt.reports().is_empty());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = std::fs::read_to_string(dir.path().join("tasks/t1/main.log")).expect("log");
    assert_eq!(log, "hello\n");
}

#[tokio::test]
async fn secrets_reach_the_process_but_not_the_state_file() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    let mut w = wanted("s1", &["sh", "-c", "echo \"db=$DB_PASSWORD\""], false);
    w.containers[0].secrets = tessera_model::agent::SecretEnv(BTreeMap::from([(
        "DB_PASSWORD".to_owned(),
        "hunter2-x".to_owned(),
    )]));
    assert!(!format!("{w:?}").contains("hunter2"), "Debug hides secrets");
    rt.converge(std::slice::from_ref(&w));
    until(&mut rt, |rt| rt.running_count() == 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = std::fs::read_to_string(dir.path().join("tasks/s1/main.log")).expect("log");
    assert_eq!(log, "db=hunter2-x\n");
    let state = std::fs::read_to_string(dir.path().join("runtime.json")).expect("state");
    assert!(!state.contains("hunter2"), "{state}");
}

#[tokio::test]
async fn unwanted_tasks_get_sigterm_then_sigkill() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    // Ignores SIGTERM: only SIGKILL after the 1 s stop timeout ends it.
    rt.converge(&[wanted(
        "stubborn",
        &["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"],
        false,
    )]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    rt.poll();
    assert_eq!(rt.running_count(), 1);
    let started = Instant::now();
    rt.converge(&[]);
    until(&mut rt, |rt| rt.tasks.is_empty()).await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "SIGKILL waits for the stop timeout"
    );
    assert!(
        rt.reports().is_empty(),
        "a requested stop is not reported as an exit"
    );
}

#[tokio::test]
async fn a_restarted_runtime_readopts_instead_of_starting_twice() {
    let dir = tempfile::tempdir().expect("dir");
    let marker = dir.path().join("starts");
    let script = format!("echo started >> {}; exec sleep 30", marker.display());
    let w = wanted("t1", &["sh", "-c", &script], false);
    {
        let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
        rt.converge(std::slice::from_ref(&w));
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The agent goes away without stopping its tasks.
    }
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("reopen");
    assert_eq!(rt.running_count(), 1, "re-adopted");
    rt.converge(std::slice::from_ref(&w));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let starts = std::fs::read_to_string(&marker).expect("marker");
    assert_eq!(starts.lines().count(), 1, "not started twice");
    rt.stop_all().await;
    rt.poll();
    assert_eq!(rt.running_count(), 0);
}

#[tokio::test]
async fn logs_are_capped() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1000, None).expect("open");
    rt.converge(&[wanted(
        "noisy",
        &[
            "sh",
            "-c",
            "i=0; while [ $i -lt 300 ]; do echo line-$i; i=$((i+1)); done",
        ],
        false,
    )]);
    until(&mut rt, |rt| rt.running_count() == 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = std::fs::metadata(dir.path().join("tasks/noisy/main.log"))
        .expect("log")
        .len();
    let old = std::fs::metadata(dir.path().join("tasks/noisy/main.log.1"))
        .expect("rotated")
        .len();
    assert!(log <= 1000 && old <= 1000, "{log} {old}");
}

#[tokio::test]
async fn a_missing_program_is_an_exit_with_127() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1000, None).expect("open");
    rt.converge(&[wanted("t", &["/no/such/program"], false)]);
    until(&mut rt, |rt| rt.running_count() == 0).await;
    assert_eq!(rt.reports()[0].exit_code, Some(127));
}

#[tokio::test]
async fn a_container_image_is_not_run_as_a_process() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1000, None).expect("open");
    let mut w = wanted("t", &["sleep", "60"], false);
    w.containers[0].image = Some("nvcr.io/nvidia/pytorch:24.05-py3".into());
    rt.converge(&[w]);
    until(&mut rt, |rt| rt.running_count() == 0).await;
    assert_eq!(rt.reports()[0].exit_code, Some(127));
    assert_eq!(marked(dir.path(), "t"), 0, "no process started");
    let log = std::fs::read_to_string(dir.path().join("tasks/t/main.err.log")).expect("log");
    assert!(log.contains("images need a container runtime"), "{log}");
}

/// Processes of task `id` that carry the mark of the runtime over `dir`.
fn marked(dir: &Path, id: &str) -> usize {
    marked_processes(&agent_mark(dir))
        .get(id)
        .map_or(0, |(groups, _)| {
            groups
                .iter()
                .map(|g| live_groups().get(g).map_or(0, |g| g.live))
                .sum()
        })
}

#[tokio::test]
async fn a_task_ends_only_when_no_process_of_it_is_left() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    // The leader exits at once; its child lives on in the same process group.
    rt.converge(&[wanted("orphan", &["sh", "-c", "sleep 30 & exit 0"], false)]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    until(&mut rt, |rt| rt.tasks.is_empty()).await;
    assert_eq!(
        marked(dir.path(), "orphan"),
        0,
        "the child was stopped with its task"
    );
}

#[tokio::test]
async fn a_task_started_just_before_a_crash_is_adopted_not_started_twice() {
    let dir = tempfile::tempdir().expect("dir");
    let w = wanted("crash", &["sleep", "30"], false);
    {
        let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
        rt.converge(std::slice::from_ref(&w));
    }
    // As if the agent died before its state file recorded the task.
    std::fs::remove_file(dir.path().join("runtime.json")).expect("state file");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("reopen");
    assert_eq!(rt.running_count(), 1, "adopted by its mark");
    rt.converge(std::slice::from_ref(&w));
    assert_eq!(marked(dir.path(), "crash"), 1, "not started twice");
    let mode = std::fs::metadata(dir.path().join("runtime.json"))
        .expect("state")
        .permissions();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.mode() & 0o777, 0o600);
    rt.stop_all().await;
    assert_eq!(marked(dir.path(), "crash"), 0);
}

#[tokio::test]
async fn a_remembered_process_id_is_not_adopted_without_the_mark() {
    let dir = tempfile::tempdir().expect("dir");
    // A process that is not a task of this agent, in a group of its own.
    let mut stranger = stranger();
    let pgid = stranger.id() as i32;
    let state =
        format!(r#"{{"tasks": {{"t-old": {{"pgids": [{pgid}], "stop_timeout_secs": 1}}}}}}"#);
    std::fs::write(dir.path().join("runtime.json"), state).expect("state");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    assert_eq!(rt.running_count(), 0, "a reused process id is not a task");
    rt.converge(&[]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        stranger.try_wait().expect("wait").is_none(),
        "and is never signalled"
    );
    end(stranger);
}

#[tokio::test]
async fn a_group_id_taken_over_by_another_process_is_never_signalled() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    // A process that now leads a group whose id a task of ours once had: same id,
    // another start time (ids are reused; start times after boot are not).
    let mut stranger = stranger();
    let pgid = stranger.id() as i32;
    let start = group_born(pgid).expect("the stranger leads its group");
    rt.tasks.insert(
        String::from("t-gone"),
        remembered(pgid, Some(start.saturating_sub(1))),
    );
    rt.poll();
    assert!(rt.tasks.is_empty(), "its group is gone: the task has ended");
    rt.tasks
        .insert(String::from("t-stop"), remembered(pgid, None));
    rt.converge(&[]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    rt.poll();
    assert!(
        stranger.try_wait().expect("wait").is_none(),
        "the stranger was not signalled"
    );
    end(stranger);
}

#[tokio::test]
async fn logs_of_tasks_gone_are_pruned_and_those_of_live_tasks_kept() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    rt.converge(&[
        wanted("done", &["true"], false),
        wanted("live", &["sleep", "30"], false),
    ]);
    until(&mut rt, |rt| rt.running_count() == 1).await;
    // The server has heard of the exit and no longer lists it.
    rt.converge(&[wanted("live", &["sleep", "30"], false)]);
    assert_eq!(rt.prune_logs(Duration::from_secs(3600)), 0, "too recent");
    assert_eq!(rt.prune_logs(Duration::ZERO), 1);
    assert!(!dir.path().join("tasks/done").exists());
    assert!(dir.path().join("tasks/live").exists());
    rt.stop_all().await;
}

#[tokio::test]
async fn tasks_run_as_the_user_given() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: switching users needs root");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None)
        .expect("open")
        .run_as(65534, 65534);
    rt.converge(&[wanted("nobody", &["sleep", "30"], false)]);
    let pid = rt.processes()[0].pids[0];
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .expect("uid");
    assert_eq!(uid, "65534");
    rt.stop_all().await;
    assert_eq!(marked(dir.path(), "nobody"), 0);
}

#[tokio::test]
async fn nothing_is_adopted_after_a_reboot() {
    let dir = tempfile::tempdir().expect("dir");
    let w = wanted("before-reboot", &["sleep", "30"], false);
    {
        let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
        rt.converge(std::slice::from_ref(&w));
    }
    let path = dir.path().join("runtime.json");
    let mut saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("state")).expect("json");
    saved["boot_id"] = "another-boot".into();
    std::fs::write(&path, saved.to_string()).expect("state");
    let rt = Runtime::open(dir.path(), 1 << 20, None).expect("reopen");
    assert_eq!(rt.running_count(), 0);
    // (A process cannot really outlive a reboot: end the one this test left.)
    for (_, (groups, _)) in marked_processes(&agent_mark(dir.path())) {
        for g in groups {
            let _ = killpg(Pid::from_raw(g), Signal::SIGKILL);
        }
    }
}

/// Ends a process a test started.
fn end(mut child: std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A process that is not a task of any agent, leading a process group of its own.
fn stranger() -> std::process::Child {
    use std::os::unix::process::CommandExt;
    std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .expect("spawn")
}

/// A task this runtime remembers as process group `pgid`, whose leader started at `born`.
fn remembered(pgid: i32, born: Option<u64>) -> Task {
    Task {
        procs: vec![Proc {
            name: String::from("main"),
            essential: true,
            pgid,
            child: None,
            exit: None,
            born,
        }],
        boxes: Vec::new(),
        error: None,
        env: BTreeMap::new(),
        stop_timeout: Duration::from_millis(100),
        ending: None,
        ports: Vec::new(),
        checkers: Vec::new(),
        wanted: None,
        waiting: Vec::new(),
        optional: BTreeSet::new(),
        resumed_health: None,
        checks_expected: 0,
        work: None,
    }
}

/// A second container of `w`, running `command`.
fn with_container(mut w: WantedTask, name: &str, command: &[&str]) -> WantedTask {
    let mut c = w.containers[0].clone();
    c.name = name.into();
    c.command = command.iter().map(|s| (*s).to_owned()).collect();
    w.containers.push(c);
    w
}

#[tokio::test]
async fn a_container_waits_for_its_dependency_and_a_non_essential_exit_ends_nothing() {
    use tessera_model::taskdef::{Dependency, DependencyCondition};
    let dir = tempfile::tempdir().expect("dir");
    let marker = dir.path().join("order");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    let log = marker.display().to_string();
    // "init" writes, sleeps and succeeds; "main" starts only after it, then stays.
    let mut w = wanted(
        "t",
        &["sh", "-c", &format!("echo init >> {log}; sleep 1")],
        false,
    );
    w.containers[0].name = "init".into();
    w.containers[0].essential = false;
    let mut w = with_container(
        w,
        "main",
        &["sh", "-c", &format!("echo main >> {log}; sleep 30")],
    );
    w.containers[1].depends_on = vec![Dependency {
        container: "init".into(),
        condition: DependencyCondition::Success,
    }];
    rt.converge(std::slice::from_ref(&w));
    until(&mut rt, |_| {
        std::fs::read_to_string(&marker).is_ok_and(|s| s.contains("init"))
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default(),
        "init\n",
        "main waits while init runs"
    );
    until(&mut rt, |_| {
        std::fs::read_to_string(&marker).unwrap_or_default() == "init\nmain\n"
    })
    .await;
    // init exited 0 and is not essential: the task runs on.
    tokio::time::sleep(Duration::from_millis(200)).await;
    rt.poll();
    assert_eq!(rt.running_count(), 1);
    assert!(rt.reports()[0].running);
    rt.converge(&[]);
    until(&mut rt, |rt| rt.tasks.is_empty()).await;

    // A dependency that fails where it had to succeed: the task ends, the waiting
    // container never starts.
    let mut bad = wanted("u", &["sh", "-c", "exit 4"], false);
    bad.containers[0].name = "init".into();
    bad.containers[0].essential = false;
    let mut bad = with_container(bad, "main", &["sh", "-c", &format!("echo never >> {log}")]);
    bad.containers[1].depends_on = vec![Dependency {
        container: "init".into(),
        condition: DependencyCondition::Success,
    }];
    rt.converge(std::slice::from_ref(&bad));
    until(&mut rt, |rt| rt.running_count() == 0).await;
    let reports = rt.reports();
    assert!(!reports[0].running);
    assert!(
        reports[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("depends_on"),
        "{reports:?}"
    );
    assert!(
        !std::fs::read_to_string(&marker)
            .unwrap_or_default()
            .contains("never")
    );
}

#[tokio::test]
async fn a_process_gets_its_ports_and_keeps_them_across_an_agent_restart() {
    use tessera_model::taskdef::{PortSpec, Protocol};
    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().join("port");
    let mut w = wanted(
        "web",
        &[
            "sh",
            "-c",
            &format!(
                "echo $PORT $TESSERA_PORT_HTTP > {}; sleep 30",
                out.display()
            ),
        ],
        false,
    );
    w.containers[0].ports = vec![PortSpec {
        name: Some("http".into()),
        container_port: 8000,
        host_port: None,
        protocol: Protocol::Tcp,
    }];
    let port = {
        let mut rt = Runtime::open(dir.path(), 1 << 20, None)
            .expect("open")
            .port_range(45000, 45100);
        rt.converge(std::slice::from_ref(&w));
        until(&mut rt, |_| {
            std::fs::read_to_string(&out).is_ok_and(|s| !s.is_empty())
        })
        .await;
        let reports = rt.reports();
        let port = reports[0].ports[0].host_port.expect("bound");
        assert!((45000..=45100).contains(&port));
        assert_eq!(
            std::fs::read_to_string(&out).expect("written").trim(),
            format!("{port} {port}")
        );
        assert_eq!(rt.dynamic_ports_free(), 100, "one of 101 held");
        port
        // The runtime is dropped here, as an agent that exits: the process runs on.
    };
    let mut again = Runtime::open(dir.path(), 1 << 20, None).expect("reopen");
    again.converge(std::slice::from_ref(&w));
    again.poll();
    let reports = again.reports();
    assert_eq!(reports.len(), 1, "re-adopted, not started twice");
    assert_eq!(reports[0].ports[0].host_port, Some(port), "the same port");
    again.converge(&[]);
    until(&mut again, |rt| rt.tasks.is_empty()).await;
}
