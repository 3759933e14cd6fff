//! Types shared between the nri-resize eBPF programs (`ebpf/programs`, built for
//! `bpfel-unknown-none`) and the user-space observer (`plugin/src/observer`).
//!
//! Every type is `#[repr(C)]`, has no implicit padding (explicit `reserved` fields instead) and
//! uses `u32` flags rather than `bool`, so that both sides agree on the byte layout and every
//! bit pattern is a valid value (a requirement of `aya::Pod`).
#![no_std]

/// Map and global names, shared so the loader and the programs cannot drift apart.
pub mod names {
    /// Per-CPU hash `CgroupKey -> ThrottleCounters`, filled by the throttling programs.
    pub const THROTTLE_MAP: &str = "THROTTLE";
    /// Per-CPU hash `CgroupKey -> ReclaimCounters`, filled by the memcg programs.
    pub const RECLAIM_MAP: &str = "RECLAIM";
    /// Per-CPU hash `CgroupKey -> OomCounters`, filled by `oom/mark_victim`.
    pub const OOM_MAP: &str = "OOM";
    /// Hash `pid -> ThrottleStart` of tasks currently switched out throttled.
    pub const THROTTLED_TASKS_MAP: &str = "THROTTLED_TASKS";
    /// Array of `ThrottlePending`: one byte per pid, set while the pid is in `THROTTLED_TASKS`.
    /// Sized by user space to the kernel's `pid_max` at load.
    pub const THROTTLE_PENDING_MAP: &str = "THROTTLE_PENDING";
    /// Hash `pid -> ReclaimStart` of tasks currently in memcg direct reclaim.
    pub const RECLAIM_START_MAP: &str = "RECLAIM_START";
    /// Ring buffer of `CpuHotplugEvent`.
    pub const CPUHP_RING: &str = "CPUHP_EVENTS";
    /// Read-only global of type `ObserverConfig`.
    pub const CONFIG_GLOBAL: &str = "CONFIG";

    /// `tp_btf/sched_switch` program: counts throttling from `task_struct::throttled`.
    pub const PROG_SCHED_SWITCH: &str = "sched_switch";
    /// Empty `tp_btf/sched_switch` program, attached only by the benchmark (dispatch floor).
    pub const PROG_NOOP_SWITCH: &str = "noop_switch";
    /// `fentry/unthrottle_cfs_rq` program: counts throttling from the unthrottle path.
    pub const PROG_UNTHROTTLE: &str = "unthrottle_cfs_rq";
    /// `fexit/unthrottle_cfs_rq` program: the throttle's duration on the runqueue's clock.
    pub const PROG_UNTHROTTLE_EXIT: &str = "unthrottle_cfs_rq_exit";
    /// `tracepoint/memcg/count_memcg_events` program (the fallback of the `tp_btf` one).
    pub const PROG_MEMCG_EVENTS: &str = "count_memcg_events";
    /// `tp_btf/count_memcg_events` program: the same counts from the raw tracepoint, which
    /// skips filling the classic record on every event (every page fault of the node).
    pub const PROG_MEMCG_EVENTS_BTF: &str = "count_memcg_events_btf";
    /// `fexit/try_to_free_mem_cgroup_pages` programs: memcg-targeted reclaim (a lowered limit,
    /// `memory.high`, `memory.reclaim`) per target memcg, where the memcg tracepoint is missing.
    /// One per parameter count of the function (4, 5, 6: index = count - 4), since the return
    /// value's slot in the context follows the parameters.
    pub const PROG_MEMCG_RECLAIM_FEXIT: [&str; 3] = [
        "memcg_reclaim_fexit4",
        "memcg_reclaim_fexit5",
        "memcg_reclaim_fexit6",
    ];

