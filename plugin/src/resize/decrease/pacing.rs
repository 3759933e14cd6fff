//! The stall ceiling a staged decrease is paced by (see `resize/reclaim/` and
//! `policy/pacing.rs`): the node's `[memory_decrease] max_stall`, lowered by the pod's
//! `memory-decrease.nri-resize.io/max-stall` annotation.

use tracing::warn;

use super::Engine;
use crate::policy::{effective_max_stall, Share};

impl Engine {
    /// The stall ceiling of container `id`'s staged decrease.
    pub(super) fn max_stall_of(&self, id: &str) -> Share {
        let cfg = self.config();
        let annotations = self
            .state
            .read_model(|m| {
                m.container(id)
                    .and_then(|c| m.pod(&c.pod_id))
                    .map(|p| p.annotations.clone())
            })
            .unwrap_or_default();
        let (max_stall, errors) = effective_max_stall(
            &annotations,
            cfg.memory_decrease.max_stall,
            cfg.policy.allow_annotations,
        );
        for e in &errors {
            warn!(container_id = %id, error = %e, "max-stall annotation ignored");
            self.state.metrics.annotation_error();
        }
        max_stall
    }
}
