//! The node reserve check: admission keeps back what kubelet keeps back.
//!
//! With `[kubelet] config_file`, kubelet's `systemReserved` + `kubeReserved` (+ the hard
//! eviction threshold for memory) become admission's reserve in place of `[resize]`'s, and a
//! different non-zero `[resize]` value is reported. Either way the reserve is checked against
//! kubelet's pods cgroup (`/kubepods.slice`, `/kubepods`), which holds the node's allocatable.
//! Disagreements go to the log (once, when they appear), to `/v1/status` (`reserve`) and to
//! `nri_resize_node_reserve_mismatch`. The check runs before the first NRI session (so the first
//! admission already uses kubelet's reserve) and again every `[capacity] resync_interval`, on a
//! blocking thread, owned by the daemon and stopped by its token.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cgroup::CgroupIo as _;
use crate::clock::now_ms;
use crate::policy::{
    compare_reserves, Configured, KubeletReserve, NodeTotals, PodsCgroup, ReserveResource,
};
use crate::resize::node::NodeReader;
use crate::state::{NodeReserve, NodeState, ReserveSource, ReserveStatus};
use crate::sync::ReadWriteLocked as _;

/// One check may take this long (a file and a few cgroup files; a hung filesystem must not hold
/// the daemon's start).
const CHECK_BUDGET: Duration = Duration::from_secs(5);

/// The pods cgroups kubelet creates (systemd driver, cgroupfs driver).
const PODS_CGROUPS: [&str; 2] = ["/kubepods.slice", "/kubepods"];

/// Checks once, now, and publishes the result.
pub(super) async fn check_now(state: &Arc<NodeState>, node: &NodeReader) {
    let (st, n) = (state.clone(), node.clone());
    let work = tokio::task::spawn_blocking(move || check(&st, &n));
    match tokio::time::timeout(CHECK_BUDGET, work).await {
        Ok(Ok((status, mismatched))) => publish(state, status, &mismatched),
        Ok(Err(err)) => warn!(%err, "node reserve check ended abnormally"),
        Err(_) => warn!(
            budget_s = CHECK_BUDGET.as_secs(),
            "node reserve check took too long; admission keeps the reserve it had"
        ),
    }
}

/// Checks now, then every `[capacity] resync_interval` until `cancel` (the returned task).
pub(super) async fn start(
    state: &Arc<NodeState>,
    node: NodeReader,
    cancel: &CancellationToken,
) -> JoinHandle<()> {
    check_now(state, &node).await;
    spawn(state.clone(), node, cancel.clone())
}

/// Waits for the task of [`start`] (it ends with the daemon's token).
pub(super) async fn stop(task: JoinHandle<()>) {
    if let Err(err) = task.await {
        warn!(%err, "node reserve check task ended abnormally");
    }
}

/// Checks every `[capacity] resync_interval` until `cancel`.
fn spawn(state: Arc<NodeState>, node: NodeReader, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let every = state.config.read_locked().capacity.resync_interval;
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            check_now(&state, &node).await;
        }
    })
}

/// Reads kubelet's configuration, its pods cgroup and the node, and compares (blocking): the
/// status, and the resources whose reserve disagrees with kubelet's.
fn check(state: &NodeState, node: &NodeReader) -> (ReserveStatus, Vec<ReserveResource>) {
    let cfg = state.config.read_locked().clone();
    let mut problems = Vec::new();
    let totals = node_totals(state, node).map_err(|e| problems.push(e)).ok();
    let configured = Configured {
        memory_bytes: cfg.resize.reserved_memory,
        cpu_millis: cfg.resize.reserved_cpu_millicores,
    };
    let file = &cfg.kubelet.config_file;
    let kubelet = if file.as_os_str().is_empty() {
        None
    } else {
        read_kubelet(file)
            .map_err(|e| problems.push(format!("{e}; admission uses [resize]'s reserve")))
            .ok()
    };
    let pods = pods_cgroup(state, &cfg.kubelet.pods_cgroup).map_err(|e| problems.push(e));
    let pods = pods.ok().flatten();
    let capacity = totals.map_or(0, |t| t.memory_bytes);
    let (source, reserve) = match &kubelet {
        Some(k) => (
            ReserveSource::KubeletConfig,
            NodeReserve {
                memory_bytes: k.memory_bytes(capacity),
                cpu_millis: k.cpu_millis(),
            },
        ),
        None => (
            ReserveSource::Config,
            NodeReserve {
                memory_bytes: configured.memory_bytes,
                cpu_millis: configured.cpu_millis,
            },
        ),
    };
    let mut status = ReserveStatus::new(source, reserve);
    let mut mismatched = Vec::new();
    if let Some(t) = totals {
        let held = pods.as_ref().map(|(_, p)| p);
        for m in compare_reserves(t, configured, kubelet.as_ref(), held) {
            problems.push(format!("{}: {}", m.resource.as_str(), m.message));
            mismatched.push(m.resource);
        }
    }
    status.kubelet_config = (!file.as_os_str().is_empty()).then(|| file.display().to_string());
    status.pods_cgroup = pods.map(|(path, _)| path);
    status.problems = problems;
    status.checked_ms = now_ms();
    (status, mismatched)
}

