//! The resource observer: per-cgroup CFS throttling, memory reclaim and OOM kills, and CPU
//! hotplug events, from eBPF programs where the kernel allows them and from cgroup files
//! otherwise.
//!
//! [`Observer::start`] loads the eBPF object (embedded at build time, see `plugin/build.rs`)
//! once and, per measurement, tries the strategies in order, falling back with one log line:
//!
//! | measurement | strategies, best first |
//! |---|---|
//! | throttling | `fentry/unthrottle_cfs_rq` → `cpu.stat` polling; `tp_btf/sched_switch` (6.18+) only when forced: it runs on every context switch |
//! | reclaim | `fexit/try_to_free_mem_cgroup_pages` → `memcg/count_memcg_events`, attached on demand ([`ReclaimWatch`]) → `memory.stat` polling; `vmscan/mm_vmscan_memcg_reclaim_{begin,end}` for direct-reclaim time |
//! | OOM kills | `tp_btf/mark_victim` → `memory.events` / `memory.oom_control` polling |
//! | CPU hotplug | `cpuhp/cpuhp_{enter,exit}` through a ring buffer → unavailable |
//! | pressure (PSI) | `cpu.pressure`, `memory.pressure`, `io.pressure` (cgroup v2) → unavailable (v1, `psi=0`) |
//!
//! eBPF counters count from the moment the observer attached; cgroup files count from the
//! cgroup's creation. Callers compare deltas.

mod btf;
mod files;
mod kernel;
pub mod map_memory;
pub mod map_sizes;
mod maps;
pub mod parse;
pub mod pressure;
mod probe;
mod snapshot;
mod watch;

use std::fmt;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

pub use nri_resize_ebpf_common::{CgroupKey, CpuHotplugEvent, CPUHP_ENTER, CPUHP_EXIT};

/// The layout is the cgroup module's (its I/O needs it too); the observer's settings carry one.
pub use crate::cgroup::CgroupLayout;

use files::{CgroupFile, CgroupFiles};
use kernel::KernelSide;
pub use pressure::{Pressure, PressureResource, PressureStrategy, StallShare, StallTotals};
pub use watch::{ReclaimGuard, ReclaimSwitch, ReclaimWatch, ReclaimWatchStatus, DEFAULT_LINGER};

/// Errors of the observer.
#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    #[error("read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// No BTF file where the settings look: a kernel built without `CONFIG_DEBUG_INFO_BTF`
    /// has no `/sys/kernel/btf/vmlinux`, or `--btf-path` names nothing.
    #[error(
        "no kernel BTF at {path} (a kernel built without CONFIG_DEBUG_INFO_BTF has none; \
         `--btf-path <file>` names an external BTF file for the running kernel, e.g. from BTFHub)"
    )]
    NoBtf { path: PathBuf },
    #[error("parse kernel BTF {path}: {reason}")]
    Btf { path: PathBuf, reason: String },
    #[error("kernel BTF lookup: {0}")]
    BtfLookup(String),
    #[error("tracefs: {0}")]
    Tracefs(String),
    #[error("eBPF object not built into this binary (run `cargo xtask build-ebpf`, then rebuild)")]
    ObjectMissing,
    #[error("load eBPF object: {0}")]
    Load(String),
    #[error("program {program}: {reason}")]
    Program {
        program: &'static str,
        reason: String,
    },
    #[error("map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} has no CFS bandwidth statistics")]
    NoBandwidthStats { path: PathBuf },
}

/// How CFS throttling is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThrottleStrategy {
    /// `fentry/unthrottle_cfs_rq`: one count per runqueue unthrottle (needs BPF trampolines).
    Fentry,
    /// `tp_btf/sched_switch`: one count per task switched out throttled (task-based throttling, 6.18+).
    TpBtfSchedSwitch,
    /// `cpu.stat` `nr_throttled` / `throttled_time` (v1) or `throttled_usec` (v2).
    CpuStatPolling,
}

/// How memory reclaim is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReclaimStrategy {
    /// `fexit/try_to_free_mem_cgroup_pages` (+ the `vmscan` timing tracepoints): pages
    /// reclaimed by reclaim aimed at the memcg (a lowered limit, `memory.high`,
    /// `memory.reclaim`), reported as direct pgsteal; kswapd's share is not seen. Needs BPF
    /// trampolines.
    Fexit,
    /// `memcg/count_memcg_events` (+ `vmscan/mm_vmscan_memcg_reclaim_{begin,end}` when
    /// available), for kernels that refuse trampolines (6.14+ has the tracepoint; it carries
    /// the reclaim events up to 6.18 at least, no longer on 7.2). The tracepoint fires on every
    /// page fault of the node, so its program is attached only while nri-resize reclaims
    /// ([`ReclaimWatch`]), and only on cgroup v1: v2's `memory.stat` has the same counts (read
    /// from there at every interval); v1's has none, so there reclaim is counted while the
    /// program is attached (the reclaim nri-resize runs) and not otherwise.
    MemcgTracepoints,
    /// `memory.stat` (v2: pgscan/pgsteal; v1: no reclaim counts).
    MemoryStatPolling,
}

