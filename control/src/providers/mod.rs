//! `Providers`: pools' capacity providers. Each reconcile pass (on the scheduler lease's
//! holder, its writes fenced) asks the scheduler how many more hosts of a provider's shape
//! would place the tasks that wait (`Scheduler::size_waiting`), decides with [`plan`]
//! (pure) what to launch, give up on and scale in, records every machine asked for in the
//! store before asking (so a restart or a handover neither asks twice nor forgets one),
//! and has the pool's provider make or remove machines ([`Machines`]). Every decision is
//! an event with its reason. [`command`] is the provider that runs an operator's
//! executable.

pub mod command;
mod plan;

use crate::clock::stamp;
use crate::error::ControlError;
use crate::parts::Core;
use crate::projects::pool_capacity;
use crate::scheduler::Scheduler;
use crate::store::{ProvidersStore, TaskFilter};
use async_trait::async_trait;
use parking_lot::Mutex;
use plan::{Booting, HostNow, PoolNow, Step};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use tessera_model::notify::NoticeKind;
use tessera_model::project::Usage;
use tessera_model::provider::{HostShape, Machine, MachineState, Provider, ProviderKind};
use tessera_model::service::TaskState;
use tessera_model::time::Timestamp;
use tessera_model::{HostId, HostInfo, HostStatus, PoolInfo, PoolName};

/// What makes and removes one kind of provider's machines: the AWS Auto Scaling API, an
/// operator's command, the demo's simulated hosts. Errors are said in words (they become
/// events).
#[async_trait]
pub trait Machines: Send + Sync {
    /// Makes one machine for each of `names` (Tessera's names for them) in `pool`; the
    /// provider's id of each, by name, as far as it knows them now (the demo's hosts are
    /// named so; an Auto Scaling group's instances are matched later).
    async fn launch(
        &self,
        pool: &PoolName,
        provider: &Provider,
        names: &[String],
    ) -> Result<BTreeMap<String, String>, String>;
    /// Removes machine `provider_id` (or, while the provider never said its id, the one
    /// named `name`).
    async fn terminate(
        &self,
        pool: &PoolName,
        provider: &Provider,
        name: &str,
        provider_id: Option<&str>,
    ) -> Result<(), String>;

    /// The machines the provider has for `pool` now, read back to reconcile with (an Auto
    /// Scaling group's instances); `None` where the provider cannot say.
    async fn fleet(&self, _pool: &PoolName, _provider: &Provider) -> Result<Option<Fleet>, String> {
        Ok(None)
    }

    /// Keeps the provider from removing machines `ids` on its own (`protected`), or lets
    /// it again: a host running tasks is protected (as ECS's managed termination
    /// protection). Providers that never remove machines on their own need nothing.
    async fn protect(
        &self,
        _pool: &PoolName,
        _provider: &Provider,
        _ids: &[String],
        _protected: bool,
    ) -> Result<(), String> {
        Ok(())
    }
}

/// A provider's machines as it reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fleet {
    /// How many machines the provider is asked to keep.
    pub desired: u32,
    pub instances: Vec<Instance>,
}

/// One of a provider's machines as it reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// The provider's id (an EC2 instance id).
    pub id: String,
    /// Its lifecycle in the provider's words (`Pending`, `InService`, `Terminating`).
    pub state: String,
    /// Kept from the provider's own scale-in.
    pub protected: bool,
}

/// What a pool's provider remembers between passes on this server (a new lease holder
/// starts afresh: hosts' empty time again, which only delays a scale-in).
#[derive(Debug, Default)]
struct PoolMemory {
    /// Since when each host has held no task.
    empty_since: HashMap<HostId, Timestamp>,
    /// Since when each host has been impaired or lost.
    bad_since: HashMap<HostId, Timestamp>,
    /// Launches failed in a row, and when the last one failed.
    failures: (u32, Option<Timestamp>),
    /// What was last said without acting (said again only when it changes).
    said: Option<String>,
    /// The provider's machines as last read, and when.
    fleet: Option<(std::time::Instant, Fleet)>,
    /// Provider calls still running after a pass stopped waiting for them: `launch`, or
    /// the machine a call ends. No second call is made for the same while one runs.
    in_flight: HashSet<String>,
    /// Hosts a consolidation plan is emptying because they were not needed: since when,
    /// and when that was said. Once empty, they count as empty since then.
    unneeded: HashMap<HostId, (Timestamp, Timestamp)>,
}

