//! A containerd root that already holds the test images, made once and copied into every
//! instance.
//!
//! Importing the two images (`ctr images import`, which hashes and unpacks them) cost every
//! harness containerd 5–8 s in the VM tier's emulated guests, a quarter of a short test. The
//! first instance of a containerd build imports them as before into a private containerd,
//! stops it cleanly and keeps its `root/` under `<cache>/containerd-roots/<version>-<key>/`;
//! every later instance starts from a copy of it (`cp -a`, a few MiB). containerd finds the
//! images in its metadata, CRI lists them from there at start-up, and the snapshots are plain
//! directories below the root, so the copy is a root like any other.
//!
//! The key covers what the root depends on: the containerd binary (path, size, modification
//! time), the image archives (their names carry their content hash) and [`FORMAT`]. A root is
//! published by renaming a finished copy into place, so a killed run never leaves half of one;
//! another process that publishes the same key first wins and ours is dropped. Roots of other
//! keys for the same containerd binary path are removed when a new one is published. The
//! import itself is still exercised: by the instance that makes the root, and by the image
//! suite's own imports.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::UNIX_EPOCH;

use tokio::sync::Mutex;

use crate::images::{sha256_hex, ImageArchives};
use crate::util::{cache_dir, next_instance};
use crate::version::ContainerdVersion;

/// Bump when what a root must hold changes.
const FORMAT: &str = "nri-resize-containerd-root-v1";

/// The directory holding the roots of every containerd build.
fn roots_dir() -> PathBuf {
    cache_dir().join("containerd-roots")
}

/// `<version>-<key>`: which root a containerd build with these images starts from.
fn root_name(version: ContainerdVersion, archives: &ImageArchives) -> String {
    let mut material = Vec::new();
    material.extend_from_slice(FORMAT.as_bytes());
    let bin = version.containerd_bin();
    material.extend_from_slice(bin.as_os_str().as_encoded_bytes());
    if let Ok(m) = std::fs::metadata(&bin) {
        material.extend_from_slice(&m.len().to_le_bytes());
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        material.extend_from_slice(&mtime.to_le_bytes());
    }
    for archive in [&archives.pause, &archives.busybox] {
        material.extend_from_slice(archive.as_os_str().as_encoded_bytes());
    }
    format!("{}-{}", build_prefix(version), &sha256_hex(&material)[..16])
}

/// `<version>-<hash of the binary's path>`: the roots of one containerd build (an older binary
/// at the same path replaces them; another build beside it keeps its own).
fn build_prefix(version: ContainerdVersion) -> String {
    let bin = version.containerd_bin();
    format!(
        "{}-{}",
        version.label(),
        &sha256_hex(bin.as_os_str().as_encoded_bytes())[..8]
    )
}

/// The finished root for `version` and `archives`, if one was published.
pub(crate) fn published(version: ContainerdVersion, archives: &ImageArchives) -> Option<PathBuf> {
    let root = roots_dir().join(root_name(version, archives)).join("root");
    root.is_dir().then_some(root)
}

/// Serializes the making of roots within this process (one import per build, not one per
/// concurrent test).
pub(crate) fn making_lock() -> &'static Mutex<()> {
    static LOCK: Mutex<()> = Mutex::const_new(());
    &LOCK
}

/// Publishes `root` (the root of a stopped containerd that imported `archives`) for `version`.
/// Best effort: a root that cannot be published only means the next instance imports again.
pub(crate) fn publish(version: ContainerdVersion, archives: &ImageArchives, root: &Path) {
    let dir = roots_dir();
    let name = root_name(version, archives);
    let fin = dir.join(&name);
    if fin.is_dir() {
        return;
    }
    let tmp = dir.join(format!(
        ".{name}.{}-{}",
        std::process::id(),
        next_instance()
    ));
    let made = std::fs::create_dir_all(&tmp)
        .and_then(|()| std::fs::create_dir(tmp.join("root")))
        .map_err(|e| format!("create {}: {e}", tmp.display()))
        .and_then(|()| copy_tree(root, &tmp.join("root")))
        .and_then(|()| {
            std::fs::rename(&tmp, &fin).map_err(|e| format!("rename to {}: {e}", fin.display()))
        });
    match made {
        Ok(()) => {
            eprintln!(
                "harness: containerd root with the test images kept at {}",
                fin.display()
            );
            remove_other_keys(&dir, version, &name);
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            if !fin.is_dir() {
                eprintln!("harness: containerd root with the test images not kept: {e}");
            }
        }
    }
}

/// Removes the roots of `version`'s build other than `keep` (an older binary or older images).
fn remove_other_keys(dir: &Path, version: ContainerdVersion, keep: &str) {
    let prefix = format!("{}-", build_prefix(version));
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(&prefix) && n != keep {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Copies what is in the directory `from` into the existing directory `to` (`cp -a from/. to`):
/// ownership, modes, links, extended attributes and timestamps as they are.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let out = Command::new("cp")
        .arg("-a")
        .arg(from.join("."))
        .arg(to)
        .output()
        .map_err(|e| format!("run cp: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "cp -a {} {} failed ({}): {}",
            from.display(),
            to.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
