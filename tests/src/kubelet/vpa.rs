//! What VPA's updater does next with a pod whose resize kubelet shows.
//!
//! Ported from kubernetes/autoscaler
//! `vertical-pod-autoscaler/pkg/updater/restriction/pods_inplace_restriction.go`
//! (`CanInPlaceUpdate`, `CanEvictInPlacingPod`), assuming the pod's replica group may be
//! disrupted (`isPodDisruptable`) and the feature gates are on.

use std::time::Duration;

use super::status::PodResizeCondition;

/// How often the updater looks at the pods (`--updater-interval`, 1 min by default in
/// `vertical-pod-autoscaler/pkg/updater/main.go`): an in-place resize that shows `Error` is
/// evicted by `InPlaceOrRecreate` at the first loop that sees it.
pub const UPDATER_INTERVAL: Duration = Duration::from_secs(60);

/// `DeferredResizeUpdateTimeout`.
pub const DEFERRED_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// `InProgressResizeUpdateTimeout`.
pub const IN_PROGRESS_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// The VPA update mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VpaMode {
    /// `InPlace`: never evicts.
    InPlace,
    /// `InPlaceOrRecreate`: evicts a resize that failed or took too long.
    InPlaceOrRecreate,
}

/// What the updater decides for the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VpaAction {
    /// Leave the pod; look again next loop (`InPlaceDeferred`).
    Wait,
    /// Stop trying in place until the recommendation changes (`InPlaceInfeasible`).
    WaitForNewRecommendation,
    /// Evict the pod (`InPlaceEvict`).
    Evict,
    /// No resize shown: the pod may be resized in place now (`InPlaceApproved`).
    ResizeInPlace,
}

/// The updater's decision for a pod whose resize condition is `condition`, its in-place
/// attempt started `age` ago. `InPlace` waits on everything and gives up on Infeasible or Error
/// until a new recommendation; `InPlaceOrRecreate` evicts on Infeasible, on Error, on an
/// unknown reason, on Deferred after 5 min and on in-progress (no reason) after 1 h.
pub fn vpa_next(mode: VpaMode, condition: Option<&PodResizeCondition>, age: Duration) -> VpaAction {
    let Some(condition) = condition else {
        return VpaAction::ResizeInPlace;
    };
    match mode {
        VpaMode::InPlace => match condition.reason() {
            "Infeasible" | "Error" => VpaAction::WaitForNewRecommendation,
            _ => VpaAction::Wait,
        },
        VpaMode::InPlaceOrRecreate => {
            let evict = match condition {
                PodResizeCondition::Pending { reason, .. } => {
                    reason != "Deferred" || age > DEFERRED_TIMEOUT
                }
                PodResizeCondition::InProgress { reason, message } => {
                    !(reason.is_empty() && message.is_empty()) || age > IN_PROGRESS_TIMEOUT
                }
            };
            if evict {
                VpaAction::Evict
            } else {
                VpaAction::Wait
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_progress(reason: &str, message: &str) -> PodResizeCondition {
        PodResizeCondition::InProgress {
            reason: reason.to_owned(),
            message: message.to_owned(),
        }
    }

    fn pending(reason: &str) -> PodResizeCondition {
        PodResizeCondition::Pending {
            reason: reason.to_owned(),
            message: "node full".to_owned(),
        }
    }

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn in_place_or_recreate_evicts_on_error_at_once() {
        let c = in_progress("Error", "rpc error: code = Unknown desc = refused");
        assert_eq!(
            vpa_next(VpaMode::InPlaceOrRecreate, Some(&c), SEC),
            VpaAction::Evict
        );
    }

    #[test]
    fn in_place_waits_on_error_for_a_new_recommendation() {
        let c = in_progress("Error", "refused");
        assert_eq!(
            vpa_next(VpaMode::InPlace, Some(&c), IN_PROGRESS_TIMEOUT * 2),
            VpaAction::WaitForNewRecommendation
        );
        assert_eq!(
            vpa_next(
                VpaMode::InPlace,
                Some(&pending("Deferred")),
                DEFERRED_TIMEOUT * 2
            ),
            VpaAction::Wait
        );
    }

    #[test]
    fn in_place_or_recreate_timeouts() {
        let m = VpaMode::InPlaceOrRecreate;
        let going = in_progress("", "");
        assert_eq!(
            vpa_next(m, Some(&going), IN_PROGRESS_TIMEOUT),
            VpaAction::Wait
        );
        assert_eq!(
            vpa_next(m, Some(&going), IN_PROGRESS_TIMEOUT + SEC),
            VpaAction::Evict
        );
        let deferred = pending("Deferred");
        assert_eq!(
            vpa_next(m, Some(&deferred), DEFERRED_TIMEOUT),
            VpaAction::Wait
        );
        assert_eq!(
            vpa_next(m, Some(&deferred), DEFERRED_TIMEOUT + SEC),
            VpaAction::Evict
        );
        assert_eq!(
            vpa_next(m, Some(&pending("Infeasible")), SEC),
            VpaAction::Evict
        );
    }

    #[test]
    fn no_condition_no_resize_shown() {
        assert_eq!(
            vpa_next(VpaMode::InPlace, None, SEC),
            VpaAction::ResizeInPlace
        );
    }
}
