//! Safe memory decrease inside the engine: when an update lowers a container's memory limit
//! below its usage, the strategy (`reclaim`, `restart`, `reject`; see
//! [`crate::policy::MemoryDecreaseStrategy`]) decides.
//!
//! On kubelet's path ([`decide`]) the runtime is never answered with a limit other than the one
//! asked: kubelet records an accepted update as actuated, never sends it again, and lowers the
//! pod cgroup right after it. With `reclaim`, page cache in the way is reclaimed inside the
//! update where the deadline allows; otherwise the update is refused with the figures and the
//! page cache keeps being reclaimed in the background toward the limit ([`toward`]), so that
//! kubelet's own retry goes through. The pod step that follows is judged with it
//! ([`pod_step`]).
//!
//! A whole-pod step ([`whole_pod`], nri-resize's own API) may still stage a decrease: accepted
//! with a safe interim limit, reclaimed on a blocking thread ([`super::reclaim`], driven by
//! [`drive`], task in [`staged`]) and the requested limit applied through NRI
//! `UpdateContainers` once usage fits. Each is checkpointed in the state directory and resumed
//! after a plugin restart ([`resume`]).
//!
//! One reclaim per container (its [`crate::resize::reclaims::ReclaimHandle`]): a newer update for the container cancels
//! it at once.

mod decide;
mod drive;
#[cfg(test)]
mod kubelet_path_tests;
mod pacing;
mod pod_step;
mod resume;
mod staged;
mod toward;
mod whole_pod;

pub(super) use self::decide::DecreaseVerdict;
use super::Engine;
use crate::metrics::DecreaseOutcome;
use crate::model::{limited_bytes, LinuxResources, MemoryResources};

fn memory_limit(r: &LinuxResources) -> Option<u64> {
    r.memory
        .as_ref()
        .and_then(|m| m.limit)
        .and_then(limited_bytes)
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
pub(in crate::resize) fn is_memory_decrease(r: &super::ContainerResize) -> bool {
    let (Some(d), Some(a)) = (&r.desired, &r.allocated) else {
        return false;
    };
    match (memory_limit(d), memory_limit(a)) {
        (Some(d), Some(a)) => d < a,
        (Some(_), None) => true,
        _ => false,
    }
}

/// How a staged decrease that ran out of time is counted: anonymous memory that cannot go
/// (above the target, no swap) or plain timeout. One rule for kubelet's and whole-pod decreases.
fn deferred_outcome(end: &crate::policy::MemoryUse, target: u64, swap: bool) -> DecreaseOutcome {
    if end.unreclaimable() > target && !swap {
        DecreaseOutcome::DeferredAnonymous
    } else {
        DecreaseOutcome::DeferredTimeout
    }
}

/// Whether the node has swap (anonymous memory is then reclaimable), from `/proc/meminfo`,
/// read on a blocking thread.
async fn node_has_swap() -> bool {
    super::off_worker::off_worker(crate::trim::node_has_swap).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ResizeState;
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
    }
}
