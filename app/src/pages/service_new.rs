//! The guided service setup: task definition, pool and count, strategy and constraints,
//! deployment settings, then a preview of where every task would land (and why any would
//! not fit) before Create. Each step is checked in the browser with the server's own rules
//! (`tessera_model::validate`) before the next one opens.

use crate::access::{Declaration, guard, ops};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_meta::Title;
use leptos_router::hooks::use_navigate;
use std::collections::BTreeMap;
use tessera_model::PoolInfo;
use tessera_model::api::{PreviewInput, PreviewResult, ServiceInput};
use tessera_model::service::{DeploymentConfig, Service, ServiceConstraints};
use tessera_model::taskdef::FieldError;

/// What the wizard chooses from: active revisions (`family:revision`) and pools.
#[server]
pub async fn wizard_choices() -> Result<(Vec<String>, Vec<PoolInfo>), ServerFnError> {
    use crate::data::ssr::{control, failed};
    let control = control()?;
    let defs = control.views().active_revisions().await.map_err(failed)?;
    Ok((defs, control.views().list_pools().await.map_err(failed)?))
}

guard!(WizardChoices, Declaration::VIEW);

/// A control-plane refusal as field errors the wizard shows; anything else is internal.
#[cfg(feature = "ssr")]
fn invalid(e: tessera_control::ControlError) -> Result<Vec<FieldError>, ServerFnError> {
    use tessera_control::Told;
    match e.told() {
        Told::Invalid(fields) => Ok(fields),
        Told::Conflict(m) | Told::NotFound(m) => Ok(vec![FieldError {
            field: "name".into(),
            message: m,
        }]),
        other => Err(crate::data::ssr::told(other)),
    }
}

#[server(input = Json)]
pub async fn preview_placement(
    input: PreviewInput,
) -> Result<Result<PreviewResult, Vec<FieldError>>, ServerFnError> {
    match crate::data::ssr::control()?
        .scheduler()
        .preview(&input)
        .await
    {
        Ok(r) => Ok(Ok(r)),
        Err(e) => invalid(e).map(Err),
    }
}

guard!(PreviewPlacement, Declaration::OPERATE);

#[server(input = Json)]
pub async fn create_service(
    input: ServiceInput,
) -> Result<Result<Service, Vec<FieldError>>, ServerFnError> {
    let control = crate::data::ssr::control()?;
    // The layer checked the caller may put a service into the project the input names
    // (`ops::CREATE_SERVICE`); the class is a rule on what is asked for.
    let caller = crate::data::ssr::caller().ok_or_else(|| ServerFnError::new("sign in first"))?;
    tessera_model::project::may_set_class(&caller, input.priority, false)
        .map_err(ServerFnError::new)?;
    match control.deployments().create_service(&input).await {
        Ok(s) => Ok(Ok(s)),
        Err(e) => invalid(e).map(Err),
    }
}

guard!(CreateService, ops::CREATE_SERVICE, body = input);

/// The step (index into [`STEPS`]) whose form holds `field`.
fn step_of(field: &str) -> usize {
    match field {
        "name" | "task_definition" => 0,
        "pool" | "desired_count" => 1,
        f if f == "strategy" || f.starts_with("constraints") => 2,
        _ => 3,
    }
}

/// A whole number typed into a field, or the error that names the field.
fn whole(field: &str, raw: &str) -> Result<u32, FieldError> {
    raw.trim().parse().map_err(|_| FieldError {
        field: field.to_owned(),
        message: format!("must be a whole number, got {:?}", raw.trim()),
    })
}

const STEPS: [&str; 5] = [
    "Task definition",
    "Pool and count",
    "Placement",
    "Deployment",
    "Preview",
];

#[component]
pub fn ServiceWizardPage() -> impl IntoView {
    let choices = Resource::new(|| (), |_| wizard_choices());
    view! {
        <Title text="Create service" />
        <p class="crumbs"><a href="/services">"Services"</a> " / new"</p>
        <h1>"Create service"</h1>
        <Suspense fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move {
                match choices.await {
                    Ok((defs, pools)) => view! { <Wizard defs pools /> }.into_any(),
                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                }
            })}
        </Suspense>
    }
}

