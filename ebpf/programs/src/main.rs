//! Kernel side of the nri-resize resource observer.
//!
//! Every counter is keyed by `CgroupKey` (hierarchy id + cgroup id) and kept in one shared
//! LRU hash per measurement, added to with the BPF atomic add (`lock *(u64 *)(p) += v`, the
//! XADD every supported kernel has, 5.10 included). Per-CPU maps would need no atomics, but the
//! kernel preallocates each of their entries once per *possible* CPU: 276 MiB of maps on a
//! node with 128 possible CPUs (issue 37), above the daemon's memory limit. User space sizes
//! every map from the node (`plugin/src/observer/map_sizes.rs`) before load.
//!
//! Rust eBPF has no CO-RE: no struct offset is compiled in. User space resolves every offset from
//! the running kernel's BTF (`/sys/kernel/btf/vmlinux`) and tracefs `format` files and writes
//! them into the read-only global `CONFIG` before loading. Kernel memory is only ever read with
//! `bpf_probe_read_kernel`, so a wrong offset yields a wrong number, never a crash.
//!
//! Each program is a thin entry that calls a `try_*` function returning `Result`; errors are
//! reported through aya-log and the program returns 0. Nothing here panics.
//!
//! # Unsafe
//! `unsafe` is unavoidable in this crate: BPF helpers (`bpf_probe_read_kernel`,
//! `bpf_ktime_get_ns`), raw map value pointers and tracepoint record reads are `unsafe fn`s.
//! Every kernel pointer is only passed to `bpf_probe_read_kernel` (which checks it); map value
//! pointers come from successful lookups; shared counters are only changed through
//! [`atomic_add`], and the per-CPU slot `UNTHROTTLE_SINCE` by its own CPU only.
#![no_std]
#![no_main]
// `asm!` on the BPF target (the atomic add): unlocked for this crate by
// `RUSTC_BOOTSTRAP=aya_ebpf,nri_resize_ebpf` (xtask/src/ebpf.rs), as aya-ebpf's own.
#![expect(unstable_features, reason = "asm! on the BPF target is unstable")]
#![feature(asm_experimental_arch)]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, fentry, fexit, map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, FEntryContext, FExitContext, TracePointContext},
    EbpfContext, Global,
};
use aya_log_ebpf::warn;
use nri_resize_ebpf_common::{
    CgroupKey, CpuHotplugEvent, CpuhpLayout, ObserverConfig, OomCounters, ReclaimCounters,
    ReclaimStart, ThrottleCounters, ThrottlePending, ThrottleStart, CPUHP_ENTER, CPUHP_EXIT,
    NO_FIELD, NO_ITEM, RECLAIM_SLOTS, THROTTLE_PENDING_PIDS_PER_SLOT,
};

/// Offsets and enum values of the running kernel, written by user space before load.
#[unsafe(no_mangle)]
static CONFIG: Global<ObserverConfig> = Global::new(ObserverConfig::UNCONFIGURED);

/// Cgroups tracked per map as built; least recently updated entries go first. User space
/// replaces it at load with a size derived from the node (`map_sizes.rs`).
const MAX_CGROUPS: u32 = 16_384;
/// Tasks concurrently throttled or in direct reclaim, as built; replaced at load likewise.
const MAX_TASKS: u32 = 65_536;

#[map(name = "THROTTLE")]
static THROTTLE: LruHashMap<CgroupKey, ThrottleCounters> =
    LruHashMap::with_max_entries(MAX_CGROUPS, 0);

#[map(name = "THROTTLED_TASKS")]
static THROTTLED_TASKS: HashMap<u32, ThrottleStart> = HashMap::with_max_entries(MAX_TASKS, 0);

