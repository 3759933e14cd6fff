//! The resource observer: per-cgroup CFS throttling, memory reclaim and OOM kills, and CPU
//! hotplug events, from eBPF programs where the kernel allows them and from cgroup files
//! otherwise.
//!
//! [`Observer::start`] loads the eBPF object (embedded at build time, see `plugin/build.rs`)
//! once and, per measurement, tries the strategies in order, falling back with one log line:
//!
//! | measurement | strategies, best first |
//! |---|---|
//! | throttling | `fentry/unthrottle_cfs_rq` → `tp_btf/sched_switch` (6.18+) → `cpu.stat` polling |
//! | reclaim | `memcg/count_memcg_events` + `vmscan/mm_vmscan_memcg_reclaim_{begin,end}` → `memory.stat` polling |
//! | OOM kills | `tp_btf/mark_victim` → `memory.events` / `memory.oom_control` polling |
//! | CPU hotplug | `cpuhp/cpuhp_{enter,exit}` through a ring buffer → unavailable |
//!
//! eBPF counters count from the moment the observer attached; cgroup files count from the
//! cgroup's creation. Callers compare deltas.

mod btf;
mod kernel;
mod maps;
pub mod parse;

use std::fmt;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

pub use nri_resize_ebpf_common::{CgroupKey, CpuHotplugEvent, CPUHP_ENTER, CPUHP_EXIT};

use kernel::KernelSide;

/// Errors of the observer.
#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    #[error("read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
    /// `memcg/count_memcg_events` (+ `vmscan/mm_vmscan_memcg_reclaim_{begin,end}` when available).
    MemcgTracepoints,
    /// `memory.stat` (v2: pgscan/pgsteal; v1: pgpgin/pgpgout only).
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
    pub const ALL: [Self; 2] = [Self::MemcgTracepoints, Self::MemoryStatPolling];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemcgTracepoints => "memcg_tracepoints",
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
}

impl Strategies {
    pub const POLLING: Self = Self {
        throttle: ThrottleStrategy::CpuStatPolling,
        reclaim: ReclaimStrategy::MemoryStatPolling,
        oom: OomStrategy::MemoryEventsPolling,
        hotplug: HotplugStrategy::Unavailable,
    };
}

/// Where the cgroup hierarchies are mounted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupLayout {
    /// cgroup v1: one mount per controller (e.g. `/sys/fs/cgroup/cpu`, `/sys/fs/cgroup/memory`).
    V1 { cpu: PathBuf, memory: PathBuf },
    /// cgroup v2: one unified hierarchy.
    V2 { root: PathBuf },
}

impl CgroupLayout {
    /// The layout under `root` (normally `/sys/fs/cgroup`): v2 when `root` holds a unified
    /// hierarchy with the cpu or memory controller, v1 otherwise.
    pub fn detect(root: &Path) -> Self {
        let unified = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        if unified
            .split_whitespace()
            .any(|c| c == "cpu" || c == "memory")
        {
            Self::V2 {
                root: root.to_owned(),
            }
        } else {
            Self::V1 {
                cpu: root.join("cpu"),
                memory: root.join("memory"),
            }
        }
    }

    fn is_v1(&self) -> bool {
        matches!(self, Self::V1 { .. })
    }
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
    /// The running kernel's BTF.
    pub btf: PathBuf,
    /// `/proc/cgroups`, for the v1 hierarchy ids.
    pub proc_cgroups: PathBuf,
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
}