#[component]
fn Wizard(defs: Vec<String>, pools: Vec<PoolInfo>) -> impl IntoView {
    let step = RwSignal::new(0usize);
    let name = RwSignal::new(String::new());
    let def = RwSignal::new(defs.first().cloned().unwrap_or_default());
    let pool = RwSignal::new(
        pools
            .first()
            .map(|p| p.name.to_string())
            .unwrap_or_default(),
    );
    let count = RwSignal::new("2".to_owned());
    let strategy = RwSignal::new(String::new());
    let models = RwSignal::new(String::new());
    let labels = RwSignal::new(String::new());
    let distinct = RwSignal::new(false);
    let per_gpu = RwSignal::new(String::new());
    let per_host = RwSignal::new(String::new());
    let min_healthy = RwSignal::new("100".to_owned());
    let max_percent = RwSignal::new("200".to_owned());
    let stop_timeout = RwSignal::new("30".to_owned());
    let deregistration_delay = RwSignal::new("5".to_owned());

    let constraints = move || ServiceConstraints {
        gpu_models: models
            .get()
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .collect(),
        labels: labels
            .get()
            .lines()
            .filter_map(|l| {
                l.split_once('=')
                    .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            })
            .collect::<BTreeMap<_, _>>(),
        distinct_hosts: distinct.get(),
        // Empty: no cap; anything else is checked by the server (0 or words are refused).
        max_per_gpu: cap(per_gpu.get()),
        max_per_host: cap(per_host.get()),
    };
    // Text that is not a number is named by `problems`; the body gets a value the rules refuse.
    let number = |s: String| whole("", &s).unwrap_or(u32::MAX);
    let service_input = move || ServiceInput {
        name: name.get(),
        task_definition: def.get(),
        pool: pool.get(),
        project: None,
        priority: None,
        desired_count: number(count.get()),
        strategy: Some(strategy.get()).filter(|s| !s.is_empty()),
        constraints: constraints(),
        deployment: Some(DeploymentConfig {
            minimum_healthy_percent: number(min_healthy.get()),
            maximum_percent: number(max_percent.get()),
        }),
        stop_timeout_secs: number(stop_timeout.get()),
        deregistration_delay_secs: number(deregistration_delay.get()),
        slo: None,
        alarms: Vec::new(),
        bake_secs: 0,
        autoscaling: None,
    };
    let preview = Action::new(|input: &PreviewInput| preview_placement(input.clone()));
    let operate = crate::access::allowed::<CreateService>();
    let may_preview = crate::access::allowed::<PreviewPlacement>();
    let create = Action::new(|input: &ServiceInput| create_service(input.clone()));
    let go = move |to: usize| {
        step.set(to);
        if to == 4 {
            preview.dispatch(PreviewInput {
                task_definition: def.get_untracked(),
                pool: pool.get_untracked(),
                count: number(count.get_untracked()).min(1000),
                strategy: Some(strategy.get_untracked()).filter(|s| !s.is_empty()),
                constraints: constraints(),
            });
        }
    };
    // What the typed text breaks, by the server's rules: numbers that are not numbers
    // first, then the body's own rules for the fields that are.
    let problems = move || {
        let mut errors: Vec<FieldError> = [
            ("desired_count", count.get()),
            ("deployment.minimum_healthy_percent", min_healthy.get()),
            ("deployment.maximum_percent", max_percent.get()),
            ("stop_timeout_secs", stop_timeout.get()),
            ("deregistration_delay_secs", deregistration_delay.get()),
            ("constraints.max_per_gpu", per_gpu.get()),
            ("constraints.max_per_host", per_host.get()),
        ]
        .into_iter()
        .filter(|(f, raw)| !(f.starts_with("constraints") && raw.trim().is_empty()))
        .filter_map(|(f, raw)| whole(f, &raw).err())
        .collect();
        if let Err(rules) = tessera_model::validate::service(&service_input()) {
            let unreadable: Vec<String> = errors.iter().map(|e| e.field.clone()).collect();
            errors.extend(
                rules
                    .errors
                    .into_iter()
                    .filter(|e| !unreadable.contains(&e.field)),
            );
        }
        errors
    };
    // Shown once Next was pressed on a step with problems; they go as they are fixed.
    let tried = RwSignal::new(false);
    let step_problems = move || {
        let at = step.get();
        problems()
            .into_iter()
            .filter(|e| step_of(&e.field) == at)
            .collect::<Vec<_>>()
    };
    let next = move || {
        if step_problems().is_empty() {
            tried.set(false);
            go(step.get_untracked() + 1);
        } else {
            tried.set(true);
        }
    };
    let navigate = use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(Ok(s))) = create.value().get() {
            navigate(&format!("/services/{}", s.name), Default::default());
        }
    });
    let create_errors = move || match create.value().get() {
        Some(Ok(Err(e))) => e,
        Some(Err(e)) => vec![FieldError {
            field: "(server)".into(),
            message: e.to_string(),
        }],
        _ => vec![],
    };
    let def_options = defs
        .iter()
        .map(|d| view! { <option value=d.clone()>{d.clone()}</option> })
        .collect_view();
    let pool_options = pools
        .iter()
        .map(|p| view! { <option value=p.name.to_string()>{format!("{} ({})", p.name, p.policy)}</option> })
        .collect_view();
    view! {
        <ol class="steps">
            {STEPS
                .iter()
                .enumerate()
                .map(|(i, s)| view! { <li class:current=move || { step.get() == i } class:done=move || { step.get() > i }>{format!("{}. {s}", i + 1)}</li> })
                .collect_view()}
        </ol>
        <form class="wizard" on:submit=|ev| ev.prevent_default()>
            <div class="step" hidden=move || step.get() != 0>
                <label class="field">
                    "Service name"
                    <input type="text" name="name" bind:value=name />
                    <small class="hint">"Lower-case letters, digits and dashes, e.g. " <code>"embeddings-api"</code></small>
                </label>
                <label class="field">
                    "Task definition"
                    <select name="task_definition" on:change=move |ev| def.set(event_target_value(&ev))>{def_options}</select>
                </label>
                {defs.is_empty().then(|| view! { <p class="field-error">"No active task definition: register one first."</p> })}
            </div>
            <div class="step" hidden=move || step.get() != 1>
                <label class="field">"Pool" <select name="pool" on:change=move |ev| pool.set(event_target_value(&ev))>{pool_options}</select></label>
                <label class="field">"Desired tasks" <input type="text" inputmode="numeric" name="desired_count" bind:value=count /></label>
            </div>
            <div class="step" hidden=move || step.get() != 2>
                <label class="field">
                    "Strategy"
                    <select name="strategy" on:change=move |ev| strategy.set(event_target_value(&ev))>
                        <option value="">"Pool default"</option>
                        <option value="fragmentation">"fragmentation (pack, keep free room usable)"</option>
                        <option value="binpack">"binpack (fullest GPU first)"</option>
                        <option value="spread_host">"spread over hosts"</option>
                        <option value="spread_gpu">"spread over GPUs"</option>
                    </select>
                </label>
                <label class="field">"GPU models (comma-separated, empty for any)" <input type="text" name="gpu_models" bind:value=models /></label>
                <label class="field">"Host labels (KEY=VALUE per line)" <textarea name="labels" rows="2" bind:value=labels></textarea></label>
                <label class="check"><input type="checkbox" name="distinct_hosts" bind:checked=distinct />" One task per host"</label>
                <label class="field">"Most tasks per GPU (one MPS server; empty for no cap)" <input type="text" inputmode="numeric" name="max_per_gpu" size="4" bind:value=per_gpu /></label>
                <label class="field">"Most tasks per host (empty for no cap)" <input type="text" inputmode="numeric" name="max_per_host" size="4" bind:value=per_host /></label>
            </div>
            <div class="step" hidden=move || step.get() != 3>
                <label class="field">"Minimum healthy (%)" <input type="text" inputmode="numeric" name="minimum_healthy_percent" bind:value=min_healthy /></label>
                <label class="field">"Maximum (%)" <input type="text" inputmode="numeric" name="maximum_percent" bind:value=max_percent /></label>
                <label class="field">"Stop timeout (s)" <input type="text" inputmode="numeric" name="stop_timeout_secs" bind:value=stop_timeout /></label>
                <label class="field">"Deregistration delay (s)" <input type="text" inputmode="numeric" name="deregistration_delay_secs" bind:value=deregistration_delay />
                    <small class="hint">"A task stopped on purpose leaves the endpoint list this long before its stop signal"</small></label>
            </div>
            <div class="step" hidden=move || step.get() != 4>
                {move || match preview.value().get() {
                    None => view! { <p class="muted">"Computing the preview…"</p> }.into_any(),
                    Some(Err(e)) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                    Some(Ok(Err(errors))) => view! { <Problems errors /> }.into_any(),
                    Some(Ok(Ok(r))) => view! { <Preview r /> }.into_any(),
                }}
                {move || {
                    let errors = create_errors();
                    (!errors.is_empty()).then(|| view! { <Problems errors /> })
                }}
            </div>
            {move || {
                tried
                    .get()
                    .then(step_problems)
                    .filter(|errors| !errors.is_empty())
                    .map(|errors| view! { <Problems errors /> })
            }}
            <div class="actions">
                <button type="button" disabled=move || step.get() == 0 on:click=move |_| { tried.set(false); go(step.get().saturating_sub(1)) }>"Back"</button>
                <crate::components::RoleHint reason=operate />
                <Show
                    when=move || step.get() < 4
                    fallback=move || {
                        view! {
                            <button type="button" class="primary" title=move || operate.get() disabled=move || create.pending().get() || operate.get().is_some() on:click=move |_| { create.dispatch(service_input()); }>
                                "Create"
                            </button>
                        }
                    }
                >
                    <button type="button" class="primary" title=move || (step.get() == 3).then(|| may_preview.get()).flatten() disabled=move || step.get() == 3 && may_preview.get().is_some() on:click=move |_| next()>
                        {move || if step.get() == 3 { "Preview" } else { "Next" }}
                    </button>
                </Show>
            </div>
        </form>
    }
}

