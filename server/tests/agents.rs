//! The server and real agents together, over HTTP (and HTTPS) on loopback: agents with
//! simulated GPUs and a stand-in MPS control program, running real processes.

use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tessera_agent::{Agent, AgentConfig};
use tessera_control::inputs::{PoolInput, ServiceInput};
use tessera_control::store::TaskFilter;
use tessera_control::testkit::wait_until;
use tessera_control::{Control, ControlConfig};
use tessera_model::service::{DeploymentConfig, ServiceConstraints, Task, TaskState};
use tessera_model::{HostId, HostStatus, PoolName};
use tessera_server::{AppState, TlsFiles, run};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const JOIN: &str = "agents-test-join-token-1";

struct Cluster {
    control: Control,
    url: String,
    dir: tempfile::TempDir,
    _stop: watch::Sender<bool>,
}

async fn cluster() -> Cluster {
    cluster_over(false).await
}

/// A control plane on the database in `dir`, with fast timings.
async fn control_on(dir: &Path) -> Control {
    let store = tessera_control::open(&format!("sqlite://{}/server.db", dir.display()))
        .await
        .expect("store");
    Control::new(
        store,
        ControlConfig {
            sync_interval: Duration::from_secs(1),
            lost_after_intervals: 3,
            tick: Duration::from_millis(100),
            ..ControlConfig::default()
        },
    )
}

/// A server over HTTPS (a certificate made now for `localhost`) or plain HTTP.
async fn cluster_over(https: bool) -> Cluster {
    let dir = tempfile::tempdir().expect("dir");
    let control = control_on(dir.path()).await;
    control
        .agents()
        .ensure_join_token(Some(JOIN))
        .await
        .expect("join token");
    control
        .deployments()
        .create_pool(&PoolInput::named("gpu"))
        .await
        .expect("pool");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (url, tls) = if https {
        let made =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert, made.cert.pem()).expect("cert");
        std::fs::write(&key, made.signing_key.serialize_pem()).expect("key");
        (
            format!("https://localhost:{}", addr.port()),
            Some(TlsFiles { cert, key }),
        )
    } else {
        (format!("http://{addr}"), None)
    };
    let stop = serve(&control, listener, addr, tls);
    Cluster {
        control,
        url,
        dir,
        _stop: stop,
    }
}

/// Serves `control` on `listener`, with its reconcile loop, until the sender says stop.
fn serve(
    control: &Control,
    listener: tokio::net::TcpListener,
    addr: std::net::SocketAddr,
    tls: Option<TlsFiles>,
) -> watch::Sender<bool> {
    let (stop, stop_rx) = watch::channel(false);
    let state = AppState::new(control.clone(), addr);
    let mut s1 = stop_rx.clone();
    tokio::spawn(run(listener, state, tls, async move {
        let _ = s1.changed().await;
    }));
    let (c, mut s2) = (control.clone(), stop_rx);
    tokio::spawn(async move {
        c.run(async move {
            let _ = s2.changed().await;
        })
        .await
    });
    stop
}

fn fake_mps() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/fake-mps-control")
}

fn agent_config(c: &Cluster, name: &str) -> AgentConfig {
    AgentConfig {
        server: c.url.clone(),
        ca_cert: None,
        insecure_http: false,
        join_token: Some(JOIN.into()),
        state_dir: c.dir.path().join(name),
        pool: PoolName::new("gpu").expect("valid"),
        name: name.into(),
        labels: Default::default(),
        resources: Some((
            tessera_model::MilliCpu(16_000),
            tessera_model::MiB(64 * 1024),
        )),
        simulate: Some("2xL4-24GB".into()),
        mps_control: Some(fake_mps()),
        max_mps_restarts: 0,
        no_mps: false,
        log_cap: 1 << 20,
        stop_tasks_on_exit: true,
        log_retention: Duration::from_secs(3600),
        run_as: None,
        containers: tessera_agent::ContainerRuntime::Process,
        advertise_address: Some("127.0.0.1".into()),
        port_range: (32768, 60999),
        provider_id: None,
    }
}

/// A running agent; dropping the handle's abort simulates the agent dying.
struct RunningAgent {
    handle: JoinHandle<()>,
    stop: watch::Sender<bool>,
}

fn start_agent(config: AgentConfig) -> RunningAgent {
    let (stop, mut rx) = watch::channel(false);
    let agent = Agent::new(config).expect("agent");
    let handle = tokio::spawn(async move {
        agent
            .run(async move {
                let _ = rx.changed().await;
            })
            .await
            .expect("agent runs");
    });
    RunningAgent { handle, stop }
}

impl RunningAgent {
    /// Clean exit: the test agents stop their tasks.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.handle.await;
    }

    /// The agent dies without a word; its tasks keep running.
    fn kill(self) {
        self.handle.abort();
    }
}

/// Waits until host `name`'s agent has synced `n` more times.
async fn syncs(c: &Cluster, name: &str, n: usize) {
    for _ in 0..n {
        let before = c
            .control
            .views()
            .get_host(&host(name))
            .await
            .expect("host")
            .last_seen;
        wait_until("the agent's next sync", || async {
            c.control
                .views()
                .get_host(&host(name))
                .await
                .expect("host")
                .last_seen
                != before
        })
        .await;
    }
}

async fn register(c: &Cluster, family: &str, command: &str, out: &Path) {
    c.control
        .deployments().register_task_definition(&json!({
            "family": family,
            "containers": [{"name": "main", "command": ["sh", "-c", command], "cpu_milli": 1000, "memory_mib": 256,
                "env": {"OUT": out.display().to_string()},
                "gpu": {"mps": {"memory_mib": 8192, "max_compute_percent": 25}}}]
        }))
        .await
        .expect("definition");
}

