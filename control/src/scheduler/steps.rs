//! The scheduler's steps that read nothing but what they are given, in the order a pass
//! takes them (in the spirit of Nomad's scheduler stack):
//!
//! 1. **order**: [`by_pool`], [`by_service`], then [`crate::projects::shares::fair_order`] and
//!    [`claims_first`];
//! 2. **feasibility and rank**: the placement engine, asked by [`ServiceBatch::place`]
//!    with each revision's request ([`request_for`], [`with_live`]) counted against what
//!    the batch placed before it;
//! 3. **hold to limits**: [`ProjectLedger::admit`];
//! 4. **take**: the engine assigns, the [`PortBook`] and every request of the batch count
//!    the placement, and a [`PlacementCommit`] is written down for the store;
//!
//! then the pass commits ([`crate::store::Store::commit_placements`] re-checks with the
//! engine's own rule) and preemption plans room for what found none (`crate::preemption`).

use crate::store::{PendingTask, PlacementCommit};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use tessera_model::project::{Amounts, Usage};
use tessera_model::service::{GpuAllocation, Service, ServiceConstraints, Task, TaskDefRef};
use tessera_model::taskdef::{Protocol, TaskDefinitionSpec, TaskGpu};
use tessera_model::{GpuUuid, HostId, PoolName};
use tessera_placement::{
    Constraints, Engine, GpuDemand, LabelRule, Placement, TaskRequest, describe_request,
};

