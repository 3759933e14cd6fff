//! Staged decreases survive a restart: each is checkpointed in the state directory and resumed
//! after the first synchronize; in `mode = "Observe"` they are reported, not resumed.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use super::{memory_limit, memory_only, Engine};
use crate::model::{Container, LinuxResources, Pod};
use crate::policy::{bytes_text, mib, ResizeState};

/// What survives a plugin restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ReclaimCheckpoint {
    pub(super) container_id: String,
    pub(super) pod_id: String,
    pub(super) target: u64,
    pub(super) interim: u64,
}

pub(super) fn checkpoint_key(container_id: &str) -> String {
    let safe: String = container_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(100)
        .collect();
    format!("reclaim-{safe}")
}

impl Engine {
    /// The pod, container and desired resources of a checkpointed decrease, while the container
    /// exists (its pod as the model knows it, or an empty one).
    fn checkpointed(&self, rec: &ReclaimCheckpoint) -> Option<(Pod, Container, LinuxResources)> {
        let (pod, ctr) = self.state.read_model(|m| {
            let c = m.container(&rec.container_id)?.clone();
            Some((m.pod(&c.pod_id).cloned().unwrap_or_default(), c))
        })?;
        let mut desired = ctr.resources.clone().unwrap_or_default();
        desired.merge(&memory_only(rec.target));
        Some((pod, ctr, desired))
    }

    /// `mode = "Observe"` at start: the checkpointed decreases and resizes are not resumed (that
    /// would write cgroups); each is logged and its container's record says so.
    pub(in crate::resize) fn report_checkpoints_in_observe_mode(&self) {
        let Some(store) = &self.checkpoints else {
            return;
        };
        let (reclaims, _) = store.load_prefixed::<ReclaimCheckpoint>("reclaim-");
        for (_, rec) in reclaims {
            warn!(container_id = %rec.container_id, target = %bytes_text(rec.target), "mode = observe: the checkpointed memory decrease is not resumed (it would write); kept for enforce mode");
            if let Some((pod, ctr, desired)) = self.checkpointed(&rec) {
                self.record(
                    &pod,
                    &ctr,
                    Some(&desired),
                    Some(ResizeState::Proposed),
                    &format!(
                        "mode = observe: a checkpointed decrease to {} is not resumed",
                        bytes_text(rec.target)
                    ),
                );
            }
        }
        let (pods, _) = store.load_prefixed::<serde_json::Value>("pod-");
        for (key, _) in pods {
            warn!(checkpoint = %key, "mode = observe: the checkpointed whole-pod resize is not resumed (it would write); kept for enforce mode");
        }
    }

    /// After a restart: picks up the staged decreases that were in flight.
    pub(in crate::resize) fn resume_reclaims(self: &Arc<Self>) {
        let Some(store) = &self.checkpoints else {
            return;
        };
        let (records, errors) = store.load_prefixed::<ReclaimCheckpoint>("reclaim-");
        for e in errors {
            error!(error = %e, "reclaim checkpoint unusable");
            self.state
                .state_dir_problem(format!("memory decrease checkpoint unusable: {e}"));
        }
        for (key, rec) in records {
            let Some((pod, ctr, desired)) = self.checkpointed(&rec) else {
                warn!(container_id = %rec.container_id, "checkpointed memory decrease of a container that no longer exists; dropping it");
                let _ = store.remove(&key);
                continue;
            };
            info!(container = %ctr.name, pod = %pod.full_name(), target_mib = mib(rec.target), "resuming a checkpointed memory decrease");
            self.record(
                &pod,
                &ctr,
                Some(&desired),
                Some(ResizeState::InProgress),
                &format!(
                    "reclaiming (resumed after a restart): limit {} requested",
                    bytes_text(rec.target)
                ),
            );
            let interim = ctr
                .resources
                .as_ref()
                .and_then(memory_limit)
                .unwrap_or(rec.interim);
            self.spawn_reclaim(rec.pod_id, &ctr, rec.target, interim, Instant::now());
            // Nothing to wait for: the interim limit is in place already.
            self.notify_reclaim_applied(&ctr.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_keys_are_safe() {
        assert_eq!(checkpoint_key("ab/../c d"), "reclaim-abcd");
    }
}
