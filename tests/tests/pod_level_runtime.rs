//! Pod-level resources (KEP-5419) resized in place against real containerd, driven the way
//! kubelet 1.36 drives them (`Containerd::kubelet_resize_pod`): the pod's usage checked before a
//! memory decrease, CRI `UpdatePodSandboxResources` (a client generated from cri-api 0.36's
//! `api.proto`) **before** each pod cgroup write (memory, then the CPU request and limit: up to
//! three calls, the first ones carrying intermediate states), and the call again with the
//! previous resources when a write fails. It checks what nri-resize made of the NRI
//! `UpdatePodSandbox` that follows: the model's desired resources, the pod cgroup read back
//! after the answer (desired vs actual), refusals with their reason (enforce) that leave the
//! pod cgroup as it was, the revert, and a decrease below usage that kubelet never sends.
//!
//! containerd 1.7 and 2.1 answer `Unimplemented` (kubelet goes on and writes the pod cgroup),
//! 2.2 "not implemented yet" (kubelet stops): the test says so loudly and checks that nothing
//! reached the plugin; the same order and the revert run over the NRI wire in
//! `plugin/src/daemon/pod_level_tests.rs`. `NRI_RESIZE_CONTAINERD_BIN=<dir>` runs the
//! 2.x half against another build (e.g. 2.3.4, which relays the call to NRI).
//!
//! The runtime is containerd (1.7.24 and 2.x); with `NRI_RESIZE_CRIO_BIN=<dir>` the harness
//! runs a CRI-O build in its place (by hand: no CRI-O package reaches these machines).

use std::time::{Duration, Instant};

use nri_resize::api::{ApiClient, PodStatus};
use nri_resize::model::PodLimits;
use nri_resize::policy::ResizeState;
use nri_resize::state::limits_text;
use nri_resize_tests::{
    CgroupLimits, ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion,
    KubeletPodResize, PluginProcess, Pod, PodSpec, Resources,
};

const MIB: i64 = 1 << 20;
/// Holds 300 MiB of anonymous memory (the pod's usage the Deferred case needs).
const ANON_300: &str = "dd if=/dev/zero bs=300M count=1 2>/dev/null | sleep 3600";

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

/// The pod overhead of the pods here (a `RuntimeClass`'s: 100m, 16Mi), added to the pod cgroup.
fn overhead() -> Resources {
    Resources::limits(10_000, 16 * MIB)
}

