//! The generated OpenAPI document against the server itself, both ways:
//! - every route is documented and every documented operation is routed;
//! - a sample answer of every GET validates against its documented schema;
//! - a schema-driven fuzzer: requests generated from the document's own schemas (checked
//!   valid against them before they are sent) are never refused for their shape (`400`,
//!   or `422` other than for the few rules JSON Schema cannot say, listed below), never
//!   answered with a server error, and every answer's status and content type is one the
//!   document lists for that operation.

mod common;
#[path = "support/schema_gen.rs"]
mod schema_gen;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use proptest::test_runner::TestRunner;
use schema_gen::{Generator, Rng};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use tessera_control::bench::api_token;
use tessera_model::auth::Role;
use tessera_server::{AppState, app};
use tower::ServiceExt;

const JOIN: &str = "openapi-test-join-token";

/// Refusals of a schema-valid request that depend on state or span several fields, which
/// JSON Schema cannot say (the schemas' descriptions name them).
const NOT_SHAPE: &[&str] = &[
    "no task definition",
    "is deregistered",
    "no pool named",
    // A capacity provider's settings depend on its kind, and min_hosts on max_hosts.
    "is not a setting of a",
    "needs its Auto Scaling group's name",
    "needs its executable's path",
    "must be at most max_hosts",
    "no host named",
    "is still registered: revoke its agent token first",
    "is used by another container",
    "is also in env",
    "either whole GPUs or MPS slots",
    "whole GPUs; at most",
    "compute caps add up",
    "has a value for this secret",
    "is reported twice",
    // Ports, health checks and dependencies across a task's containers.
    "names another port of this task",
    "is declared twice in this container",
    "is asked for twice in this task",
    "is not the name of a port of container",
    "no container of this task is named",
    "cannot wait for itself",
    "needs a health check on container",
    // The program a container runs spans its entry point, command and image.
    "must name a program",
    "has a cycle through container",
    "at least one container must be essential",
    // Work: what a service's objectives ask of its revision, and the task's port names.
    "needs the task definition to say where its work is measured",
    "needs a latency histogram",
    "needs an error counter",
    "needs tasks with a GPU",
    "must be at most max",
    "which the task does not have",
    "but the task has no named port",
    "is a percentage: at most 100",
    // Projects: a limit against its guarantee, guarantees against the pool, names that
    // must exist or stay.
    "must be at least the guarantee",
    "has a quota already: one per pool",
    "guaranteed in all, the pool has",
    "no project named",
    "a project keeps its name",
    // A token scoped to a project: its role there, and who made it.
    "a token scoped to a project is a viewer or an operator there",
    "cannot be above your own role in project",
    // ECS's memory rule spans the task and its containers.
    "give memory or memoryReservation here, or the task's memory",
];

struct Server {
    state: AppState,
    admin: String,
    agent: String,
    host: String,
    /// The consolidation plan `populate` made.
    plan: std::sync::Mutex<String>,
}

struct Answer {
    status: StatusCode,
    content_type: Option<String>,
    body: Value,
}

impl Server {
    async fn new() -> Server {
        let control = common::control(JOIN).await;
        for pool in ["training", "inference"] {
            control
                .deployments()
                .create_pool(&tessera_control::inputs::PoolInput::named(pool))
                .await
                .expect("pool");
        }
        let tokens = common::register_hosts(&control, JOIN, &common::DEMO_HOSTS).await;
        let admin = api_token(&control, Role::Admin).await.expect("token");
        let state = AppState::new(control, "127.0.0.1:0".parse().expect("valid"));
        Server {
            state,
            admin,
            agent: tokens[2].clone(),
            host: common::DEMO_HOSTS[2].0.to_owned(),
            plan: Default::default(),
        }
    }

