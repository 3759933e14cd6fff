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
use crate::resize::ContainerResize;

/// Whose progress a reclaim reports: a staged decrease's (an interim limit in the runtime's
/// spec, the requested one applied at the end) or the background reclaim toward a limit kubelet
/// was refused ([`super::toward`]: nothing applied, kubelet's retry does it).
#[derive(Debug, Clone, Copy)]
pub(super) enum Progress {
    Staged,
    Toward,
}

impl Engine {
    /// Runs reclaim until the target is applied, time runs out, or a newer update takes over.
    /// The container's record is this decrease's (`generation`) only while no newer update
    /// superseded it: every write to the record checks that ([`Self::own_record`]).
    #[expect(
        clippy::too_many_arguments,
        reason = "one staged decrease: its container, its limits, its generation and its clock"
    )]
    pub(super) async fn drive_reclaim(
        &self,
        id: &str,
        name: &str,
        cgroup: PathBuf,
        target: u64,
        interim: u64,
        generation: u64,
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
                writes: self.reclaims.limit_writes(id, generation),
            };
            let outcome = self
                .reclaim_reporting(id, generation, &cg, job, cancel, Progress::Staged)
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
                    match self.apply_memory_limit(id, Some(generation), target).await {
                        Ok(()) => {
                            info!(container = %name, target_mib = mib(target), passes, took_ms = started.elapsed().as_millis(), "staged memory decrease done: the requested limit is in place");
                            self.finish_record(id, generation, None, "");
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
                                generation,
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
                        if let Err(e) = self.apply_memory_limit(id, Some(generation), kept).await {
                            warn!(container = %name, error = %e, "could not lower the kept limit through the runtime; the interim limit stays");
                            kept = interim;
                        }
                    }
                    let swap = node_has_swap().await;
                    let reason =
                        not_reclaimable_reason(&end, target, kept, md.timeout_ms / 1000, swap)
                            + &stall_note;
                    warn!(container = %name, %reason, "staged memory decrease deferred");
                    self.own_record(id, generation, |r| {
                        finish(r, Some(ResizeState::Deferred), &reason);
                        r.deferred_target = Some(target);
                    });
                    let o = deferred_outcome(&end, target, swap);
                    return (o, before.saturating_sub(end.usage));
                }
                ReclaimOutcome::Cancelled => return (DecreaseOutcome::Superseded, 0),
                ReclaimOutcome::Failed(_) if cancel.is_cancelled() => {
                    return (DecreaseOutcome::Superseded, 0);
                }
                ReclaimOutcome::Failed(e) => {
                    error!(container = %name, error = %e, "staged memory decrease failed");
                    self.finish_record(id, generation, Some(ResizeState::Error), &e);
                    return (DecreaseOutcome::Error, 0);
                }
            }
        }
    }

    /// Runs [`reclaim_to`] on a blocking thread; after each pass the cgroup is read back and
    /// [`Self::reclaim_progress`] records where it stands.
    pub(super) async fn reclaim_reporting(
        &self,
        id: &str,
        generation: u64,
        cg: &crate::cgroup::Cgroups,
        job: ReclaimJob,
        cancel: &CancellationToken,
        progress: Progress,
    ) -> ReclaimOutcome {
        let (target, interim) = (job.target, job.interim);
        let (cg2, cancel2, path) = (cg.clone(), cancel.clone(), job.cgroup.clone());
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
                        self.reclaim_progress(id, generation, (target, interim), progress, &pass, actual.as_ref());
                    }
                }
            }
        }
    }

    /// A reclaim after one pass: the record's reason says the limit the cgroup holds now (read
    /// back) and the usage, and the confirmation's actual values follow it.
    fn reclaim_progress(
        &self,
        id: &str,
        generation: u64,
        (target, interim): (u64, u64),
        progress: Progress,
        pass: &reclaim::Pass,
        actual: Option<&crate::cgroup::ActualResources>,
    ) {
        let holds = actual
            .and_then(|a| a.memory_limit)
            .map_or_else(|| bytes_text(pass.limit), memory_limit_text);
        let reason = match progress {
            Progress::Staged => format!(
                "reclaiming: limit {} requested; the cgroup holds {holds} now (usage {}); the runtime's spec says {} until usage fits",
                bytes_text(target),
                bytes_text(pass.usage.usage),
                bytes_text(interim)
            ),
            Progress::Toward => format!(
                "usage {} above the requested limit {}: refused until usage fits; reclaiming page cache in the background ({} left), the cgroup keeps {holds}; kubelet's next try applies the limit once usage fits",
                bytes_text(pass.usage.usage),
                bytes_text(target),
                bytes_text(pass.usage.file)
            ),
        };
        let own = self.own_record(id, generation, |r| {
            if r.state == Some(ResizeState::InProgress) {
                r.reason = reason;
                r.updated_ms = now_ms();
            }
        });
        if let (true, Some(a)) = (own, actual) {
            self.state.note_actual(id, a);
        }
    }

    /// Asks the runtime to set the memory limit of `id` (its spec follows, so `ContainerStatus`
    /// reports it) and records it as allocated.
    /// `generation`: the staged decrease applying it, which updates the record only while it
    /// owns it; `None`: a whole-pod step's (the step's resize owns the record).
    pub(super) async fn apply_memory_limit(
        &self,
        id: &str,
        generation: Option<u64>,
        limit: u64,
    ) -> Result<(), UpdateError> {
        if let Some(g) = generation {
            if !self.reclaims.begin_apply(id, g) {
                return Err(UpdateError::Superseded);
            }
        }
        let applied = self.update_through_runtime(id, &memory_only(limit)).await;
        if let Some(g) = generation {
            self.reclaims.end_apply(id, g);
        }
        applied?;
        let allocated = self
            .state
            .read_model(|m| m.container(id).and_then(|c| c.resources.clone()));
        let set = |r: &mut ContainerResize| r.allocated = allocated;
        match generation {
            Some(g) => {
                self.own_record(id, g, set);
            }
            None => {
                self.records.update_container(id, set);
            }
        }
        Ok(())
    }

    /// Ends the record of this staged decrease (`generation`), unless a newer update owns it.
    pub(super) fn finish_record(
        &self,
        id: &str,
        generation: u64,
        state: Option<ResizeState>,
        reason: &str,
    ) {
        self.own_record(id, generation, |r| finish(r, state, reason));
    }

    /// Runs `f` on the record of `id` if the staged decrease in flight for it is still
    /// `generation`; `false` when a newer update superseded it (the record is the newer one's).
    /// The check and the write happen under the reclaims lock, which a supersede takes to
    /// remove the decrease before the newer update writes the record: no interleaving lets a
    /// superseded decrease write over it.
    pub(super) fn own_record(
        &self,
        id: &str,
        generation: u64,
        f: impl FnOnce(&mut ContainerResize),
    ) -> bool {
        self.reclaims
            .while_current(id, generation, || {
                self.records.update_container(id, f);
            })
            .is_some()
    }
}

