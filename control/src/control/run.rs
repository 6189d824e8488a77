//! The reconcile loop: each tick announces this server, takes or renews the scheduler
//! lease and, holding it, runs a pass as a task of its own.

use crate::control::Control;
use crate::error::ControlError;

/// Runs `pass` as a task of its own and says how it ended: a failure or a panic is
/// returned as text, never propagated, so the loop that calls it goes on.
pub(crate) async fn supervised<F>(pass: F) -> Result<(), String>
where
    F: std::future::Future<Output = Result<(), ControlError>> + Send + 'static,
{
    match tokio::spawn(pass).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) if e.is_panic() => {
            let panic = e.into_panic();
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!("panicked: {why}"))
        }
        Err(e) => Err(format!("cancelled: {e}")),
    }
}

impl Control {
    /// Runs until `shutdown` resolves: every tick (and on every wake-up) this server
    /// announces itself, writes the times of the quiet syncs it received, brings its fleet
    /// read model up to date (once it has readers), and takes or renews the scheduler
    /// lease; the server holding it runs a reconcile pass whose writes
    /// carry the lease's epoch (see [`super::cluster`]). Each pass runs as its own task, so
    /// a pass that fails or panics is logged and the next one runs as usual: scheduling
    /// never stops silently.
    pub async fn run(&self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let relay = self.relay_changes().await;
        // Notices go out while this server holds the lease, beside the passes.
        let (stop_deliveries, stopped) = tokio::sync::watch::channel(false);
        let deliveries = {
            let n = self.notifications.clone();
            tokio::spawn(async move { n.run(stopped).await })
        };
        loop {
            if let Err(why) = self.tick().await {
                tracing::error!(error = %why, "reconcile pass failed; the next pass runs as usual");
            }
            // The fleet read model, once someone reads it, is brought up to date here too,
            // so its readers seldom wait for the measured figures' periodic reading.
            if self.views.fleet_read()
                && let Err(e) = self.views.fleet().await
            {
                tracing::warn!(error = %e, "reading the fleet's changes failed");
            }
            tokio::select! {
                _ = &mut shutdown => break,
                _ = self.core.woken() => {}
                _ = tokio::time::sleep(self.core.config().tick) => {}
            }
        }
        if let Err(e) = self.agents().flush_heartbeats().await {
            tracing::error!(error = %e, "writing the last syncs' times failed");
        }
        if let Err(e) = self.agents().flush_usage(true).await {
            tracing::error!(error = %e, "writing the last usage buckets failed");
        }
        let _ = stop_deliveries.send(true);
        let _ = deliveries.await;
        self.let_go_of_lease().await;
        for task in relay {
            task.abort();
        }
        self.core.membership().set_relayed(false);
        tracing::info!("reconcile loop stopped");
    }

    /// One turn of [`Control::run`]: announce this server, write the quiet syncs' times,
    /// take or renew the scheduler lease and, holding it, run a reconcile pass whose writes
    /// carry its epoch. Whether this server scheduled; the pass's failure or panic as text.
    pub async fn tick(&self) -> Result<bool, String> {
        // A tick that comes late (the last one waited on a database that was down, or the
        // process was paused) says this server could not judge hosts' silence meanwhile.
        let began = std::time::Instant::now();
        let previous = self.core.membership().tick_began(began);
        let late = (self.core.lost_timeout() / 2).max(super::SLOW_STORE);
        if previous.is_some_and(|p| began.duration_since(p) > self.core.config().tick + late) {
            tracing::warn!(
                "this server's last tick took too long; hosts get a lost timeout to sync again"
            );
            self.core.membership().fell_behind(self.core.now());
        }
        match self.tick_cluster().await {
            Some(fenced) => {
                let started = std::time::Instant::now();
                let pass = supervised(async move { fenced.reconcile_once().await }).await;
                metrics::histogram!("tessera_reconcile_pass_seconds")
                    .record(started.elapsed().as_secs_f64());
                pass.map(|()| true)
            }
            None => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pass_that_panics_or_fails_is_reported_and_the_caller_goes_on() {
        let panicked = supervised(async { panic!("boom in a pass") }).await;
        assert_eq!(panicked, Err("panicked: boom in a pass".to_owned()));
        let failed = supervised(async { Err(ControlError::Conflict("busy".into())) }).await;
        assert_eq!(failed, Err("busy".to_owned()));
        assert_eq!(supervised(async { Ok(()) }).await, Ok(()));
    }
}
