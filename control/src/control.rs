//! `Control`: the control plane's entry point. The API, the console and the agents call
//! its methods; its reconcile loop turns desired state into tasks and placements.

use crate::agents::AgentSync;
use crate::auth::Accounts;
use crate::config::ControlConfig;
use crate::parts::{Core, Passes, ServiceStates};
use crate::projects::Projects;
use crate::scheduler::Scheduler;
use crate::store::Store;
use crate::views::Views;
use crate::work::InterferenceModel;
use chrono::Utc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;

/// The control plane: a façade over the store and the parts that keep this server's
/// state (see [`crate::parts`]). Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Control {
    pub(crate) store: Arc<dyn Store>,
    /// The configuration, the fleet's time, waking the loop, events.
    pub(crate) core: Core,
    /// Placement against the live fleet.
    pub(crate) scheduler: Scheduler,
    /// What the passes last said of each service.
    pub(crate) service_states: Arc<ServiceStates>,
    /// Interference estimates from services' work history.
    pub(crate) interference: InterferenceModel,
    /// Hosts joining and syncing.
    pub(crate) agents: AgentSync,
    /// What the reconcile passes remember.
    pub(crate) passes: Arc<Passes>,
    /// Operators' accounts, tokens, sessions and the audit log.
    pub(crate) accounts: Accounts,
    /// The read models.
    pub(crate) views: Views,
    /// Projects, their members and quotas.
    pub(crate) projects: Projects,
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
        Control {
            accounts: accounts.clone(),
            agents: AgentSync::new(store.clone(), core.clone(), scheduler.clone()),
            projects: Projects::new(store.clone(), core.clone(), accounts.clone(), views.clone()),
            views,
            scheduler,
            service_states,
            interference,
            store,
            core,
            passes: Arc::default(),
        }
    }

    /// The same control plane writing through `store` (a pass's fenced store): every
    /// component keeps its state, and writes through the new store.
    pub(crate) fn with_store(&self, store: Arc<dyn Store>) -> Control {
        let core = self.core.with_events(store.clone());
        let scheduler = self.scheduler.with_store(store.clone(), core.clone());
        Control {
            projects: self.projects.with_store(store.clone(), core.clone()),
            accounts: self.accounts.clone(),
            agents: self
                .agents
                .with_store(store.clone(), core.clone(), scheduler.clone()),
            scheduler,
            store,
            core,
            ..self.clone()
        }
    }

    /// The scheduler: placement previews and approving or declining preemption plans.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The read models: pages, lists, the fleet, endpoints, fit.
    pub fn views(&self) -> &Views {
        &self.views
    }

    /// Projects: quotas, members, use over time, preemptions.
    pub fn projects(&self) -> &Projects {
        &self.projects
    }

    /// Agent sync: hosts joining, their syncs, their credentials.
    pub fn agents(&self) -> &AgentSync {
        &self.agents
    }

    /// Operators' accounts: users, API tokens, console sessions, the audit log.
    pub fn accounts(&self) -> &Accounts {
        &self.accounts
    }

    /// Reads the database's clock for [`Control::now`]; a failure keeps the last reading
    /// (carried forward by this machine's monotonic clock).
    pub async fn read_db_clock(&self) {
        let asked = std::time::Instant::now();
        match self.store.db_now().await {
            // A reading that took long (a database coming back, a queue for connections)
            // says little about when it was taken: kept only when quick, and placed at
            // its answer, so that an error makes the fleet's time lag (it waits for the
            // database to catch up) rather than run ahead (declaring hosts lost early).
            Ok(_) if asked.elapsed() > std::time::Duration::from_millis(500) => {
                tracing::debug!("a slow reading of the database's clock is not used");
            }
            Ok(t) => match chrono::DateTime::parse_from_rfc3339(&t) {
                Ok(db) => {
                    self.core
                        .membership()
                        .fleet_clock
                        .sample(db.with_timezone(&Utc), std::time::Instant::now());
                }
                Err(e) => {
                    tracing::warn!(error = %e, time = t, "the database's clock is unreadable")
                }
            },
            Err(e) => tracing::debug!(error = %e, "reading the database's clock failed"),
        }
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
