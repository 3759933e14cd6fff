//! The plugin's own `UpdateContainers` kept apart from the runtime's container updates.
//!
//! containerd before NRI v0.12.1 can deadlock when a plugin's `UpdateContainers` runs while a
//! CRI `UpdateContainerResources` is in flight: the two paths take containerd's NRI lock and the
//! adaptation's lock in opposite orders (containerd/containerd#13733; fixed in NRI v0.12.1 by
//! containerd/nri#301, vendored from containerd 2.4). nri-resize sees the runtime's update from
//! its `UpdateContainer` request to its `PostUpdateContainer` event; a plugin-initiated update
//! waits until none is in flight there. (The other order, a CRI update arriving while the
//! plugin's own is in flight, is not in the plugin's hands; the plugin's updates are rare and
//! short: whole-pod steps of its own API, a decrease resumed from an earlier version's checkpoint,
//! a waiting resize applied after a capacity change.)
//!
//! A runtime update whose `PostUpdateContainer` never comes (refused by a plugin, failed in the
//! runtime) stops counting after [`IN_FLIGHT_BOUND`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::version::Version;
use crate::sync::Locked as _;

/// How long a runtime update counts as in flight without its `PostUpdateContainer`: containerd's
/// default plugin request timeout (2 s) for the plugins' answers, plus runc's write.
pub const IN_FLIGHT_BOUND: Duration = Duration::from_secs(5);

/// The first NRI release whose runtimes take a plugin's `UpdateContainers` safely beside their
/// own updates (containerd/nri#301).
pub const SAFE_OVERLAP_SINCE: Version = Version(0, 12, 1);

/// Whether a runtime with NRI `version` (`None`: unknown) needs plugin-initiated updates kept
/// apart from its own.
pub fn needs_quiet(version: Option<Version>) -> bool {
    version.is_none_or(|v| v < SAFE_OVERLAP_SINCE)
}

/// The runtime's container updates in flight, by container id (see the module docs).
#[derive(Debug, Clone)]
pub struct UpdateWindow {
    in_flight: Arc<Mutex<HashMap<String, Instant>>>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for UpdateWindow {
    fn default() -> Self {
        UpdateWindow {
            in_flight: Arc::default(),
            changed: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

impl UpdateWindow {
    /// The runtime asked about an update of container `id` (`UpdateContainer`).
    pub fn begins(&self, id: &str) {
        self.in_flight
            .locked()
            .insert(id.to_owned(), Instant::now());
        self.changed.send_modify(|n| *n += 1);
    }

    /// The runtime's update of `id` is over (`PostUpdateContainer`, or refused by nri-resize).
    pub fn ends(&self, id: &str) {
        if self.in_flight.locked().remove(id).is_some() {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// When the last update in flight stops counting (`None`: none is in flight at `now`).
    fn busy_until(&self, now: Instant) -> Option<Instant> {
        let mut all = self.in_flight.locked();
        all.retain(|_, started| *started + IN_FLIGHT_BOUND > now);
        all.values().map(|started| *started + IN_FLIGHT_BOUND).max()
    }

    /// Waits until no runtime update is in flight, at most `limit`; `false`: one still was.
    pub async fn quiet(&self, limit: Duration) -> bool {
        let give_up = Instant::now() + limit;
        let mut rx = self.changed.subscribe();
        loop {
            let Some(until) = self.busy_until(Instant::now()) else {
                return true;
            };
            if Instant::now() >= give_up {
                return false;
            }
            tokio::select! {
                _ = rx.changed() => {}
                () = tokio::time::sleep_until(until.min(give_up)) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_before_nri_0_12_1_need_their_updates_kept_apart() {
        assert!(needs_quiet(None));
        assert!(needs_quiet(Some(Version(0, 6, 1))));
        assert!(needs_quiet(Some(Version(0, 12, 0))));
        assert!(!needs_quiet(Some(Version(0, 12, 1))));
        assert!(!needs_quiet(Some(Version(0, 13, 0))));
    }

    /// A plugin update waits for the runtime's update in flight to end (its
    /// `PostUpdateContainer`), and gives up at its limit while one stays in flight.
    #[tokio::test(start_paused = true)]
    async fn a_plugin_update_waits_for_the_runtimes_update_to_end() {
        let w = UpdateWindow::default();
        assert!(w.quiet(Duration::ZERO).await, "nothing in flight");
        w.begins("c");
        assert!(
            !w.quiet(Duration::from_millis(100)).await,
            "still in flight at the limit"
        );
        let waiter = {
            let w = w.clone();
            tokio::spawn(async move { w.quiet(Duration::from_secs(4)).await })
        };
        tokio::task::yield_now().await;
        w.ends("c");
        assert!(waiter.await.expect("join"), "quiet once it ended");
    }

    /// An update whose `PostUpdateContainer` never comes stops counting after the bound.
    #[tokio::test(start_paused = true)]
    async fn an_update_that_never_ends_stops_counting_after_the_bound() {
        let w = UpdateWindow::default();
        w.begins("c");
        assert!(w.quiet(IN_FLIGHT_BOUND + Duration::from_secs(1)).await);
    }
}
