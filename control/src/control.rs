//! `Control`: the control plane's entry point. The API, the console and the agents call
//! its methods; its reconcile loop turns desired state into tasks and placements.

use crate::clock::{Clock, SystemClock};
use crate::error::ControlError;
use crate::error::StoreError;
use crate::inputs::{PoolInput, ServiceDetail, ServiceInput, ServicePatch};
use crate::lifecycle::{self, HostEvent};
use crate::scheduler::CachedEngine;
use crate::store::{EventFilter, Store, TaskFilter};
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tessera_model::service::{Service, TaskDefRef, TaskDefinition, TaskState};
use tessera_model::taskdef::{Secret, TaskDefinitionSpec, ValidationErrors, parse_task_definition};
use tessera_model::{HostId, PoolInfo, PoolName};
use tokio::sync::{Notify, broadcast};

/// Runs `pass` as a task of its own and says how it ended: a failure or a panic is
/// returned as text, never propagated, so the loop that calls it goes on.
pub(crate) async fn supervised<F>(pass: F) -> Result<(), String>
where
    F: std::future::Future<Output = Result<(), ControlError>> + Send + 'static,
{
    match tokio::spawn(pass).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) if e.is_panic() => {
            let panic = e.into_panic();
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("panicked: {why}"))
        }
        Err(e) => Err(format!("cancelled: {e}")),
    }
}

/// A host whose status changed between reading and writing it (a sync, a lost timeout).
fn changed_meanwhile(id: &HostId) -> ControlError {
    ControlError::Conflict(format!(
        "host {id} changed status meanwhile; look again and retry"
    ))
}

/// What the reconcile passes last reported of one service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ServiceState {
    /// Why its pending tasks could not be placed.
    pub pending: Option<String>,
    /// Why the last pass could not reconcile it.
    pub failure: Option<String>,
    /// Failures of the primary deployment already answered with a restart delay.
    pub backoff: Option<u32>,
    /// During a rollout: (deployment, its running tasks) as last reported.
    pub progress: Option<(i64, usize)>,
    /// Every desired task runs the primary revision.
    pub steady: bool,
}

/// A deployment's crash-loop backoff: the failures already answered with a delay, and
/// until when its new tasks wait.
pub(crate) type Backoff = (u32, DateTime<Utc>);

/// Timings and limits of the control plane.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// How often agents sync.
    pub sync_interval: Duration,
    /// A host silent for this many sync intervals is lost.
    pub lost_after_intervals: u32,
    /// How often the reconcile loop runs when nothing wakes it.
    pub tick: Duration,
    /// Share of a pool's hosts whose tasks may be moved at once (drain, impaired).
    pub migration_share: f64,
    /// Failed tasks after which a deployment is rolled back.
    pub failure_threshold: u32,
    /// Stopped tasks, events, finished deployments and consolidation plans, and servers
    /// not seen, older than this are deleted.
    pub retention: Duration,
    /// Audit entries older than this are deleted.
    pub audit_retention: Duration,
    /// The longest wait before a task that keeps failing is started again.
    pub max_restart_delay: Duration,
    /// What time it is: the machine's, or a test's [`crate::clock::ManualClock`].
    pub clock: Arc<dyn Clock>,
    /// How long the scheduler lease lasts without renewal (it is renewed every tick): the
    /// longest another server waits to take over from one that died.
    pub lease_ttl: Duration,
    /// Where this server is reached, as `GET /api/v1/cluster` shows it.
    pub address: String,
    /// Usage history: bucket widths, retention, the fit rules.
    pub usage: crate::usage::UsageConfig,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig {
            sync_interval: Duration::from_secs(5),
            lost_after_intervals: 3,
            tick: Duration::from_secs(1),
            migration_share: 0.2,
            failure_threshold: 3,
            retention: Duration::from_secs(7 * 24 * 3600),
            audit_retention: Duration::from_secs(90 * 24 * 3600),
            max_restart_delay: Duration::from_secs(300),
            clock: Arc::new(SystemClock),
            lease_ttl: Duration::from_secs(8),
            address: String::new(),
            usage: crate::usage::UsageConfig::default(),
        }
    }
}

