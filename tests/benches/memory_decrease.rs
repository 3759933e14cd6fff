//! Convergence of a safe memory decrease (issue 5, scenario (a): 400 MiB page cache + 50 MiB
//! anonymous, limit 512 MiB → 128 MiB), side by side in one run with its baselines. kubelet's
//! path (1.33: no usage check) is played as the tests' kubelet plays it: a decrease the plugin
//! refuses is sent again (kubelet's pod worker retries after 10–15 s; here as soon as the retry
//! can go through), and every measure runs across the tries.
//!
//! - **reclaim time** — what the plugin spends bringing usage under the new limit, over all the
//!   tries of one decrease (its `nri_resize_memory_decrease_reclaim_duration_seconds`, which
//!   counts the inline pass that made a decrease fit and a background reclaim, plus the
//!   `took_ms` its log gives for an inline pass that ran out of its share and was refused)
//!   against the time the kernel needs for **one direct limit write** of the same amount
//!   (cgroup v1 `memory.limit_in_bytes`; on v2 one `memory.reclaim`). Target: within 2× on the
//!   default path.
//! - **end to end** — the first CRI `UpdateContainerResources` call until the new limit is in
//!   place (the cgroup holds it and the plugin's record is settled), against the **naive** CRI
//!   update of the same decrease on the same containerd version without the plugin (the runtime
//!   writes the limit itself; one `runc update`).
//!
//! Three private containerds: no plugin; the plugin with its defaults (the page cache in the way
//! reclaimed inside the update; where the inline pass runs out of its share of the runtime's
//! deadline the update is refused and kubelet's retry is played: on cgroup v2 once the
//! background reclaim says usage fits, on v1 at once, as each try reclaims inline again); the
//! plugin with `inline_max = 0` (nothing reclaimed inside the update, so the first try is always
//! refused):
//!
//! - cgroup v2: the page cache is reclaimed in the background after the refusal, and the retry
//!   is played as soon as the plugin's record says usage fits (`fits the requested limit`);
//!   measured: the refusal to usage fitting (reclaim time) and the first CRI update to the limit
//!   in place at the retry (end to end);
//! - cgroup v1 has no background reclaim, so with `inline_max = 0` a decrease below usage never
//!   goes through (every try is refused; the limit stays 512 MiB, asserted). Measured instead:
//!   how soon kubelet gets the refusal, against the naive CRI update of the same container that
//!   reclaims nothing (512 → 512 MiB, no plugin): the runtime's own round trip, `runc update`
//!   included, which a refused update never reaches. No reclaim-time row there (nothing is
//!   reclaimed).
//!
//! Each sample refills the page cache (`cat` of the file inside the container) at 512 MiB first,
//! so every path reclaims the same amount. The baselines never pass through the plugin.
//!
//! Run: `cargo bench -p nri-resize-tests --bench memory_decrease` (part of `cargo xtask bench`).

use std::time::{Duration, Instant};

use nri_resize::api::ApiClient;
use nri_resize::policy::ResizeState;
use nri_resize_tests::{
    percentile, resize_record, CgroupMode, Containerd, ContainerdOptions, ContainerdVersion,
    PluginProcess, Resources,
};

const MIB: i64 = 1 << 20;
const LOAD: &str = "dd if=/dev/zero of=/tmp/cache bs=1M count=400 2>/dev/null; sync; dd if=/dev/zero bs=50M count=1 2>/dev/null | sleep 3600";
/// kubelet's tries of one decrease at most (kubelet itself never gives up).
const MAX_TRIES: usize = 10;
/// How long a decrease may take to converge before the sample fails (a bound, not a target).
const CONVERGE_WITHIN: Duration = Duration::from_secs(90);

