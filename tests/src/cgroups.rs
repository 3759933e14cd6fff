//! The harness's own cgroup tree: `/nri-resize-test-<pid>-<n>` and the pod cgroups under it.
//!
//! On cgroup v1 (this project's CI machines are hybrid: v1 controllers plus a controller-less
//! cgroup2 at `/sys/fs/cgroup/unified`) the tree is created in the `cpu`, `cpuacct`, `cpuset`,
//! `memory` and `pids` hierarchies and in the unified hierarchy, like kubelet's cgroupfs driver.
//! runc then creates container cgroups `<pod cgroup>/<container id>` in *every* mounted
//! hierarchy (also `devices`, `freezer`, `blkio`, `name=systemd`), so removal walks all of them.
//! On a pure cgroup v2 host the tree lives in `/sys/fs/cgroup` with `cpu`, `cpuset`, `memory`
//! and `pids` enabled in `cgroup.subtree_control`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::systemd::{self, CgroupDriver, Property};
use crate::util::poll_blocking;

/// Which cgroup layout the host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupMode {
    /// cgroup v1 controllers (legacy or hybrid).
    V1,
    /// Unified cgroup v2 only.
    V2,
}

impl CgroupMode {
    /// v2 if `/sys/fs/cgroup/cgroup.controllers` exists, else v1.
    pub fn detect() -> Self {
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            Self::V2
        } else {
            Self::V1
        }
    }
}

/// v1 controllers kubelet's cgroupfs driver creates pod cgroups in.
const V1_CONTROLLERS: [&str; 5] = ["cpu", "cpuacct", "cpuset", "memory", "pids"];
/// v2 controllers the harness enables for its tree.
const V2_CONTROLLERS: [&str; 4] = ["cpu", "cpuset", "memory", "pids"];
/// What systemd keeps enabled for the systemd driver's slices (their properties need them).
const V2_SYSTEMD_CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];

/// v1 memory "unlimited" is `PAGE_COUNTER_MAX * PAGE_SIZE`; anything this large is unlimited.
const V1_UNLIMITED: u64 = 1 << 62;

/// Limits of a pod cgroup, as kubelet's cgroupfs driver writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupLimits {
    /// CFS quota in µs per period; `None` = unlimited (`-1` / `max`).
    pub cpu_quota: Option<i64>,
    /// CFS period in µs (usually 100000).
    pub cpu_period: u64,
    /// `cpu.shares` (v1). On v2 written as `cpu.weight` with kubelet's conversion and read
    /// back with the inverse conversion, which may differ by rounding.
    pub cpu_shares: u64,
    /// Memory limit in bytes; `None` = unlimited.
    pub memory_limit: Option<u64>,
}

impl Default for CgroupLimits {
    fn default() -> Self {
        Self {
            cpu_quota: None,
            cpu_period: 100_000,
            cpu_shares: 1024,
            memory_limit: None,
        }
    }
}

/// kubelet's `CPUSharesToCPUWeight`.
pub fn shares_to_weight(shares: u64) -> u64 {
    1 + (shares.clamp(2, 262_144) - 2) * 9999 / 262_142
}

/// Inverse of [`shares_to_weight`] (lossy).
pub fn weight_to_shares(weight: u64) -> u64 {
    2 + (weight.clamp(1, 10_000) - 1) * 262_142 / 9999
}

/// A mounted cgroup hierarchy.
#[derive(Debug, Clone)]
struct Hierarchy {
    mount: PathBuf,
    /// v1 controllers (and `name=...`) of the hierarchy; empty for cgroup2.
    controllers: Vec<String>,
    v2: bool,
}

fn hierarchies() -> Vec<Hierarchy> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    let mut out = Vec::new();
    for line in info.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 3 {
            continue;
        }
        let mount = PathBuf::from(unescape_mountinfo(pre[4]));
        match post[0] {
            "cgroup2" => out.push(Hierarchy {
                mount,
                controllers: Vec::new(),
                v2: true,
            }),
            "cgroup" => {
                let controllers = post[2]
                    .split(',')
                    .filter(|o| {
                        !matches!(*o, "rw" | "ro") && !o.contains('=') || o.starts_with("name=")
                    })
                    .map(str::to_owned)
                    .collect();
                out.push(Hierarchy {
                    mount,
                    controllers,
                    v2: false,
                });
            }
            _ => {}
        }
    }
    out
}

