//! CRI `CreateContainer` and `UpdateContainerResources` latency against real containerd, side by
//! side in one run: no plugin, an independent do-nothing plugin (containerd's own NRI path: the
//! tests' Go plugin on NRI's Go stub, `tests/go-plugin -mode noop`, subscribed to the same events
//! as nri-resize, none of nri-resize's code), nri-resize with its observer polling (`--no-ebpf`), and
//! nri-resize as deployed (JSON logs at `info`, as the `DaemonSet` runs it). Target: nri-resize
//! adds at most 1 ms at p50 and 2 ms at p99 over containerd without a plugin.
//!
//! The sides alternate in rounds, each round running every side once, back to back (nri-resize
//! attached, the do-nothing plugin attached, no plugin, nri-resize `--no-ebpf`, ...). The order
//! cycles through four that keep nri-resize and the do-nothing plugin next to each other, each
//! first in half the rounds, so drift in the machine's load hits both alike. nri-resize is
//! measured once ready (registered, synchronized, its observer loaded), the do-nothing plugin
//! once the runtime synchronized it. Each side makes `NRI_RESIZE_BENCH_ITERS` calls of each kind
//! (default 1200: a p99 is then the 12th slowest call) over `NRI_RESIZE_BENCH_ROUNDS` rounds
//! (default 30); the percentiles are over all of a side's calls, with their spread over the
//! rounds (the lowest and highest round's value). In each round a side's creates (each removed
//! at once) come first, then, after a 300 ms pause, its updates: an update is not timed while
//! the aftermath of a removal (containerd's and the plugin's) still runs. Each attached plugin's
//! CPU time (every thread, from `/proc/<pid>/task/*/schedstat`) is read around each phase: its
//! cost per call, which unlike a latency does not move with what else the machine does.
//!
//! Verdict: met when nri-resize adds at most the target over no plugin, and only then; the ratio
//! column is at p50 (p99's beside it in the text). A second row per kind of call reports
//! "nri-resize − containerd's NRI floor" (the Go do-nothing plugin): nri-resize's own share, at
//! most +0.2 ms at p50 (issue 37). A side's p50 moves by milliseconds between rounds on a small
//! machine (the load of the host under it), far more than that target, so this row looks at
//! pairs: in each round, nri-resize's p50 minus the do-nothing plugin's p50, measured
//! seconds apart. The row reports the median of those per-round differences with its 95 %
//! distribution-free confidence interval (order statistics of the differences, `MedianInterval`)
//! and says whether the median is at most +0.2 ms; the interval is about ±0.4 ms wide here,
//! wider than the target, so the verdict on it is `cri_floor`'s, which pairs calls
//! milliseconds apart.
//!
//! `NRI_RESIZE_BENCH_SECOND_ARGS` replaces the second nri-resize side's `--no-ebpf` (to bisect
//! the eBPF share; empty: both sides the same daemon, an A/A run).
//!
//! Run: `cargo bench -p nri-resize-tests --bench cri_latency` (part of `cargo xtask bench`).

use std::time::{Duration, Instant};

use nri_resize_tests::{
    go_plugin_binary, handler_histograms, percentile, scrape_metrics, ContainerSpec, Containerd,
    ContainerdOptions, ContainerdVersion, GoPlugin, GoPluginMode, MedianInterval, PluginProcess,
    Pod, PodSpec, Resources,
};