    /// The `PROG_MEMCG_RECLAIM_FEXIT` program for a `try_to_free_mem_cgroup_pages` of `params`
    /// parameters; `None` for a count no program knows.
    #[must_use]
    pub fn memcg_reclaim_fexit(params: usize) -> Option<&'static str> {
        PROG_MEMCG_RECLAIM_FEXIT
            .get(params.checked_sub(4)?)
            .copied()
    }
    /// `tracepoint/vmscan/mm_vmscan_memcg_reclaim_begin` program.
    pub const PROG_RECLAIM_BEGIN: &str = "memcg_reclaim_begin";
    /// `tracepoint/vmscan/mm_vmscan_memcg_reclaim_end` program.
    pub const PROG_RECLAIM_END: &str = "memcg_reclaim_end";
    /// `tp_btf/mark_victim` program.
    pub const PROG_MARK_VICTIM: &str = "mark_victim";
    /// `tracepoint/cpuhp/cpuhp_enter` program.
    pub const PROG_CPUHP_ENTER: &str = "cpuhp_enter";
    /// `tracepoint/cpuhp/cpuhp_exit` program.
    pub const PROG_CPUHP_EXIT: &str = "cpuhp_exit";
}

/// Identifies one cgroup: on cgroup v1 each hierarchy has its own id space, so the id of the
/// hierarchy (as in `/proc/cgroups`) is part of the key; on cgroup v2 `hierarchy_id` is 0.
/// `cgroup_id` is the kernfs node id, equal to the inode number of the cgroup's directory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CgroupKey {
    pub hierarchy_id: u32,
    pub reserved: u32,
    pub cgroup_id: u64,
}

impl CgroupKey {
    #[must_use]
    pub const fn new(hierarchy_id: u32, cgroup_id: u64) -> Self {
        Self {
            hierarchy_id,
            reserved: 0,
            cgroup_id,
        }
    }
}

/// CFS bandwidth throttling of one cpu cgroup (one CPU's share of it, in a per-CPU map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrottleCounters {
    /// Number of times a task of the cgroup was switched out throttled (`tp_btf` strategy) or a
    /// runqueue of the cgroup was unthrottled (fentry strategy).
    pub throttled_count: u64,
    /// Nanoseconds spent throttled, summed over the tasks (`tp_btf`) or runqueues (fentry).
    pub throttled_ns: u64,
}

/// A task switched out throttled, waiting to run again.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThrottleStart {
    pub key: CgroupKey,
    pub since_ns: u64,
}

/// Pids per `ThrottlePending` array element.
pub const THROTTLE_PENDING_PIDS_PER_SLOT: u32 = 64;

/// One element of the `THROTTLE_PENDING` array: a byte per pid (`index * 64 + byte`), non-zero
/// while that pid was switched out throttled and has not run since. Bytes, not bits: each is
/// written whole by one CPU, so no atomic read-modify-write is needed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrottlePending {
    pub tasks: [u8; THROTTLE_PENDING_PIDS_PER_SLOT as usize],
}

impl Default for ThrottlePending {
    fn default() -> Self {
        Self {
            tasks: [0; THROTTLE_PENDING_PIDS_PER_SLOT as usize],
        }
    }
}

/// Number of memcg event slots counted per cgroup. The event numbers
/// (`enum vm_event_item`) of the slots are resolved from BTF at load time and passed in
/// `ObserverConfig::reclaim_items`.
pub const RECLAIM_SLOTS: usize = 6;

/// The memcg events counted, in slot order: reclaim's scans and steals only. (`PGPGIN` and
/// `PGPGOUT`, counted here before, are events of every page charge and uncharge: nothing read
/// them but the status API.)
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReclaimSlot {
    PgscanKswapd = 0,
    PgscanDirect = 1,
    PgscanKhugepaged = 2,
    PgstealKswapd = 3,
    PgstealDirect = 4,
    PgstealKhugepaged = 5,
}

