//! Projects: the teams that share a fleet. Every service belongs to one (`default` unless it
//! says otherwise). A project may have, per pool, a guaranteed quota (capacity it can count
//! on) and a limit above it (the most it may use, borrowing what others leave unused).
//! Placement never takes a project past its limit: such a task stays pending, and the reason
//! says which quantity is at its limit.
//!
//! Five quantities are counted, as a task reserves them: whole GPUs, GPU memory and compute
//! share (of shared, MPS slots and whole GPUs alike), host CPU and host memory.

use crate::error::ValidationErrors;
use crate::limits::project::{MAX_AMOUNT, MAX_QUOTAS, MAX_WEIGHT};
use crate::time::Timestamp;
use crate::validate::Errors;
use crate::{PoolName, ids};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

pub use crate::inventory::PreemptionState;
pub use crate::service::DEFAULT_PROJECT;

/// Quantities of a pool's capacity a quota names. Left out: a guarantee of none, or no
/// limit on that quantity.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Amounts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 9_223_372_036_854_775_807_u64))]
    // MAX_AMOUNT
    pub gpus: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 9_223_372_036_854_775_807_u64))]
    pub gpu_memory_mib: Option<u64>,
    /// Thousandths of a GPU's compute (1000: one whole GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 9_223_372_036_854_775_807_u64))]
    pub compute_milli: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 9_223_372_036_854_775_807_u64))]
    pub cpu_milli: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 9_223_372_036_854_775_807_u64))]
    pub memory_mib: Option<u64>,
}

/// What is used (or asked for, or available) of each quantity.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub gpus: u64,
    pub gpu_memory_mib: u64,
    pub compute_milli: u64,
    pub cpu_milli: u64,
    pub memory_mib: u64,
}

/// The five quantities, in the order they are reported.
const QUANTITIES: [(&str, &str); 5] = [
    ("gpus", "whole GPUs"),
    ("gpu_memory_mib", "MiB of GPU memory"),
    ("compute_milli", "thousandths of GPU compute"),
    ("cpu_milli", "milli-CPUs"),
    ("memory_mib", "MiB of host memory"),
];

impl Amounts {
    fn values(&self) -> [Option<u64>; 5] {
        [
            self.gpus,
            self.gpu_memory_mib,
            self.compute_milli,
            self.cpu_milli,
            self.memory_mib,
        ]
    }

    /// `2 GPUs, 40 GiB GPU memory` (what is given), or `none` when nothing is.
    pub fn describe(&self) -> String {
        describe(self.values())
    }

    /// The quantities it names, by their field names.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        self.values()
            .into_iter()
            .zip(QUANTITIES)
            .filter_map(|(v, (field, _))| Some((field, v?)))
            .collect()
    }

    /// As used amounts: what is left out counts as none.
    pub fn or_zero(&self) -> Usage {
        let v = self.values().map(|x| x.unwrap_or(0));
        Usage::from_values(v)
    }
}

impl Usage {
    fn values(&self) -> [u64; 5] {
        [
            self.gpus,
            self.gpu_memory_mib,
            self.compute_milli,
            self.cpu_milli,
            self.memory_mib,
        ]
    }

    fn from_values(v: [u64; 5]) -> Usage {
        Usage {
            gpus: v[0],
            gpu_memory_mib: v[1],
            compute_milli: v[2],
            cpu_milli: v[3],
            memory_mib: v[4],
        }
    }

    pub fn plus(&self, other: &Usage) -> Usage {
        let (a, b) = (self.values(), other.values());
        Usage::from_values(std::array::from_fn(|i| a[i].saturating_add(b[i])))
    }

    /// What is above `floor` of each quantity (none where it is below).
    pub fn above(&self, floor: &Usage) -> Usage {
        let (a, b) = (self.values(), floor.values());
        Usage::from_values(std::array::from_fn(|i| a[i].saturating_sub(b[i])))
    }

