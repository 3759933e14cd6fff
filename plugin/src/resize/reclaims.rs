//! The owner of all reclaim on a container: one place decides who reclaims what.
//!
//! - **Background reclaims** (a whole-pod step's staged decrease, one resumed from a checkpoint,
//!   the reclaim toward a limit kubelet was refused): at most one per container, its
//!   [`ReclaimHandle`]; a newer one cancels the one it replaces, a newer update supersedes it,
//!   and its checkpoint is written and removed here, under the same lock as the ownership check
//!   that decides it, so a superseded reclaim's late write never lands over a newer one's.
//! - **Inline passes** (inside a kubelet update or a pod-level call, within the runtime's
//!   deadline): [`Reclaims::inline_pass`] / [`Reclaims::inline_pod_pass`] hold trimming off
//!   the containers for as long as the pass runs.
//! - **The observer's reclaim counter**: every background reclaim and inline pass holds it
//!   attached ([`crate::observer::ReclaimWatch`]): where it is a program on the page-fault path,
//!   it runs only while a reclaim of ours is in flight (trimming's turns take it themselves).
//! - **Trimming** runs only where neither of the above holds the container: every background
//!   reclaim and every inline pass holds a [`TrimPause`]. What trimming found (its working set)
//!   is read here too.
//!
//! The state is reached only through these methods (the architecture test checks that no other
//! file names its fields).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::checkpoint::CheckpointStore;
use super::reclaim::LimitWrites;
use crate::observer::ReclaimGuard;
use crate::policy::mib;
use crate::state::NodeState;
use crate::sync::Locked as _;
use crate::trim::{ContainerTrim, TrimPause, Trimmer};

/// A background reclaim of a container, the container's one: a whole-pod step's, a staged
/// decrease resumed from a checkpoint, or the reclaim toward a limit kubelet was refused.
#[derive(Debug)]
pub(in crate::resize) struct ReclaimHandle {
    cancel: CancellationToken,
    /// Signalled when the runtime has applied the interim limit (`PostUpdateContainer`).
    applied: Arc<Notify>,
    pod_id: String,
    target: u64,
    interim: u64,
    generation: u64,
    /// The decrease is having the runtime apply a limit right now (see
    /// [`Reclaims::supersede_unless_applying`]).
    applying: bool,
    /// Trimming off the container and the reclaim counter attached while the handle lives
    /// (held for its `Drop`).
    hold: Option<ReclaimHold>,
    /// The reclaim toward a limit kubelet was refused: no interim, no limit applied at the end;
    /// `interim` is the limit the container keeps.
    toward: bool,
    /// The reclaim's limit writes inside the kernel (v1), which a supersede waits for.
    writes: Arc<LimitWrites>,
}

/// What a newer kubelet update did to the staged decrease in flight
/// ([`Reclaims::supersede_unless_applying`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::resize) enum Supersede {
    /// Superseded (or there was none): the newer update goes on.
    Done,
    /// The decrease is having the runtime apply a limit at this moment: nothing changed.
    Applying,
    /// Superseded, but a limit write of it is still inside the kernel at the deadline: the
    /// newer update must not be answered yet (its write could land before ours).
    InKernel,
}

impl ReclaimHandle {
    pub(in crate::resize) fn new(
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
            hold: None,
            toward: false,
            writes: Arc::default(),
        }
    }

    /// The handle of a background reclaim toward a refused limit.
    pub(in crate::resize) fn toward(mut self) -> Self {
        self.toward = true;
        self
    }
}

/// What a reclaim of ours holds while it runs: trimming off its containers, and the observer's
/// reclaim counter attached.
#[derive(Debug)]
pub(crate) struct ReclaimHold {
    _trim: Vec<TrimPause>,
    _counter: ReclaimGuard,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Reclaims {
    handles: Mutex<HashMap<String, ReclaimHandle>>,
    generation: AtomicU64,
    /// Held around the checkpoints' file I/O together with the ownership check that decides
    /// it. Taken on blocking threads only.
    checkpoint_io: Mutex<()>,
    checkpoints: Option<CheckpointStore>,
    trimmer: Option<Trimmer>,
    /// Parent of every background reclaim's token (the engine's shutdown).
    shutdown: CancellationToken,
    state: Arc<NodeState>,
}

impl Reclaims {
    /// The owner, with working-set trimming (paused where a reclaim runs and asked what it
    /// found) or without.
    pub(crate) fn new(
        state: Arc<NodeState>,
        checkpoints: Option<CheckpointStore>,
        trimmer: Option<Trimmer>,
        shutdown: CancellationToken,
    ) -> Self {
        Reclaims {
            handles: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            checkpoint_io: Mutex::new(()),
            checkpoints,
            trimmer,
            shutdown,
            state,
        }
    }

