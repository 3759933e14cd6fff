//! Restarts that a resize policy demands, carried out and confirmed on every runtime.
//!
//! An NRI eviction is on the wire but no released containerd carries it out for a plugin
//! (through 2.3 / NRI v0.12 the adaptation keeps only `Update` from a plugin's reply and from
//! `UpdateContainers`). So the engine stops the container itself, the way containerd's own
//! `EvictContainer` does (SIGKILL, zero timeout), and never assumes it happened:
//!
//! 1. at the decision, a pidfd is taken on the container's init pid (NRI `Container.pid`): from
//!    then on the process is pinned and its pid cannot be reused under us;
//! 2. once the runtime has applied the update that keeps the old resources (its
//!    `PostUpdateContainer`, or its request deadline), the pid must be listed in the container's
//!    own cgroup (`cgroup.procs`) while the pidfd's process is still alive; only then is SIGKILL
//!    sent, through the pidfd;
//! 3. the exit is awaited on the pidfd (readable when the process exits), then the runtime's
//!    `StopContainer` event for the container confirms it;
//! 4. an attempt that cannot be confirmed is reported (log, `status`, `nri_resize_restarts_total`)
//!    and retried with backoff; after the last one the restart is reported failed.
//!
//! Every task has an owner ([`Restarts`]) and stops when its cancellation token fires.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::cgroup::{CgroupError, CgroupIo};
use crate::sync::Locked as _;

/// What the runtime has said about a container since its restart was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Seen {
    Nothing,
    /// `PostUpdateContainer`: the update that keeps the old resources is applied.
    Updated,
    /// `StopContainer` (or `RemoveContainer`): the runtime saw the container stop.
    Stopped,
}

/// Why one attempt to stop a container did not end confirmed.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    #[error("the runtime gave no pid for the container")]
    NoPid,
    #[error("cgroup access is off, so the pid cannot be verified")]
    NoCgroups,
    #[error("the container's cgroup path is unknown, so the pid cannot be verified")]
    NoCgroupPath,
    #[error("reading the container's cgroup: {0}")]
    Cgroup(#[from] CgroupError),
    #[error("pid {pid} is not in the container's cgroup {cgroup}: refusing to signal it")]
    NotInCgroup { pid: u32, cgroup: String },
    #[error("SIGKILL to pid {pid}: {source}")]
    Signal {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("pid {pid} still running {after:?} after SIGKILL")]
    StillRunning { pid: u32, after: Duration },
    #[error("the container exited but the runtime has not reported the stop within {0:?}")]
    NotReported(Duration),
    #[error("the blocking cgroup read was cancelled")]
    Join,
    #[error("cannot hold pid {pid} (pidfd): {error}")]
    Pidfd { pid: u32, error: String },
}

/// How long each phase may take, and how often to try.
#[derive(Debug, Clone)]
pub struct Timing {
    /// Waiting for the runtime to apply the update that keeps the old resources.
    pub update: Duration,
    /// Waiting for the init process to exit after SIGKILL.
    pub exit: Duration,
    /// Waiting for the runtime's `StopContainer` after the exit.
    pub stop: Duration,
    pub attempts: u32,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            // NRI's default request timeout is 2 s: the runtime has answered (or dropped us) by then.
            update: Duration::from_millis(2500),
            exit: Duration::from_secs(5),
            stop: Duration::from_secs(10),
            attempts: 5,
            backoff_min: Duration::from_millis(500),
            backoff_max: Duration::from_secs(8),
        }
    }
}

/// One container to restart.
#[derive(Debug, Clone)]
pub struct Target {
    pub container_id: String,
    /// `namespace/pod/container`, for logs.
    pub subject: String,
    /// The init process as the runtime reported it (host pid namespace).
    pub pid: Option<u32>,
    /// The container's cgroup (within the hierarchy).
    pub cgroup: Option<PathBuf>,
    /// Why it restarts (the policy's reason), kept in every report.
    pub reason: String,
    /// How long the runtime may take to apply the update (its request timeout); `None`: the
    /// default of [`Timing::update`].
    pub update_wait: Option<Duration>,
}

/// What the owner of a restart hears as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Attempt `attempt` could not be confirmed; the next follows after `delay`.
    Retrying {
        attempt: u32,
        of: u32,
        error: String,
        delay: Duration,
    },
    /// The container exited and the runtime reported the stop.
    Confirmed { attempt: u32 },
    /// Every attempt failed.
    Failed { attempts: u32, error: String },
}

/// The restarts in flight, each a task owned here.
#[derive(Debug)]
pub struct Restarts {
    seen: Mutex<HashMap<String, watch::Sender<Seen>>>,
    tasks: TaskTracker,
    cancel: CancellationToken,
    timing: Timing,
}