/// How long a pass waits for one provider call before it goes on without it (the call
/// runs on; its result is written when it ends): a slow or hung provider delays its own
/// pool's next steps, never the scheduling of the fleet.
const CALL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// The most a pass waits to read a provider's machines back.
const FLEET_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often a provider's machines are read back (and after each change it made).
const FLEET_EVERY: std::time::Duration = std::time::Duration::from_secs(15);
/// How long a joined machine may be missing from its provider's list before it is said.
const MISSING_AFTER_SECS: u64 = 60;
/// How long what consolidation said of a host it empties holds (a plan that halts leaves
/// it busy).
const UNNEEDED_KEPT_SECS: u64 = 3600;

/// Pools' capacity providers (see the module's documentation).
#[derive(Clone)]
pub struct Providers {
    store: Arc<dyn ProvidersStore>,
    core: Core,
    /// Asked how many hosts would place the waiting tasks.
    scheduler: Scheduler,
    /// The machines of each kind of provider, as the server registered them.
    drivers: Arc<Mutex<HashMap<ProviderKind, Arc<dyn Machines>>>>,
    /// Each pool's memory between passes.
    memory: Arc<Mutex<HashMap<PoolName, PoolMemory>>>,
}

/// Machines kept in the store's answer: live ones and the last that ended.
const MACHINES_LISTED: u32 = 1000;

impl Providers {
    /// Tells on-call people a pool's provider failed (a launch, a termination, a machine
    /// given up on): an event, and a notice to the webhooks that want it.
    async fn provider_failed(&self, pool: &PoolName, said: &str) {
        self.core
            .notify(
                NoticeKind::ProviderFailed,
                (None, None, Some(pool.as_str())),
                said,
            )
            .await;
    }

    pub(crate) fn new(store: Arc<dyn ProvidersStore>, core: Core, scheduler: Scheduler) -> Self {
        Providers {
            store,
            core,
            scheduler,
            drivers: Arc::default(),
            memory: Arc::default(),
        }
    }

    /// The same, writing through `store` (a pass's fenced store); drivers and memory shared.
    pub(crate) fn with_store(
        &self,
        store: Arc<dyn ProvidersStore>,
        core: Core,
        scheduler: Scheduler,
    ) -> Self {
        Providers {
            store,
            core,
            scheduler,
            drivers: self.drivers.clone(),
            memory: self.memory.clone(),
        }
    }

    /// Has `machines` make and remove the machines of providers of `kind`.
    pub fn register(&self, kind: ProviderKind, machines: Arc<dyn Machines>) {
        self.drivers.lock().insert(kind, machines);
    }

    /// A pool's machines (every pool's with `None`): live ones, and with `ended` the last
    /// that ended too.
    pub async fn machines(
        &self,
        pool: Option<&PoolName>,
        ended: bool,
    ) -> Result<Vec<Machine>, ControlError> {
        Ok(self
            .store
            .list_machines(pool, ended, MACHINES_LISTED)
            .await?)
    }

    /// Says that consolidation is emptying `hosts` of `pool` because they have not been
    /// needed since `since`: once empty, each counts as empty since then (its scale-in
    /// cooldown was spent while it was freeable, and is not waited for twice).
    pub(crate) fn emptying_unneeded(&self, pool: &PoolName, hosts: &[HostId], since: Timestamp) {
        let said = self.now();
        let mut memory = self.memory.lock();
        let mem = memory.entry(pool.clone()).or_default();
        for h in hosts {
            mem.unneeded.insert(h.clone(), (since, said));
        }
    }

    /// The fleet's time now (what machines' times are read against).
    pub fn now(&self) -> Timestamp {
        Timestamp::from_utc(self.core.now())
    }

