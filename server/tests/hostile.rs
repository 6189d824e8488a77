//! Hostile input through the router: random and mutated task definitions, services, pools,
//! previews and agent syncs (huge numbers, foreign GPU UUIDs and task ids, NUL bytes, deep
//! nesting, very long strings). Whatever comes in: no panic, no 5xx, every rejection names
//! its field, and nothing invalid is stored.
//!
//! `PROPTEST_CASES` sets the number of cases (default 256 here, for CI); docs/operations.md's figure
//! comes from `PROPTEST_CASES=10000 cargo test --release -p tessera-server --test hostile`.

mod common;

use axum::http::{Method, StatusCode};
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use tessera_control::bench::api_token;
use tessera_model::auth::Role;
use tessera_model::taskdef::parse_task_definition;
use tessera_server::{AppState, demo};

const JOIN: &str = "hostile-test-join-token-1";

/// Names the API knows, so mutations often hit a real field.
const KEYS: &[&str] = &[
    "family",
    "containers",
    "name",
    "command",
    "env",
    "secrets",
    "cpu_milli",
    "memory_mib",
    "gpu",
    "gpus",
    "mps",
    "max_compute_percent",
    "containerDefinitions",
    "cpu",
    "memory",
    "resourceRequirements",
    "type",
    "value",
    "sharingStrategy",
    "nvidiaMps",
    "task_definition",
    "pool",
    "desired_count",
    "strategy",
    "constraints",
    "deployment",
    "policy",
    "compute_overcommit",
    "mps_client_limit",
    "count",
    "uuid",
    "index",
    "model",
    "healthy",
    "tasks",
    "task_id",
    "running",
    "exit_code",
    "gpu_memory_peak_mib",
    "sm_percent",
    "stop_timeout_secs",
    "minimum_healthy_percent",
    "maximum_percent",
    "labels",
    "distinct_hosts",
    "gpu_models",
];

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(KEYS).prop_map(str::to_owned),
        1 => ".{0,12}",
    ]
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e300f64..1e300).prop_map(|f| json!(f)),
        Just(json!(u64::MAX)),
        Just(json!(-1)),
        Just(json!(0)),
        ".{0,24}".prop_map(Value::from),
        Just(Value::from("nul\u{0}byte")),
        Just(Value::from("GPU-foreign-0000")),
        Just(Value::from("x".repeat(70_000))),
        proptest::sample::select(KEYS).prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((arb_key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Every place in `v` a mutation can hit: JSON pointers to its values.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                pointers(
                    x,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                pointers(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Remove(usize),
    Insert(usize, String, Value),
    /// The value nested 200 arrays deep.
    Deepen(usize),
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<usize>(), arb_json()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        1 => any::<usize>().prop_map(Mutation::Remove),
        2 => (any::<usize>(), arb_key(), arb_json()).prop_map(|(i, k, v)| Mutation::Insert(i, k, v)),
        1 => any::<usize>().prop_map(Mutation::Deepen),
    ]
}

fn mutate(mut doc: Value, mutations: &[Mutation]) -> Value {
    for m in mutations {
        let mut ps = Vec::new();
        pointers(&doc, String::new(), &mut ps);
        let pick = |i: usize| ps[i % ps.len()].clone();
        match m {
            Mutation::Replace(i, v) => {
                let p = pick(*i);
                if p.is_empty() {
                    doc = v.clone();
                } else if let Some(slot) = doc.pointer_mut(&p) {
                    *slot = v.clone();
                }
            }
            Mutation::Remove(i) => {
                let p = pick(*i);
                if let Some((parent, key)) = p.rsplit_once('/')
                    && let Some(Value::Object(o)) = doc.pointer_mut(parent)
                {
                    o.remove(&key.replace("~1", "/").replace("~0", "~"));
                }
            }
            Mutation::Insert(i, k, v) => {
                if let Some(Value::Object(o)) = doc.pointer_mut(&pick(*i)) {
                    o.insert(k.clone(), v.clone());
                }
            }
            Mutation::Deepen(i) => {
                if let Some(slot) = doc.pointer_mut(&pick(*i)) {
                    let mut deep = slot.take();
                    for _ in 0..200 {
                        deep = Value::Array(vec![deep]);
                    }
                    *slot = deep;
                }
            }
        }
    }
    doc
}

struct Fleet {
    app: AppState,
    admin: String,
    agent: String,
    agent_gpus: Value,
}

async fn fleet() -> Fleet {
    let control = common::control(JOIN).await;
    demo::seed(&control).await.expect("seed");
    let tokens = common::register_hosts(&control, JOIN, &common::DEMO_HOSTS[2..3]).await;
    let host = tessera_model::HostId::new("sim-l4-1").expect("valid");
    let agent_gpus = common::sync_body(&control, &host).await["gpus"].clone();
    Fleet {
        admin: api_token(&control, Role::Admin).await.expect("token"),
        app: AppState::new(control, "127.0.0.1:3000".parse().expect("valid")),
        agent: tokens[0].clone(),
        agent_gpus,
    }
}

/// The valid document each endpoint starts from, before mutation.
fn templates(f: &Fleet) -> Vec<(Method, &'static str, Value, bool)> {
    vec![
        (
            Method::POST,
            "/api/v1/task-definitions",
            json!({"family": "fuzz", "containers": [{"name": "main",
            "command": ["sleep", "1"], "cpu_milli": 100, "memory_mib": 64, "env": {"A": "1"},
            "secrets": {"S": "v"}, "gpu": {"mps": {"memory_mib": 1024, "max_compute_percent": 10}}}]}),
            false,
        ),
        (
            Method::POST,
            "/api/v1/task-definitions",
            json!({"family": "fuzz-ecs", "containerDefinitions": [{"name": "m",
            "command": ["run"], "cpu": 256, "memory": 512, "environment": [{"name": "A", "value": "1"}],
            "resourceRequirements": [{"type": "GPU", "value": "1",
                "sharingStrategy": {"nvidiaMps": {"memory": 2048, "maxComputePercent": 20}}}]}]}),
            false,
        ),
        (
            Method::POST,
            "/api/v1/services",
            json!({"name": "fuzz-svc", "task_definition": "embeddings:1",
            "pool": "inference", "desired_count": 1, "constraints": {"gpu_models": ["NVIDIA L4"]},
            "deployment": {"minimum_healthy_percent": 50, "maximum_percent": 200}}),
            false,
        ),
        (
            Method::PATCH,
            "/api/v1/services/embeddings",
            json!({"desired_count": 2}),
            false,
        ),
        (
            Method::POST,
            "/api/v1/pools",
            json!({"name": "fuzz-pool", "policy": "binpack",
            "compute_overcommit": 1.5, "mps_client_limit": 8}),
            false,
        ),
        (
            Method::POST,
            "/api/v1/placement-preview",
            json!({"task_definition": "embeddings:1",
            "pool": "inference", "count": 2}),
            false,
        ),
        (
            Method::POST,
            "/agent/v1/sync",
            json!({"gpus": f.agent_gpus, "mps": {"healthy": true},
            "tasks": [{"task_id": "not-a-task-of-this-host", "running": true, "gpu_memory_peak_mib": 5,
                "sm_percent": 3}]}),
            true,
        ),
    ]
}

/// A request through the router ([`common::send`]) with the admin's token or the agent's.
async fn send(
    f: &Fleet,
    method: Method,
    uri: &str,
    body: &Value,
    agent: bool,
) -> (StatusCode, Value) {
    let token = if agent { &f.agent } else { &f.admin };
    let a = common::send(&f.app, method, uri, Some(body), &[common::bearer(token)]).await;
    let v = serde_json::from_slice(&a.bytes).unwrap_or(Value::Null);
    (a.status, v)
}

/// Everything stored is still valid: definitions parse, services name what exists.
async fn assert_store_valid(f: &Fleet) {
    let control = &f.app.control;
    for fam in control
        .store()
        .list_task_definition_families()
        .await
        .expect("families")
    {
        for d in control
            .store()
            .list_task_definition_revisions(&fam.family)
            .await
            .expect("revisions")
        {
            let back = serde_json::to_value(&d.spec).expect("json");
            let mut spec = parse_task_definition(&back).expect("a stored definition is valid");
            assert!(spec.fill_secrets(&d.spec.secret_values()).is_empty());
            assert_eq!(spec, d.spec);
        }
    }
    for s in control.store().list_services().await.expect("services") {
        control
            .store()
            .get_task_definition(&s.task_definition)
            .await
            .expect("a service's definition exists");
        assert!(control.store().pool_exists(&s.pool).await.expect("pool"));
    }
}

#[test]
fn hostile_bodies_get_4xx_naming_the_field_and_store_nothing_invalid() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let f = rt.block_on(fleet());
    let templates = templates(&f);
    let config = ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let strategy = (
        0..templates.len(),
        prop::collection::vec(arb_mutation(), 1..4),
    );
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, usize>::new());
    runner
        .run(&strategy, |(which, mutations)| {
            let (method, uri, template, agent) = &templates[which];
            let body = mutate(template.clone(), &mutations);
            let (status, answer) = rt.block_on(send(&f, method.clone(), uri, &body, *agent));
            *statuses.borrow_mut().entry(status.as_u16()).or_default() += 1;
            prop_assert!(
                !status.is_server_error(),
                "{status} for {method} {uri}: {body}\n{answer}"
            );
            if status == StatusCode::UNPROCESSABLE_ENTITY
                && let Some(errors) = answer["errors"].as_array()
            {
                for e in errors {
                    prop_assert!(
                        e["field"].as_str().is_some_and(|s| !s.is_empty()),
                        "a rejection without its field: {answer}"
                    );
                }
            }
            if status.is_client_error() {
                prop_assert!(answer["error"].is_string(), "{status}: {answer}");
            }
            Ok(())
        })
        .expect("no hostile body breaks the server");
    rt.block_on(assert_store_valid(&f));
    eprintln!("hostile input, answers by status: {:?}", statuses.borrow());
}