/// Field errors, each with the field it concerns.
#[component]
fn Problems(errors: Vec<FieldError>) -> impl IntoView {
    view! {
        <ul class="field-error" role="alert">
            {errors.into_iter().map(|e| view! { <li><code>{e.field}</code>": "{e.message}</li> }).collect_view()}
        </ul>
    }
}

#[component]
fn Preview(r: PreviewResult) -> impl IntoView {
    let (before, after) = (r.density_before, r.density_after);
    view! {
        <p class="preview-summary">
            {format!("{} of {} task(s) would be placed now with the {} policy.", r.placed, r.placed + r.unplaced, r.policy)}
        </p>
        <p class="muted">
            {format!(
                "Density: {} → {} GPUs in use; {:.2} → {:.2} tasks per GPU in use; GPU memory allocated {:.0}% → {:.0}%.",
                before.gpus_in_use, after.gpus_in_use, before.tasks_per_gpu_in_use, after.tasks_per_gpu_in_use,
                before.memory_allocated_pct, after.memory_allocated_pct,
            )}
        </p>
        <table class="table preview">
            <thead><tr><th>"Task"</th><th>"Host"</th><th>"GPU"</th><th>"Why not"</th></tr></thead>
            <tbody>
                {r.tasks
                    .into_iter()
                    .map(|t| {
                        let placed = t.host.is_some();
                        view! {
                            <tr class:unplaced=!placed>
                                <td>{t.index + 1}</td>
                                <td>{t.host.map(|h| h.to_string()).unwrap_or_else(|| "—".into())}</td>
                                <td>{t.gpus.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(", ")}</td>
                                <td class="reason">{t.message.unwrap_or_default()}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
}

/// An optional cap as typed: empty is none; what does not parse becomes 0, which the
/// server refuses with the field's rule.
fn cap(raw: String) -> Option<u32> {
    let raw = raw.trim();
    (!raw.is_empty()).then(|| whole("", raw).unwrap_or(0))
}
