//! The engine's async paths (the whole-pod executor, re-evaluation, staged decreases, the API's
//! confirmations) read and write cgroupfs and procfs on tokio's blocking threads, never on an
//! async worker: a stuck read then leaves the workers free, and a `timeout` around the work can
//! fire.

use std::sync::Arc;

use tracing::error;

use super::Engine;

/// Runs `f` (blocking I/O) on a blocking thread and waits for it.
pub async fn off_worker<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        // Only a panic in `f` gets here (the runtime outlives the engine's tasks): pass it on.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Runs `f` (blocking work of an NRI handler: cgroupfs and procfs reads, cgroup writes,
/// checkpoint files) on a blocking thread and waits for it; `None`: it panicked (logged as
/// `what`), so a handler answers instead of crashing. The worker stays free meanwhile, and the
/// transport's deadline fires at the handler's `await` (see [`crate::nri::Deadline`]).
pub async fn logged<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => Some(v),
        Err(e) => {
            error!(what, error = %e, "blocking work failed");
            None
        }
    }
}

impl Engine {
    /// Runs `f` (cgroup I/O) on a blocking thread and waits for it.
    pub(super) async fn off_worker<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Engine) -> T + Send + 'static,
    ) -> T {
        let engine = Arc::clone(self);
        off_worker(move || f(&engine)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn blocking_work_leaves_the_worker_free_for_timers() {
        // One worker thread: had the sleep run on it, the work would be done (`Ok`) by the time
        // the timer was polled.
        let slow = logged("test", || {
            std::thread::sleep(std::time::Duration::from_millis(500));
        });
        let out = tokio::time::timeout(std::time::Duration::from_millis(50), slow).await;
        assert!(out.is_err(), "the timeout fired while the work blocked");
    }

    #[tokio::test]
    async fn a_panic_is_none_not_a_crash() {
        let out: Option<()> = logged("test", || panic!("boom")).await;
        assert!(out.is_none());
        assert_eq!(logged("test", || 7).await, Some(7));
    }
}
