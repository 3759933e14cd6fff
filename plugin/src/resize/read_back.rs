//! Read-backs that follow an answer instead of delaying it. `PostStartContainer` and
//! `PostUpdateContainer` are calls the runtime waits on inside kubelet's CRI call; reading the
//! container's cgroup back (a blocking cgroupfs read and a hop to a blocking thread) would add
//! to that call's latency. So the handler answers first and the read runs here, owned:
//!
//! - every read-back is tracked, and [`ReadBacks::settle`] waits for them (bounded) at shutdown;
//! - per container, the latest one is kept, and [`ReadBacks::finish`] waits for it before the
//!   container's `StopContainer` or `RemoveContainer` goes on, so a read-back always sees the
//!   cgroup it was started for (a stop right after an update still gets its confirmation).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;
use tracing::warn;

use super::off_worker::logged as off_worker;

use crate::sync::Locked as _;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct ReadBacks {
    tasks: TaskTracker,
    latest: Mutex<HashMap<String, JoinHandle<Option<()>>>>,
}

impl ReadBacks {
    /// Runs `read` for container `id` on a blocking thread, without waiting for it.
    pub(crate) fn start(&self, what: &'static str, id: &str, read: impl FnOnce() + Send + 'static) {
        let handle = self.tasks.spawn(off_worker(what, read));
        let mut latest = self.latest.locked();
        // Finished ones of containers that went without a RemoveContainer (a reconnect).
        latest.retain(|_, h| !h.is_finished());
        latest.insert(id.to_owned(), handle);
    }

    /// Runs `follow` (a read-back that waits between its reads, on the async workers; its reads
    /// go off them) for `id`, without waiting for it. Owned like [`Self::start`]: abandoned at
    /// shutdown after [`Self::settle`]'s bound, and a later one for the same `id` replaces it.
    pub(crate) fn start_async(
        &self,
        id: &str,
        follow: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let handle = self.tasks.spawn(async move {
            follow.await;
            Some(())
        });
        let mut latest = self.latest.locked();
        latest.retain(|_, h| !h.is_finished());
        if let Some(old) = latest.insert(id.to_owned(), handle) {
            // An older request's follow-up: the newer one reads for it.
            old.abort();
        }
    }

    /// Waits for container `id`'s latest read-back, if one is running. Cancellable: the
    /// caller's deadline bounds the wait.
    pub(crate) async fn finish(&self, id: &str) {
        let handle = self.latest.locked().remove(id);
        if let Some(h) = handle {
            let _ = h.await;
        }
    }

    /// Waits, at most `within`, for every read-back; what is left is abandoned (reads only:
    /// nothing is half-written).
    pub(crate) async fn settle(&self, within: Duration) {
        self.tasks.close();
        if tokio::time::timeout(within, self.tasks.wait())
            .await
            .is_err()
        {
            warn!(
                left = self.tasks.len(),
                "cgroup read-backs still running at shutdown; abandoned"
            );
        }
    }

    #[cfg(test)]
    fn running(&self) -> usize {
        self.tasks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn finish_waits_for_the_containers_read_back() {
        let rb = ReadBacks::default();
        let done = Arc::new(AtomicBool::new(false));
        let d = Arc::clone(&done);
        rb.start("test", "c1", move || {
            std::thread::sleep(Duration::from_millis(100));
            d.store(true, Ordering::SeqCst);
        });
        assert!(!done.load(Ordering::SeqCst), "start does not wait");
        rb.finish("c1").await;
        assert!(done.load(Ordering::SeqCst), "finish waited for it");
        rb.finish("c1").await; // nothing left: returns at once
    }

    #[tokio::test]
    async fn settle_waits_bounded_and_gives_up_on_a_stuck_read() {
        let rb = ReadBacks::default();
        rb.start("test", "c1", || {
            std::thread::sleep(Duration::from_millis(20));
        });
        rb.start("test", "c2", || std::thread::sleep(Duration::from_secs(3)));
        let t = std::time::Instant::now();
        rb.settle(Duration::from_millis(300)).await;
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "bounded: {:?}",
            t.elapsed()
        );
        assert_eq!(
            rb.running(),
            1,
            "the quick one finished, the stuck one is abandoned"
        );
    }
}