async fn create_service(c: &Cluster, name: &str, count: u32) {
    c.control
        .deployments()
        .create_service(&ServiceInput {
            name: name.into(),
            task_definition: format!("{name}:1"),
            pool: "gpu".into(),
            project: None,
            priority: None,
            desired_count: count,
            strategy: None,
            constraints: ServiceConstraints::default(),
            deployment: Some(DeploymentConfig::default()),
            stop_timeout_secs: 2,
            deregistration_delay_secs: 0,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        })
        .await
        .expect("service");
}

async fn tasks(c: &Cluster, states: &[TaskState]) -> Vec<Task> {
    c.control
        .store()
        .list_tasks(&TaskFilter {
            states: states.to_vec(),
            ..Default::default()
        })
        .await
        .expect("tasks")
}

/// Service `web` with two tasks running `command`, both on host `a` (the only host yet);
/// returns a's agent.
async fn two_tasks_on_a(c: &Cluster, command: &str) -> RunningAgent {
    let out = c.dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    register(c, "web", command, &out).await;
    let a = start_agent(agent_config(c, "a"));
    wait_until("host a", || async {
        c.control.store().get_host(&host("a")).await.is_ok()
    })
    .await;
    create_service(c, "web", 2).await;
    wait_until("two tasks on a", || async {
        tasks(c, &[TaskState::Running]).await.len() == 2
    })
    .await;
    a
}

