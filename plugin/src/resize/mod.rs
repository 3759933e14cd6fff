//! The resize engine: KEP-1287's node side, inside the runtime.
//!
//! Two entry points, one set of rules:
//! - **kubelet-driven** updates arrive one container at a time as NRI `UpdateContainer`
//!   ([`Engine::on_update`]): the resize policy decides in place / restart (eviction) / reject,
//!   admission refuses what can never fit (Infeasible) or does not fit now (Deferred), and when
//!   the container's new limit needs a larger pod cgroup first (cgroup v1 `EINVAL`,
//!   kubernetes/kubernetes#127356) the pod cgroup is raised before the runtime writes the
//!   container;
//! - **whole-pod** resizes through the API ([`Engine::resize_pod`]) are planned by
//!   [`crate::policy::plan`] into KEP-ordered steps and executed one by one — pod cgroup through
//!   cgroupfs, containers through NRI `UpdateContainers` — re-planned from the cgroups' actual
//!   values after every step, so a newer request takes over mid-resize and a resumed resize never
//!   applies a step twice. In-flight resizes are checkpointed in the state directory.
//!
//! `mode = "Observe"` decides and reports everything but changes nothing.
//!
//! One idea per file: `update` (the kubelet path), `admission`, `decrease` (memory decreases
//! below usage: refused on the kubelet path, never an interim limit), `eviction` (restarts), `whole_pod` and `executor` (API resizes),
//! `pod_checkpoint`, `pod_cgroup` (cgroupfs I/O of the pod), `records` (what `status` reads),
//! `reevaluate` (after capacity changes), `pod_level` (KEP-5419's `UpdatePodSandbox`), and
//! `read_back` (reads that follow an answer).
//!
//! The engine is a thin front over owners, each reached only through its handle:
//! [`record_store`] (the container and pod records; the API reads a view), [`reclaims`] (every
//! reclaim on a container: background, inline, trimming's pauses), [`pod_runs`] (whole-pod
//! runs: the newest target wins, one executor per pod) and [`restart`] (restarts in flight).

mod admission;
pub mod checkpoint;
mod decrease;
mod eviction;
mod executor;
#[cfg(test)]
pub(crate) mod fake_runtime;
mod late;
mod lifecycle;
pub mod node;
pub(crate) mod off_worker;
mod pod_cgroup;
mod pod_checkpoint;
pub mod pod_level;
mod pod_runs;
pub(crate) mod read_back;
pub mod reclaim;
mod reclaims;
mod record_store;
mod records;
pub mod reevaluate;
mod reply;
pub mod restart;
mod runtime_update;
mod update;
mod whole_pod;

use std::sync::Arc;

use self::checkpoint::CheckpointStore;
use self::node::NodeReader;
pub use self::pod_cgroup::PodCgroupError;
use self::pod_level::PodLevel;
use self::pod_runs::PodRuns;
use self::reclaims::Reclaims;
use self::record_store::Records;
pub use self::record_store::RecordsView;
pub use self::records::{ContainerResize, LimitPair, PodResize, SnapshotLimits, StepRecord};
pub use self::runtime_update::UpdateError;
pub use self::whole_pod::{ContainerTarget, PodResizeRequest, ResizeError};
use crate::cgroup::{CgroupIo as _, CgroupVersion, Cgroups};
use crate::config::Config;
use crate::nri::RuntimeLink;
use crate::policy::PlanOptions;
use crate::state::NodeState;
use crate::sync::ReadWriteLocked as _;
use crate::trim::Trimmer;

/// See the module docs. A thin front: it holds the owners' handles and the context they share,
/// and fans each entry point out to them; no domain state of its own.
#[derive(Debug)]
pub struct Engine {
    state: Arc<NodeState>,
    link: RuntimeLink,
    cgroups: Option<Cgroups>,
    node: NodeReader,
    /// Whole-pod resize checkpoints ([`pod_checkpoint`]); the reclaims keep their own.
    checkpoints: Option<CheckpointStore>,
    /// The container and pod records (what `status` reads).
    records: Records,
    /// Whole-pod runs: each pod's latest target, one executor per pod.
    runs: PodRuns,
    resumed: std::sync::atomic::AtomicBool,
    /// Every reclaim on a container: background, inline, and trimming's pauses (shared with
    /// pod-level admission).
    reclaims: Arc<Reclaims>,
    /// Restarts in flight ([`restart`]).
    restarts: Arc<restart::Restarts>,
    /// Fires at shutdown: every background task of the engine (staged decreases, resumed
    /// resizes, restarts) stops, leaving its checkpoint for the next start.
    shutdown: tokio_util::sync::CancellationToken,
    /// The engine's background tasks; [`Engine::shutdown`] waits for them.
    tasks: tokio_util::task::TaskTracker,
}

impl Engine {
    pub fn new(
        state: Arc<NodeState>,
        link: RuntimeLink,
        cgroups: Option<Cgroups>,
        node: NodeReader,
        checkpoints: Option<CheckpointStore>,
    ) -> Self {
        let shutdown = tokio_util::sync::CancellationToken::new();
        Engine {
            reclaims: Arc::new(Reclaims::new(
                Arc::clone(&state),
                checkpoints.clone(),
                None,
                shutdown.clone(),
            )),
            state,
            link,
            cgroups,
            node,
            checkpoints,
            records: Records::default(),
            runs: PodRuns::default(),
            resumed: std::sync::atomic::AtomicBool::new(false),
            restarts: Arc::new(restart::Restarts::new(
                shutdown.child_token(),
                restart::Timing::default(),
            )),
            shutdown,
            tasks: tokio_util::task::TaskTracker::new(),
        }
    }

    /// Tests: an engine with no cgroups, runtime link, node or checkpoints (records, owners
    /// and decisions only) on `state`.
    #[cfg(test)]
    pub(crate) fn detached_for_test(state: Arc<NodeState>) -> Self {
        Engine::new(
            state,
            RuntimeLink::default(),
            None,
            NodeReader::new("/nonexistent/nri-resize-test-node"),
            None,
        )
    }

    /// The engine with working-set trimming: a decrease asks it for the working set it found
    /// and pauses it on the container while reclaiming there.
    #[must_use]
    pub fn with_trimmer(mut self, trimmer: Trimmer) -> Self {
        // Before any use: no reclaim is in flight yet, the owner is built anew with trimming.
        self.reclaims = Arc::new(Reclaims::new(
            Arc::clone(&self.state),
            self.checkpoints.clone(),
            Some(trimmer),
            self.shutdown.clone(),
        ));
        self
    }

    /// Pod-level admission with this engine's owner of reclaim.
    #[must_use]
    pub fn pod_level(&self, pod_level: PodLevel) -> PodLevel {
        pod_level.with_reclaims(Arc::clone(&self.reclaims))
    }

    fn config(&self) -> Config {
        self.state.config.read_locked().clone()
    }

    fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            cgroup_v1: self
                .cgroups
                .as_ref()
                .is_some_and(|c| c.version() == CgroupVersion::V1),
        }
    }

    /// Cancels the engine's background work (staged decreases, resumed resizes, restarts) and
    /// waits for it to end. Checkpoints stay, so the next start resumes what was in flight.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.restarts.shutdown().await;
        self.tasks.wait().await;
    }
}
