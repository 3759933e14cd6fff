//! Safe memory decrease: what to do when a new memory limit is below what the container uses.
//!
//! Lowering `memory.limit_in_bytes` (v1) below what the kernel can reclaim fails the update;
//! lowering `memory.max` (v2) below anonymous usage OOM-kills the container from inside the write.
//! The strategies:
//!
//! - [`MemoryDecreaseStrategy::Reclaim`] (default): accept the update with a safe interim limit
//!   (usage plus headroom), reclaim in the background, apply the requested limit when usage fits;
//! - [`MemoryDecreaseStrategy::Restart`]: evict the container so it restarts under the new limit;
//! - [`MemoryDecreaseStrategy::Reject`]: fail the update (`usage X above requested limit Y`).
//!
//! The node default comes from the config; pods choose per container with
//! `memory-decrease.nri-resize.io/container.<name>` or for every container with
//! `memory-decrease.nri-resize.io/pod`. Strictness: `Reclaim < Restart < Reject` — `Reclaim`
//! holds more memory than was asked for a while, the other two never do — and annotations only
//! tighten: the effective strategy is `max(annotation, node default)`.
//!
//! Everything here is pure: the numbers come from the caller's cgroup reads.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::annotation::{
    check_value, sanitize, sanitize_key, AnnotationError, CONTAINER_DECREASE_PREFIX,
    POD_DECREASE_ANNOTATION,
};
use super::deprecated::decrease_alias;
use super::units::bytes_text;

const MIB: u64 = 1 << 20;
/// Limits are kept page-aligned (the kernel rounds down to pages anyway).
const PAGE: u64 = 4096;

/// What to do when a memory limit is lowered below the container's usage.
///
/// Strictness order: `Reclaim < Restart < Reject`.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "PascalCase")]
pub enum MemoryDecreaseStrategy {
    /// Accept with a safe interim limit, reclaim, then apply the requested limit.
    #[default]
    Reclaim,
    /// Evict the container so that it restarts under the new limit.
    Restart,
    /// Fail the update.
    Reject,
}

impl MemoryDecreaseStrategy {
    /// The annotation and config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reclaim => "Reclaim",
            Self::Restart => "Restart",
            Self::Reject => "Reject",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "Reclaim" => Some(Self::Reclaim),
            "Restart" => Some(Self::Restart),
            "Reject" => Some(Self::Reject),
            _ => None,
        }
    }
}

impl fmt::Display for MemoryDecreaseStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses a memory-decrease annotation value (`Reclaim`, `Restart` or `Reject`: Kubernetes'
/// CamelCase for enum values, as `RestartContainer`). The lowercase spelling of before
/// 2026-11-25 (`reject`) is read as the same value, deprecated (`deprecated.rs`; reported by
/// [`deprecated_spellings`](super::deprecated_spellings)).
pub fn parse_decrease_annotation(
    annotation: &str,
    value: &str,
) -> Result<MemoryDecreaseStrategy, AnnotationError> {
    let v = check_value(annotation, value)?;
    let current = decrease_alias(v).unwrap_or(v);
    MemoryDecreaseStrategy::parse(current).ok_or_else(|| AnnotationError::UnknownValue {
        annotation: sanitize_key(annotation),
        token: sanitize(v),
        expected: "Reclaim, Restart or Reject",
    })
}

/// The strategy for container `container`: the container annotation, else the pod annotation,
/// else the node default — never looser than the node default. Bad annotations are skipped and
/// returned as errors for the caller to report.
pub fn effective_decrease_strategy(
    annotations: &BTreeMap<String, String>,
    container: &str,
    node_default: MemoryDecreaseStrategy,
    allow_annotations: bool,
) -> (MemoryDecreaseStrategy, Vec<AnnotationError>) {
    let mut errors = Vec::new();
    let container_key = format!("{CONTAINER_DECREASE_PREFIX}{container}");
    let keys = [container_key.as_str(), POD_DECREASE_ANNOTATION];
    if !allow_annotations {
        for key in keys {
            if annotations.contains_key(key) {
                errors.push(AnnotationError::Disabled {
                    annotation: sanitize_key(key),
                });
            }
        }
        return (node_default, errors);
    }
    for key in keys {
        let Some(value) = annotations.get(key) else {
            continue;
        };
        match parse_decrease_annotation(key, value) {
            Ok(s) if s < node_default => {
                errors.push(AnnotationError::LooserThanNodeDefault {
                    annotation: sanitize_key(key),
                    key: "memory-decrease".into(),
                    requested: s.as_str(),
                    node_default: node_default.as_str(),
                });
                return (node_default, errors);
            }
            Ok(s) => return (s, errors),
            Err(e) => errors.push(e),
        }
    }
    (node_default, errors)
}

/// A container's memory as cgroupfs reports it, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUse {
    /// `memory.usage_in_bytes` (v1) / `memory.current` (v2).
    pub usage: u64,
    /// Anonymous memory (v1 `total_rss`, v2 `anon`).
    pub anon: u64,
    /// Shared memory / tmpfs (v1 `total_shmem`, v2 `shmem`): like anonymous, only swap frees it.
    pub shmem: u64,
    /// Page cache (v1 `total_cache`, v2 `file`), shmem included as the kernel counts it.
    pub file: u64,
}

