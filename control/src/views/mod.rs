//! Read models: what the console's pages and the API show, each built here once from the
//! store in a bounded number of queries, with every capacity figure from
//! [`crate::capacity`] (so a pool's overcommit and client limit count as the scheduler
//! counts them).

pub(crate) mod fit;
pub mod serving;
mod task;

use crate::cache::Cache;
use crate::capacity::{Held, PoolCapacity};
use crate::parts::{Core, FleetModel, FleetSnapshot};
use crate::scheduler::Scheduler;
use crate::store::ViewStore;
use std::sync::Arc;
use std::time::Duration;
use tessera_model::fit::Verdict;

use crate::error::ControlError;
use crate::store::{EventFilter, HostPageQuery, TaskFilter};
use std::collections::{BTreeMap, HashMap};
use tessera_model::api::ServiceDetail;
use tessera_model::service::{Event, Task, TaskDefRef, TaskDefinition, TaskState};
use tessera_model::taskdef::TaskGpu;
use tessera_model::views::{
    FailingView, GpuView, HOSTS_PER_PAGE, HostQuery, HostView, HostsPage, OverviewData,
    PendingView, SlotView,
};
use tessera_model::{ComputeMilli, GpuUuid, HostId, HostInfo, MiB, PoolName, SharingMode};
use tessera_placement::GpuUsage;

/// Each pool's capacity over `hosts`, with what `holding` holds.
fn capacities(
    pools: &[tessera_model::PoolInfo],
    hosts: &[HostInfo],
    holding: &[Task],
) -> HashMap<PoolName, PoolCapacity> {
    pools
        .iter()
        .map(|pool| {
            let members: Vec<HostInfo> = hosts
                .iter()
                .filter(|h| h.pool == pool.name)
                .cloned()
                .collect();
            let capacity = PoolCapacity::build(pool, &members, holding.iter().filter_map(Held::of));
            (pool.name.clone(), capacity)
        })
        .collect()
}

/// Each GPU's usage, by UUID, from the pools' capacities.
fn usage_of(
    capacities: &HashMap<PoolName, PoolCapacity>,
    host: &HostInfo,
    gpu: &GpuUuid,
) -> Option<GpuUsage> {
    capacities.get(&host.pool)?.gpu_usage(gpu)
}

/// A GPU's sharing mode as its allocations make it now (idle when nothing is allocated).
fn mode_of(usage: Option<GpuUsage>) -> SharingMode {
    usage.map_or(SharingMode::Idle, |u| u.mode)
}

/// How many failing services the overview lists.
const FAILING_SHOWN: usize = 10;

/// How many stopped tasks a service's page lists (the newest).
const STOPPED_SHOWN: u32 = 50;

/// How long the hosts pages reuse the fit verdicts they mark segments with.
pub(crate) const VERDICTS_FRESH: Duration = Duration::from_secs(10);

/// The read models: what the console's pages, the REST API's lists, `/metrics`,
/// endpoints and Prometheus discovery show. Reads only; owns the fleet read model and the
/// fit verdicts pages mark segments with.
#[derive(Clone)]
pub struct Views {
    store: Arc<dyn ViewStore>,
    core: Core,
    /// Asked for pools as they stand and revisions' specs.
    scheduler: Scheduler,
    /// Hosts with their GPUs' figures and tasks, and tasks waiting (see [`FleetModel`]).
    fleet: Arc<FleetModel>,
    /// The store the fleet model reads, unfenced (reads need no lease).
    fleet_store: Arc<dyn crate::store::FleetStore>,
    /// Fit verdicts by task, read at most [`VERDICTS_FRESH`] ago (see `cached_verdicts`).
    verdicts: Arc<Cache<(), Arc<HashMap<String, Verdict>>>>,
}

impl Views {
    pub(crate) fn new(
        store: Arc<dyn ViewStore>,
        fleet_store: Arc<dyn crate::store::FleetStore>,
        core: Core,
        scheduler: Scheduler,
    ) -> Views {
        Views {
            store,
            core,
            scheduler,
            fleet: Arc::default(),
            fleet_store,
            verdicts: Arc::new(Cache::with_max_age(1, VERDICTS_FRESH)),
        }
    }

