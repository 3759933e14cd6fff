//! The driver: kubelet's resize path applied to the harness's runtime, its decisions taken by
//! [`super::rules`], [`super::profile`], [`super::retry`] and [`super::status`].

use std::io;
use std::time::Duration;

use k8s_cri::v1::{ContainerStatsRequest, MemoryUsage};
use tonic::Status;

use super::profile::{KubeletVersion, SandboxUpdate};
use super::retry::Jitter;
use super::rules::{self, Resource, StatsRuntime, Step, UsageBlock, UsageCache};
use super::status;
use super::{KubeletPodResize, KubeletPodSync, KubeletResize, KubeletSync, SandboxCall};
use crate::cgroups::{CgroupLimits, CgroupMode};
use crate::containerd::Containerd;
use crate::cri_pod::{connect_cri_v036, LinuxContainerResources, UpdatePodSandboxResourcesRequest};
use crate::pod::{Pod, Resources};

/// The kubelet a test plays: its version and where it reads usage from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kubelet {
    /// The version whose resize path is played.
    pub version: KubeletVersion,
    /// The runtime's stats path.
    pub runtime: StatsRuntime,
    /// cAdvisor's cached reading of the pod's usage; `None`: a fresh one (the live value).
    pub pod_usage: Option<UsageCache>,
    /// cAdvisor's cached reading of the container's usage, read on CRI-O only; `None`: fresh.
    pub container_usage: Option<UsageCache>,
}

impl Kubelet {
    /// kubelet `version` on containerd, its caches fresh.
    pub fn new(version: KubeletVersion) -> Self {
        Self {
            version,
            runtime: StatsRuntime::Containerd,
            pod_usage: None,
            container_usage: None,
        }
    }
}

/// What kubelet recorded as actuated for the container and its pod (the allocation manager's
/// actuated resources), kept across syncs. `None`: not seen yet; the first sync takes the
/// runtime's `ContainerStatus` and the pod cgroup, which at the start equal what kubelet last
/// actuated (the harness created them with those values).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Actuated {
    /// The container's resources.
    pub container: Option<Resources>,
    /// The pod cgroup's memory limit (`Some(None)`: the pod has none).
    pub pod_memory: Option<Option<u64>>,
}

fn cpu_of(r: &Resources) -> (i64, i64, i64) {
    (r.cpu_period, r.cpu_quota, r.cpu_shares)
}

impl Containerd {
    /// One sync of kubelet `version` resizing container `id` of `pod` to `to`, the pod step
    /// with it: [`Self::kubelet_sync`] with a fresh [`Actuated`] and fresh caches.
    pub async fn kubelet_resize(
        &self,
        version: KubeletVersion,
        pod: &Pod,
        id: &str,
        to: &Resources,
    ) -> KubeletSync {
        self.kubelet_sync(
            &Kubelet::new(version),
            pod,
            id,
            to,
            &mut Actuated::default(),
        )
        .await
    }

