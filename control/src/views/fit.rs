//! Fit verdicts: each task's and each service's measured use (the usage history) judged
//! against its GPU budget by [`tessera_model::fit::judge`], and what a pool would hold with
//! the suggested budgets, computed by the placement engine on the pool's hosts.

use super::Views;
use crate::capacity::{Held, PoolCapacity};
use crate::error::ControlError;
use crate::inputs::Errors;
use crate::scheduler::request_for;
use crate::store::{TaskFilter, UsageQuery, UsageSummary};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tessera_model::fit::{
    Evidence, FieldChange, PoolFit, RightSize, ServiceFit, ServiceFitSummary, TaskFit, UsagePoint,
    Verdict, VerdictCount, judge,
};
use tessera_model::range::Range;
use tessera_model::service::{Service, Task, TaskState};
use tessera_model::taskdef::{TaskDefinitionSpec, TaskGpu};
use tessera_model::{MiB, SharingMode};
use tessera_placement::{DemandProfile, Engine, GpuDemand, Policy, TaskRequest};

/// `s` as a range a service's history is drawn over, or an error naming the `range` field.
pub(crate) fn usage_range(s: &str) -> Result<Range, ControlError> {
    Range::parse(s, &Range::USAGE).map_err(|m| ControlError::invalid("range", m))
}

/// The GPU memory a task of `spec` reserves per copy, and its compute cap in percent.
pub(super) fn budget_of(
    spec: &TaskDefinitionSpec,
    gpu_memory: Option<MiB>,
) -> (MiB, Option<u32>, bool) {
    match spec.gpu() {
        TaskGpu::Shared { memory, compute } => (memory, compute.map(|c| c.0.div_ceil(10)), true),
        TaskGpu::Whole { .. } => (gpu_memory.unwrap_or(MiB::ZERO), None, false),
        TaskGpu::None => (MiB::ZERO, None, false),
    }
}

/// Verdicts counted, worst first, leaving out those with no task.
fn count_verdicts(verdicts: impl IntoIterator<Item = Verdict>) -> Vec<VerdictCount> {
    let mut counts: BTreeMap<Verdict, u32> = BTreeMap::new();
    for v in verdicts {
        *counts.entry(v).or_default() += 1;
    }
    Verdict::ALL
        .iter()
        .filter_map(|v| {
            counts.get(v).map(|&n| VerdictCount {
                verdict: *v,
                tasks: n,
            })
        })
        .collect()
}

/// What was measured of one task, over every bucket kept.
#[derive(Debug, Clone)]
struct TaskEvidence {
    task_definition: tessera_model::service::TaskDefRef,
    service: String,
    evidence: Evidence,
}

/// Fine and coarse summaries of the same tasks, combined: the highest peak and SM p95, the
/// earliest bucket, and the larger count of refused allocations (coarse buckets hold the
/// fine ones' samples, bar the hour not yet written).
fn combine(
    now: i64,
    fine: Vec<UsageSummary>,
    coarse: Vec<UsageSummary>,
) -> HashMap<String, TaskEvidence> {
    let mut out: HashMap<String, TaskEvidence> = HashMap::new();
    for s in fine.into_iter().chain(coarse) {
        let span = (now - s.first).max(0) as u64;
        let e = out
            .entry(s.task_id.clone())
            .or_insert_with(|| TaskEvidence {
                task_definition: s.task_definition.clone(),
                service: s.service.clone(),
                evidence: Evidence::default(),
            });
        let ev = &mut e.evidence;
        ev.peak = Some(ev.peak.map_or(s.peak, |p| p.max(s.peak)));
        ev.sm_p95 = ev.sm_p95.max(s.sm_p95);
        ev.span_secs = ev.span_secs.max(span);
        ev.memory_errors = ev.memory_errors.max(s.memory_errors);
    }
    out
}

