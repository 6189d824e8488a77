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
            .agents()
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

/// What the router answered to [`send`]: its status, headers and body.
#[allow(dead_code)]
pub struct Answer {
    pub status: axum::http::StatusCode,
    pub headers: axum::http::HeaderMap,
    pub bytes: Vec<u8>,
}

#[allow(dead_code)]
impl Answer {
    /// The body as JSON; a body that is not JSON as a JSON string of its text.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.bytes)
            .unwrap_or_else(|_| serde_json::Value::String(self.text()))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    pub fn content_type(&self) -> Option<String> {
        self.headers
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

/// The header that carries `token` as a bearer credential.
#[allow(dead_code)]
pub fn bearer(token: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {token}"))
}

/// Sends one request through the router on `state`: the one way the server's tests make a
/// request. `headers` are added as given (credentials, `Origin`, ...); the `Host` is
/// `127.0.0.1:3000` unless they name one; a JSON `body` goes with its content type. The
/// live stream never ends: a successful one is answered with its status and headers only.
#[allow(dead_code)]
pub async fn send(
    state: &tessera_server::AppState,
    method: axum::http::Method,
    uri: &str,
    body: Option<&serde_json::Value>,
    headers: &[(&str, String)],
) -> Answer {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let mut req = axum::http::Request::builder().method(method).uri(uri);
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req = req.header("host", "127.0.0.1:3000");
    }
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let req = match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(axum::body::Body::from(b.to_string())),
        None => req.body(axum::body::Body::empty()),
    }
    .expect("request");
    let response = tessera_server::app(state.clone())
        .oneshot(req)
        .await
        .expect("the router answers");
    let (status, headers) = (response.status(), response.headers().clone());
    if uri.starts_with("/api/v1/live") && status.is_success() {
        return Answer {
            status,
            headers,
            bytes: Vec::new(),
        };
    }
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    Answer {
        status,
        headers,
        bytes,
    }
}
