//! cgroup I/O behind a small trait with an injectable root: read a cgroup's **actual** limits
//! and usage, and write a pod cgroup's CPU and memory limits.
//!
//! [`Cgroups`] dispatches between cgroup v1 (one mount per controller) and v2 (one unified
//! hierarchy) as an enum; both take their mount points from the caller, so unit tests run
//! against a temp-dir fixture and never touch `/sys`. `cgroups-rs` is not used: it hard-codes
//! `/sys/fs/cgroup`.
//!
//! | | v1 | v2 |
//! |---|---|---|
//! | CPU limit | `cpu.cfs_quota_us`, `cpu.cfs_period_us` | `cpu.max` |
//! | CPU share | `cpu.shares` | `cpu.weight` |
//! | memory limit | `memory.limit_in_bytes` | `memory.max` |
//! | memory soft limit / high | `memory.soft_limit_in_bytes` | `memory.high` |
//! | memory usage | `memory.usage_in_bytes` | `memory.current` |
//! | memory breakdown | `memory.stat` `total_rss`/`total_shmem`/`total_cache` | `memory.stat` `anon`/`shmem`/`file` |
//! | proactive reclaim | (none: lower `memory.limit_in_bytes`) | `memory.reclaim` (5.19+) |
//! | reclaim harm (paced reclaim) | (none) | `memory.pressure`, `io.pressure`, `memory.stat` `workingset_refault_*` |
//! | page cache only (trimming) | (none) | `memory.reclaim` with `swappiness=0` (6.11+), `memory.stat` `active_file`/`inactive_file` |

mod effective;
#[cfg(feature = "fault-injection")]
pub mod fault;
#[cfg(test)]
pub mod gate;
mod layout;
mod parse;
mod path;
mod pressure;
#[cfg(test)]
pub mod worker_check;

use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use effective::{ancestors, caps, read_caps, read_caps_cached, Cap, Caps, CgroupLimits};
pub use layout::CgroupLayout;
pub use parse::flat_keyed;
pub use path::{container_path, pod_path, resolve, ContainerCgroups};
pub use pressure::{stall_totals, StallTotals};

use crate::policy::{CacheStat, MemoryUse, UNLIMITED_BYTES};

/// Errors of cgroup resolution, reads and writes.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cgroup path is empty")]
    EmptyPath,
    #[error("cgroup path {path:?} is not absolute")]
    RelativePath { path: String },
    #[error("cgroup path {path:?} contains `..`")]
    Traversal { path: String },
    #[error("systemd cgroup path {path:?} is not slice:prefix:name with a valid slice")]
    BadSystemdPath { path: String },
    #[error("cgroup {path} does not exist")]
    Missing { path: PathBuf },
    #[error("{path} does not exist (is the controller enabled for this cgroup?)")]
    MissingFile { path: PathBuf },
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parse {path}: unexpected content {content:?}")]
    Parse { path: PathBuf, content: String },
    #[error("write {value:?} to {path}: the kernel refused the value (EINVAL)")]
    InvalidValue {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("write {value:?} to {path}: busy (EBUSY)")]
    Busy {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("write {value:?} to {path}: could not reclaim that much yet (EAGAIN)")]
    Again {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} is not available on cgroup {version:?}")]
    Unsupported {
        what: &'static str,
        version: CgroupVersion,
    },
    #[error("write {value:?} to {path}: {source}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },
}

impl CgroupError {
    /// The errno of a failed read or write, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Read { source, .. }
            | Self::InvalidValue { source, .. }
            | Self::Busy { source, .. }
            | Self::Again { source, .. }
            | Self::Write { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// cgroup version in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

/// What a cgroup's files say now. `None`: the file is absent (e.g. no bandwidth control).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActualResources {
    /// CFS quota in µs per period; `-1`: unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period in µs.
    pub cpu_period: Option<u64>,
    /// `cpu.shares` (v1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_shares: Option<u64>,
    /// `cpu.weight` (v2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<u64>,
    /// Memory limit in bytes; `-1`: unlimited.
    pub memory_limit: Option<i64>,
    /// `memory.soft_limit_in_bytes` (v1) or `memory.high` (v2) in bytes; `-1`: unlimited.
    pub memory_soft_limit: Option<i64>,
    /// `memory.usage_in_bytes` (v1) or `memory.current` (v2).
    pub memory_usage: Option<u64>,
}

impl ActualResources {
    /// The CPU limit in millicores, when limited.
    pub fn cpu_limit_millis(&self) -> Option<u64> {
        match (self.cpu_quota, self.cpu_period) {
            (Some(q), Some(p)) if q > 0 && p > 0 => {
                Some(u64::try_from(q).unwrap_or(0).saturating_mul(1000) / p)
            }
            _ => None,
        }
    }
}

/// A CPU limit to write: `quota` µs per `period` µs, `None` for unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuLimit {
    pub quota: Option<u64>,
    pub period: u64,
}

