//! Linux resources in nri-resize's own terms (what the OCI runtime spec calls `LinuxResources`).
//! `None` means "not specified", which differs from zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Memory limits at or above this are unlimited (cgroup v1 reports `PAGE_COUNTER_MAX` pages in
/// bytes, v2 `max`): the one such constant of the crate.
pub const UNLIMITED_BYTES: u64 = 1 << 62;

/// A memory limit as the runtime or a cgroup gives it, in bytes; `None` when it is unlimited
/// (`-1`, 0, or at or above [`UNLIMITED_BYTES`]).
pub fn limited_bytes(limit: i64) -> Option<u64> {
    u64::try_from(limit)
        .ok()
        .filter(|&b| b > 0 && b < UNLIMITED_BYTES)
}

/// CPU part of [`LinuxResources`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CpuResources {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shares: Option<u64>,
    /// CFS quota in microseconds per period; negative means unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota: Option<i64>,
    /// CFS period in microseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub realtime_runtime: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub realtime_period: Option<u64>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cpus: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mems: String,
}

/// Memory part of [`LinuxResources`] (bytes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryResources {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_tcp: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swappiness: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_oom_killer: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_hierarchy: Option<bool>,
}

/// A huge page limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HugepageLimit {
    pub page_size: String,
    pub limit: u64,
}

/// The full Linux resources of a container, a pod or an update.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinuxResources {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuResources>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryResources>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hugepage_limits: Vec<HugepageLimit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blockio_class: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdt_class: Option<String>,
    /// cgroup v2 `unified` key/values.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub unified: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
}

impl LinuxResources {
    /// CFS quota, if set.
    pub fn cpu_quota(&self) -> Option<i64> {
        self.cpu.as_ref().and_then(|c| c.quota)
    }
    /// CFS period, if set.
    pub fn cpu_period(&self) -> Option<u64> {
        self.cpu.as_ref().and_then(|c| c.period)
    }
    /// CPU shares, if set.
    pub fn cpu_shares(&self) -> Option<u64> {
        self.cpu.as_ref().and_then(|c| c.shares)
    }
    /// Memory limit in bytes, if set.
    pub fn memory_limit(&self) -> Option<i64> {
        self.memory.as_ref().and_then(|m| m.limit)
    }

    /// Whether applying `requested` over `self` (the current resources) lowers the memory limit:
    /// a limit is asked for, and it is below the current one or the current one is unlimited.
    pub fn lowers_memory_limit(&self, requested: &LinuxResources) -> bool {
        let Some(new) = requested.memory_limit().and_then(limited_bytes) else {
            return false;
        };
        self.memory_limit()
            .and_then(limited_bytes)
            .is_none_or(|old| new < old)
    }

    /// CPU limit in millicores derived from quota and period (`None` when unlimited).
    pub fn cpu_limit_millis(&self) -> Option<u64> {
        let quota = u64::try_from(self.cpu_quota()?).ok()?;
        let period = self.cpu_period().filter(|p| *p > 0).unwrap_or(100_000);
        Some(quota.saturating_mul(1000) / period)
    }

    /// `update` (for a container that holds `self` now) with its swap limit moved along with
    /// the memory limit it sets, where `update` leaves swap alone and `self` has a bounded one.
    ///
    /// The OCI swap limit is memory + swap. kubelet sets it equal to the memory limit on
    /// cgroup v1 (swap off), and CRI-O does on every container where the kernel has the swap
    /// controller. The runtime merges an update into the container's spec, so a new memory
    /// limit alone would sit above the old memory + swap limit: the kernel refuses that on v1
    /// (`EINVAL`), and runc only orders the two writes when it gets both. The allowance above
    /// the memory limit (0 for swap off) is kept.
    #[must_use]
    pub fn with_swap_following(&self, update: &LinuxResources) -> LinuxResources {
        let mut out = update.clone();
        let Some(m) = out.memory.as_mut() else {
            return out;
        };
        let (Some(limit), None) = (m.limit.filter(|l| *l > 0), m.swap) else {
            return out;
        };
        let current = self.memory.as_ref();
        let (Some(old_limit), Some(old_swap)) = (
            current.and_then(|c| c.limit).filter(|l| *l > 0),
            current.and_then(|c| c.swap).filter(|s| *s > 0),
        ) else {
            return out;
        };
        if old_swap >= old_limit {
            m.swap = Some(limit.saturating_add(old_swap - old_limit));
        }
        out
    }

    /// Overlays the fields `update` specifies onto `self`, as the runtime applies an update.
    pub fn merge(&mut self, update: &LinuxResources) {
        if let Some(u) = &update.cpu {
            let c = self.cpu.get_or_insert_with(CpuResources::default);
            merge_opt(&mut c.shares, u.shares);
            merge_opt(&mut c.quota, u.quota);
            merge_opt(&mut c.period, u.period);
            merge_opt(&mut c.realtime_runtime, u.realtime_runtime);
            merge_opt(&mut c.realtime_period, u.realtime_period);
            if !u.cpus.is_empty() {
                c.cpus.clone_from(&u.cpus);
            }
            if !u.mems.is_empty() {
                c.mems.clone_from(&u.mems);
            }
        }
        if let Some(u) = &update.memory {
            let m = self.memory.get_or_insert_with(MemoryResources::default);
            merge_opt(&mut m.limit, u.limit);
            merge_opt(&mut m.reservation, u.reservation);
            merge_opt(&mut m.swap, u.swap);
            merge_opt(&mut m.kernel, u.kernel);
            merge_opt(&mut m.kernel_tcp, u.kernel_tcp);
            merge_opt(&mut m.swappiness, u.swappiness);
            merge_opt(&mut m.disable_oom_killer, u.disable_oom_killer);
            merge_opt(&mut m.use_hierarchy, u.use_hierarchy);
        }
        if !update.hugepage_limits.is_empty() {
            self.hugepage_limits.clone_from(&update.hugepage_limits);
        }
        if update.blockio_class.is_some() {
            self.blockio_class.clone_from(&update.blockio_class);
        }
        if update.rdt_class.is_some() {
            self.rdt_class.clone_from(&update.rdt_class);
        }
        for (k, v) in &update.unified {
            self.unified.insert(k.clone(), v.clone());
        }
        merge_opt(&mut self.pids_limit, update.pids_limit);
    }
}

