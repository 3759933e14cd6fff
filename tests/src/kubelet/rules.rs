//! kubelet's resize rules as pure functions: no runtime, no cgroup, no clock.
//!
//! Each rule names the kubelet function it is ported from. Sources read: kubernetes/kubernetes
//! `pkg/kubelet/kuberuntime/kuberuntime_manager.go` (`doPodResizeAction`, `resizeContainers`,
//! `updatePodContainerResources`), `pkg/kubelet/cm/helpers_linux.go`, and the pull requests
//! named below (their descriptions and review diffs).

use std::time::Duration;

use crate::pod::Resources;

/// Whether the allocated memory limit lowers the actuated one (0 or less: no limit). A limit
/// that appears where there was none lowers it too. `validateMemoryResizeAction` checks usage
/// only for such a change (kubernetes/kubernetes#133012).
pub fn lowers_memory(actuated: i64, allocated: i64) -> bool {
    allocated > 0 && (actuated <= 0 || allocated < actuated)
}

/// Why kubelet does not call the runtime to lower a memory limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageBlock {
    /// Usage at or above the new limit.
    BelowUsage {
        /// The usage kubelet read, bytes.
        usage: u64,
        /// The limit asked for, bytes.
        limit: u64,
    },
    /// No usage to compare with (kubernetes/kubernetes#141100: blocks rather than panics).
    Missing,
}

/// The container half of `validateMemoryResizeAction` (kubelet ≥ 1.34,
/// kubernetes/kubernetes#133012, the message as fixed by kubernetes/kubernetes#141100): the
/// limit may go down only while usage is below it; no usage blocks.
pub fn check_container_memory(
    name: &str,
    limit: u64,
    usage: Option<u64>,
) -> Result<(), (UsageBlock, String)> {
    match usage {
        None => Err((
            UsageBlock::Missing,
            format!("missing container {name:?} memory usage"),
        )),
        Some(usage) if usage >= limit => Err((
            UsageBlock::BelowUsage { usage, limit },
            format!(
                "attempting to set container {name:?} memory limit ({limit}) below current usage ({usage})"
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// The pod half of `validateMemoryResizeAction` (kubernetes/kubernetes#133012): the pod
/// cgroup's limit may go down only while the pod's usage is below it. The usage passed here is
/// what kubelet's stats provider returned (see [`pod_usage_seen`]).
pub fn check_pod_memory(limit: u64, usage: Option<u64>) -> Result<(), (UsageBlock, String)> {
    match usage {
        None => Err((UsageBlock::Missing, "missing pod memory usage".to_owned())),
        Some(usage) if usage >= limit => Err((
            UsageBlock::BelowUsage { usage, limit },
            format!("attempting to set pod memory limit ({limit}) below current usage ({usage})"),
        )),
        Some(_) => Ok(()),
    }
}

/// cAdvisor's housekeeping interval on a kubelet node: 10 s, stretched up to 15 s when
/// nothing changes. A cached reading younger than this may not have been refreshed yet.
pub const HOUSEKEEPING_MAX: Duration = Duration::from_secs(15);

/// A usage reading in cAdvisor's cache, as the test sets it: `value` read `age` ago; `None`:
/// the cgroup was not scraped yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageCache {
    /// The cached usage, bytes; `None`: not scraped yet.
    pub value: Option<u64>,
    /// How long ago it was read.
    pub age: Duration,
}

/// The usage kubelet's stats provider hands `validateMemoryResizeAction` from cAdvisor's
/// cache (the pod on containerd; pod and container on CRI-O): a pod not scraped yet reads 0
/// and passes the check (kubernetes/kubernetes#133344); a reading younger than housekeeping
/// is served as it is, however stale; an older one has been refreshed, so the live value.
pub fn usage_seen(cache: UsageCache, live: Option<u64>) -> Option<u64> {
    match cache.value {
        None => Some(0),
        Some(v) if cache.age < HOUSEKEEPING_MAX => Some(v),
        Some(_) => live,
    }
}

/// Where kubelet reads usage from, by runtime (`pkg/kubelet/stats`: the CRI stats provider
/// with cAdvisor for pods on containerd, the cAdvisor provider on CRI-O).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatsRuntime {
    /// Container usage live over CRI `ContainerStats`; the pod's from cAdvisor's cache.
    #[default]
    Containerd,
    /// Both from cAdvisor's cache.
    CriO,
}

/// The pod cgroup's memory limit as `ResourceConfigForPod` (`pkg/kubelet/cm/helpers_linux.go`)
/// computes it: the containers' limits summed plus the overhead, only when every container has
/// a limit; otherwise none.
pub fn pod_memory_limit(containers: &[Option<u64>], overhead: u64) -> Option<u64> {
    containers
        .iter()
        .try_fold(overhead, |sum, c| c.map(|l| sum + l))
}

/// The pod cgroup limit after one container of a pod whose containers all have limits moves
/// from `from` to `to` (the sum in [`pod_memory_limit`] moves by as much).
pub fn pod_memory_after(pod: u64, from: u64, to: u64) -> u64 {
    (pod + to).saturating_sub(from)
}

/// A resource kubelet resizes in its own pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// Memory limit.
    Memory,
    /// CPU quota and shares.
    Cpu,
}

/// One write of kubelet's resize, in the order [`write_order`] gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The pod cgroup's value for the resource.
    Pod(Resource),
    /// The containers' CRI updates for the resource.
    Containers(Resource),
}

/// The order of `doPodResizeAction` → `resizeContainers`
/// (`pkg/kubelet/kuberuntime/kuberuntime_manager.go`): memory's pass before CPU's; within a
/// pass, a pod value that goes up is written before the containers and one that goes down
/// after them; a pass with nothing to change is skipped. `memory` and `cpu` are (now, new)
/// pod values and whether a container changes in that resource.
pub fn write_order(memory: (u64, u64, bool), cpu: (u64, u64, bool)) -> Vec<Step> {
    let mut steps = Vec::new();
    for (r, (now, new, containers)) in [(Resource::Memory, memory), (Resource::Cpu, cpu)] {
        if new > now {
            steps.push(Step::Pod(r));
        }
        if containers {
            steps.push(Step::Containers(r));
        }
        if new < now {
            steps.push(Step::Pod(r));
        }
    }
    steps
}

/// A pod cgroup value `setPodCgroupConfig` writes on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodField {
    /// `memory.max` / `memory.limit_in_bytes`.
    Memory,
    /// The CPU limit: `cpu.max`'s quota / `cpu.cfs_quota_us`.
    CpuQuota,
    /// The CPU request: `cpu.weight` / `cpu.shares`.
    CpuShares,
}