/// How OOM kills are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OomStrategy {
    /// `tp_btf/mark_victim`, attributed to the victim's memcg.
    MarkVictim,
    /// `oom_kill` of `memory.events` (v2) or `memory.oom_control` (v1).
    MemoryEventsPolling,
}

/// How CPU hotplug is followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HotplugStrategy {
    /// `cpuhp/cpuhp_{enter,exit}` pushed through a ring buffer.
    CpuhpTracepoints,
    /// Not followed.
    Unavailable,
}

impl ThrottleStrategy {
    pub const ALL: [Self; 3] = [Self::Fentry, Self::TpBtfSchedSwitch, Self::CpuStatPolling];

    /// Stable name (metrics labels, status API, `--observer-force-throttle`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fentry => "fentry",
            Self::TpBtfSchedSwitch => "tp_btf_sched_switch",
            Self::CpuStatPolling => "cpu_stat_polling",
        }
    }
}

impl std::str::FromStr for ThrottleStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == norm)
            .ok_or_else(|| {
                format!("unknown throttle strategy {s:?} (fentry, tp_btf_sched_switch, cpu_stat_polling)")
            })
    }
}

impl ReclaimStrategy {
    pub const ALL: [Self; 3] = [Self::Fexit, Self::MemcgTracepoints, Self::MemoryStatPolling];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemcgTracepoints => "memcg_tracepoints",
            Self::Fexit => "fexit",
            Self::MemoryStatPolling => "memory_stat_polling",
        }
    }
}

impl OomStrategy {
    pub const ALL: [Self; 2] = [Self::MarkVictim, Self::MemoryEventsPolling];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MarkVictim => "mark_victim",
            Self::MemoryEventsPolling => "memory_events_polling",
        }
    }
}

impl HotplugStrategy {
    pub const ALL: [Self; 2] = [Self::CpuhpTracepoints, Self::Unavailable];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::CpuhpTracepoints => "cpuhp_tracepoints",
            Self::Unavailable => "unavailable",
        }
    }
}

/// The strategy in effect for each measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strategies {
    pub throttle: ThrottleStrategy,
    pub reclaim: ReclaimStrategy,
    pub oom: OomStrategy,
    pub hotplug: HotplugStrategy,
    /// Decided apart from eBPF (from the cgroup layout and the kernel's PSI).
    pub pressure: PressureStrategy,
}

impl Strategies {
    /// Every measurement from cgroup files; pressure as on cgroup v1 until detected.
    pub const POLLING: Self = Self {
        throttle: ThrottleStrategy::CpuStatPolling,
        reclaim: ReclaimStrategy::MemoryStatPolling,
        oom: OomStrategy::MemoryEventsPolling,
        hotplug: HotplugStrategy::Unavailable,
        pressure: PressureStrategy::UnavailableCgroupV1,
    };
}

/// Where the eBPF object comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectSource {
    /// The object embedded at build time (`plugin/build.rs`).
    Embedded,
    /// An object file on disk.
    File(PathBuf),
    /// No eBPF: poll cgroup files only.
    None,
}

