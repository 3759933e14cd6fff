//! A whole-pod three-container resize through the nri-resize API (planner + executor, pod cgroup
//! through cgroupfs, containers through NRI `UpdateContainers`), end to end, side by side with
//! the baseline of kubelet doing the same writes itself (pod cgroup, then three CRI
//! `UpdateContainerResources`) in one run. The baseline runs with no plugin connected: the bench
//! stops the plugin before each baseline block and starts it again (waiting until it is
//! registered and synchronized) before each block of ours. Target: < 50 ms.
//!
//! Run: `cargo bench -p nri-resize-tests --bench resize_api` (part of `cargo xtask bench`).

use std::time::{Duration, Instant};

use nri_resize::resize::{ContainerTarget, PodResizeRequest};
use nri_resize_tests::{
    percentile, CgroupLimits, ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion,
    PluginProcess, PodSpec, Resources,
};

const MIB: i64 = 1 << 20;

fn request(millis: u64, mem: i64) -> PodResizeRequest {
    PodResizeRequest {
        containers: ["a", "b", "c"]
            .iter()
            .map(|n| {
                (
                    (*n).to_string(),
                    ContainerTarget {
                        cpu_millis: Some(millis),
                        memory_bytes: Some(u64::try_from(mem).expect("positive")),
                    },
                )
            })
            .collect(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let iters: usize = std::env::var("NRI_RESIZE_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
    let mut spec = PodSpec::new("bench-resize");
    spec.resources = Resources::limits(150_000, 384 * MIB);
    let pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
    let mut ids = Vec::new();
    for n in ["a", "b", "c"] {
        let mut c = ContainerSpec::new(n, &["sleep", "3600"]);
        c.resources = Resources::limits(50_000, 128 * MIB);
        let id = Box::pin(ctrd.create_container(&pod, c))
            .await
            .expect("create");
        ctrd.start_container(&id).await.expect("start");
        ids.push(id);
    }
    let mut plugin = PluginProcess::start_as_deployed(&ctrd, "nri-resize-bench", &[]);
    plugin.wait_ready(Duration::from_secs(15)).await;
    let api = plugin.api();

    // Blocks of baseline and ours, alternating: the baseline runs with the plugin detached (its
    // process stopped, so no update passes through nri-resize), ours after reattaching it
    // (started again and waited for until registered and synchronized). Each block is an even
    // number of resizes, up then down, so both directions are in both samples.
    let block = 10;
    let blocks = iters.div_ceil(block).max(1);
    let (mut base, mut ours) = (Vec::new(), Vec::new());
    let mut reattach = Vec::new();
    for _ in 0..blocks {
        plugin.stop();
        for i in 0..block {
            let (millis, mem): (i64, i64) = if i % 2 == 0 {
                (600, 192 * MIB)
            } else {
                (500, 128 * MIB)
            };
            // Baseline: kubelet's own writes (pod cgroup first on a net increase, last on a
            // decrease), no plugin attached.
            let quota = millis * 100;
            let pod_limits = CgroupLimits {
                cpu_quota: Some(quota * 3),
                cpu_period: 100_000,
                cpu_shares: 2,
                memory_limit: Some(u64::try_from(mem * 3).expect("positive")),
            };
            let t = Instant::now();
            if i % 2 == 0 {
                ctrd.set_pod_cgroup_limits(&pod, &pod_limits)
                    .expect("pod cgroup");
            }
            for id in &ids {
                ctrd.update_container_resources(id, &Resources::limits(quota, mem))
                    .await
                    .expect("CRI update");
            }
            if i % 2 == 1 {
                ctrd.set_pod_cgroup_limits(&pod, &pod_limits)
                    .expect("pod cgroup");
            }
            base.push(t.elapsed());
        }
        let t = Instant::now();
        plugin.restart();
        plugin.wait_ready(Duration::from_secs(15)).await;
        reattach.push(t.elapsed());
        for i in 0..block {
            // Ours: the same resizes through the API, the plugin attached.
            let (m2, mem2) = if i % 2 == 0 {
                (600, 192 * MIB)
            } else {
                (500, 128 * MIB)
            };
            let t = Instant::now();
            api.resize_pod(&pod.namespace, &pod.name, &request(m2, mem2))
                .await
                .expect("API resize");
            ours.push(t.elapsed());
        }
    }
    println!(
        "plugin detached and reattached {blocks} times (reattach until ready: {:.0} ms p50)",
        percentile(&mut reattach, 0.5).as_secs_f64() * 1e3
    );
    let iters = base.len();
    plugin.stop();
    report(ctrd.version(), iters, &mut base, &mut ours);
}

/// The comparison as a table and as a row of `cargo xtask bench`'s one table.
fn report(version: &str, iters: usize, base: &mut [Duration], ours: &mut [Duration]) {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    println!(
        "whole-pod 3-container resize, {iters} samples each, containerd {version} (target: < 50 ms)"
    );
    println!("{:<48} {:>10} {:>10}", "measure", "p50", "p99");
    let (b50, b99) = (percentile(base, 0.5), percentile(base, 0.99));
    let (o50, o99) = (percentile(ours, 0.5), percentile(ours, 0.99));
    println!(
        "{:<48} {:>10} {:>10}",
        "baseline: pod cgroup + 3x CRI UpdateContainerResources",
        ms(b50),
        ms(b99)
    );
    println!(
        "{:<48} {:>10} {:>10}  ratio p50 {:.2}x  {}",
        "ours: nri-resize resize (plan, execute, read back)",
        ms(o50),
        ms(o99),
        o50.as_secs_f64() / b50.as_secs_f64(),
        if o50 < Duration::from_millis(50) {
            "ok"
        } else {
            "OVER TARGET"
        }
    );
    nri_resize::bench_table::row(
        &format!("whole-pod 3-container resize through the API, end to end (containerd {version})"),
        &format!(
            "kubelet's own writes (pod cgroup + 3× CRI update), plugin detached: {} p50",
            ms(b50)
        ),
        &format!("{} p50 / {} p99", ms(o50), ms(o99)),
        Some(o50.as_secs_f64() / b50.as_secs_f64().max(1e-9)),
        &format!(
            "< 50 ms: {}",
            nri_resize::bench_table::verdict(o50 < Duration::from_millis(50))
        ),
    );
}
