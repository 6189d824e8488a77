//! Usage history: what agents measure of each task, gathered into buckets of two widths
//! (by default a minute, kept a day, and an hour, kept a month) and written when a bucket
//! closes. Each server gathers the syncs it receives in memory (`UsageBuffer`) and writes
//! them from its tick; buckets written by two servers (an agent that failed over) are
//! merged by the store.

use super::AgentSync;
use crate::error::ControlError;
use tessera_model::agent::TaskReport;
use tessera_model::service::Task;

pub use crate::config::UsageConfig;
pub(crate) use crate::parts::neighbours_of;

impl AgentSync {
    /// Adds what a sync reported of `tasks` (the host's, as stored) to the usage buffer.
    pub(crate) fn record_reports(&self, tasks: &[Task], reports: &[TaskReport]) {
        let now = self.core.unix_now();
        let widths = self.core.config().usage.widths();
        let mut buffer = self.gateway.usage.lock();
        for r in reports {
            if let Some(t) = tasks.iter().find(|t| t.id == r.task_id) {
                buffer.ingest(now, widths, t, r, &neighbours_of(t, tasks));
            }
        }
    }

    /// Writes the usage buckets that closed (every bucket with `all`, at shutdown). Rows
    /// that could not be written go back to the buffer for the next flush.
    pub async fn flush_usage(&self, all: bool) -> Result<usize, ControlError> {
        let rows = self
            .gateway
            .usage
            .lock()
            .take_closed(self.core.unix_now(), all);
        if rows.is_empty() {
            return Ok(0);
        }
        let n = rows.len();
        if let Err(e) = self.store.record_usage(&rows).await {
            self.gateway.usage.lock().put_back(rows);
            return Err(e.into());
        }
        Ok(n)
    }

    /// Deletes buckets older than their retention.
    pub(crate) async fn prune_usage(&self) -> Result<u64, ControlError> {
        let now = self.core.unix_now();
        let c = &self.core.config().usage;
        let [fine, coarse] = c.widths();
        let mut n = self
            .store
            .prune_usage(fine, now - c.fine_keep.as_secs() as i64)
            .await?;
        n += self
            .store
            .prune_usage(coarse, now - c.coarse_keep.as_secs() as i64)
            .await?;
        Ok(n)
    }
}