    /// Something of everything: a pool, a task definition, a service with placed tasks, a
    /// user. Each answer is checked against the document.
    async fn populate(&self, doc: &Value) {
        let setup = [
            (
                Method::POST,
                "/api/v1/pools",
                json!({"name": "batch", "policy": "binpack"}),
            ),
            (
                Method::POST,
                "/api/v1/task-definitions",
                json!({"family": "llm", "containers": [{"name": "serve", "command": ["python", "serve.py"],
                    "cpu_milli": 1000, "memory_mib": 2048, "env": {"MODEL": "7b"}, "secrets": {"HF_TOKEN": "hf_x"},
                    "gpu": {"mps": {"memory_mib": 4096, "max_compute_percent": 25}}}]}),
            ),
            (
                Method::POST,
                "/api/v1/services",
                json!({"name": "chat", "task_definition": "llm:1", "pool": "inference", "desired_count": 2}),
            ),
            (
                Method::POST,
                "/api/v1/users",
                json!({"username": "ops", "password": "a long enough password", "role": "operator"}),
            ),
        ];
        for (method, path, body) in &setup {
            let a = self.send(method, path, Some(body)).await;
            assert!(a.status.is_success(), "{method} {path}: {}", a.body);
            check_documented(
                doc,
                path,
                &method.as_str().to_ascii_lowercase(),
                &a,
                "setup",
            );
        }
        self.state.control.reconcile_once().await.expect("placed");
        // Measured use of the service's tasks, as agents' syncs leave it: fit verdicts and
        // a right-size proposal have evidence to speak of.
        let control = &self.state.control;
        let tasks = control
            .store()
            .list_tasks(&tessera_control::store::TaskFilter {
                service: Some("chat".into()),
                ..Default::default()
            })
            .await
            .expect("tasks");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs() as i64;
        let rows: Vec<_> = tasks
            .iter()
            .flat_map(|t| {
                [60, 3600].map(|w| tessera_control::store::UsageRow {
                    task_id: t.id.clone(),
                    width_secs: w,
                    bucket_start: now - now.rem_euclid(w) - w,
                    service: t.service.clone(),
                    task_definition: t.task_definition.clone(),
                    host: t.host.clone(),
                    memory_max: tessera_model::MiB(1500),
                    memory_last: tessera_model::MiB(1400),
                    sm_p50: Some(8),
                    sm_p95: Some(12),
                    sm_max: Some(15),
                    samples: 12,
                    memory_errors: 0,
                    work_secs: 0.0,
                    completed: 0.0,
                    errors: None,
                    latency_ms: [None; 3],
                    neighbours: Some(Vec::new()),
                })
            })
            .collect();
        control.store().record_usage(&rows).await.expect("usage");
        // A consolidation plan to describe.
        let a = self
            .send(
                &Method::POST,
                "/api/v1/consolidation-plans",
                Some(&json!({"pool": "inference", "goal": "gpus"})),
            )
            .await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
        check_documented(doc, "/api/v1/consolidation-plans", "post", &a, "setup");
        *self.plan.lock().expect("not poisoned") = a.body["id"].as_str().expect("id").to_owned();
    }

    async fn send(&self, method: &Method, uri: &str, body: Option<&Value>) -> Answer {
        let token = if uri.starts_with("/agent/") {
            &self.agent
        } else {
            &self.admin
        };
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, "127.0.0.1:3000")
            .header(header::AUTHORIZATION, format!("Bearer {token}"));
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        let resp = app(self.state.clone())
            .oneshot(req.body(body).expect("request"))
            .await
            .expect("answer");
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_owned());
        if content_type.as_deref() == Some("text/event-stream") {
            // A live stream never ends; its headers are the answer.
            return Answer {
                status,
                content_type,
                body: Value::Null,
            };
        }
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Answer {
            status,
            content_type,
            body,
        }
    }
}

fn pointer_escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// A validator for the schema at `pointer` in `doc`, with every `$ref` resolving within it.
fn validator_at(doc: &Value, pointer: &str) -> jsonschema::Validator {
    let mut root = doc.clone();
    let fragment = pointer.replace('{', "%7B").replace('}', "%7D");
    root["$ref"] = json!(format!("#{fragment}"));
    jsonschema::draft202012::new(&root)
        .unwrap_or_else(|e| panic!("the schema at {pointer} compiles: {e}"))
}

/// Every operation in the document: (path, method).
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            out.insert((path.clone(), method.clone()));
        }
    }
    out
}

