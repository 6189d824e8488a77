//! `tessera get`: hosts, services, tasks, task definitions, a service's endpoints or its
//! work, as tables (`-o wide` adds columns) or JSON.

use super::print_json;
use crate::commands::hosts::host_status;
use crate::lb;
use crate::table::Table;
use crate::{Client, Kind, Output, seg};
use anyhow::Context;
use tessera_model::HostInfo;
use tessera_model::api::EndpointList;
use tessera_model::bodies::{
    FamilyList, HostList, MachineList, PoolList, ProjectList, ServiceList, TaskList,
};
use tessera_model::service::Task;

fn gpus_summary(h: &HostInfo) -> String {
    let mut models: Vec<(String, usize)> = Vec::new();
    for g in &h.gpus {
        let short = g.model.trim_start_matches("NVIDIA ").to_owned();
        match models.iter_mut().find(|(m, _)| *m == short) {
            Some((_, n)) => *n += 1,
            None => models.push((short, 1)),
        }
    }
    models
        .iter()
        .map(|(m, n)| format!("{n}x {m}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn allocation(t: &Task) -> String {
    t.allocations
        .iter()
        .map(|a| {
            if a.dedicated {
                format!("gpu{} whole", a.index)
            } else {
                format!("gpu{} {} {}", a.index, a.memory, a.compute)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn task_note(t: &Task) -> String {
    t.stop_reason
        .clone()
        .or(t.placement_message.clone())
        .unwrap_or_default()
}

/// A service's work: the figures now, then (wide) its history, interference, alarms and
/// autoscaling.
fn print_work(w: &tessera_model::work::ServiceWork, wide: bool) {
    use tessera_model::work::trim_float;
    let num = |v: Option<f64>| {
        v.map_or_else(|| "-".to_owned(), |v| trim_float((v * 10.0).round() / 10.0))
    };
    let Some(spec) = &w.spec else {
        say!(
            "{}: its task definition does not say where its work is measured (`work`)",
            w.service
        );
        return;
    };
    let mut t = Table::new(&[
        "SERVICE",
        "COMPLETED/S",
        "PER GPU-HOUR",
        "PER GIB/S",
        "P99 MS",
        "ERRORS",
        "TASKS",
        "TARGET",
    ]);
    t.row(vec![
        w.service.clone(),
        num(w.completed_per_sec),
        num(w.completed_per_gpu_hour),
        num(w.completed_per_sec_per_gib),
        num(w.latency_p99_ms),
        w.error_rate
            .map_or_else(|| "-".to_owned(), |r| format!("{:.2}%", r * 100.0)),
        format!("{} ({} unknown)", w.tasks_measured, w.tasks_unknown),
        w.verdict.clone().unwrap_or_else(|| "-".into()),
    ]);
    t.print();
    say!(
        "measured: {} on port {} at {}",
        spec.completed,
        spec.port,
        spec.path
    );
    for (task, why) in &w.unknown {
        say!(
            "unknown: {}: {why}",
            task.chars().take(8).collect::<String>()
        );
    }
    for e in &w.interference {
        say!("{}", e.summary);
    }
    for a in &w.alarms {
        say!(
            "alarm {}: {}{}",
            a.alarm.describe(),
            a.state,
            a.value
                .map(|v| format!(" (now {})", num(Some(v))))
                .unwrap_or_default()
        );
    }
    if let Some(s) = &w.autoscaling {
        say!("autoscaling: {s}");
    }
    if wide {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let mut h = Table::new(&[
            "SINCE",
            "COMPLETED/S",
            "ERROR RATE",
            "P50 MS",
            "P95 MS",
            "P99 MS",
            "TASKS",
        ]);
        for p in &w.series {
            h.row(vec![
                format!("{} s ago", now - p.at),
                num(Some(p.completed_per_sec)),
                p.error_rate
                    .map_or_else(|| "-".to_owned(), |r| format!("{:.2}%", r * 100.0)),
                num(p.latency_p50_ms),
                num(p.latency_p95_ms),
                num(p.latency_p99_ms),
                p.tasks.to_string(),
            ]);
        }
        h.print();
    }
}

/// Pools, their policy and hosts, and their capacity providers: the limits, and (wide)
/// the machines booting, active and terminating, and the last failed launch.
async fn get_pools(c: &Client, output: Output, wide: bool) -> anyhow::Result<()> {
    let list: PoolList = c.get("/api/v1/pools").await?;
    let hosts: HostList = c.get("/api/v1/hosts").await?;
    let mut machines = std::collections::BTreeMap::new();
    if wide || output == Output::Json {
        for p in list.pools.iter().filter(|p| p.provider.is_some()) {
            let m: MachineList = c
                .get(&format!("/api/v1/pools/{}/machines", seg(p.name.as_str())))
                .await?;
            machines.insert(p.name.to_string(), m.machines);
        }
    }
    if output == Output::Json {
        return print_json(&serde_json::json!({"pools": list.pools, "machines": machines}));
    }
    let mut t = Table::new(&[
        "POOL", "POLICY", "HOSTS", "PROVIDER", "MIN", "MAX", "TARGET",
    ]);
    if wide {
        t.add_columns(&["BOOTING", "ACTIVE", "TERMINATING", "LAST FAILED"]);
    }
    for p in &list.pools {
        let n = hosts.hosts.iter().filter(|h| h.pool == p.name).count();
        let mut row = vec![p.name.to_string(), p.policy.to_string(), n.to_string()];
        match &p.provider {
            Some(pr) => row.extend([
                pr.kind.to_string(),
                pr.min_hosts.to_string(),
                pr.max_hosts.to_string(),
                format!("{} %", pr.target_capacity_percent),
            ]),
            None => row.extend(["-".to_owned(), "-".into(), "-".into(), "-".into()]),
        }
        if wide {
            let of = machines
                .get(p.name.as_str())
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let count = |s: tessera_model::provider::MachineState| {
                of.iter().filter(|m| m.state == s).count().to_string()
            };
            use tessera_model::provider::MachineState as S;
            row.extend([
                count(S::Booting),
                count(S::Active),
                count(S::Terminating),
                of.iter()
                    .find(|m| m.state == S::Failed)
                    .map(|m| format!("{}: {}", m.id, m.reason))
                    .unwrap_or_default(),
            ]);
        }
        t.row(row);
    }
    t.print();
    Ok(())
}

pub(crate) async fn get(
    c: &Client,
    kind: Kind,
    output: Output,
    service: Option<String>,
    host: Option<String>,
    project: Option<String>,
) -> anyhow::Result<()> {
    let wide = output == Output::Wide;
    match kind {
        Kind::Hosts => {
            let list: HostList = c.get("/api/v1/hosts").await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&["HOST", "POOL", "STATUS", "GPUS"]);
            if wide {
                t.add_columns(&["CPU", "MEMORY", "LAST SEEN", "REASON"]);
            }
            for h in &list.hosts {
                let mut row = vec![
                    h.id.to_string(),
                    h.pool.to_string(),
                    host_status(h),
                    gpus_summary(h),
                ];
                if wide {
                    row.extend([
                        h.cpu.to_string(),
                        h.memory.to_string(),
                        h.last_seen.map(|t| t.to_string()).unwrap_or_default(),
                        h.status_reason.clone().unwrap_or_default(),
                    ]);
                }
                t.row(row);
            }
            t.print();
        }
        Kind::Pools => get_pools(c, output, wide).await?,
        Kind::Projects => {
            let mut list: ProjectList = c.get("/api/v1/projects").await?;
            if let Some(p) = &project {
                list.projects.retain(|v| &v.project.name == p);
            }
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&["PROJECT", "POOL", "GUARANTEED", "LIMIT", "USED", "PENDING"]);
            if wide {
                t.add_columns(&["BORROWED", "WEIGHT", "SERVICES", "MEMBERS"]);
            }
            for p in &list.projects {
                let rows: Vec<Vec<String>> = if p.pools.is_empty() {
                    vec![vec![
                        p.project.name.clone(),
                        "-".into(),
                        "none".into(),
                        "no limit".into(),
                        "none".into(),
                        "0".into(),
                    ]]
                } else {
                    p.pools
                        .iter()
                        .map(|s| {
                            vec![
                                p.project.name.clone(),
                                s.pool.clone(),
                                s.guaranteed.describe(),
                                if s.limit == Default::default() {
                                    "no limit".into()
                                } else {
                                    s.limit.describe()
                                },
                                s.used.describe(),
                                s.pending.to_string(),
                            ]
                        })
                        .collect()
                };
                for (i, mut row) in rows.into_iter().enumerate() {
                    if wide {
                        let borrowed = p.pools.get(i).map(|s| s.borrowed.describe());
                        row.extend([
                            borrowed.unwrap_or_else(|| "none".into()),
                            p.project.weight.to_string(),
                            p.services.to_string(),
                            if p.members.is_empty() {
                                "-".into()
                            } else {
                                p.members
                                    .iter()
                                    .map(|m| format!("{}:{}", m.username, m.role))
                                    .collect::<Vec<_>>()
                                    .join(",")
                            },
                        ]);
                    }
                    t.row(row);
                }
            }
            t.print();
        }
        Kind::Services => {
            let uri = match &project {
                Some(p) => format!(
                    "/api/v1/services?project={}",
                    tessera_model::urlenc::encode(p)
                ),
                None => "/api/v1/services".to_owned(),
            };
            let list: ServiceList = c.get(&uri).await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&[
                "SERVICE",
                "TASK DEFINITION",
                "DESIRED",
                "RUNNING",
                "PENDING",
                "POOL",
            ]);
            if wide {
                t.add_columns(&["DEPLOYMENTS", "STRATEGY"]);
            }
            for s in &list.services {
                let mut row = vec![
                    s.service.name.clone(),
                    s.service.task_definition.to_string(),
                    s.service.desired_count.to_string(),
                    s.running.to_string(),
                    s.pending.to_string(),
                    s.service.pool.to_string(),
                ];
                if wide {
                    row.push(
                        s.deployments
                            .iter()
                            .map(|d| format!("{} {}", d.task_definition, d.status))
                            .collect::<Vec<_>>()
                            .join(", "),
                    );
                    row.push(
                        s.service
                            .strategy
                            .map_or_else(|| "pool's".to_owned(), |p| p.to_string()),
                    );
                }
                t.row(row);
            }
            t.print();
        }
        Kind::Tasks => {
            let mut query = Vec::new();
            if let Some(s) = &service {
                query.push(format!("service={}", seg(s)));
            }
            if let Some(h) = &host {
                query.push(format!("host={}", seg(h)));
            }
            if let Some(p) = &project {
                query.push(format!("project={}", seg(p)));
            }
            let list: TaskList = c.get(&format!("/api/v1/tasks?{}", query.join("&"))).await?;
            if output == Output::Json {
                return print_json(&list);
            }
            print_tasks(&list.tasks, wide);
        }
        Kind::Endpoints => {
            let service = service.context("which service? `tessera get endpoints SERVICE`")?;
            let list: EndpointList = c
                .get(&format!("/api/v1/services/{}/endpoints", seg(&service)))
                .await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&["TASK", "HOST", "ADDRESS", "PORT", "HEALTH", "REASON"]);
            if wide {
                t.add_columns(&["PROTOCOL", "TASK DEFINITION"]);
            }
            for e in &list.endpoints {
                let mut row = vec![
                    e.task.chars().take(8).collect(),
                    e.host.to_string(),
                    lb::host_port(&e.address, e.port),
                    e.port_name
                        .clone()
                        .unwrap_or_else(|| e.container_port.to_string()),
                    e.health.as_str().to_owned(),
                    // A check's output can run to several lines: its first.
                    e.reason
                        .as_deref()
                        .and_then(|r| r.lines().next())
                        .unwrap_or_default()
                        .to_owned(),
                ];
                if wide {
                    row.extend([
                        e.protocol.as_str().to_owned(),
                        e.task_definition.to_string(),
                    ]);
                }
                t.row(row);
            }
            t.print();
        }
        Kind::Work => {
            let service = service.context("which service? `tessera get work SERVICE`")?;
            let w: tessera_model::work::ServiceWork = c
                .get(&format!("/api/v1/services/{}/work", seg(&service)))
                .await?;
            if output == Output::Json {
                return print_json(&w);
            }
            print_work(&w, wide);
        }
        Kind::TaskDefinitions => {
            let list: FamilyList = c.get("/api/v1/task-definitions").await?;
            if output == Output::Json {
                return print_json(&list);
            }
            let mut t = Table::new(&["FAMILY", "REVISION", "CONTAINERS", "GPU"]);
            if wide {
                t.add_columns(&["IMAGES", "REGISTERED"]);
            }
            for d in &list.task_definitions {
                let gpu = d
                    .spec
                    .containers
                    .iter()
                    .filter_map(|c| c.gpu.as_ref().map(gpu_text))
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut row = vec![
                    d.family.clone(),
                    d.revision.to_string(),
                    d.spec.containers.len().to_string(),
                    if gpu.is_empty() { "-".into() } else { gpu },
                ];
                if wide {
                    row.push(
                        d.spec
                            .containers
                            .iter()
                            .filter_map(|c| c.image.clone())
                            .collect::<Vec<_>>()
                            .join(", "),
                    );
                    row.push(d.registered_at.to_string());
                }
                t.row(row);
            }
            t.print();
        }
    }
    Ok(())
}

fn gpu_text(g: &tessera_model::taskdef::GpuRequirement) -> String {
    use tessera_model::taskdef::GpuRequirement;
    match g {
        GpuRequirement::Gpus(n) => format!("{n} whole"),
        GpuRequirement::Mps {
            memory_mib,
            max_compute_percent,
        } => match max_compute_percent {
            Some(p) => format!("MPS {} {}%", memory_mib, p.get()),
            None => format!("MPS {memory_mib}"),
        },
    }
}

pub(super) fn print_tasks(tasks: &[Task], wide: bool) {
    let mut t = Table::new(&["TASK", "SERVICE", "STATE", "HOST", "GPU"]);
    if wide {
        t.add_columns(&["TASK DEFINITION", "STARTED", "NOTE"]);
    }
    for task in tasks {
        let mut row = vec![
            task.id.clone(),
            task.service.clone(),
            format!(
                "{}{}",
                task.state,
                if task.migrating { " (moving)" } else { "" }
            ),
            task.host
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_else(|| "-".into()),
            allocation(task),
        ];
        if wide {
            row.extend([
                task.task_definition.to_string(),
                task.started_at.map(|t| t.to_string()).unwrap_or_default(),
                task_note(task),
            ]);
        }
        t.row(row);
    }
    t.print();
}
