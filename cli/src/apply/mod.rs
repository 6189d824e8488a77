//! `tessera apply`: files of task definitions and services, compared with the server and
//! made true there. A task definition gets a new revision only when it differs from its
//! family's newest; a service is created, or patched (desired count, revision: a rolling
//! deployment); what cannot change in place is refused before anything is changed.
//! `--wait` follows each rollout until it is steady or rolled back.

mod documents;
mod plan;
mod preview;
mod rollout;

pub use preview::preview;

use super::{Client, Exit, seg};
use anyhow::{Context, bail};
use documents::{Doc, classify, read_documents};
use plan::{TdAction, is_not_found, plan_task_defs, resolve, settings_changes};
use rollout::wait_for;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tessera_model::api::{ServiceDetail, ServiceInput};
use tessera_model::service::{TaskDefRef, TaskDefinition};

pub struct Options {
    pub dry_run: bool,
    pub wait: bool,
    pub timeout: Duration,
    pub update_secrets: bool,
}

enum SvcAction {
    Create,
    Update {
        from_count: u32,
        from_def: TaskDefRef,
        /// Settings that change in place, in words, and as the patch sends them.
        settings: Vec<String>,
        patch: Map<String, Value>,
    },
    Unchanged,
}

struct SvcPlan {
    input: ServiceInput,
    /// Only a family: its revision this apply leaves newest.
    family_only: bool,
    action: SvcAction,
}

