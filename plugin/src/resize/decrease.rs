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

use super::reclaim::{self, reclaim_to, ReclaimJob, ReclaimOutcome};
use super::{Engine, StepFailure};
use crate::cgroup::{container_path, CgroupIo};
use crate::clock::now_ms;
use crate::config::Mode;
use crate::metrics::DecreaseOutcome;
use crate::model::{Container, LinuxResources, MemoryResources, Pod};
use crate::nri::{ContainerUpdate, Deadline, Rejection, UpdateReply};
use crate::policy::{
    bytes_text, effective_decrease_strategy, memory_limit_text, mib, not_reclaimable_reason,
    plan_decrease, DecreasePlan, MemoryDecreaseStrategy, ResizeState,
};
use crate::sync::Locked as _;

/// What one pass of the inline reclaim asks for.
const INLINE_CHUNK: u64 = 64 << 20;
/// The most the inline reclaim may take of the runtime's deadline (it takes half of what is
/// left, at most this).
const INLINE_TIME: Duration = Duration::from_millis(500);

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
        .filter(|&l| l > 0 && u64::try_from(l).is_ok_and(|b| b < crate::policy::UNLIMITED_BYTES))
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
    use procfs::Current as _;
    procfs::Meminfo::current().is_ok_and(|m| m.swap_total > 0)
}