impl ReclaimSlot {
    /// All slots, in slot order.
    pub const ALL: [Self; RECLAIM_SLOTS] = [
        Self::PgscanKswapd,
        Self::PgscanDirect,
        Self::PgscanKhugepaged,
        Self::PgstealKswapd,
        Self::PgstealDirect,
        Self::PgstealKhugepaged,
    ];

    /// The enumerator's name in the kernel's `enum vm_event_item`.
    #[must_use]
    pub const fn kernel_name(self) -> &'static str {
        match self {
            Self::PgscanKswapd => "PGSCAN_KSWAPD",
            Self::PgscanDirect => "PGSCAN_DIRECT",
            Self::PgscanKhugepaged => "PGSCAN_KHUGEPAGED",
            Self::PgstealKswapd => "PGSTEAL_KSWAPD",
            Self::PgstealDirect => "PGSTEAL_DIRECT",
            Self::PgstealKhugepaged => "PGSTEAL_KHUGEPAGED",
        }
    }
}

/// Memory reclaim of one memcg (one CPU's share of it, in a per-CPU map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclaimCounters {
    /// Pages per `ReclaimSlot`.
    pub events: [u64; RECLAIM_SLOTS],
    /// Number of memcg direct reclaim passes (`mm_vmscan_memcg_reclaim_end`) by tasks of the memcg.
    pub direct_reclaim_count: u64,
    /// Nanoseconds those tasks spent in memcg direct reclaim.
    pub direct_reclaim_ns: u64,
    /// Pages those reclaim passes reclaimed.
    pub direct_reclaimed_pages: u64,
    /// Calls of `try_to_free_mem_cgroup_pages` that targeted this memcg (`fexit` strategy):
    /// reclaim to bring it under a limit it was lowered to, its `memory.high`, or a
    /// `memory.reclaim` request, whichever task ran it.
    pub memcg_reclaim_calls: u64,
    /// Pages those calls reclaimed (their return values), from the memcg and its descendants.
    pub memcg_reclaimed_pages: u64,
}

/// A task in memcg direct reclaim.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclaimStart {
    pub key: CgroupKey,
    pub since_ns: u64,
}

/// OOM kills whose victim belonged to one memcg.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomCounters {
    pub kills: u64,
    /// Thread group id of the most recent victim (0 if none).
    pub last_victim_tgid: u32,
    pub reserved: u32,
}

/// `CpuHotplugEvent::kind` values.
pub const CPUHP_ENTER: u32 = 0;
pub const CPUHP_EXIT: u32 = 1;

/// One step of a CPU hotplug state machine transition, pushed through `CPUHP_EVENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuHotplugEvent {
    pub timestamp_ns: u64,
    pub cpu: u32,
    /// `CPUHP_ENTER` or `CPUHP_EXIT`.
    pub kind: u32,
    /// Enter: the target state; exit: the state reached.
    pub state: i32,
    /// The step (`enum cpuhp_state` index).
    pub idx: i32,
    /// Exit: the callback's return value; enter: 0.
    pub ret: i32,
    pub reserved: u32,
}

/// Byte offsets of the fields of a classic tracepoint record, as read from tracefs `format`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgEventsLayout {
    /// Offset of `u64 id` (the memcg's cgroup id).
    pub id: u32,
    /// Offset of `int item` (an `enum vm_event_item`).
    pub item: u32,
    /// Offset of `unsigned long val`.
    pub val: u32,
    pub reserved: u32,
}

