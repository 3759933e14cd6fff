//! A model of kubelet's resize path (1.33 – 1.37), played against the harness's runtime.
//!
//! No kubelet binary runs on these machines, so the tests play kubelet themselves. This module
//! is that kubelet, built as its rules (each a pure function naming the kubelet or VPA source
//! it is ported from, with a unit test) and one thin driver that applies them to containerd:
//!
//! - [`profile`]: what differs by version. 1.33 has no usage check; 1.34–1.35 check usage
//!   (`validateMemoryResizeAction`, kubernetes/kubernetes#133012) and call
//!   `UpdatePodSandboxResources` after the pod cgroup write, ignoring its error; 1.36–1.37 call
//!   it before each pod cgroup write, an error blocks, a failed write is reverted
//!   (kubernetes/kubernetes#137555).
//! - [`rules`]: allocated vs actuated (a CRI update that returned OK is actuated and never sent
//!   again; `IsPodResizeInProgress` compares allocated with actuated), the usage check and where
//!   its figures come from (container usage live over CRI stats on containerd, the pod's from
//!   cAdvisor's cache, both cached on CRI-O), the write order of `doPodResizeAction` →
//!   `resizeContainers` (memory before CPU; a pod limit going up before the containers, going
//!   down after them; a pod memory limit only when every container has one), and the
//!   contents of a request (`generateLinuxContainerResources`).
//! - [`retry`]: the pod worker's jittered back-off after a failed sync (10–15 s), the
//!   allocation manager's retries of a deferred resize (30 s, then every 3 min).
//! - [`status`]: the `PodResizeInProgress` condition and the Warning event of a failed sync.
//! - [`vpa`]: what VPA's updater does next (`InPlaceOrRecreate` evicts on `Error`; `InPlace`
//!   waits).
//! - `sync`: [`Containerd::kubelet_resize`] (one sync of a container's resize with its pod
//!   step), [`Containerd::kubelet_sync`] (the same with a configured [`Kubelet`] and the
//!   actuated record kept across syncs), [`Containerd::kubelet_resize_retrying`],
//!   [`Containerd::kubelet_resize_container`] (the container's usage check and the update, for
//!   tests that drive one container), [`Containerd::kubelet_resize_pod`] (1.36's pod-level
//!   resize, KEP-5419: one `UpdatePodSandboxResources` call before each pod cgroup write, in
//!   the order and with the merged states of [`rules::pod_level_writes`]).
//!
//! Tests that call [`Containerd::update_container_resources`] directly play a CRI client
//! without the usage check and without the pod step: a decrease that passed kubelet's check
//! just before the workload's usage grew again, or another CRI client.

pub mod profile;
pub mod retry;
pub mod rules;
pub mod status;
mod sync;
pub mod vpa;

use std::io;
use std::time::Duration;

use tonic::Status;

#[cfg(doc)]
use crate::containerd::Containerd;

pub use profile::KubeletVersion;
pub use rules::{StatsRuntime, UsageCache};
pub use status::{KubeletEvent, PodResizeCondition};
pub use sync::{Actuated, Kubelet};
pub use vpa::{VpaAction, VpaMode};

/// What one sync of kubelet's resize did to a container.
#[derive(Debug)]
pub enum KubeletResize {
    /// The runtime was called and accepted the update.
    Applied,
    /// Not called: an earlier sync's update was accepted and is recorded as actuated.
    Actuated,
    /// kubelet did not call the runtime: usage is at or above the new memory limit.
    BelowUsage {
        /// The usage kubelet read (page cache included), bytes.
        usage: u64,
        /// The memory limit asked for, bytes.
        limit: u64,
        /// kubelet's error text.
        message: String,
    },
    /// kubelet did not call the runtime: it could not read the usage.
    MissingUsage(String),
    /// The runtime was called and refused (kubelet records the error and retries).
    Refused(Status),
}

