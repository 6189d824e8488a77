//! The autoscaling benchmark: a task list with creation and deletion times replayed
//! against a provider of the trace's node types (each launch joins after a boot delay),
//! under several scaling rules in one run, against the lower bound. What each provisioned
//! is GPU-hours: every node's GPUs from its launch request to its termination, booting
//! included (it is paid). Each task runs for its trace duration from when it is placed, so
//! every rule serves the same work; time waiting for room is reported.
//!
//! - [`fleet`]: the simulated cluster (nodes, the engine over the ready ones, where tasks
//!   run, what waits, what was paid).
//! - [`sim`]: the pass loop and the [`sim::Rule`] a scaling rule implements.
//! - [`lower`]: the lower bound (the fewest GPUs that hold the live tasks, at each instant).
//! - [`tessera`]: Tessera's capacity-provider rule, sized by the engine's what-if sizing.
//! - [`consolidation`]: the consolidation the control plane runs in pools with a provider
//!   (`control/src/deployments/consolidate/auto.rs`), freeing hosts whose tasks fit
//!   elsewhere; the `tessera-no-consolidation` row runs the rule without it.
//! - [`ca`]: a cluster-autoscaler-like rule.

pub mod ca;
pub mod consolidation;
pub mod fleet;
pub mod lower;
pub mod sim;
pub mod tessera;
#[cfg(test)]
mod tests;

use crate::openb::TraceTask;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use tessera_model::provider::{MAX_HOSTS, Provider, ProviderInput, validate};
use tessera_placement::{
    DemandProfile, Engine, GpuDemand, HostSpec, Policy, PoolLimits, Snapshot, TaskRequest,
};

/// One kind of node the provider can launch: a shape of the trace's GPU nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeType {
    /// A host of the type (its id is the type's).
    pub shape: HostSpec,
    pub model: String,
    pub gpus: u32,
    /// How many nodes of the trace have it.
    pub in_trace: usize,
}

impl NodeType {
    /// "8×G2 96c 384G".
    pub fn label(&self) -> String {
        format!(
            "{}×{} {}c {}G",
            self.gpus,
            self.model,
            self.shape.cpu.0 / 1000,
            self.shape.memory.0 / 1024
        )
    }
}

/// Which node type a scale-out takes among those that place as much with as few GPUs:
/// the same for every rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeChoice {
    /// The smallest (least CPU, then memory): Cluster Autoscaler's least-waste expander.
    Smallest,
    /// The most CPU, then memory, per GPU: the least GPU share stranded when a host's CPU
    /// or memory runs out first.
    Roomy,
}

impl NodeChoice {
    /// Parses `smallest` or `roomy`.
    pub fn parse(name: &str) -> Option<NodeChoice> {
        match name {
            "smallest" => Some(NodeChoice::Smallest),
            "roomy" => Some(NodeChoice::Roomy),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            NodeChoice::Smallest => "smallest",
            NodeChoice::Roomy => "roomy",
        }
    }

    /// The tie-break key of type `ty` (lower wins).
    pub fn tie(self, types: &[NodeType], ty: usize) -> (u64, u64, usize) {
        let t = &types[ty];
        let per_gpu = |x: u64| u64::MAX - x / u64::from(t.gpus.max(1));
        match self {
            NodeChoice::Smallest => (0, 0, ty),
            NodeChoice::Roomy => (per_gpu(t.shape.cpu.0), per_gpu(t.shape.memory.0), ty),
        }
    }
}

/// The trace's GPU nodes grouped by shape (GPU model, GPU count, CPU, memory), smallest
/// first (GPUs, CPU, memory, model).
pub fn node_types(hosts: &[HostSpec]) -> Vec<NodeType> {
    let mut groups: BTreeMap<(u32, u64, u64, String), (HostSpec, usize)> = BTreeMap::new();
    for h in hosts.iter().filter(|h| !h.gpus.is_empty()) {
        let key = (
            h.gpus.len() as u32,
            h.cpu.0,
            h.memory.0,
            h.gpus[0].model.clone(),
        );
        groups.entry(key).or_insert_with(|| (h.clone(), 0)).1 += 1;
    }
    groups
        .into_iter()
        .enumerate()
        .map(|(i, ((gpus, _, _, model), (mut shape, in_trace)))| {
            shape.id = tessera_model::HostId::new(format!("type-{i}")).expect("a valid id");
            shape.active = true;
            NodeType {
                shape,
                model,
                gpus,
                in_trace,
            }
        })
        .collect()
}

/// A GPU task of the trace, as the benchmark replays it.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its data row in the task list.
    pub row: usize,
    pub request: TaskRequest,
    /// GPUs it holds (1 for a shared task).
    pub gpus: u32,
    /// Thousandths of each GPU (1000: whole GPUs).
    pub share: u16,
    /// Arrival (trace seconds).
    pub created: u64,
    /// How long it runs once placed; `None`: until the end of the trace.
    pub duration: Option<u64>,
}

impl Job {
    /// GPU demand in thousandths.
    pub fn gpu_milli(&self) -> u64 {
        u64::from(self.gpus) * u64::from(self.share)
    }