impl ObserverSettings {
    /// The host's usual paths, the embedded object, every strategy probed.
    pub fn host() -> Self {
        Self {
            cgroups: CgroupLayout::detect(Path::new("/sys/fs/cgroup")),
            object: ObjectSource::Embedded,
            btf: PathBuf::from("/sys/kernel/btf/vmlinux"),
            proc_cgroups: PathBuf::from("/proc/cgroups"),
            tracefs: None,
            force_throttle: None,
            force_reclaim: None,
            force_oom: None,
            hotplug: true,
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
    pub pgpgin: Option<u64>,
    pub pgpgout: Option<u64>,
    /// Memcg direct reclaim passes by the memcg's tasks, their time and pages reclaimed.
    pub direct_reclaim_count: Option<u64>,
    pub direct_reclaim_ns: Option<u64>,
    pub direct_reclaimed_pages: Option<u64>,
}

impl Reclaim {
    /// Pages reclaimed (stolen) by kswapd and direct reclaim, where known.
    pub fn pgsteal(&self) -> Option<u64> {
        match (self.pgsteal_kswapd, self.pgsteal_direct) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        }
    }
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
    path_buf: PathBuf,
    text_buf: String,
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

impl Observer {
    /// Loads and attaches what the kernel allows, falling back per measurement. Fails only when
    /// the cgroup hierarchy ids cannot be read; every eBPF problem becomes a fallback.
    pub fn start(settings: &ObserverSettings) -> Result<Self, ObserverError> {
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
        let (kernel, strategies) = if settings.object == ObjectSource::None {
            (None, Strategies::POLLING)
        } else {
            match KernelSide::start(settings, cpu_hierarchy, memory_hierarchy, &mut fallbacks) {
                Ok((kernel, strategies)) => (Some(kernel), strategies),
                Err(e) => {
                    tracing::warn!(error = %e, "observer: eBPF unavailable, polling cgroup files");
                    fallbacks.push(Fallback {
                        program: "object",
                        reason: e.to_string(),
                    });
                    (None, Strategies::POLLING)
                }
            }
        };
        tracing::info!(
            throttle = ?strategies.throttle,
            reclaim = ?strategies.reclaim,
            oom = ?strategies.oom,
            hotplug = ?strategies.hotplug,
            "observer started"
        );
        Ok(Self {
            cgroups: settings.cgroups.clone(),
            strategies,
            fallbacks,
            kernel,
            cpu_hierarchy,
            memory_hierarchy,
            path_buf: PathBuf::new(),
            text_buf: String::new(),
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

    /// Reads everything known about `cgroup`. Reuses the observer's buffers: no allocation
    /// once the buffers have grown to size.
    pub fn read(&mut self, cgroup: &ObservedCgroup) -> Result<Observation, ObserverError> {
        if let Some(kernel) = &mut self.kernel {
            kernel.flush_logs();
        }
        let throttling = match self.strategies.throttle {
            ThrottleStrategy::CpuStatPolling => {
                self.read_file(&cgroup.cpu_dir, "cpu.stat")?;
                parse::cpu_stat(&self.text_buf).map(|s| Throttling {
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
        let reclaim = match self.strategies.reclaim {
            ReclaimStrategy::MemoryStatPolling => {
                self.read_file(&cgroup.memory_dir, "memory.stat")?;
                let s = parse::memory_stat(&self.text_buf);
                Reclaim {
                    pgscan_kswapd: s.pgscan_kswapd,
                    pgscan_direct: s.pgscan_direct,
                    pgsteal_kswapd: s.pgsteal_kswapd,
                    pgsteal_direct: s.pgsteal_direct,
                    pgpgin: s.pgpgin,
                    pgpgout: s.pgpgout,
                    ..Reclaim::default()
                }
            }
            ReclaimStrategy::MemcgTracepoints => {
                let kernel = self
                    .kernel
                    .as_ref()
                    .expect("eBPF strategy without kernel side");
                kernel.reclaim(&cgroup.memory_key, &mut self.value_buf)?
            }
        };
        let oom_file = if self.cgroups.is_v1() {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        self.read_file(&cgroup.memory_dir, oom_file)?;
        let kernel_oom_kill = parse::oom_kill_count(&self.text_buf);
        let oom = match self.strategies.oom {
            OomStrategy::MemoryEventsPolling => OomKills {
                kills: kernel_oom_kill.unwrap_or(0),
                last_victim_tgid: None,
                kernel_oom_kill,
            },
            OomStrategy::MarkVictim => {
                let kernel = self
                    .kernel
                    .as_ref()
                    .expect("eBPF strategy without kernel side");
                let (kills, tgid) = kernel.oom(&cgroup.memory_key, &mut self.value_buf)?;
                OomKills {
                    kills,
                    last_victim_tgid: tgid,
                    kernel_oom_kill,
                }
            }
        };
        Ok(Observation {
            throttling,
            reclaim,
            oom,
        })
    }

    /// Drops the eBPF map entries of a removed cgroup.
    pub fn forget(&mut self, cgroup: &ObservedCgroup) {
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

    fn read_file(&mut self, dir: &Path, file: &str) -> Result<(), ObserverError> {
        self.path_buf.clear();
        self.path_buf.push(dir);
        self.path_buf.push(file);
        self.text_buf.clear();
        std::fs::File::open(&self.path_buf)
            .and_then(|mut f| f.read_to_string(&mut self.text_buf))
            .map(drop)
            .map_err(|source| ObserverError::Io {
                path: self.path_buf.clone(),
                source,
            })
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
        assert_eq!(
            (o.reclaim.pgpgin, o.reclaim.pgpgout, o.reclaim.pgsteal()),
            (Some(300), Some(200), None)
        );
        assert_eq!(
            o.oom,
            OomKills {
                kills: 1,
                last_victim_tgid: None,
                kernel_oom_kill: Some(1)
            }
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
