//! What `tessera apply` would change: each task definition compared with its family's
//! newest revision on the server, the revision a service names, a service's settings.

use crate::apply::documents::Doc;
use crate::{Client, Exit, seg};
use anyhow::bail;
use serde_json::{Map, Value};
use tessera_model::api::ServiceInput;
use tessera_model::bodies::RevisionList;
use tessera_model::service::{Service, TaskDefRef, TaskDefinition};
use tessera_model::taskdef::{Secret, TaskDefinitionSpec};

/// The paths where two JSON values differ (at most `max`).
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>, max: usize) {
    if out.len() >= max || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                differences(
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    &p,
                    out,
                    max,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differences(u, v, &format!("{path}[{i}]"), out, max);
            }
        }
        _ => out.push(if path.is_empty() {
            "(all)".into()
        } else {
            path.to_owned()
        }),
    }
}

/// The spec as it compares with the server's: a secret's value cannot be read back, so
/// one the server has is taken as unchanged (unless `update_secrets`).
fn comparable(
    spec: &TaskDefinitionSpec,
    server: &TaskDefinitionSpec,
    update_secrets: bool,
) -> TaskDefinitionSpec {
    let mut s = spec.clone();
    for (c, theirs) in s.containers.iter_mut().zip(&server.containers) {
        for (k, v) in c.secrets.iter_mut() {
            if theirs.secrets.contains_key(k) && (!update_secrets || matches!(v, Secret::Unchanged))
            {
                *v = Secret::Unchanged;
            }
        }
    }
    s
}

pub(super) enum TdAction {
    Create,
    NewRevision { from: u32, changes: Vec<String> },
    Unchanged { revision: u32, secrets_kept: bool },
}

pub(super) struct TdPlan {
    pub(super) family: String,
    pub(super) body: Value,
    pub(super) action: TdAction,
}

async fn revisions(c: &Client, family: &str) -> anyhow::Result<Option<Vec<TaskDefinition>>> {
    match c
        .get::<RevisionList>(&format!("/api/v1/task-definitions/{}", seg(family)))
        .await
    {
        Ok(list) => Ok(Some(list.revisions)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(super) fn is_not_found(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Exit>()
        .is_some_and(|x| x.status == Some(404))
}

fn newest_active(revs: &[TaskDefinition]) -> Option<&TaskDefinition> {
    revs.iter().filter(|r| r.active).max_by_key(|r| r.revision)
}

pub(super) async fn plan_task_defs(
    c: &Client,
    docs: &[Doc],
    update_secrets: bool,
) -> anyhow::Result<Vec<TdPlan>> {
    let mut plans: Vec<TdPlan> = Vec::new();
    for d in docs {
        let Doc::TaskDef { source, body, spec } = d else {
            continue;
        };
        if plans.iter().any(|p| p.family == spec.family) {
            bail!("{source}: family {} is given twice", spec.family);
        }
        let action = match revisions(c, &spec.family)
            .await?
            .as_deref()
            .and_then(newest_active)
        {
            None => TdAction::Create,
            Some(current) => {
                let mine = comparable(spec, &current.spec, update_secrets);
                if mine == current.spec {
                    TdAction::Unchanged {
                        revision: current.revision,
                        secrets_kept: spec
                            .containers
                            .iter()
                            .any(|c| c.secrets.values().any(|s| matches!(s, Secret::Value(_)))),
                    }
                } else {
                    let mut changes = Vec::new();
                    differences(
                        &serde_json::to_value(&current.spec)?,
                        &serde_json::to_value(&mine)?,
                        "",
                        &mut changes,
                        8,
                    );
                    if changes.is_empty() {
                        changes.push("secrets".into());
                    }
                    TdAction::NewRevision {
                        from: current.revision,
                        changes,
                    }
                }
            }
        };
        plans.push(TdPlan {
            family: spec.family.clone(),
            body: body.clone(),
            action,
        });
    }
    Ok(plans)
}

/// The revision a service's `task_definition` names: as given, or a family's newest (the
/// one this apply registers, else the server's).
pub(super) async fn resolve(
    c: &Client,
    given: &str,
    tds: &[TdPlan],
) -> anyhow::Result<(Option<TaskDefRef>, bool)> {
    if let Ok(r) = given.parse::<TaskDefRef>() {
        return Ok((Some(r), false));
    }
    if let Some(p) = tds.iter().find(|p| p.family == given) {
        return Ok(match p.action {
            TdAction::Unchanged { revision, .. } => (
                Some(TaskDefRef {
                    family: given.to_owned(),
                    revision,
                }),
                true,
            ),
            // Known once registered.
            _ => (None, true),
        });
    }
    match revisions(c, given)
        .await?
        .as_deref()
        .and_then(newest_active)
    {
        Some(r) => Ok((
            Some(TaskDefRef {
                family: r.family.clone(),
                revision: r.revision,
            }),
            true,
        )),
        None => bail!("task definition {given:?}: no such family on the server or in the files"),
    }
}

/// The settings of a service that its file changes, in words and as a patch (the pool
/// is not among them: it never changes in place).
pub(super) fn settings_changes(
    s: &Service,
    i: &ServiceInput,
) -> anyhow::Result<(Vec<String>, Map<String, Value>)> {
    let (mut words, mut patch) = (Vec::new(), Map::new());
    let strategy = s.strategy.map(|p| p.to_string());
    if strategy != i.strategy {
        words.push(format!(
            "strategy {} → {}",
            strategy.as_deref().unwrap_or("the pool's"),
            i.strategy.as_deref().unwrap_or("the pool's")
        ));
        patch.insert("strategy".into(), serde_json::to_value(&i.strategy)?);
    }
    if s.constraints != i.constraints {
        words.push("constraints".into());
        patch.insert("constraints".into(), serde_json::to_value(&i.constraints)?);
    }
    let deployment = i.deployment.unwrap_or_default();
    if s.deployment != deployment {
        words.push(format!(
            "deployment {}–{}% → {}–{}%",
            s.deployment.minimum_healthy_percent,
            s.deployment.maximum_percent,
            deployment.minimum_healthy_percent,
            deployment.maximum_percent
        ));
        patch.insert("deployment".into(), serde_json::to_value(deployment)?);
    }
    if s.stop_timeout_secs != i.stop_timeout_secs {
        words.push(format!(
            "stop timeout {} → {} s",
            s.stop_timeout_secs, i.stop_timeout_secs
        ));
        patch.insert("stop_timeout_secs".into(), i.stop_timeout_secs.into());
    }
    Ok((words, patch))
}
