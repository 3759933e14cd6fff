//! Staged reclaim: bring a container's memory usage under a lower limit without an OOM kill.
//!
//! The container runs under a safe interim limit (usage plus headroom) while this loop makes the
//! kernel reclaim, in passes with a growing pause between them:
//!
//! - cgroup v1: write the requested `memory.limit_in_bytes` directly. The kernel reclaims inside
//!   the write and refuses it with `EBUSY` when it cannot get under the value — it never OOM-kills
//!   for a v1 limit write. After a refusal the limit follows usage down (usage plus headroom),
//!   so what reclaim won stays won.
//! - cgroup v2: ask `memory.reclaim` for the difference (`EAGAIN`: it got less), and when the
//!   kernel has no `memory.reclaim` (before 5.19) step `memory.high` down towards the target
//!   instead, never above the value found there, and put that value back in every outcome
//!   (unless someone wrote `memory.high` meanwhile: theirs stays; `high.rs`). `memory.max` is
//!   never written here: writing it below unreclaimable usage OOM-kills. The caller applies the
//!   requested limit through the runtime once usage fits.
//!
//! Bounded in time: on timeout the limit kept is usage plus headroom (never above the interim,
//! never below the target; paced, once it held: at least the usage it first held at), and the
//! caller reports why.
//!
//! Paced (cgroup v2 with PSI, `max_stall` below 1.0): each pass asks for one step of the
//! difference, and the container's `memory.pressure`, `io.pressure` and refault count
//! (`memory.stat`) are read between passes; the [`Pacer`](crate::policy::Pacer) holds the
//! reclaim (passes that reclaim nothing, and on the `memory.high` path `memory.high` back at
//! `max`) while the stall share since the last pass is over the ceiling, resumes with small
//! steps once it is well under it, and grows them while it stays there. Pacing never ends the
//! loop; a timeout that pacing contributed to says so in the outcome. On v1 and without PSI
//! pacing is off, and a log line says why.
//!
//! The loop is synchronous (cgroupfs writes block while the kernel reclaims): run it on a
//! blocking thread. It looks at its cancellation token before every write and after every pass,
//! so a newer update for the same container takes over at once: nothing is written or reported
//! after it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::cgroup::{CgroupError, CgroupIo, CgroupVersion};
use crate::clock::{Clock, RealClock};
use crate::policy::{reclaim_request, safe_limit, Harm, MemoryUse, Share};
use high::HighOwner;
pub use in_kernel::LimitWrites;
use paced::Paced;

/// One staged decrease of one cgroup.
#[derive(Debug, Clone)]
pub struct ReclaimJob {
    /// The container's cgroup (within the hierarchy, see [`crate::cgroup::resolve`]).
    pub cgroup: PathBuf,
    /// The requested limit.
    pub target: u64,
    /// The limit in place while reclaiming.
    pub interim: u64,
    /// Bytes above usage a kept limit leaves.
    pub headroom: u64,
    pub timeout: Duration,
    /// First pause between passes (doubles up to one second).
    pub step_interval: Duration,
    /// v2: step `memory.high` even where `memory.reclaim` exists.
    pub force_memory_high: bool,
    /// Ceiling on the container's stall share (memory or I/O) between passes (1.0: unpaced).
    pub max_stall: Share,
    /// Where every limit write of the loop is marked while it is inside the kernel (shared
    /// with the reclaim's handle, whose supersede waits for it).
    pub writes: Arc<LimitWrites>,
}

/// How a staged decrease ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimOutcome {
    /// Usage fits the target (v1: the target limit is written).
    Reached {
        start: MemoryUse,
        end: MemoryUse,
        passes: u32,
        elapsed: Duration,
    },
    /// The target was not reached in time; `kept` is the limit to keep (v1: already written).
    TimedOut {
        start: MemoryUse,
        end: MemoryUse,
        kept: u64,
        passes: u32,
        elapsed: Duration,
        /// What pacing adds to the reason (empty unless it held the reclaim back).
        stall_note: String,
    },
    /// A newer request took over.
    Cancelled,
    /// A cgroup read or write failed (e.g. the container is gone).
    Failed(String),
}

/// The reclaim method actually used, for logs and status.
pub fn method(io: &dyn CgroupIo, force_memory_high: bool) -> &'static str {
    match (io.version(), force_memory_high) {
        (CgroupVersion::V1, _) => "memory.limit_in_bytes",
        (CgroupVersion::V2, true) => "memory.high",
        (CgroupVersion::V2, false) => "memory.reclaim",
    }
}

