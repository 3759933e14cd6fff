//! `cargo xtask demo`: a private containerd (1.7 by default; `NRI_RESIZE_DEMO_CONTAINERD=2` for
//! 2.x), the nri-resize plugin attached to it, and a pod created and resized through CRI the way
//! kubelet does, with the plugin's view printed after every step.

use std::time::Duration;

use nri_resize::api::ApiClient;
use nri_resize::model::{CpuResources, LinuxResources, MemoryResources};
use nri_resize::policy::{bytes_text, cpu_quota_text, cpu_text, memory_limit_text};
use nri_resize_tests::{
    ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion, KubeletResize, KubeletVersion,
    PluginProcess, PodSpec, Resources,
};

const MIB: i64 = 1 << 20;

async fn show(api: &ApiClient, since: &mut u64, title: &str) {
    println!("\n--- {title}");
    let events = api.events(*since).await.expect("events API");
    for e in &events {
        let r = e.resources.clone().unwrap_or_default();
        let cpu = r.cpu_limit_millis().map_or("-".to_string(), cpu_text);
        let mem = r.memory_limit().map_or("-".to_string(), memory_limit_text);
        println!(
            "  plugin saw #{:<3} {:<22} {:<22} {:<8} cpu={cpu:<6} mem={mem}",
            e.seq,
            e.event.as_str(),
            e.pod,
            e.container
        );
        *since = e.seq;
    }
    let status = api.status().await.expect("status API");
    for p in &status.pods {
        for c in &p.containers {
            println!(
                "  model: {}/{} {:?}: {}",
                p.pod.full_name(),
                c.name,
                c.state,
                spec_text(c.resources.as_ref())
            );
        }
    }
}

/// `cpu 500m (quota 50000µs per 100000µs, shares 512), memory 128Mi`.
fn spec_text(r: Option<&LinuxResources>) -> String {
    let Some(r) = r else {
        return "no resources".to_string();
    };
    let period = r.cpu_period().unwrap_or(100_000);
    let quota = r.cpu_quota().unwrap_or(-1);
    let shares = r
        .cpu_shares()
        .map_or_else(String::new, |s| format!(", shares {s}"));
    format!(
        "cpu {} (quota {}{shares}), memory {}",
        cpu_quota_text(quota, period),
        if quota > 0 {
            format!("{quota}µs per {period}µs")
        } else {
            "none".to_string()
        },
        r.memory_limit().map_or("-".to_string(), memory_limit_text)
    )
}

/// What the container's cgroup holds, read back: `cpu 1000m, memory 256Mi`.
fn cgroup_text(ctrd: &Containerd, id: &str) -> String {
    let quota: i64 = ctrd
        .read_container_cgroup(id, "cpu.cfs_quota_us")
        .parse()
        .unwrap_or(-1);
    format!(
        "cpu {}, memory {}",
        cpu_quota_text(quota, 100_000),
        memory_limit_text(ctrd.container_memory_limit(id))
    )
}