fn merge_opt<T: Copy>(dst: &mut Option<T>, src: Option<T>) {
    if src.is_some() {
        *dst = src;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(limit: Option<i64>, swap: Option<i64>) -> LinuxResources {
        LinuxResources {
            memory: Some(MemoryResources {
                limit,
                swap,
                ..MemoryResources::default()
            }),
            ..LinuxResources::default()
        }
    }

    #[test]
    fn swap_follows_a_new_memory_limit_keeping_its_allowance() {
        const MIB: i64 = 1 << 20;
        // kubelet's swap off on cgroup v1, and CRI-O everywhere: memory + swap = memory.
        let off = memory(Some(128 * MIB), Some(128 * MIB));
        let raised = off.with_swap_following(&memory(Some(256 * MIB), None));
        assert_eq!(raised, memory(Some(256 * MIB), Some(256 * MIB)));
        let lowered = off.with_swap_following(&memory(Some(64 * MIB), None));
        assert_eq!(lowered, memory(Some(64 * MIB), Some(64 * MIB)));
        // A swap allowance above the limit moves with it.
        let allowance = memory(Some(128 * MIB), Some(192 * MIB));
        assert_eq!(
            allowance.with_swap_following(&memory(Some(256 * MIB), None)),
            memory(Some(256 * MIB), Some(320 * MIB))
        );
        // Left alone: an update that sets swap itself, one without a memory limit, a container
        // with unlimited or no swap limit, or no memory limit to measure the allowance from.
        let explicit = memory(Some(256 * MIB), Some(-1));
        assert_eq!(off.with_swap_following(&explicit), explicit);
        let cpu_only = LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(50_000),
                ..CpuResources::default()
            }),
            ..LinuxResources::default()
        };
        assert_eq!(off.with_swap_following(&cpu_only), cpu_only);
        let to = memory(Some(256 * MIB), None);
        for current in [
            memory(Some(128 * MIB), Some(-1)),
            memory(Some(128 * MIB), None),
            memory(None, Some(128 * MIB)),
            LinuxResources::default(),
        ] {
            assert_eq!(current.with_swap_following(&to), to, "{current:?}");
        }
    }

    #[test]
    fn merge_overlays_only_specified_fields() {
        let mut base = LinuxResources {
            cpu: Some(CpuResources {
                shares: Some(512),
                quota: Some(50_000),
                period: Some(100_000),
                cpus: "0-1".into(),
                ..Default::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(64 << 20),
                swap: Some(64 << 20),
                ..Default::default()
            }),
            ..Default::default()
        };
        let update = LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(150_000),
                ..Default::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(128 << 20),
                ..Default::default()
            }),
            pids_limit: Some(100),
            ..Default::default()
        };
        base.merge(&update);
        assert_eq!(base.cpu_quota(), Some(150_000));
        assert_eq!(base.cpu_shares(), Some(512));
        assert_eq!(base.cpu.as_ref().unwrap().cpus, "0-1");
        assert_eq!(base.memory_limit(), Some(128 << 20));
        assert_eq!(base.memory.as_ref().unwrap().swap, Some(64 << 20));
        assert_eq!(base.pids_limit, Some(100));
        assert_eq!(base.cpu_limit_millis(), Some(1500));
    }

    #[test]
    fn unlimited_quota_has_no_cpu_limit() {
        let r = LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(-1),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(r.cpu_limit_millis(), None);
        assert_eq!(LinuxResources::default().cpu_limit_millis(), None);
    }

    #[test]
    fn json_rejects_unknown_fields() {
        let err = serde_json::from_str::<LinuxResources>(r#"{"cpu":{"qouta":5}}"#).unwrap_err();
        assert!(err.to_string().contains("qouta"), "{err}");
    }

    #[test]
    fn a_lower_memory_limit_is_told_from_other_updates() {
        let mem = |limit: Option<i64>| LinuxResources {
            memory: Some(MemoryResources {
                limit,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(mem(Some(256 << 20)).lowers_memory_limit(&mem(Some(128 << 20))));
        assert!(
            mem(None).lowers_memory_limit(&mem(Some(128 << 20))),
            "from unlimited"
        );
        assert!(
            mem(Some(-1)).lowers_memory_limit(&mem(Some(128 << 20))),
            "from -1"
        );
        assert!(!mem(Some(128 << 20)).lowers_memory_limit(&mem(Some(256 << 20))));
        assert!(!mem(Some(128 << 20)).lowers_memory_limit(&mem(Some(128 << 20))));
        assert!(
            !mem(Some(128 << 20)).lowers_memory_limit(&mem(Some(0))),
            "to unlimited"
        );
        assert!(
            !mem(Some(128 << 20)).lowers_memory_limit(&mem(None)),
            "memory untouched"
        );
        assert!(!mem(Some(128 << 20)).lowers_memory_limit(&LinuxResources::default()));
    }
}
