//! Observer overhead, side by side in one run (needs root, kernel BTF and the eBPF object:
//! `cargo xtask build-ebpf` first). Run: `cargo bench -p nri-resize --bench observer`.
//!
//! 1. `sched_switch`: a context-switch-heavy workload (two threads pinned to one CPU ping-ponging
//!    a byte over a socket pair: exactly two switches per round trip), run interleaved
//!    (`ROUNDS` rounds, medians reported) with:
//!    - no program attached;
//!    - `noop`: an empty `tp_btf/sched_switch` program — what the tracepoint's BPF dispatch
//!      (the `bpf_trace_run` trampoline) costs by itself, the floor under any program;
//!    - `current`: the observer's `sched_switch` program as built now;
//!    - `baseline` (only when `NRI_RESIZE_BENCH_BASELINE_OBJ` names an older object, e.g. one
//!      built from the previous commit): the same, from that object.
//!
//!    Two per-event numbers per program: wall clock, `(t_with − t_without) / switches` (includes
//!    the dispatch, and the noise of the machine), and the kernel's own BPF statistics
//!    (`BPF_ENABLE_STATS`, the same as `sysctl kernel.bpf_stats_enabled=1`, on only for those
//!    runs and released after): `run_time_ns / run_cnt`, the program body alone. Target ≤ 50 ns.
//! 2. `reader`: one full read of 500 cgroups of our own (created under
//!    `/sys/fs/cgroup/{cpu,memory}/nri-resize-bench-<pid>/` on v1, or the unified root on v2, and
//!    removed at the end): eBPF strategies as configured by default, eBPF as the reader worked
//!    before (`kernel_oom_kill` file opened on every read), and polling with and without kept
//!    file descriptors. Reported as time per full read (mean over 60 reads, i.e. two
//!    cross-check periods) and % of one core at the default 1 s interval. Target < 0.5 %.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aya::programs::BtfTracePoint;
use criterion::{criterion_group, criterion_main, Criterion};
use nri_resize::observer::{
    CgroupLayout, ObjectSource, ObservedCgroup, Observer, ObserverSettings, ThrottleStrategy,
};
use nri_resize_ebpf_common::names;

const CGROUPS: usize = 500;
/// The fair baseline of the reader row: polling with its files kept open.
const POLLING_KEPT: &str = "polling, fds kept";
const ROUND_TRIPS: u64 = 100_000;
const ROUNDS: usize = 7;

/// Pins the calling thread to `cpu`.
#[expect(
    unsafe_code,
    reason = "sched_setaffinity has no safe wrapper in the crates we use; the set is a local value"
)]
fn pin_to(cpu: usize) {
    // SAFETY: `set` is a plain bitmask owned by this frame; the kernel only reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set)
    };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
}

#[expect(unsafe_code, reason = "sched_setaffinity, as in pin_to")]
fn unpin() {
    // SAFETY: as in `pin_to`.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set)
    };
    assert_eq!(
        rc,
        0,
        "sched_setaffinity: {}",
        std::io::Error::last_os_error()
    );
}

/// `round_trips` ping-pongs between two threads on CPU 0: 2 context switches each.
fn ping_pong(round_trips: u64) -> Duration {
    let (mut a, mut b) = UnixStream::pair().expect("socketpair");
    let peer = std::thread::spawn(move || {
        pin_to(0);
        let mut byte = [0u8];
        for _ in 0..round_trips {
            b.read_exact(&mut byte).expect("peer read");
            b.write_all(&byte).expect("peer write");
        }
    });
    pin_to(0);
    let mut byte = [1u8];
    let started = Instant::now();
    for _ in 0..round_trips {
        a.write_all(&byte).expect("write");
        a.read_exact(&mut byte).expect("read");
    }
    let elapsed = started.elapsed();
    peer.join().expect("peer thread");
    unpin();
    elapsed
}

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the observer benchmark needs root (eBPF, cgroups)"
    );
}

/// The observer with only the throttling program (`sched_switch`) attached, from `object`:
/// forced, as no kernel gets it by default (it runs on every context switch).
fn throttle_observer(object: ObjectSource) -> Observer {
    require_root();
    let mut settings = ObserverSettings::host();
    settings.object = object;
    settings.hotplug = false;
    settings.force_throttle = Some(ThrottleStrategy::TpBtfSchedSwitch);
    let observer = Observer::start(&settings).expect("start the observer");
    assert!(
        !observer.fallbacks().iter().any(|f| f.program == "object"),
        "the eBPF object did not load: {:?} (run `cargo xtask build-ebpf`)",
        observer.fallbacks()
    );
    assert_eq!(
        observer.strategies().throttle,
        ThrottleStrategy::TpBtfSchedSwitch,
        "the sched_switch program is not attached: {:?}",
        observer.fallbacks()
    );
    observer
}