    /// The same read models reading through `store` (a pass's fenced store) and asking
    /// `scheduler`; the fleet model and the verdicts are shared.
    pub(crate) fn with_store(
        &self,
        store: Arc<dyn ViewStore>,
        core: Core,
        scheduler: Scheduler,
    ) -> Views {
        Views {
            store,
            core,
            scheduler,
            ..self.clone()
        }
    }

    /// The fleet as of now (the fleet read model, brought up to date): what this caller
    /// wrote before is in it.
    pub async fn fleet(&self) -> Result<Arc<FleetSnapshot>, ControlError> {
        let (model, store) = (self.fleet.clone(), self.fleet_store.clone());
        let every = self.core.config().fleet_measured_every;
        // A reading is finished even when its caller gives up (a request past its
        // timeout): the next caller gets it, instead of starting it again.
        match tokio::spawn(async move { model.current(&*store, every).await }).await {
            Ok(read) => Ok(read?),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(ControlError::Busy {
                retry_after: 1,
                what: format!("fleet readings ({e})"),
            }),
        }
    }

    /// Whether the fleet read model has been read (the loop keeps it fresh only then).
    pub(crate) fn fleet_read(&self) -> bool {
        self.fleet.read_before()
    }
}

impl Views {
    pub async fn list_pools(&self) -> Result<Vec<tessera_model::PoolInfo>, ControlError> {
        Ok(self.store.list_pools().await?)
    }

    /// Every host, each GPU's sharing mode as its allocations make it now.
    pub async fn list_hosts(&self) -> Result<Vec<HostInfo>, ControlError> {
        let hosts = self.store.list_hosts().await?;
        self.with_sharing_modes(hosts).await
    }

    /// One host, each GPU's sharing mode as its allocations make it now.
    pub async fn get_host(&self, id: &HostId) -> Result<HostInfo, ControlError> {
        let host = self.store.get_host(id).await?;
        let mut one = self.with_sharing_modes(vec![host]).await?;
        Ok(one.pop().expect("the host given"))
    }

    /// Sets each GPU's sharing mode from what is allocated on it, by the rule every view
    /// uses (`capacity`), not from a stored copy.
    async fn with_sharing_modes(
        &self,
        mut hosts: Vec<HostInfo>,
    ) -> Result<Vec<HostInfo>, ControlError> {
        let holding = self.holding(Some(&hosts)).await?;
        let pools = self.store.list_pools().await?;
        let capacities = capacities(&pools, &hosts, &holding);
        let modes: Vec<Vec<SharingMode>> = hosts
            .iter()
            .map(|host| {
                host.gpus
                    .iter()
                    .map(|g| mode_of(usage_of(&capacities, host, &g.uuid)))
                    .collect()
            })
            .collect();
        for (host, modes) in hosts.iter_mut().zip(modes) {
            for (gpu, mode) in host.gpus.iter_mut().zip(modes) {
                gpu.sharing_mode = mode;
            }
        }
        Ok(hosts)
    }

    pub async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>, ControlError> {
        Ok(self.store.list_tasks(filter).await?)
    }

    /// How many tasks `filter` matches.
    pub async fn count_tasks(&self, filter: &TaskFilter) -> Result<u64, ControlError> {
        Ok(self.store.count_tasks(filter).await?)
    }

    pub async fn get_task(&self, id: &str) -> Result<Task, ControlError> {
        Ok(self.store.get_task(id).await?)
    }

    pub async fn list_events(&self, filter: &EventFilter) -> Result<Vec<Event>, ControlError> {
        Ok(self.store.list_events(filter).await?)
    }

    /// The latest revision of each task definition family.
    pub async fn list_task_definition_families(&self) -> Result<Vec<TaskDefinition>, ControlError> {
        Ok(self.store.list_task_definition_families().await?)
    }

