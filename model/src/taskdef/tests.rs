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
            {"name": "a", "command": [], "cpu_milli": 2_000_000, "memory_mib": 64,
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
            "is not a known field (expected one of: family, containers, ecs, work)".into()
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

/// Registered and described again in ECS's shape, an ECS definition comes back as it was.
fn round_trips(ecs: serde_json::Value) -> TaskDefinitionSpec {
    let spec = parse_task_definition(&ecs).unwrap_or_else(|e| panic!("accepted: {e:?}"));
    assert_eq!(to_ecs_json(&spec), ecs, "ECS → Tessera → ECS");
    // Through Tessera's own shape too (what the console's editor sends back).
    let native = serde_json::to_value(&spec).expect("serializes");
    let again = parse_task_definition(&native).unwrap_or_else(|e| panic!("native: {e:?}"));
    assert_eq!(again, spec, "Tessera's shape keeps everything");
    assert_eq!(to_ecs_json(&again), ecs);
    spec
}

#[test]
fn a_whole_gpu_ecs_definition_keeps_image_essential_ports_and_cpu_units() {
    let spec = round_trips(json!({
        "family": "trainer",
        "networkMode": "awsvpc",
        "requiresCompatibilities": ["EC2"],
        "taskRoleArn": "arn:aws:iam::123456789012:role/trainer",
        "executionRoleArn": "arn:aws:iam::123456789012:role/ecsTaskExecutionRole",
        "containerDefinitions": [{
            "name": "train", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "essential": true, "cpu": 100, "memory": 30720,
            "command": ["python", "train.py", "--epochs", "3"],
            "portMappings": [{"containerPort": 6006, "protocol": "tcp"}],
            "logConfiguration": {"logDriver": "awslogs", "options": {"awslogs-group": "/ecs/trainer"}},
            "linuxParameters": {"sharedMemorySize": 8192},
            "resourceRequirements": [{"type": "GPU", "value": "2"}]
        }]
    }));
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some("nvcr.io/nvidia/pytorch:24.05-py3"));
    assert_eq!(c.cpu_milli, MilliCpu(98), "100 units, rounded up to milli");
    assert_eq!(spec.gpu(), TaskGpu::Whole { count: 2 });
    assert_eq!(c.ecs["essential"], json!(true));
}

#[test]
fn task_level_sizes_as_strings_and_entry_point_with_command() {
    let spec = round_trips(json!({
        "family": "llm-mps",
        "cpu": "2048",
        "memory": "4096",
        "networkMode": "host",
        "containerDefinitions": [{
            "name": "server", "image": "vllm/vllm-openai:v0.6.0",
            "entryPoint": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
            "command": ["--model", "meta-llama/Llama-3-8B"],
            "environment": [{"name": "HF_HOME", "value": "/cache"}],
            "resourceRequirements": [{"type": "GPU", "value": "1",
                "sharingStrategy": {"nvidiaMps": {"memory": 20480, "maxComputePercent": 50}}}]
        }]
    }));
    let c = &spec.containers[0];
    assert_eq!(c.cpu_milli, MilliCpu(2000), "the task's 2048 units");
    assert_eq!(c.memory_mib, MiB(4096), "the task's memory");
    assert_eq!(
        c.argv(),
        [
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "meta-llama/Llama-3-8B"
        ]
    );
}

#[test]
fn several_containers_share_what_the_task_gives_them() {
    let spec = round_trips(json!({
        "family": "rag",
        "cpu": "1 vCPU",
        "memory": "4 GB",
        "containerDefinitions": [
            {"name": "embed", "image": "ghcr.io/acme/embed:1.2", "cpu": 512,
             "resourceRequirements": [{"type": "GPU", "value": "1",
                "sharingStrategy": {"nvidiaMps": {"memory": 6144}}}]},
            {"name": "proxy", "image": "envoyproxy/envoy:v1.30", "memoryReservation": 256,
             "essential": false, "environment": []},
            {"name": "worker", "image": "ghcr.io/acme/worker:1.2", "command": ["run"]}
        ]
    }));
    let milli: Vec<u64> = spec.containers.iter().map(|c| c.cpu_milli.0).collect();
    // 512 units given; the other two share the rest of 1024: 256 units each.
    assert_eq!(milli, [500, 250, 250]);
    let mib: Vec<u64> = spec.containers.iter().map(|c| c.memory_mib.0).collect();
    // proxy reserves 256; embed and worker share the rest of 4096.
    assert_eq!(mib, [1920, 256, 1920]);
}

