//! Pod-level resources (KEP-5419) resized in place. kubelet 1.36 calls CRI
//! `UpdatePodSandboxResources` **before** it writes the pod cgroup (an error blocks the resize;
//! `Unimplemented` is tolerated), writes the pod cgroup, and calls again with the previous
//! resources if that write fails (the revert); kubelet 1.35's alpha wrote first and called
//! after. Both check the pod's usage before lowering its memory limit and do not call at all
//! while usage is at or above it. containerd ≥ 2.3 relays the call as NRI `UpdatePodSandbox`
//! (a plugin error fails the CRI call) and, once its sandbox store holds the new values,
//! `PostUpdatePodSandbox`; CRI-O relays `UpdatePodSandbox` only.
//!
//! On `UpdatePodSandbox` the handler reads the pod cgroup and the node (off the async workers,
//! bounded by [`READ_BUDGET`] and the runtime's deadline); on cgroup v2, where a lower memory
//! limit is below usage and only page cache stands in the way, it reclaims that cache first
//! ([`reclaim_pod`], bounded by its own budget and the same deadline, trimming of the pod's
//! containers paused meanwhile); it admits the request ([`admit_pod_level`]: anonymous and
//! shared memory, trimming's working sets, usage) and records desired, actual and the verdict;
//! in `enforce` mode (or when the pod's annotation tightens to it) a refused request is answered
//! with a [`Rejection`], so that under kubelet 1.36 the pod cgroup is never written. A call
//! that overruns the runtime's deadline is answered fail-open by the transport, except a memory
//! decrease, which is recorded and refused
//! ([`PodLevel::refuse_undecided_decrease`]). A revert is one more `UpdatePodSandbox`:
//! it replaces the record and the model's resources, nothing is counted twice. The pod cgroup is read back after the answer
//! (kubelet 1.36 writes it after the call) and on `PostUpdatePodSandbox`, and compared with what
//! was asked, as containers are confirmed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::{error, info, warn};

mod confirm;
pub mod read;
mod reclaim;

use self::confirm::{confirm_pod, follow_reads, POD_READ_BACK_AFTER};
use self::read::{read_pod, PodReadError};
use self::reclaim::reclaim_pod;
use super::node::NodeReader;
use super::read_back::ReadBacks;
use super::reclaims::Reclaims;
use crate::cgroup::{CgroupIo as _, CgroupVersion};
use crate::clock::now_ms;
use crate::config::Mode;
use crate::model::{ContainerState, LinuxResources, Pod, PodLimits};
use crate::nri::{Deadline, Rejection};
use crate::policy::{
    admit_pod_level, admit_unchecked_memory, effective_enforce, with_overhead, Admission, Limit,
    Limits, MemoryUse, PodMemory, ResizeState,
};
use crate::state::{limits_text, NodeState, PodLevelStatus};
use crate::sync::ReadWriteLocked as _;

/// Pod-level admission and confirmation (see the module docs): the handlers of `UpdatePodSandbox`
/// and `PostUpdatePodSandbox` call it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PodLevel {
    state: Arc<NodeState>,
    /// Node capacity for admission; `None`: no node checks.
    node: Option<NodeReader>,
    /// The owner of reclaim on containers: the pod's reclaim pass holds trimming off its
    /// containers through it, and asks it what trimming found. `None`: no trimming consulted.
    reclaims: Option<Arc<Reclaims>>,
    /// The read-backs that follow an answer (shared with the container handlers).
    read_backs: Arc<ReadBacks>,
    /// When the pod cgroup is read back after an accepted update (`None`:
    /// [`POD_READ_BACK_AFTER`]).
    read_back_after: Option<&'static [Duration]>,
}

impl PodLevel {
    pub(crate) fn new(state: Arc<NodeState>, read_backs: Arc<ReadBacks>) -> Self {
        PodLevel {
            state,
            node: None,
            reclaims: None,
            read_backs,
            read_back_after: None,
        }
    }

    /// With node capacity read for admission (`/` on a node).
    #[must_use]
    pub fn with_node(mut self, node: NodeReader) -> Self {
        self.node = Some(node);
        self
    }

