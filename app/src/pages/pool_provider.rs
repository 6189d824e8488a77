//! The Hosts page's panel for one pool's capacity provider (shown with a pool chosen): its
//! settings, its machines by state over time, each machine asked for with why, and, for
//! admins, a form that gives the pool a provider, changes it or takes it away.

use crate::access::{Declaration, guard};
use crate::components::{FieldErrors, RoleHint};
use crate::fit::{Chart, Series};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use serde::{Deserialize, Serialize};
use tessera_model::provider::{
    HostShape, Machine, MachineState, Provider, ProviderInput, ProviderKind, machine_history,
};
use tessera_model::taskdef::FieldError;

/// A pool's capacity provider, the machines asked of it (newest first, the last that ended
/// too) and the server's time now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderView {
    pub provider: Option<Provider>,
    pub machines: Vec<Machine>,
    /// Unix seconds.
    pub now: i64,
}

/// The pool's provider (`None`: no such pool).
#[server(input = Json)]
pub async fn pool_provider(pool: String) -> Result<Option<ProviderView>, ServerFnError> {
    let control = crate::data::ssr::control()?;
    let failed = crate::data::ssr::failed;
    let Some(info) = control
        .views()
        .list_pools()
        .await
        .map_err(failed)?
        .into_iter()
        .find(|p| p.name.as_str() == pool)
    else {
        return Ok(None);
    };
    let machines = match info.provider {
        Some(_) => control
            .providers()
            .machines(Some(&info.name), true)
            .await
            .map_err(failed)?,
        None => Vec::new(),
    };
    Ok(Some(ProviderView {
        provider: info.provider,
        machines,
        now: control.providers().now().millis().div_euclid(1000),
    }))
}

guard!(PoolProvider, Declaration::VIEW);

/// Gives `pool` a provider, changes it, or (`None`) takes it away; refused settings come
/// back by field (`provider.max_hosts`).
#[server(input = Json)]
pub async fn set_pool_provider(
    pool: String,
    provider: Option<ProviderInput>,
) -> Result<Result<(), Vec<FieldError>>, ServerFnError> {
    let control = crate::data::ssr::control_for::<SetPoolProvider>()?;
    let name = tessera_model::PoolName::new(pool)
        .map_err(|e| ServerFnError::new(format!("no pool named {:?}", e.value)))?;
    let patch = tessera_model::api::PoolPatch {
        provider: Some(provider),
        ..Default::default()
    };
    match control.deployments().update_pool(&name, &patch).await {
        Ok(_) => Ok(Ok(())),
        Err(e) => crate::data::ssr::field_errors(e).map(Err),
    }
}

guard!(SetPoolProvider, Declaration::ADMIN);

/// The panel for the pool chosen (nothing without one): the provider's settings and
/// machines, refreshed live, and the admins' form, read again only when the pool changes
/// or the form saved (a live refresh never resets what is being typed).
#[component]
pub fn PoolProviderPanel(pool: Signal<String>) -> impl IntoView {
    let live = crate::live::use_live();
    let changed = RwSignal::new(0u32);
    let fetch = |pool: String| async move {
        if pool.is_empty() {
            Ok(None)
        } else {
            pool_provider(pool).await
        }
    };
    let state = Resource::new(
        move || (live(), pool.get(), changed.get()),
        move |(_, p, _)| fetch(p),
    );
    let settings = Resource::new(move || (pool.get(), changed.get()), move |(p, _)| fetch(p));
    // What the last save did. Kept here, not in the form: a save reloads the settings,
    // which makes the form anew (and closes it).
    let saved = RwSignal::new(None::<String>);
    let on_saved = Callback::new(move |()| changed.update(|n| *n += 1));
    view! {
        <Show when=move || !pool.get().is_empty()>
            <section class="panel provider" aria-label="Capacity provider">
                <h2>{move || format!("Capacity provider of {}", pool.get())}</h2>
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        state.await.ok().flatten().map(|v| match v.provider {
                            Some(p) => view! { <ProviderSummary provider=p machines=v.machines now=v.now /> }.into_any(),
                            None => view! { <p class="muted">"No capacity provider: hosts join and leave as operators make them."</p> }.into_any(),
                        })
                    })}
                </Transition>
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        settings.await.ok().flatten().map(|v| view! { <ProviderForm pool=pool.get_untracked() provider=v.provider changed=on_saved saved /> })
                    })}
                </Transition>
                {move || saved.get().map(|s| view! { <p class="notice" role="status">{s}</p> })}
            </section>
        </Show>
    }
}