#[test]
fn ecs_cpu_units_come_back_exactly_and_sizes_follow_ecs_rules() {
    for units in [100u64, 128, 256, 1000, 1023, 1024, 4096] {
        let spec = round_trips(json!({
            "family": "u", "containerDefinitions": [{"name": "m", "command": ["a"], "cpu": units, "memory": 64}]
        }));
        assert_eq!(spec.containers[0].ecs["cpu"], json!(units));
    }
    // No memory anywhere: ECS's rule, named on the container.
    let errs = errors(json!({
        "family": "x", "containerDefinitions": [{"name": "m", "command": ["a"], "cpu": 256}]
    }));
    assert!(
        errs.iter()
            .any(|(f, m)| f == "containerDefinitions[0].memory" && m.contains("memoryReservation")),
        "{errs:?}"
    );
    // More CPU in the containers than the task has.
    let errs = errors(json!({
        "family": "x", "cpu": "256", "memory": "512",
        "containerDefinitions": [{"name": "m", "command": ["a"], "cpu": 512}]
    }));
    assert!(errs.iter().any(|(f, _)| f == "cpu"), "{errs:?}");
    // A task size that is not one.
    let errs = errors(json!({
        "family": "x", "cpu": "lots", "memory": "512",
        "containerDefinitions": [{"name": "m", "command": ["a"]}]
    }));
    assert!(errs.iter().any(|(f, _)| f == "cpu"), "{errs:?}");
    // Without an image, something to run is still required.
    let errs = errors(json!({
        "family": "x", "memory": "512", "containerDefinitions": [{"name": "m"}]
    }));
    assert!(
        errs.iter()
            .any(|(f, _)| f == "containerDefinitions[0].command"),
        "{errs:?}"
    );
}

#[test]
fn an_ecs_container_without_cpu_reserves_none_and_reads_back_in_tessera_shape() {
    for ecs in [
        json!({"family": "nocpu", "containerDefinitions": [{"name": "m", "image": "r/m:1", "memory": 512}]}),
        json!({"family": "zerocpu", "containerDefinitions": [{"name": "m", "image": "r/m:1", "memory": 512, "cpu": 0}]}),
    ] {
        let spec = parse_task_definition(&ecs).expect("ECS accepts it");
        assert_eq!(spec.containers[0].cpu_milli, MilliCpu(0));
        let back = serde_json::to_value(&spec).expect("json");
        assert_eq!(parse_task_definition(&back).expect("reads back"), spec);
        let again = to_ecs_json(&spec);
        assert_eq!(
            again["containerDefinitions"][0].get("cpu"),
            ecs["containerDefinitions"][0].get("cpu")
        );
    }
}

#[test]
fn ports_health_checks_and_dependencies_in_the_native_shape() {
    let spec = parse_task_definition(&json!({
        "family": "embed",
        "containers": [
            {"name": "server", "command": ["serve"], "cpu_milli": 100, "memory_mib": 64,
             "ports": [{"name": "http", "container_port": 8000},
                       {"name": "metrics", "container_port": 9100, "host_port": 9100, "protocol": "tcp"}],
             "health_check": {"http": {"port": "http", "path": "/health"}, "interval_secs": 5},
             "depends_on": [{"container": "warmup", "condition": "SUCCESS"}]},
            {"name": "warmup", "command": ["true"], "cpu_milli": 0, "memory_mib": 16, "essential": false}
        ]
    }))
    .expect("valid");
    let server = &spec.containers[0];
    assert_eq!(server.ports[0].host_port, None, "dynamic");
    assert_eq!(
        server.ports[1].env_name().as_deref(),
        Some("TESSERA_PORT_METRICS")
    );
    let check = server.health_check.as_ref().expect("a check");
    assert_eq!(
        (
            check.interval_secs,
            check.timeout_secs,
            check.retries,
            check.start_period_secs
        ),
        (5, 5, 3, 0)
    );
    assert!(!spec.containers[1].essential);
    assert_eq!(spec.fixed_host_ports(), [(9100, Protocol::Tcp)]);
    // What serializes parses back to the same spec.
    let again =
        parse_task_definition(&serde_json::to_value(&spec).expect("serializes")).expect("valid");
    assert_eq!(again, spec);
}

