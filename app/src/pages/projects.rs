//! Projects and their quotas: per project and pool, what is guaranteed, the limit, what its
//! tasks use, what of that is borrowed, and how many of its tasks wait (with why).

use crate::access::{Declaration, guard};
use crate::components::ErrorList;
use crate::components::RoleHint;
use crate::live::use_live;
use leptos::prelude::*;
use leptos_meta::Title;
use tessera_model::project::{Amounts, Preemption, PreemptionState, ProjectView};

/// Every project with its quotas and use per pool.
#[server]
pub async fn list_projects() -> Result<Vec<ProjectView>, ServerFnError> {
    use crate::data::ssr::{control_for, failed};
    control_for::<ListProjects>()?
        .projects()
        .list_projects()
        .await
        .map_err(failed)
}

guard!(ListProjects, Declaration::VIEW);

/// The newest preemptions (who took room, where, what it stopped).
#[server]
pub async fn recent_preemptions() -> Result<Vec<Preemption>, ServerFnError> {
    use crate::data::ssr::{control_for, failed};
    control_for::<RecentPreemptions>()?
        .projects()
        .list_preemptions(None, 20)
        .await
        .map_err(failed)
}

guard!(RecentPreemptions, Declaration::VIEW);

/// Approves (`approve = true`) or declines a proposed preemption.
#[server]
pub async fn decide_preemption(id: i64, approve: bool) -> Result<(), ServerFnError> {
    use crate::data::ssr::{control, failed};
    let control = control()?;
    if approve {
        control
            .scheduler()
            .approve_preemption(id)
            .await
            .map_err(failed)
    } else {
        control
            .scheduler()
            .decline_preemption(id)
            .await
            .map_err(failed)
    }
}

guard!(DecidePreemption, Declaration::OPERATE);

/// Every project's use over the last day, with each pool's capacity.
#[server]
pub async fn projects_history() -> Result<tessera_model::project::UsageHistory, ServerFnError> {
    use crate::data::ssr::{control_for, failed};
    control_for::<ProjectsHistory>()?
        .projects()
        .project_usage_history(None, "day")
        .await
        .map_err(failed)
}

guard!(ProjectsHistory, Declaration::VIEW);

/// One chart per pool: each project's dominant share of the pool (its largest share of any
/// quantity), as fair share reads it.
fn history_charts(h: tessera_model::project::UsageHistory) -> impl IntoView {
    use crate::fit::{Chart, Series};
    use std::collections::BTreeMap;
    let mut projects: Vec<String> = h.samples.iter().map(|s| s.project.clone()).collect();
    projects.sort();
    projects.dedup();
    h.capacity
        .into_iter()
        .map(|pool| {
            let mut by_project: BTreeMap<&str, Vec<(i64, f64)>> = BTreeMap::new();
            for s in h.samples.iter().filter(|s| s.pool == pool.pool) {
                let share = s
                    .used
                    .named()
                    .into_iter()
                    .zip(pool.capacity.named())
                    .filter(|(_, (_, cap))| *cap > 0)
                    .map(|((_, u), (_, cap))| 100.0 * u as f64 / cap as f64)
                    .fold(0.0, f64::max);
                by_project
                    .entry(s.project.as_str())
                    .or_default()
                    .push((s.at, share));
            }
            let series: Vec<Series> = by_project
                .into_iter()
                .map(|(name, points)| {
                    let i = projects.iter().position(|p| p == name).unwrap_or(0) % 6;
                    Series {
                        name: name.to_owned().into(),
                        class: ["proj-0", "proj-1", "proj-2", "proj-3", "proj-4", "proj-5"][i],
                        points,
                    }
                })
                .collect();
            view! {
                <Chart
                    title=format!("Pool {}: each project's share, last day", pool.pool)
                    unit="%"
                    series=series
                    marks=Vec::new()
                    from=h.from
                    to=h.to
                />
            }
        })
        .collect_view()
}

fn limit_text(limit: &Amounts) -> String {
    if *limit == Amounts::default() {
        "no limit".to_owned()
    } else {
        limit.describe()
    }
}

