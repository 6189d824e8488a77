//! One host: its GPUs, the tasks it holds, its events; drain and activate.

use crate::access::{Declaration, guard};
use crate::components::{ErrorList, EventList, HostCard, RoleHint};
use crate::data::HostView;
use crate::live::use_live;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::use_params_map;
use tessera_model::HostStatus;
use tessera_model::service::Event;

#[server]
pub async fn get_host_view(id: String) -> Result<(HostView, Vec<Event>), ServerFnError> {
    use crate::data::ssr::{control, failed};
    let id = tessera_model::HostId::new(id).map_err(|e| ServerFnError::new(e.to_string()))?;
    control()?.views().host_view(&id).await.map_err(failed)
}

guard!(GetHostView, Declaration::VIEW);

/// Drain (`drain = true`) or activate a host.
#[server]
pub async fn set_host_draining(id: String, drain: bool) -> Result<(), ServerFnError> {
    let control = crate::data::ssr::control()?;
    let id = tessera_model::HostId::new(id).map_err(|e| ServerFnError::new(e.to_string()))?;
    let result = if drain {
        control.deployments().drain_host(&id).await
    } else {
        control.deployments().activate_host(&id).await
    };
    result.map_err(crate::data::ssr::failed)
}

guard!(SetHostDraining, Declaration::OPERATE);

/// Lets a host its pool held for approval take tasks, and approves the GPUs it reports
/// beyond what it was admitted with.
#[server]
pub async fn approve_host(id: String) -> Result<(), ServerFnError> {
    let control = crate::data::ssr::control_for::<ApproveHost>()?;
    let caller = crate::data::ssr::caller().ok_or_else(|| ServerFnError::new("sign in first"))?;
    let id = tessera_model::HostId::new(id).map_err(|e| ServerFnError::new(e.to_string()))?;
    control
        .agents()
        .approve_host(&caller, &id)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(ApproveHost, Declaration::ADMIN);

#[component]
pub fn HostPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let live = use_live();
    let set = Action::new(|(id, drain): &(String, bool)| set_host_draining(id.clone(), *drain));
    let operate = crate::access::allowed::<SetHostDraining>();
    let approve = Action::new(|id: &String| approve_host(id.clone()));
    let admin = crate::access::allowed::<ApproveHost>();
    let data = Resource::new(
        move || (live(), id(), set.version().get(), approve.version().get()),
        |(_, id, _, _)| get_host_view(id),
    );
    view! {
        <Title text=move || format!("Host {}", id()) />
        <p class="crumbs"><a href="/hosts">"Hosts"</a> " / " {id}</p>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    data.await
                        .map(|(view, events)| {
                            let host_id = view.host.id.to_string();
                            let draining = matches!(view.host.status, HostStatus::Draining);
                            let lost = view.host.status == HostStatus::Lost;
                            let held = view.host.held.then(|| {
                                let host_id = host_id.clone();
                                view! {
                                    <div class="notice held" role="status">
                                        <p>"Held for approval: this host registered in a pool whose admission is manual. It runs no tasks and receives no secrets until an admin approves it."</p>
                                        <button class="primary" title=move || admin.get() disabled=move || admin.get().is_some() on:click=move |_| { approve.dispatch(host_id.clone()); }>
                                            "Approve"
                                        </button>
                                        {move || approve.value().get().and_then(|r| r.err()).map(|e| view! { <p class="error">{e.to_string()}</p> })}
                                    </div>
                                }
                            });
                            let pending = (!view.host.pending_gpus.is_empty()).then(|| {
                                let host_id = host_id.clone();
                                let rows = view.host.pending_gpus.iter().map(|g| view! {
                                    <li>{g.why.clone()}</li>
                                }).collect_view();
                                view! {
                                    <div class="notice held pending-gpus" role="status">
                                        <p>"GPUs awaiting approval: the agent reports GPUs this host was not admitted with. They run nothing and are offered nothing until an admin approves them."</p>
                                        <ul>{rows}</ul>
                                        <button class="primary" title=move || admin.get() disabled=move || admin.get().is_some() on:click=move |_| { approve.dispatch(host_id.clone()); }>
                                            "Approve these GPUs"
                                        </button>
                                        {move || approve.value().get().and_then(|r| r.err()).map(|e| view! { <p class="error">{e.to_string()}</p> })}
                                    </div>
                                }
                            });
                            view! {
                                {held}
                                {pending}
                                <div class="actions">
                                    {if draining {
                                        let host_id = host_id.clone();
                                        view! {
                                            <button class="primary" title=move || operate.get() disabled=move || operate.get().is_some() on:click=move |_| { set.dispatch((host_id.clone(), false)); }>
                                                "Activate"
                                            </button>
                                        }
                                            .into_any()
                                    } else {
                                        let host_id = host_id.clone();
                                        view! {
                                            <button class="danger" title=move || operate.get() disabled=move || lost || operate.get().is_some() on:click=move |_| { set.dispatch((host_id.clone(), true)); }>
                                                "Drain"
                                            </button>
                                        }
                                            .into_any()
                                    }}
                                    <RoleHint reason=operate />
                                    {move || set.value().get().and_then(|r| r.err()).map(|e| view! { <p class="error">{e.to_string()}</p> })}
                                </div>
                                <ul class="host-list single"><HostCard view=view.clone() /></ul>
                                <Enforcement view=view.clone() />
                                <MpsServers view />
                                <section class="panel">
                                    <h2>"Events"</h2>
                                    <EventList events />
                                </section>
                            }
                        })
                })}
            </ErrorBoundary>
        </Transition>
    }
}