#[test]
fn ecs_serving_fields_round_trip_unchanged() {
    let spec = round_trips(json!({
        "family": "chat",
        "networkMode": "bridge",
        "containerDefinitions": [{
            "name": "main", "image": "vllm/vllm-openai:latest", "cpu": 1024, "memory": 2048,
            "essential": true,
            "portMappings": [{"containerPort": 8000, "hostPort": 0, "protocol": "tcp", "name": "http", "appProtocol": "http"}],
            "healthCheck": {"command": ["CMD-SHELL", "curl -f http://localhost:8000/health || exit 1"],
                            "interval": 10, "timeout": 3, "retries": 2, "startPeriod": 60},
            "dependsOn": [{"containerName": "sidecar", "condition": "START"}],
            "resourceRequirements": [{"type": "GPU", "sharingStrategy": {"nvidiaMps": {"memory": 8192, "maxComputePercent": 50}}}]
        }, {
            "name": "sidecar", "image": "busybox", "cpu": 0, "memory": 64, "essential": false
        }]
    }));
    let main = &spec.containers[0];
    assert_eq!(
        main.ports,
        [PortSpec {
            name: Some("http".into()),
            container_port: 8000,
            host_port: None,
            protocol: Protocol::Tcp
        }]
    );
    assert_eq!(
        main.health_check
            .as_ref()
            .map(|h| (h.interval_secs, h.retries, h.start_period_secs)),
        Some((10, 2, 60))
    );
    assert_eq!(
        main.gpu,
        Some(GpuRequirement::Mps {
            memory_mib: MiB(8192),
            max_compute_percent: Some(Percent::new(50).expect("valid"))
        }),
        "sharingStrategy without value is one shared GPU"
    );
    assert!(!spec.containers[1].essential);
    // A change made in Tessera's shape comes back in ECS's.
    let mut changed = spec.clone();
    changed.containers[0].ports[0].host_port = Some(8080);
    changed.containers[1].essential = true;
    let ecs = to_ecs_json(&changed);
    assert_eq!(
        ecs["containerDefinitions"][0]["portMappings"][0]["hostPort"],
        8080
    );
    assert_eq!(
        ecs["containerDefinitions"][0]["portMappings"][0]["appProtocol"], "http",
        "what Tessera does not model of a mapping is kept"
    );
    assert_eq!(ecs["containerDefinitions"][1]["essential"], true);
    let back = parse_task_definition(&ecs).expect("valid");
    assert_eq!(back.containers[0].ports, changed.containers[0].ports);
    assert!(back.containers[1].essential);
}

#[test]
fn serving_mistakes_name_their_fields() {
    let errs = errors(json!({
        "family": "bad",
        "containers": [
            {"name": "a", "command": ["x"], "cpu_milli": 1, "memory_mib": 1,
             "ports": [{"name": "web", "container_port": 0}, {"name": "web", "container_port": 80, "host_port": 70000},
                       {"container_port": 81, "protocol": "sctp"}],
             "health_check": {"command": ["CMD"], "interval_secs": 1, "retries": 11},
             "depends_on": [{"container": "b", "condition": "READY"}, {"container": "nobody", "condition": "START"}]},
            {"name": "b", "command": ["y"], "cpu_milli": 1, "memory_mib": 1,
             "ports": [{"name": "web", "container_port": 80}, {"name": "x", "container_port": 90, "host_port": 90}, {"name": "y", "container_port": 91, "host_port": 90}],
             "health_check": {"http": {"port": "nope"}},
             "depends_on": [{"container": "a", "condition": "HEALTHY"}]}
        ]
    }));
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    for want in [
        "containers[0].ports[0].container_port",
        "containers[0].ports[1].host_port",
        "containers[0].ports[2].protocol",
        "containers[0].health_check.command",
        "containers[0].health_check.interval_secs",
        "containers[0].health_check.retries",
        "containers[0].depends_on[0].condition",
    ] {
        assert!(fields.contains(&want), "{want}: {errs:?}");
    }
    // The cross-container rules, once each container parsed.
    let errs = errors(json!({
        "family": "bad",
        "containers": [
            {"name": "a", "command": ["x"], "cpu_milli": 1, "memory_mib": 1,
             "ports": [{"name": "web", "container_port": 80}],
             "depends_on": [{"container": "b", "condition": "START"}, {"container": "nobody", "condition": "START"}]},
            {"name": "b", "command": ["y"], "cpu_milli": 1, "memory_mib": 1,
             "ports": [{"name": "web", "container_port": 81}, {"name": "x", "container_port": 90, "host_port": 90}, {"name": "y", "container_port": 91, "host_port": 90}],
             "health_check": {"http": {"port": "nope"}},
             "depends_on": [{"container": "a", "condition": "HEALTHY"}]}
        ]
    }));
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    for want in [
        "containers[0].depends_on[1].container",
        "containers[1].ports[0].name",
        "containers[1].ports[2].host_port",
        "containers[1].health_check.http.port",
        "containers[1].depends_on[0].condition",
        "containers",
    ] {
        assert!(fields.contains(&want), "{want}: {errs:?}");
    }
    assert!(errs.iter().any(|(_, m)| m.contains("cycle")), "{errs:?}");
    let errs = errors(json!({
        "family": "bad", "networkMode": "host",
        "containerDefinitions": [{"name": "a", "command": ["x"], "memory": 1, "essential": false,
            "portMappings": [{"containerPort": 80, "hostPort": 81}]}]
    }));
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    assert!(
        fields.contains(&"containers[0].ports[0].host_port"),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|(f, m)| f == "containers" && m.contains("essential")),
        "{errs:?}"
    );
}

