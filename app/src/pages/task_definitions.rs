//! Task definitions: the families with their latest revision, and the editor that registers
//! a new revision (a form, or JSON in Tessera's or ECS's shape), validated as you type by
//! the same validator the API uses.

use crate::access::{Declaration, guard};
use crate::components::{ErrorList, FieldErrors};
use crate::live::use_live;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::hooks::{use_navigate, use_query_map};
use serde_json::{Map, Value, json};
use tessera_model::service::TaskDefinition;
use tessera_model::taskdef::{
    FieldError, GpuRequirement, TaskDefinitionSpec, TaskGpu, parse_task_definition,
};

#[server]
pub async fn list_task_definitions() -> Result<Vec<TaskDefinition>, ServerFnError> {
    use crate::data::ssr::{control, failed};
    control()?
        .views()
        .list_task_definition_families()
        .await
        .map_err(failed)
}

guard!(ListTaskDefinitions, Declaration::VIEW);

#[server]
pub async fn get_task_definition(reference: String) -> Result<TaskDefinition, ServerFnError> {
    let r: tessera_model::service::TaskDefRef = reference
        .parse()
        .map_err(|e: tessera_model::service::TaskDefRefError| ServerFnError::new(e.to_string()))?;
    crate::data::ssr::control()?
        .views()
        .get_task_definition(&r)
        .await
        .map_err(crate::data::ssr::failed)
}

guard!(GetTaskDefinition, Declaration::VIEW);

/// Registers `body` (JSON); invalid input comes back as field errors and stores nothing.
#[server]
pub async fn register_task_definition(
    body: String,
) -> Result<Result<TaskDefinition, Vec<FieldError>>, ServerFnError> {
    let value: Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => {
            return Ok(Err(vec![FieldError {
                field: "(json)".into(),
                message: e.to_string(),
            }]));
        }
    };
    match crate::data::ssr::control()?
        .deployments()
        .register_task_definition(&value)
        .await
    {
        Ok(def) => Ok(Ok(def)),
        Err(e) => crate::data::ssr::field_errors(e).map(Err),
    }
}

guard!(RegisterTaskDefinition, Declaration::OPERATE);

/// The GPU part of a spec in a few words.
pub fn gpu_summary(spec: &TaskDefinitionSpec) -> String {
    match spec.gpu() {
        TaskGpu::None => "no GPU".into(),
        TaskGpu::Whole { count } => format!("{count} whole GPU(s)"),
        TaskGpu::Shared {
            memory,
            compute: Some(c),
        } => format!("MPS: {memory}, {c} compute"),
        TaskGpu::Shared {
            memory,
            compute: None,
        } => format!("MPS: {memory}, no compute cap"),
    }
}

#[component]
pub fn TaskDefinitionsPage() -> impl IntoView {
    let live = use_live();
    let defs = Resource::new(live, |_| list_task_definitions());
    view! {
        <Title text="Task definitions" />
        <div class="page-head with-action">
            <div>
                <h1>"Task definitions"</h1>
                <p class="lede">"What tasks run and the GPU memory and compute they may use. Editing registers a new revision."</p>
            </div>
            <a class="button primary" href="/task-definitions/new">"New task definition"</a>
        </div>
        <Transition fallback=|| view! { <p class="muted">"Loading…"</p> }>
            <ErrorBoundary fallback=|errors| view! { <ErrorList errors /> }>
                {move || Suspend::new(async move {
                    defs.await
                        .map(|defs| {
                            if defs.is_empty() {
                                return view! { <p class="empty">"No task definitions yet."</p> }.into_any();
                            }
                            view! {
                                <table class="table">
                                    <thead>
                                        <tr><th>"Family"</th><th>"Latest"</th><th>"CPU"</th><th>"Memory"</th><th>"GPU"</th><th>"Status"</th></tr>
                                    </thead>
                                    <tbody>
                                        {defs
                                            .into_iter()
                                            .map(|d| {
                                                view! {
                                                    <tr>
                                                        <td><a href=format!("/task-definitions/{}", d.family)>{d.family.clone()}</a></td>
                                                        <td>{format!("revision {}", d.revision)}</td>
                                                        <td>{d.spec.cpu().to_string()}</td>
                                                        <td>{d.spec.memory().to_string()}</td>
                                                        <td>{gpu_summary(&d.spec)}</td>
                                                        <td>{if d.active { "active" } else { "inactive" }}</td>
                                                    </tr>
                                                }
                                            })
                                            .collect_view()}
                                    </tbody>
                                </table>
                            }
                                .into_any()
                        })
                })}
            </ErrorBoundary>
        </Transition>
    }
}