/// Memory and online CPUs: the capacity watcher's last reading, else read now.
fn node_totals(state: &NodeState, node: &NodeReader) -> Result<NodeTotals, String> {
    let snapshot = state.capacity.read_locked().clone();
    node.capacity_with(snapshot.as_ref(), NodeReserve::default())
        .map(|c| NodeTotals {
            memory_bytes: c.memory_bytes,
            cpu_millis: c.online_cpus_millis,
        })
        .map_err(|e| format!("node capacity unknown, reserve not compared: {e}"))
}

fn read_kubelet(path: &Path) -> Result<KubeletReserve, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("kubelet configuration {}: {e}", path.display()))?;
    KubeletReserve::parse(&text)
        .map_err(|e| format!("kubelet configuration {}: {e}", path.display()))
}

/// The pods cgroup and what it holds: the configured one (an error when unreadable), else the
/// first of [`PODS_CGROUPS`] that exists (none: `Ok(None)`, e.g. kubelet with
/// `cgroupsPerQOS: false`).
fn pods_cgroup(
    state: &NodeState,
    configured: &str,
) -> Result<Option<(String, PodsCgroup)>, String> {
    let Some(cgroups) = state.cgroups.as_ref() else {
        return Ok(None);
    };
    let read = |path: &str| {
        cgroups
            .read_actual(&PathBuf::from(path))
            .map(|a| PodsCgroup {
                memory_limit: a.memory_limit.and_then(|l| u64::try_from(l).ok()),
                cpu_shares: a.cpu_shares,
            })
    };
    if !configured.is_empty() {
        return read(configured)
            .map(|p| Some((configured.to_owned(), p)))
            .map_err(|e| format!("[kubelet] pods_cgroup {configured}: {e}"));
    }
    Ok(PODS_CGROUPS
        .iter()
        .find_map(|path| read(path).ok().map(|p| ((*path).to_owned(), p))))
}

/// Publishes a check: state, metrics, and the log when the problems changed.
fn publish(state: &NodeState, status: ReserveStatus, mismatched: &[ReserveResource]) {
    let before = state.reserve.read_locked().clone();
    for resource in [ReserveResource::Memory, ReserveResource::Cpu] {
        state
            .metrics
            .reserve
            .set_mismatch(resource.as_str(), mismatched.contains(&resource));
    }
    let old: &[String] = before.as_ref().map_or(&[], |b| &b.problems);
    for p in status.problems.iter().filter(|p| !old.contains(p)) {
        warn!(problem = %p, "node reserve");
    }
    if !old.is_empty() && status.problems.is_empty() {
        info!("node reserve: no disagreement with kubelet any more");
    }
    let changed = before.as_ref().is_none_or(|b| {
        (b.source, b.memory_bytes, b.cpu_millis)
            != (status.source, status.memory_bytes, status.cpu_millis)
    });
    if changed {
        info!(
            source = ?status.source,
            memory = %status.memory,
            cpu = %status.cpu,
            kubelet_config = status.kubelet_config.as_deref().unwrap_or(""),
            pods_cgroup = status.pods_cgroup.as_deref().unwrap_or(""),
            "node reserve admission keeps back"
        );
    }
    *state.reserve.write_locked() = Some(status);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]
mod tests {
    use super::*;
    use crate::capacity::snapshot::fixture::meminfo;
    use crate::cgroup::Cgroups;
    use crate::config::Config;

    const GI: u64 = 1 << 30;

