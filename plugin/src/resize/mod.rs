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
//! `reevaluate` (after capacity changes).

mod admission;
pub mod checkpoint;
mod decrease;
mod eviction;
mod executor;
#[cfg(test)]
pub(crate) mod fake_runtime;
mod late;
pub mod node;
pub(crate) mod off_worker;
mod pod_cgroup;
mod pod_checkpoint;
pub mod reclaim;
mod records;
pub mod reevaluate;
mod reply;
pub mod restart;
mod runtime_update;
mod update;
mod whole_pod;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use self::checkpoint::CheckpointStore;
use self::node::NodeReader;
pub use self::pod_cgroup::PodCgroupError;
pub use self::records::{ContainerResize, LimitPair, PodResize, SnapshotLimits, StepRecord};
pub use self::runtime_update::UpdateError;
pub use self::whole_pod::{ContainerTarget, PodResizeRequest, ResizeError};
use crate::cgroup::{CgroupIo as _, CgroupVersion, Cgroups};
use crate::config::Config;
use crate::nri::RuntimeLink;
use crate::policy::PlanOptions;
use crate::state::NodeState;
use crate::sync::ReadWriteLocked as _;
use crate::trim::{TrimPause, Trimmer};

/// See the module docs.
#[derive(Debug)]
pub struct Engine {
    state: Arc<NodeState>,
    link: RuntimeLink,
    cgroups: Option<Cgroups>,
    node: NodeReader,
    checkpoints: Option<CheckpointStore>,
    containers: Mutex<HashMap<String, ContainerResize>>,
    pods: Mutex<HashMap<String, PodResize>>,
    /// Latest target per pod id, and whether an executor is running for it.
    targets: Mutex<HashMap<String, (SnapshotLimits, bool)>>,
    resumed: std::sync::atomic::AtomicBool,
    /// Reclaims in flight, by container id: one per container (see [`decrease::ReclaimHandle`]).
    reclaims: Mutex<HashMap<String, decrease::ReclaimHandle>>,
    reclaim_generation: std::sync::atomic::AtomicU64,
    /// Held around the reclaim checkpoints' file I/O together with the ownership check that
    /// decides it, so that a superseded decrease's late write or removal never lands over a
    /// newer decrease's checkpoint (same key). Taken on blocking threads only.
    reclaim_checkpoint_io: Mutex<()>,
    /// Restarts in flight ([`restart`]).
    restarts: Arc<restart::Restarts>,
    /// Fires at shutdown: every background task of the engine (staged decreases, resumed
    /// resizes, restarts) stops, leaving its checkpoint for the next start.
    shutdown: tokio_util::sync::CancellationToken,
    /// The engine's background tasks; [`Engine::shutdown`] waits for them.
    tasks: tokio_util::task::TaskTracker,
    /// Working-set trimming, asked what it found and paused while a decrease reclaims
    /// ([`Engine::with_trimmer`]; none: trimming is not consulted).
    trimmer: Option<Trimmer>,
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
            state,
            link,
            cgroups,
            node,
            checkpoints,
            containers: Mutex::new(HashMap::new()),
            pods: Mutex::new(HashMap::new()),
            targets: Mutex::new(HashMap::new()),
            resumed: std::sync::atomic::AtomicBool::new(false),
            reclaims: Mutex::new(HashMap::new()),
            reclaim_generation: std::sync::atomic::AtomicU64::new(0),
            reclaim_checkpoint_io: Mutex::new(()),
            restarts: Arc::new(restart::Restarts::new(
                shutdown.child_token(),
                restart::Timing::default(),
            )),
            shutdown,
            tasks: tokio_util::task::TaskTracker::new(),
            trimmer: None,
        }
    }

    /// The engine with working-set trimming: a decrease asks it for the working set it found
    /// and pauses it on the container while reclaiming there.
    #[must_use]
    pub fn with_trimmer(mut self, trimmer: Trimmer) -> Self {
        self.trimmer = Some(trimmer);
        self
    }

    /// Holds trimming of container `id` off until the pause is dropped.
    fn pause_trimming(&self, id: &str) -> Option<TrimPause> {
        self.trimmer.as_ref().map(|t| t.pause(id))
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