/// `KEY=VALUE` lines as a JSON object; a line without `=` gets `bare`.
fn key_values(text: &str, bare: Value) -> Map<String, Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_once('=') {
            Some((k, v)) => (k.trim().to_owned(), Value::String(v.to_owned())),
            None => (l.trim().to_owned(), bare.clone()),
        })
        .collect()
}

/// One container in the form; every field is text so bad input can be shown, not lost.
#[derive(Clone, Copy)]
struct ContainerForm {
    id: usize,
    name: RwSignal<String>,
    /// Empty: runs as a process on the host.
    image: RwSignal<String>,
    /// `entryPoint` (arguments separated by spaces), run before the command.
    entry_point: RwSignal<String>,
    command: RwSignal<String>,
    env: RwSignal<String>,
    /// `NAME=VALUE` sets a secret; a bare `NAME` keeps the value the family has now.
    secrets: RwSignal<String>,
    cpu: RwSignal<String>,
    memory: RwSignal<String>,
    gpu: RwSignal<String>,
    gpus: RwSignal<String>,
    mps_memory: RwSignal<String>,
    mps_compute: RwSignal<String>,
    /// ECS fields the form does not show, carried to the next revision as they are.
    ecs: RwSignal<Value>,
}

impl ContainerForm {
    fn new(id: usize) -> Self {
        ContainerForm {
            id,
            name: RwSignal::new(if id == 0 {
                "main".into()
            } else {
                format!("sidecar-{id}")
            }),
            image: RwSignal::new(String::new()),
            entry_point: RwSignal::new(String::new()),
            command: RwSignal::new(String::new()),
            env: RwSignal::new(String::new()),
            secrets: RwSignal::new(String::new()),
            cpu: RwSignal::new("1".into()),
            memory: RwSignal::new("1024".into()),
            gpu: RwSignal::new("mps".into()),
            gpus: RwSignal::new("1".into()),
            mps_memory: RwSignal::new("8192".into()),
            mps_compute: RwSignal::new(String::new()),
            ecs: RwSignal::new(Value::Null),
        }
    }