    /// What trimming found for container `id` (none without trimming).
    pub(crate) fn trim_state(&self, id: &str) -> Option<ContainerTrim> {
        self.trimmer.as_ref()?.state(id)
    }

    /// An inline pass on container `id`: trimming stays off it, and the reclaim counter
    /// attached, while the hold lives.
    pub(crate) fn inline_pass(&self, id: &str) -> ReclaimHold {
        self.inline_pod_pass(&[id.to_owned()])
    }

    /// An inline pass on the containers `ids` of a pod (a pod-level reclaim; the counter is
    /// attached even where the pod has no container running).
    pub(crate) fn inline_pod_pass(&self, ids: &[String]) -> ReclaimHold {
        ReclaimHold {
            _trim: self
                .trimmer
                .as_ref()
                .map(|t| ids.iter().map(|id| t.pause(id)).collect())
                .unwrap_or_default(),
            _counter: self.state.reclaim_watch.watch(),
        }
    }

    /// Whether trimming is consulted at all.
    pub(crate) fn trims(&self) -> bool {
        self.trimmer.is_some()
    }

    /// Makes a new background reclaim of container `id` its one reclaim: `make` builds the
    /// handle from a fresh cancellation token (a child of the engine's shutdown) and generation;
    /// trimming of the container stays paused while it lives, and the reclaim it replaces, if
    /// any, is cancelled. Returns the token and the generation.
    pub(in crate::resize) fn own(
        &self,
        id: &str,
        make: impl FnOnce(CancellationToken, u64) -> ReclaimHandle,
    ) -> (CancellationToken, u64) {
        let cancel = self.shutdown.child_token();
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let mut handle = make(cancel.clone(), generation);
        handle.hold = Some(self.inline_pass(id));
        if let Some(old) = self.handles.locked().insert(id.to_owned(), handle) {
            old.cancel.cancel();
        }
        (cancel, generation)
    }

    /// Runs `f` while reclaim `generation` of `id` is still the container's one, under the
    /// lock a supersede takes; `None` (and `f` not run) when a newer update superseded it.
    pub(in crate::resize) fn while_current<R>(
        &self,
        id: &str,
        generation: u64,
        f: impl FnOnce() -> R,
    ) -> Option<R> {
        let handles = self.handles.locked();
        if handles.get(id).is_none_or(|h| h.generation != generation) {
            return None;
        }
        let r = f();
        drop(handles);
        Some(r)
    }

    /// Reclaim `generation` of `id` ended without a word (its task was dropped): its handle
    /// goes, unless a newer reclaim replaced it. Its checkpoint, if any, stays.
    pub(in crate::resize) fn forget(&self, id: &str, generation: u64) {
        let mut all = self.handles.locked();
        if all.get(id).is_some_and(|h| h.generation == generation) {
            all.remove(id);
        }
    }

    /// Cancels the reclaim of `container_id`, if any: a newer update supersedes it.
    pub(in crate::resize) fn supersede(&self, container_id: &str) {
        self.end(
            container_id,
            "newer update: staged memory decrease superseded",
        );
    }

    /// Cancels the reclaim of `container_id`, if any, saying why (`what`), and removes its
    /// checkpoint (file I/O: call it off the async workers).
    pub(in crate::resize) fn end(&self, container_id: &str, what: &'static str) {
        if self.take(container_id, what) {
            self.remove_checkpoint(container_id);
        }
    }

    /// [`Self::end`]'s in-memory part: the reclaim ends and its task is cancelled. `true` when
    /// there was one (its checkpoint is still to remove).
    pub(in crate::resize) fn take(&self, container_id: &str, what: &'static str) -> bool {
        let ended = self.handles.locked().remove(container_id);
        if let Some(h) = &ended {
            info!(container_id, target_mib = mib(h.target), "{what}");
            h.cancel.cancel();
        }
        ended.is_some()
    }

    /// Removes the checkpoint of an ended reclaim of `container_id`: it must not be resumed
    /// after a restart. A newer reclaim writes its own after this (its task takes the same
    /// lock, and the ended one's handle is gone). Blocking file I/O.
    pub(crate) fn remove_checkpoint(&self, container_id: &str) {
        if let Some(store) = &self.checkpoints {
            let _io = self.checkpoint_io.locked();
            if let Err(e) = store.remove(&checkpoint_key(container_id)) {
                warn!(container_id, error = %e, "cannot remove the reclaim checkpoint");
            }
        }
    }

