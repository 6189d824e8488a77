//! Small pieces shared by pages.

use crate::data::{GpuView, HostView, service_hue};
use leptos::prelude::*;
use tessera_model::service::Event;
use tessera_model::taskdef::FieldError;
use tessera_model::{GpuHealth, HostStatus, MiB, SharingMode};

/// Why the controls beside it are disabled for the signed-in caller (see
/// [`crate::access::allowed`]); nothing when they may be used.
#[component]
pub fn RoleHint(reason: Signal<Option<String>>) -> impl IntoView {
    move || {
        reason
            .get()
            .map(|r| view! { <span class="role-hint">{format!("Disabled: {r}.")}</span> })
    }
}

/// A host's status as a coloured word.
#[component]
pub fn StatusBadge(status: HostStatus) -> impl IntoView {
    view! { <span class=format!("badge status-{}", status.as_str())>{status.as_str()}</span> }
}

/// The label every simulated host carries, so nobody mistakes demo capacity for real GPUs.
#[component]
pub fn SimulatedBadge() -> impl IntoView {
    view! {
        <span class="badge simulated" title="GPUs simulated by the demo fleet, not real devices">
            "simulated"
        </span>
    }
}

/// A GPU's sharing mode and health in words.
pub fn gpu_state_text(mode: SharingMode, health: GpuHealth) -> String {
    match health {
        GpuHealth::Healthy => mode.as_str().to_owned(),
        GpuHealth::Unhealthy => format!("{} · unhealthy", mode.as_str()),
    }
}

/// Errors from a failed load, listed for the operator.
#[component]
pub fn ErrorList(errors: ArcRwSignal<Errors>) -> impl IntoView {
    view! {
        <div class="error" role="alert">
            <p>"Something went wrong:"</p>
            <ul>
                {move || {
                    errors.get().into_iter().map(|(_, e)| view! { <li>{e.to_string()}</li> }).collect_view()
                }}
            </ul>
        </div>
    }
}

/// A filled bar: `value` of `total`, with a label.
#[component]
pub fn Meter(
    value: f64,
    total: f64,
    label: String,
    #[prop(optional)] class: &'static str,
) -> impl IntoView {
    let pct = if total > 0.0 {
        (100.0 * value / total).clamp(0.0, 100.0)
    } else {
        0.0
    };
    view! {
        <div class=format!("meter {class}") role="meter" aria-valuenow=format!("{pct:.0}") aria-valuemin="0" aria-valuemax="100" aria-label=label.clone()>
            <span class="meter-fill" style=format!("width: {pct:.1}%")></span>
        </div>
        <p class="meter-label">{label}</p>
    }
}

/// A measured amount of memory, rounded for reading (`14.4 GiB`); budgets are shown exactly.
pub fn measured_text(m: MiB) -> String {
    if m.0 >= 1024 {
        format!("{:.1} GiB", m.0 as f64 / 1024.0)
    } else {
        format!("{} MiB", m.0)
    }
}

