//! Convergence time of a safe memory decrease (issue 5, scenario (a): 400 MiB page cache + 50 MiB
//! anonymous, limit 512 MiB → 128 MiB) through the plugin — CRI update answered with an interim
//! limit, staged reclaim, the final limit applied through NRI `UpdateContainers` — side by side in
//! one run with the baseline: the time the kernel needs for one direct limit write of the same
//! amount (cgroup v1 `memory.limit_in_bytes`; on v2 one `memory.reclaim`). Target: within 2×.
//!
//! Each iteration refills the page cache (`cat` of the file inside the container) and restores
//! the 512 MiB limit first, so both paths reclaim the same amount.
//!
//! Run: `cargo bench -p nri-resize-tests --bench memory_decrease` (part of `cargo xtask bench`).

use std::time::{Duration, Instant};

use nri_resize::api::ApiClient;
use nri_resize::resize::ContainerResize;
use nri_resize_tests::{
    percentile, CgroupMode, ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion,
    PluginProcess, PodSpec, Resources,
};

const MIB: i64 = 1 << 20;

async fn refill(ctrd: &Containerd, id: &str, v1: bool) {
    ctrd.update_container_resources(id, &Resources::limits(100_000, 512 * MIB))
        .await
        .expect("back to 512 MiB");
    let r = ctrd
        .exec_sync(id, &["sh", "-c", "cat /tmp/cache > /dev/null"], 60)
        .await
        .expect("refill the page cache");
    assert_eq!(r.exit_code, 0, "refill: {r:?}");
    let file = if v1 {
        "memory.usage_in_bytes"
    } else {
        "memory.current"
    };
    let usage: i64 = ctrd.read_container_cgroup(id, file).parse().expect("usage");
    assert!(
        usage >= 440 * MIB,
        "usage after refill: {} MiB",
        usage / MIB
    );
}

/// CRI update to 128 MiB, then until the plugin reports the limit allocated and no resize state.
async fn converge(ctrd: &Containerd, api: &ApiClient, id: &str) -> Duration {
    let t = Instant::now();
    ctrd.update_container_resources(id, &Resources::limits(100_000, 128 * MIB))
        .await
        .expect("update");
    loop {
        let rec: Option<ContainerResize> = api
            .resizes()
            .await
            .expect("resizes")
            .containers
            .get(id)
            .cloned();
        if rec.as_ref().is_some_and(|r| {
            r.state.is_none()
                && r.allocated
                    .as_ref()
                    .and_then(|a| a.memory.as_ref())
                    .and_then(|m| m.limit)
                    == Some(128 * MIB)
        }) {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no convergence: {rec:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let iters: usize = std::env::var("NRI_RESIZE_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
    let v1 = ctrd.cgroups().mode() == CgroupMode::V1;
    let mut spec = PodSpec::new("bench-decrease");
    spec.resources = Resources::limits(200_000, 1024 * MIB);
    let pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
    let mut c = ContainerSpec::new(
        "app",
        &[
            "sh",
            "-c",
            "dd if=/dev/zero of=/tmp/cache bs=1M count=400 2>/dev/null; sync; dd if=/dev/zero bs=50M count=1 2>/dev/null | sleep 3600",
        ],
    );
    c.resources = Resources::limits(100_000, 512 * MIB);
    let id = Box::pin(ctrd.create_container(&pod, c))
        .await
        .expect("create");
    ctrd.start_container(&id).await.expect("start");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cfg = ctrd.base_dir().join("bench.toml");
    std::fs::write(&cfg, "[memory_decrease]\nstep_interval_ms = 5\n").expect("config");
    let cfg = cfg.to_string_lossy().into_owned();
    let mut plugin = PluginProcess::start(&ctrd, "nri-resize-bench", &["--config", &cfg]);
    plugin.wait_ready(Duration::from_secs(15)).await;
    let api = plugin.api();
    let dir = ctrd
        .container_cgroup_dir(&id, "memory")
        .expect("container memory cgroup");
    let (limit_file, baseline_name) = if v1 {
        (
            "memory.limit_in_bytes",
            "one direct memory.limit_in_bytes write",
        )
    } else {
        ("memory.reclaim", "one direct memory.reclaim")
    };

    let (mut base, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        // Baseline: the kernel alone.
        refill(&ctrd, &id, v1).await;
        let value = if v1 { 128 * MIB } else { 322 * MIB };
        let t = Instant::now();
        std::fs::write(dir.join(limit_file), value.to_string()).expect("direct write");
        base.push(t.elapsed());

        // Ours: CRI update → interim → reclaim → final limit through NRI.
        refill(&ctrd, &id, v1).await;
        ours.push(converge(&ctrd, &api, &id).await);
    }
    let (b50, o50) = (percentile(&mut base, 0.5), percentile(&mut ours, 0.5));
    let (b90, o90) = (percentile(&mut base, 0.9), percentile(&mut ours, 0.9));
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "\nmemory decrease 512 → 128 MiB with 400 MiB page cache + 50 MiB anonymous, containerd {} (cgroup {}), {iters} iterations",
        ctrd.version(),
        if v1 { "v1" } else { "v2" }
    );
    println!("  {:<58} {:>9} {:>9}", "measure", "p50 ms", "p90 ms");
    println!(
        "  {:<58} {:>9.1} {:>9.1}",
        format!("baseline: {baseline_name}"),
        ms(b50),
        ms(b90)
    );
    println!(
        "  {:<58} {:>9.1} {:>9.1}",
        "nri-resize: CRI update to the final limit in place",
        ms(o50),
        ms(o90)
    );
    let ratio = o50.as_secs_f64() / b50.as_secs_f64().max(1e-9);
    println!(
        "  ratio (p50): {ratio:.2}x  target ≤ 2x: {}",
        if ratio <= 2.0 { "met" } else { "NOT met" }
    );
    drop(plugin);
}