    /// With the engine's owner of reclaim (trimming paused and consulted through it).
    #[must_use]
    pub(crate) fn with_reclaims(mut self, reclaims: Arc<Reclaims>) -> Self {
        self.reclaims = Some(reclaims);
        self
    }

    /// With the pod cgroup read back at `after` following an accepted update (tests: none, to
    /// see the record before any read-back, or a short schedule).
    #[must_use]
    pub fn with_read_back_after(mut self, after: &'static [Duration]) -> Self {
        self.read_back_after = Some(after);
        self
    }

    fn state(&self) -> &NodeState {
        &self.state
    }

    /// Admits an `UpdatePodSandbox` and records it; `Err` when it is refused and enforced.
    pub async fn admit_update(
        &self,
        pod: &Pod,
        overhead: Option<&LinuxResources>,
        resources: &LinuxResources,
        deadline: &Deadline,
    ) -> Result<(), Rejection> {
        let state = self.state();
        let cfg = state.config.read_locked().clone();
        let snapshot = state.capacity.read_locked().clone();
        let read = read_pod(
            state.cgroups.clone(),
            self.node.clone(),
            snapshot,
            pod.cgroup_parent.clone(),
            state.node_reserve(),
            deadline,
        )
        .await;
        let overhead = overhead.or(pod.overhead.as_ref());
        let ask = PodAsk::new(resources, overhead);
        let (cgroup, desired) = (ask.cgroup, ask.desired);
        let containers: BTreeMap<String, Limits> = state.read_model(|m| {
            m.containers()
                .filter(|c| c.pod_id == pod.id && c.state != ContainerState::Stopped)
                .map(|c| {
                    let l = c.resources.as_ref().map(Limits::from_linux);
                    (c.name.clone(), l.unwrap_or_default())
                })
                .collect()
        });
        let known = known_pod_limits(state, &pod.id);
        let previous = known.map(|k| k.memory);
        let unread = unread_usage(&read.actual);
        let (enforce, annotation) =
            effective_enforce(cfg.resize.mode == Mode::Enforce, &pod.annotations);
        if let Some(e) = annotation {
            warn!(pod = %pod.full_name(), error = %e, "pod annotation ignored");
            state.metrics.annotation_error();
        }
        let memory = match judged_use(&read.actual, read.memory) {
            Some(used) => Some(
                self.pod_memory(pod, used, cgroup.memory, enforce, deadline)
                    .await,
            ),
            None => None,
        };
        let (actual, usage, error) = match read.actual {
            Ok((a, u)) => (Some(a), memory.map(|m| m.used.usage).or(u), None),
            Err(e) => (None, None, Some(e.to_string())),
        };
        let verdict = match admit_pod_level(
            &read.node.unwrap_or_default(),
            known.as_ref(),
            &ask.asked,
            &ask.extra,
            &containers,
            memory.as_ref(),
        ) {
            Admission::Fits => unread
                .and_then(|why| admit_unchecked_memory(cgroup.memory, previous, &why))
                .unwrap_or(Admission::Fits),
            other => other,
        };
        let status = verdict.resize_status();
        let record = PodLevelStatus {
            desired,
            overhead: overhead.map(PodLimits::from_linux),
            actual,
            memory_usage: usage,
            matches: None,
            state: Some(status.state),
            reason: status.reason.clone(),
            error,
            updated_ms: now_ms(),
        };
        state
            .metrics
            .pod
            .set_desired(&pod.namespace, &pod.name, desired);
        if let Some(a) = actual {
            state.metrics.pod.set_actual(&pod.namespace, &pod.name, a);
        }
        state.pod_level(|m| m.insert(pod.id.clone(), record));
        if verdict == Admission::Fits {
            info!(pod = %pod.full_name(), desired = %limits_text(&desired), "pod-level resize admitted");
            return Ok(());
        }
        info!(pod = %pod.full_name(), state = ?status.state, reason = %status.reason, enforce, "pod-level resize not admitted");
        if enforce {
            return Err(Rejection(format!(
                "pod-level resize of {} is {:?}: {}",
                pod.full_name(),
                status.state,
                status.reason
            )));
        }
        Ok(())
    }