impl Engine {
    /// Cancels the staged decrease of `container_id`, if any.
    pub(super) fn supersede_reclaim(&self, container_id: &str) {
        if let Some(h) = self.reclaims.locked().remove(container_id) {
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
    pub(super) fn notify_reclaim_applied(&self, container_id: &str) {
        if let Some(h) = self.reclaims.locked().get(container_id) {
            h.applied.notify_one();
        }
    }

    /// The staged decrease in flight for `container_id` with this target: `(interim, target)`.
    pub(super) fn reclaim_in_flight(&self, container_id: &str) -> Option<(u64, u64)> {
        self.reclaims
            .locked()
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
        deadline: &Deadline,
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
            "usage {} above requested limit {}",
            bytes_text(usage.usage),
            bytes_text(target)
        );
        if strategy == MemoryDecreaseStrategy::Reclaim
            && cfg.resize.mode == Mode::Enforce
            && self.reclaim_inline(ctr, target, &usage, md.inline_max, deadline)
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
    /// the target), reclaim inside the update, bounded by time: half of what is left of the
    /// runtime's deadline, at most [`INLINE_TIME`]. It reclaims in [`INLINE_CHUNK`] passes —
    /// v1: the limit lowered a chunk at a time (the kernel reclaims inside the write or refuses
    /// with `EBUSY`, never an OOM kill), v2: `memory.reclaim` a chunk at a time — and stops when
    /// usage fits or the time is spent; the decrease then continues as a staged one. `inline_max`
    /// (0: off) caps the bytes tried. `true`: usage fits the target now, and the runtime writes
    /// the limit as asked.
    fn reclaim_inline(
        &self,
        ctr: &Container,
        target: u64,
        usage: &crate::policy::MemoryUse,
        inline_max: u64,
        deadline: &Deadline,
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
        let until = started + (deadline.remaining() / 2).min(INLINE_TIME);
        let mut now_usage = usage.usage;
        let fits = loop {
            if now_usage <= target {
                break match cg.version() {
                    // The target itself, now that usage fits: the runtime's write is then a no-op.
                    crate::cgroup::CgroupVersion::V1 => {
                        cg.set_memory_limit(&path, Some(target)).is_ok()
                    }
                    crate::cgroup::CgroupVersion::V2 => true,
                };
            }
            if Instant::now() >= until {
                break false;
            }
            let step = match cg.version() {
                crate::cgroup::CgroupVersion::V1 => {
                    let next = now_usage.saturating_sub(INLINE_CHUNK).max(target);
                    cg.set_memory_limit(&path, Some(next))
                }
                crate::cgroup::CgroupVersion::V2 => cg.reclaim(
                    &path,
                    crate::policy::reclaim_request(now_usage, target).min(INLINE_CHUNK),
                ),
            };
            match (step, cg.memory_use(&path)) {
                (Ok(()) | Err(crate::cgroup::CgroupError::Again { .. }), Ok(u))
                    if u.usage < now_usage =>
                {
                    now_usage = u.usage;
                }
                // Nothing more comes out (or the cgroup is unreadable): staged, which waits.
                _ => break false,
            }
        };
        let took = started.elapsed();
        if fits {
            info!(container = %ctr.name, target_mib = mib(target), reclaimed_mib = mib(need), took_ms = took.as_millis(), "page cache reclaimed inside the update");
            self.state.metrics.decrease.inline(need, took.as_secs_f64());
        } else {
            info!(container = %ctr.name, target_mib = mib(target), left_mib = mib(now_usage.saturating_sub(target)), took_ms = took.as_millis(), "inline reclaim ran out of its share of the deadline; the decrease continues staged");
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
                    "mode = observe: would keep {} and reclaim down to {}",
                    bytes_text(interim),
                    bytes_text(target)
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
            let outcome = self
                .reclaim_reporting(id, target, &cg, &cgroup, job, cancel)
                .await;
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
                    if let Some(r) = self.containers.locked().get_mut(id) {
                        r.deferred_target = Some(target);
                    }
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

    /// Runs [`reclaim_to`] on a blocking thread; after each pass the cgroup is read back and
    /// [`Self::reclaim_progress`] records where it stands.
    async fn reclaim_reporting(
        &self,
        id: &str,
        target: u64,
        cg: &crate::cgroup::Cgroups,
        cgroup: &std::path::Path,
        job: ReclaimJob,
        cancel: &CancellationToken,
    ) -> ReclaimOutcome {
        let interim = job.interim;
        let (cg2, cancel2, path) = (cg.clone(), cancel.clone(), cgroup.to_path_buf());
        let (tx, mut passes) = tokio::sync::watch::channel(None);
        let mut task = tokio::task::spawn_blocking(move || {
            reclaim_to(&cg2, &job, &cancel2, |p| {
                let _ = tx.send(Some((*p, cg2.read_actual(&path).ok())));
            })
        });
        loop {
            tokio::select! {
                r = &mut task => {
                    return r.unwrap_or_else(|e| ReclaimOutcome::Failed(format!("reclaim thread: {e}")));
                }
                Ok(()) = passes.changed() => {
                    let seen = *passes.borrow_and_update();
                    if let Some((pass, actual)) = seen {
                        self.reclaim_progress(id, target, interim, &pass, actual.as_ref());
                    }
                }
            }
        }
    }

    /// A staged decrease after one pass: the record's reason says the limit the cgroup holds
    /// now (read back), and the confirmation's actual values follow it.
    fn reclaim_progress(
        &self,
        id: &str,
        target: u64,
        interim: u64,
        pass: &reclaim::Pass,
        actual: Option<&crate::cgroup::ActualResources>,
    ) {
        let holds = actual
            .and_then(|a| a.memory_limit)
            .map_or_else(|| bytes_text(pass.limit), memory_limit_text);
        let reason = format!(
            "reclaiming: limit {} requested; the cgroup holds {holds} now (usage {}); the runtime's spec says {} until usage fits",
            bytes_text(target),
            bytes_text(pass.usage.usage),
            bytes_text(interim)
        );
        if let Some(r) = self.containers.locked().get_mut(id) {
            if r.state == Some(ResizeState::InProgress) {
                r.reason = reason;
                r.updated_ms = now_ms();
            }
        }
        if let Some(a) = actual {
            self.state.note_actual(id, a);
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
        if let Some(r) = self.containers.locked().get_mut(id) {
            r.allocated = allocated;
        }
        Ok(())
    }

    fn finish_record(&self, id: &str, state: Option<ResizeState>, reason: &str) {
        if let Some(r) = self.containers.locked().get_mut(id) {
            r.state = state;
            r.reason = reason.to_string();
            r.updated_ms = now_ms();
            r.deferred_target = None;
        }
    }

    /// kubelet shows the error text of `UpdateContainerResources` in the pod's
    /// `PodResizeInProgress` condition, and re-sends the update while `ContainerStatus` differs
    /// from what it asked. So the same decrease asked again is answered with an error carrying:
    /// - while it is staged: its progress (the reclaim goes on);
    /// - once it was deferred: the reason, and the reclaim starts again from the limit kept.
    ///
    /// Nothing else of the request differs from what is allocated (a request that changes
    /// anything else is a newer one: it supersedes the staged decrease and is decided anew).
    /// `None`: not a repeat.
    pub(super) fn repeated_decrease(
        self: &Arc<Self>,
        pod: &Pod,
        ctr: &Container,
        requested: &LinuxResources,
        desired: &LinuxResources,
        allocated: &LinuxResources,
    ) -> Option<Rejection> {
        let asked = memory_limit(requested);
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        let same_but_memory = |kept: u64| {
            let mut same = desired.clone();
            same.memory
                .get_or_insert_with(MemoryResources::default)
                .limit = Some(i64::try_from(kept).unwrap_or(i64::MAX));
            same == *allocated
        };
        if let Some((interim, target)) = self.reclaim_in_flight(&ctr.id) {
            if asked == Some(target) && same_but_memory(interim) {
                let progress = self
                    .containers
                    .locked()
                    .get(&ctr.id)
                    .map(|r| r.reason.clone())
                    .unwrap_or_default();
                return Some(Rejection(format!(
                    "memory decrease of {subject} in progress, not yet in place: {progress}"
                )));
            }
            self.supersede_reclaim(&ctr.id);
            return None;
        }
        let (deferred, reason) = {
            let all = self.containers.locked();
            let r = all.get(&ctr.id)?;
            (r.deferred_target?, r.reason.clone())
        };
        let kept = memory_limit(allocated)?;
        if asked != Some(deferred)
            || deferred >= kept
            || !same_but_memory(kept)
            || self.config().resize.mode != Mode::Enforce
        {
            return None;
        }
        info!(container = %subject, target = %bytes_text(deferred), kept = %bytes_text(kept), "deferred memory decrease asked again: reclaiming again");
        self.record(
            pod,
            ctr,
            Some(desired),
            Some(ResizeState::InProgress),
            &format!(
                "reclaiming again: limit {} requested; the cgroup holds {} until usage fits (was deferred: {reason})",
                bytes_text(deferred),
                bytes_text(kept)
            ),
        );
        self.spawn_reclaim(pod.id.clone(), ctr, deferred, kept, Instant::now());
        // The runtime applies nothing (the answer is an error): start at once.
        self.notify_reclaim_applied(&ctr.id);
        Some(Rejection(format!(
            "memory decrease of {subject} deferred: {reason}; reclaiming again"
        )))
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
            "{}: usage {} above requested limit {}",
            ctr.name,
            bytes_text(usage.usage),
            bytes_text(target)
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
        let cancel = self.shutdown.child_token();
        let generation = self
            .reclaim_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.reclaims.locked().insert(
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
            let mut all = self.reclaims.locked();
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

    /// `mode = "observe"` at start: the checkpointed decreases and resizes are not resumed (that
    /// would write cgroups); each is logged and its container's record says so.
    pub(super) fn report_checkpoints_in_observe_mode(&self) {
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
