//! Prometheus metrics at `GET /metrics` (a viewer's API token, as every read of the API).
//!
//! Two kinds of figures:
//! - **timings and counts**, recorded where they happen through the `metrics` facade and
//!   its Prometheus exporter: reconcile passes and placement commits (`control`), agent
//!   syncs (here, around the handler);
//! - **the fleet as it stands**, written out on each scrape from the control plane's fleet
//!   read model (kept up to date from what changed, not read from the store per scrape):
//!   per GPU memory total, reserved and used (measured peaks) and compute reserved; per
//!   task measured memory and SM use; hosts by status; projects' use and quotas; pending
//!   tasks by reason; deployments in progress. A task that ended or a host deleted is
//!   simply not in the next scrape.
//!
//! The fleet's figures are written as the body is sent, a chunk at a time, so a scrape of
//! a large fleet never holds its whole text. Each user has at most [`SCRAPES_PER_USER`]
//! scrapes in flight (`503` past it), and chunks are written [`SCRAPES_AT_ONCE`] at a time
//! fleet-wide, turns first come first served: one client scraping in a loop, or reading
//! slowly, cannot take everyone's turns.

use crate::error::ApiError;
use axum::body::Body;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tessera_control::{Control, FleetSnapshot, HostBlock};
use tessera_model::HostId;
use tessera_model::project::ProjectView;
use tessera_model::service::{DeploymentStatus, TaskState};
use tokio::sync::Semaphore;

/// How many chunks of scrapes are written at once, fleet-wide.
pub const SCRAPES_AT_ONCE: usize = 2;

/// Roughly how many bytes one chunk of the body holds.
const CHUNK_BYTES: usize = 64 * 1024;

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
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        "tessera_reconcile_passes_total",
        "Reconcile passes, by scope (full, or only what changed)"
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

/// Who may write scrapes, and how much: at most [`SCRAPES_PER_USER`] of one user's at a
/// time (an HA pair of Prometheus servers sharing a token fits), and fleet-wide at most
/// [`SCRAPES_AT_ONCE`] chunks being written at once, turns taken first come first served.
/// A turn is taken per chunk, not per scrape: a client that reads slowly holds nobody's
/// turn but its own share.
#[derive(Clone)]
pub struct Scrapes {
    turns: Arc<Semaphore>,
    users: crate::edge::Shares<String>,
}

/// How many scrapes one user may have in flight.
pub const SCRAPES_PER_USER: usize = 2;

impl Default for Scrapes {
    fn default() -> Self {
        Scrapes {
            turns: Arc::new(Semaphore::new(SCRAPES_AT_ONCE)),
            users: crate::edge::Shares::new(SCRAPES_PER_USER),
        }
    }
}

impl Scrapes {
    /// The body of one scrape by `user`: reads what it shows once, then writes it out a
    /// chunk at a time as it is sent.
    pub async fn body(&self, control: &Control, user: &str) -> Result<Body, ApiError> {
        let mine = self.users.enter(&user.to_owned()).ok_or_else(|| {
            ApiError::Unavailable(format!(
                "{user} has {SCRAPES_PER_USER} scrapes of /metrics in flight already; wait for one to end"
            ))
        })?;
        let exposition = Exposition::read(control).await?;
        let turns = self.turns.clone();
        let chunks = futures_util::stream::unfold(
            (exposition, turns, mine),
            |(mut exposition, turns, mine)| async move {
                let turn = turns
                    .acquire()
                    .await
                    .expect("the semaphore is never closed");
                let chunk = exposition.next()?;
                drop(turn);
                Some((
                    Ok::<_, std::convert::Infallible>(chunk),
                    (exposition, turns, mine),
                ))
            },
        );
        // Fused: a compressing layer (Prometheus asks for gzip) polls the body once more
        // after its end, which an unfold stream must never be.
        Ok(Body::from_stream(futures_util::StreamExt::fuse(chunks)))
    }
}

/// A fleet family: its name, help, and which part of the fleet it is written from.
struct Family {
    name: &'static str,
    help: &'static str,
    of: Of,
}

#[derive(Clone, Copy)]
enum Of {
    GpuTotal,
    GpuReserved,
    GpuUsed,
    GpuCompute,
    TaskPeak,
    TaskSm,
}

/// The families written host by host (a chunk at a time), in this order.
const PER_HOST: [Family; 6] = [
    Family {
        name: "tessera_gpu_memory_total_mib",
        help: "GPU memory, MiB",
        of: Of::GpuTotal,
    },
    Family {
        name: "tessera_gpu_memory_reserved_mib",
        help: "GPU memory reserved by tasks' budgets, MiB",
        of: Of::GpuReserved,
    },
    Family {
        name: "tessera_gpu_memory_used_mib",
        help: "GPU memory its tasks were measured to use at their peaks, MiB",
        of: Of::GpuUsed,
    },
    Family {
        name: "tessera_gpu_compute_reserved_ratio",
        help: "Share of the GPU's compute reserved by MPS caps and whole-GPU tasks",
        of: Of::GpuCompute,
    },
    Family {
        name: "tessera_task_gpu_memory_peak_mib",
        help: "A task's measured peak GPU memory, MiB",
        of: Of::TaskPeak,
    },
    Family {
        name: "tessera_task_sm_percent",
        help: "A task's measured streaming-multiprocessor use, %",
        of: Of::TaskSm,
    },
];

