//! One service: deployments with their progress, its endpoints (where each task is reached
//! and whether it gets traffic, with why not), tasks with their placements and how widely
//! they spread, the fit of their measured use (`crate::fit`), events; scale it, roll out
//! another revision, right-size it, or delete it.

use crate::access::{Declaration, guard, ops};
use crate::components::{ErrorList, EventList, measured_text};
use crate::live::use_live;
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;
use tessera_model::api::{EndpointList, ServiceDetail, ServicePatch};
use tessera_model::service::{DeploymentStatus, Task};
use tessera_model::taskdef::FieldError;

/// The service, its tasks, its active revisions and its endpoints.
type ServiceView = (
    ServiceDetail,
    Vec<Task>,
    Vec<String>,
    EndpointList,
    tessera_model::work::ServiceWork,
);

#[server]
pub async fn get_service_view(name: String) -> Result<ServiceView, ServerFnError> {
    use crate::data::ssr::{control, failed};
    let control = control()?;
    let detail = control
        .deployments()
        .service_detail(&name)
        .await
        .map_err(failed)?;
    let tasks = control.views().service_tasks(&name).await.map_err(failed)?;
    let revisions = control
        .views()
        .list_task_definition_revisions(&detail.service.task_definition.family)
        .await
        .map_err(failed)?
        .into_iter()
        .filter(|d| d.active)
        .map(|d| format!("{}:{}", d.family, d.revision))
        .collect();
    let endpoints = control.views().endpoints(&name).await.map_err(failed)?;
    let work = control
        .deployments()
        .service_work(&name, "hour")
        .await
        .map_err(failed)?;
    Ok((detail, tasks, revisions, endpoints, work))
}

guard!(GetServiceView, Declaration::VIEW);

/// A scale or rollout: refused input comes back as field errors.
type PatchResult = Result<Result<(), Vec<FieldError>>, ServerFnError>;

#[server(input = Json)]
pub async fn patch_service(
    name: String,
    patch: ServicePatch,
) -> Result<Result<(), Vec<FieldError>>, ServerFnError> {
    let control = crate::data::ssr::control()?;
    // The layer checked the caller is an operator in the service's project and in the one
    // it moves into (`ops::UPDATE_SERVICE`); the class is a rule on what is asked for.
    let caller = crate::data::ssr::caller().ok_or_else(|| ServerFnError::new("sign in first"))?;
    tessera_model::project::may_set_class(&caller, patch.priority, true)
        .map_err(ServerFnError::new)?;
    match control.deployments().update_service(&name, &patch).await {
        Ok(_) => Ok(Ok(())),
        Err(e) => crate::data::ssr::field_errors(e).map(Err),
    }
}

guard!(PatchService, ops::UPDATE_SERVICE, body = patch);

#[server]
pub async fn delete_service(name: String) -> Result<(), ServerFnError> {
    crate::data::ssr::control()?
        .deployments()
        .delete_service(&name)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(DeleteService, ops::DELETE_SERVICE);

#[component]
pub fn ServicePage() -> impl IntoView {
    let params = use_params_map();
    let name = move || params.read().get("name").unwrap_or_default();
    let live = use_live();
    let patch = Action::new(|(n, p): &(String, ServicePatch)| patch_service(n.clone(), p.clone()));
    let delete = Action::new(|n: &String| delete_service(n.clone()));
    let data = Resource::new(
        move || {
            (
                live(),
                name(),
                patch.version().get(),
                delete.version().get(),
            )
        },
        |(_, n, _, _)| get_service_view(n),
    );
    view! {
        <Title text=move || format!("Service {}", name()) />
        <p class="crumbs"><a href="/services">"Services"</a> " / " {name}</p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    data.await.map(|(detail, tasks, revisions, endpoints, work)| view! {
                        <Detail detail tasks revisions patch delete />
                        <Endpoints list=endpoints />
                        <Work work />
                    })
                })}
            </ErrorBoundary>
        </Transition>
        <crate::fit::FitPanel name=Signal::derive(name) live=Signal::derive(live) />
        <Transition fallback=|| ()>
            <ErrorBoundary fallback=|_| ()>
                {move || Suspend::new(async move {
                    data.await.map(|(detail, _, _, _, _)| view! {
                        <section class="panel">
                            <h2>"Events"</h2>
                            <EventList events=detail.events />
                        </section>
                    })
                })}
            </ErrorBoundary>
        </Transition>
    }
}