/// The request a task of `spec` makes under a service's constraints.
pub(crate) fn request_for(
    spec: &TaskDefinitionSpec,
    c: &ServiceConstraints,
    avoid: BTreeSet<HostId>,
) -> TaskRequest {
    TaskRequest {
        cpu: spec.cpu(),
        memory: spec.memory(),
        gpu: match spec.gpu() {
            TaskGpu::None => GpuDemand::None,
            TaskGpu::Whole { count } => GpuDemand::Whole { count },
            TaskGpu::Shared { memory, compute } => GpuDemand::Shared { memory, compute },
        },
        constraints: Constraints {
            gpu_models: c.gpu_models.clone(),
            labels: c
                .labels
                .iter()
                .map(|(k, v)| LabelRule::Equals {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect(),
            distinct_hosts: c.distinct_hosts,
            avoid_hosts: avoid,
            max_per_gpu: c.max_per_gpu,
            max_per_host: c.max_per_host,
            gpu_counts: Default::default(),
            host_counts: Default::default(),
            host_ports: spec.fixed_host_ports(),
            ports_in_use: Default::default(),
            dynamic_ports: spec.ports().count() as u32 - spec.fixed_host_ports().len() as u32,
            dynamic_free: Default::default(),
            avoid_gpus: Default::default(),
        },
    }
}

/// Whether placing under `c` depends on where the service's tasks already run (spread or
/// caps), so its live tasks must be read.
pub(crate) fn counts_live(c: &ServiceConstraints) -> bool {
    c.distinct_hosts || c.max_per_gpu.is_some() || c.max_per_host.is_some()
}

/// `req` with what the service's `live` tasks hold counted against its caps (and, with
/// distinct hosts, their hosts avoided).
pub(crate) fn with_live(mut req: TaskRequest, live: &[Task]) -> TaskRequest {
    for t in live.iter().filter(|t| t.state.holds_capacity()) {
        let Some(h) = &t.host else { continue };
        count_spread(
            &mut req.constraints,
            h,
            t.allocations.iter().map(|a| &a.gpu),
        );
    }
    req
}

/// Counts one task of the service on host `host` and `gpus` against `c`'s spread and caps.
fn count_spread<'a>(
    c: &mut Constraints,
    host: &HostId,
    gpus: impl IntoIterator<Item = &'a GpuUuid>,
) {
    if c.distinct_hosts {
        c.avoid_hosts.insert(host.clone());
    }
    if c.max_per_host.is_some() {
        *c.host_counts.entry(host.clone()).or_default() += 1;
    }
    if c.max_per_gpu.is_some() {
        for uuid in gpus {
            *c.gpu_counts.entry(uuid.clone()).or_default() += 1;
        }
    }
}

/// The allocations a placement makes, as stored.
pub(crate) fn allocations(p: &Placement) -> Vec<GpuAllocation> {
    p.gpus
        .iter()
        .map(|s| GpuAllocation {
            gpu: s.uuid.clone(),
            index: s.index,
            memory: s.memory,
            compute: s.compute,
            dedicated: s.dedicated,
        })
        .collect()
}

/// Pending tasks by pool.
pub(crate) fn by_pool(pending: &[PendingTask]) -> BTreeMap<PoolName, Vec<&PendingTask>> {
    let mut out: BTreeMap<PoolName, Vec<&PendingTask>> = BTreeMap::new();
    for t in pending {
        out.entry(t.pool.clone()).or_default().push(t);
    }
    out
}

/// One pool's pending tasks by service, services in the order their first task was
/// created and tasks in theirs.
pub(crate) fn by_service(tasks: Vec<&PendingTask>) -> Vec<(String, Vec<&PendingTask>)> {
    let mut out: Vec<(String, Vec<&PendingTask>)> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for t in tasks {
        match at.get(t.service.as_str()) {
            Some(&i) => out[i].1.push(t),
            None => {
                at.insert(&t.service, out.len());
                out.push((t.service.clone(), vec![t]));
            }
        }
    }
    out
}

/// Tasks with claimed room go first (their services, then they within them), so nothing
/// else takes the room their victims left. Stable otherwise.
pub(crate) fn claims_first(
    by_service: &mut [(String, Vec<&PendingTask>)],
    claims: &HashMap<String, Placement>,
) {
    if claims.is_empty() {
        return;
    }
    for (_, tasks) in by_service.iter_mut() {
        tasks.sort_by_key(|t| !claims.contains_key(&t.id));
    }
    by_service.sort_by_key(|(_, tasks)| !tasks.iter().any(|t| claims.contains_key(&t.id)));
}

/// Host ports taken on each host of a pool and dynamic ports its agent has left (absent:
/// plenty), kept in step with every placement of the pass.
#[derive(Debug, Clone, Default)]
pub(crate) struct PortBook {
    pub in_use: BTreeMap<HostId, BTreeSet<(u16, Protocol)>>,
    pub dynamic_free: BTreeMap<HostId, u32>,
}

impl PortBook {
    /// Gives `req` the book as it stands, where it needs ports.
    fn lend(&self, req: &mut TaskRequest) {
        if !req.constraints.host_ports.is_empty() {
            req.constraints.ports_in_use = self.in_use.clone();
        }
        if req.constraints.dynamic_ports > 0 {
            req.constraints.dynamic_free = self.dynamic_free.clone();
        }
    }

    /// Counts the ports a task of `placed` takes on `host`, in the book and in `req`'s copy.
    fn take(&mut self, host: &HostId, placed: &Constraints, req: Option<&mut Constraints>) {
        let ports = placed.host_ports.iter().copied();
        if let Some(c) = req {
            if !c.host_ports.is_empty() {
                c.ports_in_use
                    .entry(host.clone())
                    .or_default()
                    .extend(ports.clone());
            }
            if c.dynamic_ports > 0
                && let Some(free) = c.dynamic_free.get_mut(host)
            {
                *free = free.saturating_sub(placed.dynamic_ports);
            }
            return;
        }
        self.in_use.entry(host.clone()).or_default().extend(ports);
        if let Some(free) = self.dynamic_free.get_mut(host) {
            *free = free.saturating_sub(placed.dynamic_ports);
        }
    }
}

/// The limits projects set in one pool and what each uses there, kept in step with every
/// placement of the pass.
#[derive(Debug, Default)]
pub(crate) struct ProjectLedger<'a> {
    limits: HashMap<&'a str, Amounts>,
    used: HashMap<String, Usage>,
}