/// One scrape being written: what it shows, read once (one reading of the fleet read
/// model for every figure), and where it is.
struct Exposition {
    fleet: Arc<FleetSnapshot>,
    projects: Vec<ProjectView>,
    /// Machines pools' providers were asked for and that may still cost money.
    machines: Vec<tessera_model::provider::Machine>,
    /// Since when the scheduler lease's holder holds it (unix seconds), if one does.
    lease_since: Option<f64>,
    deployments_in_progress: usize,
    /// What the `metrics` registry holds (timings and counts): small.
    registry: String,
    /// The next part to write: 0 the head, 1..=6 the families of [`PER_HOST`], 7 the tail.
    part: usize,
    /// Within a per-host family: the last host written.
    after: Option<HostId>,
}

impl Exposition {
    async fn read(control: &Control) -> Result<Self, ApiError> {
        let handle = handle();
        let fleet = control.views().fleet().await?;
        let projects = control.projects().list_projects_in(&fleet).await?;
        let deployments_in_progress = control
            .views()
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
        let machines = control.providers().machines(None, false).await?;
        let lease_since = control
            .cluster()
            .await?
            .servers
            .iter()
            .find(|s| s.scheduling)
            .and_then(|s| s.since)
            .map(|t| t.millis() as f64 / 1000.0);
        handle.run_upkeep();
        Ok(Exposition {
            fleet,
            projects,
            machines,
            lease_since,
            deployments_in_progress,
            registry: handle.render(),
            part: 0,
            after: None,
        })
    }

    /// The head: the registry's figures, then hosts by status.
    fn head(&self) -> String {
        let mut out = self.registry.clone();
        let mut by_status: BTreeMap<&'static str, u64> = ["active", "draining", "impaired", "lost"]
            .into_iter()
            .map(|s| (s, 0))
            .collect();
        for b in self.fleet.hosts() {
            *by_status.entry(b.host.status.as_str()).or_default() += 1;
        }
        family(&mut out, "tessera_hosts", "Hosts by status");
        for (status, n) in by_status {
            sample(&mut out, "tessera_hosts", &[("status", status)], n as f64);
        }
        out
    }

    /// The tail: projects, pending tasks, deployments.
    fn tail(&self) -> String {
        let mut out = String::new();
        let share_families: [(&str, &str); 5] = [
            (
                "tessera_project_used",
                "What a project's tasks reserve in a pool, by resource (gpus, gpu_memory_mib, compute_milli, cpu_milli, memory_mib)",
            ),
            (
                "tessera_project_borrowed",
                "What a project uses in a pool beyond its guarantee, by resource",
            ),
            (
                "tessera_project_guaranteed",
                "A project's guaranteed quota in a pool, by resource (only those it names)",
            ),
            (
                "tessera_project_limit",
                "A project's limit in a pool, by resource (only those it names; absent: no limit)",
            ),
            (
                "tessera_project_tasks_pending",
                "A project's tasks in a pool waiting for a placement",
            ),
        ];
        for (i, (name, help)) in share_families.into_iter().enumerate() {
            family(&mut out, name, help);
            for p in &self.projects {
                for share in &p.pools {
                    let labels = [
                        ("project", p.project.name.as_str()),
                        ("pool", share.pool.as_str()),
                    ];
                    let figures: Vec<(&str, u64)> = match i {
                        0 => share.used.named().to_vec(),
                        1 => share.borrowed.named().to_vec(),
                        2 => share.guaranteed.named(),
                        3 => share.limit.named(),
                        _ => {
                            sample(&mut out, name, &labels, f64::from(share.pending));
                            continue;
                        }
                    };
                    for (resource, v) in figures {
                        let [a, b] = labels;
                        sample(&mut out, name, &[a, b, ("resource", resource)], v as f64);
                    }
                }
            }
        }
        let mut reasons: BTreeMap<&str, u64> = BTreeMap::new();
        for t in self.fleet.pending() {
            let reason = t.placement_message.as_deref().unwrap_or("not tried yet");
            *reasons.entry(reason).or_default() += 1;
        }
        family(
            &mut out,
            "tessera_tasks_pending",
            "Tasks waiting for a placement, by the scheduler's reason",
        );
        for (reason, n) in reasons {
            sample(
                &mut out,
                "tessera_tasks_pending",
                &[("reason", reason)],
                n as f64,
            );
        }
        family(
            &mut out,
            "tessera_deployments_in_progress",
            "Deployments not yet completed (new revisions rolling out, old ones draining)",
        );
        sample(
            &mut out,
            "tessera_deployments_in_progress",
            &[],
            self.deployments_in_progress as f64,
        );
        family(
            &mut out,
            "tessera_provider_machines",
            "Machines pools' capacity providers were asked for, by pool and state (booting, active, terminating)",
        );
        let mut by: BTreeMap<(&str, &'static str), u64> = BTreeMap::new();
        for m in &self.machines {
            *by.entry((m.pool.as_str(), m.state.as_str())).or_default() += 1;
        }
        for ((pool, state), n) in by {
            sample(
                &mut out,
                "tessera_provider_machines",
                &[("pool", pool), ("state", state)],
                n as f64,
            );
        }
        family(
            &mut out,
            "tessera_scheduler_lease_since_seconds",
            "Since when (unix seconds) the server holding the scheduler lease holds it; 0 when none does",
        );
        sample(
            &mut out,
            "tessera_scheduler_lease_since_seconds",
            &[],
            self.lease_since.unwrap_or(0.0),
        );
        out
    }

    /// The next chunk of per-host family `f`, from the host after `self.after`, and
    /// whether the family is done.
    fn hosts_chunk(&mut self, f: &Family) -> (String, bool) {
        let mut out = String::with_capacity(CHUNK_BYTES + 8 * 1024);
        if self.after.is_none() {
            family(&mut out, f.name, f.help);
        }
        let mut last = None;
        let mut done = true;
        for b in self.fleet.hosts_after(self.after.as_ref()) {
            write_host(&mut out, f, b);
            last = Some(b.host.id.clone());
            if out.len() >= CHUNK_BYTES {
                done = false;
                break;
            }
        }
        self.after = if done { None } else { last };
        (out, done)
    }
}

impl Iterator for Exposition {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        loop {
            match self.part {
                0 => {
                    self.part = 1;
                    return Some(self.head());
                }
                p @ 1..=6 => {
                    let (chunk, done) = self.hosts_chunk(&PER_HOST[p - 1]);
                    if done {
                        self.part += 1;
                    }
                    if !chunk.is_empty() {
                        return Some(chunk);
                    }
                }
                7 => {
                    self.part = 8;
                    return Some(self.tail());
                }
                _ => return None,
            }
        }
    }
}