const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Where a staged decrease stands after one pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pass {
    /// The container's memory use after the pass.
    pub usage: MemoryUse,
    /// The memory limit the cgroup holds now (v1: it follows usage down; v2: the interim).
    pub limit: u64,
    /// Paced only: the most this pass asked the kernel to reclaim (0: holding).
    pub step: Option<u64>,
    /// Paced only: the stall share (the higher of memory and I/O) measured between the
    /// previous two passes.
    pub stall: Option<f64>,
}

/// Runs the staged decrease on the machine's clock; `on_pass` sees where it stands after every
/// pass.
pub fn reclaim_to(
    io: &dyn CgroupIo,
    job: &ReclaimJob,
    cancel: &CancellationToken,
    on_pass: impl FnMut(&Pass),
) -> ReclaimOutcome {
    reclaim_with_clock(io, job, &RealClock, cancel, on_pass)
}

/// [`reclaim_to`] on `clock`: every time the loop reads (the timeout, the pauses between passes,
/// the wall time pacing divides the stall by) is the clock's.
pub fn reclaim_with_clock(
    io: &dyn CgroupIo,
    job: &ReclaimJob,
    clock: &dyn Clock,
    cancel: &CancellationToken,
    mut on_pass: impl FnMut(&Pass),
) -> ReclaimOutcome {
    let started = clock.now();
    let elapsed = || clock.now().saturating_duration_since(started);
    let read = || io.memory_use(&job.cgroup);
    let start = match read() {
        Ok(u) => u,
        Err(e) => return ReclaimOutcome::Failed(e.to_string()),
    };
    let v1 = io.version() == CgroupVersion::V1;
    let mut use_high = !v1 && job.force_memory_high;
    let mut high = HighOwner::default();
    let restore_high = |high: &mut HighOwner| high.restore(io, &job.cgroup);
    let mut limit_now = job.interim;
    // Unpaced: the pause between passes doubles up to a second.
    let mut unpaced_pause = Backoff::new(job.step_interval, MAX_PAUSE);
    let mut passes = 0u32;
    let mut paced = Paced::start(io, job, clock);
    loop {
        if cancel.is_cancelled() {
            return cancelled(restore_high(&mut high));
        }
        passes += 1;
        let step = paced.as_ref().map(|p| p.pacer.step(u64::MAX));
        let pass = if v1 {
            v1_pass(io, job, cancel, &mut limit_now)
        } else {
            v2_pass(io, job, cancel, step, &mut use_high, &mut high)
        };
        let now = match pass.and_then(|()| read()) {
            Ok(u) => u,
            Err(e) => {
                let _ = restore_high(&mut high);
                return ReclaimOutcome::Failed(e.to_string());
            }
        };
        // Superseded during the pass: nothing more is reported or written.
        if cancel.is_cancelled() {
            return cancelled(restore_high(&mut high));
        }
        on_pass(&Pass {
            usage: now,
            limit: limit_now,
            step,
            stall: paced
                .as_ref()
                .and_then(|p| p.pacer.last.as_ref().map(Harm::stall)),
        });
        let reached = if v1 {
            limit_now == job.target
        } else {
            now.usage <= job.target
        };
        if reached {
            if let Err(e) = restore_high(&mut high) {
                return restore_failed(&e);
            }
            return ReclaimOutcome::Reached {
                start,
                end: now,
                passes,
                elapsed: elapsed(),
            };
        }
        if elapsed() >= job.timeout {
            let usage = paced::kept_usage(paced.as_ref(), now.usage);
            let kept = safe_limit(limit_now, job.target, usage, job.headroom);
            if v1 && kept < limit_now && !cancel.is_cancelled() {
                // Best effort: a refusal keeps the (higher, still safe) limit in place.
                let written = job
                    .writes
                    .write(|| io.set_memory_limit(&job.cgroup, Some(kept)))
                    .is_ok();
                // Superseded while the kernel reclaimed inside the write: `Cancelled`, not
                // `TimedOut`, whose `kept` the caller would have the runtime apply over the
                // newer update's limit (see `v1_pass` on the write itself).
                if cancel.is_cancelled() {
                    return cancelled(restore_high(&mut high));
                }
                if written {
                    limit_now = kept;
                }
            }
            if let Err(e) = restore_high(&mut high) {
                return restore_failed(&e);
            }
            return ReclaimOutcome::TimedOut {
                start,
                end: now,
                kept: if v1 { limit_now } else { kept },
                passes,
                elapsed: elapsed(),
                stall_note: paced.map(|p| p.pacer.deferred_note()).unwrap_or_default(),
            };
        }
        let wait = match &mut paced {
            Some(p) => {
                p.observe(io, job, clock, now.usage);
                p.pacer.wait()
            }
            None => unpaced_pause.next_delay(),
        };
        let left = job.timeout.saturating_sub(elapsed());
        // A cancel during the pause is handled at the top of the loop.
        clock.sleep(wait.min(left), cancel);
    }
}