/// Settings in one line, machines by state now and over time, and each machine.
#[component]
fn ProviderSummary(provider: Provider, machines: Vec<Machine>, now: i64) -> impl IntoView {
    let count = |s: MachineState| machines.iter().filter(|m| m.state == s).count();
    let summary = format!(
        "{} booting · {} active · {} terminating",
        count(MachineState::Booting),
        count(MachineState::Active),
        count(MachineState::Terminating)
    );
    let settings = format!(
        "{} provider{} · {} to {} hosts · target capacity {} % · {} · scale-out cooldown {} s · empty hosts go after {} s · boot timeout {} s · impaired hosts replaced after {} s, lost ones after {} s",
        provider.kind,
        provider
            .group
            .as_ref()
            .map(|g| format!(
                " (group {g}{})",
                provider
                    .region
                    .as_ref()
                    .map(|r| format!(", {r}"))
                    .unwrap_or_default()
            ))
            .or_else(|| provider.path.as_ref().map(|p| format!(" ({p})")))
            .unwrap_or_default(),
        provider.min_hosts,
        provider.max_hosts,
        provider.target_capacity_percent,
        provider
            .shape
            .as_ref()
            .map_or("hosts like the pool's".to_owned(), |s| format!(
                "hosts of {}",
                s.describe()
            )),
        provider.scale_out_cooldown_secs,
        provider.scale_in_cooldown_secs,
        provider.boot_timeout_secs,
        provider.repair_delay_secs,
        provider.lost_delay_secs,
    );
    let chart = history_chart(&provider, &machines, now);
    let rows = machines
        .into_iter()
        .map(|m| {
            let host = m.host_id.as_ref().map(|h| {
                let href = format!("/hosts/{h}");
                view! { <a href=href>{h.to_string()}</a> }
            });
            view! {
                <tr data-machine=m.id.clone() data-state=m.state.as_str()>
                    <td><code>{m.id.clone()}</code></td>
                    <td><span class=format!("badge machine-{}", m.state.as_str())>{m.state.as_str()}</span></td>
                    <td>{m.provider_id.clone().unwrap_or_default()}</td>
                    <td>{host}</td>
                    <td>{m.asked_at.short()}</td>
                    <td class="reason">{m.reason.clone()}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <p class="muted">{settings}</p>
        <p class="machines-summary">{summary}</p>
        {chart}
        <table class="table">
            <thead><tr><th>"Machine"</th><th>"State"</th><th>"Provider's id"</th><th>"Host"</th><th>"Asked"</th><th>"Why"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
}

/// Booting, active and desired machines over the last hours (as far back as the machines
/// listed go), with the pool's limits as lines.
fn history_chart(provider: &Provider, machines: &[Machine], now: i64) -> impl IntoView + use<> {
    const SPAN: i64 = 6 * 3600;
    let oldest = machines
        .iter()
        .map(|m| m.asked_at.millis().div_euclid(1000))
        .min()
        .unwrap_or(now);
    let from = (now - SPAN).max(oldest - 60).min(now - 600);
    let history = machine_history(machines, from, now);
    // Drawn as steps: each change holds until the next.
    let steps = |f: fn(&tessera_model::provider::MachineCounts) -> u32| {
        let mut points: Vec<(i64, f64)> = Vec::new();
        for c in &history {
            if let Some(&(_, last)) = points.last() {
                points.push((c.t, last));
            }
            points.push((c.t, f64::from(f(c))));
        }
        points
    };
    let series = vec![
        Series {
            name: "desired".into(),
            class: "m-desired",
            points: steps(|c| c.desired()),
        },
        Series {
            name: "active".into(),
            class: "m-active",
            points: steps(|c| c.active),
        },
        Series {
            name: "booting".into(),
            class: "m-booting",
            points: steps(|c| c.booting),
        },
    ];
    let marks = vec![
        (
            format!("max {}", provider.max_hosts),
            "budget",
            f64::from(provider.max_hosts),
        ),
        (
            format!("min {}", provider.min_hosts),
            "budget",
            f64::from(provider.min_hosts),
        ),
    ];
    view! { <div class="charts"><Chart title="Machines".into() unit="hosts" series marks from=from to=now /></div> }
}

/// The form's fields, as text (what the inputs hold).
#[derive(Clone, Copy)]
struct Fields {
    kind: RwSignal<String>,
    group: RwSignal<String>,
    region: RwSignal<String>,
    path: RwSignal<String>,
    min_hosts: RwSignal<String>,
    max_hosts: RwSignal<String>,
    target: RwSignal<String>,
    scale_out: RwSignal<String>,
    scale_in: RwSignal<String>,
    boot: RwSignal<String>,
    repair: RwSignal<String>,
    lost: RwSignal<String>,
    gpu_model: RwSignal<String>,
    gpus: RwSignal<String>,
    gpu_memory: RwSignal<String>,
    cpus: RwSignal<String>,
    memory_gib: RwSignal<String>,
}

impl Fields {
    fn new(p: Option<&Provider>) -> Fields {
        let text = |v: Option<String>| RwSignal::new(v.unwrap_or_default());
        let num = |v: Option<u64>| RwSignal::new(v.map(|v| v.to_string()).unwrap_or_default());
        let shape = p.and_then(|p| p.shape.as_ref());
        Fields {
            kind: RwSignal::new(
                p.map_or(ProviderKind::AwsAsg, |p| p.kind)
                    .as_str()
                    .to_owned(),
            ),
            group: text(p.and_then(|p| p.group.clone())),
            region: text(p.and_then(|p| p.region.clone())),
            path: text(p.and_then(|p| p.path.clone())),
            min_hosts: num(Some(p.map_or(0, |p| p.min_hosts.into()))),
            max_hosts: num(p.map(|p| p.max_hosts.into())),
            target: num(Some(p.map_or(100, |p| p.target_capacity_percent.into()))),
            scale_out: num(p.map(|p| p.scale_out_cooldown_secs.into())),
            scale_in: num(p.map(|p| p.scale_in_cooldown_secs.into())),
            boot: num(p.map(|p| p.boot_timeout_secs.into())),
            repair: num(p.map(|p| p.repair_delay_secs.into())),
            lost: num(p.map(|p| p.lost_delay_secs.into())),
            gpu_model: text(shape.map(|s| s.gpu_model.clone())),
            gpus: num(shape.map(|s| s.gpus.into())),
            gpu_memory: num(shape.map(|s| s.gpu_memory_mib)),
            cpus: num(shape.map(|s| s.cpu_milli / 1000)),
            memory_gib: num(shape.map(|s| s.memory_mib / 1024)),
        }
    }

    /// The settings the fields say, or the fields that are not numbers.
    fn input(&self) -> Result<ProviderInput, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut number = |field: &str, s: RwSignal<String>| -> Option<u64> {
            let text = s.get_untracked();
            let text = text.trim();
            if text.is_empty() {
                return None;
            }
            text.parse::<u64>().map_or_else(
                |_| {
                    errors.push(FieldError {
                        field: format!("provider.{field}"),
                        message: format!("must be a whole number, got {text:?}"),
                    });
                    None
                },
                Some,
            )
        };
        let small = |v: Option<u64>| v.map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        let min_hosts = small(number("min_hosts", self.min_hosts));
        let max_hosts = small(number("max_hosts", self.max_hosts));
        let target = small(number("target_capacity_percent", self.target));
        let scale_out = small(number("scale_out_cooldown_secs", self.scale_out));
        let scale_in = small(number("scale_in_cooldown_secs", self.scale_in));
        let boot = small(number("boot_timeout_secs", self.boot));
        let repair = small(number("repair_delay_secs", self.repair));
        let lost = small(number("lost_delay_secs", self.lost));
        let gpus = small(number("shape.gpus", self.gpus));
        let gpu_memory = number("shape.gpu_memory_mib", self.gpu_memory);
        let cpus = number("shape.cpu_milli", self.cpus);
        let memory = number("shape.memory_mib", self.memory_gib);
        let model = self.gpu_model.get_untracked().trim().to_owned();
        let shape = self.shape(model, gpus, gpu_memory, cpus, memory, &mut errors);
        if max_hosts.is_none() && errors.is_empty() {
            errors.push(FieldError {
                field: "provider.max_hosts".into(),
                message: "required: the most hosts the provider may keep".into(),
            });
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let opt = |s: RwSignal<String>| {
            Some(s.get_untracked().trim().to_owned()).filter(|s| !s.is_empty())
        };
        Ok(ProviderInput {
            kind: self.kind.get_untracked(),
            group: opt(self.group),
            region: opt(self.region),
            path: opt(self.path),
            min_hosts,
            max_hosts: max_hosts.unwrap_or(0),
            target_capacity_percent: target,
            scale_out_cooldown_secs: scale_out,
            scale_in_cooldown_secs: scale_in,
            boot_timeout_secs: boot,
            repair_delay_secs: repair,
            lost_delay_secs: lost,
            shape,
        })
    }

    /// The hosts' shape: none when every shape field is empty (learnt from the pool's
    /// hosts), all of them otherwise.
    fn shape(
        &self,
        model: String,
        gpus: Option<u32>,
        gpu_memory: Option<u64>,
        cpus: Option<u64>,
        memory_gib: Option<u64>,
        errors: &mut Vec<FieldError>,
    ) -> Option<HostShape> {
        let given = [
            gpus.is_some(),
            gpu_memory.is_some(),
            cpus.is_some(),
            memory_gib.is_some(),
        ];
        if model.is_empty() && !given.contains(&true) {
            return None;
        }
        match (gpus, gpu_memory, cpus, memory_gib) {
            (Some(gpus), Some(gpu_memory_mib), Some(cpus), Some(gib)) if !model.is_empty() => {
                Some(HostShape {
                    gpu_model: model,
                    gpus,
                    gpu_memory_mib,
                    cpu_milli: cpus.saturating_mul(1000),
                    memory_mib: gib.saturating_mul(1024),
                })
            }
            _ => {
                errors.push(FieldError {
                    field: "provider.shape".into(),
                    message: "give all of the host shape (GPU model, GPUs, GPU memory, CPUs, memory) or none of it (learnt from the pool's hosts)".into(),
                });
                None
            }
        }
    }
}

/// The admins' form: kind and where, limits, timings and the hosts' shape.
#[component]
fn ProviderForm(
    pool: String,
    provider: Option<Provider>,
    changed: Callback<()>,
    saved: RwSignal<Option<String>>,
) -> impl IntoView {
    let admin = crate::access::allowed::<SetPoolProvider>();
    let f = Fields::new(provider.as_ref());
    let errors = RwSignal::new(Vec::<FieldError>::new());
    let pool_for_save = pool.clone();
    let save = Action::new(move |input: &Option<ProviderInput>| {
        let pool = pool_for_save.clone();
        let input = input.clone();
        async move { (input.is_some(), set_pool_provider(pool, input).await) }
    });
    Effect::new(move |_| {
        if let Some((set, result)) = save.value().get() {
            match result {
                Ok(Ok(())) => {
                    errors.set(Vec::new());
                    saved.set(Some(
                        if set {
                            "Saved."
                        } else {
                            "Provider removed; its hosts stay."
                        }
                        .into(),
                    ));
                    changed.run(());
                }
                Ok(Err(fields)) => {
                    saved.set(None);
                    errors.set(fields);
                }
                Err(e) => {
                    saved.set(None);
                    errors.set(vec![FieldError {
                        field: "provider".into(),
                        message: e.to_string(),
                    }]);
                }
            }
        }
    });
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        match f.input() {
            Ok(input) => {
                errors.set(Vec::new());
                saved.set(None);
                save.dispatch(Some(input));
            }
            Err(e) => errors.set(e),
        }
    };
    let has = provider.is_some();
    let e = Signal::from(errors);
    // One setting: its label, its input, what it is when left empty (or an example), and
    // the server's refusals of it.
    let input = move |label: &'static str,
                      name: &'static str,
                      s: RwSignal<String>,
                      numeric: bool,
                      hint: &'static str| {
        view! {
            <label>{label} " "
                <input type="text" inputmode=numeric.then_some("numeric") name=name prop:value=s on:input=move |ev| s.set(event_target_value(&ev)) />
                <small class="muted">{hint}</small>
                <FieldErrors errors=e field=format!("provider.{name}") />
            </label>
        }
    };
    let kind = f.kind;
    view! {
        <details class="provider-form" open=!has>
            <summary>{if has { "Change the provider" } else { "Give this pool a capacity provider" }}</summary>
            <form class="controls" aria-label="Capacity provider settings" on:submit=submit>
                <label>"Kind "
                    <select name="kind" on:change=move |ev| kind.set(event_target_value(&ev))>
                        {ProviderKind::ALL.map(|k| view! { <option value=k.as_str() selected=move || kind.get() == k.as_str()>{k.as_str()}</option> }).collect_view()}
                    </select>
                    <FieldErrors errors=e field="provider.kind".to_owned() />
                </label>
                <Show when=move || kind.get() == "aws-asg">
                    {input("Auto Scaling group", "group", f.group, false, "e.g. tessera-l4")}
                    {input("Region", "region", f.region, false, "empty: the usual AWS way")}
                </Show>
                <Show when=move || kind.get() == "command">
                    {input("Command", "path", f.path, false, "e.g. /usr/local/bin/make-hosts")}
                </Show>
                {input("Min hosts", "min_hosts", f.min_hosts, true, "default 0")}
                {input("Max hosts", "max_hosts", f.max_hosts, true, "required")}
                {input("Target capacity (%)", "target_capacity_percent", f.target, true, "default 100")}
                {input("Scale-out cooldown (s)", "scale_out_cooldown_secs", f.scale_out, true, "default 0")}
                {input("Empty hosts go after (s)", "scale_in_cooldown_secs", f.scale_in, true, "default 600")}
                {input("Boot timeout (s)", "boot_timeout_secs", f.boot, true, "default 600")}
                {input("Replace impaired after (s)", "repair_delay_secs", f.repair, true, "default 300")}
                {input("Replace lost after (s)", "lost_delay_secs", f.lost, true, "default 900")}
                <fieldset>
                    <legend>"Hosts it makes (empty: learnt from the pool's hosts)"</legend>
                    {input("GPU model", "shape.gpu_model", f.gpu_model, false, "e.g. NVIDIA L4")}
                    {input("GPUs", "shape.gpus", f.gpus, true, "e.g. 4")}
                    {input("GPU memory (MiB each)", "shape.gpu_memory_mib", f.gpu_memory, true, "e.g. 23034")}
                    {input("CPUs", "shape.cpu_milli", f.cpus, true, "e.g. 48")}
                    {input("Memory (GiB)", "shape.memory_mib", f.memory_gib, true, "e.g. 192")}
                    <FieldErrors errors=e field="provider.shape".to_owned() />
                </fieldset>
                <button type="submit" class="primary" title=move || admin.get() disabled=move || admin.get().is_some()>
                    {if has { "Save provider" } else { "Add provider" }}
                </button>
                {has.then(|| view! {
                    <button type="button" class="danger" title=move || admin.get() disabled=move || admin.get().is_some()
                        on:click=move |_| { save.dispatch(None); }>"Remove provider"</button>
                })}
            </form>
            <RoleHint reason=admin />
            {move || {
                let general: Vec<String> = errors.get().into_iter().filter(|e| e.field == "provider").map(|e| e.message).collect();
                (!general.is_empty()).then(|| view! { <p class="field-error" role="alert">{general.join("; ")}</p> })
            }}
        </details>
    }
}
