//! What the console's pages show, computed on the server from the control plane and sent
//! to the browser: hosts with each GPU's slots, the overview's figures, service detail.

use serde::{Deserialize, Serialize};
use tessera_model::api::Density;
use tessera_model::service::{Event, TaskState};
use tessera_model::{ComputeMilli, GpuInfo, HostInfo, HostStatus, MiB};

/// One task's share of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotView {
    pub task_id: String,
    pub service: String,
    pub memory: MiB,
    pub compute: ComputeMilli,
    pub dedicated: bool,
    pub measured_peak: Option<MiB>,
    pub state: TaskState,
}

/// A GPU and what is allocated on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub gpu: GpuInfo,
    pub slots: Vec<SlotView>,
}

impl GpuView {
    pub fn memory_allocated(&self) -> MiB {
        self.slots.iter().map(|s| s.memory).sum()
    }

    pub fn compute_allocated(&self) -> ComputeMilli {
        self.slots.iter().map(|s| s.compute).sum()
    }

    pub fn measured(&self) -> Option<MiB> {
        let peaks: Vec<MiB> = self.slots.iter().filter_map(|s| s.measured_peak).collect();
        (!peaks.is_empty()).then(|| peaks.into_iter().sum())
    }
}

/// A host with its GPUs' allocations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostView {
    pub host: HostInfo,
    pub gpus: Vec<GpuView>,
    /// Why it is impaired, lost or draining.
    pub status_reason: Option<String>,
}

impl HostView {
    pub fn tasks(&self) -> usize {
        let mut ids: Vec<&str> = self
            .gpus
            .iter()
            .flat_map(|g| g.slots.iter().map(|s| s.task_id.as_str()))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// The MPS daemon's state in words, from what the agent reported.
    pub fn mps_state(&self) -> &'static str {
        match (&self.host.status, &self.status_reason) {
            (HostStatus::Lost, _) => "unknown",
            (_, Some(r)) if r.contains("MPS") => "unhealthy",
            _ => "healthy",
        }
    }

    /// The agent's state in words.
    pub fn agent_state(&self) -> &'static str {
        if self.host.status == HostStatus::Lost {
            "silent"
        } else {
            "syncing"
        }
    }
}

/// Filters and paging of the hosts page (its query string).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostQuery {
    pub pool: String,
    pub status: String,
    pub model: String,
    pub page: u32,
}

/// Hosts shown per page: enough to scan, few enough to render fast at any fleet size.
pub const HOSTS_PER_PAGE: usize = 24;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostsPage {
    pub hosts: Vec<HostView>,
    pub total: u32,
    pub matched: u32,
    pub page: u32,
    pub pages: u32,
    pub pools: Vec<String>,
    pub models: Vec<String>,
}

/// Pending tasks of one service and why they wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingView {
    pub service: String,
    pub count: u32,
    pub message: Option<String>,
}

/// The overview's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverviewData {
    pub hosts_by_status: Vec<(HostStatus, u32)>,
    pub simulated_hosts: u32,
    pub gpus_idle: u32,
    pub gpus_mps: u32,
    pub gpus_dedicated: u32,
    pub memory_total: MiB,
    pub memory_allocated: MiB,
    /// Peak use the agents measured, where they report it.
    pub memory_measured: Option<MiB>,
    pub compute_total: ComputeMilli,
    pub compute_allocated: ComputeMilli,
    pub density: Density,
    /// Free GPU memory on GPUs whose free memory is too small for the smallest pending
    /// task (zero when nothing is pending).
    pub stranded_memory: MiB,
    pub smallest_pending: Option<String>,
    pub pending: Vec<PendingView>,
    pub events: Vec<Event>,
}

/// A stable colour for a service, so its slots look alike on every host.
pub fn service_hue(service: &str) -> u32 {
    service
        .bytes()
        .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
        % 360
}

#[cfg(feature = "ssr")]
pub(crate) mod ssr {
    //! Building the views from the control plane.

    use super::*;
    use leptos::prelude::*;
    use std::collections::{BTreeMap, HashMap};
    use tessera_control::Control;
    use tessera_control::store::{EventFilter, TaskFilter};
    use tessera_model::service::Task;
    use tessera_model::taskdef::TaskGpu;

    /// Who is calling, as the server's authentication layer found it on the request.
    pub fn caller() -> Option<tessera_model::auth::Caller> {
        use_context::<http::request::Parts>()?
            .extensions
            .get::<tessera_model::auth::Caller>()
            .cloned()
    }

