//! Pools administered in the browser (admins, on the Hosts page): add a pool, and with a
//! pool chosen, change its settings (placement policy, compute overcommit, MPS client
//! limit, admission, preemption, GPU memory budgets, what its tasks may do). The same
//! validation and messages as `POST /api/v1/pools` and `PATCH /api/v1/pools/{name}`; the
//! capacity provider has its own panel (`pool_provider`).

use crate::access::{Declaration, guard};
use crate::components::FieldErrors;
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use tessera_model::api::{PoolInput, PoolPatch};
use tessera_model::inventory::{Admission, GpuBudget, PreemptionMode};
use tessera_model::taskdef::FieldError;
use tessera_model::{PlacementPolicy, PoolInfo};

/// Refused input comes back as field errors, anything else as the error.
type Answer = Result<Result<(), Vec<FieldError>>, ServerFnError>;

#[server]
pub async fn pool_settings(pool: String) -> Result<Option<PoolInfo>, ServerFnError> {
    use crate::data::ssr::{control_for, failed};
    let pools = control_for::<PoolSettings>()?
        .views()
        .list_pools()
        .await
        .map_err(failed)?;
    Ok(pools.into_iter().find(|p| p.name.as_str() == pool))
}

guard!(PoolSettings, Declaration::VIEW);

#[server(input = Json)]
pub async fn change_pool(pool: String, patch: PoolPatch) -> Answer {
    let control = crate::data::ssr::control_for::<ChangePool>()?;
    let name =
        tessera_model::PoolName::new(&pool).map_err(|e| ServerFnError::new(e.to_string()))?;
    match control.deployments().update_pool(&name, &patch).await {
        Ok(_) => Ok(Ok(())),
        Err(e) => crate::data::ssr::refused(e).map(Err),
    }
}

guard!(ChangePool, Declaration::ADMIN);

#[server]
pub async fn add_pool(name: String) -> Answer {
    let control = crate::data::ssr::control_for::<AddPool>()?;
    match control
        .deployments()
        .create_pool(&PoolInput::named(name))
        .await
    {
        Ok(_) => Ok(Ok(())),
        Err(e) => crate::data::ssr::refused(e).map(Err),
    }
}

guard!(AddPool, Declaration::ADMIN);

/// Adding a pool, and the chosen pool's settings: for admins only.
#[component]
pub fn PoolAdmin(pool: Signal<String>) -> impl IntoView {
    let admin = crate::access::allowed::<ChangePool>();
    let changed = RwSignal::new(0u32);
    let info = Resource::new(
        move || (pool.get(), changed.get()),
        |(p, _)| async move {
            if p.is_empty() {
                Ok(None)
            } else {
                pool_settings(p).await
            }
        },
    );
    let saved = RwSignal::new(None::<String>);
    move || {
        admin.get().is_none().then(|| view! {
            <section class="panel pool-admin" aria-label="Pool settings">
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        info.await.ok().flatten().map(|p| view! {
                            <PoolForm pool=p saved on_saved=Callback::new(move |()| changed.update(|n| *n += 1)) />
                        })
                    })}
                </Transition>
                {move || saved.get().map(|s| view! { <p class="notice" role="status">{s}</p> })}
                <AddPoolForm />
            </section>
        })
    }
}

