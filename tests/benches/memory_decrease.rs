//! Convergence of a safe memory decrease (issue 5, scenario (a): 400 MiB page cache + 50 MiB
//! anonymous, limit 512 MiB → 128 MiB), side by side in one run with its baselines:
//!
//! - **reclaim time** — what the plugin spends bringing usage under the new limit (its
//!   `nri_resize_memory_decrease_reclaim_duration_seconds`: the fast path's one reclaim inside the
//!   update, or the staged path from accepting the update to the limit in place) against the time
//!   the kernel needs for **one direct limit write** of the same amount (cgroup v1
//!   `memory.limit_in_bytes`; on v2 one `memory.reclaim`). Target: within 2×.
//! - **end to end** — the CRI `UpdateContainerResources` call until the new limit is in place,
//!   against the **naive** CRI update of the same decrease on the same containerd version
//!   without the plugin (the runtime writes the limit itself; one `runc update`).
//!
//! Each sample refills the page cache (`cat` of the file inside the container) at 512 MiB first,
//! so every path reclaims the same amount. Three private containerds: no plugin, the plugin with
//! its defaults (fast path), the plugin with `inline_max = 0` (staged path).
//!
//! Run: `cargo bench -p nri-resize-tests --bench memory_decrease` (part of `cargo xtask bench`).

use std::time::{Duration, Instant};

use nri_resize::api::ApiClient;
use nri_resize_tests::{
    percentile, CgroupMode, Containerd, ContainerdOptions, ContainerdVersion, PluginProcess,
    Resources,
};

const MIB: i64 = 1 << 20;
const LOAD: &str = "dd if=/dev/zero of=/tmp/cache bs=1M count=400 2>/dev/null; sync; dd if=/dev/zero bs=50M count=1 2>/dev/null | sleep 3600";

/// One private containerd with a loaded container, and optionally the plugin.
struct Setup {
    ctrd: Containerd,
    id: String,
    plugin: Option<PluginProcess>,
}

impl Setup {
    async fn new(config: Option<&str>) -> Setup {
        let ctrd = Containerd::start(ContainerdVersion::V1_7, ContainerdOptions::default()).await;
        let plugin = match config {
            Some(text) => {
                Some(PluginProcess::start_ready(&ctrd, "nri-resize-bench", Some(text)).await)
            }
            None => None,
        };
        let (_pod, id) = ctrd
            .loaded_pod("bench-decrease", &[], LOAD, 440 * MIB)
            .await;
        Setup { ctrd, id, plugin }
    }

    fn v1(&self) -> bool {
        self.ctrd.cgroups().mode() == CgroupMode::V1
    }

    fn api(&self) -> Option<ApiClient> {
        self.plugin.as_ref().map(PluginProcess::api)
    }

    /// Back to 512 MiB with ≥ 440 MiB charged (the file read back into the page cache).
    async fn refill(&self) {
        self.ctrd
            .update_container_resources(&self.id, &Resources::limits(100_000, 512 * MIB))
            .await
            .expect("back to 512 MiB");
        let r = self
            .ctrd
            .exec_sync(&self.id, &["sh", "-c", "cat /tmp/cache > /dev/null"], 60)
            .await
            .expect("refill the page cache");
        assert_eq!(r.exit_code, 0, "refill: {r:?}");
        let usage = self.ctrd.container_memory_usage(&self.id);
        assert!(
            usage >= 440 * MIB,
            "usage after refill: {} MiB",
            usage / MIB
        );
    }

    /// The kernel alone: one direct write of the same decrease.
    fn direct_write(&self) -> Duration {
        let dir = self
            .ctrd
            .container_cgroup_dir(&self.id, "memory")
            .expect("memory cgroup");
        let (file, value) = if self.v1() {
            ("memory.limit_in_bytes", 128 * MIB)
        } else {
            ("memory.reclaim", 322 * MIB)
        };
        let t = Instant::now();
        std::fs::write(dir.join(file), value.to_string()).expect("direct write");
        t.elapsed()
    }

