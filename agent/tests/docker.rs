//! The Docker path's contract: what the agent asks a Docker engine for, checked against a
//! fake engine that speaks the Engine API over a unix socket. One test, ignored by default,
//! runs against a real engine (see docs/operations.md, "The agent").

mod fake_docker;

use fake_docker::Fake;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tessera_agent::runtime::{Engine, Runtime};
use tessera_model::agent::{TaskReport, WantedContainer, WantedTask};

const IMAGE: &str = "registry.example/llm-serve:1.2";

fn gpu_task(id: &str, mps: bool) -> WantedTask {
    let mut env = BTreeMap::from([
        ("CUDA_VISIBLE_DEVICES".to_owned(), "GPU-1111".to_owned()),
        ("MODEL".to_owned(), "llama".to_owned()),
    ]);
    if mps {
        env.insert("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=8192M".into());
        env.insert("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "40".into());
    }
    WantedTask {
        task_id: id.into(),
        containers: vec![WantedContainer {
            name: "server".into(),
            image: Some(IMAGE.into()),
            command: vec![
                "python".into(),
                "-m".into(),
                "serve".into(),
                "--port=8000".into(),
            ],
            entry_point_words: 2,
            cpu_milli: 1500,
            memory_mib: 4096,
            memory_soft: false,
            env,
            secrets: tessera_model::agent::SecretEnv(BTreeMap::from([(
                "HF_TOKEN".to_owned(),
                "hf-secret".to_owned(),
            )])),
            ports: vec![],
            security: Default::default(),
            health_check: None,
            essential: true,
            depends_on: vec![],
        }],
        mps,
        stop_timeout_secs: 7,
        host_network: false,
        bound_ports: vec![],
        work: None,
        draining: false,
    }
}

fn cpu_task(id: &str) -> WantedTask {
    WantedTask {
        task_id: id.into(),
        containers: vec![WantedContainer {
            name: "worker".into(),
            image: Some("busybox".into()),
            command: vec![],
            entry_point_words: 0,
            cpu_milli: 250,
            memory_mib: 256,
            memory_soft: true,
            env: BTreeMap::from([("CUDA_VISIBLE_DEVICES".to_owned(), String::new())]),
            secrets: Default::default(),
            ports: vec![],
            security: Default::default(),
            health_check: None,
            essential: true,
            depends_on: vec![],
        }],
        mps: false,
        stop_timeout_secs: 3,
        host_network: false,
        bound_ports: vec![],
        work: None,
        draining: false,
    }
}

async fn runtime(state: &Path, fake: &Fake) -> Runtime {
    let mut rt = Runtime::open(state, 1 << 20, Some(state.join("mps"))).expect("runtime");
    let engine = Engine::connect(&fake.socket)
        .await
        .expect("the fake answers");
    rt.attach_engine(engine).await.expect("adopt");
    rt
}

/// Polls until the engine has no container `done` rejects.
async fn until_engine(rt: &mut Runtime, fake: &Fake, what: &str, done: impl Fn(&[String]) -> bool) {
    for _ in 0..200 {
        rt.poll();
        let names: Vec<String> = fake.lock().containers.keys().cloned().collect();
        if done(&names) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "{what}: not reached; containers {:?}",
        fake.lock().containers.keys()
    );
}

/// Polls until `done` holds of the reports, and returns them.
async fn until(
    rt: &mut Runtime,
    what: &str,
    done: impl Fn(&[TaskReport]) -> bool,
) -> Vec<TaskReport> {
    for _ in 0..200 {
        rt.poll();
        let reports = rt.reports();
        if done(&reports) {
            return reports;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{what}: not reached; reports {:?}", rt.reports());
}

fn running(id: &str) -> impl Fn(&[TaskReport]) -> bool + '_ {
    move |r| r.iter().any(|t| t.task_id == id && t.running)
}

#[tokio::test]
async fn an_mps_task_is_pulled_then_created_with_its_gpu_pipe_limits_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    {
        let mut g = fake.lock();
        g.pull_time = Duration::from_millis(400);
        g.output = vec![(1, "model loaded".into()), (2, "warning: slow disk".into())];
    }
    let state = dir.path().join("agent");
    let mut rt = runtime(&state, &fake).await;
    rt.converge(&[gpu_task("t1", true)]);
    // While the image comes down the task says so, and is not running.
    let pulling = until(&mut rt, "pulling", |r| {
        r.iter().any(|t| t.pulling.is_some())
    })
    .await;
    assert_eq!(pulling[0].pulling.as_deref(), Some(IMAGE));
    assert!(!pulling[0].running);
    until(&mut rt, "running", running("t1")).await;

    let pulls = fake.requests("POST", "/images/create");
    assert_eq!(pulls.len(), 1);
    assert_eq!(pulls[0].query["fromImage"], "registry.example/llm-serve");
    assert_eq!(pulls[0].query["tag"], "1.2");
    let creates = fake.requests("POST", "/containers/create");
    assert_eq!(creates.len(), 1, "created once");
    let name = creates[0].query["name"].clone();
    assert!(
        name.starts_with("tessera-") && name.ends_with("-t1-server"),
        "{name}"
    );
    let body = &creates[0].body;
    assert_eq!(body["Image"], IMAGE);
    assert_eq!(body["Entrypoint"], json!(["python", "-m"]));
    assert_eq!(body["Cmd"], json!(["serve", "--port=8000"]));
    let env: Vec<&str> = body["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let pipe = state.join("mps/GPU-1111/pipe").display().to_string();
    for want in [
        "CUDA_VISIBLE_DEVICES=GPU-1111".to_owned(),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M".to_owned(),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40".to_owned(),
        format!("CUDA_MPS_PIPE_DIRECTORY={pipe}"),
        "MODEL=llama".to_owned(),
        "HF_TOKEN=hf-secret".to_owned(),
        "TESSERA_TASK_ID=t1".to_owned(),
    ] {
        assert!(env.contains(&want.as_str()), "{want} in {env:?}");
    }
    // The image brings its own PATH and HOME; the agent's own environment stays out.
    assert!(
        env.iter()
            .all(|e| !e.starts_with("PATH=") && !e.starts_with("HOME=")),
        "{env:?}"
    );
    let host = &body["HostConfig"];
    assert_eq!(
        host["DeviceRequests"],
        json!([{ "Driver": "nvidia", "DeviceIDs": ["GPU-1111"], "Capabilities": [["gpu"]] }])
    );
    assert_eq!(host["Binds"], json!([format!("{pipe}:{pipe}")]));
    assert_eq!(host["IpcMode"], "host");
    assert_eq!(host["NanoCpus"], 1_500_000_000i64);
    assert_eq!(host["Memory"], 4096i64 * 1024 * 1024);
    assert_eq!(body["Labels"]["tessera.task-id"], "t1");
    assert_eq!(body["Labels"]["tessera.container"], "server");
    assert!(
        body["Labels"]["tessera.agent-mark"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    assert_eq!(
        fake.requests("POST", &format!("/containers/{name}/start"))
            .len(),
        1,
        "{:?}",
        fake.lock()
            .requests
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect::<Vec<_>>()
    );

    // Its output lands in the task's logs, stdout and stderr apart.
    let logs = state.join("tasks/t1");
    for _ in 0..100 {
        if tessera_agent::runtime::read_log(logs.join("server.err.log"))
            .is_ok_and(|s| !s.is_empty())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        tessera_agent::runtime::read_log(logs.join("server.log")).unwrap(),
        "model loaded\n"
    );
    assert_eq!(
        tessera_agent::runtime::read_log(logs.join("server.err.log")).unwrap(),
        "warning: slow disk\n"
    );

    // Not wanted any more: stopped with its stop timeout, then removed.
    rt.converge(&[]);
    assert!(
        rt.reports().iter().all(|r| r.running),
        "a task being stopped runs (and holds what it holds) until it is gone"
    );
    until_engine(&mut rt, &fake, "removed", <[String]>::is_empty).await;
    until(&mut rt, "forgotten once gone", <[TaskReport]>::is_empty).await;
    let stops = fake.requests("POST", &format!("/containers/{name}/stop"));
    assert_eq!(stops.len(), 1);
    assert_eq!(stops[0].query["t"], "7");
}

#[tokio::test]
async fn a_task_without_gpus_gets_no_device_and_a_soft_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let mut rt = runtime(&dir.path().join("agent"), &fake).await;
    rt.converge(&[cpu_task("c1")]);
    until(&mut rt, "running", running("c1")).await;
    let create = &fake.requests("POST", "/containers/create")[0].body;
    let host = &create["HostConfig"];
    assert!(
        host.get("DeviceRequests").is_none_or(Value::is_null),
        "{host}"
    );
    assert!(
        host.get("Binds").is_none_or(Value::is_null),
        "no MPS pipe: {host}"
    );
    assert_eq!(host["MemoryReservation"], 256i64 * 1024 * 1024);
    assert!(host.get("Memory").is_none_or(Value::is_null), "{host}");
    assert_eq!(host["NanoCpus"], 250_000_000i64);
    // Neither entry point nor command: the image's own.
    assert!(create.get("Entrypoint").is_none_or(Value::is_null));
    assert!(create.get("Cmd").is_none_or(Value::is_null));
    assert_eq!(
        fake.requests("POST", "/images/create")[0].query["tag"],
        "latest"
    );
}

#[tokio::test]
async fn a_refused_pull_fails_the_task_with_the_registrys_reason_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let why = "pull access denied for registry.example/llm-serve, repository does not exist or may require 'docker login'";
    fake.lock().refused.insert(IMAGE.into(), why.into());
    let mut rt = runtime(&dir.path().join("agent"), &fake).await;
    rt.converge(&[gpu_task("t1", false)]);
    let reports = until(&mut rt, "failed", |r| {
        r.iter().any(|t| t.exit_code.is_some())
    })
    .await;
    assert_eq!(reports.len(), 1);
    assert!(!reports[0].running);
    assert_eq!(reports[0].exit_code, Some(125));
    let error = reports[0].error.as_deref().unwrap();
    assert!(error.contains(why) && error.contains(IMAGE), "{error}");
    assert!(fake.requests("POST", "/containers/create").is_empty());
    // Still wanted, it is not tried again until the server has heard.
    rt.converge(&[gpu_task("t1", false)]);
    assert_eq!(fake.requests("POST", "/images/create").len(), 1);
}

#[tokio::test]
async fn an_exit_is_reported_with_its_code_and_the_container_removed() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let mut rt = runtime(&dir.path().join("agent"), &fake).await;
    rt.converge(&[cpu_task("c1")]);
    until(&mut rt, "running", running("c1")).await;
    let name = fake.requests("POST", "/containers/create")[0].query["name"].clone();
    fake.exit(&name, 3);
    let reports = until(&mut rt, "exited", |r| r.iter().any(|t| !t.running)).await;
    assert_eq!(reports[0].exit_code, Some(3));
    assert_eq!(reports[0].error, None);
    assert!(fake.lock().containers.is_empty());
}

#[tokio::test]
async fn a_container_killed_at_its_memory_limit_is_reported_out_of_memory() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let mut rt = runtime(&dir.path().join("agent"), &fake).await;
    rt.converge(&[cpu_task("c1")]);
    until(&mut rt, "running", running("c1")).await;
    let name = fake.requests("POST", "/containers/create")[0].query["name"].clone();
    fake.oom_kill(&name);
    let reports = until(&mut rt, "exited", |r| r.iter().any(|t| !t.running)).await;
    assert_eq!(reports[0].exit_code, Some(137));
    assert_eq!(
        reports[0].out_of_memory.as_deref(),
        Some("container worker was killed by the kernel's OOM killer"),
        "{reports:?}"
    );
    assert!(
        fake.lock().containers.is_empty(),
        "removed after it was read"
    );
}

