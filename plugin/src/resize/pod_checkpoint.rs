//! Whole-pod resizes survive a restart: each in flight is checkpointed in the state directory
//! and resumed after the first synchronize (not in `mode = "Observe"`, which would write).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use super::{Engine, SnapshotLimits};
use crate::config::Mode;
use crate::model::Pod;

/// What is checkpointed for an in-flight whole-pod resize.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ResizeCheckpoint {
    pod_id: String,
    pod: String,
    target: SnapshotLimits,
}

impl Engine {
    pub(super) fn checkpoint(&self, pod: &Pod, target: &SnapshotLimits) {
        if let Some(store) = &self.checkpoints {
            let rec = ResizeCheckpoint {
                pod_id: pod.id.clone(),
                pod: pod.full_name(),
                target: target.clone(),
            };
            if let Err(e) = store.save(&checkpoint_key(&pod.id), &rec) {
                error!(pod = %pod.full_name(), error = %e, "cannot checkpoint the resize; it will not survive a restart");
                self.state.state_dir_problem(format!(
                    "checkpoint of {} not written: {e}",
                    pod.full_name()
                ));
            }
        }
    }

    /// After the first synchronize: picks up checkpointed resizes (once per process).
    /// In `mode = "Observe"` nothing is resumed (resuming writes cgroups): the checkpoints stay,
    /// their resizes are reported as Proposed, and a later synchronize in `enforce` resumes them.
    pub fn resume_checkpointed(self: &Arc<Self>) {
        if self.config().resize.mode == Mode::Observe {
            self.report_checkpoints_in_observe_mode();
            return;
        }
        if self.resumed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        self.resume_reclaims();
        let Some(store) = &self.checkpoints else {
            return;
        };
        let (records, errors) = store.load_prefixed::<ResizeCheckpoint>("pod-");
        for e in errors {
            error!(error = %e, "resize checkpoint unusable");
            self.state
                .state_dir_problem(format!("resize checkpoint unusable: {e}"));
        }
        for (_, rec) in records {
            let pod = self.state.read_model(|m| m.pod(&rec.pod_id).cloned());
            let Some(pod) = pod else {
                warn!(pod = %rec.pod, "checkpointed resize of a pod that no longer exists; dropping it");
                let _ = store.remove(&checkpoint_key(&rec.pod_id));
                continue;
            };
            info!(pod = %rec.pod, "resuming a checkpointed resize");
            let engine = Arc::clone(self);
            self.tasks.spawn(async move {
                tokio::select! {
                    r = engine.run(pod, rec.target, true) => {
                        if let Err(e) = r {
                            error!(pod = %rec.pod, error = %e, "resumed resize failed");
                        }
                    }
                    () = engine.shutdown.cancelled() => {
                        info!(pod = %rec.pod, "stopping: the resumed resize stays checkpointed");
                    }
                }
            });
        }
    }
}

pub(super) fn checkpoint_key(pod_id: &str) -> String {
    let safe: String = pod_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(100)
        .collect();
    format!("pod-{safe}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_keys_are_safe() {
        assert_eq!(checkpoint_key("abc-123"), "pod-abc-123");
        assert_eq!(checkpoint_key("../../etc"), "pod-etc");
    }
}
