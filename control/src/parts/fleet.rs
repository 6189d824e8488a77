//! The fleet read model: every host with its GPUs' figures and the tasks placed on it, and
//! every task waiting for a placement, kept in memory and brought up to date from the rows
//! changed since the last reading (change marks kept by the database's triggers; see
//! [`crate::store::FleetStore`]). `/metrics`, the overview, the projects' figures and the
//! endpoint lists read it instead of every task and host on each request.
//!
//! Each reading costs what changed since the one before: a few small queries when nothing
//! did. A reader that asks after its own write sees it (a reading starts after the reader
//! asked, or the reader starts one); readers that come together share one reading.
//! Readings publish an immutable [`FleetSnapshot`]: hosts are shared between snapshots,
//! and only those whose rows or tasks changed are built again.

use crate::capacity::{Held, PoolCapacity};
use crate::error::StoreError;
use crate::store::FleetStore;
use parking_lot::RwLock;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_model::service::{Measured, Task, TaskState};
use tessera_model::{HostId, HostInfo, MiB, PoolInfo, PoolName, SharingMode};
use tessera_placement::GpuUsage;

/// The fleet as of one reading.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetSnapshot {
    /// Every host by id.
    hosts: BTreeMap<HostId, Arc<HostBlock>>,
    /// Tasks waiting for a placement, by id.
    pending: Arc<BTreeMap<String, Arc<Task>>>,
}

/// One host as the model shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBlock {
    /// The host, each GPU's sharing mode as its allocations make it now. Its `last_seen`
    /// is left out (written on every sync; the model's readers do not show it).
    pub host: HostInfo,
    /// Figures of `host.gpus`, in the same order.
    pub gpus: Vec<GpuFigures>,
    /// Tasks placed on it and not stopped, by id. Their measured `work` is left out
    /// (the work pages read it; a change of it alone is not a change of the model).
    pub tasks: Vec<Arc<Task>>,
}

/// One GPU's figures, counted by [`crate::capacity`] as the scheduler counts them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuFigures {
    /// How full it is; `None` when its host's pool is unknown or the GPU is in no
    /// snapshot of it.
    pub usage: Option<GpuUsage>,
    /// The measured peaks of the tasks holding it, summed (`None`: none measured).
    pub measured: Option<MiB>,
}

impl FleetSnapshot {
    /// Every host, by id.
    pub fn hosts(&self) -> impl ExactSizeIterator<Item = &HostBlock> + Clone {
        self.hosts.values().map(|b| &**b)
    }

    /// The hosts after `after` (all of them when `None`), by id.
    pub fn hosts_after(&self, after: Option<&HostId>) -> impl Iterator<Item = &HostBlock> {
        use std::ops::Bound;
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.hosts
            .range::<HostId, _>((lower, Bound::Unbounded))
            .map(|(_, b)| &**b)
    }

    /// Host `id`, if there is one.
    pub fn host(&self, id: &HostId) -> Option<&HostBlock> {
        self.hosts.get(id).map(|b| &**b)
    }

    /// Tasks waiting for a placement, by id.
    pub fn pending(&self) -> impl ExactSizeIterator<Item = &Task> + Clone {
        self.pending.values().map(|t| &**t)
    }

    /// Tasks placed on a host and not stopped (host by host, each host's by id).
    pub fn placed(&self) -> impl Iterator<Item = &Task> + Clone {
        self.hosts().flat_map(|b| b.tasks.iter().map(|t| &**t))
    }

    /// Tasks holding capacity (assigned, running or stopping).
    pub fn holding(&self) -> impl Iterator<Item = &Task> + Clone {
        self.placed().filter(|t| t.state.holds_capacity())
    }
}