/// Checks `answer` is documented for the operation: its status, and its content type with
/// a body that validates against that response's schema.
fn check_documented(doc: &Value, path: &str, method: &str, answer: &Answer, what: &str) {
    let status = answer.status.as_u16().to_string();
    let op = format!("/paths/{}/{method}", pointer_escape(path));
    let response = doc
        .pointer(&format!("{op}/responses/{status}"))
        .unwrap_or_else(|| {
            panic!(
                "{what}: {status} is not documented for {method} {path}: {}",
                answer.body
            )
        });
    match (&answer.content_type, response.get("content")) {
        (None, None) => {}
        (Some(ct), Some(content)) => {
            assert!(
                content.get(ct).is_some(),
                "{what}: {status} {ct} is not documented for {method} {path}"
            );
            if answer.body.is_null() {
                return;
            }
            let pointer = format!(
                "{op}/responses/{status}/content/{}/schema",
                pointer_escape(ct)
            );
            let v = validator_at(doc, &pointer);
            let errors: Vec<String> = v
                .iter_errors(&answer.body)
                .map(|e| format!("{} at {}", e, e.instance_path()))
                .collect();
            assert!(
                errors.is_empty(),
                "{what}: the {status} answer of {method} {path} does not match its schema: {errors:?}\n{}",
                answer.body
            );
        }
        (Some(ct), None) => panic!(
            "{what}: {method} {path} answered {status} with {ct}, documented without a body: {}",
            answer.body
        ),
        (None, Some(_)) => {
            assert!(
                answer.body.is_null(),
                "{what}: {method} {path} answered {status} without a content type"
            );
        }
    }
}

