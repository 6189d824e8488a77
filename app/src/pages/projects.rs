//! Projects and their quotas: per project and pool, what is guaranteed, the limit, what its
//! tasks use, what of that is borrowed, and how many of its tasks wait (with why).

use crate::access::{Access, guard};
use crate::components::ErrorList;
use crate::live::use_live;
use leptos::prelude::*;
use leptos_meta::Title;
use tessera_model::project::{Amounts, ProjectView};

/// Every project with its quotas and use per pool.
#[server]
pub async fn list_projects() -> Result<Vec<ProjectView>, ServerFnError> {
    use crate::data::ssr::{control_for, failed};
    control_for::<ListProjects>()?
        .list_projects()
        .await
        .map_err(failed)
}

guard!(ListProjects, Access::VIEW);

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
    view! {
        <Title text="Projects" />
        <h1>"Projects"</h1>
        <p class="muted">
            "Each service belongs to a project. A project's limit in a pool bounds what its tasks may reserve there; "
            "what it uses beyond its guarantee is borrowed. Admins set quotas with "
            <code>"PUT /api/v1/projects/{name}"</code> "."
        </p>
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
                                    let title = format!("{name}: {services} service(s), weight {}", p.project.weight);
                                    if p.pools.is_empty() {
                                        return view! {
                                            <tr>
                                                <th scope="row" title=title>{name}</th>
                                                <td class="muted" colspan="6">"no quota and no tasks"</td>
                                            </tr>
                                        }.into_any();
                                    }
                                    p.pools.into_iter().map(|s| {
                                        // Tasks wait while a limit is set: most likely held by it.
                                        let at_limit = s.limit != Amounts::default() && s.pending > 0;
                                        view! {
                                            <tr class:at-limit=at_limit>
                                                <th scope="row" title=title.clone()>{name.clone()}</th>
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
    }
}
