//! The resize path of today's kubelet (1.34 – 1.36), played against the harness's containerd.
//!
//! - **A container's memory decrease (kubelet ≥ 1.34).** Before it lowers a container's memory
//!   limit, kubelet reads the container's usage from its stats provider (`UsageBytes`: the
//!   cgroup's `memory.current` / `memory.usage_in_bytes`, page cache included) and does not call
//!   the runtime while that usage is at or above the new limit; the resize stays in progress
//!   with the error *"attempting to set container's memory limit … below current usage …"* and
//!   is tried again on a later sync. A usage it cannot read blocks too. Here the usage comes
//!   from CRI `ContainerStats`, which containerd fills from the same cgroup file.
//!   [`Containerd::kubelet_resize_container`] is one sync, [`Containerd::kubelet_resize_container_until`]
//!   the retries.
//! - **A pod-level resize (kubelet 1.36, KEP-5419).** The same usage check on the pod cgroup,
//!   then CRI `UpdatePodSandboxResources` **before** the pod cgroup is written (an error blocks
//!   the resize; `Unimplemented` is tolerated, the call is best effort for runtimes without
//!   it), then the pod cgroup write, and if that write fails the call again with the previous
//!   resources (the revert). [`Containerd::kubelet_resize_pod`].
//!
//! - **The pod step after a container (every version since 1.33).** `doPodResizeAction` →
//!   `resizeContainers` (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`) writes a pod memory
//!   limit that goes up before the containers and one that goes down right after them, once the
//!   runtime accepted the container's update; a pod has a memory limit only when every container
//!   has one (`ResourceConfigForPod`: their sum plus overhead), so a container lowered by `d`
//!   lowers the pod cgroup by `d`. An accepted update is recorded as actuated and never sent
//!   again (`updatePodContainerResources`); a refused one fails the sync and the pod worker
//!   retries after its backoff. From 1.34 the pod's usage is checked before the pod write too.
//!   [`Containerd::kubelet_resize`] is one sync of a container's resize with its pod step, for a
//!   [`KubeletVersion`].
//!
//! Tests that call [`Containerd::update_container_resources`] directly play a CRI client
//! without the usage check and without the pod step: a decrease that passed kubelet's check
//! just before the workload's usage grew again, or another CRI client.

use std::io;
use std::time::Duration;

use k8s_cri::v1::{ContainerStatsRequest, MemoryUsage};
use tonic::Status;

use crate::cgroups::{CgroupLimits, CgroupMode};
use crate::containerd::Containerd;
use crate::cri_pod::{connect_cri_v036, LinuxContainerResources, UpdatePodSandboxResourcesRequest};
use crate::pod::{Pod, Resources};

/// What one sync of kubelet's resize of a container did.
#[derive(Debug)]
pub enum KubeletResize {
    /// The runtime was called and accepted the update.
    Applied,
    /// kubelet did not call the runtime: usage is at or above the new memory limit.
    BelowUsage {
        /// The usage kubelet read (page cache included), bytes.
        usage: u64,
        /// The memory limit asked for, bytes.
        limit: u64,
        /// kubelet's error text.
        message: String,
    },
    /// kubelet did not call the runtime: it could not read the usage.
    MissingUsage(String),
    /// The runtime was called and refused (kubelet records the error and retries).
    Refused(Status),
}

impl KubeletResize {
    /// Whether the runtime accepted the update.
    pub fn applied(&self) -> bool {
        matches!(self, Self::Applied)
    }
}

/// What kubelet 1.36's pod-level resize did.
#[derive(Debug)]
pub enum KubeletPodResize {
    /// Called (or tolerated as unimplemented), then the pod cgroup written.
    Applied {
        /// The runtime answered `Unimplemented`: it never saw the resize.
        unimplemented: bool,
    },
    /// Not called: the pod's usage is at or above the new memory limit.
    BelowUsage {
        /// The pod cgroup's usage, bytes.
        usage: u64,
        /// The pod cgroup's new memory limit, bytes.
        limit: u64,
    },
    /// The runtime refused: the pod cgroup was not written.
    Refused(Status),
    /// The pod cgroup write failed after the runtime accepted: the runtime was called again
    /// with the previous resources.
    Reverted {
        /// Why the write failed.
        write: io::Error,
        /// The revert call's answer.
        revert: Result<(), Status>,
    },
}

