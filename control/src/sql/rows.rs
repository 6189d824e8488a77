//! Row mapping: stored rows to the model's types, the column lists that go with them, and
//! the small helpers every aggregate's queries share.
use super::*;

pub(super) const POOL_COLUMNS: &str = "name, policy, compute_overcommit, mps_client_limit, admission, task_users, privileged, preemption, host_network, gpu_budget, provider, exec";

pub(super) const HOST_COLUMNS: &str = "id, pool, status, simulated, cpu_milli, memory_mib, labels, status_reason, last_seen_at, mps_restarts, address, dynamic_ports_free, held, pending_gpus, capabilities, provider_id, agent_version";

pub(super) const GPU_COLUMNS: &str =
    "uuid, host_id, idx, model, memory_mib, mps_client_limit, health, sharing_mode";

pub(super) const TASK_COLUMNS: &str = "id, service, deployment_id, family, revision, pool, cpu_milli, memory_mib, state, migrating, host_id, placement_message, \
     stop_reason, exit_code, gpu_memory_peak_mib, sm_percent, ports, health, health_output, drain_until, work, created_at, started_at, stopped_at";

pub(super) const SERVICE_COLUMNS: &str = "name, family, revision, pool, project, priority, desired_count, strategy, constraints, \
     minimum_healthy_percent, maximum_percent, stop_timeout_secs, deregistration_delay_secs, objectives, deleting, created_at";

pub(super) fn allocation_from_row(row: &DbRow) -> Result<GpuAllocation, StoreError> {
    Ok(GpuAllocation {
        gpu: GpuUuid::new(row.try_get::<String, _>("gpu_uuid")?)
            .map_err(|e| StoreError::corrupt("GPU UUID", e))?,
        index: row.try_get::<i64, _>("idx")? as u32,
        memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
        compute: ComputeMilli(row.try_get::<i64, _>("compute_milli")? as u32),
        dedicated: row.try_get::<i64, _>("dedicated")? != 0,
    })
}

/// `state IN (...)` over the states that hold capacity.
pub(super) fn holding_states() -> String {
    let states: Vec<String> = TaskState::HOLDING
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    format!("state IN ({})", states.join(", "))
}

pub(super) fn parse<T: FromStr>(what: &'static str, raw: &str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    raw.parse().map_err(|e| StoreError::corrupt(what, e))
}

pub(super) fn pool_from_row(row: &DbRow) -> Result<PoolInfo, StoreError> {
    let limit: Option<i64> = row.try_get("mps_client_limit")?;
    Ok(PoolInfo {
        name: PoolName::new(row.try_get::<String, _>("name")?)
            .map_err(|e| StoreError::corrupt("pool name", e))?,
        policy: parse::<PlacementPolicy>("pool policy", row.try_get("policy")?)?,
        compute_overcommit: row.try_get("compute_overcommit")?,
        mps_client_limit: limit.map(|l| l as u32),
        admission: parse::<tessera_model::Admission>("pool admission", row.try_get("admission")?)?,
        task_users: row.try_get::<i64, _>("task_users")? != 0,
        privileged: row.try_get::<i64, _>("privileged")? != 0,
        host_network: row.try_get::<i64, _>("host_network")? != 0,
        exec: row.try_get::<i64, _>("exec")? != 0,
        preemption: parse::<tessera_model::PreemptionMode>(
            "pool preemption",
            row.try_get("preemption")?,
        )?,
        provider: match row.try_get::<Option<String>, _>("provider")? {
            Some(json) => Some(
                serde_json::from_str(&json).map_err(|e| StoreError::corrupt("pool provider", e))?,
            ),
            None => None,
        },
        gpu_budget: parse::<tessera_model::GpuBudget>(
            "pool gpu budget",
            row.try_get("gpu_budget")?,
        )?,
    })
}

pub(super) fn gpu_from_row(row: &DbRow) -> Result<GpuInfo, StoreError> {
    Ok(GpuInfo {
        uuid: GpuUuid::new(row.try_get::<String, _>("uuid")?)
            .map_err(|e| StoreError::corrupt("GPU UUID", e))?,
        index: row.try_get::<i64, _>("idx")? as u32,
        model: row.try_get("model")?,
        memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
        mps_client_limit: row.try_get::<i64, _>("mps_client_limit")? as u32,
        health: parse::<GpuHealth>("GPU health", row.try_get("health")?)?,
        sharing_mode: parse::<SharingMode>("GPU sharing mode", row.try_get("sharing_mode")?)?,
    })
}

pub(super) const JOIN_TOKEN_COLUMNS: &str = "id, description, pool, host_id, expires_at, uses_left, uses, preapproved, created_by, created_at";

