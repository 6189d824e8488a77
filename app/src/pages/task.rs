//! One task (`/tasks/{id}`): how it went (created, started, stopped, with why and its exit
//! code), where it runs (host, GPUs, ports, health), its budget against what was measured,
//! the revision it runs against its service's current one, its deployment's failures (a
//! crash loop stands out) and the events that name it. Its last lines are read on request,
//! by operators of its project (output may hold secrets; every read is audited).

use crate::access::{Declaration, guard, ops};
use crate::components::{ErrorList, EventList, RoleHint, measured_text};
use crate::fit::{Chart, Series};
use crate::live::use_live;
use crate::pages::task_definition::{DiffLine, diff_lines};
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;
use tessera_model::HostStatus;
use tessera_model::api::{TaskDetail, TaskLastOutput};
use tessera_model::service::{Task, TaskState};

/// The task, and when it runs another revision than its service, both revisions' specs
/// (pretty JSON) to compare.
type TaskPageData = (TaskDetail, Option<(String, String)>);

/// Reads a stopped task's last lines: (service, task) in, (task, what was read) out.
type OutputAction = Action<(String, String), (String, Result<TaskLastOutput, ServerFnError>)>;

#[server]
pub async fn get_task_page(id: String) -> Result<TaskPageData, ServerFnError> {
    use crate::data::ssr::{control, failed};
    let control = control()?;
    let views = control.views();
    let detail = views.task_detail(&id).await.map_err(failed)?;
    let revisions = match &detail.service_revision {
        Some(current) if *current != detail.task.task_definition => {
            let pretty = |d: tessera_model::service::TaskDefinition| {
                serde_json::to_string_pretty(&d.spec).unwrap_or_default()
            };
            let mine = views
                .get_task_definition(&detail.task.task_definition)
                .await;
            let now = views.get_task_definition(current).await;
            match (mine, now) {
                (Ok(a), Ok(b)) => Some((pretty(a), pretty(b))),
                // A revision deleted since: nothing to compare.
                _ => None,
            }
        }
        _ => None,
    };
    Ok((detail, revisions))
}

guard!(GetTaskPage, Declaration::VIEW);

/// How a task of service `name` ended and the last lines it wrote.
#[server]
pub async fn read_last_output(
    name: String,
    task: String,
) -> Result<tessera_model::api::TaskLastOutput, ServerFnError> {
    crate::data::ssr::control()?
        .views()
        .task_last_output(&name, &task)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(ReadLastOutput, ops::READ_SERVICE_OUTPUT);

/// A task id as lists show it: its first eight characters.
pub fn short_id(id: &str) -> &str {
    &id[..8.min(id.len())]
}

#[component]
pub fn TaskPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let live = use_live();
    let data = Resource::new(move || (live(), id()), |(_, id)| get_task_page(id));
    // Held here, not in the panel: a live refresh redraws the panel, and what was read
    // stays on the page.
    let output = Action::new(|(service, task): &(String, String)| {
        let (service, task) = (service.clone(), task.clone());
        async move { (task.clone(), read_last_output(service, task).await) }
    });
    let logs = super::task_logs::LogsState::new();
    on_cleanup(super::task_logs::stop);
    view! {
        <Title text=move || format!("Task {}", short_id(&id())) />
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    data.await.map(|(detail, revisions)| view! { <TaskBody detail revisions output logs /> })
                })}
            </ErrorBoundary>
        </Transition>
    }
}

#[component]
fn TaskBody(
    detail: TaskDetail,
    revisions: Option<(String, String)>,
    output: OutputAction,
    logs: super::task_logs::LogsState,
) -> impl IntoView {
    let t = detail.task.clone();
    let short = short_id(&t.id).to_owned();
    let lede = format!(
        "{} of service {} in pool {}{}",
        t.task_definition,
        t.service,
        t.pool,
        detail
            .project
            .as_ref()
            .map(|p| format!(", project {p}"))
            .unwrap_or_else(|| " (the service is deleted)".into())
    );
    let crash = detail.failures.clone().map(|f| {
        view! {
            <p class="notice crash-loop" role="alert">
                {format!(
                    "Crash-looping: {} task(s) of deployment #{} exited on their own with a non-zero code{}.",
                    f.failed_tasks,
                    f.deployment,
                    if f.restart_delay_secs > 0 {
                        format!("; each new task waits {} s before it starts", f.restart_delay_secs)
                    } else {
                        String::new()
                    }
                )}
            </p>
        }
    });
    view! {
        <p class="crumbs">
            <a href="/services">"Services"</a> " / "
            <a href=format!("/services/{}", t.service)>{t.service.clone()}</a> " / "
            {format!("task {short}")}
        </p>
        <div class="page-head">
            <h1>"Task " <code>{short.clone()}</code> " "
                <span class=format!("badge task-state state-{}", t.state.as_str())>{t.state.as_str()}</span>
            </h1>
            <p class="lede">{lede}</p>
        </div>
        {crash}
        <Lifecycle t=t.clone() host_status=detail.host_status />
        <Output t=t.clone() project=detail.project.clone() output logs />
        <Placement t=t.clone() />
        <Usage detail=detail.clone() />
        <Revision t=t.clone() current=detail.service_revision.clone() revisions />
        <section class="panel">
            <h2>"Events"</h2>
            <EventList events=detail.events />
        </section>
    }
}

