use super::*;
use serde_json::json;

fn errors(v: Value) -> Vec<(String, String)> {
    parse_task_definition(&v)
        .expect_err("invalid")
        .errors
        .into_iter()
        .map(|e| (e.field, e.message))
        .collect()
}

#[test]
fn native_shape_parses_and_sums_gpu_needs() {
    let spec = parse_task_definition(&json!({
        "family": "llm-serve",
        "containers": [
            {"name": "main", "command": ["python", "serve.py"], "env": {"MODEL": "7b"},
             "cpu_milli": 2000, "memory_mib": 4096,
             "gpu": {"mps": {"memory_mib": 8192, "max_compute_percent": 25}}},
            {"name": "sidecar", "command": ["sleep", "inf"], "cpu_milli": 100, "memory_mib": 64,
             "gpu": {"mps": {"memory_mib": 1024}}}
        ]
    }))
    .expect("valid");
    assert_eq!(spec.cpu(), MilliCpu(2100));
    assert_eq!(
        spec.gpu(),
        TaskGpu::Shared {
            memory: MiB(9216),
            compute: Some(ComputeMilli(250))
        }
    );
}

#[test]
fn every_error_names_its_field() {
    let errs = errors(json!({
        "family": "bad family!",
        "containers": [
            {"name": "a", "command": [], "cpu_milli": 0, "memory_mib": 64,
             "gpu": {"mps": {"memory_mib": 8192, "max_compute_percent": 150}}},
            {"name": "a", "command": ["x"], "cpu_milli": 10, "memory_mib": 64,
             "env": {"CUDA_VISIBLE_DEVICES": "0"}, "gpu": {"gpus": 1}}
        ]
    }));
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    assert!(fields.contains(&"containers[0].cpu_milli"), "{errs:?}");
    assert!(
        fields.contains(&"containers[0].gpu.mps.max_compute_percent"),
        "{errs:?}"
    );
    assert!(
        fields.contains(&"family"),
        "the name is checked even when a container fails to parse: {errs:?}"
    );
    assert!(errs.iter().all(|(f, m)| !f.is_empty() && !m.is_empty()));
}

#[test]
fn spec_level_rules_are_reported_together() {
    let errs = errors(json!({
        "family": "bad family!",
        "containers": [
            {"name": "a", "command": [""], "cpu_milli": 10, "memory_mib": 64, "gpu": {"mps": {"memory_mib": 10}}},
            {"name": "a", "command": ["x"], "cpu_milli": 10, "memory_mib": 64,
             "env": {"CUDA_VISIBLE_DEVICES": "0"}, "gpu": {"gpus": 1}}
        ]
    }));
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        [
            "family",
            "containers[0].command",
            "containers[1].name",
            "containers[1].env.CUDA_VISIBLE_DEVICES",
            "containers"
        ],
        "{errs:?}"
    );
}

#[test]
fn missing_and_mistyped_fields() {
    let errs = errors(
        json!({"family": 3, "containers": [{"name": "a", "command": "python"}], "extra": 1}),
    );
    assert!(
        errs.contains(&(
            "extra".into(),
            "is not a known field (expected one of: family, containers)".into()
        )),
        "{errs:?}"
    );
    assert!(
        errs.contains(&("family".into(), "must be a string, got a number".into())),
        "{errs:?}"
    );
    assert!(
        errs.iter().any(|(f, _)| f == "containers[0].command"),
        "{errs:?}"
    );
    assert!(
        errs.contains(&("containers[0].cpu_milli".into(), "is required".into())),
        "{errs:?}"
    );
}

#[test]
fn ecs_shape_round_trips() {
    let ecs = json!({
        "family": "inference",
        "containerDefinitions": [{
            "name": "main", "command": ["python", "serve.py"], "cpu": 1024, "memory": 2048,
            "environment": [{"name": "MODEL", "value": "7b"}],
            "resourceRequirements": [{"type": "GPU", "value": "1",
                "sharingStrategy": {"nvidiaMps": {"memory": 8192, "maxComputePercent": 25}}}]
        }]
    });
    let spec = parse_task_definition(&ecs).expect("valid ECS");
    assert_eq!(spec.containers[0].cpu_milli, MilliCpu(1000));
    assert_eq!(spec.containers[0].env["MODEL"], "7b");
    assert_eq!(
        spec.gpu(),
        TaskGpu::Shared {
            memory: MiB(8192),
            compute: Some(ComputeMilli(250))
        }
    );
    assert_eq!(to_ecs_json(&spec), ecs);
    assert_eq!(parse_task_definition(&to_ecs_json(&spec)), Ok(spec));
}