    /// The control plane, provided by the server to every page and server function; only
    /// to a signed-in caller (the authentication layer checks each server function's role
    /// before it runs; this keeps a page rendered without a caller from reading anything).
    pub fn control() -> Result<Control, ServerFnError> {
        if caller().is_none() {
            return Err(ServerFnError::new("sign in first"));
        }
        use_context::<Control>()
            .ok_or_else(|| ServerFnError::new("the console is not connected to the control plane"))
    }

    /// A failure the operator cannot act on: logged with its cause, shown without it.
    pub fn internal(e: impl std::fmt::Display) -> ServerFnError {
        tracing::error!(error = %e, "console request failed");
        ServerFnError::new("the server could not answer; its log has the cause")
    }

    const HOLDING: [TaskState; 3] = [TaskState::Assigned, TaskState::Running, TaskState::Stopping];

    /// Each host with its GPUs' slots.
    pub async fn host_views(
        control: &Control,
        hosts: Vec<HostInfo>,
    ) -> Result<Vec<HostView>, ServerFnError> {
        let store = control.store();
        let tasks = if hosts.is_empty() {
            Vec::new()
        } else {
            store
                .list_tasks(&TaskFilter {
                    hosts: hosts.iter().map(|h| h.id.clone()).collect(),
                    states: HOLDING.to_vec(),
                    ..Default::default()
                })
                .await
                .map_err(internal)?
        };
        let mut by_gpu: HashMap<String, Vec<SlotView>> = HashMap::new();
        for t in &tasks {
            for a in &t.allocations {
                by_gpu.entry(a.gpu.to_string()).or_default().push(SlotView {
                    task_id: t.id.clone(),
                    service: t.service.clone(),
                    memory: a.memory,
                    compute: a.compute,
                    dedicated: a.dedicated,
                    measured_peak: t.measured.gpu_memory_peak,
                    state: t.state,
                });
            }
        }
        let mut views = Vec::with_capacity(hosts.len());
        for host in hosts {
            let status_reason = if host.status == HostStatus::Active {
                None
            } else {
                store.host_status_reason(&host.id).await.map_err(internal)?
            };
            let gpus = host
                .gpus
                .iter()
                .map(|g| {
                    let slots = by_gpu.remove(g.uuid.as_str()).unwrap_or_default();
                    // The mode follows from the allocations now, not from the last sync.
                    let sharing_mode = match slots.first() {
                        None => tessera_model::SharingMode::Idle,
                        Some(s) if s.dedicated => tessera_model::SharingMode::Dedicated,
                        Some(_) => tessera_model::SharingMode::Mps,
                    };
                    GpuView {
                        gpu: tessera_model::GpuInfo {
                            sharing_mode,
                            ..g.clone()
                        },
                        slots,
                    }
                })
                .collect();
            views.push(HostView {
                host,
                gpus,
                status_reason,
            });
        }
        Ok(views)
    }

    /// The hosts page: filtered, one page of host views.
    pub async fn hosts_page(control: &Control, q: &HostQuery) -> Result<HostsPage, ServerFnError> {
        let all = control.store().list_hosts().await.map_err(internal)?;
        let total = all.len() as u32;
        let mut pools: Vec<String> = all.iter().map(|h| h.pool.to_string()).collect();
        pools.sort();
        pools.dedup();
        let mut models: Vec<String> = all
            .iter()
            .flat_map(|h| h.gpus.iter().map(|g| g.model.clone()))
            .collect();
        models.sort();
        models.dedup();
        let matched: Vec<HostInfo> = all
            .into_iter()
            .filter(|h| {
                (q.pool.is_empty() || h.pool.as_str() == q.pool)
                    && (q.status.is_empty() || h.status.as_str() == q.status)
                    && (q.model.is_empty() || h.gpus.iter().any(|g| g.model == q.model))
            })
            .collect();
        let pages = (matched.len().div_ceil(HOSTS_PER_PAGE)).max(1) as u32;
        let page = q.page.min(pages - 1);
        let matched_count = matched.len() as u32;
        let shown: Vec<HostInfo> = matched
            .into_iter()
            .skip(page as usize * HOSTS_PER_PAGE)
            .take(HOSTS_PER_PAGE)
            .collect();
        Ok(HostsPage {
            hosts: host_views(control, shown).await?,
            total,
            matched: matched_count,
            page,
            pages,
            pools,
            models,
        })
    }

