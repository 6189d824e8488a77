//! Notifications, for admins: the webhooks what on-call people must hear goes to (a
//! rollback, an alarm, a host impaired or lost, a crash loop, a preemption, autoscaling at
//! its maximum, a provider failing), each with its latest deliveries and their status; add
//! one (its signing secret shown once) or delete one.

use crate::access::{Declaration, guard};
use crate::components::{ErrorList, FieldErrors, RoleHint};
use crate::live::use_live;
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_meta::Title;
use tessera_model::notify::{
    Delivery, DeliveryStatus, NoticeKind, Webhook, WebhookCreated, WebhookFormat, WebhookInput,
};
use tessera_model::taskdef::FieldError;

/// Each webhook with its latest deliveries.
#[server]
pub async fn list_notifications() -> Result<Vec<(Webhook, Vec<Delivery>)>, ServerFnError> {
    use crate::data::ssr::{control_for, failed};
    let control = control_for::<ListNotifications>()?;
    let n = control.notifications();
    let mut out = Vec::new();
    for w in n.list_webhooks().await.map_err(failed)? {
        let mut d = n.deliveries(w.id).await.map_err(failed)?;
        d.truncate(10);
        out.push((w, d));
    }
    Ok(out)
}

guard!(ListNotifications, Declaration::ADMIN);

/// Adds a webhook: its secret is in this answer only; refused input comes back as field
/// errors.
#[server(input = Json)]
pub async fn add_webhook(
    input: WebhookInput,
) -> Result<Result<WebhookCreated, Vec<FieldError>>, ServerFnError> {
    let control = crate::data::ssr::control_for::<AddWebhook>()?;
    match control.notifications().create_webhook(&input).await {
        Ok(c) => Ok(Ok(c)),
        Err(e) => crate::data::ssr::refused(e).map(Err),
    }
}

guard!(AddWebhook, Declaration::ADMIN);

#[server]
pub async fn remove_webhook(id: i64) -> Result<(), ServerFnError> {
    crate::data::ssr::control_for::<RemoveWebhook>()?
        .notifications()
        .delete_webhook(id)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(RemoveWebhook, Declaration::ADMIN);

#[component]
pub fn NotificationsPage() -> impl IntoView {
    let live = use_live();
    let add = Action::new(|input: &WebhookInput| add_webhook(input.clone()));
    let remove = Action::new(|id: &i64| remove_webhook(*id));
    let data = Resource::new(
        move || (live(), add.version().get(), remove.version().get()),
        |_| list_notifications(),
    );
    view! {
        <Title text="Notifications" />
        <div class="page-head">
            <h1>"Notifications"</h1>
            <p class="lede">"Where what on-call people must hear is sent: webhooks, each delivery signed (HMAC-SHA256), retried with backoff for about 38 minutes, and listed with its status."</p>
        </div>
        <WebhookForm add />
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    data.await.map(|hooks| view! { <Webhooks hooks remove /> })
                })}
            </ErrorBoundary>
        </Transition>
    }
}