fn finish(r: &mut ContainerResize, state: Option<ResizeState>, reason: &str) {
    r.state = state;
    r.reason = reason.to_string();
    r.updated_ms = now_ms();
    r.deferred_target = None;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::Notify;

    use super::*;
    use crate::config::Config;
    use crate::model::{Container, Pod};

    use crate::policy::MemoryUse;

    use crate::resize::reclaims::{ReclaimHandle, Supersede};
    use crate::state::NodeState;

    const MIB: u64 = 1 << 20;

    /// An engine with no cgroups, runtime or checkpoints: records and handles only.
    fn engine() -> Engine {
        Engine::detached_for_test(NodeState::new(Config::default()))
    }

    /// The failure seen in the VM tier: a newer update superseded a staged decrease while a
    /// pass was running; the pass's progress then wrote "reclaiming: limit 100Mi requested"
    /// into the newer update's record, which therefore never completed (`InProgress` for ever
    /// while desired and allocated said 400Mi). A superseded decrease writes nothing now.
    #[test]
    fn a_superseded_decrease_never_writes_the_newer_updates_record() {
        let engine = engine();
        let pod = Pod {
            id: "p".into(),
            namespace: "ns".into(),
            name: "p".into(),
            ..Pod::default()
        };
        let ctr = Container {
            id: "c".into(),
            pod_id: "p".into(),
            name: "app".into(),
            ..Container::default()
        };
        let (_, generation) = engine.reclaims.own("c", |cancel, generation| {
            ReclaimHandle::new(
                cancel,
                Arc::new(Notify::new()),
                "p".into(),
                (100 * MIB, 317 * MIB),
                generation,
            )
        });
        engine.record(
            &pod,
            &ctr,
            None,
            Some(ResizeState::InProgress),
            "reclaiming",
        );
        let pass = reclaim::Pass {
            usage: MemoryUse {
                usage: 250 * MIB,
                anon: 20 * MIB,
                shmem: 0,
                file: 230 * MIB,
            },
            limit: 317 * MIB,
            step: None,
            stall: None,
        };
        // While it owns the record, a pass reports its progress there.
        engine.reclaim_progress(
            "c",
            generation,
            (100 * MIB, 317 * MIB),
            Progress::Staged,
            &pass,
            None,
        );
        assert!(engine.container_resizes()["c"]
            .reason
            .contains("usage 250Mi"));

        // The newer update (400Mi) supersedes it and records itself, in flight.
        engine.reclaims.supersede("c");
        engine.record(&pod, &ctr, None, Some(ResizeState::InProgress), "");
        // The superseded decrease's last pass, its end and its allocation all come too late.
        engine.reclaim_progress(
            "c",
            generation,
            (100 * MIB, 317 * MIB),
            Progress::Staged,
            &pass,
            None,
        );
        engine.finish_record("c", generation, Some(ResizeState::Deferred), "timed out");
        let r = &engine.container_resizes()["c"];
        assert_eq!(
            (r.state, r.reason.as_str()),
            (Some(ResizeState::InProgress), ""),
            "the newer update's record was written by the superseded decrease"
        );
        assert!(!engine.own_record("c", generation, |r| r.reason = "mine".into()));
        // So the runtime's applying the newer update completes it.
        engine.applied(&ctr);
        assert_eq!(engine.container_resizes()["c"].state, None);
    }

    /// A newer kubelet update while the staged decrease has the runtime apply its limit would
    /// race with that write (the older limit could land last): it is refused once instead, and
    /// once the apply is over it supersedes the decrease, which then applies nothing more.
    #[test]
    fn a_newer_update_never_races_the_decrease_s_own_apply() {
        let engine = engine();
        let (_, generation) = engine.reclaims.own("c", |cancel, generation| {
            ReclaimHandle::new(
                cancel,
                Arc::new(Notify::new()),
                "p".into(),
                (100 * MIB, 317 * MIB),
                generation,
            )
        });
        assert!(engine.reclaims.begin_apply("c", generation));
        let until = Instant::now();
        assert_eq!(
            engine.reclaims.supersede_unless_applying("c", until),
            Supersede::Applying,
            "superseded in the middle of the decrease's own apply"
        );
        assert!(engine.reclaims.staged("c").is_some());
        engine.reclaims.end_apply("c", generation);
        assert_eq!(
            engine.reclaims.supersede_unless_applying("c", until),
            Supersede::Done
        );
        assert!(engine.reclaims.staged("c").is_none());
        assert!(
            !engine.reclaims.begin_apply("c", generation),
            "a superseded decrease must apply nothing"
        );
        assert_eq!(
            engine.reclaims.supersede_unless_applying("c", until),
            Supersede::Done,
            "nothing in flight"
        );
    }
}
