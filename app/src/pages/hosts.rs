//! The Hosts page: hosts and their GPUs drawn as bars (memory per task coloured by service,
//! reserved compute), filtered by pool, status and GPU model, a page at a time.

use crate::access::{Declaration, guard};
use crate::components::{ErrorList, HostCard};
use crate::data::{HostQuery, HostsPage};
use crate::live::use_live;
use crate::pages::pool_provider::PoolProviderPanel;
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_meta::Title;
use leptos_router::hooks::{use_navigate, use_query_map};
use tessera_model::HostStatus;

/// One page of hosts matching the filters.
#[server(input = Json)]
pub async fn list_hosts_page(query: HostQuery) -> Result<HostsPage, ServerFnError> {
    let control = crate::data::ssr::control()?;
    control
        .views()
        .hosts_page(&query)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(ListHostsPage, Declaration::VIEW);

fn query_string(q: &HostQuery) -> String {
    let mut parts = Vec::new();
    for (k, v) in [
        ("pool", &q.pool),
        ("status", &q.status),
        ("model", &q.model),
    ] {
        if !v.is_empty() {
            parts.push(format!("{k}={}", tessera_model::urlenc::encode(v)));
        }
    }
    if q.page > 0 {
        parts.push(format!("page={}", q.page));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

#[component]
pub fn HostsPage() -> impl IntoView {
    let live = use_live();
    let params = use_query_map();
    let query = Memo::new(move |_| {
        let m = params.read();
        HostQuery {
            pool: m.get("pool").unwrap_or_default(),
            status: m.get("status").unwrap_or_default(),
            model: m.get("model").unwrap_or_default(),
            page: m.get("page").and_then(|p| p.parse().ok()).unwrap_or(0),
        }
    });
    let data = Resource::new(move || (live(), query.get()), |(_, q)| list_hosts_page(q));
    view! {
        <Title text="Hosts" />
        <div class="page-head">
            <h1>"Hosts"</h1>
            <p class="lede">
                "Each GPU: memory allocated per task (coloured by service; hover or focus a segment for details) and, below it, reserved compute."
            </p>
        </div>
        <Transition fallback=|| view! { <p class="muted">"Loading hosts…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move { data.await.map(|page| view! { <HostList page query /> }) })}
            </ErrorBoundary>
        </Transition>
        <PoolProviderPanel pool=Signal::derive(move || query.get().pool) />
        <crate::pages::pool_admin::PoolAdmin pool=Signal::derive(move || query.get().pool) />
        <crate::pages::join_tokens::JoinTokens />
    }
}

/// The filters, the hosts of this page, and paging.
#[component]
fn HostList(page: HostsPage, query: Memo<HostQuery>) -> impl IntoView {
    let navigate = use_navigate();
    let go = Callback::new(move |q: HostQuery| {
        navigate(&format!("/hosts{}", query_string(&q)), Default::default())
    });
    let q = query.get_untracked();
    let statuses: Vec<String> = HostStatus::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    let (current, pages) = (page.page, page.pages);
    view! {
        <form class="filters" aria-label="Filter hosts" on:submit=|ev| ev.prevent_default()>
            <Filter
                label="Pool"
                name="pool"
                any="All pools"
                values=page.pools.clone()
                selected=q.pool.clone()
                pick=Callback::new(move |pool| go.run(HostQuery { pool, page: 0, ..query.get_untracked() }))
            />
            <Filter
                label="Status"
                name="status"
                any="Any status"
                values=statuses
                selected=q.status.clone()
                pick=Callback::new(move |status| go.run(HostQuery { status, page: 0, ..query.get_untracked() }))
            />
            <Filter
                label="GPU model"
                name="model"
                any="Any model"
                values=page.models.clone()
                selected=q.model.clone()
                pick=Callback::new(move |model| go.run(HostQuery { model, page: 0, ..query.get_untracked() }))
            />
            <p class="count" aria-live="polite">{format!("{} of {} hosts", page.matched, page.total)}</p>
        </form>
        {if page.hosts.is_empty() {
            view! { <p class="empty">"No host matches these filters."</p> }.into_any()
        } else {
            view! {
                <ul class="host-list">
                    {page.hosts.into_iter().map(|view| view! { <HostCard view link=true /> }).collect_view()}
                </ul>
            }
                .into_any()
        }}
        {(pages > 1)
            .then(|| {
                view! {
                    <nav class="pager" aria-label="Pages">
                        <button
                            disabled=current == 0
                            on:click=move |_| go.run(HostQuery { page: current.saturating_sub(1), ..query.get_untracked() })
                        >
                            "Previous"
                        </button>
                        <span>{format!("page {} of {pages}", current + 1)}</span>
                        <button
                            disabled={ current + 1 >= pages }
                            on:click=move |_| go.run(HostQuery { page: current + 1, ..query.get_untracked() })
                        >
                            "Next"
                        </button>
                    </nav>
                }
            })}
    }
}

/// One filter of the host list: a labelled choice, empty for any, handed to `pick`.
#[component]
fn Filter(
    label: &'static str,
    name: &'static str,
    any: &'static str,
    values: Vec<String>,
    selected: String,
    pick: Callback<String>,
) -> impl IntoView {
    let options = values
        .into_iter()
        .map(|v| {
            let is = v == selected;
            let text = v.clone();
            view! { <option value=v selected=is>{text}</option> }
        })
        .collect_view();
    view! {
        <label>
            {label}
            <select name=name on:change=move |ev| pick.run(event_target_value(&ev))>
                <option value="">{any}</option>
                {options}
            </select>
        </label>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_strings_carry_only_set_filters() {
        assert_eq!(query_string(&HostQuery::default()), "");
        let q = HostQuery {
            pool: "gpu a".into(),
            status: String::new(),
            model: "NVIDIA L4".into(),
            page: 2,
        };
        assert_eq!(query_string(&q), "?pool=gpu%20a&model=NVIDIA%20L4&page=2");
    }
}