    /// `UpdatePodSandbox` of `pod` asking for `resources` (with `overhead` apart) was not
    /// decided within the runtime's deadline. When it lowers the pod's memory limit below what
    /// nri-resize knows of it (or sets one where the pod had none, or nothing is known: it
    /// cannot be checked) it is recorded Deferred with the reason and, when enforcing, refused
    /// and counted; anything else is let through (`None`), as the transport answers fail-open.
    pub fn refuse_undecided_decrease(
        &self,
        pod: &Pod,
        overhead: Option<&LinuxResources>,
        resources: &LinuxResources,
    ) -> Option<Rejection> {
        let state = self.state();
        let overhead = overhead.or(pod.overhead.as_ref());
        let PodAsk {
            cgroup, desired, ..
        } = PodAsk::new(resources, overhead);
        let previous = known_pod_limits(state, &pod.id).map(|k| k.memory);
        let Some(Admission::Deferred { reason }) =
            admit_unchecked_memory(cgroup.memory, previous, UNDECIDED_POD_DECREASE)
        else {
            return None;
        };
        let node_enforces = state.config.read_locked().resize.mode == Mode::Enforce;
        let (enforce, _) = effective_enforce(node_enforces, &pod.annotations);
        state.pod_level(|m| {
            // What the last read found stays; desired and the verdict are this request's.
            let r = m.entry(pod.id.clone()).or_default();
            r.desired = desired;
            r.overhead = overhead.map(PodLimits::from_linux);
            r.matches = None;
            r.state = Some(ResizeState::Deferred);
            r.reason.clone_from(&reason);
            r.updated_ms = now_ms();
        });
        state
            .metrics
            .pod
            .set_desired(&pod.namespace, &pod.name, desired);
        if !enforce {
            warn!(pod = %pod.full_name(), %reason, "pod memory decrease not decided within the runtime's deadline; observing, let through");
            return None;
        }
        error!(pod = %pod.full_name(), %reason, "pod memory decrease not decided within the runtime's deadline: refused");
        state.metrics.resize_outcome("deferred");
        Some(Rejection(format!(
            "pod-level resize of {} refused: {reason}; kubelet asks again",
            pod.full_name()
        )))
    }

    /// The pod's memory as admission judges it: `used` as read, what trimming found for its
    /// containers, and — on cgroup v2, enforcing, when only page cache stands between usage and
    /// a lower `limit` — after that cache was reclaimed inside the call ([`reclaim_pod`]).
    async fn pod_memory(
        &self,
        pod: &Pod,
        used: MemoryUse,
        limit: Limit,
        enforce: bool,
        deadline: &Deadline,
    ) -> PodMemory {
        let cgroups = self.state().cgroups.clone();
        let reclaims = self.reclaims.as_deref();
        let ids = if reclaims.is_some() {
            self.pod_container_ids(&pod.id)
        } else {
            Vec::new()
        };
        let mut m = PodMemory {
            used,
            // The sum of the working sets trimming found for the pod's containers.
            trimmed_working_set: reclaims.filter(|r| r.trims()).and_then(|r| {
                ids.iter()
                    .filter_map(|id| r.trim_state(id)?.working_set_bytes)
                    .reduce(u64::saturating_add)
            }),
            reclaimed: 0,
            reclaim_unsupported: false,
            write_refuses: cgroups
                .as_ref()
                .is_some_and(|c| c.version() == CgroupVersion::V1),
        };
        if let (Limit::Limited(limit), Some(cg), true) = (limit, cgroups, enforce) {
            if m.needs_reclaim(limit) {
                // An inline pass: trimming off the pod's containers and the reclaim counter
                // attached meanwhile.
                let _pass = reclaims.map(|r| r.inline_pod_pass(&ids));
                let after =
                    reclaim_pod(cg, pod.cgroup_parent.clone(), limit, m.used, deadline).await;
                m.reclaimed = m.used.usage.saturating_sub(after.used.usage);
                m.used = after.used;
                m.reclaim_unsupported = after.unsupported;
            }
        }
        m
    }

    /// The ids of `pod_id`'s containers that are not stopped.
    fn pod_container_ids(&self, pod_id: &str) -> Vec<String> {
        self.state().read_model(|m| {
            m.containers()
                .filter(|c| c.pod_id == pod_id && c.state != ContainerState::Stopped)
                .map(|c| c.id.clone())
                .collect()
        })
    }