    /// CRI update to 128 MiB until the limit is in place: for the plugin, until it reports the
    /// limit allocated with no resize state. Returns the time and, for the plugin, its own
    /// reclaim duration of this decrease.
    async fn cri_decrease(&self) -> (Duration, Option<Duration>) {
        let api = self.api();
        let before = match &api {
            Some(a) => Some(reclaim_seconds(a).await),
            None => None,
        };
        let t = Instant::now();
        self.ctrd
            .update_container_resources(&self.id, &Resources::limits(100_000, 128 * MIB))
            .await
            .expect("update");
        let Some(api) = api else {
            return (t.elapsed(), None);
        };
        loop {
            let rec = api
                .resizes()
                .await
                .expect("resizes")
                .containers
                .get(&self.id)
                .cloned();
            let done = rec.as_ref().is_some_and(|r| {
                r.state.is_none()
                    && r.allocated
                        .as_ref()
                        .and_then(|a| a.memory.as_ref())
                        .and_then(|m| m.limit)
                        == Some(128 * MIB)
            });
            if done {
                let took = t.elapsed();
                let (sum0, n0) = before.unwrap_or_default();
                let (sum1, n1) = reclaim_seconds(&api).await;
                assert!(n1 > n0, "the plugin measured this decrease");
                return (took, Some(Duration::from_secs_f64(sum1 - sum0)));
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "no convergence: {rec:?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// `(sum, count)` of the plugin's reclaim-duration histogram.
async fn reclaim_seconds(api: &ApiClient) -> (f64, u64) {
    let body = nri_resize_tests::scrape_metrics(api).await;
    let get = |name: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let sum = get("nri_resize_memory_decrease_reclaim_duration_seconds_sum ");
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a sample count"
    )]
    let count = get("nri_resize_memory_decrease_reclaim_duration_seconds_count ") as u64;
    (sum, count)
}

fn row(name: &str, samples: &mut [Duration], baseline: Option<(&str, Duration)>) -> Duration {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p50 = percentile(samples, 0.5);
    let p90 = percentile(samples, 0.9);
    let ratio = baseline.map_or(String::new(), |(b, d)| {
        format!("{:.2}x {b}", p50.as_secs_f64() / d.as_secs_f64().max(1e-9))
    });
    println!("  {name:<56} {:>8.1} {:>8.1}  {ratio}", ms(p50), ms(p90));
    p50
}

/// A row of the one benchmark table (`cargo xtask bench`).
fn table_row(measure: &str, baseline: (&str, Duration), ours: Duration, target: Option<f64>) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let ratio = ours.as_secs_f64() / baseline.1.as_secs_f64().max(1e-9);
    nri_resize::bench_table::row(
        &format!(
            "memory decrease 512 → 128 MiB (400 MiB page cache + 50 MiB anonymous): {measure}"
        ),
        &format!("{}: {:.1} ms p50", baseline.0, ms(baseline.1)),
        &format!("{:.1} ms p50", ms(ours)),
        Some(ratio),
        &target.map_or_else(
            || "—".to_string(),
            |t| format!("≤ {t}×: {}", nri_resize::bench_table::verdict(ratio <= t)),
        ),
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let iters: usize = std::env::var("NRI_RESIZE_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let naive = Setup::new(None).await;
    let fast = Setup::new(Some("")).await;
    let staged = Setup::new(Some(
        "[memory_decrease]\ninline_max = 0\nstep_interval = \"5ms\"\n",
    ))
    .await;
    let v1 = naive.v1();

    let (mut kernel, mut naive_e2e) = (Vec::new(), Vec::new());
    let (mut fast_e2e, mut fast_reclaim) = (Vec::new(), Vec::new());
    let (mut staged_e2e, mut staged_reclaim) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        naive.refill().await;
        kernel.push(naive.direct_write());
        naive.refill().await;
        naive_e2e.push(naive.cri_decrease().await.0);
        fast.refill().await;
        let (e2e, reclaim) = fast.cri_decrease().await;
        fast_e2e.push(e2e);
        fast_reclaim.push(reclaim.expect("plugin"));
        staged.refill().await;
        let (e2e, reclaim) = staged.cri_decrease().await;
        staged_e2e.push(e2e);
        staged_reclaim.push(reclaim.expect("plugin"));
    }

    println!(
        "\nmemory decrease 512 → 128 MiB, 400 MiB page cache + 50 MiB anonymous, containerd {} (cgroup {}), {iters} samples each",
        naive.ctrd.version(),
        if v1 { "v1" } else { "v2" }
    );
    println!(
        "  {:<56} {:>8} {:>8}  ratio (p50)",
        "measure", "p50 ms", "p90 ms"
    );
    let direct = if v1 {
        "kernel: one direct memory.limit_in_bytes write"
    } else {
        "kernel: one direct memory.reclaim"
    };
    let k = row(direct, &mut kernel, None);
    let f = row(
        "plugin reclaim time, fast path (default)",
        &mut fast_reclaim,
        Some(("the kernel", k)),
    );
    let s50 = row(
        "plugin reclaim time, staged path (inline_max = 0)",
        &mut staged_reclaim,
        Some(("the kernel", k)),
    );
    let n = row(
        "naive CRI update, no plugin (runtime writes the limit)",
        &mut naive_e2e,
        None,
    );
    let fe = row(
        "CRI update to limit in place, plugin fast path",
        &mut fast_e2e,
        Some(("naive", n)),
    );
    row(
        "CRI update to limit in place, plugin staged path",
        &mut staged_e2e,
        Some(("naive", n)),
    );
    table_row(
        "plugin reclaim time, default (fast) path",
        (direct, k),
        f,
        Some(2.0),
    );
    table_row(
        "plugin reclaim time, staged path (`inline_max = 0`)",
        (direct, k),
        s50,
        None,
    );
    table_row(
        "CRI update until the limit is in place (default path)",
        ("naive CRI update without the plugin", n),
        fe,
        None,
    );
    let ratio = f.as_secs_f64() / k.as_secs_f64().max(1e-9);
    println!(
        "  target: reclaim within 2x one direct kernel write (default path): {ratio:.2}x, {}",
        if ratio <= 2.0 { "met" } else { "NOT met" }
    );
}
