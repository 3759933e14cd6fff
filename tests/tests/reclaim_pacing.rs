//! Reclaim paced by the workload's memory stall (issue 18, part 4), side by side in one run on
//! cgroup v2 (the VM tier): a container running `/bin/latency-probe` (random 4 KiB reads of a
//! 400 MiB file it keeps cached) is decreased 512 MiB → 128 MiB three ways:
//!
//! 1. **direct**: no plugin, the runtime writes `memory.max` (what runc does alone);
//! 2. **unpaced**: the plugin refuses the update below usage and reclaims the page cache in the
//!    background with `max_stall = 1.0`, and a kubelet retry applies the limit once usage fits;
//! 3. **paced**: the same with the default `max_stall = 0.05`.
//!
//! For each: the probe's p50/p99 before (undisturbed), during the decrease and in the 5 s after
//! it, the container's memory and I/O stall shares (`memory.pressure` / `io.pressure` `some`
//! over wall time) during and after, and the higher of the two (the stall pacing holds to its
//! ceiling), the bytes it refaulted (`memory.stat` `workingset_refault_*`), the time to converge
//! (or the Deferred reason), and the OOM kills. A 400 MiB working set
//! cannot stay cached under 128 MiB: once the limit is in force every path thrashes, so "after"
//! shows what the decrease costs for good, and "during" what the way of getting there costs.
//! With `NRI_RESIZE_BENCH_TABLE` set (`cargo xtask bench`) the run writes one benchmark row.
//!
//! Asserted: no OOM kill on the staged ways, each ends by converging or by its timeout, pacing
//! keeps its contract (Deferred names the stall), the paced stall (the higher of memory and
//! I/O) during the decrease is under the ceiling. Reported, not asserted: whether a Deferred
//! paced decrease keeps a limit with room for the 400 MiB set, the stall in the 5 s after, and
//! the p99 within 2× of undisturbed, which this workload misses on both kernels (see the
//! README).
//!
//! The decrease is sent as kubelet 1.33 sends it (CRI `UpdateContainerResources` directly, usage
//! above the new limit); kubelet ≥ 1.34 blocks it (`tests/src/kubelet/`).

use std::time::{Duration, Instant, SystemTime};

use nri_resize::policy::ResizeState;
use nri_resize_tests::probe::{self, Latency};
use nri_resize_tests::{
    resize_record, Containerd, ContainerdOptions, ContainerdVersion, KubeletVersion, PluginProcess,
    Resources,
};

const MIB: i64 = 1 << 20;
const TIMEOUT_MS: u64 = 30_000;
/// The default ceiling (`[memory_decrease] max_stall`).
const CEILING: f64 = 0.05;
const SPAN: Duration = Duration::from_secs(5);

/// What one way of decreasing did.
#[derive(Debug)]
struct Figures {
    name: &'static str,
    before: Latency,
    during: Latency,
    after: Latency,
    stall_during: f64,
    stall_after: f64,
    /// `io.pressure` over the decrease: refaults of pages the kernel does not count as thrashing
    /// wait here, not in `memory.pressure`.
    io_during: f64,
    io_after: f64,
    /// Bytes refaulted during the decrease.
    refaulted: u64,
    took: Duration,
    outcome: String,
    oom_kills: u64,
}

/// `some` stalled µs of the container's `memory.pressure` or `io.pressure`.
fn stall_us(ctrd: &Containerd, id: &str, file: &str) -> u64 {
    let text = ctrd.read_container_cgroup(id, file);
    nri_resize::cgroup::stall_totals(&text)
        .unwrap_or_else(|| panic!("{file} unreadable: {text:?}"))
        .some_us
}

/// Bytes the container refaulted so far (`memory.stat`, 4 KiB pages on `x86_64`).
fn refaulted(ctrd: &Containerd, id: &str) -> u64 {
    let text = ctrd.read_container_cgroup(id, "memory.stat");
    let get = |k: &str| nri_resize::cgroup::flat_keyed(&text, k);
    let pages = match (
        get("workingset_refault_anon"),
        get("workingset_refault_file"),
    ) {
        (Some(a), Some(f)) => a + f,
        _ => get("workingset_refault").unwrap_or_else(|| panic!("no refaults in {text}")),
    };
    pages * 4096
}

impl Figures {
    /// The stall paced reclaim holds to its ceiling: the higher of memory and I/O.
    fn paced_stall(&self) -> f64 {
        self.stall_during.max(self.io_during)
    }
}