impl<'a> ProjectLedger<'a> {
    pub fn new(limits: HashMap<&'a str, Amounts>, used: HashMap<String, Usage>) -> Self {
        ProjectLedger { limits, used }
    }

    /// Takes what a task of `req` placed at `p` reserves for `project`, or says what it
    /// would use past its limit (and takes nothing).
    pub fn admit(&mut self, project: &str, req: &TaskRequest, p: &Placement) -> Result<(), String> {
        let Some(limit) = self.limits.get(project) else {
            return Ok(());
        };
        let used = self.used.entry(project.to_owned()).or_default();
        let after = used.plus(&crate::projects::shares::reserved(
            req.cpu,
            req.memory,
            &allocations(p),
        ));
        if let Some(over) = after.exceeds(limit) {
            return Err(over);
        }
        *used = after;
        Ok(())
    }
}

/// Why a revision's last task did not get room, until the engine's picture changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Nothing had room: preemption may make some.
    NoRoom,
    /// Its project is at its limit in the pool.
    Limit,
}

/// One revision's request within a batch.
struct Revision {
    req: TaskRequest,
    /// The failure of its last task and how many placements the batch had made then: the
    /// tasks after it fail alike until the batch places again (nothing else changes the
    /// engine in between).
    failed: Option<(Failure, usize)>,
}

/// One service's pending tasks of one pass, placed one at a time.
pub(crate) struct ServiceBatch<'s> {
    pool: &'s PoolName,
    service: &'s Service,
    live: &'s [Task],
    /// GPUs of neighbours measured to break a latency target: kept off while anything else
    /// has room.
    avoid: BTreeSet<GpuUuid>,
    /// Each revision's request with the service's live tasks and the batch's placements
    /// counted; made when its first task comes.
    requests: HashMap<TaskDefRef, Revision>,
    placed: Vec<Placement>,
    pub commits: Vec<PlacementCommit>,
    /// Tasks that found no room or were held to their project's limit.
    pub unplaced: Vec<String>,
    /// The first reason a task waits.
    pub sentence: String,
    /// The request that found no room and its tasks (for preemption).
    pub wanting: Option<(TaskRequest, Vec<String>)>,
    /// Tasks placed away from `avoid`, and placed beside it for want of other room.
    pub kept_off: usize,
    pub beside: usize,
}

impl<'s> ServiceBatch<'s> {
    pub fn new(
        pool: &'s PoolName,
        service: &'s Service,
        live: &'s [Task],
        avoid: BTreeSet<GpuUuid>,
    ) -> Self {
        ServiceBatch {
            pool,
            service,
            live,
            avoid,
            requests: HashMap::new(),
            placed: Vec::new(),
            commits: Vec::new(),
            unplaced: Vec::new(),
            sentence: String::new(),
            wanting: None,
            kept_off: 0,
            beside: 0,
        }
    }