    /// One sync of `kubelet` resizing container `id` of `pod` to `to` (the allocated
    /// resources), in the order of [`rules::write_order`]: a pod memory limit that goes up is
    /// written first; the container's memory, then its CPU, each sent only if it differs from
    /// `actuated` (≥ 1.34: the usage check before a memory decrease); a pod memory limit that
    /// goes down after the container's memory (≥ 1.34: the pod's usage check). The pod has a
    /// memory limit when its cgroup holds one; it moves by the container's change. The pod's
    /// CPU is not written (the container's CPU change is not summed into it). The first failure
    /// ends the sync; `actuated` keeps what was accepted.
    pub async fn kubelet_sync(
        &self,
        kubelet: &Kubelet,
        pod: &Pod,
        id: &str,
        to: &Resources,
        actuated: &mut Actuated,
    ) -> KubeletSync {
        let mut sync = KubeletSync {
            container: KubeletResize::Actuated,
            pod_written: None,
            pod_blocked: None,
            condition: None,
            event: None,
        };
        let now = match actuated.container {
            Some(r) => r,
            None => match self.container_resources(id).await {
                // A runtime that reports no resources: the whole of `to` goes in one update,
                // its memory limit treated as lowering one there was none of.
                Ok(r) => r.as_ref().map_or(
                    Resources {
                        memory_limit: 0,
                        ..*to
                    },
                    Resources::from_cri,
                ),
                Err(e) => {
                    sync.container = KubeletResize::Refused(e);
                    return finish(sync, true);
                }
            },
        };
        actuated.container = Some(now);
        let pod_now = *actuated.pod_memory.get_or_insert_with(|| {
            self.pod_cgroup_limits(pod)
                .ok()
                .and_then(|l| l.memory_limit)
        });
        let pod_target = match (pod_now, now.memory_limit, to.memory_limit) {
            (Some(p), o, n) if o > 0 && n > 0 => Some(rules::pod_memory_after(
                p,
                o.unsigned_abs(),
                n.unsigned_abs(),
            )),
            _ => pod_now,
        };
        let memory_changes = now.memory_limit != to.memory_limit;
        let cpu_changes = cpu_of(&now) != cpu_of(to);
        let pod_mem = (pod_now.unwrap_or(0), pod_target.unwrap_or(0));
        let steps = rules::write_order((pod_mem.0, pod_mem.1, memory_changes), (0, 0, cpu_changes));
        for step in steps {
            let failed = match step {
                Step::Pod(Resource::Memory) => {
                    let (old, new) = pod_mem;
                    match self.write_pod_memory(kubelet, pod, old, new).await {
                        Ok(()) => {
                            sync.pod_written = Some(new);
                            actuated.pod_memory = Some(Some(new));
                            false
                        }
                        Err(e) => {
                            sync.pod_blocked = Some(e);
                            true
                        }
                    }
                }
                Step::Pod(Resource::Cpu) => false,
                Step::Containers(Resource::Memory) => {
                    let current = actuated.container.unwrap_or(now);
                    let send = Resources {
                        memory_limit: to.memory_limit,
                        ..current
                    };
                    sync.container = self.update_checked(kubelet, id, &current, &send).await;
                    if sync.container.applied() {
                        actuated.container = Some(send);
                    }
                    !sync.container.applied()
                }
                Step::Containers(Resource::Cpu) => {
                    let current = actuated.container.unwrap_or(now);
                    let send = Resources {
                        cpu_period: to.cpu_period,
                        cpu_quota: to.cpu_quota,
                        cpu_shares: to.cpu_shares,
                        ..current
                    };
                    sync.container = match self.update_container_resources(id, &send).await {
                        Ok(()) => KubeletResize::Applied,
                        Err(e) => KubeletResize::Refused(e),
                    };
                    if sync.container.applied() {
                        actuated.container = Some(send);
                    }
                    !sync.container.applied()
                }
            };
            if failed {
                break;
            }
        }
        let in_progress = rules::resize_in_progress(&Some(*to), &actuated.container)
            || rules::resize_in_progress(&Some(pod_target), &actuated.pod_memory);
        finish(sync, in_progress)
    }

    /// The container's memory update, with ≥ 1.34's usage check before a decrease.
    async fn update_checked(
        &self,
        kubelet: &Kubelet,
        id: &str,
        current: &Resources,
        send: &Resources,
    ) -> KubeletResize {
        if kubelet.version.checks_usage()
            && rules::lowers_memory(current.memory_limit, send.memory_limit)
        {
            let live = self.container_usage(id).await;
            let usage = match (kubelet.runtime, kubelet.container_usage) {
                (StatsRuntime::CriO, Some(cache)) => rules::usage_seen(cache, live),
                _ => live,
            };
            let limit = send.memory_limit.unsigned_abs();
            if let Err(block) = rules::check_container_memory(id, limit, usage) {
                return blocked(block);
            }
        }
        match self.update_container_resources(id, send).await {
            Ok(()) => KubeletResize::Applied,
            Err(e) => KubeletResize::Refused(e),
        }
    }

