//! Cgroup files kept open between reads, and the per-cgroup state of the OOM cross-check.
//!
//! Opening a cgroup file (path walk, kernfs open, `seq_file` set-up, close) costs several times
//! what reading it does. A cgroup file can be read again from an open descriptor: `pread` at
//! offset 0 makes kernfs' `seq_file` regenerate the content. An open descriptor does not keep the
//! cgroup alive — `rmdir` still succeeds and later reads fail with `ENODEV` — so a read that
//! fails on a kept descriptor drops it and opens the path again (which then reports the real
//! error, e.g. `ENOENT` for a removed cgroup, or reads a cgroup recreated at the same path).
//!
//! Descriptors are kept up to a budget (a quarter of `RLIMIT_NOFILE`, so the daemon's own
//! sockets never run short); beyond it files are opened per read, as before.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

use super::{CgroupKey, ObservedCgroup, ObserverError};

/// The cgroup files the observer reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CgroupFile {
    /// `cpu.stat` of the cpu cgroup.
    CpuStat,
    /// `memory.stat` of the memory cgroup.
    MemoryStat,
    /// `memory.oom_control` (v1) or `memory.events` (v2) of the memory cgroup.
    Oom,
    /// `cpu.pressure` (v2 only).
    CpuPressure,
    /// `memory.pressure` (v2 only).
    MemoryPressure,
    /// `io.pressure` (v2 only).
    IoPressure,
}

impl CgroupFile {
    const COUNT: usize = 6;

    fn index(self) -> usize {
        match self {
            Self::CpuStat => 0,
            Self::MemoryStat => 1,
            Self::Oom => 2,
            Self::CpuPressure => 3,
            Self::MemoryPressure => 4,
            Self::IoPressure => 5,
        }
    }
}

/// When the eBPF OOM strategy last checked the kernel's own `oom_kill` count of a cgroup.
#[derive(Debug, Default)]
pub(super) struct OomCrossCheck {
    /// The kernel's `oom_kill` at the last check (`None`: never checked, or no such line).
    pub kernel_oom_kill: Option<u64>,
    /// Whether the file was read at least once.
    pub checked: bool,
    /// Reads since the last check.
    pub reads_since: u32,
    /// The eBPF kill count seen at the previous read.
    pub ebpf_kills: Option<u64>,
    /// Reads left that check again because eBPF counted a kill the file did not show yet
    /// (`mark_victim` fires just before the kernel counts the kill in the memcg).
    pub recheck: u8,
}

impl OomCrossCheck {
    /// Reads after an eBPF-counted kill that re-read the file until it shows the kill.
    pub const RECHECKS: u8 = 3;

    /// Notes the eBPF count of this read; whether the file is due for a read, given that it is
    /// read at least every `every` reads.
    pub fn due(&mut self, ebpf_kills: u64, every: u32) -> bool {
        if self.ebpf_kills.is_some_and(|k| k != ebpf_kills) {
            self.recheck = Self::RECHECKS;
        }
        self.ebpf_kills = Some(ebpf_kills);
        self.reads_since = self.reads_since.saturating_add(1);
        !self.checked || self.recheck > 0 || self.reads_since >= every.max(1)
    }

    /// Records a file read that found `kernel_oom_kill`. `phase` (less than the period) only
    /// matters on the first check: it starts the cgroup's period part-way, so that cgroups
    /// first read together do not all come due on the same later read.
    pub fn checked(&mut self, kernel_oom_kill: Option<u64>, phase: u32) {
        if self.recheck > 0 {
            let moved = self.checked && kernel_oom_kill != self.kernel_oom_kill;
            self.recheck = if moved { 0 } else { self.recheck - 1 };
        }
        self.reads_since = if self.checked { 0 } else { phase };
        self.kernel_oom_kill = kernel_oom_kill;
        self.checked = true;
    }
}

#[derive(Debug, Default)]
struct CgroupState {
    files: [Option<File>; CgroupFile::COUNT],
    oom: OomCrossCheck,
}

/// Open cgroup files and cross-check state, per observed cgroup.
#[derive(Debug)]
pub(super) struct CgroupFiles {
    oom_file: &'static str,
    cgroups: HashMap<(CgroupKey, CgroupKey), CgroupState>,
    open: usize,
    budget: usize,
    path: PathBuf,
    bytes: Vec<u8>,
}

