//! Whether trimming can run on a container's cgroup, and how it asks the kernel for page cache
//! only. Blocking (cgroupfs reads and one write): call it off the async workers.
//!
//! - cgroup v1: unavailable (no `memory.reclaim`, no PSI).
//! - No PSI (`memory.pressure` unreadable, `psi=0`): unavailable; trimming cannot pace.
//! - No `memory.reclaim` (before 5.19): unavailable.
//! - `memory.reclaim` with `swappiness=0` (6.11+, commit 68cd9050d871 "mm: add swappiness=
//!   arg to memory.reclaim"): every step asks with it, so the kernel scans file pages only.
//!   Checked by writing `0 swappiness=0`, which reclaims nothing where the key is known and is
//!   refused (EINVAL) where it is not.
//! - Without the key, a plain `memory.reclaim` may swap anonymous memory out where the node has
//!   swap: unavailable there; on a node without swap anonymous and shmem pages cannot be
//!   reclaimed at all, and the plain write is used.

use std::path::Path;

use crate::cgroup::{CgroupError, CgroupIo, CgroupVersion};

/// How a step asks the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// `memory.reclaim` with `swappiness=0`.
    PageCacheOnly,
    /// Plain `memory.reclaim`, on a node without swap.
    NoSwap,
}

impl Writer {
    /// Asks for `bytes`; `Again` (it got less) is not an error: the next reading tells.
    pub fn reclaim(self, io: &dyn CgroupIo, cgroup: &Path, bytes: u64) -> Result<(), CgroupError> {
        let r = match self {
            Self::PageCacheOnly => io.reclaim_page_cache(cgroup, bytes),
            Self::NoSwap => io.reclaim(cgroup, bytes),
        };
        match r {
            Err(CgroupError::Again { .. }) => Ok(()),
            r => r,
        }
    }
}

/// Why trimming cannot run on a cgroup.
#[derive(Debug)]
pub enum NotAvailable {
    /// The node or its kernel lacks what trimming needs (for status; checked again after the
    /// re-probe pause).
    Node(String),
    /// The cgroup does not read (not created yet, or gone): tried again at the next interval.
    Cgroup(CgroupError),
}

/// Whether trimming can run on `cgroup`, and with which writer. `node_has_swap` is asked only
/// where the kernel lacks `swappiness=`.
pub fn writer(
    io: &dyn CgroupIo,
    cgroup: &Path,
    node_has_swap: &dyn Fn() -> bool,
) -> Result<Writer, NotAvailable> {
    let node = |why: &str| Err(NotAvailable::Node(why.to_owned()));
    if io.version() == CgroupVersion::V1 {
        return node("cgroup v1 has no memory.reclaim and no pressure stall information");
    }
    match io.memory_pressure(cgroup) {
        Ok(_) => {}
        Err(CgroupError::Unsupported { .. }) => {
            return node(
                "the kernel has no PSI (memory.pressure unreadable; psi=0?): trimming cannot pace",
            )
        }
        Err(e) => return Err(NotAvailable::Cgroup(e)),
    }
    io.cache_stat(cgroup).map_err(NotAvailable::Cgroup)?;
    match io.reclaim_page_cache(cgroup, 0) {
        Ok(()) => Ok(Writer::PageCacheOnly),
        Err(CgroupError::InvalidValue { .. }) if node_has_swap() => node(
            "swap is on and this kernel's memory.reclaim has no swappiness= (6.11+): a step could reclaim anonymous memory",
        ),
        Err(CgroupError::InvalidValue { .. }) => Ok(Writer::NoSwap),
        Err(CgroupError::Unsupported { .. }) => node("the kernel has no memory.reclaim (5.19+)"),
        Err(e) => Err(NotAvailable::Cgroup(e)),
    }
}

/// Whether the node has swap, from `/proc/meminfo` (anonymous memory is then reclaimable).
#[must_use]
pub fn node_has_swap() -> bool {
    use procfs::Current as _;
    procfs::Meminfo::current().is_ok_and(|m| m.swap_total > 0)
}
