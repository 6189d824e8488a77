//! Interference estimates acted on: each service's estimates (reused for a while) and the
//! neighbours, and so the GPUs, a service's tasks should keep off.

use crate::error::ControlError;
use crate::interference::{ANY, Observation, alone_p99, estimate, predicted_p99};
use crate::parts::Core;
use crate::store::{InterferenceStore, TaskFilter, UsageQuery};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tessera_model::GpuUuid;
use tessera_model::service::{Service, TaskState};
use tessera_model::work::{Interference, trim_float};

/// A service's interference estimates and its p99 alone, cached (they come from a day of
/// usage buckets).
pub(crate) type Estimates = Arc<(Vec<Interference>, Option<f64>)>;

/// How long (seconds, by the control plane's clock) estimates are reused before they are
/// read again.
const ESTIMATES_TTL: i64 = 30;

/// Why a service's tasks should keep off the GPUs where `neighbour` runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Conflict {
    pub neighbour: String,
    pub why: String,
}

/// The neighbours a task of `service` should not share a GPU with: those whose established
/// estimate predicts its p99 past its target (`own`: its estimates and p99 alone), and those
/// it is predicted to push past theirs (`others`: each service with a target, its
/// estimates).
pub(crate) fn conflicts(
    service: &Service,
    own: &(Vec<Interference>, Option<f64>),
    others: &[(&Service, Estimates)],
) -> Vec<Conflict> {
    let mut out: Vec<Conflict> = Vec::new();
    let mut add = |neighbour: &str, why: String| {
        if !out.iter().any(|c| c.neighbour == neighbour) {
            out.push(Conflict {
                neighbour: neighbour.to_owned(),
                why,
            });
        }
    };
    if let (Some(slo), Some(alone)) = (&service.objectives.slo, own.1) {
        for e in own.0.iter().filter(|e| e.established && e.neighbour != ANY) {
            let p = predicted_p99(alone, &[e.neighbour.as_str()], &own.0);
            if p > slo.latency_p99_ms {
                add(
                    &e.neighbour,
                    format!(
                        "{}: {} predicted {} ms, past its {} ms target",
                        service.name,
                        e.summary,
                        p.round(),
                        trim_float(slo.latency_p99_ms)
                    ),
                );
            }
        }
    }
    for (other, est) in others {
        let (Some(slo), Some(alone)) = (&other.objectives.slo, est.1) else {
            continue;
        };
        if let Some(e) = est
            .0
            .iter()
            .find(|e| e.established && e.neighbour == service.name)
        {
            let p = predicted_p99(alone, &[service.name.as_str()], &est.0);
            if p > slo.latency_p99_ms {
                add(
                    &other.name,
                    format!(
                        "{}: {} predicted {} ms, past its {} ms target",
                        other.name,
                        e.summary,
                        p.round(),
                        trim_float(slo.latency_p99_ms)
                    ),
                );
            }
        }
    }
    out
}

/// Interference estimates: what sharing a GPU with each neighbour costs a service, from its
/// work history, reused for [`ESTIMATES_TTL`]; the scheduler and consolidation ask it which
/// GPUs a service should keep off.
#[derive(Clone)]
pub(crate) struct InterferenceModel {
    store: Arc<dyn InterferenceStore>,
    core: Core,
    /// Each service's estimates and when they were read (unix seconds).
    estimates: Arc<Mutex<HashMap<String, (i64, Estimates)>>>,
}

impl InterferenceModel {
    pub(crate) fn new(store: Arc<dyn InterferenceStore>, core: Core) -> Self {
        InterferenceModel {
            store,
            core,
            estimates: Arc::default(),
        }
    }

    /// The same model reading through `store` (a pass's fenced store), sharing its
    /// estimates.
    pub(crate) fn with_store(&self, store: Arc<dyn InterferenceStore>, core: Core) -> Self {
        InterferenceModel {
            store,
            core,
            estimates: self.estimates.clone(),
        }
    }

    /// The service's work history: task-buckets of the fine width over the last
    /// `since_secs`, as interference observations.
    pub(crate) async fn observations(
        &self,
        service: &str,
        since_secs: i64,
    ) -> Result<Vec<Observation>, ControlError> {
        let [fine, _] = self.core.config().usage.widths();
        let rows = self
            .store
            .list_usage(&UsageQuery {
                service: Some(service.to_owned()),
                task: None,
                width_secs: fine,
                since: self.core.unix_now() - since_secs,
            })
            .await?;
        Ok(rows
            .into_iter()
            .filter(|r| r.work_secs > 0.0)
            .filter_map(|r| {
                Some(Observation {
                    service: r.service,
                    neighbours: r.neighbours?,
                    completed_per_sec: r.completed / r.work_secs,
                    latency_p99_ms: r.latency_ms[2],
                })
            })
            .collect())
    }

    /// A service's interference estimates and p99 alone, read at most every 30 s.
    pub(crate) async fn estimates_of(&self, service: &str) -> Result<Estimates, ControlError> {
        if let Some((at, e)) = self.estimates.lock().get(service)
            && self.core.unix_now() - at < ESTIMATES_TTL
        {
            return Ok(e.clone());
        }
        let obs = self
            .observations(service, self.core.config().usage.fine_keep.as_secs() as i64)
            .await?;
        let e: Estimates = Arc::new((estimate(service, &obs), alone_p99(service, &obs)));
        self.estimates
            .lock()
            .insert(service.to_owned(), (self.core.unix_now(), e.clone()));
        Ok(e)
    }

    /// The GPUs a task of `service` should keep off (where its conflicting neighbours run),
    /// with the reasons; empty when no service of its pool has a latency target.
    pub(crate) async fn interference_avoid(
        &self,
        service: &Service,
        services: &[&Service],
    ) -> Result<(BTreeSet<GpuUuid>, Vec<Conflict>), ControlError> {
        let with_target: Vec<&Service> = services
            .iter()
            .copied()
            .filter(|s| {
                s.pool == service.pool && s.objectives.slo.is_some() && s.name != service.name
            })
            .collect();
        if with_target.is_empty() && service.objectives.slo.is_none() {
            return Ok(Default::default());
        }
        let own = if service.objectives.slo.is_some() {
            self.estimates_of(&service.name).await?
        } else {
            Arc::new((Vec::new(), None))
        };
        let mut others = Vec::with_capacity(with_target.len());
        for s in with_target {
            others.push((s, self.estimates_of(&s.name).await?));
        }
        let found = conflicts(service, &own, &others);
        let mut gpus = BTreeSet::new();
        for c in &found {
            let tasks = self
                .store
                .list_tasks(&TaskFilter {
                    service: Some(c.neighbour.clone()),
                    states: TaskState::HOLDING.to_vec(),
                    ..Default::default()
                })
                .await?;
            gpus.extend(
                tasks
                    .iter()
                    .flat_map(|t| t.allocations.iter().map(|a| a.gpu.clone())),
            );
        }
        Ok((gpus, found))
    }
}
