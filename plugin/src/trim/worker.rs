//! Trimming's own thread: the trimmer's passes (each container's turn, cgroupfs reads and the
//! `memory.reclaim` write, whose reclaim the kernel does in the writing thread's context, and
//! the bookkeeping around the turns) run here, one at a time, at low CPU priority:
//! `SCHED_BATCH` at nice [`TRIM_NICE`] (else nice 19 alone). They used to run on tokio's
//! shared blocking pool beside the NRI handlers' blocking work, at the same priority: trimming 200 containers slowed the handlers (docs/benchmarks.md, "Trimming
//! under load"). A pooled tokio thread's priority is never changed: it would carry over to
//! whatever runs on that thread later.
//!
//! Why not `SCHED_IDLE`: its weight (3, against nice 19's 15 and nice 0's 1024) lets a busy
//! node starve the thread almost entirely while it is inside `memory.reclaim`, where it may hold
//! a kernel lock others wait for (`shrinker_rwsem` for reading on kernels before 6.7: a mount
//! that registers a shrinker then waits behind it, and every reclaimer on the node behind the
//! mount). nice 19 keeps the thread's share of a contended CPU small but never nil;
//! `SCHED_BATCH` keeps its wake-ups from preempting a running handler.
//!
//! The [`TrimWorker`] is owned by the trimmer's task; the thread ends when the worker is
//! dropped (its queue closes), after the pass it is in, if any. Nobody waits for that pass: a
//! `memory.reclaim` write stuck in the kernel holds only this thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;

use tokio::sync::oneshot;
use tracing::warn;

/// The thread's nice value (the lowest).
pub const TRIM_NICE: i32 = 19;

/// The thread's name (`ps -T`, `/proc/<pid>/task/*/comm`).
pub const THREAD_NAME: &str = "nri-resize-trim";

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Why a submitted closure gave no result.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The thread is gone (it could not start, or ended).
    #[error("the trimming thread is gone")]
    Gone,
    /// The closure panicked (the thread lives on for the next one).
    #[error("the trimming turn panicked")]
    Panicked,
}

/// How far the thread lowered its priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lowered {
    /// `SCHED_BATCH` at nice [`TRIM_NICE`].
    Batch,
    /// `SCHED_BATCH` refused; nice [`TRIM_NICE`] alone.
    Nice,
    /// Both refused: it runs at the default priority.
    Not,
}

/// The handle to the thread: submit closures with [`TrimWorker::run`].
pub struct TrimWorker {
    /// `None`: the thread could not start; closures run on tokio's blocking pool (as before
    /// the thread existed), at the default priority.
    jobs: Option<mpsc::Sender<Job>>,
}

impl TrimWorker {
    /// Starts the thread; it lowers its own priority first (a warning when it cannot). When
    /// the thread cannot start, says so and runs closures on tokio's blocking pool.
    pub fn start() -> Self {
        match Self::spawn() {
            Ok(jobs) => Self { jobs: Some(jobs) },
            Err(error) => {
                warn!(%error, "trimming: cannot start its thread; turns run on the shared blocking pool at the default priority");
                Self { jobs: None }
            }
        }
    }

    fn spawn() -> std::io::Result<mpsc::Sender<Job>> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                if lower_own_priority() == Lowered::Not {
                    warn!(
                        "trimming: cannot lower its thread's priority to nice {TRIM_NICE}; its reclaim competes with the NRI handlers at the default"
                    );
                }
                // Ends when every sender is gone: the worker was dropped.
                while let Ok(job) = queue.recv() {
                    job();
                }
            })?;
        Ok(jobs)
    }

    /// Runs `f` on the thread after the closures submitted before it; its result comes back
    /// through the returned future. Dropping the future does not stop `f` (it runs to its end,
    /// its result is dropped).
    pub fn run<T, F>(
        &self,
        f: F,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, WorkerError>> + Send>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let Some(jobs) = &self.jobs else {
            let pooled = tokio::task::spawn_blocking(f);
            return from_pool(pooled);
        };
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            // A panic in a turn must not end the thread: the closure owns what it touches.
            let r = catch_unwind(AssertUnwindSafe(f)).map_err(|_| WorkerError::Panicked);
            // The receiver is gone when the pass was cancelled: nothing to report.
            let _ = tx.send(r);
        });
        let sent = jobs.send(job).is_ok();
        Box::pin(async move {
            if !sent {
                return Err(WorkerError::Gone);
            }
            rx.await.unwrap_or(Err(WorkerError::Gone))
        })
    }
}

/// A closure's result from tokio's blocking pool (the thread could not start).
fn from_pool<T: Send + 'static>(
    pooled: tokio::task::JoinHandle<T>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, WorkerError>> + Send>> {
    Box::pin(async move {
        pooled.await.map_err(|e| {
            if e.is_panic() {
                WorkerError::Panicked
            } else {
                WorkerError::Gone
            }
        })
    })
}