impl HostBlock {
    /// `host` with `tasks` (those placed on it), its GPUs' figures counted under `pool`.
    fn build(pool: Option<&PoolInfo>, host: &HostInfo, tasks: Vec<Arc<Task>>) -> HostBlock {
        let capacity = pool.map(|p| {
            PoolCapacity::build(
                p,
                std::slice::from_ref(host),
                tasks.iter().filter_map(|t| Held::of(t)),
            )
        });
        let mut host = host.clone();
        let gpus = host
            .gpus
            .iter_mut()
            .map(|g| {
                let usage = capacity.as_ref().and_then(|c| c.gpu_usage(&g.uuid));
                g.sharing_mode = usage.map_or(SharingMode::Idle, |u| u.mode);
                let peaks = tasks
                    .iter()
                    .filter(|t| t.state.holds_capacity())
                    .filter(|t| t.allocations.iter().any(|a| a.gpu == g.uuid))
                    .filter_map(|t| t.measured.gpu_memory_peak);
                GpuFigures {
                    usage,
                    measured: peaks.reduce(|a, b| a + b),
                }
            })
            .collect();
        HostBlock { host, gpus, tasks }
    }
}

/// What a reading works on, behind the reading lock: the model's own copy of every row it
/// read, from which snapshots are published.
struct Rows {
    /// Where the next reading starts.
    next: i64,
    /// When the last reading started (a reader that asked before it needs none).
    started: Option<Instant>,
    /// When the last reading of every placed task's measured figures started.
    measured_at: Option<Instant>,
    pools: HashMap<PoolName, PoolInfo>,
    hosts: HashMap<HostId, HostInfo>,
    /// Tasks placed on each host (hosts not read yet included), by id.
    on_host: HashMap<HostId, BTreeMap<String, Arc<Task>>>,
    /// Where each task not stopped is: its host, or `None` while pending.
    place: HashMap<String, Option<HostId>>,
    pending: BTreeMap<String, Arc<Task>>,
}

impl Default for Rows {
    fn default() -> Self {
        Rows {
            next: crate::store::FLEET_FROM_START,
            started: None,
            measured_at: None,
            pools: HashMap::new(),
            hosts: HashMap::new(),
            on_host: HashMap::new(),
            place: HashMap::new(),
            pending: BTreeMap::new(),
        }
    }
}

/// What a reading changed: the hosts whose blocks are built again, and whether the
/// pending tasks changed.
#[derive(Default)]
struct Dirty {
    hosts: BTreeSet<HostId>,
    pending: bool,
}

impl Rows {
    /// Takes every pool as read: a pool's limits count in each of its hosts' figures, so
    /// when they changed all are built again.
    fn take_pools(&mut self, pools: Vec<PoolInfo>, dirty: &mut Dirty) {
        let pools: HashMap<PoolName, PoolInfo> =
            pools.into_iter().map(|p| (p.name.clone(), p)).collect();
        if pools != self.pools {
            dirty.hosts.extend(self.hosts.keys().cloned());
            self.pools = pools;
        }
    }

    /// Moves a changed task out of where it was and into where it is now.
    fn take_task(&mut self, mut task: Task, dirty: &mut Dirty) {
        task.measured.work = None;
        match self.place.remove(&task.id) {
            Some(Some(host)) => {
                if let Some(tasks) = self.on_host.get_mut(&host) {
                    tasks.remove(&task.id);
                }
                dirty.hosts.insert(host);
            }
            Some(None) => {
                self.pending.remove(&task.id);
                dirty.pending = true;
            }
            None => {}
        }
        match (task.state, task.host.clone()) {
            (TaskState::Stopped, _) => {}
            (TaskState::Pending, _) | (_, None) => {
                self.place.insert(task.id.clone(), None);
                self.pending.insert(task.id.clone(), Arc::new(task));
                dirty.pending = true;
            }
            (_, Some(host)) => {
                self.place.insert(task.id.clone(), Some(host.clone()));
                self.on_host
                    .entry(host.clone())
                    .or_default()
                    .insert(task.id.clone(), Arc::new(task));
                dirty.hosts.insert(host);
            }
        }
    }

    /// Takes what was measured of placed task `id` (its peak GPU memory and SM use).
    fn take_measured(&mut self, id: &str, measured: Measured, dirty: &mut Dirty) {
        let Some(Some(host)) = self.place.get(id) else {
            return;
        };
        let Some(task) = self
            .on_host
            .get_mut(host)
            .and_then(|tasks| tasks.get_mut(id))
        else {
            return;
        };
        if task.measured.gpu_memory_peak != measured.gpu_memory_peak
            || task.measured.sm_percent != measured.sm_percent
        {
            let t = Arc::make_mut(task);
            t.measured.gpu_memory_peak = measured.gpu_memory_peak;
            t.measured.sm_percent = measured.sm_percent;
            dirty.hosts.insert(host.clone());
        }
    }