#[tokio::test]
async fn a_restarted_agent_re_adopts_by_label_never_starts_twice_and_removes_what_is_not_wanted() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let state = dir.path().join("agent");
    {
        let mut rt = runtime(&state, &fake).await;
        rt.converge(&[cpu_task("keep"), cpu_task("drop")]);
        until(&mut rt, "running", |r| {
            r.iter().filter(|t| t.running).count() == 2
        })
        .await;
        // The agent dies here; its containers run on.
    }
    // Someone else's container, even one that looks like a task's, is never touched.
    fake.add_running(
        "someone-elses",
        json!({ "tessera.task-id": "keep", "tessera.container": "worker", "tessera.agent-mark": "other" }),
    );
    assert_eq!(
        fake.lock()
            .containers
            .values()
            .filter(|c| c.running)
            .count(),
        3
    );

    let mut rt = runtime(&state, &fake).await;
    // The first report after the restart already has both: none is taken for lost.
    assert_eq!(rt.reports().iter().filter(|t| t.running).count(), 2);
    rt.converge(&[cpu_task("keep")]);
    until_engine(&mut rt, &fake, "drop removed", |names| {
        !names.iter().any(|n| n.ends_with("-drop-worker"))
    })
    .await;
    assert_eq!(rt.reports().len(), 1);
    assert!(rt.reports()[0].running && rt.reports()[0].task_id == "keep");
    assert_eq!(
        fake.requests("POST", "/containers/create").len(),
        2,
        "nothing created again"
    );
    let left: Vec<String> = fake.lock().containers.keys().cloned().collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().any(|n| n.ends_with("-keep-worker")), "{left:?}");
    assert!(left.contains(&"someone-elses".to_owned()));
}

