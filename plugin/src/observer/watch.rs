//! The memcg event counter on demand: attached while nri-resize reclaims, detached otherwise.
//!
//! Where the kernel refuses BPF trampolines, reclaim is counted from the
//! `memcg/count_memcg_events` tracepoint, which fires on every memcg event of the node: every
//! page fault and charge included. Its program is loaded at start and attached only while some
//! reclaim of nri-resize's is in flight (a memory decrease reclaiming, a trimming turn): each
//! such reclaim holds a [`ReclaimGuard`] from the node's [`ReclaimWatch`]. The first live guard
//! attaches the program; once the last is dropped it stays attached for a short linger (so that
//! back-to-back passes do not attach and detach in turn), then it is detached.
//!
//! One task owns the switching (the driver, started with [`ReclaimWatch::start`]): taking and
//! dropping a guard only counts and wakes it, so both are cheap and never block. The driver
//! runs every attach and detach on a blocking thread (an attach patches kernel text, a detach
//! waits for RCU grace periods) and publishes whether the program is attached. The switch is
//! bound once the observer has loaded its programs ([`ReclaimWatch::bind`]); guards taken
//! before count already. Without a bound switch (the program is not needed here, or eBPF is
//! off) guards count and nothing else happens.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ObserverError;
use crate::sync::Locked as _;

/// How long the program stays attached after the last guard went.
pub const DEFAULT_LINGER: Duration = Duration::from_secs(5);

/// What the watch switches: the observer's memcg event program. Both calls block (an attach
/// patches kernel text, a detach waits for RCU grace periods): the driver makes them on a
/// blocking thread, one at a time.
pub trait ReclaimSwitch: Send + Sync + 'static {
    /// The program switched (status and logs).
    fn program(&self) -> &'static str;
    fn attach(&self) -> Result<(), ObserverError>;
    fn detach(&self) -> Result<(), ObserverError>;
}

/// The handle: cheap to clone; every clone counts the same guards.
#[derive(Clone)]
pub struct ReclaimWatch {
    inner: Arc<Inner>,
}

struct Inner {
    linger: Duration,
    state: Mutex<State>,
    /// Woken on every change of `state`; the driver waits on it.
    changed: Notify,
    /// Whether the program is attached now (the driver's to change).
    attached: watch::Sender<bool>,
    driver: Mutex<Option<(CancellationToken, JoinHandle<()>)>>,
}

#[derive(Default)]
struct State {
    /// Live guards.
    watchers: usize,
    switch: Option<Arc<dyn ReclaimSwitch>>,
    /// The last attach or detach error, cleared by the next success.
    last_error: Option<String>,
}

/// Where the watch stands, for the status API and `/readyz`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReclaimWatchStatus {
    /// The program attached on demand.
    pub program: &'static str,
    pub attached: bool,
    /// Reclaims in flight (live guards).
    pub watchers: usize,
    pub last_error: Option<String>,
}

impl fmt::Display for ReclaimWatchStatus {
    /// `reclaim counter count_memcg_events_btf attached on demand: detached` (`/readyz`; the
    /// status table says it in the same words).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reclaim counter {} attached on demand: ", self.program)?;
        if self.attached {
            write!(f, "attached ({} reclaims in flight)", self.watchers)?;
        } else {
            write!(f, "detached")?;
        }
        if let Some(e) = &self.last_error {
            write!(f, ", last error: {e}")?;
        }
        Ok(())
    }
}

/// Held by one reclaim in flight; dropping it lets the program go (after the linger).
#[must_use = "the memcg event counter may be detached once the guard is dropped"]
pub struct ReclaimGuard {
    inner: Arc<Inner>,
}

impl fmt::Debug for ReclaimWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReclaimWatch")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ReclaimGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReclaimGuard").finish_non_exhaustive()
    }
}

impl Drop for ReclaimGuard {
    fn drop(&mut self) {
        let mut s = self.inner.state.locked();
        s.watchers = s.watchers.saturating_sub(1);
        drop(s);
        self.inner.changed.notify_one();
    }
}

impl Default for ReclaimWatch {
    fn default() -> Self {
        Self::new(DEFAULT_LINGER)
    }
}