/// The kubelet whose resize path a test plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletVersion {
    /// 1.33: no usage check; the decrease reaches the runtime whatever the usage.
    V1_33,
    /// 1.34 and 1.35: `validateMemoryResizeAction` (kubernetes/kubernetes#133012) reads the
    /// container's usage before lowering its limit, and the pod's before lowering the pod's.
    V1_34,
}

impl KubeletVersion {
    /// Whether kubelet reads usage before lowering a memory limit (≥ 1.34).
    pub fn checks_usage(self) -> bool {
        self != Self::V1_33
    }
}

/// One sync of kubelet resizing a container of a pod, pod step included.
#[derive(Debug)]
pub struct KubeletSync {
    /// The container's step.
    pub container: KubeletResize,
    /// The pod cgroup memory limit kubelet wrote (before the container for a raise, after it
    /// for a decrease); `None`: not written.
    pub pod_written: Option<u64>,
    /// Why the pod step was not taken after the runtime accepted the container (kubelet's usage
    /// check on the pod, or the write's error); the sync fails and kubelet retries the pod step.
    pub pod_blocked: Option<String>,
}

impl Containerd {
    /// One sync of kubelet `version` resizing container `id` of `pod` to `to`, the pod step with
    /// it (see the module docs): a pod memory limit that goes up is written first, the
    /// container updated (with ≥ 1.34's usage check), and once the runtime accepted, a pod
    /// memory limit that goes down written after it (with ≥ 1.34's usage check of the pod).
    /// The pod has a memory limit when its cgroup holds one; it moves by the container's change.
    pub async fn kubelet_resize(
        &self,
        version: KubeletVersion,
        pod: &Pod,
        id: &str,
        to: &Resources,
    ) -> KubeletSync {
        let mut sync = KubeletSync {
            container: KubeletResize::Applied,
            pod_written: None,
            pod_blocked: None,
        };
        let old = match self.container_resources(id).await {
            Ok(r) => r.map_or(0, |r| r.memory_limit_in_bytes),
            Err(e) => {
                sync.container = KubeletResize::Refused(e);
                return sync;
            }
        };
        let pod_limits = self.pod_cgroup_limits(pod).ok();
        let new_pod = match (
            pod_limits.as_ref().and_then(|l| l.memory_limit),
            old,
            to.memory_limit,
        ) {
            (Some(p), o, n) if o > 0 && n > 0 => {
                let (o, n) = (o.unsigned_abs(), n.unsigned_abs());
                Some((p, (p + n).saturating_sub(o)))
            }
            _ => None,
        };
        let write_pod = |limit: u64| -> io::Result<()> {
            let mut l = pod_limits.unwrap_or_default();
            l.memory_limit = Some(limit);
            self.set_pod_cgroup_limits(pod, &l)
        };
        if let Some((p, n)) = new_pod {
            if n > p {
                if let Err(e) = write_pod(n) {
                    sync.pod_blocked = Some(format!("raising the pod cgroup: {e}"));
                    return sync;
                }
                sync.pod_written = Some(n);
            }
        }
        sync.container = if version.checks_usage() {
            self.kubelet_resize_container(id, to).await
        } else {
            match self.update_container_resources(id, to).await {
                Ok(()) => KubeletResize::Applied,
                Err(e) => KubeletResize::Refused(e),
            }
        };
        if !sync.container.applied() {
            return sync;
        }
        if let Some((p, n)) = new_pod {
            if n < p {
                if version.checks_usage() {
                    match self.pod_memory_usage(pod) {
                        Ok(usage) if usage >= n => {
                            sync.pod_blocked = Some(format!(
                                "attempting to set pod memory limit ({n}) below current usage ({usage})"
                            ));
                            return sync;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            sync.pod_blocked = Some(format!("missing pod memory usage: {e}"));
                            return sync;
                        }
                    }
                }
                match write_pod(n) {
                    Ok(()) => sync.pod_written = Some(n),
                    Err(e) => sync.pod_blocked = Some(format!("lowering the pod cgroup: {e}")),
                }
            }
        }
        sync
    }

