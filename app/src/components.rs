//! Small pieces shared by pages.

use leptos::prelude::*;
use tessera_model::{GpuHealth, HostStatus, SharingMode};

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
                    errors
                        .get()
                        .into_iter()
                        .map(|(_, e)| view! { <li>{e.to_string()}</li> })
                        .collect_view()
                }}
            </ul>
        </div>
    }
}
