//! The documents `tessera apply` and `tessera preview` read: files, directories or
//! standard input, YAML or JSON; each a task definition (Tessera's or ECS's) or a service.

use anyhow::{Context, bail};
use serde_json::Value;
use std::io::Read;
use std::path::PathBuf;
use tessera_model::api::ServiceInput;
use tessera_model::taskdef::{TaskDefinitionSpec, parse_task_definition};

/// One document of the files.
pub(super) enum Doc {
    TaskDef {
        source: String,
        /// What is sent to register it (Tessera's or ECS's shape, as written).
        body: Value,
        spec: TaskDefinitionSpec,
    },
    Service {
        source: String,
        input: ServiceInput,
    },
}

/// Every document of `paths`: files, directories (their `.yaml`, `.yml` and `.json`
/// files, in name order), or `-` for standard input; each with where it came from.
pub(super) fn read_documents(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, Value)>> {
    let mut files = Vec::new();
    for p in paths {
        if p.as_os_str() == "-" {
            files.push(p.clone());
        } else if p.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("reading {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    f.extension()
                        .and_then(|e| e.to_str())
                        .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
                })
                .collect();
            inside.sort();
            files.extend(inside);
        } else {
            files.push(p.clone());
        }
    }
    let mut docs = Vec::new();
    for f in files {
        let (name, text) = if f.as_os_str() == "-" {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading standard input")?;
            ("(stdin)".to_owned(), s)
        } else {
            let text =
                std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
            (f.display().to_string(), text)
        };
        if f.extension().is_some_and(|e| e == "json") {
            let v: Value =
                serde_json::from_str(&text).with_context(|| format!("{name}: not valid JSON"))?;
            match v {
                Value::Array(items) => {
                    for (i, item) in items.into_iter().enumerate() {
                        docs.push((format!("{name}[{i}]"), item));
                    }
                }
                other => docs.push((name, other)),
            }
        } else {
            for (i, d) in serde_yaml::Deserializer::from_str(&text).enumerate() {
                let v = <Value as serde::Deserialize>::deserialize(d)
                    .with_context(|| format!("{name}: document {} is not valid YAML", i + 1))?;
                if !v.is_null() {
                    docs.push((format!("{name} (document {})", i + 1), v));
                }
            }
        }
    }
    if docs.is_empty() {
        bail!(
            "no documents in {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(docs)
}

/// Fields of an ECS task definition that ECS reports but never takes on registration.
const ECS_OUTPUT_ONLY: &[&str] = &[
    "taskDefinitionArn",
    "revision",
    "status",
    "requiresAttributes",
    "compatibilities",
    "registeredAt",
    "registeredBy",
    "deregisteredAt",
];

/// What a document is: `kind: TaskDefinition` or `kind: Service`, else its fields say.
pub(super) fn classify(source: String, value: Value) -> anyhow::Result<Doc> {
    let Value::Object(mut o) = value else {
        bail!("{source}: a document must be an object (a task definition or a service)");
    };
    // What `aws ecs describe-task-definition` prints: the definition, with fields ECS
    // sets itself (never part of what is registered, and different on every export).
    if let Some(Value::Object(inner)) = o.get("taskDefinition") {
        o = inner.clone();
    }
    if o.contains_key("containerDefinitions") {
        for k in ECS_OUTPUT_ONLY {
            o.remove(*k);
        }
    }
    let kind = match o.remove("kind") {
        Some(Value::String(k)) => Some(k.to_lowercase().replace(['-', '_'], "")),
        Some(other) => bail!("{source}: kind must be TaskDefinition or Service, not {other}"),
        None => None,
    };
    let is_task_def = match kind.as_deref() {
        Some("taskdefinition") => true,
        Some("service") => false,
        Some(k) => bail!("{source}: kind {k:?}: give TaskDefinition or Service"),
        None if o.contains_key("containerDefinitions") || o.contains_key("containers") => true,
        None if o.contains_key("task_definition") || o.contains_key("desired_count") => false,
        None => bail!(
            "{source}: cannot tell what this is: give `kind: TaskDefinition` or `kind: Service`"
        ),
    };
    if is_task_def {
        let body = Value::Object(o);
        let spec = parse_task_definition(&body).map_err(|e| {
            let lines: Vec<String> = e
                .errors
                .iter()
                .map(|f| format!("  {}: {}", f.field, f.message))
                .collect();
            anyhow::anyhow!(
                "{source}: not a valid task definition:\n{}",
                lines.join("\n")
            )
        })?;
        Ok(Doc::TaskDef { source, body, spec })
    } else {
        let input: ServiceInput = serde_json::from_value(Value::Object(o))
            .with_context(|| format!("{source}: not a valid service"))?;
        Ok(Doc::Service { source, input })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exported_ecs_definition_is_read_without_what_ecs_set_itself() {
        let exported = serde_json::json!({"taskDefinition": {
            "taskDefinitionArn": "arn:aws:ecs:us-east-1:123456789012:task-definition/infer:7",
            "family": "infer", "revision": 7, "status": "ACTIVE",
            "registeredAt": "2026-11-02T10:00:00Z", "registeredBy": "arn:aws:iam::123:user/ops",
            "requiresAttributes": [{"name": "com.amazonaws.ecs.capability.docker-remote-api.1.17"}],
            "compatibilities": ["EC2"], "networkMode": "awsvpc",
            "cpu": "2048", "memory": "4096",
            "containerDefinitions": [{"name": "m", "image": "r/infer:1", "essential": true,
                "resourceRequirements": [{"type": "GPU", "value": "1"}]}]
        }});
        let Doc::TaskDef { body, spec, .. } = classify("t".into(), exported).expect("reads") else {
            panic!("a task definition");
        };
        for k in ECS_OUTPUT_ONLY {
            assert!(body.get(*k).is_none(), "{k} dropped");
            assert!(!spec.ecs.contains_key(*k), "{k} not kept");
        }
        // What the operator wrote is kept.
        assert_eq!(spec.ecs["networkMode"], "awsvpc");
        assert_eq!(spec.containers[0].image.as_deref(), Some("r/infer:1"));
    }

    #[test]
    fn documents_say_what_they_are_or_are_told_apart_by_their_fields() {
        let svc = serde_json::json!({"name": "s", "task_definition": "f", "pool": "p"});
        assert!(matches!(
            classify("a".into(), svc).unwrap(),
            Doc::Service { .. }
        ));
        let err = classify("b".into(), serde_json::json!({"name": "x"}))
            .err()
            .unwrap();
        assert!(err.to_string().contains("kind: TaskDefinition"), "{err}");
        let err = classify("c".into(), serde_json::json!({"kind": "Pod"}))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("give TaskDefinition or Service"),
            "{err}"
        );
    }
}