/// The object `plugin/build.rs` embeds (same search order).
fn object_path() -> PathBuf {
    if let Some(p) = std::env::var_os("NRI_RESIZE_EBPF_OBJ") {
        return p.into();
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ebpf/target/bpfel-unknown-none");
    ["release", "debug"]
        .iter()
        .map(|p| out.join(p).join("nri-resize-ebpf"))
        .find(|p| p.is_file())
        .expect("no eBPF object: run `cargo xtask build-ebpf`")
}

/// The empty `noop_switch` program attached to `tp_btf/sched_switch`; detached on drop.
struct NoopProbe {
    ebpf: aya::Ebpf,
}

impl NoopProbe {
    fn attach() -> Self {
        require_root();
        let bytes = std::fs::read(object_path()).expect("read the eBPF object");
        let btf = aya::Btf::from_sys_fs().expect("kernel BTF");
        let mut ebpf = aya::EbpfLoader::new()
            .btf(Some(&btf))
            // A small pid array: this object only serves the empty program.
            .map_max_entries(names::THROTTLE_PENDING_MAP, 1)
            .load(&bytes)
            .expect("load the eBPF object");
        let p: &mut BtfTracePoint = ebpf
            .program_mut(names::PROG_NOOP_SWITCH)
            .expect("noop_switch in the object (rebuild it: `cargo xtask build-ebpf`)")
            .try_into()
            .expect("a tp_btf program");
        p.load("sched_switch", &btf).expect("load noop_switch");
        p.attach().expect("attach noop_switch");
        Self { ebpf }
    }

    fn stats(&self) -> (u64, u64) {
        let info = self
            .ebpf
            .program(names::PROG_NOOP_SWITCH)
            .expect("program")
            .info()
            .expect("program info");
        let ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
        (info.run_count(), ns)
    }
}

/// One program under test, attached for the duration of a run.
#[derive(Clone, Debug)]
enum Probe {
    None,
    Noop,
    Observer {
        label: &'static str,
        object: ObjectSource,
    },
}

enum Attached {
    None,
    Noop(NoopProbe),
    Observer(Box<Observer>),
}

impl Probe {
    fn label(&self) -> &'static str {
        match self {
            Self::None => "no program",
            Self::Noop => "noop (dispatch floor)",
            Self::Observer { label, .. } => label,
        }
    }

    fn attach(&self) -> Attached {
        match self {
            Self::None => Attached::None,
            Self::Noop => Attached::Noop(NoopProbe::attach()),
            Self::Observer { object, .. } => {
                Attached::Observer(Box::new(throttle_observer(object.clone())))
            }
        }
    }
}

impl Attached {
    /// `(run_cnt, run_time_ns)` of the attached `sched_switch` program.
    fn stats(&self) -> Option<(u64, u64)> {
        match self {
            Self::None => None,
            Self::Noop(p) => Some(p.stats()),
            Self::Observer(o) => o
                .program_stats()
                .into_iter()
                .find(|s| s.name == names::PROG_SCHED_SWITCH)
                .map(|s| (s.run_count, s.run_time_ns)),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Observer(o) => o
                .program_stats()
                .into_iter()
                .find(|s| s.name == names::PROG_SCHED_SWITCH)
                .map(|s| {
                    format!(
                        "{} instructions after verification ({} verified), {} B JITed",
                        s.translated_instructions,
                        s.verified_instructions.unwrap_or(0),
                        s.jited_bytes
                    )
                })
                .unwrap_or_default(),
            _ => String::new(),
        }
    }
}

#[expect(clippy::cast_precision_loss, reason = "nanosecond ratios for display")]
fn per_event(total_ns: u128, events: u64) -> f64 {
    total_ns as f64 / events as f64
}

fn median<T: Copy + PartialOrd>(v: &mut [T]) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
    v[v.len() / 2]
}

fn probes() -> Vec<Probe> {
    let mut probes = vec![
        Probe::None,
        Probe::Noop,
        Probe::Observer {
            label: "sched_switch (current)",
            object: ObjectSource::Embedded,
        },
    ];
    if let Some(path) = std::env::var_os("NRI_RESIZE_BENCH_BASELINE_OBJ") {
        probes.push(Probe::Observer {
            label: "sched_switch (baseline object)",
            object: ObjectSource::File(path.into()),
        });
    }
    probes
}

