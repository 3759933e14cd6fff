//! The staged decrease's driver: reclaim passes on a blocking thread, progress in the record
//! after each, then the requested limit through the runtime (or the kept one, Deferred).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::{deferred_outcome, memory_only, node_has_swap, Engine};
use crate::cgroup::CgroupIo;
use crate::clock::now_ms;
use crate::metrics::DecreaseOutcome;
use crate::policy::{bytes_text, memory_limit_text, mib, not_reclaimable_reason, ResizeState};
use crate::resize::reclaim::{self, reclaim_to, ReclaimJob, ReclaimOutcome};
use crate::resize::runtime_update::UpdateError;
use crate::sync::Locked as _;

impl Engine {
    /// Runs reclaim until the target is applied, time runs out, or a newer update takes over.
    #[expect(
        clippy::too_many_arguments,
        reason = "one staged decrease: its container, its limits and its clock"
    )]
    pub(super) async fn drive_reclaim(
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
                max_stall: self.max_stall_of(id),
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
                        // Superseded or the container stopped while the limit was applied:
                        // the failure is the container's going, not the decrease's.
                        Err(_) if cancel.is_cancelled() => {
                            return (
                                DecreaseOutcome::Superseded,
                                before.saturating_sub(end.usage),
                            );
                        }
                        Err(e) if started.elapsed() < timeout => {
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
                    start,
                    end,
                    kept,
                    stall_note,
                    ..
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
                    let swap = node_has_swap().await;
                    let reason =
                        not_reclaimable_reason(&end, target, kept, md.timeout_ms / 1000, swap)
                            + &stall_note;
                    warn!(container = %name, %reason, "staged memory decrease deferred");
                    self.finish_record(id, Some(ResizeState::Deferred), &reason);
                    if let Some(r) = self.containers.locked().get_mut(id) {
                        r.deferred_target = Some(target);
                    }
                    let o = deferred_outcome(&end, target, swap);
                    return (o, before.saturating_sub(end.usage));
                }
                ReclaimOutcome::Cancelled => return (DecreaseOutcome::Superseded, 0),
                ReclaimOutcome::Failed(_) if cancel.is_cancelled() => {
                    return (DecreaseOutcome::Superseded, 0);
                }
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
    pub(super) async fn apply_memory_limit(&self, id: &str, limit: u64) -> Result<(), UpdateError> {
        self.update_through_runtime(id, &memory_only(limit)).await?;
        let allocated = self
            .state
            .read_model(|m| m.container(id).and_then(|c| c.resources.clone()));
        if let Some(r) = self.containers.locked().get_mut(id) {
            r.allocated = allocated;
        }
        Ok(())
    }

    pub(super) fn finish_record(&self, id: &str, state: Option<ResizeState>, reason: &str) {
        if let Some(r) = self.containers.locked().get_mut(id) {
            r.state = state;
            r.reason = reason.to_string();
            r.updated_ms = now_ms();
            r.deferred_target = None;
        }
    }
}
