//! Work ingestion: what agents' syncs report of their tasks' work, kept until it says
//! something new and written with the next heartbeats.

use super::AgentSync;
use crate::error::ControlError;
use tessera_model::agent::TaskReport;
use tessera_model::service::Task;
use tessera_model::work::WorkNow;

impl AgentSync {
    /// Keeps what a sync reported of its tasks' work, written with the next heartbeats
    /// when it says something new (see [`WorkLatest::offer`]).
    pub(crate) fn record_work(&self, tasks: &[Task], reports: &[TaskReport]) {
        let at = self.core.instant();
        let now = self.core.unix_now();
        let mut latest = self.gateway.work.lock();
        for r in reports {
            let Some(w) = &r.work else { continue };
            if !tasks.iter().any(|t| t.id == r.task_id) {
                continue;
            }
            latest.offer(&r.task_id, WorkNow::of(at, w), now);
        }
    }

    /// Writes the work received since the last flush that says something new.
    pub(crate) async fn flush_work(&self) -> Result<(), ControlError> {
        let work = self.gateway.work.lock().take(self.core.unix_now());
        if work.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.store.set_task_work(&work).await {
            self.gateway.work.lock().put_back(work);
            return Err(e.into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::agents::gateway::{WORK_REFRESH, WorkLatest};
    use tessera_model::work::WorkNow;

    #[test]
    fn work_is_written_when_it_moves_or_grows_old() {
        let w = |c: f64, p99: f64| WorkNow {
            completed_per_sec: Some(c),
            latency_p99_ms: Some(p99),
            ..WorkNow::default()
        };
        let mut l = WorkLatest::default();
        l.offer("t", w(100.0, 50.0), 0);
        assert_eq!(l.take(0).len(), 1, "the first report");
        l.offer("t", w(105.0, 52.0), 1);
        assert!(l.take(1).is_empty(), "within 10 %: not written");
        l.offer("t", w(105.0, 60.0), 2);
        assert_eq!(l.take(2).len(), 1, "p99 moved by 20 %");
        l.offer("t", w(105.0, 60.0), 2 + WORK_REFRESH);
        assert_eq!(l.take(2 + WORK_REFRESH).len(), 1, "refreshed");
        l.offer(
            "t",
            WorkNow {
                unknown: Some("timeout".into()),
                ..WorkNow::default()
            },
            3 + WORK_REFRESH,
        );
        assert_eq!(l.take(3 + WORK_REFRESH).len(), 1, "turned unknown");
    }
}
