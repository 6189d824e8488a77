use super::confine::Confinement;
use super::procfs::{agent_mark, group_born, live_groups, marked_processes, proc_stat};
use super::task::Proc;
use super::*;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tessera_model::agent::WantedContainer;
use tokio::process::Command;

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
            security: Default::default(),
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
    assert_eq!(
        env["CUDA_MPS_PIPE_DIRECTORY"], "/run/mps/GPU-1/pipe",
        "the pipe of its GPU's own daemon"
    );
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
    let log = super::read_log(dir.path().join("tasks/t1/main.log")).expect("log");
    assert_eq!(log, "hello\n");
}

#[tokio::test]
async fn an_exit_is_reported_with_the_last_lines_the_task_wrote() {
    let dir = tempfile::tempdir().expect("dir");
    // A cap of 1000 bytes: the log starts over while it writes, and its last lines are
    // read on from the file before.
    let mut rt = Runtime::open(dir.path(), 1000, None).expect("open");
    let script = "i=0; while [ $i -lt 300 ]; do echo line-$i; i=$((i+1)); done; echo 'CUDA error: out of memory' >&2; exit 2";
    rt.converge(&[wanted("t", &["sh", "-c", script], false)]);
    until(&mut rt, |rt| rt.running_count() == 0).await;
    // Reported at the next sync, once its output is copied to its files.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = &rt.reports()[0];
    assert_eq!(r.exit_code, Some(2));
    let last = r.last_output.clone().expect("its last lines");
    let expected: Vec<String> = (280..300).map(|i| format!("line-{i}")).collect();
    assert_eq!(
        last,
        format!(
            "==> main.err.log <==\nCUDA error: out of memory\n==> main.log <==\n{}",
            expected.join("\n")
        )
    );
    // A task that wrote nothing sends none.
    rt.converge(&[wanted("quiet", &["true"], false)]);
    until(&mut rt, |rt| rt.running_count() == 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let quiet = rt
        .reports()
        .into_iter()
        .find(|r| r.task_id == "quiet")
        .expect("reported");
    assert_eq!(quiet.last_output, None);
}

/// The first report of an exit, the one the server keeps, carries the last lines whole:
/// a task that exited is reported running while its output is still being copied to its
/// files (for at most its stop timeout), and exited once it is.
#[tokio::test]
async fn an_exit_is_reported_once_the_output_is_copied_whole() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    let (copied, copying) = tokio::sync::oneshot::channel::<()>();
    let mut t = remembered(i32::MAX, None);
    t.procs[0].pumps.push(tokio::spawn(async move {
        let _ = copying.await;
    }));
    t.ending = Some((
        super::task::Ending::Exited(Some(4)),
        std::time::Instant::now() + Duration::from_secs(60),
    ));
    rt.tasks.insert("t".into(), t);
    let report = |rt: &Runtime| {
        rt.reports()
            .into_iter()
            .find(|r| r.task_id == "t")
            .expect("reported")
    };
    assert!(
        report(&rt).running,
        "still copying: not reported as ended yet"
    );
    assert_eq!(rt.running_count(), 1);
    copied.send(()).expect("the copy waits");
    while !rt.tasks["t"].procs[0].output_copied() {
        tokio::task::yield_now().await;
    }
    let ended = report(&rt);
    assert!(!ended.running);
    assert_eq!(ended.exit_code, Some(4));
    assert_eq!(rt.running_count(), 0);
    // Past its stop timeout a copy that never ends (a process that left its group holds
    // the pipe) is not waited for.
    let mut stuck = remembered(i32::MAX - 1, None);
    stuck.procs[0]
        .pumps
        .push(tokio::spawn(std::future::pending::<()>()));
    stuck.ending = Some((
        super::task::Ending::Exited(Some(1)),
        std::time::Instant::now(),
    ));
    rt.tasks.insert("stuck".into(), stuck);
    assert!(
        rt.reports()
            .iter()
            .any(|r| r.task_id == "stuck" && !r.running)
    );
}

