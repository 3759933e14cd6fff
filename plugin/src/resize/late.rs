//! A kubelet update decided after the runtime's deadline: the runtime was answered fail-open
//! (it applied the update as asked), so the decision must act on nothing — no refusal
//! recorded, no restart, no staged decrease (see [`Deadline`]).

use tracing::warn;

use crate::nri::{Deadline, Rejection};

/// `Err` when the runtime was already answered fail-open; `Ok`: the answer will be delivered
/// (the deadline is committed), so the caller may act on it.
pub(super) fn too_late(subject: &str, deadline: &Deadline) -> Result<(), Rejection> {
    if deadline.commit() {
        return Ok(());
    }
    warn!(container = %subject, "decided after the runtime's deadline, which was answered fail-open: nothing is acted on");
    Err(Rejection(format!(
        "the decision on {subject} came after the runtime's deadline (answered fail-open)"
    )))
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
            err.0.contains("ns/p/c") && err.0.contains("fail-open"),
            "{err}"
        );
    }
}
