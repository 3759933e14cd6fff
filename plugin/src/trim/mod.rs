//! Working-set trimming (cgroup v2): keeps an opted-in container's charged memory close to its
//! working set by reclaiming cold page cache with `memory.reclaim`, in small steps paced by the
//! container's own harm signals (stall from `memory.pressure` and `io.pressure`, refaults from
//! `memory.stat`). Why: kubelet ≥ 1.34 sends a memory-limit decrease to the runtime only once
//! the container's usage (`memory.current`, page cache included) is below the new limit, and
//! VPA recommends from the working set; cold page cache blocks such a decrease forever on a
//! node without memory pressure. docs/trimming.md tells the whole story.
//!
//! The [`Trimmer`] is a component of its own: it owns its per-container records, its
//! background task and that task's cancellation (a child of the daemon's token; a removed
//! container's record goes at the next pass, and the outcome of a step in flight for it is
//! dropped). It learns containers through [`Trimmer::sync`] (the daemon feeds it) and answers
//! what it found through [`Trimmer::state`] and [`Trimmer::working_set`]: the handle the
//! decrease path asks, and [`Trimmer::pause`]: the decrease path holds trimming of a container
//! off while it reclaims that container itself.
//!
//! One pass every `[trim] interval`: each container whose turn it is, one at a time, on
//! trimming's own thread at the lowest CPU priority (`worker`: nice 19 under `SCHED_BATCH`; the
//! kernel reclaims in the writing thread's context, so the NRI handlers go first) —
//! `step::turn`: a few cgroupfs reads and at most one `memory.reclaim` write of at most
//! `[trim] max_step`. The step decision itself is pure
//! ([`Probe`](crate::policy::Probe)).

mod pause;
mod probe;
mod run;
mod status;
mod step;
#[cfg(test)]
mod tests;
mod worker;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use pause::TrimPause;
pub use probe::node_has_swap;
pub use status::{ContainerTrim, TrimState};

use crate::metrics::ContainerLabels;
use crate::state::NodeState;
use crate::sync::Locked as _;

/// A container trimming may work on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrimTarget {
    pub labels: ContainerLabels,
    /// The container's cgroup within the hierarchy (`/kubepods.slice/…`, see
    /// [`crate::cgroup::container_path`]).
    pub cgroup: PathBuf,
    /// Its pod's annotations (`trim.nri-resize.io/pod`, `trim.nri-resize.io/max-stall`).
    pub annotations: BTreeMap<String, String>,
}

/// The handle: cheap to clone; every clone speaks to the same trimmer.
#[derive(Clone)]
pub struct Trimmer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Trimmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trimmer").finish_non_exhaustive()
    }
}

/// What the handle and the task share: the containers to trim (the handle's to change) and the
/// published records (the task's to change), each under a short lock; taken in that order.
struct Shared {
    state: Arc<NodeState>,
    cancel: CancellationToken,
    targets: Mutex<HashMap<String, TrimTarget>>,
    published: Mutex<HashMap<String, ContainerTrim>>,
    task: Mutex<Option<JoinHandle<()>>>,
    node_has_swap: fn() -> bool,
    /// Containers a memory decrease is reclaiming ([`Trimmer::pause`]).
    pauses: pause::Pauses,
}

impl Trimmer {
    /// Starts the trimmer's task (on the current tokio runtime); it stops when `cancel` fires or
    /// at [`Trimmer::shutdown`]. Settings come from `state`'s configuration (`[trim]`, read at
    /// every pass) and cgroup I/O from `state.cgroups` (none: every container unavailable).
    pub fn start(state: Arc<NodeState>, cancel: &CancellationToken) -> Self {
        Self::start_with(state, cancel, node_has_swap)
    }

    /// [`Trimmer::start`] with the node's swap told by `node_has_swap` (tests).
    pub fn start_with(
        state: Arc<NodeState>,
        cancel: &CancellationToken,
        node_has_swap: fn() -> bool,
    ) -> Self {
        let shared = Arc::new(Shared {
            state,
            cancel: cancel.child_token(),
            targets: Mutex::new(HashMap::new()),
            published: Mutex::new(HashMap::new()),
            task: Mutex::new(None),
            node_has_swap,
            pauses: pause::Pauses::default(),
        });
        let task = tokio::spawn(run::run(Arc::clone(&shared)));
        *shared.task.locked() = Some(task);
        Self { shared }
    }

    /// The containers to trim, all at once (by container id): new ones are added, changed ones
    /// replaced (a new cgroup starts over), missing ones forgotten.
    pub fn sync(&self, targets: HashMap<String, TrimTarget>) {
        let gone: Vec<String> = self
            .shared
            .targets
            .locked()
            .keys()
            .filter(|id| !targets.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            self.forget(&id);
        }
        let mut t = self.shared.targets.locked();
        for (id, target) in targets {
            if t.get(&id) != Some(&target) {
                t.insert(id, target);
            }
        }
    }

    /// Adds or replaces one container.
    pub fn watch(&self, id: &str, target: TrimTarget) {
        self.shared.targets.locked().insert(id.to_owned(), target);
    }

    /// Forgets a container: its record and series go now, a step in flight is not reported.
    pub fn forget(&self, id: &str) {
        let mut targets = self.shared.targets.locked();
        let Some(gone) = targets.remove(id) else {
            return;
        };
        self.shared.published.locked().remove(id);
        self.shared.pauses.forget(id);
        // A restarted container has a new id and the same labels: its series stay.
        if !targets.values().any(|t| t.labels == gone.labels) {
            self.shared.state.metrics.trim.remove(&gone.labels);
        }
    }

    /// Where trimming stands for container `id`, with its figures; `None`: not known to it.
    #[must_use]
    pub fn state(&self, id: &str) -> Option<ContainerTrim> {
        self.shared.published.locked().get(id).cloned()
    }

    /// The working set the last converged probe of container `id` found (usage at its first
    /// sign of harm), if one did.
    #[must_use]
    pub fn working_set(&self, id: &str) -> Option<u64> {
        self.shared
            .published
            .locked()
            .get(id)
            .and_then(|c| c.working_set_bytes)
    }

    /// Every container's record, by id (the status API).
    #[must_use]
    pub fn states(&self) -> HashMap<String, ContainerTrim> {
        self.shared.published.locked().clone()
    }

    /// Stops the task and waits for it (a `memory.reclaim` write in flight finishes on
    /// trimming's thread, which then ends; nothing is reported after it).
    pub async fn shutdown(&self) {
        self.shared.cancel.cancel();
        let task = self.shared.task.locked().take();
        if let Some(task) = task {
            if let Err(err) = task.await {
                tracing::warn!(%err, "trimmer task ended abnormally");
            }
        }
    }
}
