//! Smoke test of the real-runtime harness itself, for both containerd versions. The tests run
//! in parallel threads of one process, each with its own containerd, dirs and cgroup tree.

use std::path::Path;

use nri_resize_tests::cri::ContainerState;
use nri_resize_tests::{
    shim_pids, CgroupMode, ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion, Pod,
    PodSpec, Resources,
};

const MIB: i64 = 1 << 20;

fn assert_cgroup(ctrd: &Containerd, id: &str, quota: i64, period: i64, memory: i64) {
    match ctrd.cgroups().mode() {
        CgroupMode::V1 => {
            assert_eq!(
                ctrd.read_container_cgroup(id, "cpu.cfs_quota_us"),
                quota.to_string()
            );
            assert_eq!(
                ctrd.read_container_cgroup(id, "cpu.cfs_period_us"),
                period.to_string()
            );
            assert_eq!(
                ctrd.read_container_cgroup(id, "memory.limit_in_bytes"),
                memory.to_string()
            );
        }
        CgroupMode::V2 => {
            assert_eq!(
                ctrd.read_container_cgroup(id, "cpu.max"),
                format!("{quota} {period}")
            );
            assert_eq!(
                ctrd.read_container_cgroup(id, "memory.max"),
                memory.to_string()
            );
        }
    }
}

/// Runs a pod whose cgroup is limited to 2 CPUs / 256 MiB and checks the pod cgroup.
async fn run_limited_pod(ctrd: &Containerd, version: ContainerdVersion) -> Pod {
    let mut spec = PodSpec::new(&format!("smoke-{}", version.label().replace('.', "-")));
    spec.resources = Resources::limits(200_000, 256 * MIB);
    let pod = ctrd.run_pod(spec).await.expect("RunPodSandbox");
    let limits = ctrd.pod_cgroup_limits(&pod).expect("read pod cgroup");
    assert_eq!(limits.cpu_quota, Some(200_000));
    assert_eq!(limits.cpu_period, 100_000);
    assert_eq!(limits.memory_limit, Some(256 << 20));
    pod
}

/// Creates and starts `sleep 3600` limited to 0.5 CPU / 64 MiB, checks its cgroup and exec.
async fn start_sleeper(ctrd: &Containerd, pod: &Pod) -> String {
    let mut c = ContainerSpec::new("sleeper", &["sleep", "3600"]);
    c.resources = Resources::limits(50_000, 64 * MIB);
    let id = ctrd
        .create_container(pod, c)
        .await
        .expect("CreateContainer");
    ctrd.start_container(&id).await.expect("StartContainer");
    let dir = ctrd
        .container_cgroup_dir(&id, "cpu")
        .expect("container cgroup");
    eprintln!("harness: container cgroup {}", dir.display());
    // containerd's cgroupfs driver names the container's cgroup by its id, CRI-O's `crio-<id>`.
    let leaf = if ctrd.is_crio() {
        format!("crio-{id}")
    } else {
        id.clone()
    };
    assert!(
        dir.ends_with(format!("pod{}/{leaf}", pod.uid)),
        "unexpected cgroup dir {}",
        dir.display()
    );
    assert_cgroup(ctrd, &id, 50_000, 100_000, 64 * MIB);
    let out = ctrd
        .exec_sync(
            &id,
            &["sh", "-c", "echo hello from $(cat /proc/self/comm)"],
            10,
        )
        .await
        .expect("ExecSync");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "hello from cat",
        "exec: {out:?}"
    );
    id
}

/// Stops and removes container and pod; checks the container and pod cgroups are gone.
async fn tear_down(ctrd: &Containerd, pod: &Pod, id: &str) {
    ctrd.stop_container(id, 0).await.expect("StopContainer");
    ctrd.remove_container(id).await.expect("RemoveContainer");
    assert!(
        ctrd.container_cgroup_dir(id, "memory").is_none(),
        "container cgroup left after RemoveContainer"
    );
    ctrd.stop_pod(pod).await.expect("StopPodSandbox");
    ctrd.remove_pod(pod).await.expect("RemovePodSandbox");
    assert!(
        ctrd.cgroups()
            .find_dir("memory", &format!("pod{}", pod.uid))
            .is_none(),
        "pod cgroup left"
    );
}

