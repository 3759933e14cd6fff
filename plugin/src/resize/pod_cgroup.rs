//! Pod cgroup I/O of the engine: the pod's limits as cgroupfs holds them, read back after a
//! step, and written by a `SetPod` step; and a container step as the resources the runtime applies.

use std::path::Path;

use super::Engine;
use crate::cgroup::{container_path, pod_path, CgroupIo, CpuLimit};
use crate::model::{CpuResources, LinuxResources, MemoryResources, Pod};
use crate::policy::{Limit, Limits, LimitsUpdate, PodResources, DEFAULT_CFS_PERIOD_US};

/// A step's update as the Linux resources the runtime applies.
pub(super) fn update_resources(u: &LimitsUpdate) -> LinuxResources {
    let cpu = (u.cpu.is_some() || u.cpu_shares.is_some()).then(|| CpuResources {
        quota: u.cpu.map(|l| {
            l.value().map_or(-1, |m| {
                i64::try_from(m * DEFAULT_CFS_PERIOD_US / 1000).unwrap_or(i64::MAX)
            })
        }),
        period: u.cpu.map(|_| DEFAULT_CFS_PERIOD_US),
        shares: u.cpu_shares,
        ..CpuResources::default()
    });
    let memory = u.memory.map(|l| MemoryResources {
        limit: Some(
            l.value()
                .map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)),
        ),
        ..MemoryResources::default()
    });
    LinuxResources {
        cpu,
        memory,
        ..LinuxResources::default()
    }
}

impl Engine {
    /// The pod's current limits: the pod cgroup as cgroupfs says, containers as the model says.
    pub(super) fn current_pod(&self, pod: &Pod) -> Result<PodResources, String> {
        let cg = self.cgroups.as_ref().ok_or("cgroup access is off")?;
        let path = pod_path(&pod.cgroup_parent).map_err(|e| e.to_string())?;
        let pod_limits = limits_of(&cg.read_actual(&path).map_err(|e| e.to_string())?);
        let containers = self.state.read_model(|m| {
            m.containers()
                .filter(|c| c.pod_id == pod.id)
                .filter(|c| !matches!(c.state, crate::model::ContainerState::Stopped))
                .map(|c| {
                    (
                        c.name.clone(),
                        c.resources
                            .as_ref()
                            .map(Limits::from_linux)
                            .unwrap_or_default(),
                    )
                })
                .collect()
        });
        Ok(PodResources {
            pod: pod_limits,
            containers,
        })
    }

    /// Reads back the actual limits of the pod and its containers from cgroupfs.
    pub(super) fn actual_pod(&self, pod: &Pod) -> Option<PodResources> {
        let cg = self.cgroups.as_ref()?;
        let read = |p: &Path| cg.read_actual(p).ok().map(|a| limits_of(&a));
        let pod_limits = read(&pod_path(&pod.cgroup_parent).ok()?)?;
        let containers = self.state.read_model(|m| {
            m.containers()
                .filter(|c| c.pod_id == pod.id)
                .filter(|c| !matches!(c.state, crate::model::ContainerState::Stopped))
                .filter_map(|c| {
                    Some((
                        c.name.clone(),
                        read(&container_path(&c.cgroups_path).ok()?)?,
                    ))
                })
                .collect()
        });
        Some(PodResources {
            pod: pod_limits,
            containers,
        })
    }

    pub(super) fn write_pod(&self, pod: &Pod, u: &LimitsUpdate) -> Result<(), String> {
        let cg = self.cgroups.as_ref().ok_or("cgroup access is off")?;
        let path = pod_path(&pod.cgroup_parent).map_err(|e| e.to_string())?;
        if let Some(cpu) = u.cpu {
            let quota = cpu.value().map(|m| m * DEFAULT_CFS_PERIOD_US / 1000);
            cg.set_cpu_limit(
                &path,
                CpuLimit {
                    quota,
                    period: DEFAULT_CFS_PERIOD_US,
                },
            )
            .map_err(|e| e.to_string())?;
        }
        if let Some(mem) = u.memory {
            cg.set_memory_limit(&path, mem.value())
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The CPU and memory limits a cgroup holds (`-1`, 0 or v1's huge "unlimited" value: unlimited).
fn limits_of(a: &crate::cgroup::ActualResources) -> Limits {
    Limits::new(
        Limit::from_option(a.cpu_limit_millis()),
        Limit::from_option(
            a.memory_limit
                .filter(|&m| {
                    m > 0 && u64::try_from(m).is_ok_and(|b| b < crate::policy::UNLIMITED_BYTES)
                })
                .and_then(|m| u64::try_from(m).ok()),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_become_runtime_resources() {
        let u = LimitsUpdate {
            cpu: Some(Limit::Limited(1500)),
            memory: Some(Limit::Unlimited),
            cpu_shares: Some(1536),
        };
        let r = update_resources(&u);
        assert_eq!(
            (
                r.cpu_quota(),
                r.cpu_period(),
                r.cpu_shares(),
                r.memory_limit()
            ),
            (Some(150_000), Some(100_000), Some(1536), Some(-1))
        );
        let r = update_resources(&LimitsUpdate {
            memory: Some(Limit::Limited(1 << 30)),
            ..LimitsUpdate::default()
        });
        assert!(r.cpu.is_none());
        assert_eq!(r.memory_limit(), Some(1 << 30));
    }
}