fn host(name: &str) -> HostId {
    HostId::new(name).expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_starts_with_its_gpu_and_mps_environment_and_is_measured() {
    let c = cluster().await;
    let out = c.dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    register(
        &c,
        "envdump",
        // Written aside, then renamed: the test never reads a half-written file.
        "env > \"$OUT/$TESSERA_TASK_ID.part\" && mv \"$OUT/$TESSERA_TASK_ID.part\" \"$OUT/$TESSERA_TASK_ID.env\"; exec sleep 60",
        &out,
    )
    .await;
    let a = start_agent(agent_config(&c, "a"));
    create_service(&c, "envdump", 1).await;
    let written = || {
        std::fs::read_dir(&out).ok().and_then(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "env"))
        })
    };
    wait_until("the task to write its environment", || async {
        written().is_some()
    })
    .await;
    let file = written().expect("file");
    let env: std::collections::HashMap<String, String> = std::fs::read_to_string(&file)
        .expect("env")
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let task = tasks(&c, &[TaskState::Assigned, TaskState::Running])
        .await
        .remove(0);
    assert_eq!(
        env["CUDA_VISIBLE_DEVICES"],
        task.allocations[0].gpu.to_string()
    );
    assert!(env["CUDA_VISIBLE_DEVICES"].starts_with("GPU-SIM-a-"));
    assert_eq!(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=8192M");
    assert_eq!(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "25");
    // The pipe of its GPU's own daemon, which was started seeing that GPU alone.
    let gpu_dir = c
        .dir
        .path()
        .join("a/mps")
        .join(task.allocations[0].gpu.to_string());
    assert_eq!(
        env["CUDA_MPS_PIPE_DIRECTORY"],
        gpu_dir.join("pipe").display().to_string()
    );
    let daemon = std::fs::read_to_string(gpu_dir.join("pipe/daemon.env")).expect("daemon env");
    assert!(
        daemon.contains(&format!(
            "CUDA_VISIBLE_DEVICES={}\n",
            task.allocations[0].gpu
        )),
        "{daemon}"
    );
    assert_eq!(env["TESSERA_TASK_ID"], task.id);
    assert!(!env.contains_key("TESSERA_AGENT_JOIN_TOKEN"));
    // The agent reports what the task uses (simulated: at its peak 60 % of its budget,
    // 88 % to 100 % of that along its cycle).
    wait_until("the task's measured use", || async {
        let t = c.control.store().get_task(&task.id).await.expect("task");
        t.state == TaskState::Running
            && t.measured
                .gpu_memory_peak
                .is_some_and(|m| (4325..=4915).contains(&m.0))
    })
    .await;
    // What it can enforce here is on its host, each missing one with why.
    let caps = c
        .control
        .store()
        .get_host(&host("a"))
        .await
        .expect("host")
        .capabilities
        .expect("said with every sync");
    assert!(
        caps.mps.held && caps.mps.detail.contains("per GPU"),
        "{caps:?}"
    );
    assert!(caps.gpu_discovery.detail.contains("simulated"), "{caps:?}");
    assert!(
        !caps.limits.held && caps.limits.detail.contains("--cgroup-parent"),
        "{caps:?}"
    );
    assert!(!caps.gpu_devices.held, "{caps:?}");
    assert!(
        !caps.containers.held && caps.containers.detail.contains("--runtime process"),
        "{caps:?}"
    );
    // Its agent's version, as the binary says it in every sync.
    let version = c
        .control
        .store()
        .get_host(&host("a"))
        .await
        .expect("host")
        .agent_version;
    assert_eq!(version.as_deref(), Some(tessera_model::version::VERSION));
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_task_is_reported_and_replaced() {
    let c = cluster().await;
    let out = c.dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    register(
        &c,
        "victim",
        "echo $$ > \"$OUT/$TESSERA_TASK_ID.pid\"; exec sleep 60",
        &out,
    )
    .await;
    let a = start_agent(agent_config(&c, "a"));
    create_service(&c, "victim", 1).await;
    wait_until("the task to run", || async {
        tasks(&c, &[TaskState::Running]).await.len() == 1
    })
    .await;
    let first = tasks(&c, &[TaskState::Running]).await.remove(0);
    wait_until("its pid file", || async {
        out.join(format!("{}.pid", first.id)).exists()
    })
    .await;
    let pid = std::fs::read_to_string(out.join(format!("{}.pid", first.id))).expect("pid");
    assert!(
        std::process::Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .expect("kill")
            .success()
    );
    wait_until("the killed task to be stopped and replaced", || async {
        let old = c.control.store().get_task(&first.id).await.expect("task");
        let running = tasks(&c, &[TaskState::Running]).await;
        old.state == TaskState::Stopped && running.len() == 1 && running[0].id != first.id
    })
    .await;
    let old = c.control.store().get_task(&first.id).await.expect("task");
    assert_eq!(old.exit_code, Some(137), "SIGKILL shows as 128 + 9");
    assert!(
        old.stop_reason
            .as_deref()
            .unwrap_or("")
            .contains("exited with code 137"),
        "{:?}",
        old.stop_reason
    );
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_mps_daemon_impairs_the_host_and_its_tasks_move() {
    let c = cluster().await;
    let a = two_tasks_on_a(&c, "exec sleep 60").await;
    let b = start_agent(agent_config(&c, "b"));
    let pid = std::fs::read_to_string(c.dir.path().join("a/mps/GPU-SIM-a-0/pipe/fake-daemon.pid"))
        .expect("daemon pid");
    assert!(
        std::process::Command::new("kill")
            .arg(pid.trim())
            .status()
            .expect("kill")
            .success()
    );
    wait_until("a impaired and its tasks running on b", || async {
        let a_status = c
            .control
            .store()
            .get_host(&host("a"))
            .await
            .expect("a")
            .status;
        let live = tasks(
            &c,
            &[TaskState::Assigned, TaskState::Running, TaskState::Stopping],
        )
        .await;
        a_status == HostStatus::Impaired
            && live.len() == 2
            && live
                .iter()
                .all(|t| t.host == Some(host("b")) && t.state == TaskState::Running)
    })
    .await;
    let events = c
        .control
        .store()
        .list_events(&tessera_control::store::EventFilter {
            host: Some(host("a")),
            limit: 20,
            ..Default::default()
        })
        .await
        .expect("events");
    assert!(
        events
            .iter()
            .any(|e| e.message.contains("MPS control daemon unhealthy")),
        "{events:?}"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_agent_makes_its_host_lost_and_its_tasks_move() {
    let c = cluster().await;
    let a = two_tasks_on_a(&c, "exec sleep 20").await;
    let b = start_agent(agent_config(&c, "b"));
    a.kill();
    wait_until("a lost and its tasks running on b", || async {
        let a_status = c
            .control
            .store()
            .get_host(&host("a"))
            .await
            .expect("a")
            .status;
        let live = tasks(
            &c,
            &[TaskState::Assigned, TaskState::Running, TaskState::Stopping],
        )
        .await;
        a_status == HostStatus::Lost
            && live.len() == 2
            && live
                .iter()
                .all(|t| t.host == Some(host("b")) && t.state == TaskState::Running)
    })
    .await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_does_not_start_its_tasks_twice() {
    let c = cluster().await;
    let out = c.dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    register(
        &c,
        "web",
        "echo started >> \"$OUT/$TESSERA_TASK_ID.starts\"; exec sleep 60",
        &out,
    )
    .await;
    let mut config = agent_config(&c, "a");
    config.stop_tasks_on_exit = false;
    let a = start_agent(config.clone());
    create_service(&c, "web", 2).await;
    wait_until("two tasks running", || async {
        tasks(&c, &[TaskState::Running]).await.len() == 2
    })
    .await;
    let before: Vec<String> = tasks(&c, &[TaskState::Running])
        .await
        .into_iter()
        .map(|t| t.id)
        .collect();
    a.stop().await;
    // The agent comes back with the same state directory.
    config.stop_tasks_on_exit = true;
    let a = start_agent(config);
    syncs(&c, "a", 3).await;
    let after: Vec<String> = tasks(&c, &[TaskState::Running])
        .await
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(before, after, "the same tasks run");
    for id in &after {
        let starts = std::fs::read_to_string(out.join(format!("{id}.starts"))).expect("marker");
        assert_eq!(starts.lines().count(), 1, "task {id} started once");
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_https_an_agent_registers_syncs_and_gets_its_task_secret() {
    let c = cluster_over(true).await;
    let out = c.dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    c.control
        .deployments().register_task_definition(&json!({
            "family": "secretive",
            "containers": [{"name": "main", "command": ["sh", "-c", "echo \"$API_KEY\" > \"$OUT/key\"; exec sleep 60"],
                "cpu_milli": 1000, "memory_mib": 256, "env": {"OUT": out.display().to_string()},
                "secrets": {"API_KEY": "k-over-tls-42"},
                "gpu": {"mps": {"memory_mib": 4096}}}]
        }))
        .await
        .expect("definition");
    // Without the server's certificate the agent cannot register.
    let mut untrusting = agent_config(&c, "b");
    untrusting.join_token = Some(JOIN.into());
    let b = start_agent(untrusting);
    let mut config = agent_config(&c, "a");
    config.ca_cert = Some(c.dir.path().join("cert.pem"));
    let a = start_agent(config);
    wait_until("host a over https", || async {
        c.control.store().get_host(&host("a")).await.is_ok()
    })
    .await;
    c.control
        .deployments()
        .create_service(&ServiceInput {
            name: "secretive".into(),
            task_definition: "secretive:1".into(),
            pool: "gpu".into(),
            project: None,
            priority: None,
            desired_count: 1,
            strategy: None,
            constraints: ServiceConstraints::default(),
            deployment: Some(DeploymentConfig::default()),
            stop_timeout_secs: 2,
            deregistration_delay_secs: 0,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        })
        .await
        .expect("service");
    wait_until("the task to write its secret", || async {
        std::fs::read_to_string(out.join("key")).is_ok_and(|k| k == "k-over-tls-42\n")
    })
    .await;
    assert!(
        c.control.store().get_host(&host("b")).await.is_err(),
        "an agent that does not trust the certificate never registers"
    );
    let state = std::fs::read_to_string(c.dir.path().join("a/runtime.json")).expect("state");
    assert!(
        !state.contains("k-over-tls-42"),
        "the agent's state file keeps no secret"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_agent_rejoins_only_with_a_token_minted_for_it() {
    let c = cluster().await;
    let a = two_tasks_on_a(&c, "exec sleep 60").await;
    let creds = c.dir.path().join("a/credentials.json");
    let old = std::fs::read_to_string(&creds).expect("credentials");
    c.control
        .agents()
        .revoke_host(&host("a"))
        .await
        .expect("revoke");
    // It forgot its join token once registered: a revoked agent does not let itself back in.
    // Absence cannot be awaited: in 1.5 s the agent, syncing about every second, has had its
    // token refused, and it must not have registered again since.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        std::fs::read_to_string(&creds).expect("credentials"),
        old,
        "the revoked agent rejoined by itself"
    );
    // An admin mints a token for it; the agent, restarted with it, rejoins under its old id.
    let admin = tessera_model::auth::Caller {
        name: "admin".into(),
        on_behalf_of: None,
        kind: tessera_model::auth::CallerKind::Session,
        role: tessera_model::auth::Role::Admin,
        token_id: None,
        projects: Default::default(),
        project: None,
    };
    let minted = c
        .control
        .agents()
        .mint_join_token(
            &admin,
            &tessera_model::auth::JoinTokenInput {
                host: Some("a".into()),
                ..Default::default()
            },
        )
        .await
        .expect("minted");
    a.kill();
    let mut config = agent_config(&c, "a");
    config.join_token = Some(minted.token);
    let a = start_agent(config);
    wait_until("the agent to rejoin with a new token", || async {
        std::fs::read_to_string(&creds).is_ok_and(|now| now != old)
    })
    .await;
    let hosts = c.control.store().list_hosts().await.expect("hosts");
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].id, host("a"), "under its old id");
    wait_until("its two tasks running", || async {
        tasks(&c, &[TaskState::Running]).await.len() == 2
    })
    .await;
    a.stop().await;
}

/// Another server on `c`'s database (as behind a load balancer), serving the API and the
/// agent API without a reconcile loop of its own; its stop handle.
async fn second_server(c: &Cluster) -> (Control, String, watch::Sender<bool>) {
    let control = control_on(c.dir.path()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, mut rx) = watch::channel(false);
    tokio::spawn(run(
        listener,
        AppState::new(control.clone(), addr),
        None,
        async move {
            let _ = rx.changed().await;
        },
    ));
    (control, format!("http://{addr}"), stop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_given_two_servers_carries_on_through_the_other_when_one_stops() {
    let c = cluster().await;
    let (other, other_url, _other_stop) = second_server(&c).await;
    let mut config = agent_config(&c, "a");
    config.server = format!("{},{}", c.url, other_url);
    let out = c.dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    register(&c, "web", "exec sleep 60", &out).await;
    let agent = start_agent(config);
    wait_until("host a", || async {
        c.control.views().get_host(&host("a")).await.is_ok()
    })
    .await;
    create_service(&c, "web", 1).await;
    wait_until("the task to run", || async {
        tasks(&c, &[TaskState::Running]).await.len() == 1
    })
    .await;
    let running = tasks(&c, &[TaskState::Running]).await;
    // The first server goes away; the agent's syncs reach the other, which writes the
    // times of quiet syncs when its passes run: here, by hand, as it has no loop.
    let _ = c._stop.send(true);
    for _ in 0..3 {
        let before = other
            .views()
            .get_host(&host("a"))
            .await
            .expect("host")
            .last_seen;
        wait_until("a sync through the other server", || async {
            other.reconcile_once().await.expect("pass");
            other
                .views()
                .get_host(&host("a"))
                .await
                .expect("host")
                .last_seen
                != before
        })
        .await;
    }
    let now = other.views().get_host(&host("a")).await.expect("host");
    assert_eq!(now.status, HostStatus::Active);
    let still: Vec<String> = other
        .views()
        .list_tasks(&TaskFilter {
            states: vec![TaskState::Running],
            ..Default::default()
        })
        .await
        .expect("tasks")
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(
        still,
        running.into_iter().map(|t| t.id).collect::<Vec<_>>(),
        "the same task runs on, never restarted"
    );
    agent.stop().await;
}

/// Processes alive among those whose pid the tasks wrote under `out`.
fn live_processes(out: &Path) -> Vec<String> {
    std::fs::read_dir(out)
        .expect("out")
        .filter_map(|e| {
            let path = e.ok()?.path();
            let pid = std::fs::read_to_string(&path).ok()?;
            let alive = std::process::Command::new("kill")
                .args(["-0", pid.trim()])
                .stderr(std::process::Stdio::null())
                .status()
                .ok()?
                .success();
            let task = path.file_stem()?.to_string_lossy().into_owned();
            alive.then_some(task)
        })
        .collect()
}

/// Service `web`'s definition: each task writes its pid to `$OUT/<task id>.pid` and
/// sleeps; host `a`'s agent started and joined. Returns the agent and `out`.
async fn pid_writers_on_a(c: &Cluster) -> (RunningAgent, PathBuf) {
    let out = c.dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    register(
        c,
        "web",
        "echo $$ > \"$OUT/$TESSERA_TASK_ID.pid\"; exec sleep 600",
        &out,
    )
    .await;
    let a = start_agent(agent_config(c, "a"));
    wait_until("host a", || async {
        c.control.views().get_host(&host("a")).await.is_ok()
    })
    .await;
    (a, out)
}

/// A task's pid, as it wrote it under `out`.
fn pid_of(out: &Path, task: &str) -> String {
    std::fs::read_to_string(out.join(format!("{task}.pid"))).expect("pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consolidation_plan_runs_start_before_stop_on_real_processes() {
    let c = cluster().await;
    let (a, out) = pid_writers_on_a(&c).await;
    // Spread over the host's two GPUs: one of them can be freed.
    c.control
        .deployments()
        .create_service(&ServiceInput {
            name: "web".into(),
            task_definition: "web:1".into(),
            pool: "gpu".into(),
            project: None,
            priority: None,
            desired_count: 2,
            strategy: Some("spread_gpu".into()),
            constraints: ServiceConstraints::default(),
            deployment: Some(DeploymentConfig::default()),
            stop_timeout_secs: 2,
            deregistration_delay_secs: 0,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        })
        .await
        .expect("service");
    wait_until("two processes", || async {
        live_processes(&out).len() == 2
    })
    .await;
    wait_until("both running", || async {
        tasks(&c, &[TaskState::Running]).await.len() == 2
    })
    .await;
    let plan = c
        .control
        .deployments()
        .plan_consolidation(&tessera_model::consolidation::PlanInput {
            pool: "gpu".into(),
            goal: "gpus".into(),
        })
        .await
        .expect("plan");
    assert_eq!(plan.moves.len(), 1, "{plan:?}");
    assert_eq!(plan.frees_gpus.len(), 1);
    let moved = plan.moves[0].task_id.clone();
    // Nothing is committed by planning.
    assert_eq!(tasks(&c, &[TaskState::Running]).await.len(), 2);
    c.control
        .deployments()
        .execute_consolidation_plan(&plan.id)
        .await
        .expect("execute");
    // Until it is done, the service never has fewer than two processes running.
    let mut fewest = usize::MAX;
    let mut most = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let done = loop {
        let alive = live_processes(&out).len();
        fewest = fewest.min(alive);
        most = most.max(alive);
        let p = c
            .control
            .deployments()
            .consolidation_plan(&plan.id)
            .await
            .expect("plan");
        if p.status != tessera_model::consolidation::PlanStatus::Executing
            || std::time::Instant::now() > deadline
        {
            break p;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        done.status,
        tessera_model::consolidation::PlanStatus::Done,
        "{done:?}"
    );
    assert!(fewest >= 2, "a moment with {fewest} process(es) running");
    assert_eq!(most, 3, "the replacement ran beside its original");
    wait_until("the original's process gone", || async {
        !live_processes(&out).contains(&moved)
    })
    .await;
    let running = tasks(&c, &[TaskState::Running]).await;
    assert_eq!(running.len(), 2);
    assert!(running.iter().all(|t| t.id != moved));
    let gpus: std::collections::BTreeSet<u32> = running
        .iter()
        .flat_map(|t| t.allocations.iter().map(|a| a.index))
        .collect();
    assert_eq!(gpus.len(), 1, "both tasks share one GPU now: {gpus:?}");
    assert_eq!(live_processes(&out).len(), 2);
    a.stop().await;
}

/// `GET /api/v1/tasks/{id}/logs` with an admin's token: the answer's status and body.
async fn logs(c: &Cluster, task: &str, query: &str) -> (reqwest::StatusCode, String) {
    let token = tessera_control::bench::api_token(&c.control, tessera_model::auth::Role::Admin)
        .await
        .expect("token");
    let r = reqwest::Client::new()
        .get(format!("{}/api/v1/tasks/{task}/logs?{query}", c.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("answer");
    (r.status(), r.text().await.expect("body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_logs_come_from_its_agent_and_a_follow_gets_each_new_line() {
    let c = cluster().await;
    let a = two_tasks_on_a(
        &c,
        "i=0; while true; do echo line-$i; echo err-$i >&2; i=$((i+1)); sleep 0.1; done",
    )
    .await;
    let task = tasks(&c, &[TaskState::Running]).await.remove(0);
    wait_until("a few lines written", || async {
        logs(&c, &task.id, "").await.1.lines().count() >= 6
    })
    .await;
    let (status, body) = logs(&c, &task.id, "tail=4").await;
    assert_eq!(status, 200, "{body}");
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines.len(), 4, "{body}");
    assert!(
        lines.iter().any(|l| l.starts_with("err-")) && lines.iter().any(|l| l.starts_with("line-")),
        "standard output and error, in the order written: {body}"
    );
    // Stamps, and lines since a moment only.
    let (_, stamped) = logs(&c, &task.id, "tail=1&timestamps=true").await;
    assert!(
        stamped.starts_with("20") && stamped.contains("Z "),
        "{stamped}"
    );
    // (The task writes at most 20 lines a second: 30 span more than the last second.)
    wait_until("more than a second of lines", || async {
        logs(&c, &task.id, "").await.1.lines().count() >= 30
    })
    .await;
    let (_, recent) = logs(&c, &task.id, "since=1s").await;
    let (_, all) = logs(&c, &task.id, "").await;
    assert!(recent.lines().count() < all.lines().count(), "{recent}");

    // A follow gets lines written after it began, as they come.
    let token = tessera_control::bench::api_token(&c.control, tessera_model::auth::Role::Admin)
        .await
        .expect("token");
    let mut follow = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/tasks/{}/logs?follow=true&tail=0",
            c.url, task.id
        ))
        .bearer_auth(token)
        .send()
        .await
        .expect("follow");
    assert_eq!(follow.status(), 200);
    let mut got = String::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        while got.lines().filter(|l| l.starts_with("line-")).count() < 5 {
            let chunk = follow.chunk().await.expect("chunk").expect("more");
            got.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("five new lines within 10 s; got {got:?}"));
    let numbers: Vec<u32> = got
        .lines()
        .filter_map(|l| l.strip_prefix("line-")?.parse().ok())
        .collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");

    // No such task: 404. A bad parameter: 422, naming it.
    assert_eq!(logs(&c, "no-such-task", "").await.0, 404);
    let (status, body) = logs(&c, &task.id, "since=yesterday").await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("since"), "{body}");

    // The agent gone mid-follow: the follow ends, saying why.
    let token = tessera_control::bench::api_token(&c.control, tessera_model::auth::Role::Admin)
        .await
        .expect("token");
    let follow = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/tasks/{}/logs?follow=true&tail=1",
            c.url, task.id
        ))
        .bearer_auth(token)
        .send()
        .await
        .expect("follow");
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.kill();
    let ended = tokio::time::timeout(Duration::from_secs(30), follow.text())
        .await
        .expect("the follow ends within 30 s")
        .expect("body");
    assert!(
        ended
            .trim_end()
            .lines()
            .last()
            .is_some_and(|l| l.contains("stopped answering")),
        "{ended}"
    );
    // The host lost: the logs say so instead of waiting.
    wait_until("host a lost", || async {
        c.control
            .store()
            .get_host(&host("a"))
            .await
            .expect("host")
            .status
            == HostStatus::Lost
    })
    .await;
    let (status, body) = logs(&c, &task.id, "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("tessera: host a cannot be reached"), "{body}");
}

/// Runs `tessera exec ARGS` against the cluster with an operator's token and `stdin`;
/// its exit code, standard output and standard error.
async fn tessera_exec(c: &Cluster, args: &[&str], stdin: &str) -> (i32, String, String) {
    use tokio::io::AsyncWriteExt;
    let token = tessera_control::bench::api_token(&c.control, tessera_model::auth::Role::Admin)
        .await
        .expect("token");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("exec")
        .args(args)
        .env("TESSERA_CONFIG_DIR", c.dir.path().join("no-login"))
        .env("TESSERA_URL", &c.url)
        .env("TESSERA_TOKEN", token)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("tessera");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).await.expect("typed");
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("exec ends within 30 s")
        .expect("output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_in_the_task_where_its_pool_allows_it() {
    let c = cluster().await;
    let a = two_tasks_on_a(&c, "sleep 300").await;
    let task = tasks(&c, &[TaskState::Running]).await.remove(0);
    // The pool does not allow it (the default).
    let (code, _, err) = tessera_exec(&c, &[&task.id, "--", "true"], "").await;
    assert_ne!(code, 0);
    assert!(err.contains("does not allow commands"), "{err}");
    c.control
        .deployments()
        .update_pool(
            &PoolName::new("gpu").expect("valid"),
            &tessera_model::api::PoolPatch {
                exec: Some(true),
                ..Default::default()
            },
        )
        .await
        .expect("exec allowed");

    // A command: in the task's environment, its exit code the command's.
    let (code, out, err) = tessera_exec(
        &c,
        &[
            &task.id,
            "--",
            "sh",
            "-c",
            "echo out=$OUT; echo oops >&2; exit 3",
        ],
        "",
    )
    .await;
    assert_eq!(code, 3, "{out} {err}");
    assert!(
        out.contains(&format!("out={}", c.dir.path().join("out").display())),
        "{out}"
    );
    assert!(out.contains("oops"), "standard error comes too: {out}");

    // Interactive, on a terminal of its own.
    let (code, out, err) = tessera_exec(
        &c,
        &["-it", &task.id, "--", "sh"],
        "tty\necho typed-$((40+2))\nexit 5\n",
    )
    .await;
    assert_eq!(code, 5, "{out} {err}");
    assert!(out.contains("/dev/pts/"), "{out}");
    assert!(out.contains("typed-42"), "{out}");

    // Input piped in without a terminal.
    let (code, out, _) = tessera_exec(&c, &["-i", &task.id, "--", "wc", "-l"], "a\nb\nc\n").await;
    assert_eq!((code, out.trim()), (0, "3"));

    // Bad input: no such task, no such container.
    let (code, _, err) = tessera_exec(&c, &["no-such-task", "--", "true"], "").await;
    assert_ne!(code, 0);
    assert!(err.contains("no task"), "{err}");
    let (code, _, err) =
        tessera_exec(&c, &["--container", "other", &task.id, "--", "true"], "").await;
    assert_ne!(code, 0);
    assert!(err.contains("no container \"other\""), "{err}");
    a.stop().await;
}

/// An agent's batch of output: each piece reaches its own stream's client, and the answer
/// says piece by piece what became of it; a client that does not read holds up its own
/// stream only, and a host reaches only its own streams.
#[tokio::test]
async fn a_batch_of_output_reaches_each_streams_client_and_says_what_became_of_each() {
    use tessera_control::streams::Piece;
    use tessera_model::agent::streams::{LogRequest, OutputAnswer, OutputBatch, StreamKind, Taken};
    let c = cluster().await;
    let admitted = tessera_control::bench::admit_simulated_hosts(&c.control, 2, 1, |_| {
        PoolName::new("gpu").expect("pool")
    })
    .await
    .expect("hosts");
    let relay = c.control.streams().relay();
    let logs = || StreamKind::Logs(LogRequest::default());
    let (a, b) = (&admitted[0], &admitted[1]);
    let slow = relay.open(&a.host_id, "t1", logs()).expect("open");
    let mut quick = relay.open(&a.host_id, "t2", logs()).expect("open");
    let foreign = relay.open(&b.host_id, "t3", logs()).expect("open");
    let post = |token: String, body: Vec<u8>| {
        let url = format!("{}/agent/v1/streams/output", c.url);
        async move {
            reqwest::Client::new()
                .post(url)
                .bearer_auth(token)
                .body(body)
                .send()
                .await
                .expect("answers")
        }
    };
    let piece = |id: &str, bytes: &[u8]| (id.to_owned(), bytes.to_vec());
    // The slow client's stream fills up (nothing is read), piece by piece.
    let mut said = Vec::new();
    for _ in 0..20 {
        let body = OutputBatch {
            pieces: vec![piece(slow.id(), b"slow\n")],
        };
        let answer: OutputAnswer = post(a.agent_token.clone(), body.encode())
            .await
            .json()
            .await
            .expect("json");
        said.extend(answer.pieces);
    }
    assert!(said.starts_with(&[Taken::Taken]), "{said:?}");
    assert_eq!(said.last(), Some(&Taken::Full), "{said:?}");
    let body = OutputBatch {
        pieces: vec![
            piece(slow.id(), b"more\n"),
            piece(quick.id(), b"quick\n"),
            piece(foreign.id(), b"not mine\n"),
            piece("no-such-stream", b"x"),
            piece(slow.id(), b""),
        ],
    };
    let answer = post(a.agent_token.clone(), body.encode()).await;
    assert_eq!(answer.status(), 200);
    let answer: OutputAnswer = answer.json().await.expect("json");
    assert_eq!(
        answer.pieces,
        vec![
            Taken::Full,
            Taken::Taken,
            Taken::Gone,
            Taken::Gone,
            Taken::Taken
        ],
        "full, passed on, another host's, unknown, a heartbeat"
    );
    match tokio::time::timeout(Duration::from_secs(5), quick.next()).await {
        Ok(Some(Piece::Data(d))) => assert_eq!(d, b"quick\n"),
        other => panic!("the quick client's piece: {other:?}"),
    }
    // A body that is not a batch: 400, saying where; an unknown token: 401.
    let mut cut = OutputBatch {
        pieces: vec![piece(quick.id(), b"line\n")],
    }
    .encode();
    cut.pop();
    let refused = post(a.agent_token.clone(), cut).await;
    assert_eq!(refused.status(), 400);
    let why = refused.text().await.expect("text");
    assert!(why.contains("piece 0") && why.contains("cut off"), "{why}");
    let unknown = post("not-a-token".into(), Vec::new()).await;
    assert_eq!(unknown.status(), 401);
    drop((slow, foreign));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_read_through_a_server_the_agent_does_not_sync_with() {
    let c = cluster().await;
    let (other, other_url, _other_stop) = second_server(&c).await;
    let mut config = agent_config(&c, "a");
    config.server = format!("{},{}", c.url, other_url);
    let out = c.dir.path().join("out");
    std::fs::create_dir_all(&out).expect("out");
    register(&c, "web", "echo hello-from-the-task; exec sleep 60", &out).await;
    let agent = start_agent(config);
    wait_until("host a", || async {
        c.control.views().get_host(&host("a")).await.is_ok()
    })
    .await;
    create_service(&c, "web", 1).await;
    wait_until("the task to run", || async {
        tasks(&c, &[TaskState::Running]).await.len() == 1
    })
    .await;
    let task = tasks(&c, &[TaskState::Running]).await.remove(0);
    // The agent syncs with the first server; the client asks the other.
    let token = tessera_control::bench::api_token(&other, tessera_model::auth::Role::Admin)
        .await
        .expect("token");
    let mut said = String::new();
    for _ in 0..50 {
        said = reqwest::Client::new()
            .get(format!("{other_url}/api/v1/tasks/{}/logs", task.id))
            .bearer_auth(&token)
            .send()
            .await
            .expect("answer")
            .text()
            .await
            .expect("body");
        if said.contains("hello-from-the-task") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(said.contains("hello-from-the-task"), "{said}");
    agent.stop().await;
}

/// The restore drill: a backup taken while the fleet runs, more started after it, then the
/// server replaced by one on the restored copy, at the same address. The copy is aged as
/// a backup taken an hour earlier would be (its hosts last heard from an hour before): the
/// restored server does not declare them lost before their agents sync again. The agent's
/// tasks that the backup knows run on, never restarted; the one started after it (which
/// the restored server never heard of) is stopped; no task runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_runs_no_task_twice_and_restarts_none_it_knows() {
    let c = cluster().await;
    let (agent, out) = pid_writers_on_a(&c).await;
    create_service(&c, "web", 2).await;
    wait_until("two tasks running", || async {
        live_processes(&out).len() == 2 && tasks(&c, &[TaskState::Running]).await.len() == 2
    })
    .await;
    let mut known: Vec<String> = live_processes(&out);
    known.sort();
    let pids: Vec<String> = known.iter().map(|t| pid_of(&out, t)).collect();
    let url = format!("sqlite://{}/server.db", c.dir.path().display());
    let backup = c.dir.path().join("backup.db");
    tessera_control::sqlite::backup::backup(&url, &backup)
        .await
        .expect("backup");
    println!("step 1: backed up while 2 tasks ran: {known:?}");

    // After the backup: one more task.
    c.control
        .deployments()
        .update_service(
            "web",
            &tessera_model::api::ServicePatch {
                desired_count: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("scale");
    wait_until("a third task running", || async {
        live_processes(&out).len() == 3
    })
    .await;
    let later: Vec<String> = live_processes(&out)
        .into_iter()
        .filter(|t| !known.contains(t))
        .collect();
    println!("step 2: started after the backup: {later:?}");

    // The server stops; the restored copy is put in place; a server starts on it at the
    // same address.
    let addr: std::net::SocketAddr = c
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let _ = c._stop.send(true);
    let restored_dir = c.dir.path().join("restored");
    std::fs::create_dir_all(&restored_dir).expect("dir");
    std::fs::copy(&backup, restored_dir.join("server.db")).expect("restore");
    age_by_an_hour(&restored_dir.join("server.db")).await;
    let restored = control_on(&restored_dir).await;
    let listener = loop {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("reuse");
        if socket.bind(addr).is_ok() {
            break socket.listen(128).expect("listen");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let stop = serve(&restored, listener, addr, None);
    println!("step 3: the server restarted on the restored copy at {addr}");

    // The agent syncs with the restored server: what it never heard of is stopped.
    wait_until("the task started after the backup stopped", || async {
        let mut live = live_processes(&out);
        live.sort();
        live == known
    })
    .await;
    for _ in 0..3 {
        let before = restored
            .views()
            .get_host(&host("a"))
            .await
            .expect("host")
            .last_seen;
        wait_until("a sync with the restored server", || async {
            restored
                .views()
                .get_host(&host("a"))
                .await
                .expect("host")
                .last_seen
                != before
        })
        .await;
    }
    let mut running: Vec<String> = restored
        .views()
        .list_tasks(&TaskFilter {
            states: vec![TaskState::Running],
            ..Default::default()
        })
        .await
        .expect("tasks")
        .into_iter()
        .map(|t| t.id)
        .collect();
    running.sort();
    assert_eq!(
        running, known,
        "the restored server runs what the backup knew"
    );
    let mut live = live_processes(&out);
    live.sort();
    assert_eq!(
        live, known,
        "each known task runs once; the later one is stopped"
    );
    let pids_now: Vec<String> = known.iter().map(|t| pid_of(&out, t)).collect();
    assert_eq!(pids_now, pids, "never restarted");
    let a = restored.views().get_host(&host("a")).await.expect("host");
    assert_eq!(
        a.status,
        HostStatus::Active,
        "silent an hour in the copy, never lost"
    );
    println!("step 4: running {running:?}, each once, never restarted; stopped {later:?}");
    agent.stop().await;
    let _ = stop.send(true);
}

/// Makes a backup look an hour old: every host last heard from an hour before it was taken.
async fn age_by_an_hour(db: &Path) {
    use sqlx::Connection;
    let mut c = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .expect("open the copy");
    let aged = sqlx::query(
        "UPDATE hosts SET last_seen_at = strftime('%Y-%m-%dT%H:%M:%fZ', last_seen_at, '-1 hour') \
         WHERE last_seen_at IS NOT NULL",
    )
    .execute(&mut c)
    .await
    .expect("age the copy");
    assert!(aged.rows_affected() >= 1, "no host to age");
    c.close().await.expect("close the copy");
}

/// A follow of a quiet task stays open past the server's silence limit (20 s): its
/// agent's heartbeats reach the server's side, and an event stream's client hears them
/// as comments (which keep proxies between from closing it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_tasks_follow_stays_open_and_hears_that_its_agent_is_there() {
    let c = cluster().await;
    let a = two_tasks_on_a(&c, "echo hello; exec sleep 600").await;
    let task = tasks(&c, &[TaskState::Running]).await.remove(0);
    let token = tessera_control::bench::api_token(&c.control, tessera_model::auth::Role::Admin)
        .await
        .expect("token");
    let mut follow = reqwest::Client::new()
        .get(format!(
            "{}/api/v1/tasks/{}/logs?follow=true&tail=10",
            c.url, task.id
        ))
        .header("accept", "text/event-stream")
        .bearer_auth(token)
        .send()
        .await
        .expect("follow");
    assert_eq!(follow.status(), 200);
    let mut got = String::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(26);
    while let Ok(chunk) = tokio::time::timeout_at(until, follow.chunk()).await {
        match chunk.expect("chunk") {
            Some(c) => got.push_str(&String::from_utf8_lossy(&c)),
            None => break,
        }
    }
    assert!(got.contains("data: hello"), "{got}");
    assert!(!got.contains("event: end"), "still open after 26 s: {got}");
    assert!(got.matches(":\n\n").count() >= 3, "{got}");
    a.stop().await;
}