/// Start-up configuration of the observer.
#[derive(Clone, Debug)]
pub struct ObserverSettings {
    pub cgroups: CgroupLayout,
    pub object: ObjectSource,
    /// The running kernel's BTF: `/sys/kernel/btf/vmlinux`, or an external file for the same
    /// kernel (`--btf-path`). Without one, every measurement polls cgroup files.
    pub btf: PathBuf,
    /// `/proc/cgroups`, for the v1 hierarchy ids.
    pub proc_cgroups: PathBuf,
    /// `/proc/sys/kernel/pid_max`, to size the `sched_switch` program's per-pid flags.
    pub pid_max: PathBuf,
    /// `/proc/pressure/memory`: whether the kernel has PSI (cgroup v2 only).
    pub proc_pressure: PathBuf,
    /// tracefs mount point; `None`: `/sys/kernel/tracing`, mounted there if needed.
    pub tracefs: Option<PathBuf>,
    /// Start the throttling probe at this strategy (to exercise fallbacks).
    pub force_throttle: Option<ThrottleStrategy>,
    /// Start the reclaim probe at this strategy.
    pub force_reclaim: Option<ReclaimStrategy>,
    /// Start the OOM probe at this strategy.
    pub force_oom: Option<OomStrategy>,
    /// Follow CPU hotplug.
    pub hotplug: bool,
    /// With eBPF OOM counting, re-read the cgroup's own `oom_kill` (`memory.oom_control` /
    /// `memory.events`, the `kernel_oom_kill` cross-check) on the first read, after eBPF counted
    /// a kill, and otherwise every this many reads of the cgroup (0 and 1: every read).
    pub oom_cross_check_every: u32,
    /// Most cgroup files kept open between reads (re-read with `pread`); beyond it files are
    /// opened per read. `None`: a quarter of the soft `RLIMIT_NOFILE`; `Some(0)`: never kept.
    pub max_open_files: Option<usize>,
    /// What the eBPF maps are sized from (`[observer]` in the configuration).
    pub maps: MapLimits,
}

/// The configured inputs of the eBPF maps' sizes ([`map_sizes::map_sizes`]); the rest comes
/// from the running kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapLimits {
    /// kubelet's `maxPods` for the node.
    pub max_pods: u32,
    /// The most tasks tracked at once while throttled or in direct reclaim.
    pub max_tasks: u32,
}

impl Default for MapLimits {
    fn default() -> Self {
        Self {
            max_pods: map_sizes::DEFAULT_MAX_PODS,
            max_tasks: map_sizes::DEFAULT_MAX_TASKS,
        }
    }
}

/// Default of [`ObserverSettings::oom_cross_check_every`]: every 30 reads (30 s at the default
/// 1 s interval).
pub const DEFAULT_OOM_CROSS_CHECK_EVERY: u32 = 30;

impl ObserverSettings {
    /// The host's usual paths, the embedded object, every strategy probed.
    pub fn host() -> Self {
        Self {
            cgroups: CgroupLayout::detect(Path::new("/sys/fs/cgroup")),
            object: ObjectSource::Embedded,
            btf: PathBuf::from("/sys/kernel/btf/vmlinux"),
            proc_cgroups: PathBuf::from("/proc/cgroups"),
            pid_max: PathBuf::from("/proc/sys/kernel/pid_max"),
            proc_pressure: PathBuf::from("/proc/pressure/memory"),
            tracefs: None,
            force_throttle: None,
            force_reclaim: None,
            force_oom: None,
            hotplug: true,
            oom_cross_check_every: DEFAULT_OOM_CROSS_CHECK_EVERY,
            max_open_files: None,
            maps: MapLimits::default(),
        }
    }

    /// Polling only: no eBPF (unit tests, or a kernel without BPF).
    pub fn polling(cgroups: CgroupLayout) -> Self {
        Self {
            cgroups,
            object: ObjectSource::None,
            hotplug: false,
            ..Self::host()
        }
    }
}

/// One observed cgroup: its directories and its keys in the eBPF maps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedCgroup {
    cpu_dir: PathBuf,
    memory_dir: PathBuf,
    cpu_key: CgroupKey,
    memory_key: CgroupKey,
}

impl ObservedCgroup {
    pub fn cpu_dir(&self) -> &Path {
        &self.cpu_dir
    }
    pub fn memory_dir(&self) -> &Path {
        &self.memory_dir
    }
    pub fn cpu_key(&self) -> CgroupKey {
        self.cpu_key
    }
    pub fn memory_key(&self) -> CgroupKey {
        self.memory_key
    }
}

/// CFS throttling of a cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Throttling {
    /// Throttle events: per task switched out throttled (`TpBtfSchedSwitch`), per runqueue
    /// unthrottled (`Fentry`) or periods with throttling (`CpuStatPolling`). The three agree for a
    /// single busy task.
    pub count: u64,
    pub throttled_ns: u64,
}

/// Memory reclaim of a memcg, in pages; `None` where the strategy cannot tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaim {
    pub pgscan_kswapd: Option<u64>,
    pub pgscan_direct: Option<u64>,
    pub pgsteal_kswapd: Option<u64>,
    pub pgsteal_direct: Option<u64>,
    /// `pgscan` and `pgsteal` of kernels whose v2 `memory.stat` has the totals only (5.10:
    /// the kswapd / direct split came in 5.13); `None` where the split is known.
    pub pgscan_total: Option<u64>,
    pub pgsteal_total: Option<u64>,
    /// Memcg direct reclaim passes by the memcg's tasks, their time and pages reclaimed.
    pub direct_reclaim_count: Option<u64>,
    pub direct_reclaim_ns: Option<u64>,
    pub direct_reclaimed_pages: Option<u64>,
}

