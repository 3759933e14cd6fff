//! The resize engine against real containerd and real cgroups: resize policy and actions,
//! eviction for `RestartContainer`, admission (enforce and observe), the cgroup v1 ordering that
//! kubelet's one-container updates need (kubernetes/kubernetes#127356), whole-pod resizes of a
//! three-container Guaranteed pod through the API in every direction, a plugin killed in the
//! middle of a resize that resumes from its checkpoint, and a CLI killed in the middle of one
//! (the resize is the daemon's, not the request's), and a container raised above its pod cgroup
//! reported as capped by it (kubernetes/kubernetes#138760).
//!
//! The runtime is containerd (1.7.24 and 2.x); with `NRI_RESIZE_CRIO_BIN=<dir>` the harness
//! runs a CRI-O build in its place (by hand: no CRI-O package reaches these machines).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nri_resize::policy::ResizeState;
use nri_resize::resize::{ContainerTarget, PodResize, PodResizeRequest};
use nri_resize_tests::cri::ContainerState;
use nri_resize_tests::{
    plugin_binary, resize_record, scrape_metrics, CgroupMode, ContainerSpec, Containerd,
    ContainerdOptions, ContainerdVersion, PluginProcess, Pod, PodSpec, Resources,
};

const MIB: i64 = 1 << 20;
const READY: Duration = Duration::from_secs(15);

fn v1(ctrd: &Containerd) -> bool {
    ctrd.cgroups().mode() == CgroupMode::V1
}

fn cpu_quota(ctrd: &Containerd, id: &str) -> i64 {
    ctrd.container_cpu_quota(id)
}

async fn pod_with(
    ctrd: &Containerd,
    name: &str,
    annotations: &[(&str, &str)],
    pod_limits: Resources,
    containers: &[(&str, Resources)],
) -> (Pod, Vec<String>) {
    let mut spec = PodSpec::new(name);
    for (k, v) in annotations {
        spec.annotations.insert((*k).to_string(), (*v).to_string());
    }
    spec.resources = pod_limits;
    let pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
    let mut ids = Vec::new();
    for (cname, res) in containers {
        let mut c = ContainerSpec::new(cname, &["sleep", "3600"]);
        c.resources = *res;
        let id = Box::pin(ctrd.create_container(&pod, c))
            .await
            .expect("CreateContainer");
        ctrd.start_container(&id).await.expect("StartContainer");
        ids.push(id);
    }
    (pod, ids)
}

async fn wait_exited(ctrd: &Containerd, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let st = ctrd.container_status(id).await.expect("ContainerStatus");
        if st.state == ContainerState::ContainerExited as i32 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "container {id} was not evicted (state {})",
            st.state
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each policy and action, as pod owners set them through annotations.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario per policy and action, in sequence"
)]
async fn resize_policy_and_actions() {
    let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", None).await;
    let api = plugin.api();
    let pod_limits = Resources::limits(400_000, 1024 * MIB);
    let small = Resources::limits(10_000, 64 * MIB);

    // Node default NotRequired: resized in place.
    let (_, ids) = pod_with(&ctrd, "default-policy", &[], pod_limits, &[("app", small)]).await;
    ctrd.update_container_resources(&ids[0], &Resources::limits(20_000, 128 * MIB))
        .await
        .expect("in-place update");
    assert_eq!(
        (
            cpu_quota(&ctrd, &ids[0]),
            ctrd.container_memory_limit(&ids[0])
        ),
        (20_000, 128 * MIB)
    );

    // RestartContainer for memory: a memory resize evicts the container, with the reason.
    let restart = [(
        "resize-policy.nri-resize.io/container.app",
        "memory=RestartContainer",
    )];
    let (_, ids) = pod_with(
        &ctrd,
        "restart-memory",
        &restart,
        pod_limits,
        &[("app", small)],
    )
    .await;
    ctrd.update_container_resources(&ids[0], &Resources::limits(10_000, 128 * MIB))
        .await
        .ok();
    wait_exited(&ctrd, &ids[0]).await;
    let rec = resize_record(&api, &ids[0]).await;
    assert!(rec.reason.contains("restart required"), "{rec:?}");

    // ...while a CPU-only resize of the same policy stays in place.
    let (_, ids) = pod_with(
        &ctrd,
        "restart-memory-cpu",
        &restart,
        pod_limits,
        &[("app", small)],
    )
    .await;
    ctrd.update_container_resources(&ids[0], &Resources::limits(30_000, 64 * MIB))
        .await
        .expect("CPU resize stays in place");
    assert_eq!(cpu_quota(&ctrd, &ids[0]), 30_000);
    let st = ctrd.container_status(&ids[0]).await.expect("status");
    assert_eq!(
        st.state,
        ContainerState::ContainerRunning as i32,
        "a CPU resize must not restart it"
    );

    // Per direction: memory.decrease=RestartContainer restarts on a decrease only.
    let dir = [(
        "resize-policy.nri-resize.io/container.app",
        "memory.decrease=RestartContainer",
    )];
    let (_, ids) = pod_with(
        &ctrd,
        "restart-on-decrease",
        &dir,
        pod_limits,
        &[("app", small)],
    )
    .await;
    ctrd.update_container_resources(&ids[0], &Resources::limits(10_000, 96 * MIB))
        .await
        .expect("increase in place");
    assert_eq!(ctrd.container_memory_limit(&ids[0]), 96 * MIB);
    ctrd.update_container_resources(&ids[0], &Resources::limits(10_000, 80 * MIB))
        .await
        .ok();
    wait_exited(&ctrd, &ids[0]).await;

    // LiveResize: in place or fail, never a restart.
    let live = [
        (
            "resize-policy.nri-resize.io/container.app",
            "memory=RestartContainer",
        ),
        ("resize-action.nri-resize.io/pod", "LiveResize"),
    ];
    let (_, ids) = pod_with(&ctrd, "live-resize", &live, pod_limits, &[("app", small)]).await;
    let err = ctrd
        .update_container_resources(&ids[0], &Resources::limits(10_000, 128 * MIB))
        .await
        .expect_err("LiveResize that needs a restart fails");
    assert!(err.message().contains("refused"), "{err:?}");
    assert_eq!(
        ctrd.container_memory_limit(&ids[0]),
        64 * MIB,
        "nothing applied"
    );
    let st = ctrd.container_status(&ids[0]).await.expect("status");
    assert_eq!(st.state, ContainerState::ContainerRunning as i32);
    assert_eq!(
        resize_record(&api, &ids[0]).await.state,
        Some(ResizeState::Error)
    );

    // Restart action: every resize restarts the container, even one the policy allows in place.
    let (_, ids) = pod_with(
        &ctrd,
        "restart-action",
        &[("resize-action.nri-resize.io/pod", "Restart")],
        pod_limits,
        &[("app", small)],
    )
    .await;
    ctrd.update_container_resources(&ids[0], &Resources::limits(15_000, 64 * MIB))
        .await
        .ok();
    wait_exited(&ctrd, &ids[0]).await;

    // A malformed annotation: the container is still created and resized by the node default.
    let bad = [("resize-policy.nri-resize.io/pod", "cpu=Sometimes,,memory")];
    let (_, ids) = pod_with(&ctrd, "malformed", &bad, pod_limits, &[("app", small)]).await;
    ctrd.update_container_resources(&ids[0], &Resources::limits(25_000, 64 * MIB))
        .await
        .expect("resize despite a bad annotation");
    assert_eq!(cpu_quota(&ctrd, &ids[0]), 25_000);
    let log = plugin.log_tail(200);
    assert!(
        log.contains("resize annotation ignored") && log.contains("Sometimes"),
        "the bad annotation is reported:\n{log}"
    );
}

