//! Admission of a pod-level resize (KEP-5419 pod-level resources, resized in place: kubelet
//! 1.36 calls CRI `UpdatePodSandboxResources` — containerd ≥ 2.3 relays it as NRI
//! `UpdatePodSandbox` — and then writes the pod cgroup, so a refusal here keeps the write from
//! happening).
//!
//! kubelet sends the pod-level limits and the pod overhead apart and writes their sum to the pod
//! cgroup (`generateUpdatePodSandboxResourcesRequest` subtracts the overhead it added). So the
//! node and the pod's usage are judged against the pod cgroup's limit (limits plus overhead),
//! the containers against the pod-level limits.
//!
//! Infeasible, in this order: the pod cgroup's CPU limit raised above the node's allocatable
//! CPU; its memory limit raised above allocatable memory (a limit the pod already holds is not
//! judged again: kubelet 1.36's calls carry the resources they do not change as they are); a container limit of the pod above the pod limit (the
//! container could never get what it holds). Deferred ([`PodMemory`]): a pod cgroup memory
//! limit below the pod's anonymous and shared memory (only swap frees it: the kernel
//! would refuse the write on cgroup v1 and OOM-kill inside it on v2); one below the working set
//! trimming found for the pod's containers; on cgroup v2, one still below usage after the
//! handler reclaimed page cache inline (the write would have to reclaim the rest, and OOM-kills
//! where it cannot); and a memory limit below the last known one when the pod's usage could not
//! be read in time ([`admit_unchecked_memory`]: never let through unchecked). Pure: no I/O.
//!
//! Pod owners may make a pod stricter with `resize-mode.nri-resize.io/pod: Enforce` (refuse
//! such resizes even when the node only observes); `Observe` on an enforcing node is looser and
//! ignored ([`effective_enforce`]).

use std::collections::BTreeMap;

use super::admission::{Admission, NodeCapacity};
use super::deprecated::mode_alias;
use super::limits::Limits;
use super::memory_decrease::MemoryUse;
use super::quantity::Limit;

/// The pod annotation that may turn `observe` into `enforce` for one pod (never the reverse).
pub const POD_MODE_ANNOTATION: &str = "resize-mode.nri-resize.io/pod";

/// Why a [`POD_MODE_ANNOTATION`] was ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodModeError {
    /// Neither `Enforce` nor `Observe`.
    #[error("{POD_MODE_ANNOTATION}: unknown value {value:?} (Enforce or Observe)")]
    Unknown {
        /// The value (truncated to 64 characters).
        value: String,
    },
    /// `observe` on a node that enforces: annotations only tighten.
    #[error("{POD_MODE_ANNOTATION}: Observe is looser than the node's Enforce; ignored")]
    Looser,
}

/// Whether a pod-level verdict is enforced for this pod: the node's mode, tightened (never
/// loosened) by [`POD_MODE_ANNOTATION`].
pub fn effective_enforce(
    node_enforces: bool,
    annotations: &BTreeMap<String, String>,
) -> (bool, Option<PodModeError>) {
    // The lowercase spelling of before 2026-11-25 reads as the current one (`deprecated.rs`).
    let value = annotations
        .get(POD_MODE_ANNOTATION)
        .map(|v| mode_alias(v).unwrap_or(v.trim()));
    match value {
        None => (node_enforces, None),
        Some("Enforce") => (true, None),
        Some("Observe") if node_enforces => (true, Some(PodModeError::Looser)),
        Some("Observe") => (false, None),
        Some(other) => (
            node_enforces,
            Some(PodModeError::Unknown {
                value: other.chars().take(64).collect(),
            }),
        ),
    }
}

/// CPU as people read it: `500m`.
pub fn cpu_quantity(millis: u64) -> String {
    format!("{millis}m")
}

/// Memory as people read it: `128Mi`, `2Gi`, `512Ki` (rounded to the nearest Mi from 1 Mi up).
pub fn memory_quantity(bytes: u64) -> String {
    const KI: u64 = 1 << 10;
    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;
    if bytes >= GI && bytes % GI == 0 {
        format!("{}Gi", bytes / GI)
    } else if bytes >= MI {
        format!("{}Mi", (bytes + MI / 2) / MI)
    } else if bytes >= KI && bytes % KI == 0 {
        format!("{}Ki", bytes / KI)
    } else {
        bytes.to_string()
    }
}