/// One byte per pid: non-zero while the pid has an entry in `THROTTLED_TASKS`. A flat array
/// (the verifier inlines its lookups: no helper call) so that `sched_switch` can tell in a few
/// instructions that `next` has no throttle pending, which is almost always the case. Sized for
/// `PID_MAX_LIMIT` (4 Mi pids, 4 MiB) here; user space shrinks it to the running kernel's
/// `kernel.pid_max` at load. A pid beyond the array takes the hash lookup.
#[map(name = "THROTTLE_PENDING")]
static THROTTLE_PENDING: Array<ThrottlePending> =
    Array::with_max_entries((1 << 22) / THROTTLE_PENDING_PIDS_PER_SLOT, 0);

/// `cfs_rq->throttled_clock` as `fentry/unthrottle_cfs_rq` found it, for its `fexit` on the
/// same CPU (the runqueue's lock is held across the call: nothing else runs between them there).
#[map(name = "UNTHROTTLE_SINCE")]
static UNTHROTTLE_SINCE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "RECLAIM")]
static RECLAIM: LruHashMap<CgroupKey, ReclaimCounters> =
    LruHashMap::with_max_entries(MAX_CGROUPS, 0);

#[map(name = "RECLAIM_START")]
static RECLAIM_START: HashMap<u32, ReclaimStart> = HashMap::with_max_entries(MAX_TASKS, 0);

#[map(name = "OOM")]
static OOM: LruHashMap<CgroupKey, OomCounters> = LruHashMap::with_max_entries(MAX_CGROUPS, 0);

#[map(name = "CPUHP_EVENTS")]
static CPUHP_EVENTS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Why a program gave up on one event.
#[derive(Clone, Copy)]
enum Error {
    /// `CONFIG` was not filled in by user space.
    Unconfigured,
    /// `bpf_probe_read_kernel` failed (errno).
    Read(i32),
    /// A map update failed (errno).
    Map(i32),
}

impl Error {
    fn code(self) -> i32 {
        match self {
            Error::Unconfigured => 0,
            Error::Read(e) | Error::Map(e) => e,
        }
    }
}

/// One field of `CONFIG`, read on its own (a single load, not a copy of the whole struct).
///
/// `CONFIG` is in `.rodata`, which the loader freezes: the verifier then knows every value read
/// from it as a constant, folds offsets into the instructions that use them and drops the
/// branches a constant decides. The volatile read only keeps the compiler from folding in the
/// build-time `UNCONFIGURED` value.
macro_rules! conf {
    ($field:ident) => {
        // SAFETY: `Global<T>` is `repr(transparent)` over `MaybeUninit<T>`, itself transparent
        // over an always-initialised `T`; the field pointer stays inside the static.
        unsafe {
            core::ptr::read_volatile(core::ptr::addr_of!(
                (*core::ptr::addr_of!(CONFIG).cast::<ObserverConfig>()).$field
            ))
        }
    };
}

fn config() -> Result<ObserverConfig, Error> {
    if conf!(configured) == 0 {
        return Err(Error::Unconfigured);
    }
    Ok(CONFIG.load())
}

/// Reads a `T` at `base + offset` of kernel memory.
#[inline(always)]
fn read<T>(base: u64, offset: u32) -> Result<T, Error> {
    // SAFETY: `bpf_probe_read_kernel` validates the address and fails cleanly on a bad one.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T) }
        .map_err(|e| Error::Read(e as i32))
}

/// The cgroup of `task` in the hierarchy of controller `subsys`:
/// `task->cgroups->subsys[subsys]->cgroup->kn->id`.
#[inline(always)]
fn task_cgroup(
    cfg: &ObserverConfig,
    task: u64,
    subsys: u32,
    hierarchy: u32,
) -> Result<CgroupKey, Error> {
    let css_set: u64 = read(task, cfg.task_cgroups)?;
    let css: u64 = read(css_set, cfg.css_set_subsys + 8 * subsys)?;
    css_cgroup(cfg, css, hierarchy)
}

