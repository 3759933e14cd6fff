//! Staged decreases survive a restart: each is checkpointed in the state directory and resumed
//! after the first synchronize; in `mode = "Observe"` they are reported, not resumed.
//!
//! Only checkpoints written by an earlier nri-resize remain to resume: kubelet's path no longer
//! stages a decrease behind an interim limit ([`super::toward`]). Such a container holds the
//! interim while kubelet believes the target in place (it never sends an accepted update
//! again), so the decrease is finished here, once, when the container still holds the interim
//! the checkpoint names; a container whose limit changed since (a newer update) is left alone
//! and its checkpoint dropped.

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
            let holds = ctr.resources.as_ref().and_then(memory_limit);
            if !still_staged(&rec, holds) {
                warn!(container = %ctr.name, pod = %pod.full_name(), target = %bytes_text(rec.target), interim = %bytes_text(rec.interim), holds = ?holds.map(bytes_text), "checkpointed memory decrease not resumed: the container's limit changed since it was checkpointed; dropping it");
                let _ = store.remove(&key);
                continue;
            }
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
            self.spawn_reclaim(rec.pod_id, &ctr, rec.target, rec.interim, Instant::now());
            // Nothing to wait for: the interim limit is in place already.
            self.reclaims.notify_applied(&ctr.id);
        }
    }
}

/// Whether a checkpointed decrease is still what the container's spec says: it holds the
/// interim limit the checkpoint names (anything else, a newer update changed it).
fn still_staged(rec: &ReclaimCheckpoint, holds: Option<u64>) -> bool {
    holds == Some(rec.interim) && rec.target < rec.interim
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_resumed_only_while_the_container_holds_its_interim() {
        const MI: u64 = 1 << 20;
        let rec = ReclaimCheckpoint {
            container_id: "c".into(),
            pod_id: "p".into(),
            target: 100 * MI,
            interim: 317 * MI,
        };
        assert!(still_staged(&rec, Some(317 * MI)));
        // A newer update took the container elsewhere (up, or down to the target itself), or
        // the limit went: resuming would write over it.
        assert!(!still_staged(&rec, Some(512 * MI)));
        assert!(!still_staged(&rec, Some(100 * MI)));
        assert!(!still_staged(&rec, None));
    }
}