/// The work its applications complete (their own metrics): rates now, the latency
/// target's verdict, what sharing a GPU costs it, its alarms and autoscaling.
#[component]
fn Work(work: tessera_model::work::ServiceWork) -> impl IntoView {
    use tessera_model::work::trim_float;
    let num = |v: Option<f64>, unit: &str| {
        v.map_or_else(
            || "—".to_owned(),
            |v| format!("{} {unit}", trim_float((v * 10.0).round() / 10.0)),
        )
    };
    let Some(spec) = work.spec.clone() else {
        return view! {
            <section class="panel work">
                <h2>"Work"</h2>
                <p class="muted">"Its task definition does not say where its work is measured (work: {port, path, completed, errors, latency}): only the GPU's view is known."</p>
            </section>
        }
        .into_any();
    };
    let last = work.series.last().cloned();
    // The last hour, up to the end of the newest bucket.
    let to = last.as_ref().map_or(0, |p| p.at + work.bucket_secs);
    let from = to - 3600;
    let points = |f: fn(&tessera_model::work::WorkPoint) -> Option<f64>| -> Vec<(i64, f64)> {
        work.series
            .iter()
            .filter_map(|p| f(p).map(|v| (p.at, v)))
            .collect()
    };
    use crate::fit::Series;
    let completed = vec![Series {
        name: "completed / s".into(),
        class: "s-p50",
        points: points(|p| Some(p.completed_per_sec)),
    }];
    let latency = vec![
        Series {
            name: "p99".into(),
            class: "s-max",
            points: points(|p| p.latency_p99_ms),
        },
        Series {
            name: "p50".into(),
            class: "s-p50",
            points: points(|p| p.latency_p50_ms),
        },
    ];
    let latency_marks = work
        .objectives
        .slo
        .as_ref()
        .map(|s| {
            vec![(
                format!("target {} ms", trim_float(s.latency_p99_ms)),
                "budget",
                s.latency_p99_ms,
            )]
        })
        .unwrap_or_default();
    view! {
        <section class="panel work">
            <h2>"Work"</h2>
            <p class="muted">{format!(
                "As its application counts it: {} on port {} at {}, scraped by each agent every sync.{}",
                spec.completed, spec.port, spec.path,
                work.note.as_ref().map(|n| format!(" {n}")).unwrap_or_default()
            )}</p>
            <dl class="facts">
                <div><dt>"Completed"</dt><dd class="completed">{num(work.completed_per_sec, "/s")}</dd></div>
                <div><dt>"Per GPU-hour"</dt><dd>{num(work.completed_per_gpu_hour, "")}</dd></div>
                <div><dt>"Per GiB reserved"</dt><dd>{num(work.completed_per_sec_per_gib, "/s")}</dd></div>
                <div><dt>"Latency p99"</dt><dd>{num(work.latency_p99_ms, "ms")}</dd></div>
                <div><dt>"Error rate"</dt><dd>{work.error_rate.map_or_else(|| "—".to_owned(), |r| format!("{:.2} %", r * 100.0))}</dd></div>
                <div><dt>"Tasks measured"</dt><dd>{format!("{} ({} unknown)", work.tasks_measured, work.tasks_unknown)}</dd></div>
                <div><dt>"Latency target"</dt><dd class="verdict">{work.verdict.clone().unwrap_or_else(|| "none set".into())}</dd></div>
                <div><dt>"Last bucket"</dt><dd class="verdict">{last.map_or_else(|| "no history yet".to_owned(), |p| format!(
                    "{} /s · p50 {} · p95 {} · p99 {}",
                    trim_float((p.completed_per_sec * 10.0).round() / 10.0),
                    num(p.latency_p50_ms, "ms"), num(p.latency_p95_ms, "ms"), num(p.latency_p99_ms, "ms")
                ))}</dd></div>
            </dl>
            <div class="charts">
                <crate::fit::Chart title="Completed work".into() unit="/s" series=completed marks=vec![] from=from to=to />
                <crate::fit::Chart title="Latency".into() unit="ms" series=latency marks=latency_marks from=from to=to />
            </div>
            {(!work.unknown.is_empty()).then(|| view! {
                <p class="muted unknown">{work.unknown.iter().map(|(t, why)| format!("{}: {why}", &t[..8.min(t.len())])).collect::<Vec<_>>().join("; ")}</p>
            })}
            <h3>"Sharing a GPU"</h3>
            {if work.interference.is_empty() {
                view! { <p class="muted">"No evidence yet: estimates need buckets of its tasks with and without each neighbour."</p> }.into_any()
            } else {
                view! {
                    <ul class="interference">
                        {work.interference.iter().map(|e| view! {
                            <li class=if e.established { "established" } else { "muted" }>{e.summary.clone()}</li>
                        }).collect_view()}
                    </ul>
                }.into_any()
            }}
            {(!work.alarms.is_empty()).then(|| view! {
                <h3>"Alarms"</h3>
                <ul class="alarms">
                    {work.alarms.iter().map(|a| view! {
                        <li class=format!("alarm alarm-{}", a.state)>
                            <span class=format!("badge alarm-{}", a.state)>{a.state.clone()}</span>
                            " " {a.alarm.describe()}
                            {a.value.map(|v| format!(" (now {})", trim_float((v * 100.0).round() / 100.0)))}
                        </li>
                    }).collect_view()}
                </ul>
            })}
            {work.objectives.autoscaling.as_ref().map(|a| view! {
                <h3>"Autoscaling"</h3>
                <p>{format!("{}..{} tasks, {} toward {}", a.min, a.max, a.metric.as_str(), trim_float(a.target))}</p>
                <p class="muted">{work.autoscaling.clone().unwrap_or_else(|| "no decision yet".into())}</p>
            })}
        </section>
    }
    .into_any()
}