    pub async fn overview(control: &Control) -> Result<OverviewData, ServerFnError> {
        let store = control.store();
        let hosts = store.list_hosts().await.map_err(internal)?;
        let holding = store
            .list_tasks(&TaskFilter {
                states: HOLDING.to_vec(),
                ..Default::default()
            })
            .await
            .map_err(internal)?;
        let pending = store
            .list_tasks(&TaskFilter {
                states: vec![TaskState::Pending],
                ..Default::default()
            })
            .await
            .map_err(internal)?;
        let mut by_status: BTreeMap<HostStatus, u32> = BTreeMap::new();
        for h in &hosts {
            *by_status.entry(h.status).or_default() += 1;
        }
        let mut used: HashMap<&str, (u64, u32, u32, bool)> = HashMap::new();
        let mut measured = None::<u64>;
        for t in &holding {
            if let Some(p) = t.measured.gpu_memory_peak {
                measured = Some(measured.unwrap_or(0) + p.0);
            }
            for a in &t.allocations {
                let e = used.entry(a.gpu.as_str()).or_default();
                e.0 += a.memory.0;
                e.1 += a.compute.0;
                e.2 += 1;
                e.3 |= a.dedicated;
            }
        }
        let (mut idle, mut mps, mut dedicated) = (0, 0, 0);
        let (mut mem_total, mut mem_alloc, mut compute_total, mut compute_alloc) =
            (0u64, 0u64, 0u32, 0u32);
        let mut usage = Vec::new();
        for g in hosts.iter().flat_map(|h| h.gpus.iter()) {
            mem_total += g.memory.0;
            compute_total += 1000;
            let (mode, mem, compute, clients) = match used.get(g.uuid.as_str()) {
                None => {
                    idle += 1;
                    (tessera_model::SharingMode::Idle, 0, 0, 0)
                }
                Some(&(_, _, _, true)) => {
                    dedicated += 1;
                    (tessera_model::SharingMode::Dedicated, g.memory.0, 1000, 1)
                }
                Some(&(mem, compute, clients, false)) => {
                    mps += 1;
                    (
                        tessera_model::SharingMode::Mps,
                        mem.min(g.memory.0),
                        compute,
                        clients,
                    )
                }
            };
            mem_alloc += mem;
            compute_alloc += compute;
            usage.push(gpu_usage(
                g.memory,
                mem,
                compute,
                clients,
                g.mps_client_limit,
                mode,
            ));
        }
        let density = tessera_control::density_of(usage);

        // Stranded: free memory on GPUs too small for the smallest pending task.
        let mut smallest: Option<(MiB, String)> = None;
        let mut pending_by_service: BTreeMap<String, (u32, Option<String>)> = BTreeMap::new();
        let specs = control
            .task_definition_specs(pending.iter().map(|t| t.task_definition.clone()).collect())
            .await
            .map_err(internal)?;
        for t in &pending {
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
            Some((need, _)) => hosts
                .iter()
                .flat_map(|h| h.gpus.iter())
                .filter(|g| !used.get(g.uuid.as_str()).is_some_and(|u| u.3))
                .map(|g| g.memory.0 - used.get(g.uuid.as_str()).map_or(0, |u| u.0).min(g.memory.0))
                .filter(|free| *free > 0 && *free < need.0)
                .sum(),
            None => 0,
        };
        let events = store
            .list_events(&EventFilter {
                limit: 12,
                ..Default::default()
            })
            .await
            .map_err(internal)?;
        Ok(OverviewData {
            hosts_by_status: by_status.into_iter().collect(),
            simulated_hosts: hosts.iter().filter(|h| h.simulated).count() as u32,
            gpus_idle: idle,
            gpus_mps: mps,
            gpus_dedicated: dedicated,
            memory_total: MiB(mem_total),
            memory_allocated: MiB(mem_alloc),
            memory_measured: measured.map(MiB),
            compute_total: ComputeMilli(compute_total),
            compute_allocated: ComputeMilli(compute_alloc),
            density,
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
            events,
        })
    }

    /// One GPU's usage as the density measure reads it.
    fn gpu_usage(
        capacity: MiB,
        used: u64,
        compute: u32,
        clients: u32,
        client_limit: u32,
        mode: tessera_model::SharingMode,
    ) -> tessera_control::GpuUsage {
        tessera_control::GpuUsage {
            memory_free: MiB(capacity.0 - used),
            memory_capacity: capacity,
            compute_free: ComputeMilli(1000u32.saturating_sub(compute)),
            compute_capacity: ComputeMilli(1000),
            clients,
            client_limit,
            mode,
        }
    }

    /// Tasks of a service, newest first, for its page.
    pub async fn service_tasks(
        control: &Control,
        service: &str,
    ) -> Result<Vec<Task>, ServerFnError> {
        let mut tasks = control
            .store()
            .list_tasks(&TaskFilter {
                service: Some(service.to_owned()),
                limit: Some(500),
                ..Default::default()
            })
            .await
            .map_err(internal)?;
        tasks.sort_by(|a, b| {
            (a.state == TaskState::Stopped, &b.created_at)
                .cmp(&(b.state == TaskState::Stopped, &a.created_at))
        });
        tasks.truncate(100);
        Ok(tasks)
    }
}