fn sched_switch(c: &mut Criterion) {
    let probes = probes();
    let switches = 2 * ROUND_TRIPS;

    let mut g = c.benchmark_group("sched_switch");
    g.sample_size(10).measurement_time(Duration::from_secs(2));
    for probe in &probes {
        let attached = probe.attach();
        g.bench_function(probe.label(), |b| b.iter_custom(ping_pong));
        drop(attached);
    }
    g.finish();

    // Wall clock, interleaved so that drift hits every mode alike; BPF statistics off.
    let mut wall: Vec<Vec<Duration>> = vec![Vec::new(); probes.len()];
    for _ in 0..ROUNDS {
        for (i, probe) in probes.iter().enumerate() {
            let attached = probe.attach();
            wall[i].push(ping_pong(ROUND_TRIPS));
            drop(attached);
        }
    }
    // The kernel's per-program statistics, on only for these runs.
    let mut stats: Vec<Vec<f64>> = vec![Vec::new(); probes.len()];
    let mut described = vec![String::new(); probes.len()];
    for _ in 0..ROUNDS {
        for (i, probe) in probes.iter().enumerate() {
            let attached = probe.attach();
            let Some(before) = attached.stats() else {
                continue;
            };
            let enabled =
                aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("enable BPF stats");
            let start = attached.stats().unwrap_or(before);
            ping_pong(ROUND_TRIPS);
            let end = attached.stats().unwrap_or(start);
            drop(enabled);
            if end.0 > start.0 {
                stats[i].push(per_event(u128::from(end.1 - start.1), end.0 - start.0));
            }
            described[i] = attached.describe();
            drop(attached);
        }
    }

    let base = median(&mut wall[0]);
    eprintln!(
        "\nsched_switch: {switches} switches per run, medians of {ROUNDS} interleaved runs; \
         no program: {base:?} = {:.0} ns per switch",
        per_event(base.as_nanos(), switches)
    );
    eprintln!(
        "  {:<32} {:>14} {:>26} {:>10}",
        "program", "wall clock", "run_time_ns / run_cnt", "target"
    );
    // (label, wall-clock ns per switch above no program, BPF run time per event)
    let mut measured: Vec<(&'static str, f64, Option<f64>)> = Vec::new();
    for (i, probe) in probes.iter().enumerate().skip(1) {
        let w = median(&mut wall[i]);
        #[expect(clippy::cast_precision_loss, reason = "nanoseconds for display")]
        let delta = (w.as_nanos() as f64 - base.as_nanos() as f64) / switches as f64;
        let run_ns = (!stats[i].is_empty()).then(|| median(&mut stats[i]));
        let run = run_ns.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.1} ns"));
        eprintln!(
            "  {:<32} {:>11.1} ns {:>26} {:>10}   {}",
            probe.label(),
            delta,
            run,
            "≤ 50 ns",
            described[i]
        );
        measured.push((probe.label(), delta, run_ns));
    }
    // The table: each program's BPF run time above the empty program's (the tracepoint's own
    // dispatch is the floor any program pays), side by side from the same runs.
    if let Some(&(floor_label, floor_wall, Some(floor_run))) = measured.first() {
        for &(label, wall_delta, run) in measured.iter().skip(1) {
            let Some(run) = run else { continue };
            let above = run - floor_run;
            nri_resize::bench_table::row(
                &format!("eBPF cost per context switch: {label}"),
                &format!(
                    "empty program ({floor_label}): {floor_run:.1} ns BPF run time, +{floor_wall:.0} ns wall clock"
                ),
                &format!(
                    "{run:.1} ns BPF run time ({above:+.1} ns above it), +{wall_delta:.0} ns wall clock"
                ),
                Some(run / floor_run.max(1e-9)),
                &format!(
                    "≤ 50 ns above the empty program: {}",
                    nri_resize::bench_table::verdict(above <= 50.0)
                ),
            );
        }
    }
}

/// 500 empty cgroups of our own, removed on drop.
struct BenchCgroups {
    roots: Vec<PathBuf>,
    names: Vec<PathBuf>,
}

impl BenchCgroups {
    fn create(layout: &CgroupLayout) -> Self {
        let top = format!("nri-resize-bench-{}", std::process::id());
        let roots: Vec<PathBuf> = match layout {
            CgroupLayout::V1 { cpu, memory } => vec![cpu.join(&top), memory.join(&top)],
            CgroupLayout::V2 { root } => vec![root.join(&top)],
        };
        let mut made = BenchCgroups {
            roots: Vec::new(),
            names: Vec::new(),
        };
        for r in &roots {
            std::fs::create_dir(r).unwrap_or_else(|e| panic!("mkdir {}: {e}", r.display()));
            made.roots.push(r.clone());
        }
        for i in 0..CGROUPS {
            let name = PathBuf::from(format!("/{top}/c{i}"));
            for r in &roots {
                let dir = r.join(format!("c{i}"));
                std::fs::create_dir(&dir)
                    .unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            }
            made.names.push(name);
        }
        made
    }
}

impl Drop for BenchCgroups {
    fn drop(&mut self) {
        for r in &self.roots {
            for i in 0..CGROUPS {
                let _ = std::fs::remove_dir(r.join(format!("c{i}")));
            }
            if let Err(e) = std::fs::remove_dir(r) {
                eprintln!("could not remove {}: {e}", r.display());
            }
        }
    }
}