    /// Saves the checkpoint `rec` of reclaim `generation` of `container_id` while it is still
    /// in flight (a superseded one writes nothing). Blocking file I/O.
    pub(in crate::resize) fn save_checkpoint<T: Serialize>(
        &self,
        container_id: &str,
        generation: u64,
        rec: &T,
    ) {
        let Some(store) = &self.checkpoints else {
            return;
        };
        let _io = self.checkpoint_io.locked();
        let own = self
            .handles
            .locked()
            .get(container_id)
            .is_some_and(|h| h.generation == generation);
        if !own {
            return;
        }
        if let Err(e) = store.save(&checkpoint_key(container_id), rec) {
            error!(container_id, error = %e, "cannot checkpoint the staged memory decrease; it will not survive a restart");
            self.state.state_dir_problem(format!(
                "checkpoint of the memory decrease of {container_id} not written: {e}"
            ));
        }
    }

    /// Reclaim `generation` of `container_id` ended on its own: it leaves and its checkpoint
    /// goes, unless a newer reclaim took over meanwhile (whose handle and checkpoint stay).
    /// Blocking file I/O.
    pub(in crate::resize) fn retire(&self, container_id: &str, generation: u64) {
        let _io = self.checkpoint_io.locked();
        let mine = {
            let mut all = self.handles.locked();
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
    /// supersedes it, unless the decrease is having the runtime apply a limit at this moment
    /// ([`Supersede::Applying`]: nothing changes). The runtime's writes of that apply and of the
    /// newer update would race, and the older limit could land last, over kubelet's; refused
    /// once, kubelet asks again and the newer update goes through after the apply. (Waiting
    /// here instead could deadlock: the runtime applies the plugin's update under the lock it
    /// holds while it calls this handler.) The check and the removal are one step under the
    /// lock, which the apply takes to start ([`Reclaims::begin_apply`]).
    ///
    /// A superseded decrease may have a limit write inside the kernel (v1), which can land
    /// after the runtime's write of the newer limit: this waits, at most until `until` (the
    /// runtime's deadline), for it to leave the kernel; [`Supersede::InKernel`] when it did not
    /// (the newer update is refused once). Blocking (the wait, and the checkpoint's removal).
    pub(in crate::resize) fn supersede_unless_applying(
        &self,
        container_id: &str,
        until: Instant,
    ) -> Supersede {
        let writes = {
            let mut all = self.handles.locked();
            match all.get(container_id) {
                None => return Supersede::Done,
                Some(h) if h.applying => return Supersede::Applying,
                Some(_) => match all.remove(container_id) {
                    Some(h) => {
                        info!(
                            container_id,
                            target_mib = mib(h.target),
                            "newer update: staged memory decrease superseded"
                        );
                        h.cancel.cancel();
                        Arc::clone(&h.writes)
                    }
                    None => return Supersede::Done,
                },
            }
        };
        self.remove_checkpoint(container_id);
        if writes.wait_idle(until) {
            Supersede::Done
        } else {
            warn!(
                container_id,
                "a limit write of the superseded memory decrease is still inside the kernel"
            );
            Supersede::InKernel
        }
    }

    /// Where reclaim `generation` of `id` marks its limit writes (a fresh mark where it was
    /// superseded meanwhile: nothing waits on it).
    pub(in crate::resize) fn limit_writes(&self, id: &str, generation: u64) -> Arc<LimitWrites> {
        self.handles
            .locked()
            .get(id)
            .filter(|h| h.generation == generation)
            .map_or_else(Arc::default, |h| Arc::clone(&h.writes))
    }

    /// Staged decrease `generation` of `container_id` is about to have the runtime apply a
    /// limit: `false` when it was superseded (apply nothing); `true` marks it applying until
    /// [`Reclaims::end_apply`].
    pub(in crate::resize) fn begin_apply(&self, container_id: &str, generation: u64) -> bool {
        match self.handles.locked().get_mut(container_id) {
            Some(h) if h.generation == generation && !h.cancel.is_cancelled() => {
                h.applying = true;
                true
            }
            _ => false,
        }
    }

    /// The apply [`Reclaims::begin_apply`] started is over.
    pub(in crate::resize) fn end_apply(&self, container_id: &str, generation: u64) {
        if let Some(h) = self.handles.locked().get_mut(container_id) {
            if h.generation == generation {
                h.applying = false;
            }
        }
    }

    /// Cancels the reclaims of every container of `pod_id` (a newer whole-pod request).
    pub(in crate::resize) fn supersede_pod(&self, pod_id: &str) {
        let ids: Vec<String> = self
            .handles
            .locked()
            .iter()
            .filter(|(_, h)| h.pod_id == pod_id)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.supersede(&id);
        }
    }

    /// The runtime applied an update of `container_id`: a staged decrease waiting for its
    /// interim limit may start.
    pub(in crate::resize) fn notify_applied(&self, container_id: &str) {
        if let Some(h) = self.handles.locked().get(container_id) {
            h.applied.notify_one();
        }
    }

    /// The staged decrease in flight for `container_id`: `(interim, target)`.
    pub(in crate::resize) fn staged(&self, container_id: &str) -> Option<(u64, u64)> {
        self.handles
            .locked()
            .get(container_id)
            .filter(|h| !h.toward)
            .map(|h| (h.interim, h.target))
    }

    /// The target of the reclaim toward a refused limit in flight for `container_id`.
    pub(in crate::resize) fn toward_target(&self, container_id: &str) -> Option<u64> {
        self.handles
            .locked()
            .get(container_id)
            .filter(|h| h.toward)
            .map(|h| h.target)
    }

    /// Whether no background reclaim is in flight.
    #[cfg(test)]
    pub(in crate::resize) fn is_empty(&self) -> bool {
        self.handles.locked().is_empty()
    }

    /// Tests: a reclaim toward refused limit `target` in flight for `container_id` of `pod_id`,
    /// which keeps `kept`; its token.
    #[cfg(test)]
    pub(in crate::resize) fn toward_in_flight_for_test(
        &self,
        pod_id: &str,
        container_id: &str,
        target: u64,
        kept: u64,
    ) -> CancellationToken {
        let cancel = CancellationToken::new();
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        self.handles.locked().insert(
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
}

/// The checkpoint file key of a staged decrease of `container_id`.
pub(in crate::resize) fn checkpoint_key(container_id: &str) -> String {
    let safe: String = container_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(100)
        .collect();
    format!("reclaim-{safe}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_keys_are_safe() {
        assert_eq!(checkpoint_key("ab/../c d"), "reclaim-abcd");
    }

    #[test]
    fn a_newer_reclaim_cancels_the_one_it_replaces_and_a_superseded_one_writes_nothing() {
        let r = Reclaims::new(
            NodeState::new(crate::config::Config::default()),
            None,
            None,
            CancellationToken::new(),
        );
        let handle = |pod: &str| {
            let pod = pod.to_owned();
            move |cancel, generation| {
                ReclaimHandle::new(cancel, Arc::new(Notify::new()), pod, (1, 2), generation)
            }
        };
        let (first, g1) = r.own("c", handle("p"));
        let (second, g2) = r.own("c", handle("p"));
        assert!(first.is_cancelled() && !second.is_cancelled());
        assert_eq!(r.while_current("c", g1, || ()), None);
        assert_eq!(r.while_current("c", g2, || 7), Some(7));
        assert!(r.begin_apply("c", g2));
        let until = Instant::now();
        assert_eq!(
            r.supersede_unless_applying("c", until),
            Supersede::Applying,
            "applying: kept"
        );
        r.end_apply("c", g2);
        r.supersede_pod("p");
        assert!(second.is_cancelled() && r.is_empty());
    }

    /// Issue 36 audit: a newer update superseding a decrease whose v1 limit write is still
    /// inside the kernel waits for it (within `until`) before it is answered: refused once
    /// (`InKernel`) when the write is still there at `until`, `Done` once it left. Before, the
    /// supersede returned at once and the runtime's write of the newer limit could land first.
    #[test]
    fn a_supersede_waits_for_a_limit_write_inside_the_kernel() {
        use std::time::Duration;

        for held_past_until in [true, false] {
            let r = Reclaims::new(
                NodeState::new(crate::config::Config::default()),
                None,
                None,
                CancellationToken::new(),
            );
            let (_, generation) = r.own("c", |cancel, g| {
                ReclaimHandle::new(cancel, Arc::new(Notify::new()), "p".into(), (1, 2), g)
            });
            let writes = r.limit_writes("c", generation);
            let (entered_tx, entered_rx) = std::sync::mpsc::channel();
            let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
            std::thread::scope(|s| {
                let held = Arc::clone(&writes);
                s.spawn(move || {
                    held.write(|| {
                        entered_tx.send(()).unwrap();
                        release_rx.recv().unwrap();
                    });
                });
                entered_rx.recv().unwrap();
                if held_past_until {
                    assert_eq!(
                        r.supersede_unless_applying("c", Instant::now()),
                        Supersede::InKernel
                    );
                    release_tx.send(()).unwrap();
                } else {
                    s.spawn(move || {
                        std::thread::sleep(Duration::from_millis(50));
                        release_tx.send(()).unwrap();
                    });
                    assert_eq!(
                        r.supersede_unless_applying("c", Instant::now() + Duration::from_secs(60)),
                        Supersede::Done
                    );
                    assert!(
                        writes.wait_idle(Instant::now()),
                        "answered after the write left"
                    );
                }
            });
            assert!(r.is_empty(), "superseded either way");
        }
    }
}