/// Hears a restart's progress.
pub type Report = Arc<dyn Fn(&Target, &Progress) + Send + Sync>;

impl Restarts {
    pub fn new(cancel: CancellationToken, timing: Timing) -> Self {
        Restarts {
            seen: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            cancel,
            timing,
        }
    }

    fn seen_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<Seen>>> {
        self.seen.locked()
    }

    /// The runtime said something about a container; a restart waiting for it moves on.
    pub fn note(&self, container_id: &str, seen: Seen) {
        if let Some(tx) = self.seen_map().get(container_id) {
            tx.send_if_modified(|s| {
                let newer = seen > *s;
                if newer {
                    *s = seen;
                }
                newer
            });
        }
    }

    /// Whether a restart of the container is in flight.
    pub fn pending(&self, container_id: &str) -> bool {
        self.seen_map().contains_key(container_id)
    }

    /// Starts restarting `target` unless a restart of it is already in flight. The pidfd is taken
    /// now, at the decision, so that the process cannot be swapped for another one later.
    /// `report` hears every retry and the end. Returns whether a new restart started.
    pub fn request(
        self: &Arc<Self>,
        target: Target,
        cgroups: Option<Arc<dyn CgroupIo>>,
        report: Report,
    ) -> bool {
        let rx = {
            let mut map = self.seen_map();
            if map.contains_key(&target.container_id) {
                return false;
            }
            let (tx, rx) = watch::channel(Seen::Nothing);
            map.insert(target.container_id.clone(), tx);
            rx
        };
        let process = Process::open(target.pid);
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            let id = target.container_id.clone();
            tokio::select! {
                () = this.cancel.cancelled() => {}
                () = run(&target, process, cgroups, rx, &this.timing, &report) => {}
            }
            this.seen_map().remove(&id);
        });
        true
    }

    /// Cancels every restart in flight and waits for their tasks to end.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// The container's init process as the restart holds it.
#[derive(Debug)]
enum Process {
    /// The runtime gave no pid.
    NoPid,
    /// The process had already exited at the decision: only the runtime's word is missing.
    Gone,
    /// Pinned by its pidfd.
    Open { pid: u32, pidfd: AsyncFd<OwnedFd> },
    /// `pidfd_open` failed for another reason (permissions, no host pid namespace).
    Unopenable { pid: u32, error: String },
}

impl Process {
    /// Takes the pidfd of `pid` (needs a tokio runtime for the exit notification).
    fn open(pid: Option<u32>) -> Self {
        let Some(pid) = pid else {
            return Self::NoPid;
        };
        let unopenable = |error: String| Self::Unopenable { pid, error };
        let Some(raw) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
            return unopenable("not a valid pid".into());
        };
        #[expect(
            deprecated,
            reason = "the AsyncFd owns the pidfd (an `OwnedFd`), which is the I/O safety tokio's \
                      `unsafe fn register` asks for; unsafe code is denied in this crate"
        )]
        let register = AsyncFd::new;
        match pidfd_open(raw, PidfdFlags::empty()) {
            Ok(fd) => match register(fd) {
                Ok(pidfd) => Self::Open { pid, pidfd },
                Err(e) => unopenable(e.to_string()),
            },
            Err(e) if e == rustix::io::Errno::SRCH => Self::Gone,
            Err(e) => unopenable(std::io::Error::from(e).to_string()),
        }
    }
}

/// Whether the pidfd's process has exited (readable pidfd), without waiting.
fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
}

/// Waits until the runtime has said at least `want`, or `within` passed. Returns whether it did.
async fn wait_seen(rx: &mut watch::Receiver<Seen>, want: Seen, within: Duration) -> bool {
    tokio::time::timeout(within, rx.wait_for(|s| *s >= want))
        .await
        .is_ok_and(|r| r.is_ok())
}

async fn run(
    target: &Target,
    process: Process,
    cgroups: Option<Arc<dyn CgroupIo>>,
    mut rx: watch::Receiver<Seen>,
    timing: &Timing,
    report: &Report,
) {
    // The runtime first applies the update that keeps the old resources (or stops the
    // container itself, if it ever carries out the eviction).
    let update_wait = target.update_wait.unwrap_or(timing.update);
    wait_seen(&mut rx, Seen::Updated, update_wait).await;
    let mut backoff = Backoff::new(timing.backoff_min, timing.backoff_max);
    for attempt in 1..=timing.attempts {
        match attempt_stop(&process, target, cgroups.as_ref(), &mut rx, timing).await {
            Ok(()) => {
                report(target, &Progress::Confirmed { attempt });
                return;
            }
            Err(e) if attempt == timing.attempts => {
                report(
                    target,
                    &Progress::Failed {
                        attempts: attempt,
                        error: e.to_string(),
                    },
                );
                return;
            }
            Err(e) => {
                let delay = backoff.next_delay();
                report(
                    target,
                    &Progress::Retrying {
                        attempt,
                        of: timing.attempts,
                        error: e.to_string(),
                        delay,
                    },
                );
                // A stop reported meanwhile ends the wait early.
                wait_seen(&mut rx, Seen::Stopped, delay).await;
            }
        }
    }
}