    fn from_spec(id: usize, c: &tessera_model::taskdef::ContainerSpec) -> Self {
        let f = ContainerForm::new(id);
        f.name.set(c.name.clone());
        f.image.set(c.image.clone().unwrap_or_default());
        f.entry_point.set(c.entry_point.join(" "));
        f.command.set(c.command.join(" "));
        if !c.ecs.is_empty() {
            f.ecs.set(Value::Object(c.ecs.clone()));
        }
        f.env.set(
            c.env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
        // Values are never sent to the console: names only, which keep their values.
        f.secrets
            .set(c.secrets.keys().cloned().collect::<Vec<_>>().join("\n"));
        f.cpu.set(format!("{}", c.cpu_milli.0 as f64 / 1000.0));
        f.memory.set(c.memory_mib.0.to_string());
        match c.gpu {
            None => f.gpu.set("none".into()),
            Some(GpuRequirement::Gpus(n)) => {
                f.gpu.set("whole".into());
                f.gpus.set(n.to_string());
            }
            Some(GpuRequirement::Mps {
                memory_mib,
                max_compute_percent,
            }) => {
                f.gpu.set("mps".into());
                f.mps_memory.set(memory_mib.0.to_string());
                f.mps_compute.set(
                    max_compute_percent
                        .map(|p| p.get().to_string())
                        .unwrap_or_default(),
                );
            }
        }
        f
    }

    /// The container as JSON; text that is not a number stays text, so the validator
    /// names the field.
    fn to_json(self) -> Value {
        let num = |s: String| {
            s.trim()
                .parse::<u64>()
                .map(Value::from)
                .unwrap_or(Value::String(s))
        };
        let cpu = self.cpu.get();
        let cpu_milli = cpu
            .trim()
            .parse::<f64>()
            .map(|v| Value::from((v * 1000.0).round() as u64))
            .unwrap_or(Value::String(cpu));
        // A bare KEY is null in env (the validator names it) and "keep" for a secret.
        let env = key_values(&self.env.get(), Value::Null);
        let secrets = key_values(&self.secrets.get(), json!({ "set": true }));
        let mut c = json!({
            "name": self.name.get(),
            "command": self.command.get().split_whitespace().collect::<Vec<_>>(),
            "env": env,
            "cpu_milli": cpu_milli,
            "memory_mib": num(self.memory.get()),
        });
        if !secrets.is_empty() {
            c["secrets"] = Value::Object(secrets);
        }
        let image = self.image.get();
        if !image.trim().is_empty() {
            c["image"] = image.trim().into();
        }
        let entry_point: Vec<String> = self
            .entry_point
            .get()
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        if !entry_point.is_empty() {
            c["entry_point"] = entry_point.into();
        }
        let ecs = self.ecs.get();
        if !ecs.is_null() {
            c["ecs"] = ecs;
        }
        match self.gpu.get().as_str() {
            "whole" => c["gpu"] = json!({ "gpus": num(self.gpus.get()) }),
            "mps" => {
                let mut mps = json!({ "memory_mib": num(self.mps_memory.get()) });
                let cap = self.mps_compute.get();
                if !cap.trim().is_empty() {
                    mps["max_compute_percent"] = num(cap);
                }
                c["gpu"] = json!({ "mps": mps });
            }
            _ => {}
        }
        c
    }
}

/// The editor: `/task-definitions/new`, optionally `?from=family:revision` to start from one.
#[component]
pub fn TaskDefinitionEditorPage() -> impl IntoView {
    let query = use_query_map();
    let from = move || query.read().get("from");
    let base = Resource::new(from, |from| async move {
        match from {
            Some(r) => get_task_definition(r).await.ok(),
            None => None,
        }
    });
    view! {
        <Title text="New task definition" />
        <p class="crumbs"><a href="/task-definitions">"Task definitions"</a> " / new"</p>
        <h1>"New task definition"</h1>
        <Suspense fallback=|| view! { <p class="muted">"Loading…"</p> }>
            {move || Suspend::new(async move { view! { <Editor base=base.await /> } })}
        </Suspense>
    }
}

#[component]
fn Editor(base: Option<TaskDefinition>) -> impl IntoView {
    let family = RwSignal::new(base.as_ref().map(|d| d.family.clone()).unwrap_or_default());
    let containers = RwSignal::new(match &base {
        Some(d) => d
            .spec
            .containers
            .iter()
            .enumerate()
            .map(|(i, c)| ContainerForm::from_spec(i, c))
            .collect(),
        None => vec![ContainerForm::new(0)],
    });
    let next_id = StoredValue::new(containers.get_untracked().len());
    let tab = RwSignal::new("form");
    let json_text = RwSignal::new(String::new());
    let tried = RwSignal::new(false);
    // ECS task-level fields the form does not show, carried to the next revision as they are.
    let task_ecs = StoredValue::new(
        base.as_ref()
            .filter(|d| !d.spec.ecs.is_empty())
            .map(|d| Value::Object(d.spec.ecs.clone())),
    );
    let form_json = move || {
        let mut doc = json!({ "family": family.get(), "containers": containers.get().into_iter().map(ContainerForm::to_json).collect::<Vec<_>>() });
        if let Some(ecs) = task_ecs.get_value() {
            doc["ecs"] = ecs;
        }
        doc
    };
    let current = move || -> Result<Value, Vec<FieldError>> {
        if tab.get() == "json" {
            serde_json::from_str(&json_text.get()).map_err(|e| {
                vec![FieldError {
                    field: "(json)".into(),
                    message: format!("not valid JSON: {e}"),
                }]
            })
        } else {
            Ok(form_json())
        }
    };
    let local_errors = Memo::new(move |_| match current() {
        Err(e) => e,
        Ok(v) => parse_task_definition(&v)
            .err()
            .map(|e| e.errors)
            .unwrap_or_default(),
    });
    let register = Action::new(|body: &String| register_task_definition(body.clone()));
    let operate = crate::access::allowed::<RegisterTaskDefinition>();
    let server_errors = move || match register.value().get() {
        Some(Ok(Err(errors))) => errors,
        _ => vec![],
    };
    let shown = Signal::derive(move || {
        let mut e = if tried.get() {
            local_errors.get()
        } else {
            vec![]
        };
        e.extend(server_errors());
        e
    });
    let navigate = use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(Ok(def))) = register.value().get() {
            navigate(
                &format!("/task-definitions/{}", def.family),
                Default::default(),
            );
        }
    });
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        tried.set(true);
        if let (true, Ok(v)) = (local_errors.get_untracked().is_empty(), current()) {
            register.dispatch(v.to_string());
        }
    };
    let numbered = move || containers.get().into_iter().enumerate().collect::<Vec<_>>();
    let to_json_tab = move |_| {
        json_text.set(serde_json::to_string_pretty(&form_json()).unwrap_or_default());
        tab.set("json");
    };
    view! {
        <form class="editor" on:submit=submit novalidate>
            <div class="tabs" role="tablist">
                <button type="button" role="tab" aria-selected=move || (tab.get() == "form").to_string() on:click=move |_| tab.set("form")>
                    "Form"
                </button>
                <button type="button" role="tab" aria-selected=move || (tab.get() == "json").to_string() on:click=to_json_tab>
                    "JSON"
                </button>
            </div>
            <Show when=move || tab.get() == "form" fallback=move || view! { <JsonTab text=json_text errors=shown /> }>
                <label class="field">
                    "Family"
                    <input type="text" name="family" bind:value=family />
                    <small class="hint">"Revisions of one family share its name, e.g. " <code>"llm-inference"</code></small>
                    <FieldErrors errors=shown field="family".into() />
                </label>
                <For each=numbered key=|(_, c)| c.id let:item>
                    <ContainerFields index=item.0 c=item.1 errors=shown containers />
                </For>
                <FieldErrors errors=shown field="containers".into() />
                <button
                    type="button"
                    on:click=move |_| {
                        let id = next_id.get_value();
                        next_id.set_value(id + 1);
                        containers.update(|cs| cs.push(ContainerForm::new(id)));
                    }
                >
                    "Add container"
                </button>
            </Show>
            {move || {
                let errs = shown.get();
                (tried.get() && !errs.is_empty())
                    .then(|| view! { <p class="field-error summary" role="alert">{format!("{} problem(s) to fix before registering.", errs.len())}</p> })
            }}
            <div class="actions">
                <button type="submit" class="primary" title=move || operate.get() disabled=move || register.pending().get() || operate.get().is_some()>"Register"</button>
                <crate::components::RoleHint reason=operate />
                {move || register.value().get().and_then(|r| r.err()).map(|e| view! { <p class="error">{e.to_string()}</p> })}
            </div>
        </form>
    }
}

