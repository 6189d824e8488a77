//! `tessera describe`: everything about one service (deployments, tasks, events), one
//! host (GPUs, tasks) or one task (how it went, where, its failures, events, last lines).

use crate::commands::get::print_tasks;
use crate::table::Table;
use crate::{Client, Described, seg};
use tessera_model::api::{ServiceDetail, TaskDetail, TaskLastOutput};
use tessera_model::bodies::{HostDetail, TaskList};
use tessera_model::service::Task;

pub(crate) async fn describe(c: &Client, kind: Described, name: &str) -> anyhow::Result<()> {
    match kind {
        Described::Service => {
            let s: ServiceDetail = c.get(&format!("/api/v1/services/{}", seg(name))).await?;
            let svc = &s.service;
            say!("Service:          {}", svc.name);
            say!("Task definition:  {}", svc.task_definition);
            say!("Pool:             {}", svc.pool);
            say!(
                "Tasks:            {} desired, {} running, {} pending",
                svc.desired_count,
                s.running,
                s.pending
            );
            say!(
                "Strategy:         {}",
                svc.strategy
                    .map_or_else(|| "the pool's".to_owned(), |p| p.to_string())
            );
            say!(
                "Deployment:       minimum healthy {}%, maximum {}%; stop timeout {} s",
                svc.deployment.minimum_healthy_percent,
                svc.deployment.maximum_percent,
                svc.stop_timeout_secs
            );
            if svc.deleting {
                say!("Being deleted:    its tasks are stopping");
            }
            say!("\nDeployments:");
            let mut t = Table::new(&[
                "ID",
                "TASK DEFINITION",
                "STATUS",
                "RUNNING",
                "PENDING",
                "FAILED",
            ]);
            for d in &s.deployments {
                t.row(vec![
                    d.id.to_string(),
                    d.task_definition.to_string(),
                    d.status.to_string(),
                    d.running.to_string(),
                    d.pending.to_string(),
                    d.failed_tasks.to_string(),
                ]);
            }
            t.print();
            let tasks: TaskList = c
                .get(&format!("/api/v1/tasks?service={}", seg(name)))
                .await?;
            let (live, stopped): (Vec<Task>, Vec<Task>) =
                tasks.tasks.into_iter().partition(|t| t.state.is_live());
            say!("\nTasks:");
            print_tasks(&live, false);
            if !stopped.is_empty() {
                say!(
                    "({} stopped not shown: `tessera get tasks --service {name} -o wide`)",
                    stopped.len()
                );
            }
            say!("\nEvents:");
            for e in s.events.iter().take(15).rev() {
                say!("  {}  {}", e.at, e.message);
            }
        }
        Described::Host => {
            let h: HostDetail = c.get(&format!("/api/v1/hosts/{}", seg(name))).await?;
            let host = &h.host;
            say!("Host:     {}", host.id);
            say!("Pool:     {}", host.pool);
            say!(
                "Status:   {}{}",
                host.status,
                host.status_reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            );
            say!("CPU:      {}    Memory: {}", host.cpu, host.memory);
            say!(
                "Seen:     {}{}",
                host.last_seen
                    .map_or_else(|| "never".to_owned(), |t| t.to_string()),
                if host.simulated {
                    " (simulated GPUs)"
                } else {
                    ""
                }
            );
            if !host.labels.is_empty() {
                let labels: Vec<String> = host
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                say!("Labels:   {}", labels.join(", "));
            }
            say!("\nGPUs:");
            let mut t = Table::new(&["INDEX", "MODEL", "MEMORY", "SHARING", "HEALTH", "TASKS"]);
            for g in &host.gpus {
                let on = h
                    .tasks
                    .iter()
                    .filter(|t| t.allocations.iter().any(|a| a.gpu == g.uuid))
                    .count();
                t.row(vec![
                    g.index.to_string(),
                    g.model.clone(),
                    g.memory.to_string(),
                    g.sharing_mode.to_string(),
                    g.health.to_string(),
                    on.to_string(),
                ]);
            }
            t.print();
            say!("\nTasks:");
            print_tasks(&h.tasks, false);
        }
        Described::Task => describe_task(c, name).await?,
    }
    Ok(())
}

/// One task: how it went, where it runs, its deployment's failures, its events, and its
/// last lines when it stopped (for operators of its project; a viewer is told why not).
async fn describe_task(c: &Client, id: &str) -> anyhow::Result<()> {
    let d: TaskDetail = c.get(&format!("/api/v1/tasks/{}", seg(id))).await?;
    let t = &d.task;
    say!("Task:             {}", t.id);
    say!("Service:          {}", t.service);
    say!(
        "Revision:         {}{}",
        t.task_definition,
        match &d.service_revision {
            Some(r) if *r != t.task_definition => format!(" (the service now runs {r})"),
            _ => String::new(),
        }
    );
    say!("State:            {}", t.state);
    say!("Created:          {}", t.created_at);
    if let Some(s) = t.started_at {
        say!("Started:          {s}");
    }
    if let Some(s) = t.stopped_at {
        say!(
            "Stopped:          {s}{}",
            t.how_it_ended()
                .map(|h| format!(" ({h})"))
                .unwrap_or_default()
        );
    }
    if let Some(h) = &t.host {
        say!(
            "Host:             {h}{}",
            d.host_status.map(|s| format!(" ({s})")).unwrap_or_default()
        );
    }
    for a in &t.allocations {
        say!(
            "GPU {}:            {} GPU memory, {} compute",
            a.index,
            a.memory,
            a.compute
        );
    }
    if let Some(p) = t.measured.gpu_memory_peak {
        say!("Measured peak:    {p} of {} budget", d.budget_mib);
    }
    if let Some(f) = &d.failures {
        say!(
            "Crash-looping:    {} task(s) of deployment {} failed; new ones wait {} s",
            f.failed_tasks,
            f.deployment,
            f.restart_delay_secs
        );
    }
    say!("\nEvents:");
    for e in d.events.iter().take(15).rev() {
        say!("  {}  {}", e.at, e.message);
    }
    if t.state.is_live() {
        return Ok(());
    }
    let path = format!(
        "/api/v1/services/{}/tasks/{}/last-output",
        seg(&t.service),
        seg(&t.id)
    );
    match c.get::<TaskLastOutput>(&path).await {
        Ok(o) => {
            say!("\nLast lines:");
            say!(
                "{}",
                o.last_output
                    .as_deref()
                    .unwrap_or("(it wrote nothing before it ended, or its agent did not say)")
            );
        }
        Err(e) => say!("\nLast lines: not shown: {e:#}"),
    }
    Ok(())
}