pub(super) fn join_token_from_row(row: &DbRow) -> Result<JoinTokenInfo, StoreError> {
    let count = |c: &str| -> Result<u32, StoreError> {
        Ok(row
            .try_get::<Option<i64>, _>(c)?
            .unwrap_or(0)
            .clamp(0, i64::from(u32::MAX)) as u32)
    };
    Ok(JoinTokenInfo {
        id: row.try_get("id")?,
        description: row.try_get("description")?,
        pool: row.try_get("pool")?,
        host: row.try_get("host_id")?,
        expires_at: row
            .try_get::<Option<Timestamp>, _>("expires_at")?
            .unwrap_or(Timestamp::EPOCH),
        uses_left: count("uses_left")?,
        uses: count("uses")?,
        preapproved: row.try_get::<i64, _>("preapproved")? != 0,
        created_by: row.try_get("created_by")?,
        created_at: row.try_get("created_at")?,
    })
}

/// Each GPU of `rows` added to its host among `hosts`, in the rows' order (GPUs of other
/// hosts are passed over).
pub(super) fn attach_gpus(hosts: &mut [HostInfo], rows: &[DbRow]) -> Result<(), StoreError> {
    let position: HashMap<String, usize> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| (h.id.to_string(), i))
        .collect();
    for row in rows {
        let host_id: String = row.try_get("host_id")?;
        if let Some(&i) = position.get(&host_id) {
            hosts[i].gpus.push(gpu_from_row(row)?);
        }
    }
    Ok(())
}

pub(super) fn host_from_row(row: &DbRow) -> Result<HostInfo, StoreError> {
    let labels: String = row.try_get("labels")?;
    Ok(HostInfo {
        id: host_id(row.try_get::<String, _>("id")?)?,
        pool: PoolName::new(row.try_get::<String, _>("pool")?)
            .map_err(|e| StoreError::corrupt("host pool", e))?,
        status: parse::<HostStatus>("host status", row.try_get("status")?)?,
        held: row.try_get::<i64, _>("held")? != 0,
        simulated: row.try_get::<i64, _>("simulated")? != 0,
        cpu: MilliCpu(row.try_get::<i64, _>("cpu_milli")? as u64),
        memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
        labels: serde_json::from_str::<BTreeMap<String, String>>(&labels)
            .map_err(|e| StoreError::corrupt("host labels", e))?,
        gpus: Vec::new(),
        status_reason: row.try_get("status_reason")?,
        last_seen: row.try_get("last_seen_at")?,
        mps_restarts: row
            .try_get::<i64, _>("mps_restarts")?
            .clamp(0, i64::from(u32::MAX)) as u32,
        address: row.try_get("address")?,
        dynamic_ports_free: row
            .try_get::<Option<i64>, _>("dynamic_ports_free")?
            .map(|n| n.clamp(0, 65535) as u32),
        pending_gpus: match row.try_get::<Option<String>, _>("pending_gpus")? {
            Some(json) => serde_json::from_str(&json)
                .map_err(|e| StoreError::corrupt("host pending_gpus", e))?,
            None => Vec::new(),
        },
        capabilities: match row.try_get::<Option<String>, _>("capabilities")? {
            Some(json) => Some(
                serde_json::from_str(&json)
                    .map_err(|e| StoreError::corrupt("host capabilities", e))?,
            ),
            None => None,
        },
        provider_id: row.try_get("provider_id")?,
        agent_version: row.try_get("agent_version")?,
    })
}

pub(super) fn host_id(s: String) -> Result<HostId, StoreError> {
    HostId::new(s).map_err(|e| StoreError::corrupt("host id", e))
}

/// A stored definition with its secret values put back (they are kept in their own column).
pub(super) fn task_def_from_row(row: &DbRow) -> Result<TaskDefinition, StoreError> {
    let spec: String = row.try_get("spec")?;
    let secrets: String = row.try_get("secrets")?;
    let mut spec = serde_json::from_str::<TaskDefinitionSpec>(&spec)
        .map_err(|e| StoreError::corrupt("task definition", e))?;
    tessera_model::taskdef::upgrade_stored(&mut spec);
    let secrets: SecretValues = serde_json::from_str(&secrets)
        .map_err(|e| StoreError::corrupt("task definition secrets", e))?;
    if let Some(missing) = spec.fill_secrets(&secrets).first() {
        return Err(StoreError::corrupt(
            "task definition secrets",
            &missing.field,
        ));
    }
    Ok(TaskDefinition {
        family: row.try_get("family")?,
        revision: row.try_get::<i64, _>("revision")? as u32,
        active: row.try_get::<i64, _>("active")? != 0,
        spec,
        registered_at: row.try_get("registered_at")?,
    })
}