impl CgroupFiles {
    /// `budget`: most descriptors kept open (`None`: a quarter of the soft `RLIMIT_NOFILE`).
    pub fn new(v1: bool, budget: Option<usize>) -> Self {
        Self::with_budget(v1, budget.unwrap_or_else(default_budget))
    }

    pub fn with_budget(v1: bool, budget: usize) -> Self {
        Self {
            oom_file: if v1 {
                "memory.oom_control"
            } else {
                "memory.events"
            },
            cgroups: HashMap::new(),
            open: 0,
            budget,
            path: PathBuf::new(),
            bytes: Vec::new(),
        }
    }

    /// Number of descriptors currently kept open.
    pub fn open_files(&self) -> usize {
        self.open
    }

    /// The OOM cross-check state of `cgroup`.
    pub fn oom_check(&mut self, cgroup: &ObservedCgroup) -> &mut OomCrossCheck {
        &mut self
            .cgroups
            .entry((cgroup.cpu_key, cgroup.memory_key))
            .or_default()
            .oom
    }

    /// Reads `file` of `cgroup` whole, from a kept descriptor where there is one.
    pub fn read(
        &mut self,
        cgroup: &ObservedCgroup,
        file: CgroupFile,
    ) -> Result<&str, ObserverError> {
        let (dir, name): (&Path, &str) = match file {
            CgroupFile::CpuStat => (&cgroup.cpu_dir, "cpu.stat"),
            CgroupFile::MemoryStat => (&cgroup.memory_dir, "memory.stat"),
            CgroupFile::Oom => (&cgroup.memory_dir, self.oom_file),
            CgroupFile::CpuPressure => (&cgroup.cpu_dir, "cpu.pressure"),
            CgroupFile::MemoryPressure => (&cgroup.memory_dir, "memory.pressure"),
            CgroupFile::IoPressure => (&cgroup.memory_dir, "io.pressure"),
        };
        let state = self
            .cgroups
            .entry((cgroup.cpu_key, cgroup.memory_key))
            .or_default();
        let slot = &mut state.files[file.index()];
        let mut done = false;
        if let Some(kept) = slot.as_ref() {
            if read_whole(kept, &mut self.bytes).is_ok() {
                done = true;
            } else {
                *slot = None;
                self.open -= 1;
            }
        }
        if !done {
            self.path.clear();
            self.path.push(dir);
            self.path.push(name);
            let io_error = |path: &Path| {
                let path = path.to_owned();
                move |source| ObserverError::Io { path, source }
            };
            let opened = File::open(&self.path).map_err(io_error(&self.path))?;
            read_whole(&opened, &mut self.bytes).map_err(io_error(&self.path))?;
            if self.open < self.budget {
                *slot = Some(opened);
                self.open += 1;
            }
        }
        std::str::from_utf8(&self.bytes).map_err(|e| ObserverError::Io {
            path: dir.join(name),
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        })
    }

    /// Closes the files of a cgroup no longer observed and drops its state.
    pub fn forget(&mut self, cgroup: &ObservedCgroup) {
        if let Some(state) = self.cgroups.remove(&(cgroup.cpu_key, cgroup.memory_key)) {
            self.open -= state.files.iter().filter(|f| f.is_some()).count();
        }
    }
}