#[tokio::test]
async fn a_container_created_but_never_started_is_removed_and_its_task_started_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let state = dir.path().join("agent");
    // The agent's mark, from a run that started nothing.
    let mark = {
        let mut rt = runtime(&state, &fake).await;
        rt.converge(&[cpu_task("probe")]);
        until(&mut rt, "running", running("probe")).await;
        let name = fake.requests("POST", "/containers/create")[0].query["name"].clone();
        let mark = fake.lock().containers[&name].create["Labels"]["tessera.agent-mark"].clone();
        rt.converge(&[]);
        until_engine(&mut rt, &fake, "removed", <[String]>::is_empty).await;
        mark
    };
    let leftover = "tessera-left-c1-worker";
    fake.add_created(
        leftover,
        json!({ "tessera.task-id": "c1", "tessera.container": "worker", "tessera.agent-mark": mark }),
    );
    let mut rt = runtime(&state, &fake).await;
    assert!(
        !fake.lock().containers.contains_key(leftover),
        "removed, not adopted"
    );
    assert!(rt.reports().is_empty(), "nothing reported as ended");
    rt.converge(&[cpu_task("c1")]);
    until(&mut rt, "started afresh", running("c1")).await;
}

#[tokio::test]
async fn without_an_engine_an_image_is_refused_with_the_reason_in_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("agent");
    let mut rt = Runtime::open(&state, 1 << 20, None).expect("runtime");
    rt.converge(&[cpu_task("c1")]);
    let reports = until(&mut rt, "refused", |r| r.iter().any(|t| !t.running)).await;
    assert_eq!(reports[0].exit_code, Some(127));
    let log = tessera_agent::runtime::read_log(state.join("tasks/c1/worker.err.log")).unwrap();
    assert!(log.contains("container runtime"), "{log}");
}