/// A pod (2 CPUs, 1 GiB, and the [`overhead`]) whose container `app` has a CPU limit (1 CPU) and no memory limit and
/// holds 300 MiB, as pods with pod-level resources may.
async fn loaded_pod(ctrd: &Containerd, name: &str) -> Pod {
    let mut spec = PodSpec::new(name);
    spec.resources = Resources::limits(200_000, 1024 * MIB);
    spec.overhead = overhead();
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

#[expect(
    clippy::too_many_lines,
    reason = "one pod's resizes read top to bottom: grow, refuse, revert, below usage"
)]
async fn pod_level_resize(version: ContainerdVersion) {
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", None).await;
    let api = plugin.api();
    let pod = loaded_pod(&ctrd, "pod-level").await;
    let before = pod_status(&api, "pod-level").await;
    assert_eq!(model_limits(&before), "2000m/1Gi", "the pod as created");
    let created = Resources::limits(200_000, 1024 * MIB);
    let overhead = overhead();
    let write = |c: &Containerd, p: &Pod, l: &CgroupLimits| c.set_pod_cgroup_limits(p, l);

    // kubelet 1.36: the runtime first, then the pod cgroup (pod limits plus the 100m / 16Mi
    // overhead).
    let grown = Resources::limits(150_000, 768 * MIB);
    let sync = ctrd
        .kubelet_resize_pod(&pod, &created, &grown, &overhead, write)
        .await;
    eprintln!(
        "{} {}: kubelet 1.36 resize to 1500m/768Mi: {sync:#?}",
        ctrd.runtime_name(),
        ctrd.version()
    );
    let relayed = match sync.outcome {
        KubeletPodResize::Applied {
            unimplemented: false,
        } => true,
        KubeletPodResize::Applied {
            unimplemented: true,
        } => false,
        // containerd 2.2 answers "not implemented yet" (not `Unimplemented`): kubelet 1.36
        // stops there, the pod cgroup is not written.
        KubeletPodResize::Refused(status) if status.message().contains("not implemented") => false,
        other => panic!("kubelet 1.36 resize to 1500m/768Mi: {other:?}"),
    };
    if !relayed {
        eprintln!(
            "\n!!!!!!!! {} {} has no CRI UpdatePodSandboxResources: the NRI \
             UpdatePodSandbox path is NOT exercised against this runtime (the in-process runtime \
             peer of plugin/src/daemon/pod_level_tests.rs exercises it in CI). Run with \
             NRI_RESIZE_CONTAINERD_BIN=<containerd >= 2.3 build> to exercise it. !!!!!!!!\n",
            ctrd.runtime_name(),
            ctrd.version(),
        );
        assert!(
            sync.calls.iter().all(|c| c.answer.is_err()),
            "no call reached the plugin: {:?}",
            sync.calls
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
        below_usage_is_blocked_by_kubelet(&ctrd, &api, &pod, &grown, &overhead).await;
        return;
    }

    // kubelet's calls: memory's pass, then CPU's (the request going down before the limit),
    // each with the pod's resources merged so far, all admitted; the plugin saw each.
    let sent: Vec<(i64, i64, i64)> = sync
        .calls
        .iter()
        .map(|c| {
            (
                c.resources.memory_limit >> 20,
                c.resources.cpu_shares,
                c.resources.cpu_quota,
            )
        })
        .collect();
    assert_eq!(
        sent,
        [
            (768, 2048, 200_000),
            (768, 1536, 200_000),
            (768, 1536, 150_000)
        ],
        "the calls in kubelet's order, with their intermediate states: {:?}",
        sync.calls
    );
    assert!(
        sync.calls.iter().all(|c| c.answer.is_ok() && !c.revert),
        "{:?}",
        sync.calls
    );
    let seen = api
        .events(0)
        .await
        .expect("events API")
        .iter()
        .filter(|e| e.event.as_str() == "update_pod_sandbox")
        .count();
    assert_eq!(seen, 3, "the plugin judged each of kubelet's three calls");

    // Admitted before the write, relayed, and confirmed by the read-back after the answer,
    // once kubelet wrote the pod cgroup.
    let deadline = Instant::now() + Duration::from_secs(10);
    let confirmed = loop {
        let p = pod_status(&api, "pod-level").await;
        if p.pod_level
            .as_ref()
            .is_some_and(|l| l.matches == Some(true))
        {
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
    assert_eq!(level.state, None, "{level:?}");
    assert_eq!(
        model_limits(&confirmed),
        "1500m/768Mi",
        "the model keeps the asked limits"
    );

    // Refused (enforce) before kubelet writes the CPU limit: the pod cgroup keeps 1600m/784Mi.
    let sync = ctrd
        .kubelet_resize_pod(
            &pod,
            &grown,
            &Resources::limits(50_000, 768 * MIB),
            &overhead,
            write,
        )
        .await;
    eprintln!("kubelet 1.36 resize to 500m/768Mi: {sync:#?}");
    let KubeletPodResize::Refused(err) = &sync.outcome else {
        panic!("a pod CPU limit below a container's: {sync:?}");
    };
    assert_eq!(
        sync.calls.last().map(|c| c.resources.cpu_quota),
        Some(50_000),
        "the call that carried the new CPU limit was refused: {:?}",
        sync.calls
    );
    assert!(
        err.message()
            .contains("container app CPU limit 1000m exceeds the requested pod limit 500m"),
        "{err:?}"
    );
    let cgroup = ctrd.pod_cgroup_limits(&pod).expect("pod cgroup");
    assert_eq!(
        (cgroup.cpu_quota, cgroup.memory_limit),
        (Some(160_000), Some(784 << 20)),
        "the refused resize never reached the pod cgroup"
    );
    let p = pod_status(&api, "pod-level").await;
    let level = p.pod_level.clone().expect("record");
    assert_eq!(level.state, Some(ResizeState::Infeasible), "{level:?}");
    assert_eq!(model_limits(&p), "1500m/768Mi");

    // The pod cgroup write fails after the plugin admitted the resize: kubelet reverts, and the
    // plugin's records show the pod back at 1500m/768Mi.
    let sync = ctrd
        .kubelet_resize_pod(
            &pod,
            &grown,
            &Resources::limits(180_000, 900 * MIB),
            &overhead,
            |_, _, _| {
                Err(std::io::Error::other(
                    "injected: the pod cgroup write failed",
                ))
            },
        )
        .await;
    eprintln!("kubelet 1.36 resize to 1800m/900Mi, the write failing: {sync:#?}");
    let KubeletPodResize::Reverted { revert, .. } = &sync.outcome else {
        panic!("a failed pod cgroup write: {sync:?}");
    };
    revert.as_ref().expect("the revert call is admitted");
    let sent: Vec<(i64, i64, bool)> = sync
        .calls
        .iter()
        .map(|c| {
            (
                c.resources.memory_limit >> 20,
                c.resources.cpu_quota,
                c.revert,
            )
        })
        .collect();
    assert_eq!(
        sent,
        [(900, 150_000, false), (768, 150_000, true)],
        "memory's call, its failed write, the revert; CPU's pass never ran: {:?}",
        sync.calls
    );
    let p = pod_status(&api, "pod-level").await;
    assert_eq!(
        model_limits(&p),
        "1500m/768Mi",
        "back at the previous resources"
    );
    let level = p.pod_level.clone().expect("record");
    assert_eq!(limits_text(&level.desired), "1600m/784Mi", "{level:?}");

    below_usage_is_blocked_by_kubelet(&ctrd, &api, &pod, &grown, &overhead).await;
}

/// A pod memory limit (plus overhead) below what the pod uses (300 MiB): kubelet ≥ 1.34 does not
/// call the runtime; the plugin's records do not change.
async fn below_usage_is_blocked_by_kubelet(
    ctrd: &Containerd,
    api: &ApiClient,
    pod: &Pod,
    from: &Resources,
    overhead: &Resources,
) {
    let before = pod_status(api, "pod-level").await;
    let sync = ctrd
        .kubelet_resize_pod(
            pod,
            from,
            &Resources::limits(150_000, 100 * MIB),
            overhead,
            |c: &Containerd, p: &Pod, l: &CgroupLimits| c.set_pod_cgroup_limits(p, l),
        )
        .await;
    let KubeletPodResize::BelowUsage { usage, limit } = sync.outcome else {
        panic!("a pod memory limit below usage: {sync:?}");
    };
    assert!(sync.calls.is_empty(), "no call: {:?}", sync.calls);
    assert_eq!(limit, 116 << 20);
    assert!(usage >= 300 << 20, "usage {usage}");
    let after = pod_status(api, "pod-level").await;
    assert_eq!(
        model_limits(&after),
        model_limits(&before),
        "the plugin saw nothing"
    );
    assert_eq!(
        after.pod_level.map(|l| l.desired),
        before.pod_level.map(|l| l.desired)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_level_resize_containerd_1_7() {
    pod_level_resize(ContainerdVersion::V1_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pod_level_resize_containerd_2() {
    pod_level_resize(ContainerdVersion::V2).await;
}
