//! What the benchmark programs share (`scale-bench` here, `console-bench` and `sync-bench`
//! in the server):
//! their command-line numbers, a large simulated fleet admitted through the same path
//! agents register by, and the task definition whose tasks they place.

use crate::{Control, ControlError};
use serde_json::json;
use tessera_model::agent::{GpuReport, RegisterRequest, RegisterResponse};
use tessera_model::service::TaskDefinition;
use tessera_model::{GpuUuid, MiB, MilliCpu, PoolName};

/// The whole number after `name` on the command line, or `default` without one.
///
/// # Panics
/// When the value is not a whole number: a benchmark run with a typo should stop at once.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} needs a whole number, got {v:?}"))
        })
        .unwrap_or(default)
}

/// The text after `name` on the command line, if given.
pub fn arg_text(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// A new, empty database on the PostgreSQL server at `server` (a URL whose user may create
/// databases), named `name` after dropping any left from an earlier run; its URL.
pub async fn fresh_postgres_database(
    server: &str,
    name: &str,
) -> Result<String, crate::StoreError> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(server).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut conn)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await?;
    let base = server.rsplit_once('/').map_or(server, |(base, _)| base);
    Ok(format!("{base}/{name}"))
}

/// Vacuums the database at `url` and updates its statistics (PostgreSQL; nothing on
/// SQLite), as after any bulk load: a benchmark that loads a whole fleet at once and
/// measures at once would otherwise measure autovacuum catching up with the load, and
/// plans made for empty tables.
pub async fn analyze(url: &str) -> Result<(), crate::StoreError> {
    use sqlx::Connection;
    if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        sqlx::query("VACUUM (ANALYZE)").execute(&mut conn).await?;
    }
    Ok(())
}

/// Resident memory of this process now and at its peak, in MiB (Linux; NaN elsewhere).
pub fn memory_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(f64::NAN, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets this process's peak resident memory to what it holds now (Linux), so that the
/// next [`memory_mib`] peak is the peak since this call.
pub fn reset_peak_memory() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Admits `hosts` simulated hosts (192 vCPU, 2 TiB, `gpus_per_host` GPUs of 80 GiB each)
/// named `sim-0000`…, host `h` into pool `pool_of(h)`; returns what each was told (its id
/// and agent token).
pub async fn admit_simulated_hosts(
    control: &Control,
    hosts: usize,
    gpus_per_host: usize,
    pool_of: impl Fn(usize) -> PoolName,
) -> Result<Vec<RegisterResponse>, ControlError> {
    let mut admitted = Vec::with_capacity(hosts);
    for h in 0..hosts {
        let response = control
            .agents()
            .admit_host(
                &RegisterRequest {
                    address: None,
                    join_token: String::new(),
                    pool: pool_of(h),
                    cpu_milli: MilliCpu(192_000),
                    memory_mib: MiB(2 * 1024 * 1024),
                    simulated: true,
                    labels: Default::default(),
                    gpus: simulated_gpus(h, gpus_per_host),
                    name: Some(format!("sim-{h:04}")),
                    provider_id: None,
                    agent_version: None,
                },
                &Default::default(),
            )
            .await?;
        admitted.push(response);
    }
    Ok(admitted)
}

/// The GPUs `admit_simulated_hosts` gave host `h`, as its agent reports them.
pub fn simulated_gpus(h: usize, gpus_per_host: usize) -> Vec<GpuReport> {
    (0..gpus_per_host as u32)
        .map(|i| GpuReport {
            uuid: GpuUuid::new(format!("GPU-SIM-{h}-{i}")).expect("non-empty"),
            index: i,
            model: "H100 80GB (simulated)".into(),
            memory_mib: MiB(80 * 1024),
            mps_client_limit: 48,
            healthy: true,
        })
        .collect()
}

/// Registers `bench:1`: one container of 2 vCPU and 8 GiB with an MPS slot of 10 GiB and
/// 12 % compute, so eight share an 80 GiB GPU.
pub async fn register_task_definition(control: &Control) -> Result<TaskDefinition, ControlError> {
    control
        .deployments()
        .register_task_definition(&json!({"family": "bench", "containers": [{
            "name": "main", "command": ["sleep", "infinity"], "cpu_milli": 2000, "memory_mib": 8192,
            "gpu": {"mps": {"memory_mib": 10240, "max_compute_percent": 12}}}]}))
        .await
}

/// Creates service `name` of `bench:1` in `pool` with `desired` tasks.
pub async fn create_service(
    control: &Control,
    name: &str,
    pool: &str,
    desired: usize,
) -> Result<(), ControlError> {
    control
        .deployments()
        .create_service(&crate::inputs::ServiceInput {
            name: name.into(),
            task_definition: "bench:1".into(),
            pool: pool.into(),
            project: None,
            priority: None,
            desired_count: desired as u32,
            strategy: None,
            constraints: Default::default(),
            deployment: Some(Default::default()),
            stop_timeout_secs: 30,
            deregistration_delay_secs: 0,
            slo: None,
            alarms: Vec::new(),
            bake_secs: 0,
            autoscaling: None,
        })
        .await
        .map(|_| ())
}

/// An API token of the given role, made by a user of that role created for it: benchmarks
/// and tests call the router through the same authentication as everyone else.
pub async fn api_token(
    control: &Control,
    role: tessera_model::auth::Role,
) -> Result<String, ControlError> {
    use tessera_model::auth::{Caller, CallerKind};
    let username = format!("bench-{role}");
    let missing = match control.accounts().get_user(&username).await {
        Ok(_) => false,
        Err(ControlError::NotFound(_)) => true,
        Err(e) => return Err(e),
    };
    if missing {
        control
            .accounts()
            .add_user(&username, &crate::auth::generate_password(), role)
            .await?;
    }
    let caller = Caller {
        name: username,
        on_behalf_of: None,
        kind: CallerKind::Session,
        role,
        token_id: None,
        projects: Default::default(),
        project: None,
    };
    Ok(control
        .accounts()
        .create_api_token(&caller, &format!("{role} token"), role, None, None)
        .await?
        .token)
}
