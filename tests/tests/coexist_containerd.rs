//! nri-resize beside another NRI plugin on real containerd (issue 25, point 3): NRI gives every
//! field of an update one owner, so a reply that restates a field nri-resize does not change
//! (cpuset, a `unified` key, huge pages, pids, swap) fails the runtime's request when another
//! plugin adjusts it. The other plugin here is the tests' own Go plugin on NRI's Go stub
//! (`tests/go-plugin`, independent of nri-resize's code and transport): on every
//! `UpdateContainer` it sets the cpuset and, on cgroup v2, one `unified` key.
//!
//! Through a CPU resize and a resize that needs a restart every CRI update succeeds and both
//! plugins' adjustments are in place: read back from the cgroup (cpuset, quota, memory limit) and
//! from the runtime's spec (`ContainerStatus`) where the container has already exited. A memory
//! decrease below anonymous usage is refused with nri-resize's own reason (never a conflict
//! between the plugins), and nothing of it lands.

use std::time::{Duration, Instant};

use nri_resize::policy::ResizeState;
use nri_resize_tests::cri::ContainerState;
use nri_resize_tests::{
    go_plugin_binary, resize_record, scrape_metrics, CgroupMode, Containerd, ContainerdOptions,
    ContainerdVersion, GoPlugin, GoPluginMode, PluginProcess, Resources,
};

const MIB: i64 = 1 << 20;
const ANON_300: &str = "dd if=/dev/zero bs=300M count=1 2>/dev/null | sleep 3600";
/// The cpuset the other plugin gives every updated container (CPU 0 exists everywhere).
const OTHER_CPUS: &str = "0";
/// Its `unified` key on cgroup v2 (a 1 MiB memory protection: visible, harmless).
const OTHER_UNIFIED: (&str, &str) = ("memory.low", "1048576");

fn v2(ctrd: &Containerd) -> bool {
    ctrd.cgroups().mode() == CgroupMode::V2
}

/// The other plugin's adjustments, read back from the container's cgroup.
fn assert_other_plugin_in_cgroup(ctrd: &Containerd, id: &str, when: &str) {
    let cpus = ctrd.read_container_cgroup(id, "cpuset.cpus");
    assert_eq!(cpus, OTHER_CPUS, "{when}: the other plugin's cpuset");
    if v2(ctrd) {
        let low = ctrd.read_container_cgroup(id, OTHER_UNIFIED.0);
        assert_eq!(
            low, OTHER_UNIFIED.1,
            "{when}: the other plugin's unified key"
        );
    }
}

async fn running(ctrd: &Containerd, id: &str) -> bool {
    ctrd.container_status(id)
        .await
        .is_ok_and(|s| s.state == ContainerState::ContainerRunning as i32)
}

fn oom_kills(ctrd: &Containerd, id: &str) -> u64 {
    let file = if v2(ctrd) {
        "memory.events"
    } else {
        "memory.oom_control"
    };
    nri_resize::observer::parse::oom_kill_count(&ctrd.read_container_cgroup(id, file)).unwrap_or(0)
}

async fn coexist(version: ContainerdVersion) {
    // Built (or found in the cache) before containerd and nri-resize start.
    let _ = go_plugin_binary();
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    let plugin = PluginProcess::start_ready(
        &ctrd,
        "nri-resize",
        Some("[memory_decrease]\ntimeout = \"5s\"\n"),
    )
    .await;
    // After nri-resize (index 50): the order in which a claimed field conflicts.
    let other = GoPlugin::start(
        &ctrd,
        "nri-other",
        "90",
        &GoPluginMode::Adjust {
            cpus: OTHER_CPUS.into(),
            mems: String::new(),
            unified: v2(&ctrd).then(|| (OTHER_UNIFIED.0.into(), OTHER_UNIFIED.1.into())),
        },
    );
    let s = Sides {
        ctrd: &ctrd,
        plugin: &plugin,
        other: &other,
    };
    resize_and_refused_decrease(&s).await;
    restart(&s).await;
}

/// containerd, nri-resize and the other plugin.
struct Sides<'a> {
    ctrd: &'a Containerd,
    plugin: &'a PluginProcess,
    other: &'a GoPlugin,
}

impl Sides<'_> {
    /// The three logs' tails, for a failure's message.
    fn logs(&self) -> String {
        format!(
            "containerd {}\nnri-resize:\n{}\nnri-other:\n{}\ncontainerd:\n{}",
            self.ctrd.version(),
            self.plugin.log_tail(30),
            self.other.log_tail(10),
            self.ctrd.log_tail(30)
        )
    }
}