/// Against a real engine: `DOCKER_HOST=unix://… cargo test -p tessera-agent --test docker
/// -- --ignored` (pulls `busybox`).
#[tokio::test]
#[ignore = "needs a Docker engine"]
async fn a_real_engine_runs_a_task_and_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("agent");
    let mut rt = Runtime::open(&state, 1 << 20, None).expect("runtime");
    let engine = Engine::connect(&tessera_agent::runtime::default_socket())
        .await
        .expect("a Docker engine answers");
    rt.attach_engine(engine).await.expect("list");
    let mut task = cpu_task("real1");
    task.containers[0].command = vec!["sh".into(), "-c".into(), "echo hello; sleep 300".into()];
    rt.converge(&[task]);
    for _ in 0..1200 {
        rt.poll();
        if rt.reports().iter().any(|t| t.running) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(rt.reports().iter().any(|t| t.running), "{:?}", rt.reports());
    let log_file = state.join("tasks/real1/worker.log");
    for _ in 0..100 {
        if tessera_agent::runtime::read_log(&log_file).is_ok_and(|log| log == "hello\n") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = tessera_agent::runtime::read_log(&log_file).unwrap_or_default();
    assert_eq!(log, "hello\n");
    rt.converge(&[]);
    for _ in 0..200 {
        rt.poll();
        if rt.reports().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not stopped: {:?}", rt.reports());
}

#[tokio::test]
async fn ports_are_published_and_dockers_own_health_check_is_read_back() {
    use tessera_model::service::TaskHealth;
    use tessera_model::taskdef::{HealthCheck, PortSpec, Protocol};
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let state = dir.path().join("agent");
    let mut rt = runtime(&state, &fake).await;
    let mut w = cpu_task("web");
    w.containers[0].ports = vec![PortSpec {
        name: Some("http".into()),
        container_port: 8000,
        host_port: None,
        protocol: Protocol::Tcp,
    }];
    w.containers[0].health_check = Some(HealthCheck {
        command: vec![
            "CMD-SHELL".into(),
            "curl -f http://localhost:8000/health".into(),
        ],
        http: None,
        interval_secs: 5,
        timeout_secs: 3,
        retries: 2,
        start_period_secs: 30,
    });
    rt.converge(&[w]);
    let reports = until(&mut rt, "running", running("web")).await;
    let report = reports
        .iter()
        .find(|r| r.task_id == "web")
        .expect("reported");
    let host_port = report.ports[0].host_port.expect("a dynamic port was bound");
    assert!((32768..=60999).contains(&host_port), "{host_port}");
    assert_eq!(
        report.health.as_ref().map(|h| h.status),
        Some(TaskHealth::Unknown)
    );
    // The create request publishes the port and hands the check to Docker.
    let create = &fake.requests("POST", "/containers/create")[0].body;
    assert_eq!(create["ExposedPorts"], serde_json::json!({"8000/tcp": {}}));
    assert_eq!(
        create["HostConfig"]["PortBindings"]["8000/tcp"][0]["HostPort"],
        host_port.to_string()
    );
    assert_eq!(
        create["Healthcheck"]["Test"],
        serde_json::json!(["CMD-SHELL", "curl -f http://localhost:8000/health"])
    );
    assert_eq!(create["Healthcheck"]["Interval"], 5_000_000_000_i64);
    assert_eq!(create["Healthcheck"]["Retries"], 2);
    assert_eq!(create["Healthcheck"]["StartPeriod"], 30_000_000_000_i64);
    // Docker's verdict is what the task reports, with the failing check's output.
    let name = fake.lock().containers.keys().next().cloned().expect("one");
    fake.set_health(&name, "healthy", "");
    until(&mut rt, "healthy", |r| {
        r.iter().any(|t| {
            t.health
                .as_ref()
                .is_some_and(|h| h.status == TaskHealth::Healthy)
        })
    })
    .await;
    fake.set_health(&name, "unhealthy", "curl: (7) Failed to connect");
    // Once healthy, Docker's verdict is read every interval (5 s here).
    let mut reports = Vec::new();
    for _ in 0..300 {
        rt.poll();
        reports = rt.reports();
        if reports.iter().any(|t| {
            t.health
                .as_ref()
                .is_some_and(|h| h.status == TaskHealth::Unhealthy)
        }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        reports[0].health.as_ref().and_then(|h| h.output.as_deref()),
        Some("curl: (7) Failed to connect")
    );
}

/// Attack: a container that would gain privileges (setuid binaries, capabilities, an
/// unbounded fork) or run as root when its definition did not ask. The create request
/// holds it back: no-new-privileges, every capability dropped but those added, a pid
/// limit, the definition's user, a read-only root when asked; privileged only when asked.
#[tokio::test]
async fn a_container_is_created_without_privileges_and_with_what_its_definition_asks() {
    use tessera_model::taskdef::ContainerSecurity;
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let mut rt = runtime(&dir.path().join("agent"), &fake).await;
    let mut asks = cpu_task("asks");
    asks.containers[0].security = ContainerSecurity {
        user: Some("1000:1000".into()),
        privileged: false,
        readonly_root_filesystem: true,
        cap_add: vec!["NET_BIND_SERVICE".into()],
    };
    let mut privileged = cpu_task("priv");
    privileged.containers[0].security.privileged = true;
    rt.converge(&[cpu_task("plain"), asks, privileged]);
    until(&mut rt, "running", |r| {
        r.iter().filter(|t| t.running).count() == 3
    })
    .await;
    let body = |task: &str| {
        fake.requests("POST", "/containers/create")
            .into_iter()
            .find(|r| r.query["name"].ends_with(&format!("-{task}-worker")))
            .expect("created")
            .body
    };

    let plain = body("plain");
    let host = &plain["HostConfig"];
    println!(
        "tried: a container whose definition asks for nothing; held: SecurityOpt {} CapDrop {} CapAdd {} PidsLimit {} Privileged {} ReadonlyRootfs {} User {}",
        host["SecurityOpt"],
        host["CapDrop"],
        host["CapAdd"],
        host["PidsLimit"],
        host["Privileged"],
        host["ReadonlyRootfs"],
        plain["User"]
    );
    assert_eq!(host["SecurityOpt"], json!(["no-new-privileges"]));
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert!(host.get("CapAdd").is_none_or(Value::is_null), "{host}");
    assert_eq!(host["PidsLimit"], 4096);
    assert_eq!(host["Privileged"], false);
    assert_eq!(host["ReadonlyRootfs"], false);
    assert!(
        plain.get("User").is_none_or(Value::is_null),
        "without --task-uids the image's own user: {plain}"
    );

    let asks = body("asks");
    let host = &asks["HostConfig"];
    println!(
        "tried: a container asking for user 1000:1000, a read-only root and NET_BIND_SERVICE; held: User {} ReadonlyRootfs {} CapDrop {} CapAdd {}",
        asks["User"], host["ReadonlyRootfs"], host["CapDrop"], host["CapAdd"]
    );
    assert_eq!(asks["User"], "1000:1000");
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert_eq!(host["CapAdd"], json!(["NET_BIND_SERVICE"]));
    assert_eq!(host["SecurityOpt"], json!(["no-new-privileges"]));

    let privileged = body("priv");
    let host = &privileged["HostConfig"];
    println!(
        "tried: a privileged container (its pool allowed it); held: Privileged {} PidsLimit {}",
        host["Privileged"], host["PidsLimit"]
    );
    assert_eq!(host["Privileged"], true);
    assert!(host.get("SecurityOpt").is_none_or(Value::is_null), "{host}");
    assert_eq!(host["PidsLimit"], 4096, "a pid limit whatever it asks");
}

/// Attack: two tasks' containers under one uid could read each other's files on shared
/// volumes and signal each other. With --task-uids each runs as a uid of its own, unless
/// its definition names a user.
#[tokio::test]
async fn with_task_uids_each_container_runs_as_its_tasks_own_uid() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: --task-uids needs the agent to run as root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let state = dir.path().join("agent");
    let mut rt = Runtime::open(&state, 1 << 20, None)
        .expect("runtime")
        .task_uids(310_000, 310_009)
        .expect("task uids")
        .pids_max(100);
    rt.attach_engine(
        Engine::connect(&fake.socket)
            .await
            .expect("the fake answers"),
    )
    .await
    .expect("adopt");
    let mut named = cpu_task("named");
    named.containers[0].security.user = Some("app".into());
    rt.converge(&[cpu_task("one"), cpu_task("two"), named]);
    until(&mut rt, "running", |r| {
        r.iter().filter(|t| t.running).count() == 3
    })
    .await;
    let user = |task: &str| {
        fake.requests("POST", "/containers/create")
            .into_iter()
            .find(|r| r.query["name"].ends_with(&format!("-{task}-worker")))
            .expect("created")
            .body["User"]
            .clone()
    };
    let (one, two) = (user("one"), user("two"));
    println!("tried: two tasks' containers on one host; held: they run as {one} and {two}");
    for u in [&one, &two] {
        let (uid, gid) = u.as_str().and_then(|s| s.split_once(':')).expect("uid:gid");
        assert_eq!(uid, gid);
        assert!(
            (310_000..=310_009).contains(&uid.parse::<u32>().expect("a uid")),
            "{u}"
        );
    }
    assert_ne!(one, two);
    assert_eq!(user("named"), "app", "the definition's user wins");
    let create = &fake.requests("POST", "/containers/create")[0].body;
    assert_eq!(create["HostConfig"]["PidsLimit"], 100);
}

/// Runs `command` in task `id` through the runtime's exec, typing `typed` then ending its
/// input; everything it wrote and its exit code.
async fn exec_in(
    rt: &Runtime,
    id: &str,
    command: &[&str],
    tty: bool,
    typed: &str,
) -> (String, Option<i32>) {
    use tessera_model::agent::streams::{ExecRequest, InputPiece};
    let mut exec = rt
        .exec(
            id,
            &ExecRequest {
                container: None,
                command: command.iter().map(|w| (*w).to_owned()).collect(),
                tty,
            },
        )
        .expect("started");
    exec.input
        .send(InputPiece::Data(typed.as_bytes().to_vec()))
        .await
        .expect("typed");
    exec.input.send(InputPiece::Eof).await.expect("ended");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(piece) = exec.output.recv().await {
            out.extend(piece);
        }
    })
    .await
    .expect("its output ends");
    let code = tokio::time::timeout(Duration::from_secs(10), exec.done)
        .await
        .expect("it ends")
        .expect("an answer");
    (String::from_utf8_lossy(&out).into_owned(), code)
}

