//! Page cache reclaimed from a pod cgroup inside `UpdatePodSandbox` (cgroup v2), before a pod
//! memory limit below the pod's usage is admitted. kubelet 1.36 writes the pod cgroup right
//! after the call returns; on cgroup v2 a `memory.max` below usage makes the kernel reclaim
//! inside that write and OOM-kill in the pod when it cannot get under it. So where what must go
//! is page cache (admission has checked that anonymous and shared memory fit, and that trimming
//! found no working set above the limit), the handler asks `memory.reclaim` for the difference
//! in small passes within [`RECLAIM_BUDGET`] and the runtime's deadline, on a blocking thread;
//! the limit is admitted only if usage then fits. What was reclaimed stays reclaimed: when
//! kubelet asks again, less is left.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use crate::cgroup::{pod_path, CgroupError, CgroupIo as _, Cgroups};
use crate::nri::Deadline;
use crate::policy::{bytes_text, reclaim_request, MemoryUse};

/// How long the handler may spend reclaiming a pod cgroup (on top of its read budget), at most:
/// never past the runtime's deadline, whatever is left of it.
pub const RECLAIM_BUDGET: Duration = Duration::from_millis(500);

/// The most one `memory.reclaim` pass asks for: a pass is one write the kernel returns from
/// only when done, so it is kept short enough for the budget to be checked between passes.
const CHUNK: u64 = 16 << 20;

/// What [`reclaim_pod`] left.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reclaimed {
    /// The pod's memory after: as the last finished pass read it (`start` when none finished
    /// in time or the reclaim failed: the caller then judges the request as if nothing went).
    pub used: MemoryUse,
    /// The kernel has no `memory.reclaim` (before 5.19): nothing can be reclaimed inside the
    /// call, and the refusal says so.
    pub unsupported: bool,
}

/// Reclaims page cache from the pod cgroup under `cgroup_parent` until its usage is at most
/// `limit` or [`RECLAIM_BUDGET`], or what `deadline` leaves if less, is spent.
pub(super) async fn reclaim_pod(
    cgroups: Cgroups,
    cgroup_parent: String,
    limit: u64,
    start: MemoryUse,
    deadline: &Deadline,
) -> Reclaimed {
    let budget = RECLAIM_BUDGET.min(deadline.remaining());
    let unchanged = |unsupported| Reclaimed {
        used: start,
        unsupported,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    // The usage the last finished pass read: what a pass still running at the budget leaves to
    // report (the passes before it did reclaim).
    let last = Arc::new(Mutex::new(start));
    let measured = Arc::clone(&last);
    let parent = cgroup_parent.clone();
    let work = tokio::task::spawn_blocking(move || {
        let path = pod_path(&parent)?;
        let started = Instant::now();
        let mut used = start;
        while used.usage > limit && started.elapsed() < budget && !stopped.load(Ordering::Relaxed) {
            let ask = reclaim_request(used.usage, limit).min(CHUNK);
            match cgroups.reclaim(&path, ask) {
                // EAGAIN: the kernel got less than asked; what it got shows in the usage.
                Ok(()) | Err(CgroupError::Again { .. }) => {}
                Err(e) => return Err(e),
            }
            let now = cgroups.memory_use(&path)?;
            *measured.lock().unwrap_or_else(PoisonError::into_inner) = now;
            let progressed = now.usage < used.usage;
            used = now;
            if !progressed {
                break;
            }
        }
        Ok::<_, CgroupError>(used)
    });
    // The thread checks the budget between passes; one pass past it is given a little more,
    // but not past the runtime's deadline.
    let until =
        (tokio::time::Instant::now() + budget + Duration::from_millis(100)).min(deadline.at());
    let outcome = tokio::time::timeout_at(until, work).await;
    let used = match outcome {
        Ok(Ok(Ok(used))) => used,
        Ok(Ok(Err(e @ CgroupError::Unsupported { .. }))) => {
            warn!(%cgroup_parent, error = %e, "pod page cache cannot be reclaimed here: the kernel has no memory.reclaim (5.19+)");
            return unchanged(true);
        }
        Ok(Ok(Err(e))) => {
            warn!(%cgroup_parent, error = %e, "pod page cache reclaim failed");
            return unchanged(false);
        }
        Ok(Err(e)) => {
            warn!(%cgroup_parent, error = %e, "pod page cache reclaim thread failed");
            return unchanged(false);
        }
        Err(_) => {
            stop.store(true, Ordering::Relaxed);
            let used = *last.lock().unwrap_or_else(PoisonError::into_inner);
            warn!(
                %cgroup_parent,
                reclaimed = %bytes_text(start.usage.saturating_sub(used.usage)),
                "pod page cache reclaim ran past its budget; stopped after its last finished pass"
            );
            used
        }
    };
    info!(
        %cgroup_parent,
        limit = %bytes_text(limit),
        reclaimed = %bytes_text(start.usage.saturating_sub(used.usage)),
        usage = %bytes_text(used.usage),
        "pod page cache reclaimed inside UpdatePodSandbox"
    );
    Reclaimed {
        used,
        unsupported: false,
    }
}