#[component]
pub fn ProjectsPage() -> impl IntoView {
    let live = use_live();
    let data = Resource::new(live, |_| list_projects());
    let history = Resource::new(live, |_| projects_history());
    let decide = Action::new(|(id, approve): &(i64, bool)| decide_preemption(*id, *approve));
    // A decision shows at once, whatever the live stream says.
    let preemptions = Resource::new(
        move || (live(), decide.version().get()),
        |_| recent_preemptions(),
    );
    let operate = crate::access::allowed::<DecidePreemption>();
    let decided = decide.value();
    view! {
        <Title text="Projects" />
        <h1>"Projects"</h1>
        <p class="muted">
            "Each service belongs to a project. A project's limit in a pool bounds what its tasks may reserve there; "
            "what it uses beyond its guarantee is borrowed."
        </p>
        <crate::pages::project_admin::ProjectAdmin />
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    data.await.map(|projects| view! {
                        <table class="projects">
                            <thead>
                                <tr>
                                    <th>"Project"</th><th>"Pool"</th><th>"Guaranteed"</th><th>"Limit"</th>
                                    <th>"Used"</th><th>"Borrowed"</th><th>"Pending"</th>
                                </tr>
                            </thead>
                            <tbody>
                                {projects.into_iter().map(|p| {
                                    let name = p.project.name.clone();
                                    let services = p.services;
                                    let members = if p.members.is_empty() {
                                        "no members of its own".to_owned()
                                    } else {
                                        p.members.iter().map(|m| format!("{} ({})", m.username, m.role)).collect::<Vec<_>>().join(", ")
                                    };
                                    let title = format!("{name}: {services} service(s), weight {}; {members}", p.project.weight);
                                    let href = format!("/services?project={}", tessera_model::urlenc::encode(&name));
                                    if p.pools.is_empty() {
                                        return view! {
                                            <tr>
                                                <th scope="row" title=title><a href=href>{name}</a></th>
                                                <td class="muted" colspan="6">"no quota and no tasks"</td>
                                            </tr>
                                        }.into_any();
                                    }
                                    p.pools.into_iter().map(|s| {
                                        // Tasks wait while a limit is set: most likely held by it.
                                        let at_limit = s.limit != Amounts::default() && s.pending > 0;
                                        view! {
                                            <tr class:at-limit=at_limit>
                                                <th scope="row" title=title.clone()><a href=href.clone()>{name.clone()}</a></th>
                                                <td>{s.pool}</td>
                                                <td>{s.guaranteed.describe()}</td>
                                                <td class="nowrap">{limit_text(&s.limit)}</td>
                                                <td>{s.used.describe()}</td>
                                                <td>{s.borrowed.describe()}</td>
                                                <td>{s.pending}</td>
                                            </tr>
                                        }
                                    }).collect_view().into_any()
                                }).collect_view()}
                            </tbody>
                        </table>
                    })
                })}
            </ErrorBoundary>
        </Transition>
        <h2>"Waiting"</h2>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    data.await.map(|projects| {
                        let rows: Vec<_> = projects
                            .into_iter()
                            .flat_map(|p| {
                                let name = p.project.name.clone();
                                p.waiting.into_iter().map(move |w| (name.clone(), w))
                            })
                            .collect();
                        if rows.is_empty() {
                            return view! { <p class="empty">"No task waits for a place."</p> }.into_any();
                        }
                        view! {
                            <table class="table waiting">
                                <thead>
                                    <tr><th>"Project"</th><th>"Service"</th><th>"Pool"</th><th>"Tasks"</th><th>"Why"</th></tr>
                                </thead>
                                <tbody>
                                    {rows.into_iter().map(|(project, w)| view! {
                                        <tr>
                                            <td>{project}</td>
                                            <td><a href=format!("/services/{}", w.service)>{w.service.clone()}</a></td>
                                            <td>{w.pool}</td>
                                            <td>{w.tasks}</td>
                                            <td>{w.reason.unwrap_or_else(|| "not tried yet".to_owned())}</td>
                                        </tr>
                                    }).collect_view()}
                                </tbody>
                            </table>
                        }.into_any()
                    })
                })}
            </ErrorBoundary>
        </Transition>
        <h2>"Use over time"</h2>
        <p class="muted">
            "Sampled every 5 minutes. Within a priority class, the project whose share over the last hour is lowest (over its weight) is placed first."
        </p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    history.await.map(|h| {
                        if h.samples.is_empty() {
                            return view! { <p class="empty">"No samples yet."</p> }.into_any();
                        }
                        history_charts(h).into_any()
                    })
                })}
            </ErrorBoundary>
        </Transition>
        <h2>"Recent preemptions"</h2>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    preemptions.await.map(|list| {
                        if list.is_empty() {
                            return view! {
                                <p class="empty">"None yet. A waiting task of a project within its guarantee stops tasks of lower classes that use borrowed capacity."</p>
                            }.into_any();
                        }
                        view! {
                            {move || decided.get().and_then(|r| r.err()).map(|e| view! { <p class="notice error" role="alert">{e.to_string()}</p> })}
                            <RoleHint reason=operate />
                            <table class="table preemptions">
                                <thead>
                                    <tr><th>"When (UTC)"</th><th>"Takes room"</th><th>"On"</th><th>"Stops"</th><th>"State"</th></tr>
                                </thead>
                                <tbody>
                                    {list.into_iter().map(|p| {
                                        let stopped = p.victims.iter()
                                            .map(|v| format!("{} of {} ({}, {})", v.task, v.service, v.project, v.priority))
                                            .collect::<Vec<_>>()
                                            .join("; ");
                                        let id = p.id;
                                        let proposed = p.state == PreemptionState::Proposed;
                                        view! {
                                            <tr data-preemption=id.to_string() data-state=p.state.as_str()>
                                                <td class="nowrap">{p.at.short()}</td>
                                                <td>{format!("{} ({}, {})", p.service, p.project, p.priority)}</td>
                                                <td>{format!("{} in {}", p.host, p.pool)}</td>
                                                <td>{stopped}</td>
                                                <td class="nowrap">
                                                    {p.state.as_str()}
                                                    {proposed.then(|| view! {
                                                        " "
                                                        <button class="primary" title=move || operate.get() disabled=move || operate.get().is_some()
                                                            on:click=move |_| { decide.dispatch((id, true)); }>"Approve"</button>
                                                        " "
                                                        <button title=move || operate.get() disabled=move || operate.get().is_some()
                                                            on:click=move |_| { decide.dispatch((id, false)); }>"Decline"</button>
                                                    })}
                                                </td>
                                            </tr>
                                        }
                                    }).collect_view()}
                                </tbody>
                            </table>
                        }.into_any()
                    })
                })}
            </ErrorBoundary>
        </Transition>
    }
}