/// The value of one sample in `/metrics` text (`name{labels}` exactly), 0 when absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A restart the policy demands happens on every runtime, and is confirmed: containerd through
/// 2.3 drops a plugin's NRI evictions, so the plugin stops the container itself (SIGKILL through
/// a pidfd, only while the pid is in the container's cgroup) and waits for the runtime's
/// `StopContainer`. `UpdateContainerResources` succeeds with the old resources kept.
async fn restart_happens_and_is_confirmed(version: ContainerdVersion) {
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", None).await;
    let api = plugin.api();
    let restart = [(
        "resize-policy.nri-resize.io/container.app",
        "memory=RestartContainer",
    )];
    let (_, ids) = pod_with(
        &ctrd,
        "restart-confirmed",
        &restart,
        Resources::limits(400_000, 1024 * MIB),
        &[("app", Resources::limits(10_000, 64 * MIB))],
    )
    .await;
    ctrd.update_container_resources(&ids[0], &Resources::limits(10_000, 128 * MIB))
        .await
        .expect("the update is answered OK (old resources kept)");
    wait_exited(&ctrd, &ids[0]).await;
    let kept = ctrd
        .container_resources(&ids[0])
        .await
        .expect("ContainerStatus")
        .expect("resources reported");
    assert_eq!(
        kept.memory_limit_in_bytes,
        64 * MIB,
        "old limit kept until the restart"
    );
    // Confirmed once the runtime reported the stop.
    let deadline = Instant::now() + Duration::from_secs(15);
    let rec = loop {
        let rec = resize_record(&api, &ids[0]).await;
        if rec.reason.contains("restarted") || Instant::now() > deadline {
            break rec;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        rec.reason.contains("restart required")
            && rec.reason.contains("runtime confirmed the stop"),
        "{version} ({}): {rec:?}\n{}",
        ctrd.version(),
        plugin.log_tail(30)
    );
    assert_eq!(rec.state, None, "{rec:?}");
    let metrics = scrape_metrics(&api).await;
    assert_eq!(
        (
            sample(
                &metrics,
                r#"nri_resize_restarts_total{outcome="confirmed"}"#
            ),
            sample(&metrics, r#"nri_resize_restarts_total{outcome="failed"}"#),
            sample(&metrics, "nri_resize_restarts_pending"),
        ),
        (1.0, 0.0, 0.0),
        "restart metrics"
    );
    assert!(
        plugin
            .log_tail(100)
            .contains("container stopped for its restart"),
        "logged"
    );
    eprintln!(
        "=== {version} ({}): restart carried out and confirmed",
        ctrd.version()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_happens_and_is_confirmed_containerd_1_7() {
    Box::pin(restart_happens_and_is_confirmed(ContainerdVersion::V1_7)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_happens_and_is_confirmed_containerd_2() {
    Box::pin(restart_happens_and_is_confirmed(ContainerdVersion::V2)).await;
}

/// Admission: a resize that can never fit is Infeasible; enforce fails it, observe reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admission_enforce_and_observe() {
    let huge = Resources::limits(50_000, 1 << 40); // 1 TiB of memory: above any test machine
    for (mode, config) in [
        ("enforce", None),
        ("observe", Some("[resize]\nmode = \"Observe\"\n")),
    ] {
        let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
        let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", config).await;
        let (_, ids) = pod_with(
            &ctrd,
            "admission",
            &[],
            Resources::limits(400_000, 0),
            &[("app", Resources::limits(50_000, 64 * MIB))],
        )
        .await;
        let r = ctrd.update_container_resources(&ids[0], &huge).await;
        let rec = resize_record(&plugin.api(), &ids[0]).await;
        assert_eq!(rec.state, Some(ResizeState::Infeasible), "{mode}: {rec:?}");
        assert!(
            rec.reason.contains("memory"),
            "{mode}: the reason names the resource: {rec:?}"
        );
        if mode == "enforce" {
            let err = r.expect_err("enforce fails an infeasible resize");
            assert!(err.message().contains("Infeasible"), "{err:?}");
            assert_eq!(ctrd.container_memory_limit(&ids[0]), 64 * MIB);
        } else {
            r.expect("observe lets the update through");
            assert_eq!(ctrd.container_memory_limit(&ids[0]), 1 << 40);
        }
        eprintln!("admission ({mode}): {rec:?}");
    }
}

/// Deferred: the resize fits the node alone but not next to what other pods hold now.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admission_defers_what_does_not_fit_next_to_other_pods() {
    let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", None).await;
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online CPUs");
    let cpus = nri_resize::policy::CpuSet::parse(online.trim())
        .expect("cpu list")
        .count();
    let cpus = i64::from(cpus);
    // Another pod holds all CPUs but half of one; this pod asks for a whole one.
    let big = (cpus * 1000 - 500) * 100;
    let _other = pod_with(
        &ctrd,
        "big",
        &[],
        Resources::limits(big, 0),
        &[("hog", Resources::limits(big, 64 * MIB))],
    )
    .await;
    let (_, ids) = pod_with(
        &ctrd,
        "small",
        &[],
        Resources::limits(400_000, 0),
        &[("app", Resources::limits(10_000, 64 * MIB))],
    )
    .await;
    let err = ctrd
        .update_container_resources(&ids[0], &Resources::limits(100_000, 64 * MIB))
        .await
        .expect_err("deferred in enforce mode");
    assert!(err.message().contains("Deferred"), "{err:?}");
    let rec = resize_record(&plugin.api(), &ids[0]).await;
    assert_eq!(rec.state, Some(ResizeState::Deferred), "{rec:?}");
    assert_eq!(cpu_quota(&ctrd, &ids[0]), 10_000, "nothing applied");
    eprintln!("deferred: {}", rec.reason);
}

/// kubelet updates one container at a time; on cgroup v1 a container quota above its pod's
/// fails with EINVAL (kubernetes/kubernetes#127356). With the plugin the pod cgroup is raised first.
///
/// cgroup v2 differs, and the test states both: v2 accepts a child `cpu.max` above its parent's,
/// so the update without the plugin "succeeds" while the pod cgroup (untouched by the runtime)
/// still caps the container at 1 CPU. With the plugin the pod is raised before a container
/// grows past it, on both versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_style_update_that_fails_on_v1_without_ordering_succeeds() {
    let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
    let (pod, ids) = pod_with(
        &ctrd,
        "einval",
        &[],
        Resources::limits(100_000, 512 * MIB),
        &[("app", Resources::limits(50_000, 64 * MIB))],
    )
    .await;
    let pod_quota = || ctrd.pod_cgroup_limits(&pod).expect("pod cgroup").cpu_quota;

    // Without the plugin: v1 refuses the write; v2 takes it and the pod still caps it.
    let naive = ctrd
        .update_container_resources(&ids[0], &Resources::limits(150_000, 64 * MIB))
        .await;
    if v1(&ctrd) {
        let err = naive.expect_err("v1: EINVAL without ordering");
        eprintln!("v1 without the plugin: {}", err.message());
        assert!(
            err.message().to_lowercase().contains("invalid argument"),
            "{err:?}"
        );
        assert_eq!(cpu_quota(&ctrd, &ids[0]), 50_000);
    } else {
        naive.expect("v2 accepts a child cpu.max above its parent's");
        assert_eq!(cpu_quota(&ctrd, &ids[0]), 150_000);
        assert_eq!(
            pod_quota(),
            Some(100_000),
            "v2: the runtime never raises the pod, so the pod caps the container at 1 CPU"
        );
        eprintln!("v2 without the plugin: accepted, capped by the pod at 100000");
    }

    // With the plugin: the pod cgroup is raised first and the update succeeds. On v1 the same
    // update as above (50 → 150 ms: the pod grows by that, keeping its headroom); on v2 the
    // container already holds 150 ms, so it grows on to 200 ms, and the pod is raised to at least
    // the new sum.
    let _plugin = PluginProcess::start_ready(&ctrd, "nri-resize", None).await;
    let want = if v1(&ctrd) { 150_000 } else { 200_000 };
    ctrd.update_container_resources(&ids[0], &Resources::limits(want, 64 * MIB))
        .await
        .expect("ordered update succeeds");
    assert_eq!(cpu_quota(&ctrd, &ids[0]), want);
    assert_eq!(
        pod_quota(),
        Some(200_000),
        "the pod grew by the container's growth (keeping its headroom), at least to the new sum"
    );
}

/// Per container: name, CPU millicores, memory bytes.
type Targets = [(&'static str, u64, i64); 3];

fn targets(cs: &[(&str, u64, i64)]) -> PodResizeRequest {
    PodResizeRequest {
        containers: cs
            .iter()
            .map(|(n, cpu, mem)| {
                (
                    (*n).to_string(),
                    ContainerTarget {
                        cpu_millis: Some(*cpu),
                        memory_bytes: Some(u64::try_from(*mem).expect("positive")),
                    },
                )
            })
            .collect(),
    }
}

/// A Guaranteed pod (1500m / 384Mi) of containers a, b, c at 500m / 128Mi each; ids by name.
async fn three_guaranteed_containers(
    ctrd: &Containerd,
    name: &str,
) -> (Pod, BTreeMap<String, String>) {
    let each = Resources::limits(50_000, 128 * MIB);
    let containers = [("a", each), ("b", each), ("c", each)];
    let (pod, ids) = pod_with(
        ctrd,
        name,
        &[],
        Resources::limits(150_000, 384 * MIB),
        &containers,
    )
    .await;
    (
        pod,
        containers
            .iter()
            .map(|(n, _)| (*n).to_string())
            .zip(ids)
            .collect(),
    )
}

fn check_steps(r: &PodResize, label: &str) {
    assert!(r.state.is_none(), "{label}: resize not done: {r:?}");
    assert!(!r.steps.is_empty(), "{label}: no steps");
    for (i, s) in r.steps.iter().enumerate() {
        assert!(s.ok, "{label}: step {i} ({}) failed: {}", s.step, s.error);
        assert!(
            s.violation.is_empty(),
            "{label}: after step {i} ({}) the cgroups broke an invariant: {}",
            s.step,
            s.violation
        );
        assert!(
            s.actual.is_some(),
            "{label}: step {i}: cgroups not read back"
        );
    }
    eprintln!(
        "{label}: {}",
        r.steps
            .iter()
            .map(|s| s.step.as_str())
            .collect::<Vec<_>>()
            .join(" -> ")
    );
}

async fn assert_cgroups(
    ctrd: &Containerd,
    pod: &Pod,
    ids: &BTreeMap<String, String>,
    want: &[(&str, u64, i64)],
    label: &str,
) {
    let mut pod_cpu = 0;
    let mut pod_mem = 0;
    for (name, cpu, mem) in want {
        let id = &ids[*name];
        let quota = i64::try_from(*cpu * 100).expect("fits");
        assert_eq!(
            (cpu_quota(ctrd, id), ctrd.container_memory_limit(id)),
            (quota, *mem),
            "{label}: cgroupfs of {name}"
        );
        let reported = ctrd
            .container_resources(id)
            .await
            .expect("ContainerStatus")
            .expect("resources");
        assert_eq!(
            (reported.cpu_quota, reported.memory_limit_in_bytes),
            (quota, *mem),
            "{label}: ContainerStatus of {name}"
        );
        pod_cpu += quota;
        pod_mem += *mem;
    }
    let limits = ctrd.pod_cgroup_limits(pod).expect("pod cgroup");
    assert_eq!(
        limits.cpu_quota,
        Some(pod_cpu),
        "{label}: pod cgroup CPU = sum of containers"
    );
    assert_eq!(
        limits.memory_limit,
        Some(u64::try_from(pod_mem).expect("positive")),
        "{label}: pod cgroup memory = sum"
    );
}

async fn three_container_pod_resizes(version: ContainerdVersion) {
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    eprintln!("=== whole-pod resizes on {version} ({})", ctrd.version());
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", None).await;
    let api = plugin.api();
    let (pod, ids) = three_guaranteed_containers(&ctrd, "guaranteed").await;

    let cases: [(&str, Targets); 4] = [
        (
            "net increase",
            [
                ("a", 600, 192 * MIB),
                ("b", 600, 192 * MIB),
                ("c", 600, 192 * MIB),
            ],
        ),
        (
            "net decrease",
            [
                ("a", 300, 96 * MIB),
                ("b", 300, 96 * MIB),
                ("c", 300, 96 * MIB),
            ],
        ),
        (
            "no net change",
            [
                ("a", 500, 128 * MIB),
                ("b", 200, 64 * MIB),
                ("c", 200, 96 * MIB),
            ],
        ),
        (
            "mixed directions",
            [
                ("a", 200, 256 * MIB),
                ("b", 500, 32 * MIB),
                ("c", 300, 64 * MIB),
            ],
        ),
    ];
    for (label, want) in &cases {
        let started = Instant::now();
        let r = api
            .resize_pod(&pod.namespace, &pod.name, &targets(want))
            .await
            .unwrap_or_else(|e| panic!("{label}: {e}\n{}", plugin.log_tail(30)));
        eprintln!(
            "{label}: {} steps in {:?}",
            r.steps.len(),
            started.elapsed()
        );
        check_steps(&r, label);
        assert_cgroups(&ctrd, &pod, &ids, want, label).await;
        // What `nri-resize status` shows follows: desired == allocated == the target, no state.
        let records = api.resizes().await.expect("resizes").containers;
        for (name, cpu, mem) in want {
            let rec = &records[&ids[*name]];
            let quota = i64::try_from(*cpu * 100).expect("fits");
            for (what, r) in [("desired", &rec.desired), ("allocated", &rec.allocated)] {
                let r = r
                    .as_ref()
                    .unwrap_or_else(|| panic!("{label}: {name} has no {what}"));
                assert_eq!(
                    (r.cpu_quota(), r.memory_limit()),
                    (Some(quota), Some(*mem)),
                    "{label}: {name} {what}"
                );
            }
            assert_eq!(
                rec.state, None,
                "{label}: {name} has a resize pending: {rec:?}"
            );
        }
    }
    // kubelet-style one-container updates still work after API resizes (containerd 1.7 ignores
    // CPU shares in NRI updates, so shares-inferred requests drifted from limits meanwhile).
    ctrd.update_container_resources(&ids["a"], &Resources::limits(40_000, 96 * MIB))
        .await
        .expect("a kubelet-style update after API resizes is not mistaken for a QoS change");
    assert_eq!(cpu_quota(&ctrd, &ids["a"]), 40_000);
    // A request the pod cannot take is refused before anything is written.
    let err = api
        .resize_pod(
            &pod.namespace,
            &pod.name,
            &targets(&[("zzz", 100, 64 * MIB)]),
        )
        .await
        .expect_err("unknown container");
    assert!(err.to_string().contains("zzz"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_pod_resize_of_three_guaranteed_containers_containerd_1_7() {
    Box::pin(three_container_pod_resizes(ContainerdVersion::V1_7)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn whole_pod_resize_of_three_guaranteed_containers_containerd_2() {
    Box::pin(three_container_pod_resizes(ContainerdVersion::V2)).await;
}

/// SIGKILL in the middle of a whole-pod resize: the restarted plugin resumes from its checkpoint,
/// reaches the target, and applies no step twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plugin_killed_mid_resize_resumes_from_its_checkpoint() {
    let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
    let mut plugin = PluginProcess::start_ready(
        &ctrd,
        "nri-resize",
        Some("[resize]\nstep_pause = \"1500ms\"\n"),
    )
    .await;
    let api = plugin.api();
    let (pod, ids) = three_guaranteed_containers(&ctrd, "resume").await;
    let want = [
        ("a", 600, 192 * MIB),
        ("b", 600, 192 * MIB),
        ("c", 600, 192 * MIB),
    ];
    let req = targets(&want);
    let (ns, name) = (pod.namespace.clone(), pod.name.clone());
    let call = {
        let api = api.clone();
        tokio::spawn(async move { api.resize_pod(&ns, &name, &req).await })
    };
    // Wait for the first step(s), then kill.
    let deadline = Instant::now() + Duration::from_secs(15);
    let before = loop {
        let r = api.resizes().await.expect("resizes");
        if let Some(p) = r
            .pods
            .iter()
            .find(|p| p.pod_id == pod.id)
            .filter(|p| !p.steps.is_empty())
        {
            break p.clone();
        }
        assert!(Instant::now() < deadline, "the resize never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    plugin.stop_with(Signal::SIGKILL, Duration::from_secs(5));
    assert!(
        call.await.expect("join").is_err(),
        "the API call dies with the plugin"
    );
    assert!(before.state.is_some(), "killed mid-resize, not after it");
    eprintln!(
        "killed after {} step(s): {:?}",
        before.steps.len(),
        before.steps.iter().map(|s| &s.step).collect::<Vec<_>>()
    );

    plugin.restart();
    plugin.wait_ready(READY).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let resumed = loop {
        let r = api.resizes().await.expect("resizes");
        if let Some(p) = r
            .pods
            .iter()
            .find(|p| p.pod_id == pod.id && p.resumed && p.state.is_none())
        {
            break p.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the resize was not resumed; log:\n{}",
            plugin.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for s in &resumed.steps {
        assert!(s.ok && s.violation.is_empty(), "{s:?}");
        assert!(
            !before.steps.iter().any(|b| b.step == s.step),
            "step {} applied twice",
            s.step
        );
    }
    eprintln!(
        "resumed with {} step(s): {:?}",
        resumed.steps.len(),
        resumed.steps.iter().map(|s| &s.step).collect::<Vec<_>>()
    );
    assert_cgroups(&ctrd, &pod, &ids, &want, "after resume").await;
    assert!(
        std::fs::read_dir(&plugin.state_dir)
            .expect("state dir")
            .filter_map(Result::ok)
            .all(|e| !e.file_name().to_string_lossy().ends_with(".json")),
        "checkpoint removed when done"
    );
}

/// A newer whole-pod request arriving mid-resize takes over: the executor re-plans from the
/// cgroups' actual state to the newest target, and the older request reports it was superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_newer_request_mid_resize_wins() {
    let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
    let plugin = PluginProcess::start_ready(
        &ctrd,
        "nri-resize",
        Some("[resize]\nstep_pause = \"700ms\"\n"),
    )
    .await;
    let api = plugin.api();
    let (pod, ids) = three_guaranteed_containers(&ctrd, "latest-wins").await;
    let first = targets(&[
        ("a", 600, 192 * MIB),
        ("b", 600, 192 * MIB),
        ("c", 600, 192 * MIB),
    ]);
    let newest = [
        ("a", 300, 96 * MIB),
        ("b", 400, 96 * MIB),
        ("c", 300, 64 * MIB),
    ];
    let older = {
        let (api, ns, name) = (api.clone(), pod.namespace.clone(), pod.name.clone());
        tokio::spawn(async move { api.resize_pod(&ns, &name, &first).await })
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !api
        .resizes()
        .await
        .expect("resizes")
        .pods
        .iter()
        .any(|p| p.pod_id == pod.id && !p.steps.is_empty())
    {
        assert!(Instant::now() < deadline, "the first resize never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done = api
        .resize_pod(&pod.namespace, &pod.name, &targets(&newest))
        .await
        .expect("the newest request completes");
    check_steps(&done, "latest wins");
    let err = older
        .await
        .expect("join")
        .expect_err("the older request is superseded");
    assert!(err.to_string().contains("superseded"), "{err}");
    assert_cgroups(&ctrd, &pod, &ids, &newest, "latest wins").await;
}

/// kubelet's `UpdateContainerResources` in flight while nri-resize's own whole-pod API updates
/// the same pod through NRI `UpdateContainers`: containerd before NRI v0.12.1 can deadlock on
/// the two (containerd/containerd#13733), so the plugin sends its update only once none of the
/// runtime's own is in flight (`nri::update_window`). Rounds of both at once, each bounded: none
/// hangs, and the runtime still answers CRI afterwards.
async fn kubelet_updates_beside_whole_pod_resizes(version: ContainerdVersion) {
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", None).await;
    let api = plugin.api();
    let (pod, ids) = three_guaranteed_containers(&ctrd, "overlap").await;
    for round in 0..6u64 {
        let cpu = 300 + 100 * (round % 3);
        let want = targets(&[
            ("a", cpu, 128 * MIB),
            ("b", 500, 128 * MIB),
            ("c", 500, 128 * MIB),
        ]);
        let quota = if round % 2 == 0 { 40_000 } else { 50_000 };
        let whole_pod = {
            let (api, ns, name) = (api.clone(), pod.namespace.clone(), pod.name.clone());
            tokio::spawn(async move { api.resize_pod(&ns, &name, &want).await })
        };
        let b_limits = Resources::limits(quota, 128 * MIB);
        let both = tokio::time::timeout(Duration::from_secs(60), async {
            let (k, w) = tokio::join!(
                ctrd.update_container_resources(&ids["b"], &b_limits),
                whole_pod
            );
            (k, w.expect("join"))
        })
        .await;
        let (k, w) = both.unwrap_or_else(|_| {
            panic!(
                "round {round}: kubelet's update and the whole-pod resize hung together\n{}\n{}",
                plugin.log_tail(40),
                ctrd.log_tail(40)
            )
        });
        eprintln!(
            "round {round}: kubelet's update {}, whole-pod resize {}",
            if k.is_ok() { "ok" } else { "refused" },
            match &w {
                Ok(r) => format!("{} step(s)", r.steps.len()),
                Err(e) => format!("ended: {e}"),
            }
        );
        k.unwrap_or_else(|e| panic!("round {round}: kubelet's CPU update failed: {e:?}"));
    }
    tokio::time::timeout(Duration::from_secs(10), ctrd.container_status(&ids["b"]))
        .await
        .expect("the runtime still answers CRI")
        .expect("ContainerStatus");
    assert!(api.status().await.is_ok(), "the plugin still serves");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_updates_beside_whole_pod_resizes_never_hang_containerd_1_7() {
    Box::pin(kubelet_updates_beside_whole_pod_resizes(
        ContainerdVersion::V1_7,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubelet_updates_beside_whole_pod_resizes_never_hang_containerd_2() {
    Box::pin(kubelet_updates_beside_whole_pod_resizes(
        ContainerdVersion::V2,
    ))
    .await;
}

/// `nri-resize resize` of `pod` to `want`, as a child process (stdout and stderr piped).
fn cli_resize(plugin: &PluginProcess, pod: &Pod, want: &[(&str, u64, i64)]) -> std::process::Child {
    std::process::Command::new(plugin_binary())
        .arg("resize")
        .arg("--api-socket")
        .arg(&plugin.api_socket)
        .arg(format!("{}/{}", pod.namespace, pod.name))
        .args(
            want.iter()
                .map(|(n, cpu, mem)| format!("{n}=cpu={cpu}m,memory={mem}")),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn nri-resize resize")
}

/// Waits (up to 30 s) for the pod's whole-pod record to satisfy `done`.
async fn pod_record(
    plugin: &PluginProcess,
    pod: &Pod,
    what: &str,
    done: impl Fn(&PodResize) -> bool,
) -> PodResize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = plugin.api().resizes().await.expect("resizes");
        if let Some(p) = r.pods.iter().find(|p| p.pod_id == pod.id && done(p)) {
            return p.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not seen; records {:?}; log:\n{}",
            r.pods,
            plugin.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A whole-pod resize belongs to the daemon, not to the request: the CLI killed mid-resize
/// leaves it running to its end, and the pod's next resize runs (before, the dropped request
/// left the pod "running" for ever and every later resize of it waited without bound). A
/// SIGTERM mid-resize then ends it at once, leaving its checkpoint, which the next start resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cli_killed_mid_resize_leaves_the_resize_running_and_the_next_one_runs() {
    let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
    let mut plugin = PluginProcess::start_ready(
        &ctrd,
        "nri-resize",
        Some("[resize]\nstep_pause = \"1500ms\"\n"),
    )
    .await;
    let api = plugin.api();
    let (pod, ids) = three_guaranteed_containers(&ctrd, "cli-killed").await;
    let first = [
        ("a", 600, 192 * MIB),
        ("b", 600, 192 * MIB),
        ("c", 600, 192 * MIB),
    ];
    let mut cli = cli_resize(&plugin, &pod, &first);
    let started = pod_record(&plugin, &pod, "the first step", |p| !p.steps.is_empty()).await;
    assert!(started.state.is_some(), "still under way: {started:?}");
    cli.kill().expect("kill the CLI");
    let _ = cli.wait();
    // The resize goes on without its client and ends done.
    let done = pod_record(&plugin, &pod, "the resize done without its CLI", |p| {
        p.state.is_none()
    })
    .await;
    check_steps(&done, "CLI killed");
    assert!(
        done.steps.len() > started.steps.len(),
        "it went on after the CLI died: {done:?}"
    );
    assert_cgroups(&ctrd, &pod, &ids, &first, "CLI killed").await;
    // The pod's next resize runs to its end (the test's own bound: it must not wait for ever).
    let second = [
        ("a", 400, 128 * MIB),
        ("b", 400, 128 * MIB),
        ("c", 400, 128 * MIB),
    ];
    let next = tokio::time::timeout(
        Duration::from_secs(60),
        api.resize_pod(&pod.namespace, &pod.name, &targets(&second)),
    )
    .await
    .unwrap_or_else(|_| panic!("the next resize never ended; log:\n{}", plugin.log_tail(30)))
    .expect("the next resize");
    check_steps(&next, "next resize");
    assert_cgroups(&ctrd, &pod, &ids, &second, "next resize").await;
    let metrics = scrape_metrics(&api).await;
    let in_progress = sample(&metrics, "nri_resize_memory_decrease_reclaims_in_progress");
    assert!(
        in_progress < 0.5,
        "no reclaim left in progress: {in_progress}"
    );

    // SIGTERM mid-resize: the daemon stops (exit 0, the helper's bound), the CLI is told, the
    // checkpoint stays, and the next start resumes it to its target.
    let third = [
        ("a", 500, 160 * MIB),
        ("b", 500, 160 * MIB),
        ("c", 500, 160 * MIB),
    ];
    let cli = cli_resize(&plugin, &pod, &third);
    pod_record(&plugin, &pod, "the third resize's first step", |p| {
        p.state.is_some() && !p.steps.is_empty()
    })
    .await;
    plugin.stop();
    let out = cli.wait_with_output().expect("the CLI ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the CLI was not told: {stderr}");
    assert!(stderr.contains("stopping"), "the CLI says why: {stderr}");
    assert!(
        std::fs::read_dir(&plugin.state_dir)
            .expect("state dir")
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().starts_with("pod-")),
        "the checkpoint stays for the next start"
    );
    plugin.restart();
    plugin.wait_ready(READY).await;
    let resumed = pod_record(&plugin, &pod, "the resumed resize done", |p| {
        p.resumed && p.state.is_none()
    })
    .await;
    check_steps(&resumed, "resumed after SIGTERM");
    assert_cgroups(&ctrd, &pod, &ids, &third, "resumed after SIGTERM").await;
}

/// The node's online CPUs in millicores, kubelet's configuration file (keeping all CPUs but
/// 500m back, and 512Mi of memory plus the default 100Mi eviction), and a pods cgroup (the
/// harness's own, standing in for kubepods) holding 1Gi less than the node, unlike the file.
fn kubelet_files(ctrd: &Containerd) -> (u64, std::path::PathBuf, String) {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").expect("online CPUs");
    let cpus = nri_resize::policy::CpuSet::parse(online.trim())
        .expect("cpu list")
        .count();
    let cpu_millis = u64::from(cpus) * 1000;
    let kubelet_file = ctrd.base_dir().join("kubelet-config.yaml");
    std::fs::write(
        &kubelet_file,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsystemReserved:\n  cpu: 250m\n  memory: 256Mi\nkubeReserved:\n  cpu: {}m\n  memory: 256Mi\n",
            cpu_millis - 750
        ),
    )
    .expect("write the kubelet configuration");
    let mem_total = nri_resize::capacity::SysReader::new("/")
        .mem_total()
        .expect("MemTotal");
    let pods_cgroup = format!("{}/kubepods", ctrd.cgroups().path());
    ctrd.cgroups().create_cgroup(&pods_cgroup);
    ctrd.cgroups()
        .set_limits(
            &pods_cgroup,
            &nri_resize_tests::CgroupLimits {
                cpu_quota: None,
                cpu_period: 100_000,
                cpu_shares: nri_resize::policy::millis_to_shares(500),
                memory_limit: Some(mem_total - (1 << 30)),
            },
        )
        .expect("pods cgroup limits");
    (cpu_millis, kubelet_file, pods_cgroup)
}

/// The capacity watcher's allocatable CPU gauge line, once it is exported (its first reading
/// follows the observer's start).
async fn allocatable_cpu_line(api: &nri_resize::api::ApiClient) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = scrape_metrics(api).await;
        if let Some(line) = metrics
            .lines()
            .find(|l| l.starts_with("nri_resize_node_allocatable_cpu_cores "))
        {
            return line.to_owned();
        }
        assert!(Instant::now() < deadline, "no allocatable CPU gauge");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Admission keeps back what kubelet keeps back: with `[kubelet] config_file` kubelet's
/// reserve decides admission (a resize that fits the node with `[resize]`'s reserve is
/// Infeasible with kubelet's), a `[resize]` reserve unlike kubelet's is reported, and so is a
/// pods cgroup that holds less than the file says (kubelet running with other settings). Without
/// the file, the same resize is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admission_reserve_comes_from_kubelet() {
    let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
    let (cpu_millis, kubelet_file, pods_cgroup) = kubelet_files(&ctrd);
    let config = format!(
        "[resize]\nreserved_cpu = \"100m\"\n[kubelet]\nconfig_file = \"{}\"\npods_cgroup = \"{pods_cgroup}\"\n",
        kubelet_file.display()
    );
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", Some(&config)).await;
    let api = plugin.api();

    let status = api.status().await.expect("status");
    let reserve = status.reserve.expect("the status has a reserve section");
    eprintln!("reserve: {reserve:?}");
    assert_eq!(
        reserve.source,
        nri_resize::state::ReserveSource::KubeletConfig
    );
    assert_eq!(reserve.cpu_millis, cpu_millis - 500);
    assert_eq!(reserve.memory_bytes, (512 + 100) << 20);
    assert_eq!(reserve.pods_cgroup.as_deref(), Some(pods_cgroup.as_str()));
    let problems = reserve.problems.join("\n");
    assert!(
        problems.contains("cpu: [resize] reserved_cpu is 100m but kubelet reserves"),
        "{problems}"
    );
    assert!(
        problems.contains("memory: kubelet's pods cgroup holds")
            && problems.contains("keeps 1Gi back"),
        "{problems}"
    );
    let metrics = scrape_metrics(&api).await;
    for resource in ["memory", "cpu"] {
        assert!(
            metrics.contains(&format!(
                "nri_resize_node_reserve_mismatch{{resource=\"{resource}\"}} 1"
            )),
            "{resource} mismatch exported"
        );
    }
    // The capacity watcher's gauges use the same reserve.
    let allocatable = allocatable_cpu_line(&api).await;
    assert_eq!(
        allocatable, "nri_resize_node_allocatable_cpu_cores 0.5",
        "allocatable CPU follows kubelet's reserve"
    );

    // 10m → 1 CPU: fits the node's CPUs, not kubelet's 500m allocatable.
    let (_, ids) = pod_with(
        &ctrd,
        "reserve",
        &[],
        Resources::limits(400_000, 0),
        &[("app", Resources::limits(1_000, 64 * MIB))],
    )
    .await;
    let err = ctrd
        .update_container_resources(&ids[0], &Resources::limits(100_000, 64 * MIB))
        .await
        .expect_err("kubelet's reserve leaves 500m: 1 CPU is infeasible");
    assert!(err.message().contains("Infeasible"), "{err:?}");
    let rec = resize_record(&api, &ids[0]).await;
    assert_eq!(rec.state, Some(ResizeState::Infeasible), "{rec:?}");
    assert!(rec.reason.contains("CPU"), "the reason names CPU: {rec:?}");
    drop(plugin);

    // Without kubelet's file, `[resize]`'s reserve (100m) decides: the same resize fits. The
    // pods cgroup still keeps more memory back than `[resize]` does: reported.
    let config =
        format!("[resize]\nreserved_cpu = \"100m\"\n[kubelet]\npods_cgroup = \"{pods_cgroup}\"\n");
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", Some(&config)).await;
    let reserve = plugin
        .api()
        .status()
        .await
        .expect("status")
        .reserve
        .expect("reserve");
    assert_eq!(reserve.source, nri_resize::state::ReserveSource::Config);
    assert_eq!(reserve.cpu_millis, 100);
    assert!(
        reserve.problems.iter().any(|p| p.starts_with(
            "memory: [resize] reserved_memory is 0 but kubelet's pods cgroup keeps 1Gi back"
        )),
        "{:?}",
        reserve.problems
    );
    ctrd.update_container_resources(&ids[0], &Resources::limits(100_000, 64 * MIB))
        .await
        .expect("[resize]'s reserve admits it");
    assert_eq!(cpu_quota(&ctrd, &ids[0]), 100_000);
}

/// The caps `/v1/status` reports for container `id` once `done` holds them (up to 30 s: the
/// observer re-reads the cgroup path every 5 of its 1 s intervals).
async fn caps_of(
    plugin: &PluginProcess,
    id: &str,
    what: &str,
    done: impl Fn(&nri_resize::cgroup::Caps) -> bool,
) -> nri_resize::api::ContainerObserved {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = plugin.api().status().await.expect("status");
        let observed = status
            .pods
            .iter()
            .flat_map(|p| &p.containers)
            .find(|c| c.id == id)
            .and_then(|c| c.observed.clone());
        if let Some(o) = observed.as_ref() {
            if o.caps.as_ref().is_some_and(&done) {
                return o.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not seen within 60 s; last: {observed:?}\n{}",
            plugin.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `nri_resize_capped_containers{resource="memory"}` as the plugin's `/metrics` says (-1: absent).
async fn capped_memory(plugin: &PluginProcess) -> i64 {
    let text = scrape_metrics(&plugin.api()).await;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(r#"nri_resize_capped_containers{resource="memory"} "#)?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(-1)
}

/// `nri-resize status` shows the effective limit as ACTUAL and the cap as REASON.
fn status_table_shows_the_cap(plugin: &PluginProcess) {
    let table = std::process::Command::new(plugin_binary())
        .arg("status")
        .arg("--api-socket")
        .arg(&plugin.api_socket)
        .output()
        .expect("nri-resize status");
    let table = String::from_utf8_lossy(&table.stdout);
    let row = table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("app"))
        .unwrap_or_else(|| panic!("app row in:\n{table}"));
    assert_eq!(
        row.split_whitespace().nth(4),
        Some("500m/175Mi"),
        "ACTUAL is the effective limit:\n{table}"
    );
    assert!(
        row.contains("memory capped by the pod cgroup at 175Mi"),
        "REASON says why:\n{table}"
    );
    eprintln!("{table}");
}

/// kubernetes/kubernetes#138760 (kubernetes/autoscaler#9829) on real containerd and cgroups: a
/// container's memory limit is raised to 512Mi while its pod cgroup stays at 175Mi. The
/// container's own cgroup holds 512Mi, so the resize looks done (desired matches actual), yet
/// the kernel OOM-kills it at 175Mi. nri-resize reports it as capped: `/v1/status` carries the
/// effective 175Mi with the reason, `nri-resize status` shows 175Mi as ACTUAL, the gauge
/// `nri_resize_capped_containers{resource="memory"}` counts it, one log line says so; once the
/// pod cgroup is raised (as kubelet should have), the cap clears and the gauge is back to 0.
///
/// The plugin runs in Observe mode: in Enforce mode it raises the pod cgroup itself before a
/// container grows past it (KEP ordering, `raise_pod_first` in `resize/update.rs`), so the bug
/// cannot arise through it. Observe leaves the runtime to write as asked and the pod cgroup to
/// kubelet, which is the situation of the bug (kubelet's pod cgroup write missing).
async fn a_container_raised_above_its_pod_cgroup_is_reported_capped(version: ContainerdVersion) {
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    let plugin =
        PluginProcess::start_ready(&ctrd, "nri-resize", Some("[resize]\nmode = \"Observe\"\n"))
            .await;
    let (pod, ids) = pod_with(
        &ctrd,
        "capped",
        &[],
        Resources::limits(100_000, 175 * MIB),
        &[("app", Resources::limits(50_000, 128 * MIB))],
    )
    .await;
    let id = &ids[0];
    // 128Mi under a 175Mi pod: its own limit is in effect.
    caps_of(&plugin, id, "not capped at start", |c| !c.any()).await;
    assert_eq!(capped_memory(&plugin).await, 0);

    // The raise kubelet sends, with the pod cgroup left where it was.
    ctrd.update_container_resources(id, &Resources::limits(50_000, 512 * MIB))
        .await
        .expect("observe mode lets the update through");
    assert_eq!(ctrd.container_memory_limit(id), 512 * MIB);
    let pod_limits = ctrd.pod_cgroup_limits(&pod).expect("pod cgroup");
    assert_eq!(
        pod_limits.memory_limit,
        Some(175 << 20),
        "nothing raised the pod cgroup"
    );

    let o = caps_of(&plugin, id, "capped after the raise", |c| {
        c.memory.is_some()
    })
    .await;
    assert_eq!(
        o.matches,
        Some(true),
        "the container's own cgroup holds what was asked: {o:?}"
    );
    let cap = o.caps.and_then(|c| c.memory).expect("memory cap");
    assert_eq!(cap.effective, 175 << 20, "{cap:?}");
    assert_eq!(cap.own, Some(512 << 20), "{cap:?}");
    assert!(cap.pod_cgroup, "{cap:?}");
    assert_eq!(cap.reason, "capped by the pod cgroup at 175Mi");
    assert_eq!(capped_memory(&plugin).await, 1);
    status_table_shows_the_cap(&plugin);
    // Let the observer re-read the path while it stays capped (every 10 s): still one line.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let capped_lines = |log: &str| {
        log.lines()
            .filter(|l| l.contains("container limit capped by an ancestor cgroup"))
            .count()
    };
    assert_eq!(
        capped_lines(&plugin.log_tail(2000)),
        1,
        "one line per change"
    );
    assert_eq!(capped_memory(&plugin).await, 1);

    // kubelet's missing write: the pod cgroup raised. The observer's re-read clears the cap.
    ctrd.set_pod_cgroup_limits(
        &pod,
        &nri_resize_tests::CgroupLimits {
            memory_limit: Some(1 << 30),
            ..pod_limits
        },
    )
    .expect("raise the pod cgroup");
    caps_of(
        &plugin,
        id,
        "cleared after the pod cgroup was raised",
        |c| !c.any(),
    )
    .await;
    assert_eq!(capped_memory(&plugin).await, 0);
    let log = plugin.log_tail(2000);
    assert_eq!(capped_lines(&log), 1, "{log}");
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("container limit no longer capped by an ancestor cgroup"))
            .count(),
        1,
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_container_raised_above_its_pod_cgroup_is_reported_capped_containerd_1_7() {
    Box::pin(a_container_raised_above_its_pod_cgroup_is_reported_capped(
        ContainerdVersion::V1_7,
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_container_raised_above_its_pod_cgroup_is_reported_capped_containerd_2() {
    Box::pin(a_container_raised_above_its_pod_cgroup_is_reported_capped(
        ContainerdVersion::V2,
    ))
    .await;
}
