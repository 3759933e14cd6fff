//! A container's decrease judged together with the pod step kubelet takes right after it.
//!
//! kubelet's `doPodResizeAction` → `resizeContainers` (`pkg/kubelet/kuberuntime/
//! kuberuntime_manager.go`, 1.33 to master) writes a pod memory limit that goes **down after**
//! the containers (`setPodCgroupConfig` after `updatePodContainerResources`), and a pod has a
//! memory limit only when every container has one: the sum of their limits plus the pod
//! overhead (`ResourceConfigForPod`). So once the runtime accepts a container's decrease from
//! `old` to `target`, the pod cgroup goes from `L` to `L - (old - target)` a moment later. On
//! cgroup v2 that write reclaims inside the pod and OOM-kills where what is not page cache does
//! not fit (on v1 it fails with `EBUSY` and kubelet retries the pod step). The container's update
//! is refused when the pod's memory that is not page cache would not fit under the new pod
//! limit; page cache in the way of it is reclaimed inside the update where the time allows (the
//! kernel would take it inside kubelet's write anyway; reclaiming it here lets kubelet's own usage
//! check of the pod pass sooner).

use std::time::Instant;

use tracing::{info, warn};

use super::{memory_limit, Engine};
use crate::cgroup::{container_path, pod_path, CgroupError, CgroupIo as _, CgroupVersion};
use crate::model::{limited_bytes, Container, LinuxResources, Pod};
use crate::nri::Deadline;
use crate::policy::{bytes_text, not_page_cache, pod_step_reason, reclaim_request};

/// The most one pass of the pod's page-cache reclaim asks for.
const POD_CHUNK: u64 = 64 << 20;

/// The pod limit kubelet writes after a container of the pod goes from `old` to `target`: the
/// pod's `pod_limit` lowered by the same amount.
pub(super) fn pod_limit_after(pod_limit: u64, old: u64, target: u64) -> u64 {
    pod_limit.saturating_sub(old.saturating_sub(target))
}

impl Engine {
    /// Why the container's decrease from `allocated` to `desired` (its usage already judged to
    /// fit) must be refused for the pod step that follows it (`None`: no memory decrease, the
    /// pod has no memory limit, or what is not page cache fits under the lowered one). A pod cgroup that cannot be read is a refusal: unchecked, the pod
    /// write may OOM-kill on cgroup v2. A pod without a cgroup of its own (no `cgroup_parent`,
    /// or the directory is gone) has no pod step.
    pub(in crate::resize) fn pod_step_refusal(
        &self,
        pod: &Pod,
        ctr: &Container,
        allocated: &LinuxResources,
        desired: &LinuxResources,
        deadline: &Deadline,
    ) -> Option<String> {
        let (old, target) = (memory_limit(allocated)?, memory_limit(desired)?);
        if target >= old {
            return None;
        }
        let refusal = self.judge_pod_step(pod, old, target, deadline)?;
        // cgroup v1: the inline reclaim may have written the target into the container's cgroup
        // already; refused, the container keeps the limit its spec says.
        if let (Some(cg), Ok(path)) = (self.cgroups.as_ref(), container_path(&ctr.cgroups_path)) {
            if cg.version() == CgroupVersion::V1 {
                if let Err(e) = cg.set_memory_limit(&path, Some(old)) {
                    warn!(container = %ctr.name, error = %e, "could not put the container's memory limit back");
                }
            }
        }
        Some(refusal)
    }

    /// [`Self::pod_step_refusal`]'s judgement of the pod cgroup, from `old` to `target`.
    fn judge_pod_step(
        &self,
        pod: &Pod,
        old: u64,
        target: u64,
        deadline: &Deadline,
    ) -> Option<String> {
        let cg = self.cgroups.as_ref()?;
        let path = pod_path(&pod.cgroup_parent).ok()?;
        let unreadable = |e: &CgroupError| {
            warn!(pod = %pod.full_name(), error = %e, "pod cgroup unreadable: the container's memory decrease is refused until the pod step can be checked");
            format!("the pod cgroup is unreadable ({e}): the pod limit kubelet lowers right after this update cannot be checked against the pod's usage")
        };
        let pod_limit = match cg.read_limits(&path) {
            Ok(l) => l.memory_limit.and_then(limited_bytes)?,
            Err(CgroupError::Missing { .. }) => return None,
            Err(e) => return Some(unreadable(&e)),
        };
        let new_pod = pod_limit_after(pod_limit, old, target);
        let used = match cg.memory_use(&path) {
            Ok(u) => u,
            Err(CgroupError::Missing { .. }) => return None,
            Err(e) => return Some(unreadable(&e)),
        };
        let pinned = not_page_cache(&used);
        if pinned >= new_pod {
            return Some(pod_step_reason(pinned, pod_limit, new_pod));
        }
        if used.usage > new_pod && cg.version() == CgroupVersion::V2 {
            // Within a quarter of what is left: the container's own checks come first.
            let until = Instant::now() + deadline.remaining() / 4;
            let mut usage = used.usage;
            while usage > new_pod && Instant::now() < until && !deadline.expired() {
                let ask = reclaim_request(usage, new_pod).min(POD_CHUNK);
                let step = cg.reclaim(&path, ask);
                match (step, cg.memory_use(&path)) {
                    (Ok(()) | Err(CgroupError::Again { .. }), Ok(u)) if u.usage < usage => {
                        usage = u.usage;
                    }
                    _ => break,
                }
            }
            info!(pod = %pod.full_name(), new_pod_limit = %bytes_text(new_pod), usage = %bytes_text(usage), "page cache of the pod reclaimed ahead of kubelet's pod step");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_step_lowers_the_pod_by_the_containers_decrease() {
        const MI: u64 = 1 << 20;
        // Two containers at 256Mi each plus 0 overhead: one goes to 100Mi.
        assert_eq!(pod_limit_after(512 * MI, 256 * MI, 100 * MI), 356 * MI);
        // Never below zero, and an increase leaves the pod as it is.
        assert_eq!(pod_limit_after(100 * MI, 512 * MI, 0), 0);
        assert_eq!(pod_limit_after(512 * MI, 100 * MI, 256 * MI), 512 * MI);
    }
}
