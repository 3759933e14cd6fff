//! A kubelet update not decided within the runtime's deadline. The transport answered without
//! the decision: fail-open (the runtime applied the update as asked), or, for a memory
//! decrease, a refusal ([`Engine::refuse_undecided_decrease`]: an unchecked decrease below
//! usage OOM-kills on cgroup v2). Either way the late decision must act on nothing — no refusal
//! recorded, no restart, no staged decrease (see [`Deadline`]).

use tracing::{error, warn};

use super::Engine;
use crate::clock::now_ms;
use crate::config::Mode;
use crate::metrics::DecreaseOutcome;
use crate::nri::{Deadline, Rejection};
use crate::policy::ResizeState;

/// `Err` when the runtime was already answered without this decision; `Ok`: the answer will
/// be delivered (the deadline is committed), so the caller may act on it.
pub(super) fn too_late(subject: &str, deadline: &Deadline) -> Result<(), Rejection> {
    if deadline.commit() {
        return Ok(());
    }
    warn!(container = %subject, "decided after the runtime's deadline, which was answered without it: nothing is acted on");
    Err(Rejection(format!(
        "the decision on {subject} came after the runtime's deadline (already answered)"
    )))
}

/// Why an undecided memory decrease is refused (the record's reason and kubelet's message).
const UNDECIDED_DECREASE: &str = "the memory decrease could not be checked against usage within the runtime's deadline; refused rather than written unchecked (a limit below usage is an OOM kill on cgroup v2), kubelet asks again";

impl Engine {
    /// The kubelet update of `container_id`, a memory decrease, was not decided within the
    /// runtime's deadline (a slow usage read, a reclaim pass that ran long): when enforcing it is
    /// refused, recorded `Deferred` with the reason and counted; observing, the runtime writes
    /// it as asked (`None`), as it would without the plugin.
    pub fn refuse_undecided_decrease(
        &self,
        container_id: &str,
        subject: &str,
    ) -> Option<Rejection> {
        if self.config().resize.mode != Mode::Enforce {
            return None;
        }
        error!(container = %subject, "memory decrease not decided within the runtime's deadline: refused");
        let known = self.state.read_model(|m| {
            m.container(container_id)
                .map(|c| (c.pod_id.clone(), c.name.clone()))
        });
        self.records.upsert_container(container_id, |r| {
            if let Some((pod_id, name)) = known {
                r.pod_id = pod_id;
                r.container = name;
            }
            r.state = Some(ResizeState::Deferred);
            r.reason = UNDECIDED_DECREASE.to_string();
            r.updated_ms = now_ms();
            r.deferred_target = None;
        });
        self.state.metrics.resize_outcome("deferred");
        self.state
            .metrics
            .decrease
            .outcome(DecreaseOutcome::Rejected);
        Some(Rejection(format!(
            "resize of {subject} refused: {UNDECIDED_DECREASE}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn on_time_commits_and_late_refuses() {
        let d = Deadline::after(Duration::from_secs(5));
        assert!(too_late("ns/p/c", &d).is_ok());
        let late = Deadline::after(Duration::from_secs(5));
        assert!(late.expire(), "the transport gave up first");
        let err = too_late("ns/p/c", &late).unwrap_err();
        assert!(
            err.0.contains("ns/p/c") && err.0.contains("already answered"),
            "{err}"
        );
    }
}
