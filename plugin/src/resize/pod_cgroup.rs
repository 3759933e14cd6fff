//! Pod cgroup I/O of the engine: the pod's limits as cgroupfs holds them, read back after a
//! step, and written by a `SetPod` step; and a container step as the resources the runtime applies.

use super::Engine;
use crate::cgroup::{container_path, pod_path, ActualResources, CgroupError, CgroupIo, CpuLimit};
use crate::model::{limited_bytes, CpuResources, LinuxResources, MemoryResources, Pod};
use crate::policy::{Limit, Limits, LimitsUpdate, PodResources, DEFAULT_CFS_PERIOD_US};

/// Why the engine could not read or write a pod's cgroups.
#[derive(Debug, thiserror::Error)]
pub enum PodCgroupError {
    /// The plugin runs without cgroup access.
    #[error("cgroup access is off")]
    Off,
    /// The pod cgroup's path, a read or a write.
    #[error("pod cgroup: {source}")]
    Pod {
        #[source]
        source: CgroupError,
    },
    /// A container's cgroup could not be read back.
    #[error("cgroup of container {container}: {source}")]
    Container {
        container: String,
        #[source]
        source: CgroupError,
    },
}

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
    /// The pod cgroup's limits as cgroupfs says: of CPU (`cpu`) and/or memory (`memory`); the
    /// resource not read is unlimited.
    fn pod_limits(&self, pod: &Pod, cpu: bool, memory: bool) -> Result<Limits, PodCgroupError> {
        let cg = self.cgroups.as_ref().ok_or(PodCgroupError::Off)?;
        pod_path(&pod.cgroup_parent)
            .and_then(|path| cg.read_limits_of(&path, cpu, memory))
            .map(|l| limits_of(&ActualResources::from(l)))
            .map_err(|source| PodCgroupError::Pod { source })
    }

    /// The pod's current limits: the pod cgroup as cgroupfs says, containers as the model says.
    pub(super) fn current_pod(&self, pod: &Pod) -> Result<PodResources, PodCgroupError> {
        self.current_pod_for(pod, true, true)
    }

    /// [`Self::current_pod`] for a single container's update: only the pod cgroup's files of
    /// the resources that grow are read; the others, which no plan raises, are taken as
    /// unlimited (`plan_single` passes over a resource that does not grow, whatever the pod's).
    pub(super) fn current_pod_for(
        &self,
        pod: &Pod,
        cpu_grows: bool,
        memory_grows: bool,
    ) -> Result<PodResources, PodCgroupError> {
        let pod_limits = self.pod_limits(pod, cpu_grows, memory_grows)?;
        Ok(self.with_containers(pod, pod_limits))
    }

    /// The pod cgroup's `pod_limits` with the pod's containers as the model says.
    fn with_containers(&self, pod: &Pod, pod_limits: Limits) -> PodResources {
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
        PodResources {
            pod: pod_limits,
            containers,
        }
    }

    /// Reads back the actual limits of the pod and its containers from cgroupfs. A container
    /// without a cgroup to read (its path does not resolve, or the cgroup is gone because it
    /// exited and its stop is not seen yet) is left out; any other failure is an error: what a
    /// step left cannot be checked.
    pub(super) fn actual_pod(&self, pod: &Pod) -> Result<PodResources, PodCgroupError> {
        let pod_limits = self.pod_limits(pod, true, true)?;
        let cg = self.cgroups.as_ref().ok_or(PodCgroupError::Off)?;
        let containers = self.state.read_model(|m| {
            m.containers()
                .filter(|c| c.pod_id == pod.id)
                .filter(|c| !matches!(c.state, crate::model::ContainerState::Stopped))
                .filter_map(|c| {
                    let path = container_path(&c.cgroups_path).ok()?;
                    match cg.read_limits(&path) {
                        Ok(l) => Some(Ok((c.name.clone(), limits_of(&ActualResources::from(l))))),
                        Err(CgroupError::Missing { .. }) => None,
                        Err(source) => Some(Err(PodCgroupError::Container {
                            container: c.name.clone(),
                            source,
                        })),
                    }
                })
                .collect::<Result<_, _>>()
        })?;
        Ok(PodResources {
            pod: pod_limits,
            containers,
        })
    }

    /// Writes a `SetPod` step to the pod cgroup.
    pub(super) fn write_pod(&self, pod: &Pod, u: &LimitsUpdate) -> Result<(), PodCgroupError> {
        let cg = self.cgroups.as_ref().ok_or(PodCgroupError::Off)?;
        let pod_error = |source| PodCgroupError::Pod { source };
        let path = pod_path(&pod.cgroup_parent).map_err(pod_error)?;
        if let Some(cpu) = u.cpu {
            let quota = cpu.value().map(|m| m * DEFAULT_CFS_PERIOD_US / 1000);
            cg.set_cpu_limit(
                &path,
                CpuLimit {
                    quota,
                    period: DEFAULT_CFS_PERIOD_US,
                },
            )
            .map_err(pod_error)?;
        }
        if let Some(mem) = u.memory {
            cg.set_memory_limit(&path, mem.value()).map_err(pod_error)?;
        }
        Ok(())
    }
}

/// The CPU and memory limits a cgroup holds (`-1`, 0 or v1's huge "unlimited" value: unlimited).
fn limits_of(a: &ActualResources) -> Limits {
    Limits::new(
        Limit::from_option(a.cpu_limit_millis()),
        Limit::from_option(a.memory_limit.and_then(limited_bytes)),
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