/// The cgroup of a `cgroup_subsys_state`: `css->cgroup->kn->id`.
#[inline(always)]
fn css_cgroup(cfg: &ObserverConfig, css: u64, hierarchy: u32) -> Result<CgroupKey, Error> {
    let cgroup: u64 = read(css, cfg.css_cgroup)?;
    let kn: u64 = read(cgroup, cfg.cgroup_kn)?;
    let id: u64 = read(kn, cfg.kernfs_node_id)?;
    Ok(CgroupKey::new(hierarchy, id))
}

/// Adds `v` to the `u64` at `p` atomically: `BPF_STX | BPF_ATOMIC | BPF_DW` with `BPF_ADD` and
/// no fetch, the XADD instruction that every supported kernel (5.10 and newer) verifies on a map
/// value. Written out, not left to LLVM: the target has no atomics in `core`, and a fetching
/// add (what a used result compiles to) needs 5.12.
///
/// # Safety
/// `p` must point into a map value (or this program's stack) and be 8-byte aligned.
#[inline(always)]
unsafe fn atomic_add(p: *mut u64, v: u64) {
    // SAFETY: per the contract; the verifier checks the access against the value's bounds.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({p} + 0) += {v}",
            p = in(reg) p,
            v = in(reg) v,
            options(nostack),
        );
    }
}

/// Applies `update` to the shared value of `key`, creating a zeroed value first if needed.
/// `update` gets a raw pointer to the value and must change counters only with
/// [`atomic_add`]: programs on other CPUs update the same value concurrently.
#[inline(always)]
fn update_counters<V: Default>(
    map: &LruHashMap<CgroupKey, V>,
    key: &CgroupKey,
    update: impl Fn(*mut V),
) -> Result<(), Error> {
    if let Some(value) = map.get_ptr_mut(key) {
        update(value);
        return Ok(());
    }
    let mut value = V::default();
    update(&raw mut value);
    match map.insert(key, &value, u64::from(BPF_NOEXIST)) {
        Ok(()) => Ok(()),
        // Another CPU created the entry since the lookup: add to it in place.
        Err(_) => match map.get_ptr_mut(key) {
            Some(existing) => {
                update(existing);
                Ok(())
            }
            None => Err(Error::Map(-1)),
        },
    }
}

/// `add!(value, field, v)`: adds `v` to the `u64` counter `field` of the value at `value` (a map
/// value or its stack copy, from [`update_counters`]) with [`atomic_add`].
macro_rules! add {
    ($value:expr, $field:ident, $v:expr) => {
        // SAFETY: `$value` comes from `update_counters` (a map value from a successful lookup
        // or a stack copy) and `$field` is a `u64` field, 8-byte aligned in these
        // `#[repr(C)]` structs.
        unsafe { atomic_add(&raw mut (*$value).$field, $v) }
    };
}

/// Adds `val` pages to `slot` of a `ReclaimCounters`.
#[inline(always)]
fn add_event(c: *mut ReclaimCounters, slot: usize, val: u64) {
    if slot < RECLAIM_SLOTS {
        // SAFETY: `c` as in `add!`; `slot` is checked against the array's length just above.
        unsafe { atomic_add((&raw mut (*c).events).cast::<u64>().add(slot), val) };
    }
}

fn now() -> u64 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