/// Family `f`'s samples of host `b`.
fn write_host(out: &mut String, f: &Family, b: &HostBlock) {
    let host = b.host.id.as_str();
    match f.of {
        Of::GpuTotal | Of::GpuReserved | Of::GpuUsed | Of::GpuCompute => {
            for (g, figures) in b.host.gpus.iter().zip(&b.gpus) {
                let index = g.index.to_string();
                let labels = [
                    ("host", host),
                    ("gpu", g.uuid.as_str()),
                    ("index", index.as_str()),
                    ("model", g.model.as_str()),
                ];
                let usage = figures.usage;
                let value = match f.of {
                    Of::GpuTotal => g.memory.0 as f64,
                    Of::GpuReserved => {
                        usage.map_or(0, |u| u.memory_capacity.0 - u.memory_free.0) as f64
                    }
                    Of::GpuUsed => figures.measured.map_or(0.0, |m| m.0 as f64),
                    _ => {
                        usage.map_or(0.0, |u| f64::from(u.compute_capacity.0 - u.compute_free.0))
                            / 1000.0
                    }
                };
                sample(out, f.name, &labels, value);
            }
        }
        Of::TaskPeak | Of::TaskSm => {
            for t in b
                .tasks
                .iter()
                .filter(|t| matches!(t.state, TaskState::Assigned | TaskState::Running))
            {
                let value = match f.of {
                    Of::TaskPeak => t.measured.gpu_memory_peak.map(|m| m.0 as f64),
                    _ => t.measured.sm_percent.map(f64::from),
                };
                if let Some(v) = value {
                    let labels = [
                        ("task", t.id.as_str()),
                        ("service", t.service.as_str()),
                        ("host", host),
                    ];
                    sample(out, f.name, &labels, v);
                }
            }
        }
    }
}

/// A family's `# HELP` and `# TYPE` lines (every fleet family is a gauge).
fn family(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
}

/// One sample line, its label values escaped as the text format asks.
fn sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str("=\"");
            if v.contains(['\\', '"', '\n']) {
                for c in v.chars() {
                    match c {
                        '\\' => out.push_str("\\\\"),
                        '"' => out.push_str("\\\""),
                        '\n' => out.push_str("\\n"),
                        c => out.push(c),
                    }
                }
            } else {
                out.push_str(v);
            }
            out.push('"');
        }
        out.push('}');
    }
    // Most figures are whole numbers (MiB, counts): written as integers, which is faster
    // than a float's shortest form and reads the same.
    if value.fract() == 0.0 && value.abs() < 1e15 {
        let _ = writeln!(out, " {}", value as i64);
    } else {
        let _ = writeln!(out, " {value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_as_the_text_format_asks() {
        let mut out = String::new();
        sample(
            &mut out,
            "tessera_x",
            &[("model", "a \"b\" \\ c\nd"), ("gpu", "GPU-1")],
            1.5,
        );
        assert_eq!(
            out,
            "tessera_x{model=\"a \\\"b\\\" \\\\ c\\nd\",gpu=\"GPU-1\"} 1.5\n"
        );
        let mut out = String::new();
        sample(&mut out, "tessera_y", &[], 3.0);
        assert_eq!(out, "tessera_y 3\n");
    }
}