/// One attempt: verify, SIGKILL, wait for the exit, wait for the runtime's stop.
async fn attempt_stop(
    process: &Process,
    target: &Target,
    cgroups: Option<&Arc<dyn CgroupIo>>,
    rx: &mut watch::Receiver<Seen>,
    timing: &Timing,
) -> Result<(), StopError> {
    if *rx.borrow() >= Seen::Stopped {
        return Ok(());
    }
    match process {
        Process::NoPid => return Err(StopError::NoPid),
        Process::Unopenable { pid, error } => {
            return Err(StopError::Pidfd {
                pid: *pid,
                error: error.clone(),
            })
        }
        Process::Gone => {}
        Process::Open { pid, pidfd } => {
            if !exited(pidfd.get_ref()) {
                kill_verified(*pid, pidfd.get_ref(), target, cgroups).await?;
                tokio::time::timeout(timing.exit, pidfd.readable())
                    .await
                    .map_err(|_| StopError::StillRunning {
                        pid: *pid,
                        after: timing.exit,
                    })?
                    .map_err(|e| StopError::Pidfd {
                        pid: *pid,
                        error: e.to_string(),
                    })?
                    .retain_ready();
            }
        }
    }
    if wait_seen(rx, Seen::Stopped, timing.stop).await {
        Ok(())
    } else {
        Err(StopError::NotReported(timing.stop))
    }
}

