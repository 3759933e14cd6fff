//! Accepting a staged decrease: the runtime gets the interim limit, and a reclaim task (owned
//! by the engine's tracker, checkpointed) drives the container to the requested one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::{error, info, warn};

use super::resume::{checkpoint_key, ReclaimCheckpoint};
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
        if let Some(old) = self.reclaims.locked().insert(
            ctr.id.clone(),
            ReclaimHandle {
                cancel: cancel.clone(),
                applied: Arc::clone(&applied),
                pod_id: pod_id.clone(),
                target,
                interim,
                generation,
            },
        ) {
            old.cancel.cancel();
        }
        if let Some(store) = &self.checkpoints {
            let rec = ReclaimCheckpoint {
                container_id: ctr.id.clone(),
                pod_id,
                target,
                interim,
            };
            if let Err(e) = store.save(&checkpoint_key(&ctr.id), &rec) {
                error!(container = %ctr.name, error = %e, "cannot checkpoint the staged memory decrease; it will not survive a restart");
                self.state.state_dir_problem(format!(
                    "checkpoint of the memory decrease of {} not written: {e}",
                    ctr.name
                ));
            }
        }
        self.state.metrics.decrease.started();
        let engine = Arc::clone(self);
        let id = ctr.id.clone();
        let name = ctr.name.clone();
        self.tasks.spawn(async move {
            // The runtime applies the interim limit after this handler answers: start after it.
            let _ = tokio::time::timeout(Duration::from_secs(2), applied.notified()).await;
            let outcome = engine
                .drive_reclaim(&id, &name, cgroup, target, interim, started, &cancel)
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
            let mine = {
                let mut all = engine.reclaims.locked();
                let mine = all.get(&id).is_some_and(|h| h.generation == generation);
                if mine {
                    all.remove(&id);
                }
                mine
            };
            // Not mine: superseded, and the checkpoint (if any) belongs to a newer decrease.
            if let (true, Some(store)) = (mine, &engine.checkpoints) {
                if let Err(e) = store.remove(&checkpoint_key(&id)) {
                    warn!(container = %name, error = %e, "cannot remove the reclaim checkpoint");
                }
            }
        });
    }
}