/// The limit a Deferred staged decrease kept, in MiB (`"...; keeping 420.6Mi; ..."`).
fn kept_mib(outcome: &str) -> Option<f64> {
    let rest = outcome.split("keeping ").nth(1)?;
    let end = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
    let n: f64 = rest[..end].parse().ok()?;
    match rest.get(end..=end)? {
        "M" => Some(n),
        "G" => Some(n * 1024.0),
        _ => None,
    }
}

/// Stall share of the container between two readings `wall` apart.
fn share(before_us: u64, after_us: u64, wall: Duration) -> f64 {
    let wall = u64::try_from(wall.as_micros()).unwrap_or(u64::MAX);
    nri_resize::observer::pressure::share(after_us.saturating_sub(before_us), wall)
}

/// The probe's output, read through its `/proc/<pid>/root` (no exec into the container).
fn memory_stall_us(ctrd: &Containerd, id: &str) -> u64 {
    stall_us(ctrd, id, "memory.pressure")
}

fn probe_windows(ctrd: &Containerd, id: &str) -> Vec<probe::Window> {
    probe_log(ctrd, id).unwrap_or_else(|e| panic!("{e}"))
}

/// The probe's windows so far, or why its log cannot be read (not written yet).
fn probe_log(ctrd: &Containerd, id: &str) -> Result<Vec<probe::Window>, String> {
    let procs = ctrd.read_container_cgroup(id, "cgroup.procs");
    let pid = procs.lines().next().expect("the probe's pid");
    let path = format!("/proc/{pid}/root/tmp/probe.log");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("read {path}: {e}"))?;
    Ok(probe::parse(&text))
}

