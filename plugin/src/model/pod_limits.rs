//! Pod-level limits (KEP-5419 pod-level resources) as the plugin compares them: CPU millicores
//! and memory bytes, `None` = unlimited.

use serde::{Deserialize, Serialize};

use super::{held_memory_limit, limited_bytes, LinuxResources};

/// CPU and memory limits of a pod; `None` = unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodLimits {
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl PodLimits {
    /// The limits Linux resources ask for (a quota or memory limit of 0 or below: unlimited).
    pub fn from_linux(r: &LinuxResources) -> Self {
        PodLimits {
            cpu_millis: r.cpu_quota().filter(|q| *q > 0).and(r.cpu_limit_millis()),
            memory_bytes: memory(r.memory_limit()),
        }
    }

    /// The limits a cgroup holds: CFS quota and period, memory limit (`-1`/`max`: unlimited).
    pub fn from_cgroup(quota: Option<i64>, period: Option<u64>, memory_limit: Option<i64>) -> Self {
        let cpu_millis = match (quota, period) {
            (Some(q), Some(p)) if q > 0 && p > 0 => Some(q.unsigned_abs().saturating_mul(1000) / p),
            _ => None,
        };
        PodLimits {
            cpu_millis,
            memory_bytes: memory(memory_limit),
        }
    }
}

impl PodLimits {
    /// These limits as a cgroup holds them once written: the memory limit in whole pages of
    /// `page_size` bytes, rounded down ([`held_memory_limit`]). A pod cgroup read back holds
    /// what was asked when its limits equal these.
    #[must_use]
    pub fn as_held(&self, page_size: u64) -> Self {
        PodLimits {
            cpu_millis: self.cpu_millis,
            memory_bytes: self.memory_bytes.map(|b| held_memory_limit(b, page_size)),
        }
    }
}

fn memory(limit: Option<i64>) -> Option<u64> {
    limit.and_then(limited_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CpuResources, MemoryResources};

    #[test]
    fn spec_and_cgroup_forms_agree_and_zero_or_max_is_unlimited() {
        let r = LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(50_000),
                period: Some(100_000),
                ..CpuResources::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(128 << 20),
                ..MemoryResources::default()
            }),
            ..LinuxResources::default()
        };
        let want = PodLimits {
            cpu_millis: Some(500),
            memory_bytes: Some(128 << 20),
        };
        assert_eq!(PodLimits::from_linux(&r), want);
        assert_eq!(
            PodLimits::from_cgroup(Some(50_000), Some(100_000), Some(128 << 20)),
            want
        );
        assert_eq!(
            PodLimits::from_cgroup(Some(-1), Some(100_000), Some(i64::MAX)),
            PodLimits::default()
        );
        let zero = LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(0),
                ..CpuResources::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(0),
                ..MemoryResources::default()
            }),
            ..LinuxResources::default()
        };
        assert_eq!(PodLimits::from_linux(&zero), PodLimits::default());
    }
}
