//! The test kit (feature `testing`): what the control plane's and the server's tests build
//! their fleets with, so that each does it the same way.
//!
//! - A database: [`TestDb`], fresh and empty per test, SQLite in a temporary directory or,
//!   with `TESSERA_TEST_STORE=postgres`, a new database on a PostgreSQL server; it can
//!   stall the database or edit it behind the store's back.
//! - A control plane: [`env()`] (on a [`TestDb`], with a manual clock, the join token
//!   [`JOIN`] and pool `gpu`; [`fast`] timings), [`Env::restart`] (another server on the
//!   same database), [`in_memory`] (on an in-memory store, the default configuration).
//! - Hosts and agents: [`gpus`] and [`gpus_of`], [`registration`], [`host`] (registered
//!   through the agent API), [`sync`] and [`sync_with`] (a stand-in agent that runs what it
//!   is asked to).
//! - Workloads: [`register_def`], [`service`], [`deploy`], and [`tasks`] (in the states
//!   asked, [`LIVE`] for those not ended).
//! - Checks: [`assert_no_overcommit`], and [`wait_until`] for what a test waits on (a
//!   loop's tick, an agent's sync, a process) instead of sleeping a fixed time.

use crate::clock::ManualClock;
use crate::inputs::{PoolInput, ServiceInput};
use crate::store::TaskFilter;
use crate::{Control, ControlConfig};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tessera_model::agent::{
    GpuReport, MpsReport, RegisterRequest, SyncRequest, SyncResponse, TaskReport,
};
use tessera_model::service::{DeploymentConfig, ServiceConstraints, Task, TaskState};
use tessera_model::{GpuUuid, HostId, MiB, MilliCpu, PoolName};

/// The join token of [`env()`]'s control plane.
pub const JOIN: &str = "test-join-token-0123456789";

/// A fresh, empty database for one test. SQLite in a temporary directory, unless
/// `TESSERA_TEST_STORE=postgres`: then a new database on the PostgreSQL server at
/// `TESSERA_TEST_POSTGRES` (`scripts/with-postgres.sh` starts a throwaway one), so the same
/// tests run against both backends.
pub struct TestDb {
    pub url: String,
    _dir: tempfile::TempDir,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = match std::env::var("TESSERA_TEST_STORE").as_deref() {
            Ok("postgres") => postgres_database().await,
            Ok("sqlite") | Err(_) => format!("sqlite://{}/t.db", dir.path().display()),
            Ok(other) => panic!("TESSERA_TEST_STORE={other:?}: expected sqlite or postgres"),
        };
        TestDb { url, _dir: dir }
    }

    pub fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres")
    }

    pub async fn open(&self) -> Arc<dyn crate::Store> {
        crate::open(&self.url).await.expect("store")
    }

    /// Stalls the database for `how_long` from now: another connection holds what the
    /// control plane's every-tick write needs (SQLite's write lock; PostgreSQL's `servers`
    /// table), as a database restarting or overloaded would keep it waiting.
    pub async fn stall(&self, how_long: Duration) -> tokio::task::JoinHandle<()> {
        use sqlx::Connection;
        if self.is_postgres() {
            let mut conn = sqlx::PgConnection::connect(&self.url).await.expect("db");
            sqlx::query("BEGIN")
                .execute(&mut conn)
                .await
                .expect("begin");
            sqlx::query("LOCK TABLE servers IN ACCESS EXCLUSIVE MODE")
                .execute(&mut conn)
                .await
                .expect("lock");
            tokio::spawn(async move {
                tokio::time::sleep(how_long).await;
                sqlx::query("COMMIT")
                    .execute(&mut conn)
                    .await
                    .expect("commit");
            })
        } else {
            let mut conn = sqlx::SqliteConnection::connect(&self.url)
                .await
                .expect("db");
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut conn)
                .await
                .expect("lock");
            tokio::spawn(async move {
                tokio::time::sleep(how_long).await;
                sqlx::query("COMMIT")
                    .execute(&mut conn)
                    .await
                    .expect("commit");
            })
        }
    }

    /// Runs `sql` on the database behind the store's back (a hand edit, a corruption).
    pub async fn execute(&self, sql: &str) {
        use sqlx::Connection;
        if self.is_postgres() {
            let mut conn = sqlx::PgConnection::connect(&self.url).await.expect("db");
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .expect("statement");
        } else {
            let mut conn = sqlx::SqliteConnection::connect(&self.url)
                .await
                .expect("db");
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .expect("statement");
        }
    }
}