#[component]
fn PoolForm(
    pool: PoolInfo,
    saved: RwSignal<Option<String>>,
    on_saved: Callback<()>,
) -> impl IntoView {
    let name = pool.name.to_string();
    let save = Action::new(move |patch: &PoolPatch| change_pool(name.clone(), patch.clone()));
    let policy = RwSignal::new(pool.policy.as_str().to_owned());
    let overcommit = RwSignal::new(pool.compute_overcommit.to_string());
    let limit = RwSignal::new(
        pool.mps_client_limit
            .map(|l| l.to_string())
            .unwrap_or_default(),
    );
    let admission = RwSignal::new(pool.admission.as_str().to_owned());
    let preemption = RwSignal::new(pool.preemption.as_str().to_owned());
    let budget = RwSignal::new(pool.gpu_budget.as_str().to_owned());
    let (task_users, privileged, host_network, exec) = (
        RwSignal::new(pool.task_users),
        RwSignal::new(pool.privileged),
        RwSignal::new(pool.host_network),
        RwSignal::new(pool.exec),
    );
    let local = RwSignal::new(Vec::<FieldError>::new());
    let errors = Signal::derive(move || {
        let mut e = match save.value().get() {
            Some(Ok(Err(e))) => e,
            _ => Vec::new(),
        };
        e.extend(local.get());
        e
    });
    Effect::new(move |_| {
        if let Some(Ok(Ok(()))) = save.value().get() {
            saved.set(Some("Pool settings saved.".into()));
            on_saved.run(());
        }
    });
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        saved.set(None);
        let mut bad = Vec::new();
        let overcommit = match overcommit.get_untracked().trim().parse::<f64>() {
            Ok(v) => Some(v),
            Err(_) => {
                bad.push(FieldError {
                    field: "compute_overcommit".into(),
                    message: "must be a number from 1.0 to 10.0".into(),
                });
                None
            }
        };
        let limit = match limit.get_untracked().trim() {
            "" => None,
            t => match t.parse::<u32>() {
                Ok(v) => Some(v),
                Err(_) => {
                    bad.push(FieldError {
                        field: "mps_client_limit".into(),
                        message: format!(
                            "must be a whole number from 1 to 48 (or empty), got {t:?}"
                        ),
                    });
                    None
                }
            },
        };
        local.set(bad.clone());
        if !bad.is_empty() {
            return;
        }
        save.dispatch(PoolPatch {
            policy: Some(policy.get_untracked()),
            compute_overcommit: overcommit,
            mps_client_limit: limit,
            admission: Some(admission.get_untracked()),
            task_users: Some(task_users.get_untracked()),
            privileged: Some(privileged.get_untracked()),
            host_network: Some(host_network.get_untracked()),
            exec: Some(exec.get_untracked()),
            preemption: Some(preemption.get_untracked()),
            gpu_budget: Some(budget.get_untracked()),
            provider: None,
        });
    };
    let choice = move |label: &'static str,
                       field: &'static str,
                       options: Vec<&'static str>,
                       to: RwSignal<String>| {
        view! {
            <label>{label} " "
                <select name=field on:change=move |ev| to.set(event_target_value(&ev))>
                    {options.into_iter().map(|o| view! { <option value=o selected=move || to.get() == o>{o}</option> }).collect_view()}
                </select>
                <FieldErrors errors field=field.to_owned() />
            </label>
        }
    };
    let text = move |label: &'static str,
                     field: &'static str,
                     s: RwSignal<String>,
                     hint: &'static str| {
        view! {
            <label>{label} " "
                <input type="text" inputmode="decimal" size="5" name=field prop:value=s on:input=move |ev| s.set(event_target_value(&ev)) />
                <small class="muted">{hint}</small>
                <FieldErrors errors field=field.to_owned() />
            </label>
        }
    };
    let flag = move |label: &'static str, field: &'static str, b: RwSignal<bool>| {
        view! {
            <label><input type="checkbox" name=field prop:checked=b on:change=move |ev| b.set(event_target_checked(&ev)) />" " {label}</label>
        }
    };
    view! {
        <h2>{format!("Settings of pool {}", pool.name)}</h2>
        <form class="controls" aria-label="Pool settings form" on:submit=submit>
            {choice("Placement policy", "policy", PlacementPolicy::ALL.iter().map(|p| p.as_str()).collect(), policy)}
            {text("Compute overcommit", "compute_overcommit", overcommit, "1.0: caps reserved")}
            {text("MPS client limit", "mps_client_limit", limit, "empty: the GPUs' own")}
            {choice("New hosts", "admission", Admission::ALL.iter().map(|a| a.as_str()).collect(), admission)}
            {choice("Preemption", "preemption", PreemptionMode::ALL.iter().map(|p| p.as_str()).collect(), preemption)}
            {choice("Over GPU memory budget", "gpu_budget", GpuBudget::ALL.iter().map(|g| g.as_str()).collect(), budget)}
            {flag("tasks may name their user", "task_users", task_users)}
            {flag("privileged containers", "privileged", privileged)}
            {flag("host network and NET_RAW/NET_ADMIN", "host_network", host_network)}
            {flag("operators may run commands in tasks (exec)", "exec", exec)}
            <button type="submit" class="primary">"Save pool settings"</button>
        </form>
    }
}

#[component]
fn AddPoolForm() -> impl IntoView {
    let add = Action::new(|name: &String| add_pool(name.clone()));
    let name = RwSignal::new(String::new());
    let errors = Signal::derive(move || match add.value().get() {
        Some(Ok(Err(e))) => e,
        _ => Vec::new(),
    });
    view! {
        <form class="controls" aria-label="New pool" on:submit=move |ev| {
            ev.prevent_default();
            add.dispatch(name.get_untracked());
        }>
            <label>"New pool " <input type="text" name="pool-name" prop:value=name on:input=move |ev| name.set(event_target_value(&ev)) />
                <FieldErrors errors field="name".to_owned() /></label>
            <button type="submit">"Add pool"</button>
            <small class="muted">"its settings start at their defaults; choose it above to change them"</small>
        </form>
        {move || match add.value().get() {
            Some(Ok(Ok(()))) => Some(view! { <p class="notice" role="status">{format!("Pool {} added.", name.get_untracked())}</p> }.into_any()),
            Some(Ok(Err(e))) => crate::components::request_refusal(e),
            Some(Err(e)) => Some(view! { <p class="field-error" role="alert">{e.to_string()}</p> }.into_any()),
            _ => None,
        }}
    }
}