    /// When it ends if placed at `placed`.
    pub fn end_after(&self, placed: u64, trace_end: u64) -> u64 {
        match self.duration {
            Some(d) => placed + d,
            None => trace_end.max(placed),
        }
    }
}

/// What the benchmark replays: the GPU tasks and the node types.
#[derive(Debug, Clone)]
pub struct Workload {
    pub jobs: Vec<Job>,
    pub types: Vec<NodeType>,
    /// Tasks left out: without GPUs, and GPU tasks no node type holds (rows).
    pub cpu_only: usize,
    pub unfit: Vec<usize>,
    /// Tasks left out by `limit`.
    pub beyond_limit: usize,
    /// The last time the trace names: tasks without a deletion time live until then.
    pub trace_end: u64,
    /// The workload's shape, for the fragmentation-aware placement.
    pub profile: DemandProfile,
}

/// Why a trace cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// In the node list.
    #[error("no node has a GPU")]
    NoGpuNode,
    /// In the task list.
    #[error(
        "line {line}: a GPU task without creation_time (tasks are replayed at their creation times)"
    )]
    NoCreationTime { line: usize },
}

/// The GPU tasks of `tasks` (the first `limit` by creation time, if given) and the node
/// types of `hosts`.
pub fn workload(
    hosts: &[HostSpec],
    tasks: &[TraceTask],
    limit: Option<usize>,
) -> Result<Workload, WorkloadError> {
    let types = node_types(hosts);
    if types.is_empty() {
        return Err(WorkloadError::NoGpuNode);
    }
    let mut gpu: Vec<&TraceTask> = Vec::new();
    let mut cpu_only = 0;
    for t in tasks {
        if t.num_gpu == 0 || t.gpu_milli == 0 {
            cpu_only += 1;
        } else if t.created.is_none() {
            return Err(WorkloadError::NoCreationTime { line: t.row + 2 });
        } else {
            gpu.push(t);
        }
    }
    gpu.sort_by_key(|t| (t.created, t.row));
    let beyond_limit = limit.map_or(0, |n| gpu.len().saturating_sub(n));
    gpu.truncate(gpu.len() - beyond_limit);
    let trace_end = gpu
        .iter()
        .flat_map(|t| [t.created, t.deleted])
        .flatten()
        .max()
        .unwrap_or(0);
    let mut holds: HashMap<(u64, u64, u32, u32), bool> = HashMap::new();
    let (mut jobs, mut unfit) = (Vec::new(), Vec::new());
    for t in gpu {
        let key = (t.request.cpu.0, t.request.memory.0, t.num_gpu, t.gpu_milli);
        let fits = *holds
            .entry(key)
            .or_insert_with(|| types.iter().any(|ty| holds_alone(&ty.shape, &t.request)));
        if !fits {
            unfit.push(t.row);
            continue;
        }
        let created = t.created.expect("checked");
        jobs.push(Job {
            row: t.row,
            request: t.request.clone(),
            gpus: t.num_gpu,
            share: if matches!(t.request.gpu, GpuDemand::Whole { .. }) {
                1000
            } else {
                t.gpu_milli as u16
            },
            created,
            duration: t.deleted.map(|d| d.saturating_sub(created)),
        });
    }
    let profile = DemandProfile::from_requests(jobs.iter().map(|j| &j.request));
    Ok(Workload {
        jobs,
        types,
        cpu_only,
        unfit,
        beyond_limit,
        trace_end,
        profile,
    })
}

/// Whether an empty host of `shape` holds `request`.
fn holds_alone(shape: &HostSpec, request: &TaskRequest) -> bool {
    let snap = Snapshot::new(vec![shape.clone()], PoolLimits::default());
    Engine::new(snap, Policy::Binpack, &DemandProfile::default(), 0)
        .try_place(request)
        .is_some()
}

/// What one simulation runs with.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub boot_delay: u64,
    /// Seconds between passes.
    pub pass: u64,
    /// The placement policy of the cluster.
    pub placement: Policy,
    /// Tasks without a deletion time live until then.
    pub trace_end: u64,
}

/// The benchmark's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Seconds from a launch request to the node taking tasks.
    pub boot_delay: u64,
    /// Seconds between passes (the control plane's reconcile tick).
    pub pass: u64,
    /// Tessera's provider settings.
    pub provider: Provider,
    /// The cluster-autoscaler-like rule: utilization threshold (%) and unneeded time.
    pub ca_threshold_pct: u64,
    pub ca_unneeded_secs: u64,
    /// The placement policy of Tessera's pool (and the static fleet's).
    pub placement: Policy,
    /// Which node type scale-outs take on a tie.
    pub node_choice: NodeChoice,
}

/// A provider with the product's defaults (target capacity 100 %, scale-out cooldown
/// 0 s, scale-in cooldown 600 s) and the most hosts a provider may keep.
pub fn product_provider() -> Provider {
    validate(&ProviderInput {
        kind: "demo".into(),
        max_hosts: MAX_HOSTS,
        ..Default::default()
    })
    .expect("the defaults are valid")
}