#[tokio::test]
async fn exec_in_a_container_goes_through_the_engines_exec_with_its_input_and_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(dir.path()).await;
    let mut rt = runtime(&dir.path().join("agent"), &fake).await;
    rt.converge(&[cpu_task("c1")]);
    until(&mut rt, "running", running("c1")).await;
    let name = fake.requests("POST", "/containers/create")[0].query["name"].clone();

    let (out, code) = exec_in(&rt, "c1", &["sh", "-c", "cat"], false, "hello\n").await;
    assert_eq!(out, "ran: sh -c cat\nHELLO\n");
    assert_eq!(code, Some(7), "the exit code the engine reports");
    // What the engine was asked: an exec in the task's container, attached, no TTY.
    let created = fake.requests("POST", &format!("/containers/{name}/exec"));
    assert_eq!(created.len(), 1);
    let body = &created[0].body;
    assert_eq!(body["Cmd"], serde_json::json!(["sh", "-c", "cat"]));
    assert_eq!(body["AttachStdin"], true);
    assert_eq!(body["AttachStdout"], true);
    assert_eq!(body["AttachStderr"], true);
    assert_eq!(body["Tty"], false);
    assert!(
        body.get("Privileged").is_none_or(|p| p == false),
        "never privileged: {body}"
    );
    let started = fake.requests("POST", "/start");
    assert!(
        started
            .iter()
            .any(|r| r.path.starts_with("/exec/") && r.body["upgrade"] == true),
        "started attached, over the hijacked connection: {started:?}"
    );

    // With a terminal: the raw bytes, no frames.
    let (out, _) = exec_in(&rt, "c1", &["sh"], true, "ls\n").await;
    assert_eq!(out, "ran: sh\nLS\n");

    // A task that is not here: refused, saying so.
    let refused = rt.exec(
        "elsewhere",
        &tessera_model::agent::streams::ExecRequest {
            container: None,
            command: vec!["true".into()],
            tty: false,
        },
    );
    assert!(
        refused
            .err()
            .is_some_and(|e| e.contains("not running on this host"))
    );
}