/// The pod cgroup writes of a resize of the pod's resources from `from` to `to`, in kubelet's
/// order, each with the pod's resources merged up to and including it: what kubelet ≥ 1.36
/// sends in `UpdatePodSandboxResources` before that write (and, with the previous entry's
/// resources, the revert when the write fails). `doPodResizeAction` → `resizeContainers(rName,
/// …)` runs memory's pass, then CPU's; within a pass a limit that goes up is written first, a
/// request that goes down next (both before the containers), then a limit that goes down and a
/// request that goes up (after them); memory requests are not written (`setPodCgroupConfig`
/// returns before the call); each write is followed (≤ 1.35) or preceded (1.36+,
/// kubernetes/kubernetes#137555) by the call with `mergeResourceConfig(current, resized)`
/// (kubernetes/kubernetes#128123). So one resize of CPU and memory makes up to three calls,
/// the first ones with intermediate states.
pub fn pod_level_writes(from: &Resources, to: &Resources) -> Vec<(PodField, Resources)> {
    let mut merged = *from;
    let mut writes = Vec::new();
    let mut write = |field: PodField, merged: &mut Resources| {
        match field {
            PodField::Memory => merged.memory_limit = to.memory_limit,
            PodField::CpuQuota => merged.cpu_quota = to.cpu_quota,
            PodField::CpuShares => merged.cpu_shares = to.cpu_shares,
        }
        writes.push((field, *merged));
    };
    if to.memory_limit != from.memory_limit {
        write(PodField::Memory, &mut merged);
    }
    let (quota, shares) = (
        (from.cpu_quota, to.cpu_quota),
        (from.cpu_shares, to.cpu_shares),
    );
    if quota.1 > quota.0 {
        write(PodField::CpuQuota, &mut merged);
    }
    if shares.1 < shares.0 {
        write(PodField::CpuShares, &mut merged);
    }
    if quota.1 < quota.0 {
        write(PodField::CpuQuota, &mut merged);
    }
    if shares.1 > shares.0 {
        write(PodField::CpuShares, &mut merged);
    }
    writes
}

/// `MinShares` in `pkg/kubelet/cm/helpers_linux.go`.
const MIN_SHARES: i64 = 2;
/// `MaxShares`.
const MAX_SHARES: i64 = 262_144;
/// `MinQuotaPeriod` (µs).
const MIN_QUOTA: i64 = 1_000;