#[test]
fn ecs_errors_use_ecs_paths() {
    let errs = errors(json!({
        "family": "x",
        "containerDefinitions": [{"name": "m", "command": ["a"], "cpu": 256, "memory": 512,
            "resourceRequirements": [{"type": "GPU", "value": "2",
                "sharingStrategy": {"nvidiaMps": {"maxComputePercent": 0}}}]}]
    }));
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    assert!(
        fields.contains(&"containerDefinitions[0].resourceRequirements[0].value"),
        "{errs:?}"
    );
    assert!(
        fields.contains(
            &"containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps.memory"
        ),
        "{errs:?}"
    );
    assert!(fields.contains(&"containerDefinitions[0].resourceRequirements[0].sharingStrategy.nvidiaMps.maxComputePercent"), "{errs:?}");
}

#[test]
fn secrets_are_write_only() {
    let mut spec = parse_task_definition(&json!({
        "family": "db",
        "containers": [{"name": "main", "command": ["serve"], "cpu_milli": 100, "memory_mib": 64,
            "env": {"MODE": "prod"}, "secrets": {"DB_PASSWORD": "hunter2-hunter2"}}]
    }))
    .expect("valid");
    let shown = serde_json::to_string(&spec).expect("serializes");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains(r#""DB_PASSWORD":{"set":true}"#), "{shown}");
    assert!(!format!("{spec:?}").contains("hunter2"));
    let ecs = to_ecs_json(&spec).to_string();
    assert!(!ecs.contains("hunter2"), "{ecs}");
    let values = spec.secret_values();
    assert_eq!(values["main"]["DB_PASSWORD"], "hunter2-hunter2");
    // What a description sends back keeps the value once filled from the store.
    let mut again = parse_task_definition(&serde_json::from_str(&shown).expect("json"))
        .expect("a described definition registers again");
    assert_eq!(
        again.containers[0].secrets["DB_PASSWORD"],
        Secret::Unchanged
    );
    assert!(again.fill_secrets(&values).is_empty());
    assert_eq!(again, spec);
    spec.containers[0].name = "renamed".into();
    let mut renamed = spec.clone();
    renamed.containers[0]
        .secrets
        .insert("DB_PASSWORD".into(), Secret::Unchanged);
    let missing = renamed.fill_secrets(&values);
    assert_eq!(missing[0].field, "containers[0].secrets.DB_PASSWORD");
}

#[test]
fn secret_rules_name_their_field() {
    let errs = errors(json!({
        "family": "db",
        "containers": [{"name": "main", "command": ["serve"], "cpu_milli": 100, "memory_mib": 64,
            "env": {"A": "1"}, "secrets": {"A": "x", "CUDA_VISIBLE_DEVICES": "0", "B": 3}}]
    }));
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    assert!(fields.contains(&"containers[0].secrets.B"), "{errs:?}");
    assert!(fields.contains(&"containers[0].secrets.A"), "{errs:?}");
    assert!(
        fields.contains(&"containers[0].secrets.CUDA_VISIBLE_DEVICES"),
        "{errs:?}"
    );
}

#[test]
fn ecs_secrets_take_literals_and_refuse_arns() {
    let base = |from: &str| {
        json!({"family": "x", "containerDefinitions": [{"name": "m", "command": ["a"],
            "cpu": 256, "memory": 512, "secrets": [{"name": "TOKEN", "valueFrom": from}]}]})
    };
    let spec = parse_task_definition(&base("s3cr3t-literal")).expect("a literal is held");
    assert_eq!(
        spec.containers[0].secrets["TOKEN"].expose(),
        Some("s3cr3t-literal")
    );
    let errs = errors(base("arn:aws:secretsmanager:us-east-1:1:secret:db"));
    assert_eq!(errs[0].0, "containerDefinitions[0].secrets[0].valueFrom");
    assert!(errs[0].1.contains("cannot read"), "{errs:?}");
}