#[tokio::test]
async fn a_task_that_runs_out_of_gpu_memory_says_so_and_a_plain_failure_does_not() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    let oom = wanted(
        "oom",
        &[
            "sh",
            "-c",
            "echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2; exit 1",
        ],
        true,
    );
    let plain = wanted(
        "plain",
        &["sh", "-c", "echo 'no such file' >&2; exit 1"],
        true,
    );
    rt.converge(&[oom, plain]);
    // Its output reaches the file just after it exits; by the next sync it is there.
    until(&mut rt, |rt| {
        rt.running_count() == 0
            && rt
                .reports()
                .iter()
                .any(|r| r.task_id == "oom" && r.out_of_memory.is_some())
    })
    .await;
    let reports = rt.reports();
    let of = |id: &str| reports.iter().find(|r| r.task_id == id).expect("reported");
    assert_eq!(of("oom").exit_code, Some(1));
    let why = of("oom").out_of_memory.clone().expect("out of memory");
    assert!(
        why.starts_with("container main ran out of GPU memory; its output says: torch.OutOfMemoryError: CUDA out of memory"),
        "{why}"
    );
    assert_eq!(of("plain").exit_code, Some(1));
    assert_eq!(of("plain").out_of_memory, None);
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
    let log = super::read_log(dir.path().join("tasks/s1/main.log")).expect("log");
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
    let log = super::read_log(dir.path().join("tasks/t/main.err.log")).expect("log");
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
    // The server has heard of the exit and no longer lists it; it is gone once its
    // output is copied whole.
    rt.converge(&[wanted("live", &["sleep", "30"], false)]);
    for _ in 0..10 {
        rt.poll();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
            pumps: Vec::new(),
        }],
        boxes: Vec::new(),
        error: None,
        out_of_memory: None,
        mps_pipe: None,
        env: BTreeMap::new(),
        stop_timeout: Duration::from_millis(100),
        ending: None,
        ports: Vec::new(),
        checkers: Vec::new(),
        wanted: None,
        spec: None,
        waiting: Vec::new(),
        optional: BTreeSet::new(),
        resumed_health: None,
        checks_expected: 0,
        work: None,
        uid: None,
        cgroup: None,
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

// Isolation, written as attacks: each test prints what it tried and what held.