const MIB: i64 = 1 << 20;
const PERCENTILES: [(f64, &str); 3] = [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")];
/// The target: added at p50, added at p99.
const TARGET: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(2));
/// The orders of the sides, one per round in turn: nri-resize and the do-nothing plugin always
/// next to each other, each first in two of the four, and every side in every position once.
const ORDERS: [[Side; 4]; 4] = [
    [Side::Ours, Side::Null, Side::Base, Side::NoEbpf],
    [Side::Null, Side::Ours, Side::NoEbpf, Side::Base],
    [Side::Base, Side::NoEbpf, Side::Ours, Side::Null],
    [Side::NoEbpf, Side::Base, Side::Null, Side::Ours],
];
/// The target over containerd's NRI floor (the Go do-nothing plugin), at p50: nri-resize's own
/// share of a call.
const FLOOR_TARGET: Duration = Duration::from_micros(200);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Ours,
    Base,
    Null,
    /// nri-resize with its observer polling (`--no-ebpf`): what the eBPF programs cost.
    NoEbpf,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Ours => "nri-resize",
            Side::Base => "no plugin",
            Side::Null => "Go do-nothing plugin",
            Side::NoEbpf => "nri-resize --no-ebpf",
        }
    }
}

/// One side's calls of one kind, per round.
#[derive(Default)]
struct Calls {
    rounds: Vec<Vec<Duration>>,
}

impl Calls {
    fn all(&self) -> Vec<Duration> {
        self.rounds.iter().flatten().copied().collect()
    }

    /// The percentile over every call, and its lowest and highest value over the rounds.
    fn at(&self, p: f64) -> (Duration, Duration, Duration) {
        let mut per_round: Vec<Duration> = self
            .rounds
            .iter()
            .map(|r| percentile(&mut r.clone(), p))
            .collect();
        per_round.sort_unstable();
        (
            percentile(&mut self.all(), p),
            per_round[0],
            per_round[per_round.len() - 1],
        )
    }

    fn len(&self) -> usize {
        self.rounds.iter().map(Vec::len).sum()
    }
}

/// Two sides' percentile compared round by round: the median of the per-round differences
/// (`a` − `b`, seconds) and its 95 % interval.
fn paired(a: &Calls, b: &Calls, p: f64) -> MedianInterval {
    let diffs: Vec<f64> = a
        .rounds
        .iter()
        .zip(&b.rounds)
        .map(|(x, y)| {
            percentile(&mut x.clone(), p).as_secs_f64()
                - percentile(&mut y.clone(), p).as_secs_f64()
        })
        .collect();
    MedianInterval::of(&diffs)
}

/// `-0.05 ms (95 % interval -0.31 – +0.20 ms, 20 rounds)`.
fn paired_text(m: &MedianInterval) -> String {
    let ms = |s: f64| format!("{:+.2}", s * 1e3);
    format!(
        "{} ms ({} {} – {} ms, {} rounds)",
        ms(m.median),
        if m.interval {
            "95 % interval"
        } else {
            "range, too few rounds for an interval:"
        },
        ms(m.lo),
        ms(m.hi),
        m.n
    )
}

#[derive(Default)]
struct SideCalls {
    create: Calls,
    update: Calls,
    create_cpu: CpuPerCall,
    update_cpu: CpuPerCall,
}

impl SideCalls {
    fn push(&mut self, m: Measured) {
        self.create.rounds.push(m.create);
        self.update.rounds.push(m.update);
        self.create_cpu.add(m.cpu.0);
        self.update_cpu.add(m.cpu.1);
    }
}

/// A plugin's CPU time per call, averaged over the rounds.
#[derive(Default, Clone, Copy)]
struct CpuPerCall {
    sum: Duration,
    rounds: u32,
}

impl CpuPerCall {
    fn add(&mut self, d: Option<Duration>) {
        if let Some(d) = d {
            self.sum += d;
            self.rounds += 1;
        }
    }

    fn text(self) -> String {
        if self.rounds == 0 {
            return "not measured".to_string();
        }
        format!("{:.3} ms", (self.sum / self.rounds).as_secs_f64() * 1e3)
    }
}

/// nri-resize's own time in its handlers (`nri_resize_nri_handler_duration_seconds`, from the
/// request decoded to the answer ready), summed over the rounds: event (`update_container`) →
/// (seconds, count).
#[derive(Default)]
struct HandlerTime(std::collections::BTreeMap<String, (f64, f64)>);

