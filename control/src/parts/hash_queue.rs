//! The queue password checks wait in (the accounts component's).

use crate::error::ControlError;

/// Password checks (argon2id: about 19 MiB and tens of milliseconds each) run at most
/// this many at once per server, with a bounded queue behind them: a burst of sign-ins
/// gets `Busy` (503) instead of memory and a blocking pool spent on hashing.
#[derive(Debug)]
pub(crate) struct HashQueue {
    running: tokio::sync::Semaphore,
    /// Checks running or waiting.
    queued: std::sync::atomic::AtomicUsize,
    capacity: usize,
}

impl Default for HashQueue {
    fn default() -> Self {
        let running = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(1, 4));
        HashQueue::new(running, 16)
    }
}

impl HashQueue {
    pub(crate) fn new(running: usize, waiting: usize) -> Self {
        HashQueue {
            running: tokio::sync::Semaphore::new(running),
            queued: Default::default(),
            capacity: running + waiting,
        }
    }

    /// Runs `f` (a hash) on the blocking pool when its turn comes; `Busy` at once when
    /// the queue is full.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ControlError> {
        use std::sync::atomic::Ordering::SeqCst;
        if self.queued.fetch_add(1, SeqCst) >= self.capacity {
            self.queued.fetch_sub(1, SeqCst);
            return Err(ControlError::Busy {
                retry_after: 1,
                what: "password checks".into(),
            });
        }
        struct Leave<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let _leave = Leave(&self.queued);
        let _permit = self
            .running
            .acquire()
            .await
            .map_err(|_| ControlError::Busy {
                retry_after: 1,
                what: "password checks".into(),
            })?;
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| ControlError::Conflict(format!("password check failed: {e}")))
    }
}
