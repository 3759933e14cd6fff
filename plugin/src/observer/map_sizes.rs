//! How many entries the observer's eBPF maps get, from what is known about the node. A pure
//! function of [`NodeFacts`]; the loader applies it before load (`EbpfLoader::map_max_entries`).
//!
//! The counters (`THROTTLE`, `RECLAIM`, `OOM`) are shared LRU hashes keyed by cgroup: their
//! memory is entries × (value + ~64 bytes of key and bookkeeping), the same on 2 CPUs as on 128.
//! The cgroups that can hold counters at once are the pods' (pod cgroup, sandbox, containers)
//! plus the node's own (system slices, quality-of-service levels, runtime). An LRU hash also parks free entries
//! on each CPU that inserts (the kernel's `LOCAL_FREE_TARGET`, 128 per CPU) and evicts live
//! ones once the shared free list runs short, so that much room per possible CPU is added: live
//! entries are then never evicted early.
//!
//! The task maps (`THROTTLED_TASKS`, `RECLAIM_START`) hold one entry per task throttled or in
//! direct reclaim *right now*; they cannot need more than the node has pids (`pid_max`).

/// What the map sizes follow from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// kubelet's `maxPods` for this node (`[observer] max_pods`).
    pub max_pods: u32,
    /// `/sys/devices/system/cpu/possible`: the CPUs the kernel allocates per-CPU memory for.
    pub possible_cpus: u32,
    /// `kernel.pid_max`, when it could be read.
    pub pid_max: Option<u32>,
    /// The most tasks tracked at once (`[observer] max_tasks`).
    pub max_tasks: u32,
}

/// Entries per map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// `THROTTLE`, `RECLAIM` and `OOM`: cgroups with counters.
    pub cgroups: u32,
    /// `THROTTLED_TASKS` and `RECLAIM_START`: tasks throttled or in direct reclaim at once.
    pub tasks: u32,
}

/// Cgroups one pod can hold counters for: its pod cgroup, its sandbox and up to six containers
/// (init and sidecar containers included).
pub const CGROUPS_PER_POD: u32 = 8;
/// The node's cgroups outside pods: system slices, kubelet's quality-of-service levels, the runtime's own.
pub const NODE_CGROUPS: u32 = 256;
/// Free entries an LRU hash parks per CPU (`LOCAL_FREE_TARGET` in `kernel/bpf/bpf_lru_list.h`).
pub const LRU_LOCAL_FREE: u32 = 128;
/// kubelet's default `maxPods`.
pub const DEFAULT_MAX_PODS: u32 = 110;
/// Default of [`NodeFacts::max_tasks`]: the default `pid_max` of nodes with up to 32 CPUs, so
/// every task of such a node.
pub const DEFAULT_MAX_TASKS: u32 = 32_768;
/// The fewest entries a task map gets (a `pid_max` read as tiny is not trusted below it).
const MIN_TASKS: u32 = 1_024;

/// The entries of each map for a node.
#[must_use]
pub fn map_sizes(node: &NodeFacts) -> MapSizes {
    let cgroups = node
        .max_pods
        .saturating_mul(CGROUPS_PER_POD)
        .saturating_add(NODE_CGROUPS)
        .saturating_add(LRU_LOCAL_FREE.saturating_mul(node.possible_cpus.saturating_add(1)));
    let tasks = node
        .pid_max
        .map_or(node.max_tasks, |pids| node.max_tasks.min(pids))
        .max(MIN_TASKS);
    MapSizes { cgroups, tasks }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(max_pods: u32, possible_cpus: u32, pid_max: Option<u32>) -> NodeFacts {
        NodeFacts {
            max_pods,
            possible_cpus,
            pid_max,
            max_tasks: DEFAULT_MAX_TASKS,
        }
    }

    #[test]
    fn cgroup_maps_follow_the_pods_and_the_lru_room_per_cpu() {
        // 110 pods × 8 + 256 node cgroups + 128 × (2 + 1).
        assert_eq!(map_sizes(&node(110, 2, None)).cgroups, 880 + 256 + 384);
        // 128 possible CPUs: only the LRU's parked room grows, linearly.
        assert_eq!(map_sizes(&node(110, 128, None)).cgroups, 880 + 256 + 16_512);
        assert_eq!(
            map_sizes(&node(250, 128, None)).cgroups,
            2_000 + 256 + 16_512
        );
    }

    #[test]
    fn task_maps_never_exceed_the_nodes_pids() {
        assert_eq!(map_sizes(&node(110, 2, Some(4_194_304))).tasks, 32_768);
        assert_eq!(map_sizes(&node(110, 2, Some(16_384))).tasks, 16_384);
        assert_eq!(map_sizes(&node(110, 2, None)).tasks, 32_768);
        // A nonsense pid_max does not shrink the maps to nothing.
        assert_eq!(map_sizes(&node(110, 2, Some(1))).tasks, 1_024);
    }

    #[test]
    fn configured_max_tasks_caps_the_task_maps() {
        let mut n = node(110, 2, Some(4_194_304));
        n.max_tasks = 65_536;
        assert_eq!(map_sizes(&n).tasks, 65_536);
    }

    #[test]
    fn absurd_inputs_saturate_instead_of_wrapping() {
        let sizes = map_sizes(&node(u32::MAX, u32::MAX, None));
        assert_eq!(sizes.cgroups, u32::MAX);
    }
}