/// One GPU: memory segments per task (coloured by service; details on hover and focus),
/// reserved compute as a second bar, the sharing mode.
#[component]
pub fn GpuBars(gpu: GpuView) -> impl IntoView {
    let total = gpu.gpu.memory.0.max(1) as f64;
    let mem_used = gpu.memory_allocated;
    let compute = gpu.compute_allocated;
    let compute_cap = gpu.compute_capacity;
    let state = gpu_state_text(gpu.gpu.sharing_mode, gpu.gpu.health);
    let measured = gpu.measured();
    let segments = gpu
        .slots
        .iter()
        .map(|s| {
            let width = 100.0 * s.memory.0 as f64 / total;
            let hue = service_hue(&s.service);
            let peak = s
                .measured_peak
                .map_or("not measured yet".to_owned(), measured_text);
            let cap = if s.dedicated {
                "whole GPU".to_owned()
            } else {
                format!("{} compute cap", s.compute)
            };
            let risk = s.verdict.filter(|v| v.at_risk());
            let detail = format!(
                "task {} · service {} · {} GPU memory · {cap} · measured peak {peak} · {}{}",
                &s.task_id[..8.min(s.task_id.len())],
                s.service,
                s.memory,
                s.state,
                risk.map(|v| format!(" · {v}")).unwrap_or_default()
            );
            let tip = detail.clone();
            let class = match risk {
                Some(v) => format!("segment verdict-{}", v.slug()),
                None => "segment".to_owned(),
            };
            view! {
                <a
                    class=class
                    href=format!("/tasks/{}", s.task_id)
                    style=format!("width: {width:.2}%; background: hsl({hue} 60% 55%)")
                    aria-label=detail
                    data-service=s.service.clone()
                >
                    <span class="tip" aria-hidden="true">{tip}</span>
                </a>
            }
        })
        .collect_view();
    // Against the pool's compute capacity (1,000 per GPU times its overcommit).
    let compute_pct =
        100.0 * f64::from(compute.0.min(compute_cap.0)) / f64::from(compute_cap.0.max(1));
    view! {
        <li class="gpu" data-gpu=gpu.gpu.uuid.to_string()>
            <span class="gpu-index">{format!("GPU {}", gpu.gpu.index)}</span>
            <div class="gpu-bars">
                <div class="bar memory-bar" aria-label=format!("{mem_used} of {} GPU memory allocated", gpu.gpu.memory)>
                    {segments}
                </div>
                <div class="bar compute-bar" aria-label=format!("{compute} of {compute_cap} compute reserved")>
                    <span class="bar-fill" style=format!("width: {compute_pct:.1}%")></span>
                </div>
            </div>
            <span class="gpu-mem">
                {format!("{} / {}", mem_used, gpu.gpu.memory)}
                {measured.map(|m| view! { <small>{format!(" · used {}", measured_text(m))}</small> })}
            </span>
            <span class=format!("gpu-state mode-{}", gpu.gpu.sharing_mode.as_str())>{state}</span>
        </li>
    }
}

/// A host card: status, badges, agent and MPS state, GPUs.
#[component]
pub fn HostCard(view: HostView, #[prop(optional)] link: bool) -> impl IntoView {
    let host = view.host.clone();
    let id = host.id.to_string();
    let tasks = view.tasks();
    let (mps, agent) = (view.mps_state(), view.agent_state());
    let title = if link {
        view! { <a href=format!("/hosts/{id}")>{id.clone()}</a> }.into_any()
    } else {
        view! { <span>{id.clone()}</span> }.into_any()
    };
    view! {
        <li class="host-card" data-host=id.clone()>
            <div class="host-head">
                <h2>{title}</h2>
                <StatusBadge status=host.status />
                {host.simulated.then(|| view! { <SimulatedBadge /> })}
                {host.held.then(|| view! { <span class="badge held" title="Its pool holds new hosts until an admin approves them: it runs no tasks">"awaiting approval"</span> })}
                {(!host.pending_gpus.is_empty()).then(|| {
                    let n = host.pending_gpus.len();
                    view! { <span class="badge held" title="Its agent reports GPUs it was not admitted with: they are not capacity until an admin approves them">{format!("{n} GPU(s) awaiting approval")}</span> }
                })}
            </div>
            <p class="host-meta">
                <span>"pool " <strong>{host.pool.to_string()}</strong></span>
                <span>{host.cpu.to_string()}</span>
                <span>{format!("{} host memory", host.memory)}</span>
                <span>{format!("{} GPUs · {} tasks", host.gpus.len(), tasks)}</span>
                <span class=format!("mps mps-{mps}")>{format!("MPS daemon {mps}")}</span>
                <span class=format!("agent agent-{agent}")>{format!("agent {agent}")}</span>
            </p>
            {view.host.status_reason.clone().map(|r| view! { <p class="host-reason">{r}</p> })}
            <ul class="gpu-list">{view.gpus.into_iter().map(|gpu| view! { <GpuBars gpu /> }).collect_view()}</ul>
        </li>
    }
}

