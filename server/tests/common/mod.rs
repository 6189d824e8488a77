//! Helpers shared by the server's test binaries, on the control plane's test kit
//! (`tessera_control::testkit`): the demo's hosts registered through the agent path, and
//! agents' requests as the HTTP API takes them.

use tessera_control::Control;
use tessera_control::testkit::{gpus_of, registration};

/// The demo's four simulated hosts: (name, pool, GPU model, GPUs, GiB per GPU).
pub const DEMO_HOSTS: [(&str, &str, &str, u32, u64); 4] = [
    ("sim-h100-1", "training", "NVIDIA H100 80GB HBM3", 8, 80),
    ("sim-h100-2", "training", "NVIDIA H100 80GB HBM3", 8, 80),
    ("sim-l4-1", "inference", "NVIDIA L4", 4, 24),
    ("sim-l4-2", "inference", "NVIDIA L4", 4, 24),
];

/// A control plane on an in-memory store that agents join with `join_token`.
#[allow(dead_code)]
pub async fn control(join_token: &str) -> Control {
    tessera_control::testkit::in_memory(join_token).await
}

/// Registers simulated hosts through the agent registration path with `join_token`;
/// returns each one's agent token.
pub async fn register_hosts(
    control: &Control,
    join_token: &str,
    hosts: &[(&str, &str, &str, u32, u64)],
) -> Vec<String> {
    let mut tokens = Vec::new();
    for &(name, pool, model, count, gib) in hosts {
        let gpus = gpus_of(name, model, count, gib);
        let registered = control
            .register_agent(&registration(join_token, pool, name, gpus))
            .await
            .expect("register");
        tokens.push(registered.agent_token);
    }
    tokens
}

/// A registration of a one-GPU host named `name` in pool `inference`.
#[allow(dead_code)]
pub fn register_body(join_token: &str, name: &str) -> serde_json::Value {
    serde_json::json!({"join_token": join_token, "pool": "inference", "name": name,
        "cpu_milli": 8000, "memory_mib": 32768,
        "gpus": [{"uuid": format!("GPU-{name}-0"), "index": 0, "model": "NVIDIA L4",
                  "memory_mib": 24576, "healthy": true}]})
}

/// A sync that reports the host's stored GPUs healthy and no tasks yet.
#[allow(dead_code)]
pub async fn sync_body(control: &Control, host: &tessera_model::HostId) -> serde_json::Value {
    let h = control.store().get_host(host).await.expect("host");
    let gpus: Vec<serde_json::Value> = h
        .gpus
        .iter()
        .map(|g| {
            serde_json::json!({"uuid": g.uuid, "index": g.index, "model": g.model,
            "memory_mib": g.memory, "healthy": true})
        })
        .collect();
    serde_json::json!({"gpus": gpus, "mps": {"healthy": true}, "tasks": []})
}