    /// [`Self::kubelet_resize`] until the container step is accepted, at most `syncs` syncs
    /// `backoff` apart (kubelet's pod worker retries a failed sync after a jittered backoff of
    /// about 10–15 s; a test passes less): every sync, the last the accepted one if any.
    pub async fn kubelet_resize_retrying(
        &self,
        version: KubeletVersion,
        pod: &Pod,
        id: &str,
        to: &Resources,
        backoff: Duration,
        syncs: u32,
    ) -> Vec<KubeletSync> {
        let mut all = Vec::new();
        for n in 0..syncs {
            if n > 0 {
                tokio::time::sleep(backoff).await;
            }
            let s = self.kubelet_resize(version, pod, id, to).await;
            let done = s.container.applied();
            all.push(s);
            if done {
                break;
            }
        }
        all
    }

    /// One sync of kubelet ≥ 1.34 resizing container `id` to `to` (see the module docs).
    pub async fn kubelet_resize_container(&self, id: &str, to: &Resources) -> KubeletResize {
        let current = match self.container_resources(id).await {
            Ok(r) => r.map_or(0, |r| r.memory_limit_in_bytes),
            Err(e) => return KubeletResize::Refused(e),
        };
        let lowers = to.memory_limit > 0 && (current <= 0 || to.memory_limit < current);
        if lowers {
            let limit = u64::try_from(to.memory_limit).unwrap_or(0);
            match self.container_usage(id).await {
                Some(usage) if usage >= limit => {
                    return KubeletResize::BelowUsage {
                        usage,
                        limit,
                        message: format!(
                            "attempting to set container's memory limit ({limit}) below current usage ({usage})"
                        ),
                    };
                }
                Some(_) => {}
                None => {
                    return KubeletResize::MissingUsage(format!(
                        "missing container {id} memory usage"
                    ))
                }
            }
        }
        match self.update_container_resources(id, to).await {
            Ok(()) => KubeletResize::Applied,
            Err(e) => KubeletResize::Refused(e),
        }
    }

    /// kubelet ≥ 1.34 resizing container `id` to `to`, one try per `sync`, at most `syncs`
    /// tries: every outcome, the last first to be [`KubeletResize::Applied`] or
    /// [`KubeletResize::Refused`] if one was (kubelet also retries a refusal, but a test wants
    /// to see it).
    pub async fn kubelet_resize_container_until(
        &self,
        id: &str,
        to: &Resources,
        sync: Duration,
        syncs: u32,
    ) -> Vec<KubeletResize> {
        let mut tries = Vec::new();
        for n in 0..syncs {
            if n > 0 {
                tokio::time::sleep(sync).await;
            }
            let r = self.kubelet_resize_container(id, to).await;
            let done = matches!(r, KubeletResize::Applied | KubeletResize::Refused(_));
            tries.push(r);
            if done {
                break;
            }
        }
        tries
    }

    /// The container's memory usage from CRI `ContainerStats` (page cache included), as
    /// kubelet's stats provider reads it; `None` if the runtime gives none.
    pub async fn container_usage(&self, id: &str) -> Option<u64> {
        self.memory_stats(id).await?.usage_bytes.map(|v| v.value)
    }

    /// The container's working set from CRI `ContainerStats` (usage minus inactive page cache:
    /// what VPA recommends from); `None` if the runtime gives none.
    pub async fn container_working_set(&self, id: &str) -> Option<u64> {
        self.memory_stats(id)
            .await?
            .working_set_bytes
            .map(|v| v.value)
    }

