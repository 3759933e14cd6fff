//! A whole-pod step that lowers a container's memory below its usage: reclaim first (within the
//! step), or stop the resize Deferred when the strategy or the memory does not allow it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tracing::warn;

use super::{deferred_outcome, memory_limit, node_has_swap, DecreaseVerdict, Engine};
use crate::cgroup::{container_path, CgroupIo, Cgroups};
use crate::metrics::DecreaseOutcome;
use crate::model::{Container, Pod};
use crate::policy::{
    bytes_text, effective_decrease_strategy, not_reclaimable_reason, plan_decrease, DecreasePlan,
    MemoryDecreaseStrategy, MemoryUse,
};
use crate::resize::executor::{StepError, StepFailure};
use crate::resize::reclaim::{reclaim_to, ReclaimJob, ReclaimOutcome};
use crate::resize::reclaims::ReclaimHandle;

impl Engine {
    /// Whole-pod resizes: brings container `ctr` under `target` before the runtime writes it.
    /// `Ok` when the limit can be written now.
    pub(in crate::resize) async fn reclaim_before_step(
        &self,
        pod: &Pod,
        ctr: &Container,
        target: u64,
    ) -> Result<(), StepFailure> {
        let Some(cg) = self.cgroups.clone() else {
            return Ok(());
        };
        let Ok(cgroup) = container_path(&ctr.cgroups_path) else {
            return Ok(());
        };
        let current = ctr.resources.as_ref().and_then(memory_limit);
        let Some(usage) = self
            .usage_before_step(pod, ctr, &cg, &cgroup, current, target)
            .await?
        else {
            return Ok(());
        };
        let cfg = self.config();
        let md = &cfg.memory_decrease;
        let DecreasePlan::Staged { interim, .. } =
            plan_decrease(current, target, usage.usage, md.headroom)
        else {
            return Ok(());
        };
        let (strategy, _) = effective_decrease_strategy(
            &pod.annotations,
            &ctr.name,
            md.strategy,
            cfg.policy.allow_annotations,
        );
        let what = format!(
            "{}: usage {} above requested limit {}",
            ctr.name,
            bytes_text(usage.usage),
            bytes_text(target)
        );
        if strategy == MemoryDecreaseStrategy::Reclaim {
            if let Some(reason) = self.below_trimmed_working_set(ctr, target, &what) {
                self.state
                    .metrics
                    .decrease
                    .outcome(DecreaseOutcome::Rejected);
                return Err(StepFailure::Deferred(reason));
            }
        }
        let verdict = DecreaseVerdict::of_strategy(strategy, &what, false);
        if let Some(o) = verdict.outcome() {
            self.state.metrics.decrease.outcome(o);
        }
        if let DecreaseVerdict::Reject(reason) | DecreaseVerdict::Restart(reason) = verdict {
            return Err(StepFailure::Deferred(reason));
        }
        // The container keeps its current limit (the interim is never above it) while reclaiming.
        let interim = current.unwrap_or(interim);
        // One reclaim per container: the one in flight (kubelet's path reclaiming toward a
        // refused limit, or an older staged decrease) ends here.
        let (cancel, generation) = self.reclaims.own(&ctr.id, |cancel, generation| {
            ReclaimHandle::new(
                cancel,
                Arc::new(Notify::new()),
                pod.id.clone(),
                (target, interim),
                generation,
            )
        });
        self.state.metrics.decrease.started();
        // Dropped before the outcome is counted (the resize's task stopped at shutdown): the
        // handle and the in-progress gauge must not outlive it.
        let mut in_flight = InFlight {
            engine: self,
            id: &ctr.id,
            generation,
            cancel: cancel.clone(),
            counted: false,
        };
        let started = Instant::now();
        let job = ReclaimJob {
            cgroup,
            target,
            interim,
            headroom: md.headroom,
            timeout: Duration::from_millis(md.timeout_ms),
            step_interval: Duration::from_millis(md.step_interval_ms),
            force_memory_high: false,
            max_stall: self.max_stall_of(&ctr.id),
            writes: self.reclaims.limit_writes(&ctr.id, generation),
        };
        let cancel2 = cancel.clone();
        let outcome = tokio::task::spawn_blocking(move || reclaim_to(&cg, &job, &cancel2, |_| {}))
            .await
            .unwrap_or_else(|e| ReclaimOutcome::Failed(format!("reclaim thread: {e}")));
        in_flight.forget_handle();
        in_flight.counted = true;
        let secs = started.elapsed().as_secs_f64();
        self.reclaim_step_result(ctr, target, interim, md.timeout_ms / 1000, outcome, secs)
            .await
    }

