//! `memory.high` while a staged decrease steps it (cgroup v2 without `memory.reclaim`, or
//! forced). The value found there belongs to someone else: kubelet's `MemoryQoS` (KEP-2570) sets
//! it, KEP-5986 would raise it under pressure, a runtime may. So the loop never sets it above its
//! owner's value, and afterwards puts that value back. Before each write and before the put-back
//! it reads `memory.high`: when it no longer holds the loop's last write, the owner wrote it
//! meanwhile, and the owner's new value is the one the loop stays under and leaves in place. (A
//! write landing between that read and the loop's own is lost; the window is one syscall wide.)

use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::cgroup::{CgroupError, CgroupIo};

/// `memory.high` while the loop holds it lowered.
#[derive(Debug, Default)]
pub(super) struct HighOwner {
    held: Option<Held>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    /// The owner's value (`None`: `max`): read before the loop's first write, and again whenever
    /// the owner wrote since the loop's last one.
    owners: Option<u64>,
    /// The loop's last write as the kernel holds it (read back: it keeps whole pages).
    ours: Option<u64>,
}

impl HighOwner {
    /// Lowers `memory.high` to `high`, or to its owner's value if that is lower; nothing once
    /// `cancel` fired (a newer update superseded the decrease, possibly during the read).
    pub(super) fn lower(
        &mut self,
        io: &dyn CgroupIo,
        cgroup: &Path,
        high: u64,
        cancel: &CancellationToken,
    ) -> Result<(), CgroupError> {
        let now = io.memory_high(cgroup)?;
        if cancel.is_cancelled() {
            return Ok(());
        }
        let owners = match self.held {
            // Still the loop's last write: the owner's value is the one known.
            Some(h) if now == h.ours => h.owners,
            // First write, or the owner wrote since the loop's last one.
            _ => now,
        };
        io.set_memory_high(cgroup, Some(owners.map_or(high, |o| o.min(high))))?;
        let ours = io.memory_high(cgroup)?;
        self.held = Some(Held { owners, ours });
        Ok(())
    }

    /// Puts back the owner's value, if `memory.high` still holds the loop's last write.
    pub(super) fn restore(&mut self, io: &dyn CgroupIo, cgroup: &Path) -> Result<(), CgroupError> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        if io.memory_high(cgroup)? != held.ours {
            // The owner wrote it meanwhile: theirs stays.
            return Ok(());
        }
        io.set_memory_high(cgroup, held.owners)
    }
}