    /// One pass over every pool with a provider. A pool whose provider fails is said in an
    /// event and the others go on.
    pub(crate) async fn pass(&self) -> Result<(), ControlError> {
        let pools: Vec<PoolInfo> = self
            .store
            .list_pools()
            .await?
            .into_iter()
            .filter(|p| p.provider.is_some())
            .collect();
        if pools.is_empty() {
            return Ok(());
        }
        let hosts = self.store.list_hosts().await?;
        for pool in pools {
            if let Err(e) = self.pool_pass(&pool, &hosts).await {
                tracing::warn!(pool = %pool.name, error = %e, "capacity provider pass failed");
                self.say(&pool.name, &format!("capacity provider pass failed: {e}"))
                    .await;
            }
        }
        Ok(())
    }

    async fn pool_pass(&self, pool: &PoolInfo, all: &[HostInfo]) -> Result<(), ControlError> {
        let provider = pool.provider.as_ref().expect("filtered");
        let hosts: Vec<&HostInfo> = all.iter().filter(|h| h.pool == pool.name).collect();
        let shape = provider.shape.clone().or_else(|| learnt_shape(&hosts));
        let now = self.core.now();
        let at = Timestamp::from_utc(now);
        let fleet = self.read_fleet(pool, provider).await;
        if let Some(fleet) = &fleet {
            self.adopt_instances(pool, &hosts, fleet, at).await?;
        }
        let machines = self
            .store
            .list_machines(Some(&pool.name), false, MACHINES_LISTED)
            .await?;
        let held = self.tasks_by_host(&pool.name).await?;
        let have = hosts.len() as u32
            + machines
                .iter()
                .filter(|m| m.state == MachineState::Booting)
                .count() as u32;
        let waiting = match &shape {
            Some(shape) => self
                .scheduler
                .size_waiting(
                    &pool.name,
                    shape,
                    provider.max_hosts.saturating_sub(have).max(1),
                )
                .await?
                .map(|w| (w.describe(), w.sizing)),
            None => None,
        };
        let since_scale_out = machines
            .iter()
            .map(|m| m.asked_at)
            .chain(self.last_launch(&pool.name).await?)
            .max()
            .map(|t| secs_between(t, at));
        let (hosts_now, failed_launches) = self.remember(&pool.name, &hosts, &machines, &held, at);
        let view = PoolNow {
            provider,
            shape: None,
            hosts: hosts_now,
            booting: machines
                .iter()
                .filter(|m| m.state == MachineState::Booting)
                .map(|m| Booting {
                    machine: m.id.clone(),
                    age: secs_between(m.asked_at, at),
                })
                .collect(),
            waiting,
            since_scale_out,
            failed_launches,
            guaranteed: self.guaranteed_in(&pool.name).await?,
        };
        let view = PoolNow {
            shape: shape.as_ref(),
            ..view
        };
        if shape.is_none() && view.waiting.is_none() && view.hosts.is_empty() {
            self.say(
                &pool.name,
                "the provider has no host shape and the pool no host to learn it from: give provider.shape",
            )
            .await;
        }
        let steps = plan::plan(&view);
        if let Some(fleet) = &fleet {
            self.reconcile_fleet(pool, provider, &hosts, &machines, &held, fleet, at)
                .await;
        }
        let machines = Arc::new(machines);
        for step in steps {
            self.run_step(pool, &machines, step).await?;
        }
        Ok(())
    }

    /// The provider's machines that no host or machine of the pool is yet (an Auto Scaling
    /// group names its instances only once they run, and has instances of its own before
    /// the pool has a provider): each takes the place of a machine asked for whose id the
    /// provider never said (oldest first), and the rest are recorded as machines booting.
    /// So they count as coming capacity (never asked for twice), and one whose host does
    /// not join within the boot timeout is terminated like any other.
    async fn adopt_instances(
        &self,
        pool: &PoolInfo,
        hosts: &[&HostInfo],
        fleet: &Fleet,
        at: Timestamp,
    ) -> Result<(), ControlError> {
        let machines = self
            .store
            .list_machines(Some(&pool.name), false, MACHINES_LISTED)
            .await?;
        let mut unclaimed = unclaimed(fleet, hosts, &machines).into_iter();
        // Newest first in the store's answer: the oldest take ids first.
        for m in machines
            .iter()
            .rev()
            .filter(|m| m.state == MachineState::Booting && m.provider_id.is_none())
        {
            let Some(id) = unclaimed.next() else {
                return Ok(());
            };
            self.store.set_machine_provider_id(&m.id, &id).await?;
        }
        let rows: Vec<Machine> = unclaimed
            .map(|id| Machine {
                id: format!("m-{}-{}", pool.name, &uuid::Uuid::new_v4().simple().to_string()[..8]),
                pool: pool.name.clone(),
                reason: format!("the provider has {id}, which Tessera did not ask for: waiting for its host to join"),
                provider_id: Some(id),
                host_id: None,
                state: MachineState::Booting,
                asked_at: at,
                joined_at: None,
                ended_at: None,
            })
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        self.store.add_machines(&rows).await?;
        let ids: Vec<&str> = rows
            .iter()
            .filter_map(|m| m.provider_id.as_deref())
            .collect();
        let said = format!(
            "pool {}: the provider has {} machine(s) no host is yet ({}): counted as booting, terminated unless their hosts join within the boot timeout",
            pool.name,
            ids.len(),
            ids.join(", ")
        );
        self.core.event(None, None, &said).await;
        Ok(())
    }