async fn smoke(version: ContainerdVersion) {
    let mut ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    eprintln!(
        "harness: {} {} ({version}), log {}",
        ctrd.runtime_name(),
        ctrd.version(),
        ctrd.log_path().display()
    );
    assert!(ctrd.nri_socket().exists(), "NRI socket missing");

    let pod = run_limited_pod(&ctrd, version).await;
    let id = start_sleeper(&ctrd, &pod).await;

    let new = Resources::limits(100_000, 128 * MIB);
    ctrd.update_container_resources(&id, &new)
        .await
        .expect("UpdateContainerResources");
    assert_cgroup(&ctrd, &id, 100_000, 100_000, 128 * MIB);
    let reported = ctrd
        .container_resources(&id)
        .await
        .expect("ContainerStatus")
        .expect("resources in status");
    assert_eq!(
        Resources::from_cri(&reported),
        new,
        "ContainerStatus resources: {reported:?}"
    );

    // containerd restart: shims and containers survive, CRI answers again.
    let old_pid = ctrd.pid();
    ctrd.restart().await;
    assert_ne!(ctrd.pid(), old_pid);
    let st = ctrd
        .container_status(&id)
        .await
        .expect("ContainerStatus after restart");
    assert_eq!(
        st.state,
        ContainerState::ContainerRunning as i32,
        "after restart: {st:?}"
    );

    tear_down(&ctrd, &pod, &id).await;

    let tree = ctrd.cgroups().clone();
    let base = ctrd.base_dir().to_path_buf();
    let sock = ctrd.cri_socket().to_path_buf();
    let pid = ctrd.pid().expect("containerd running");
    drop(ctrd);
    assert!(!tree.exists(), "cgroup tree {} left", tree.path());
    assert!(!base.exists(), "{} left", base.display());
    assert!(
        shim_pids(&sock).is_empty(),
        "shims left: {:?}",
        shim_pids(&sock)
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "containerd {pid} left"
    );
    eprintln!("harness: {version} smoke test passed, nothing left behind");
}

/// A test that panics with a running pod and container must still leave nothing behind.
async fn cleanup_after_panic(version: ContainerdVersion) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let opts = ContainerdOptions {
            keep_log_on_panic: false,
            ..ContainerdOptions::default()
        };
        let ctrd = Containerd::start(version, opts).await;
        let pod = run_limited_pod(&ctrd, version).await;
        let id = start_sleeper(&ctrd, &pod).await;
        let sleeper = ctrd.read_container_cgroup(&id, "cgroup.procs");
        let _ = tx.send((
            ctrd.cgroups().clone(),
            ctrd.base_dir().to_path_buf(),
            ctrd.cri_socket().to_path_buf(),
            sleeper,
        ));
        panic!("deliberate panic with a running pod (expected in this test)");
    });
    let err = task.await.expect_err("task must panic");
    assert!(err.is_panic());
    let (tree, base, sock, sleeper) = rx.await.expect("state before panic");
    assert!(!tree.exists(), "cgroup tree {} left", tree.path());
    assert!(!base.exists(), "{} left", base.display());
    assert!(
        shim_pids(&sock).is_empty(),
        "shims left: {:?}",
        shim_pids(&sock)
    );
    for pid in sleeper.lines() {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "container process {pid} left"
        );
    }
    eprintln!("harness: {version} cleanup after panic left nothing behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_containerd_1_7() {
    Box::pin(smoke(ContainerdVersion::V1_7)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_containerd_2() {
    Box::pin(smoke(ContainerdVersion::V2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_after_panic_containerd_2() {
    Box::pin(cleanup_after_panic(ContainerdVersion::V2)).await;
}
