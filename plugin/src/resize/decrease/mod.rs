//! Safe memory decrease inside the engine: when an update lowers a container's memory limit
//! below its usage, the strategy (`reclaim`, `restart`, `reject`; see
//! [`crate::policy::MemoryDecreaseStrategy`]) decides.
//!
//! On kubelet's path ([`decide`]) the runtime is never answered with a limit other than the one
//! asked: kubelet records an accepted update as actuated, never sends it again, and lowers the
//! pod cgroup right after it. With `reclaim`, page cache in the way is reclaimed inside the
//! update where the deadline allows; otherwise the update is refused with the figures and the
//! page cache keeps being reclaimed in the background toward the limit ([`toward`]), so that
//! kubelet's own retry goes through. The pod step that follows is judged with it
//! ([`pod_step`]).
//!
//! A whole-pod step ([`whole_pod`], nri-resize's own API) may still stage a decrease: accepted
//! with a safe interim limit, reclaimed on a blocking thread ([`super::reclaim`], driven by
//! [`drive`], task in [`staged`]) and the requested limit applied through NRI
//! `UpdateContainers` once usage fits. Each is checkpointed in the state directory and resumed
//! after a plugin restart ([`resume`]).
//!
//! One reclaim per container (its [`ReclaimHandle`]): a newer update for the container cancels
//! it at once.

mod decide;
mod drive;
#[cfg(test)]
mod kubelet_path_tests;
mod pacing;
mod pod_step;
mod resume;
mod staged;
mod toward;
mod whole_pod;

use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub(super) use self::decide::DecreaseVerdict;
use self::resume::checkpoint_key;
use super::Engine;
use crate::metrics::DecreaseOutcome;
use crate::model::{limited_bytes, LinuxResources, MemoryResources};
use crate::policy::mib;
use crate::sync::Locked as _;
use crate::trim::TrimPause;

/// A reclaim of a container in flight, the container's one: a whole-pod step's, a staged
/// decrease resumed from a checkpoint, or the background reclaim toward a limit kubelet was
/// refused ([`toward`]). A newer one cancels the one it replaces.
#[derive(Debug)]
pub(in crate::resize) struct ReclaimHandle {
    pub(super) cancel: CancellationToken,
    /// Signalled when the runtime has applied the interim limit (`PostUpdateContainer`).
    pub(super) applied: Arc<Notify>,
    pub(super) pod_id: String,
    pub(super) target: u64,
    pub(super) interim: u64,
    generation: u64,
    /// The decrease is having the runtime apply a limit right now (see
    /// [`Engine::supersede_unless_applying`]).
    applying: bool,
    /// Trimming of the container stays off while the handle lives (held for its `Drop`).
    trim_pause: Option<TrimPause>,
    /// The background reclaim toward a limit kubelet was refused ([`toward`]): no interim, no
    /// limit applied at the end; `interim` is the limit the container keeps.
    toward: bool,
}

impl ReclaimHandle {
    pub(super) fn new(
        cancel: CancellationToken,
        applied: Arc<Notify>,
        pod_id: String,
        (target, interim): (u64, u64),
        generation: u64,
    ) -> Self {
        ReclaimHandle {
            cancel,
            applied,
            pod_id,
            target,
            interim,
            generation,
            applying: false,
            trim_pause: None,
            toward: false,
        }
    }

    /// The handle of a background reclaim toward a refused limit ([`toward`]).
    pub(super) fn toward(mut self) -> Self {
        self.toward = true;
        self
    }

    /// The handle, holding `pause` (trimming of the container) for as long as it lives.
    pub(super) fn pausing(mut self, pause: Option<TrimPause>) -> Self {
        self.trim_pause = pause;
        self
    }
}

fn memory_limit(r: &LinuxResources) -> Option<u64> {
    r.memory
        .as_ref()
        .and_then(|m| m.limit)
        .and_then(limited_bytes)
}

fn memory_only(limit: u64) -> LinuxResources {
    LinuxResources {
        memory: Some(MemoryResources {
            limit: Some(i64::try_from(limit).unwrap_or(i64::MAX)),
            ..MemoryResources::default()
        }),
        ..LinuxResources::default()
    }
}

/// Whether a resize record lowers the memory limit (desired below allocated).
pub(in crate::resize) fn is_memory_decrease(r: &super::ContainerResize) -> bool {
    let (Some(d), Some(a)) = (&r.desired, &r.allocated) else {
        return false;
    };
    match (memory_limit(d), memory_limit(a)) {
        (Some(d), Some(a)) => d < a,
        (Some(_), None) => true,
        _ => false,
    }
}

