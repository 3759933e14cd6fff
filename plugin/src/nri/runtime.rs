//! The plugin's handle on the runtime: unsolicited container updates and evictions, and the
//! connection state the daemon reports (`/readyz`, status API). Shared by the transport, which
//! sets it on every (re)connect, and by domain code, which calls through it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use nri_resize_proto::api as pb;
use nri_resize_proto::api_ttrpc::RuntimeClient;
use serde::Serialize;

use super::convert::{eviction_to_pb, update_from_pb, update_to_pb};
use super::handler::{ContainerUpdate, Eviction, RuntimeInfo};
use super::update_window::{needs_quiet, UpdateWindow};
use crate::sync::Locked as _;

/// Why a call to the runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("not connected to the runtime")]
    NotConnected,
    /// The runtime's own container updates stayed in flight: a plugin update beside them can
    /// deadlock runtimes before NRI v0.12.1 (`update_window`).
    #[error("the runtime's own container updates stayed in flight for {waited:?}; the update is not sent beside them (NRI before v0.12.1 can deadlock)")]
    RuntimeBusy { waited: Duration },
    #[error("runtime call {method} failed: {source}")]
    Call {
        method: &'static str,
        #[source]
        source: ttrpc::Error,
    },
}

#[derive(Default)]
struct LinkState {
    client: Option<RuntimeClient>,
    runtime: Option<RuntimeInfo>,
    synchronized: bool,
    connects: u64,
    connected_since: Option<SystemTime>,
}

impl std::fmt::Debug for LinkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkState")
            .field("connected", &self.client.is_some())
            .field("runtime", &self.runtime)
            .field("synchronized", &self.synchronized)
            .field("connects", &self.connects)
            .finish_non_exhaustive()
    }
}

/// Connection state, as reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LinkStatus {
    pub connected: bool,
    /// `Synchronize` completed on the current connection.
    pub synchronized: bool,
    pub runtime: Option<RuntimeInfo>,
    /// Successful registrations since start.
    pub connects: u64,
    /// Seconds since the Unix epoch when the current connection registered.
    pub connected_since: Option<u64>,
}

/// Cloneable handle; see the module docs.
#[derive(Debug, Clone)]
pub struct RuntimeLink {
    state: Arc<Mutex<LinkState>>,
    /// Whether a runtime client is set, for [`RuntimeLink::wait_connected`].
    connected: Arc<tokio::sync::watch::Sender<bool>>,
    /// The runtime's own container updates in flight, which the plugin's wait for.
    window: UpdateWindow,
}

impl Default for RuntimeLink {
    fn default() -> Self {
        RuntimeLink {
            state: Arc::default(),
            connected: Arc::new(tokio::sync::watch::channel(false).0),
            window: UpdateWindow::default(),
        }
    }
}

/// How long an unsolicited update may take before we give up waiting for the runtime.
const UPDATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an unsolicited update waits for the runtime's own updates to end (`update_window`).
const QUIET_LIMIT: Duration = Duration::from_secs(10);

impl RuntimeLink {
    fn with<R>(&self, f: impl FnOnce(&mut LinkState) -> R) -> R {
        f(&mut self.state.locked())
    }

    pub(crate) fn set_connected(&self, client: RuntimeClient) {
        // Not touching `synchronized`: runtimes may configure and synchronize the plugin before
        // they answer RegisterPlugin (containerd 2.x does); it is reset on disconnect.
        self.with(|s| {
            s.client = Some(client);
            s.connects += 1;
            s.connected_since = Some(SystemTime::now());
        });
        self.connected.send_replace(true);
    }

    pub(crate) fn set_runtime(&self, info: RuntimeInfo) {
        self.with(|s| s.runtime = Some(info));
    }

    /// The runtime asked about an update of container `id` (`UpdateContainer`).
    pub(crate) fn runtime_update_begins(&self, id: &str) {
        self.window.begins(id);
    }

    /// The runtime's update of container `id` is over (`PostUpdateContainer`, or refused).
    pub(crate) fn runtime_update_ends(&self, id: &str) {
        self.window.ends(id);
    }

