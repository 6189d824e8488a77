//! One container under the engine and the background task that drives it: pulled,
//! created, started, its output copied to capped logs, waited for, and removed.

use super::{Engine, Launch, Phase, docker_name, reason};
use crate::runtime::CappedLog;
use bollard::container::LogOutput;
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, KillContainerOptions, LogsOptions,
    StopContainerOptions, WaitContainerOptions,
};
use futures_util::StreamExt;
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

/// One container under the engine, and the task that drives it.
pub struct Boxed {
    pub name: String,
    docker_name: String,
    engine: Engine,
    phase: Arc<Mutex<Phase>>,
    driver: JoinHandle<()>,
    /// The engine said the kernel killed it at its memory limit (`State.OOMKilled`).
    oom_killed: Arc<AtomicBool>,
}

/// What a container's driver tells its holder: its phase, and whether the engine said the
/// kernel killed it at its memory limit.
type Told = (Arc<Mutex<Phase>>, Arc<AtomicBool>);

/// Where a container's output goes.
#[derive(Debug, Clone)]
pub struct LogFiles {
    pub out: PathBuf,
    pub err: PathBuf,
    pub cap: u64,
    /// The group the files belong to (its task's own gid), besides the agent.
    pub group: Option<u32>,
}

impl Boxed {
    /// Pulls, creates and starts the container, in the background.
    pub fn launch(engine: &Engine, launch: Launch, logs: LogFiles) -> Boxed {
        let docker_name = docker_name(&launch.mark, &launch.task_id, &launch.name);
        let phase = Arc::new(Mutex::new(Phase::Pulling(launch.image.clone())));
        let oom_killed = Arc::new(AtomicBool::new(false));
        let driver = tokio::spawn(drive(
            engine.clone(),
            docker_name.clone(),
            launch.clone(),
            (phase.clone(), oom_killed.clone()),
            logs,
        ));
        Boxed {
            name: launch.name,
            docker_name,
            engine: engine.clone(),
            phase,
            driver,
            oom_killed,
        }
    }

    /// Takes over a container a previous run of the agent started. Its state is read
    /// before this returns, so the agent's first report after a restart already says it
    /// runs (a task left out of a report would be taken for lost).
    pub async fn adopt(
        engine: &Engine,
        name: String,
        docker_name: String,
        logs: LogFiles,
    ) -> Boxed {
        let first = engine.phase_of(&docker_name).await;
        let phase = Arc::new(Mutex::new(first.clone()));
        let oom_killed = Arc::new(AtomicBool::new(false));
        let driver = tokio::spawn(watch(
            engine.clone(),
            docker_name.clone(),
            (phase.clone(), oom_killed.clone()),
            logs,
            true,
            first,
        ));
        Boxed {
            name,
            docker_name,
            engine: engine.clone(),
            phase,
            driver,
            oom_killed,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase.lock().clone()
    }

    /// The engine and the container's name there, for reading Docker's health verdict.
    pub fn probe_target(&self) -> (Engine, String) {
        (self.engine.clone(), self.docker_name.clone())
    }

    /// Whether the engine said the kernel killed it at its memory limit (known once it
    /// has exited).
    pub fn oom_killed(&self) -> bool {
        self.oom_killed.load(Ordering::Relaxed)
    }

    /// Asks it to stop: the engine sends SIGTERM, then SIGKILL after `timeout`. One that
    /// has not started yet is abandoned and removed.
    pub fn stop(&self, timeout: Duration) {
        let engine = self.engine.clone();
        let name = self.docker_name.clone();
        match self.phase() {
            Phase::Pulling(_) | Phase::Starting => {
                self.driver.abort();
                *self.phase.lock() = Phase::Exited(None);
                tokio::spawn(async move { engine.remove(&name).await });
            }
            Phase::Running(_) => {
                let t = i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX);
                tokio::spawn(async move {
                    let stopped = engine
                        .docker
                        .stop_container(
                            &name,
                            Some(StopContainerOptions {
                                t: Some(t),
                                signal: None,
                            }),
                        )
                        .await;
                    if let Err(e) = stopped {
                        tracing::warn!(container = %name, error = %reason(&e), "cannot stop a container");
                    }
                });
            }
            Phase::Exited(_) | Phase::Failed(_) => {}
        }
    }