/// How a staged decrease that ran out of time is counted: anonymous memory that cannot go
/// (above the target, no swap) or plain timeout. One rule for kubelet's and whole-pod decreases.
fn deferred_outcome(end: &crate::policy::MemoryUse, target: u64, swap: bool) -> DecreaseOutcome {
    if end.unreclaimable() > target && !swap {
        DecreaseOutcome::DeferredAnonymous
    } else {
        DecreaseOutcome::DeferredTimeout
    }
}

/// Whether the node has swap (anonymous memory is then reclaimable), from `/proc/meminfo`,
/// read on a blocking thread.
async fn node_has_swap() -> bool {
    super::off_worker::off_worker(crate::trim::node_has_swap).await
}

impl Engine {
    /// Makes a new reclaim of container `id` its one reclaim: `make` builds the handle from a
    /// fresh cancellation token (a child of the engine's shutdown) and generation; trimming of
    /// the container stays paused while it lives, and the reclaim it replaces, if any, is
    /// cancelled. Returns the token and the generation.
    pub(super) fn own_reclaim(
        &self,
        id: &str,
        make: impl FnOnce(CancellationToken, u64) -> ReclaimHandle,
    ) -> (CancellationToken, u64) {
        let cancel = self.shutdown.child_token();
        let generation = self
            .reclaim_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let handle = make(cancel.clone(), generation).pausing(self.pause_trimming(id));
        if let Some(old) = self.reclaims.locked().insert(id.to_owned(), handle) {
            old.cancel.cancel();
        }
        (cancel, generation)
    }

    /// Cancels the staged decrease of `container_id`, if any: a newer update supersedes it.
    pub(in crate::resize) fn supersede_reclaim(&self, container_id: &str) {
        self.end_reclaim(
            container_id,
            "newer update: staged memory decrease superseded",
        );
    }

    /// Cancels the staged decrease of `container_id`, if any, saying why (`what`). Removes its
    /// checkpoint (file I/O: call it off the async workers).
    pub(in crate::resize) fn end_reclaim(&self, container_id: &str, what: &'static str) {
        if self.take_reclaim(container_id, what) {
            self.remove_reclaim_checkpoint(container_id);
        }
    }

    /// [`Self::end_reclaim`]'s in-memory part: the decrease leaves the engine and its task is
    /// cancelled. `true` when there was one (its checkpoint is still to remove).
    pub(in crate::resize) fn take_reclaim(&self, container_id: &str, what: &'static str) -> bool {
        let ended = self.reclaims.locked().remove(container_id);
        if let Some(h) = &ended {
            info!(container_id, target_mib = mib(h.target), "{what}");
            h.cancel.cancel();
        }
        ended.is_some()
    }

    /// Removes the checkpoint of an ended staged decrease of `container_id`: it must not be
    /// resumed after a restart. A newer staged decrease writes its own after this (its task
    /// takes the same lock, and the ended one's handle is gone). Blocking file I/O.
    pub fn remove_reclaim_checkpoint(&self, container_id: &str) {
        if let Some(store) = &self.checkpoints {
            let _io = self.reclaim_checkpoint_io.locked();
            if let Err(e) = store.remove(&checkpoint_key(container_id)) {
                warn!(container_id, error = %e, "cannot remove the reclaim checkpoint");
            }
        }
    }

    /// Saves the checkpoint of staged decrease `generation` of `rec`'s container while it is
    /// still in flight (a superseded one writes nothing). Blocking file I/O.
    fn save_reclaim_checkpoint(&self, generation: u64, rec: &resume::ReclaimCheckpoint) {
        let Some(store) = &self.checkpoints else {
            return;
        };
        let _io = self.reclaim_checkpoint_io.locked();
        let own = self
            .reclaims
            .locked()
            .get(&rec.container_id)
            .is_some_and(|h| h.generation == generation);
        if !own {
            return;
        }
        if let Err(e) = store.save(&checkpoint_key(&rec.container_id), rec) {
            error!(container_id = %rec.container_id, error = %e, "cannot checkpoint the staged memory decrease; it will not survive a restart");
            self.state.state_dir_problem(format!(
                "checkpoint of the memory decrease of {} not written: {e}",
                rec.container_id
            ));
        }
    }

    /// Staged decrease `generation` of `container_id` ended on its own: it leaves the engine
    /// and its checkpoint goes, unless a newer decrease took over meanwhile (whose handle and
    /// checkpoint stay). Blocking file I/O.
    fn retire_reclaim(&self, container_id: &str, generation: u64) {
        let _io = self.reclaim_checkpoint_io.locked();
        let mine = {
            let mut all = self.reclaims.locked();
            let mine = all
                .get(container_id)
                .is_some_and(|h| h.generation == generation);
            if mine {
                all.remove(container_id);
            }
            mine
        };
        if let (true, Some(store)) = (mine, &self.checkpoints) {
            if let Err(e) = store.remove(&checkpoint_key(container_id)) {
                warn!(container_id, error = %e, "cannot remove the reclaim checkpoint");
            }
        }
    }