/// cgroup reads and writes. Paths are cgroups within the hierarchy (`/a/b`, see [`resolve`]).
pub trait CgroupIo: Send + Sync + fmt::Debug {
    fn version(&self) -> CgroupVersion;
    /// Reads the actual limits and usage of `cgroup`.
    fn read_actual(&self, cgroup: &Path) -> Result<ActualResources, CgroupError>;
    /// Reads only the CPU bandwidth and memory limits of `cgroup` (what [`read_caps`] needs of
    /// each cgroup on a container's path).
    fn read_limits(&self, cgroup: &Path) -> Result<CgroupLimits, CgroupError>;
    /// [`CgroupIo::read_limits`] of only the CPU bandwidth (`cpu`) and/or the memory limit
    /// (`memory`): the files of the other are not read, and it is `None`.
    fn read_limits_of(
        &self,
        cgroup: &Path,
        cpu: bool,
        memory: bool,
    ) -> Result<CgroupLimits, CgroupError> {
        let all = self.read_limits(cgroup)?;
        Ok(CgroupLimits {
            cpu_quota: all.cpu_quota.filter(|_| cpu),
            cpu_period: all.cpu_period.filter(|_| cpu),
            memory_limit: all.memory_limit.filter(|_| memory),
        })
    }
    /// Sets the CFS bandwidth limit of `cgroup` (a pod cgroup: the resize engine writes those).
    fn set_cpu_limit(&self, cgroup: &Path, limit: CpuLimit) -> Result<(), CgroupError>;
    /// Sets the memory limit of `cgroup` in bytes, `None` for unlimited.
    fn set_memory_limit(&self, cgroup: &Path, limit: Option<u64>) -> Result<(), CgroupError>;
    /// Usage and what it is made of (anonymous, shared, page cache).
    fn memory_use(&self, cgroup: &Path) -> Result<MemoryUse, CgroupError>;
    /// Asks the kernel to reclaim `bytes` from `cgroup` (v2 `memory.reclaim`). `Again`: it
    /// reclaimed less; `Unsupported`: no such interface (v1, or a v2 kernel before 5.19).
    fn reclaim(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError>;
    /// Sets the v2 `memory.high` throttling threshold (`None`: `max`); v1 has none.
    fn set_memory_high(&self, cgroup: &Path, high: Option<u64>) -> Result<(), CgroupError>;
    /// The v2 `memory.high` of `cgroup` (`None`: `max`, or v1, which has none).
    fn memory_high(&self, cgroup: &Path) -> Result<Option<u64>, CgroupError>;
    /// The pids in `cgroup` (its `cgroup.procs`, as the reader's pid namespace numbers them).
    fn procs(&self, cgroup: &Path) -> Result<Vec<u32>, CgroupError>;
    /// The cumulative memory stall of `cgroup` (its v2 `memory.pressure`); `Unsupported` on
    /// v1 and where the kernel has no PSI (the file is hidden under `psi=0`).
    fn memory_pressure(&self, _cgroup: &Path) -> Result<StallTotals, CgroupError> {
        Err(CgroupError::Unsupported {
            what: "memory.pressure",
            version: self.version(),
        })
    }
    /// The cumulative I/O stall of `cgroup` (its v2 `io.pressure`: refaults of reclaimed page
    /// cache wait here); `Unsupported` as for [`CgroupIo::memory_pressure`].
    fn io_pressure(&self, _cgroup: &Path) -> Result<StallTotals, CgroupError> {
        Err(CgroupError::Unsupported {
            what: "io.pressure",
            version: self.version(),
        })
    }
    /// Bytes of `cgroup` refaulted since it was created: reclaimed pages its tasks needed again
    /// (v2 `memory.stat` `workingset_refault_anon` + `workingset_refault_file`, or
    /// `workingset_refault` before 5.9, in pages, times the page size); `Unsupported` on v1.
    fn workingset_refaults(&self, _cgroup: &Path) -> Result<u64, CgroupError> {
        Err(CgroupError::Unsupported {
            what: "memory.stat workingset_refault",
            version: self.version(),
        })
    }
    /// What working-set trimming decides from: `memory.current` and the v2 `memory.stat`
    /// breakdown of page cache (`file`, `active_file`, `inactive_file`, `shmem`, `anon`, and
    /// `workingset_refault_file` in bytes); `Unsupported` on v1.
    fn cache_stat(&self, _cgroup: &Path) -> Result<CacheStat, CgroupError> {
        Err(CgroupError::Unsupported {
            what: "memory.stat file breakdown",
            version: self.version(),
        })
    }
    /// Asks the kernel to reclaim `bytes` of page cache only: v2 `memory.reclaim` with
    /// `swappiness=0` (6.11+; `bytes` 0 reclaims nothing and only checks that the kernel takes
    /// the key). `InvalidValue` (EINVAL) where the kernel has no `swappiness=` key; `Again`:
    /// it reclaimed less; `Unsupported`: no `memory.reclaim` (v1, or before 5.19).
    fn reclaim_page_cache(&self, _cgroup: &Path, _bytes: u64) -> Result<(), CgroupError> {
        Err(CgroupError::Unsupported {
            what: "memory.reclaim",
            version: self.version(),
        })
    }
}

/// Parses a `cgroup.procs` file: one pid per line.
fn read_procs(dir: &Path) -> Result<Vec<u32>, CgroupError> {
    let text = read_file(dir, "cgroup.procs")?.unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| l.parse().map_err(|_| parse_err(dir, "cgroup.procs", l)))
        .collect()
}

/// Reads `memory.stat` keys into a [`MemoryUse`] with the given usage.
fn memory_breakdown(
    dir: &Path,
    usage: u64,
    anon: &str,
    shmem: &str,
    file: &str,
) -> Result<MemoryUse, CgroupError> {
    let text = read_file(dir, "memory.stat")?.unwrap_or_default();
    let get = |key: &str| flat_keyed(&text, key).unwrap_or(0);
    Ok(MemoryUse {
        usage,
        anon: get(anon),
        shmem: get(shmem),
        file: get(file),
    })
}