    /// Every quantity by its field name.
    pub fn named(&self) -> [(&'static str, u64); 5] {
        let v = self.values();
        std::array::from_fn(|i| (QUANTITIES[i].0, v[i]))
    }

    /// `2 GPUs, 40 GiB GPU memory, 4 CPUs` (what is not zero), or `none`.
    pub fn describe(&self) -> String {
        describe(self.values().map(|v| (v > 0).then_some(v)))
    }

    pub fn is_zero(&self) -> bool {
        self.values().iter().all(|v| *v == 0)
    }

    /// The first quantity of which this exceeds `limit`, said as `9 of 8 whole GPUs`
    /// (`None` when within it on every one).
    pub fn exceeds(&self, limit: &Amounts) -> Option<String> {
        self.values()
            .into_iter()
            .zip(limit.values())
            .zip(QUANTITIES)
            .find_map(|((used, limit), (_, words))| match limit {
                Some(l) if used > l => Some(format!("{used} of {l} {words}")),
                _ => None,
            })
    }

    /// The quantities of which this falls short of `need`, said as
    /// `gpus: 2 short (8 guaranteed of 6)`: for guarantees against capacity.
    pub fn shortfalls(&self, need: &Usage) -> Vec<(&'static str, String)> {
        self.values()
            .into_iter()
            .zip(need.values())
            .zip(QUANTITIES)
            .filter(|((have, need), _)| need > have)
            .map(|((have, need), (field, words))| {
                (
                    field,
                    format!(
                        "{} {words} short: {need} guaranteed in all, the pool has {have}",
                        need - have
                    ),
                )
            })
            .collect()
    }
}

fn describe(values: [Option<u64>; 5]) -> String {
    let thousandths = |v: u64| {
        let whole = v as f64 / 1000.0;
        if v.is_multiple_of(1000) {
            format!("{}", v / 1000)
        } else {
            format!("{whole:.2}")
        }
    };
    let parts: Vec<String> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let v = (*v)?;
            Some(match i {
                0 => format!("{v} GPU{}", if v == 1 { "" } else { "s" }),
                1 => format!("{} GPU memory", crate::MiB(v)),
                2 => format!("{} GPU compute", thousandths(v)),
                3 => format!("{} CPU", thousandths(v)),
                _ => format!("{} memory", crate::MiB(v)),
            })
        })
        .collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

/// A project's quota in one pool.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::name))]
    pub pool: String,
    /// Capacity the project can count on; others may borrow it only while it is unused.
    #[serde(default)]
    pub guaranteed: Amounts,
    /// The most it may use in the pool (guaranteed plus borrowed); left out: no limit.
    #[serde(default)]
    pub limit: Amounts,
}

/// `POST /api/v1/projects`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectInput {
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::fields::name))]
    pub name: String,
    /// Its share of capacity borrowed beyond guarantees, against other projects' weights
    /// (default 1).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub weight: Option<u32>,
    /// At most one per pool. A pool without one: no guarantee and no limit there.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub quotas: Vec<Quota>,
}

/// `PUT /api/v1/projects/{name}`: its weight and quotas, replacing the old ones (the name
/// is the path's).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectSettings {
    /// Default 1.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub weight: Option<u32>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub quotas: Vec<Quota>,
}

impl ProjectSettings {
    /// The whole body of a project named `name` with these settings.
    pub fn named(&self, name: &str) -> ProjectInput {
        ProjectInput {
            name: name.to_owned(),
            weight: self.weight,
            quotas: self.quotas.clone(),
        }
    }
}

/// A project as stored.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    pub name: String,
    pub weight: u32,
    pub quotas: Vec<Quota>,
    pub created_at: Timestamp,
}

impl Project {
    /// The project every fleet starts with: no quota anywhere.
    pub fn default_project() -> Project {
        Project {
            name: DEFAULT_PROJECT.to_owned(),
            weight: 1,
            quotas: Vec::new(),
            created_at: Timestamp::EPOCH,
        }
    }

    pub fn quota(&self, pool: &str) -> Option<&Quota> {
        self.quotas.iter().find(|q| q.pool == pool)
    }
}

/// One project in one pool: its quota and what it uses, for the quotas page, the API and
/// the metrics.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolShare {
    pub pool: String,
    pub guaranteed: Amounts,
    pub limit: Amounts,
    /// Reserved by its tasks that hold capacity (assigned, starting, running, stopping).
    pub used: Usage,
    /// Used beyond its guarantee: capacity other projects' guarantees may reclaim.
    pub borrowed: Usage,
    /// Its tasks in the pool waiting for a place.
    pub pending: u32,
}

/// `GET /api/v1/projects`: each project with its quotas and use.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectView {
    #[serde(flatten)]
    pub project: Project,
    pub services: u32,
    /// Every pool it has a quota in or tasks in.
    pub pools: Vec<PoolShare>,
    /// Users given a role in it (admins, and fleet-wide roles, count everywhere).
    #[serde(default)]
    pub members: Vec<Member>,
    /// Its services with tasks waiting for a place, and why.
    #[serde(default)]
    pub waiting: Vec<Waiting>,
}

/// A service's tasks waiting for a place, and why (the scheduler's last word on them).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiting {
    pub service: String,
    pub pool: String,
    pub tasks: u32,
    /// `None` until the scheduler has tried.
    pub reason: Option<String>,
}