#[component]
fn JsonTab(text: RwSignal<String>, errors: Signal<Vec<FieldError>>) -> impl IntoView {
    view! {
        <label class="field">
            "Task definition JSON (Tessera's shape, or ECS's with containerDefinitions)"
            <textarea name="json" rows="18" spellcheck="false" bind:value=text></textarea>
        </label>
        {move || {
            let errs = errors.get();
            (!errs.is_empty())
                .then(|| {
                    view! {
                        <ul class="field-error" role="alert">
                            {errs.into_iter().map(|e| view! { <li><code>{e.field}</code>": "{e.message}</li> }).collect_view()}
                        </ul>
                    }
                })
        }}
    }
}

#[component]
fn ContainerFields(
    index: usize,
    c: ContainerForm,
    errors: Signal<Vec<FieldError>>,
    containers: RwSignal<Vec<ContainerForm>>,
) -> impl IntoView {
    let p = move |f: &str| format!("containers[{index}].{f}");
    view! {
        <fieldset class="container-form">
            <legend>{format!("Container {}", index + 1)}</legend>
            <div class="grid">
                <label class="field">"Name" <input type="text" name=p("name") bind:value=c.name /> <FieldErrors errors field=p("name") /></label>
                <label class="field wide">
                    "Image (optional; without one the command runs as a process on the host)"
                    <input type="text" name=p("image") bind:value=c.image />
                    <small class="hint">"e.g. " <code>"nvcr.io/nvidia/pytorch:24.05-py3"</code></small>
                    <FieldErrors errors field=p("image") />
                </label>
                <label class="field wide">
                    "Entry point (optional, arguments separated by spaces)"
                    <input type="text" name=p("entry_point") bind:value=c.entry_point />
                    <FieldErrors errors field=p("entry_point") />
                </label>
                <label class="field wide">
                    "Command (arguments separated by spaces)"
                    <input type="text" name=p("command") bind:value=c.command />
                    <small class="hint">"e.g. " <code>"python serve.py --port 8000"</code></small>
                    <FieldErrors errors field=p("command") />
                </label>
                <label class="field">"CPU (vCPU)" <input type="text" inputmode="decimal" name=p("cpu") bind:value=c.cpu /> <FieldErrors errors field=p("cpu_milli") /></label>
                <label class="field">"Memory (MiB)" <input type="text" inputmode="numeric" name=p("memory") bind:value=c.memory /> <FieldErrors errors field=p("memory_mib") /></label>
                <label class="field">
                    "GPU"
                    <select name=p("gpu") prop:value=move || c.gpu.get() on:change=move |ev| c.gpu.set(event_target_value(&ev))>
                        <option value="none">"None"</option>
                        <option value="whole">"Whole GPUs"</option>
                        <option value="mps">"Shared (MPS)"</option>
                    </select>
                </label>
                <Show when=move || c.gpu.get() == "whole">
                    <label class="field">"GPUs" <input type="text" inputmode="numeric" name=p("gpus") bind:value=c.gpus /> <FieldErrors errors field=p("gpu.gpus") /></label>
                </Show>
                <Show when=move || c.gpu.get() == "mps">
                    <label class="field">
                        "GPU memory (MiB)"
                        <input type="text" inputmode="numeric" name=p("mps_memory") bind:value=c.mps_memory />
                        <FieldErrors errors field=p("gpu.mps.memory_mib") />
                    </label>
                    <label class="field">
                        "Compute cap (%, optional)"
                        <input type="text" inputmode="numeric" name=p("mps_compute") bind:value=c.mps_compute />
                        <FieldErrors errors field=p("gpu.mps.max_compute_percent") />
                    </label>
                </Show>
                <label class="field wide">
                    "Environment (KEY=VALUE per line)"
                    <textarea name=p("env") rows="3" bind:value=c.env></textarea>
                    <FieldErrors errors field=p("env") />
                </label>
                <label class="field wide">
                    "Secrets (KEY=VALUE per line; write-only: a KEY alone keeps its current value)"
                    <textarea name=p("secrets") rows="2" autocomplete="off" bind:value=c.secrets></textarea>
                    <FieldErrors errors field=p("secrets") />
                </label>
            </div>
            <Show when=move || { containers.get().len() > 1 }>
                <button type="button" class="link" on:click=move |_| containers.update(|cs| cs.retain(|x| x.id != c.id))>
                    "Remove container"
                </button>
            </Show>
        </fieldset>
    }
}