    async fn memory_stats(&self, id: &str) -> Option<MemoryUsage> {
        self.runtime_client()
            .container_stats(ContainerStatsRequest {
                container_id: id.to_owned(),
            })
            .await
            .ok()?
            .into_inner()
            .stats?
            .memory
    }

    /// The pod cgroup's memory usage (`memory.current` / `memory.usage_in_bytes`).
    pub fn pod_memory_usage(&self, pod: &Pod) -> io::Result<u64> {
        let file = if self.cgroups.mode() == CgroupMode::V1 {
            "memory.usage_in_bytes"
        } else {
            "memory.current"
        };
        let dir = self.cgroups.dir_for("memory", &pod.cgroup_path);
        let text = std::fs::read_to_string(dir.join(file))?;
        text.trim()
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{file}: {e}")))
    }

    /// kubelet 1.36 resizing `pod`'s pod-level resources from `from` to `to` (the overhead
    /// `overhead` is added to the pod cgroup, as kubelet does): the usage check, then
    /// `UpdatePodSandboxResources`, then the pod cgroup write through `write` (the harness's
    /// writer, or one a test makes fail), then the revert call if the write failed.
    pub async fn kubelet_resize_pod(
        &self,
        pod: &Pod,
        from: &Resources,
        to: &Resources,
        overhead: &Resources,
        write: impl FnOnce(&Self, &Pod, &CgroupLimits) -> io::Result<()>,
    ) -> KubeletPodResize {
        let cgroup = with_overhead(to, overhead).cgroup_limits();
        let current = self
            .pod_cgroup_limits(pod)
            .ok()
            .and_then(|l| l.memory_limit);
        if let Some(limit) = cgroup.memory_limit {
            if current.is_none_or(|c| limit < c) {
                match self.pod_memory_usage(pod) {
                    Ok(usage) if usage >= limit => {
                        return KubeletPodResize::BelowUsage { usage, limit };
                    }
                    Ok(_) => {}
                    Err(e) => return KubeletPodResize::Refused(Status::unavailable(e.to_string())),
                }
            }
        }
        let unimplemented = match self.update_pod_sandbox_resources(pod, to, overhead).await {
            Ok(()) => false,
            Err(s) if s.code() == tonic::Code::Unimplemented => true,
            Err(s) => return KubeletPodResize::Refused(s),
        };
        match write(self, pod, &cgroup) {
            Ok(()) => KubeletPodResize::Applied { unimplemented },
            Err(write) => KubeletPodResize::Reverted {
                write,
                revert: if unimplemented {
                    Ok(())
                } else {
                    self.update_pod_sandbox_resources(pod, from, overhead).await
                },
            },
        }
    }

    /// CRI `UpdatePodSandboxResources` (cri-api 0.36) with `resources` and `overhead`.
    pub async fn update_pod_sandbox_resources(
        &self,
        pod: &Pod,
        resources: &Resources,
        overhead: &Resources,
    ) -> Result<(), Status> {
        let mut client = connect_cri_v036(self.cri_socket())
            .await
            .map_err(|e| Status::unavailable(format!("connect to CRI: {e}")))?;
        client
            .update_pod_sandbox_resources(UpdatePodSandboxResourcesRequest {
                pod_sandbox_id: pod.id.clone(),
                overhead: Some(v036(overhead)),
                resources: Some(v036(resources)),
            })
            .await
            .map(|_| ())
    }
}

/// `r` plus `overhead` (what kubelet writes to the pod cgroup).
fn with_overhead(r: &Resources, overhead: &Resources) -> Resources {
    let add = |a: i64, b: i64| if a > 0 { a + b.max(0) } else { a };
    Resources {
        cpu_period: r.cpu_period,
        cpu_quota: add(r.cpu_quota, overhead.cpu_quota),
        cpu_shares: add(r.cpu_shares, overhead.cpu_shares),
        memory_limit: add(r.memory_limit, overhead.memory_limit),
    }
}

fn v036(r: &Resources) -> LinuxContainerResources {
    LinuxContainerResources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit,
        ..Default::default()
    }
}
