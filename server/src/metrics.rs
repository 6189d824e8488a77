//! Prometheus metrics at `GET /metrics` (a viewer's API token, as every read of the API),
//! through the `metrics` facade and its Prometheus exporter.
//!
//! Two kinds of figures:
//! - **timings**, recorded where they happen as histograms: reconcile passes and placement
//!   commits (`control`), agent syncs (here, around the handler);
//! - **the fleet as it stands**, set as gauges from the control plane's read models on
//!   each scrape: per GPU memory total, reserved and used (measured peaks) and compute
//!   reserved; per task measured memory and SM use; hosts by status; pending tasks by
//!   reason; deployments in progress.
//!
//! A gauge not set again for five minutes (a task that ended, a host deleted) is dropped.

use crate::error::ApiError;
use metrics::gauge;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;
use tessera_control::Control;
use tessera_control::store::TaskFilter;
use tessera_model::service::{DeploymentStatus, TaskState};

/// The process's recorder: installed once, on first use.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets(&[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0,
            ])
            .expect("buckets are not empty")
            .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(300)))
            .build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!(
                "another metrics recorder is installed; /metrics shows only the fleet's gauges"
            );
        }
        describe();
        handle
    })
}

fn describe() {
    use metrics::{describe_gauge, describe_histogram};
    describe_gauge!("tessera_gpu_memory_total_mib", "GPU memory, MiB");
    describe_gauge!(
        "tessera_gpu_memory_reserved_mib",
        "GPU memory reserved by tasks' budgets, MiB"
    );
    describe_gauge!(
        "tessera_gpu_memory_used_mib",
        "GPU memory its tasks were measured to use at their peaks, MiB"
    );
    describe_gauge!(
        "tessera_gpu_compute_reserved_ratio",
        "Share of the GPU's compute reserved by MPS caps and whole-GPU tasks"
    );
    describe_gauge!(
        "tessera_task_gpu_memory_peak_mib",
        "A task's measured peak GPU memory, MiB"
    );
    describe_gauge!(
        "tessera_task_sm_percent",
        "A task's measured streaming-multiprocessor use, %"
    );
    describe_gauge!("tessera_hosts", "Hosts by status");
    describe_gauge!(
        "tessera_project_used",
        "What a project's tasks reserve in a pool, by resource (gpus, gpu_memory_mib, compute_milli, cpu_milli, memory_mib)"
    );
    describe_gauge!(
        "tessera_project_borrowed",
        "What a project uses in a pool beyond its guarantee, by resource"
    );
    describe_gauge!(
        "tessera_project_guaranteed",
        "A project's guaranteed quota in a pool, by resource (only those it names)"
    );
    describe_gauge!(
        "tessera_project_limit",
        "A project's limit in a pool, by resource (only those it names; absent: no limit)"
    );
    describe_gauge!(
        "tessera_project_tasks_pending",
        "A project's tasks in a pool waiting for a placement"
    );
    describe_gauge!(
        "tessera_tasks_pending",
        "Tasks waiting for a placement, by the scheduler's reason"
    );
    describe_gauge!(
        "tessera_deployments_in_progress",
        "Deployments not yet completed (new revisions rolling out, old ones draining)"
    );
    describe_histogram!(
        "tessera_reconcile_pass_seconds",
        "Duration of the scheduler's reconcile passes"
    );
    describe_histogram!(
        "tessera_placement_commit_seconds",
        "Duration of placement commits (the capacity re-check and the writes)"
    );
    describe_histogram!(
        "tessera_agent_sync_seconds",
        "Duration of agent syncs, authentication included"
    );
}

/// The last rendering, shared by every scrape for [`Rendered::FRESH_FOR`]: one rendering
/// runs at a time and scrapers that come meanwhile wait for it, so any number of scrapers
/// (or one viewer scraping in a loop) cost one reading of the fleet per period, not one
/// each.
#[derive(Clone, Default)]
pub struct Rendered {
    last: std::sync::Arc<tokio::sync::Mutex<Option<Rendering>>>,
}

/// One rendering: when, and the text.
type Rendering = (std::time::Instant, std::sync::Arc<String>);

impl Rendered {
    /// How long a rendering is served as it is (Prometheus scrapes every 15 s or more).
    pub const FRESH_FOR: Duration = Duration::from_secs(5);