#[test]
fn a_revision_stored_before_serving_was_modelled_reads_its_ecs_fields() {
    // As an earlier Tessera stored an ECS import: the mappings only in `ecs`.
    let mut spec: TaskDefinitionSpec = serde_json::from_value(json!({
        "family": "old",
        "containers": [{"name": "main", "command": ["serve"], "cpu_milli": 100, "memory_mib": 64,
            "ecs": {"portMappings": [{"containerPort": 8000, "name": "http"}], "essential": true,
                    "healthCheck": {"command": ["CMD-SHELL", "true"]}}}]
    }))
    .expect("deserializes");
    assert!(spec.containers[0].ports.is_empty());
    upgrade_stored(&mut spec);
    assert_eq!(spec.containers[0].ports[0].container_port, 8000);
    assert!(spec.containers[0].health_check.is_some());
    let ecs = to_ecs_json(&spec);
    assert_eq!(
        ecs["containerDefinitions"][0]["portMappings"][0]["containerPort"],
        8000
    );
    // A native edit that removes the ports drops the stale ECS copy: nothing to bring back.
    let mut edited = serde_json::to_value(&spec).expect("serializes");
    edited["containers"][0]
        .as_object_mut()
        .expect("object")
        .remove("ports");
    let again = parse_task_definition(&edited).expect("valid");
    assert!(again.containers[0].ports.is_empty());
    assert!(!again.containers[0].ecs.contains_key("portMappings"));
    let mut stored = again.clone();
    upgrade_stored(&mut stored);
    assert_eq!(stored, again);
}

#[test]
fn work_names_a_port_of_the_task_and_prometheus_metric_names() {
    let base = |work: serde_json::Value| {
        json!({"family": "web", "containers": [{"name": "a", "command": ["serve"], "cpu_milli": 100,
            "memory_mib": 64, "ports": [{"name": "http", "container_port": 8080}]}], "work": work})
    };
    let spec = parse_task_definition(&base(
        json!({"port": "http", "completed": "vllm:request_success_total", "latency": "vllm:e2e_request_latency_seconds"}),
    ))
    .expect("valid");
    let work = spec.work.expect("kept");
    assert_eq!(work.path, "/metrics", "the default path");
    assert_eq!(work.errors, None);
    let errs = errors(base(
        json!({"port": "grpc", "completed": "bad name", "path": "metrics", "extra": 1}),
    ));
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    assert_eq!(
        fields,
        ["work.extra", "work.port", "work.path", "work.completed"],
        "{errs:?}"
    );
    assert!(errs[1].1.contains("its ports: http"), "{errs:?}");
    // In ECS's shape too, and given back.
    let ecs = json!({"family": "web", "containerDefinitions": [{"name": "a", "image": "x", "memory": 64,
        "portMappings": [{"name": "http", "containerPort": 8080}]}],
        "work": {"port": "http", "completed": "requests_total"}});
    let spec = parse_task_definition(&ecs).expect("valid");
    assert_eq!(
        spec.work.as_ref().map(|w| w.completed.as_str()),
        Some("requests_total")
    );
    assert_eq!(to_ecs_json(&spec)["work"]["port"], "http");
    assert!(spec.ecs.get("work").is_none(), "modelled, not kept twice");
}

#[test]
fn an_ecs_task_size_near_the_integer_limit_is_an_error_not_an_overflow() {
    for (key, value) in [
        ("cpu", json!(u64::MAX)),
        ("cpu", json!("18446744073709551615")),
        ("memory", json!(u64::MAX - 1)),
        ("cpu", json!("1e300 vCPU")),
    ] {
        let errs = errors(json!({"family": "big", key: value,
            "containerDefinitions": [{"name": "a", "image": "x"}]}));
        assert!(
            errs.iter().any(|(f, m)| f == key && m.contains("at most")),
            "{key} = {value}: {errs:?}"
        );
    }
}

#[test]
fn an_image_is_limited_in_characters_as_its_schema_says_not_in_bytes() {
    let with = |image: String| json!({"family": "f", "containers": [{"name": "c", "image": image, "cpu_milli": 0, "memory_mib": 16}]});
    let limit = crate::limits::MAX_TEXT_CHARS;
    assert!(parse_task_definition(&with("é".repeat(limit))).is_ok());
    assert!(parse_task_definition(&with("é".repeat(limit + 1))).is_err());
}