    /// After `PostUpdatePodSandbox`: reads the pod cgroup back and compares it with desired.
    /// Drift is not reported from this read: containerd sends the event inside the CRI call,
    /// before kubelet 1.36 writes the pod cgroup; the reads that follow the answer
    /// ([`Self::follow_update`]) report it after the last.
    pub async fn confirm(&self, pod: &Pod) {
        confirm_pod(self.state(), pod, false).await;
    }

    /// After answering an accepted `UpdatePodSandbox`: reads `pod`'s cgroup back at
    /// [`POD_READ_BACK_AFTER`] (an owned read-back; a newer update of the pod replaces it).
    pub fn follow_update(&self, pod: Pod) {
        let after = self.read_back_after.unwrap_or(&POD_READ_BACK_AFTER);
        if after.is_empty() {
            return;
        }
        let id = format!("pod:{}", pod.id);
        self.read_backs
            .start_async(&id, follow_reads(Arc::clone(&self.state), pod, after));
    }
}

/// What an `UpdatePodSandbox` asks of the pod cgroup.
struct PodAsk {
    /// The pod-level limits.
    asked: Limits,
    /// The pod overhead's.
    extra: Limits,
    /// Their sum, which kubelet writes to the pod cgroup.
    cgroup: Limits,
    /// `cgroup` as the pod-level record shows it.
    desired: PodLimits,
}

impl PodAsk {
    fn new(resources: &LinuxResources, overhead: Option<&LinuxResources>) -> Self {
        let asked = Limits::from_linux(resources);
        let extra = overhead.map(Limits::from_linux).unwrap_or_default();
        let cgroup = with_overhead(&asked, &extra);
        let desired = PodLimits {
            cpu_millis: cgroup.cpu.value(),
            memory_bytes: cgroup.memory.value(),
        };
        PodAsk {
            asked,
            extra,
            cgroup,
            desired,
        }
    }
}

/// The pod's memory as admission judges it, from what the read found. Without the breakdown
/// (`memory.stat` unread) the usage alone is judged, all of it as memory that cannot be
/// reclaimed: never less careful than before the breakdown.
fn judged_use(
    actual: &Result<(PodLimits, Option<u64>), PodReadError>,
    breakdown: Option<MemoryUse>,
) -> Option<MemoryUse> {
    match (actual, breakdown) {
        (Ok(_), Some(used)) => Some(used),
        (Ok((_, Some(usage))), None) => Some(MemoryUse {
            usage: *usage,
            ..MemoryUse::default()
        }),
        _ => None,
    }
}

/// The pod cgroup's limits as far as the model knows (the last accepted update, or the
/// sandbox's resources, overhead included); `None`: unknown. A memory limit below its memory is
/// a decrease.
fn known_pod_limits(state: &NodeState, pod_id: &str) -> Option<Limits> {
    state.read_model(|m| {
        m.pod(pod_id).and_then(|p| {
            let limits = Limits::from_linux(p.resources.as_ref()?);
            let extra = p
                .overhead
                .as_ref()
                .map(Limits::from_linux)
                .unwrap_or_default();
            Some(with_overhead(&limits, &extra))
        })
    })
}

/// Why an `UpdatePodSandbox` memory limit went unchecked when the call overran the runtime's
/// deadline (the policy's reason names the limit around it).
const UNDECIDED_POD_DECREASE: &str = "the check did not finish within the runtime's deadline; \
     a limit below usage is an OOM kill on cgroup v2";

/// Why the pod's memory usage is unknown after `read`: the read failed or ran out of its
/// budget, or the cgroup has no usage; `None` when it is known, or when cgroup access is turned
/// off (the operator's choice: nothing is checked then).
fn unread_usage(read: &Result<(PodLimits, Option<u64>), PodReadError>) -> Option<String> {
    match read {
        Ok((_, None)) => Some("its memory usage is unreadable".to_string()),
        Err(PodReadError::NoCgroupAccess) | Ok(_) => None,
        Err(e) => Some(e.to_string()),
    }
}