    /// The memory use of `ctr` before its step writes `target` over `current`. A decrease whose
    /// usage cannot be read is refused (Deferred): unchecked, a limit below usage is an OOM kill
    /// on cgroup v2, as on kubelet's path. `None`: unreadable, but the step does not lower the
    /// limit, so there is nothing to check.
    async fn usage_before_step(
        &self,
        pod: &Pod,
        ctr: &Container,
        cg: &Cgroups,
        cgroup: &std::path::Path,
        current: Option<u64>,
        target: u64,
    ) -> Result<Option<MemoryUse>, StepFailure> {
        let (cg, path) = (cg.clone(), cgroup.to_owned());
        let read = match tokio::task::spawn_blocking(move || cg.memory_use(&path)).await {
            Ok(read) => read.map_err(|e| e.to_string()),
            Err(e) => Err(format!("reading thread: {e}")),
        };
        match read {
            Ok(usage) => Ok(Some(usage)),
            Err(_) if current.is_some_and(|c| target >= c) => Ok(None),
            Err(e) => {
                warn!(container = %ctr.name, pod = %pod.full_name(), error = %e, "memory usage unreadable: the decrease is refused until it can be checked");
                self.state.metrics.decrease.outcome(DecreaseOutcome::Error);
                Err(StepFailure::Deferred(format!(
                    "{}: memory usage unreadable ({e}): a memory decrease to {} is refused until it can be checked against usage",
                    ctr.name,
                    bytes_text(target)
                )))
            }
        }
    }

    /// A whole-pod step's reclaim as the step's result: done, Deferred (the limit kept applied
    /// through the runtime), superseded or failed; the decrease metrics follow.
    async fn reclaim_step_result(
        &self,
        ctr: &Container,
        target: u64,
        interim: u64,
        timeout_secs: u64,
        outcome: ReclaimOutcome,
        secs: f64,
    ) -> Result<(), StepFailure> {
        let dec = &self.state.metrics.decrease;
        match outcome {
            ReclaimOutcome::Reached { start, end, .. } => {
                dec.finished(
                    DecreaseOutcome::Converged,
                    secs,
                    start.usage.saturating_sub(end.usage),
                );
                Ok(())
            }
            ReclaimOutcome::TimedOut {
                start,
                end,
                kept,
                stall_note,
                ..
            } => {
                let swap = node_has_swap().await;
                let o = deferred_outcome(&end, target, swap);
                dec.finished(o, secs, start.usage.saturating_sub(end.usage));
                if kept < interim {
                    let _ = self.apply_memory_limit(&ctr.id, None, kept).await;
                }
                let reason =
                    not_reclaimable_reason(&end, target, kept, timeout_secs, swap) + &stall_note;
                Err(StepFailure::Deferred(format!("{}: {reason}", ctr.name)))
            }
            ReclaimOutcome::Cancelled => {
                dec.finished(DecreaseOutcome::Superseded, secs, 0);
                Err(StepFailure::Superseded)
            }
            ReclaimOutcome::Failed(e) => {
                dec.finished(DecreaseOutcome::Error, secs, 0);
                Err(StepError::Reclaim(e).into())
            }
        }
    }
}

/// A whole-pod step's reclaim in flight: its handle in the engine's reclaims and its share of the
/// in-progress gauge, given back when it is dropped before its outcome was counted (its
/// reclaim thread is then told to stop).
struct InFlight<'a> {
    engine: &'a Engine,
    id: &'a str,
    generation: u64,
    cancel: tokio_util::sync::CancellationToken,
    counted: bool,
}

impl InFlight<'_> {
    fn forget_handle(&self) {
        self.engine.reclaims.forget(self.id, self.generation);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.counted {
            self.cancel.cancel();
            self.forget_handle();
            self.engine
                .state
                .metrics
                .decrease
                .finished(DecreaseOutcome::Superseded, 0.0, 0);
        }
    }
}
