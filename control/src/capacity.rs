//! The one place where capacity is counted: a pool's stored hosts and the allocations of
//! the tasks that hold capacity, turned into the placement engine's [`Snapshot`]. The
//! scheduler places on it, the commit re-checks a plan on it inside its transaction
//! ([`verify_commits`]), and every figure the API and the console show of a GPU (memory and
//! compute in use, clients, sharing mode, density) is read from it, so a pool's compute
//! overcommit and MPS client limit count the same everywhere.

use crate::store::{CommitContext, HeldCapacity, PlacementCommit};
use std::collections::HashMap;
use tessera_model::service::{GpuAllocation, Task};
use tessera_model::{GpuHealth, GpuUuid, HostId, HostInfo, HostStatus, MiB, MilliCpu, PoolInfo};
use tessera_placement::{
    GpuIdx, GpuSlot, GpuSpec, GpuUsage, HostIdx, HostSpec, Placement, PoolLimits, Snapshot,
};

/// What a task holds, whatever it was loaded as.
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    pub task_id: &'a str,
    pub host: &'a HostId,
    pub cpu: MilliCpu,
    pub memory: MiB,
    pub allocations: &'a [GpuAllocation],
}

impl<'a> Held<'a> {
    /// What `task` holds, if it holds anything (it is placed and in a holding state).
    pub fn of(task: &'a Task) -> Option<Self> {
        let host = task.host.as_ref().filter(|_| task.state.holds_capacity())?;
        Some(Held {
            task_id: &task.id,
            host,
            cpu: task.cpu,
            memory: task.memory,
            allocations: &task.allocations,
        })
    }

    fn of_stored(h: &'a HeldCapacity) -> Self {
        Held {
            task_id: &h.task_id,
            host: &h.host,
            cpu: h.cpu,
            memory: h.memory,
            allocations: &h.allocations,
        }
    }
}

/// A pool's hosts and GPUs with what is held on them.
#[derive(Debug, Clone)]
pub struct PoolCapacity {
    pub snapshot: Snapshot,
    hosts: HashMap<HostId, HostIdx>,
    gpus: HashMap<GpuUuid, GpuIdx>,
    /// Tasks whose stored allocation the snapshot could not take (their host reports less
    /// than they hold now): they are in no placement of the snapshot.
    pub not_in_snapshot: std::collections::HashSet<String>,
}

/// The engine's limits for `pool`.
pub fn limits(pool: &PoolInfo) -> PoolLimits {
    PoolLimits {
        compute_overcommit: pool.compute_overcommit,
        mps_client_limit: pool.mps_client_limit,
    }
}

/// A stored host as the engine sees it: only active hosts take new tasks.
fn host_spec(h: &HostInfo) -> HostSpec {
    HostSpec {
        id: h.id.clone(),
        cpu: h.cpu,
        memory: h.memory,
        labels: h.labels.clone(),
        active: h.status == HostStatus::Active && !h.held,
        gpus: h
            .gpus
            .iter()
            .map(|g| GpuSpec {
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                memory: g.memory,
                mps_client_limit: g.mps_client_limit,
                healthy: g.health == GpuHealth::Healthy,
            })
            .collect(),
    }
}