    /// Carries out `step`, waiting for the provider at most [`CALL_WAIT`]: a call that
    /// takes longer runs on (its result written when it ends) while the pass goes on, and
    /// no second call for the same launch or machine is made meanwhile.
    async fn run_step(
        &self,
        pool: &PoolInfo,
        machines: &Arc<Vec<Machine>>,
        step: Step,
    ) -> Result<(), ControlError> {
        let key = match &step {
            Step::Say(what) => {
                self.say(&pool.name, what).await;
                return Ok(());
            }
            Step::Launch { .. } => "launch".to_owned(),
            Step::Abandon { machine, .. }
            | Step::Replace { machine, .. }
            | Step::ScaleIn { machine, .. } => machine.clone(),
        };
        let Some(guard) = InFlight::take(&self.memory, &pool.name, &key) else {
            return Ok(());
        };
        let (this, pool_now, machines) = (self.clone(), pool.clone(), machines.clone());
        let mut call = tokio::spawn(async move {
            let _guard = guard;
            let done = this.carry_out(&pool_now, &machines, step).await;
            if let Err(e) = &done {
                tracing::warn!(pool = %pool_now.name, error = %e, "a capacity provider step failed");
            }
            done
        });
        match tokio::time::timeout(CALL_WAIT, &mut call).await {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => Err(ControlError::Conflict(format!(
                "a capacity provider step of pool {} failed: {e}",
                pool.name
            ))),
            Err(_) => {
                tracing::info!(pool = %pool.name, step = %key, "the provider is slow; its call runs on while the pass goes on");
                Ok(())
            }
        }
    }

    /// The provider's machines for `pool`, read again when the last reading is older than
    /// [`FLEET_EVERY`] or the provider changed something since. A provider that cannot say
    /// is said in an event, and the pass goes on without.
    async fn read_fleet(&self, pool: &PoolInfo, provider: &Provider) -> Option<Fleet> {
        let driver = self.driver(provider.kind)?;
        let cached = {
            let memory = self.memory.lock();
            memory
                .get(&pool.name)
                .and_then(|m| m.fleet.clone())
                .filter(|(at, _)| at.elapsed() < FLEET_EVERY)
        };
        if let Some((_, fleet)) = cached {
            return Some(fleet);
        }
        let read = tokio::time::timeout(FLEET_WAIT, driver.fleet(&pool.name, provider)).await;
        let read =
            read.unwrap_or_else(|_| Err(format!("no answer within {} s", FLEET_WAIT.as_secs())));
        match read {
            Ok(Some(fleet)) => {
                self.memory
                    .lock()
                    .entry(pool.name.clone())
                    .or_default()
                    .fleet = Some((std::time::Instant::now(), fleet.clone()));
                Some(fleet)
            }
            Ok(None) => None,
            Err(why) => {
                self.say(
                    &pool.name,
                    &format!(
                        "cannot read the {} provider's machines: {why}",
                        provider.kind
                    ),
                )
                .await;
                None
            }
        }
    }