impl MemoryUse {
    /// Memory the kernel cannot reclaim without swap.
    pub fn unreclaimable(&self) -> u64 {
        self.anon.saturating_add(self.shmem)
    }
}

/// How a memory decrease proceeds, decided from the usage at the time of the update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecreasePlan {
    /// The new limit is above usage: the runtime writes it directly.
    Direct,
    /// Accept with `interim` (usage plus headroom, between the requested and the old limit), then
    /// reclaim down to `target`.
    Staged { interim: u64, target: u64 },
}

/// Decides how to lower a limit from `old_limit` (`None`: unlimited) to `target` when the
/// container uses `usage` bytes, keeping `headroom` above usage while reclaiming.
pub fn plan_decrease(
    old_limit: Option<u64>,
    target: u64,
    usage: u64,
    headroom: u64,
) -> DecreasePlan {
    if usage <= target {
        return DecreasePlan::Direct;
    }
    let interim = round_up_page(usage.saturating_add(headroom));
    let interim = old_limit
        .map_or(interim, |old| interim.min(old))
        .max(target);
    DecreasePlan::Staged { interim, target }
}

/// The limit to keep when reclaim could not reach `target`: usage plus headroom, never above what
/// is in place (`interim`) and never below `target`.
pub fn safe_limit(interim: u64, target: u64, usage: u64, headroom: u64) -> u64 {
    round_up_page(usage.saturating_add(headroom))
        .min(interim)
        .max(target)
}

/// Bytes to ask `memory.reclaim` for: down to `target`, plus one MiB of slack so that the
/// final limit write has nothing left to reclaim.
pub fn reclaim_request(usage: u64, target: u64) -> u64 {
    round_up_page(usage.saturating_sub(target).saturating_add(MIB))
}

fn round_up_page(b: u64) -> u64 {
    b.div_ceil(PAGE).saturating_mul(PAGE)
}

/// Bytes in MiB, rounded to the nearest, for people.
pub fn mib(b: u64) -> u64 {
    (b + MIB / 2) / MIB
}

/// Why reclaim did not reach `target` in time, as a person reads it.
pub fn not_reclaimable_reason(
    used: &MemoryUse,
    target: u64,
    kept: u64,
    timeout_s: u64,
    swap: bool,
) -> String {
    let unreclaimable = used.unreclaimable();
    if unreclaimable > target && !swap {
        // Shared memory (tmpfs `emptyDir` with `medium: Memory`, /dev/shm) is swap-backed like
        // anonymous memory: only swap frees it.
        let shared = if used.shmem > 0 {
            format!(" ({} of it shared: tmpfs, shm)", bytes_text(used.shmem))
        } else {
            String::new()
        };
        format!(
            "{} of anonymous memory{shared} cannot be reclaimed without swap (usage {}, requested limit {}); keeping {}",
            bytes_text(unreclaimable),
            bytes_text(used.usage),
            bytes_text(target),
            bytes_text(kept)
        )
    } else {
        format!(
            "usage {} did not fall to the requested limit {} within {timeout_s} s ({} anonymous, {} page cache still charged); keeping {}",
            bytes_text(used.usage),
            bytes_text(target),
            bytes_text(unreclaimable),
            bytes_text(used.file),
            bytes_text(kept)
        )
    }
}

