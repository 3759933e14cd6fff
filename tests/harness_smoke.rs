//! Smoke test of the real-runtime harness itself, for both containerd versions (the two tests
//! run in parallel threads, each with its own containerd).

use std::path::Path;

use nri_resize_tests::cri::ContainerState;
use nri_resize_tests::{
    shim_pids, CgroupMode, ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion,
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

async fn smoke(version: ContainerdVersion) {
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    eprintln!(
        "harness: containerd {} ({version}), log {}",
        ctrd.version(),
        ctrd.log_path().display()
    );
    assert!(ctrd.nri_socket().exists(), "NRI socket missing");

    let mut spec = PodSpec::new(&format!("smoke-{}", version.label().replace('.', "-")));
    spec.resources = Resources::limits(200_000, 256 * MIB);
    let pod = ctrd.run_pod(spec).await.expect("RunPodSandbox");
    let limits = ctrd.pod_cgroup_limits(&pod).expect("read pod cgroup");
    assert_eq!(limits.cpu_quota, Some(200_000));
    assert_eq!(limits.memory_limit, Some(256 << 20));

    let mut c = ContainerSpec::new("sleeper", &["sleep", "3600"]);
    c.resources = Resources::limits(50_000, 64 * MIB);
    let id = ctrd
        .create_container(&pod, c)
        .await
        .expect("CreateContainer");
    ctrd.start_container(&id).await.expect("StartContainer");
    let dir = ctrd
        .container_cgroup_dir(&id, "cpu")
        .expect("container cgroup");
    eprintln!("harness: container cgroup {}", dir.display());
    assert!(dir.starts_with(
        format!(
            "/sys/fs/cgroup/{}",
            if ctrd.cgroups().mode() == CgroupMode::V1 {
                "cpu"
            } else {
                ""
            }
        )
        .trim_end_matches('/')
    ));
    assert_cgroup(&ctrd, &id, 50_000, 100_000, 64 * MIB);
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
    let mut ctrd = ctrd;
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

    ctrd.stop_container(&id, 0).await.expect("StopContainer");
    ctrd.remove_container(&id).await.expect("RemoveContainer");
    assert!(
        ctrd.container_cgroup_dir(&id, "memory").is_none(),
        "container cgroup left after RemoveContainer"
    );
    ctrd.stop_pod(&pod).await.expect("StopPodSandbox");
    ctrd.remove_pod(&pod).await.expect("RemovePodSandbox");
    assert!(
        ctrd.cgroups()
            .find_dir("memory", &format!("pod{}", pod.uid))
            .is_none(),
        "pod cgroup left"
    );

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_containerd_1_7() {
    smoke(ContainerdVersion::V1_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_containerd_2() {
    smoke(ContainerdVersion::V2).await;
}
