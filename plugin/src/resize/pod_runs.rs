//! The owner of whole-pod runs: each pod's latest target and whether an executor drives it.
//! The newest target wins, and a pod never has two executors at once: a request that finds one
//! running hands it its target and waits (kube-rs' `scheduler` + `Runner` are the shape).

use std::collections::HashMap;
use std::sync::Mutex;

use super::records::SnapshotLimits;
use crate::sync::Locked as _;

/// See the module docs. Reached only through its methods.
#[derive(Debug, Default)]
pub(crate) struct PodRuns {
    /// Latest target per pod id (present: an executor runs for the pod or is about to).
    targets: Mutex<HashMap<String, SnapshotLimits>>,
}

/// What a request for a pod does next ([`PodRuns::submit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Submitted {
    /// No executor ran for the pod: the caller is its executor now.
    Run,
    /// An executor runs and takes the new target at its next plan: the caller waits for it.
    Wait,
}

impl PodRuns {
    /// `target` becomes the pod's latest.
    pub(crate) fn submit(&self, pod_id: &str, target: SnapshotLimits) -> Submitted {
        match self.targets.locked().insert(pod_id.to_owned(), target) {
            Some(_) => Submitted::Wait,
            None => Submitted::Run,
        }
    }

    /// The pod's latest target (the default where no run is in flight).
    pub(crate) fn target(&self, pod_id: &str) -> SnapshotLimits {
        self.targets
            .locked()
            .get(pod_id)
            .cloned()
            .unwrap_or_default()
    }

    /// Whether a target newer than `planned` arrived for the pod.
    pub(crate) fn superseded(&self, pod_id: &str, planned: &SnapshotLimits) -> bool {
        self.targets
            .locked()
            .get(pod_id)
            .is_some_and(|t| t != planned)
    }

    /// Whether an executor runs for the pod.
    pub(crate) fn running(&self, pod_id: &str) -> bool {
        self.targets.locked().contains_key(pod_id)
    }

    /// The executor reached `done`: the newer target to go on with when one arrived meanwhile
    /// and `again` allows it; otherwise the run ends (`None`). One step under the lock, so a
    /// request either lands before (and is picked up) or finds no run (and starts one).
    pub(crate) fn next_or_end(
        &self,
        pod_id: &str,
        done: &SnapshotLimits,
        again: bool,
    ) -> Option<SnapshotLimits> {
        let mut targets = self.targets.locked();
        match targets.get(pod_id) {
            Some(t) if again && t != done => Some(t.clone()),
            _ => {
                targets.remove(pod_id);
                None
            }
        }
    }

    /// The run of the pod ended without finishing (the daemon stops).
    pub(crate) fn end(&self, pod_id: &str) {
        self.targets.locked().remove(pod_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(cpu: u64) -> SnapshotLimits {
        let mut t = SnapshotLimits::default();
        t.pod.cpu_millis = Some(cpu);
        t
    }

    #[test]
    fn the_first_request_runs_a_later_one_waits_and_the_newest_target_wins() {
        let runs = PodRuns::default();
        assert_eq!(runs.submit("p", target(1)), Submitted::Run);
        assert_eq!(runs.submit("p", target(2)), Submitted::Wait);
        assert!(runs.superseded("p", &target(1)));
        assert_eq!(runs.next_or_end("p", &target(1), true), Some(target(2)));
        assert_eq!(runs.next_or_end("p", &target(2), true), None);
        assert!(!runs.running("p"));
        assert_eq!(runs.submit("p", target(3)), Submitted::Run);
        assert_eq!(
            runs.next_or_end("p", &target(1), false),
            None,
            "not again: the run ends"
        );
    }
}
