//! A sync report judged item by item against [`crate::bounds`]: what breaks a bound is
//! dropped or cut, and said with its owner. Used by the agent before it sends and by the
//! server on what arrives.

use super::{GpuReport, SyncRequest, TaskReport};
use crate::bounds::*;
use crate::limits::report::*;
use crate::units::MiB;
use crate::work::WorkReport;
use std::collections::BTreeSet;

/// Collects what the bounds dropped, with the owner of each item.
struct Judge {
    dropped: Vec<Dropped>,
}

impl Judge {
    fn drop(&mut self, owner: Owner, field: String, reason: impl Into<String>) {
        self.dropped.push(Dropped {
            owner,
            field,
            reason: reason.into(),
        });
    }

    /// Cuts an optional text to `max`, saying so on `owner`.
    fn cut(&mut self, owner: &Owner, field: String, text: &mut Option<String>, max: usize) {
        if let Some(t) = text.as_mut()
            && let Some(cut) = cut_text(t, max)
        {
            self.drop(
                owner.clone(),
                field,
                format!("cut to {max} characters without control characters"),
            );
            *t = cut;
        }
    }
}

/// Why a GPU entry cannot be taken, if it cannot.
pub(crate) fn gpu_fault(g: &GpuReport) -> Option<String> {
    if g.memory_mib.0 == 0 || g.memory_mib.0 > MAX_GPU_MEMORY_MIB {
        return Some(format!(
            "memory_mib must be between 1 and {MAX_GPU_MEMORY_MIB}, got {}",
            g.memory_mib.0
        ));
    }
    if g.index > MAX_GPU_INDEX {
        return Some(format!(
            "index must be at most {MAX_GPU_INDEX}, got {}",
            g.index
        ));
    }
    if !(1..=crate::limits::MPS_CLIENT_LIMIT_MAX).contains(&g.mps_client_limit) {
        return Some(format!(
            "mps_client_limit must be between 1 and {}, got {}",
            crate::limits::MPS_CLIENT_LIMIT_MAX,
            g.mps_client_limit
        ));
    }
    // As the registration's schema says (a model is shown escaped everywhere).
    if g.model.is_empty() || g.model.chars().count() > MAX_NAME_CHARS || g.model.contains('\0') {
        return Some(format!(
            "model must be 1 to {MAX_NAME_CHARS} characters without NUL"
        ));
    }
    None
}

/// Keeps the GPU entries that can be taken (the first of each index and UUID, at most
/// [`MAX_GPUS`]); the others are dropped, each on its GPU.
fn judge_gpus(gpus: &mut Vec<GpuReport>, j: &mut Judge) {
    let mut indices = BTreeSet::new();
    let mut uuids = BTreeSet::new();
    let mut kept = Vec::with_capacity(gpus.len().min(MAX_GPUS));
    for (i, g) in std::mem::take(gpus).into_iter().enumerate() {
        let field = format!("gpus[{i}]");
        let owner = Owner::Gpu(g.uuid.clone());
        if kept.len() == MAX_GPUS {
            j.drop(
                owner,
                field,
                format!("dropped: at most {MAX_GPUS} GPUs per host"),
            );
        } else if let Some(fault) = gpu_fault(&g) {
            j.drop(owner, field, format!("dropped: {fault}"));
        } else if !indices.insert(g.index) {
            j.drop(
                owner,
                field,
                format!("dropped: index {} is reported twice", g.index),
            );
        } else if !uuids.insert(g.uuid.clone()) {
            j.drop(owner, field, "dropped: the UUID is reported twice");
        } else {
            kept.push(g);
        }
    }
    *gpus = kept;
}