    /// Every revision of `family`, oldest first.
    pub async fn list_task_definition_revisions(
        &self,
        family: &str,
    ) -> Result<Vec<TaskDefinition>, ControlError> {
        Ok(self.store.list_task_definition_revisions(family).await?)
    }

    pub async fn get_task_definition(
        &self,
        r: &TaskDefRef,
    ) -> Result<TaskDefinition, ControlError> {
        Ok(self.store.get_task_definition(r).await?)
    }

    /// Every active revision, `family:revision`, newest first within a family.
    pub async fn active_revisions(&self) -> Result<Vec<String>, ControlError> {
        let mut out = Vec::new();
        for f in self.store.list_task_definition_families().await? {
            for d in self
                .store
                .list_task_definition_revisions(&f.family)
                .await?
                .into_iter()
                .rev()
                .filter(|d| d.active)
            {
                out.push(format!("{}:{}", d.family, d.revision));
            }
        }
        Ok(out)
    }

    /// Every service with its deployments and task counts, in two queries however many
    /// services there are (a service's events are on its own page, `service_detail`).
    pub async fn service_details(&self) -> Result<Vec<ServiceDetail>, ControlError> {
        let services = self.store.list_services().await?;
        let mut deployments: HashMap<String, Vec<tessera_model::service::Deployment>> =
            HashMap::new();
        for d in self.store.list_all_deployments().await? {
            deployments.entry(d.service.clone()).or_default().push(d);
        }
        Ok(services
            .into_iter()
            .map(|service| {
                let deployments = deployments.remove(&service.name).unwrap_or_default();
                ServiceDetail {
                    running: deployments.iter().map(|d| d.running).sum(),
                    pending: deployments.iter().map(|d| d.pending).sum(),
                    service,
                    deployments,
                    events: Vec::new(),
                }
            })
            .collect())
    }

    /// Tasks holding capacity, on `hosts` only when given.
    async fn holding(&self, hosts: Option<&[HostInfo]>) -> Result<Vec<Task>, ControlError> {
        if hosts.is_some_and(<[HostInfo]>::is_empty) {
            return Ok(Vec::new());
        }
        Ok(self
            .store
            .list_tasks(&TaskFilter {
                hosts: hosts
                    .map(|hs| hs.iter().map(|h| h.id.clone()).collect())
                    .unwrap_or_default(),
                states: TaskState::HOLDING.to_vec(),
                ..Default::default()
            })
            .await?)
    }

    /// Each host with its GPUs' segments and figures: three queries however many hosts.
    pub async fn host_views(&self, hosts: Vec<HostInfo>) -> Result<Vec<HostView>, ControlError> {
        let holding = self.holding(Some(&hosts)).await?;
        let pools = self.store.list_pools().await?;
        let capacities = capacities(&pools, &hosts, &holding);
        let verdicts = self.cached_verdicts().await;
        let mut slots: HashMap<&GpuUuid, Vec<SlotView>> = HashMap::new();
        for t in &holding {
            for a in &t.allocations {
                slots.entry(&a.gpu).or_default().push(SlotView {
                    task_id: t.id.clone(),
                    service: t.service.clone(),
                    memory: a.memory,
                    compute: a.compute,
                    dedicated: a.dedicated,
                    measured_peak: t.measured.gpu_memory_peak,
                    state: t.state,
                    verdict: verdicts.get(&t.id).copied(),
                });
            }
        }
        Ok(hosts
            .iter()
            .map(|host| {
                let gpus = host
                    .gpus
                    .iter()
                    .map(|g| {
                        let usage = usage_of(&capacities, host, &g.uuid);
                        let mut gpu = g.clone();
                        // The mode follows from the allocations now, not from the last sync.
                        gpu.sharing_mode = mode_of(usage);
                        GpuView {
                            gpu,
                            slots: slots.remove(&g.uuid).unwrap_or_default(),
                            memory_allocated: usage
                                .map_or(MiB::ZERO, |u| u.memory_capacity - u.memory_free),
                            compute_allocated: usage.map_or(ComputeMilli(0), |u| {
                                ComputeMilli(u.compute_capacity.0 - u.compute_free.0)
                            }),
                            compute_capacity: usage
                                .map_or(ComputeMilli(1000), |u| u.compute_capacity),
                            clients: usage.map_or(0, |u| u.clients),
                            client_limit: usage.map_or(g.mps_client_limit, |u| u.client_limit),
                        }
                    })
                    .collect();
                HostView {
                    host: host.clone(),
                    gpus,
                }
            })
            .collect())
    }