/// The control plane. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Control {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: ControlConfig,
    /// Wakes the reconcile loop when something changed (a scale, a sync with news).
    pub(crate) wake: Arc<Notify>,
    /// Tells live views (SSE) that state changed; the payload is a coarse topic.
    pub(crate) changes: broadcast::Sender<&'static str>,
    /// What the last passes reported per service, so an event is written when it
    /// changes, not on every pass.
    pub(crate) service_state: Arc<Mutex<HashMap<String, ServiceState>>>,
    /// Serialises reconcile passes: the loop and tests calling `reconcile_once` directly.
    pub(crate) pass: Arc<tokio::sync::Mutex<()>>,
    /// Recent failed sign-ins, to limit password guessing.
    pub(crate) hash_queue: Arc<crate::auth::HashQueue>,
    /// When this control plane started, by this machine's clock (what the cluster view
    /// shows).
    pub(crate) started: DateTime<Utc>,
    /// The fleet's time (the database's clock): what liveness and the lease are decided
    /// by. Hosts are not declared lost for one lost timeout after it started, since their
    /// agents could not reach a server that was down.
    pub(crate) fleet_clock: Arc<crate::clock::FleetClock>,
    /// When this server last found itself unable to do its work on time: the database
    /// failed or stalled (agents could not have a sync recorded through any server
    /// meanwhile), or a tick came late. Hosts get one lost timeout after it too.
    pub(crate) store_failed_at: Arc<Mutex<Option<DateTime<Utc>>>>,
    /// Whether the last announcement failed: the first that succeeds after it marks the
    /// database back, and the hosts' lost timeout counts from then (agents backing off
    /// may not sync again for two intervals after it returns).
    pub(crate) store_failing: Arc<std::sync::atomic::AtomicBool>,
    /// When the last tick began.
    pub(crate) last_tick: Arc<Mutex<Option<std::time::Instant>>>,
    /// Per deployment: the failures already answered with a delay, and until when new
    /// tasks wait (crash-loop backoff).
    pub(crate) restart_backoff: Arc<Mutex<HashMap<i64, Backoff>>>,
    /// When old rows were last pruned.
    pub(crate) last_prune: Arc<Mutex<Option<DateTime<Utc>>>>,
    /// Per pool, the scheduler's engine, kept in step with its own commits from one pass
    /// to the next while nothing else changes capacity.
    pub(crate) engines: Arc<Mutex<HashMap<PoolName, CachedEngine>>>,
    /// Bumped by every change of capacity the scheduler did not make itself (a task gone,
    /// a host's status or GPUs, a pool's limits): a cached engine older than it is rebuilt.
    pub(crate) capacity_epoch: Arc<std::sync::atomic::AtomicU64>,
    /// Specs of task definition revisions, which never change once registered: every
    /// sync and scheduling pass needs them.
    pub(crate) specs: Arc<Mutex<HashMap<TaskDefRef, Arc<TaskDefinitionSpec>>>>,
    /// When each host last synced with nothing else to say, not yet written: written
    /// together every tick, and at the start of every pass (before lost hosts are looked
    /// for), so a quiet sync costs no write of its own.
    pub(crate) heartbeats: Arc<Mutex<HashMap<HostId, String>>>,
    /// Each deployment's stop timeout (its service's, which never changes; deployment ids
    /// are never reused).
    pub(crate) stop_timeouts: Arc<Mutex<HashMap<i64, u32>>>,
    /// How many times the scheduler built an engine from the store (for tests and logs).
    pub(crate) engine_builds: Arc<std::sync::atomic::AtomicU64>,
    /// This server's id among the servers sharing the database.
    pub(crate) server_id: Arc<str>,
    /// The scheduler lease as this server last took or renewed it.
    pub(crate) lease: Arc<Mutex<Option<crate::store::Lease>>>,
    /// Whether the database carries the other servers' changes to this one (see
    /// [`Control::relay_changes`]); without it, a scheduler with company rebuilds its
    /// engines every pass.
    pub(crate) relayed: Arc<std::sync::atomic::AtomicBool>,
    /// Measured use received by this server and not written yet.
    pub(crate) usage: Arc<Mutex<crate::usage::UsageBuffer>>,
    /// Fit verdicts by task, and when they were read (see `cached_verdicts`).
    pub(crate) verdicts: Arc<Mutex<Option<CachedVerdicts>>>,
    /// Each task's work as its syncs here reported it: written with the heartbeats when it
    /// says something new.
    pub(crate) work: Arc<Mutex<crate::work::WorkLatest>>,
    /// Alarm watches and autoscaling memory of the services this server reconciles.
    pub(crate) watches: Arc<Mutex<crate::work::Watches>>,
}