/// A new database on the server at `TESSERA_TEST_POSTGRES`; its URL.
async fn postgres_database() -> String {
    let admin = std::env::var("TESSERA_TEST_POSTGRES").expect(
        "TESSERA_TEST_STORE=postgres needs TESSERA_TEST_POSTGRES: run the tests under scripts/with-postgres.sh",
    );
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    crate::bench::fresh_postgres_database(&admin, &name)
        .await
        .expect("a test database on the test PostgreSQL server")
}

pub struct Env {
    pub control: Control,
    /// The control plane's time: tests move it instead of sleeping.
    pub clock: Arc<ManualClock>,
    pub db: TestDb,
}

impl Env {
    /// The database's URL.
    pub fn url(&self) -> String {
        self.db.url.clone()
    }

    /// A new control plane on the same database: the server restarted.
    pub async fn restart(&self, config: ControlConfig) -> Control {
        let store = crate::open(&self.url()).await.expect("store");
        Control::new(
            store,
            ControlConfig {
                clock: self.clock.clone(),
                ..config
            },
        )
    }
}

/// A control plane on a fresh [`TestDb`] with `config` and a manual clock; agents join with
/// [`JOIN`], and pool `gpu` exists.
pub async fn env(config: ControlConfig) -> Env {
    let db = TestDb::new().await;
    let store = db.open().await;
    let clock = Arc::new(ManualClock::default());
    let control = Control::new(
        store,
        ControlConfig {
            clock: clock.clone(),
            ..config
        },
    );
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
    Env { control, clock, db }
}

/// Timings for tests: a sync every second, a host lost after two missed, a 50 ms tick.
pub fn fast() -> ControlConfig {
    ControlConfig {
        sync_interval: Duration::from_secs(1),
        lost_after_intervals: 2,
        tick: Duration::from_millis(50),
        // What a test's agents report is in the next reading of the fleet.
        fleet_measured_every: Duration::ZERO,
        ..ControlConfig::default()
    }
}

/// A control plane on an in-memory store with the default configuration, that agents join
/// with `join_token`.
pub async fn in_memory(join_token: &str) -> Control {
    let store = crate::open("sqlite::memory:")
        .await
        .expect("in-memory store");
    let control = Control::new(store, ControlConfig::default());
    control
        .agents()
        .ensure_join_token(Some(join_token))
        .await
        .expect("join token");
    control
}

/// Waits until `check` holds, asking again every 100 ms; panics naming `what` when it
/// still does not after 15 s. For what a test cannot make happen itself (a loop's tick, an
/// agent's sync, a process starting or ending), in place of a fixed sleep.
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for(what, Duration::from_secs(15), || {
        let asked = check();
        async move {
            if asked.await {
                Ok(())
            } else {
                Err("not yet".to_owned())
            }
        }
    })
    .await
}

/// The one wait of the tests: asks `check` every 50 ms until it answers `Ok`, and returns
/// what it answered; after `within`, panics naming `what` and the last `Err` (what the
/// check saw instead).
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(seen) => assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {within:?} waiting for: {what} ({seen})"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub struct Host {
    pub id: HostId,
    pub token: String,
    pub gpus: Vec<GpuReport>,
}

impl Host {
    /// The same host (its id and token), reporting `gpus`.
    pub fn clone_with_gpus(&self, gpus: Vec<GpuReport>) -> Host {
        Host {
            id: self.id.clone(),
            token: self.token.clone(),
            gpus,
        }
    }
}