impl Views {
    /// What was measured of each task of `service` (or every service), fine and coarse
    /// buckets within their retention, summed up by the database.
    async fn evidence(
        &self,
        service: Option<&str>,
    ) -> Result<HashMap<String, TaskEvidence>, ControlError> {
        let now = self.core.unix_now();
        let c = &self.core.config().usage;
        let [fine_w, coarse_w] = c.widths();
        let q = |width: i64, keep: std::time::Duration| UsageQuery {
            service: service.map(str::to_owned),
            task: None,
            width_secs: width,
            since: now - keep.as_secs() as i64,
        };
        let fine = self.store.usage_summary(&q(fine_w, c.fine_keep)).await?;
        let coarse = self
            .store
            .usage_summary(&q(coarse_w, c.coarse_keep))
            .await?;
        Ok(combine(now, fine, coarse))
    }

    /// `GET /api/v1/services/{name}/fit`: the verdict over the service's evidence, each
    /// live task's, and its history over `range`.
    pub async fn service_fit(&self, name: &str, range: &str) -> Result<ServiceFit, ControlError> {
        let range = usage_range(range)?;
        let service = self.store.get_service(name).await?;
        let evidence = self.evidence(Some(name)).await?;
        let tasks = self.holding_tasks_of(name).await?;
        let spec = self.scheduler.spec_of(&service.task_definition).await?;
        let mut fit = self.judge_service(&service, &spec, &tasks, &evidence);
        let (bucket_secs, history) = self.history(name, range).await?;
        fit.range = range.as_str().to_owned();
        fit.bucket_secs = bucket_secs;
        fit.history = history;
        Ok(fit)
    }

    async fn holding_tasks_of(&self, service: &str) -> Result<Vec<Task>, ControlError> {
        Ok(self
            .store
            .list_tasks(&TaskFilter {
                service: Some(service.to_owned()),
                states: TaskState::HOLDING.to_vec(),
                ..Default::default()
            })
            .await?)
    }

    /// A service's fit from what was measured of its tasks and its holding `tasks` (no
    /// history).
    fn judge_service(
        &self,
        service: &Service,
        spec: &TaskDefinitionSpec,
        tasks: &[Task],
        evidence: &HashMap<String, TaskEvidence>,
    ) -> ServiceFit {
        let rules = &self.core.config().usage.rules;
        let whole_memory = tasks
            .iter()
            .map(|t| t.allocations.iter().map(|a| a.memory).sum::<MiB>())
            .max();
        let (budget, cap, shared) = budget_of(spec, whole_memory);
        let task_fits: Vec<TaskFit> = tasks
            .iter()
            .map(|t| {
                let mut ev = evidence.get(&t.id).map(|e| e.evidence).unwrap_or_default();
                // The stored running peak covers syncs whose bucket is not written yet.
                if let Some(p) = t.measured.gpu_memory_peak {
                    ev.peak = Some(ev.peak.map_or(p, |e| e.max(p)));
                }
                let task_budget = t.allocations.iter().map(|a| a.memory).sum::<MiB>();
                let task_budget = if shared { budget } else { task_budget };
                TaskFit {
                    task_id: t.id.clone(),
                    host: t.host.as_ref().map(|h| h.to_string()),
                    budget_mib: task_budget,
                    compute_cap_percent: cap,
                    peak_mib: ev.peak,
                    sm_p95: ev.sm_p95,
                    evidence_secs: ev.span_secs,
                    memory_errors: ev.memory_errors,
                    judgement: judge(task_budget, &ev, rules),
                }
            })
            .collect();
        // The service's verdict: every task's evidence of the revision it runs now.
        let mut ev = Evidence::default();
        for e in evidence
            .values()
            .filter(|e| e.service == service.name && e.task_definition == service.task_definition)
        {
            let x = e.evidence;
            if let Some(p) = x.peak {
                ev.peak = Some(ev.peak.map_or(p, |q| q.max(p)));
            }
            ev.sm_p95 = ev.sm_p95.max(x.sm_p95);
            ev.span_secs = ev.span_secs.max(x.span_secs);
            ev.memory_errors += x.memory_errors;
        }
        for t in tasks
            .iter()
            .filter(|t| t.task_definition == service.task_definition)
        {
            if let Some(p) = t.measured.gpu_memory_peak {
                ev.peak = Some(ev.peak.map_or(p, |e| e.max(p)));
            }
        }
        let judgement = judge(budget, &ev, rules);
        let used = task_fits.iter().filter_map(|t| t.peak_mib).sum();
        ServiceFit {
            service: service.name.clone(),
            pool: service.pool.to_string(),
            task_definition: service.task_definition.to_string(),
            budget_mib: budget,
            compute_cap_percent: cap,
            shared,
            judgement,
            by_verdict: count_verdicts(task_fits.iter().map(|t| t.judgement.verdict)),
            reserved_mib: task_fits.iter().map(|t| t.budget_mib).sum(),
            used_mib: used,
            tasks: task_fits,
            range: String::new(),
            bucket_secs: 0,
            history: Vec::new(),
            min_evidence_secs: rules.min_evidence_secs,
            time_note: self.core.config().usage.time_note.clone(),
        }
    }