/// A CPU resize (step 1), then a decrease below usage (step 2): 300 MiB of anonymous memory,
/// limit to 100 MiB. Anonymous memory (no swap) cannot go, so nri-resize refuses the update
/// (kubelet never writes an interim): the runtime's error is nri-resize's reason, not a clash
/// of the two plugins' adjustments, and the container keeps its limit, quota and the other
/// plugin's cpuset.
async fn resize_and_refused_decrease(s: &Sides<'_>) {
    let Sides {
        ctrd,
        plugin,
        other,
    } = *s;
    let api = plugin.api();
    let logs = || s.logs();

    // 1. A CPU resize: kubelet's quota, the other plugin's cpuset.
    let (_pod, a) = ctrd.loaded_pod("anon", &[], ANON_300, 300 * MIB).await;
    ctrd.update_container_resources(&a, &Resources::limits(150_000, 512 * MIB))
        .await
        .unwrap_or_else(|e| panic!("the CPU resize failed: {e:?}\n{}", logs()));
    assert_eq!(ctrd.container_cpu_quota(&a), 150_000, "the new quota");
    assert_other_plugin_in_cgroup(ctrd, &a, "after the CPU resize");
    assert_eq!(other.updates_of(&a), 1, "{}", other.log_tail(10));

    // 2. The decrease below usage: refused with nri-resize's reason.
    let err = ctrd
        .update_container_resources(&a, &Resources::limits(150_000, 100 * MIB))
        .await
        .expect_err("a decrease below anonymous usage is refused");
    assert!(
        err.message().contains("nri-resize")
            && err
                .message()
                .contains("anonymous memory cannot be reclaimed"),
        "nri-resize's reason, not a conflict: {err:?}\n{}",
        logs()
    );
    let rec = resize_record(&api, &a).await;
    assert_eq!(rec.state, Some(ResizeState::Deferred), "{rec:?}");
    let metrics = scrape_metrics(&api).await;
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "nri_resize_memory_decrease_outcomes_total{outcome=\"deferred_anonymous\"} "
        ) && !l.ends_with(" 0")),
        "no refused decrease in /metrics\n{}",
        logs()
    );
    assert_eq!(
        ctrd.container_memory_limit(&a),
        512 * MIB,
        "the limit as it was"
    );
    assert_eq!(ctrd.container_cpu_quota(&a), 150_000);
    assert_other_plugin_in_cgroup(ctrd, &a, "after the refused decrease");
    let status = ctrd
        .container_resources(&a)
        .await
        .expect("ContainerStatus")
        .expect("resources");
    assert_eq!(status.memory_limit_in_bytes, 512 * MIB, "{status:?}");
    assert_eq!(status.cpuset_cpus, OTHER_CPUS, "{status:?}");
    assert!(running(ctrd, &a).await, "never restarted");
    assert_eq!(oom_kills(ctrd, &a), 0);
}

/// A resize that needs a restart (step 3).
async fn restart(s: &Sides<'_>) {
    let Sides {
        ctrd,
        plugin,
        other,
    } = *s;
    let api = plugin.api();
    let logs = || s.logs();

    // 3. A resize that needs a restart (strategy `Restart`, anonymous memory): nri-resize keeps
    //    the memory limit in the update (the only field it changes) and stops the container. A
    //    CPU decrease first (the node has room for no more) puts the other plugin's cpuset in
    //    the container's spec, which a reply restating the spec would claim.
    let (_pod, b) = ctrd
        .loaded_pod(
            "restart",
            &[("memory-decrease.nri-resize.io/container.app", "Restart")],
            ANON_300,
            300 * MIB,
        )
        .await;
    ctrd.update_container_resources(&b, &Resources::limits(80_000, 512 * MIB))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the CPU resize before the restart failed: {e:?}\n{}",
                logs()
            )
        });
    assert_other_plugin_in_cgroup(ctrd, &b, "after the CPU resize");
    ctrd.update_container_resources(&b, &Resources::limits(80_000, 100 * MIB))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the update of the resize that needs a restart failed: {e:?}\n{}",
                logs()
            )
        });
    let deadline = Instant::now() + Duration::from_secs(15);
    while running(ctrd, &b).await {
        assert!(
            Instant::now() < deadline,
            "restart: the container was not stopped\n{}",
            plugin.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let st = ctrd.container_status(&b).await.expect("status");
    assert_ne!(st.reason, "OOMKilled", "stopped, not OOM-killed: {st:?}");
    let rec = resize_record(&api, &b).await;
    assert!(rec.reason.contains("restart"), "{rec:?}");
    // The runtime's spec (the cgroup went with the container): both plugins' fields.
    let spec = ctrd
        .container_resources(&b)
        .await
        .expect("ContainerStatus")
        .expect("resources");
    assert_eq!(
        spec.memory_limit_in_bytes,
        512 * MIB,
        "nri-resize kept the memory limit: {spec:?}"
    );
    assert_eq!(
        spec.cpuset_cpus, OTHER_CPUS,
        "the other plugin's cpuset: {spec:?}"
    );
    assert_eq!(other.updates_of(&b), 2, "{}", other.log_tail(10));
    assert!(
        !plugin.log_tail(400).contains("conflict"),
        "{}",
        plugin.log_tail(40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nri_resize_coexists_with_another_nri_plugin_containerd_1_7() {
    coexist(ContainerdVersion::V1_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nri_resize_coexists_with_another_nri_plugin_containerd_2() {
    coexist(ContainerdVersion::V2).await;
}