/// `count` healthy GPUs of `model` with `gib` GiB each, named `GPU-{name}-{index}`.
pub fn gpus_of(name: &str, model: &str, count: u32, gib: u64) -> Vec<GpuReport> {
    (0..count)
        .map(|i| GpuReport {
            uuid: GpuUuid::new(format!("GPU-{name}-{i}")).expect("valid"),
            index: i,
            model: model.into(),
            memory_mib: MiB(gib * 1024),
            mps_client_limit: 48,
            healthy: true,
        })
        .collect()
}

/// `count` healthy NVIDIA L4s with `gib` GiB each, as [`gpus_of`] makes them.
pub fn gpus(name: &str, count: u32, gib: u64) -> Vec<GpuReport> {
    gpus_of(name, "NVIDIA L4", count, gib)
}

/// A simulated host's registration (64 cores, 256 GiB) as `name` in `pool`, with
/// `join_token` and `gpus`.
pub fn registration(
    join_token: &str,
    pool: &str,
    name: &str,
    gpus: Vec<GpuReport>,
) -> RegisterRequest {
    RegisterRequest {
        address: None,
        join_token: join_token.into(),
        pool: PoolName::new(pool).expect("valid"),
        cpu_milli: MilliCpu(64_000),
        memory_mib: MiB(256 * 1024),
        simulated: true,
        labels: Default::default(),
        gpus,
        name: Some(name.into()),
        provider_id: None,
        agent_version: Some(tessera_model::version::VERSION.into()),
    }
}

/// Registers a host through the agent API with the join token.
pub async fn host(control: &Control, name: &str, count: u32, gib: u64) -> Host {
    let gpus = gpus(name, count, gib);
    let resp = control
        .agents()
        .register_agent(&registration(JOIN, "gpu", name, gpus.clone()))
        .await
        .expect("register");
    let id = control
        .agents()
        .authenticate_agent(&resp.agent_token)
        .await
        .expect("token works");
    assert_eq!(id, resp.host_id);
    Host {
        id,
        token: resp.agent_token,
        gpus,
    }
}

/// One sync of an agent that runs everything it is asked to, optionally with an unhealthy
/// MPS daemon, and reports `exited` tasks with their exit codes.
pub async fn sync_with(
    control: &Control,
    h: &Host,
    mps_healthy: bool,
    exited: &[(String, i32)],
) -> SyncResponse {
    let id = control
        .agents()
        .authenticate_agent(&h.token)
        .await
        .expect("token");
    let wanted = control
        .store()
        .list_tasks(&TaskFilter {
            host: Some(id.clone()),
            states: vec![TaskState::Assigned, TaskState::Running],
            ..Default::default()
        })
        .await
        .expect("tasks");
    let mut tasks: Vec<TaskReport> = wanted
        .iter()
        .filter(|t| !exited.iter().any(|(e, _)| *e == t.id))
        .map(|t| TaskReport {
            task_id: t.id.clone(),
            running: true,
            ..Default::default()
        })
        .collect();
    tasks.extend(exited.iter().map(|(id, code)| TaskReport {
        task_id: id.clone(),
        running: false,
        exit_code: Some(*code),
        ..Default::default()
    }));
    control
        .agents()
        .sync_agent(
            &id,
            &SyncRequest {
                address: None,
                dynamic_ports_free: None,
                capabilities: None,
                gpus: h.gpus.clone(),
                mps: MpsReport {
                    healthy: mps_healthy,
                    reason: (!mps_healthy).then(|| "control daemon did not answer".into()),
                    restarts: None,
                },
                tasks,
                agent_version: Some(tessera_model::version::VERSION.into()),
            },
        )
        .await
        .expect("sync")
}

/// `h`'s report of `tasks`, with its GPUs and a healthy MPS daemon.
pub fn report(h: &Host, tasks: Vec<TaskReport>) -> SyncRequest {
    SyncRequest {
        address: None,
        dynamic_ports_free: None,
        capabilities: None,
        gpus: h.gpus.clone(),
        mps: MpsReport {
            healthy: true,
            reason: None,
            restarts: None,
        },
        tasks,
        agent_version: Some(tessera_model::version::VERSION.into()),
    }
}