    /// A newer kubelet update of `container_id` while its staged decrease may be in flight:
    /// supersedes it (`true`), unless the decrease is having the runtime apply a limit at this
    /// moment (`false`: nothing changes). The runtime's writes of that apply and of the newer
    /// update would race, and the older limit could land last, over kubelet's; refused once,
    /// kubelet asks again and the newer update goes through after the apply. (Waiting here
    /// instead could deadlock: the runtime applies the plugin's update under the lock it holds
    /// while it calls this handler.) The check and the removal are one step under the reclaims
    /// lock, which the apply takes to start ([`Engine::begin_apply`]).
    pub(in crate::resize) fn supersede_unless_applying(&self, container_id: &str) -> bool {
        {
            let mut all = self.reclaims.locked();
            match all.get(container_id) {
                None => return true,
                Some(h) if h.applying => return false,
                Some(_) => {
                    if let Some(h) = all.remove(container_id) {
                        info!(
                            container_id,
                            target_mib = mib(h.target),
                            "newer update: staged memory decrease superseded"
                        );
                        h.cancel.cancel();
                    }
                }
            }
        }
        self.remove_reclaim_checkpoint(container_id);
        true
    }

    /// Staged decrease `generation` of `container_id` is about to have the runtime apply a
    /// limit: `false` when it was superseded (apply nothing); `true` marks it applying until
    /// [`Engine::end_apply`].
    pub(in crate::resize) fn begin_apply(&self, container_id: &str, generation: u64) -> bool {
        match self.reclaims.locked().get_mut(container_id) {
            Some(h) if h.generation == generation && !h.cancel.is_cancelled() => {
                h.applying = true;
                true
            }
            _ => false,
        }
    }

    /// The apply [`Engine::begin_apply`] started is over.
    pub(in crate::resize) fn end_apply(&self, container_id: &str, generation: u64) {
        if let Some(h) = self.reclaims.locked().get_mut(container_id) {
            if h.generation == generation {
                h.applying = false;
            }
        }
    }

    /// Tests: a reclaim toward refused limit `target` (kubelet's path, [`toward`]) in flight for
    /// `container_id` of `pod_id`, which keeps `kept`; its token.
    #[cfg(test)]
    pub(in crate::resize) fn reclaim_toward_in_flight_for_test(
        &self,
        pod_id: &str,
        container_id: &str,
        target: u64,
        kept: u64,
    ) -> CancellationToken {
        let cancel = CancellationToken::new();
        let generation = self
            .reclaim_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.reclaims.locked().insert(
            container_id.to_owned(),
            ReclaimHandle::new(
                cancel.clone(),
                Arc::new(Notify::new()),
                pod_id.to_owned(),
                (target, kept),
                generation,
            )
            .toward(),
        );
        cancel
    }

    /// Cancels the staged decreases of every container of `pod_id` (a newer whole-pod request).
    pub(in crate::resize) fn supersede_pod_reclaims(&self, pod_id: &str) {
        let ids: Vec<String> = self
            .reclaims
            .locked()
            .iter()
            .filter(|(_, h)| h.pod_id == pod_id)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.supersede_reclaim(&id);
        }
    }

    /// The runtime applied an update of `container_id`: a staged decrease waiting for its interim
    /// limit may start.
    pub(in crate::resize) fn notify_reclaim_applied(&self, container_id: &str) {
        if let Some(h) = self.reclaims.locked().get(container_id) {
            h.applied.notify_one();
        }
    }

    /// The staged decrease in flight for `container_id` with this target: `(interim, target)`.
    pub(in crate::resize) fn reclaim_in_flight(&self, container_id: &str) -> Option<(u64, u64)> {
        self.reclaims
            .locked()
            .get(container_id)
            .filter(|h| !h.toward)
            .map(|h| (h.interim, h.target))
    }

    /// The target of the background reclaim toward a refused limit in flight for
    /// `container_id` ([`toward`]).
    pub(in crate::resize) fn reclaim_toward_in_flight(&self, container_id: &str) -> Option<u64> {
        self.reclaims
            .locked()
            .get(container_id)
            .filter(|h| h.toward)
            .map(|h| h.target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ResizeState;
    use crate::resize::ContainerResize;

    #[test]
    fn a_waiting_memory_decrease_is_told_apart_from_other_waiting_resizes() {
        let rec = |desired: u64, allocated: Option<u64>| ContainerResize {
            desired: Some(memory_only(desired)),
            allocated: allocated.map(memory_only),
            state: Some(ResizeState::Deferred),
            ..ContainerResize::default()
        };
        assert!(is_memory_decrease(&rec(100 << 20, Some(317 << 20))));
        assert!(!is_memory_decrease(&rec(512 << 20, Some(256 << 20))));
        assert!(!is_memory_decrease(&ContainerResize::default()));
    }
}
