//! Safe memory decrease inside the engine: when an update lowers a container's memory limit
//! below its usage, the strategy (`reclaim`, `restart`, `reject`; see
//! [`crate::policy::MemoryDecreaseStrategy`]) decides. `reclaim` accepts the update with a safe
//! interim limit, reclaims on a blocking thread ([`super::reclaim`]) and applies the requested
//! limit through NRI `UpdateContainers` once usage fits, so the runtime's spec — what kubelet
//! reads back as actual — says the new limit only when it is really in place.
//!
//! One staged decrease per container: a newer update for the container cancels it at once (a
//! repeat of the same request keeps it). Each is checkpointed in the state directory and resumed
//! after a plugin restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::reclaim::{reclaim_to, ReclaimJob, ReclaimOutcome};
use super::{lock, now_ms, Engine, StepFailure};
use crate::cgroup::{container_path, CgroupIo};
use crate::config::Mode;
use crate::metrics::DecreaseOutcome;
use crate::model::{Container, LinuxResources, MemoryResources, Pod};
use crate::nri::{ContainerUpdate, UpdateReply};
use crate::policy::{
    effective_decrease_strategy, mib, not_reclaimable_reason, plan_decrease, DecreasePlan,
    MemoryDecreaseStrategy, ResizeState,
};

/// A staged decrease in flight.
#[derive(Debug)]
pub(super) struct ReclaimHandle {
    pub(super) cancel: CancellationToken,
    /// Signalled when the runtime has applied the interim limit (`PostUpdateContainer`).
    pub(super) applied: Arc<Notify>,
    pub(super) pod_id: String,
    pub(super) target: u64,
    pub(super) interim: u64,
    generation: u64,
}

/// What survives a plugin restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ReclaimCheckpoint {
    container_id: String,
    pod_id: String,
    target: u64,
    interim: u64,
}

/// The engine's answer for a memory decrease below usage (`None`: not one, carry on).
pub(super) enum DecreaseVerdict {
    /// The limit is above usage: the runtime writes it as asked.
    Direct,
    /// Accept with this memory limit now (the interim); reclaim runs.
    Interim(u64),
    /// Restart (evict) with this reason.
    Restart(String),
    /// Fail the update with this reason (`Deferred`).
    Reject(String),
}

fn memory_limit(r: &LinuxResources) -> Option<u64> {
    r.memory
        .as_ref()
        .and_then(|m| m.limit)
        .filter(|&l| l > 0 && l < super::UNLIMITED_MEMORY)
        .and_then(|l| u64::try_from(l).ok())
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
pub(super) fn is_memory_decrease(r: &super::ContainerResize) -> bool {
    let (Some(d), Some(a)) = (&r.desired, &r.allocated) else {
        return false;
    };
    match (memory_limit(d), memory_limit(a)) {
        (Some(d), Some(a)) => d < a,
        (Some(_), None) => true,
        _ => false,
    }
}

fn checkpoint_key(container_id: &str) -> String {
    let safe: String = container_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(100)
        .collect();
    format!("reclaim-{safe}")
}

/// Whether the node has swap (anonymous memory is then reclaimable), from `/proc/meminfo`.
fn node_has_swap() -> bool {
    std::fs::read_to_string("/proc/meminfo").is_ok_and(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("SwapTotal:"))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .is_some_and(|kb| kb > 0)
    })
}

impl Engine {
    /// Cancels the staged decrease of `container_id`, if any.
    pub(super) fn supersede_reclaim(&self, container_id: &str) {
        if let Some(h) = lock(&self.reclaims).remove(container_id) {
            info!(
                container_id,
                target_mib = mib(h.target),
                "newer update: staged memory decrease superseded"
            );
            h.cancel.cancel();
            // It must not be resumed after a restart; a newer staged decrease writes its own.
            if let Some(store) = &self.checkpoints {
                if let Err(e) = store.remove(&checkpoint_key(container_id)) {
                    warn!(container_id, error = %e, "cannot remove the reclaim checkpoint");
                }
            }
        }
    }

