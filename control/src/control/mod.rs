//! `Control`: the control plane's entry point. The API, the console and the agents call
//! its methods; its reconcile loop turns desired state into tasks and placements.

use crate::agents::AgentSync;
use crate::auth::Accounts;
mod cluster;
mod run;

pub(crate) use cluster::SLOW_STORE;

use crate::config::ControlConfig;
use crate::deployments::{Asks, Deployments};
use crate::error::ControlError;
use crate::notify::Notifications;
use crate::parts::{Core, ServiceStates};
use crate::projects::Projects;
use crate::providers::Providers;
use crate::scheduler::Scheduler;
use crate::store::Store;
use crate::streams::TaskStreams;
use crate::views::Views;
use crate::work::InterferenceModel;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// The control plane: a façade over the components that do its work, each owning its
/// state (see `docs/architecture.md`). The server and the console reach a component through
/// its accessor (`control.agents().sync_agent(..)`); `Control` itself wires them, runs the
/// loop (`run`) and keeps this server's place among the servers (`cluster`). Cheap to
/// clone; clones share everything.
#[derive(Clone)]
pub struct Control {
    /// The whole store: what components are made with, and what the lease fences.
    store: Arc<dyn Store>,
    /// The configuration, the fleet's time, waking the loop, events.
    pub(crate) core: Core,
    /// Operators' accounts, tokens, sessions and the audit log.
    accounts: Accounts,
    /// Hosts joining and syncing.
    agents: AgentSync,
    /// Placement against the live fleet.
    scheduler: Scheduler,
    /// Services, pools, task definitions and the reconcile passes.
    deployments: Deployments,
    /// Projects, their members and quotas.
    projects: Projects,
    /// The read models.
    views: Views,
    /// Pools' capacity providers.
    providers: Providers,
    /// Webhooks and the delivery of notices to them (sent at least once, by whichever
    /// server holds the lease).
    notifications: Notifications,
    /// Logs and exec: the relay to agents (this server's streams).
    streams: TaskStreams,
}

impl Control {
    pub fn new(store: Arc<dyn Store>, config: ControlConfig) -> Control {
        let core = Core::new(config, store.clone());
        let service_states: Arc<ServiceStates> = Arc::default();
        let interference = InterferenceModel::new(store.clone(), core.clone());
        let accounts = Accounts::new(store.clone(), store.clone(), core.clone());
        let scheduler = Scheduler::new(
            store.clone(),
            core.clone(),
            service_states.clone(),
            interference.clone(),
        );
        let views = Views::new(
            store.clone(),
            store.clone(),
            core.clone(),
            scheduler.clone(),
        );
        let agents = AgentSync::new(store.clone(), core.clone(), scheduler.clone());
        let providers = Providers::new(store.clone(), core.clone(), scheduler.clone());
        let deployments = Deployments::new(
            store.clone(),
            core.clone(),
            Asks {
                scheduler: scheduler.clone(),
                agents: agents.clone(),
                views: views.clone(),
                interference,
                service_states,
                providers: providers.clone(),
            },
        );
        Control {
            providers,
            notifications: Notifications::new(store.clone(), core.clone()),
            streams: TaskStreams::new(store.clone()),
            projects: Projects::new(store.clone(), core.clone(), accounts.clone(), views.clone()),
            accounts,
            agents,
            scheduler,
            deployments,
            views,
            store,
            core,
        }
    }

    /// The same control plane writing through `store` (a pass's fenced store): every
    /// component is rebuilt on it, asking the others rebuilt likewise, and keeps its state
    /// (shared with this one's).
    pub(crate) fn with_store(&self, store: Arc<dyn Store>) -> Control {
        let core = self.core.with_store(store.clone());
        let interference = self
            .deployments
            .interference()
            .with_store(store.clone(), core.clone());
        let scheduler =
            self.scheduler
                .with_store(store.clone(), core.clone(), interference.clone());
        let agents = self
            .agents
            .with_store(store.clone(), core.clone(), scheduler.clone());
        let views = self
            .views
            .with_store(store.clone(), core.clone(), scheduler.clone());
        let accounts = self.accounts.with_store(store.clone(), core.clone());
        let providers = self
            .providers
            .with_store(store.clone(), core.clone(), scheduler.clone());
        let deployments = self.deployments.with_store(
            store.clone(),
            core.clone(),
            Asks {
                scheduler: scheduler.clone(),
                agents: agents.clone(),
                views: views.clone(),
                interference,
                service_states: self.deployments.service_states().clone(),
                providers: providers.clone(),
            },
        );
        Control {
            providers,
            notifications: self.notifications.with_store(store.clone(), core.clone()),
            streams: self.streams.with_store(store.clone()),
            projects: self.projects.with_store(
                store.clone(),
                core.clone(),
                accounts.clone(),
                views.clone(),
            ),
            accounts,
            agents,
            scheduler,
            deployments,
            views,
            store,
            core,
        }
    }

    /// Tasks' logs and commands run in them.
    pub fn streams(&self) -> &TaskStreams {
        &self.streams
    }

    /// Operators' accounts: users, API tokens, console sessions, the audit log.
    pub fn accounts(&self) -> &Accounts {
        &self.accounts
    }

    /// Agent sync: hosts joining, their syncs, their credentials.
    pub fn agents(&self) -> &AgentSync {
        &self.agents
    }

    /// Deployments: pools, task definitions, services, consolidation, host operations,
    /// and the reconcile passes.
    pub fn deployments(&self) -> &Deployments {
        &self.deployments
    }

    /// Projects: quotas, members, use over time, preemptions.
    pub fn projects(&self) -> &Projects {
        &self.projects
    }

    /// The read models: pages, lists, the fleet, endpoints, fit.
    pub fn views(&self) -> &Views {
        &self.views
    }

    /// Pools' capacity providers: registering what makes machines, the machines asked for.
    pub fn providers(&self) -> &Providers {
        &self.providers
    }

    /// Notifications: webhooks and their deliveries.
    pub fn notifications(&self) -> &Notifications {
        &self.notifications
    }

    /// The scheduler: placement previews and approving or declining preemption plans.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Reads the database's clock for the fleet's time (a failure keeps the last reading).
    pub async fn read_db_clock(&self) {
        self.core.read_db_clock().await
    }

    /// Asks the reconcile loop for one pass now, as its holder of the lease would (tests
    /// and the benchmarks drive passes with it).
    pub async fn reconcile_once(&self) -> Result<(), ControlError> {
        self.deployments.reconcile_once().await
    }

    /// The store itself, for tests that look at or set up what no operation exposes
    /// (a race, a host lost at a chosen moment). Everything else goes through `Control`.
    #[cfg(any(test, feature = "testing"))]
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn config(&self) -> &ControlConfig {
        self.core.config()
    }

    /// How long a host may go without a sync before it is lost.
    pub fn lost_timeout(&self) -> Duration {
        self.core.lost_timeout()
    }

    /// Asks the reconcile loop to run soon, and tells live views something changed.
    pub fn wake(&self) {
        self.core.wake()
    }

    /// Change notifications for live views.
    pub fn subscribe(&self) -> broadcast::Receiver<&'static str> {
        self.core.subscribe()
    }
}