/// Each state it went through, with times and why it stopped.
#[component]
fn Lifecycle(t: Task, host_status: Option<HostStatus>) -> impl IntoView {
    let stopped = t.stopped_at.map(|s| {
        let how = t.how_it_ended().unwrap_or_default();
        view! { <tr class="stopped"><th>"Stopped"</th><td>{s.short()}</td><td class="reason">{how}</td></tr> }
    });
    let host_note = match host_status {
        Some(HostStatus::Lost) => Some(
            "its host is lost: what it wrote there cannot be reached; its last lines are kept here",
        ),
        Some(HostStatus::Impaired) => Some("its host is impaired"),
        _ => None,
    };
    view! {
        <section class="panel">
            <h2>"Lifecycle"</h2>
            <table class="table lifecycle">
                <tbody>
                    <tr><th>"Created"</th><td>{t.created_at.short()}</td>
                        <td class="reason">{(t.state == TaskState::Pending).then(|| t.placement_message.clone().unwrap_or_else(|| "waiting for a placement".into()))}</td></tr>
                    {t.started_at.map(|s| view! { <tr><th>"Started"</th><td>{s.short()}</td><td></td></tr> })}
                    {(t.state == TaskState::Stopping).then(|| view! {
                        <tr><th>"Stopping"</th><td></td><td class="reason">{t.stop_reason.clone().unwrap_or_default()}</td></tr>
                    })}
                    {stopped}
                </tbody>
            </table>
            {host_note.map(|n| view! { <p class="muted">{n}</p> })}
        </section>
    }
}

/// The last lines it wrote, read on request: operators of its project.
#[component]
fn Output(
    t: Task,
    project: Option<String>,
    output: OutputAction,
    logs: super::task_logs::LogsState,
) -> impl IntoView {
    let allowed = crate::access::allowed_in::<ReadLastOutput>(Signal::stored(project));
    let stopped = t.state == TaskState::Stopped;
    let key = (t.service.clone(), t.id.clone());
    let id = t.id.clone();
    view! {
        <section class="panel output" aria-label="Output">
            <h2>"Output"</h2>
            {if stopped {
                view! {
                    <button type="button" class="last-output-button" title=move || allowed.get()
                        disabled=move || allowed.get().is_some()
                        on:click=move |_| { output.dispatch(key.clone()); }>
                        "Show its last lines"
                    </button>
                    <RoleHint reason=allowed />
                }.into_any()
            } else {
                view! { <p class="muted">"Its last lines are kept when it stops; its logs are read from its host."</p> }.into_any()
            }}
            {move || output.value().get().filter(|(task, _)| *task == id).map(|(_, r)| last_output_view(r))}
            {t.host.is_some().then(|| view! { <super::task_logs::LogsPanel task_id=t.id.clone() allowed state=logs /> })}
        </section>
    }
}

/// How a task ended and its last lines, or why they could not be read.
pub fn last_output_view(r: Result<TaskLastOutput, ServerFnError>) -> AnyView {
    match r {
        Ok(o) => {
            let head = format!(
                "{}{}",
                o.exit_code
                    .map(|c| format!("exit code {c}"))
                    .unwrap_or_else(|| "no exit code".into()),
                o.host.map(|h| format!(" on {h}")).unwrap_or_default()
            );
            view! {
                <div class="last-output" role="region" aria-label="Last lines">
                    <p class="muted">{head}</p>
                    {match o.last_output {
                        Some(text) => view! { <pre>{text}</pre> }.into_any(),
                        None => view! { <p class="muted">"It wrote nothing before it ended (or its agent did not say)."</p> }.into_any(),
                    }}
                </div>
            }
            .into_any()
        }
        Err(e) => view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any(),
    }
}

