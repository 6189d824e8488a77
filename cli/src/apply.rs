//! `tessera apply`: files of task definitions and services, compared with the server and
//! made true there. A task definition gets a new revision only when it differs from its
//! family's newest; a service is created, or patched (desired count, revision: a rolling
//! deployment); what cannot change in place is refused before anything is changed.
//! `--wait` follows each rollout until it is steady or rolled back.

use super::{Client, Exit, seg};
use anyhow::{Context, bail};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tessera_model::api::{PreviewResult, ServiceDetail, ServiceInput};
use tessera_model::bodies::RevisionList;
use tessera_model::service::{DeploymentStatus, Service, TaskDefRef, TaskDefinition};
use tessera_model::taskdef::{Secret, TaskDefinitionSpec, parse_task_definition};

pub struct Options {
    pub dry_run: bool,
    pub wait: bool,
    pub timeout: Duration,
    pub update_secrets: bool,
}

/// One document of the files.
enum Doc {
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
fn read_documents(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, Value)>> {
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
fn classify(source: String, value: Value) -> anyhow::Result<Doc> {
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

enum TdAction {
    Create,
    NewRevision { from: u32, changes: Vec<String> },
    Unchanged { revision: u32, secrets_kept: bool },
}

struct TdPlan {
    family: String,
    body: Value,
    action: TdAction,
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

fn is_not_found(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Exit>()
        .is_some_and(|x| x.status == Some(404))
}

fn newest_active(revs: &[TaskDefinition]) -> Option<&TaskDefinition> {
    revs.iter().filter(|r| r.active).max_by_key(|r| r.revision)
}

async fn plan_task_defs(
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
async fn resolve(
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
fn settings_changes(
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

/// A progress bar of `done` out of `total`, 20 wide.
fn bar(done: u32, total: u32) -> String {
    let filled = (done.min(total) * 20)
        .checked_div(total)
        .map_or(20, |f| f as usize);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(20 - filled))
}

/// Follows a service until its deployment of `target` runs `desired` tasks with no other
/// deployment left (steady), or is rolled back (exit 3), or the deadline passes (exit 4).
async fn wait_for(
    c: &Client,
    name: &str,
    target: &TaskDefRef,
    desired: u32,
    deadline: Instant,
) -> anyhow::Result<()> {
    let tty = std::io::stderr().is_terminal();
    let mut last = String::new();
    loop {
        let s: ServiceDetail = c.get(&format!("/api/v1/services/{}", seg(name))).await?;
        let mine = s.deployments.iter().find(|d| d.task_definition == *target);
        if mine.is_some_and(|d| d.status == DeploymentStatus::RolledBack)
            || (s.service.task_definition != *target
                && s.deployments
                    .iter()
                    .any(|d| d.status == DeploymentStatus::RolledBack))
        {
            if tty {
                eprintln!();
            }
            let why = s
                .events
                .iter()
                .find(|e| e.message.contains("rolled back") || e.message.contains("roll"))
                .map(|e| format!(": {}", e.message))
                .unwrap_or_default();
            return Err(Exit::new(
                3,
                format!(
                    "service {name}: {target} was rolled back to {}{why}",
                    s.service.task_definition
                ),
            )
            .into());
        }
        let running = mine.map_or(0, |d| d.running);
        let others = s
            .deployments
            .iter()
            .filter(|d| d.task_definition != *target && d.status == DeploymentStatus::Active)
            .map(|d| d.running)
            .sum::<u32>();
        let steady = mine.is_some_and(|d| d.status == DeploymentStatus::Primary && d.pending == 0)
            && running == desired
            && others == 0;
        let line = format!(
            "service {name} {} {running}/{desired} running {target}{}",
            bar(running, desired),
            if others > 0 {
                format!(", {others} old still running")
            } else {
                String::new()
            }
        );
        if line != last {
            if tty {
                eprint!("\r{line}\x1b[K");
                let _ = std::io::stderr().flush();
            } else {
                eprintln!("{line}");
            }
            last = line;
        }
        if steady {
            if tty {
                eprintln!();
            }
            say!("service {name}: steady, {desired} tasks of {target} running");
            return Ok(());
        }
        if Instant::now() >= deadline {
            if tty {
                eprintln!();
            }
            let message = format!(
                "service {name}: not steady before the timeout ({running}/{desired} running of {target})"
            );
            return Err(Exit::new(4, message).into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `tessera preview -f FILE`: each service of the file as the server would place it now.
pub async fn preview(c: &Client, path: &Path, count: Option<u32>) -> anyhow::Result<()> {
    let docs: Vec<Doc> = read_documents(&[path.to_path_buf()])?
        .into_iter()
        .map(|(source, v)| classify(source, v))
        .collect::<anyhow::Result<_>>()?;
    let mut any = false;
    for d in &docs {
        let Doc::Service { input, .. } = d else {
            continue;
        };
        any = true;
        let (resolved, _) = resolve(c, &input.task_definition, &[]).await?;
        let def = resolved.context("a registered task definition")?;
        let body = serde_json::json!({
            "task_definition": def.to_string(),
            "pool": input.pool,
            "count": count.unwrap_or(input.desired_count).max(1),
            "strategy": input.strategy,
            "constraints": input.constraints,
        });
        let r: PreviewResult = c
            .send(
                reqwest::Method::POST,
                "/api/v1/placement-preview",
                Some(&body),
            )
            .await?;
        say!(
            "service {}: {} of {} tasks of {} would be placed in pool {} ({} policy)",
            input.name,
            r.placed,
            r.placed + r.unplaced,
            r.task_definition,
            r.pool,
            r.policy
        );
        say!(
            "  GPUs in use {} → {}, tasks per GPU in use {:.2} → {:.2}, GPU memory allocated {:.1}% → {:.1}%",
            r.density_before.gpus_in_use,
            r.density_after.gpus_in_use,
            r.density_before.tasks_per_gpu_in_use,
            r.density_after.tasks_per_gpu_in_use,
            r.density_before.memory_allocated_pct,
            r.density_after.memory_allocated_pct
        );
        let mut t = super::table::Table::new(&["TASK", "HOST", "GPUS", "WHY NOT"]);
        for task in &r.tasks {
            t.row(vec![
                task.index.to_string(),
                task.host
                    .as_ref()
                    .map_or_else(|| "-".into(), ToString::to_string),
                task.gpus
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                task.message.clone().unwrap_or_default(),
            ]);
        }
        t.print();
        if r.unplaced > 0 {
            return Err(Exit::new(2, format!("{} task(s) would not be placed", r.unplaced)).into());
        }
    }
    if !any {
        bail!("{}: no service in the file to preview", path.display());
    }
    Ok(())
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
