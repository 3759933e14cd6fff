//! The engine's async paths (the whole-pod executor) read and write cgroupfs on tokio's
//! blocking threads, never on an async worker.

use std::sync::Arc;

use super::Engine;

impl Engine {
    /// Runs `f` (cgroup I/O) on a blocking thread and waits for it.
    pub(super) async fn off_worker<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Engine) -> T + Send + 'static,
    ) -> T {
        let engine = Arc::clone(self);
        match tokio::task::spawn_blocking(move || f(&engine)).await {
            Ok(v) => v,
            // Only a panic in `f` gets here (the runtime outlives the engine's tasks): pass it on.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}