/// Configuration resolved by user space from the running kernel (BTF, tracefs, /proc/cgroups)
/// and written into the read-only global `CONFIG` before loading. Rust eBPF has no CO-RE: every
/// kernel struct offset the programs use comes from here, never from build time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObserverConfig {
    /// Non-zero once user space filled the struct; programs do nothing while it is 0.
    pub configured: u32,
    /// Byte offset of `task_struct::throttled`.
    pub task_throttled: u32,
    /// Mask applied to the byte at `task_throttled` (0xff for a `bool`, a single bit for a bitfield).
    pub task_throttled_mask: u32,
    /// Byte offset of `task_struct::pid` (thread id, i32).
    pub task_pid: u32,
    /// Byte offset of `task_struct::tgid` (process id, i32).
    pub task_tgid: u32,
    /// Byte offset of `task_struct::cgroups` (`struct css_set *`).
    pub task_cgroups: u32,
    /// Byte offset of `css_set::subsys` (array of `struct cgroup_subsys_state *`).
    pub css_set_subsys: u32,
    /// Byte offset of `cgroup_subsys_state::cgroup`.
    pub css_cgroup: u32,
    /// Byte offset of `cgroup::kn`.
    pub cgroup_kn: u32,
    /// Byte offset of `kernfs_node::id` (u64).
    pub kernfs_node_id: u32,
    /// `cpu_cgrp_id` in `enum cgroup_subsys_id`.
    pub cpu_subsys: u32,
    /// `memory_cgrp_id` in `enum cgroup_subsys_id`.
    pub memory_subsys: u32,
    /// Hierarchy id of the cpu controller (`/proc/cgroups`; 0 on cgroup v2).
    pub cpu_hierarchy: u32,
    /// Hierarchy id of the memory controller (`/proc/cgroups`; 0 on cgroup v2).
    pub memory_hierarchy: u32,
    /// Byte offset of `cfs_rq::tg` (`struct task_group *`), for the fentry strategy.
    pub cfs_rq_tg: u32,
    /// Byte offset of `task_group::css`.
    pub task_group_css: u32,
    /// Byte offset of `mem_cgroup::css`, for the `tp_btf/count_memcg_events` program.
    pub memcg_css: u32,
    /// Byte offset of `cfs_rq::throttled_clock` (u64), for the fentry strategy; `NO_FIELD` if absent.
    pub cfs_rq_throttled_clock: u32,
    /// Byte offset of `cfs_rq::rq` (`struct rq *`), for the fentry strategy's durations;
    /// `NO_FIELD` if absent.
    pub cfs_rq_rq: u32,
    /// Byte offset of `rq::clock` (u64, the runqueue's clock `throttled_clock` is taken from);
    /// `NO_FIELD` if absent.
    pub rq_clock: u32,
    /// Layout of the `memcg/count_memcg_events` record.
    pub memcg_events: MemcgEventsLayout,
    /// `enum vm_event_item` value of each `ReclaimSlot`; `NO_ITEM` for events this kernel lacks.
    pub reclaim_items: [u32; RECLAIM_SLOTS],
    /// Byte offset of `nr_reclaimed` in the `vmscan/mm_vmscan_memcg_reclaim_end` record.
    pub reclaim_end_nr_reclaimed: u32,
    /// Layout of the `cpuhp/cpuhp_enter` record (`state` is the `target` field, `ret` unused).
    pub cpuhp_enter: CpuhpLayout,
    /// Layout of the `cpuhp/cpuhp_exit` record.
    pub cpuhp_exit: CpuhpLayout,
    /// Number of parameters of `try_to_free_mem_cgroup_pages` on the running kernel (4 on 6.1,
    /// 5 on 6.12): which `fexit` program user space loads. 0 where the function is not traced.
    pub memcg_reclaim_params: u32,
}