impl Reclaim {
    /// Pages reclaimed (stolen) by kswapd and direct reclaim, where known.
    pub fn pgsteal(&self) -> Option<u64> {
        match (self.pgsteal_kswapd, self.pgsteal_direct) {
            (None, None) => self.pgsteal_total,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        }
    }

    /// Pages scanned by kswapd and direct reclaim, where known.
    pub fn pgscan(&self) -> Option<u64> {
        match (self.pgscan_kswapd, self.pgscan_direct) {
            (None, None) => self.pgscan_total,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        }
    }
}

/// Takes the reclaim counts `memory.stat` has (v2; v1 has none) into `r`.
fn memory_stat_counts(s: &parse::MemoryStat, r: &mut Reclaim) {
    r.pgscan_kswapd = s.pgscan_kswapd;
    r.pgscan_direct = s.pgscan_direct;
    r.pgsteal_kswapd = s.pgsteal_kswapd;
    r.pgsteal_direct = s.pgsteal_direct;
    r.pgscan_total = s.pgscan;
    r.pgsteal_total = s.pgsteal;
}

/// OOM kills in a memcg.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomKills {
    /// Kills counted by the active strategy.
    pub kills: u64,
    /// A victim's thread group id (eBPF only).
    pub last_victim_tgid: Option<u32>,
    /// The kernel's own `oom_kill` count for the cgroup (cross-check), if the file has one.
    pub kernel_oom_kill: Option<u64>,
}

/// What the observer knows about one cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// `None` when the cgroup has no CFS bandwidth statistics.
    pub throttling: Option<Throttling>,
    pub reclaim: Reclaim,
    pub oom: OomKills,
    /// Cumulative stalled time per resource; `None` without PSI (see [`PressureStrategy`]).
    pub pressure: Option<Pressure>,
}

/// Size and run statistics of one loaded eBPF program. `run_count` and `run_time_ns` advance
/// only while BPF statistics are enabled (`sysctl kernel.bpf_stats_enabled=1`, or
/// `aya::sys::enable_stats`); `run_time_ns / run_count` is then the program's cost per event,
/// without the tracepoint's own dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramStats {
    pub name: String,
    /// The kernel's id of the program (its links name it: `BPF_LINK_GET_NEXT_ID`).
    pub id: u32,
    pub run_count: u64,
    pub run_time_ns: u64,
    /// Instructions after the verifier's rewrites (`xlated_prog_len / 8`).
    pub translated_instructions: u32,
    pub jited_bytes: u32,
    /// Instructions the verifier walked (kernel 5.16+).
    pub verified_instructions: Option<u32>,
}

/// A measurement that fell back, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    pub program: &'static str,
    pub reason: String,
}

/// The observer: load once with [`Observer::start`], then [`Observer::read`] per cgroup.
pub struct Observer {
    cgroups: CgroupLayout,
    strategies: Strategies,
    fallbacks: Vec<Fallback>,
    kernel: Option<KernelSide>,
    cpu_hierarchy: u32,
    memory_hierarchy: u32,
    files: CgroupFiles,
    oom_cross_check_every: u32,
    value_buf: Vec<u64>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("cgroups", &self.cgroups)
            .field("strategies", &self.strategies)
            .field("fallbacks", &self.fallbacks)
            .finish_non_exhaustive()
    }
}

/// How far the observer's thread yields: its nice value (0 is the default, 19 the lowest).
pub const OBSERVER_NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority to [`OBSERVER_NICE`] (on Linux the nice
/// value is per thread). The observer is background work: loading its eBPF programs (seconds
/// of verifier time in an emulated guest) and its reads each interval yield the CPU to the NRI
/// answers the runtime is waiting for and to the node's workloads. Failure (a seccomp filter)
/// is returned for the caller to log; the observer then runs at the default priority.
pub fn lower_thread_priority() -> std::io::Result<()> {
    let tid = nix::unistd::gettid().as_raw();
    let who = libc::id_t::try_from(tid)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    #[expect(
        unsafe_code,
        reason = "setpriority has no safe wrapper in libc or nix; it takes no pointers"
    )]
    // SAFETY: plain integer arguments; it changes only this thread's nice value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, OBSERVER_NICE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Returns the free pages of every malloc arena to the kernel (glibc's `malloc_trim`). glibc