/// The message with each task id in it (a UUID) a link to the task's page.
fn linked_tasks(message: &str) -> impl IntoView + use<> {
    let mut parts = Vec::new();
    let mut rest = message;
    while let Some(at) = find_uuid(rest) {
        let (before, tail) = rest.split_at(at);
        let (id, after) = tail.split_at(36);
        parts.push(before.to_owned().into_any());
        parts.push(
            view! { <a class="task-link" href=format!("/tasks/{id}")>{id.to_owned()}</a> }
                .into_any(),
        );
        rest = after;
    }
    parts.push(rest.to_owned().into_any());
    parts
}

/// Where the first UUID (8-4-4-4-12 hex digits) in `s` starts.
fn find_uuid(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (0..b.len().saturating_sub(35)).find(|&i| {
        (i == 0 || !b[i - 1].is_ascii_alphanumeric())
            && b.get(i + 36).is_none_or(|c| !c.is_ascii_alphanumeric())
            && b[i..i + 36].iter().enumerate().all(|(k, c)| match k {
                8 | 13 | 18 | 23 => *c == b'-',
                _ => c.is_ascii_hexdigit(),
            })
    })
}

/// Recent events, newest first.
#[component]
pub fn EventList(events: Vec<Event>) -> impl IntoView {
    if events.is_empty() {
        return view! { <p class="muted">"No events yet."</p> }.into_any();
    }
    view! {
        <ol class="events">
            {events
                .into_iter()
                .map(|e| {
                    let at = e.at.clock();
                    let subject = match (&e.service, &e.host) {
                        (Some(s), _) => view! { <a href=format!("/services/{s}")>{s.clone()}</a> }.into_any(),
                        (None, Some(h)) => view! { <a href=format!("/hosts/{h}")>{h.to_string()}</a> }.into_any(),
                        (None, None) => ().into_any(),
                    };
                    view! {
                        <li>
                            <time datetime=e.at.to_string()>{at}</time>
                            <span class="event-subject">{subject}</span>
                            <span class="event-message">{linked_tasks(&e.message)}</span>
                        </li>
                    }
                })
                .collect_view()}
        </ol>
    }
    .into_any()
}

/// What a refusal says of the request as a whole, where it says anything.
pub fn request_refusal(errors: Vec<FieldError>) -> Option<AnyView> {
    let m: Vec<String> = errors
        .into_iter()
        .filter(|e| e.field == crate::data::REQUEST_FIELD)
        .map(|e| e.message)
        .collect();
    (!m.is_empty())
        .then(|| view! { <p class="field-error" role="alert">{m.join("; ")}</p> }.into_any())
}

/// Validation messages for one field (path prefix), from the shared validator.
#[component]
pub fn FieldErrors(errors: Signal<Vec<FieldError>>, field: String) -> impl IntoView {
    move || {
        let mine: Vec<String> = errors
            .get()
            .into_iter()
            .filter(|e| e.field == field || e.field.starts_with(&format!("{field}.")))
            .map(|e| e.message)
            .collect();
        (!mine.is_empty()).then(|| {
            view! {
                <p class="field-error" role="alert">
                    {mine.join("; ")}
                </p>
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::find_uuid;

    #[test]
    fn finds_task_ids_in_messages() {
        let id = "0f8b6c1e-2a3b-4c5d-8e9f-0a1b2c3d4e5f";
        assert_eq!(find_uuid(&format!("task {id} stopped")), Some(5));
        assert_eq!(find_uuid(id), Some(0));
        assert_eq!(find_uuid("task 0f8b6c1e stopped"), None);
        // Part of a longer word is not an id.
        assert_eq!(find_uuid(&format!("x{id}")), None);
        assert_eq!(find_uuid(&format!("{id}0")), None);
        assert_eq!(
            find_uuid("no ids here at all, however long this message is made"),
            None
        );
    }
}