    /// Brings the provider in line with the pool: hosts running tasks protected from its
    /// own scale-in and empty ones not; a joined machine the provider no longer has said.
    #[allow(clippy::too_many_arguments)]
    async fn reconcile_fleet(
        &self,
        pool: &PoolInfo,
        provider: &Provider,
        hosts: &[&HostInfo],
        machines: &[Machine],
        held: &HashMap<HostId, usize>,
        fleet: &Fleet,
        at: Timestamp,
    ) {
        let Some(driver) = self.driver(provider.kind) else {
            return;
        };
        let (mut protect, mut release) = (Vec::new(), Vec::new());
        for h in hosts {
            let Some(i) = h
                .provider_id
                .as_ref()
                .and_then(|id| fleet.instances.iter().find(|i| &i.id == id))
            else {
                continue;
            };
            let busy = held.get(&h.id).copied().unwrap_or(0) > 0;
            if busy && !i.protected {
                protect.push(i.id.clone());
            } else if !busy && i.protected {
                release.push(i.id.clone());
            }
        }
        for (ids, protected) in [(protect, true), (release, false)] {
            if ids.is_empty() {
                continue;
            }
            let call = driver.protect(&pool.name, provider, &ids, protected);
            match tokio::time::timeout(CALL_WAIT, call).await {
                Ok(Ok(())) => {
                    if let Some((_, f)) = &mut self
                        .memory
                        .lock()
                        .entry(pool.name.clone())
                        .or_default()
                        .fleet
                    {
                        for i in f.instances.iter_mut().filter(|i| ids.contains(&i.id)) {
                            i.protected = protected;
                        }
                    }
                    tracing::info!(pool = %pool.name, ?ids, protected, "scale-in protection set");
                }
                Ok(Err(why)) => {
                    let what = if protected { "protect" } else { "unprotect" };
                    self.say(
                        &pool.name,
                        &format!(
                            "the {} provider failed to {what} {}: {why}",
                            provider.kind,
                            ids.join(", ")
                        ),
                    )
                    .await;
                }
                Err(_) => {
                    tracing::warn!(pool = %pool.name, "setting scale-in protection took too long")
                }
            }
        }
        let missing: Vec<String> = machines
            .iter()
            .filter(|m| m.state == MachineState::Active)
            .filter(|m| {
                m.joined_at
                    .is_some_and(|j| secs_between(j, at) >= MISSING_AFTER_SECS)
            })
            .filter_map(|m| m.provider_id.as_ref().map(|id| (m, id)))
            .filter(|(_, id)| !fleet.instances.iter().any(|i| &i.id == *id))
            .map(|(m, id)| {
                format!(
                    "{} ({id}, host {})",
                    m.id,
                    m.host_id.as_ref().map_or("none", |h| h.as_str())
                )
            })
            .collect();
        if !missing.is_empty() {
            self.say(
                &pool.name,
                &format!(
                    "the {} provider no longer has machine(s) {}: ended outside Tessera, or a host said an id that is not its own; such a host is deregistered once lost",
                    provider.kind,
                    missing.join(", ")
                ),
            )
            .await;
        }
    }

    /// The pool's hosts as the plan sees them, with what this server remembers of each
    /// (since when it is empty, impaired or lost), and its failed launches in a row with
    /// seconds since the last.
    fn remember(
        &self,
        pool: &PoolName,
        hosts: &[&HostInfo],
        machines: &[Machine],
        held: &HashMap<HostId, usize>,
        at: Timestamp,
    ) -> (Vec<HostNow>, (u32, Option<u64>)) {
        let mut memory = self.memory.lock();
        let mem = memory.entry(pool.clone()).or_default();
        let now = hosts
            .iter()
            .map(|h| {
                let bad = if matches!(h.status, HostStatus::Impaired | HostStatus::Lost) {
                    Some(*mem.bad_since.entry(h.id.clone()).or_insert(at))
                } else {
                    mem.bad_since.remove(&h.id);
                    None
                };
                let tasks = held.get(&h.id).copied().unwrap_or(0);
                let empty = if tasks == 0 && h.status == HostStatus::Active {
                    let since = mem.unneeded.remove(&h.id).map_or(at, |(since, _)| since);
                    let e = mem.empty_since.entry(h.id.clone()).or_insert(at);
                    *e = (*e).min(since);
                    Some(*e)
                } else {
                    mem.empty_since.remove(&h.id);
                    None
                };
                HostNow {
                    id: h.id.clone(),
                    machine: machines
                        .iter()
                        .find(|m| m.host_id.as_ref() == Some(&h.id))
                        .map(|m| m.id.clone()),
                    tasks,
                    empty_for: empty.map(|e| secs_between(e, at)),
                    status: h.status,
                    bad_for: bad.map(|b| secs_between(b, at)),
                    capacity: pool_capacity(std::iter::once(*h)),
                }
            })
            .collect();
        mem.empty_since
            .retain(|id, _| hosts.iter().any(|h| &h.id == id));
        mem.bad_since
            .retain(|id, _| hosts.iter().any(|h| &h.id == id));
        // A plan that halted leaves its hosts busy: what it said of them lapses.
        mem.unneeded.retain(|id, (_, said)| {
            hosts.iter().any(|h| &h.id == id) && secs_between(*said, at) < UNNEEDED_KEPT_SECS
        });
        let failed = (mem.failures.0, mem.failures.1.map(|t| secs_between(t, at)));
        (now, failed)
    }