    /// The bucket width read for `range`, and the width of the points a chart shows.
    pub(crate) fn grouping(&self, range: Range) -> (i64, i64) {
        let [fine, coarse] = self.core.config().usage.widths();
        match range {
            Range::Hour => (fine, fine),
            // At most ~300 points a chart.
            Range::Day => (fine, fine.max(((86_400 / 288) / fine).max(1) * fine)),
            Range::Week | Range::Month => (
                coarse,
                coarse.max(((range.secs() / 720) / coarse).max(1) * coarse),
            ),
        }
    }

    /// The service's history over `range`: per bucket, across its tasks.
    async fn history(
        &self,
        name: &str,
        range: Range,
    ) -> Result<(u64, Vec<UsagePoint>), ControlError> {
        let now = self.core.unix_now();
        let (width, group) = self.grouping(range);
        let groups = self
            .store
            .usage_history(
                &UsageQuery {
                    service: Some(name.to_owned()),
                    task: None,
                    width_secs: width,
                    since: now - range.secs(),
                },
                group,
            )
            .await?;
        let points = groups
            .into_iter()
            .map(|g| UsagePoint {
                t: g.start,
                memory_mean_mib: g.memory_mean.0,
                memory_max_mib: g.memory_max.0,
                sm_mean: g.sm_mean,
                sm_p95: g.sm_p95,
                tasks: g.tasks,
            })
            .collect();
        Ok((group as u64, points))
    }