/// The host's agent (its version) and what it can hold its tasks to, as it said at its
/// last start: each capability held or not, with how or why not.
#[component]
fn Enforcement(view: HostView) -> impl IntoView {
    let agent = match &view.host.agent_version {
        Some(v) => format!("tessera-agent {v}"),
        None => "tessera-agent before 0.2 (it does not say its version), or not synced yet".into(),
    };
    let agent = view! { <p class="agent-version">"Agent: " {agent}</p> };
    let Some(caps) = view.host.capabilities else {
        return view! {
            <section class="panel enforcement">
                <h2>"Enforcement"</h2>
                {agent}
                <p class="muted">"Its agent has not said what it can enforce (not synced yet, or an agent older than this server)."</p>
            </section>
        }
        .into_any();
    };
    let missing = caps.named().iter().filter(|(_, c)| !c.held).count();
    let summary = if missing == 0 {
        "Everything Tessera can hold a task to is held on this host.".to_owned()
    } else {
        format!("{missing} of 6 not held on this host: tasks here are held to less than elsewhere.")
    };
    let rows = caps
        .named()
        .into_iter()
        .map(|(name, c)| {
            let (mark, class) = if c.held {
                ("held", "cap-held")
            } else {
                ("not held", "cap-missing")
            };
            view! {
                <tr data-capability=name data-held=c.held.to_string()>
                    <td>{name}</td>
                    <td><span class=format!("badge {class}")>{mark}</span></td>
                    <td class="detail">{c.detail.clone()}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section class="panel enforcement">
            <h2>"Enforcement"</h2>
            {agent}
            <p class="muted">{summary}</p>
            <table class="table">
                <thead><tr><th>"Capability"</th><th>""</th><th>"How, or why not"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </section>
    }
    .into_any()
}

/// Per GPU, the tasks that share its MPS server (one faulting client can take down every
/// client of that GPU), and how often the agent restarted the daemon.
#[component]
fn MpsServers(view: HostView) -> impl IntoView {
    let restarts = view.host.mps_restarts;
    let rows = view
        .gpus
        .iter()
        .filter(|g| !g.slots.is_empty())
        .map(|g| {
            let mut by_service: std::collections::BTreeMap<&str, u32> = Default::default();
            for s in &g.slots {
                *by_service.entry(s.service.as_str()).or_default() += 1;
            }
            let services = by_service
                .iter()
                .map(|(s, n)| format!("{s} × {n}"))
                .collect::<Vec<_>>()
                .join(", ");
            let dedicated = g.slots.iter().any(|s| s.dedicated);
            let risk = if dedicated {
                "whole GPU: no MPS clients share it".to_owned()
            } else if g.slots.len() > 1 {
                format!(
                    "a fault in one client can stop all {} clients",
                    g.slots.len()
                )
            } else {
                "one client".to_owned()
            };
            view! {
                <tr data-gpu=g.gpu.index.to_string()>
                    <td>{format!("GPU {}", g.gpu.index)}</td>
                    <td>{g.slots.len()}</td>
                    <td>{services}</td>
                    <td class="reason">{risk}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <section class="panel mps-servers">
            <h2>"Blast radius: MPS servers"</h2>
            <p class="muted" data-mps-restarts=restarts.to_string()>
                {format!("The agent restarted this host's MPS control daemon {restarts} time(s) since it started.")}
            </p>
            <table class="table">
                <thead><tr><th>"GPU"</th><th>"Clients"</th><th>"Services"</th><th>"If one client faults"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </section>
    }
}
