//! `TaskStreams`: a task's logs and commands run in it, for clients, through the relay
//! ([`relay`]) to the task's host's agent. Which task, on which host, whether the host
//! can be reached (a lost host's task answers with the last lines its agent sent when it
//! stopped, and why), and whether its pool lets anyone run commands in it.

pub mod relay;

use crate::error::ControlError;
use crate::store::StreamsStore;
use std::sync::Arc;
use tessera_model::HostStatus;
use tessera_model::agent::streams::{ExecRequest, LogRequest, StreamKind};
use tessera_model::error::{FieldError, ValidationErrors};
use tessera_model::service::TaskState;

pub use relay::{Gone, Input, Opened, Piece, Streams};

/// What a request for a task's logs gets.
pub enum LogsAnswer {
    /// The host's agent reads them (once it picks the order up).
    Live {
        opened: Opened,
        /// The task's host.
        host: String,
    },
    /// The host cannot be asked: the last lines its agent sent when the task stopped (if
    /// any), and why that is all.
    Stored { text: Option<String>, why: String },
}

/// Logs and exec of tasks (cheap to clone: clones share the relay).
#[derive(Clone)]
pub struct TaskStreams {
    store: Arc<dyn StreamsStore>,
    relay: Streams,
}

fn invalid(e: FieldError) -> ControlError {
    ControlError::Invalid(ValidationErrors { errors: vec![e] })
}

impl TaskStreams {
    pub(crate) fn new(store: Arc<dyn StreamsStore>) -> TaskStreams {
        TaskStreams {
            store,
            relay: Streams::default(),
        }
    }

    pub(crate) fn with_store(&self, store: Arc<dyn StreamsStore>) -> TaskStreams {
        TaskStreams {
            store,
            relay: self.relay.clone(),
        }
    }

    /// The relay, as agents reach it.
    pub fn relay(&self) -> &Streams {
        &self.relay
    }

    /// The project of task `id`'s service: where reading its logs or running a command
    /// in it is checked.
    pub async fn project_of_task(&self, id: &str) -> Result<String, ControlError> {
        let task = self.task(id).await?;
        Ok(self.store.get_service(&task.service).await?.project)
    }

    async fn task(&self, id: &str) -> Result<tessera_model::service::Task, ControlError> {
        match self.store.get_task(id).await {
            Ok(t) => Ok(t),
            Err(crate::StoreError::NotFound { .. }) => {
                Err(ControlError::NotFound(format!("no task {id}")))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Task `id`'s logs as `request` asks (see [`LogsAnswer`]).
    pub async fn logs(&self, id: &str, request: LogRequest) -> Result<LogsAnswer, ControlError> {
        request.check().map_err(invalid)?;
        let task = self.task(id).await?;
        let stored = |why: String| async move {
            Ok(LogsAnswer::Stored {
                text: self.store.task_last_output(id).await?,
                why,
            })
        };
        let Some(host) = task.host.clone() else {
            let why = match task.state {
                TaskState::Pending => format!("task {id} has not been placed on a host yet"),
                _ => format!("task {id} has no host"),
            };
            return stored(why).await;
        };
        let info = match self.store.get_host(&host).await {
            Ok(info) => info,
            Err(crate::StoreError::NotFound { .. }) => {
                return stored(format!(
                    "host {host} was removed; these are the last lines its agent sent when task {id} stopped"
                ))
                .await;
            }
            Err(e) => return Err(e.into()),
        };
        if info.status == HostStatus::Lost {
            return stored(format!(
                "host {host} cannot be reached (lost: its agent stopped syncing); these are the last lines its agent sent when task {id} stopped"
            ))
            .await;
        }
        let opened = self.relay.open(&host, id, StreamKind::Logs(request))?;
        Ok(LogsAnswer::Live {
            opened,
            host: host.to_string(),
        })
    }

    /// The last lines stored for task `id` (a fallback when its agent cannot give more).
    pub async fn stored_lines(&self, id: &str) -> Result<Option<String>, ControlError> {
        Ok(self.store.task_last_output(id).await?)
    }

    /// Runs `request`'s command in task `id`: refused unless the task runs, on a host
    /// that can be reached, in a pool that allows exec.
    pub async fn exec(&self, id: &str, request: ExecRequest) -> Result<Opened, ControlError> {
        request.check().map_err(invalid)?;
        let task = self.task(id).await?;
        let pool = self.store.get_pool(&task.pool).await?;
        if !pool.exec {
            return Err(ControlError::Conflict(format!(
                "pool {} does not allow commands in its tasks (an admin sets the pool setting exec)",
                task.pool
            )));
        }
        let (Some(host), TaskState::Running) = (task.host.clone(), task.state) else {
            return Err(ControlError::Conflict(format!(
                "task {id} is {}, not running: commands run in running tasks only",
                task.state
            )));
        };
        let info = self.store.get_host(&host).await?;
        if info.status == HostStatus::Lost {
            return Err(ControlError::Conflict(format!(
                "host {host} cannot be reached (lost: its agent stopped syncing)"
            )));
        }
        self.relay.open(&host, id, StreamKind::Exec(request))
    }
}
