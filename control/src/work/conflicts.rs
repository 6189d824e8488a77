//! Interference estimates acted on: each service's estimates (reused for a while) and the
//! neighbours, and so the GPUs, a service's tasks should keep off.

use crate::control::Control;
use crate::error::ControlError;
use crate::interference::{ANY, alone_p99, estimate, predicted_p99};
use crate::parts::Estimates;
use crate::store::TaskFilter;
use std::collections::BTreeSet;
use std::sync::Arc;
use tessera_model::GpuUuid;
use tessera_model::service::{Service, TaskState};
use tessera_model::work::{Interference, trim_float};

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

impl Control {
    /// A service's interference estimates and p99 alone, read at most every 30 s.
    pub(crate) async fn estimates_of(&self, service: &str) -> Result<Estimates, ControlError> {
        if let Some((at, e)) = self.passes.watches.lock().estimates.get(service)
            && self.core.unix_now() - at < ESTIMATES_TTL
        {
            return Ok(e.clone());
        }
        let obs = self
            .observations(service, self.core.config().usage.fine_keep.as_secs() as i64)
            .await?;
        let e: Estimates = Arc::new((estimate(service, &obs), alone_p99(service, &obs)));
        self.passes
            .watches
            .lock()
            .estimates
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
