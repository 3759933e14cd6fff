//! Pod-level resources (KEP-5419): the record of each pod's desired vs actual pod cgroup limits
//! and where its last resize stands. Pod-level admission (`resize/pod_level/`) writes them, the
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
    /// Whether actual holds desired (the memory limit in whole pages, as the kernel keeps it:
    /// [`PodLimits::as_held`]); `None`: not read back.
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

/// What differs between a pod cgroup's `desired` limits and the `actual` ones read back, each
/// with both values: in quantities, or in exact bytes where the quantities read the same (`128Mi`
/// either side of a few KiB). The memory limit is compared in whole pages of `page_size` bytes,
/// as the kernel holds it ([`PodLimits::as_held`]): empty when the cgroup holds what was asked.
pub fn limits_differences(desired: &PodLimits, actual: &PodLimits, page_size: u64) -> Vec<String> {
    let mut out = Vec::new();
    if desired.cpu_millis != actual.cpu_millis {
        let q = |v: Option<u64>| v.map_or_else(|| "max".into(), cpu_quantity);
        out.push(format!(
            "cpu: desired {}, actual {}",
            q(desired.cpu_millis),
            q(actual.cpu_millis)
        ));
    }
    let held = desired.as_held(page_size).memory_bytes;
    if held != actual.memory_bytes {
        let q = |v: Option<u64>| v.map_or_else(|| "max".into(), memory_quantity);
        let exact = |v: Option<u64>| v.map_or_else(|| "max".into(), |b| format!("{b} bytes"));
        let (mut d, mut a) = (q(desired.memory_bytes), q(actual.memory_bytes));
        if d == a {
            (d, a) = (exact(desired.memory_bytes), exact(actual.memory_bytes));
            if let Some(h) = held.filter(|h| Some(*h) != desired.memory_bytes) {
                d = format!("{d} ({h} in whole pages)");
            }
        }
        out.push(format!("memory: desired {d}, actual {a}"));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 4096;

    fn limits(cpu_millis: Option<u64>, memory_bytes: Option<u64>) -> PodLimits {
        PodLimits {
            cpu_millis,
            memory_bytes,
        }
    }

    #[test]
    fn a_pod_memory_limit_held_in_whole_pages_is_no_difference() {
        // 500M asked, held in 4 KiB pages; 1G on 64 KiB pages.
        let asked = limits(Some(500), Some(500_000_000));
        assert!(limits_differences(&asked, &limits(Some(500), Some(499_998_720)), PAGE).is_empty());
        let asked = limits(None, Some(1_000_000_000));
        assert!(limits_differences(&asked, &limits(None, Some(999_948_288)), 64 << 10).is_empty());
        assert_eq!(
            asked.as_held(PAGE),
            limits(None, Some(999_997_440)),
            "the pod cgroup holds 1G as 999997440 bytes"
        );
        // A page short is a difference: in bytes, since both read 954Mi.
        assert_eq!(
            limits_differences(&asked, &limits(None, Some(999_993_344)), PAGE),
            ["memory: desired 1000000000 bytes (999997440 in whole pages), actual 999993344 bytes"]
        );
        // The bytes asked, read back as such, are not what a 4 KiB-page kernel holds.
        assert_eq!(
            limits_differences(&asked, &limits(None, Some(1_000_000_000)), PAGE),
            ["memory: desired 1000000000 bytes (999997440 in whole pages), actual 1000000000 bytes"]
        );
    }
}