impl Config {
    /// The product's provider defaults and Cluster Autoscaler's (50 %, 10 minutes).
    pub fn new(boot_delay: u64, pass: u64) -> Self {
        Config {
            boot_delay,
            pass,
            provider: product_provider(),
            ca_threshold_pct: 50,
            ca_unneeded_secs: 600,
            placement: Policy::from(tessera_model::PlacementPolicy::default()),
            node_choice: NodeChoice::Smallest,
        }
    }
}

/// One rule's figures.
#[derive(Debug, Clone)]
pub struct Row {
    pub policy: &'static str,
    pub gpu_hours: f64,
    /// Seconds each placed task waited, sorted.
    pub waits: Vec<u64>,
    pub never_placed: usize,
    pub paid: fleet::Paid,
    /// Nodes launched, by node type.
    pub by_type: Vec<usize>,
    pub wall: Duration,
}

impl Row {
    fn of(policy: &'static str, run: sim::Run, types: usize) -> Row {
        let mut waits = run.waits;
        waits.sort_unstable();
        let mut by_type = vec![0; types];
        for &t in &run.launched_types {
            by_type[t] += 1;
        }
        Row {
            by_type,
            policy,
            gpu_hours: run.paid.gpu_seconds as f64 / 3600.0,
            waits,
            never_placed: run.never_placed,
            paid: run.paid,
            wall: run.wall,
        }
    }

    /// The `p`-th percentile of the waits (nearest rank), 0 when nothing was placed.
    pub fn wait_percentile(&self, p: f64) -> u64 {
        percentile(&self.waits, p)
    }
}

/// The `p`-th percentile (0–100, nearest rank) of sorted values; 0 when there are none.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Every rule's figures on one workload.
#[derive(Debug, Clone)]
pub struct Report {
    /// GPU-hours of the lower bound.
    pub lower_gpu_hours: f64,
    /// `static`, `ca-like`, `tessera`, `tessera-no-consolidation`, in that order.
    pub rows: Vec<Row>,
    /// GPUs of the static fleet.
    pub static_gpus: u64,
    pub wall: Duration,
}

/// Runs every rule on `w`, side by side in threads.
pub fn run(w: &Workload, cfg: &Config) -> Report {
    let started = Instant::now();
    let settings = Settings {
        boot_delay: cfg.boot_delay,
        pass: cfg.pass,
        placement: cfg.placement,
        trace_end: w.trace_end,
    };
    let lower = lower::gpu_seconds(&w.jobs, w.trace_end) as f64 / 3600.0;
    let (fixed, ca, tessera, consolidating) = std::thread::scope(|s| {
        let fixed = s.spawn(|| run_static(w, cfg, &settings));
        let ca = s.spawn(|| {
            let mut rule = ca::CaLike::new(
                cfg.ca_threshold_pct,
                cfg.ca_unneeded_secs,
                cfg.boot_delay,
                cfg.node_choice,
            );
            let settings = Settings {
                placement: Policy::Binpack,
                ..settings
            };
            sim::simulate(&w.types, &w.jobs, &w.profile, &settings, &mut rule, &[])
        });
        let tessera = || {
            tessera::Tessera::new(
                cfg.provider.clone(),
                cfg.boot_delay,
                settings.placement,
                cfg.node_choice,
            )
        };
        let consolidating = s.spawn(move || {
            let mut rule = tessera().with_consolidation();
            sim::simulate(&w.types, &w.jobs, &w.profile, &settings, &mut rule, &[])
        });
        let mut rule = tessera();
        let product = sim::simulate(&w.types, &w.jobs, &w.profile, &settings, &mut rule, &[]);
        (
            fixed.join().expect("the static run"),
            ca.join().expect("the ca-like run"),
            product,
            consolidating.join().expect("the consolidating run"),
        )
    });
    let (fixed, static_gpus) = fixed;
    Report {
        lower_gpu_hours: lower,
        rows: vec![
            Row::of("static", fixed, w.types.len()),
            Row::of("ca-like", ca, w.types.len()),
            Row::of("tessera", consolidating, w.types.len()),
            Row::of("tessera-no-consolidation", tessera, w.types.len()),
        ],
        static_gpus,
        wall: started.elapsed(),
    }
}

/// The static fleet: the nodes a fleet that grows at once for every task that waits, and
/// never shrinks, ends with; then the trace on those nodes, all there from the start.
fn run_static(w: &Workload, cfg: &Config, settings: &Settings) -> (sim::Run, u64) {
    let mut grow =
        tessera::Tessera::grow_only(cfg.provider.clone(), settings.placement, cfg.node_choice);
    let grown = sim::simulate(&w.types, &w.jobs, &w.profile, settings, &mut grow, &[]);
    let gpus = grown
        .launched_types
        .iter()
        .map(|&t| u64::from(w.types[t].gpus))
        .sum();
    let mut run = sim::simulate(
        &w.types,
        &w.jobs,
        &w.profile,
        settings,
        &mut sim::Fixed,
        &grown.launched_types,
    );
    run.wall += grown.wall;
    (run, gpus)
}