impl KubeletResize {
    /// Whether the runtime accepted the update, in this sync or an earlier one.
    pub fn applied(&self) -> bool {
        matches!(self, Self::Applied | Self::Actuated)
    }

    /// The error kubelet's sync result carries, if the container step failed.
    pub fn error_text(&self) -> Option<String> {
        match self {
            Self::Applied | Self::Actuated => None,
            Self::BelowUsage { message, .. } | Self::MissingUsage(message) => Some(message.clone()),
            Self::Refused(s) => Some(status::runtime_error_text(s.code(), s.message())),
        }
    }
}

/// What kubelet 1.36's pod-level resize did.
#[derive(Debug)]
pub enum KubeletPodResize {
    /// Called (or tolerated as unimplemented), then the pod cgroup written.
    Applied {
        /// The runtime answered `Unimplemented`: it never saw the resize.
        unimplemented: bool,
    },
    /// Not called: the pod's usage is at or above the new memory limit.
    BelowUsage {
        /// The pod cgroup's usage, bytes.
        usage: u64,
        /// The pod cgroup's new memory limit, bytes.
        limit: u64,
    },
    /// The runtime refused: the pod cgroup was not written.
    Refused(Status),
    /// The pod cgroup write failed after the runtime accepted: the runtime was called again
    /// with the previous resources.
    Reverted {
        /// Why the write failed.
        write: io::Error,
        /// The revert call's answer.
        revert: Result<(), Status>,
    },
}

/// kubelet 1.36's resize of a pod's pod-level resources: the `UpdatePodSandboxResources` calls
/// it made, in order, and how it ended.
#[derive(Debug)]
pub struct KubeletPodSync {
    /// The calls, in kubelet's order (see [`rules::pod_level_writes`]).
    pub calls: Vec<SandboxCall>,
    /// How the resize ended.
    pub outcome: KubeletPodResize,
}

/// One CRI `UpdatePodSandboxResources` call of kubelet's pod-level resize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxCall {
    /// The pod's resources sent (overhead apart): the fields written so far new, the others
    /// as they were.
    pub resources: crate::pod::Resources,
    /// The call after a failed pod cgroup write, with the resources before it.
    pub revert: bool,
    /// The runtime's answer (its message on error).
    pub answer: Result<(), String>,
}

impl SandboxCall {
    pub(crate) fn new(
        resources: crate::pod::Resources,
        revert: bool,
        answer: &Result<(), Status>,
    ) -> Self {
        Self {
            resources,
            revert,
            answer: match answer {
                Ok(()) => Ok(()),
                Err(s) => Err(s.message().to_owned()),
            },
        }
    }
}

/// One sync of kubelet resizing a container of a pod, pod step included, and what kubelet
/// and VPA show of it.
#[derive(Debug)]
pub struct KubeletSync {
    /// The container's step.
    pub container: KubeletResize,
    /// The pod cgroup memory limit kubelet wrote (before the container for a raise, after it
    /// for a decrease); `None`: not written.
    pub pod_written: Option<u64>,
    /// Why the pod step was not taken (kubelet's usage check on the pod, the runtime's answer
    /// to `UpdatePodSandboxResources` on 1.36+, or the write's error); the sync fails and
    /// kubelet retries the pod step.
    pub pod_blocked: Option<String>,
    /// The pod's resize condition after the sync; `None`: done.
    pub condition: Option<PodResizeCondition>,
    /// The Warning event of a failed sync.
    pub event: Option<KubeletEvent>,
}

impl KubeletSync {
    /// Whether allocated and actuated still differ after this sync.
    pub fn in_progress(&self) -> bool {
        self.condition.is_some()
    }

    /// What VPA's updater in `mode` does next with the pod, its in-place attempt `age` old.
    pub fn vpa_next(&self, mode: VpaMode, age: Duration) -> VpaAction {
        vpa::vpa_next(mode, self.condition.as_ref(), age)
    }
}
