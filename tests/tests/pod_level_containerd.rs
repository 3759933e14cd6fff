//! Pod-level resources (KEP-5419) resized in place against real containerd: the test plays
//! kubelet — it writes the pod cgroup, then calls CRI `UpdatePodSandboxResources` (through a
//! client generated from cri-api 0.36's `api.proto`) — and checks what nri-resize made of the
//! NRI `UpdatePodSandbox` / `PostUpdatePodSandbox` that follow: the model's desired resources,
//! the pod cgroup read back (desired vs actual), and refusals with their reason (enforce).
//!
//! containerd 1.7 and 2.1 answer `Unimplemented`, 2.2 "not implemented yet": the test says so
//! loudly and checks that nothing reached the plugin. `NRI_RESIZE_CONTAINERD_BIN=<dir>` runs the
//! 2.x half against another build (e.g. 2.3.4, which relays the call to NRI).

use std::time::{Duration, Instant};

use nri_resize::api::{ApiClient, PodStatus};
use nri_resize::model::PodLimits;
use nri_resize::policy::ResizeState;
use nri_resize::state::limits_text;
use nri_resize_tests::cri_pod::{
    connect_cri_v036, LinuxContainerResources, UpdatePodSandboxResourcesRequest,
};
use nri_resize_tests::{
    CgroupLimits, ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion, PluginProcess,
    Pod, PodSpec, Resources,
};

const MIB: i64 = 1 << 20;
/// Holds 300 MiB of anonymous memory (the pod's usage the Deferred case needs).
const ANON_300: &str = "dd if=/dev/zero bs=300M count=1 2>/dev/null | sleep 3600";

fn cri(cpu_quota: i64, memory: i64) -> LinuxContainerResources {
    LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota,
        cpu_shares: cpu_quota * 1024 / 100_000,
        memory_limit_in_bytes: memory,
        ..Default::default()
    }
}

async fn update(
    ctrd: &Containerd,
    pod: &Pod,
    resources: LinuxContainerResources,
) -> Result<(), tonic::Status> {
    let mut client = connect_cri_v036(ctrd.cri_socket())
        .await
        .expect("connect to CRI");
    client
        .update_pod_sandbox_resources(UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: pod.id.clone(),
            overhead: Some(cri(10_000, 16 * MIB)),
            resources: Some(resources),
        })
        .await
        .map(|_| ())
}

async fn pod_status(api: &ApiClient, name: &str) -> PodStatus {
    api.status()
        .await
        .expect("status API")
        .pods
        .into_iter()
        .find(|p| p.pod.name == name)
        .unwrap_or_else(|| panic!("pod {name} not in the plugin's status"))
}

fn model_limits(p: &PodStatus) -> String {
    p.pod
        .resources
        .as_ref()
        .map_or_else(|| "-".into(), |r| limits_text(&PodLimits::from_linux(r)))
}