/// Where the service's tasks are reached: one row per task and port, with whether it gets
/// traffic and, when not, why.
#[component]
fn Endpoints(list: EndpointList) -> impl IntoView {
    let healthy = list
        .endpoints
        .iter()
        .filter(|e| e.health == tessera_model::api::EndpointHealth::Healthy)
        .count();
    view! {
        <section class="panel endpoints">
            <h2>"Endpoints"</h2>
            {if list.endpoints.is_empty() {
                view! { <p class="muted">"No endpoints: its tasks declare no ports, or none has bound one yet."</p> }.into_any()
            } else {
                view! {
                    <p class="muted">{format!("{healthy} of {} get traffic. Load balancers follow GET /api/v1/services/{}/endpoints (tessera lb haproxy).", list.endpoints.len(), list.service)}</p>
                    <table class="table">
                        <thead><tr><th>"Task"</th><th>"Address"</th><th>"Port"</th><th>"Health"</th><th>"Why"</th></tr></thead>
                        <tbody>
                            {list
                                .endpoints
                                .into_iter()
                                .map(|e| {
                                    let port = e.port_name.clone().unwrap_or_else(|| e.container_port.to_string());
                                    view! {
                                        <tr class=format!("endpoint health-{}", e.health.as_str()) data-task=e.task.clone()>
                                            <td><code>{e.task[..8.min(e.task.len())].to_owned()}</code></td>
                                            <td><code>{format!("{}:{}", e.address, e.port)}</code></td>
                                            <td>{format!("{port} ({})", e.protocol.as_str())}</td>
                                            <td><span class=format!("badge health-{}", e.health.as_str())>{e.health.as_str()}</span></td>
                                            <td class="reason">{e.reason.clone().unwrap_or_default()}</td>
                                        </tr>
                                    }
                                })
                                .collect_view()}
                        </tbody>
                    </table>
                }.into_any()
            }}
        </section>
    }
}