/// Memory of a cgroup that a lower limit can only take by swapping or killing: everything that
/// is not page cache (anonymous, shared, and the kernel's own charges such as slab and page
/// tables), at least the anonymous and shared memory `memory.stat` reports.
pub fn not_page_cache(used: &MemoryUse) -> u64 {
    let file_only = used.file.saturating_sub(used.shmem);
    used.usage
        .saturating_sub(file_only)
        .max(used.unreclaimable())
}

/// What becomes of the page cache standing in the way of a refused decrease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheReclaim {
    /// It keeps being reclaimed after the answer (cgroup v2), so kubelet's next try can pass.
    Background,
    /// Each of kubelet's tries reclaims inside the update again (cgroup v1: no reclaim but a
    /// limit write).
    AtNextTry,
    /// Nothing reclaims it (`inline_max = 0` on cgroup v1, or `mode = "Observe"`): the decrease
    /// waits for the workload's usage to fall.
    Off,
}

/// Why a kubelet-driven decrease of a container to `target` is refused while its usage is above
/// it (`used`, read after the reclaim inside the update); `cache`: what becomes of the page
/// cache in the way.
pub fn below_usage_reason(used: &MemoryUse, target: u64, cache: CacheReclaim) -> String {
    let head = format!(
        "usage {} above the requested limit {}",
        bytes_text(used.usage),
        bytes_text(target)
    );
    let unreclaimable = used.unreclaimable();
    if unreclaimable >= target {
        let shared = if used.shmem > 0 {
            format!(", {} of it shared (tmpfs, shm)", bytes_text(used.shmem))
        } else {
            String::new()
        };
        return format!(
            "{head}: {} of anonymous memory{shared} cannot be reclaimed, and a limit below it would OOM-kill the container",
            bytes_text(unreclaimable)
        );
    }
    let then = match cache {
        CacheReclaim::Background => {
            "it is being reclaimed in the background, and kubelet's next try applies the limit once usage fits"
        }
        CacheReclaim::AtNextTry => "kubelet's next try reclaims it again",
        CacheReclaim::Off => {
            "nothing reclaims it here ([memory_decrease] inline_max = 0 on cgroup v1): the decrease waits for usage to fall"
        }
    };
    format!(
        "{head}: {} of it is page cache, not reclaimed within the update's deadline; {then}",
        bytes_text(used.file)
    )
}