/// Where it runs: its host, GPUs, ports and health.
#[component]
fn Placement(t: Task) -> impl IntoView {
    let gpus = t
        .allocations
        .iter()
        .map(|a| {
            let share = if a.dedicated {
                "the whole GPU".to_owned()
            } else {
                format!("{:.1} % of its compute", f64::from(a.compute.0) / 10.0)
            };
            view! { <li>{format!("GPU {}: {}, {share}", a.index, a.memory)}</li> }
        })
        .collect_view();
    let ports = t
        .ports
        .iter()
        .map(|p| {
            let at = p.host_port.map_or_else(|| "not bound yet".to_owned(), |h| format!("host port {h}"));
            view! { <li>{format!("{} {} ({}/{}) → {at}", p.container, p.name.clone().unwrap_or_default(), p.container_port, p.protocol.as_str())}</li> }
        })
        .collect_view();
    let health = t.health.map(|h| {
        view! {
            <p>"Health: " <span class=format!("health-{}", h.as_str())>{h.as_str()}</span>
                {t.health_output.clone().map(|o| view! { <pre class="health-output">{o}</pre> })}
            </p>
        }
    });
    view! {
        <section class="panel">
            <h2>"Placement"</h2>
            {match t.host.clone() {
                Some(h) => view! { <p>"Host " <a href=format!("/hosts/{h}")>{h.to_string()}</a></p> }.into_any(),
                None => view! { <p class="muted">"Not placed."</p> }.into_any(),
            }}
            {(!t.allocations.is_empty()).then(|| view! { <ul class="gpus">{gpus}</ul> })}
            {(t.allocations.is_empty() && t.host.is_some() && !t.state.holds_capacity()).then(|| view! {
                <p class="muted">"Its GPUs were given back when it stopped; its placement event below names them."</p>
            })}
            {(!t.ports.is_empty()).then(|| view! { <ul class="ports">{ports}</ul> })}
            {health}
        </section>
    }
}

/// Its measured GPU memory against its budget, and SM use against its cap.
#[component]
fn Usage(detail: TaskDetail) -> impl IntoView {
    let t = &detail.task;
    let now = detail.now;
    let from = detail
        .usage
        .first()
        .map_or(now - 3600, |p| p.t)
        .min(now - 600);
    let mem = vec![Series {
        name: "peak".into(),
        class: "s-max",
        points: detail
            .usage
            .iter()
            .map(|p| (p.t, p.memory_max_mib as f64))
            .collect(),
    }];
    let sm = vec![Series {
        name: "SM p95".into(),
        class: "s-p95",
        points: detail
            .usage
            .iter()
            .filter_map(|p| p.sm_p95.map(|v| (p.t, f64::from(v))))
            .collect(),
    }];
    let mem_marks = vec![(
        format!("budget {}", detail.budget_mib),
        "budget",
        detail.budget_mib.0 as f64,
    )];
    let sm_marks: Vec<(String, &'static str, f64)> = detail
        .compute_cap_percent
        .map(|c| (format!("cap {c} %"), "cap", f64::from(c)))
        .into_iter()
        .collect();
    let peak = t
        .measured
        .gpu_memory_peak
        .map(|m| format!("Peak {} of {} budget", measured_text(m), detail.budget_mib));
    let work = t.measured.work.clone().map(|w| {
        let said = match &w.unknown {
            Some(why) => format!("not measured: {why}"),
            None => work_figures(&w),
        };
        view! { <p class="task-work">{format!("Work (its application's own figures, at {}): {said}", w.at.clock())}</p> }
    });
    view! {
        <section class="panel">
            <h2>"GPU use"</h2>
            {peak.map(|p| view! { <p>{p}</p> })}
            {work}
            <div class="charts">
                <Chart title="GPU memory".into() unit="MiB" series=mem marks=mem_marks from=from to=now />
                <Chart title="SM use".into() unit="%" series=sm marks=sm_marks from=from to=now />
            </div>
        </section>
    }
}

/// The revision it runs and how it differs from its service's current one.
#[component]
fn Revision(
    t: Task,
    current: Option<tessera_model::service::TaskDefRef>,
    revisions: Option<(String, String)>,
) -> impl IntoView {
    let said = match &current {
        Some(c) if *c == t.task_definition => {
            format!("It runs {c}, its service's current revision.")
        }
        Some(c) => format!("It runs {}; its service now runs {c}.", t.task_definition),
        None => format!("It runs {}.", t.task_definition),
    };
    view! {
        <section class="panel">
            <h2>"Revision"</h2>
            <p>{said}</p>
            {revisions.map(|(mine, now)| view! {
                <pre class="diff">
                    {diff_lines(&mine, &now)
                        .into_iter()
                        .filter(|l| !matches!(l, DiffLine::Same(_)))
                        .map(|l| match l {
                            DiffLine::Removed(t) => view! { <span class="removed">{format!("- {t}\n")}</span> }.into_any(),
                            DiffLine::Added(t) => view! { <span class="added">{format!("+ {t}\n")}</span> }.into_any(),
                            DiffLine::Same(_) => ().into_any(),
                        })
                        .collect_view()}
                </pre>
            })}
        </section>
    }
}

/// What a task completed, as its agent last read it: rate, errors, latency.
fn work_figures(w: &tessera_model::work::WorkNow) -> String {
    let mut parts = Vec::new();
    if let Some(c) = w.completed_per_sec {
        parts.push(format!("{c:.1} completed/s"));
    }
    if let Some(e) = w.errors_per_sec {
        parts.push(format!("{e:.2} errors/s"));
    }
    for (name, v) in [
        ("p50", w.latency_p50_ms),
        ("p95", w.latency_p95_ms),
        ("p99", w.latency_p99_ms),
    ] {
        if let Some(ms) = v {
            parts.push(format!("{name} {ms:.0} ms"));
        }
    }
    if parts.is_empty() {
        "nothing completed yet".into()
    } else {
        parts.join(", ")
    }
}
