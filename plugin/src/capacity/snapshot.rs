//! Reading the node's CPUs and memory under an injectable root, and diffing two readings.
//!
//! | what | where (under the root, `/` on a node) |
//! |---|---|
//! | online / present CPUs | `sys/devices/system/cpu/{online,present}` (kernel list format) |
//! | memory blocks | `sys/devices/system/memory/block_size_bytes` (hex), `memoryN/state` |
//! | total memory | `proc/meminfo` `MemTotal` (through the `procfs` crate) |
//!
//! A kernel without memory hotplug has no `sys/devices/system/memory`: zero blocks, not an error.

use std::path::{Path, PathBuf};

use procfs::FromRead as _;

use crate::policy::CpuSet;
use crate::state::{CapacityChange, ChangeKind};

/// Node capacity could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parse {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}

/// One reading of the node's CPUs and memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub online_cpus: CpuSet,
    pub present_cpus: CpuSet,
    /// `MemTotal`, in bytes.
    pub memory_bytes: u64,
    /// Size of one memory block (0: no memory hotplug in this kernel).
    pub memory_block_bytes: u64,
    pub memory_blocks_online: u32,
    pub memory_blocks_present: u32,
}

/// What part of the node a trigger concerns: only that part is re-read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Cpu,
    Memory,
    All,
}

/// Reads [`NodeSnapshot`]s under a root.
#[derive(Debug, Clone)]
pub struct SysReader {
    root: PathBuf,
}

impl SysReader {
    /// `root` is `/` on a node; tests give a fixture directory.
    pub fn new(root: impl AsRef<Path>) -> Self {
        SysReader {
            root: root.as_ref().to_owned(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn text(&self, rel: &str) -> Result<(PathBuf, String), ReadError> {
        let path = self.root.join(rel);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok((path, text)),
            Err(source) => Err(ReadError::Io { path, source }),
        }
    }

    fn cpu_list(&self, rel: &str) -> Result<CpuSet, ReadError> {
        let (path, text) = self.text(rel)?;
        CpuSet::parse(text.trim()).map_err(|e| ReadError::Parse {
            path,
            reason: e.to_string(),
        })
    }

    /// Everything.
    pub fn read(&self) -> Result<NodeSnapshot, ReadError> {
        let mut s = NodeSnapshot::default();
        self.refresh(&mut s, Scope::All)?;
        Ok(s)
    }

    /// Re-reads the part of `s` that `scope` names. On error `s` is left as it was.
    pub fn refresh(&self, s: &mut NodeSnapshot, scope: Scope) -> Result<(), ReadError> {
        let mut next = s.clone();
        if matches!(scope, Scope::Cpu | Scope::All) {
            next.online_cpus = self.cpu_list("sys/devices/system/cpu/online")?;
            next.present_cpus = self.cpu_list("sys/devices/system/cpu/present")?;
        }
        if matches!(scope, Scope::Memory | Scope::All) {
            next.memory_bytes = self.mem_total()?;
            let (block, online, present) = self.memory_blocks()?;
            next.memory_block_bytes = block;
            next.memory_blocks_online = online;
            next.memory_blocks_present = present;
        }
        *s = next;
        Ok(())
    }

    /// `MemTotal` in bytes.
    pub fn mem_total(&self) -> Result<u64, ReadError> {
        let path = self.root.join("proc/meminfo");
        let file = std::fs::File::open(&path).map_err(|source| ReadError::Io {
            path: path.clone(),
            source,
        })?;
        procfs::Meminfo::from_read(file)
            .map(|m| m.mem_total)
            .map_err(|e| ReadError::Parse {
                path,
                reason: e.to_string(),
            })
    }

    /// `(block size, blocks online, blocks present)`.
    fn memory_blocks(&self) -> Result<(u64, u32, u32), ReadError> {
        let dir = self.root.join("sys/devices/system/memory");
        if !dir.is_dir() {
            return Ok((0, 0, 0));
        }
        let (path, text) = self.text("sys/devices/system/memory/block_size_bytes")?;
        let block = parse_block_size(&text).ok_or_else(|| ReadError::Parse {
            path,
            reason: format!("not a hexadecimal size: {:?}", text.trim()),
        })?;
        let entries = std::fs::read_dir(&dir).map_err(|source| ReadError::Io {
            path: dir.clone(),
            source,
        })?;
        let (mut online, mut present) = (0u32, 0u32);
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(n) = name.to_str().and_then(|n| n.strip_prefix("memory")) else {
                continue;
            };
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            present += 1;
            // A block removed between readdir and read is simply not online.
            if let Ok(state) = std::fs::read_to_string(entry.path().join("state")) {
                if block_online(&state) {
                    online += 1;
                }
            }
        }
        Ok((block, online, present))
    }
}

/// `block_size_bytes` is hexadecimal without a prefix (`8000000` = 128 MiB).
pub fn parse_block_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    u64::from_str_radix(t, 16).ok().filter(|b| *b > 0)
}