/// The pod cgroup's limit for pod-level `limits` and `overhead`: their sum; unlimited stays
/// unlimited, an overhead without a limit adds nothing.
pub fn with_overhead(limits: &Limits, overhead: &Limits) -> Limits {
    let add = |l: Limit, o: Limit| match (l, o) {
        (Limit::Limited(a), Limit::Limited(b)) => Limit::Limited(a.saturating_add(b)),
        (l, _) => l,
    };
    Limits::new(
        add(limits.cpu, overhead.cpu),
        add(limits.memory, overhead.memory),
    )
}

/// Whether a limit of `new` raises the pod cgroup's `previous` one (`None`: unknown, judged as
/// a raise); setting a limit where there was none lowers it.
fn raises(new: u64, previous: Option<Limit>) -> bool {
    match previous {
        None => true,
        Some(Limit::Limited(p)) => new > p,
        Some(Limit::Unlimited) => false,
    }
}

/// Admits a pod-level resize to `desired` pod limits with `overhead` (unlimited when the pod has
/// none), given the pod cgroup's limits before it (`previous`, overhead included; `None`:
/// unknown), the limits of the pod's running containers by name and the pod cgroup's memory
/// (`None`: unknown). See the module docs for the order of checks. A limit above the node's
/// allocatable is refused only where the request raises it: kubelet 1.36 sends one call per pod
/// cgroup write (memory, then CPU), each carrying the other resources as the pod has them, and
/// a pod that already holds such a limit (set before the node's allocatable shrank) must still
/// be resizable in the other resource, or lowered.
pub fn admit_pod_level(
    node: &NodeCapacity,
    previous: Option<&Limits>,
    desired: &Limits,
    overhead: &Limits,
    containers: &BTreeMap<String, Limits>,
    memory: Option<&PodMemory>,
) -> Admission {
    let cgroup = with_overhead(desired, overhead);
    let allocatable_cpu = node.allocatable_cpu_millis();
    if let Limit::Limited(cpu) = cgroup.cpu {
        if allocatable_cpu > 0 && cpu > allocatable_cpu && raises(cpu, previous.map(|p| p.cpu)) {
            return Admission::Infeasible {
                reason: format!(
                    "pod CPU limit {} exceeds the node's {} allocatable CPU",
                    cpu_quantity(cpu),
                    cpu_quantity(allocatable_cpu)
                ),
            };
        }
    }
    let allocatable_memory = node.allocatable_memory_bytes();
    if let Limit::Limited(mem) = cgroup.memory {
        if allocatable_memory > 0
            && mem > allocatable_memory
            && raises(mem, previous.map(|p| p.memory))
        {
            return Admission::Infeasible {
                reason: format!(
                    "pod memory limit {} exceeds the node's {} allocatable memory",
                    memory_quantity(mem),
                    memory_quantity(allocatable_memory)
                ),
            };
        }
    }
    for (name, c) in containers {
        if let (Limit::Limited(ctr), Limit::Limited(pod)) = (c.cpu, desired.cpu) {
            if ctr > pod {
                return Admission::Infeasible {
                    reason: format!(
                        "container {name} CPU limit {} exceeds the requested pod limit {}",
                        cpu_quantity(ctr),
                        cpu_quantity(pod)
                    ),
                };
            }
        }
        if let (Limit::Limited(ctr), Limit::Limited(pod)) = (c.memory, desired.memory) {
            if ctr > pod {
                return Admission::Infeasible {
                    reason: format!(
                        "container {name} memory limit {} exceeds the requested pod limit {}",
                        memory_quantity(ctr),
                        memory_quantity(pod)
                    ),
                };
            }
        }
    }
    if let (Limit::Limited(limit), Some(m)) = (cgroup.memory, memory) {
        if let Some(reason) = memory_floor(limit, m) {
            return Admission::Deferred { reason };
        }
    }
    Admission::Fits
}

/// The pod cgroup's memory when a pod-level resize is admitted, and what bounds how low its
/// limit may go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodMemory {
    /// The pod cgroup's usage and its breakdown (`memory.stat`), after any inline reclaim.
    pub used: MemoryUse,
    /// The sum of the working sets trimming found for the pod's containers (those it found
    /// one for); `None`: it found none.
    pub trimmed_working_set: Option<u64>,
    /// Page cache reclaimed from the pod cgroup for this request before it was judged.
    pub reclaimed: u64,
    /// The kernel has no `memory.reclaim` (before 5.19): page cache could not be reclaimed
    /// inside the call.
    pub reclaim_unsupported: bool,
    /// The pod cgroup's limit write itself refuses rather than OOM-kills when page cache
    /// cannot be reclaimed in time (cgroup v1: the kernel reclaims inside the write and fails
    /// it with `EBUSY`); on cgroup v2 the write OOM-kills, so usage must already fit.
    pub write_refuses: bool,
}

