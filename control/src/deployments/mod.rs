//! Deployments: what operators ask of pools, task definitions and services, and the
//! reconcile passes that carry it out: services' rolling deployments, crash-loop backoff,
//! draining, alarms and autoscaling on their work, lost and impaired hosts' tasks moved,
//! consolidation plans carried out, old rows pruned.
//!
//! - `workloads`: pools, task definitions and services as operators change them.
//! - `hosts`: operators' host operations (drain, activate).
//! - `reconcile`: one reconcile pass: lost hosts, migrations, services and deployments.
//! - `work`: a service's work figures, deployment alarms and autoscaling, interference
//!   estimates.
//! - `consolidate`: consolidation plans (moves that free GPUs or hosts) and their execution.
//! - `passes`: what the passes remember from one to the next.

pub(crate) mod consolidate;
mod hosts;
mod passes;
pub(crate) mod reconcile;
pub(crate) mod work;
pub(crate) mod workloads;

use crate::agents::AgentSync;
use crate::parts::{Core, ServiceStates};
use crate::providers::Providers;
use crate::scheduler::Scheduler;
use crate::store::DeploymentStore;
use crate::views::Views;
use crate::work::InterferenceModel;
use passes::Passes;
use std::sync::Arc;

/// Deployments: operators' changes to pools, task definitions and services, and the
/// reconcile passes. Owns what the passes remember (see [`Passes`]); asks the scheduler to
/// place, agent sync to write what syncs left, the read models for figures and fit, and
/// interference estimates for consolidation.
#[derive(Clone)]
pub struct Deployments {
    store: Arc<dyn DeploymentStore>,
    core: Core,
    passes: Arc<Passes>,
    /// Where the passes say a service's failures, backoff and progress.
    service_states: Arc<ServiceStates>,
    scheduler: Scheduler,
    agents: AgentSync,
    views: Views,
    interference: InterferenceModel,
    /// Pools' capacity providers, run after each pass's scheduling.
    providers: Providers,
}

/// The components deployments ask.
pub(crate) struct Asks {
    pub scheduler: Scheduler,
    pub agents: AgentSync,
    pub views: Views,
    pub interference: InterferenceModel,
    pub service_states: Arc<ServiceStates>,
    pub providers: Providers,
}

impl Deployments {
    pub(crate) fn new(store: Arc<dyn DeploymentStore>, core: Core, asks: Asks) -> Deployments {
        Deployments {
            store,
            core,
            passes: Arc::default(),
            service_states: asks.service_states,
            scheduler: asks.scheduler,
            agents: asks.agents,
            views: asks.views,
            interference: asks.interference,
            providers: asks.providers,
        }
    }

    /// The same component writing through `store` (a pass's fenced store), asking the
    /// fenced components of `asks`.
    pub(crate) fn with_store(
        &self,
        store: Arc<dyn DeploymentStore>,
        core: Core,
        asks: Asks,
    ) -> Deployments {
        Deployments {
            passes: self.passes.clone(),
            ..Deployments::new(store, core, asks)
        }
    }
}

impl Deployments {
    /// Interference estimates, as this component asks them (shared with the scheduler).
    pub(crate) fn interference(&self) -> &InterferenceModel {
        &self.interference
    }

    /// What the passes last said of each service (shared with the scheduler).
    pub(crate) fn service_states(&self) -> &Arc<ServiceStates> {
        &self.service_states
    }

    /// Forgets which changes the passes have read: the next pass looks at every service
    /// (this server just took the lease, and another wrote meanwhile).
    pub(crate) fn read_everything_next(&self) {
        self.passes.memory.lock().forget();
    }
}
