//! Free space on the filesystems a run writes to (the target directory, the VM tier's cache).
//!
//! A run that fills its disk does not fail where it fills it: QEMU pauses a guest whose disk
//! write gets `ENOSPC` (its default `werror=enospc`), and the guest then sits silent until its
//! budget kills it. So the run checks the space before it starts and before every guest boots,
//! and says how much was free wherever it fails.

use std::path::Path;

use anyhow::{bail, Context as _};

/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// Bytes available to this (unprivileged or not) process on the filesystem holding `path`, or on
/// the filesystem of its nearest existing ancestor.
pub fn available(path: &Path) -> anyhow::Result<u64> {
    let existing = path
        .ancestors()
        .find(|p| p.exists())
        .with_context(|| format!("no existing ancestor of {}", path.display()))?;
    let st = nix::sys::statvfs::statvfs(existing)
        .with_context(|| format!("statvfs {}", existing.display()))?;
    Ok(st.blocks_available().saturating_mul(st.fragment_size()))
}

/// A byte count as a Kubernetes quantity in binary units, one decimal: `21.4Gi`, `512.0Mi`.
pub fn quantity(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size {
            // Tenths, rounded down: never more than what there is.
            let tenths = bytes.saturating_mul(10) / size;
            return format!("{}.{}{unit}", tenths / 10, tenths % 10);
        }
    }
    bytes.to_string()
}

/// "`21.4Gi` free on the filesystem of <path>", or why that is unknown.
pub fn describe(path: &Path) -> String {
    match available(path) {
        Ok(b) => format!(
            "{} free on the filesystem of {}",
            quantity(b),
            path.display()
        ),
        Err(e) => format!("free space of {} unknown ({e:#})", path.display()),
    }
}

/// Fails, naming both numbers, when less than `need` bytes are free for `path`.
pub fn ensure(path: &Path, need: u64, what: &str) -> anyhow::Result<()> {
    let free = available(path)?;
    if free < need {
        bail!(
            "{what} needs about {} free on the filesystem of {}, which has {}: free some space \
             (an old `target/` of another checkout, say) and run it again",
            quantity(need),
            path.display(),
            quantity(free)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_round_down_in_binary_units() {
        assert_eq!(quantity(0), "0");
        assert_eq!(quantity(1023), "1023");
        assert_eq!(quantity(1024), "1.0Ki");
        assert_eq!(quantity(512 << 20), "512.0Mi");
        assert_eq!(quantity((21 << 30) + (460 << 20)), "21.4Gi");
        assert_eq!(quantity(GIB - 1), "1023.9Mi");
    }

    #[test]
    fn space_is_read_from_the_nearest_existing_ancestor() {
        let here = available(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        let below = available(&Path::new(env!("CARGO_MANIFEST_DIR")).join("no/such/dir")).unwrap();
        assert!(here > 0);
        // Same filesystem, read moments apart: within a GiB of each other.
        assert!(here.abs_diff(below) < GIB, "{here} vs {below}");
        assert!(
            ensure(Path::new(env!("CARGO_MANIFEST_DIR")), u64::MAX, "a test")
                .unwrap_err()
                .to_string()
                .contains("needs about")
        );
    }
}