/// Brings one task report within the bounds, field by field.
fn judge_task(i: usize, t: &mut TaskReport, j: &mut Judge) {
    let owner = Owner::Task(t.task_id.clone());
    let at = |f: &str| format!("tasks[{i}].{f}");
    if t.sm_percent.is_some_and(|p| p > 100) {
        j.drop(
            owner.clone(),
            at("sm_percent"),
            format!(
                "dropped: {} is not a share (0 to 100)",
                t.sm_percent.unwrap_or_default()
            ),
        );
        t.sm_percent = None;
    }
    for (name, value) in [
        ("gpu_memory_peak_mib", &mut t.gpu_memory_peak_mib),
        ("gpu_memory_mib", &mut t.gpu_memory_mib),
    ] {
        if value.is_some_and(|m: MiB| m.0 > MAX_GPU_MEMORY_MIB) {
            j.drop(owner.clone(), at(name), "dropped: larger than any GPU");
            *value = None;
        }
    }
    if t.memory_errors.is_some_and(|n| n > MAX_MEMORY_ERRORS) {
        j.drop(
            owner.clone(),
            at("memory_errors"),
            format!("cut to {MAX_MEMORY_ERRORS}"),
        );
        t.memory_errors = Some(MAX_MEMORY_ERRORS);
    }
    if t.ports.len() > MAX_PORTS {
        j.drop(
            owner.clone(),
            at("ports"),
            format!("cut to the first {MAX_PORTS} ports"),
        );
        t.ports.truncate(MAX_PORTS);
    }
    let mut k = 0;
    t.ports.retain(|p| {
        let field = at(&format!("ports[{k}]"));
        k += 1;
        let fault = if p.container_port == 0 || p.host_port == Some(0) {
            Some("ports are between 1 and 65535")
        } else if !text_ok(&p.container, MAX_NAME_CHARS)
            || p.name
                .as_deref()
                .is_some_and(|n| !text_ok(n, MAX_NAME_CHARS))
        {
            Some("names must be at most 256 characters without control characters")
        } else {
            None
        };
        if let Some(fault) = fault {
            j.drop(owner.clone(), field, format!("dropped: {fault}"));
        }
        fault.is_none()
    });
    if let Some(h) = &mut t.health {
        j.cut(
            &owner,
            at("health.output"),
            &mut h.output,
            MAX_HEALTH_OUTPUT_CHARS,
        );
    }
    if let Some(w) = &mut t.work
        && let Some(why) = judge_work(w)
    {
        j.drop(owner.clone(), at("work"), why);
    }
    j.cut(&owner, at("pulling"), &mut t.pulling, MAX_PULLING_CHARS);
    j.cut(&owner, at("error"), &mut t.error, MAX_ERROR_CHARS);
    j.cut(
        &owner,
        at("out_of_memory"),
        &mut t.out_of_memory,
        MAX_ERROR_CHARS,
    );
    j.cut(
        &owner,
        at("last_output"),
        &mut t.last_output,
        MAX_LAST_OUTPUT_CHARS,
    );
}

/// A work report the bounds refuse becomes `unknown` with the reason (never zero work, and
/// never a refused sync); a reason too long is cut. Returns what was done, if anything.
fn judge_work(w: &mut WorkReport) -> Option<String> {
    match w.check() {
        Ok(()) => None,
        Err(e) => {
            let why = match w {
                WorkReport::Unknown { reason } => {
                    *reason = cut_text(reason, MAX_WORK_REASON_CHARS).unwrap_or_default();
                    return Some(format!(
                        "reason cut to {MAX_WORK_REASON_CHARS} characters without control characters"
                    ));
                }
                WorkReport::Measured(_) => format!("the measurement was dropped: {e}"),
            };
            *w = WorkReport::Unknown {
                reason: cut_text(&why, MAX_WORK_REASON_CHARS).unwrap_or_else(|| why.clone()),
            };
            Some(why)
        }
    }
}