/// keeps freed memory in a thread's arena unless it sits at the arena's top; a one-off burst of
/// allocations at start-up (the kernel BTF, parsed twice) would otherwise stay resident for the
/// daemon's whole life.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_freed_memory() {
    #[expect(
        unsafe_code,
        reason = "malloc_trim has no safe wrapper; it only releases free memory"
    )]
    // SAFETY: malloc_trim takes no pointers and is thread-safe; it touches only free chunks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other C libraries return freed memory by themselves (or have no such call).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_freed_memory() {}

impl Observer {
    /// Loads and attaches what the kernel allows, falling back per measurement. Fails only when
    /// the cgroup hierarchy ids cannot be read; every eBPF problem becomes a fallback.
    pub fn start(settings: &ObserverSettings) -> Result<Self, ObserverError> {
        let started = std::time::Instant::now();
        let (cpu_hierarchy, memory_hierarchy) = if settings.cgroups.is_v1() {
            let text = std::fs::read_to_string(&settings.proc_cgroups).map_err(|source| {
                ObserverError::Io {
                    path: settings.proc_cgroups.clone(),
                    source,
                }
            })?;
            (
                parse::hierarchy_id(&text, "cpu").unwrap_or(0),
                parse::hierarchy_id(&text, "memory").unwrap_or(0),
            )
        } else {
            (0, 0)
        };
        let mut fallbacks = Vec::new();
        let (kernel, mut strategies) = if settings.object == ObjectSource::None {
            (None, Strategies::POLLING)
        } else {
            match KernelSide::start(settings, cpu_hierarchy, memory_hierarchy, &mut fallbacks) {
                Ok((kernel, strategies)) => (Some(kernel), strategies),
                Err(e) => {
                    let program = match e {
                        ObserverError::NoBtf { .. } | ObserverError::Btf { .. } => "btf",
                        _ => "object",
                    };
                    tracing::warn!(
                        program,
                        error = %e,
                        "observer: eBPF unavailable, every measurement polls cgroup files"
                    );
                    fallbacks.push(Fallback {
                        program,
                        reason: e.to_string(),
                    });
                    (None, Strategies::POLLING)
                }
            }
        };
        strategies.pressure =
            match PressureStrategy::detect(settings.cgroups.is_v1(), &settings.proc_pressure) {
                Ok(s) => s,
                Err((s, reason)) => {
                    fallbacks.push(Fallback {
                        program: "pressure",
                        reason,
                    });
                    s
                }
            };
        // The BTF parses above are freed, but the allocator keeps their pages (32 MiB of a
        // thread's arena, measured by the footprint bench): hand them back to the kernel.
        release_freed_memory();
        tracing::info!(
            throttle = ?strategies.throttle,
            reclaim = ?strategies.reclaim,
            oom = ?strategies.oom,
            hotplug = ?strategies.hotplug,
            pressure = ?strategies.pressure,
            start_ms = started.elapsed().as_millis(),
            "observer started"
        );
        Ok(Self {
            cgroups: settings.cgroups.clone(),
            strategies,
            fallbacks,
            kernel,
            cpu_hierarchy,
            memory_hierarchy,
            files: CgroupFiles::new(settings.cgroups.is_v1(), settings.max_open_files),
            oom_cross_check_every: settings.oom_cross_check_every,
            value_buf: Vec::new(),
        })
    }

    /// The strategy in effect for each measurement.
    pub fn strategies(&self) -> Strategies {
        self.strategies
    }

    /// The measurements that fell back at start-up, with the reason.
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    /// Resolves a cgroup by its path relative to the hierarchy roots (the OCI `cgroupsPath`,
    /// e.g. `/kubepods/pod1/ctr`). The cgroup must exist.
    pub fn cgroup(&self, relative: &Path) -> Result<ObservedCgroup, ObserverError> {
        let relative = relative.strip_prefix("/").unwrap_or(relative);
        let (cpu_dir, memory_dir) = match &self.cgroups {
            CgroupLayout::V1 { cpu, memory } => (cpu.join(relative), memory.join(relative)),
            CgroupLayout::V2 { root } => (root.join(relative), root.join(relative)),
        };
        let ino = |dir: &Path| {
            std::fs::metadata(dir)
                .map(|m| m.ino())
                .map_err(|source| ObserverError::Io {
                    path: dir.to_owned(),
                    source,
                })
        };
        Ok(ObservedCgroup {
            cpu_key: CgroupKey::new(self.cpu_hierarchy, ino(&cpu_dir)?),
            memory_key: CgroupKey::new(self.memory_hierarchy, ino(&memory_dir)?),
            cpu_dir,
            memory_dir,
        })
    }

