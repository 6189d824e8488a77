//! The Hosts page: every GPU host with its GPUs, filterable by pool, status and GPU model.

use crate::components::{ErrorList, SimulatedBadge, StatusBadge, gpu_state_text};
use leptos::prelude::*;
use leptos_meta::Title;
use std::collections::BTreeSet;
use tessera_model::{HostInfo, HostStatus};

/// All hosts with their GPUs, from the store.
#[server]
pub async fn list_hosts() -> Result<Vec<HostInfo>, ServerFnError> {
    use std::sync::Arc;
    use tessera_control::Store;
    let store = use_context::<Arc<dyn Store>>()
        .ok_or_else(|| ServerFnError::new("the console is not connected to a store"))?;
    store.list_hosts().await.map_err(|e| {
        tracing::error!(error = %e, "listing hosts failed");
        ServerFnError::new("could not read the hosts; the server log has the cause")
    })
}

/// What the filters select; empty means any.
#[derive(Debug, Clone, Default, PartialEq)]
struct HostFilter {
    pool: String,
    status: String,
    model: String,
}

impl HostFilter {
    fn matches(&self, host: &HostInfo) -> bool {
        (self.pool.is_empty() || host.pool.as_str() == self.pool)
            && (self.status.is_empty() || host.status.as_str() == self.status)
            && (self.model.is_empty() || host.gpus.iter().any(|g| g.model == self.model))
    }
}

#[component]
pub fn HostsPage() -> impl IntoView {
    let hosts = Resource::new(|| (), |_| list_hosts());
    let filter = RwSignal::new(HostFilter::default());
    view! {
        <Title text="Hosts" />
        <div class="page-head">
            <h1>"Hosts"</h1>
            <p class="lede">"GPU hosts by pool, with each GPU's memory and sharing mode."</p>
        </div>
        <Suspense fallback=|| view! { <p class="muted">"Loading hosts…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    hosts.await.map(|all| view! { <HostList all filter /> })
                })}
            </ErrorBoundary>
        </Suspense>
    }
}

/// The filters and the hosts they select.
#[component]
fn HostList(all: Vec<HostInfo>, filter: RwSignal<HostFilter>) -> impl IntoView {
    let total = all.len();
    let pools: BTreeSet<String> = all.iter().map(|h| h.pool.to_string()).collect();
    let models: BTreeSet<String> = all
        .iter()
        .flat_map(|h| h.gpus.iter().map(|g| g.model.clone()))
        .collect();
    let all = StoredValue::new(all);
    let shown = move || {
        let f = filter.get();
        all.with_value(|hosts| {
            hosts
                .iter()
                .filter(|h| f.matches(h))
                .cloned()
                .collect::<Vec<_>>()
        })
    };
    let options = |values: Vec<String>| {
        values
            .into_iter()
            .map(|v| view! { <option value=v.clone()>{v.clone()}</option> })
            .collect_view()
    };
    view! {
        <form class="filters" aria-label="Filter hosts" on:submit=|ev| ev.prevent_default()>
            <label>
                "Pool"
                <select
                    name="pool"
                    on:change=move |ev| filter.update(|f| f.pool = event_target_value(&ev))
                >
                    <option value="">"All pools"</option>
                    {options(pools.into_iter().collect())}
                </select>
            </label>
            <label>
                "Status"
                <select
                    name="status"
                    on:change=move |ev| filter.update(|f| f.status = event_target_value(&ev))
                >
                    <option value="">"Any status"</option>
                    {options(HostStatus::ALL.iter().map(|s| s.as_str().to_owned()).collect())}
                </select>
            </label>
            <label>
                "GPU model"
                <select
                    name="model"
                    on:change=move |ev| filter.update(|f| f.model = event_target_value(&ev))
                >
                    <option value="">"Any model"</option>
                    {options(models.into_iter().collect())}
                </select>
            </label>
            <p class="count" aria-live="polite">
                {move || format!("{} of {total} hosts", shown().len())}
            </p>
        </form>
        {move || {
            let hosts = shown();
            if hosts.is_empty() {
                view! { <p class="empty">"No host matches these filters."</p> }.into_any()
            } else {
                view! {
                    <ul class="host-list">
                        <For each=move || hosts.clone() key=|h| h.id.clone() let:host>
                            <HostCard host />
                        </For>
                    </ul>
                }
                    .into_any()
            }
        }}
    }
}

/// One host and its GPUs.
#[component]
fn HostCard(host: HostInfo) -> impl IntoView {
    let gpu_total = host.gpu_memory_total();
    view! {
        <li class="host-card" data-host=host.id.to_string()>
            <div class="host-head">
                <h2>{host.id.to_string()}</h2>
                <StatusBadge status=host.status />
                {host.simulated.then(|| view! { <SimulatedBadge /> })}
            </div>
            <p class="host-meta">
                <span>"pool " <strong>{host.pool.to_string()}</strong></span>
                <span>{host.cpu.to_string()}</span>
                <span>{format!("{} host memory", host.memory)}</span>
                <span>{format!("{} GPUs · {} GPU memory", host.gpus.len(), gpu_total)}</span>
            </p>
            <ul class="gpu-list">
                {host
                    .gpus
                    .into_iter()
                    .map(|g| {
                        let state = gpu_state_text(g.sharing_mode, g.health);
                        view! {
                            <li class="gpu" title=format!("{} · {}", g.uuid, g.model)>
                                <span class="gpu-index">{format!("GPU {}", g.index)}</span>
                                <span class="gpu-model">{g.model.clone()}</span>
                                <span class="gpu-mem">{g.memory.to_string()}</span>
                                <span class="gpu-limit">{format!("{} MPS clients", g.mps_client_limit)}</span>
                                <span class=format!("gpu-state mode-{}", g.sharing_mode.as_str())>{state}</span>
                            </li>
                        }
                    })
                    .collect_view()}
            </ul>
        </li>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::{HostId, MiB, MilliCpu, PoolName};

    fn host(pool: &str, status: HostStatus) -> HostInfo {
        HostInfo {
            id: HostId::new("h").expect("valid"),
            pool: PoolName::new(pool).expect("valid"),
            status,
            simulated: false,
            cpu: MilliCpu(1000),
            memory: MiB(1024),
            labels: Default::default(),
            gpus: vec![],
        }
    }

    #[test]
    fn filter_matches_every_set_field() {
        let any = HostFilter::default();
        assert!(any.matches(&host("a", HostStatus::Active)));
        let f = HostFilter {
            pool: "a".into(),
            status: "draining".into(),
            model: String::new(),
        };
        assert!(!f.matches(&host("a", HostStatus::Active)));
        assert!(f.matches(&host("a", HostStatus::Draining)));
        assert!(!f.matches(&host("b", HostStatus::Draining)));
    }
}
