//! A kubelet-driven decrease below usage: refused with its figures, never answered with another
//! limit.
//!
//! kubelet records the values of a container update as actuated as soon as the CRI call returns
//! OK and never sends them again (`updatePodContainerResources`, `kuberuntime_manager.go`: "we
//! can't rely on `GetPodStatus` as runtime may lag"; the allocation manager compares allocated
//! with actuated), and lowers the pod cgroup right after ([`super::pod_step`]). An interim limit
//! would be a divergence nobody sees, and the pod write below it an OOM kill. So a decrease
//! the update could not bring within reach is refused: kubelet shows the error in
//! `PodResizeInProgress` (reason `Error`) and its pod worker retries after its backoff (about
//! 10–15 s). Where only page cache stands in the way, it keeps being reclaimed after the answer
//! toward the requested limit (cgroup v2: `memory.reclaim`, or `memory.high` steps put back,
//! paced by the container's stall as staged reclaim is; never a limit write), so that kubelet's
//! retry passes its own usage check and ours. Anonymous or shared memory in the way: refused,
//! nothing reclaimed.
//!
//! The reclaim is one [`crate::resize::reclaims::ReclaimHandle`] in the engine's reclaims (one reclaimer per
//! container): kubelet asking again while it runs is answered with its progress unless usage
//! fits now (then the handle goes and the update is decided anew); any other update supersedes
//! it. Nothing is checkpointed: after a restart kubelet's next retry starts it again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::{info, warn};

use super::drive::Progress;
use super::{memory_limit, Engine};
use crate::cgroup::{container_path, CgroupIo as _, CgroupVersion};
use crate::metrics::DecreaseOutcome;
use crate::model::{Container, LinuxResources, Pod};
use crate::nri::{Rejection, UpdateReply};
use crate::policy::{below_usage_reason, bytes_text, CacheReclaim, MemoryUse, ResizeState};
use crate::resize::reclaim::{ReclaimJob, ReclaimOutcome};
use crate::resize::reclaims::ReclaimHandle;

impl Engine {
    /// Refuses a kubelet-driven decrease of `ctr` to `target` while its usage (`used`, read after
    /// the reclaim inside the update) is above it, and starts reclaiming the page cache in the
    /// way in the background where that can make it fit (cgroup v2, enforcing). In observe mode
    /// the decrease is recorded as what would happen and let through.
    pub(in crate::resize) fn refuse_below_usage(
        self: &Arc<Self>,
        pod: &Pod,
        ctr: &Container,
        desired: &LinuxResources,
        allocated: &LinuxResources,
        used: &MemoryUse,
        enforce: bool,
    ) -> Result<UpdateReply, Rejection> {
        let target = memory_limit(desired).unwrap_or(0);
        let v2 = self
            .cgroups
            .as_ref()
            .is_some_and(|c| c.version() == CgroupVersion::V2);
        let cache_in_the_way = used.unreclaimable() < target;
        // What enforcing does with the page cache (observe mode says what it would do).
        let cache = if v2 && cache_in_the_way {
            CacheReclaim::Background
        } else if self.config().memory_decrease.inline_max > 0 {
            CacheReclaim::AtNextTry
        } else {
            CacheReclaim::Off
        };
        let background = enforce && cache == CacheReclaim::Background;
        let reason = below_usage_reason(used, target, cache);
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        self.state.metrics.resize_outcome("deferred");
        self.state.metrics.decrease.outcome(if cache_in_the_way {
            DecreaseOutcome::Rejected
        } else {
            DecreaseOutcome::DeferredAnonymous
        });
        if !enforce {
            self.record(
                pod,
                ctr,
                Some(desired),
                Some(ResizeState::Proposed),
                &format!("mode = observe: would refuse: {reason}"),
            );
            return Ok(UpdateReply::default());
        }
        let state = if background {
            ResizeState::InProgress
        } else {
            ResizeState::Deferred
        };
        info!(container = %subject, %reason, "memory decrease below usage refused");
        self.record(pod, ctr, Some(desired), Some(state), &reason);
        if background {
            let kept = memory_limit(allocated).unwrap_or(u64::MAX);
            self.spawn_reclaim_toward(pod.id.clone(), ctr, target, kept);
        }
        Err(Rejection(format!(
            "memory decrease of {subject} refused: {reason}"
        )))
    }