impl SyncRequest {
    /// Brings the report within the protocol's bounds, item by item, and says what was
    /// dropped or cut, each on its owner. Never refuses the report: what is left is always
    /// one the server takes.
    pub fn sanitize(&mut self) -> Vec<Dropped> {
        let mut j = Judge {
            dropped: Vec::new(),
        };
        judge_gpus(&mut self.gpus, &mut j);
        if self.tasks.len() > MAX_TASKS {
            j.drop(
                Owner::Host,
                "tasks".into(),
                format!(
                    "cut to the first {MAX_TASKS} of {} task reports",
                    self.tasks.len()
                ),
            );
            self.tasks.truncate(MAX_TASKS);
        }
        let mut ids = BTreeSet::new();
        let mut kept = Vec::with_capacity(self.tasks.len());
        for (i, mut t) in std::mem::take(&mut self.tasks).into_iter().enumerate() {
            if t.task_id.is_empty() || !text_ok(&t.task_id, MAX_NAME_CHARS) {
                j.drop(
                    Owner::Host,
                    format!("tasks[{i}].task_id"),
                    "dropped: a task id is 1 to 256 characters without control characters",
                );
                continue;
            }
            if !ids.insert(t.task_id.clone()) {
                j.drop(
                    Owner::Task(t.task_id.clone()),
                    format!("tasks[{i}]"),
                    "dropped: the task is reported twice (the first report counts)",
                );
                continue;
            }
            judge_task(i, &mut t, &mut j);
            kept.push(t);
        }
        self.tasks = kept;
        if self.address.as_deref().is_some_and(|a| !address_ok(a)) {
            j.drop(
                Owner::Host,
                "address".into(),
                "dropped: must be a host name or an IP address (the known one is kept)",
            );
            self.address = None;
        }
        if self.dynamic_ports_free.is_some_and(|n| n > 65535) {
            j.drop(
                Owner::Host,
                "dynamic_ports_free".into(),
                "dropped: must be at most 65535",
            );
            self.dynamic_ports_free = None;
        }
        if self.mps.restarts.is_some_and(|n| n > 1_000_000) {
            j.drop(
                Owner::Host,
                "mps.restarts".into(),
                "dropped: must be at most 1000000",
            );
            self.mps.restarts = None;
        }
        j.cut(
            &Owner::Host,
            "mps.reason".into(),
            &mut self.mps.reason,
            MAX_MPS_REASON_CHARS,
        );
        if let Some(c) = &mut self.capabilities {
            for (name, cap) in c.named_mut() {
                let mut detail = Some(std::mem::take(&mut cap.detail));
                j.cut(
                    &Owner::Host,
                    format!("capabilities.{name}.detail"),
                    &mut detail,
                    MAX_CAPABILITY_CHARS,
                );
                cap.detail = detail.unwrap_or_default();
            }
        }
        j.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{HealthReport, MpsReport};
    use crate::ids::GpuUuid;
    use crate::service::{TaskHealth, TaskPort};
    use crate::work::{LatencyBucket, WorkSample};

    fn gpu(index: u32, uuid: &str, memory: u64) -> GpuReport {
        GpuReport {
            uuid: GpuUuid::new(uuid).expect("valid"),
            index,
            model: "NVIDIA L4".into(),
            memory_mib: MiB(memory),
            mps_client_limit: 48,
            healthy: true,
        }
    }

    fn report(tasks: Vec<TaskReport>) -> SyncRequest {
        SyncRequest {
            gpus: vec![gpu(0, "GPU-a", 24_000)],
            mps: MpsReport {
                healthy: true,
                reason: None,
                restarts: None,
            },
            tasks,
            address: None,
            dynamic_ports_free: None,
            capabilities: None,
            agent_version: None,
        }
    }

    fn task(id: &str) -> TaskReport {
        TaskReport {
            task_id: id.into(),
            running: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_capability_said_at_length_is_cut_and_named() {
        use crate::agent::{Capability, HostCapabilities};
        let long = "x".repeat(MAX_CAPABILITY_CHARS + 10);
        let mut r = report(Vec::new());
        r.capabilities = Some(HostCapabilities {
            gpu_discovery: Capability::held("NVML"),
            mps: Capability::held("per GPU"),
            gpu_devices: Capability::missing(long),
            limits: Capability::held("v2"),
            task_users: Capability::held("uids"),
            containers: Capability::missing("none"),
        });
        let dropped = r.sanitize();
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert_eq!(dropped[0].field, "capabilities.gpu_devices.detail");
        let caps = r.capabilities.expect("kept");
        assert_eq!(
            caps.gpu_devices.detail.chars().count(),
            MAX_CAPABILITY_CHARS
        );
        assert!(!caps.gpu_devices.held);
        assert_eq!(caps.mps.detail, "per GPU");
    }

    #[test]
    fn an_honest_report_passes_unchanged() {
        let mut r = report(vec![TaskReport {
            sm_percent: Some(40),
            gpu_memory_mib: Some(MiB(2048)),
            health: Some(HealthReport {
                status: TaskHealth::Unhealthy,
                output: Some("GET /health: 503".into()),
            }),
            ..task("t1")
        }]);
        let before = r.clone();
        assert!(r.sanitize().is_empty());
        assert_eq!(r, before);
    }

    #[test]
    fn a_bad_item_is_dropped_on_its_owner_and_the_rest_is_kept() {
        let histogram: Vec<LatencyBucket> = (0..200)
            .map(|i| LatencyBucket {
                le: Some(f64::from(i) + 1.0),
                count: 1.0,
            })
            .collect();
        let mut r = report(vec![
            TaskReport {
                sm_percent: Some(400),
                health: Some(HealthReport {
                    status: TaskHealth::Unhealthy,
                    output: Some("x".repeat(5000)),
                }),
                work: Some(WorkReport::Measured(WorkSample {
                    interval_secs: 1.0,
                    completed: 3.0,
                    errors: None,
                    latency: histogram,
                })),
                error: Some("\0".repeat(3)),
                ports: vec![TaskPort {
                    container: "main".into(),
                    name: None,
                    container_port: 0,
                    host_port: None,
                    protocol: Default::default(),
                }],
                ..task("noisy")
            },
            task("quiet"),
            task(&"x".repeat(300)),
            task("quiet"),
        ]);
        r.gpus.push(gpu(1, "GPU-b", 0));
        r.gpus.push(gpu(0, "GPU-c", 1000));
        r.address = Some("not an address!".into());
        let dropped = r.sanitize();
        let on = |owner: &Owner| {
            dropped
                .iter()
                .filter(|d| &d.owner == owner)
                .map(|d| d.field.as_str())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            on(&Owner::Task("noisy".into())),
            [
                "tasks[0].sm_percent",
                "tasks[0].ports[0]",
                "tasks[0].health.output",
                "tasks[0].work",
                "tasks[0].error"
            ]
        );
        assert_eq!(on(&Owner::Task("quiet".into())), ["tasks[3]"]);
        assert_eq!(on(&Owner::Host), ["tasks[2].task_id", "address"]);
        assert_eq!(
            on(&Owner::Gpu(GpuUuid::new("GPU-b").expect("valid"))),
            ["gpus[1]"]
        );
        assert_eq!(
            on(&Owner::Gpu(GpuUuid::new("GPU-c").expect("valid"))),
            ["gpus[2]"]
        );
        assert_eq!(r.gpus.len(), 1, "the good GPU stays");
        let ids: Vec<&str> = r.tasks.iter().map(|t| t.task_id.as_str()).collect();
        assert_eq!(ids, ["noisy", "quiet"]);
        let noisy = &r.tasks[0];
        assert!(noisy.running, "the task itself is still reported running");
        assert_eq!(noisy.sm_percent, None);
        assert!(noisy.ports.is_empty());
        let output = noisy
            .health
            .as_ref()
            .and_then(|h| h.output.as_deref())
            .expect("output");
        assert_eq!(output.chars().count(), MAX_HEALTH_OUTPUT_CHARS);
        match &noisy.work {
            Some(WorkReport::Unknown { reason }) => {
                assert!(reason.contains("at most 64 latency buckets"), "{reason}")
            }
            other => panic!("work should be unknown with the reason, got {other:?}"),
        }
        assert_eq!(noisy.error.as_deref(), Some("\u{fffd}\u{fffd}\u{fffd}"));
        // Judged again, it is within every bound: nothing more to drop.
        assert!(r.sanitize().is_empty());
    }
}
