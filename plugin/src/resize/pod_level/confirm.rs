//! The pod cgroup read back after a pod-level update and compared with what was asked, as
//! containers are confirmed: on `PostUpdatePodSandbox` (containerd sends it inside the CRI
//! call, before kubelet 1.36 writes the pod cgroup, so that read reports no drift) and at
//! [`POD_READ_BACK_AFTER`] following the answer (drift reported after the last).

use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use super::read::read_pod;
use crate::clock::now_ms;
use crate::model::Pod;
use crate::nri::Deadline;
use crate::policy::ResizeState;
use crate::state::{limits_differences, limits_text, NodeReserve, NodeState};

/// When the pod cgroup is read back after an accepted `UpdatePodSandbox`, counted from the
/// answer: CRI-O sends no `PostUpdatePodSandbox` (1.34 to 1.37), and kubelet 1.36 writes the
/// pod cgroup only after the call returns, so the read follows the answer and is repeated until
/// the cgroup holds the request; drift is reported after the last.
pub(super) const POD_READ_BACK_AFTER: [Duration; 5] = [
    Duration::from_millis(100),
    Duration::from_millis(400),
    Duration::from_millis(1500),
    Duration::from_secs(3),
    Duration::from_secs(5),
];

/// Reads the pod cgroup of `pod` at `after` (each counted from the previous read) until it
/// holds what the pod-level record asks; stops when the record is gone or the cgroup cannot be
/// read. Drift is reported after the last read only.
pub(super) async fn follow_reads(state: Arc<NodeState>, pod: Pod, after: &[Duration]) {
    for (i, wait) in after.iter().enumerate() {
        tokio::time::sleep(*wait).await;
        let last = i + 1 == after.len();
        if confirm_pod(&state, &pod, last).await != Some(false) {
            return;
        }
    }
}

/// Reads `pod`'s cgroup back and records it against its pod-level record: `Some(true)` when it
/// holds what was asked, `Some(false)` when it does not (a warning when `report_drift`), `None`
/// when there is no record or the cgroup could not be read.
pub(super) async fn confirm_pod(state: &NodeState, pod: &Pod, report_drift: bool) -> Option<bool> {
    let desired = state.pod_level(|m| m.get(&pod.id).map(|r| r.desired))?;
    let read = read_pod(
        state.cgroups.clone(),
        None,
        None,
        pod.cgroup_parent.clone(),
        NodeReserve::default(),
        // After the answer, or on an event whose answer does not depend on it: READ_BUDGET.
        &Deadline::none(),
    )
    .await;
    let mut drift = None;
    let mut matches = None;
    state.pod_level(|m| {
        let Some(r) = m.get_mut(&pod.id) else { return };
        r.updated_ms = now_ms();
        match read.actual {
            Ok((actual, usage)) => {
                r.actual = Some(actual);
                r.memory_usage = usage;
                r.error = None;
                // The memory limit as the kernel holds it: in whole pages.
                let held = actual == desired.as_held(crate::cgroup::page_size());
                r.matches = Some(held);
                matches = r.matches;
                if held {
                    if r.state == Some(ResizeState::InProgress) {
                        r.state = None;
                        r.reason.clear();
                    }
                } else {
                    drift = Some(actual);
                }
                state
                    .metrics
                    .pod
                    .set_actual(&pod.namespace, &pod.name, actual);
            }
            Err(e) => {
                r.matches = None;
                r.error = Some(e.to_string());
            }
        }
    });
    if let (Some(actual), true) = (drift, report_drift) {
        warn!(
            pod = %pod.full_name(),
            desired = %limits_text(&desired),
            actual = %limits_text(&actual),
            differences = %limits_differences(&desired, &actual, crate::cgroup::page_size()).join("; "),
            "pod-level resize not in effect: desired and actual differ"
        );
    }
    matches
}