pub(super) fn service_from_row(row: &DbRow) -> Result<Service, StoreError> {
    let strategy: Option<String> = row.try_get("strategy")?;
    let constraints: String = row.try_get("constraints")?;
    Ok(Service {
        name: row.try_get("name")?,
        task_definition: TaskDefRef {
            family: row.try_get("family")?,
            revision: row.try_get::<i64, _>("revision")? as u32,
        },
        pool: PoolName::new(row.try_get::<String, _>("pool")?)
            .map_err(|e| StoreError::corrupt("service pool", e))?,
        project: row.try_get("project")?,
        priority: parse("service priority", &row.try_get::<String, _>("priority")?)?,
        desired_count: row.try_get::<i64, _>("desired_count")? as u32,
        strategy: strategy
            .map(|s| parse::<PlacementPolicy>("service strategy", &s))
            .transpose()?,
        constraints: serde_json::from_str::<ServiceConstraints>(&constraints)
            .map_err(|e| StoreError::corrupt("service constraints", e))?,
        deployment: DeploymentConfig {
            minimum_healthy_percent: row.try_get::<i64, _>("minimum_healthy_percent")? as u32,
            maximum_percent: row.try_get::<i64, _>("maximum_percent")? as u32,
        },
        stop_timeout_secs: row.try_get::<i64, _>("stop_timeout_secs")? as u32,
        deregistration_delay_secs: row.try_get::<i64, _>("deregistration_delay_secs")? as u32,
        objectives: serde_json::from_str(&row.try_get::<String, _>("objectives")?)
            .map_err(|e| StoreError::corrupt("service objectives", e))?,
        deleting: row.try_get::<i64, _>("deleting")? != 0,
        created_at: row.try_get("created_at")?,
    })
}

pub(super) fn task_from_row(row: &DbRow) -> Result<Task, StoreError> {
    let host: Option<String> = row.try_get("host_id")?;
    let peak: Option<i64> = row.try_get("gpu_memory_peak_mib")?;
    let sm: Option<i64> = row.try_get("sm_percent")?;
    let exit: Option<i64> = row.try_get("exit_code")?;
    let ports: String = row.try_get("ports")?;
    let health: Option<String> = row.try_get("health")?;
    Ok(Task {
        id: row.try_get("id")?,
        service: row.try_get("service")?,
        deployment_id: row.try_get("deployment_id")?,
        task_definition: TaskDefRef {
            family: row.try_get("family")?,
            revision: row.try_get::<i64, _>("revision")? as u32,
        },
        pool: PoolName::new(row.try_get::<String, _>("pool")?)
            .map_err(|e| StoreError::corrupt("task pool", e))?,
        cpu: MilliCpu(row.try_get::<i64, _>("cpu_milli")? as u64),
        memory: MiB(row.try_get::<i64, _>("memory_mib")? as u64),
        state: parse::<TaskState>("task state", row.try_get("state")?)?,
        migrating: row.try_get::<i64, _>("migrating")? != 0,
        host: host.map(host_id).transpose()?,
        allocations: Vec::new(),
        placement_message: row.try_get("placement_message")?,
        stop_reason: row.try_get("stop_reason")?,
        exit_code: exit.map(|c| c as i32),
        measured: Measured {
            gpu_memory_peak: peak.map(|p| MiB(p as u64)),
            sm_percent: sm.map(|s| s as u32),
            work: row
                .try_get::<Option<String>, _>("work")?
                .map(|w| serde_json::from_str(&w))
                .transpose()
                .map_err(|e| StoreError::corrupt("task work", e))?,
        },
        ports: serde_json::from_str(&ports).map_err(|e| StoreError::corrupt("task ports", e))?,
        health: health
            .map(|h| parse::<tessera_model::service::TaskHealth>("task health", &h))
            .transpose()?,
        health_output: row.try_get("health_output")?,
        drain_until: row.try_get("drain_until")?,
        created_at: row.try_get("created_at")?,
        started_at: row.try_get("started_at")?,
        stopped_at: row.try_get("stopped_at")?,
    })
}

pub(super) fn event_from_row(row: &DbRow) -> Result<Event, StoreError> {
    let host: Option<String> = row.try_get("host_id")?;
    Ok(Event {
        id: row.try_get("id")?,
        at: row.try_get("at")?,
        service: row.try_get("service")?,
        host: host.map(host_id).transpose()?,
        message: row.try_get("message")?,
    })
}

pub(super) fn not_found(what: &'static str, id: impl ToString) -> StoreError {
    StoreError::NotFound {
        what,
        id: id.to_string(),
    }
}

/// An update of one row by key: no row changed means no such `what`.
pub(super) fn updated(
    done: DbResult,
    what: &'static str,
    id: impl ToString,
) -> Result<(), StoreError> {
    if done.rows_affected() == 0 {
        Err(not_found(what, id))
    } else {
        Ok(())
    }
}

/// Fills in the GPUs of `hosts` (ordered by index), read on `conn`.
pub(super) async fn load_gpus(conn: &mut DbConn, hosts: &mut [HostInfo]) -> Result<(), StoreError> {
    let position: HashMap<String, usize> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| (h.id.to_string(), i))
        .collect();
    let ids: Vec<String> = position.keys().cloned().collect();
    for chunk in ids.chunks(500) {
        let mut q =
            QueryBuilder::<Db>::new(format!("SELECT {GPU_COLUMNS} FROM gpus WHERE host_id IN ("));
        let mut sep = q.separated(", ");
        for id in chunk {
            sep.push_bind(id.as_str());
        }
        q.push(") ORDER BY host_id, idx");
        for row in q.build().fetch_all(&mut *conn).await? {
            let host: String = row.try_get("host_id")?;
            if let Some(&i) = position.get(&host) {
                hosts[i].gpus.push(gpu_from_row(&row)?);
            }
        }
    }
    Ok(())
}