/// The running kernel's page size in bytes (4 KiB on x86-64; 4, 16 or 64 KiB on arm64):
/// `memory.stat` counts events in pages, and memory limits are held in whole pages
/// ([`crate::model::held_memory_limit`]). From the auxiliary vector: it cannot fail.
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// A v2 pressure file's totals; `Unsupported` where it is absent or unreadable (EOPNOTSUPP
/// where the file exists but PSI is off).
fn read_pressure(dir: &Path, file: &'static str) -> Result<StallTotals, CgroupError> {
    let text = read_file(dir, file)
        .ok()
        .flatten()
        .ok_or(CgroupError::Unsupported {
            what: file,
            version: CgroupVersion::V2,
        })?;
    stall_totals(&text).ok_or_else(|| parse_err(dir, file, &text))
}

/// cgroup v1: one mount per controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V1 {
    pub cpu: PathBuf,
    pub memory: PathBuf,
}

/// cgroup v2: one unified hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct V2 {
    pub root: PathBuf,
}

/// The cgroup I/O of the node: v1 or v2, each with an injectable root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cgroups {
    V1(V1),
    V2(V2),
    /// Test builds only: every call slowed down on purpose ([`fault`]).
    #[cfg(feature = "fault-injection")]
    Slow(fault::Slow),
    /// Unit tests only: notes the calls made on the async worker ([`worker_check`]).
    #[cfg(test)]
    OffWorkerOnly(worker_check::OffWorkerOnly),
    /// Unit tests only: reads held until the test lets them through ([`gate`]).
    #[cfg(test)]
    Gated(gate::Gated),
}

impl Cgroups {
    /// Detects v1 or v2 under `root` (normally `/sys/fs/cgroup`).
    pub fn detect(root: &Path) -> Self {
        Self::from_layout(&CgroupLayout::detect(root))
    }

    /// The same mounts the observer uses.
    pub fn from_layout(layout: &CgroupLayout) -> Self {
        match layout {
            CgroupLayout::V1 { cpu, memory } => Self::V1(V1 {
                cpu: cpu.clone(),
                memory: memory.clone(),
            }),
            CgroupLayout::V2 { root } => Self::V2(V2 { root: root.clone() }),
        }
    }
}

/// Joins a hierarchy root and a cgroup, refusing anything but an absolute path of normal
/// components (no `..`): the result is always below `root`.
pub fn join_root(root: &Path, cgroup: &Path) -> Result<PathBuf, CgroupError> {
    let text = cgroup.to_string_lossy();
    if text.is_empty() {
        return Err(CgroupError::EmptyPath);
    }
    let clean = path::validated(&text)?;
    let relative = clean.strip_prefix("/").unwrap_or(&clean);
    Ok(root.join(relative))
}

fn existing_dir(root: &Path, cgroup: &Path) -> Result<PathBuf, CgroupError> {
    let dir = join_root(root, cgroup)?;
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(CgroupError::Missing { path: dir })
    }
}

/// Reads a cgroup file; `Ok(None)` if it does not exist, `Missing` if its cgroup does not.
/// Open, read to the end, close: read through `Take`, which has no size hint, since `File`'s
/// costs a `statx` and an `lseek` per file (and cgroupfs says 0 bytes, or 4096, anyway).
fn read_file(dir: &Path, file: &str) -> Result<Option<String>, CgroupError> {
    let path = dir.join(file);
    let mut text = String::new();
    match std::fs::File::open(&path).and_then(|f| f.take(u64::MAX).read_to_string(&mut text)) {
        Ok(_) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if dir.is_dir() {
                Ok(None)
            } else {
                Err(CgroupError::Missing {
                    path: dir.to_owned(),
                })
            }
        }
        Err(source) => Err(CgroupError::Read { path, source }),
    }
}

fn parse_err(dir: &Path, file: &str, content: &str) -> CgroupError {
    CgroupError::Parse {
        path: dir.join(file),
        content: content.trim().to_owned(),
    }
}

fn read_u64(dir: &Path, file: &str) -> Result<Option<u64>, CgroupError> {
    read_file(dir, file)?
        .map(|t| t.trim().parse().map_err(|_| parse_err(dir, file, &t)))
        .transpose()
}

/// A value the caller cannot do without: a missing file is an error, never a zero (a usage
/// read as 0 would let a memory decrease below real usage through).
fn required<T>(dir: &Path, file: &str, value: Option<T>) -> Result<T, CgroupError> {
    value.ok_or_else(|| CgroupError::MissingFile {
        path: dir.join(file),
    })
}

fn read_i64(dir: &Path, file: &str) -> Result<Option<i64>, CgroupError> {
    read_file(dir, file)?
        .map(|t| t.trim().parse().map_err(|_| parse_err(dir, file, &t)))
        .transpose()
}

/// A byte limit: `max` (v2) or a v1 value at `PAGE_COUNTER_MAX` is unlimited (-1).
fn read_limit(dir: &Path, file: &str) -> Result<Option<i64>, CgroupError> {
    let Some(text) = read_file(dir, file)? else {
        return Ok(None);
    };
    let t = text.trim();
    if t == "max" {
        return Ok(Some(-1));
    }
    let v: u64 = t.parse().map_err(|_| parse_err(dir, file, t))?;
    Ok(Some(if v >= UNLIMITED_BYTES {
        -1
    } else {
        i64::try_from(v).unwrap_or(-1)
    }))
}

