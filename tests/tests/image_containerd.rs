//! The daemon from its OCI image (`cargo xtask image`), run in a private containerd the way the
//! `DaemonSet` runs it on a node: imported with `ctr -n k8s.io images import`, started privileged
//! in the host's PID and network namespaces with the NRI socket and cgroupfs mounted. A real pod
//! created through CRI must show up in `/metrics` (classic and `OpenMetrics`) and in
//! `nri-resize status` read through the API socket inside the container.

use std::time::{Duration, Instant};

use nri_resize_tests::{
    daemon_image_archive, http_get, ContainerSpec, Containerd, ContainerdOptions,
    ContainerdVersion, DaemonContainer, PodSpec, Privilege, Resources, LEAST_PRIVILEGE_CAPS,
};

/// A kubelet-style resize through CRI: counted by resource and direction, timed, confirmed.
async fn resize_is_counted_and_confirmed(ctrd: &Containerd, daemon: &DaemonContainer, id: &str) {
    ctrd.update_container_resources(id, &Resources::limits(80_000, 64 << 20))
        .await
        .expect("resize the container's CPU through CRI");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, _, body) = http_get(&daemon.metrics_addr, "/metrics", None).expect("scrape");
        let want = [
            r#"nri_resize_resize_requests_total{direction="increase",outcome="in_place",resource="cpu"} 1"#,
            r#"nri_resize_resize_duration_seconds_count{direction="increase",resource="cpu"} 1"#,
            r#"nri_resize_resize_outcomes_total{outcome="in_place"} 1"#,
            r#"nri_resize_container_actual_cpu_millicores{container="app",namespace="default",pod="imaged"} 800"#,
        ];
        if want.iter().all(|w| body.contains(w)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after a CPU increase, want {want:?} in\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn daemon_from_image_sees_a_real_pod(version: ContainerdVersion, privilege: Privilege) {
    let archive = daemon_image_archive();
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    let daemon = DaemonContainer::start(&ctrd, &archive, &privilege);
    daemon.wait_ready(Duration::from_secs(60));

    let mut spec = PodSpec::new("imaged");
    spec.resources = Resources::limits(100_000, 256 << 20);
    let pod = ctrd.run_pod(spec).await.expect("run pod");
    let mut c = ContainerSpec::new("app", &["sleep", "3600"]);
    c.resources = Resources::limits(50_000, 64 << 20);
    let id = ctrd
        .create_container(&pod, c)
        .await
        .expect("create container");
    ctrd.start_container(&id).await.expect("start container");

    // Desired vs actual is read back once the container started; the observer's counters come on
    // its interval (1 s): wait for both.
    let want = r#"nri_resize_container_actual_cpu_millicores{container="app",namespace="default",pod="imaged"} 500"#;
    let counters = r#"nri_resize_container_throttled_periods_total{container="app",namespace="default",pod="imaged"}"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (code, headers, body) =
            http_get(&daemon.metrics_addr, "/metrics", None).expect("scrape /metrics");
        assert_eq!(code, 200, "{body}");
        assert!(headers.contains("text/plain; version=0.0.4"), "{headers}");
        if body.contains(want) && body.contains(counters) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no series for the pod's container after 30 s; want {want}\n/metrics:\n{body}\nlog:\n{}",
            daemon.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    for series in [
        "nri_resize_nri_connected 1",
        r#"nri_resize_container_desired_memory_bytes{container="app",namespace="default",pod="imaged"} 67108864"#,
        r#"nri_resize_container_allocated_memory_bytes{container="app",namespace="default",pod="imaged"} 67108864"#,
        r#"nri_resize_container_throttled_periods_total{container="app",namespace="default",pod="imaged"}"#,
        // The eBPF programs load with either privilege: no measurement fell back to polling
        // (reclaim: see below).
        r#"nri_resize_observer_strategy{program="throttle",strategy="cpu_stat_polling"} 0"#,
        r#"nri_resize_observer_strategy{program="oom",strategy="memory_events_polling"} 0"#,
    ] {
        assert!(body.contains(series), "missing {series} in\n{body}");
    }
    // Reclaim is counted by eBPF only where the kernel has the `memcg/count_memcg_events`
    // tracepoint (6.18 here); Debian's 6.1 and 6.12 (VM tier) lack it, so there the observer
    // polls `memory.stat`, with either privilege.
    let reclaim =
        if std::path::Path::new("/sys/kernel/tracing/events/memcg/count_memcg_events").exists() {
            r#"nri_resize_observer_strategy{program="reclaim",strategy="memory_stat_polling"} 0"#
        } else {
            r#"nri_resize_observer_strategy{program="reclaim",strategy="memory_stat_polling"} 1"#
        };
    assert!(body.contains(reclaim), "missing {reclaim} in\n{body}");
    let (code, headers, om) = http_get(
        &daemon.metrics_addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    )
    .expect("scrape /metrics as OpenMetrics");
    assert_eq!(code, 200);
    assert!(
        headers.contains("application/openmetrics-text"),
        "{headers}"
    );
    assert!(
        om.ends_with("# EOF\n") && om.contains(r#"pod="imaged""#),
        "{om}"
    );

    // `kubectl exec ds/nri-resize -- nri-resize status`, here through ctr.
    let (code, out, err) = daemon.exec(&["/usr/bin/nri-resize", "status"]);
    assert_eq!(code, 0, "nri-resize status in the container: {out}{err}");
    assert!(out.contains("(connected)"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("default/imaged") && l.contains(" app "))
        .unwrap_or_else(|| panic!("no row for default/imaged app in\n{out}"));
    assert!(
        row.contains("500m/64Mi"),
        "desired/allocated/actual shown: {row}"
    );
    let (code, json, err) = daemon.exec(&["/usr/bin/nri-resize", "status", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("status --json");
    assert_eq!(v["runtime"]["connected"], true, "{json}");
    // And from the host, through the mounted socket directory.
    let status = nri_resize::api::ApiClient::new(daemon.api_dir.join("api.sock"))
        .status()
        .await
        .expect("status through the host-mounted API socket");
    assert!(
        status
            .pods
            .iter()
            .any(|p| p.pod.name == "imaged" && p.containers.iter().any(|c| c.name == "app")),
        "{status:?}"
    );
    eprintln!("{out}");

    resize_is_counted_and_confirmed(&ctrd, &daemon, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_image_in_containerd_1_7() {
    daemon_from_image_sees_a_real_pod(ContainerdVersion::V1_7, Privilege::Privileged).await;
}

/// The least-privilege overlay's capabilities (`deploy/overlays/least-privilege`) suffice:
/// NRI, cgroupfs, every eBPF program, the API socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_image_with_least_privilege_in_containerd_1_7() {
    let caps = LEAST_PRIVILEGE_CAPS
        .iter()
        .map(ToString::to_string)
        .collect();
    daemon_from_image_sees_a_real_pod(ContainerdVersion::V1_7, Privilege::Capabilities(caps)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_image_in_containerd_2() {
    daemon_from_image_sees_a_real_pod(ContainerdVersion::V2, Privilege::Privileged).await;
}
