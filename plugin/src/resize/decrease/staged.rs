//! Accepting a staged decrease: the runtime gets the interim limit, and a reclaim task (owned
//! by the engine's tracker, checkpointed) drives the container to the requested one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::info;

use super::resume::ReclaimCheckpoint;
use super::{memory_limit, Engine, ReclaimHandle};
use crate::cgroup::container_path;
use crate::config::Mode;
use crate::model::{Container, LinuxResources, Pod};
use crate::nri::{ContainerUpdate, UpdateReply};
use crate::policy::{bytes_text, mib, ResizeState};
use crate::resize::reply::interim_reply;
use crate::sync::Locked as _;

impl Engine {
    /// Accepts a staged decrease: the reply for the runtime (interim limit) and the reclaim task.
    pub(in crate::resize) fn start_staged_decrease(
        self: &Arc<Self>,
        pod: &Pod,
        ctr: &Container,
        desired: &LinuxResources,
        interim: u64,
    ) -> UpdateReply {
        let target = memory_limit(desired).unwrap_or(interim);
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        if self.config().resize.mode == Mode::Observe {
            self.record(
                pod,
                ctr,
                Some(desired),
                Some(ResizeState::Proposed),
                &format!(
                    "mode = observe: would keep {} and reclaim down to {}",
                    bytes_text(interim),
                    bytes_text(target)
                ),
            );
            return UpdateReply::default();
        }
        let adjusted = interim_reply(desired, target, interim);
        let reason = format!(
            "reclaiming: limit {} requested; the cgroup holds {} until usage fits",
            bytes_text(target),
            bytes_text(interim)
        );
        info!(container = %subject, target_mib = mib(target), interim_mib = mib(interim), "memory decrease below usage: staged reclaim");
        self.record(
            pod,
            ctr,
            Some(desired),
            Some(ResizeState::InProgress),
            &reason,
        );
        self.state.metrics.resize_outcome("in_place");
        self.spawn_reclaim(pod.id.clone(), ctr, target, interim, Instant::now());
        UpdateReply {
            updates: vec![ContainerUpdate {
                container_id: ctr.id.clone(),
                resources: adjusted,
                ignore_failure: false,
            }],
            evictions: Vec::new(),
        }
    }

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
        let cancel = self.shutdown.child_token();
        let applied = Arc::new(Notify::new());
        let generation = self
            .reclaim_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let replaced = self.reclaims.locked().insert(
            ctr.id.clone(),
            ReclaimHandle::new(
                cancel.clone(),
                Arc::clone(&applied),
                pod_id.clone(),
                (target, interim),
                generation,
            )
            .pausing(self.pause_trimming(&ctr.id)),
        );
        if let Some(old) = replaced {
            old.cancel.cancel();
        }
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
                .off_worker(move |e| e.save_reclaim_checkpoint(generation, &checkpoint))
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
                .off_worker(move |e| e.retire_reclaim(&id, generation))
                .await;
        });
    }
}