/// v2 `cpu.max`: (quota, period); quota `-1` for `max`; `(None, None)` when absent.
fn read_cpu_max(dir: &Path) -> Result<(Option<i64>, Option<u64>), CgroupError> {
    Ok(match read_file(dir, "cpu.max")? {
        None => (None, None),
        Some(text) => {
            let mut it = text.split_whitespace();
            let quota = match it.next() {
                Some("max") => -1,
                Some(q) => q.parse().map_err(|_| parse_err(dir, "cpu.max", &text))?,
                None => return Err(parse_err(dir, "cpu.max", &text)),
            };
            let period = it
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| parse_err(dir, "cpu.max", &text))?;
            (Some(quota), Some(period))
        }
    })
}

fn write_file(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    std::fs::write(&path, value).map_err(|source| write_error(path, value, source))
}

/// EINVAL (value refused, e.g. a v1 child quota above its parent's) and EBUSY (e.g. a v1 memory
/// limit below what cannot be reclaimed) are told apart: the resize engine reacts differently.
fn write_error(path: PathBuf, value: &str, source: std::io::Error) -> CgroupError {
    let value = value.to_owned();
    match source.raw_os_error() {
        Some(libc::EINVAL) => CgroupError::InvalidValue {
            path,
            value,
            source,
        },
        Some(libc::EBUSY) => CgroupError::Busy {
            path,
            value,
            source,
        },
        Some(libc::EAGAIN) => CgroupError::Again {
            path,
            value,
            source,
        },
        _ => CgroupError::Write {
            path,
            value,
            source,
        },
    }
}

impl CgroupIo for V1 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }

    fn procs(&self, cgroup: &Path) -> Result<Vec<u32>, CgroupError> {
        read_procs(&existing_dir(&self.memory, cgroup)?)
    }

    fn read_actual(&self, cgroup: &Path) -> Result<ActualResources, CgroupError> {
        let cpu = existing_dir(&self.cpu, cgroup)?;
        let memory = existing_dir(&self.memory, cgroup)?;
        Ok(ActualResources {
            cpu_quota: read_i64(&cpu, "cpu.cfs_quota_us")?,
            cpu_period: read_u64(&cpu, "cpu.cfs_period_us")?,
            cpu_shares: read_u64(&cpu, "cpu.shares")?,
            cpu_weight: None,
            memory_limit: read_limit(&memory, "memory.limit_in_bytes")?,
            memory_soft_limit: read_limit(&memory, "memory.soft_limit_in_bytes")?,
            memory_usage: read_u64(&memory, "memory.usage_in_bytes")?,
        })
    }

    fn read_limits(&self, cgroup: &Path) -> Result<CgroupLimits, CgroupError> {
        self.read_limits_of(cgroup, true, true)
    }

    fn read_limits_of(
        &self,
        cgroup: &Path,
        cpu: bool,
        memory: bool,
    ) -> Result<CgroupLimits, CgroupError> {
        // No `stat` up front: a missing cgroup is told by its first file's read.
        let mut limits = CgroupLimits::default();
        if cpu {
            let dir = join_root(&self.cpu, cgroup)?;
            limits.cpu_quota = read_i64(&dir, "cpu.cfs_quota_us")?;
            limits.cpu_period = read_u64(&dir, "cpu.cfs_period_us")?;
        }
        if memory {
            let dir = join_root(&self.memory, cgroup)?;
            limits.memory_limit = read_limit(&dir, "memory.limit_in_bytes")?;
        }
        Ok(limits)
    }

    fn set_cpu_limit(&self, cgroup: &Path, limit: CpuLimit) -> Result<(), CgroupError> {
        let dir = existing_dir(&self.cpu, cgroup)?;
        // Period first: the kernel validates the quota against the period in effect.
        write_file(&dir, "cpu.cfs_period_us", &limit.period.to_string())?;
        let quota = limit
            .quota
            .map_or_else(|| "-1".to_owned(), |q| q.to_string());
        write_file(&dir, "cpu.cfs_quota_us", &quota)
    }

    fn set_memory_limit(&self, cgroup: &Path, limit: Option<u64>) -> Result<(), CgroupError> {
        let dir = existing_dir(&self.memory, cgroup)?;
        let value = limit.map_or_else(|| "-1".to_owned(), |l| l.to_string());
        write_file(&dir, "memory.limit_in_bytes", &value)
    }

    fn memory_use(&self, cgroup: &Path) -> Result<MemoryUse, CgroupError> {
        let dir = existing_dir(&self.memory, cgroup)?;
        let usage = required(
            &dir,
            "memory.usage_in_bytes",
            read_u64(&dir, "memory.usage_in_bytes")?,
        )?;
        memory_breakdown(&dir, usage, "total_rss", "total_shmem", "total_cache")
    }

    fn reclaim(&self, _cgroup: &Path, _bytes: u64) -> Result<(), CgroupError> {
        Err(CgroupError::Unsupported {
            what: "memory.reclaim",
            version: CgroupVersion::V1,
        })
    }

    fn set_memory_high(&self, _cgroup: &Path, _high: Option<u64>) -> Result<(), CgroupError> {
        Err(CgroupError::Unsupported {
            what: "memory.high",
            version: CgroupVersion::V1,
        })
    }

    fn memory_high(&self, cgroup: &Path) -> Result<Option<u64>, CgroupError> {
        existing_dir(&self.memory, cgroup)?;
        Ok(None)
    }
}