    /// Reclaim of `cgroup`, as the reclaim strategy counts it.
    fn read_reclaim(&mut self, cgroup: &ObservedCgroup) -> Result<Reclaim, ObserverError> {
        Ok(match self.strategies.reclaim {
            ReclaimStrategy::MemoryStatPolling => {
                let s = parse::memory_stat(self.files.read(cgroup, CgroupFile::MemoryStat)?);
                let mut r = Reclaim::default();
                memory_stat_counts(&s, &mut r);
                r
            }
            strategy @ (ReclaimStrategy::MemcgTracepoints | ReclaimStrategy::Fexit) => {
                let kernel = self
                    .kernel
                    .as_ref()
                    .expect("eBPF strategy without kernel side");
                let mut r = kernel.reclaim(&cgroup.memory_key, strategy, &mut self.value_buf)?;
                if strategy == ReclaimStrategy::MemcgTracepoints && !self.cgroups.is_v1() {
                    // The event program is never attached on v2 (see `ReclaimStrategy`): the
                    // same counts, from the cgroup's own file.
                    let s = parse::memory_stat(self.files.read(cgroup, CgroupFile::MemoryStat)?);
                    memory_stat_counts(&s, &mut r);
                }
                r
            }
        })
    }

    /// The program counting reclaim that is attached only on demand ([`ReclaimWatch`]), if this
    /// kernel and cgroup version have one: `memcg/count_memcg_events` on cgroup v1.
    pub fn reclaim_on_demand(&self) -> Option<&'static str> {
        self.kernel.as_ref().and_then(KernelSide::on_demand_program)
    }

    /// Attaches the on-demand reclaim program (blocking: kernel text is patched). Attached
    /// already: nothing to do.
    pub fn attach_reclaim_events(&mut self) -> Result<(), ObserverError> {
        match &mut self.kernel {
            Some(kernel) => kernel.attach_on_demand(),
            None => Err(ObserverError::ObjectMissing),
        }
    }

    /// Detaches the on-demand reclaim program (blocking: waits for RCU grace periods). Its
    /// counts stay in the map. Detached already: nothing to do.
    pub fn detach_reclaim_events(&mut self) -> Result<(), ObserverError> {
        match &mut self.kernel {
            Some(kernel) => kernel.detach_on_demand(),
            None => Ok(()),
        }
    }

    /// Starts a pass over many cgroups: the eBPF counter maps are read whole now (a few batch
    /// lookups) and the pass's [`Observer::read`]s take their values from that copy, until
    /// [`Observer::end_pass`]. Without eBPF, nothing.
    pub fn begin_pass(&mut self) {
        if let Some(kernel) = &mut self.kernel {
            kernel.begin_pass();
        }
    }

    /// Ends the pass [`Observer::begin_pass`] started: reads look their keys up again.
    pub fn end_pass(&mut self) {
        if let Some(kernel) = &mut self.kernel {
            kernel.end_pass();
        }
    }

    /// Reads everything known about `cgroup`. Reuses the observer's buffers and keeps the
    /// cgroup's files open between reads: no allocation and no `open` once warmed up. With
    /// eBPF strategies a read is three map lookups, plus the `kernel_oom_kill` cross-check file
    /// when it is due (see [`ObserverSettings::oom_cross_check_every`]); between checks
    /// `kernel_oom_kill` repeats the last value read.
    pub fn read(&mut self, cgroup: &ObservedCgroup) -> Result<Observation, ObserverError> {
        if let Some(kernel) = &mut self.kernel {
            kernel.flush_logs();
        }
        let throttling = match self.strategies.throttle {
            ThrottleStrategy::CpuStatPolling => {
                let text = self.files.read(cgroup, CgroupFile::CpuStat)?;
                parse::cpu_stat(text).map(|s| Throttling {
                    count: s.nr_throttled,
                    throttled_ns: s.throttled_ns,
                })
            }
            ThrottleStrategy::Fentry | ThrottleStrategy::TpBtfSchedSwitch => {
                let kernel = self
                    .kernel
                    .as_ref()
                    .expect("eBPF strategy without kernel side");
                let [count, throttled_ns] =
                    kernel.throttle(&cgroup.cpu_key, &mut self.value_buf)?;
                Some(Throttling {
                    count,
                    throttled_ns,
                })
            }
        };
        let reclaim = self.read_reclaim(cgroup)?;
        let oom = match self.strategies.oom {
            OomStrategy::MemoryEventsPolling => {
                let kernel_oom_kill =
                    parse::oom_kill_count(self.files.read(cgroup, CgroupFile::Oom)?);
                OomKills {
                    kills: kernel_oom_kill.unwrap_or(0),
                    last_victim_tgid: None,
                    kernel_oom_kill,
                }
            }
            OomStrategy::MarkVictim => {
                let kernel = self
                    .kernel
                    .as_ref()
                    .expect("eBPF strategy without kernel side");
                let (kills, tgid) = kernel.oom(&cgroup.memory_key, &mut self.value_buf)?;
                let every = self.oom_cross_check_every;
                let kernel_oom_kill = if self.files.oom_check(cgroup).due(kills, every) {
                    let found = parse::oom_kill_count(self.files.read(cgroup, CgroupFile::Oom)?);
                    let phase = cgroup.memory_key.cgroup_id % u64::from(every.max(1));
                    let phase = u32::try_from(phase).unwrap_or(0);
                    self.files.oom_check(cgroup).checked(found, phase);
                    found
                } else {
                    self.files.oom_check(cgroup).kernel_oom_kill
                };
                OomKills {
                    kills,
                    last_victim_tgid: tgid,
                    kernel_oom_kill,
                }
            }
        };
        let pressure = if self.strategies.pressure.available() {
            let mut read = |file| {
                let text = self.files.read(cgroup, file)?;
                Ok::<_, ObserverError>(pressure::stall_totals(text).unwrap_or_default())
            };
            Some(Pressure {
                cpu: read(CgroupFile::CpuPressure)?,
                memory: read(CgroupFile::MemoryPressure)?,
                io: read(CgroupFile::IoPressure)?,
            })
        } else {
            None
        };
        Ok(Observation {
            throttling,
            reclaim,
            oom,
            pressure,
        })
    }

    /// Each eBPF map's memory (`memlock`), read after load; empty without eBPF.
    pub fn map_memory(&self) -> &[map_memory::MapMemory] {
        self.kernel.as_ref().map_or(&[][..], KernelSide::map_memory)
    }

    /// The kernel's possible CPUs (`/sys/devices/system/cpu/possible`), read at load; `None`
    /// without eBPF.
    pub fn possible_cpus(&self) -> Option<usize> {
        self.kernel.as_ref().map(KernelSide::possible_cpus)
    }

    /// The entries the eBPF maps were created with; `None` without eBPF.
    pub fn map_sizes(&self) -> Option<map_sizes::MapSizes> {
        self.kernel.as_ref().map(KernelSide::map_sizes)
    }

    /// Size and run statistics of the loaded eBPF programs (empty without eBPF).
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        self.kernel
            .as_ref()
            .map(KernelSide::program_stats)
            .unwrap_or_default()
    }

    /// Number of cgroup files kept open between reads.
    pub fn open_files(&self) -> usize {
        self.files.open_files()
    }

    /// Drops the eBPF map entries, open files and cross-check state of a removed cgroup.
    pub fn forget(&mut self, cgroup: &ObservedCgroup) {
        self.files.forget(cgroup);
        if let Some(kernel) = &mut self.kernel {
            kernel.forget(cgroup.cpu_key, cgroup.memory_key);
        }
    }

    /// Moves the CPU hotplug events received since the last call into `out`.
    pub fn drain_hotplug_events(&mut self, out: &mut Vec<CpuHotplugEvent>) {
        if let Some(kernel) = &mut self.kernel {
            kernel.flush_logs();
            kernel.drain_hotplug(out);
        }
    }

    /// The ring buffer's file descriptor, readable when hotplug events are waiting (for
    /// `tokio::io::unix::AsyncFd`).
    pub fn hotplug_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.kernel.as_ref().and_then(KernelSide::hotplug_fd)
    }

    /// Hands the CPU hotplug ring buffer to its consumer (the capacity watcher, which awaits
    /// it with `AsyncFd`); afterwards [`Observer::drain_hotplug_events`] finds nothing. The
    /// `cpuhp` programs stay attached as long as the observer lives. `None` when hotplug is not
    /// followed (see [`Strategies::hotplug`]) or the ring was taken already.
    pub fn take_hotplug_ring(&mut self) -> Option<HotplugRing> {
        self.kernel
            .as_mut()
            .and_then(KernelSide::take_hotplug)
            .map(|ring| HotplugRing { ring })
    }
}