impl HandlerTime {
    fn add(&mut self, metrics: &str) {
        for (event, h) in handler_histograms(metrics) {
            let e = self.0.entry(event).or_default();
            e.0 += h.sum;
            e.1 += h.count;
        }
    }

    /// Mean time per call of `events` together (the NRI requests one CRI call makes), and each
    /// event's share: `0.28 ms per call (update_container 0.25 ms + post_update_container 0.03 ms)`.
    fn text(&self, events: &[&str]) -> String {
        let mut total = 0.0;
        let mut parts = Vec::new();
        for e in events {
            match self.0.get(*e) {
                Some((sum, count)) if *count > 0.0 => {
                    total += sum / count;
                    parts.push(format!("{e} {}", ms(Duration::from_secs_f64(sum / count))));
                }
                _ => return format!("{e} not in the plugin's /metrics"),
            }
        }
        format!(
            "{} per call ({})",
            ms(Duration::from_secs_f64(total)),
            parts.join(" + ")
        )
    }
}

/// CPU time of every thread of process `pid` so far (`/proc/<pid>/task/*/schedstat`: time on
/// a CPU, in ns). Unlike a latency, it does not move with what else the machine is doing.
fn cpu_time(pid: Option<u32>) -> Option<Duration> {
    let process = procfs::process::Process::new(i32::try_from(pid?).ok()?).ok()?;
    let ns: u64 = process
        .tasks()
        .ok()?
        .flatten()
        .filter_map(|t| t.schedstat().ok())
        .map(|s| s.sum_exec_runtime)
        .sum();
    Some(Duration::from_nanos(ns))
}

/// One side's calls in one round: the latencies, and the plugin's CPU time per call of each
/// kind (`None` without a plugin).
struct Measured {
    create: Vec<Duration>,
    update: Vec<Duration>,
    cpu: (Option<Duration>, Option<Duration>),
}