/// One sync of a healthy agent that runs everything it is asked to.
pub async fn sync(control: &Control, h: &Host) -> SyncResponse {
    sync_with(control, h, true, &[]).await
}

/// Registers a definition of family `family`: one container asking `gib` GiB and `percent`
/// % compute of a shared GPU; its reference (`family:revision`).
pub async fn register_def(control: &Control, family: &str, gib: u64, percent: u32) -> String {
    let def = control
        .deployments().register_task_definition(&json!({
            "family": family,
            "containers": [{"name": "main", "command": ["sleep", "infinity"], "cpu_milli": 1000, "memory_mib": 1024,
                "gpu": {"mps": {"memory_mib": gib * 1024, "max_compute_percent": percent}}}]
        }))
        .await
        .expect("register");
    format!("{}:{}", def.family, def.revision)
}

/// Creates service `name` of `count` tasks of `def` in pool `gpu`.
pub async fn service(
    control: &Control,
    name: &str,
    def: &str,
    count: u32,
    deployment: DeploymentConfig,
) {
    control
        .deployments()
        .create_service(&ServiceInput {
            name: name.into(),
            task_definition: def.into(),
            pool: "gpu".into(),
            project: None,
            priority: None,
            desired_count: count,
            strategy: None,
            constraints: ServiceConstraints::default(),
            deployment: Some(deployment),
            stop_timeout_secs: 5,
            deregistration_delay_secs: 0,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        })
        .await
        .expect("service");
}

/// Service `service`'s tasks in `states`.
pub async fn tasks(control: &Control, service: &str, states: &[TaskState]) -> Vec<Task> {
    control
        .store()
        .list_tasks(&TaskFilter {
            service: Some(service.into()),
            states: states.to_vec(),
            ..Default::default()
        })
        .await
        .expect("tasks")
}

/// The states of tasks that have not ended.
pub const LIVE: &[TaskState] = &[
    TaskState::Pending,
    TaskState::Assigned,
    TaskState::Running,
    TaskState::Stopping,
];

/// Reads every GPU's allocations from the store and checks none is overcommitted.
pub async fn assert_no_overcommit(control: &Control) {
    let hosts = control.store().list_hosts().await.expect("hosts");
    let all = control
        .store()
        .list_tasks(&TaskFilter {
            states: vec![TaskState::Assigned, TaskState::Running, TaskState::Stopping],
            ..Default::default()
        })
        .await
        .expect("tasks");
    for h in &hosts {
        for g in &h.gpus {
            let allocs: Vec<_> = all
                .iter()
                .flat_map(|t| t.allocations.iter())
                .filter(|a| a.gpu == g.uuid)
                .collect();
            let mem: u64 = allocs.iter().map(|a| a.memory.0).sum();
            let compute: u32 = allocs
                .iter()
                .filter(|a| !a.dedicated)
                .map(|a| a.compute.0)
                .sum();
            assert!(
                mem <= g.memory.0,
                "GPU {} overcommitted: {mem} MiB of {}",
                g.uuid,
                g.memory.0
            );
            assert!(
                compute <= 1000,
                "GPU {} compute overcommitted: {compute}",
                g.uuid
            );
            let dedicated = allocs.iter().filter(|a| a.dedicated).count();
            assert!(
                dedicated == 0 || allocs.len() == 1,
                "dedicated GPU {} shared",
                g.uuid
            );
            assert!(allocs.len() as u32 <= g.mps_client_limit);
        }
    }
}

/// A service `family` of `count` tasks (`gib` GiB, `percent` % compute each) placed by one
/// pass and running on `hosts` after one sync each; returns the definition.
pub async fn deploy(
    control: &Control,
    hosts: &[&Host],
    family: &str,
    gib: u64,
    percent: u32,
    count: u32,
) -> String {
    let def = register_def(control, family, gib, percent).await;
    service(control, family, &def, count, DeploymentConfig::default()).await;
    control.reconcile_once().await.expect("pass");
    for h in hosts {
        sync(control, h).await;
    }
    def
}