/// SIGKILL through the pidfd, only while its process is verifiably in the container's cgroup.
async fn kill_verified(
    pid: u32,
    pidfd: &OwnedFd,
    target: &Target,
    cgroups: Option<&Arc<dyn CgroupIo>>,
) -> Result<(), StopError> {
    let cgroup = target.cgroup.clone().ok_or(StopError::NoCgroupPath)?;
    let cg = Arc::clone(cgroups.ok_or(StopError::NoCgroups)?);
    // `cgroup.procs` is one small read; it runs off the async workers all the same.
    let path = cgroup.clone();
    let procs = tokio::task::spawn_blocking(move || cg.procs(&path))
        .await
        .map_err(|_| StopError::Join)??;
    // Checked after the read: alive now means it was alive, so it was this process, when listed.
    if exited(pidfd) {
        return Ok(());
    }
    if !procs.contains(&pid) {
        return Err(StopError::NotInCgroup {
            pid,
            cgroup: cgroup.display().to_string(),
        });
    }
    match pidfd_send_signal(pidfd, Signal::KILL) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::SRCH => Ok(()),
        Err(e) => Err(StopError::Signal {
            pid,
            source: e.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command};

    use tokio::sync::mpsc;

    use super::*;
    use crate::cgroup::{Cgroups, V2};

    fn fast() -> Timing {
        Timing {
            update: Duration::from_millis(10),
            exit: Duration::from_secs(5),
            stop: Duration::from_millis(200),
            attempts: 2,
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(10),
        }
    }

    /// A real process of our own, and a cgroup tree (injected root) whose `cgroup.procs` lists
    /// `listed` for the container's cgroup `/ctr`.
    fn setup(listed: impl FnOnce(u32) -> u32) -> (Child, tempfile::TempDir, Arc<dyn CgroupIo>) {
        let child = Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("spawn sleep");
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("ctr")).expect("mkdir");
        std::fs::write(
            root.path().join("ctr/cgroup.procs"),
            format!("1\n{}\n", listed(child.id())),
        )
        .expect("write cgroup.procs");
        let cg = Cgroups::V2(V2 {
            root: root.path().to_path_buf(),
        });
        (child, root, Arc::new(cg))
    }

    fn target(pid: Option<u32>) -> Target {
        Target {
            container_id: "c1".into(),
            subject: "ns/pod/app".into(),
            pid,
            cgroup: Some(PathBuf::from("/ctr")),
            reason: "restart required".into(),
            update_wait: None,
        }
    }

    /// Starts a restart; returns every report up to the final one.
    fn restart(
        restarts: &Arc<Restarts>,
        t: Target,
        cg: Arc<dyn CgroupIo>,
    ) -> mpsc::UnboundedReceiver<Progress> {
        let (tx, rx) = mpsc::unbounded_channel();
        let report: Report = Arc::new(move |_, p| {
            let _ = tx.send(p.clone());
        });
        assert!(restarts.request(t, Some(cg), report));
        rx
    }

    async fn last(mut rx: mpsc::UnboundedReceiver<Progress>) -> Vec<Progress> {
        let mut all = Vec::new();
        while let Some(p) = rx.recv().await {
            let end = !matches!(p, Progress::Retrying { .. });
            all.push(p);
            if end {
                break;
            }
        }
        all
    }

    #[tokio::test]
    async fn kills_a_verified_process_and_waits_for_the_runtime() {
        let (mut child, _root, cg) = setup(|pid| pid);
        let pid = child.id();
        let restarts = Arc::new(Restarts::new(CancellationToken::new(), fast()));
        let rx = restart(&restarts, target(Some(pid)), cg);
        assert!(!restarts.request(
            target(Some(pid)),
            None,
            Arc::new(|_: &Target, _: &Progress| {})
        ));
        restarts.note("c1", Seen::Updated);
        // The "runtime": reports the stop once the process has exited.
        let status = tokio::task::spawn_blocking(move || child.wait().expect("wait"))
            .await
            .expect("join");
        restarts.note("c1", Seen::Stopped);
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert_eq!(last(rx).await, [Progress::Confirmed { attempt: 1 }]);
        restarts.shutdown().await;
        assert!(!restarts.pending("c1"));
    }

    #[tokio::test]
    async fn never_signals_a_pid_outside_the_containers_cgroup() {
        let (mut child, _root, cg) = setup(|pid| pid + 1);
        let restarts = Arc::new(Restarts::new(CancellationToken::new(), fast()));
        let rx = restart(&restarts, target(Some(child.id())), cg);
        let reports = last(rx).await;
        assert_eq!(reports.len(), 2, "{reports:?}");
        assert!(
            matches!(&reports[0], Progress::Retrying { attempt: 1, of: 2, error, .. } if error.contains("not in the container's cgroup")),
            "{reports:?}"
        );
        assert!(
            matches!(&reports[1], Progress::Failed { attempts: 2, error } if error.contains("not in the container's cgroup")),
            "{reports:?}"
        );
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "still running"
        );
        child.kill().expect("kill our own child");
        child.wait().expect("reap");
    }

    #[tokio::test]
    async fn an_exit_the_runtime_never_reports_is_retried_then_failed() {
        let (mut child, _root, cg) = setup(|pid| pid);
        let restarts = Arc::new(Restarts::new(CancellationToken::new(), fast()));
        let rx = restart(&restarts, target(Some(child.id())), cg);
        let reports = last(rx).await;
        assert!(
            matches!(&reports[..], [Progress::Retrying { error: e1, .. }, Progress::Failed { error: e2, .. }]
                if e1.contains("has not reported the stop") && e2.contains("has not reported the stop")),
            "{reports:?}"
        );
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[tokio::test]
    async fn no_pid_is_reported_not_assumed() {
        let (mut child, _root, cg) = setup(|pid| pid);
        let restarts = Arc::new(Restarts::new(CancellationToken::new(), fast()));
        let reports = last(restart(&restarts, target(None), cg)).await;
        assert!(
            matches!(reports.last(), Some(Progress::Failed { error, .. }) if error.contains("no pid")),
            "{reports:?}"
        );
        assert!(child.try_wait().expect("try_wait").is_none());
        child.kill().expect("kill our own child");
        child.wait().expect("reap");
    }

    #[tokio::test]
    async fn a_stop_the_runtime_already_reported_needs_no_signal() {
        let (mut child, _root, cg) = setup(|pid| pid);
        let restarts = Arc::new(Restarts::new(CancellationToken::new(), fast()));
        let rx = restart(&restarts, target(Some(child.id())), cg);
        restarts.note("c1", Seen::Stopped);
        assert_eq!(last(rx).await, [Progress::Confirmed { attempt: 1 }]);
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "not signalled"
        );
        child.kill().expect("kill our own child");
        child.wait().expect("reap");
    }

    #[tokio::test]
    async fn shutdown_cancels_restarts_in_flight() {
        let (mut child, _root, cg) = setup(|pid| pid + 1);
        let slow = Timing {
            update: Duration::from_secs(3600),
            ..fast()
        };
        let restarts = Arc::new(Restarts::new(CancellationToken::new(), slow));
        let _rx = restart(&restarts, target(Some(child.id())), cg);
        assert!(restarts.pending("c1"));
        restarts.shutdown().await;
        assert!(!restarts.pending("c1"));
        child.kill().expect("kill our own child");
        child.wait().expect("reap");
    }
}
