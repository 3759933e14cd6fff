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