#[component]
fn Detail(
    detail: ServiceDetail,
    tasks: Vec<Task>,
    revisions: Vec<String>,
    patch: Action<(String, ServicePatch), PatchResult>,
    delete: Action<String, Result<(), ServerFnError>>,
) -> impl IntoView {
    let s = detail.service.clone();
    // What the server will check: an operator in this service's project.
    let project = Signal::stored(Some(s.project.clone()));
    let operate = crate::access::allowed_in::<PatchService>(project);
    let may_delete = crate::access::allowed_in::<DeleteService>(project);
    let may_read_output = crate::access::allowed_in::<crate::pages::task::ReadLastOutput>(project);
    let desired = s.desired_count;
    let scale_to = RwSignal::new(desired.to_string());
    let revision = RwSignal::new(s.task_definition.to_string());
    let (n1, n2, n3) = (s.name.clone(), s.name.clone(), s.name.clone());
    let problems = move || match patch.value().get() {
        Some(Ok(Err(errors))) => errors
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>(),
        Some(Err(e)) => vec![e.to_string()],
        _ => vec![],
    };
    view! {
        <div class="page-head">
            <h1>{s.name.clone()}{s.deleting.then(|| view! { <span class="badge status-draining">"deleting"</span> })}</h1>
            <p class="lede">
                {format!("{} in pool {} · {} running, {} pending of {} desired", s.task_definition, s.pool, detail.running, detail.pending, desired)}
            </p>
        </div>
        <section class="panel controls">
            <form on:submit=move |ev| {
                ev.prevent_default();
                let d = scale_to.get_untracked().trim().parse().unwrap_or(u32::MAX);
                patch.dispatch((n1.clone(), ServicePatch { desired_count: Some(d), task_definition: None, ..Default::default()  }));
            }>
                <label>"Desired tasks " <input type="text" inputmode="numeric" name="desired_count" size="5" bind:value=scale_to /></label>
                <button type="submit" title=move || operate.get() disabled=move || operate.get().is_some()>"Scale"</button>
            </form>
            <form on:submit=move |ev| {
                ev.prevent_default();
                patch.dispatch((n2.clone(), ServicePatch { desired_count: None, task_definition: Some(revision.get_untracked()), ..Default::default()  }));
            }>
                <label>
                    "Revision "
                    <select name="revision" on:change=move |ev| revision.set(event_target_value(&ev))>
                        {revisions
                            .into_iter()
                            .map(|r| {
                                let selected = r == s.task_definition.to_string();
                                view! { <option value=r.clone() selected=selected>{r.clone()}</option> }
                            })
                            .collect_view()}
                    </select>
                </label>
                <button type="submit" title=move || operate.get() disabled=move || operate.get().is_some()>"Deploy"</button>
            </form>
            <button class="danger" title=move || may_delete.get() disabled=move || s.deleting || may_delete.get().is_some() on:click=move |_| { delete.dispatch(n3.clone()); }>"Delete service"</button>
            <crate::components::RoleHint reason=operate />
            {move || {
                let p = problems();
                (!p.is_empty()).then(|| view! { <p class="field-error" role="alert">{p.join("; ")}</p> })
            }}
        </section>
        <section class="panel">
            <h2>"Deployments"</h2>
            <ul class="deployments">
                {detail
                    .deployments
                    .iter()
                    .filter(|d| matches!(d.status, DeploymentStatus::Primary | DeploymentStatus::Active) || d.running + d.pending > 0)
                    .map(|d| {
                        let target = if d.status == DeploymentStatus::Primary { desired } else { d.running + d.pending };
                        let pct = if target > 0 { 100.0 * f64::from(d.running.min(target)) / f64::from(target) } else { 100.0 };
                        view! {
                            <li class=format!("deployment {}", d.status.as_str())>
                                <span>{format!("#{} {} ({})", d.id, d.task_definition, d.status.as_str())}</span>
                                <span class="progress" role="progressbar" aria-valuenow=format!("{pct:.0}") aria-valuemin="0" aria-valuemax="100">
                                    <span class="progress-fill" style=format!("width: {pct:.0}%")></span>
                                </span>
                                <span>{format!("{} running, {} pending{}", d.running, d.pending, if d.failed_tasks > 0 { format!(", {} failed", d.failed_tasks) } else { String::new() })}</span>
                            </li>
                        }
                    })
                    .collect_view()}
            </ul>
        </section>
        <section class="panel">
            <h2>"Tasks"</h2>
            <crate::fit::BlastRadius tasks=tasks.clone() constraints=s.constraints.clone() />
            <table class="table tasks">
                <thead><tr><th>"Task"</th><th>"Revision"</th><th>"State"</th><th>"Host"</th><th>"GPUs"</th><th>"Measured peak"</th><th>"Note"</th></tr></thead>
                <tbody>
                    {tasks
                        .into_iter()
                        .map(|t| {
                            let gpus = t.allocations.iter().map(|a| format!("GPU {} ({})", a.index, a.memory)).collect::<Vec<_>>().join(", ");
                            let note = t.stop_reason.clone().or(t.placement_message.clone()).unwrap_or_default();
                            let last = (t.state == tessera_model::service::TaskState::Stopped)
                                .then(|| view! { <LastOutput service=s.name.clone() task=t.id.clone() allowed=may_read_output /> });
                            view! {
                                <tr class=format!("task state-{}", t.state.as_str()) data-task=t.id.clone()>
                                    <td><a href=format!("/tasks/{}", t.id)><code>{crate::pages::task::short_id(&t.id).to_owned()}</code></a></td>
                                    <td>{t.task_definition.to_string()}</td>
                                    <td>{t.state.as_str()}</td>
                                    <td>{t.host.map(|h| view! { <a href=format!("/hosts/{h}")>{h.to_string()}</a> })}</td>
                                    <td>{gpus}</td>
                                    <td>{t.measured.gpu_memory_peak.map(measured_text).unwrap_or_default()}</td>
                                    <td class="reason">{note} {last}</td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </tbody>
            </table>
        </section>
    }
}

/// A stopped task's last lines, read on request (operators of the service's project: the
/// read is audited, output may hold secrets).
#[component]
fn LastOutput(service: String, task: String, allowed: Signal<Option<String>>) -> impl IntoView {
    let read = Action::new(move |_: &()| {
        crate::pages::task::read_last_output(service.clone(), task.clone())
    });
    view! {
        <button type="button" class="link last-output-button" title=move || allowed.get()
            disabled=move || allowed.get().is_some() on:click=move |_| { read.dispatch(()); }>
            "Last lines"
        </button>
        {move || read.value().get().map(crate::pages::task::last_output_view)}
    }
}