impl CgroupIo for V2 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V2
    }

    fn procs(&self, cgroup: &Path) -> Result<Vec<u32>, CgroupError> {
        read_procs(&existing_dir(&self.root, cgroup)?)
    }

    fn read_actual(&self, cgroup: &Path) -> Result<ActualResources, CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        let (cpu_quota, cpu_period) = read_cpu_max(&dir)?;
        Ok(ActualResources {
            cpu_quota,
            cpu_period,
            cpu_shares: None,
            cpu_weight: read_u64(&dir, "cpu.weight")?,
            memory_limit: read_limit(&dir, "memory.max")?,
            memory_soft_limit: read_limit(&dir, "memory.high")?,
            memory_usage: read_u64(&dir, "memory.current")?,
        })
    }

    fn read_limits(&self, cgroup: &Path) -> Result<CgroupLimits, CgroupError> {
        self.read_limits_of(cgroup, true, true)
    }

    fn read_limits_of(
        &self,
        cgroup: &Path,
        cpu: bool,
        memory: bool,
    ) -> Result<CgroupLimits, CgroupError> {
        // No `stat` up front: a missing cgroup is told by its first file's read.
        let dir = join_root(&self.root, cgroup)?;
        let mut limits = CgroupLimits::default();
        if cpu {
            (limits.cpu_quota, limits.cpu_period) = read_cpu_max(&dir)?;
        }
        if memory {
            limits.memory_limit = read_limit(&dir, "memory.max")?;
        }
        Ok(limits)
    }

    fn set_cpu_limit(&self, cgroup: &Path, limit: CpuLimit) -> Result<(), CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        let value = match limit.quota {
            Some(q) => format!("{q} {}", limit.period),
            None => format!("max {}", limit.period),
        };
        write_file(&dir, "cpu.max", &value)
    }

    fn set_memory_limit(&self, cgroup: &Path, limit: Option<u64>) -> Result<(), CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        let value = limit.map_or_else(|| "max".to_owned(), |l| l.to_string());
        write_file(&dir, "memory.max", &value)
    }

    fn memory_use(&self, cgroup: &Path) -> Result<MemoryUse, CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        let usage = required(&dir, "memory.current", read_u64(&dir, "memory.current")?)?;
        memory_breakdown(&dir, usage, "anon", "shmem", "file")
    }

    fn reclaim(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        if !dir.join("memory.reclaim").exists() {
            return Err(CgroupError::Unsupported {
                what: "memory.reclaim",
                version: CgroupVersion::V2,
            });
        }
        write_file(&dir, "memory.reclaim", &bytes.to_string())
    }

    fn set_memory_high(&self, cgroup: &Path, high: Option<u64>) -> Result<(), CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        let value = high.map_or_else(|| "max".to_owned(), |h| h.to_string());
        write_file(&dir, "memory.high", &value)
    }

    fn memory_high(&self, cgroup: &Path) -> Result<Option<u64>, CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        Ok(read_limit(&dir, "memory.high")?.and_then(|h| u64::try_from(h).ok()))
    }

    fn memory_pressure(&self, cgroup: &Path) -> Result<StallTotals, CgroupError> {
        read_pressure(&existing_dir(&self.root, cgroup)?, "memory.pressure")
    }

    fn io_pressure(&self, cgroup: &Path) -> Result<StallTotals, CgroupError> {
        read_pressure(&existing_dir(&self.root, cgroup)?, "io.pressure")
    }

    fn workingset_refaults(&self, cgroup: &Path) -> Result<u64, CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        let text = read_file(&dir, "memory.stat")?.unwrap_or_default();
        let get = |key: &str| flat_keyed(&text, key);
        let pages = match (
            get("workingset_refault_anon"),
            get("workingset_refault_file"),
            get("workingset_refault"),
        ) {
            (Some(anon), Some(file), _) => anon.saturating_add(file),
            (None, None, Some(all)) => all,
            _ => {
                return Err(CgroupError::Unsupported {
                    what: "memory.stat workingset_refault",
                    version: CgroupVersion::V2,
                })
            }
        };
        Ok(pages.saturating_mul(page_size()))
    }

    fn cache_stat(&self, cgroup: &Path) -> Result<CacheStat, CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        let usage = required(&dir, "memory.current", read_u64(&dir, "memory.current")?)?;
        let text = required(&dir, "memory.stat", read_file(&dir, "memory.stat")?)?;
        let get = |key: &'static str| {
            flat_keyed(&text, key).ok_or_else(|| parse_err(&dir, "memory.stat", key))
        };
        Ok(CacheStat {
            usage,
            anon: get("anon")?,
            file: get("file")?,
            shmem: get("shmem")?,
            active_file: get("active_file")?,
            inactive_file: get("inactive_file")?,
            // `workingset_refault` before 5.9 counts anonymous refaults too: still refaults.
            refaulted_file: flat_keyed(&text, "workingset_refault_file")
                .or_else(|| flat_keyed(&text, "workingset_refault"))
                .unwrap_or(0)
                .saturating_mul(page_size()),
        })
    }

    fn reclaim_page_cache(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        let dir = existing_dir(&self.root, cgroup)?;
        if !dir.join("memory.reclaim").exists() {
            return Err(CgroupError::Unsupported {
                what: "memory.reclaim",
                version: CgroupVersion::V2,
            });
        }
        write_file(&dir, "memory.reclaim", &format!("{bytes} swappiness=0"))
    }
}

impl Cgroups {
    fn io(&self) -> &dyn CgroupIo {
        match self {
            Self::V1(v) => v,
            Self::V2(v) => v,
            #[cfg(feature = "fault-injection")]
            Self::Slow(v) => v,
            #[cfg(test)]
            Self::OffWorkerOnly(v) => v,
            #[cfg(test)]
            Self::Gated(v) => v,
        }
    }
}

impl CgroupIo for Cgroups {
    fn version(&self) -> CgroupVersion {
        self.io().version()
    }