/// A pod (2 CPUs, 1 GiB) whose container `app` has a CPU limit (1 CPU) and no memory limit and
/// holds 300 MiB, as pods with pod-level resources may.
async fn loaded_pod(ctrd: &Containerd, name: &str) -> Pod {
    let mut spec = PodSpec::new(name);
    spec.resources = Resources::limits(200_000, 1024 * MIB);
    let pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
    let mut c = ContainerSpec::new("app", &["sh", "-c", ANON_300]);
    c.resources = Resources::limits(100_000, 0);
    let id = Box::pin(ctrd.create_container(&pod, c))
        .await
        .expect("CreateContainer");
    ctrd.start_container(&id).await.expect("StartContainer");
    let deadline = Instant::now() + Duration::from_secs(60);
    while ctrd.container_memory_usage(&id) < 300 * MIB {
        assert!(
            Instant::now() < deadline,
            "{name}: usage stayed below 300 MiB"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pod
}

async fn pod_level_resize(version: ContainerdVersion) {
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", None).await;
    let api = plugin.api();
    let pod = loaded_pod(&ctrd, "pod-level").await;
    let before = pod_status(&api, "pod-level").await;
    assert_eq!(model_limits(&before), "2000m/1Gi", "the pod as created");

    // kubelet: the pod cgroup first (pod limits plus the 100m / 16Mi overhead), then the
    // runtime with the two apart.
    let grown = CgroupLimits {
        cpu_quota: Some(160_000),
        cpu_period: 100_000,
        cpu_shares: 1536,
        memory_limit: Some(784 << 20),
    };
    ctrd.set_pod_cgroup_limits(&pod, &grown)
        .expect("write the pod cgroup as kubelet does");
    let answer = update(&ctrd, &pod, cri(150_000, 768 * MIB)).await;
    if let Err(status) = &answer {
        eprintln!(
            "\n!!!!!!!! containerd {} has no CRI UpdatePodSandboxResources ({:?}: {}): the NRI \
             UpdatePodSandbox path is NOT exercised against this runtime. Run with \
             NRI_RESIZE_CONTAINERD_BIN=<containerd >= 2.3 build> to exercise it. !!!!!!!!\n",
            ctrd.version(),
            status.code(),
            status.message()
        );
        assert!(
            status.code() == tonic::Code::Unimplemented
                || status.message().contains("not implemented"),
            "an error other than 'not implemented': {status:?}"
        );
        let after = pod_status(&api, "pod-level").await;
        assert_eq!(after.pod_level, None, "nothing reached the plugin");
        assert_eq!(model_limits(&after), "2000m/1Gi", "the model is unchanged");
        let events = api.events(0).await.expect("events API");
        assert!(
            !events
                .iter()
                .any(|e| e.event.as_str().contains("update_pod_sandbox")),
            "{events:?}"
        );
        return;
    }

    // Admitted, relayed, and confirmed against the pod cgroup after the post-update.
    let deadline = Instant::now() + Duration::from_secs(10);
    let confirmed = loop {
        let p = pod_status(&api, "pod-level").await;
        if p.pod_level.as_ref().is_some_and(|l| l.matches.is_some()) {
            break p;
        }
        assert!(Instant::now() < deadline, "no read-back recorded: {p:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let level = confirmed.pod_level.clone().expect("pod-level record");
    assert_eq!(limits_text(&level.desired), "1600m/784Mi", "{level:?}");
    assert_eq!(
        level.actual.map(|a| limits_text(&a)).as_deref(),
        Some("1600m/784Mi"),
        "{level:?}"
    );
    assert_eq!(
        (level.matches, level.state),
        (Some(true), None),
        "{level:?}"
    );
    assert_eq!(
        model_limits(&confirmed),
        "1500m/768Mi",
        "the model keeps the asked limits"
    );
    eprintln!(
        "containerd {}: UpdatePodSandboxResources relayed; pod desired = actual = {}",
        ctrd.version(),
        limits_text(&level.desired)
    );

    // Refused (enforce), with the reason returned through the runtime; the model keeps 768Mi.
    let err = update(&ctrd, &pod, cri(50_000, 768 * MIB))
        .await
        .expect_err("a pod CPU limit below a container's");
    assert!(
        err.message()
            .contains("container app CPU limit 1000m exceeds the requested pod limit 500m"),
        "{err:?}"
    );
    let p = pod_status(&api, "pod-level").await;
    let level = p.pod_level.clone().expect("record");
    assert_eq!(level.state, Some(ResizeState::Infeasible), "{level:?}");
    assert_eq!(model_limits(&p), "1500m/768Mi");

    // A pod memory limit (plus overhead) below what the pod uses: Deferred, both quantities in
    // the reason.
    let err = update(&ctrd, &pod, cri(150_000, 100 * MIB))
        .await
        .expect_err("below usage");
    assert!(
        err.message().contains("above requested pod limit 116Mi"),
        "{err:?}"
    );
    let level = pod_status(&api, "pod-level")
        .await
        .pod_level
        .expect("record");
    assert_eq!(level.state, Some(ResizeState::Deferred), "{level:?}");
    assert!(level.reason.starts_with("usage 3"), "{level:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_level_resize_containerd_1_7() {
    pod_level_resize(ContainerdVersion::V1_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_level_resize_containerd_2() {
    pod_level_resize(ContainerdVersion::V2).await;
}