/// A comma-separated list of names, each trimmed; empty ones dropped.
fn names(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

#[component]
fn WebhookForm(
    add: Action<WebhookInput, Result<Result<WebhookCreated, Vec<FieldError>>, ServerFnError>>,
) -> impl IntoView {
    let admin = crate::access::allowed::<AddWebhook>();
    let name = RwSignal::new(String::new());
    let url = RwSignal::new(String::new());
    let format = RwSignal::new(WebhookFormat::Json);
    let kinds = RwSignal::new(Vec::<NoticeKind>::new());
    let pool = RwSignal::new(String::new());
    let project = RwSignal::new(String::new());
    let service = RwSignal::new(String::new());
    let errors = Signal::derive(move || match add.value().get() {
        Some(Ok(Err(e))) => e,
        _ => Vec::new(),
    });
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        add.dispatch(WebhookInput {
            name: name.get_untracked(),
            url: url.get_untracked(),
            format: format.get_untracked(),
            kinds: kinds.get_untracked(),
            project: names(&project.get_untracked()),
            pool: names(&pool.get_untracked()),
            service: names(&service.get_untracked()),
        });
    };
    let text = move |label: &'static str,
                     field: &'static str,
                     s: RwSignal<String>,
                     hint: &'static str| {
        view! {
            <label>{label} " "
                <input type="text" name=field prop:value=s on:input=move |ev| s.set(event_target_value(&ev)) />
                <small class="muted">{hint}</small>
                <FieldErrors errors field=field.to_owned() />
            </label>
        }
    };
    view! {
        <section class="panel">
            <h2>"Add a webhook"</h2>
            <form class="controls webhook-form" aria-label="Webhook" on:submit=submit>
                {text("Name", "name", name, "e.g. on-call")}
                {text("URL", "url", url, "https://…; for Alertmanager its base URL, e.g. http://alertmanager:9093")}
                <label>"Body "
                    <select name="format" on:change=move |ev| {
                        if let Ok(f) = event_target_value(&ev).parse() { format.set(f) }
                    }>
                        {WebhookFormat::ALL.iter().map(|f| view! { <option value=f.as_str()>{f.as_str()}</option> }).collect_view()}
                    </select>
                </label>
                <fieldset class="kinds">
                    <legend>"What it is sent (none ticked: everything)"</legend>
                    {NoticeKind::ALL.iter().map(|k| {
                        let k = *k;
                        view! {
                            <label>
                                <input type="checkbox" name="kinds" value=k.as_str()
                                    prop:checked=move || kinds.with(|ks| ks.contains(&k))
                                    on:change=move |ev| {
                                        let on = event_target_checked(&ev);
                                        kinds.update(|ks| { ks.retain(|x| *x != k); if on { ks.push(k) } });
                                    } />
                                " " {k.as_str().replace('_', " ")}
                            </label>
                        }
                    }).collect_view()}
                </fieldset>
                {text("Only pool", "pool", pool, "optional")}
                {text("Only project", "project", project, "optional")}
                {text("Only service", "service", service, "optional")}
                <button type="submit" class="primary" title=move || admin.get() disabled=move || admin.get().is_some()>"Add webhook"</button>
            </form>
            <RoleHint reason=admin />
            {move || match add.value().get() {
                Some(Ok(Ok(c))) => Some(view! {
                    <div class="minted" role="status">
                        <p>{format!("Webhook {} added. Its deliveries are signed with this secret, shown this once:", c.webhook.name)}</p>
                        <pre><code>{c.secret.clone()}</code></pre>
                        <p class="muted">"Each request carries X-Tessera-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">, and X-Tessera-Delivery, the same on every try (drop repeats by it)."</p>
                    </div>
                }.into_any()),
                Some(Ok(Err(e))) => crate::components::request_refusal(e),
                Some(Err(e)) => Some(view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any()),
                _ => None,
            }}
        </section>
    }
}

#[component]
fn Webhooks(
    hooks: Vec<(Webhook, Vec<Delivery>)>,
    remove: Action<i64, Result<(), ServerFnError>>,
) -> impl IntoView {
    if hooks.is_empty() {
        return view! { <section class="panel"><p class="muted">"No webhook yet: nobody is told of anything unless they watch this console."</p></section> }.into_any();
    }
    hooks
        .into_iter()
        .map(|(w, deliveries)| {
            let id = w.id;
            let scope: Vec<String> = [("pool", &w.pool), ("project", &w.project), ("service", &w.service)]
                .iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k} {v}")))
                .collect();
            let kinds = if w.kinds.is_empty() {
                "everything".to_owned()
            } else {
                w.kinds.iter().map(|k| k.as_str().replace('_', " ")).collect::<Vec<_>>().join(", ")
            };
            view! {
                <section class="panel webhook" data-webhook=w.name.clone()>
                    <div class="page-head with-action">
                        <h2>{w.name.clone()}</h2>
                        <button type="button" class="danger" on:click=move |_| { remove.dispatch(id); }>"Delete"</button>
                    </div>
                    <p class="muted">{format!("{} body to {} · {kinds}{}", w.format.as_str(), w.url, if scope.is_empty() { String::new() } else { format!(" · only {}", scope.join(", ")) })}</p>
                    {if deliveries.is_empty() {
                        view! { <p class="muted">"Nothing sent yet."</p> }.into_any()
                    } else {
                        view! {
                            <table class="table deliveries">
                                <thead><tr><th>"When"</th><th>"What"</th><th>"Status"</th><th>"Tries"</th><th>"Last answer"</th></tr></thead>
                                <tbody>
                                    {deliveries.into_iter().map(|d| {
                                        let answer = match (d.last_status, d.last_error.clone()) {
                                            (_, Some(e)) if d.status != DeliveryStatus::Delivered => e,
                                            (Some(s), _) => format!("HTTP {s}"),
                                            _ => "—".into(),
                                        };
                                        let next = d.next_at.filter(|_| d.status == DeliveryStatus::Pending).map(|t| format!(" (next try {})", t.clock())).unwrap_or_default();
                                        view! {
                                            <tr class=format!("delivery status-{}", d.status.as_str())>
                                                <td><time datetime=d.notice.at.to_string()>{d.notice.at.short()}</time></td>
                                                <td>{format!("{}: {}", d.notice.kind.as_str().replace('_', " "), d.notice.message)}</td>
                                                <td>{format!("{}{next}", d.status.as_str())}</td>
                                                <td>{d.attempts}</td>
                                                <td class="reason">{answer}</td>
                                            </tr>
                                        }
                                    }).collect_view()}
                                </tbody>
                            </table>
                        }.into_any()
                    }}
                </section>
            }
        })
        .collect_view()
        .into_any()
}
