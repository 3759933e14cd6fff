//! nri-resize beside another NRI plugin on real containerd (issue 25, point 3): NRI gives every
//! field of an update one owner, so a reply that restates a field nri-resize does not change
//! (cpuset, a `unified` key, huge pages, pids, swap) fails the runtime's request when another
//! plugin adjusts it. The other plugin here is the tests' own Go plugin on NRI's Go stub
//! (`tests/go-plugin`, independent of nri-resize's code and transport): on every
//! `UpdateContainer` it sets the cpuset and, on cgroup v2, one `unified` key.
//!
//! Through a CPU resize, a staged memory decrease below usage (reclaimed to the new limit) and a
//! resize that needs a restart, every CRI update succeeds and both plugins' adjustments are in
//! place: read back from the cgroup (cpuset, quota, memory limit) and from the runtime's spec
//! (`ContainerStatus`) where the container has already exited.

use std::time::{Duration, Instant};

use nri_resize::api::ApiClient;
use nri_resize::policy::ResizeState;
use nri_resize_tests::cri::ContainerState;
use nri_resize_tests::{
    go_plugin_binary, resize_record, CgroupMode, Containerd, ContainerdOptions, ContainerdVersion,
    GoPlugin, GoPluginMode, PluginProcess, Resources,
};

const MIB: i64 = 1 << 20;
/// 400 MiB of clean page cache (written, then synced) and 50 MiB held anonymous.
const CACHE_AND_ANON: &str =
    "dd if=/dev/zero of=/tmp/cache bs=1M count=400 2>/dev/null; sync; dd if=/dev/zero bs=50M count=1 2>/dev/null | sleep 3600";
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

/// Waits until the record of `id` leaves `InProgress`; returns it.
async fn settled(
    api: &ApiClient,
    id: &str,
    within: Duration,
) -> nri_resize::resize::ContainerResize {
    let deadline = Instant::now() + within;
    loop {
        let r = resize_record(api, id).await;
        if r.state != Some(ResizeState::InProgress) {
            return r;
        }
        assert!(Instant::now() < deadline, "still in progress: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn coexist(version: ContainerdVersion) {
    // Built (or found in the cache) before containerd and nri-resize start.
    let _ = go_plugin_binary();
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    // `inline_max = 0`: a decrease below usage takes the staged path (the interim limit in the
    // reply, then the reclaim), the reply this test is about.
    let plugin = PluginProcess::start_ready(
        &ctrd,
        "nri-resize",
        Some("[memory_decrease]\ntimeout_ms = 5000\ninline_max = 0\n"),
    )
    .await;
    let api = plugin.api();
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
    let logs = || {
        format!(
            "containerd {}\nnri-resize:\n{}\nnri-other:\n{}\ncontainerd:\n{}",
            ctrd.version(),
            plugin.log_tail(30),
            other.log_tail(10),
            ctrd.log_tail(30)
        )
    };

    // 1. A CPU resize: kubelet's quota, the other plugin's cpuset.
    let (_pod, a) = ctrd
        .loaded_pod("cache", &[], CACHE_AND_ANON, 440 * MIB)
        .await;
    ctrd.update_container_resources(&a, &Resources::limits(150_000, 512 * MIB))
        .await
        .unwrap_or_else(|e| panic!("the CPU resize failed: {e:?}\n{}", logs()));
    assert_eq!(ctrd.container_cpu_quota(&a), 150_000, "the new quota");
    assert_other_plugin_in_cgroup(&ctrd, &a, "after the CPU resize");
    assert_eq!(other.updates_of(&a), 1, "{}", other.log_tail(10));

    // 2. A staged decrease below usage: nri-resize's reply sets the interim limit, the other
    //    plugin's the cpuset, in the same update; then the reclaim reaches 128 MiB.
    ctrd.update_container_resources(&a, &Resources::limits(150_000, 128 * MIB))
        .await
        .unwrap_or_else(|e| panic!("the staged memory decrease failed: {e:?}\n{}", logs()));
    let interim = ctrd.container_memory_limit(&a);
    assert!(
        interim >= 128 * MIB,
        "never below the requested limit: {interim}"
    );
    assert_other_plugin_in_cgroup(&ctrd, &a, "after the staged decrease's update");
    let rec = settled(&api, &a, Duration::from_secs(30)).await;
    assert_eq!(rec.state, None, "the staged decrease converged: {rec:?}");
    assert_eq!(
        ctrd.container_memory_limit(&a),
        128 * MIB,
        "the cgroup holds 128 MiB"
    );
    assert_eq!(ctrd.container_cpu_quota(&a), 150_000);
    assert_other_plugin_in_cgroup(&ctrd, &a, "after the reclaim");
    let status = ctrd
        .container_resources(&a)
        .await
        .expect("ContainerStatus")
        .expect("resources");
    assert_eq!(status.memory_limit_in_bytes, 128 * MIB, "{status:?}");
    assert_eq!(status.cpuset_cpus, OTHER_CPUS, "{status:?}");
    assert!(running(&ctrd, &a).await, "never restarted");
    assert_eq!(oom_kills(&ctrd, &a), 0);
    assert_eq!(other.updates_of(&a), 2, "{}", other.log_tail(10));

    // 3. A resize that needs a restart (strategy `restart`, anonymous memory): nri-resize keeps
    //    the memory limit in the update (the only field it changes) and stops the container. A
    //    CPU decrease first (the node has room for no more) puts the other plugin's cpuset in
    //    the container's spec, which a reply restating the spec would claim.
    let (_pod, b) = ctrd
        .loaded_pod(
            "restart",
            &[("memory-decrease.nri-resize.io/container.app", "restart")],
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
    assert_other_plugin_in_cgroup(&ctrd, &b, "after the CPU resize");
    ctrd.update_container_resources(&b, &Resources::limits(80_000, 100 * MIB))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the update of the resize that needs a restart failed: {e:?}\n{}",
                logs()
            )
        });
    let deadline = Instant::now() + Duration::from_secs(15);
    while running(&ctrd, &b).await {
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