pub(crate) fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The harness's cgroup tree `/<name>`, created by `Containerd::start` and removed (with
/// everything below it, in every hierarchy) when the owning `Containerd` is dropped.
#[derive(Debug, Clone)]
pub struct CgroupTree {
    /// Absolute cgroup path, e.g. `/nri-resize-test-1234-0` (cgroupfs driver) or
    /// `/nri_resize_test_1234_0.slice` (systemd driver).
    path: String,
    mode: CgroupMode,
    driver: CgroupDriver,
}

impl CgroupTree {
    /// Describes the tree without touching the filesystem. A path ending in `.slice` is a
    /// systemd slice (the systemd driver's tree), anything else a directory.
    pub(crate) fn new(path: String) -> Self {
        let driver = if systemd::is_slice(&path) {
            CgroupDriver::Systemd
        } else {
            CgroupDriver::Cgroupfs
        };
        Self {
            path,
            mode: CgroupMode::detect(),
            driver,
        }
    }

    /// The tree of harness instance `n` of process `pid` for `driver`: `/<prefix><pid>-<n>`,
    /// or the slice `<prefix with _><pid>_<n>.slice` (a dash would nest it).
    pub(crate) fn for_instance(driver: CgroupDriver, prefix: &str, pid: u32, n: u32) -> Self {
        Self::new(match driver {
            CgroupDriver::Cgroupfs => format!("/{prefix}{pid}-{n}"),
            CgroupDriver::Systemd => {
                systemd::slice_path(&format!("{}{pid}_{n}.slice", systemd::escape(prefix)))
            }
        })
    }

    /// kubelet's driver this tree is made by.
    pub fn driver(&self) -> CgroupDriver {
        self.driver
    }

    /// A pod's cgroup: `(cgroup_parent as sent to CRI, absolute cgroup path)`. cgroupfs:
    /// `/<tree>/pod<uid>` both; systemd: the slice `<tree>-pod<uid with _>.slice` and its path,
    /// as kubelet names `kubepods-pod<uid>.slice`.
    pub fn pod_cgroup(&self, uid: &str) -> (String, String) {
        match self.driver {
            CgroupDriver::Cgroupfs => {
                let path = format!("{}/pod{uid}", self.path);
                (path.clone(), path)
            }
            CgroupDriver::Systemd => {
                let slice = format!(
                    "{}-pod{}.slice",
                    self.unit().trim_end_matches(".slice"),
                    systemd::escape(uid)
                );
                let path = systemd::slice_path(&slice);
                (slice, path)
            }
        }
    }

    /// The systemd unit of the tree (its last path component).
    fn unit(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or_default()
    }

    /// The systemd slice unit of `cgroup` when the systemd driver manages it.
    fn slice_of(&self, cgroup: &str) -> Option<String> {
        let last = cgroup.rsplit('/').next().unwrap_or_default();
        (self.driver == CgroupDriver::Systemd && systemd::is_slice(last)).then(|| last.to_owned())
    }

    /// Absolute cgroup path of the tree root (e.g. `/nri-resize-test-1234-0`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The host's cgroup mode.
    pub fn mode(&self) -> CgroupMode {
        self.mode
    }

    /// Directory of cgroup `rel` (absolute cgroup path) in the hierarchy of `controller`
    /// (v1; ignored on v2). Panics if that controller is not mounted.
    pub fn dir_for(&self, controller: &str, cgroup: &str) -> PathBuf {
        let rel = cgroup.trim_start_matches('/');
        match self.mode {
            CgroupMode::V2 => PathBuf::from("/sys/fs/cgroup").join(rel),
            CgroupMode::V1 => {
                let h = hierarchies()
                    .into_iter()
                    .find(|h| !h.v2 && h.controllers.iter().any(|c| c == controller))
                    .unwrap_or_else(|| panic!("cgroup v1 controller {controller} is not mounted"));
                h.mount.join(rel)
            }
        }
    }