/// The outcome of a cancelled loop, once `memory.high` was put back (`restored`).
fn cancelled(restored: Result<(), CgroupError>) -> ReclaimOutcome {
    match restored {
        Ok(()) => ReclaimOutcome::Cancelled,
        Err(e) => restore_failed(&e),
    }
}

/// The outcome when `memory.high` could not be put back (its error is the reason).
fn restore_failed(e: &CgroupError) -> ReclaimOutcome {
    ReclaimOutcome::Failed(format!("restoring memory.high: {e}"))
}

/// v1: try the target; on `EBUSY` let the limit follow usage down. Every write is preceded by a
/// look at `cancel`, and a write during which it fired is the last (the loop then ends
/// `Cancelled`): once a newer update has superseded the decrease, no lower limit is written
/// over the runtime's.
///
/// The write that raced the cancel is the one left. A v1 limit write blocks while the kernel
/// reclaims, and the newer update's limit is written by the runtime only after the handler
/// that cancelled us answered; so a write of ours that returned before then lands first and
/// the newer limit last. Every write is marked in `job.writes` while it is inside the kernel,
/// and the handler that supersedes the decrease waits for it to leave before answering
/// ([`in_kernel`]), so one still inside the kernel never lands after the newer limit.
fn v1_pass(
    io: &dyn CgroupIo,
    job: &ReclaimJob,
    cancel: &CancellationToken,
    limit_now: &mut u64,
) -> Result<(), CgroupError> {
    if cancel.is_cancelled() {
        return Ok(());
    }
    let wrote = job
        .writes
        .write(|| io.set_memory_limit(&job.cgroup, Some(job.target)));
    if cancel.is_cancelled() {
        // Superseded during the write: nothing follows it (the loop ends `Cancelled`).
        if wrote.is_ok() {
            *limit_now = job.target;
        }
        return Ok(());
    }
    match wrote {
        Ok(()) => {
            *limit_now = job.target;
            Ok(())
        }
        Err(CgroupError::Busy { .. }) => {
            let usage = io.memory_use(&job.cgroup)?.usage;
            let follow = safe_limit(*limit_now, job.target, usage, job.headroom);
            if follow < *limit_now && !cancel.is_cancelled() {
                match job
                    .writes
                    .write(|| io.set_memory_limit(&job.cgroup, Some(follow)))
                {
                    Ok(()) => *limit_now = follow,
                    // Usage grew meanwhile: keep the limit in place.
                    Err(CgroupError::Busy { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// v2: `memory.reclaim`, or `memory.high` stepping where there is none. `step`: at most this
/// much per pass (paced); 0 holds: nothing is reclaimed and `memory.high` goes back to what was
/// found there.
/// Nothing is reclaimed or lowered once `cancel` fired (the loop then puts `memory.high` back).
fn v2_pass(
    io: &dyn CgroupIo,
    job: &ReclaimJob,
    cancel: &CancellationToken,
    step: Option<u64>,
    use_high: &mut bool,
    high: &mut HighOwner,
) -> Result<(), CgroupError> {
    let usage = io.memory_use(&job.cgroup)?.usage;
    if usage <= job.target {
        return Ok(());
    }
    let step = step.unwrap_or(u64::MAX);
    if step == 0 {
        high.restore(io, &job.cgroup)?;
        return Ok(());
    }
    if cancel.is_cancelled() {
        return Ok(());
    }
    if !*use_high {
        match io.reclaim(&job.cgroup, reclaim_request(usage, job.target).min(step)) {
            Ok(()) | Err(CgroupError::Again { .. }) => return Ok(()),
            Err(CgroupError::Unsupported { .. }) => *use_high = true,
            Err(e) => return Err(e),
        }
    }
    // Halfway down each pass (the last 32 MiB at once): the kernel throttles allocations above
    // `memory.high` and reclaims, so one big step would stall the workload.
    let gap = usage - job.target;
    let down = if gap <= 32 << 20 { gap } else { gap / 2 };
    if cancel.is_cancelled() {
        return Ok(());
    }
    high.lower(io, &job.cgroup, usage - down.min(step), cancel)
}

mod high;
mod in_kernel;
mod paced;
#[cfg(test)]
mod tests;