// ---------------------------------------------------------------------------------------------
// 1. CFS bandwidth throttling

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...)`.
/// Since the task-based throttle model (6.18), a throttled task has `task_struct::throttled`
/// set when it is switched out; it runs again only after being unthrottled.
///
/// This runs on every context switch of the machine, so the common case — `prev` not throttled,
/// `next` not coming back from a throttle — is a handful of instructions: two direct loads
/// through the BTF-typed task pointers (the verifier turns them into fault-safe loads; the
/// offsets are constants from the frozen `CONFIG`), one inlined array lookup and no helper call.
/// The clock, the cgroup walk and the hash maps are touched only when there is a throttle to
/// count.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> u32 {
    if conf!(configured) == 0 {
        return 0;
    }
    let prev: *const u8 = ctx.arg(1);
    let next: *const u8 = ctx.arg(2);
    // SAFETY: `prev` is the BTF-typed `struct task_struct *` of this tracepoint and
    // `task_throttled` is a `task_struct` field offset from the running kernel's BTF; the
    // verifier checks the access against BTF and makes the load fault-safe.
    let throttled_at = conf!(task_throttled) as usize;
    let throttled = unsafe { *prev.add(throttled_at) };
    if u32::from(throttled) & conf!(task_throttled_mask) != 0 {
        if let Err(e) = switched_out_throttled(prev as u64) {
            warn!(&ctx, "sched_switch: error {}", e.code());
        }
    }
    let pid_at = conf!(task_pid) as usize;
    // SAFETY: as above, for `task_struct::pid` (an `i32`) of `next`.
    let next_pid = unsafe { *next.add(pid_at).cast::<u32>() };
    if throttle_pending(next_pid) {
        if let Err(e) = switched_in_after_throttle(next_pid) {
            warn!(&ctx, "sched_switch: error {}", e.code());
        }
    }
    0
}

/// An empty `tp_btf/sched_switch` program, never attached by the observer: the benchmark
/// attaches it to measure what the tracepoint's BPF dispatch costs by itself (the floor under
/// `sched_switch`'s per-event cost).
#[btf_tracepoint(function = "sched_switch")]
pub fn noop_switch(_ctx: BtfTracePointContext) -> u32 {
    0
}

/// Where `pid`'s byte is in `THROTTLE_PENDING`.
#[inline(always)]
fn pending_slot(pid: u32) -> (u32, usize) {
    (
        pid / THROTTLE_PENDING_PIDS_PER_SLOT,
        (pid % THROTTLE_PENDING_PIDS_PER_SLOT) as usize,
    )
}

/// Whether `pid` may have an entry in `THROTTLED_TASKS` (true for a pid beyond the array).
#[inline(always)]
fn throttle_pending(pid: u32) -> bool {
    let (index, byte) = pending_slot(pid);
    match THROTTLE_PENDING.get(index) {
        Some(slot) => slot.tasks.get(byte).is_some_and(|b| *b != 0),
        None => true,
    }
}

/// Sets or clears `pid`'s byte. Bytes are written whole, by one CPU at a time per pid (a task
/// is switched out or in under its runqueue lock), so neighbours never race.
#[inline(always)]
fn set_pending(pid: u32, pending: bool) {
    let (index, byte) = pending_slot(pid);
    if let Some(slot) = THROTTLE_PENDING.get_ptr_mut(index) {
        // SAFETY: an array value from a successful lookup; see above for concurrency.
        if let Some(b) = unsafe { (*slot).tasks.get_mut(byte) } {
            *b = u8::from(pending);
        }
    }
}

/// `prev` is being switched out throttled: count it and remember when.
#[inline(never)]
fn switched_out_throttled(prev: u64) -> Result<(), Error> {
    let cfg = config()?;
    let key = task_cgroup(&cfg, prev, cfg.cpu_subsys, cfg.cpu_hierarchy)?;
    let pid: u32 = read(prev, cfg.task_pid)?;
    update_counters(&THROTTLE, &key, |c| add!(c, throttled_count, 1))?;
    THROTTLED_TASKS
        .insert(
            pid,
            ThrottleStart {
                key,
                since_ns: now(),
            },
            0,
        )
        .map_err(|e| Error::Map(e as i32))?;
    set_pending(pid, true);
    Ok(())
}

/// `next` was switched out throttled and runs again: add the time it was held back.
#[inline(never)]
fn switched_in_after_throttle(pid: u32) -> Result<(), Error> {
    // SAFETY: copied out at once; a concurrent delete can at worst make us read a stale start.
    let Some(start) = unsafe { THROTTLED_TASKS.get(pid) }.copied() else {
        return Ok(());
    };
    let _ = THROTTLED_TASKS.remove(pid);
    set_pending(pid, false);
    let now = now();
    let throttled_ns = now.saturating_sub(start.since_ns);
    update_counters(&THROTTLE, &start.key, |c| {
        add!(c, throttled_ns, throttled_ns);
    })
}

/// `unthrottle_cfs_rq(struct cfs_rq *cfs_rq)`: one call per runqueue throttle period ended,
/// for kernels that allow BPF trampolines (refused on some hardened kernels: user space falls
/// back to `sched_switch`, then to `cpu.stat` polling).
#[fentry(function = "unthrottle_cfs_rq")]
pub fn unthrottle_cfs_rq(ctx: FEntryContext) -> u32 {
    if let Err(e) = try_unthrottle_cfs_rq(&ctx) {
        if !matches!(e, Error::Unconfigured) {
            warn!(&ctx, "unthrottle_cfs_rq: error {}", e.code());
        }
    }
    0
}

fn try_unthrottle_cfs_rq(ctx: &FEntryContext) -> Result<(), Error> {
    let cfg = config()?;
    let cfs_rq: u64 = ctx.arg(0);
    // The throttle began at `throttled_clock` (the runqueue's clock); its end is measured in the
    // `fexit` below, on the same clock, once the function has updated it.
    let since: u64 = if cfg.cfs_rq_throttled_clock == NO_FIELD {
        0
    } else {
        read(cfs_rq, cfg.cfs_rq_throttled_clock)?
    };
    if let Some(slot) = UNTHROTTLE_SINCE.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array, written by this CPU only.
        unsafe { *slot = since };
    }
    let tg: u64 = read(cfs_rq, cfg.cfs_rq_tg)?;
    let key = css_cgroup(&cfg, tg + u64::from(cfg.task_group_css), cfg.cpu_hierarchy)?;
    update_counters(&THROTTLE, &key, |c| add!(c, throttled_count, 1))
}

/// `fexit/unthrottle_cfs_rq`: the throttle's duration, `rq_clock(rq) - throttled_clock` as the
/// kernel itself adds it to `cpu.stat`'s `throttled_usec` (the function updates the runqueue's
/// clock first). Where the kernel's BTF lacks `cfs_rq::rq` or `rq::clock`, `bpf_ktime_get_ns`
/// stands in: close to the runqueue's clock on x86, not on arm64 (every duration was 0 there).
#[fexit(function = "unthrottle_cfs_rq")]
pub fn unthrottle_cfs_rq_exit(ctx: FExitContext) -> u32 {
    if let Err(e) = try_unthrottle_cfs_rq_exit(&ctx) {
        if !matches!(e, Error::Unconfigured) {
            warn!(&ctx, "unthrottle_cfs_rq_exit: error {}", e.code());
        }
    }
    0
}

fn try_unthrottle_cfs_rq_exit(ctx: &FExitContext) -> Result<(), Error> {
    let cfg = config()?;
    let cfs_rq: u64 = ctx.arg(0);
    let Some(slot) = UNTHROTTLE_SINCE.get_ptr_mut(0) else {
        return Ok(());
    };
    // SAFETY: this CPU's slot of a per-CPU array, written by this CPU only.
    let since = unsafe { core::mem::replace(&mut *slot, 0) };
    if since == 0 {
        return Ok(());
    }
    let end = if cfg.cfs_rq_rq == NO_FIELD || cfg.rq_clock == NO_FIELD {
        now()
    } else {
        let rq: u64 = read(cfs_rq, cfg.cfs_rq_rq)?;
        read(rq, cfg.rq_clock)?
    };
    let throttled_ns = end.saturating_sub(since);
    let tg: u64 = read(cfs_rq, cfg.cfs_rq_tg)?;
    let key = css_cgroup(&cfg, tg + u64::from(cfg.task_group_css), cfg.cpu_hierarchy)?;
    update_counters(&THROTTLE, &key, |c| {
        add!(c, throttled_ns, throttled_ns);
    })
}

// ---------------------------------------------------------------------------------------------
// 2. Memory reclaim

/// `memcg/count_memcg_events(memcg, item, val)`: the record carries the memcg's cgroup id.
/// This tracepoint fires on every page fault and charge of the node: user space loads this
/// program (or the `tp_btf` one below) at start and attaches it only while nri-resize itself
/// reclaims (a memory decrease, trimming), on cgroup v1 only.
#[tracepoint(category = "memcg", name = "count_memcg_events")]
pub fn count_memcg_events(ctx: TracePointContext) -> u32 {
    if let Err(e) = try_count_memcg_events(&ctx) {
        if !matches!(e, Error::Unconfigured) {
            warn!(&ctx, "count_memcg_events: error {}", e.code());
        }
    }
    0
}

fn try_count_memcg_events(ctx: &TracePointContext) -> Result<(), Error> {
    // Fires for every memcg event (page faults included): read only the fields it needs.
    if conf!(configured) == 0 {
        return Err(Error::Unconfigured);
    }
    let layout = conf!(memcg_events);
    // SAFETY: offsets come from this tracepoint's tracefs `format`; reads are checked.
    let item: i32 = unsafe { ctx.read_at(layout.item as usize) }.map_err(Error::Read)?;
    let Some(slot) = reclaim_slot(item as u32) else {
        return Ok(());
    };
    // SAFETY: as above.
    let id: u64 = unsafe { ctx.read_at(layout.id as usize) }.map_err(Error::Read)?;
    // SAFETY: as above.
    let val: u64 = unsafe { ctx.read_at(layout.val as usize) }.map_err(Error::Read)?;
    let key = CgroupKey::new(conf!(memory_hierarchy), id);
    update_counters(&RECLAIM, &key, |c| add_event(c, slot, val))
}

/// The `ReclaimSlot` a memcg event `item` counts in, or `None` for the events that do not count
/// (nearly all of them: page faults).
#[inline(always)]
fn reclaim_slot(item: u32) -> Option<usize> {
    let items = conf!(reclaim_items);
    items
        .iter()
        .position(|wanted| *wanted != NO_ITEM && *wanted == item)
}

/// `tp_btf/count_memcg_events(struct mem_cgroup *memcg, int item, unsigned long val)`: the same
/// counts as [`count_memcg_events`] from the raw tracepoint. This fires on every page fault of
/// the node, and a classic tracepoint fills its record (the memcg's cgroup id included) before
/// any program can look at it: ~0.3-0.5 µs a fault on this project's host. Here the common case
/// — an item that is not a reclaim event — is a compare on an argument register; the cgroup id
/// is read only for the few events that count.
#[btf_tracepoint(function = "count_memcg_events")]
pub fn count_memcg_events_btf(ctx: BtfTracePointContext) -> u32 {
    if conf!(configured) == 0 {
        return 0;
    }
    let item: u64 = ctx.arg(1);
    let Some(slot) = reclaim_slot(item as u32) else {
        return 0;
    };
    let memcg: u64 = ctx.arg(0);
    let val: u64 = ctx.arg(2);
    let counted = css_cgroup_of(memcg + u64::from(conf!(memcg_css)))
        .and_then(|key| update_counters(&RECLAIM, &key, |c| add_event(c, slot, val)));
    if let Err(e) = counted {
        warn!(&ctx, "count_memcg_events_btf: error {}", e.code());
    }
    0
}

/// The memory hierarchy's key of a memcg's `cgroup_subsys_state`.
#[inline(always)]
fn css_cgroup_of(css: u64) -> Result<CgroupKey, Error> {
    let cfg = config()?;
    css_cgroup(&cfg, css, cfg.memory_hierarchy)
}

/// `fexit/try_to_free_mem_cgroup_pages(struct mem_cgroup *memcg, unsigned long nr_pages, ...)`:
/// every reclaim aimed at one memcg — to bring it under a limit that was lowered, over its
/// `memory.high`, or for a `memory.reclaim` request — returns here with the pages it reclaimed.
/// The reclaim a resize causes, counted against the memcg it targeted, on the kernels without
/// the `memcg/count_memcg_events` tracepoint (before 6.14) that allow BPF trampolines.
///
/// The return value follows the parameters in an fexit context, and their number changed
/// (4 on 6.1, 5 on 6.12): one program per count, each reading a constant slot (the verifier
/// refuses a context read at a computed offset, which is what one program with a `match` on
/// the count compiles to). User space loads the one the kernel's BTF calls for.
macro_rules! memcg_reclaim_fexit {
    ($name:ident, $params:literal) => {
        #[fexit(function = "try_to_free_mem_cgroup_pages")]
        pub fn $name(ctx: FExitContext) -> u32 {
            let reclaimed: u64 = ctx.arg($params);
            if let Err(e) = memcg_reclaimed(ctx.arg(0), reclaimed) {
                if !matches!(e, Error::Unconfigured) {
                    warn!(&ctx, "memcg_reclaim_fexit: error {}", e.code());
                }
            }
            0
        }
    };
}
memcg_reclaim_fexit!(memcg_reclaim_fexit4, 4);
memcg_reclaim_fexit!(memcg_reclaim_fexit5, 5);
memcg_reclaim_fexit!(memcg_reclaim_fexit6, 6);

/// One `try_to_free_mem_cgroup_pages` call on `memcg` returned `reclaimed` pages.
#[inline(always)]
fn memcg_reclaimed(memcg: u64, reclaimed: u64) -> Result<(), Error> {
    let key = css_cgroup_of(memcg + u64::from(conf!(memcg_css)))?;
    update_counters(&RECLAIM, &key, |c| {
        add!(c, memcg_reclaim_calls, 1);
        add!(c, memcg_reclaimed_pages, reclaimed);
    })
}

/// `vmscan/mm_vmscan_memcg_reclaim_begin`: the current task enters memcg direct reclaim.
#[tracepoint(category = "vmscan", name = "mm_vmscan_memcg_reclaim_begin")]
pub fn memcg_reclaim_begin(ctx: TracePointContext) -> u32 {
    if let Err(e) = try_memcg_reclaim_begin() {
        if !matches!(e, Error::Unconfigured) {
            warn!(&ctx, "memcg_reclaim_begin: error {}", e.code());
        }
    }
    0
}

fn try_memcg_reclaim_begin() -> Result<(), Error> {
    let cfg = config()?;
    // SAFETY: a helper without arguments; the result is only passed to bpf_probe_read_kernel.
    let task = unsafe { bpf_get_current_task() };
    let key = task_cgroup(&cfg, task, cfg.memory_subsys, cfg.memory_hierarchy)?;
    let pid: u32 = read(task, cfg.task_pid)?;
    RECLAIM_START
        .insert(
            pid,
            ReclaimStart {
                key,
                since_ns: now(),
            },
            0,
        )
        .map_err(|e| Error::Map(e as i32))
}

/// `vmscan/mm_vmscan_memcg_reclaim_end(nr_reclaimed)`: the current task leaves direct reclaim.
#[tracepoint(category = "vmscan", name = "mm_vmscan_memcg_reclaim_end")]
pub fn memcg_reclaim_end(ctx: TracePointContext) -> u32 {
    if let Err(e) = try_memcg_reclaim_end(&ctx) {
        if !matches!(e, Error::Unconfigured) {
            warn!(&ctx, "memcg_reclaim_end: error {}", e.code());
        }
    }
    0
}

fn try_memcg_reclaim_end(ctx: &TracePointContext) -> Result<(), Error> {
    let cfg = config()?;
    let pid = ctx.pid();
    // SAFETY: copied out at once.
    let Some(start) = (unsafe { RECLAIM_START.get(pid) }).copied() else {
        return Ok(());
    };
    let _ = RECLAIM_START.remove(pid);
    // SAFETY: offset from this tracepoint's tracefs `format`; the read is checked.
    let reclaimed: u64 =
        unsafe { ctx.read_at(cfg.reclaim_end_nr_reclaimed as usize) }.map_err(Error::Read)?;
    let elapsed = now().saturating_sub(start.since_ns);
    update_counters(&RECLAIM, &start.key, |c| {
        add!(c, direct_reclaim_count, 1);
        add!(c, direct_reclaim_ns, elapsed);
        add!(c, direct_reclaimed_pages, reclaimed);
    })
}

// ---------------------------------------------------------------------------------------------
// 3. OOM kills

/// `oom/mark_victim(struct task_struct *task, ...)`: counted against the victim's memcg.
#[btf_tracepoint(function = "mark_victim")]
pub fn mark_victim(ctx: BtfTracePointContext) -> u32 {
    if let Err(e) = try_mark_victim(&ctx) {
        if !matches!(e, Error::Unconfigured) {
            warn!(&ctx, "mark_victim: error {}", e.code());
        }
    }
    0
}

fn try_mark_victim(ctx: &BtfTracePointContext) -> Result<(), Error> {
    let cfg = config()?;
    let task: u64 = ctx.arg(0);
    let key = task_cgroup(&cfg, task, cfg.memory_subsys, cfg.memory_hierarchy)?;
    let tgid: u32 = read(task, cfg.task_tgid)?;
    update_counters(&OOM, &key, |c| {
        add!(c, kills, 1);
        // SAFETY: a field of a map value from `update_counters`; a whole u32 store, so a
        // concurrent kill's store leaves one victim's tgid or the other's, never a mix.
        unsafe { core::ptr::write_volatile(&raw mut (*c).last_victim_tgid, tgid) };
    })
}

// ---------------------------------------------------------------------------------------------
// 4. CPU hotplug

#[tracepoint(category = "cpuhp", name = "cpuhp_enter")]
pub fn cpuhp_enter(ctx: TracePointContext) -> u32 {
    if let Err(e) = try_cpuhp(&ctx, CPUHP_ENTER) {
        if !matches!(e, Error::Unconfigured) {
            warn!(&ctx, "cpuhp_enter: error {}", e.code());
        }
    }
    0
}

#[tracepoint(category = "cpuhp", name = "cpuhp_exit")]
pub fn cpuhp_exit(ctx: TracePointContext) -> u32 {
    if let Err(e) = try_cpuhp(&ctx, CPUHP_EXIT) {
        if !matches!(e, Error::Unconfigured) {
            warn!(&ctx, "cpuhp_exit: error {}", e.code());
        }
    }
    0
}

fn try_cpuhp(ctx: &TracePointContext, kind: u32) -> Result<(), Error> {
    let cfg = config()?;
    let layout: CpuhpLayout = if kind == CPUHP_ENTER {
        cfg.cpuhp_enter
    } else {
        cfg.cpuhp_exit
    };
    // SAFETY (all three reads): offsets from this tracepoint's tracefs `format`; checked reads.
    let cpu: u32 = unsafe { ctx.read_at(layout.cpu as usize) }.map_err(Error::Read)?;
    let state: i32 = unsafe { ctx.read_at(layout.state as usize) }.map_err(Error::Read)?;
    let idx: i32 = unsafe { ctx.read_at(layout.idx as usize) }.map_err(Error::Read)?;
    let ret: i32 = if layout.ret == NO_FIELD {
        0
    } else {
        // SAFETY: as above.
        unsafe { ctx.read_at(layout.ret as usize) }.map_err(Error::Read)?
    };
    let event = CpuHotplugEvent {
        timestamp_ns: now(),
        cpu,
        kind,
        state,
        idx,
        ret,
        reserved: 0,
    };
    // A full ring drops the event; user space notices the gap from the sequence of steps.
    CPUHP_EVENTS
        .output::<CpuHotplugEvent>(&event, 0)
        .map_err(|e| Error::Map(e as i32))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // Unreachable in a verified program: the verifier rejects any path that could reach it.
    loop {}
}
