//! Best-effort teardown of one harness instance, identified only by things the harness
//! created: its base directory, its containerd pid (checked against the config path in the
//! process's command line), shims whose `-address` is the instance's socket, processes inside
//! its cgroup tree, and mounts below its base directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::cgroups::{unescape_mountinfo, CgroupTree};
use crate::util::poll_blocking;

/// What identifies one instance on the machine.
#[derive(Debug, Clone)]
pub(crate) struct InstanceRef {
    pub base: PathBuf,
    pub grpc_socket: PathBuf,
    pub cgroup_root: String,
}

/// Prefix of instance base dirs under `/tmp` and of cgroup roots.
pub(crate) const BASE_PREFIX: &str = "nrt-";
pub(crate) const CGROUP_PREFIX: &str = "nri-resize-test-";

fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn alive(pid: i32) -> bool {
    // A zombie still has /proc/<pid>; treat it as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Is `pid` a containerd (or CRI-O) started with a config inside `base`?
pub(crate) fn is_our_containerd(pid: i32, base: &Path) -> bool {
    let base = base.to_string_lossy();
    cmdline(pid).is_some_and(|c| {
        c.first()
            .is_some_and(|a| a.ends_with("containerd") || a.ends_with("crio"))
            && c.iter().any(|a| a.starts_with(base.as_ref()))
    })
}

/// Pids of `containerd-shim*` processes serving the containerd at `grpc_socket` (by their
/// `-address` argument).
pub fn shim_pids(grpc_socket: &Path) -> Vec<i32> {
    let sock = grpc_socket.to_string_lossy();
    all_pids()
        .into_iter()
        .filter(|pid| {
            cmdline(*pid).is_some_and(|c| {
                c.first().is_some_and(|a| a.contains("containerd-shim"))
                    && c.windows(2)
                        .any(|w| w[0].trim_start_matches('-') == "address" && w[1] == sock.as_ref())
            })
        })
        .collect()
}

/// SIGTERM, then SIGKILL after `grace`; waits until the process is gone.
pub(crate) fn terminate(pid: i32, grace: Duration) {
    let p = Pid::from_raw(pid);
    if kill(p, Signal::SIGTERM).is_err() {
        return;
    }
    if !poll_blocking(grace, || !alive(pid)) {
        let _ = kill(p, Signal::SIGKILL);
        poll_blocking(Duration::from_secs(5), || !alive(pid));
    }
}

/// Mount points at or below `base`, deepest first.
pub(crate) fn mounts_under(base: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape_mountinfo(m)))
        .filter(|m| m.starts_with(base))
        .collect();
    // Later mounts may stack on earlier ones: unmount in reverse mount order, deepest first.
    out.reverse();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// Detach-unmounts everything at or below `base`.
pub(crate) fn unmount_all(base: &Path) {
    for _ in 0..5 {
        let mounts = mounts_under(base);
        if mounts.is_empty() {
            return;
        }
        for m in mounts {
            if let Err(e) = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH) {
                tracing::debug!(mount = %m.display(), error = %e, "umount2");
            }
        }
    }
}

/// Kills and removes everything of the instance except containerd itself (which the caller
/// stops first). Returns a list of what could not be cleaned.
pub(crate) fn teardown(inst: &InstanceRef) -> Vec<String> {
    let mut problems = Vec::new();
    let tree = CgroupTree::new(inst.cgroup_root.clone());
    // Container processes first (their shim is their subreaper), then the shims.
    let left = tree.remove();
    problems.extend(
        left.iter()
            .map(|d| format!("cgroup {} not removed", d.display())),
    );
    for pid in shim_pids(&inst.grpc_socket) {
        terminate(pid, Duration::from_secs(2));
    }
    let shims = shim_pids(&inst.grpc_socket);
    if !shims.is_empty() {
        problems.push(format!("shims still alive: {shims:?}"));
    }
    // Shims were gone before the cgroups could all be removed? Retry the cgroups.
    if !left.is_empty() {
        problems.retain(|p| !p.starts_with("cgroup "));
        problems.extend(
            tree.remove()
                .iter()
                .map(|d| format!("cgroup {} not removed", d.display())),
        );
    }
    unmount_all(&inst.base);
    let mounts = mounts_under(&inst.base);
    if !mounts.is_empty() {
        problems.push(format!("mounts left: {mounts:?}"));
    } else if inst.base.exists() {
        if let Err(e) = std::fs::remove_dir_all(&inst.base) {
            problems.push(format!("remove {}: {e}", inst.base.display()));
        }
    }
    problems
}

/// Cleans up instances left behind by test processes that no longer exist (killed by a
/// timeout, SIGKILL, ...). Only touches `/tmp/nrt-<pid>-<n>` dirs and `/nri-resize-test-<pid>-<n>`
/// cgroups whose `<pid>` is dead.
pub(crate) fn sweep_stale() {
    let dead = |name: &str, prefix: &str| -> bool {
        name.strip_prefix(prefix)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
            .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    if let Ok(rd) = std::fs::read_dir("/tmp") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !dead(&name, BASE_PREFIX) || !e.path().join("config.toml").exists() {
                continue;
            }
            let base = e.path();
            tracing::warn!(base = %base.display(), "cleaning up a stale harness instance");
            if let Some(pid) = std::fs::read_to_string(base.join("containerd.pid"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                if is_our_containerd(pid, &base) {
                    terminate(pid, Duration::from_secs(5));
                }
            }
            let cgroup_root = std::fs::read_to_string(base.join("cgroup-root"))
                .unwrap_or_default()
                .trim()
                .to_owned();
            let inst = InstanceRef {
                grpc_socket: base.join("c.sock"),
                base,
                cgroup_root,
            };
            if inst.cgroup_root.starts_with(&format!("/{CGROUP_PREFIX}"))
                || inst
                    .cgroup_root
                    .starts_with(&format!("/{}", CGROUP_PREFIX.replace('-', "_")))
            {
                teardown(&inst);
            } else {
                unmount_all(&inst.base);
                let _ = std::fs::remove_dir_all(&inst.base);
            }
        }
    }
    // Cgroup roots whose base dir is already gone.
    for mount in [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ] {
        if let Ok(rd) = std::fs::read_dir(mount) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if e.path().is_dir() && dead(&name, CGROUP_PREFIX) {
                    tracing::warn!(cgroup = %name, "removing a stale harness cgroup tree");
                    CgroupTree::new(format!("/{name}")).remove();
                }
            }
        }
    }
}