/// The `cpuhp/cpuhp_{enter,exit}` ring buffer: readable (poll/epoll) when events wait.
pub struct HotplugRing {
    ring: aya::maps::RingBuf<aya::maps::MapData>,
}

impl fmt::Debug for HotplugRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HotplugRing").finish_non_exhaustive()
    }
}

impl HotplugRing {
    /// Moves every waiting event into `out`.
    pub fn drain(&mut self, out: &mut Vec<CpuHotplugEvent>) {
        while let Some(item) = self.ring.next() {
            if let Some(event) = kernel::decode_hotplug(&item) {
                out.push(event);
            }
        }
    }
}

impl std::os::fd::AsRawFd for HotplugRing {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd as _;
        self.ring.as_fd().as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> (tempfile::TempDir, Observer, ObservedCgroup) {
        let dir = tempfile::tempdir().expect("tempdir");
        let cpu = dir.path().join("cpu");
        let memory = dir.path().join("memory");
        std::fs::create_dir_all(cpu.join("pod/ctr")).expect("mkdir");
        std::fs::create_dir_all(memory.join("pod/ctr")).expect("mkdir");
        std::fs::write(
            dir.path().join("cgroups"),
            "#subsys_name\thierarchy\nmemory\t7\t1\t1\ncpu\t4\t1\t1\n",
        )
        .expect("write");
        std::fs::write(
            cpu.join("pod/ctr/cpu.stat"),
            "nr_periods 10\nnr_throttled 3\nthrottled_time 5000\n",
        )
        .expect("write");
        std::fs::write(
            memory.join("pod/ctr/memory.stat"),
            "cache 0\npgpgin 300\npgpgout 200\n",
        )
        .expect("write");
        std::fs::write(
            memory.join("pod/ctr/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .expect("write");
        let mut settings = ObserverSettings::polling(CgroupLayout::V1 { cpu, memory });
        settings.proc_cgroups = dir.path().join("cgroups");
        let observer = Observer::start(&settings).expect("start");
        let cgroup = observer.cgroup(Path::new("/pod/ctr")).expect("cgroup");
        (dir, observer, cgroup)
    }

    #[test]
    fn polling_reads_v1_files_under_an_injected_root() {
        let (_dir, mut observer, cgroup) = fixture();
        assert_eq!(observer.strategies(), Strategies::POLLING);
        assert_eq!(cgroup.cpu_key().hierarchy_id, 4);
        assert_eq!(cgroup.memory_key().hierarchy_id, 7);
        let o = observer.read(&cgroup).expect("read");
        assert_eq!(
            o.throttling,
            Some(Throttling {
                count: 3,
                throttled_ns: 5000
            })
        );
        // v1's memory.stat has no reclaim counts (its pgpgin/pgpgout are every charge).
        assert_eq!(o.reclaim, Reclaim::default());
        assert_eq!(
            o.oom,
            OomKills {
                kills: 1,
                last_victim_tgid: None,
                kernel_oom_kill: Some(1)
            }
        );
    }

    /// A kernel without BTF (no `/sys/kernel/btf/vmlinux`, or a `--btf-path` naming nothing):
    /// the observer starts, polls every measurement and says why in one fallback.
    #[test]
    fn without_kernel_btf_every_measurement_polls_and_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let object = dir.path().join("object.o");
        std::fs::write(&object, b"not read: the BTF is missing first").expect("write");
        let cpu = dir.path().join("cpu");
        let memory = dir.path().join("memory");
        std::fs::create_dir_all(&cpu).expect("mkdir");
        std::fs::create_dir_all(&memory).expect("mkdir");
        std::fs::write(dir.path().join("cgroups"), "#subsys_name\thierarchy\n").expect("write");
        let mut settings = ObserverSettings::polling(CgroupLayout::V1 { cpu, memory });
        settings.object = ObjectSource::File(object);
        settings.btf = dir.path().join("no-btf/vmlinux");
        settings.proc_cgroups = dir.path().join("cgroups");
        let observer = Observer::start(&settings).expect("start without BTF");
        assert_eq!(observer.strategies(), Strategies::POLLING);
        // One fallback for all of eBPF (and cgroup v1's own, PSI).
        let programs: Vec<&str> = observer.fallbacks().iter().map(|f| f.program).collect();
        assert_eq!(programs, ["btf", "pressure"]);
        let f = &observer.fallbacks()[0];
        assert!(
            f.reason.contains("no kernel BTF at")
                && f.reason.contains("no-btf/vmlinux")
                && f.reason.contains("--btf-path"),
            "{}",
            f.reason
        );
    }

    #[test]
    fn missing_cgroup_is_an_error_naming_the_path() {
        let (_dir, observer, _) = fixture();
        let err = observer
            .cgroup(Path::new("/pod/gone"))
            .expect_err("absent cgroup");
        assert!(err.to_string().contains("pod/gone"), "{err}");
    }
}
