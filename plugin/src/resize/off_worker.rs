//! The engine's async paths (the whole-pod executor, re-evaluation, staged decreases, the API's
//! confirmations) read and write cgroupfs and procfs on tokio's blocking threads, never on an
//! async worker: a stuck read then leaves the workers free, and a `timeout` around the work can
//! fire.

use std::sync::Arc;

use super::Engine;

/// Runs `f` (blocking I/O) on a blocking thread and waits for it.
pub async fn off_worker<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => v,
        // Only a panic in `f` gets here (the runtime outlives the engine's tasks): pass it on.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
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