    /// Kills it now (the stop timeout has passed).
    pub fn kill(&self) {
        if !matches!(self.phase(), Phase::Running(_)) {
            return;
        }
        let engine = self.engine.clone();
        let name = self.docker_name.clone();
        tokio::spawn(async move {
            let _ = engine
                .docker
                .kill_container(
                    &name,
                    Some(KillContainerOptions {
                        signal: "SIGKILL".into(),
                    }),
                )
                .await;
        });
    }
}

fn set(phase: &Mutex<Phase>, to: Phase) {
    *phase.lock() = to;
}

/// Pull, create, start, then watch until it ends.
async fn drive(engine: Engine, docker_name: String, launch: Launch, told: Told, logs: LogFiles) {
    let phase = &told.0;
    if let Err(why) = engine.pull(&launch.image).await {
        // A registry that cannot be reached does not stop an image already here.
        if engine.docker.inspect_image(&launch.image).await.is_err() {
            tracing::warn!(task = %launch.task_id, image = %launch.image, error = %why, "image pull failed");
            set(
                phase,
                Phase::Failed(format!("pulling {}: {why}", launch.image)),
            );
            return;
        }
        tracing::warn!(image = %launch.image, error = %why, "pull failed; using the image already on this host");
    }
    set(phase, Phase::Starting);
    // A container of this name is a leftover of this very task that was never started
    // (what runs is adopted, never launched again): it goes.
    engine.remove(&docker_name).await;
    let created = engine
        .docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(docker_name.clone()),
                ..Default::default()
            }),
            launch.body(),
        )
        .await;
    if let Err(e) = created {
        set(
            phase,
            Phase::Failed(format!("creating the container: {}", reason(&e))),
        );
        return;
    }
    if let Err(e) = engine.docker.start_container(&docker_name, None).await {
        engine.remove(&docker_name).await;
        set(
            phase,
            Phase::Failed(format!("starting the container: {}", reason(&e))),
        );
        return;
    }
    tracing::info!(task = %launch.task_id, container = %launch.name, image = %launch.image, "container started");
    let first = engine.phase_of(&docker_name).await;
    watch(engine, docker_name, told, logs, false, first).await;
}

/// Follows a started container from its phase `first` (read just before): its logs, its
/// main process, its end; then removes it.
async fn watch(
    engine: Engine,
    docker_name: String,
    (phase, oom_killed): Told,
    logs: LogFiles,
    adopted: bool,
    first: Phase,
) {
    if let Phase::Exited(code) = first {
        // It ended already (while no agent watched, or at once): its code is what the
        // engine kept.
        oom_killed.store(engine.oom_killed(&docker_name).await, Ordering::Relaxed);
        engine.remove(&docker_name).await;
        set(&phase, Phase::Exited(code));
        return;
    }
    set(&phase, first);
    // After an agent restart, only what is new: the earlier output is in the files.
    let since = if adopted {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i32::try_from(d.as_secs()).unwrap_or(0))
    } else {
        0
    };
    let copier = tokio::spawn(copy_logs(engine.clone(), docker_name.clone(), logs, since));
    let mut wait = engine
        .docker
        .wait_container(&docker_name, None::<WaitContainerOptions>);
    let code = match wait.next().await {
        Some(Ok(r)) => i32::try_from(r.status_code).ok(),
        Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
            i32::try_from(code).ok()
        }
        _ => engine
            .docker
            .inspect_container(&docker_name, None::<InspectContainerOptions>)
            .await
            .ok()
            .and_then(|i| i.state?.exit_code)
            .and_then(|c| i32::try_from(c).ok()),
    };
    // The output is complete once the container has ended; then it goes.
    let _ = tokio::time::timeout(Duration::from_secs(5), copier).await;
    oom_killed.store(engine.oom_killed(&docker_name).await, Ordering::Relaxed);
    engine.remove(&docker_name).await;
    set(&phase, Phase::Exited(code));
}

async fn copy_logs(engine: Engine, docker_name: String, files: LogFiles, since: i32) {
    let mut out = CappedLog::new(files.out, files.cap).group(files.group);
    let mut err = CappedLog::new(files.err, files.cap).group(files.group);
    let mut stream = engine.docker.logs(
        &docker_name,
        Some(LogsOptions {
            follow: true,
            stdout: true,
            stderr: true,
            since,
            ..Default::default()
        }),
    );
    while let Some(item) = stream.next().await {
        let written = match item {
            Ok(LogOutput::StdErr { message }) => err.write(&message).await,
            Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                out.write(&message).await
            }
            Ok(LogOutput::StdIn { .. }) => Ok(()),
            Err(_) => break,
        };
        if written.is_err() {
            break;
        }
    }
    out.flush().await;
    err.flush().await;
}