/// A `memoryN/state` of `online` (also `online_movable`/`online_kernel` on some kernels).
pub fn block_online(state: &str) -> bool {
    state.trim().starts_with("online")
}

/// Every difference from `old` to `new`, capacity changes first.
pub fn diff(old: &NodeSnapshot, new: &NodeSnapshot) -> Vec<CapacityChange> {
    let mut out = Vec::new();
    let cpus = |kind, a: &CpuSet, b: &CpuSet, out: &mut Vec<CapacityChange>| {
        if a != b {
            out.push(CapacityChange {
                kind,
                old: u64::from(a.count()),
                new: u64::from(b.count()),
                cpus: Some((a.to_string(), b.to_string())),
            });
        }
    };
    let num = |kind, a: u64, b: u64, out: &mut Vec<CapacityChange>| {
        if a != b {
            out.push(CapacityChange {
                kind,
                old: a,
                new: b,
                cpus: None,
            });
        }
    };
    cpus(
        ChangeKind::OnlineCpus,
        &old.online_cpus,
        &new.online_cpus,
        &mut out,
    );
    num(
        ChangeKind::MemoryTotal,
        old.memory_bytes,
        new.memory_bytes,
        &mut out,
    );
    cpus(
        ChangeKind::PresentCpus,
        &old.present_cpus,
        &new.present_cpus,
        &mut out,
    );
    num(
        ChangeKind::MemoryBlocksOnline,
        u64::from(old.memory_blocks_online),
        u64::from(new.memory_blocks_online),
        &mut out,
    );
    num(
        ChangeKind::MemoryBlocksPresent,
        u64::from(old.memory_blocks_present),
        u64::from(new.memory_blocks_present),
        &mut out,
    );
    out
}

#[cfg(test)]
pub(crate) mod fixture {
    //! A fake `/sys` + `/proc` tree.

    use std::path::Path;

    pub struct Fixture {
        pub dir: tempfile::TempDir,
    }

    impl Fixture {
        /// `cpus` online and present, `blocks` 128 MiB blocks all online, `MemTotal` to match.
        pub fn new(cpus: &str, blocks: u32) -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let f = Fixture { dir };
            std::fs::create_dir_all(f.path().join("sys/devices/system/cpu")).expect("mkdir");
            std::fs::create_dir_all(f.path().join("proc")).expect("mkdir");
            f.set_cpus(cpus, cpus);
            std::fs::create_dir_all(f.path().join("sys/devices/system/memory")).expect("mkdir");
            f.write("sys/devices/system/memory/block_size_bytes", "8000000\n");
            for n in 0..blocks {
                f.add_block(n, true);
            }
            f.set_mem_total_kib(u64::from(blocks) * 128 * 1024);
            f
        }

        pub fn path(&self) -> &Path {
            self.dir.path()
        }

        pub fn write(&self, rel: &str, text: &str) {
            std::fs::write(self.path().join(rel), text).expect("write fixture");
        }

        pub fn set_cpus(&self, online: &str, present: &str) {
            self.write("sys/devices/system/cpu/online", &format!("{online}\n"));
            self.write("sys/devices/system/cpu/present", &format!("{present}\n"));
        }

        pub fn add_block(&self, n: u32, online: bool) {
            let dir = format!("sys/devices/system/memory/memory{n}");
            std::fs::create_dir_all(self.path().join(&dir)).expect("mkdir");
            self.set_block(n, online);
        }

        pub fn set_block(&self, n: u32, online: bool) {
            let state = if online { "online\n" } else { "offline\n" };
            self.write(&format!("sys/devices/system/memory/memory{n}/state"), state);
        }

