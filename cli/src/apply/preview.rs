//! `tessera preview -f FILE`: where a file's services would be placed now, and what would
//! not fit (nothing is committed).

use crate::apply::documents::{Doc, classify, read_documents};
use crate::apply::plan::resolve;
use crate::{Client, Exit};
use anyhow::{Context, bail};
use std::path::Path;
use tessera_model::api::{PreviewInput, PreviewResult};

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
        let body = serde_json::to_value(PreviewInput {
            task_definition: def.to_string(),
            pool: input.pool.clone(),
            count: count.unwrap_or(input.desired_count).max(1),
            strategy: input.strategy.clone(),
            constraints: input.constraints.clone(),
        })?;
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
        let mut t = crate::table::Table::new(&["TASK", "HOST", "GPUS", "WHY NOT"]);
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