/// This machine's cgroups for a test, under a parent of the tests' own; `None` (the
/// reason printed) where they cannot be used here.
fn test_cgroups() -> Option<Cgroups> {
    let cgroups = Cgroups::detect("tessera-test");
    println!("cgroups here: {}", cgroups.describe());
    if !cgroups.usable() {
        println!("skipped: no cgroups writable here (not root, or a read-only /sys)");
        return None;
    }
    Some(cgroups)
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether process `pid` is gone (a zombie runs nothing either).
fn dead(pid: u32) -> bool {
    proc_stat(pid).is_none_or(|s| s.state == 'Z')
}

/// Removes what a test left of its agent's cgroup.
fn clean_cgroups(rt: &Runtime) {
    if let Some(c) = &rt.cgroups {
        c.remove_agent_cgroup();
    }
}

#[tokio::test]
async fn attack_a_process_that_leaves_its_group_with_setsid_dies_with_its_task() {
    let Some(cgroups) = test_cgroups() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    // As a uid of its own where the agent may switch users: the child joins its cgroup,
    // then takes that uid, before the task's program runs.
    if is_root() {
        rt = rt.task_uids(320_100, 320_199).expect("task uids");
    }
    let mut rt = rt.cgroups(cgroups);
    // Where the task may write: its own working directory (as a uid of its own), else
    // the test's.
    let place = if is_root() {
        dir.path().join("tasks/escape").join(WORK_DIR)
    } else {
        dir.path().to_path_buf()
    };
    let script = format!(
        "setsid sh -c 'echo $$ > {p}/escaped.pid; exec sleep 300' & \
         sh -c 'sleep 299 & echo $! > {p}/orphan.pid'; \
         exec sleep 298",
        p = place.display()
    );
    rt.converge(&[wanted("escape", &["sh", "-c", &script], false)]);
    let read_pid = |name: &str| {
        std::fs::read_to_string(place.join(name))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
    };
    until(&mut rt, |_| {
        read_pid("escaped.pid").is_some() && read_pid("orphan.pid").is_some()
    })
    .await;
    let escaped = read_pid("escaped.pid").expect("written");
    let orphan = read_pid("orphan.pid").expect("written");
    let leader = rt.processes()[0].pids[0];
    let group = |pid: u32| proc_stat(pid).map(|s| s.pgrp);
    println!(
        "tried: task \"escape\" (process group {leader}) started {escaped} in a session of its own (setsid) and {orphan} through a double fork, then was stopped"
    );
    assert_ne!(
        group(escaped),
        Some(leader as i32),
        "setsid took it out of the task's process group"
    );
    println!(
        "  {escaped} is in process group {:?}: a signal to the task's process group misses it",
        group(escaped)
    );
    let cgroup = rt.tasks["escape"]
        .cgroup
        .clone()
        .expect("a cgroup of its own");
    let members = cgroup.pids();
    assert!(
        members.contains(&escaped) && members.contains(&orphan),
        "{members:?}"
    );
    println!("  both are in the task's cgroup {cgroup}: {members:?}");

    rt.converge(&[]);
    until(&mut rt, |rt| rt.tasks.is_empty()).await;
    for pid in [leader, escaped, orphan] {
        assert!(dead(pid), "process {pid} outlived its task");
    }
    println!("held: once the task is gone, none of {leader}, {escaped}, {orphan} is alive");
    until(&mut rt, |rt| rt.debris.is_empty()).await;
    assert!(
        !PathBuf::from(cgroup.to_string()).exists(),
        "its cgroup is removed"
    );
    println!("held: its cgroup {cgroup} is removed");
    clean_cgroups(&rt);
}

#[tokio::test]
async fn attack_a_task_reads_another_tasks_environment_logs_and_files() {
    use std::os::unix::fs::MetadataExt;
    if !is_root() {
        println!("skipped: tasks of uids of their own need the agent to run as root");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None)
        .expect("open")
        .task_uids(320_200, 320_299)
        .expect("task uids");
    let mut victim = wanted(
        "victim",
        &[
            "sh",
            "-c",
            "echo \"token=$API_TOKEN\"; echo mine > own-file; exec sleep 300",
        ],
        false,
    );
    victim.containers[0].secrets = tessera_model::agent::SecretEnv(BTreeMap::from([(
        "API_TOKEN".to_owned(),
        "s3cr3t-of-the-victim".to_owned(),
    )]));
    rt.converge(std::slice::from_ref(&victim));
    let victim_dir = dir.path().join("tasks/victim");
    let victim_log = victim_dir.join("main.log");
    let own_file = victim_dir.join(WORK_DIR).join("own-file");
    until(&mut rt, |_| {
        super::read_log(&victim_log).is_ok_and(|s| s.contains("token=")) && own_file.exists()
    })
    .await;
    let victim_pid = rt.processes()[0].pids[0];
    let script = format!(
        "cat /proc/{victim_pid}/environ; echo environ-exit=$?; \
         cat {log}; echo log-exit=$?; \
         ls {dir}; echo list-exit=$?; \
         cat {own}; echo work-exit=$?; \
         kill -0 {victim_pid}; echo signal-exit=$?; \
         echo uid=$(id -u)",
        log = victim_log.display(),
        dir = victim_dir.display(),
        own = own_file.display(),
    );
    let thief = wanted("thief", &["sh", "-c", &script], false);
    rt.converge(&[victim.clone(), thief]);
    until(&mut rt, |rt| {
        rt.reports()
            .iter()
            .any(|r| r.task_id == "thief" && !r.running)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let thief_dir = dir.path().join("tasks/thief");
    let out = ["main.log", "main.err.log"]
        .iter()
        .map(|f| super::read_log(thief_dir.join(f)).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("");
    println!(
        "tried: task \"thief\" read task \"victim\"'s environment (/proc/{victim_pid}/environ), its log, its directory and its working files, and signalled it; it saw:\n{out}"
    );
    assert!(!out.contains("s3cr3t-of-the-victim"), "{out}");
    for what in ["environ", "log", "list", "work", "signal"] {
        assert!(
            out.contains(&format!("{what}-exit=")),
            "{what} tried: {out}"
        );
        assert!(!out.contains(&format!("{what}-exit=0")), "{what}: {out}");
    }
    let victim_uid = confine::process_uid(victim_pid).expect("the victim's uid");
    let thief_uid = out
        .lines()
        .find_map(|l| l.strip_prefix("uid="))
        .and_then(|u| u.trim().parse::<u32>().ok())
        .expect("the thief's uid");
    assert_ne!(victim_uid, thief_uid);
    for uid in [victim_uid, thief_uid] {
        assert!((320_200..=320_299).contains(&uid), "{uid}");
    }
    println!(
        "held: the victim runs as {victim_uid}, the thief as {thief_uid}; no secret, log, file or signal crossed"
    );
    // What the victim has is its own: its log in its group only, its working directory
    // its alone; the agent's directories above can be passed, not listed.
    let meta = |p: &Path| std::fs::metadata(p).expect("metadata");
    let log = meta(victim_log.as_path());
    assert_eq!(
        (log.mode() & 0o777, log.uid(), log.gid()),
        (0o640, 0, victim_uid)
    );
    let task_dir = meta(victim_dir.as_path());
    assert_eq!(
        (task_dir.mode() & 0o777, task_dir.uid(), task_dir.gid()),
        (0o750, 0, victim_uid)
    );
    let work = meta(victim_dir.join(WORK_DIR).as_path());
    assert_eq!((work.mode() & 0o777, work.uid()), (0o700, victim_uid));
    assert_eq!(
        meta(own_file.as_path()).uid(),
        victim_uid,
        "written by the victim where it runs"
    );
    for traversed in [dir.path().to_path_buf(), dir.path().join("tasks")] {
        assert_eq!(
            meta(traversed.as_path()).mode() & 0o777,
            0o711,
            "{}",
            traversed.display()
        );
    }
    println!(
        "held: the victim's log is 0640 root:{victim_uid}, its directory 0750 root:{victim_uid}, its working directory 0700 {victim_uid}"
    );
    rt.stop_all().await;
}

#[tokio::test]
async fn attack_a_fork_bomb_and_a_memory_hog_are_held_by_their_cgroup_limits() {
    use cgroup::Controller;
    let Some(detected) = test_cgroups() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None)
        .expect("open")
        .pids_max(16)
        .cgroups(detected);
    let Some(cgroups) = rt.cgroups.clone() else {
        println!("skipped: this agent's cgroup cannot be made here");
        return;
    };

    // What the definition asks is what the kernel holds.
    let mut limits = wanted("limits", &["sleep", "300"], false);
    limits.containers[0].cpu_milli = 250;
    limits.containers[0].memory_mib = 64;
    rt.converge(std::slice::from_ref(&limits));
    let back = rt.tasks["limits"]
        .cgroup
        .as_ref()
        .expect("a cgroup of its own")
        .readback("main");
    println!(
        "asked: 250 milli-CPU, 64 MiB, 16 pids; the kernel holds: {back:?} ({})",
        rt.tasks["limits"].cgroup.as_ref().expect("a cgroup")
    );
    let check = |c: Controller, held: bool| {
        if cgroups.enforces(c) {
            assert!(held, "{} limit: {back:?}", c.name());
        } else {
            println!("not checked: no {} controller here", c.name());
        }
    };
    check(Controller::Cpu, back.cpu_quota_us == Some(25_000));
    check(Controller::Memory, back.memory_bytes == Some(64 << 20));
    check(Controller::Pids, back.pids_max == Some(16));

    // A fork bomb: far more processes than its limit.
    if cgroups.enforces(Controller::Pids) {
        let started = dir.path().join("bomb.pids");
        let script = format!(
            "i=0; while [ $i -lt 64 ]; do sleep 300 & echo $! >> {s}; i=$((i+1)); done; exec sleep 300",
            s = started.display()
        );
        rt.converge(&[
            limits.clone(),
            wanted("bomb", &["sh", "-c", &script], false),
        ]);
        until(&mut rt, |rt| {
            rt.reports()
                .iter()
                .any(|r| r.task_id == "bomb" && !r.running)
        })
        .await;
        // Its output reaches the log a moment after it exited.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let count = std::fs::read_to_string(&started)
            .unwrap_or_default()
            .lines()
            .count();
        let err = super::read_log(dir.path().join("tasks/bomb/main.err.log")).unwrap_or_default();
        println!(
            "tried: a shell starting 64 processes under a limit of 16; held: {count} started, then: {}",
            err.trim()
        );
        assert!(count < 16, "{count} processes started");
        assert!(err.to_lowercase().contains("fork"), "{err}");
    } else {
        println!("not tried: a fork bomb, without a pids controller here");
    }

    // A memory hog: 100 MB held under a hard limit of 32 MiB.
    if cgroups.enforces(Controller::Memory) {
        let mut hog = wanted(
            "hog",
            &[
                "sh",
                "-c",
                "x=$(head -c 100000000 /dev/zero | tr '\\0' a); echo ${#x}",
            ],
            false,
        );
        hog.containers[0].memory_mib = 32;
        rt.converge(&[limits.clone(), hog]);
        until(&mut rt, |rt| {
            rt.reports()
                .iter()
                .any(|r| r.task_id == "hog" && !r.running)
        })
        .await;
        let code = rt
            .reports()
            .iter()
            .find(|r| r.task_id == "hog")
            .and_then(|r| r.exit_code);
        println!(
            "tried: holding 100 MB under a 32 MiB limit; held: it ended with {code:?} (137: killed)"
        );
        assert_eq!(code, Some(137), "killed by the kernel at its limit");
        let why = rt
            .reports()
            .iter()
            .find(|r| r.task_id == "hog")
            .and_then(|r| r.out_of_memory.clone());
        assert_eq!(
            why.as_deref(),
            Some(
                "container main was killed by the kernel's OOM killer at its memory limit of 32 MiB"
            ),
            "its stop reason says out of memory"
        );
    } else {
        println!("not tried: a memory hog, without a memory controller here");
    }
    rt.stop_all().await;
    until(&mut rt, |rt| rt.debris.is_empty()).await;
    clean_cgroups(&rt);
}

#[tokio::test]
async fn attack_a_process_left_in_a_task_cgroup_by_a_crash_is_killed_when_the_agent_starts() {
    use std::os::unix::process::ExitStatusExt;
    let Some(cgroups) = test_cgroups() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    // What a crashed run left: the cgroup of a task it no longer has, with a process in it
    // that carries no mark of the agent (it cleared its environment).
    let mine = cgroups.for_agent(&agent_mark(dir.path()));
    let left = mine.create("gone-task", 0).expect("create");
    let procs = left
        .container("main", &cgroup::Limits::default())
        .expect("container");
    let mut cmd = Command::new("sleep");
    cmd.arg("300")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .process_group(0);
    Confinement {
        procs,
        ..Confinement::default()
    }
    .apply(&mut cmd)
    .expect("confined");
    let mut child = cmd.spawn().expect("spawn");
    let pid = child.id().expect("a pid");
    assert!(left.pids().contains(&pid), "{:?}", left.pids());
    println!(
        "tried: process {pid} left in {left}, the cgroup of a task the agent no longer has, without the agent's mark"
    );
    let mut rt = Runtime::open(dir.path(), 1 << 20, None)
        .expect("open")
        .cgroups(cgroups);
    assert_eq!(rt.running_count(), 0, "not taken for a task");
    let mut status = None;
    for _ in 0..100 {
        status = child.try_wait().expect("wait");
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status.and_then(|s| s.signal()), Some(9), "{status:?}");
    until(&mut rt, |rt| rt.debris.is_empty()).await;
    assert!(!PathBuf::from(left.to_string()).exists());
    println!("held: the agent killed {pid} when it started and removed {left}");
    clean_cgroups(&rt);
}

#[tokio::test]
async fn attack_a_task_that_names_another_tasks_uid_or_root_is_refused() {
    if !is_root() {
        println!("skipped: tasks of uids of their own need the agent to run as root");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None)
        .expect("open")
        .task_uids(320_300, 320_399)
        .expect("task uids");
    let mut impostor = wanted("impostor", &["sleep", "30"], false);
    impostor.containers[0].security.user = Some("320300".into());
    let mut root = wanted("root", &["sleep", "30"], false);
    root.containers[0].security.user = Some("root".into());
    rt.converge(&[impostor, root]);
    until(&mut rt, |rt| {
        rt.running_count() == 0 && rt.reports().len() == 2
    })
    .await;
    for r in rt.reports() {
        println!(
            "tried: task {:?} naming a user that is not its to take; held: exit {:?}, {:?}",
            r.task_id, r.exit_code, r.error
        );
        assert_eq!(r.exit_code, Some(125));
        let why = r.error.unwrap_or_default();
        let expected = if r.task_id == "root" {
            "root"
        } else {
            "--task-uids"
        };
        assert!(why.contains(expected), "{why}");
    }
    assert_eq!(
        marked(dir.path(), "impostor") + marked(dir.path(), "root"),
        0
    );
}

/// MPS serves one Linux user at a time per daemon (a client of another user waits until
/// every client of the running server is done), so the MPS tasks of one GPU share a uid;
/// tasks of another GPU get another, whose pipe directory the first GPU's tasks cannot
/// enter; other tasks get uids of their own.
#[tokio::test]
async fn attack_mps_tasks_share_their_gpus_uid_and_cannot_reach_another_gpus_pipe() {
    if !is_root() {
        println!("skipped: tasks of uids of their own need the agent to run as root");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let mps = dir.path().join("mps");
    for gpu in ["GPU-1", "GPU-2"] {
        // As each GPU's daemon makes it, before any task: closed.
        use std::os::unix::fs::PermissionsExt;
        let pipe = mps.join(gpu).join("pipe");
        std::fs::create_dir_all(&pipe).expect("pipe dir");
        std::fs::set_permissions(&pipe, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    }
    let mut rt = Runtime::open(&dir.path().join("state"), 1 << 20, Some(mps.clone()))
        .expect("open")
        .task_uids(320_400, 320_499)
        .expect("task uids");
    let on_gpu2 = |id: &str, command: &[&str]| {
        let mut w = wanted(id, command, true);
        w.containers[0]
            .env
            .insert("CUDA_VISIBLE_DEVICES".into(), "GPU-2".into());
        w
    };
    let other_pipe = mps.join("GPU-2/pipe").display().to_string();
    // A task of GPU 1 that tries to enter GPU 2's pipe directory.
    let probe =
        format!("ls {other_pipe} > /dev/null 2>&1 && echo entered || echo refused; exec sleep 300");
    rt.converge(&[
        wanted("mps-a", &["sh", "-c", &probe], true),
        wanted("mps-b", &["sleep", "300"], true),
        on_gpu2("mps-c", &["sleep", "300"]),
        wanted("cpu-only", &["sleep", "300"], false),
    ]);
    until(&mut rt, |rt| rt.processes().len() == 4).await;
    let uid_of = |task: &str| rt.tasks[task].uid;
    println!(
        "GPU 1's MPS tasks run as {:?} and {:?}; GPU 2's as {:?}; the other as {:?}",
        uid_of("mps-a"),
        uid_of("mps-b"),
        uid_of("mps-c"),
        uid_of("cpu-only")
    );
    assert!(uid_of("mps-a").is_some());
    assert_eq!(uid_of("mps-a"), uid_of("mps-b"), "one GPU, one MPS user");
    let distinct: std::collections::BTreeSet<_> = ["mps-a", "mps-c", "cpu-only"]
        .iter()
        .map(|t| uid_of(t))
        .collect();
    assert_eq!(distinct.len(), 3, "another GPU, another uid");
    for (gpu, task) in [("GPU-1", "mps-a"), ("GPU-2", "mps-c")] {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(mps.join(gpu).join("pipe")).expect("pipe dir");
        assert_eq!(Some(meta.uid()), uid_of(task), "{gpu}'s pipe is its uid's");
        assert_eq!(
            meta.mode() & 0o777,
            0o700,
            "{gpu}'s pipe is its uid's alone"
        );
    }
    for p in rt.processes() {
        let expected = uid_of(&p.task_id).expect("a uid");
        assert_eq!(
            confine::process_uid(p.pids[0]),
            Some(expected),
            "{} runs as another uid",
            p.task_id
        );
    }
    let log = dir.path().join("state/tasks/mps-a/main.log");
    for _ in 0..100 {
        if super::read_log(&log).is_ok_and(|l| !l.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let said = super::read_log(&log).expect("its output");
    println!(
        "tried: a task of GPU 1 enters GPU 2's pipe directory; held: {}",
        said.trim()
    );
    assert_eq!(said.trim(), "refused");
    // A restarted agent knows which GPU each task's uid is for: a new task of GPU 2
    // joins its uid, not GPU 1's.
    drop(rt);
    let mut rt = Runtime::open(&dir.path().join("state"), 1 << 20, Some(mps.clone()))
        .expect("reopen")
        .task_uids(320_400, 320_499)
        .expect("task uids");
    let gpu2_uid = rt.tasks["mps-c"].uid;
    rt.converge(&[
        wanted("mps-a", &["sh", "-c", &probe], true),
        wanted("mps-b", &["sleep", "300"], true),
        on_gpu2("mps-c", &["sleep", "300"]),
        on_gpu2("mps-d", &["sleep", "300"]),
        wanted("cpu-only", &["sleep", "300"], false),
    ]);
    until(&mut rt, |rt| rt.processes().len() == 5).await;
    assert_eq!(rt.tasks["mps-d"].uid, gpu2_uid);
    rt.converge(&[]);
    until(&mut rt, |rt| rt.tasks.is_empty()).await;
}

#[tokio::test]
async fn attack_a_task_opens_another_gpus_device_node() {
    let Some(cgroups) = test_cgroups() else {
        return;
    };
    if !is_root() || cgroups.gpu_devices() == cgroup::GpuDevices::None {
        println!("skipped: device nodes need root and a cgroup to hold the rules");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    // Fake GPU nodes of the real major: with no driver behind them, an open that the
    // cgroup allows fails with ENXIO, one that it refuses with EPERM.
    let dev = dir.path().join("dev");
    std::fs::create_dir(&dev).expect("dev");
    for minor in [0, 1] {
        let made = std::process::Command::new("mknod")
            .arg(dev.join(format!("nvidia{minor}")))
            .args(["c", "195", &minor.to_string()])
            .status()
            .expect("mknod");
        assert!(made.success());
    }
    let mut rt = Runtime::open(dir.path(), 1 << 20, None)
        .expect("open")
        .cgroups(cgroups)
        .dev_dir(dev.clone());
    // The task is given GPU-1, whose node is minor 1.
    rt.set_gpu_minors(HashMap::from([
        ("GPU-1".to_owned(), 1),
        ("GPU-0".to_owned(), 0),
    ]));
    let script = format!(
        "cat {d}/nvidia0 2> {p}/other.err; cat {d}/nvidia1 2> {p}/own.err; touch {p}/done; exec sleep 30",
        d = dev.display(),
        p = dir.path().display()
    );
    rt.converge(&[wanted("gpu-thief", &["sh", "-c", &script], true)]);
    until(&mut rt, |_| dir.path().join("done").exists()).await;
    let other = std::fs::read_to_string(dir.path().join("other.err")).expect("other");
    let own = std::fs::read_to_string(dir.path().join("own.err")).expect("own");
    println!(
        "tried: task given GPU-1 ({}) opened /dev/nvidia0 (another GPU) and /dev/nvidia1 (its own)",
        rt.cgroups
            .as_ref()
            .map(|c| c.describe())
            .unwrap_or_default()
    );
    println!("  another GPU's node: {}", other.trim());
    println!("  its own GPU's node: {}", own.trim());
    assert!(other.contains("Operation not permitted"), "{other}");
    assert!(own.contains("No such device or address"), "{own}");
    rt.stop_all().await;
    clean_cgroups(&rt);
}

/// A task's GPU use is summed over every process of its live process groups (a worker its
/// shell started), not only the process the agent started.
#[tokio::test]
async fn every_process_of_a_tasks_groups_is_measured() {
    let dir = tempfile::tempdir().expect("dir");
    let mut rt = Runtime::open(dir.path(), 1 << 20, None).expect("open");
    rt.converge(&[wanted(
        "workers",
        &["sh", "-c", "sleep 300 & sleep 301 & wait"],
        false,
    )]);
    until(&mut rt, |rt| {
        rt.processes().first().is_some_and(|p| p.pids.len() >= 3)
    })
    .await;
    let p = &rt.processes()[0];
    let leader = rt.tasks["workers"].procs[0].pgid as u32;
    assert_eq!(p.pids[0], leader, "its first process first");
    for pid in &p.pids {
        assert_eq!(
            proc_stat(*pid).map(|s| s.pgrp),
            Some(leader as i32),
            "only its own group's"
        );
    }
    rt.converge(&[]);
    until(&mut rt, |rt| rt.tasks.is_empty()).await;
}

/// A container's processes are those of its main process's cgroup (where the engine put
/// them), found by what `/proc/<pid>/cgroup` says; a cgroup the agent is in counts for none.
#[test]
fn a_containers_processes_are_those_of_its_cgroup() {
    let v2 = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.join("cgroup.procs").is_file() && !p.join("cpu").is_dir());
    let Some(v2) = v2.filter(|_| is_root()) else {
        println!("skipped: needs root and a cgroup v2 hierarchy");
        return;
    };
    let cg = v2.join(format!("tessera-members-{}", std::process::id()));
    std::fs::create_dir_all(&cg).expect("cgroup");
    let procs = cg.join("cgroup.procs");
    let script = format!("echo $$ > {}; sleep 300 & exec sleep 301", procs.display());
    let child = std::process::Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .expect("spawn");
    let main = child.id();
    let mut inside = Vec::new();
    for _ in 0..100 {
        inside = std::fs::read_to_string(&procs)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse::<u32>().ok())
            .collect();
        if inside.len() == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = super::procfs::cgroup_of(main).expect("its cgroup");
    let found = super::procfs::members(&BTreeSet::new(), &BTreeSet::from([text.clone()]));
    let mut got = found.cgroups.get(&text).cloned().unwrap_or_default();
    got.sort_unstable();
    inside.sort_unstable();
    for pid in &inside {
        let _ = nix::sys::signal::kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
    }
    end(child);
    let _ = std::fs::remove_dir(&cg);
    assert_eq!(inside.len(), 2, "{inside:?}");
    assert_eq!(got, inside);
    let own = super::procfs::cgroup_of(std::process::id()).expect("own");
    let none = super::procfs::members(&BTreeSet::new(), &BTreeSet::from([own]));
    assert!(
        none.cgroups.is_empty(),
        "the agent's own cgroup names no container"
    );
}
