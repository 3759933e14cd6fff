//! One bounded read for the pod-level handlers: the pod cgroup's limits, usage and its
//! breakdown, and the node's capacity, on a blocking thread (cgroupfs and procfs reads never
//! run on an async worker), given up after [`READ_BUDGET`] or at the runtime's deadline,
//! whichever comes first, so a handler answers inside that deadline.

use std::time::Duration;

use tracing::warn;

use crate::cgroup::{pod_path, CgroupError, CgroupIo, Cgroups};
use crate::model::PodLimits;
use crate::nri::Deadline;
use crate::policy::{MemoryUse, NodeCapacity};
use crate::resize::node::NodeReader;
use crate::state::NodeReserve;
use crate::state::NodeStatus;

/// How long a pod-level handler may spend reading the pod cgroup and the node.
pub const READ_BUDGET: Duration = Duration::from_millis(500);

/// Why the pod cgroup was not read.
#[derive(Debug, thiserror::Error)]
pub(super) enum PodReadError {
    #[error("cgroup access is off")]
    NoCgroupAccess,
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The blocking read panicked or was cancelled.
    #[error("pod cgroup read failed: {0}")]
    Failed(#[source] tokio::task::JoinError),
    #[error("pod cgroup read took longer than {budget:?}")]
    TooSlow { budget: Duration },
    /// The runtime's deadline came before the read (and before [`READ_BUDGET`]).
    #[error("pod cgroup not read within the runtime's deadline")]
    PastDeadline,
}

/// One read of the pod cgroup and the node.
pub(super) struct PodRead {
    pub actual: Result<(PodLimits, Option<u64>), PodReadError>,
    /// The pod cgroup's usage with its breakdown (`memory.stat`); `None` when unread.
    pub memory: Option<MemoryUse>,
    pub node: Option<NodeCapacity>,
}

/// Reads the pod cgroup (and the node, when a reader is given: the capacity watcher's
/// `snapshot` when there is one) on a blocking thread, at most [`READ_BUDGET`] and never past
/// `deadline`.
pub(super) async fn read_pod(
    cgroups: Option<Cgroups>,
    node: Option<NodeReader>,
    snapshot: Option<NodeStatus>,
    cgroup_parent: String,
    reserve: NodeReserve,
    deadline: &Deadline,
) -> PodRead {
    let by_budget = tokio::time::Instant::now() + READ_BUDGET;
    let until = by_budget.min(deadline.at());
    let work = tokio::task::spawn_blocking(move || {
        let actual = match &cgroups {
            None => Err(PodReadError::NoCgroupAccess),
            Some(cg) => pod_path(&cgroup_parent)
                .and_then(|p| cg.read_actual(&p))
                .map(|a| {
                    (
                        PodLimits::from_cgroup(a.cpu_quota, a.cpu_period, a.memory_limit),
                        a.memory_usage,
                    )
                })
                .map_err(PodReadError::from),
        };
        let memory = match (&cgroups, &actual) {
            (Some(cg), Ok(_)) => pod_path(&cgroup_parent)
                .and_then(|p| cg.memory_use(&p))
                .map_err(|e| warn!(error = %e, "pod memory breakdown unreadable"))
                .ok(),
            _ => None,
        };
        let node = node.and_then(|n| {
            n.capacity_with(snapshot.as_ref(), reserve)
                .map_err(|e| warn!(error = %e, "node capacity unknown for pod-level admission"))
                .ok()
        });
        PodRead {
            actual,
            memory,
            node,
        }
    });
    match tokio::time::timeout_at(until, work).await {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => PodRead {
            actual: Err(PodReadError::Failed(e)),
            memory: None,
            node: None,
        },
        Err(_) => PodRead {
            actual: Err(if until < by_budget {
                PodReadError::PastDeadline
            } else {
                PodReadError::TooSlow {
                    budget: READ_BUDGET,
                }
            }),
            memory: None,
            node: None,
        },
    }
}