/// Reads the whole file from offset 0 into `buf` (kernfs regenerates it for a read at 0).
fn read_whole(file: &File, buf: &mut Vec<u8>) -> io::Result<()> {
    const CHUNK: usize = 4096;
    buf.clear();
    loop {
        let len = buf.len();
        buf.resize(len + CHUNK, 0);
        let n = file.read_at(&mut buf[len..], len as u64);
        match n {
            Ok(0) => {
                buf.truncate(len);
                return Ok(());
            }
            Ok(n) => buf.truncate(len + n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => buf.truncate(len),
            Err(e) => {
                buf.truncate(len);
                return Err(e);
            }
        }
    }
}

/// A quarter of the soft `RLIMIT_NOFILE` (256 at the common 1024), at least 0.
fn default_budget() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    #[expect(
        unsafe_code,
        reason = "getrlimit has no safe wrapper in the enabled nix features"
    )]
    // SAFETY: `limit` is a valid, writable `rlimit` owned by this frame.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) };
    if rc != 0 {
        return 0;
    }
    usize::try_from(limit.rlim_cur / 4).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    fn cgroup(dir: &Path) -> ObservedCgroup {
        ObservedCgroup {
            cpu_dir: dir.to_owned(),
            memory_dir: dir.to_owned(),
            cpu_key: CgroupKey::new(1, 2),
            memory_key: CgroupKey::new(3, 4),
        }
    }

    #[test]
    fn rereads_a_kept_descriptor_and_reopens_after_replacement() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cpu.stat"), "nr_throttled 1\n").expect("write");
        let c = cgroup(dir.path());
        let mut files = CgroupFiles::with_budget(true, 8);
        assert_eq!(
            files.read(&c, CgroupFile::CpuStat).expect("read"),
            "nr_throttled 1\n"
        );
        assert_eq!(files.open_files(), 1);
        // Rewritten in place: the kept descriptor sees the new content.
        std::fs::write(dir.path().join("cpu.stat"), "nr_throttled 22\n").expect("write");
        assert_eq!(
            files.read(&c, CgroupFile::CpuStat).expect("read"),
            "nr_throttled 22\n"
        );
        assert_eq!(files.open_files(), 1);
        files.forget(&c);
        assert_eq!(files.open_files(), 0);
        std::fs::remove_file(dir.path().join("cpu.stat")).expect("remove");
        let err = files.read(&c, CgroupFile::CpuStat).expect_err("gone");
        assert!(err.to_string().contains("cpu.stat"), "{err}");
    }

    #[test]
    fn budget_caps_kept_descriptors() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cpu.stat"), "a\n").expect("write");
        std::fs::write(dir.path().join("memory.stat"), "b\n").expect("write");
        let c = cgroup(dir.path());
        let mut files = CgroupFiles::with_budget(true, 1);
        assert_eq!(files.read(&c, CgroupFile::CpuStat).expect("read"), "a\n");
        assert_eq!(files.read(&c, CgroupFile::MemoryStat).expect("read"), "b\n");
        assert_eq!(files.open_files(), 1);
    }

    #[test]
    fn reads_files_longer_than_one_chunk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut long = String::new();
        for i in 0..2000 {
            writeln!(long, "key{i} {i}").expect("write to a String");
        }
        std::fs::write(dir.path().join("memory.stat"), &long).expect("write");
        let c = cgroup(dir.path());
        let mut files = CgroupFiles::with_budget(true, 1);
        assert_eq!(files.read(&c, CgroupFile::MemoryStat).expect("read"), long);
    }

    #[test]
    fn cross_check_is_due_first_every_nth_and_after_an_ebpf_kill() {
        let mut check = OomCrossCheck::default();
        let due: Vec<bool> = (0..7)
            .map(|_| {
                let due = check.due(0, 3);
                if due {
                    check.checked(Some(0), 0);
                }
                due
            })
            .collect();
        assert_eq!(due, [true, false, false, true, false, false, true]);
        // eBPF counts a kill the file does not show yet: re-read until it does (at most RECHECKS).
        assert!(check.due(1, 3));
        check.checked(Some(0), 0);
        assert!(check.due(1, 3));
        check.checked(Some(1), 0);
        assert!(
            !check.due(1, 3),
            "the file caught up: back to every 3rd read"
        );
        // The file never catches up: RECHECKS reads, then the cadence again.
        let mut rechecks = 0;
        for _ in 0..10 {
            if check.due(2, 100) {
                check.checked(Some(1), 0);
                rechecks += 1;
            }
        }
        assert_eq!(rechecks, usize::from(OomCrossCheck::RECHECKS));
    }

    #[test]
    fn first_check_phase_staggers_the_period() {
        let mut check = OomCrossCheck::default();
        assert!(check.due(0, 10));
        check.checked(Some(0), 7);
        let next = (1..=10)
            .find(|_| check.due(0, 10))
            .expect("due within a period");
        assert_eq!(next, 3, "phase 7 of 10: due again after 3 reads");
    }
}
