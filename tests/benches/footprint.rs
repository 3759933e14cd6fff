//! The daemon's footprint with 500 containers (issue 9): resident memory, CPU time and open file
//! descriptors of `nri-resize run`, with none and then with 100 pods × 5 containers tracked
//! (model, observer, metrics series), side by side in one run. Containers are Burstable with a
//! minimal CPU request so that 500 fit a small node.
//!
//! Run: `cargo bench -p nri-resize-tests --bench footprint` (part of `cargo xtask bench`).

use std::time::Duration;

use nri_resize_tests::{
    ContainerSpec, Containerd, ContainerdOptions, ContainerdVersion, PluginProcess, PodSpec,
    Resources,
};

const MIB: i64 = 1 << 20;

/// (RSS KiB, CPU seconds user+system, open fds) of `pid`.
fn footprint(pid: u32) -> (u64, f64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100);
    #[expect(clippy::cast_precision_loss, reason = "seconds for a report")]
    let cpu = (ticks(11) + ticks(12)) as f64 / hz as f64;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
    (rss, cpu, fds)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let pods: usize = std::env::var("NRI_RESIZE_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let ctrd = Containerd::start(ContainerdVersion::V2, ContainerdOptions::default()).await;
    let mut plugin = PluginProcess::start(&ctrd, "nri-resize-footprint", &[]);
    plugin.wait_ready(Duration::from_secs(15)).await;
    let pid = plugin.pid().expect("pid");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss0, cpu_idle_start, fds0) = footprint(pid);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (_, cpu_idle_end, _) = footprint(pid);

    for p in 0..pods {
        let mut spec = PodSpec::new(&format!("fp-{p}"));
        spec.resources = Resources::burstable(200_000, 1024 * MIB);
        let pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
        for c in 0..5 {
            let mut s = ContainerSpec::new(&format!("c{c}"), &["sleep", "3600"]);
            s.resources = Resources::burstable(20_000, 32 * MIB);
            let id = Box::pin(ctrd.create_container(&pod, s))
                .await
                .expect("CreateContainer");
            ctrd.start_container(&id).await.expect("StartContainer");
        }
    }
    let n = pods * 5;
    let tracked = plugin
        .api()
        .status()
        .await
        .expect("status")
        .pods
        .iter()
        .map(|p| p.containers.len())
        .sum::<usize>();
    assert_eq!(tracked, n, "the daemon tracks every container");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss1, cpu_loaded_start, fds1) = footprint(pid);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (_, cpu_loaded_end, _) = footprint(pid);

    #[expect(clippy::cast_precision_loss, reason = "a ratio for a report")]
    let ratio = rss1 as f64 / rss0.max(1) as f64;
    let idle0 = (cpu_idle_end - cpu_idle_start) / 10.0 * 100.0;
    let idle1 = (cpu_loaded_end - cpu_loaded_start) / 10.0 * 100.0;
    println!(
        "\ndaemon footprint, containerd {}: none vs {n} containers tracked",
        ctrd.version()
    );
    println!("  RSS {rss0} KiB → {rss1} KiB ({ratio:.2}×); fds {fds0} → {fds1}; CPU over 10 s {idle0:.2} % → {idle1:.2} % of a core");
    nri_resize::bench_table::row(
        &format!("daemon footprint with {n} containers tracked (RSS, fds)"),
        &format!("no containers: {} MiB, {fds0} fds", rss0 / 1024),
        &format!("{} MiB, {fds1} fds", rss1 / 1024),
        Some(ratio),
        "—",
    );
    nri_resize::bench_table::row(
        &format!("daemon CPU at steady state with {n} containers (observer reading every second)"),
        &format!("no containers: {idle0:.2} % of a core"),
        &format!("{idle1:.2} % of a core"),
        None,
        "—",
    );
    plugin.stop();
}
