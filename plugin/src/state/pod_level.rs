//! Pod-level resources (KEP-5419): the record of each pod's desired vs actual pod cgroup limits
//! and where its last resize stands. The NRI handler (`daemon/pod_level.rs`) writes them, the
//! status API reads them.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::NodeState;
use crate::model::{Pod, PodLimits};
use crate::policy::{cpu_quantity, memory_quantity, ResizeState};
use crate::sync::Locked as _;

/// Desired vs actual of one pod's pod-level resources, and where its last resize stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodLevelStatus {
    /// The pod cgroup's limits the last `UpdatePodSandbox` asked for: the pod-level limits
    /// plus the pod overhead, as kubelet writes them.
    pub desired: PodLimits,
    /// The overhead part of `desired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<PodLimits>,
    /// The pod cgroup's limits when last read.
    pub actual: Option<PodLimits>,
    /// The pod cgroup's memory usage when last read, in bytes.
    pub memory_usage: Option<u64>,
    /// Whether actual equals desired; `None`: not read back.
    pub matches: Option<bool>,
    /// `None`: nothing pending (confirmed).
    pub state: Option<ResizeState>,
    #[serde(default)]
    pub reason: String,
    /// Why the pod cgroup could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub updated_ms: u64,
}

/// `500m/128Mi`, `max` for unlimited.
pub fn limits_text(l: &PodLimits) -> String {
    format!(
        "{}/{}",
        l.cpu_millis.map_or_else(|| "max".into(), cpu_quantity),
        l.memory_bytes.map_or_else(|| "max".into(), memory_quantity)
    )
}

impl NodeState {
    /// Pod-level records by pod id.
    pub fn pod_levels(&self) -> HashMap<String, PodLevelStatus> {
        self.pod_level.locked().clone()
    }

    /// The records under their lock.
    pub(crate) fn pod_level<R>(
        &self,
        f: impl FnOnce(&mut HashMap<String, PodLevelStatus>) -> R,
    ) -> R {
        f(&mut self.pod_level.locked())
    }

    /// Forgets a pod's record and series.
    pub(crate) fn forget_pod_level(&self, pod: &Pod) {
        if self.pod_level(|m| m.remove(&pod.id)).is_some() {
            self.metrics.pod.remove(&pod.namespace, &pod.name);
        }
    }

    /// Keeps the records of `pods` only (after `Synchronize`).
    pub(crate) fn retain_pod_levels(&self, pods: &[Pod]) {
        let gone: Vec<Pod> = self.read_model(|m| {
            self.pod_level(|l| {
                l.keys()
                    .filter(|id| !pods.iter().any(|p| &p.id == *id))
                    .filter_map(|id| m.pod(id).cloned())
                    .collect()
            })
        });
        for p in &gone {
            self.forget_pod_level(p);
        }
        self.pod_level(|l| l.retain(|id, _| pods.iter().any(|p| &p.id == id)));
    }
}
