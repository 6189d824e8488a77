//! `tessera apply --wait`: a service's rollout followed until it is steady (exit 0),
//! rolled back (exit 3) or the timeout passes (exit 4).

use crate::{Client, Exit, seg};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};
use tessera_model::api::ServiceDetail;
use tessera_model::service::{DeploymentStatus, TaskDefRef};

/// A progress bar of `done` out of `total`, 20 wide.
fn bar(done: u32, total: u32) -> String {
    let filled = (done.min(total) * 20)
        .checked_div(total)
        .map_or(20, |f| f as usize);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(20 - filled))
}

/// Follows a service until its deployment of `target` runs `desired` tasks with no other
/// deployment left (steady), or is rolled back (exit 3), or the deadline passes (exit 4).
pub(super) async fn wait_for(
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
                eprint!("\r{}\x1b[K", crate::printable(&line));
                let _ = std::io::stderr().flush();
            } else {
                eprintln!("{}", crate::printable(&line));
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
