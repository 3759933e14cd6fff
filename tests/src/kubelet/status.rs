//! What kubelet shows of a resize: the pod's resize conditions and its events.

/// A pod resize condition as kubelet's status manager sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodResizeCondition {
    /// `PodResizePending`: allocation waits (reason `Deferred`) or never can (`Infeasible`).
    Pending {
        /// `Deferred` or `Infeasible`.
        reason: String,
        /// Why.
        message: String,
    },
    /// `PodResizeInProgress`: allocated, not all actuated. Reason empty while it goes on,
    /// `Error` with the failure's text after a failed actuation.
    InProgress {
        /// `""` or `Error`.
        reason: String,
        /// `""` or the error's text.
        message: String,
    },
}

impl PodResizeCondition {
    /// The condition's type, as in the pod's status.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Pending { .. } => "PodResizePending",
            Self::InProgress { .. } => "PodResizeInProgress",
        }
    }

    /// Its reason.
    pub fn reason(&self) -> &str {
        match self {
            Self::Pending { reason, .. } | Self::InProgress { reason, .. } => reason,
        }
    }

    /// Its message.
    pub fn message(&self) -> &str {
        match self {
            Self::Pending { message, .. } | Self::InProgress { message, .. } => message,
        }
    }
}

/// The `PodResizeInProgress` condition after a sync (`SyncPod` → the resize's sync result;
/// kubernetes/kubernetes#130902 "surface pod resize actuation errors in pod resize
/// conditions"): reason `Error` and the error's text when actuation failed; no reason while
/// allocated and actuated still differ; none once they agree (`IsPodResizeInProgress`).
pub fn condition_after_sync(in_progress: bool, error: Option<&str>) -> Option<PodResizeCondition> {
    match (error, in_progress) {
        (Some(e), _) => Some(PodResizeCondition::InProgress {
            reason: "Error".to_owned(),
            message: e.to_owned(),
        }),
        (None, true) => Some(PodResizeCondition::InProgress {
            reason: String::new(),
            message: String::new(),
        }),
        (None, false) => None,
    }
}

/// The text kubelet's sync result carries for a CRI error: Go's `status.Error` string of the
/// gRPC error the runtime returned (`rpc error: code = … desc = …`), the runtime's message in it.
pub fn runtime_error_text(code: tonic::Code, message: &str) -> String {
    format!("rpc error: code = {code:?} desc = {message}")
}

/// A Kubernetes event kubelet records on the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletEvent {
    /// `Normal` or `Warning`.
    pub kind: &'static str,
    /// The event's reason.
    pub reason: &'static str,
    /// Its message.
    pub message: String,
}

/// The Warning event of a failed resize: reason `ResizeError`, the error's text. The reason
/// is the project's (issue 36); it was not found in the kubelet sources read for this model,
/// which show the failure in the condition above and as the pod worker's failed sync.
pub fn event_after_sync(error: Option<&str>) -> Option<KubeletEvent> {
    error.map(|e| KubeletEvent {
        kind: "Warning",
        reason: "ResizeError",
        message: e.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_update_shows_error_and_the_runtimes_message() {
        let text = runtime_error_text(
            tonic::Code::Unknown,
            "usage 300Mi above the requested limit 100Mi",
        );
        assert_eq!(
            text,
            "rpc error: code = Unknown desc = usage 300Mi above the requested limit 100Mi"
        );
        let c = condition_after_sync(true, Some(&text)).expect("a condition");
        assert_eq!(c.type_name(), "PodResizeInProgress");
        assert_eq!(c.reason(), "Error");
        assert_eq!(c.message(), text);
        let e = event_after_sync(Some(&text)).expect("an event");
        assert_eq!((e.kind, e.reason), ("Warning", "ResizeError"));
    }

    #[test]
    fn in_progress_without_reason_then_nothing_when_done() {
        let c = condition_after_sync(true, None).expect("in progress");
        assert_eq!((c.reason(), c.message()), ("", ""));
        assert_eq!(condition_after_sync(false, None), None);
        assert_eq!(event_after_sync(None), None);
    }
}