    /// kubelet's pod cgroup memory write from `old` to `new`: ≥ 1.34's usage check before a
    /// decrease, `UpdatePodSandboxResources` where the version puts it, the write through the
    /// harness's writer (cgroupfs or systemd paths by its [`CgroupMode`] and driver).
    async fn write_pod_memory(
        &self,
        kubelet: &Kubelet,
        pod: &Pod,
        old: u64,
        new: u64,
    ) -> Result<(), String> {
        if kubelet.version.checks_usage() && new < old {
            let live = self.pod_memory_usage(pod).ok();
            let usage = kubelet
                .pod_usage
                .map_or(live, |cache| rules::usage_seen(cache, live));
            rules::check_pod_memory(new, usage).map_err(|(_, m)| m)?;
        }
        let limits = self.pod_cgroup_limits(pod).unwrap_or_default();
        let as_resources = |memory: u64| Resources {
            cpu_period: i64::try_from(limits.cpu_period).unwrap_or(100_000),
            cpu_quota: limits.cpu_quota.unwrap_or(0),
            cpu_shares: i64::try_from(limits.cpu_shares).unwrap_or(1024),
            memory_limit: i64::try_from(memory).unwrap_or(i64::MAX),
        };
        let none = Resources::default();
        let write = |memory: u64| {
            let l = CgroupLimits {
                memory_limit: Some(memory),
                ..limits
            };
            self.set_pod_cgroup_limits(pod, &l)
        };
        let verb = if new > old { "raising" } else { "lowering" };
        match kubelet.version.sandbox_update() {
            SandboxUpdate::NotCalled => {
                write(new).map_err(|e| format!("{verb} the pod cgroup: {e}"))
            }
            SandboxUpdate::AfterWriteIgnored => {
                write(new).map_err(|e| format!("{verb} the pod cgroup: {e}"))?;
                let _ignored = self
                    .update_pod_sandbox_resources(pod, &as_resources(new), &none)
                    .await;
                Ok(())
            }
            SandboxUpdate::BeforeWriteBlocking => {
                let unimplemented = match self
                    .update_pod_sandbox_resources(pod, &as_resources(new), &none)
                    .await
                {
                    Ok(()) => false,
                    Err(s) if s.code() == tonic::Code::Unimplemented => true,
                    Err(s) => return Err(status::runtime_error_text(s.code(), s.message())),
                };
                if let Err(e) = write(new) {
                    if !unimplemented {
                        let _revert = self
                            .update_pod_sandbox_resources(pod, &as_resources(old), &none)
                            .await;
                    }
                    return Err(format!("{verb} the pod cgroup: {e}"));
                }
                Ok(())
            }
        }
    }

    /// [`Self::kubelet_resize`] until allocated and actuated agree, at most `syncs` syncs, the
    /// actuated record kept between them (an accepted container update is not sent again); the
    /// pod worker's wait between two is `backoff` (kubelet: 10 s; a test passes less) with its
    /// jitter of up to half as much again ([`Jitter::pod_worker_backoff`], a fixed seed). Every
    /// sync, the last the one that finished the resize if any.
    pub async fn kubelet_resize_retrying(
        &self,
        version: KubeletVersion,
        pod: &Pod,
        id: &str,
        to: &Resources,
        backoff: Duration,
        syncs: u32,
    ) -> Vec<KubeletSync> {
        let kubelet = Kubelet::new(version);
        let mut actuated = Actuated::default();
        let mut jitter = Jitter::seeded(36);
        let mut all = Vec::new();
        for n in 0..syncs {
            if n > 0 {
                tokio::time::sleep(jitter.pod_worker_backoff(backoff)).await;
            }
            let s = self
                .kubelet_sync(&kubelet, pod, id, to, &mut actuated)
                .await;
            let done = !s.in_progress();
            all.push(s);
            if done {
                break;
            }
        }
        all
    }