    /// The snapshot after `before` with the `dirty` hosts' blocks built again from the
    /// rows (and the pending tasks, if they changed).
    fn publish(&self, before: &FleetSnapshot, dirty: Dirty) -> FleetSnapshot {
        let mut snapshot = FleetSnapshot {
            hosts: before.hosts.clone(),
            pending: if dirty.pending {
                Arc::new(self.pending.clone())
            } else {
                before.pending.clone()
            },
        };
        for id in dirty.hosts {
            match self.hosts.get(&id) {
                Some(host) => {
                    let tasks = self
                        .on_host
                        .get(&id)
                        .map(|t| t.values().cloned().collect())
                        .unwrap_or_default();
                    let block = HostBlock::build(self.pools.get(&host.pool), host, tasks);
                    snapshot.hosts.insert(id, Arc::new(block));
                }
                None => {
                    snapshot.hosts.remove(&id);
                }
            }
        }
        snapshot
    }
}

/// The fleet read model (see the module's documentation).
#[derive(Default)]
pub(crate) struct FleetModel {
    rows: tokio::sync::Mutex<Rows>,
    current: RwLock<Arc<FleetSnapshot>>,
}

impl FleetModel {
    /// Whether anyone has read the model yet (a server whose readers never came keeps
    /// none).
    pub(crate) fn read_before(&self) -> bool {
        self.rows
            .try_lock()
            .map_or(true, |rows| rows.started.is_some())
    }

    /// The fleet as of a reading that started after this call: what the caller wrote
    /// before is in it.
    ///
    /// What was measured of the placed tasks (peak GPU memory, SM use), which no change
    /// mark follows, is read for every one of them when the last such reading is
    /// `measured_every` old or more.
    pub(crate) async fn current(
        &self,
        store: &dyn FleetStore,
        measured_every: Duration,
    ) -> Result<Arc<FleetSnapshot>, StoreError> {
        let asked = Instant::now();
        let mut rows = self.rows.lock().await;
        if rows.started.is_some_and(|started| started >= asked) {
            return Ok(self.current.read().clone());
        }
        let started = Instant::now();
        let changes = store.fleet_changes(rows.next).await?;
        // A first reading has every task's figures in its rows.
        let measured_due = rows
            .measured_at
            .is_some_and(|at| at.elapsed() >= measured_every);
        let measured = if measured_due {
            Some(store.measured_figures().await?)
        } else {
            None
        };
        // Hosts deleted leave no row to read: when the count says some are gone, which.
        // Asked before anything is changed, so a failed reading changes nothing.
        let new_hosts = changes
            .hosts
            .iter()
            .filter(|h| !rows.hosts.contains_key(&h.id))
            .count();
        let gone: Vec<HostId> = if changes.host_count != (rows.hosts.len() + new_hosts) as u64 {
            let ids: std::collections::HashSet<HostId> =
                store.host_ids().await?.into_iter().collect();
            rows.hosts
                .keys()
                .chain(changes.hosts.iter().map(|h| &h.id))
                .filter(|id| !ids.contains(*id))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        rows.started = Some(started);
        if measured_due || rows.measured_at.is_none() {
            rows.measured_at = Some(started);
        }
        let mut dirty = Dirty::default();
        rows.take_pools(changes.pools, &mut dirty);
        for mut host in changes.hosts {
            host.last_seen = None;
            dirty.hosts.insert(host.id.clone());
            rows.hosts.insert(host.id.clone(), host);
        }
        for task in changes.tasks {
            rows.take_task(task, &mut dirty);
        }
        for id in gone {
            rows.hosts.remove(&id);
            dirty.hosts.insert(id);
        }
        for (id, measured) in measured.into_iter().flatten() {
            rows.take_measured(&id, measured, &mut dirty);
        }
        rows.next = changes.next;
        if dirty.hosts.is_empty() && !dirty.pending {
            return Ok(self.current.read().clone());
        }
        let before = self.current.read().clone();
        let snapshot = rows.publish(&before, dirty);
        let snapshot = Arc::new(snapshot);
        *self.current.write() = snapshot.clone();
        Ok(snapshot)
    }
}
