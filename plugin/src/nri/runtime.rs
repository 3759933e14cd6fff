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
use crate::sync::Locked as _;

/// Why a call to the runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("not connected to the runtime")]
    NotConnected,
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
}

impl Default for RuntimeLink {
    fn default() -> Self {
        RuntimeLink {
            state: Arc::default(),
            connected: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
}

/// How long an unsolicited update may take before we give up waiting for the runtime.
const UPDATE_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// apply (an empty list means all applied).
    pub async fn update_containers(
        &self,
        updates: &[ContainerUpdate],
        evictions: &[Eviction],
    ) -> Result<Vec<ContainerUpdate>, LinkError> {
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

    #[tokio::test(start_paused = true)]
    async fn waiting_for_a_connection_gives_up_after_its_limit() {
        let link = RuntimeLink::default();
        assert!(!link.wait_connected(Duration::from_secs(5)).await);
        link.set_disconnected();
        assert!(!link.wait_connected(Duration::from_millis(1)).await);
    }
}