    /// `GET /api/v1/fit?pool=NAME`: each service's verdict, and what the pool would hold
    /// with the suggested budgets: its tasks placed afresh on its hosts by the placement
    /// engine (best fit, largest first), and then as many more tasks of each service as fit.
    pub async fn pool_fit(&self, pool: &str) -> Result<PoolFit, ControlError> {
        let mut e = Errors::default();
        let pool_name = e.pool(pool);
        e.finish()?;
        let pool_name = pool_name.expect("validated");
        // Not found (404) rather than invalid: the pool is what is asked for.
        let (info, hosts, holding) = self.scheduler.pool_state(&pool_name).await?;
        let services: Vec<Service> = self
            .store
            .list_services()
            .await?
            .into_iter()
            .filter(|s| s.pool == pool_name)
            .collect();
        let evidence = self.evidence(None).await?;
        let now_capacity = PoolCapacity::build(&info, &hosts, holding.iter().filter_map(Held::of));
        let gpus_total = hosts.iter().map(|h| h.gpus.len() as u32).sum();
        let gpus_in_use = hosts
            .iter()
            .flat_map(|h| &h.gpus)
            .filter(|g| {
                now_capacity
                    .gpu_usage(&g.uuid)
                    .is_some_and(|u| u.mode != SharingMode::Idle)
            })
            .count() as u32;

        let mut fits = Vec::new();
        let mut requests: Vec<(String, TaskRequest)> = Vec::new();
        let mut suggested: HashMap<String, TaskRequest> = HashMap::new();
        for s in &services {
            let tasks: Vec<Task> = holding
                .iter()
                .filter(|t| t.service == s.name)
                .cloned()
                .collect();
            let spec = self.scheduler.spec_of(&s.task_definition).await?;
            let fit = self.judge_service(s, &spec, &tasks, &evidence);
            let mut req = request_for(&spec, &s.constraints, BTreeSet::new());
            if let (GpuDemand::Shared { memory, compute }, Some(m)) =
                (&mut req.gpu, fit.judgement.suggested_memory_mib)
            {
                *memory = m;
                if compute.is_some()
                    && let Some(c) = fit.judgement.suggested_compute_percent
                {
                    *compute = Some(tessera_model::ComputeMilli(c * 10));
                }
            }
            for t in &tasks {
                let own = self.scheduler.spec_of(&t.task_definition).await?;
                let mut r = request_for(&own, &s.constraints, BTreeSet::new());
                if t.task_definition == s.task_definition {
                    r = req.clone();
                }
                requests.push((s.name.clone(), r));
            }
            suggested.insert(s.name.clone(), req);
            fits.push(fit);
        }
        let engine = repack(&info, &hosts, &mut requests);
        let snap = engine.snapshot();
        let gpus_in_use_suggested = (0..snap.gpu_count() as u32)
            .filter(|&g| snap.gpu_usage(g).mode != SharingMode::Idle)
            .count() as u32;
        let summaries = fits
            .iter()
            .map(|f| ServiceFitSummary {
                service: f.service.clone(),
                verdict: f.judgement.verdict,
                tasks: f.tasks.len() as u32,
                budget_mib: f.budget_mib,
                suggested_memory_mib: f.judgement.suggested_memory_mib.filter(|_| f.shared),
                extra_tasks: suggested
                    .get(&f.service)
                    .map_or(0, |r| room_left_for(&engine, r, 1000)),
            })
            .collect();
        Ok(PoolFit {
            pool: pool.to_owned(),
            services: summaries,
            by_verdict: count_verdicts(
                fits.iter()
                    .flat_map(|f| f.tasks.iter().map(|t| t.judgement.verdict)),
            ),
            reserved_mib: fits.iter().map(|f| f.reserved_mib).sum(),
            used_mib: fits.iter().map(|f| f.used_mib).sum(),
            gpus_in_use,
            gpus_in_use_suggested,
            gpus_freed: gpus_in_use.saturating_sub(gpus_in_use_suggested),
            gpus_total,
        })
    }

    /// Each holding task's verdict, as read at most [`super::VERDICTS_FRESH`] ago (pages that mark
    /// segments read it on every render); empty when it cannot be read.
    pub(crate) async fn cached_verdicts(&self) -> std::sync::Arc<HashMap<String, Verdict>> {
        if let Some(v) = self.verdicts.get(&()) {
            return v;
        }
        let fresh = match self.task_verdicts().await {
            Ok(v) => std::sync::Arc::new(v),
            Err(e) => {
                tracing::warn!(error = %e, "reading fit verdicts failed; segments go unmarked");
                std::sync::Arc::default()
            }
        };
        self.verdicts.insert((), fresh.clone());
        fresh
    }

    /// Each holding task's verdict, by task id (what the hosts page marks).
    pub async fn task_verdicts(&self) -> Result<HashMap<String, Verdict>, ControlError> {
        let evidence = self.evidence(None).await?;
        let mut out = HashMap::new();
        for s in self.store.list_services().await? {
            let tasks = self.holding_tasks_of(&s.name).await?;
            if tasks.is_empty() {
                continue;
            }
            let spec = self.scheduler.spec_of(&s.task_definition).await?;
            for t in self.judge_service(&s, &spec, &tasks, &evidence).tasks {
                out.insert(t.task_id, t.judgement.verdict);
            }
        }
        Ok(out)
    }
}