/// `MilliCPUToShares` (`pkg/kubelet/cm/helpers_linux.go`): always sent, at least 2.
pub fn cpu_shares(milli_cpu: i64) -> i64 {
    (milli_cpu * 1024 / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// `MilliCPUToQuota`: no limit, no quota (0); otherwise at least 1 ms per period.
pub fn cpu_quota(milli_cpu: i64, period: i64) -> i64 {
    if milli_cpu <= 0 {
        0
    } else {
        (milli_cpu * period / 1000).max(MIN_QUOTA)
    }
}

/// A container's resources as the allocation manager holds them (Kubernetes units).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allocation {
    /// CPU request, millicores.
    pub cpu_request: i64,
    /// CPU limit, millicores; 0: none.
    pub cpu_limit: i64,
    /// Memory request, bytes.
    pub memory_request: i64,
    /// Memory limit, bytes; 0: none.
    pub memory_limit: i64,
}

/// The CRI resources of `generateLinuxContainerResources`
/// (`pkg/kubelet/kuberuntime/kuberuntime_container_linux.go`): shares always (at least 2),
/// period and quota, the memory limit. The memory request has no CRI field (without
/// `MemoryQoS`); swap is added on the wire by [`Resources::to_cri`] as kubelet does with swap
/// off (`configureContainerSwapResources`, `NoSwap`).
pub fn linux_resources(a: Allocation, period: i64) -> Resources {
    Resources {
        cpu_period: period,
        cpu_quota: cpu_quota(a.cpu_limit, period),
        cpu_shares: cpu_shares(a.cpu_request),
        memory_limit: a.memory_limit,
    }
}

/// Whether kubelet calls the runtime for a container: its allocation differs from what was
/// actuated (`computePodResizeAction` compares with the actuated resources, the memory request
/// included), so a memory-request-only resize still sends an update, unchanged on the wire.
pub fn update_needed(allocated: Allocation, actuated: Allocation) -> bool {
    allocated != actuated
}

/// `IsPodResizeInProgress` (allocation manager): allocated differs from actuated. The runtime's
/// `ContainerStatus` does not enter: after a CRI update returns OK the values are recorded as
/// actuated (`updatePodContainerResources`) and never sent again.
pub fn resize_in_progress<T: PartialEq>(allocated: &T, actuated: &T) -> bool {
    allocated != actuated
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_resize_of_cpu_and_memory_makes_three_calls_memory_first() {
        const MI: i64 = 1 << 20;
        let from = Resources::limits(200_000, 1024 * MI);
        let to = Resources::limits(150_000, 768 * MI);
        let writes = pod_level_writes(&from, &to);
        let fields: Vec<PodField> = writes.iter().map(|(f, _)| *f).collect();
        assert_eq!(
            fields,
            [PodField::Memory, PodField::CpuShares, PodField::CpuQuota],
            "memory's pass, then CPU's: the request going down before the limit going down"
        );
        let states: Vec<(i64, i64, i64)> = writes
            .iter()
            .map(|(_, r)| (r.memory_limit, r.cpu_shares, r.cpu_quota))
            .collect();
        assert_eq!(
            states,
            [
                (768 * MI, 2048, 200_000),
                (768 * MI, 1536, 200_000),
                (768 * MI, 1536, 150_000)
            ],
            "each call carries what was written so far, the rest as it was"
        );
    }

    #[test]
    fn a_growing_cpu_limit_is_written_before_its_request() {
        let from = Resources::limits(100_000, 0);
        let to = Resources::limits(300_000, 0);
        let fields: Vec<PodField> = pod_level_writes(&from, &to)
            .into_iter()
            .map(|(f, _)| f)
            .collect();
        assert_eq!(fields, [PodField::CpuQuota, PodField::CpuShares]);
    }

    #[test]
    fn an_unchanged_pod_writes_nothing_and_one_resource_writes_once() {
        let r = Resources::limits(100_000, 64 << 20);
        assert!(pod_level_writes(&r, &r).is_empty());
        let more = Resources {
            memory_limit: 128 << 20,
            ..r
        };
        assert_eq!(
            pod_level_writes(&r, &more),
            [(PodField::Memory, more)],
            "a memory-only resize: one call, with the final state"
        );
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn only_a_lower_or_new_memory_limit_lowers() {
        assert!(lowers_memory(512, 256));
        assert!(lowers_memory(-1, 256), "a limit where there was none");
        assert!(!lowers_memory(256, 512));
        assert!(!lowers_memory(256, 256));
        assert!(!lowers_memory(256, 0), "no limit asked: nothing lowered");
    }

    #[test]
    fn container_check_blocks_at_usage_and_without_usage() {
        assert_eq!(
            check_container_memory("app", 100 * MIB, Some(99 * MIB)),
            Ok(())
        );
        let (block, message) =
            check_container_memory("app", 100 * MIB, Some(100 * MIB)).unwrap_err();
        assert_eq!(
            block,
            UsageBlock::BelowUsage {
                usage: 100 * MIB,
                limit: 100 * MIB
            }
        );
        assert_eq!(
            message,
            "attempting to set container \"app\" memory limit (104857600) below current usage (104857600)"
        );
        let (block, message) = check_container_memory("app", 100 * MIB, None).unwrap_err();
        assert_eq!(block, UsageBlock::Missing);
        assert_eq!(message, "missing container \"app\" memory usage");
    }

    #[test]
    fn pod_check_names_the_pod_figures() {
        assert_eq!(check_pod_memory(10, Some(9)), Ok(()));
        assert_eq!(
            check_pod_memory(10, Some(12)).unwrap_err().1,
            "attempting to set pod memory limit (10) below current usage (12)"
        );
    }

    #[test]
    fn a_pod_not_scraped_yet_reads_zero_and_passes() {
        let cache = UsageCache {
            value: None,
            age: Duration::ZERO,
        };
        assert_eq!(usage_seen(cache, Some(400 * MIB)), Some(0));
        assert_eq!(
            check_pod_memory(100 * MIB, usage_seen(cache, Some(400 * MIB))),
            Ok(())
        );
    }

    #[test]
    fn a_stale_reading_is_served_until_housekeeping_refreshes_it() {
        let stale = |age| UsageCache {
            value: Some(50 * MIB),
            age,
        };
        assert_eq!(
            usage_seen(stale(Duration::from_secs(14)), Some(400 * MIB)),
            Some(50 * MIB)
        );
        assert_eq!(
            usage_seen(stale(HOUSEKEEPING_MAX), Some(400 * MIB)),
            Some(400 * MIB)
        );
        assert_eq!(usage_seen(stale(HOUSEKEEPING_MAX), None), None);
    }

    #[test]
    fn a_pod_has_a_memory_limit_only_when_every_container_has_one() {
        assert_eq!(pod_memory_limit(&[Some(100), Some(200)], 10), Some(310));
        assert_eq!(pod_memory_limit(&[Some(100), None], 10), None);
        assert_eq!(pod_memory_limit(&[], 0), Some(0));
        assert_eq!(pod_memory_after(512, 512, 128), 128);
        assert_eq!(pod_memory_after(600, 100, 300), 800);
    }

    #[test]
    fn memory_before_cpu_pod_up_first_pod_down_last() {
        use Resource::{Cpu, Memory};
        assert_eq!(
            write_order((512, 128, true), (100, 150, true)),
            vec![
                Step::Containers(Memory),
                Step::Pod(Memory),
                Step::Pod(Cpu),
                Step::Containers(Cpu)
            ]
        );
        assert_eq!(
            write_order((128, 512, true), (150, 100, true)),
            vec![
                Step::Pod(Memory),
                Step::Containers(Memory),
                Step::Containers(Cpu),
                Step::Pod(Cpu)
            ]
        );
        assert_eq!(
            write_order((5, 5, false), (1, 1, true)),
            vec![Step::Containers(Cpu)]
        );
    }

    #[test]
    fn shares_always_at_least_two_and_quota_at_least_a_millisecond() {
        assert_eq!(cpu_shares(0), 2);
        assert_eq!(cpu_shares(1), 2);
        assert_eq!(cpu_shares(1000), 1024);
        assert_eq!(cpu_shares(1_000_000), 262_144);
        assert_eq!(cpu_quota(0, 100_000), 0);
        assert_eq!(cpu_quota(1, 100_000), 1_000);
        assert_eq!(cpu_quota(1500, 100_000), 150_000);
    }

    #[test]
    fn a_request_carries_shares_period_quota_and_limit() {
        let a = Allocation {
            cpu_request: 100,
            cpu_limit: 1000,
            memory_request: 64 << 20,
            memory_limit: 128 << 20,
        };
        assert_eq!(
            linux_resources(a, 100_000),
            Resources {
                cpu_period: 100_000,
                cpu_quota: 100_000,
                cpu_shares: 102,
                memory_limit: 128 << 20
            }
        );
    }

    #[test]
    fn a_memory_request_only_resize_still_sends_an_update() {
        let actuated = Allocation {
            cpu_request: 100,
            cpu_limit: 0,
            memory_request: 64 << 20,
            memory_limit: 128 << 20,
        };
        let allocated = Allocation {
            memory_request: 96 << 20,
            ..actuated
        };
        assert!(update_needed(allocated, actuated));
        assert_eq!(
            linux_resources(allocated, 100_000),
            linux_resources(actuated, 100_000),
            "the same on the wire"
        );
        assert!(!update_needed(actuated, actuated));
    }

    #[test]
    fn in_progress_compares_allocated_with_actuated() {
        assert!(resize_in_progress(&128, &512));
        assert!(!resize_in_progress(&128, &128));
    }
}