/// `iters` creates (each removed at once), then, after a pause that lets containerd's and the
/// plugin's work after the last removal settle, `iters` updates of one running container: an
/// update is timed without a create's aftermath overlapping it, on every side alike. `plugin`:
/// the attached plugin's pid, whose CPU time is read around each phase.
async fn measure(
    ctrd: &Containerd,
    pod: &Pod,
    iters: usize,
    tag: &str,
    plugin: Option<u32>,
) -> Measured {
    let (mut create, mut update) = (Vec::new(), Vec::new());
    let mut c = ContainerSpec::new(&format!("upd-{tag}"), &["sleep", "3600"]);
    c.resources = Resources::limits(50_000, 64 * MIB);
    let target = Box::pin(ctrd.create_container(pod, c))
        .await
        .expect("create update target");
    ctrd.start_container(&target)
        .await
        .expect("start update target");
    let t0 = Instant::now();
    let trace = std::env::var_os("NRI_RESIZE_BENCH_TRACE").is_some();
    let per_call = |before: Option<Duration>, calls: usize| {
        let after = cpu_time(plugin)?;
        Some(after.saturating_sub(before?) / u32::try_from(calls.max(1)).unwrap_or(u32::MAX))
    };
    let cpu0 = cpu_time(plugin);
    for i in 0..iters {
        let mut c = ContainerSpec::new(&format!("c-{tag}-{i}"), &["sleep", "3600"]);
        c.resources = Resources::limits(50_000, 64 * MIB);
        let t = Instant::now();
        let id = Box::pin(ctrd.create_container(pod, c))
            .await
            .expect("CreateContainer");
        create.push(t.elapsed());
        ctrd.remove_container(&id).await.expect("RemoveContainer");
    }
    // Creates and removes together: the plugin's share of the pair.
    let create_cpu = per_call(cpu0, iters);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu1 = cpu_time(plugin);
    for i in 0..iters {
        let quota = if i % 2 == 0 { 60_000 } else { 50_000 };
        let t = Instant::now();
        ctrd.update_container_resources(&target, &Resources::limits(quota, 64 * MIB))
            .await
            .expect("UpdateContainerResources");
        update.push(t.elapsed());
        if trace && t.elapsed() > Duration::from_millis(16) {
            eprintln!(
                "TRACE {tag} update {i} at {:.3}s took {}",
                t0.elapsed().as_secs_f64(),
                ms(t.elapsed())
            );
        }
    }
    let update_cpu = per_call(cpu1, iters);
    ctrd.stop_container(&target, 0).await.expect("stop");
    ctrd.remove_container(&target).await.expect("remove");
    Measured {
        create,
        update,
        cpu: (create_cpu, update_cpu),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// `+0.42 ms` / `-0.10 ms`.
fn delta(a: Duration, b: Duration) -> String {
    format!("{:+.2} ms", (a.as_secs_f64() - b.as_secs_f64()) * 1e3)
}

fn added(ours: Duration, base: Duration) -> Duration {
    ours.saturating_sub(base)
}

/// One kind of call on every side.
struct Kind<'a> {
    base: &'a Calls,
    null: &'a Calls,
    ours: &'a Calls,
    no_ebpf: &'a Calls,
    /// CPU time per call: (nri-resize, the do-nothing plugin).
    cpu: (CpuPerCall, CpuPerCall),
}

fn report(name: &str, k: &Kind<'_>, handler_text: &str) {
    let Kind {
        base,
        null,
        ours,
        no_ebpf,
        cpu,
    } = *k;
    println!(
        "{name} ({} calls per side)",
        ours.len().min(base.len()).min(null.len())
    );
    for (side, calls) in [
        (Side::Base, base),
        (Side::Null, null),
        (Side::NoEbpf, no_ebpf),
        (Side::Ours, ours),
    ] {
        let cols: Vec<String> = PERCENTILES
            .iter()
            .map(|(p, label)| {
                let (v, lo, hi) = calls.at(*p);
                format!("{label} {} ({}–{})", ms(v), ms(lo), ms(hi))
            })
            .collect();
        println!("  {:<21} {}", side.label(), cols.join("   "));
    }
    let line = |what: &str, a: &Calls, b: &Calls| {
        let cols: Vec<String> = PERCENTILES
            .iter()
            .map(|(p, label)| format!("{label} {}", delta(a.at(*p).0, b.at(*p).0)))
            .collect();
        println!("  {what:<38} {}", cols.join("   "));
    };
    line("nri-resize − no plugin (the target)", ours, base);
    line(
        "Go do-nothing − no plugin (containerd's NRI floor)",
        null,
        base,
    );
    let paired_line = |a: &Calls, b: &Calls| {
        println!(
            "  {:<38} p50 {}",
            "  the same, median of per-round p50s",
            paired_text(&paired(a, b, 0.5))
        );
    };
    line("nri-resize − Go do-nothing (ours)", ours, null);
    paired_line(ours, null);
    line("nri-resize − nri-resize --no-ebpf (eBPF)", ours, no_ebpf);
    paired_line(ours, no_ebpf);
    println!(
        "  {:<38} {handler_text}",
        "nri-resize's handlers (its own work)"
    );
    let cpu_text = format!(
        "{} per call (Go do-nothing plugin: {})",
        cpu.0.text(),
        cpu.1.text()
    );
    println!("  {:<38} {cpu_text}", "plugin CPU time, all threads");

    let (b50, b90, b99) = (base.at(0.5).0, base.at(0.9).0, base.at(0.99).0);
    let (o50, o90, o99) = (ours.at(0.5), ours.at(0.9).0, ours.at(0.99));
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    // The verdict is against the target alone: what nri-resize adds over no plugin.
    let met = added(o50.0, b50) <= TARGET.0 && added(o99.0, b99) <= TARGET.1;
    nri_resize::bench_table::row(
        &format!(
            "CRI latency: {name}, {} calls per side in {} alternating rounds",
            ours.len(),
            ours.rounds.len()
        ),
        &format!(
            "no plugin: {} p50 / {} p90 / {} p99",
            ms(b50),
            ms(b90),
            ms(b99),
        ),
        &format!(
            "{} p50 / {} p90 / {} p99 ({} p50, {} p99; ratio p99 {:.2}×; p99 over rounds {}–{}); its handlers: {handler_text}; its CPU time, all threads: {cpu_text}; its eBPF programs (vs --no-ebpf, median of per-round p50 differences): {}",
            ms(o50.0),
            ms(o90),
            ms(o99.0),
            delta(o50.0, b50),
            delta(o99.0, b99),
            ratio(o99.0, b99),
            ms(o99.1),
            ms(o99.2),
            paired_text(&paired(ours, no_ebpf, 0.5)),
        ),
        Some(ratio(o50.0, b50)),
        &format!(
            "nri-resize − no plugin ≤ +1 ms p50 and ≤ +2 ms p99: {} ({} p50, {} p99)",
            nri_resize::bench_table::verdict(met),
            delta(o50.0, b50),
            delta(o99.0, b99)
        ),
    );
    floor_row(name, k);
}

/// containerd's own NRI path, measured with an independent do-nothing plugin (NRI's Go stub,
/// none of nri-resize's code), and what nri-resize adds over it, judged on per-round pairs: its
/// own row.
fn floor_row(name: &str, k: &Kind<'_>) {
    let (base, null, ours) = (k.base, k.null, k.ours);
    let (b50, b99) = (base.at(0.5).0, base.at(0.99).0);
    let (n50, n99) = (null.at(0.5).0, null.at(0.99).0);
    let (o50, o99) = (ours.at(0.5).0, ours.at(0.99).0);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    let paired = paired(ours, null, 0.5);
    let target = FLOOR_TARGET.as_secs_f64();
    // Not judged here: rounds measured seconds apart leave an interval wider than the target;
    // `cri_floor` pairs calls milliseconds apart and gives the verdict.
    let verdict = if paired.median > target {
        "the median is above it"
    } else {
        "the median is at or below it"
    };
    nri_resize::bench_table::row(
        &format!("CRI latency: {name}: nri-resize − containerd's NRI floor"),
        &format!(
            "Go do-nothing plugin (NRI stub, same events): {} p50 / {} p99 ({} p50, {} p99 over no plugin); its CPU time, all threads: {}",
            ms(n50),
            ms(n99),
            delta(n50, b50),
            delta(n99, b99),
            k.cpu.1.text(),
        ),
        &format!(
            "nri-resize − that floor, p50 per round, median: {}; over all calls: {} p50, {} p99 (ratio p99 {:.2}×)",
            paired_text(&paired),
            delta(o50, n50),
            delta(o99, n99),
            ratio(o99, n99),
        ),
        Some(ratio(o50, n50)),
        &format!(
            "nri-resize − Go floor ≤ +{} ms p50 (issue 37): judged by `cri_floor` (pairs of calls, not rounds); here {verdict}, with an interval {}–{} ms wide",
            target * 1000.0,
            format_args!("{:+.2}", paired.lo * 1000.0),
            format_args!("{:+.2}", paired.hi * 1000.0),
        ),
    );
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let iters = env_usize("NRI_RESIZE_BENCH_ITERS", 1200);
    let rounds = env_usize("NRI_RESIZE_BENCH_ROUNDS", 30);
    let per_round = iters.div_ceil(rounds);
    // The second nri-resize side's arguments: `--no-ebpf` (the eBPF share). Another value is for
    // bisecting that share (`--observer-force-reclaim`, ...); an empty one makes both sides the
    // same daemon, an A/A run that shows what the order of the sides alone accounts for.
    let second_args =
        std::env::var("NRI_RESIZE_BENCH_SECOND_ARGS").unwrap_or_else(|_| "--no-ebpf".to_owned());
    if second_args != "--no-ebpf" {
        println!("the \"nri-resize --no-ebpf\" side runs with {second_args:?} instead (NRI_RESIZE_BENCH_SECOND_ARGS)");
    }
    // Built (or found in the cache) before anything is timed.
    let _ = go_plugin_binary();
    println!(
        "CRI latency, {} calls of each kind per side in {rounds} alternating rounds \
         (nri-resize and the Go do-nothing plugin side by side, no plugin, nri-resize --no-ebpf); \
         percentiles over all calls (lowest–highest round); target: nri-resize − no plugin ≤ 1 ms at p50 and ≤ 2 ms at p99",
        per_round * rounds
    );
    for version in ContainerdVersion::all() {
        let ctrd = Containerd::start(version, ContainerdOptions::default()).await;
        let mut spec = PodSpec::new("bench");
        spec.resources = Resources::limits(400_000, 2048 * MIB);
        let pod = Box::pin(ctrd.run_pod(spec)).await.expect("RunPodSandbox");
        // Warm-up: image unpack, shim start.
        drop(measure(&ctrd, &pod, 5, "warm", None).await);
        let (mut base, mut null, mut ours, mut no_ebpf) = (
            SideCalls::default(),
            SideCalls::default(),
            SideCalls::default(),
            SideCalls::default(),
        );
        let mut handlers = HandlerTime::default();
        for round in 0..rounds {
            // nri-resize next to the do-nothing plugin, each first in half the rounds, and
            // every side in every position once in four rounds.
            let order = ORDERS[round % ORDERS.len()];
            for side in order {
                let tag = format!("{}{round}", side.label().replace(' ', "-"));
                let out = match side {
                    Side::Base => measure(&ctrd, &pod, per_round, &tag, None).await,
                    Side::Null => {
                        // Measured once the runtime synchronized it.
                        let np = GoPlugin::start(
                            &ctrd,
                            &format!("nri-noop{round}"),
                            "50",
                            &GoPluginMode::Noop,
                        );
                        let out = measure(&ctrd, &pod, per_round, &tag, np.pid()).await;
                        drop(np);
                        out
                    }
                    Side::Ours | Side::NoEbpf => {
                        let extra: Vec<&str> = if side == Side::NoEbpf {
                            second_args.split_whitespace().collect()
                        } else {
                            Vec::new()
                        };
                        let mut plugin = PluginProcess::start_as_deployed(
                            &ctrd,
                            &format!("nri-resize-bench{round}"),
                            &extra,
                        );
                        plugin.wait_ready(Duration::from_secs(15)).await;
                        let out = measure(&ctrd, &pod, per_round, &tag, plugin.pid()).await;
                        if side == Side::Ours {
                            handlers.add(&scrape_metrics(&plugin.api()).await);
                        }
                        plugin.stop();
                        out
                    }
                };
                let into = match side {
                    Side::Base => &mut base,
                    Side::Null => &mut null,
                    Side::Ours => &mut ours,
                    Side::NoEbpf => &mut no_ebpf,
                };
                into.push(out);
            }
        }
        report(
            &format!("{version} CreateContainer"),
            &Kind {
                base: &base.create,
                null: &null.create,
                ours: &ours.create,
                no_ebpf: &no_ebpf.create,
                cpu: (ours.create_cpu, null.create_cpu),
            },
            &handlers.text(&["create_container", "post_create_container"]),
        );
        report(
            &format!("{version} UpdateContainerResources"),
            &Kind {
                base: &base.update,
                null: &null.update,
                ours: &ours.update,
                no_ebpf: &no_ebpf.update,
                cpu: (ours.update_cpu, null.update_cpu),
            },
            &handlers.text(&["update_container", "post_update_container"]),
        );
        ctrd.stop_pod(&pod).await.expect("stop pod");
        ctrd.remove_pod(&pod).await.expect("remove pod");
    }
}