    /// The metrics as of at most [`Rendered::FRESH_FOR`] ago.
    pub async fn get(&self, control: &Control) -> Result<std::sync::Arc<String>, ApiError> {
        let mut last = self.last.lock().await;
        if let Some((at, text)) = last.as_ref()
            && at.elapsed() < Self::FRESH_FOR
        {
            return Ok(text.clone());
        }
        let text = std::sync::Arc::new(render(control).await?);
        *last = Some((std::time::Instant::now(), text.clone()));
        Ok(text)
    }
}

/// Sets the fleet's gauges from the control plane, then renders everything.
pub async fn render(control: &Control) -> Result<String, ApiError> {
    let handle = handle();
    let hosts = control.list_hosts().await?;
    let mut by_status: BTreeMap<&'static str, u64> = ["active", "draining", "impaired", "lost"]
        .into_iter()
        .map(|s| (s, 0))
        .collect();
    for h in &hosts {
        *by_status.entry(h.status.as_str()).or_default() += 1;
    }
    for (status, n) in by_status {
        gauge!("tessera_hosts", "status" => status).set(n as f64);
    }
    for view in control.host_views(hosts).await? {
        let host = view.host.id.to_string();
        for g in &view.gpus {
            let labels = [
                ("host", host.clone()),
                ("gpu", g.gpu.uuid.to_string()),
                ("index", g.gpu.index.to_string()),
                ("model", g.gpu.model.clone()),
            ];
            gauge!("tessera_gpu_memory_total_mib", &labels).set(g.gpu.memory.0 as f64);
            gauge!("tessera_gpu_memory_reserved_mib", &labels).set(g.memory_allocated.0 as f64);
            gauge!("tessera_gpu_memory_used_mib", &labels)
                .set(g.measured().map_or(0.0, |m| m.0 as f64));
            gauge!("tessera_gpu_compute_reserved_ratio", &labels)
                .set(f64::from(g.compute_allocated.0) / 1000.0);
        }
    }
    let placed = control
        .list_tasks(&TaskFilter {
            states: vec![TaskState::Assigned, TaskState::Running],
            without_allocations: true,
            ..Default::default()
        })
        .await?;
    for t in &placed {
        let labels = [
            ("task", t.id.clone()),
            ("service", t.service.clone()),
            (
                "host",
                t.host.as_ref().map(|h| h.to_string()).unwrap_or_default(),
            ),
        ];
        if let Some(peak) = t.measured.gpu_memory_peak {
            gauge!("tessera_task_gpu_memory_peak_mib", &labels).set(peak.0 as f64);
        }
        if let Some(sm) = t.measured.sm_percent {
            gauge!("tessera_task_sm_percent", &labels).set(f64::from(sm));
        }
    }
    for p in control.list_projects().await? {
        for share in &p.pools {
            let labels = [
                ("project", p.project.name.clone()),
                ("pool", share.pool.clone()),
            ];
            let with = |resource: &str| {
                let mut l = labels.to_vec();
                l.push(("resource", resource.to_owned()));
                l
            };
            for ((resource, used), (_, borrowed)) in
                share.used.named().into_iter().zip(share.borrowed.named())
            {
                gauge!("tessera_project_used", &with(resource)).set(used as f64);
                gauge!("tessera_project_borrowed", &with(resource)).set(borrowed as f64);
            }
            for (resource, v) in share.guaranteed.named() {
                gauge!("tessera_project_guaranteed", &with(resource)).set(v as f64);
            }
            for (resource, v) in share.limit.named() {
                gauge!("tessera_project_limit", &with(resource)).set(v as f64);
            }
            gauge!("tessera_project_tasks_pending", &labels).set(f64::from(share.pending));
        }
    }
    let pending = control
        .list_tasks(&TaskFilter {
            states: vec![TaskState::Pending],
            without_allocations: true,
            ..Default::default()
        })
        .await?;
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    for t in &pending {
        let reason = t
            .placement_message
            .clone()
            .unwrap_or_else(|| "not tried yet".to_owned());
        *reasons.entry(reason).or_default() += 1;
    }
    for (reason, n) in reasons {
        gauge!("tessera_tasks_pending", "reason" => reason).set(n as f64);
    }
    let in_progress = control
        .service_details()
        .await?
        .iter()
        .flat_map(|s| &s.deployments)
        .filter(|d| match d.status {
            DeploymentStatus::Primary => d.pending > 0,
            DeploymentStatus::Active => true,
            _ => false,
        })
        .count();
    gauge!("tessera_deployments_in_progress").set(in_progress as f64);
    handle.run_upkeep();
    Ok(handle.render())
}