impl ReclaimWatch {
    /// A watch with no switch bound and no driver: guards count, nothing is attached.
    #[must_use]
    pub fn new(linger: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                linger,
                state: Mutex::new(State::default()),
                changed: Notify::new(),
                attached: watch::Sender::new(false),
                driver: Mutex::new(None),
            }),
        }
    }

    /// One reclaim in flight until the guard is dropped. Never blocks: the driver attaches.
    pub fn watch(&self) -> ReclaimGuard {
        self.inner.state.locked().watchers += 1;
        self.inner.changed.notify_one();
        ReclaimGuard {
            inner: Arc::clone(&self.inner),
        }
    }

    /// The program to switch, once the observer has loaded it (from any thread).
    pub fn bind(&self, switch: Arc<dyn ReclaimSwitch>) {
        self.inner.state.locked().switch = Some(switch);
        self.inner.changed.notify_one();
    }

    /// Forgets the switch (the observer stops and detaches everything itself).
    pub fn unbind(&self) {
        self.inner.state.locked().switch = None;
        self.inner.attached.send_replace(false);
        self.inner.changed.notify_one();
    }

    /// Starts the driver on the current tokio runtime; it stops when `parent` is cancelled or at
    /// [`ReclaimWatch::shutdown`]. A second call does nothing.
    pub fn start(&self, parent: &CancellationToken) {
        let mut driver = self.inner.driver.locked();
        if driver.is_some() {
            return;
        }
        let cancel = parent.child_token();
        let task = tokio::spawn(drive(Arc::clone(&self.inner), cancel.clone()));
        *driver = Some((cancel, task));
    }

    /// Stops the driver and waits for it. An attach or detach in flight finishes on its blocking
    /// thread; the program is left as it is (the observer detaches everything when it stops).
    pub async fn shutdown(&self) {
        let driver = self.inner.driver.locked().take();
        if let Some((cancel, task)) = driver {
            cancel.cancel();
            if let Err(err) = task.await {
                tracing::warn!(%err, "reclaim watch task ended abnormally");
            }
        }
    }

    /// Whether the program is attached now.
    #[must_use]
    pub fn attached(&self) -> bool {
        *self.inner.attached.borrow()
    }

    /// Waits until the program is attached (`true`) or detached (`false`).
    pub async fn until_attached(&self, attached: bool) {
        let mut rx = self.inner.attached.subscribe();
        // The sender lives as long as `self`: the wait ends only by the value.
        let _ = rx.wait_for(|a| *a == attached).await;
    }

    /// Where the watch stands; `None` while no switch is bound (nothing to attach here).
    #[must_use]
    pub fn status(&self) -> Option<ReclaimWatchStatus> {
        let s = self.inner.state.locked();
        let program = s.switch.as_ref()?.program();
        Some(ReclaimWatchStatus {
            program,
            attached: self.attached(),
            watchers: s.watchers,
            last_error: s.last_error.clone(),
        })
    }
}

/// The driver: attaches on the first guard, detaches a linger after the last.
async fn drive(inner: Arc<Inner>, cancel: CancellationToken) {
    loop {
        let (wanted, switch) = {
            let s = inner.state.locked();
            (s.watchers > 0, s.switch.clone())
        };
        let attached = *inner.attached.borrow();
        match switch {
            Some(switch) if wanted && !attached => {
                let now_attached = switched(&inner, switch, Direction::Attach).await;
                if now_attached {
                    continue;
                }
                // Failed: tried again at the next change, not in a loop.
            }
            Some(switch) if !wanted && attached => {
                tokio::select! {
                    () = tokio::time::sleep(inner.linger) => {}
                    () = inner.changed.notified() => continue,
                    () = cancel.cancelled() => return,
                }
                switched(&inner, switch, Direction::Detach).await;
                continue;
            }
            _ => {}
        }
        tokio::select! {
            () = inner.changed.notified() => {}
            () = cancel.cancelled() => return,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Direction {
    Attach,
    Detach,
}

/// Attaches or detaches on a blocking thread and publishes the outcome; `true` on success. A
/// failed detach leaves the program counted as attached: the driver tries again a linger later.
async fn switched(inner: &Inner, switch: Arc<dyn ReclaimSwitch>, direction: Direction) -> bool {
    let program = switch.program();
    let outcome = tokio::task::spawn_blocking(move || match direction {
        Direction::Attach => switch.attach(),
        Direction::Detach => switch.detach(),
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()));
    let attach = matches!(direction, Direction::Attach);
    match outcome {
        Ok(()) => {
            tracing::debug!(
                program,
                ?direction,
                "observer: memcg event counter switched"
            );
            inner.state.locked().last_error = None;
            inner.attached.send_replace(attach);
            true
        }
        Err(error) => {
            tracing::warn!(program, ?direction, %error, "observer: memcg event counter not switched");
            inner.state.locked().last_error = Some(format!("{direction:?}: {error}"));
            false
        }
    }
}

#[cfg(test)]
mod tests;
