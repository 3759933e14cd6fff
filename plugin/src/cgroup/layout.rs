//! Where the cgroup hierarchies are mounted (v1: one per controller, v2: one unified), as
//! detected under a root. Shared by cgroup I/O and the observer, which re-exports it.

use std::path::{Path, PathBuf};

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

    /// cgroup v1 (one hierarchy per controller).
    pub(crate) fn is_v1(&self) -> bool {
        matches!(self, Self::V1 { .. })
    }
}