    pub(crate) fn set_synchronized(&self) {
        self.with(|s| s.synchronized = true);
    }

    pub(crate) fn set_disconnected(&self) {
        self.with(|s| {
            s.client = None;
            s.synchronized = false;
            s.connected_since = None;
        });
        self.connected.send_replace(false);
    }

    /// Waits until a runtime client is set, at most `limit`; `false`: none came. (The runtime
    /// synchronizes a plugin before it answers `RegisterPlugin`: work started at `Synchronize`,
    /// such as a resumed resize, must wait for the client before calling the runtime.)
    pub async fn wait_connected(&self, limit: Duration) -> bool {
        let mut rx = self.connected.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|c| *c))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    pub fn status(&self) -> LinkStatus {
        self.with(|s| LinkStatus {
            connected: s.client.is_some(),
            synchronized: s.synchronized,
            runtime: s.runtime.clone(),
            connects: s.connects,
            connected_since: s
                .connected_since
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_secs()),
        })
    }

    /// Asks the runtime to update and evict containers. Returns the updates the runtime could not
    /// apply (an empty list means all applied). On a runtime before NRI v0.12.1 the call waits
    /// until none of the runtime's own container updates is in flight (`update_window`).
    pub async fn update_containers(
        &self,
        updates: &[ContainerUpdate],
        evictions: &[Eviction],
    ) -> Result<Vec<ContainerUpdate>, LinkError> {
        let nri = self.with(|s| s.runtime.as_ref().map(RuntimeInfo::nri));
        if needs_quiet(nri.and_then(|n| n.version)) && !self.window.quiet(QUIET_LIMIT).await {
            return Err(LinkError::RuntimeBusy {
                waited: QUIET_LIMIT,
            });
        }
        let client = self
            .with(|s| s.client.clone())
            .ok_or(LinkError::NotConnected)?;
        let req = pb::UpdateContainersRequest {
            update: updates.iter().map(update_to_pb).collect(),
            evict: evictions.iter().map(eviction_to_pb).collect(),
            ..Default::default()
        };
        let timeout = i64::try_from(UPDATE_TIMEOUT.as_nanos()).unwrap_or(i64::MAX);
        let resp = client
            .update_containers(ttrpc::context::with_timeout(timeout), &req)
            .await
            .map_err(|source| LinkError::Call {
                method: "UpdateContainers",
                source,
            })?;
        Ok(resp.failed.iter().map(update_from_pb).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(nri_version: &str) -> RuntimeInfo {
        RuntimeInfo {
            name: "containerd".into(),
            version: "2.1.9".into(),
            nri_version: nri_version.into(),
            request_timeout_ms: 0,
            registration_timeout_ms: 0,
        }
    }

    /// containerd 2.1.9 (NRI v0.8.0): a plugin update waits while the runtime's own update of a
    /// container is in flight, and goes once its `PostUpdateContainer` came; from NRI v0.12.1 it
    /// goes at once.
    #[tokio::test(start_paused = true)]
    async fn a_plugin_update_waits_for_the_runtimes_own_before_nri_0_12_1() {
        let link = RuntimeLink::default();
        link.set_runtime(runtime(""));
        link.runtime_update_begins("c");
        let call = tokio::spawn({
            let link = link.clone();
            async move { link.update_containers(&[], &[]).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!call.is_finished(), "sent beside the runtime's own update");
        link.runtime_update_ends("c");
        let r = call.await.expect("join");
        assert!(matches!(r, Err(LinkError::NotConnected)), "{r:?}");

        link.set_runtime(runtime("v0.12.1"));
        link.runtime_update_begins("c");
        let r = tokio::time::timeout(Duration::from_millis(1), link.update_containers(&[], &[]))
            .await
            .expect("no wait from NRI v0.12.1");
        assert!(matches!(r, Err(LinkError::NotConnected)), "{r:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_a_connection_gives_up_after_its_limit() {
        let link = RuntimeLink::default();
        assert!(!link.wait_connected(Duration::from_secs(5)).await);
        link.set_disconnected();
        assert!(!link.wait_connected(Duration::from_millis(1)).await);
    }
}