impl ObserverConfig {
    /// The value compiled into the object; the programs do nothing until user space replaces it.
    pub const UNCONFIGURED: Self = Self {
        configured: 0,
        task_throttled: 0,
        task_throttled_mask: 0,
        task_pid: 0,
        task_tgid: 0,
        task_cgroups: 0,
        css_set_subsys: 0,
        css_cgroup: 0,
        cgroup_kn: 0,
        kernfs_node_id: 0,
        cpu_subsys: 0,
        memory_subsys: 0,
        cpu_hierarchy: 0,
        memory_hierarchy: 0,
        cfs_rq_tg: 0,
        task_group_css: 0,
        memcg_css: 0,
        cfs_rq_throttled_clock: NO_FIELD,
        cfs_rq_rq: NO_FIELD,
        rq_clock: NO_FIELD,
        memcg_events: MemcgEventsLayout {
            id: 0,
            item: 0,
            val: 0,
            reserved: 0,
        },
        reclaim_items: [NO_ITEM; RECLAIM_SLOTS],
        reclaim_end_nr_reclaimed: 0,
        cpuhp_enter: CpuhpLayout {
            cpu: 0,
            state: 0,
            idx: 0,
            ret: NO_FIELD,
        },
        cpuhp_exit: CpuhpLayout {
            cpu: 0,
            state: 0,
            idx: 0,
            ret: NO_FIELD,
        },
        memcg_reclaim_params: 0,
    };
}

/// Byte offsets of the fields of a `cpuhp/cpuhp_{enter,exit}` record, from tracefs `format`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuhpLayout {
    pub cpu: u32,
    pub state: u32,
    pub idx: u32,
    /// `NO_FIELD` when the record has no such field.
    pub ret: u32,
}

/// An offset for a field the running kernel does not have.
pub const NO_FIELD: u32 = u32::MAX;

/// `ObserverConfig::reclaim_items` value of an event the running kernel does not have.
pub const NO_ITEM: u32 = u32::MAX;

#[cfg(feature = "user")]
mod pod {
    // SAFETY (for every impl below): the types are `#[repr(C)]`, `Copy`, contain only integers
    // and arrays of integers, and have no implicit padding (checked by the size assertions), so
    // every bit pattern is a valid value.
    #![expect(unsafe_code, reason = "aya::Pod is an unsafe marker trait")]

    use super::{
        CgroupKey, CpuHotplugEvent, CpuhpLayout, MemcgEventsLayout, ObserverConfig, OomCounters,
        ReclaimCounters, ReclaimStart, ThrottleCounters, ThrottlePending, ThrottleStart,
    };

    unsafe impl aya::Pod for CgroupKey {}
    unsafe impl aya::Pod for ThrottleCounters {}
    unsafe impl aya::Pod for ThrottleStart {}
    unsafe impl aya::Pod for ThrottlePending {}
    unsafe impl aya::Pod for ReclaimCounters {}
    unsafe impl aya::Pod for ReclaimStart {}
    unsafe impl aya::Pod for OomCounters {}
    unsafe impl aya::Pod for CpuHotplugEvent {}
    unsafe impl aya::Pod for MemcgEventsLayout {}
    unsafe impl aya::Pod for ObserverConfig {}
    unsafe impl aya::Pod for CpuhpLayout {}
}

// No implicit padding: each size is the sum of the field sizes.
const _: () = assert!(core::mem::size_of::<CgroupKey>() == 16);
const _: () = assert!(core::mem::size_of::<ThrottleCounters>() == 16);
const _: () = assert!(core::mem::size_of::<ThrottleStart>() == 24);
const _: () =
    assert!(core::mem::size_of::<ThrottlePending>() == THROTTLE_PENDING_PIDS_PER_SLOT as usize);
const _: () = assert!(core::mem::size_of::<ReclaimCounters>() == 8 * (RECLAIM_SLOTS + 5));
const _: () = assert!(core::mem::size_of::<ReclaimStart>() == 24);
const _: () = assert!(core::mem::size_of::<OomCounters>() == 16);
const _: () = assert!(core::mem::size_of::<CpuHotplugEvent>() == 32);
const _: () = assert!(core::mem::size_of::<MemcgEventsLayout>() == 16);
const _: () = assert!(core::mem::size_of::<CpuhpLayout>() == 16);
const _: () =
    assert!(core::mem::size_of::<ObserverConfig>() == 4 * (20 + 4 + RECLAIM_SLOTS + 1 + 4 + 4 + 1));
