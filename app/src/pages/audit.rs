//! The audit log (admins): every accepted change, who made it, on what, from where.

use crate::access::{Declaration, guard};
use crate::components::ErrorList;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_navigate, use_query_map};
use tessera_model::auth::AuditEntry;

/// Newest first; `actor` and `text` (action or target) filter by substring.
#[server]
pub async fn list_audit(
    actor: Option<String>,
    text: Option<String>,
) -> Result<Vec<AuditEntry>, ServerFnError> {
    use crate::data::ssr::{control_for, internal};
    control_for::<ListAudit>()?
        .accounts()
        .list_audit(&tessera_control::store::AuditFilter {
            actor: actor.filter(|s| !s.is_empty()),
            text: text.filter(|s| !s.is_empty()),
            before: None,
            limit: 200,
        })
        .await
        .map_err(internal)
}

guard!(ListAudit, Declaration::ADMIN);

#[component]
pub fn AuditPage() -> impl IntoView {
    let query = use_query_map();
    let actor = move || query.read().get("actor");
    let text = move || query.read().get("q");
    let data = Resource::new(move || (actor(), text()), |(a, t)| list_audit(a, t));
    let navigate = use_navigate();
    // The fields start from the filters in the address, so changing one keeps the other.
    let (actor_in, set_actor_in) = signal(actor().unwrap_or_default());
    let (text_in, set_text_in) = signal(text().unwrap_or_default());
    let apply = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let mut params = Vec::new();
        for (k, v) in [("actor", actor_in.get()), ("q", text_in.get())] {
            if !v.is_empty() {
                params.push(format!("{k}={}", tessera_model::urlenc::encode(&v)));
            }
        }
        navigate(&format!("/audit?{}", params.join("&")), Default::default());
    };
    view! {
        <Title text="Audit log" />
        <h1>"Audit log"</h1>
        <form class="filters" on:submit=apply>
            <label>
                "Who"
                <input name="actor" prop:value=move || actor().unwrap_or_default()
                    on:input=move |ev| set_actor_in.set(event_target_value(&ev)) />
            </label>
            <label>
                "What or on what"
                <input name="q" prop:value=move || text().unwrap_or_default()
                    on:input=move |ev| set_text_in.set(event_target_value(&ev)) />
            </label>
            <button type="submit">"Filter"</button>
        </form>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    data.await.map(|entries| {
                        if entries.is_empty() {
                            return view! { <p class="muted">"No changes recorded match."</p> }.into_any();
                        }
                        view! {
                            <table class="audit">
                                <thead>
                                    <tr><th>"When (UTC)"</th><th>"Who"</th><th>"What"</th><th>"On"</th><th>"From"</th></tr>
                                </thead>
                                <tbody>
                                    {entries.into_iter().map(|e| view! {
                                        <tr>
                                            <td>{e.at.short()}</td>
                                            <td>{e.actor}</td>
                                            <td>{e.action}</td>
                                            <td>{e.target.unwrap_or_default()}</td>
                                            <td>{e.address.unwrap_or_default()}</td>
                                        </tr>
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