    /// Places task `t` (of `spec`) on `engine` and takes the room: its claim first when
    /// the claimed room is still allowed and free, held to its project's limit.
    pub fn place(
        &mut self,
        engine: &mut Engine,
        t: &PendingTask,
        spec: &TaskDefinitionSpec,
        claim: Option<&Placement>,
        ports: &mut PortBook,
        ledger: &mut ProjectLedger<'_>,
    ) {
        let (service, live, placed) = (self.service, self.live, &self.placed);
        let rev = self
            .requests
            .entry(t.task_definition.clone())
            .or_insert_with(|| {
                let mut req = with_live(
                    request_for(spec, &service.constraints, BTreeSet::new()),
                    live,
                );
                for p in placed {
                    count_spread(
                        &mut req.constraints,
                        &p.host_id,
                        p.gpus.iter().map(|s| &s.uuid),
                    );
                }
                ports.lend(&mut req);
                Revision { req, failed: None }
            });
        let since = self.placed.len();
        let found = match (claim, rev.failed) {
            // Nothing changed since a task of this request found nothing.
            (None, Some((failure, at))) if at == since => Err(failure),
            _ => {
                let claimed =
                    claim.and_then(|c| tessera_placement::quota::claimable(engine, c, &rev.req));
                let found = claimed.or_else(|| engine.try_place(&rev.req)).map(|first| {
                    Self::keep_off(
                        engine,
                        first,
                        &mut rev.req,
                        &self.avoid,
                        (&mut self.kept_off, &mut self.beside),
                    )
                });
                match found {
                    None => {
                        if self.sentence.is_empty() {
                            self.sentence = engine.explain(&rev.req).to_string();
                        }
                        Err(Failure::NoRoom)
                    }
                    Some(p) => match ledger.admit(&service.project, &rev.req, &p) {
                        Ok(()) => Ok(p),
                        Err(over) => {
                            if self.sentence.is_empty() {
                                self.sentence = format!(
                                    "unable to place task ({}): project `{}` is at its limit in pool `{}`: it would use {over}",
                                    describe_request(&rev.req),
                                    service.project,
                                    self.pool
                                );
                            }
                            Err(Failure::Limit)
                        }
                    },
                }
            }
        };
        match found {
            Ok(p) => self.take(engine, t, &t.task_definition, p, ports),
            Err(failure) => {
                let rev = self
                    .requests
                    .get_mut(&t.task_definition)
                    .expect("made above");
                rev.failed = Some((failure, since));
                if failure == Failure::NoRoom {
                    self.wanting
                        .get_or_insert_with(|| (rev.req.clone(), Vec::new()))
                        .1
                        .push(t.id.clone());
                }
                self.unplaced.push(t.id.clone());
            }
        }
    }

    /// `first`, or where else `req` fits when `first` uses a GPU of `avoid`.
    fn keep_off(
        engine: &mut Engine,
        first: Placement,
        req: &mut TaskRequest,
        avoid: &BTreeSet<GpuUuid>,
        (kept_off, beside): (&mut usize, &mut usize),
    ) -> Placement {
        if !first.gpus.iter().any(|g| avoid.contains(&g.uuid)) {
            return first;
        }
        req.constraints.avoid_gpus = avoid.clone();
        let away = engine.try_place(req);
        req.constraints.avoid_gpus.clear();
        match away {
            Some(p) => {
                *kept_off += 1;
                p
            }
            None => {
                *beside += 1;
                first
            }
        }
    }

    /// Takes the room of `p` for task `t` of revision `rev`: on the engine, in the port
    /// book, against every request of the batch, and as a commit to write.
    fn take(
        &mut self,
        engine: &mut Engine,
        t: &PendingTask,
        rev: &TaskDefRef,
        p: Placement,
        ports: &mut PortBook,
    ) {
        engine
            .assign(&p)
            .expect("a fresh placement fits its own engine");
        let placed = &self.requests[rev].req.constraints;
        let placed = Constraints {
            host_ports: placed.host_ports.clone(),
            dynamic_ports: placed.dynamic_ports,
            ..Default::default()
        };
        ports.take(&p.host_id, &placed, None);
        for r in self.requests.values_mut() {
            let c = &mut r.req.constraints;
            count_spread(c, &p.host_id, p.gpus.iter().map(|s| &s.uuid));
            ports.take(&p.host_id, &placed, Some(c));
        }
        self.commits.push(PlacementCommit {
            task_id: t.id.clone(),
            host: p.host_id.clone(),
            allocations: allocations(&p),
        });
        self.placed.push(p);
    }

    /// What the event about interference says, when the batch kept tasks off neighbours'
    /// GPUs or could not: `conflicts` are each neighbour and why it is kept off.
    pub fn interference_said(&self, conflicts: &[(&str, &str)]) -> Option<String> {
        if self.kept_off + self.beside == 0 {
            return None;
        }
        let mut words = Vec::new();
        if self.kept_off > 0 {
            let names: Vec<String> = conflicts
                .iter()
                .map(|(neighbour, _)| format!("`{neighbour}`"))
                .collect();
            words.push(format!(
                "{} task(s) placed away from the GPUs of {}",
                self.kept_off,
                names.join(", ")
            ));
        }
        if self.beside > 0 {
            words.push(format!(
                "{} task(s) placed beside them: no other GPU had room",
                self.beside
            ));
        }
        let why: Vec<&str> = conflicts.iter().map(|(_, why)| *why).collect();
        Some(format!(
            "placement: {} (interference: {})",
            words.join("; "),
            why.join("; ")
        ))
    }
}