    /// What projects are guaranteed in `pool`, all together.
    async fn guaranteed_in(&self, pool: &PoolName) -> Result<Usage, ControlError> {
        Ok(self
            .store
            .list_projects()
            .await?
            .iter()
            .filter_map(|p| p.quota(pool.as_str()))
            .fold(Usage::default(), |sum, q| sum.plus(&q.guaranteed.or_zero())))
    }

    /// Tasks holding capacity in `pool`, by host.
    async fn tasks_by_host(&self, pool: &PoolName) -> Result<HashMap<HostId, usize>, ControlError> {
        let tasks = self
            .store
            .list_tasks(&TaskFilter {
                pool: Some(pool.clone()),
                states: TaskState::HOLDING.to_vec(),
                ..Default::default()
            })
            .await?;
        let mut by_host = HashMap::new();
        for t in tasks {
            if let Some(h) = t.host {
                *by_host.entry(h).or_insert(0) += 1;
            }
        }
        Ok(by_host)
    }

    /// When the pool's last machine was asked for, ended ones included.
    async fn last_launch(&self, pool: &PoolName) -> Result<Option<Timestamp>, ControlError> {
        Ok(self
            .store
            .list_machines(Some(pool), true, 1)
            .await?
            .first()
            .map(|m| m.asked_at))
    }

    async fn carry_out(
        &self,
        pool: &PoolInfo,
        machines: &[Machine],
        step: Step,
    ) -> Result<(), ControlError> {
        let provider = pool.provider.as_ref().expect("a pool with a provider");
        match step {
            Step::Launch { count, reason } => self.launch(pool, provider, count, &reason).await,
            Step::Abandon { machine, reason } => {
                let m = machines.iter().find(|m| m.id == machine);
                self.end_machine(
                    pool,
                    provider,
                    &machine,
                    m.and_then(|m| m.provider_id.as_deref()),
                    MachineState::Booting,
                    MachineState::Failed,
                    &reason,
                )
                .await?;
                self.failed_launch(&pool.name);
                Ok(())
            }
            Step::ScaleIn {
                host,
                machine,
                reason,
            } => {
                self.scale_in(pool, provider, machines, &host, &machine, &reason)
                    .await
            }
            Step::Replace {
                host,
                machine,
                reason,
            } => {
                self.retire(pool, provider, machines, &host, &machine, &reason)
                    .await
            }
            Step::Say(what) => {
                self.say(&pool.name, &what).await;
                Ok(())
            }
        }
    }