impl PodMemory {
    /// Whether reclaiming page cache first could admit a limit of `limit` bytes: usage is above
    /// it on cgroup v2, and only page cache stands in the way (anonymous and shared memory fit,
    /// and trimming found no working set above it).
    #[must_use]
    pub fn needs_reclaim(&self, limit: u64) -> bool {
        !self.write_refuses
            && self.used.usage > limit
            && self.unreclaimable() <= limit
            && self.trimmed_working_set.is_none_or(|ws| ws <= limit)
    }

    /// Whether the breakdown accounts for none of the usage (no `memory.stat`).
    fn blind(&self) -> bool {
        self.used.anon == 0 && self.used.file == 0 && self.used.usage > 0
    }

    /// Anonymous and shared memory: only swap frees them. Without a breakdown ([`Self::blind`])
    /// all of the usage counts.
    fn unreclaimable(&self) -> u64 {
        if self.blind() {
            self.used.usage
        } else {
            self.used.unreclaimable()
        }
    }
}

/// Why a pod cgroup memory limit of `limit` bytes must wait, given the pod's memory `m`:
/// unreclaimable memory above it (on v2 the write would OOM-kill, on v1 fail); a working
/// set trimming found above it (reclaiming there evicts what the containers use); or, where the
/// write would OOM-kill, usage still above it after the inline reclaim. `None`: it may be
/// written.
fn memory_floor(limit: u64, m: &PodMemory) -> Option<String> {
    let used = &m.used;
    let unreclaimable = m.unreclaimable();
    if unreclaimable > limit && m.blind() {
        return Some(format!(
            "usage {} above requested pod limit {}: memory.stat gives no breakdown, so all of it \
             counts as memory that cannot be reclaimed",
            memory_quantity(used.usage),
            memory_quantity(limit)
        ));
    }
    if unreclaimable > limit {
        let shared = if used.shmem > 0 {
            format!(
                " ({} of it shared: tmpfs, shm)",
                memory_quantity(used.shmem)
            )
        } else {
            String::new()
        };
        return Some(format!(
            "usage {} above requested pod limit {}: {} of anonymous memory{shared} cannot be \
             reclaimed without swap",
            memory_quantity(used.usage),
            memory_quantity(limit),
            memory_quantity(unreclaimable)
        ));
    }
    if let Some(ws) = m.trimmed_working_set.filter(|ws| *ws > limit) {
        return Some(format!(
            "requested pod limit {} is below the working set trimming found for the pod's \
             containers ({}; usage {}): reclaiming below it would evict memory they use",
            memory_quantity(limit),
            memory_quantity(ws),
            memory_quantity(used.usage)
        ));
    }
    if used.usage > limit && !m.write_refuses {
        let reclaimed = if m.reclaimed > 0 {
            format!(
                " after {} of page cache was reclaimed inline",
                memory_quantity(m.reclaimed)
            )
        } else if m.reclaim_unsupported {
            " (this kernel has no memory.reclaim, 5.19+: page cache cannot be reclaimed inside \
             the call)"
                .to_string()
        } else {
            String::new()
        };
        return Some(format!(
            "usage {} above requested pod limit {}{reclaimed} ({} of page cache still \
             charged); the limit is written once usage fits",
            memory_quantity(used.usage),
            memory_quantity(limit),
            memory_quantity(used.usage.saturating_sub(unreclaimable))
        ));
    }
    None
}

/// A pod cgroup memory limit `asked` whose check against the pod's usage could not be made
/// (`why`: the read failed or took longer than its budget) is not let through when it may lower
/// the limit: below `previous` (the pod cgroup's last known memory limit; `None`: unknown, which
/// may be higher) it is Deferred, since on cgroup v2 the kernel OOM-kills inside a write below
/// usage. Raises, equal and unlimited limits are not held back (`None`).
pub fn admit_unchecked_memory(
    asked: Limit,
    previous: Option<Limit>,
    why: &str,
) -> Option<Admission> {
    let Limit::Limited(limit) = asked else {
        return None;
    };
    let lowers = match previous {
        Some(Limit::Limited(before)) => limit < before,
        Some(Limit::Unlimited) | None => true,
    };
    lowers.then(|| Admission::Deferred {
        reason: format!(
            "pod memory limit {} not checked against the pod's usage ({why}): a lower limit is \
             not let through unchecked",
            memory_quantity(limit)
        ),
    })
}

#[cfg(test)]
mod tests;