/// One decrease through the plugin.
struct Decrease {
    /// First CRI update until the limit is in place, or, refused for good, until the answer.
    took: Duration,
    /// CRI updates sent: kubelet's first try and its retries.
    tries: usize,
    /// The plugin's own reclaim time over the tries (see the module docs).
    reclaim: Duration,
}

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

    fn plugin(&self) -> &PluginProcess {
        self.plugin.as_ref().expect("a setup with the plugin")
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

    /// Without the plugin: the CRI update of `bytes`, timed; the runtime writes the limit.
    async fn naive_update(&self, bytes: i64) -> Duration {
        let t = Instant::now();
        self.ctrd
            .update_container_resources(&self.id, &Resources::limits(100_000, bytes))
            .await
            .expect("naive update");
        let took = t.elapsed();
        assert_eq!(self.ctrd.container_memory_limit(&self.id), bytes);
        took
    }

    /// One CRI update to 128 MiB through the plugin; a refusal must be the plugin's own.
    async fn try_decrease(&self) -> Result<(), tonic::Status> {
        let answer = self
            .ctrd
            .update_container_resources(&self.id, &Resources::limits(100_000, 128 * MIB))
            .await;
        if let Err(e) = &answer {
            assert!(
                e.message().contains("memory decrease of") && e.message().contains("refused"),
                "failed, not refused by nri-resize: {e:?}\n{}",
                self.plugin().log_tail(20)
            );
        }
        answer
    }

    /// Waits until the background reclaim toward a refused 128 MiB has ended: its record says
    /// usage fits (or it left `InProgress`, and the retry decides anew).
    async fn background_reclaim_ended(&self, api: &ApiClient) {
        let give_up = Instant::now() + CONVERGE_WITHIN;
        loop {
            let r = resize_record(api, &self.id).await;
            if r.state != Some(ResizeState::InProgress)
                || r.reason.contains("fits the requested limit")
            {
                return;
            }
            assert!(Instant::now() < give_up, "still reclaiming: {r:?}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits until 128 MiB is in place: the cgroup holds it, and the plugin's record has it
    /// allocated with no resize pending.
    async fn in_place(&self, api: &ApiClient, since: Instant) {
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
            }) && self.ctrd.container_memory_limit(&self.id) == 128 * MIB;
            if done {
                return;
            }
            assert!(since.elapsed() < CONVERGE_WITHIN, "no convergence: {rec:?}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// kubelet's decrease to 128 MiB until the limit is in place: sent again after each refusal
    /// (on cgroup v2 once the background reclaim has ended, on v1 at once).
    async fn until_in_place(&self) -> Decrease {
        let plugin = self.plugin();
        let api = plugin.api();
        let log_from = log_len(plugin);
        let before = reclaim_seconds(&api).await;
        let t = Instant::now();
        let mut tries = 0;
        loop {
            tries += 1;
            if self.try_decrease().await.is_ok() {
                break;
            }
            assert!(tries < MAX_TRIES, "refused {tries} times");
            if !self.v1() {
                self.background_reclaim_ended(&api).await;
            }
        }
        self.in_place(&api, t).await;
        let took = t.elapsed();
        Decrease {
            took,
            tries,
            reclaim: self.reclaimed_since(&api, before, log_from).await,
        }
    }

    /// `inline_max = 0` on cgroup v2: the first try refused, the page cache reclaimed in the
    /// background, the retry applied once usage fits.
    async fn refused_then_retried(&self) -> Decrease {
        let plugin = self.plugin();
        let api = plugin.api();
        let log_from = log_len(plugin);
        let before = reclaim_seconds(&api).await;
        let t = Instant::now();
        let refusal = self
            .try_decrease()
            .await
            .expect_err("inline_max = 0: the first try is refused");
        assert!(
            refusal.message().contains("page cache")
                && refusal.message().contains("in the background"),
            "refused for the page cache, reclaimed in the background: {}",
            refusal.message()
        );
        self.background_reclaim_ended(&api).await;
        self.try_decrease()
            .await
            .expect("the retry once usage fits goes through");
        self.in_place(&api, t).await;
        let took = t.elapsed();
        Decrease {
            took,
            tries: 2,
            reclaim: self.reclaimed_since(&api, before, log_from).await,
        }
    }

    /// `inline_max = 0` on cgroup v1: refused, nothing reclaimed, nothing changed; the time
    /// kubelet waits for the answer.
    async fn refused_answer(&self) -> Duration {
        let t = Instant::now();
        let refusal = self
            .try_decrease()
            .await
            .expect_err("cgroup v1, inline_max = 0: refused");
        let took = t.elapsed();
        assert!(
            refusal.message().contains("page cache"),
            "refused for the page cache: {}",
            refusal.message()
        );
        assert_eq!(
            self.ctrd.container_memory_limit(&self.id),
            512 * MIB,
            "a refused decrease leaves the limit"
        );
        took
    }

    /// The plugin's reclaim time since `before` (its histogram) and `log_from` (its log's
    /// refused inline passes), waiting for the histogram to count this decrease.
    async fn reclaimed_since(
        &self,
        api: &ApiClient,
        before: (f64, u64),
        log_from: usize,
    ) -> Duration {
        let (sum0, n0) = before;
        let t = Instant::now();
        let (sum1, n1) = loop {
            let now = reclaim_seconds(api).await;
            // A background reclaim is counted when its task ends, just after its record says so.
            if now.1 > n0 || t.elapsed() > Duration::from_secs(5) {
                break now;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(n1 > n0, "the plugin measured this decrease");
        Duration::from_secs_f64(sum1 - sum0) + refused_inline_passes(self.plugin(), log_from)
    }
}

fn log_len(plugin: &PluginProcess) -> usize {
    std::fs::read_to_string(&plugin.log_path).map_or(0, |t| t.len())
}

/// The `took_ms` of the inline passes that ran out of their share (and were refused) in the
/// plugin's log from byte `from`: the histogram counts only a pass that made a decrease fit.
fn refused_inline_passes(plugin: &PluginProcess, from: usize) -> Duration {
    let log = std::fs::read_to_string(&plugin.log_path).expect("plugin log");
    let ms: u64 = log
        .get(from..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("inline reclaim ran out of its share"))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("took_ms="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no took_ms in: {l}"))
        })
        .sum();
    Duration::from_millis(ms)
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn row(name: &str, samples: &mut [Duration], baseline: Option<(&str, Duration)>) -> Duration {
    let p50 = percentile(samples, 0.5);
    let p90 = percentile(samples, 0.9);
    let ratio = baseline.map_or(String::new(), |(b, d)| {
        format!("{:.2}x {b}", p50.as_secs_f64() / d.as_secs_f64().max(1e-9))
    });
    println!("  {name:<72} {:>8.1} {:>8.1}  {ratio}", ms(p50), ms(p90));
    p50
}

/// A row of the one benchmark table (`cargo xtask bench`); `note` follows ours' p50.
fn table_row(
    measure: &str,
    baseline: (&str, Duration),
    (ours, note): (Duration, &str),
    target: Option<f64>,
) {
    let ratio = ours.as_secs_f64() / baseline.1.as_secs_f64().max(1e-9);
    nri_resize::bench_table::row(
        &format!(
            "memory decrease 512 → 128 MiB (400 MiB page cache + 50 MiB anonymous): {measure}"
        ),
        &format!("{}: {:.1} ms p50", baseline.0, ms(baseline.1)),
        &format!("{:.1} ms p50{note}", ms(ours)),
        Some(ratio),
        &target.map_or_else(
            || "—".to_string(),
            |t| format!("≤ {t}×: {}", nri_resize::bench_table::verdict(ratio <= t)),
        ),
    );
}

/// What the samples' tries say, for a row: empty when every decrease went through at kubelet's
/// first try, else how many did (`, 5 of 7 at kubelet's first try (at most 2 tries)`).
fn tries_note(tries: &[usize]) -> String {
    let first = tries.iter().filter(|t| **t == 1).count();
    if first == tries.len() {
        String::new()
    } else {
        format!(
            ", {first} of {} at kubelet's first try (at most {} tries)",
            tries.len(),
            tries.iter().max().unwrap_or(&1)
        )
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
#[expect(
    clippy::too_many_lines,
    reason = "one run: the samples of every path, then their rows side by side"
)]
async fn main() {
    let iters: usize = std::env::var("NRI_RESIZE_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let naive = Setup::new(None).await;
    let fast = Setup::new(Some("")).await;
    let refused = Setup::new(Some(
        "[memory_decrease]\ninline_max = 0\nstep_interval = \"5ms\"\n",
    ))
    .await;
    let v1 = naive.v1();

    let (mut kernel, mut naive_e2e, mut naive_noop) = (Vec::new(), Vec::new(), Vec::new());
    let (mut fast_e2e, mut fast_reclaim, mut fast_tries) = (Vec::new(), Vec::new(), Vec::new());
    let (mut refused_e2e, mut refused_reclaim) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        naive.refill().await;
        kernel.push(naive.direct_write());
        naive.refill().await;
        naive_noop.push(naive.naive_update(512 * MIB).await);
        naive_e2e.push(naive.naive_update(128 * MIB).await);
        fast.refill().await;
        let d = fast.until_in_place().await;
        fast_e2e.push(d.took);
        fast_reclaim.push(d.reclaim);
        fast_tries.push(d.tries);
        refused.refill().await;
        if v1 {
            refused_e2e.push(refused.refused_answer().await);
        } else {
            let d = refused.refused_then_retried().await;
            refused_e2e.push(d.took);
            refused_reclaim.push(d.reclaim);
        }
    }

    println!(
        "\nmemory decrease 512 → 128 MiB, 400 MiB page cache + 50 MiB anonymous, containerd {} (cgroup {}), {iters} samples each",
        naive.ctrd.version(),
        if v1 { "v1" } else { "v2" }
    );
    println!(
        "  {:<72} {:>8} {:>8}  ratio (p50)",
        "measure", "p50 ms", "p90 ms"
    );
    let direct = if v1 {
        "kernel: one direct memory.limit_in_bytes write"
    } else {
        "kernel: one direct memory.reclaim"
    };
    let k = row(direct, &mut kernel, None);
    let fast_note = tries_note(&fast_tries);
    let f = row(
        "plugin reclaim time over kubelet's tries, default path",
        &mut fast_reclaim,
        Some(("the kernel", k)),
    );
    let r = (!v1).then(|| {
        row(
            "plugin reclaim time, refusal to usage fitting (inline_max = 0)",
            &mut refused_reclaim,
            Some(("the kernel", k)),
        )
    });
    let n = row(
        "naive CRI update, no plugin (runtime writes the limit)",
        &mut naive_e2e,
        None,
    );
    let n0 = row(
        "naive CRI update reclaiming nothing (512 → 512 MiB), no plugin",
        &mut naive_noop,
        None,
    );
    let fe = row(
        "first CRI update to limit in place, default path",
        &mut fast_e2e,
        Some(("naive", n)),
    );
    println!("  default path: tries per decrease {fast_tries:?}");
    let re = if v1 {
        row(
            "CRI update refused (inline_max = 0, cgroup v1: never applied)",
            &mut refused_e2e,
            Some(("naive, reclaiming nothing", n0)),
        )
    } else {
        row(
            "first CRI update (refused) to limit in place at the retry (inline_max = 0)",
            &mut refused_e2e,
            Some(("naive", n)),
        )
    };
    table_row(
        "plugin reclaim time over kubelet's tries, default (fast) path",
        (direct, k),
        (f, &fast_note),
        Some(2.0),
    );
    match r {
        Some(r) => table_row(
            "plugin reclaim time, `inline_max = 0`: the update refused, the page cache reclaimed in the background until usage fits",
            (direct, k),
            (r, ""),
            None,
        ),
        None => println!(
            "  no reclaim-time row for inline_max = 0: cgroup v1 has no background reclaim, so nothing is reclaimed"
        ),
    }
    table_row(
        "first CRI update until the limit is in place, default path (kubelet's retry played at once where a try is refused)",
        ("naive CRI update without the plugin", n),
        (fe, &fast_note),
        None,
    );
    if v1 {
        table_row(
            "CRI update refused at once with `inline_max = 0` (cgroup v1 has no background reclaim: such a decrease never goes through, the limit stays 512 MiB): time to the answer",
            ("naive CRI update reclaiming nothing (512 → 512 MiB) without the plugin", n0),
            (re, ""),
            None,
        );
    } else {
        table_row(
            "first CRI update (refused, `inline_max = 0`) until the limit is in place at kubelet's retry, played once the plugin's record says usage fits",
            ("naive CRI update without the plugin", n),
            (re, ""),
            None,
        );
    }
    let ratio = f.as_secs_f64() / k.as_secs_f64().max(1e-9);
    println!(
        "  target: reclaim within 2x one direct kernel write (default path): {ratio:.2}x, {}",
        if ratio <= 2.0 { "met" } else { "NOT met" }
    );
}