/// Why a container's decrease is refused for the pod step kubelet takes right after it
/// (`setPodCgroupConfig` after `updatePodContainerResources`, `kuberuntime_manager.go`): the pod
/// cgroup goes from `pod_limit` to `new_pod_limit`, below the pod's memory that is not page
/// cache (`pinned`, [`not_page_cache`]). On cgroup v2 that write OOM-kills inside the pod.
pub fn pod_step_reason(pinned: u64, pod_limit: u64, new_pod_limit: u64) -> String {
    format!(
        "the pod's memory that is not page cache ({}) does not fit under the pod limit kubelet writes right after this update ({}, now {}): a pod cgroup below it would OOM-kill inside the pod",
        bytes_text(pinned),
        bytes_text(new_pod_limit),
        bytes_text(pod_limit)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::annotation::test_support::ann;

    #[test]
    fn memory_that_is_not_page_cache_counts_kernel_charges() {
        const MI: u64 = 1 << 20;
        let used = MemoryUse {
            usage: 300 * MI,
            anon: 100 * MI,
            shmem: 20 * MI,
            file: 150 * MI,
        };
        // 300 - (150 - 20): the 30Mi the breakdown does not name (slab, page tables) stay.
        assert_eq!(not_page_cache(&used), 170 * MI);
        // A breakdown larger than usage (read at another moment) never goes below anon + shmem.
        let racy = MemoryUse {
            usage: 100 * MI,
            anon: 90 * MI,
            shmem: 30 * MI,
            file: 40 * MI,
        };
        assert_eq!(not_page_cache(&racy), 120 * MI);
    }

    #[test]
    fn a_decrease_below_usage_is_refused_with_its_figures() {
        const MI: u64 = 1 << 20;
        let anon = MemoryUse {
            usage: 310 * MI,
            anon: 300 * MI,
            shmem: 0,
            file: 10 * MI,
        };
        assert_eq!(
            below_usage_reason(&anon, 100 * MI, CacheReclaim::AtNextTry),
            "usage 310Mi above the requested limit 100Mi: 300Mi of anonymous memory cannot be reclaimed, and a limit below it would OOM-kill the container"
        );
        let cache = MemoryUse {
            usage: 310 * MI,
            anon: 20 * MI,
            shmem: 0,
            file: 290 * MI,
        };
        assert_eq!(
            below_usage_reason(&cache, 100 * MI, CacheReclaim::Background),
            "usage 310Mi above the requested limit 100Mi: 290Mi of it is page cache, not reclaimed within the update's deadline; it is being reclaimed in the background, and kubelet's next try applies the limit once usage fits"
        );
        assert!(
            below_usage_reason(&cache, 100 * MI, CacheReclaim::AtNextTry)
                .ends_with("kubelet's next try reclaims it again")
        );
        assert!(below_usage_reason(&cache, 100 * MI, CacheReclaim::Off)
            .ends_with("the decrease waits for usage to fall"));
        assert_eq!(
            pod_step_reason(300 * MI, 612 * MI, 200 * MI),
            "the pod's memory that is not page cache (300Mi) does not fit under the pod limit kubelet writes right after this update (200Mi, now 612Mi): a pod cgroup below it would OOM-kill inside the pod"
        );
    }

    #[test]
    fn container_annotation_wins_over_pod_and_node() {
        use MemoryDecreaseStrategy as S;
        let a = ann(&[
            ("memory-decrease.nri-resize.io/container.app", "Reject"),
            ("memory-decrease.nri-resize.io/pod", "Restart"),
        ]);
        assert_eq!(
            effective_decrease_strategy(&a, "app", S::Reclaim, true),
            (S::Reject, vec![])
        );
        assert_eq!(
            effective_decrease_strategy(&a, "sidecar", S::Reclaim, true),
            (S::Restart, vec![])
        );
        assert_eq!(
            effective_decrease_strategy(&BTreeMap::new(), "app", S::Restart, true),
            (S::Restart, vec![])
        );
    }

    #[test]
    fn annotations_only_tighten() {
        use MemoryDecreaseStrategy as S;
        let a = ann(&[("memory-decrease.nri-resize.io/pod", "Reclaim")]);
        let (s, errors) = effective_decrease_strategy(&a, "app", S::Reject, true);
        assert_eq!(s, S::Reject);
        assert!(
            matches!(
                &errors[..],
                [AnnotationError::LooserThanNodeDefault {
                    requested: "Reclaim",
                    node_default: "Reject",
                    ..
                }]
            ),
            "{errors:?}"
        );
        let (s, errors) = effective_decrease_strategy(&a, "app", S::Reclaim, false);
        assert_eq!(s, S::Reclaim);
        assert!(matches!(&errors[..], [AnnotationError::Disabled { .. }]));
    }

    #[test]
    fn malformed_annotation_falls_back_to_the_next_source() {
        use MemoryDecreaseStrategy as S;
        let a = ann(&[
            ("memory-decrease.nri-resize.io/container.app", "Reclaimm"),
            ("memory-decrease.nri-resize.io/pod", "Restart"),
        ]);
        let (s, errors) = effective_decrease_strategy(&a, "app", S::Reclaim, true);
        assert_eq!(s, S::Restart);
        assert_eq!(errors.len(), 1);
        let msg = errors[0].to_string();
        assert!(
            msg.contains("Reclaim, Restart or Reject") && msg.contains("\"Reclaimm\""),
            "{msg}"
        );
        for bad in ["", "   ", "réclaim", &"x".repeat(5000)] {
            assert!(
                parse_decrease_annotation(POD_DECREASE_ANNOTATION, bad).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_decrease_annotation(POD_DECREASE_ANNOTATION, " Reject "),
            Ok(S::Reject)
        );
    }

    /// A pod annotated before the respelling (`reject`, 2026-11-25) gets what it asked for, as
    /// with `Reject`: no error, the same strategy from every source.
    #[test]
    fn the_old_lowercase_spelling_is_the_same_strategy() {
        use MemoryDecreaseStrategy as S;
        for (old, new) in [
            ("reclaim", S::Reclaim),
            ("restart", S::Restart),
            ("reject", S::Reject),
        ] {
            assert_eq!(
                parse_decrease_annotation(POD_DECREASE_ANNOTATION, old),
                Ok(new)
            );
            for key in [
                "memory-decrease.nri-resize.io/pod",
                "memory-decrease.nri-resize.io/container.app",
            ] {
                let current = ann(&[(key, new.as_str())]);
                let earlier = ann(&[(key, old)]);
                assert_eq!(
                    effective_decrease_strategy(&earlier, "app", S::Reclaim, true),
                    effective_decrease_strategy(&current, "app", S::Reclaim, true),
                    "{key}: {old}"
                );
            }
        }
        // Annotations still only tighten, in either spelling.
        let (s, errors) = effective_decrease_strategy(
            &ann(&[("memory-decrease.nri-resize.io/pod", "reclaim")]),
            "app",
            S::Reject,
            true,
        );
        assert_eq!((s, errors.len()), (S::Reject, 1));
    }

    #[test]
    fn plan_is_direct_when_the_limit_is_above_usage() {
        assert_eq!(
            plan_decrease(Some(512 * MIB), 128 * MIB, 100 * MIB, 16 * MIB),
            DecreasePlan::Direct
        );
        assert_eq!(
            plan_decrease(Some(512 * MIB), 128 * MIB, 128 * MIB, 16 * MIB),
            DecreasePlan::Direct
        );
    }

    #[test]
    fn staged_interim_is_usage_plus_headroom_between_target_and_old_limit() {
        // 450 MiB used, 512 → 128: interim 466 MiB.
        assert_eq!(
            plan_decrease(Some(512 * MIB), 128 * MIB, 450 * MIB, 16 * MIB),
            DecreasePlan::Staged {
                interim: 466 * MIB,
                target: 128 * MIB
            }
        );
        // Usage close to the old limit: the old limit stays (never raised).
        assert_eq!(
            plan_decrease(Some(512 * MIB), 128 * MIB, 505 * MIB, 16 * MIB),
            DecreasePlan::Staged {
                interim: 512 * MIB,
                target: 128 * MIB
            }
        );
        // Unlimited before: interim is usage plus headroom, page-aligned.
        assert_eq!(
            plan_decrease(None, 100 * MIB, 300 * MIB + 1, 0),
            DecreasePlan::Staged {
                interim: 300 * MIB + PAGE,
                target: 100 * MIB
            }
        );
    }

    #[test]
    fn safe_limit_stays_between_target_and_interim() {
        assert_eq!(
            safe_limit(466 * MIB, 100 * MIB, 300 * MIB, 16 * MIB),
            316 * MIB
        );
        assert_eq!(
            safe_limit(466 * MIB, 100 * MIB, 460 * MIB, 16 * MIB),
            466 * MIB
        );
        assert_eq!(
            safe_limit(466 * MIB, 100 * MIB, 10 * MIB, 16 * MIB),
            100 * MIB
        );
        assert_eq!(reclaim_request(450 * MIB, 128 * MIB), 323 * MIB);
        assert_eq!(reclaim_request(100, 128 * MIB), MIB);
    }

    #[test]
    fn reasons_name_what_cannot_be_reclaimed() {
        let used = MemoryUse {
            usage: 312 * MIB,
            anon: 310 * MIB,
            shmem: 0,
            file: 2 * MIB,
        };
        let r = not_reclaimable_reason(&used, 100 * MIB, 328 * MIB, 60, false);
        assert!(
            r.starts_with("310Mi of anonymous memory cannot be reclaimed without swap"),
            "{r}"
        );
        assert!(
            r.contains("requested limit 100Mi") && r.contains("keeping 328Mi"),
            "{r}"
        );
        let cache = MemoryUse {
            usage: 300 * MIB,
            anon: 20 * MIB,
            shmem: 0,
            file: 280 * MIB,
        };
        let r = not_reclaimable_reason(&cache, 100 * MIB, 316 * MIB, 60, false);
        assert!(
            r.contains("within 60 s") && r.contains("280Mi page cache"),
            "{r}"
        );
        // tmpfs / shm counts as unreclaimable, and the reason says how much of it is shared.
        let tmpfs = MemoryUse {
            usage: 200 * MIB,
            anon: 20 * MIB,
            shmem: 150 * MIB,
            file: 180 * MIB,
        };
        let r = not_reclaimable_reason(&tmpfs, 100 * MIB, 216 * MIB, 60, false);
        assert!(
            r.starts_with(
                "170Mi of anonymous memory (150Mi of it shared: tmpfs, shm) cannot be reclaimed without swap"
            ),
            "{r}"
        );
    }
}