/// How many tasks one placement event names one by one.
const PLACED_NAMED: usize = 20;

/// The event saying where a service's tasks of one pass went and what chose it (`why`):
/// those of `mine` the commit took, each with its host and GPUs; `None` when it took none.
pub(crate) fn placed_said(
    mine: &[PlacementCommit],
    committed: &std::collections::HashSet<String>,
    why: &str,
) -> Option<String> {
    let took: Vec<&PlacementCommit> = mine
        .iter()
        .filter(|c| committed.contains(&c.task_id))
        .collect();
    if took.is_empty() {
        return None;
    }
    let named: Vec<String> = took
        .iter()
        .take(PLACED_NAMED)
        .map(|c| {
            let gpus: Vec<String> = c
                .allocations
                .iter()
                .map(|a| format!("GPU {} ({})", a.index, a.memory))
                .collect();
            if gpus.is_empty() {
                format!("task {} on {}", c.task_id, c.host)
            } else {
                format!("task {} on {} {}", c.task_id, c.host, gpus.join(", "))
            }
        })
        .collect();
    let more = took.len().saturating_sub(PLACED_NAMED);
    Some(format!(
        "{} task(s) placed by {why}: {}{}",
        took.len(),
        named.join("; "),
        if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use tessera_model::taskdef::parse_task_definition;
    use tessera_model::{MiB, MilliCpu};
    use tessera_placement::{DemandProfile, GpuSpec, HostSpec, Policy, PoolLimits, Snapshot};

    fn pool() -> PoolName {
        PoolName::new("gpu").expect("valid")
    }

    fn service(name: &str, project: &str, constraints: ServiceConstraints) -> Service {
        Service {
            project: project.into(),
            constraints,
            ..crate::test_values::service(name)
        }
    }

    fn rev(family: &str, revision: u32) -> TaskDefRef {
        TaskDefRef {
            family: family.into(),
            revision,
        }
    }

    /// A task definition of one container with an MPS slot of `gpu_mib`, and `ports`
    /// (`containerPort`, `hostPort`) pairs.
    fn spec(gpu_mib: u64, ports: serde_json::Value) -> TaskDefinitionSpec {
        parse_task_definition(&json!({"family": "f", "containers": [{
            "name": "main", "command": ["serve"], "cpu_milli": 1000, "memory_mib": 1024,
            "ports": ports, "gpu": {"mps": {"memory_mib": gpu_mib}}}]}))
        .expect("valid")
    }

    fn pending(id: &str, service: &str, revision: u32) -> PendingTask {
        PendingTask {
            id: id.into(),
            service: service.into(),
            task_definition: rev(service, revision),
            pool: pool(),
        }
    }

    /// Binpack over `hosts` hosts of one 1,000 MiB GPU each, `host-0`….
    fn engine(hosts: usize) -> Engine {
        let hosts = (0..hosts)
            .map(|h| HostSpec {
                id: HostId::new(format!("host-{h}")).expect("valid"),
                cpu: MilliCpu(64_000),
                memory: MiB(256 * 1024),
                labels: Default::default(),
                active: true,
                gpus: vec![GpuSpec {
                    uuid: GpuUuid::new(format!("GPU-{h}")).expect("valid"),
                    model: "L4".into(),
                    memory: MiB(1000),
                    mps_client_limit: 48,
                    healthy: true,
                }],
            })
            .collect();
        Engine::new(
            Snapshot::new(hosts, PoolLimits::default()),
            Policy::Binpack,
            &DemandProfile::default(),
            1,
        )
    }

    fn hosts_of(batch: &ServiceBatch<'_>) -> Vec<String> {
        batch.commits.iter().map(|c| c.host.to_string()).collect()
    }

    #[test]
    fn services_keep_the_order_of_their_first_task_and_claims_go_first() {
        let tasks = [
            pending("a1", "a", 1),
            pending("b1", "b", 1),
            pending("a2", "a", 1),
            pending("c1", "c", 1),
            pending("c2", "c", 1),
        ];
        let mut order = by_service(tasks.iter().collect());
        let names = |o: &[(String, Vec<&PendingTask>)]| -> Vec<String> {
            o.iter()
                .map(|(s, t)| {
                    format!(
                        "{s}:{}",
                        t.iter()
                            .map(|t| t.id.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                })
                .collect()
        };
        assert_eq!(names(&order), ["a:a1,a2", "b:b1", "c:c1,c2"]);
        let mut e = engine(1);
        let room = e
            .try_place(&TaskRequest::cpu_only(MilliCpu(1), MiB(1)))
            .expect("room");
        claims_first(&mut order, &[("c2".to_owned(), room)].into());
        assert_eq!(names(&order), ["c:c2,c1", "a:a1,a2", "b:b1"]);
    }

    #[test]
    fn every_revision_of_a_batch_counts_the_placements_before_it() {
        // A deployment places old and new revisions in one pass: spread over distinct
        // hosts holds across both, and what the service ran already counts.
        let s = service(
            "web",
            "default",
            ServiceConstraints {
                distinct_hosts: true,
                ..Default::default()
            },
        );
        let live = [Task {
            host: Some(HostId::new("host-0").expect("valid")),
            ..crate::test_values::task("t0", "web")
        }];
        let (mut e, mut ports, mut ledger) =
            (engine(4), PortBook::default(), ProjectLedger::default());
        let pool = pool();
        let mut batch = ServiceBatch::new(&pool, &s, &live, BTreeSet::new());
        let (old, new) = (spec(100, json!([])), spec(200, json!([])));
        for (t, spec) in [
            (pending("t1", "web", 1), &old),
            (pending("t2", "web", 2), &new),
            (pending("t3", "web", 1), &old),
            (pending("t4", "web", 2), &new),
        ] {
            batch.place(&mut e, &t, spec, None, &mut ports, &mut ledger);
        }
        let mut hosts = hosts_of(&batch);
        hosts.sort();
        assert_eq!(
            hosts,
            ["host-1", "host-2", "host-3"],
            "host-0 is held already"
        );
        assert_eq!(batch.unplaced, ["t4"]);
        let (request, waiting) = batch.wanting.as_ref().expect("t4 found no room");
        assert_eq!(waiting, &["t4"]);
        assert_eq!(
            request.constraints.avoid_hosts.len(),
            4,
            "every host counted"
        );
        assert!(
            batch.sentence.contains("unable to place"),
            "{}",
            batch.sentence
        );
    }

    #[test]
    fn tasks_after_one_that_found_no_room_wait_alike_until_the_batch_places() {
        let s = service("web", "default", Default::default());
        let (mut e, mut ports, mut ledger) =
            (engine(1), PortBook::default(), ProjectLedger::default());
        let pool = pool();
        let mut batch = ServiceBatch::new(&pool, &s, &[], BTreeSet::new());
        let (big, small) = (spec(900, json!([])), spec(100, json!([])));
        batch.place(
            &mut e,
            &pending("t1", "web", 1),
            &big,
            None,
            &mut ports,
            &mut ledger,
        );
        batch.place(
            &mut e,
            &pending("t2", "web", 1),
            &big,
            None,
            &mut ports,
            &mut ledger,
        );
        assert_eq!(batch.unplaced, ["t2"]);
        let first = batch.sentence.clone();
        batch.place(
            &mut e,
            &pending("t3", "web", 1),
            &big,
            None,
            &mut ports,
            &mut ledger,
        );
        batch.place(
            &mut e,
            &pending("t4", "web", 2),
            &small,
            None,
            &mut ports,
            &mut ledger,
        );
        assert_eq!(batch.unplaced, ["t2", "t3"]);
        assert_eq!(batch.sentence, first, "the first reason stays");
        assert_eq!(batch.wanting.as_ref().map(|w| w.1.len()), Some(2));
        assert_eq!(hosts_of(&batch), ["host-0", "host-0"]);
    }

    #[test]
    fn a_project_at_its_limit_waits_without_asking_for_preemption() {
        let s = service("web", "team", Default::default());
        let limit = Amounts {
            gpu_memory_mib: Some(250),
            ..Default::default()
        };
        let (mut e, mut ports) = (engine(2), PortBook::default());
        let mut ledger = ProjectLedger::new([("team", limit)].into(), HashMap::new());
        let pool = pool();
        let mut batch = ServiceBatch::new(&pool, &s, &[], BTreeSet::new());
        let slot = spec(100, json!([]));
        for id in ["t1", "t2", "t3"] {
            batch.place(
                &mut e,
                &pending(id, "web", 1),
                &slot,
                None,
                &mut ports,
                &mut ledger,
            );
        }
        assert_eq!(batch.commits.len(), 2);
        assert_eq!(batch.unplaced, ["t3"]);
        assert!(batch.wanting.is_none(), "a limit is not a want of room");
        assert!(
            batch
                .sentence
                .contains("project `team` is at its limit in pool `gpu`"),
            "{}",
            batch.sentence
        );
    }

    #[test]
    fn a_fixed_host_port_is_held_across_the_services_of_a_pass() {
        let (a, b) = (
            service("a", "default", Default::default()),
            service("b", "default", Default::default()),
        );
        let (mut e, mut ports, mut ledger) =
            (engine(2), PortBook::default(), ProjectLedger::default());
        let web = spec(100, json!([{"container_port": 8080, "host_port": 8080}]));
        let pool = pool();
        let mut first = ServiceBatch::new(&pool, &a, &[], BTreeSet::new());
        first.place(
            &mut e,
            &pending("a1", "a", 1),
            &web,
            None,
            &mut ports,
            &mut ledger,
        );
        first.place(
            &mut e,
            &pending("a2", "a", 1),
            &web,
            None,
            &mut ports,
            &mut ledger,
        );
        let mut second = ServiceBatch::new(&pool, &b, &[], BTreeSet::new());
        second.place(
            &mut e,
            &pending("b1", "b", 1),
            &web,
            None,
            &mut ports,
            &mut ledger,
        );
        let mut hosts = hosts_of(&first);
        hosts.sort();
        assert_eq!(hosts, ["host-0", "host-1"], "one task per host: the port");
        assert_eq!(second.unplaced, ["b1"], "both hosts' port 8080 taken");
        assert_eq!(ports.in_use.len(), 2);
    }

    #[test]
    fn tasks_keep_off_avoided_gpus_while_anything_else_has_room() {
        let s = service("web", "default", Default::default());
        let (mut e, mut ports, mut ledger) =
            (engine(2), PortBook::default(), ProjectLedger::default());
        let pool = pool();
        let avoid: BTreeSet<GpuUuid> = [GpuUuid::new("GPU-0").expect("valid")].into();
        let mut batch = ServiceBatch::new(&pool, &s, &[], avoid);
        let slot = spec(600, json!([]));
        batch.place(
            &mut e,
            &pending("t1", "web", 1),
            &slot,
            None,
            &mut ports,
            &mut ledger,
        );
        batch.place(
            &mut e,
            &pending("t2", "web", 1),
            &slot,
            None,
            &mut ports,
            &mut ledger,
        );
        assert_eq!(hosts_of(&batch), ["host-1", "host-0"]);
        assert_eq!((batch.kept_off, batch.beside), (1, 1));
        let said = batch
            .interference_said(&[("noisy", "p99 +40 %")])
            .expect("a task went beside");
        assert_eq!(
            said,
            "placement: 1 task(s) placed away from the GPUs of `noisy`; \
             1 task(s) placed beside them: no other GPU had room (interference: p99 +40 %)"
        );
    }
}