/// When fit verdicts were read, and what they were.
pub(crate) type CachedVerdicts = (
    std::time::Instant,
    Arc<HashMap<String, tessera_model::fit::Verdict>>,
);

impl Control {
    pub fn new(store: Arc<dyn Store>, config: ControlConfig) -> Control {
        let (changes, _) = broadcast::channel(64);
        Control {
            store,
            wake: Arc::new(Notify::new()),
            changes,
            service_state: Arc::default(),
            pass: Arc::default(),
            hash_queue: Arc::default(),
            started: config.clock.now(),
            fleet_clock: Arc::new(crate::clock::FleetClock::new(&*config.clock)),
            store_failed_at: Arc::default(),
            store_failing: Arc::default(),
            last_tick: Arc::default(),
            restart_backoff: Arc::default(),
            last_prune: Arc::default(),
            engines: Arc::default(),
            capacity_epoch: Arc::default(),
            engine_builds: Arc::default(),
            specs: Arc::default(),
            heartbeats: Arc::default(),
            stop_timeouts: Arc::default(),
            server_id: crate::cluster::server_id(&config.address).into(),
            lease: Arc::default(),
            relayed: Arc::default(),
            usage: Arc::default(),
            verdicts: Arc::default(),
            work: Arc::default(),
            watches: Arc::default(),
            config,
        }
    }

    /// Changes what is remembered of service `name` with `change`; true when that changed
    /// anything (then it is news worth an event).
    pub(crate) fn service_state_changed(
        &self,
        name: &str,
        change: impl FnOnce(&mut ServiceState),
    ) -> bool {
        let mut states = self.service_state.lock().expect("not poisoned");
        let state = states.entry(name.to_owned()).or_default();
        let before = state.clone();
        change(state);
        *state != before
    }

    /// The spec of revision `r`, from memory after the first read (revisions are
    /// immutable; only whether new tasks may use them changes).
    pub(crate) async fn spec_of(
        &self,
        r: &TaskDefRef,
    ) -> Result<Arc<TaskDefinitionSpec>, ControlError> {
        if let Some(spec) = self.specs.lock().expect("not poisoned").get(r) {
            return Ok(spec.clone());
        }
        let spec = Arc::new(self.store.get_task_definition(r).await?.spec);
        let mut specs = self.specs.lock().expect("not poisoned");
        if specs.len() >= 4096 {
            specs.clear();
        }
        specs.insert(r.clone(), spec.clone());
        Ok(spec)
    }

    /// Capacity changed outside the scheduler: its cached engines are rebuilt next pass,
    /// and the other servers on this database hear of it (theirs are too).
    pub(crate) fn capacity_changed(&self) {
        self.capacity_epoch
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = self.changes.send("capacity");
    }