    async fn launch(
        &self,
        pool: &PoolInfo,
        provider: &Provider,
        count: u32,
        reason: &str,
    ) -> Result<(), ControlError> {
        let Some(driver) = self.driver(provider.kind) else {
            self.say(
                &pool.name,
                &format!(
                    "cannot launch: this server has no {} provider ({reason})",
                    provider.kind
                ),
            )
            .await;
            return Ok(());
        };
        let at = Timestamp::from_utc(self.core.now());
        let names: Vec<String> = (0..count)
            .map(|_| {
                format!(
                    "m-{}-{}",
                    pool.name,
                    &uuid::Uuid::new_v4().simple().to_string()[..8]
                )
            })
            .collect();
        // In the store first: a crash after the provider acted leaves a machine that is
        // known (and given up on after its boot timeout), never one forgotten.
        let rows: Vec<Machine> = names
            .iter()
            .map(|id| Machine {
                id: id.clone(),
                pool: pool.name.clone(),
                provider_id: None,
                host_id: None,
                state: MachineState::Booting,
                reason: reason.to_owned(),
                asked_at: at,
                joined_at: None,
                ended_at: None,
            })
            .collect();
        self.store.add_machines(&rows).await?;
        let said = format!(
            "pool {}: asked the {} provider for {count} host(s): {reason}",
            pool.name, provider.kind
        );
        self.core.event(None, None, &said).await;
        match driver.launch(&pool.name, provider, &names).await {
            Ok(ids) => {
                for (name, id) in ids {
                    if names.contains(&name) {
                        self.store.set_machine_provider_id(&name, &id).await?;
                    }
                }
                self.memory
                    .lock()
                    .entry(pool.name.clone())
                    .or_default()
                    .failures = (0, None);
            }
            Err(why) => {
                for name in &names {
                    self.store
                        .set_machine_state(
                            name,
                            MachineState::Booting,
                            MachineState::Failed,
                            &format!("the provider refused: {why}"),
                            &stamp(self.core.now()),
                        )
                        .await?;
                }
                self.failed_launch(&pool.name);
                let said = format!(
                    "pool {}: the {} provider failed to launch: {why}",
                    pool.name, provider.kind
                );
                self.provider_failed(&pool.name, &said).await;
            }
        }
        Ok(())
    }

    /// An empty host goes: drained first (no task is placed on it meanwhile), its machine
    /// terminated, then deregistered.
    async fn scale_in(
        &self,
        pool: &PoolInfo,
        provider: &Provider,
        machines: &[Machine],
        host: &HostId,
        machine: &str,
        reason: &str,
    ) -> Result<(), ControlError> {
        if !self
            .store
            .set_host_status_if(
                host,
                HostStatus::Active,
                HostStatus::Draining,
                Some("scaling in: empty"),
            )
            .await?
        {
            return Ok(());
        }
        self.scheduler.capacity_changed();
        // A task placed between the plan and the drain keeps the host.
        let still = self
            .tasks_by_host(&pool.name)
            .await?
            .get(host)
            .copied()
            .unwrap_or(0);
        if still > 0 {
            self.store
                .set_host_status_if(host, HostStatus::Draining, HostStatus::Active, None)
                .await?;
            return Ok(());
        }
        self.retire(pool, provider, machines, host, machine, reason)
            .await
    }

    /// A host goes (empty and drained, impaired with its tasks moved off, or lost): its
    /// machine terminated, the host deregistered. What the pool still needs is asked for by
    /// the next pass (its tasks, `min_hosts`).
    async fn retire(
        &self,
        pool: &PoolInfo,
        provider: &Provider,
        machines: &[Machine],
        host: &HostId,
        machine: &str,
        reason: &str,
    ) -> Result<(), ControlError> {
        let provider_id = machines
            .iter()
            .find(|m| m.id == machine)
            .and_then(|m| m.provider_id.as_deref());
        if !self
            .end_machine(
                pool,
                provider,
                machine,
                provider_id,
                MachineState::Active,
                MachineState::Terminated,
                reason,
            )
            .await?
        {
            return Ok(());
        }
        // A lost host's tasks were stopped with it; an impaired or empty one's moved off.
        if let Err(e) = self.store.delete_host(host).await {
            tracing::warn!(host = %host, error = %e, "a terminated host could not be deregistered");
        }
        self.memory
            .lock()
            .entry(pool.name.clone())
            .or_default()
            .empty_since
            .remove(host);
        self.scheduler.capacity_changed();
        let said = format!("host {host} terminated and deregistered: {reason}");
        self.core.event(None, Some(host), &said).await;
        Ok(())
    }