    /// One host's view and its latest events.
    pub async fn host_view(&self, id: &HostId) -> Result<(HostView, Vec<Event>), ControlError> {
        let host = self.store.get_host(id).await?;
        let view = self.host_views(vec![host]).await?.remove(0);
        let events = self
            .store
            .list_events(&EventFilter {
                host: Some(id.clone()),
                limit: 15,
                ..Default::default()
            })
            .await?;
        Ok((view, events))
    }

    /// The hosts page: filtered, one page of host views, read a page at a time.
    pub async fn hosts_page(&self, q: &HostQuery) -> Result<HostsPage, ControlError> {
        let per_page = HOSTS_PER_PAGE as u32;
        let query = |page: u32| HostPageQuery {
            pool: q.pool.clone(),
            status: q.status.clone(),
            model: q.model.clone(),
            offset: page * per_page,
            limit: per_page,
        };
        let mut found = self.store.host_page(&query(q.page)).await?;
        let pages = (found.matched.div_ceil(u64::from(per_page))).max(1) as u32;
        let page = q.page.min(pages - 1);
        if page != q.page {
            // Past the last page: show the last one.
            found = self.store.host_page(&query(page)).await?;
        }
        Ok(HostsPage {
            hosts: self.host_views(found.hosts).await?,
            total: found.total as u32,
            matched: found.matched as u32,
            page,
            pages,
            pools: found.pools,
            models: found.models,
        })
    }