    /// Now, by the fleet's clock (the database's; see [`crate::clock::FleetClock`]).
    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.fleet_clock.now(&*self.config.clock)
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
                    self.fleet_clock
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
        &self.config
    }

    /// How long a host may go without a sync before it is lost.
    pub fn lost_timeout(&self) -> Duration {
        self.config.sync_interval * self.config.lost_after_intervals
    }

    /// Asks the reconcile loop to run soon, and tells live views something changed.
    pub fn wake(&self) {
        self.wake.notify_one();
        let _ = self.changes.send("changed");
    }

    /// Change notifications for live views.
    pub fn subscribe(&self) -> broadcast::Receiver<&'static str> {
        self.changes.subscribe()
    }

    /// Runs until `shutdown` resolves: every tick (and on every wake-up) this server
    /// announces itself, writes the times of the quiet syncs it received, and takes or
    /// renews the scheduler lease; the server holding it runs a reconcile pass whose writes
    /// carry the lease's epoch (see [`crate::cluster`]). Each pass runs as its own task, so
    /// a pass that fails or panics is logged and the next one runs as usual: scheduling
    /// never stops silently.
    pub async fn run(&self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let relay = self.relay_changes().await;
        loop {
            if let Err(why) = self.tick().await {
                tracing::error!(error = %why, "reconcile pass failed; the next pass runs as usual");
            }
            tokio::select! {
                _ = &mut shutdown => break,
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(self.config.tick) => {}
            }
        }
        if let Err(e) = self.flush_heartbeats().await {
            tracing::error!(error = %e, "writing the last syncs' times failed");
        }
        if let Err(e) = self.flush_usage(true).await {
            tracing::error!(error = %e, "writing the last usage buckets failed");
        }
        self.let_go_of_lease().await;
        for task in relay {
            task.abort();
        }
        self.relayed
            .store(false, std::sync::atomic::Ordering::SeqCst);
        tracing::info!("reconcile loop stopped");
    }

    /// One turn of [`Control::run`]: announce this server, write the quiet syncs' times,
    /// take or renew the scheduler lease and, holding it, run a reconcile pass whose writes
    /// carry its epoch. Whether this server scheduled; the pass's failure or panic as text.
    pub async fn tick(&self) -> Result<bool, String> {
        // A tick that comes late (the last one waited on a database that was down, or the
        // process was paused) says this server could not judge hosts' silence meanwhile.
        let began = std::time::Instant::now();
        let previous = self.last_tick.lock().expect("not poisoned").replace(began);
        let late = (self.lost_timeout() / 2).max(crate::cluster::SLOW_STORE);
        if previous.is_some_and(|p| began.duration_since(p) > self.config.tick + late) {
            tracing::warn!(
                "this server's last tick took too long; hosts get a lost timeout to sync again"
            );
            *self.store_failed_at.lock().expect("not poisoned") = Some(self.now());
        }
        match self.tick_cluster().await {
            Some(fenced) => {
                let started = std::time::Instant::now();
                let pass = supervised(async move { fenced.reconcile_once().await }).await;
                metrics::histogram!("tessera_reconcile_pass_seconds")
                    .record(started.elapsed().as_secs_f64());
                pass.map(|()| true)
            }
            None => Ok(false),
        }
    }

    pub(crate) async fn event(&self, service: Option<&str>, host: Option<&HostId>, message: &str) {
        tracing::info!(service, host = host.map(HostId::as_str), "{message}");
        if let Err(e) = self.store.add_event(service, host, message).await {
            tracing::error!(error = %e, "recording an event failed");
        }
        let _ = self.changes.send("event");
    }

    // Pools.

    pub async fn create_pool(&self, input: &PoolInput) -> Result<PoolInfo, ControlError> {
        let pool = crate::inputs::validate_pool(input)?;
        if self.store.pool_exists(&pool.name).await? {
            return Err(ControlError::Conflict(format!(
                "a pool named {:?} already exists",
                pool.name.as_str()
            )));
        }
        self.store.upsert_pool(&pool).await?;
        self.capacity_changed();
        Ok(pool)
    }

    /// `PATCH /api/v1/pools/{name}`: the pool with what `patch` gives changed. Services
    /// already running keep their definitions; a stricter pool applies to their next
    /// deployment.
    pub async fn update_pool(
        &self,
        name: &PoolName,
        patch: &tessera_model::api::PoolPatch,
    ) -> Result<PoolInfo, ControlError> {
        let pool = self.store.get_pool(name).await?;
        let merged = PoolInput {
            name: pool.name.to_string(),
            policy: Some(
                patch
                    .policy
                    .clone()
                    .unwrap_or_else(|| pool.policy.as_str().to_owned()),
            ),
            compute_overcommit: Some(patch.compute_overcommit.unwrap_or(pool.compute_overcommit)),
            mps_client_limit: patch.mps_client_limit.or(pool.mps_client_limit),
            admission: Some(
                patch
                    .admission
                    .clone()
                    .unwrap_or_else(|| pool.admission.as_str().to_owned()),
            ),
            task_users: Some(patch.task_users.unwrap_or(pool.task_users)),
            privileged: Some(patch.privileged.unwrap_or(pool.privileged)),
        };
        let updated = crate::inputs::validate_pool(&merged)?;
        self.store.upsert_pool(&updated).await?;
        self.capacity_changed();
        self.wake();
        Ok(updated)
    }

    // Task definitions.

    /// Validates `input` (Tessera's JSON or ECS's) and stores it as the family's next revision.
    /// A secret sent back as `{"set": true}` (as descriptions show it) keeps the value the
    /// family's latest revision has for it.
    pub async fn register_task_definition(
        &self,
        input: &Value,
    ) -> Result<TaskDefinition, ControlError> {
        let mut spec = parse_task_definition(input).map_err(ControlError::Invalid)?;
        let keeps_secrets = spec
            .containers
            .iter()
            .any(|c| c.secrets.values().any(|v| *v == Secret::Unchanged));
        if keeps_secrets {
            let previous = match self
                .store
                .list_task_definition_revisions(&spec.family)
                .await
            {
                Ok(revisions) => revisions
                    .last()
                    .map(|d| d.spec.secret_values())
                    .unwrap_or_default(),
                Err(StoreError::NotFound { .. }) => Default::default(),
                Err(e) => return Err(e.into()),
            };
            let missing = spec.fill_secrets(&previous);
            if !missing.is_empty() {
                return Err(ControlError::Invalid(ValidationErrors { errors: missing }));
            }
        }
        Ok(self.store.register_task_definition(&spec).await?)
    }

    /// Marks a revision inactive: still describable, no new tasks; running ones go on.
    pub async fn deregister_task_definition(
        &self,
        r: &TaskDefRef,
    ) -> Result<TaskDefinition, ControlError> {
        self.store.set_task_definition_active(r, false).await?;
        Ok(self.store.get_task_definition(r).await?)
    }

    // Services.

    pub async fn create_service(&self, input: &ServiceInput) -> Result<Service, ControlError> {
        let service = crate::inputs::validate_service(input)?;
        let def = self.usable_definition(&service.task_definition).await?;
        service
            .objectives
            .check(def.spec.published())
            .map_err(ControlError::Invalid)?;
        let pool = self.existing_pool(&service.pool).await?;
        allowed_in_pool(&def.spec, &pool)?;
        self.store.create_service(&service).await?;
        self.event(
            Some(&service.name),
            None,
            &format!(
                "service {} created: {} tasks of {} in pool {}",
                service.name, service.desired_count, service.task_definition, service.pool
            ),
        )
        .await;
        self.wake();
        Ok(self.store.get_service(&service.name).await?)
    }

    /// The definition `r` names, if new tasks may use it (registered and active); the error
    /// names the `task_definition` field. The one check the API, the console, the preview
    /// and the scheduler's inputs share.
    pub(crate) async fn usable_definition(
        &self,
        r: &TaskDefRef,
    ) -> Result<TaskDefinition, ControlError> {
        let def = self.store.get_task_definition(r).await.map_err(|_| {
            ControlError::invalid(
                "task_definition",
                format!("no task definition {r} is registered"),
            )
        })?;
        if !def.active {
            return Err(ControlError::invalid(
                "task_definition",
                format!("{r} is deregistered; use an active revision"),
            ));
        }
        Ok(def)
    }

    /// The pool named `name`, or an error naming the `pool` field.
    pub(crate) async fn existing_pool(&self, name: &PoolName) -> Result<PoolInfo, ControlError> {
        self.store.get_pool(name).await.map_err(|_| {
            ControlError::invalid("pool", format!("no pool named {:?}", name.as_str()))
        })
    }

    /// Scales a service and/or starts a rolling deployment of a new revision.
    pub async fn update_service(
        &self,
        name: &str,
        patch: &ServicePatch,
    ) -> Result<Service, ControlError> {
        let service = self.store.get_service(name).await?;
        if service.deleting {
            return Err(ControlError::Conflict(format!(
                "service {name} is being deleted"
            )));
        }
        let mut e = crate::inputs::Errors::default();
        if patch
            .desired_count
            .is_some_and(|d| d > crate::inputs::MAX_DESIRED)
        {
            e.add(
                "desired_count",
                format!("must be at most {}", crate::inputs::MAX_DESIRED),
            );
        }
        let new_def = patch
            .task_definition
            .as_deref()
            .and_then(|raw| e.task_definition(raw));
        if patch.is_empty() {
            e.add(
                "(body)",
                "give desired_count, task_definition, strategy, constraints, deployment, stop_timeout_secs, deregistration_delay_secs, slo, alarms, bake_secs or autoscaling",
            );
        }
        e.finish()?;
        // Settings go through the same rules as a new service's.
        let settings = if patch.changes_settings() {
            let input = ServiceInput {
                name: service.name.clone(),
                task_definition: service.task_definition.to_string(),
                pool: service.pool.to_string(),
                desired_count: service.desired_count,
                strategy: match &patch.strategy {
                    Some(s) => s.clone(),
                    None => service.strategy.map(|p| p.as_str().to_owned()),
                },
                constraints: patch
                    .constraints
                    .clone()
                    .unwrap_or_else(|| service.constraints.clone()),
                deployment: Some(patch.deployment.unwrap_or(service.deployment)),
                stop_timeout_secs: patch.stop_timeout_secs.unwrap_or(service.stop_timeout_secs),
                deregistration_delay_secs: patch
                    .deregistration_delay_secs
                    .unwrap_or(service.deregistration_delay_secs),
                slo: None,
                alarms: Vec::new(),
                bake_secs: 0,
                autoscaling: None,
            };
            let mut new = crate::inputs::validate_service(&input)?;
            new.objectives = patch.objectives_over(&service.objectives);
            Some(new)
        } else {
            None
        };
        // Objectives ask for figures the (new) revision must publish.
        if patch.changes_objectives() || new_def.is_some() {
            let r = new_def.as_ref().unwrap_or(&service.task_definition);
            let def = if new_def.is_some() {
                self.usable_definition(r).await?
            } else {
                self.store.get_task_definition(r).await?
            };
            let objectives = settings
                .as_ref()
                .map_or(&service.objectives, |s| &s.objectives);
            objectives
                .check(def.spec.published())
                .map_err(ControlError::Invalid)?;
            if new_def.is_some() {
                allowed_in_pool(&def.spec, &self.existing_pool(&service.pool).await?)?;
            }
        }
        if let Some(d) = patch.desired_count.filter(|&d| d != service.desired_count) {
            self.store.set_desired_count(name, d).await?;
            self.event(
                Some(name),
                None,
                &format!(
                    "desired count changed from {} to {d}",
                    service.desired_count
                ),
            )
            .await;
        }
        if let Some(new) = settings {
            // Only what the patch gives and changes is written.
            let mut change = crate::store::SettingsChange::default();
            let mut changed = Vec::new();
            if patch.strategy.is_some() && new.strategy != service.strategy {
                changed.push(format!(
                    "strategy {}",
                    new.strategy.map_or("the pool's", |p| p.as_str())
                ));
                change.strategy = Some(new.strategy);
            }
            if patch.constraints.is_some() && new.constraints != service.constraints {
                changed.push("constraints".to_owned());
                change.constraints = Some(new.constraints.clone());
            }
            if patch.deployment.is_some() && new.deployment != service.deployment {
                changed.push(format!(
                    "deployment minimum healthy {}% maximum {}%",
                    new.deployment.minimum_healthy_percent, new.deployment.maximum_percent
                ));
                change.deployment = Some(new.deployment);
            }
            if patch.stop_timeout_secs.is_some()
                && new.stop_timeout_secs != service.stop_timeout_secs
            {
                changed.push(format!("stop timeout {} s", new.stop_timeout_secs));
                change.stop_timeout_secs = Some(new.stop_timeout_secs);
            }
            if patch.deregistration_delay_secs.is_some()
                && new.deregistration_delay_secs != service.deregistration_delay_secs
            {
                changed.push(format!(
                    "deregistration delay {} s",
                    new.deregistration_delay_secs
                ));
                change.deregistration_delay_secs = Some(new.deregistration_delay_secs);
            }
            if patch.changes_objectives() && new.objectives != service.objectives {
                changed.push(crate::work::describe_objectives(&new.objectives));
                change.objectives = Some(new.objectives.clone());
            }
            if !changed.is_empty() {
                self.store.update_service_settings(name, &change).await?;
                self.event(
                    Some(name),
                    None,
                    &format!("settings changed: {}", changed.join(", ")),
                )
                .await;
                self.capacity_changed();
            }
        }
        if let Some(r) = new_def.filter(|r| *r != service.task_definition) {
            let id = self.store.start_deployment(name, &r, false).await?;
            self.event(
                Some(name),
                None,
                &format!("deployment {id} started: {} → {r}", service.task_definition),
            )
            .await;
        }
        self.wake();
        Ok(self.store.get_service(name).await?)
    }

    /// Drains the service to zero tasks; the reconciler removes it then.
    pub async fn delete_service(&self, name: &str) -> Result<(), ControlError> {
        self.store.mark_service_deleting(name).await?;
        self.event(
            Some(name),
            None,
            "service deletion requested: draining to 0 tasks",
        )
        .await;
        self.wake();
        Ok(())
    }

    pub async fn service_detail(&self, name: &str) -> Result<ServiceDetail, ControlError> {
        let service = self.store.get_service(name).await?;
        let deployments = self.store.list_deployments(name).await?;
        let events = self
            .store
            .list_events(&EventFilter {
                service: Some(name.to_owned()),
                limit: 20,
                ..Default::default()
            })
            .await?;
        Ok(ServiceDetail {
            running: deployments.iter().map(|d| d.running).sum(),
            pending: deployments.iter().map(|d| d.pending).sum(),
            service,
            deployments,
            events,
        })
    }

    // Hosts.

    /// Operator drain: no new tasks; running ones move elsewhere (start before stop).
    pub async fn drain_host(&self, id: &HostId) -> Result<(), ControlError> {
        self.operate_host(id, HostEvent::Drain).await
    }

    /// Operator activate: the host takes new tasks again.
    pub async fn activate_host(&self, id: &HostId) -> Result<(), ControlError> {
        self.operate_host(id, HostEvent::Activate).await
    }

    /// An operator's change of a host's status, by the host lifecycle's rules, written
    /// only over the status it read.
    async fn operate_host(&self, id: &HostId, event: HostEvent<'_>) -> Result<(), ControlError> {
        let host = self.store.get_host(id).await?;
        let Some(t) =
            lifecycle::next(id.as_str(), host.status, event).map_err(ControlError::Conflict)?
        else {
            return Ok(());
        };
        if !self
            .store
            .set_host_status_if(id, host.status, t.to, t.reason.as_deref())
            .await?
        {
            return Err(changed_meanwhile(id));
        }
        self.capacity_changed();
        self.event(None, Some(id), &t.message).await;
        self.wake();
        Ok(())
    }

    /// Live tasks of a service (not stopped), without their allocations.
    pub(crate) async fn live_tasks(
        &self,
        service: &str,
    ) -> Result<Vec<tessera_model::service::Task>, ControlError> {
        Ok(self
            .store
            .list_tasks(&TaskFilter {
                service: Some(service.to_owned()),
                states: vec![
                    TaskState::Pending,
                    TaskState::Assigned,
                    TaskState::Running,
                    TaskState::Stopping,
                ],
                without_allocations: true,
                ..Default::default()
            })
            .await?)
    }
}