    /// A node with 4 CPUs and 16 GiB, a v1 cgroup tree with a pods cgroup `/kubepods`, and a
    /// kubelet configuration reserving 1Gi + 512Mi memory (plus 100Mi eviction) and 1 CPU.
    fn fixture(
        pods_memory: u64,
        pods_shares: u64,
    ) -> (tempfile::TempDir, Arc<NodeState>, NodeReader) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("sys/devices/system/cpu")).unwrap();
        std::fs::create_dir_all(root.join("proc")).unwrap();
        std::fs::write(root.join("sys/devices/system/cpu/online"), "0-3\n").unwrap();
        std::fs::write(root.join("proc/meminfo"), meminfo(16 * 1024 * 1024)).unwrap();
        for (ctrl, files) in [
            (
                "cpu",
                vec![
                    ("cpu.cfs_quota_us", "-1".to_owned()),
                    ("cpu.cfs_period_us", "100000".into()),
                    ("cpu.shares", pods_shares.to_string()),
                ],
            ),
            (
                "memory",
                vec![
                    ("memory.limit_in_bytes", pods_memory.to_string()),
                    ("memory.soft_limit_in_bytes", "9223372036854771712".into()),
                    ("memory.usage_in_bytes", "0".into()),
                ],
            ),
        ] {
            let d = root.join("cg").join(ctrl).join("kubepods");
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in files {
                std::fs::write(d.join(f), v).unwrap();
            }
        }
        std::fs::write(
            root.join("kubelet.yaml"),
            "kind: KubeletConfiguration\nsystemReserved: {cpu: 500m, memory: 1Gi}\nkubeReserved: {cpu: 500m, memory: 512Mi}\n",
        )
        .unwrap();
        let cgroups = Cgroups::V1(crate::cgroup::V1 {
            cpu: root.join("cg/cpu"),
            memory: root.join("cg/memory"),
        });
        let mut cfg = Config::default();
        cfg.kubelet.config_file = root.join("kubelet.yaml");
        let state = NodeState::with_cgroups(cfg, Some(cgroups));
        let node = NodeReader::new(root);
        (dir, state, node)
    }

    #[tokio::test]
    async fn kubelets_reserve_becomes_admissions() {
        let (_dir, state, node) = fixture(16 * GI - GI - 512 * (1 << 20), 3072);
        check_now(&state, &node).await;
        let r = state.node_reserve();
        assert_eq!(r.memory_bytes, GI + 512 * (1 << 20) + 100 * (1 << 20));
        assert_eq!(r.cpu_millis, 1000);
        let status = state.reserve.read_locked().clone().unwrap();
        assert_eq!(status.source, ReserveSource::KubeletConfig);
        assert_eq!(status.pods_cgroup.as_deref(), Some("/kubepods"));
        assert!(status.problems.is_empty(), "{:?}", status.problems);
        let text = state.metrics.encode().unwrap();
        assert!(
            text.contains("nri_resize_node_reserve_mismatch{resource=\"memory\"} 0"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn disagreements_are_reported_and_an_unreadable_file_falls_back() {
        let (dir, state, node) = fixture(16 * GI - 2 * GI, 3072);
        {
            let mut cfg = state.config.write_locked();
            cfg.resize.reserved_cpu_millicores = 250;
        }
        check_now(&state, &node).await;
        let status = state.reserve.read_locked().clone().unwrap();
        assert_eq!(status.problems.len(), 2, "{:?}", status.problems);
        assert!(
            status.problems[0].starts_with("cpu: [resize] reserved_cpu is 250m"),
            "{:?}",
            status.problems
        );
        assert!(
            status.problems[1].starts_with("memory: kubelet's pods cgroup"),
            "{:?}",
            status.problems
        );
        let text = state.metrics.encode().unwrap();
        assert!(
            text.contains("nri_resize_node_reserve_mismatch{resource=\"memory\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("nri_resize_node_reserve_mismatch{resource=\"cpu\"} 1"),
            "{text}"
        );

        std::fs::write(
            dir.path().join("kubelet.yaml"),
            "kubeReserved: {memory: lots}\n",
        )
        .unwrap();
        check_now(&state, &node).await;
        let status = state.reserve.read_locked().clone().unwrap();
        assert_eq!(status.source, ReserveSource::Config);
        assert_eq!(
            state.node_reserve().cpu_millis,
            250,
            "[resize]'s reserve again"
        );
        assert!(
            status
                .problems
                .iter()
                .any(|p| p.contains("kubeReserved.memory")
                    && p.contains("admission uses [resize]'s reserve")),
            "{:?}",
            status.problems
        );
    }
}