    /// One sync of kubelet ≥ 1.34 resizing container `id` to `to`, the container alone: the
    /// usage check (live over CRI stats) before a memory decrease, then the whole update.
    pub async fn kubelet_resize_container(&self, id: &str, to: &Resources) -> KubeletResize {
        let current = match self.container_resources(id).await {
            Ok(r) => r.map_or(0, |r| r.memory_limit_in_bytes),
            Err(e) => return KubeletResize::Refused(e),
        };
        if rules::lowers_memory(current, to.memory_limit) {
            let usage = self.container_usage(id).await;
            let limit = to.memory_limit.unsigned_abs();
            if let Err(block) = rules::check_container_memory(id, limit, usage) {
                return blocked(block);
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

    /// The pod cgroup's memory usage (`memory.current` / `memory.usage_in_bytes`), live.
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
    /// `overhead` is added to the pod cgroup, as kubelet does): the usage check before a memory
    /// decrease, then each pod cgroup write of [`rules::pod_level_writes`] in its order (memory,
    /// then CPU), each preceded by `UpdatePodSandboxResources` with the resources merged so far
    /// and written through `write` (the harness's writer, or one a test makes fail); a failed
    /// write is followed by the call with the resources before it (the revert) and ends the
    /// sync, as does a refused call ([`SandboxUpdate::BeforeWriteBlocking`]).
    pub async fn kubelet_resize_pod(
        &self,
        pod: &Pod,
        from: &Resources,
        to: &Resources,
        overhead: &Resources,
        write: impl Fn(&Self, &Pod, &CgroupLimits) -> io::Result<()>,
    ) -> KubeletPodSync {
        let mut calls = Vec::new();
        let done = |calls, outcome| KubeletPodSync { calls, outcome };
        let cgroup = to.with_overhead(overhead).cgroup_limits();
        let current = self
            .pod_cgroup_limits(pod)
            .ok()
            .and_then(|l| l.memory_limit);
        if let Some(limit) = cgroup.memory_limit {
            if current.is_none_or(|c| limit < c) {
                match self.pod_memory_usage(pod) {
                    Ok(usage) => {
                        if let Err((UsageBlock::BelowUsage { usage, limit }, _)) =
                            rules::check_pod_memory(limit, Some(usage))
                        {
                            return done(calls, KubeletPodResize::BelowUsage { usage, limit });
                        }
                    }
                    Err(e) => {
                        return done(
                            calls,
                            KubeletPodResize::Refused(Status::unavailable(e.to_string())),
                        )
                    }
                }
            }
        }
        let mut before = *from;
        let mut unimplemented = false;
        for (_, merged) in rules::pod_level_writes(from, to) {
            let answer = self
                .update_pod_sandbox_resources(pod, &merged, overhead)
                .await;
            calls.push(SandboxCall::new(merged, false, &answer));
            match answer {
                Ok(()) => {}
                Err(s) if s.code() == tonic::Code::Unimplemented => unimplemented = true,
                Err(s) => return done(calls, KubeletPodResize::Refused(s)),
            }
            if let Err(failed) = write(self, pod, &merged.with_overhead(overhead).cgroup_limits()) {
                let revert = if unimplemented {
                    Ok(())
                } else {
                    let revert = self
                        .update_pod_sandbox_resources(pod, &before, overhead)
                        .await;
                    calls.push(SandboxCall::new(before, true, &revert));
                    revert
                };
                return done(
                    calls,
                    KubeletPodResize::Reverted {
                        write: failed,
                        revert,
                    },
                );
            }
            before = merged;
        }
        done(calls, KubeletPodResize::Applied { unimplemented })
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

/// The sync's result with what kubelet shows of it.
fn finish(mut sync: KubeletSync, in_progress: bool) -> KubeletSync {
    let error = sync
        .container
        .error_text()
        .or_else(|| sync.pod_blocked.clone());
    sync.condition = status::condition_after_sync(in_progress, error.as_deref());
    sync.event = status::event_after_sync(error.as_deref());
    sync
}

fn blocked((block, message): (UsageBlock, String)) -> KubeletResize {
    match block {
        UsageBlock::BelowUsage { usage, limit } => KubeletResize::BelowUsage {
            usage,
            limit,
            message,
        },
        UsageBlock::Missing => KubeletResize::MissingUsage(message),
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