pub async fn apply(c: &Client, paths: &[PathBuf], opts: Options) -> anyhow::Result<()> {
    let docs: Vec<Doc> = read_documents(paths)?
        .into_iter()
        .map(|(source, v)| classify(source, v))
        .collect::<anyhow::Result<_>>()?;
    let tds = plan_task_defs(c, &docs, opts.update_secrets).await?;
    let mut svcs: Vec<SvcPlan> = Vec::new();
    let mut refused = Vec::new();
    for d in &docs {
        let Doc::Service { source, input } = d else {
            continue;
        };
        if svcs.iter().any(|p| p.input.name == input.name) {
            bail!("{source}: service {} is given twice", input.name);
        }
        let (resolved, family_only) = resolve(c, &input.task_definition, &tds).await?;
        let family = input
            .task_definition
            .split(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        let changes_def = tds
            .iter()
            .any(|p| p.family == family && !matches!(p.action, TdAction::Unchanged { .. }));
        let action = match c
            .get::<ServiceDetail>(&format!("/api/v1/services/{}", seg(&input.name)))
            .await
        {
            Ok(current) => {
                if current.service.pool.as_str() != input.pool {
                    refused.push(format!(
                        "service {}: its pool cannot change in place ({} → {}); delete the service (`DELETE /api/v1/services/{}`) and apply again",
                        input.name, current.service.pool, input.pool, input.name
                    ));
                }
                let (settings, patch) = settings_changes(&current.service, input)?;
                let def_differs = match &resolved {
                    Some(r) => *r != current.service.task_definition,
                    None => family_only && changes_def,
                };
                if def_differs
                    || current.service.desired_count != input.desired_count
                    || !settings.is_empty()
                {
                    SvcAction::Update {
                        from_count: current.service.desired_count,
                        from_def: current.service.task_definition.clone(),
                        settings,
                        patch,
                    }
                } else {
                    SvcAction::Unchanged
                }
            }
            Err(e) if is_not_found(&e) => SvcAction::Create,
            Err(e) => return Err(e),
        };
        let mut input = input.clone();
        if let Some(r) = &resolved {
            input.task_definition = r.to_string();
        }
        svcs.push(SvcPlan {
            input,
            family_only,
            action,
        });
    }
    // The plan.
    let mut changes = 0;
    for p in &tds {
        match &p.action {
            TdAction::Create => {
                changes += 1;
                say!("+ task definition {}: new family (revision 1)", p.family);
            }
            TdAction::NewRevision {
                from,
                changes: what,
            } => {
                changes += 1;
                say!(
                    "~ task definition {}: new revision after {}:{from}; changed: {}",
                    p.family,
                    p.family,
                    what.join(", ")
                );
            }
            TdAction::Unchanged {
                revision,
                secrets_kept,
            } => {
                let note = if *secrets_kept {
                    " (secret values are write-only and kept as the server has them; --update-secrets registers the file's)"
                } else {
                    ""
                };
                say!("= task definition {}:{revision}: unchanged{note}", p.family);
            }
        }
    }
    for p in &svcs {
        let def = if p.input.task_definition.contains(':') {
            p.input.task_definition.clone()
        } else {
            format!("{} (its new revision)", p.input.task_definition)
        };
        match &p.action {
            SvcAction::Create => {
                changes += 1;
                say!(
                    "+ service {}: create, {} tasks of {def} in pool {}",
                    p.input.name,
                    p.input.desired_count,
                    p.input.pool
                );
            }
            SvcAction::Update {
                from_count,
                from_def,
                settings,
                ..
            } => {
                changes += 1;
                let mut what = Vec::new();
                if *from_count != p.input.desired_count {
                    what.push(format!(
                        "desired count {from_count} → {}",
                        p.input.desired_count
                    ));
                }
                if from_def.to_string() != p.input.task_definition {
                    what.push(format!(
                        "task definition {from_def} → {def} (rolling deployment)"
                    ));
                }
                what.extend(settings.iter().cloned());
                say!("~ service {}: {}", p.input.name, what.join(", "));
            }
            SvcAction::Unchanged => say!("= service {}: unchanged", p.input.name),
        }
    }
    if !refused.is_empty() {
        return Err(Exit::new(1, refused.join("\n")).into());
    }
    if changes == 0 {
        say!("nothing to change");
        return Ok(());
    }
    if opts.dry_run {
        say!("dry run: nothing changed ({changes} change(s) planned)");
        return Ok(());
    }
    // Task definitions first: the services name their revisions.
    let mut registered: BTreeMap<String, TaskDefRef> = BTreeMap::new();
    for p in &tds {
        if matches!(p.action, TdAction::Unchanged { .. }) {
            continue;
        }
        let made: TaskDefinition = c
            .send(
                reqwest::Method::POST,
                "/api/v1/task-definitions",
                Some(&p.body),
            )
            .await
            .with_context(|| format!("registering task definition {}", p.family))?;
        say!("registered {}:{}", made.family, made.revision);
        registered.insert(
            made.family.clone(),
            TaskDefRef {
                family: made.family,
                revision: made.revision,
            },
        );
    }
    let mut follow: Vec<(String, TaskDefRef, u32)> = Vec::new();
    for p in &mut svcs {
        let family = p
            .input
            .task_definition
            .split(':')
            .next()
            .unwrap_or_default()
            .to_owned();
        if p.family_only
            && let Some(r) = registered.get(&family)
        {
            p.input.task_definition = r.to_string();
        }
        let target: TaskDefRef = p.input.task_definition.parse().with_context(|| {
            format!(
                "service {}: task definition {}",
                p.input.name, p.input.task_definition
            )
        })?;
        match &p.action {
            SvcAction::Create => {
                let _: Value = c
                    .send(
                        reqwest::Method::POST,
                        "/api/v1/services",
                        Some(&serde_json::to_value(&p.input)?),
                    )
                    .await
                    .with_context(|| format!("creating service {}", p.input.name))?;
                say!("created service {}", p.input.name);
            }
            SvcAction::Update { patch, .. } => {
                let mut patch = patch.clone();
                patch.insert("desired_count".into(), p.input.desired_count.into());
                patch.insert(
                    "task_definition".into(),
                    p.input.task_definition.clone().into(),
                );
                let _: Value = c
                    .send(
                        reqwest::Method::PATCH,
                        &format!("/api/v1/services/{}", seg(&p.input.name)),
                        Some(&Value::Object(patch)),
                    )
                    .await
                    .with_context(|| format!("updating service {}", p.input.name))?;
                say!("updated service {}", p.input.name);
            }
            SvcAction::Unchanged => continue,
        }
        follow.push((p.input.name.clone(), target, p.input.desired_count));
    }
    if !opts.wait {
        return Ok(());
    }
    let deadline = Instant::now() + opts.timeout;
    for (name, target, desired) in follow {
        wait_for(c, &name, &target, desired, deadline).await?;
    }
    Ok(())
}