    /// Starts the background reclaim of `ctr`'s page cache toward `target` (see the module
    /// docs); `kept`: the limit the container keeps meanwhile, for the record.
    fn spawn_reclaim_toward(
        self: &Arc<Self>,
        pod_id: String,
        ctr: &Container,
        target: u64,
        kept: u64,
    ) {
        let Ok(cgroup) = container_path(&ctr.cgroups_path) else {
            return;
        };
        let Some(cg) = self.cgroups.clone() else {
            return;
        };
        let (cancel, generation) = self.reclaims.own(&ctr.id, |cancel, generation| {
            ReclaimHandle::new(
                cancel,
                Arc::new(Notify::new()),
                pod_id,
                (target, kept),
                generation,
            )
            .toward()
        });
        let cfg = self.config();
        let md = &cfg.memory_decrease;
        let job = ReclaimJob {
            cgroup: cgroup.clone(),
            target,
            interim: kept,
            headroom: md.headroom,
            timeout: Duration::from_millis(md.timeout_ms),
            step_interval: Duration::from_millis(md.step_interval_ms),
            force_memory_high: false,
            max_stall: self.max_stall_of(&ctr.id),
            writes: self.reclaims.limit_writes(&ctr.id, generation),
        };
        let (engine, id, name) = (Arc::clone(self), ctr.id.clone(), ctr.name.clone());
        self.state.metrics.decrease.started();
        let started = Instant::now();
        self.tasks.spawn(async move {
            let outcome = engine
                .reclaim_reporting(&id, generation, &cg, job, &cancel, Progress::Toward)
                .await;
            let (o, reclaimed) =
                engine.end_toward(&id, &name, generation, target, outcome, &cancel);
            let seconds = started.elapsed().as_secs_f64();
            engine
                .state
                .metrics
                .decrease
                .finished(o, seconds, reclaimed);
            if engine.shutdown.is_cancelled() {
                return;
            }
            engine
                .off_worker(move |e| e.reclaims.retire(&id, generation))
                .await;
        });
    }

    /// The background reclaim toward `target` ended with `outcome`: its record says where it
    /// stopped (unless a newer update owns it); returns the outcome to count and the bytes
    /// reclaimed.
    fn end_toward(
        &self,
        id: &str,
        name: &str,
        generation: u64,
        target: u64,
        outcome: ReclaimOutcome,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> (DecreaseOutcome, u64) {
        match outcome {
            ReclaimOutcome::Reached { start, end, .. } => {
                info!(container = %name, usage = %bytes_text(end.usage), target = %bytes_text(target), "page cache reclaimed: usage fits the refused limit, kubelet's next try applies it");
                self.finish_record(
                    id,
                    generation,
                    Some(ResizeState::InProgress),
                    &format!(
                        "usage {} fits the requested limit {} now (page cache reclaimed); kubelet's next try applies it",
                        bytes_text(end.usage),
                        bytes_text(target)
                    ),
                );
                (
                    DecreaseOutcome::Converged,
                    start.usage.saturating_sub(end.usage),
                )
            }
            ReclaimOutcome::TimedOut {
                start,
                end,
                stall_note,
                ..
            } => {
                let reason = format!(
                    "{}{stall_note}; reclaim stopped after {} s",
                    below_usage_reason(&end, target, CacheReclaim::AtNextTry),
                    self.config().memory_decrease.timeout_ms / 1000
                );
                warn!(container = %name, %reason, "page cache reclaim toward a refused limit stopped");
                self.finish_record(id, generation, Some(ResizeState::Deferred), &reason);
                let o = if end.unreclaimable() >= target {
                    DecreaseOutcome::DeferredAnonymous
                } else {
                    DecreaseOutcome::DeferredTimeout
                };
                (o, start.usage.saturating_sub(end.usage))
            }
            ReclaimOutcome::Cancelled => (DecreaseOutcome::Superseded, 0),
            ReclaimOutcome::Failed(_) if cancel.is_cancelled() => (DecreaseOutcome::Superseded, 0),
            ReclaimOutcome::Failed(e) => {
                warn!(container = %name, error = %e, "page cache reclaim toward a refused limit failed");
                self.finish_record(
                    id,
                    generation,
                    Some(ResizeState::Deferred),
                    &format!(
                        "reclaiming page cache toward the requested limit {} failed: {e}; kubelet's next try decides again",
                        bytes_text(target)
                    ),
                );
                (DecreaseOutcome::Error, 0)
            }
        }
    }

    /// kubelet asking again for `target` while the background reclaim toward it runs: `None`
    /// when usage fits now (the reclaim ends, and the update is decided anew: it goes through)
    /// or the cgroup cannot be read (decided anew: refused as unreadable); else the refusal
    /// with the progress, the reclaim going on.
    pub(in crate::resize) fn repeat_toward(
        &self,
        ctr: &Container,
        subject: &str,
        target: u64,
    ) -> Option<Rejection> {
        let usage = self
            .cgroups
            .as_ref()
            .zip(container_path(&ctr.cgroups_path).ok())
            .and_then(|(cg, p)| cg.memory_use(&p).ok());
        match usage {
            Some(u) if u.usage > target => {
                let progress = self
                    .records
                    .view()
                    .container(&ctr.id)
                    .map(|r| r.reason)
                    .unwrap_or_default();
                Some(Rejection(format!(
                    "memory decrease of {subject} refused: {progress}"
                )))
            }
            _ => {
                self.reclaims.take(&ctr.id, "kubelet asked again: the reclaim toward the refused limit ends, the update is decided anew");
                None
            }
        }
    }
}