impl PoolCapacity {
    /// `hosts` (of `pool`) with everything in `held` assigned. A holding that no longer fits
    /// the host as reported now (a GPU gone, a host shrunk) is logged and left out.
    /// Holdings on hosts of other pools are not this pool's and are passed over.
    pub fn build<'a>(
        pool: &PoolInfo,
        hosts: &[HostInfo],
        held: impl IntoIterator<Item = Held<'a>>,
    ) -> Self {
        let snapshot = Snapshot::new(hosts.iter().map(host_spec).collect(), limits(pool));
        let mut capacity = PoolCapacity {
            hosts: hosts
                .iter()
                .enumerate()
                .map(|(i, h)| (h.id.clone(), i as HostIdx))
                .collect(),
            gpus: HashMap::new(),
            snapshot,
            not_in_snapshot: Default::default(),
        };
        for (i, h) in hosts.iter().enumerate() {
            let slots: Vec<GpuIdx> = capacity.snapshot.gpus_of(i as HostIdx).collect();
            for (g, gpu) in slots.into_iter().zip(&h.gpus) {
                capacity.gpus.insert(gpu.uuid.clone(), g);
            }
        }
        for h in held {
            if !capacity.hosts.contains_key(h.host) {
                continue;
            }
            let Some(placement) = capacity.placement(h.host, h.cpu, h.memory, h.allocations) else {
                tracing::warn!(task = %h.task_id, "task holds a GPU its host no longer reports");
                capacity.not_in_snapshot.insert(h.task_id.to_owned());
                continue;
            };
            if let Err(e) = capacity.snapshot.assign(&placement) {
                tracing::warn!(task = %h.task_id, error = %e, "stored allocation does not fit the host as reported now");
                capacity.not_in_snapshot.insert(h.task_id.to_owned());
            }
        }
        capacity
    }

    /// The engine's placement for a task of `cpu` and `memory` on `host` holding
    /// `allocations`; `None` when the host or one of the GPUs is not in this pool.
    pub fn placement(
        &self,
        host: &HostId,
        cpu: MilliCpu,
        memory: MiB,
        allocations: &[GpuAllocation],
    ) -> Option<Placement> {
        let h = *self.hosts.get(host)?;
        let gpus = allocations
            .iter()
            .map(|a| {
                let g = *self.gpus.get(&a.gpu)?;
                self.snapshot.gpus_of(h).any(|x| x == g).then(|| GpuSlot {
                    gpu: g,
                    uuid: a.gpu.clone(),
                    index: a.index,
                    memory: a.memory,
                    compute: a.compute,
                    dedicated: a.dedicated,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Placement {
            host: h,
            host_id: host.clone(),
            cpu,
            memory,
            gpus,
        })
    }

    /// How full GPU `uuid` is, if it is in this pool.
    pub fn gpu_usage(&self, uuid: &GpuUuid) -> Option<GpuUsage> {
        self.gpus.get(uuid).map(|&g| self.snapshot.gpu_usage(g))
    }
}

/// Which of `commits` may be stored, in order, given what `ctx` (read inside the commit's
/// transaction) says is held now: each one that fits is taken before the next is checked,
/// with the same rules the engine placed by. A task no longer pending is never committed.
pub fn verify_commits(ctx: &CommitContext, commits: &[PlacementCommit]) -> Vec<bool> {
    let host_pool: HashMap<&HostId, &PoolInfo> = ctx
        .hosts
        .iter()
        .filter_map(|h| Some((&h.id, ctx.pools.iter().find(|p| p.name == h.pool)?)))
        .collect();
    let mut pools: HashMap<&str, PoolCapacity> = HashMap::new();
    for pool in &ctx.pools {
        let hosts: Vec<HostInfo> = ctx
            .hosts
            .iter()
            .filter(|h| h.pool == pool.name)
            .cloned()
            .collect();
        let held = ctx.holding.iter().map(Held::of_stored);
        pools.insert(pool.name.as_str(), PoolCapacity::build(pool, &hosts, held));
    }
    // Host ports are held like capacity: a fixed one taken on the host refuses the commit.
    let mut ports: HashMap<
        &HostId,
        std::collections::HashSet<(u16, tessera_model::taskdef::Protocol)>,
    > = HashMap::new();
    for h in &ctx.holding {
        ports
            .entry(&h.host)
            .or_default()
            .extend(h.ports.iter().copied());
    }
    commits
        .iter()
        .map(|c| {
            let Some(&(cpu, memory)) = ctx.pending.get(&c.task_id) else {
                return false;
            };
            let Some(capacity) = host_pool
                .get(&c.host)
                .and_then(|p| pools.get_mut(p.name.as_str()))
            else {
                return false;
            };
            let wanted = ctx
                .pending_ports
                .get(&c.task_id)
                .map_or(&[][..], |p| &p[..]);
            let used = ports.entry(&c.host).or_default();
            if wanted.iter().any(|p| used.contains(p)) {
                return false;
            }
            let fits = match capacity.placement(&c.host, cpu, memory, &c.allocations) {
                Some(p) => capacity.snapshot.verify(&p).is_ok(),
                None => false,
            };
            if fits {
                used.extend(wanted.iter().copied());
            }
            fits
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::inputs::{PoolInput, ServiceInput, ServicePatch};
    use crate::store::{NewTask, PlacementCommit, TaskFilter};
    use crate::{Control, ControlConfig};
    use serde_json::json;
    use std::collections::HashMap;
    use tessera_model::agent::{GpuReport, RegisterRequest};
    use tessera_model::service::{DeploymentConfig, ServiceConstraints, TaskState};
    use tessera_model::{GpuUuid, MiB, MilliCpu, PoolName};

    const JOIN: &str = "capacity-test-join-token-0123";

    /// Two control planes (two servers) on one database, with a pool `gpu` of one host
    /// with two 24 GiB GPUs and a service `s` of 10 GiB tasks, at zero tasks.
    async fn two_servers(dir: &tempfile::TempDir) -> (Control, Control) {
        let url = format!("sqlite://{}/t.db", dir.path().display());
        let a = Control::new(
            crate::open(&url).await.expect("store"),
            ControlConfig::default(),
        );
        let b = Control::new(
            crate::open(&url).await.expect("store"),
            ControlConfig::default(),
        );
        a.agents()
            .ensure_join_token(Some(JOIN))
            .await
            .expect("join token");
        a.deployments()
            .create_pool(&PoolInput::named("gpu"))
            .await
            .expect("pool");
        a.agents()
            .register_agent(&RegisterRequest {
                agent_version: None,
                address: None,
                join_token: JOIN.into(),
                pool: PoolName::new("gpu").expect("valid"),
                cpu_milli: MilliCpu(64_000),
                memory_mib: MiB(256 * 1024),
                simulated: true,
                labels: Default::default(),
                gpus: (0..2)
                    .map(|i| GpuReport {
                        uuid: GpuUuid::new(format!("GPU-h-{i}")).expect("valid"),
                        index: i,
                        model: "NVIDIA L4".into(),
                        memory_mib: MiB(24 * 1024),
                        mps_client_limit: 48,
                        healthy: true,
                    })
                    .collect(),
                name: Some("h".into()),
                provider_id: None,
            })
            .await
            .expect("register");
        let def = a
            .deployments()
            .register_task_definition(&json!({"family": "s", "containers": [{"name": "main",
                "command": ["sleep", "infinity"], "cpu_milli": 1000, "memory_mib": 1024,
                "gpu": {"mps": {"memory_mib": 10 * 1024, "max_compute_percent": 40}}}]}))
            .await
            .expect("definition");
        a.deployments()
            .create_service(&ServiceInput {
                name: "s".into(),
                task_definition: format!("{}:{}", def.family, def.revision),
                pool: "gpu".into(),
                project: None,
                priority: None,
                desired_count: 0,
                strategy: None,
                constraints: ServiceConstraints::default(),
                deployment: Some(DeploymentConfig::default()),
                stop_timeout_secs: 5,
                deregistration_delay_secs: 0,
                slo: None,
                alarms: Vec::new(),
                bake_secs: 0,
                autoscaling: None,
            })
            .await
            .expect("service");
        (a, b)
    }

    /// Every GPU's allocations, summed from the rows as stored: memory, compute, clients.
    async fn assert_not_overcommitted(c: &Control) -> usize {
        let hosts = c.store().list_hosts().await.expect("hosts");
        let held = c
            .store()
            .list_tasks(&TaskFilter {
                states: TaskState::HOLDING.to_vec(),
                ..Default::default()
            })
            .await
            .expect("tasks");
        let mut per_gpu: HashMap<&GpuUuid, (u64, u32)> = HashMap::new();
        for a in held.iter().flat_map(|t| &t.allocations) {
            let e = per_gpu.entry(&a.gpu).or_default();
            e.0 += a.memory.0;
            e.1 += a.compute.0;
        }
        for g in hosts.iter().flat_map(|h| &h.gpus) {
            let (memory, compute) = per_gpu.get(&g.uuid).copied().unwrap_or_default();
            assert!(
                memory <= g.memory.0,
                "{}: {memory} MiB of {}",
                g.uuid,
                g.memory.0
            );
            assert!(compute <= 1000, "{}: compute {compute}", g.uuid);
        }
        held.len()
    }

    /// `n` pending tasks of service `s`, created as the reconcile pass would.
    async fn pending(c: &Control, prefix: &str, n: usize) -> Vec<String> {
        let service = c.store().get_service("s").await.expect("service");
        let deployment = c.store().list_deployments("s").await.expect("deployments")[0].id;
        let def = c
            .store()
            .get_task_definition(&service.task_definition)
            .await
            .expect("definition");
        let tasks: Vec<NewTask> = (0..n)
            .map(|i| NewTask {
                id: format!("{prefix}-{i}"),
                service: "s".into(),
                deployment_id: deployment,
                task_definition: service.task_definition.clone(),
                pool: service.pool.clone(),
                cpu: def.spec.cpu(),
                memory: def.spec.memory(),
                ports: vec![],
                health: None,
            })
            .collect();
        c.store().create_tasks(&tasks).await.expect("tasks");
        tasks.into_iter().map(|t| t.id).collect()
    }

    /// What `c`'s engine plans for `ids`, from its own picture of the fleet.
    async fn plan(c: &Control, ids: &[String]) -> Vec<PlacementCommit> {
        let pool = PoolName::new("gpu").expect("valid");
        let mut engine = c
            .scheduler()
            .pool_engine(&pool, None, &[])
            .await
            .expect("engine")
            .engine;
        let service = c.store().get_service("s").await.expect("service");
        let def = c
            .store()
            .get_task_definition(&service.task_definition)
            .await
            .expect("definition");
        let req =
            crate::scheduler::request_for(&def.spec, &service.constraints, Default::default());
        let mut commits = Vec::new();
        for id in ids {
            let Ok(p) = engine.place(&req) else { break };
            engine.assign(&p).expect("fits its own engine");
            commits.push(PlacementCommit {
                task_id: id.clone(),
                host: p.host_id.clone(),
                allocations: crate::scheduler::allocations(&p),
            });
        }
        commits
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_servers_committing_conflicting_plans_at_once_never_overcommit() {
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = two_servers(&dir).await;
        // Room for four tasks (two per GPU). Each server plans three of its own against
        // the same empty fleet: each plan fits alone, together they do not.
        let ids_a = pending(&a, "a", 3).await;
        let ids_b = pending(&b, "b", 3).await;
        let (plan_a, plan_b) = (plan(&a, &ids_a).await, plan(&b, &ids_b).await);
        assert_eq!((plan_a.len(), plan_b.len()), (3, 3));
        let (done_a, done_b) = tokio::join!(
            a.store().commit_placements(&plan_a),
            b.store().commit_placements(&plan_b)
        );
        let (done_a, done_b) = (done_a.expect("commit"), done_b.expect("commit"));
        assert_eq!(done_a.len() + done_b.len(), 4, "{done_a:?} {done_b:?}");
        assert_eq!(assert_not_overcommitted(&a).await, 4);
        // A stale plan for a task the other server placed already is refused too.
        let again = b.store().commit_placements(&plan_a).await.expect("commit");
        assert!(again.is_empty(), "{again:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_servers_reconciling_at_once_never_overcommit() {
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = two_servers(&dir).await;
        for desired in [3, 7, 2, 9, 5] {
            a.deployments()
                .update_service(
                    "s",
                    &ServicePatch {
                        desired_count: Some(desired),
                        ..Default::default()
                    },
                )
                .await
                .expect("scale");
            for _ in 0..3 {
                let (ra, rb) = tokio::join!(a.reconcile_once(), b.reconcile_once());
                ra.expect("pass");
                rb.expect("pass");
                assert!(assert_not_overcommitted(&a).await <= 4);
            }
        }
    }

    fn builds(c: &Control) -> u64 {
        c.scheduler().engine_builds()
    }

    async fn scale(c: &Control, desired: u32) {
        c.deployments()
            .update_service(
                "s",
                &ServicePatch {
                    desired_count: Some(desired),
                    ..Default::default()
                },
            )
            .await
            .expect("scale");
        c.reconcile_once().await.expect("pass");
    }

    #[tokio::test]
    async fn the_engine_is_kept_between_passes_and_rebuilt_when_capacity_changes() {
        let dir = tempfile::tempdir().expect("dir");
        let (a, b) = two_servers(&dir).await;
        scale(&a, 2).await;
        assert_eq!(builds(&a), 1);
        // More tasks: placed by the same engine, which already holds the first two.
        scale(&a, 3).await;
        assert_eq!(builds(&a), 1, "not rebuilt for a scale-up");
        assert_eq!(assert_not_overcommitted(&a).await, 3);
        // Another server takes the last slot, which a's engine believes free (a hears
        // nothing of it): a's next placement is refused by the commit's re-check, and its
        // engine rebuilt from the store on the pass after.
        let theirs = pending(&b, "b", 1).await;
        let plan_b = plan(&b, &theirs).await;
        assert_eq!(
            b.store()
                .commit_placements(&plan_b)
                .await
                .expect("commit")
                .len(),
            1
        );
        // (b's task is one of the service's: five wanted, one new.)
        scale(&a, 5).await;
        assert_eq!(builds(&a), 1, "the stale engine was used once");
        assert_eq!(
            assert_not_overcommitted(&a).await,
            4,
            "and its placement refused"
        );
        a.reconcile_once().await.expect("pass");
        assert_eq!(builds(&a), 2, "then rebuilt from the store");
        assert_eq!(assert_not_overcommitted(&a).await, 4);
        a.reconcile_once().await.expect("pass");
        assert_eq!(builds(&a), 2, "kept while nothing changes");
        // Capacity changed here (an operator drains the host, then reactivates it).
        let host = a.views().list_hosts().await.expect("hosts")[0].id.clone();
        a.deployments().drain_host(&host).await.expect("drain");
        a.deployments()
            .activate_host(&host)
            .await
            .expect("activate");
        a.reconcile_once().await.expect("pass");
        assert_eq!(builds(&a), 3, "rebuilt after the host changed");
        assert_eq!(assert_not_overcommitted(&a).await, 4);
    }
}