    /// Cancels the staged decreases of every container of `pod_id` (a newer whole-pod request).
    pub(super) fn supersede_pod_reclaims(&self, pod_id: &str) {
        let ids: Vec<String> = lock(&self.reclaims)
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
    pub(super) fn notify_reclaim_applied(&self, container_id: &str) {
        if let Some(h) = lock(&self.reclaims).get(container_id) {
            h.applied.notify_one();
        }
    }

    /// The staged decrease in flight for `container_id` with this target: `(interim, target)`.
    pub(super) fn reclaim_in_flight(&self, container_id: &str) -> Option<(u64, u64)> {
        lock(&self.reclaims)
            .get(container_id)
            .map(|h| (h.interim, h.target))
    }

    /// Decides a kubelet-driven memory decrease from `allocated` to `desired` (see the module
    /// docs). Reads the container's usage: one cgroupfs read, within the NRI deadline.
    pub(super) fn decide_decrease(
        &self,
        pod: &Pod,
        ctr: &Container,
        allocated: &LinuxResources,
        desired: &LinuxResources,
    ) -> DecreaseVerdict {
        let Some(target) = memory_limit(desired) else {
            return DecreaseVerdict::Direct;
        };
        let old = memory_limit(allocated);
        if old.is_some_and(|o| o <= target) {
            return DecreaseVerdict::Direct;
        }
        let Some(cg) = self.cgroups.as_ref() else {
            return DecreaseVerdict::Direct;
        };
        let usage = match container_path(&ctr.cgroups_path).and_then(|p| cg.memory_use(&p)) {
            Ok(u) => u,
            Err(e) => {
                warn!(container = %ctr.name, pod = %pod.full_name(), error = %e, "memory usage unreadable; the runtime writes the decrease as asked");
                return DecreaseVerdict::Direct;
            }
        };
        let cfg = self.config();
        let md = &cfg.memory_decrease;
        let DecreasePlan::Staged { interim, .. } =
            plan_decrease(old, target, usage.usage, md.headroom)
        else {
            self.state.metrics.decrease.outcome(DecreaseOutcome::Direct);
            return DecreaseVerdict::Direct;
        };
        let (strategy, errors) = effective_decrease_strategy(
            &pod.annotations,
            &ctr.name,
            md.strategy,
            cfg.policy.allow_annotations,
        );
        for e in &errors {
            warn!(pod = %pod.full_name(), container = %ctr.name, error = %e, "memory-decrease annotation ignored");
            self.state.metrics.annotation_error();
        }
        let what = format!(
            "usage {} MiB above requested limit {} MiB",
            mib(usage.usage),
            mib(target)
        );
        if strategy == MemoryDecreaseStrategy::Reclaim
            && cfg.resize.mode == Mode::Enforce
            && self.reclaim_inline(ctr, target, &usage, md.inline_max)
        {
            return DecreaseVerdict::Direct;
        }
        match strategy {
            MemoryDecreaseStrategy::Reject => {
                self.state
                    .metrics
                    .decrease
                    .outcome(DecreaseOutcome::Rejected);
                DecreaseVerdict::Reject(format!("{what} (memory-decrease strategy reject)"))
            }
            MemoryDecreaseStrategy::Restart => {
                self.state
                    .metrics
                    .decrease
                    .outcome(DecreaseOutcome::Restarted);
                DecreaseVerdict::Restart(format!(
                    "{what}: restarting under the new limit (memory-decrease strategy restart)"
                ))
            }
            MemoryDecreaseStrategy::Reclaim => DecreaseVerdict::Interim(interim),
        }
    }

    /// The fast path: when what must go is page cache (anonymous and shared memory fit under
    /// the target) and is at most `inline_max`, one reclaim inside the update — v1: the target
    /// limit written directly (the kernel reclaims inside the write or refuses with `EBUSY`,
    /// never an OOM kill), v2: one `memory.reclaim`. `true`: usage fits the target now, and the
    /// runtime writes the limit as asked.
    fn reclaim_inline(
        &self,
        ctr: &Container,
        target: u64,
        usage: &crate::policy::MemoryUse,
        inline_max: u64,
    ) -> bool {
        let need = usage.usage.saturating_sub(target);
        if need == 0 || need > inline_max || usage.unreclaimable() >= target {
            return false;
        }
        let (Some(cg), Ok(path)) = (self.cgroups.as_ref(), container_path(&ctr.cgroups_path))
        else {
            return false;
        };
        let started = Instant::now();
        let fits = match cg.version() {
            crate::cgroup::CgroupVersion::V1 => cg.set_memory_limit(&path, Some(target)).is_ok(),
            crate::cgroup::CgroupVersion::V2 => {
                let _ = cg.reclaim(&path, crate::policy::reclaim_request(usage.usage, target));
                cg.memory_use(&path).is_ok_and(|u| u.usage <= target)
            }
        };
        if fits {
            info!(container = %ctr.name, target_mib = mib(target), reclaimed_mib = mib(need), took_ms = started.elapsed().as_millis(), "page cache reclaimed inside the update");
            self.state
                .metrics
                .decrease
                .inline(need, started.elapsed().as_secs_f64());
        }
        fits
    }

    /// Accepts a staged decrease: the reply for the runtime (interim limit) and the reclaim task.
    pub(super) fn start_staged_decrease(
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
                    "mode = observe: would keep {} MiB and reclaim down to {} MiB",
                    mib(interim),
                    mib(target)
                ),
            );
            return UpdateReply::default();
        }
        let mut adjusted = desired.clone();
        adjusted
            .memory
            .get_or_insert_with(MemoryResources::default)
            .limit = Some(i64::try_from(interim).unwrap_or(i64::MAX));
        let reason = format!(
            "reclaiming: limit {} MiB requested, {} MiB kept until usage fits",
            mib(target),
            mib(interim)
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

    fn spawn_reclaim(
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
        let cancel = CancellationToken::new();
        let applied = Arc::new(Notify::new());
        let generation = self
            .reclaim_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(old) = lock(&self.reclaims).insert(
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
        tokio::spawn(async move {
            // The runtime applies the interim limit after this handler answers: start after it.
            let _ = tokio::time::timeout(Duration::from_secs(2), applied.notified()).await;
            let outcome = engine
                .drive_reclaim(&id, &name, cgroup, target, interim, started, &cancel)
                .await;
            let seconds = started.elapsed().as_secs_f64();
            let (o, reclaimed) = outcome;
            engine
                .state
                .metrics
                .decrease
                .finished(o, seconds, reclaimed);
            let mine = {
                let mut all = lock(&engine.reclaims);
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

    /// Runs reclaim until the target is applied, time runs out, or a newer update takes over.
    #[expect(
        clippy::too_many_arguments,
        reason = "one staged decrease: its container, its limits and its clock"
    )]
    async fn drive_reclaim(
        &self,
        id: &str,
        name: &str,
        cgroup: PathBuf,
        target: u64,
        interim: u64,
        started: Instant,
        cancel: &CancellationToken,
    ) -> (DecreaseOutcome, u64) {
        let cfg = self.config();
        let md = &cfg.memory_decrease;
        let timeout = Duration::from_millis(md.timeout_ms);
        let Some(cg) = self.cgroups.clone() else {
            return (DecreaseOutcome::Error, 0);
        };
        let mut first_usage = None;
        loop {
            let job = ReclaimJob {
                cgroup: cgroup.clone(),
                target,
                interim,
                headroom: md.headroom,
                timeout: timeout.saturating_sub(started.elapsed()),
                step_interval: Duration::from_millis(md.step_interval_ms),
                force_memory_high: false,
            };
            let (cg2, cancel2) = (cg.clone(), cancel.clone());
            let outcome =
                tokio::task::spawn_blocking(move || reclaim_to(&cg2, &job, &cancel2, |_| {}))
                    .await
                    .unwrap_or_else(|e| ReclaimOutcome::Failed(format!("reclaim thread: {e}")));
            match outcome {
                ReclaimOutcome::Reached {
                    start, end, passes, ..
                } => {
                    let before = *first_usage.get_or_insert(start.usage);
                    if cancel.is_cancelled() {
                        return (
                            DecreaseOutcome::Superseded,
                            before.saturating_sub(end.usage),
                        );
                    }
                    match self.apply_memory_limit(id, target).await {
                        Ok(()) => {
                            info!(container = %name, target_mib = mib(target), passes, took_ms = started.elapsed().as_millis(), "staged memory decrease done: the requested limit is in place");
                            self.finish_record(id, None, "");
                            return (DecreaseOutcome::Converged, before.saturating_sub(end.usage));
                        }
                        Err(e) if started.elapsed() < timeout && !cancel.is_cancelled() => {
                            warn!(container = %name, error = %e, "applying the requested limit failed (usage grew?); reclaiming again");
                        }
                        Err(e) => {
                            error!(container = %name, error = %e, "applying the requested memory limit failed");
                            self.finish_record(
                                id,
                                Some(ResizeState::Error),
                                &format!("applying the requested memory limit failed: {e}"),
                            );
                            return (DecreaseOutcome::Error, before.saturating_sub(end.usage));
                        }
                    }
                }
                ReclaimOutcome::TimedOut {
                    start, end, kept, ..
                } => {
                    let before = *first_usage.get_or_insert(start.usage);
                    let mut kept = kept;
                    if kept < interim {
                        // The runtime's spec says what the cgroup holds.
                        if let Err(e) = self.apply_memory_limit(id, kept).await {
                            warn!(container = %name, error = %e, "could not lower the kept limit through the runtime; the interim limit stays");
                            kept = interim;
                        }
                    }
                    let swap = node_has_swap();
                    let reason =
                        not_reclaimable_reason(&end, target, kept, md.timeout_ms / 1000, swap);
                    warn!(container = %name, %reason, "staged memory decrease deferred");
                    self.finish_record(id, Some(ResizeState::Deferred), &reason);
                    let o = if end.unreclaimable() > target && !swap {
                        DecreaseOutcome::DeferredAnonymous
                    } else {
                        DecreaseOutcome::DeferredTimeout
                    };
                    return (o, before.saturating_sub(end.usage));
                }
                ReclaimOutcome::Cancelled => return (DecreaseOutcome::Superseded, 0),
                ReclaimOutcome::Failed(e) => {
                    error!(container = %name, error = %e, "staged memory decrease failed");
                    self.finish_record(id, Some(ResizeState::Error), &e);
                    return (DecreaseOutcome::Error, 0);
                }
            }
        }
    }

    /// Asks the runtime to set the memory limit of `id` (its spec follows, so `ContainerStatus`
    /// reports it) and records it as allocated.
    async fn apply_memory_limit(&self, id: &str, limit: u64) -> Result<(), String> {
        let resources = memory_only(limit);
        let failed = self
            .link
            .update_containers(
                &[ContainerUpdate {
                    container_id: id.to_string(),
                    resources: resources.clone(),
                    ignore_failure: false,
                }],
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        if !failed.is_empty() {
            return Err("the runtime refused the update".into());
        }
        self.state
            .write_model(|m| m.apply_resources(id, &resources));
        let allocated = self
            .state
            .read_model(|m| m.container(id).and_then(|c| c.resources.clone()));
        if let Some(r) = lock(&self.containers).get_mut(id) {
            r.allocated = allocated;
        }
        Ok(())
    }

    fn finish_record(&self, id: &str, state: Option<ResizeState>, reason: &str) {
        if let Some(r) = lock(&self.containers).get_mut(id) {
            r.state = state;
            r.reason = reason.to_string();
            r.updated_ms = now_ms();
        }
    }

    /// Whole-pod resizes: brings container `ctr` under `target` before the runtime writes it.
    /// `Ok` when the limit can be written now.
    #[expect(
        clippy::too_many_lines,
        reason = "one staged decrease read top to bottom: strategy, reclaim, outcome"
    )]
    pub(super) async fn reclaim_before_step(
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
        let Ok(usage) = cg.memory_use(&cgroup) else {
            return Ok(());
        };
        let cfg = self.config();
        let md = &cfg.memory_decrease;
        let current = ctr.resources.as_ref().and_then(memory_limit);
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
            "{}: usage {} MiB above requested limit {} MiB",
            ctr.name,
            mib(usage.usage),
            mib(target)
        );
        match strategy {
            MemoryDecreaseStrategy::Reject => {
                self.state
                    .metrics
                    .decrease
                    .outcome(DecreaseOutcome::Rejected);
                return Err(StepFailure::Deferred(format!(
                    "{what} (memory-decrease strategy reject)"
                )));
            }
            MemoryDecreaseStrategy::Restart => {
                self.state
                    .metrics
                    .decrease
                    .outcome(DecreaseOutcome::Rejected);
                return Err(StepFailure::Deferred(format!("{what}: memory-decrease strategy restart, and a whole-pod resize cannot restart a container")));
            }
            MemoryDecreaseStrategy::Reclaim => {}
        }
        // The container keeps its current limit (the interim is never above it) while reclaiming.
        let interim = current.unwrap_or(interim);
        let cancel = CancellationToken::new();
        let generation = self
            .reclaim_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.reclaims).insert(
            ctr.id.clone(),
            ReclaimHandle {
                cancel: cancel.clone(),
                applied: Arc::new(Notify::new()),
                pod_id: pod.id.clone(),
                target,
                interim,
                generation,
            },
        );
        self.state.metrics.decrease.started();
        let started = Instant::now();
        let job = ReclaimJob {
            cgroup,
            target,
            interim,
            headroom: md.headroom,
            timeout: Duration::from_millis(md.timeout_ms),
            step_interval: Duration::from_millis(md.step_interval_ms),
            force_memory_high: false,
        };
        let cancel2 = cancel.clone();
        let outcome = tokio::task::spawn_blocking(move || reclaim_to(&cg, &job, &cancel2, |_| {}))
            .await
            .unwrap_or_else(|e| ReclaimOutcome::Failed(format!("reclaim thread: {e}")));
        {
            let mut all = lock(&self.reclaims);
            if all.get(&ctr.id).is_some_and(|h| h.generation == generation) {
                all.remove(&ctr.id);
            }
        }
        let secs = started.elapsed().as_secs_f64();
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
                start, end, kept, ..
            } => {
                let o = if end.unreclaimable() > target {
                    DecreaseOutcome::DeferredAnonymous
                } else {
                    DecreaseOutcome::DeferredTimeout
                };
                dec.finished(o, secs, start.usage.saturating_sub(end.usage));
                if kept < interim {
                    let _ = self.apply_memory_limit(&ctr.id, kept).await;
                }
                let reason = not_reclaimable_reason(
                    &end,
                    target,
                    kept,
                    md.timeout_ms / 1000,
                    node_has_swap(),
                );
                Err(StepFailure::Deferred(format!("{}: {reason}", ctr.name)))
            }
            ReclaimOutcome::Cancelled => {
                dec.finished(DecreaseOutcome::Superseded, secs, 0);
                Err(StepFailure::Superseded)
            }
            ReclaimOutcome::Failed(e) => {
                dec.finished(DecreaseOutcome::Error, secs, 0);
                Err(StepFailure::Failed(e))
            }
        }
    }

    /// After a restart: picks up the staged decreases that were in flight.
    pub(super) fn resume_reclaims(self: &Arc<Self>) {
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
            let found = self.state.read_model(|m| {
                let c = m.container(&rec.container_id)?.clone();
                let p = m.pod(&c.pod_id).cloned().unwrap_or_default();
                Some((p, c))
            });
            let Some((pod, ctr)) = found else {
                warn!(container_id = %rec.container_id, "checkpointed memory decrease of a container that no longer exists; dropping it");
                let _ = store.remove(&key);
                continue;
            };
            info!(container = %ctr.name, pod = %pod.full_name(), target_mib = mib(rec.target), "resuming a checkpointed memory decrease");
            let mut desired = ctr.resources.clone().unwrap_or_default();
            desired.merge(&memory_only(rec.target));
            self.record(
                &pod,
                &ctr,
                Some(&desired),
                Some(ResizeState::InProgress),
                &format!(
                    "reclaiming (resumed after a restart): limit {} MiB requested",
                    mib(rec.target)
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
        assert_eq!(checkpoint_key("ab/../c d"), "reclaim-abcd");
    }
}