    /// Has the provider remove machine `name` and records it `to` (from `from`). Whether
    /// the provider did; a refusal is said and the machine kept as it was.
    #[allow(clippy::too_many_arguments)]
    async fn end_machine(
        &self,
        pool: &PoolInfo,
        provider: &Provider,
        name: &str,
        provider_id: Option<&str>,
        from: MachineState,
        to: MachineState,
        reason: &str,
    ) -> Result<bool, ControlError> {
        let Some(driver) = self.driver(provider.kind) else {
            self.say(
                &pool.name,
                &format!(
                    "cannot terminate {name}: this server has no {} provider",
                    provider.kind
                ),
            )
            .await;
            return Ok(false);
        };
        if let Err(why) = driver
            .terminate(&pool.name, provider, name, provider_id)
            .await
        {
            let said = format!(
                "pool {}: the {} provider failed to terminate {name}: {why}",
                pool.name, provider.kind
            );
            self.provider_failed(&pool.name, &said).await;
            return Ok(false);
        }
        self.store
            .set_machine_state(name, from, to, reason, &stamp(self.core.now()))
            .await?;
        if to == MachineState::Failed {
            let said = format!("pool {}: {reason}; terminated", pool.name);
            self.provider_failed(&pool.name, &said).await;
        }
        Ok(true)
    }

    fn driver(&self, kind: ProviderKind) -> Option<Arc<dyn Machines>> {
        self.drivers.lock().get(&kind).cloned()
    }

    fn failed_launch(&self, pool: &PoolName) {
        let at = Timestamp::from_utc(self.core.now());
        let mut memory = self.memory.lock();
        let f = &mut memory.entry(pool.clone()).or_default().failures;
        *f = (f.0 + 1, Some(at));
    }

    /// Says `what` of `pool` in an event, once until it changes.
    async fn say(&self, pool: &PoolName, what: &str) {
        let new = {
            let mut memory = self.memory.lock();
            let said = &mut memory.entry(pool.clone()).or_default().said;
            let new = said.as_deref() != Some(what);
            *said = Some(what.to_owned());
            new
        };
        if new {
            self.core
                .event(None, None, &format!("pool {pool}: {what}"))
                .await;
        }
    }
}

/// Takes a provider call's place in its pool's memory; gives it back when dropped (the call
/// ended, failed or panicked).
struct InFlight {
    memory: Arc<Mutex<HashMap<PoolName, PoolMemory>>>,
    pool: PoolName,
    key: String,
}

impl InFlight {
    /// `None` while a call for the same runs.
    fn take(
        memory: &Arc<Mutex<HashMap<PoolName, PoolMemory>>>,
        pool: &PoolName,
        key: &str,
    ) -> Option<InFlight> {
        let mut m = memory.lock();
        m.entry(pool.clone())
            .or_default()
            .in_flight
            .insert(key.to_owned())
            .then(|| InFlight {
                memory: memory.clone(),
                pool: pool.clone(),
                key: key.to_owned(),
            })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut m = self.memory.lock();
        let mem = m.entry(self.pool.clone()).or_default();
        mem.in_flight.remove(&self.key);
        // The provider changed: read its machines again.
        mem.fleet = None;
    }
}

/// The provider's machines (not on their way out) that no host or machine of the pool is.
fn unclaimed(fleet: &Fleet, hosts: &[&HostInfo], machines: &[Machine]) -> Vec<String> {
    fleet
        .instances
        .iter()
        .filter(|i| !i.state.starts_with("Terminat"))
        .filter(|i| !hosts.iter().any(|h| h.provider_id.as_ref() == Some(&i.id)))
        .filter(|i| {
            !machines
                .iter()
                .any(|m| m.provider_id.as_ref() == Some(&i.id))
        })
        .map(|i| i.id.clone())
        .collect()
}

/// The shape of the pool's hosts, when they agree on one (the first host's otherwise).
fn learnt_shape(hosts: &[&HostInfo]) -> Option<HostShape> {
    let h = hosts.iter().find(|h| !h.gpus.is_empty())?;
    let g = &h.gpus[0];
    Some(HostShape {
        gpu_model: g.model.clone(),
        gpus: h.gpus.len() as u32,
        gpu_memory_mib: g.memory.0,
        cpu_milli: h.cpu.0,
        memory_mib: h.memory.0,
    })
}

fn secs_between(earlier: Timestamp, later: Timestamp) -> u64 {
    u64::try_from(later.millis_since(earlier) / 1000).unwrap_or(0)
}