        pub fn set_mem_total_kib(&self, kib: u64) {
            self.write("proc/meminfo", &meminfo(kib));
        }
    }

    /// A `/proc/meminfo` with every line procfs requires, `MemTotal` as given.
    pub fn meminfo(kib: u64) -> String {
        format!(
            "MemTotal:       {kib} kB\nMemFree:        1024 kB\nMemAvailable:   2048 kB\nBuffers: 0 kB\nCached: 0 kB\nSwapCached: 0 kB\nActive: 0 kB\nInactive: 0 kB\nActive(anon): 0 kB\nInactive(anon): 0 kB\nActive(file): 0 kB\nInactive(file): 0 kB\nUnevictable: 0 kB\nMlocked: 0 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\nDirty: 0 kB\nWriteback: 0 kB\nAnonPages: 0 kB\nMapped: 0 kB\nShmem: 0 kB\nSlab: 0 kB\nSReclaimable: 0 kB\nSUnreclaim: 0 kB\nKernelStack: 0 kB\nPageTables: 0 kB\nNFS_Unstable: 0 kB\nBounce: 0 kB\nWritebackTmp: 0 kB\nCommitLimit: 0 kB\nCommitted_AS: 0 kB\nVmallocTotal: 0 kB\nVmallocUsed: 0 kB\nVmallocChunk: 0 kB\n"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::Fixture;
    use super::*;

    #[test]
    fn reads_cpus_blocks_and_meminfo_under_a_root() {
        let f = Fixture::new("0-3", 4);
        f.add_block(4, false);
        let s = SysReader::new(f.path()).read().expect("read");
        assert_eq!(s.online_cpus.to_string(), "0-3");
        assert_eq!(s.present_cpus.count(), 4);
        assert_eq!(s.memory_bytes, 4 * 128 * 1024 * 1024);
        assert_eq!(s.memory_block_bytes, 128 << 20);
        assert_eq!((s.memory_blocks_online, s.memory_blocks_present), (4, 5));
    }

    #[test]
    fn no_memory_hotplug_is_zero_blocks_and_bad_files_are_named() {
        let f = Fixture::new("0", 1);
        std::fs::remove_dir_all(f.path().join("sys/devices/system/memory")).expect("rm");
        let s = SysReader::new(f.path()).read().expect("read");
        assert_eq!((s.memory_block_bytes, s.memory_blocks_present), (0, 0));

        f.write("sys/devices/system/cpu/online", "zero\n");
        let err = SysReader::new(f.path()).read().expect_err("bad list");
        assert!(err.to_string().contains("cpu/online"), "{err}");

        let f = Fixture::new("0", 1);
        f.write("proc/meminfo", "nothing here\n");
        let err = SysReader::new(f.path()).read().expect_err("bad meminfo");
        assert!(err.to_string().contains("meminfo"), "{err}");

        let f = Fixture::new("0", 1);
        f.write("sys/devices/system/memory/block_size_bytes", "zz\n");
        let mut s = NodeSnapshot::default();
        let err = SysReader::new(f.path())
            .refresh(&mut s, Scope::Memory)
            .expect_err("bad block size");
        assert!(err.to_string().contains("block_size_bytes"), "{err}");
        assert_eq!(s, NodeSnapshot::default(), "unchanged on error");

        let err = SysReader::new("/nonexistent-root")
            .read()
            .expect_err("none");
        assert!(err.to_string().contains("/nonexistent-root"), "{err}");
    }

    #[test]
    fn block_sizes_and_states() {
        assert_eq!(parse_block_size("8000000\n"), Some(128 << 20));
        assert_eq!(parse_block_size("0x10000000"), Some(256 << 20));
        assert_eq!(parse_block_size("0"), None);
        assert!(block_online("online\n") && block_online("online_movable"));
        assert!(!block_online("offline\n") && !block_online("going-offline"));
    }

    #[test]
    fn diff_reports_each_change_with_direction() {
        let f = Fixture::new("0-3", 4);
        let r = SysReader::new(f.path());
        let before = r.read().expect("read");
        assert!(diff(&before, &before).is_empty());

        f.set_cpus("0,2-3", "0-3");
        let mut after = before.clone();
        r.refresh(&mut after, Scope::Cpu).expect("cpu");
        let d = diff(&before, &after);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].kind, ChangeKind::OnlineCpus);
        assert_eq!((d[0].old, d[0].new, d[0].direction()), (4, 3, "down"));
        assert_eq!(d[0].cpus, Some(("0-3".to_string(), "0,2-3".to_string())));

        f.add_block(4, true);
        f.set_mem_total_kib(5 * 128 * 1024);
        f.set_cpus("0-4", "0-4");
        let mut grown = after.clone();
        r.refresh(&mut grown, Scope::All).expect("all");
        let kinds: Vec<(ChangeKind, &str)> = diff(&after, &grown)
            .iter()
            .map(|c| (c.kind, c.direction()))
            .collect();
        assert_eq!(
            kinds,
            [
                (ChangeKind::OnlineCpus, "up"),
                (ChangeKind::MemoryTotal, "up"),
                (ChangeKind::PresentCpus, "up"),
                (ChangeKind::MemoryBlocksOnline, "up"),
                (ChangeKind::MemoryBlocksPresent, "up"),
            ]
        );
        // Same size, other members: a change, direction `same`.
        let mut moved = grown.clone();
        moved.online_cpus = CpuSet::parse("1-5").expect("parse");
        assert_eq!(diff(&grown, &moved)[0].direction(), "same");
    }
}