    /// Directories in which the harness creates its cgroups (v1: one per controller plus
    /// unified; v2: one).
    fn managed_dirs(&self, cgroup: &str) -> Vec<PathBuf> {
        let rel = cgroup.trim_start_matches('/');
        match self.mode {
            CgroupMode::V2 => vec![PathBuf::from("/sys/fs/cgroup").join(rel)],
            CgroupMode::V1 => {
                let hs = hierarchies();
                let mut dirs: Vec<PathBuf> = V1_CONTROLLERS
                    .iter()
                    .map(|c| self.dir_for(c, cgroup))
                    .collect();
                dirs.extend(hs.iter().filter(|h| h.v2).map(|h| h.mount.join(rel)));
                dirs.sort();
                dirs.dedup();
                dirs
            }
        }
    }

    /// Creates the tree root. Panics with context on failure.
    pub(crate) fn create(&self) {
        if self.mode == CgroupMode::V2 {
            self.enable_controllers(Path::new("/sys/fs/cgroup"));
        }
        self.create_cgroup(&self.path);
        if self.driver == CgroupDriver::Systemd {
            // systemd realizes the root's `cgroup.subtree_control` again when a unit starts:
            // libcontainer enables its controllers on every ancestor after the unit is up.
            self.enable_controllers(Path::new("/sys/fs/cgroup"));
        }
        if self.mode == CgroupMode::V2 {
            self.enable_controllers(&self.dir_for("", &self.path));
        }
    }