/// Whether `spec`'s containers ask only what `pool` allows of a host's security (a user of
/// their choosing, privileges, capabilities that reach past the container): a `422` naming
/// the container's field otherwise. Checked on create and deploy, and again for every task
/// a sync would send (a rollback, a pool made stricter, a definition stored before).
pub(crate) fn allowed_in_pool(
    spec: &tessera_model::taskdef::TaskDefinitionSpec,
    pool: &PoolInfo,
) -> Result<(), ControlError> {
    let errors: Vec<_> = spec
        .containers
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            c.security()
                .refused_by(pool.task_users, pool.privileged)
                .into_iter()
                .map(move |(field, message)| tessera_model::taskdef::FieldError {
                    field: format!("task_definition.containers[{i}].{field}"),
                    message: format!("{message} (pool {})", pool.name),
                })
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ControlError::Invalid(
            tessera_model::taskdef::ValidationErrors { errors },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pass_that_panics_or_fails_is_reported_and_the_caller_goes_on() {
        let panicked = supervised(async { panic!("boom in a pass") }).await;
        assert_eq!(panicked, Err("panicked: boom in a pass".to_owned()));
        let failed = supervised(async { Err(ControlError::Conflict("busy".into())) }).await;
        assert_eq!(failed, Err("busy".to_owned()));
        assert_eq!(supervised(async { Ok(()) }).await, Ok(()));
    }
}