#[tokio::test]
async fn the_document_and_the_router_agree_and_answers_match_their_schemas() {
    let server = Server::new().await;
    let doc = server
        .send(&Method::GET, "/api/v1/openapi.json", None)
        .await
        .body;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc, tessera_server::openapi::document());

    // Every reference resolves.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(o) => {
                if let Some(Value::String(r)) = o.get("$ref") {
                    out.push(r.clone());
                }
                o.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 50, "{} references", all.len());
    for r in &all {
        assert!(
            doc.pointer(r.trim_start_matches('#')).is_some(),
            "{r} resolves"
        );
    }

    // Both directions: routes and documented operations are the same set.
    let routed: BTreeSet<(String, String)> = tessera_server::api::routes()
        .rules()
        .iter()
        .map(|r| (r.path.clone(), r.method.as_str().to_ascii_lowercase()))
        .collect();
    let documented = operations(&doc);
    let undocumented: Vec<_> = routed.difference(&documented).collect();
    let unrouted: Vec<_> = documented.difference(&routed).collect();
    assert!(
        undocumented.is_empty(),
        "routes without a description: {undocumented:?}"
    );
    assert!(
        unrouted.is_empty(),
        "described operations nobody serves: {unrouted:?}"
    );
    server.populate(&doc).await;
    for rule in tessera_server::api::routes().rules() {
        let op = &doc["paths"][rule.path.as_str()][rule.method.as_str().to_ascii_lowercase()];
        assert_eq!(
            op["x-access"],
            serde_json::to_value(&rule.declared).expect("serialises"),
            "{} {}",
            rule.method,
            rule.path
        );
        assert!(
            op["summary"].as_str().is_some_and(|s| !s.is_empty()),
            "{} {} has a summary",
            rule.method,
            rule.path
        );
        // Every response names its content type (or has no body).
        for (status, r) in op["responses"].as_object().expect("responses") {
            if let Some(content) = r.get("content") {
                assert!(
                    !content.as_object().expect("content").is_empty(),
                    "{status}"
                );
            }
        }
    }

    // A sample answer of every GET against its schema.
    let host = server.host.clone();
    let mut samples = vec![
        ("/healthz", "/healthz".to_owned()),
        ("/api/v1/openapi.json", "/api/v1/openapi.json".to_owned()),
        ("/api/v1/session", "/api/v1/session".to_owned()),
        ("/api/v1/hosts", "/api/v1/hosts".to_owned()),
        ("/api/v1/hosts/{id}", format!("/api/v1/hosts/{host}")),
        ("/api/v1/pools", "/api/v1/pools".to_owned()),
        ("/api/v1/cluster", "/api/v1/cluster".to_owned()),
        (
            "/api/v1/task-definitions",
            "/api/v1/task-definitions".to_owned(),
        ),
        (
            "/api/v1/task-definitions/{id}",
            "/api/v1/task-definitions/llm".to_owned(),
        ),
        (
            "/api/v1/task-definitions/{id}",
            "/api/v1/task-definitions/llm:1".to_owned(),
        ),
        (
            "/api/v1/task-definitions/{id}",
            "/api/v1/task-definitions/llm:1?format=ecs".to_owned(),
        ),
        ("/api/v1/services", "/api/v1/services".to_owned()),
        (
            "/api/v1/services/{name}",
            "/api/v1/services/chat".to_owned(),
        ),
        (
            "/api/v1/tasks",
            "/api/v1/tasks?service=chat&state=assigned,running".to_owned(),
        ),
        ("/api/v1/events", "/api/v1/events?limit=5".to_owned()),
        ("/api/v1/tokens", "/api/v1/tokens".to_owned()),
        ("/api/v1/users", "/api/v1/users".to_owned()),
        ("/api/v1/audit", "/api/v1/audit".to_owned()),
        ("/api/v1/live", "/api/v1/live".to_owned()),
        ("/metrics", "/metrics".to_owned()),
        (
            "/api/v1/services/{name}/fit",
            "/api/v1/services/chat/fit?range=day".to_owned(),
        ),
        ("/api/v1/fit", "/api/v1/fit?pool=inference".to_owned()),
        (
            "/api/v1/services/{name}/endpoints",
            "/api/v1/services/chat/endpoints".to_owned(),
        ),
        (
            "/api/v1/services/{name}/work",
            "/api/v1/services/chat/work?range=day".to_owned(),
        ),
        (
            "/api/v1/discovery/prometheus",
            "/api/v1/discovery/prometheus".to_owned(),
        ),
        (
            "/api/v1/services/{name}/right-size",
            "/api/v1/services/chat/right-size".to_owned(),
        ),
        (
            "/api/v1/consolidation-plans",
            "/api/v1/consolidation-plans".to_owned(),
        ),
        ("/api/v1/projects", "/api/v1/projects".to_owned()),
        (
            "/api/v1/projects/{name}",
            "/api/v1/projects/default".to_owned(),
        ),
        (
            "/api/v1/projects/{name}/usage",
            "/api/v1/projects/default/usage?range=hour".to_owned(),
        ),
        (
            "/api/v1/consolidation-plans/{id}",
            format!(
                "/api/v1/consolidation-plans/{}",
                server.plan.lock().expect("not poisoned")
            ),
        ),
    ];
    let minted = server
        .send(
            &Method::POST,
            "/api/v1/join-tokens",
            Some(&json!({"pool": "inference", "uses": 2, "description": "sample"})),
        )
        .await;
    assert_eq!(minted.status, StatusCode::CREATED, "{}", minted.body);
    samples.push(("/api/v1/join-tokens", "/api/v1/join-tokens".to_owned()));
    // A webhook, its deliveries, and one task's page.
    let hook = server
        .send(
            &Method::POST,
            "/api/v1/webhooks",
            Some(&json!({"name": "on-call", "url": "http://127.0.0.1:9/hook", "kinds": ["host_lost"]})),
        )
        .await;
    assert_eq!(hook.status, StatusCode::CREATED, "{}", hook.body);
    samples.push(("/api/v1/webhooks", "/api/v1/webhooks".to_owned()));
    samples.push((
        "/api/v1/webhooks/{id}/deliveries",
        format!("/api/v1/webhooks/{}/deliveries", hook.body["webhook"]["id"]),
    ));
    let tasks = server
        .send(&Method::GET, "/api/v1/tasks?service=chat", None)
        .await;
    let task = tasks.body["tasks"][0]["id"]
        .as_str()
        .expect("a task")
        .to_owned();
    samples.push(("/api/v1/tasks/{id}", format!("/api/v1/tasks/{task}")));
    // Its logs: its host's agent does not run here, so the answer (after the wait for the
    // agent) says so, as text.
    samples.push((
        "/api/v1/tasks/{id}/logs",
        format!("/api/v1/tasks/{task}/logs?tail=10"),
    ));
    // A preemption on record, so its answer has one to match its schema.
    {
        use tessera_model::project::{Preempted, Preemption};
        use tessera_model::service::PriorityClass;
        server
            .state
            .control
            .store()
            .add_preemption(&Preemption {
                id: 0,
                state: tessera_model::project::PreemptionState::Proposed,
                task: "t-0".into(),
                at: tessera_model::time::Timestamp::EPOCH,
                pool: "inference".into(),
                host: "sim-l4-1".into(),
                service: "chat".into(),
                project: "default".into(),
                priority: PriorityClass::Production,
                victims: vec![Preempted {
                    task: "t-1".into(),
                    service: "batch".into(),
                    project: "lab".into(),
                    priority: PriorityClass::Batch,
                }],
            })
            .await
            .expect("recorded");
    }
    samples.push((
        "/api/v1/preemptions",
        "/api/v1/preemptions?project=lab&limit=5".to_owned(),
    ));
    // A machine a provider was asked for, so its list has one to match its schema.
    {
        use tessera_model::provider::{Machine, MachineState};
        server
            .state
            .control
            .store()
            .add_machines(&[Machine {
                id: "m-inference-sample".into(),
                pool: tessera_model::PoolName::new("inference").expect("valid"),
                provider_id: Some("i-0abc".into()),
                host_id: None,
                state: MachineState::Booting,
                reason: "a sample".into(),
                asked_at: tessera_model::time::Timestamp::EPOCH,
                joined_at: None,
                ended_at: None,
            }])
            .await
            .expect("recorded");
    }
    samples.push((
        "/api/v1/pools/{name}/machines",
        "/api/v1/pools/inference/machines".to_owned(),
    ));
    // A task of chat with the last lines its agent sent.
    {
        let store = server.state.control.store();
        let task = store
            .list_tasks(&tessera_control::store::TaskFilter {
                service: Some("chat".into()),
                ..Default::default()
            })
            .await
            .expect("tasks")
            .remove(0);
        store
            .set_task_last_output(&task.id, "==> main.err.log <==\nout of memory")
            .await
            .expect("recorded");
        samples.push((
            "/api/v1/services/{name}/tasks/{task}/last-output",
            format!("/api/v1/services/chat/tasks/{}/last-output", task.id),
        ));
    }
    let mut sampled = BTreeSet::new();
    for (path, uri) in &samples {
        let a = server.send(&Method::GET, uri, None).await;
        assert_eq!(a.status, StatusCode::OK, "GET {uri}: {}", a.body);
        check_documented(&doc, path, "get", &a, "sample");
        sampled.insert(path.to_string());
    }
    // A WebSocket's handshake (`101`) needs a connection that can be upgraded, which a
    // request through the router alone is not: exec is walked with the real client in
    // `tests/agents.rs`.
    let gets: BTreeSet<String> = documented
        .iter()
        .filter(|(_, m)| m == "get")
        .filter(|(p, _)| {
            doc.pointer(&format!("/paths/{}/get/responses/101", pointer_escape(p)))
                .is_none()
        })
        .map(|(p, _)| p.clone())
        .collect();
    let missing: Vec<_> = gets.difference(&sampled).collect();
    assert!(missing.is_empty(), "GETs without a sample: {missing:?}");
    // The samples said something: tasks were placed and shown with their allocations.
    let tasks = server
        .send(&Method::GET, "/api/v1/tasks?service=chat", None)
        .await;
    assert_eq!(tasks.body["tasks"].as_array().map(Vec::len), Some(2));
}