    /// Creates cgroup `cgroup` (absolute path below the tree) in every managed hierarchy,
    /// copying `cpuset.cpus`/`cpuset.mems` from the parent on v1.
    pub fn create_cgroup(&self, cgroup: &str) {
        assert!(
            cgroup.starts_with(&self.path),
            "{cgroup} is not under {}",
            self.path
        );
        if let Some(slice) = self.slice_of(cgroup) {
            // A CPU weight from the start, as kubelet's (so systemd enables `cpu` for it).
            systemd::start_slice(&slice, &[Property::u64("CPUWeight", 100)])
                .unwrap_or_else(|e| panic!("create cgroup {cgroup} (systemd): {e}"));
        }
        for dir in self.managed_dirs(cgroup) {
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("create cgroup {}: {e}", dir.display()),
            }
            if self.mode == CgroupMode::V1 && dir.join("cpuset.cpus").exists() {
                let parent = dir.parent().expect("cgroup has a parent");
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = read_trim(&parent.join(f)).unwrap_or_else(|e| panic!("{e}"));
                    write(&dir.join(f), &v).unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
        if self.mode == CgroupMode::V2 && cgroup != self.path {
            self.enable_controllers(&self.dir_for("", cgroup));
        }
    }

    /// Writes limits to `cgroup` the way kubelet's driver does: the systemd driver first sets
    /// them as unit properties (libcontainer's `SetUnitProperties`), then both write the files.
    pub fn set_limits(&self, cgroup: &str, l: &CgroupLimits) -> io::Result<()> {
        if let Some(slice) = self.slice_of(cgroup) {
            systemd::set_properties(
                &slice,
                &[
                    Property::u64(
                        "CPUQuotaPerSecUSec",
                        systemd::cpu_quota_per_sec_usec(l.cpu_quota, l.cpu_period),
                    ),
                    Property::u64("CPUQuotaPeriodUSec", l.cpu_period),
                    Property::u64("CPUWeight", shares_to_weight(l.cpu_shares)),
                    Property::u64("MemoryMax", l.memory_limit.unwrap_or(systemd::INFINITY)),
                ],
            )?;
        }
        match self.mode {
            CgroupMode::V1 => {
                let cpu = self.dir_for("cpu", cgroup);
                write(&cpu.join("cpu.cfs_period_us"), &l.cpu_period.to_string())?;
                write(
                    &cpu.join("cpu.cfs_quota_us"),
                    &l.cpu_quota.unwrap_or(-1).to_string(),
                )?;
                write(&cpu.join("cpu.shares"), &l.cpu_shares.to_string())?;
                let mem = self.dir_for("memory", cgroup);
                let m = l
                    .memory_limit
                    .map_or_else(|| "-1".to_owned(), |m| m.to_string());
                write(&mem.join("memory.limit_in_bytes"), &m)
            }
            CgroupMode::V2 => {
                let dir = self.dir_for("", cgroup);
                let quota = l
                    .cpu_quota
                    .map_or_else(|| "max".to_owned(), |q| q.to_string());
                write(&dir.join("cpu.max"), &format!("{quota} {}", l.cpu_period))?;
                write(
                    &dir.join("cpu.weight"),
                    &shares_to_weight(l.cpu_shares).to_string(),
                )?;
                let m = l
                    .memory_limit
                    .map_or_else(|| "max".to_owned(), |m| m.to_string());
                write(&dir.join("memory.max"), &m)
            }
        }
    }

    /// Reads the limits of `cgroup`.
    pub fn limits(&self, cgroup: &str) -> io::Result<CgroupLimits> {
        match self.mode {
            CgroupMode::V1 => {
                let cpu = self.dir_for("cpu", cgroup);
                let quota: i64 = parse(&cpu.join("cpu.cfs_quota_us"))?;
                let mem: u64 =
                    parse(&self.dir_for("memory", cgroup).join("memory.limit_in_bytes"))?;
                Ok(CgroupLimits {
                    cpu_quota: (quota >= 0).then_some(quota),
                    cpu_period: parse(&cpu.join("cpu.cfs_period_us"))?,
                    cpu_shares: parse(&cpu.join("cpu.shares"))?,
                    memory_limit: (mem < V1_UNLIMITED).then_some(mem),
                })
            }
            CgroupMode::V2 => {
                let dir = self.dir_for("", cgroup);
                let max = read_trim(&dir.join("cpu.max"))?;
                let (q, p) = max.split_once(' ').unwrap_or((max.as_str(), "100000"));
                let bad = |what: &str| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{}: bad {what}", dir.display()),
                    )
                };
                let mem = read_trim(&dir.join("memory.max"))?;
                Ok(CgroupLimits {
                    cpu_quota: if q == "max" {
                        None
                    } else {
                        Some(q.parse().map_err(|_| bad("cpu.max"))?)
                    },
                    cpu_period: p.parse().map_err(|_| bad("cpu.max"))?,
                    cpu_shares: weight_to_shares(parse(&dir.join("cpu.weight"))?),
                    memory_limit: if mem == "max" {
                        None
                    } else {
                        Some(mem.parse().map_err(|_| bad("memory.max"))?)
                    },
                })
            }
        }
    }

    /// Adds the harness's v2 controllers to `dir/cgroup.subtree_control`, as libcontainer does
    /// on every ancestor. With the systemd driver, systemd owns `cgroup.subtree_control` and
    /// writes it again whenever it realizes a unit, keeping what its units' properties need
    /// (`CPUWeight`: cpu; accounting: memory, pids, io): those are the ones checked.
    fn enable_controllers(&self, dir: &Path) {
        match self.driver {
            CgroupDriver::Cgroupfs => enable_controllers(dir, &V2_CONTROLLERS),
            CgroupDriver::Systemd => enable_controllers(dir, &V2_SYSTEMD_CONTROLLERS),
        }
    }

    /// Every directory of the tree, in every mounted hierarchy, deepest first.
    fn all_dirs(&self) -> Vec<PathBuf> {
        let rel = self.path.trim_start_matches('/');
        let mut out = Vec::new();
        for h in hierarchies() {
            let root = h.mount.join(rel);
            if root.is_dir() {
                collect_dirs(&root, &mut out);
            }
        }
        out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        out
    }

    /// Removes cgroup `cgroup` (below the tree) and everything under it in every hierarchy,
    /// retrying for up to 2 s while it still holds processes.
    pub(crate) fn remove_cgroup(&self, cgroup: &str) -> io::Result<()> {
        assert!(
            cgroup.starts_with(&format!("{}/", self.path)),
            "{cgroup} is not below {}",
            self.path
        );
        if let Some(slice) = self.slice_of(cgroup) {
            systemd::stop_unit(&slice)?;
        }
        let rel = cgroup.trim_start_matches('/');
        let mut last: Option<io::Error> = None;
        poll_blocking(Duration::from_secs(2), || {
            let mut dirs = Vec::new();
            for h in hierarchies() {
                let d = h.mount.join(rel);
                if d.is_dir() {
                    collect_dirs(&d, &mut dirs);
                }
            }
            dirs.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            last = None;
            for d in dirs {
                if let Err(e) = std::fs::remove_dir(&d) {
                    if e.kind() != io::ErrorKind::NotFound {
                        last = Some(io::Error::new(
                            e.kind(),
                            format!("rmdir {}: {e}", d.display()),
                        ));
                    }
                }
            }
            last.is_none()
        });
        last.map_or(Ok(()), Err)
    }

    /// Pids of all processes in the tree (any hierarchy).
    pub fn procs(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .all_dirs()
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|s| {
                s.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// True if any directory of the tree still exists in any hierarchy.
    pub fn exists(&self) -> bool {
        !self.all_dirs().is_empty()
    }

    /// Finds the directory named `name` below the tree in the hierarchy of `controller`.
    pub fn find_dir(&self, controller: &str, name: &str) -> Option<PathBuf> {
        let root = self.dir_for(controller, &self.path);
        let mut dirs = Vec::new();
        if root.is_dir() {
            collect_dirs(&root, &mut dirs);
        }
        dirs.into_iter()
            .find(|d| d.file_name().is_some_and(|n| n == name))
    }

    /// SIGKILLs every process in the tree, then removes all its directories bottom-up in
    /// every hierarchy. Returns the directories that could not be removed.
    pub(crate) fn remove(&self) -> Vec<PathBuf> {
        let gone = poll_blocking(Duration::from_secs(5), || {
            let pids = self.procs();
            for pid in &pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            pids.is_empty()
        });
        if !gone {
            tracing::warn!(cgroup = %self.path, pids = ?self.procs(), "processes survive in test cgroups");
        }
        if let Some(slice) = self.slice_of(&self.path) {
            if let Err(e) = systemd::stop_unit(&slice) {
                tracing::warn!(%slice, "stop the harness's slice: {e}");
            }
        }
        let mut left = Vec::new();
        poll_blocking(Duration::from_secs(3), || {
            left.clear();
            for d in self.all_dirs() {
                if let Err(e) = std::fs::remove_dir(&d) {
                    if e.kind() != io::ErrorKind::NotFound {
                        left.push(d);
                    }
                }
            }
            left.is_empty()
        });
        left
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// Adds (never removes) `controllers` to `dir/cgroup.subtree_control`.
fn enable_controllers(dir: &Path, controllers: &[&str]) {
    let available = read_trim(&dir.join("cgroup.controllers")).unwrap_or_else(|e| panic!("{e}"));
    let enabled = read_trim(&dir.join("cgroup.subtree_control")).unwrap_or_else(|e| panic!("{e}"));
    for &c in controllers {
        if enabled.split(' ').any(|e| e == c) {
            continue;
        }
        assert!(
            available.split(' ').any(|a| a == c),
            "cgroup v2 controller {c} is not available in {} (cgroup.controllers: {available})",
            dir.display()
        );
        write(&dir.join("cgroup.subtree_control"), &format!("+{c}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

pub(crate) fn read_trim(path: &Path) -> io::Result<String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| io::Error::new(e.kind(), format!("read {}: {e}", path.display())))
}

fn parse<T: std::str::FromStr>(path: &Path) -> io::Result<T> {
    let s = read_trim(path)?;
    s.parse().map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: cannot parse {s:?}", path.display()),
        )
    })
}

pub(crate) fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("write {value:?} to {}: {e}", path.display()),
        )
    })
}