/// A user's role in a project.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub username: String,
    pub role: crate::auth::Role,
}

/// `PUT /api/v1/projects/{name}/members/{username}`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberInput {
    /// Admins are admins in every project.
    pub role: crate::auth::ProjectRole,
}

/// Checks a project body; returns the project to store.
pub fn validate(input: &ProjectInput) -> Result<Project, ValidationErrors> {
    let mut e = Errors::default();
    if !ids::is_valid_name(&input.name) {
        e.add("name", ids::NAME_RULE);
    }
    let weight = input.weight.unwrap_or(1);
    if !(1..=MAX_WEIGHT).contains(&weight) {
        e.add(
            "weight",
            format!("must be between 1 and {MAX_WEIGHT}, got {weight}"),
        );
    }
    if input.quotas.len() > MAX_QUOTAS {
        e.add(
            "quotas",
            format!(
                "at most {MAX_QUOTAS} (one per pool), got {}",
                input.quotas.len()
            ),
        );
    }
    let mut pools = BTreeSet::new();
    for (i, q) in input.quotas.iter().enumerate() {
        if PoolName::new(q.pool.clone()).is_err() {
            e.add(&format!("quotas[{i}].pool"), ids::NAME_RULE);
        } else if !pools.insert(q.pool.as_str()) {
            e.add(
                &format!("quotas[{i}].pool"),
                format!("pool {:?} has a quota already: one per pool", q.pool),
            );
        }
        for (which, amounts) in [("guaranteed", &q.guaranteed), ("limit", &q.limit)] {
            for (v, (field, _)) in amounts.values().into_iter().zip(QUANTITIES) {
                if let Some(v) = v.filter(|v| *v > MAX_AMOUNT) {
                    e.add(
                        &format!("quotas[{i}].{which}.{field}"),
                        format!("must be at most {MAX_AMOUNT}, got {v}"),
                    );
                }
            }
        }
        let limit = q.limit.values();
        for ((guaranteed, limit), (field, words)) in
            q.guaranteed.values().into_iter().zip(limit).zip(QUANTITIES)
        {
            if let (Some(g), Some(l)) = (guaranteed, limit)
                && g > l
            {
                e.add(
                    &format!("quotas[{i}].limit.{field}"),
                    format!("must be at least the guarantee ({g} {words}), got {l}"),
                );
            }
        }
    }
    e.finish()?;
    Ok(Project {
        name: input.name.clone(),
        weight,
        quotas: input.quotas.clone(),
        created_at: Timestamp::EPOCH,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(pool: &str, g: Amounts, l: Amounts) -> Quota {
        Quota {
            pool: pool.into(),
            guaranteed: g,
            limit: l,
        }
    }

    fn gpus(n: u64) -> Amounts {
        Amounts {
            gpus: Some(n),
            ..Default::default()
        }
    }

    fn input(quotas: Vec<Quota>) -> ProjectInput {
        ProjectInput {
            name: "research".into(),
            weight: None,
            quotas,
        }
    }

    #[test]
    fn a_limit_below_its_guarantee_a_second_quota_for_a_pool_and_bad_names_are_refused() {
        let err = validate(&ProjectInput {
            name: "Bad Name".into(),
            weight: Some(0),
            quotas: vec![
                quota("gpu", gpus(4), gpus(2)),
                quota("gpu", gpus(1), Amounts::default()),
                quota("no such", Amounts::default(), Amounts::default()),
            ],
        })
        .unwrap_err();
        let fields: Vec<&str> = err.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "name",
                "weight",
                "quotas[0].limit.gpus",
                "quotas[1].pool",
                "quotas[2].pool"
            ]
        );
        assert!(
            err.errors[2]
                .message
                .contains("at least the guarantee (4 whole GPUs)")
        );
    }

    #[test]
    fn a_valid_project_keeps_its_quotas_and_defaults_its_weight() {
        let p = validate(&input(vec![quota("gpu", gpus(2), gpus(6))])).unwrap();
        assert_eq!(p.weight, 1);
        assert_eq!(p.quota("gpu").unwrap().limit.gpus, Some(6));
        assert!(p.quota("cpu").is_none());
    }

    #[test]
    fn usage_names_the_first_quantity_past_a_limit_and_shortfalls_name_each() {
        let used = Usage {
            gpus: 3,
            gpu_memory_mib: 100,
            ..Default::default()
        };
        assert_eq!(used.exceeds(&gpus(3)), None);
        assert_eq!(used.exceeds(&gpus(2)).as_deref(), Some("3 of 2 whole GPUs"));
        assert_eq!(used.exceeds(&Amounts::default()), None, "no limit given");
        let have = Usage {
            gpus: 2,
            gpu_memory_mib: 50,
            ..Default::default()
        };
        let short = have.shortfalls(&used);
        assert_eq!(short.len(), 2);
        assert_eq!(short[0].0, "gpus");
        assert!(
            short[0]
                .1
                .starts_with("1 whole GPUs short: 3 guaranteed in all")
        );
        assert_eq!(used.above(&have).gpus, 1);
        assert_eq!(used.describe(), "3 GPUs, 100 MiB GPU memory");
        assert_eq!(Usage::default().describe(), "none");
        let limit = Amounts {
            compute_milli: Some(1500),
            cpu_milli: Some(4000),
            ..Default::default()
        };
        assert_eq!(limit.describe(), "1.50 GPU compute, 4 CPU");
        assert!(have.above(&used).is_zero());
    }
}

