//! The overview: the fleet by status, allocation against capacity and measured use,
//! packing density, stranded memory, pending tasks with their reasons, recent events.

use crate::access::{Declaration, guard};
use crate::components::{ErrorList, EventList, Meter, measured_text};
use crate::data::OverviewData;
use crate::live::use_live;
use leptos::prelude::*;
use leptos_meta::Title;

#[server]
pub async fn get_overview() -> Result<OverviewData, ServerFnError> {
    let control = crate::data::ssr::control()?;
    control
        .views()
        .overview()
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(GetOverview, Declaration::VIEW);

#[component]
pub fn OverviewPage() -> impl IntoView {
    let live = use_live();
    let data = Resource::new(live, |_| get_overview());
    view! {
        <Title text="Overview" />
        <div class="page-head">
            <h1>"Overview"</h1>
            <p class="lede">"How full the fleet is, how well it is packed, and what is waiting."</p>
        </div>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move { data.await.map(|d| view! { <Overview d /> }) })}
            </ErrorBoundary>
        </Transition>
    }
}

#[component]
fn Overview(d: OverviewData) -> impl IntoView {
    let hosts: u32 = d.hosts_by_status.iter().map(|(_, n)| n).sum();
    let gpus = d.gpus_idle + d.gpus_mps + d.gpus_dedicated;
    let mem_label = format!(
        "{} of {} GPU memory allocated ({:.0}%)",
        d.memory_allocated, d.memory_total, d.density.memory_allocated_pct
    );
    let measured = d
        .memory_measured
        .map(|m| format!("{} measured in use by tasks", measured_text(m)));
    // Compute is counted in thousandths of a GPU: 2,250 is two and a quarter GPUs' worth.
    let compute_label = format!(
        "{:.2} of {} GPUs' compute reserved ({:.0}%)",
        f64::from(d.compute_allocated.0) / 1000.0,
        gpus,
        100.0 * f64::from(d.compute_allocated.0) / f64::from(d.compute_total.0.max(1))
    );
    view! {
        <section class="cards">
            <article class="card">
                <h2>"Hosts"</h2>
                <p class="big">{hosts}</p>
                <ul class="inline">
                    {d
                        .hosts_by_status
                        .iter()
                        .map(|(s, n)| view! { <li class=format!("status-{}", s.as_str())>{format!("{n} {}", s.as_str())}</li> })
                        .collect_view()}
                </ul>
                {(d.simulated_hosts > 0).then(|| view! { <p class="muted">{format!("{} simulated", d.simulated_hosts)}</p> })}
            </article>
            <article class="card">
                <h2>"GPUs"</h2>
                <p class="big">{gpus}</p>
                <ul class="inline">
                    <li class="mode-idle">{format!("{} idle", d.gpus_idle)}</li>
                    <li class="mode-mps">{format!("{} shared (MPS)", d.gpus_mps)}</li>
                    <li class="mode-dedicated">{format!("{} dedicated", d.gpus_dedicated)}</li>
                </ul>
            </article>
            <article class="card">
                <h2>"Packing density"</h2>
                <p class="big">{format!("{:.2}", d.density.tasks_per_gpu_in_use)}</p>
                <p class="muted">"tasks per GPU in use"</p>
                <p>
                    {format!(
                        "{} GPUs in use; the allocations would fit on {} at best",
                        d.density.gpus_in_use,
                        d.density.gpus_needed_at_least,
                    )}
                </p>
            </article>
            <article class="card">
                <h2>"Stranded memory"</h2>
                <p class="big">{d.stranded_memory.to_string()}</p>
                <p class="muted">
                    {match &d.smallest_pending {
                        Some(s) => format!("free on GPUs too small for the smallest pending task, {s}"),
                        None => "nothing is pending, so no free memory is stranded".to_owned(),
                    }}
                </p>
            </article>
        </section>
        <section class="panel">
            <h2>"Memory"</h2>
            <Meter value=d.memory_allocated.0 as f64 total=d.memory_total.0 as f64 label=mem_label />
            {measured.map(|m| view! { <p class="muted">{m}</p> })}
            <h2>"Compute"</h2>
            <Meter value=f64::from(d.compute_allocated.0) total=f64::from(d.compute_total.0) label=compute_label class="compute" />
        </section>
        {(!d.failing.is_empty()).then(|| view! {
            <section class="panel failing" aria-label="Failing services">
                <h2>"Failing services"</h2>
                <ul class="failing">
                    {d.failing.iter().map(|f| view! {
                        <li>
                            <a href=format!("/services/{}", f.service)>{f.service.clone()}</a>
                            {format!(": {} task(s) of deployment #{} failed. ", f.failed_tasks, f.deployment)}
                            {f.last_task.clone().map(|t| view! {
                                "Latest: "
                                <a class="last-failed" href=format!("/tasks/{t}")>{format!("task {}", crate::pages::task::short_id(&t))}</a>
                                <span class="reason">{f.last_exit.clone().map(|e| format!(" ({e})")).unwrap_or_default()}</span>
                            })}
                        </li>
                    }).collect_view()}
                </ul>
            </section>
        })}
        <section class="panel">
            <h2>"Pending tasks"</h2>
            {if d.pending.is_empty() {
                view! { <p class="muted">"Every task is placed."</p> }.into_any()
            } else {
                view! {
                    <ul class="pending">
                        {d
                            .pending
                            .into_iter()
                            .map(|p| {
                                view! {
                                    <li>
                                        <a href=format!("/services/{}", p.service)>{p.service.clone()}</a>
                                        {format!(": {} pending. ", p.count)}
                                        <span class="reason">{p.message.unwrap_or_else(|| "not placed yet".into())}</span>
                                    </li>
                                }
                            })
                            .collect_view()}
                    </ul>
                }
                    .into_any()
            }}
        </section>
        <section class="panel">
            <h2>"Recent events"</h2>
            <EventList events=d.events />
        </section>
    }
}
