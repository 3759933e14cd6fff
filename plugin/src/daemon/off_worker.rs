//! Blocking work of the NRI handlers (cgroupfs and procfs reads, cgroup writes, checkpoint
//! files) runs on tokio's blocking threads, never on an async worker: a stuck read then leaves
//! the workers free, and the transport's deadline fires at the handler's `await` and answers
//! fail-open (see [`crate::nri::Deadline`]).

use tracing::error;

/// Runs `f` on a blocking thread and waits for it. `None`: it panicked (logged).
pub(super) async fn off_worker<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => Some(v),
        Err(e) => {
            error!(what, error = %e, "handler work failed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn blocking_work_leaves_the_worker_free_for_timers() {
        // One worker thread: had the sleep run on it, the work would be done (`Ok`) by the time
        // the timer was polled.
        let slow = off_worker("test", || {
            std::thread::sleep(std::time::Duration::from_millis(500));
        });
        let out = tokio::time::timeout(std::time::Duration::from_millis(50), slow).await;
        assert!(out.is_err(), "the timeout fired while the work blocked");
    }

    #[tokio::test]
    async fn a_panic_is_none_not_a_crash() {
        let out: Option<()> = off_worker("test", || panic!("boom")).await;
        assert!(out.is_none());
        assert_eq!(off_worker("test", || 7).await, Some(7));
    }
}