/// Lowers the calling thread's priority: nice [`TRIM_NICE`], then `SCHED_BATCH` (which keeps
/// the nice value). Only ever called on the trimming thread (a thread's scheduling policy and
/// nice value are its own on Linux).
pub fn lower_own_priority() -> Lowered {
    let Ok(who) = libc::id_t::try_from(nix::unistd::gettid().as_raw()) else {
        return Lowered::Not;
    };
    #[expect(
        unsafe_code,
        reason = "setpriority has no safe wrapper in libc or nix; it takes no pointers"
    )]
    // SAFETY: plain integer arguments; it changes only this thread's nice value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, TRIM_NICE) };
    if rc != 0 {
        return Lowered::Not;
    }
    let param = libc::sched_param { sched_priority: 0 };
    #[expect(
        unsafe_code,
        reason = "sched_setscheduler has no safe wrapper in libc or nix; the pointer is to a local"
    )]
    // SAFETY: `param` lives across the call; pid 0 is the calling thread, whose policy alone
    // changes.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &raw const param) };
    if rc == 0 {
        Lowered::Batch
    } else {
        let error = std::io::Error::last_os_error();
        warn!(%error, "trimming: SCHED_BATCH refused; its thread runs at nice {TRIM_NICE} under the default policy");
        Lowered::Nice
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{TrimWorker, WorkerError, THREAD_NAME};

    /// The calling thread's id.
    fn tid() -> i32 {
        nix::unistd::gettid().as_raw()
    }

    /// The scheduling policy and nice value of the calling thread, from
    /// `/proc/thread-self/sched` (`policy`) and `getpriority`.
    fn own_policy_and_nice() -> (u32, i32) {
        let sched = std::fs::read_to_string("/proc/thread-self/sched").expect("read sched");
        let policy = sched
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "policy").then(|| v.trim().parse::<u32>().ok())?
            })
            .expect("policy line in /proc/thread-self/sched");
        let who = libc::id_t::try_from(tid()).expect("tid");
        #[expect(unsafe_code, reason = "getpriority has no safe wrapper; no pointers")]
        // SAFETY: plain integer arguments, reads only.
        let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, who) };
        (policy, nice)
    }

    #[tokio::test]
    async fn results_come_back_in_order_from_one_named_thread() {
        let worker = TrimWorker::start();
        let pending: Vec<_> = (0..20)
            .map(|n| {
                worker.run(move || {
                    let name = std::thread::current().name().map(str::to_owned);
                    (n, name, tid())
                })
            })
            .collect();
        let mut tids = Vec::new();
        for (want, p) in pending.into_iter().enumerate() {
            let (n, name, t) = p.await.expect("result");
            assert_eq!(n, want, "results out of order");
            assert_eq!(name.as_deref(), Some(THREAD_NAME));
            tids.push(t);
        }
        tids.dedup();
        assert_eq!(tids.len(), 1, "turns ran on more than one thread: {tids:?}");
        assert_ne!(tids[0], tid(), "a turn ran on the caller's thread");
    }

    #[tokio::test]
    async fn the_thread_runs_at_low_priority_and_the_caller_does_not() {
        let before = own_policy_and_nice();
        let worker = TrimWorker::start();
        let (policy, nice) = worker.run(own_policy_and_nice).await.expect("result");
        // SCHED_BATCH is policy 3; both at nice 19.
        assert_eq!(
            (policy, nice),
            (3, super::TRIM_NICE),
            "trimming thread at policy {policy}, nice {nice}: not SCHED_BATCH at nice 19"
        );
        assert_eq!(
            own_policy_and_nice(),
            before,
            "the caller's thread priority changed"
        );
    }

    #[tokio::test]
    async fn a_panicking_turn_is_reported_and_the_thread_lives_on() {
        let worker = TrimWorker::start();
        let r = worker.run(|| -> u32 { panic!("a turn fails") }).await;
        assert!(matches!(r, Err(WorkerError::Panicked)), "got {r:?}");
        assert_eq!(worker.run(|| 7).await.expect("after a panic"), 7);
    }

    #[tokio::test]
    async fn dropping_the_worker_ends_the_thread_after_its_turn() {
        let worker = TrimWorker::start();
        let (release, held) = std::sync::mpsc::channel::<()>();
        // A turn still in flight when the worker goes (as after a cancelled pass).
        let in_flight = worker.run(move || {
            let _ = held.recv_timeout(Duration::from_secs(10));
            tid()
        });
        let thread = worker.run(tid);
        drop(worker);
        release.send(()).expect("release the turn");
        let t = in_flight.await.expect("the turn in flight finishes");
        assert_eq!(thread.await.expect("queued turn"), t);
        let task = format!("/proc/self/task/{t}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&task).exists() {
            assert!(
                Instant::now() < deadline,
                "the trimming thread {t} still runs 10 s after its worker was dropped"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