/// What the observer measured and how: its strategies (eBPF programs, or the cgroup files it
/// polls when a program could not load, with why), then each container's throttling, reclaim
/// and OOM kills, from the status API (`GET /v1/status`).
async fn observer_narration(api: &ApiClient, containers: &[(&str, &str)]) {
    let status = api.status().await.expect("status API");
    println!("\n== what the observer counted, and how");
    match &status.observer {
        None => println!("   the observer has not started"),
        Some(o) => {
            let s = &o.strategies;
            let ebpf = |strategy: &str| {
                if strategy.starts_with("unavailable") {
                    "not measured"
                } else if strategy.ends_with("_polling") {
                    "polling cgroup files"
                } else {
                    "eBPF"
                }
            };
            println!("   every {}ms; strategies in use:", o.interval_ms);
            for (what, strategy) in [
                ("CPU throttling", &s.throttle),
                ("memory reclaim", &s.reclaim),
                ("OOM kills", &s.oom),
                ("CPU/memory hotplug", &s.hotplug),
                ("pressure (PSI)", &s.pressure),
            ] {
                let how = if what == "pressure (PSI)" && !strategy.starts_with("unavailable") {
                    "cgroup files"
                } else {
                    ebpf(strategy)
                };
                println!("     {what:<20} {strategy:<24} ({how})");
            }
            for f in &o.fallbacks {
                println!("   fell back from {}: {}", f.program, f.reason);
            }
        }
    }
    let page = 4096;
    for (pod, name) in containers {
        let found = status
            .pods
            .iter()
            .filter(|p| p.pod.full_name() == *pod)
            .flat_map(|p| &p.containers)
            .find(|c| c.name == *name);
        let Some(observed) = found.and_then(|c| c.observed.as_ref()) else {
            println!("   {pod}/{name}: not observed (yet)");
            continue;
        };
        let throttled = observed.throttling.map_or("-".to_string(), |t| {
            format!("throttled {} times ({:.2}s)", t.count, t.seconds)
        });
        let reclaimed = observed.reclaim.map_or("-".to_string(), |r| {
            let pages = r
                .pages
                .map_or("? (not counted by this strategy)".to_string(), |p| {
                    bytes_text(p.saturating_mul(page))
                });
            let direct = r.direct_reclaim_events.map_or(String::new(), |n| {
                format!(
                    ", {n} direct reclaims ({:.3}s)",
                    r.direct_reclaim_seconds.unwrap_or(0.0)
                )
            });
            format!("reclaimed {pages}{direct}")
        });
        let oom = observed
            .oom
            .map_or("-".to_string(), |o| format!("{} OOM kills", o.kills));
        let by = observed.strategies.as_ref().map_or(String::new(), |s| {
            format!(" [by {} / {} / {}]", s.throttle, s.reclaim, s.oom)
        });
        println!("   {pod}/{name}: {throttled}, {reclaimed}, {oom}{by}");
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
#[expect(
    clippy::too_many_lines,
    reason = "the demo is a narrated script, read top to bottom"
)]
async fn main() {
    let version = match std::env::var("NRI_RESIZE_DEMO_CONTAINERD").as_deref() {
        Ok("2") => ContainerdVersion::V2,
        _ => ContainerdVersion::V1_7,
    };
    println!("== starting a private {version} with NRI enabled");
    let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
    println!(
        "   containerd {} at {}",
        ctrd.version(),
        ctrd.base_dir().display()
    );
    let mut plugin = PluginProcess::start(&ctrd, "nri-resize", &[]);
    plugin.wait_ready(Duration::from_secs(15)).await;
    let api = plugin.api();
    let mut since = 0;
    show(&api, &mut since, "plugin registered and synchronized").await;

    println!("\n== creating pod default/demo (pod cgroup limited to 2 CPUs / 512Mi) with container 'app' at 500m / 128Mi");
    let mut spec = PodSpec::new("demo");
    spec.resources = Resources::limits(200_000, 512 * MIB);
    let pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
    let mut c = ContainerSpec::new("app", &["sleep", "3600"]);
    c.resources = Resources::limits(50_000, 128 * MIB);
    let id = Box::pin(ctrd.create_container(&pod, c))
        .await
        .expect("CreateContainer");
    ctrd.start_container(&id).await.expect("StartContainer");
    tokio::time::sleep(Duration::from_millis(200)).await;
    show(&api, &mut since, "after create + start").await;

    println!(
        "\n== kubelet-style resize through CRI UpdateContainerResources: 500m/128Mi -> 1000m/256Mi"
    );
    ctrd.update_container_resources(&id, &Resources::limits(100_000, 256 * MIB))
        .await
        .expect("UpdateContainerResources");
    tokio::time::sleep(Duration::from_millis(200)).await;
    show(&api, &mut since, "after the CRI update").await;
    println!("   the container's cgroup: {}", cgroup_text(&ctrd, &id));

    println!("\n== plugin-initiated resize through NRI UpdateContainers (nri-resize update): -> 1500m/384Mi");
    let want = LinuxResources {
        cpu: Some(CpuResources {
            quota: Some(150_000),
            period: Some(100_000),
            ..Default::default()
        }),
        memory: Some(MemoryResources {
            limit: Some(384 * MIB),
            ..Default::default()
        }),
        ..Default::default()
    };
    let result = api
        .update_resources(&id, &want)
        .await
        .expect("update through the plugin");
    assert!(result.failed.is_empty(), "runtime failed the update");
    show(&api, &mut since, "after the plugin's update").await;
    let reported = ctrd
        .container_resources(&id)
        .await
        .expect("ContainerStatus")
        .unwrap_or_default();
    println!("   the container's cgroup: {}", cgroup_text(&ctrd, &id));
    println!(
        "   CRI ContainerStatus (what kubelet reads): cpu {}, memory {}",
        cpu_quota_text(reported.cpu_quota, 100_000),
        memory_limit_text(reported.memory_limit_in_bytes)
    );

    println!("\n== whole-pod resize through the planner (nri-resize resize default/demo app=cpu=800m,memory=256Mi):");
    let out = std::process::Command::new(nri_resize_tests::plugin_binary())
        .args(["resize", "--api-socket"])
        .arg(&plugin.api_socket)
        .args(["default/demo", "app=cpu=800m,memory=256Mi"])
        .output()
        .expect("run nri-resize resize");
    // Its warning (stderr) first, as a person at a terminal reads it.
    print!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.status.success(), "nri-resize resize failed");
    let limits = ctrd.pod_cgroup_limits(&pod).expect("pod cgroup");
    println!(
        "   the container's cgroup: {}; the pod's cgroup: cpu {}, memory {}",
        cgroup_text(&ctrd, &id),
        cpu_quota_text(limits.cpu_quota.unwrap_or(-1), limits.cpu_period),
        limits
            .memory_limit
            .map_or("unlimited".to_string(), |m| memory_limit_text(
                i64::try_from(m).unwrap_or(-1)
            ))
    );
    tokio::time::sleep(Duration::from_millis(1200)).await; // one observer interval

    println!("\n== safe memory decrease: pod default/demo-mem, container 'worker' at 512Mi holding 400 MiB of page cache + 50 MiB anonymous");
    let mut spec = PodSpec::new("demo-mem");
    spec.resources = Resources::limits(100_000, 1024 * MIB);
    let mem_pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
    let mut c = ContainerSpec::new(
        "worker",
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=/tmp/cache bs=1M count=400 2>/dev/null; sync; dd if=/dev/zero bs=50M count=1 2>/dev/null | sleep 3600",
        ],
    );
    c.resources = Resources::limits(50_000, 512 * MIB);
    let worker = Box::pin(ctrd.create_container(&mem_pod, c))
        .await
        .expect("CreateContainer");
    ctrd.start_container(&worker).await.expect("StartContainer");
    let usage = |ctrd: &Containerd| ctrd.container_memory_usage(&worker);
    let usage_text = |ctrd: &Containerd| bytes_text(u64::try_from(usage(ctrd)).unwrap_or(0));
    for _ in 0..300 {
        if usage(&ctrd) >= 440 * MIB {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "   usage {}; CRI update 512Mi -> 128Mi (without the plugin, v1 reclaims inside runc's write, v2 too; below anonymous usage v1 fails the update and v2 OOM-kills)",
        usage_text(&ctrd)
    );
    // As kubelet 1.33 drives it (no usage check of its own), retrying a refused sync.
    let syncs = ctrd
        .kubelet_resize_retrying(
            KubeletVersion::V1_33,
            &mem_pod,
            &worker,
            &Resources::limits(50_000, 128 * MIB),
            Duration::from_secs(2),
            15,
        )
        .await;
    for s in &syncs[..syncs.len() - 1] {
        if let KubeletResize::Refused(e) = &s.container {
            println!("   refused, kubelet retries: {}", e.message());
        }
    }
    assert!(
        syncs.last().is_some_and(|s| s.container.applied()),
        "the page-cache decrease was never applied: {syncs:?}"
    );
    println!(
        "   applied at kubelet's try {}: the cgroup holds {}, usage {}",
        syncs.len(),
        memory_limit_text(ctrd.container_memory_limit(&worker)),
        usage_text(&ctrd)
    );
    println!("   CRI update 128Mi -> 40Mi: below the 50Mi the container holds anonymously");
    let err = ctrd
        .update_container_resources(&worker, &Resources::limits(50_000, 40 * MIB))
        .await
        .expect_err("refused: anonymous memory above the limit");
    let rec = api
        .resizes()
        .await
        .expect("resizes")
        .containers
        .get(&worker)
        .cloned()
        .unwrap_or_default();
    println!(
        "   refused, not OOM-killed: the cgroup keeps {} (usage {}); state {}",
        memory_limit_text(ctrd.container_memory_limit(&worker)),
        usage_text(&ctrd),
        rec.state
            .map_or("-", nri_resize::policy::ResizeState::as_str),
    );
    println!(
        "   kubelet's PodResizeInProgress condition (reason Error) says, and it retries after its backoff:"
    );
    println!("     {}", err.message());
    show(&api, &mut since, "after the memory decrease").await;
    observer_narration(
        &api,
        &[("default/demo", "app"), ("default/demo-mem", "worker")],
    )
    .await;

    println!("\n== `nri-resize status` as an operator sees it:");
    let out = std::process::Command::new(nri_resize_tests::plugin_binary())
        .args(["status", "--api-socket"])
        .arg(&plugin.api_socket)
        .output()
        .expect("run nri-resize status");
    let table = String::from_utf8_lossy(&out.stdout);
    print!("{table}");
    assert!(
        out.status.success() && table.contains("demo"),
        "`nri-resize status` did not show the demo's pods ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );

    println!("\n== tearing down");
    ctrd.stop_container(&id, 0).await.expect("StopContainer");
    ctrd.remove_container(&id).await.expect("RemoveContainer");
    ctrd.stop_pod(&pod).await.expect("StopPodSandbox");
    ctrd.remove_pod(&pod).await.expect("RemovePodSandbox");
    ctrd.stop_pod(&mem_pod).await.expect("StopPodSandbox");
    ctrd.remove_pod(&mem_pod).await.expect("RemovePodSandbox");
    tokio::time::sleep(Duration::from_millis(200)).await;
    show(&api, &mut since, "after teardown").await;
    plugin.stop();
    println!("\n== demo done: containerd, plugin, pod cgroups and temp dirs are cleaned up");
}