/// `spec` with its MPS budget set to `memory` in total (split over its MPS containers in
/// proportion, each rounded up to 256 MiB) and, where containers have a compute cap, the
/// cap set to `compute` percent; with the changes listed.
fn resized(
    spec: &TaskDefinitionSpec,
    memory: MiB,
    compute: Option<u32>,
) -> (TaskDefinitionSpec, Vec<FieldChange>) {
    use tessera_model::taskdef::GpuRequirement;
    let total: u64 = spec
        .containers
        .iter()
        .filter_map(|c| match c.gpu {
            Some(GpuRequirement::Mps { memory_mib, .. }) => Some(memory_mib.0),
            _ => None,
        })
        .sum();
    let mut out = spec.clone();
    let mut changes = Vec::new();
    for (i, c) in out.containers.iter_mut().enumerate() {
        if let Some(GpuRequirement::Mps {
            memory_mib,
            max_compute_percent,
        }) = &mut c.gpu
        {
            let share = memory_mib.0 as f64 / total.max(1) as f64;
            let new = MiB(((memory.0 as f64 * share).ceil() as u64)
                .div_ceil(256)
                .max(1)
                * 256);
            if new != *memory_mib {
                changes.push(FieldChange {
                    field: format!("containers[{i}].gpu.mps.memory_mib"),
                    from: memory_mib.0.to_string(),
                    to: new.0.to_string(),
                });
                *memory_mib = new;
            }
            if let (Some(cap), Some(to)) = (max_compute_percent.as_mut(), compute)
                && cap.get() != to
                && let Ok(new) = tessera_model::Percent::new(to)
            {
                changes.push(FieldChange {
                    field: format!("containers[{i}].gpu.mps.max_compute_percent"),
                    from: cap.get().to_string(),
                    to: to.to_string(),
                });
                *cap = new;
            }
        }
    }
    (out, changes)
}

impl Views {
    /// What right-sizing service `name` would register: `Conflict` when its tasks do not
    /// share GPUs, when there is no evidence yet, or when the budget already matches.
    pub async fn right_size_proposal(&self, name: &str) -> Result<RightSize, ControlError> {
        let fit = self.service_fit(name, "hour").await?;
        let service = self.store.get_service(name).await?;
        if !fit.shared {
            return Err(ControlError::Conflict(format!(
                "service {name} does not use an MPS slot; only MPS budgets are right-sized"
            )));
        }
        let Some(memory) = fit.judgement.suggested_memory_mib else {
            return Err(ControlError::Conflict(format!(
                "service {name} has no usage evidence yet; nothing to suggest"
            )));
        };
        let spec = self.scheduler.spec_of(&service.task_definition).await?;
        let (new, changes) = resized(&spec, memory, fit.judgement.suggested_compute_percent);
        if changes.is_empty() {
            return Err(ControlError::Conflict(format!(
                "service {name} already runs the suggested budget"
            )));
        }
        Ok(RightSize {
            service: name.to_owned(),
            current: service.task_definition.to_string(),
            verdict: fit.judgement.verdict,
            reason: fit.judgement.reason,
            changes,
            definition: serde_json::to_value(&new).map_err(|e| {
                ControlError::Store(crate::StoreError::Corrupt {
                    what: "task definition",
                    message: e.to_string(),
                })
            })?,
        })
    }
}

/// `requests` repacked on `hosts` emptied, largest GPU demand first (best fit
/// decreasing); what fits nowhere is left out.
fn repack(
    info: &tessera_model::PoolInfo,
    hosts: &[tessera_model::HostInfo],
    requests: &mut [(String, TaskRequest)],
) -> Engine {
    let size = |r: &TaskRequest| match r.gpu {
        GpuDemand::Whole { count } => u64::from(count) * 1_000_000_000,
        GpuDemand::Shared { memory, .. } => memory.0,
        GpuDemand::None => 0,
    };
    requests.sort_by_key(|(_, r)| std::cmp::Reverse(size(r)));
    let empty = PoolCapacity::build(info, hosts, std::iter::empty());
    let profile = DemandProfile::from_requests(requests.iter().map(|(_, r)| r));
    let mut engine = Engine::new(empty.snapshot, Policy::Binpack, &profile, 0x7e55e7a);
    for (_, r) in requests.iter() {
        if let Ok(p) = engine.place(r) {
            engine.assign(&p).expect("a fresh placement fits");
        }
    }
    engine
}

/// How many more tasks of `r` fit on `engine`'s picture, counting up to `most`.
fn room_left_for(engine: &Engine, r: &TaskRequest, most: u32) -> u32 {
    let mut e = engine.clone();
    let mut n = 0;
    while n < most {
        let Some(p) = e.try_place(r) else { break };
        e.assign(&p).expect("a fresh placement fits");
        n += 1;
    }
    n
}
