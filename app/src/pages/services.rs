//! Services: each with its running, pending and desired counts.

use crate::access::{Declaration, guard};
use crate::components::ErrorList;
use crate::live::use_live;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_navigate, use_query_map};
use tessera_model::api::ServiceDetail;

#[server]
pub async fn list_service_details() -> Result<Vec<ServiceDetail>, ServerFnError> {
    use crate::data::ssr::{control, failed};
    control()?.views().service_details().await.map_err(failed)
}

guard!(ListServiceDetails, Declaration::VIEW);

#[component]
pub fn ServicesPage() -> impl IntoView {
    let live = use_live();
    let services = Resource::new(live, |_| list_service_details());
    // `?project=NAME` shows one project's services (the Projects page links here).
    let query = use_query_map();
    let project = move || query.read().get("project").filter(|p| !p.is_empty());
    let navigate = use_navigate();
    let choose = move |ev: leptos::ev::Event| {
        let p = event_target_value(&ev);
        let to = if p.is_empty() {
            "/services".to_owned()
        } else {
            format!("/services?project={}", tessera_model::urlenc::encode(&p))
        };
        navigate(&to, Default::default());
    };
    view! {
        <Title text="Services" />
        <div class="page-head with-action">
            <div>
                <h1>"Services"</h1>
                <p class="lede">"Each keeps a number of tasks of a task definition running in a pool."</p>
            </div>
            <a class="button primary" href="/services/new">"Create service"</a>
        </div>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || { let choose = choose.clone(); Suspend::new(async move {
                    services.await
                        .map(|list| {
                            if list.is_empty() {
                                return view! { <p class="empty">"No services yet. Create one to run tasks."</p> }.into_any();
                            }
                            let mut projects: Vec<String> = list.iter().map(|d| d.service.project.clone()).collect();
                            let shown = project();
                            // A project with no services yet (linked from the Projects page)
                            // is still the one shown.
                            projects.extend(shown.clone());
                            projects.sort();
                            projects.dedup();
                            let total = list.len();
                            let list: Vec<ServiceDetail> = list
                                .into_iter()
                                .filter(|d| shown.as_ref().is_none_or(|p| &d.service.project == p))
                                .collect();
                            let count = if list.len() == total {
                                format!("{total} services")
                            } else {
                                format!("{} of {total} services", list.len())
                            };
                            view! {
                                <form class="filters" on:submit=|ev| ev.prevent_default()>
                                    <label>
                                        "Project"
                                        <select name="project" on:change=choose>
                                            <option value="" selected=shown.is_none()>"All projects"</option>
                                            {projects.into_iter().map(|p| {
                                                let selected = shown.as_deref() == Some(p.as_str());
                                                view! { <option value=p.clone() selected=selected>{p.clone()}</option> }
                                            }).collect_view()}
                                        </select>
                                    </label>
                                    <p class="count">{count}</p>
                                </form>
                                <table class="table">
                                    <thead>
                                        <tr><th>"Service"</th><th>"Project"</th><th>"Task definition"</th><th>"Pool"</th><th>"Running"</th><th>"Pending"</th><th>"Desired"</th><th>"Progress"</th></tr>
                                    </thead>
                                    <tbody>
                                        {list
                                            .into_iter()
                                            .map(|d| {
                                                let s = &d.service;
                                                let pct = if s.desired_count > 0 { 100.0 * f64::from(d.running.min(s.desired_count)) / f64::from(s.desired_count) } else { 100.0 };
                                                view! {
                                                    <tr data-service=s.name.clone()>
                                                        <td><a href=format!("/services/{}", s.name)>{s.name.clone()}</a>{s.deleting.then_some(" (deleting)")}</td>
                                                        <td>{s.project.clone()}</td>
                                                        <td>{s.task_definition.to_string()}</td>
                                                        <td>{s.pool.to_string()}</td>
                                                        <td class="running">{d.running}</td>
                                                        <td class="pending">{d.pending}</td>
                                                        <td>{s.desired_count}</td>
                                                        <td><span class="progress"><span class="progress-fill" style=format!("width: {pct:.0}%")></span></span></td>
                                                    </tr>
                                                }
                                            })
                                            .collect_view()}
                                    </tbody>
                                </table>
                            }
                                .into_any()
                        })
                })}}
            </ErrorBoundary>
        </Transition>
    }
}
