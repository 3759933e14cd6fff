//! Node capacity as admission sees it: the capacity watcher's live snapshot (no file read on
//! an update), or, before the watcher's first reading or without a watcher, online CPUs
//! (sysfs) and total memory (procfs) read under an injectable root so tests use a fixture.

use std::path::{Path, PathBuf};

use crate::capacity::snapshot::ReadError;
use crate::capacity::SysReader;
use crate::policy::{AdmissionError, CpuSet, NodeCapacity};
use crate::state::{NodeReserve, NodeStatus};

/// Node capacity could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {source}")]
    Cpus {
        path: PathBuf,
        #[source]
        source: AdmissionError,
    },
    /// `MemTotal`, read through procfs as the capacity watcher reads it.
    #[error("cannot read MemTotal: {source}")]
    Memory {
        #[source]
        source: ReadError,
    },
}

/// Reads node capacity from `<root>/sys/devices/system/cpu/online` and `<root>/proc/meminfo`.
#[derive(Debug, Clone)]
pub struct NodeReader {
    root: PathBuf,
}

impl NodeReader {
    /// `root` is `/` on a node.
    pub fn new(root: impl AsRef<Path>) -> Self {
        NodeReader {
            root: root.as_ref().to_path_buf(),
        }
    }

    fn read(&self, rel: &str) -> Result<(PathBuf, String), NodeError> {
        let path = self.root.join(rel);
        let text = std::fs::read_to_string(&path).map_err(|source| NodeError::Read {
            path: path.clone(),
            source,
        })?;
        Ok((path, text))
    }

    /// The capacity from the watcher's `snapshot` when there is one, else read now; with
    /// `reserve` kept back for the system (kubelet's, or `[resize]`'s).
    pub fn capacity_with(
        &self,
        snapshot: Option<&NodeStatus>,
        reserve: NodeReserve,
    ) -> Result<NodeCapacity, NodeError> {
        let Some(s) = snapshot.filter(|s| s.memory_bytes > 0) else {
            return self.capacity(reserve);
        };
        let online_cpus = CpuSet::parse(&s.online_cpus).map_err(|source| NodeError::Cpus {
            path: PathBuf::from("the capacity watcher's online CPUs"),
            source,
        })?;
        Ok(NodeCapacity {
            online_cpus_millis: u64::from(online_cpus.count()) * 1000,
            memory_bytes: s.memory_bytes,
            reserved_memory_bytes: reserve.memory_bytes,
            online_cpus,
            reserved_cpu_millis: reserve.cpu_millis,
        })
    }

    /// The node's capacity read now, with `reserve` kept back for the system.
    pub fn capacity(&self, reserve: NodeReserve) -> Result<NodeCapacity, NodeError> {
        let (cpu_path, online) = self.read("sys/devices/system/cpu/online")?;
        let online_cpus = CpuSet::parse(online.trim()).map_err(|source| NodeError::Cpus {
            path: cpu_path,
            source,
        })?;
        let memory_bytes = SysReader::new(&self.root)
            .mem_total()
            .map_err(|source| NodeError::Memory { source })?;
        Ok(NodeCapacity {
            online_cpus_millis: u64::from(online_cpus.count()) * 1000,
            memory_bytes,
            reserved_memory_bytes: reserve.memory_bytes,
            online_cpus,
            reserved_cpu_millis: reserve.cpu_millis,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::snapshot::fixture::meminfo;

    fn reserve(memory: u64) -> NodeReserve {
        NodeReserve {
            memory_bytes: memory,
            cpu_millis: 250,
        }
    }

    fn fixture(online: &str, meminfo: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/devices/system/cpu")).unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        std::fs::write(dir.path().join("sys/devices/system/cpu/online"), online).unwrap();
        std::fs::write(dir.path().join("proc/meminfo"), meminfo).unwrap();
        dir
    }

    #[test]
    fn reads_cpus_and_memory() {
        let dir = fixture("0-3,6\n", &meminfo(24_576_000));
        let cap = NodeReader::new(dir.path())
            .capacity(reserve(1 << 30))
            .unwrap();
        assert_eq!(cap.online_cpus_millis, 5000);
        assert_eq!(cap.memory_bytes, 24_576_000 * 1024);
        assert_eq!(cap.reserved_memory_bytes, 1 << 30);
        assert_eq!(cap.allocatable_cpu_millis(), 4750);
    }

    #[test]
    fn the_watchers_snapshot_is_used_without_reading() {
        let snapshot = NodeStatus {
            online_cpus: "0-7".into(),
            memory_bytes: 32 << 30,
            ..NodeStatus::default()
        };
        let cap = NodeReader::new("/nonexistent")
            .capacity_with(Some(&snapshot), reserve(1 << 30))
            .unwrap();
        assert_eq!(cap.online_cpus_millis, 8000);
        assert_eq!(cap.memory_bytes, 32 << 30);
        assert_eq!(cap.reserved_memory_bytes, 1 << 30);
        // No snapshot yet (the watcher's first reading pending): read the files.
        let dir = fixture("0-1\n", &meminfo(1024));
        let cap = NodeReader::new(dir.path())
            .capacity_with(Some(&NodeStatus::default()), reserve(0))
            .unwrap();
        assert_eq!((cap.online_cpus_millis, cap.memory_bytes), (2000, 1 << 20));
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = fixture("zero\n", "MemTotal: 5 MB\n");
        let err = NodeReader::new(dir.path())
            .capacity(reserve(0))
            .unwrap_err()
            .to_string();
        assert!(err.contains("online"), "{err}");
        let dir = fixture("0\n", "nothing\n");
        let err = NodeReader::new(dir.path())
            .capacity(reserve(0))
            .unwrap_err()
            .to_string();
        assert!(err.contains("meminfo") && err.contains("MemTotal"), "{err}");
        let err = NodeReader::new("/nonexistent")
            .capacity(reserve(0))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent"), "{err}");
    }
}