    fn read_actual(&self, cgroup: &Path) -> Result<ActualResources, CgroupError> {
        self.io().read_actual(cgroup)
    }

    fn read_limits(&self, cgroup: &Path) -> Result<CgroupLimits, CgroupError> {
        self.io().read_limits(cgroup)
    }

    fn read_limits_of(
        &self,
        cgroup: &Path,
        cpu: bool,
        memory: bool,
    ) -> Result<CgroupLimits, CgroupError> {
        self.io().read_limits_of(cgroup, cpu, memory)
    }

    fn set_cpu_limit(&self, cgroup: &Path, limit: CpuLimit) -> Result<(), CgroupError> {
        self.io().set_cpu_limit(cgroup, limit)
    }

    fn set_memory_limit(&self, cgroup: &Path, limit: Option<u64>) -> Result<(), CgroupError> {
        self.io().set_memory_limit(cgroup, limit)
    }

    fn memory_use(&self, cgroup: &Path) -> Result<MemoryUse, CgroupError> {
        self.io().memory_use(cgroup)
    }

    fn reclaim(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        self.io().reclaim(cgroup, bytes)
    }

    fn set_memory_high(&self, cgroup: &Path, high: Option<u64>) -> Result<(), CgroupError> {
        self.io().set_memory_high(cgroup, high)
    }

    fn memory_high(&self, cgroup: &Path) -> Result<Option<u64>, CgroupError> {
        self.io().memory_high(cgroup)
    }

    fn memory_pressure(&self, cgroup: &Path) -> Result<StallTotals, CgroupError> {
        self.io().memory_pressure(cgroup)
    }

    fn io_pressure(&self, cgroup: &Path) -> Result<StallTotals, CgroupError> {
        self.io().io_pressure(cgroup)
    }

    fn workingset_refaults(&self, cgroup: &Path) -> Result<u64, CgroupError> {
        self.io().workingset_refaults(cgroup)
    }

    fn cache_stat(&self, cgroup: &Path) -> Result<CacheStat, CgroupError> {
        self.io().cache_stat(cgroup)
    }

    fn reclaim_page_cache(&self, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        self.io().reclaim_page_cache(cgroup, bytes)
    }

    fn procs(&self, cgroup: &Path) -> Result<Vec<u32>, CgroupError> {
        self.io().procs(cgroup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, value: &str) {
        std::fs::write(dir.join(file), value).expect("write fixture");
    }

    fn v1_fixture() -> (tempfile::TempDir, Cgroups) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cpu = tmp.path().join("cpu");
        let memory = tmp.path().join("memory");
        let c = cpu.join("pod1/ctr");
        let m = memory.join("pod1/ctr");
        std::fs::create_dir_all(&c).expect("mkdir");
        std::fs::create_dir_all(&m).expect("mkdir");
        write(&c, "cpu.cfs_quota_us", "10000\n");
        write(&c, "cpu.cfs_period_us", "100000\n");
        write(&c, "cpu.shares", "102\n");
        write(&m, "memory.limit_in_bytes", "104857600\n");
        write(&m, "memory.soft_limit_in_bytes", "9223372036854771712\n");
        write(&m, "memory.usage_in_bytes", "4096\n");
        (tmp, Cgroups::V1(V1 { cpu, memory }))
    }