    /// The overview's figures, over the whole fleet (from the fleet read model).
    pub async fn overview(&self) -> Result<OverviewData, ControlError> {
        let fleet = self.fleet().await?;
        let mut pending: Vec<&Task> = fleet.pending().collect();
        pending.sort_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id)));
        let mut by_status: BTreeMap<_, u32> = BTreeMap::new();
        for b in fleet.hosts() {
            *by_status.entry(b.host.status).or_default() += 1;
        }
        let measured = fleet
            .holding()
            .filter_map(|t| t.measured.gpu_memory_peak)
            .reduce(|a, b| a + b);
        let usages: Vec<GpuUsage> = fleet
            .hosts()
            .flat_map(|b| b.gpus.iter().filter_map(|g| g.usage))
            .collect();
        let count = |mode| usages.iter().filter(|u| u.mode == mode).count() as u32;
        let sum = |f: fn(&GpuUsage) -> u64| usages.iter().map(f).sum::<u64>();

        // Stranded: free memory on GPUs too small for the smallest pending task.
        let specs = self
            .scheduler
            .task_definition_specs(pending.iter().map(|t| t.task_definition.clone()).collect())
            .await?;
        let mut smallest: Option<(MiB, String)> = None;
        let mut pending_by_service: BTreeMap<String, (u32, Option<String>)> = BTreeMap::new();
        for t in pending.iter().copied() {
            let e = pending_by_service.entry(t.service.clone()).or_default();
            e.0 += 1;
            if e.1.is_none() {
                e.1 = t.placement_message.clone();
            }
            let need = match specs[&t.task_definition].gpu() {
                TaskGpu::Shared { memory, .. } => Some(memory),
                TaskGpu::Whole { .. } | TaskGpu::None => None,
            };
            if let Some(m) = need.filter(|m| smallest.as_ref().is_none_or(|(s, _)| m < s)) {
                smallest = Some((m, format!("{} ({m} GPU memory)", t.task_definition)));
            }
        }
        let stranded = match &smallest {
            Some((need, _)) => usages
                .iter()
                .filter(|u| u.mode != SharingMode::Dedicated)
                .map(|u| u.memory_free.0)
                .filter(|free| *free > 0 && *free < need.0)
                .sum(),
            None => 0,
        };
        let events = self
            .store
            .list_events(&EventFilter {
                limit: 12,
                ..Default::default()
            })
            .await?;
        Ok(OverviewData {
            hosts_by_status: by_status.into_iter().collect(),
            simulated_hosts: fleet.hosts().filter(|b| b.host.simulated).count() as u32,
            gpus_idle: count(SharingMode::Idle),
            gpus_mps: count(SharingMode::Mps),
            gpus_dedicated: count(SharingMode::Dedicated),
            memory_total: MiB(sum(|u| u.memory_capacity.0)),
            memory_allocated: MiB(sum(|u| u.memory_capacity.0 - u.memory_free.0)),
            memory_measured: measured,
            compute_total: ComputeMilli(sum(|u| u64::from(u.compute_capacity.0)) as u32),
            compute_allocated: ComputeMilli(sum(|u| {
                u64::from(u.compute_capacity.0 - u.compute_free.0)
            }) as u32),
            density: crate::density_of(usages.iter().copied()),
            stranded_memory: MiB(stranded),
            smallest_pending: smallest.map(|(_, s)| s),
            pending: pending_by_service
                .into_iter()
                .map(|(service, (count, message))| PendingView {
                    service,
                    count,
                    message,
                })
                .collect(),
            failing: self.failing().await?,
            events,
        })
    }

    /// Services whose current deployments' tasks keep failing, most failures first, each
    /// with its latest failed task: one query, and one more per such service (at most
    /// [`FAILING_SHOWN`]).
    async fn failing(&self) -> Result<Vec<FailingView>, ControlError> {
        use tessera_model::service::DeploymentStatus;
        let mut failing: Vec<_> = self
            .store
            .list_all_deployments()
            .await?
            .into_iter()
            .filter(|d| {
                d.failed_tasks > 0
                    && matches!(
                        d.status,
                        DeploymentStatus::Primary | DeploymentStatus::Active
                    )
            })
            .collect();
        failing.sort_by(|a, b| (b.failed_tasks, &a.service).cmp(&(a.failed_tasks, &b.service)));
        failing.truncate(FAILING_SHOWN);
        let mut out = Vec::with_capacity(failing.len());
        for d in failing {
            let last = self
                .store
                .list_tasks(&TaskFilter {
                    service: Some(d.service.clone()),
                    states: vec![TaskState::Stopped],
                    limit: Some(20),
                    newest_first: true,
                    without_allocations: true,
                    ..Default::default()
                })
                .await?
                .into_iter()
                .find(|t| t.deployment_id == d.id && t.exit_code.is_some_and(|c| c != 0));
            out.push(FailingView {
                service: d.service,
                deployment: d.id,
                failed_tasks: d.failed_tasks,
                last_exit: last.as_ref().and_then(Task::how_it_ended),
                last_task: last.map(|t| t.id),
            });
        }
        Ok(out)
    }

    /// Tasks of a service for its page: every live one (at most 500), newest first, then
    /// the newest stopped ones (a crash-looping service's latest failures, however many
    /// came before).
    pub async fn service_tasks(&self, service: &str) -> Result<Vec<Task>, ControlError> {
        let of = |states: Vec<TaskState>, limit| TaskFilter {
            service: Some(service.to_owned()),
            states,
            limit: Some(limit),
            newest_first: true,
            ..Default::default()
        };
        let live = vec![
            TaskState::Pending,
            TaskState::Assigned,
            TaskState::Running,
            TaskState::Stopping,
        ];
        let mut tasks = self.store.list_tasks(&of(live, 500)).await?;
        let stopped = self
            .store
            .list_tasks(&of(vec![TaskState::Stopped], STOPPED_SHOWN))
            .await?;
        tasks.extend(stopped);
        Ok(tasks)
    }
}
