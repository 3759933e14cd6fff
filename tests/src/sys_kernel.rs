//! A node's `/sys/kernel` as a kernel built without BTF shows it: no `btf` entry at all, every
//! other entry the running kernel's own.
//!
//! The VM tier boots Debian's kernels, which all carry BTF, and a container's view of
//! `/sys/kernel` comes from the host path the `DaemonSet` mounts there. This makes that host
//! path: a read-only tmpfs holding one mount point per entry of the real `/sys/kernel` but
//! `btf`, each entry bind-mounted from the real one recursively (tracefs at `tracing/`, debugfs
//! at `debug/` come along as the node mounted them). What it is not: a kernel without BTF. The
//! kernel still has its BTF, so BTF-typed programs (`fentry`, `tp_btf`) would attach if the daemon
//! found a BTF file; what a container mounting this sees is exactly what it sees on a kernel
//! without `CONFIG_DEBUG_INFO_BTF` (`/sys/kernel/btf` absent, `ENOENT`), and, like sysfs, it
//! refuses to create what is missing (read only: `EROFS` where sysfs says `EPERM`/`ENOENT`), so a
//! `DirectoryOrCreate` hostPath of `/sys/kernel/btf` is refused on it as on such a node.

use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// The real directory this stands in for.
const SYS_KERNEL: &str = "/sys/kernel";

/// The replica, mounted at [`SysKernelWithoutBtf::path`]; unmounted (lazily, recursively) on drop.
#[derive(Debug)]
pub struct SysKernelWithoutBtf {
    path: PathBuf,
}

impl SysKernelWithoutBtf {
    /// Mounts the replica at `path` (created if absent). Panics with the step that failed.
    pub fn mount(path: &Path) -> Self {
        std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=0755,size=64k"),
        )
        .unwrap_or_else(|e| panic!("mount a tmpfs at {}: {e}", path.display()));
        // Unmounted from here on, whatever fails below.
        let replica = Self {
            path: path.to_owned(),
        };
        let entries =
            std::fs::read_dir(SYS_KERNEL).unwrap_or_else(|e| panic!("read {SYS_KERNEL}: {e}"));
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("read {SYS_KERNEL}: {e}"));
            if entry.file_name() == "btf" {
                continue;
            }
            let source = entry.path();
            let target = path.join(entry.file_name());
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                std::fs::create_dir(&target)
            } else {
                std::fs::write(&target, b"")
            }
            .unwrap_or_else(|e| panic!("create {}: {e}", target.display()));
            mount(
                Some(&source),
                &target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .unwrap_or_else(|e| panic!("bind {} at {}: {e}", source.display(), target.display()));
        }
        // Read only, as sysfs refuses a mkdir: only the tmpfs itself, the bound entries keep
        // their own flags.
        mount(
            None::<&str>,
            path,
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .unwrap_or_else(|e| panic!("remount {} read-only: {e}", path.display()));
        assert!(
            !path.join("btf").exists() && path.join("tracing").is_dir(),
            "the replica at {} has no btf and has tracing",
            path.display()
        );
        replica
    }

    /// Where the replica is mounted.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `host_path` on a node without BTF: under `/sys/kernel`, the same path in the replica;
    /// anything else unchanged.
    pub fn host_path(&self, host_path: &str) -> PathBuf {
        match Path::new(host_path).strip_prefix(SYS_KERNEL) {
            Ok(rest) => self.path.join(rest),
            Err(_) => PathBuf::from(host_path),
        }
    }
}

impl Drop for SysKernelWithoutBtf {
    fn drop(&mut self) {
        // Lazily: a container still holding a bind of it must not make the drop fail.
        if let Err(e) = umount2(&self.path, MntFlags::MNT_DETACH) {
            eprintln!("unmount {}: {e}", self.path.display());
        }
    }
}