    fn v2_fixture() -> (tempfile::TempDir, Cgroups) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path().join("pod1/ctr");
        std::fs::create_dir_all(&d).expect("mkdir");
        write(&d, "cpu.max", "20000 100000\n");
        write(&d, "cpu.weight", "4\n");
        write(&d, "memory.max", "max\n");
        write(&d, "memory.high", "67108864\n");
        write(&d, "memory.current", "8192\n");
        let root = tmp.path().to_owned();
        (tmp, Cgroups::V2(V2 { root }))
    }

    #[test]
    fn reads_v1_actual_values_under_an_injected_root() {
        let (_tmp, cg) = v1_fixture();
        assert_eq!(cg.version(), CgroupVersion::V1);
        let a = cg.read_actual(Path::new("/pod1/ctr")).expect("read");
        assert_eq!(
            a,
            ActualResources {
                cpu_quota: Some(10_000),
                cpu_period: Some(100_000),
                cpu_shares: Some(102),
                cpu_weight: None,
                memory_limit: Some(100 << 20),
                memory_soft_limit: Some(-1),
                memory_usage: Some(4096),
            }
        );
        assert_eq!(a.cpu_limit_millis(), Some(100));
    }

    #[test]
    fn reads_v2_actual_values_under_an_injected_root() {
        let (_tmp, cg) = v2_fixture();
        let a = cg.read_actual(Path::new("/pod1/ctr")).expect("read");
        assert_eq!(
            a,
            ActualResources {
                cpu_quota: Some(20_000),
                cpu_period: Some(100_000),
                cpu_shares: None,
                cpu_weight: Some(4),
                memory_limit: Some(-1),
                memory_soft_limit: Some(64 << 20),
                memory_usage: Some(8192),
            }
        );
        assert_eq!(a.cpu_limit_millis(), Some(200));
    }

    #[test]
    fn limits_of_one_resource_read_only_its_files() {
        let (tmp, v1) = v1_fixture();
        let ctr = Path::new("/pod1/ctr");
        assert_eq!(
            v1.read_limits(ctr).expect("both"),
            CgroupLimits {
                cpu_quota: Some(10_000),
                cpu_period: Some(100_000),
                memory_limit: Some(100 << 20),
            }
        );
        // The memory hierarchy's directory gone: a CPU-only read does not go there.
        std::fs::remove_dir_all(tmp.path().join("memory/pod1")).expect("rm");
        assert_eq!(
            v1.read_limits_of(ctr, true, false).expect("cpu only"),
            CgroupLimits {
                cpu_quota: Some(10_000),
                cpu_period: Some(100_000),
                memory_limit: None,
            }
        );
        assert!(matches!(
            v1.read_limits_of(ctr, false, true),
            Err(CgroupError::Missing { .. })
        ));
        let (tmp2, v2) = v2_fixture();
        std::fs::write(tmp2.path().join("pod1/ctr/cpu.max"), "garbage").expect("write");
        assert_eq!(
            v2.read_limits_of(ctr, false, true).expect("memory only"),
            CgroupLimits {
                cpu_quota: None,
                cpu_period: None,
                memory_limit: Some(-1),
            }
        );
        assert!(
            v2.read_limits_of(ctr, true, false).is_err(),
            "cpu.max is read"
        );
    }

    #[test]
    fn writes_pod_limits_in_each_version_format() {
        let (tmp, v1) = v1_fixture();
        let pod = Path::new("/pod1");
        std::fs::create_dir_all(tmp.path().join("cpu/pod1")).expect("mkdir");
        v1.set_cpu_limit(
            pod,
            CpuLimit {
                quota: Some(50_000),
                period: 100_000,
            },
        )
        .expect("set cpu");
        v1.set_memory_limit(pod, Some(256 << 20)).expect("set mem");
        let read = |p: &str| std::fs::read_to_string(tmp.path().join(p)).expect("read");
        assert_eq!(read("cpu/pod1/cpu.cfs_quota_us"), "50000");
        assert_eq!(read("cpu/pod1/cpu.cfs_period_us"), "100000");
        assert_eq!(read("memory/pod1/memory.limit_in_bytes"), "268435456");
        v1.set_cpu_limit(
            pod,
            CpuLimit {
                quota: None,
                period: 100_000,
            },
        )
        .expect("unlimit");
        assert_eq!(read("cpu/pod1/cpu.cfs_quota_us"), "-1");

        let (tmp2, v2) = v2_fixture();
        v2.set_cpu_limit(
            pod,
            CpuLimit {
                quota: None,
                period: 100_000,
            },
        )
        .expect("set cpu");
        v2.set_memory_limit(pod, None).expect("set mem");
        let read2 = |p: &str| std::fs::read_to_string(tmp2.path().join(p)).expect("read");
        assert_eq!(read2("pod1/cpu.max"), "max 100000");
        assert_eq!(read2("pod1/memory.max"), "max");
    }

    #[test]
    fn bad_or_absent_paths_are_clear_errors() {
        let (_tmp, cg) = v2_fixture();
        let err = cg.read_actual(Path::new("/pod1/gone")).expect_err("absent");
        assert!(
            matches!(&err, CgroupError::Missing { path } if path.ends_with("pod1/gone")),
            "{err}"
        );
        // `read_limits` does not `stat` the cgroup first: its first file's read tells.
        let err = cg.read_limits(Path::new("/pod1/gone")).expect_err("absent");
        assert!(
            matches!(&err, CgroupError::Missing { path } if path.ends_with("pod1/gone")),
            "{err}"
        );
        for bad in ["/pod1/../../etc", "relative", ""] {
            let err = cg.read_actual(Path::new(bad)).expect_err(bad);
            assert!(
                matches!(
                    err,
                    CgroupError::Traversal { .. }
                        | CgroupError::RelativePath { .. }
                        | CgroupError::EmptyPath
                ),
                "{bad:?}: {err}"
            );
            let err = cg.set_memory_limit(Path::new(bad), Some(1)).expect_err(bad);
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn write_errors_carry_path_value_and_errno() {
        let (tmp, cg) = v2_fixture();
        // A directory where the file should be: EISDIR, reported as a plain write error.
        std::fs::create_dir_all(tmp.path().join("pod1/memory.max")).expect("mkdir");
        let err = cg
            .set_memory_limit(Path::new("/pod1"), Some(4096))
            .expect_err("EISDIR");
        assert!(
            matches!(&err, CgroupError::Write { path, value, .. }
                if path.ends_with("pod1/memory.max") && value == "4096"),
            "{err}"
        );
        assert_eq!(err.errno(), Some(libc::EISDIR));
        // The kernel's EINVAL/EBUSY cannot be produced in a temp dir: the mapping on its own.
        let p = PathBuf::from("/x/memory.max");
        let e = |errno| std::io::Error::from_raw_os_error(errno);
        let einval = write_error(p.clone(), "1", e(libc::EINVAL));
        assert!(
            matches!(einval, CgroupError::InvalidValue { .. }),
            "{einval}"
        );
        assert!(einval.to_string().contains("EINVAL"), "{einval}");
        let ebusy = write_error(p, "1", e(libc::EBUSY));
        assert!(matches!(ebusy, CgroupError::Busy { .. }), "{ebusy}");
        assert_eq!(ebusy.errno(), Some(libc::EBUSY));
    }

    #[test]
    fn memory_use_and_reclaim_in_each_version() {
        let (tmp, v1) = v1_fixture();
        write(
            &tmp.path().join("memory/pod1/ctr"),
            "memory.stat",
            "cache 1\nrss 2\ntotal_cache 300\ntotal_rss 100\ntotal_shmem 7\n",
        );
        let ctr = Path::new("/pod1/ctr");
        assert_eq!(
            v1.memory_use(ctr).expect("v1 use"),
            MemoryUse {
                usage: 4096,
                anon: 100,
                shmem: 7,
                file: 300
            }
        );
        assert!(matches!(
            v1.reclaim(ctr, 1),
            Err(CgroupError::Unsupported { .. })
        ));
        assert!(matches!(
            v1.set_memory_high(ctr, None),
            Err(CgroupError::Unsupported { .. })
        ));

        let (tmp, v2) = v2_fixture();
        let dir = tmp.path().join("pod1/ctr");
        write(
            &dir,
            "memory.stat",
            "anon 50\nfile 60\nshmem 5\nfile_mapped 1\n",
        );
        assert_eq!(
            v2.memory_use(ctr).expect("v2 use"),
            MemoryUse {
                usage: 8192,
                anon: 50,
                shmem: 5,
                file: 60
            }
        );
        // No memory.reclaim file (a kernel before 5.19): unsupported, nothing written.
        assert!(matches!(
            v2.reclaim(ctr, 4096),
            Err(CgroupError::Unsupported { .. })
        ));
        write(&dir, "memory.reclaim", "");
        v2.reclaim(ctr, 4096).expect("reclaim");
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.reclaim")).expect("read"),
            "4096"
        );
        v2.set_memory_high(ctr, Some(1 << 20)).expect("high");
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.high")).expect("read"),
            "1048576"
        );
        v2.set_memory_high(ctr, None).expect("high max");
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.high")).expect("read"),
            "max"
        );
    }

    #[test]
    fn a_missing_usage_file_is_an_error_not_zero_usage() {
        let (tmp, v1) = v1_fixture();
        let ctr = Path::new("/pod1/ctr");
        std::fs::remove_file(tmp.path().join("memory/pod1/ctr/memory.usage_in_bytes")).expect("rm");
        let err = v1.memory_use(ctr).expect_err("no usage file");
        assert!(matches!(err, CgroupError::MissingFile { .. }), "{err}");
        assert!(err.to_string().contains("memory.usage_in_bytes"), "{err}");

        let (tmp, v2) = v2_fixture();
        std::fs::remove_file(tmp.path().join("pod1/ctr/memory.current")).expect("rm");
        let err = v2.memory_use(ctr).expect_err("no usage file");
        assert!(matches!(err, CgroupError::MissingFile { .. }), "{err}");
        assert!(err.to_string().contains("memory.current"), "{err}");
    }

    #[test]
    fn garbage_in_a_file_is_a_parse_error_naming_it() {
        let (tmp, cg) = v2_fixture();
        write(&tmp.path().join("pod1/ctr"), "cpu.max", "lots\n");
        let err = cg.read_actual(Path::new("/pod1/ctr")).expect_err("garbage");
        assert!(err.to_string().contains("cpu.max"), "{err}");
    }

    #[test]
    fn reclaim_harm_reads_io_pressure_and_refaults_on_v2_only() {
        let (tmp, cg) = v2_fixture();
        let (dir, ctr) = (tmp.path().join("pod1/ctr"), Path::new("/pod1/ctr"));
        assert!(matches!(
            cg.io_pressure(ctr),
            Err(CgroupError::Unsupported {
                what: "io.pressure",
                ..
            })
        ));
        write(&dir, "io.pressure", "some avg10=1.00 avg60=0.50 avg300=0.10 total=4321\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=99\n");
        assert_eq!(cg.io_pressure(ctr).expect("io.pressure").some_us, 4321);
        write(
            &dir,
            "memory.stat",
            "anon 1\nworkingset_refault_anon 3\nworkingset_refault_file 40\n",
        );
        assert_eq!(
            cg.workingset_refaults(ctr).expect("refaults"),
            43 * page_size()
        );
        write(&dir, "memory.stat", "anon 1\nworkingset_refault 7\n");
        assert_eq!(
            cg.workingset_refaults(ctr).expect("before 5.9"),
            7 * page_size()
        );
        write(&dir, "memory.stat", "anon 1\n");
        assert!(cg.workingset_refaults(ctr).is_err());
        let (_tmp1, v1) = v1_fixture();
        assert!(v1.io_pressure(ctr).is_err() && v1.workingset_refaults(ctr).is_err());
    }

    #[test]
    fn trimming_reads_the_cache_breakdown_and_asks_for_page_cache_only() {
        let (tmp, cg) = v2_fixture();
        let (dir, ctr) = (tmp.path().join("pod1/ctr"), Path::new("/pod1/ctr"));
        write(&dir, "memory.stat", "anon 1\nfile 60\n");
        let err = cg.cache_stat(ctr).expect_err("no shmem");
        assert!(err.to_string().contains("shmem"), "{err}");
        write(
            &dir,
            "memory.stat",
            "anon 10\nfile 60\nshmem 5\nactive_file 20\ninactive_file 35\nworkingset_refault_file 2\n",
        );
        assert_eq!(
            cg.cache_stat(ctr).expect("stat"),
            CacheStat {
                usage: 8192,
                anon: 10,
                file: 60,
                shmem: 5,
                active_file: 20,
                inactive_file: 35,
                refaulted_file: 2 * page_size(),
            }
        );
        assert!(matches!(
            cg.reclaim_page_cache(ctr, 4096),
            Err(CgroupError::Unsupported { .. })
        ));
        write(&dir, "memory.reclaim", "");
        cg.reclaim_page_cache(ctr, 4096).expect("reclaim");
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.reclaim")).expect("read"),
            "4096 swappiness=0"
        );
        let (_tmp1, v1) = v1_fixture();
        assert!(v1.cache_stat(ctr).is_err() && v1.reclaim_page_cache(ctr, 1).is_err());
    }
}