fn percent_encode(s: &str) -> String {
    tessera_model::urlenc::encode(s)
}

/// Whether a refusal names only rules the schema cannot say.
fn not_for_shape(answer: &Answer) -> bool {
    answer.status == StatusCode::UNPROCESSABLE_ENTITY
        && answer.body["errors"].as_array().is_some_and(|errors| {
            !errors.is_empty()
                && errors.iter().all(|e| {
                    let m = e["message"].as_str().unwrap_or_default();
                    NOT_SHAPE.iter().any(|known| m.contains(known))
                })
        })
}

#[tokio::test]
async fn requests_the_schemas_allow_are_never_refused_for_their_shape() {
    let server = Server::new().await;
    let doc = tessera_server::openapi::document();
    let doc: &'static Value = Box::leak(Box::new(doc));
    let seed = std::env::var("TESSERA_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0x5eed_1234_abcd_0042)
        | 1;
    let mut generator = Generator {
        doc,
        rng: Rng(seed),
        runner: TestRunner::new_with_rng(
            proptest::test_runner::Config::default(),
            proptest::test_runner::TestRng::from_seed(
                proptest::test_runner::RngAlgorithm::ChaCha,
                &[seed.to_le_bytes(), seed.to_be_bytes(), [7; 8], [42; 8]].concat(),
            ),
        ),
    };
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    // Longer runs: TESSERA_FUZZ_SEED=<n> TESSERA_FUZZ_CASES=<n> cargo test --test openapi
    let cases = env("TESSERA_FUZZ_CASES").unwrap_or(25) as usize;
    eprintln!("seed {seed:#x}, {cases} cases per operation");
    server.populate(doc).await;
    let mut tried = 0;
    let mut accepted = 0;
    // Deletions last, so the things that exist are there for the others.
    let mut ops: Vec<(String, String)> = operations(doc).into_iter().collect();
    ops.sort_by_key(|(_, m)| m == "delete");
    for (path, method) in ops {
        if path == "/api/v1/session/end" || (path == "/api/v1/session" && method == "delete") {
            continue; // sign-outs: no input to vary
        }
        let op = &doc["paths"][&path][&method];
        let params: Vec<&Value> = op["parameters"]
            .as_array()
            .map(|p| p.iter().collect())
            .unwrap_or_default();
        let body_pointer = op["requestBody"]["content"]["application/json"]["schema"]
            .is_object()
            .then(|| {
                format!(
                    "/paths/{}/{method}/requestBody/content/application~1json/schema",
                    pointer_escape(&path)
                )
            });
        if params.is_empty() && body_pointer.is_none() {
            continue;
        }
        let body_validator = body_pointer.as_ref().map(|p| validator_at(doc, p));
        let http_method =
            Method::from_bytes(method.to_ascii_uppercase().as_bytes()).expect("method");
        let mut valid = 0;
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        for attempt in 0..cases * 8 {
            if valid == cases {
                break;
            }
            let mut uri = path.clone();
            let mut query = Vec::new();
            let mut ok = true;
            for p in &params {
                let name = p["name"].as_str().expect("name");
                let schema = &p["schema"];
                let v = generator.value(schema, 0);
                let check = jsonschema::draft202012::new(&{
                    let mut root = doc.clone();
                    root["$ref"] = json!("#/$defs/p");
                    root["$defs"] = json!({"p": schema});
                    root
                })
                .expect("parameter schema compiles");
                if !check.is_valid(&v) {
                    ok = false;
                    break;
                }
                let text = match &v {
                    Value::String(s) => s.clone(),
                    Value::Null => continue,
                    other => other.to_string(),
                };
                if p["in"] == "path" {
                    // Half the time a thing that exists.
                    let real = match name {
                        "id" if path.starts_with("/api/v1/hosts") => Some(server.host.clone()),
                        "id" if path.starts_with("/api/v1/task-definitions") => Some(
                            if method == "get" && attempt % 4 == 0 {
                                "llm"
                            } else {
                                "llm:1"
                            }
                            .to_owned(),
                        ),
                        "name" => Some("chat".to_owned()),
                        "username" => Some("ops".to_owned()),
                        _ => None,
                    };
                    let text = real.filter(|_| attempt % 2 == 0).unwrap_or(text);
                    uri = uri.replace(&format!("{{{name}}}"), &percent_encode(&text));
                } else if p["required"] == true || generator.rng.chance(60) {
                    query.push(format!("{name}={}", percent_encode(&text)));
                }
            }
            if !ok {
                continue;
            }
            if !query.is_empty() {
                uri = format!("{uri}?{}", query.join("&"));
            }
            let body = match (&body_pointer, &body_validator) {
                (Some(p), Some(v)) => {
                    let schema = doc.pointer(p).expect("body schema");
                    let mut b = generator.value(schema, 0);
                    // Half the time, references to things that exist.
                    if attempt % 2 == 0
                        && let Some(o) = b.as_object_mut()
                    {
                        for (field, real) in [
                            ("join_token", JOIN),
                            ("pool", "inference"),
                            ("task_definition", "llm:1"),
                        ] {
                            if o.contains_key(field) {
                                o.insert(field.into(), json!(real));
                            }
                        }
                    }
                    if !v.is_valid(&b) {
                        continue;
                    }
                    Some(b)
                }
                _ => None,
            };
            valid += 1;
            let answer = server.send(&http_method, &uri, body.as_ref()).await;
            *statuses.entry(answer.status.as_u16()).or_default() += 1;
            let what = format!(
                "{method} {uri} with {}",
                body.clone().unwrap_or(Value::Null)
            );
            check_documented(doc, &path, &method, &answer, &what);
            assert!(
                !answer.status.is_server_error(),
                "{what}: {} {}",
                answer.status,
                answer.body
            );
            assert!(
                answer.status != StatusCode::BAD_REQUEST
                    && (answer.status != StatusCode::UNPROCESSABLE_ENTITY
                        || not_for_shape(&answer)),
                "{what}: a request its schema allows was refused for its shape: {} {}",
                answer.status,
                answer.body
            );
            if answer.status.is_success() {
                accepted += 1;
            }
        }
        eprintln!("{method} {path}: {valid} requests, answers {statuses:?}");
        assert!(
            valid >= cases / 2,
            "{method} {path}: only {valid} generated requests matched the schema"
        );
        tried += valid;
    }
    assert!(tried > 300, "{tried} requests tried");
    assert!(accepted > 50, "only {accepted} of {tried} were accepted");
}

/// Every variant of `v` that changes one place in it (named by its JSON pointer and what
/// it became): each object key removed, and each value replaced by null, other types, empty
/// and boundary values.
fn mutants(v: &Value) -> Vec<(String, Value)> {
    let replacements = || {
        [
            json!(null),
            json!(""),
            json!(" "),
            json!("x"),
            json!("a-b_c"),
            json!("CMD"),
            json!("x".repeat(1025)),
            json!(0),
            json!(1),
            json!(-1),
            json!(1.5),
            json!(100),
            json!(101),
            json!(65536),
            json!(1_000_001),
            json!(4_294_967_296_u64),
            json!(true),
            json!([]),
            json!(["x"]),
            json!({}),
        ]
    };
    let short = |v: &Value| {
        let t = v.to_string();
        if t.len() > 40 {
            format!("{}…", &t[..40])
        } else {
            t
        }
    };
    let mut out = Vec::new();
    let mut at = |key: String, inner: &Value, set: &mut dyn FnMut(Option<Value>) -> Value| {
        out.push((format!("/{key} removed"), set(None)));
        for r in replacements() {
            out.push((format!("/{key} = {}", short(&r)), set(Some(r))));
        }
        for (place, r) in mutants(inner) {
            out.push((format!("/{key}{place}"), set(Some(r))));
        }
    };
    match v {
        Value::Object(o) => {
            for (k, inner) in o {
                at(pointer_escape(k), inner, &mut |r| {
                    let mut changed = o.clone();
                    match r {
                        Some(r) => changed.insert(k.clone(), r),
                        None => changed.remove(k),
                    };
                    Value::Object(changed)
                });
            }
        }
        Value::Array(items) => {
            for (i, inner) in items.iter().enumerate() {
                at(i.to_string(), inner, &mut |r| {
                    let mut changed = items.clone();
                    match r {
                        Some(r) => changed[i] = r,
                        None => {
                            changed.remove(i);
                        }
                    }
                    Value::Array(changed)
                });
            }
        }
        _ => {}
    }
    out
}

/// The other direction: what a validator accepts, the body's schema accepts too. Valid
/// bodies of every shape are mutated one place at a time (removed, null, other types,
/// empty, bounds); every mutant the server's validator accepts must match the schema the
/// document publishes, or a client generated from the document could not send it.
#[test]
fn what_the_validators_accept_the_schemas_accept_too() {
    use tessera_model::api::{PoolInput, ServiceInput};
    let doc = tessera_server::openapi::document();
    /// The server's verdict on a body: its validator's errors, if any.
    type Accepts = fn(&Value) -> Result<(), String>;
    let task_definition: Accepts = |v| {
        tessera_model::taskdef::parse_task_definition(v)
            .map(drop)
            .map_err(|e| format!("{e:?}"))
    };
    let service: Accepts = |v| {
        let input = serde_json::from_value::<ServiceInput>(v.clone()).map_err(|e| e.to_string())?;
        tessera_model::validate::service(&input).map_err(|e| format!("{e:?}"))?;
        // As the server checks them against a definition that publishes every figure.
        let everything = tessera_model::work::Published {
            work: true,
            errors: true,
            latency: true,
            gpu: true,
        };
        input
            .objectives()
            .check(everything)
            .map_err(|e| format!("{e:?}"))
    };
    let pool: Accepts = |v| {
        let input = serde_json::from_value::<PoolInput>(v.clone()).map_err(|e| e.to_string())?;
        tessera_model::validate::pool(&input)
            .map(drop)
            .map_err(|e| format!("{e:?}"))
    };
    let cases: [(&str, Accepts, Vec<Value>); 3] = [
        (
            "/api/v1/task-definitions",
            task_definition,
            vec![
                json!({"family": "llm", "work": {"port": "http", "path": "/metrics", "completed": "requests_total", "errors": "errors_total", "latency": "latency_seconds"},
                    "containers": [{"name": "server", "command": ["python3", "-m", "serve"], "cpu_milli": 2000, "memory_mib": 4096,
                        "env": {"MODEL": "7b"}, "secrets": {"TOKEN": "s3cret", "KEPT": {"set": true}},
                        "gpu": {"mps": {"memory_mib": 20480, "max_compute_percent": 50}},
                        "ports": [{"name": "http", "container_port": 8000, "protocol": "tcp"}],
                        "health_check": {"http": {"port": "http", "path": "/health"}, "interval_secs": 10, "timeout_secs": 5, "retries": 3, "start_period_secs": 30},
                        "essential": true},
                      {"name": "sidecar", "command": ["sleep", "infinity"], "cpu_milli": 0, "memory_mib": 64, "essential": false,
                        "depends_on": [{"container": "server", "condition": "HEALTHY"}],
                        "health_check": {"command": ["CMD", "true"]}}]}),
                json!({"family": "trainer", "ecs": {"networkMode": "host"},
                    "containers": [{"name": "t", "image": "registry.example/trainer:1", "entry_point": ["/bin/train"], "command": [], "cpu_milli": 1000, "memory_mib": 2048,
                        "gpu": {"gpus": 2}, "ports": [{"container_port": 9000, "host_port": 9000}], "ecs": {"ulimits": []}}]}),
                json!({"family": "web", "containerDefinitions": [{"name": "web", "image": "nginx:1", "cpu": 256, "memory": 512,
                    "essential": true, "portMappings": [{"containerPort": 80, "protocol": "tcp", "name": "http"}],
                    "environment": [{"name": "A", "value": "1"}], "secrets": [{"name": "S", "valueFrom": "v"}],
                    "resourceRequirements": [{"type": "GPU", "value": "1"}],
                    "healthCheck": {"command": ["CMD-SHELL", "curl -f localhost"], "interval": 10, "timeout": 5, "retries": 3, "startPeriod": 0}}]}),
            ],
        ),
        (
            "/api/v1/services",
            service,
            vec![
                json!({"name": "chat", "task_definition": "llm:1", "pool": "inference", "desired_count": 2,
                "strategy": "binpack", "constraints": {"gpu_models": ["L4"], "labels": {"zone": "a"}, "distinct_hosts": false, "max_per_gpu": 4, "max_per_host": 8},
                "deployment": {"minimum_healthy_percent": 50, "maximum_percent": 200},
                "stop_timeout_secs": 30, "deregistration_delay_secs": 5, "bake_secs": 60}),
            ],
        ),
        (
            "/api/v1/pools",
            pool,
            vec![
                json!({"name": "inference", "policy": "fragmentation", "compute_overcommit": 1.5, "mps_client_limit": 16,
                "admission": "manual", "task_users": true, "privileged": false}),
            ],
        ),
    ];
    let mut checked = 0;
    let mut disagreements = Vec::new();
    for (path, accepts, seeds) in cases {
        let pointer = format!(
            "/paths/{}/post/requestBody/content/application~1json/schema",
            pointer_escape(path)
        );
        let schema = validator_at(&doc, &pointer);
        for seed in seeds {
            if let Err(e) = accepts(&seed) {
                panic!("{path}: the seed itself is valid: {seed}: {e}");
            }
            for (place, body) in
                std::iter::once(("".to_owned(), seed.clone())).chain(mutants(&seed))
            {
                if accepts(&body).is_ok() {
                    checked += 1;
                    if !schema.is_valid(&body) {
                        disagreements.push(format!("POST {path}, {place}"));
                    }
                }
            }
        }
    }
    assert!(checked > 300, "only {checked} accepted mutants");
    assert!(
        disagreements.is_empty(),
        "{} bodies a validator accepts and its schema refuses, e.g.:\n{}",
        disagreements.len(),
        disagreements.join("\n")
    );
}