fn read_all(observer: &mut Observer, cgroups: &[ObservedCgroup]) {
    for c in cgroups {
        std::hint::black_box(observer.read(c).expect("read"));
    }
}

struct ReaderMode {
    label: &'static str,
    observer: Observer,
    cgroups: Vec<ObservedCgroup>,
}

fn reader(c: &mut Criterion) {
    require_root();
    let layout = CgroupLayout::detect(Path::new("/sys/fs/cgroup"));
    let tree = BenchCgroups::create(&layout);
    let ebpf = |every: u32, max_open: Option<usize>| {
        let mut settings = ObserverSettings::host();
        settings.oom_cross_check_every = every;
        settings.max_open_files = max_open;
        let o = Observer::start(&settings).expect("start");
        assert!(
            !o.fallbacks().iter().any(|f| f.program == "object"),
            "the eBPF object did not load: {:?}",
            o.fallbacks()
        );
        o
    };
    let polling = |max_open: Option<usize>| {
        let mut settings = ObserverSettings::polling(layout.clone());
        settings.max_open_files = max_open;
        Observer::start(&settings).expect("start")
    };
    let observers = [
        (
            "eBPF, defaults (cross-check every 30th read, fds kept)",
            ebpf(30, None),
        ),
        (
            "eBPF, as before (oom file opened every read)",
            ebpf(1, Some(0)),
        ),
        (POLLING_KEPT, polling(None)),
        (
            "polling, as before (files opened every read)",
            polling(Some(0)),
        ),
    ];
    let mut modes: Vec<ReaderMode> = observers
        .into_iter()
        .map(|(label, observer)| ReaderMode {
            cgroups: tree
                .names
                .iter()
                .map(|n| observer.cgroup(n).expect("resolve"))
                .collect(),
            label,
            observer,
        })
        .collect();
    // Warm up: first reads open the files and do the first cross-check.
    for m in &mut modes {
        read_all(&mut m.observer, &m.cgroups);
    }

    let mut g = c.benchmark_group("reader_500_cgroups");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    for m in &mut modes {
        g.bench_function(m.label, |b| {
            b.iter(|| read_all(&mut m.observer, &m.cgroups));
        });
    }
    g.finish();

    // Interleaved rounds of 60 full reads each (two cross-check periods), medians.
    let reads = 60_u32;
    let mut per_read: Vec<Vec<Duration>> = vec![Vec::new(); modes.len()];
    let mut slowest: Vec<Duration> = vec![Duration::ZERO; modes.len()];
    for _ in 0..5 {
        for (i, m) in modes.iter_mut().enumerate() {
            let started = Instant::now();
            for _ in 0..reads {
                let one = Instant::now();
                read_all(&mut m.observer, &m.cgroups);
                slowest[i] = slowest[i].max(one.elapsed());
            }
            per_read[i].push(started.elapsed() / reads);
        }
    }
    let mut shares: Vec<(&str, f64)> = Vec::new();
    eprintln!("\nreader: one full read of {CGROUPS} cgroups (mean of {reads} reads, median of 5 interleaved rounds)");
    for (i, m) in modes.iter().enumerate() {
        let t = median(&mut per_read[i]);
        eprintln!(
            "  {:<58} {:>10.3?} per read (slowest {:>9.3?}) → {:.3} % of one core at a 1 s interval (target < 0.5 %); {} fds kept",
            m.label,
            t,
            slowest[i],
            t.as_secs_f64() * 100.0,
            m.observer.open_files()
        );
        shares.push((m.label, t.as_secs_f64() * 100.0));
    }
    report_reader(&shares);
    drop(modes);
    drop(tree);
}

/// The reader row of the table: the daemon's default (first mode) against the strongest polling
/// mode (fds kept open), not the weakest (files reopened on every read).
fn report_reader(shares: &[(&str, f64)]) {
    let baseline = shares.iter().find(|(label, _)| *label == POLLING_KEPT);
    if let (Some(&(ours_label, ours)), Some(&(base_label, base))) = (shares.first(), baseline) {
        let weakest = shares.last().map_or_else(String::new, |(l, v)| {
            format!(" (for reference, {l}: {v:.3} %)")
        });
        nri_resize::bench_table::row(
            &format!("observer reader CPU, {CGROUPS} cgroups, 1 s interval"),
            &format!("{base_label}: {base:.3} % of one core"),
            &format!("{ours_label}: {ours:.3} % of one core{weakest}"),
            Some(ours / base.max(1e-9)),
            &format!("< 0.5 %: {}", nri_resize::bench_table::verdict(ours < 0.5)),
        );
    }
}

criterion_group!(benches, sched_switch, reader);
criterion_main!(benches);