/// A task a preemption stopped.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preempted {
    pub task: String,
    pub service: String,
    pub project: String,
    pub priority: crate::inventory::PriorityClass,
}

/// A preemption: a waiting task of `service` takes (or, proposed, asks for) room on `host`
/// by stopping `victims`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    pub id: i64,
    pub state: PreemptionState,
    /// The waiting task the plan was made for.
    pub task: String,
    pub at: Timestamp,
    pub pool: String,
    pub host: String,
    pub service: String,
    pub project: String,
    pub priority: crate::inventory::PriorityClass,
    pub victims: Vec<Preempted>,
}

impl Preemption {
    /// Whether `project` took room or lost it in it.
    pub fn involves(&self, project: &str) -> bool {
        self.project == project || self.victims.iter().any(|v| v.project == project)
    }
}

/// What a project held in a pool at one time (a 5-minute bucket's sample).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageSample {
    pub project: String,
    pub pool: String,
    /// Unix seconds: the bucket's start.
    pub at: i64,
    pub used: Usage,
}

/// `GET /api/v1/projects/{name}/usage`: a project's use over time, and each pool's
/// capacity now (to read shares against).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageHistory {
    /// Unix seconds.
    pub from: i64,
    pub to: i64,
    pub samples: Vec<UsageSample>,
    /// Per pool, what its hosts offer now.
    pub capacity: Vec<PoolCapacity>,
}

/// What a pool's hosts offer (every host not lost).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCapacity {
    pub pool: String,
    pub capacity: Usage,
}

/// Whether `caller` has `needed` in `project` ([`crate::auth::Caller::role_in`]); `Err` says
/// why not.
pub fn may_act_in(
    caller: &crate::auth::Caller,
    project: &str,
    needed: crate::auth::Role,
) -> Result<(), String> {
    match caller.role_in(project) {
        Some(r) if r.allows(needed) => Ok(()),
        Some(r) => Err(format!(
            "this needs the {needed} role in project {project}; {} has {r} there",
            caller.actor()
        )),
        None => Err(format!(
            "{} acts in project {} only, not {project}",
            caller.actor(),
            caller.project.as_deref().unwrap_or_default()
        )),
    }
}

/// Whether `caller` may put a service into `project` (create it there, or move it there):
/// an operator there, and for a project other than `default`, one given the role in that
/// project itself (or an admin), since its quotas are that project's. The authentication
/// layer asks this for an operation whose scope is [`crate::operations::Scope::Into`] or
/// [`crate::operations::Scope::MovedInto`]. `Err` says why not.
pub fn may_put_in(caller: &crate::auth::Caller, project: &str) -> Result<(), String> {
    may_act_in(caller, project, crate::auth::Role::Operator)?;
    if project != DEFAULT_PROJECT && !caller.given_in(project, crate::auth::Role::Operator) {
        return Err(format!(
            "putting a service into project {project} needs the operator role given in that project (or an admin); {} has none there",
            caller.actor()
        ));
    }
    Ok(())
}

/// Whether `caller` may ask for priority class `priority` (`None`: the class is not being
/// set): the `production` class (whom a service may preempt) is the admin's to give; when
/// `changes_class` (an existing service's), any class is. A rule on what the request asks
/// for, beside its access: REST and the console's server functions both ask it.
pub fn may_set_class(
    caller: &crate::auth::Caller,
    priority: Option<crate::inventory::PriorityClass>,
    changes_class: bool,
) -> Result<(), String> {
    let class_is_admins = changes_class && priority.is_some()
        || priority == Some(crate::inventory::PriorityClass::Production);
    if class_is_admins && caller.role != crate::auth::Role::Admin {
        return Err(
            "a service's priority class is the admin's to give (a higher class may preempt other projects' tasks)"
                .into(),
        );
    }
    Ok(())
}
