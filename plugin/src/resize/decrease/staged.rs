//! A staged decrease's reclaim task (owned by the engine's tracker, checkpointed), which drives
//! the container from its interim limit to the requested one. Whole-pod steps and checkpoints
//! only: kubelet's path never answers with an interim ([`super::toward`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::info;

use super::resume::ReclaimCheckpoint;
use super::Engine;
use crate::cgroup::container_path;
use crate::model::Container;
use crate::resize::reclaims::ReclaimHandle;

impl Engine {
    /// Starts the reclaim task of a staged decrease of `ctr` (a whole-pod step's, or one resumed
    /// from its checkpoint) toward `target` while the container holds `interim`.
    pub(super) fn spawn_reclaim(
        self: &Arc<Self>,
        pod_id: String,
        ctr: &Container,
        target: u64,
        interim: u64,
        started: Instant,
    ) {
        let Ok(cgroup) = container_path(&ctr.cgroups_path) else {
            return;
        };
        let applied = Arc::new(Notify::new());
        let (cancel, generation) = self.reclaims.own(&ctr.id, |cancel, generation| {
            ReclaimHandle::new(
                cancel,
                Arc::clone(&applied),
                pod_id.clone(),
                (target, interim),
                generation,
            )
        });
        let checkpoint = ReclaimCheckpoint {
            container_id: ctr.id.clone(),
            pod_id,
            target,
            interim,
        };
        self.state.metrics.decrease.started();
        let engine = Arc::clone(self);
        let id = ctr.id.clone();
        let name = ctr.name.clone();
        self.tasks.spawn(async move {
            // The checkpoint is written here, not in the handler: after the handler committed
            // to its answer only in-memory work may delay that answer (see `Deadline`).
            engine
                .off_worker(move |e| {
                    e.reclaims
                        .save_checkpoint(&checkpoint.container_id, generation, &checkpoint);
                })
                .await;
            // The runtime applies the interim limit after this handler answers: start after it.
            let _ = tokio::time::timeout(Duration::from_secs(2), applied.notified()).await;
            let outcome = engine
                .drive_reclaim(
                    &id, &name, cgroup, target, interim, generation, started, &cancel,
                )
                .await;
            if engine.shutdown.is_cancelled() {
                // Stopping, not superseded: the record and the checkpoint stay for the next start.
                info!(container = %name, "stopping: the staged memory decrease stays checkpointed");
                return;
            }
            let seconds = started.elapsed().as_secs_f64();
            let (o, reclaimed) = outcome;
            engine
                .state
                .metrics
                .decrease
                .finished(o, seconds, reclaimed);
            // Superseded: the handle and the checkpoint (if any) belong to a newer decrease.
            engine
                .off_worker(move |e| e.reclaims.retire(&id, generation))
                .await;
        });
    }
}