/// A decrease `plugin` refused below usage: waits until its background reclaim ends, and when
/// usage fits plays kubelet's retry (kubelet's own backoff is 10–15 s; this one retries as soon
/// as the record says so, so "during" ends where the reclaim does). The outcome, as the table
/// shows it.
async fn reclaimed_then_retried(
    ctrd: &Containerd,
    plugin: &PluginProcess,
    name: &str,
    id: &str,
    ask: &Resources,
    refusal: &tonic::Status,
) -> String {
    let api = plugin.api();
    let give_up = Instant::now() + Duration::from_millis(TIMEOUT_MS) + Duration::from_secs(60);
    let rec = loop {
        let r = resize_record(&api, id).await;
        if r.state != Some(ResizeState::InProgress) || r.reason.contains("fits the requested limit")
        {
            break r;
        }
        assert!(
            Instant::now() < give_up,
            "{name}: still reclaiming: {r:?} (refused with: {})",
            refusal.message()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if rec.state != Some(ResizeState::InProgress) {
        return format!("{:?}: {}", rec.state, rec.reason);
    }
    match ctrd.update_container_resources(id, ask).await {
        Ok(()) => format!(
            "converged (limit {} MiB, applied at kubelet's retry)",
            ctrd.container_memory_limit(id) / MIB
        ),
        Err(e) => format!("retry refused: {}", e.message()),
    }
}

/// Decreases one probe container through `plugin` (or, without one, the runtime alone).
async fn decrease(
    ctrd: &Containerd,
    plugin: Option<&PluginProcess>,
    name: &'static str,
) -> Figures {
    let script = probe::command("/tmp/probe.data", 400, 100, "/tmp/probe.log");
    let (pod, id) = ctrd.loaded_pod(name, &[], &script, 390 * MIB).await;
    // Undisturbed: once the probe reads (the file written, its first windows out; usage passes
    // 390 MiB before that, seconds before in a slow guest: the unpaced run on 6.1 once had no
    // window before its decrease) and a few more windows have passed.
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let log = probe_log(ctrd, &id);
        if log.as_ref().is_ok_and(|w| w.len() >= 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{name}: the probe wrote no windows in 180 s: {log:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b0 = SystemTime::now();
    tokio::time::sleep(SPAN).await;
    let b1 = SystemTime::now();

    let (stall0, io0, refaults0) = (
        memory_stall_us(ctrd, &id),
        stall_us(ctrd, &id, "io.pressure"),
        refaulted(ctrd, &id),
    );
    let (d0, t0) = (SystemTime::now(), Instant::now());
    let ask = Resources::limits(100_000, 128 * MIB);
    let update = ctrd.update_container_resources(&id, &ask).await;
    let outcome = match (plugin, update) {
        (None, Err(e)) => format!("update failed: {}", e.message()),
        (None, Ok(())) => format!(
            "written (limit {} MiB, usage {} MiB)",
            ctrd.container_memory_limit(&id) / MIB,
            ctrd.container_memory_usage(&id) / MIB
        ),
        (Some(_), Ok(())) => format!(
            "converged (limit {} MiB: reclaimed inside the update)",
            ctrd.container_memory_limit(&id) / MIB
        ),
        // Refused below usage: the page cache is reclaimed in the background, and kubelet's
        // retry applies the limit once usage fits.
        (Some(p), Err(refusal)) => reclaimed_then_retried(ctrd, p, name, &id, &ask, &refusal).await,
    };
    let (took, d1, stall1) = (t0.elapsed(), SystemTime::now(), memory_stall_us(ctrd, &id));
    let (io1, refaults1) = (stall_us(ctrd, &id, "io.pressure"), refaulted(ctrd, &id));
    tokio::time::sleep(SPAN).await;
    let (stall2, io2) = (
        memory_stall_us(ctrd, &id),
        stall_us(ctrd, &id, "io.pressure"),
    );
    let a1 = SystemTime::now();

    let windows = probe_windows(ctrd, &id);
    let events = ctrd.read_container_cgroup(&id, "memory.events");
    let figures = Figures {
        name,
        before: Latency::between(&windows, b0, b1),
        during: Latency::between(&windows, d0, d1),
        after: Latency::between(&windows, d1, a1),
        stall_during: share(stall0, stall1, took),
        stall_after: share(stall1, stall2, SPAN),
        io_during: share(io0, io1, took),
        io_after: share(io1, io2, SPAN),
        refaulted: refaults1.saturating_sub(refaults0),
        took,
        outcome,
        oom_kills: nri_resize::observer::parse::oom_kill_count(&events).unwrap_or(0),
    };
    eprintln!("{name}: {figures:?}");
    for (span, l) in [
        ("before", &figures.before),
        ("during", &figures.during),
        ("after", &figures.after),
    ] {
        assert!(
            l.reads > 0,
            "{name}: the probe read nothing {span} the decrease: {l:?}"
        );
    }
    // Free the guest's memory for the next way.
    ctrd.stop_pod(&pod).await.expect("StopPodSandbox");
    ctrd.remove_pod(&pod).await.expect("RemovePodSandbox");
    figures
}

fn us(d: Duration) -> String {
    format!("{} µs", d.as_micros())
}

fn pct(share: f64) -> String {
    format!("{:.1} %", share * 100.0)
}

/// The share of reads in `span` slower than twice the undisturbed p99 (the p99 target
/// holds when it is at most 1 %).
fn slow(f: &Figures, span: &Latency) -> f64 {
    span.share_over(f.before.p99() * 2)
}

fn mib(bytes: u64) -> String {
    let tenths = (bytes * 10 + (1 << 19)) >> 20;
    format!("{}.{} MiB", tenths / 10, tenths % 10)
}

fn print_table(all: &[Figures]) {
    eprintln!("\nmemory decrease 512Mi → 128Mi under a 400 MiB random-read working set (latency-probe), cgroup v2");
    eprintln!(
        "  {:<8} {:>10} {:>10} | {:>10} {:>10} {:>11} {:>6} {:>8} {:>8} {:>8} {:>10} | {:>10} {:>6} {:>8} {:>8} | {:>8} {:>4} | outcome",
        "way",
        "p50 before",
        "p99 before",
        "p50 during",
        "p99 during",
        "max during",
        "slow",
        "mem",
        "io",
        "stall",
        "refaulted",
        "p99 after",
        "slow",
        "mem",
        "io",
        "time",
        "OOM"
    );
    eprintln!("  (slow: reads slower than 2× the undisturbed p99; mem / io: memory.pressure / io.pressure some over wall time; stall: the higher of the two, what pacing holds under max_stall; refaulted: memory.stat workingset_refault_* during; after: the 5 s after the decrease ended)");
    for f in all {
        eprintln!(
            "  {:<8} {:>10} {:>10} | {:>10} {:>10} {:>11} {:>6} {:>8} {:>8} {:>8} {:>10} | {:>10} {:>6} {:>8} {:>8} | {:>6.1} s {:>4} | {}",
            f.name,
            us(f.before.p50()),
            us(f.before.p99()),
            us(f.during.p50()),
            us(f.during.p99()),
            us(f.during.max),
            pct(slow(f, &f.during)),
            pct(f.stall_during),
            pct(f.io_during),
            pct(f.paced_stall()),
            mib(f.refaulted),
            us(f.after.p99()),
            pct(slow(f, &f.after)),
            pct(f.stall_after),
            pct(f.io_after),
            f.took.as_secs_f64(),
            f.oom_kills,
            f.outcome
        );
    }
}

/// cgroup v1 has no `memory.pressure` and no reclaim but a limit write: nothing to pace by, and
/// no background reclaim. The page cache goes inside the update (the default `inline_max`), at
/// kubelet's first try or a later one. The side by side needs v2: the VM tier runs it
/// (`cargo xtask vm-test --kernel 6.12 --suite reclaim_pacing`).
async fn inline_on_v1(ctrd: &Containerd) {
    eprintln!(
        "!!! cgroup v1: no memory.pressure, so no paced reclaim to measure here; checking that the \
         decrease goes through inside kubelet's tries. The side by side runs in the VM tier (cgroup v2)"
    );
    let _plugin = PluginProcess::start_ready(ctrd, "nri-resize", None).await;
    let script = probe::command("/tmp/probe.data", 400, 100, "/tmp/probe.log");
    let (pod, id) = ctrd.loaded_pod("v1", &[], &script, 390 * MIB).await;
    let syncs = ctrd
        .kubelet_resize_retrying(
            KubeletVersion::V1_33,
            &pod,
            &id,
            &Resources::limits(100_000, 128 * MIB),
            Duration::from_secs(2),
            15,
        )
        .await;
    assert!(
        syncs.last().is_some_and(|s| s.container.applied()),
        "applied at one of kubelet's tries: {syncs:?}"
    );
    assert_eq!(ctrd.container_memory_limit(&id), 128 * MIB);
    let events = ctrd.read_container_cgroup(&id, "memory.oom_control");
    assert_eq!(
        nri_resize::observer::parse::oom_kill_count(&events),
        Some(0),
        "{events}"
    );
    assert!(!probe_windows(ctrd, &id).is_empty(), "the probe reports");
}

/// One row of `cargo xtask bench`'s table: ours = paced, baseline = the direct write.
fn bench_row(direct: &Figures, unpaced: &Figures, paced: &Figures, stall_met: bool, p99_met: bool) {
    let during = |f: &Figures| {
        format!(
            "stall {} (memory {}, io {}), p99 {} (undisturbed {}), {} of reads over 2× that, {} refaulted, {:.1} s, {} OOM kill(s)",
            pct(f.paced_stall()),
            pct(f.stall_during),
            pct(f.io_during),
            us(f.during.p99()),
            us(f.before.p99()),
            pct(slow(f, &f.during)),
            mib(f.refaulted),
            f.took.as_secs_f64(),
            f.oom_kills
        )
    };
    let ratio = (direct.paced_stall() > 0.0).then(|| paced.paced_stall() / direct.paced_stall());
    let verdict = nri_resize::bench_table::verdict;
    nri_resize::bench_table::row(
        &format!(
            "memory decrease 512Mi → 128Mi of a container reading a 400 MiB file at random (latency-probe), cgroup v2, kernel {} (VM tier): stall share (the higher of memory and I/O pressure; ratio) and read p99 while decreasing",
            std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()
        ),
        &format!("direct memory.max write (runtime alone): {}", during(direct)),
        &format!(
            "paced staged reclaim: {}, {}. Unpaced: {}, {}",
            during(paced),
            paced.outcome,
            during(unpaced),
            unpaced.outcome
        ),
        ratio,
        &format!(
            "paced stall (memory or I/O) ≤ {}: {}; p99 ≤ 2× undisturbed: {}; 0 OOM kills: {}",
            pct(CEILING),
            verdict(stall_met),
            verdict(p99_met),
            verdict(paced.oom_kills == 0)
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paced_reclaim_side_by_side_containerd_2() {
    let ctrd = Containerd::start(ContainerdVersion::V2, ContainerdOptions::default()).await;
    let config = |max_stall: &str| {
        format!("[memory_decrease]\ninline_max = 0\ntimeout = \"{TIMEOUT_MS}ms\"\n{max_stall}")
    };
    if ctrd.cgroups().mode() == nri_resize_tests::CgroupMode::V1 {
        Box::pin(inline_on_v1(&ctrd)).await;
        return;
    }
    let direct = decrease(&ctrd, None, "direct").await;
    let plugin =
        PluginProcess::start_ready(&ctrd, "nri-resize", Some(&config("max_stall = 1.0\n"))).await;
    let unpaced = decrease(&ctrd, Some(&plugin), "unpaced").await;
    drop(plugin);
    let plugin = PluginProcess::start_ready(&ctrd, "nri-resize", Some(&config(""))).await;
    let paced = decrease(&ctrd, Some(&plugin), "paced").await;
    drop(plugin);
    let all = [direct, unpaced, paced];
    print_table(&all);
    let [direct, unpaced, paced] = &all;
    let stall_met = paced.paced_stall() <= CEILING;
    let p99_met = paced.during.p99() <= paced.before.p99() * 2;
    bench_row(direct, unpaced, paced, stall_met, p99_met);

    for f in [unpaced, paced] {
        assert_eq!(f.oom_kills, 0, "{}: never an OOM kill", f.name);
        assert!(
            f.outcome.starts_with("converged") || f.outcome.starts_with("Some(Deferred)"),
            "{}: a decrease ends by converging or by its reclaim's timeout: {}",
            f.name,
            f.outcome
        );
    }
    // The contract for pacing: a paced reclaim over the ceiling is held back, never
    // given up; when it ends at its timeout (Deferred), the reason names the stall. It may still
    // converge (pacing alone never ends a decrease).
    if paced.outcome.starts_with("Some(Deferred)") {
        assert!(
            paced.outcome.contains("paced by the workload's stall")
                || paced.paced_stall() <= CEILING,
            "paced: stall {} (memory {}, io {}) and the end does not name the stall: {}",
            pct(paced.paced_stall()),
            pct(paced.stall_during),
            pct(paced.io_during),
            paced.outcome
        );
    }
    // The target, met on 6.1 and 6.12 since pacing holds on the higher of memory and
    // I/O stall from half the ceiling (see the README): the paced stall during the decrease is
    // under the ceiling. The direct write goes over it.
    assert!(
        stall_met,
        "paced: stall {} (memory {}, io {}) during the decrease, over the ceiling {}: {}",
        pct(paced.paced_stall()),
        pct(paced.stall_during),
        pct(paced.io_during),
        pct(CEILING),
        paced.outcome
    );
    // Reported, not asserted: whether the limit kept at the timeout leaves room for the whole
    // 400 MiB set (the plugin keeps room for the usage it first held at, which on 6.12 can be a
    // little inside the set already: 398.5Mi kept in one run), and the stall in the 5 s after.
    let kept = kept_mib(&paced.outcome);
    eprintln!(
        "paced: kept {kept:?} MiB for a 400 MiB working set; stall in the 5 s after {} (memory {}, io {})",
        pct(paced.stall_after.max(paced.io_after)),
        pct(paced.stall_after),
        pct(paced.io_after)
    );
    if kept.is_some_and(|k| k < 400.0) {
        eprintln!(
            "!!! paced: the kept limit is under the 400 MiB working set: {}",
            paced.outcome
        );
    }
    if !stall_met {
        eprintln!(
            "!!! paced: stall {} (memory {}, io {}) during the decrease, over the ceiling {} (the direct write's: {}); {}",
            pct(paced.paced_stall()),
            pct(paced.stall_during),
            pct(paced.io_during),
            pct(CEILING),
            pct(direct.paced_stall()),
            paced.outcome
        );
    }
    // Not asserted: the p99 within 2× of undisturbed. A uniformly hot 400 MiB set that
    // must end under 128 MiB loses most of its pages whichever way; once more than 1 % of the
    // reads go to disk the p99 is a disk read (measured: every way, ~50× undisturbed; see the
    // README). The table and the benchmark row say met / NOT met, with the figures.
    if !p99_met {
        eprintln!(
            "!!! paced: p99 {} during the decrease vs {} undisturbed: the 2× target is NOT met ({} of reads slower than 2×)",
            us(paced.during.p99()),
            us(paced.before.p99()),
            pct(slow(paced, &paced.during))
        );
    }
}

#[test]
fn the_kept_limit_reads_from_a_deferred_reason() {
    assert_eq!(
        kept_mib("Deferred: ...; keeping 398.5Mi; paced by"),
        Some(398.5)
    );
    assert_eq!(
        kept_mib("Deferred: ...; keeping 1Gi; paced by"),
        Some(1024.0)
    );
    assert_eq!(kept_mib("converged (limit 128 MiB)"), None);
}
