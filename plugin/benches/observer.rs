//! Observer overhead, side by side in one run (needs root, kernel BTF and the eBPF object:
//! `cargo xtask build-ebpf` first). Run: `cargo bench -p nri-resize --bench observer`.
//!
//! 1. `sched_switch`: a context-switch-heavy workload (two threads pinned to one CPU ping-ponging
//!    a byte over a pair of pipes: exactly two switches per round trip) without and with the
//!    observer's `tp_btf/sched_switch` program attached. Per-event overhead =
//!    `(t_with - t_without) / switches`. Target ≤ 50 ns.
//! 2. `reader`: one full read of 500 cgroups of our own (created under
//!    `/sys/fs/cgroup/{cpu,memory}/nri-resize-bench-<pid>/` on v1, or the unified root on v2, and
//!    removed at the end), with eBPF strategies and with polling only. Reported as time per full
//!    read and % of one core at the default 1 s interval. Target < 0.5 %.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use nri_resize::observer::{
    CgroupLayout, ObservedCgroup, Observer, ObserverSettings, ThrottleStrategy,
};

const CGROUPS: usize = 500;

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
    elapsed
}

fn host_observer(throttle_only: bool) -> Observer {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the observer benchmark needs root (eBPF, cgroups)"
    );
    let mut settings = ObserverSettings::host();
    settings.hotplug = !throttle_only;
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

const ROUND_TRIPS: u64 = 200_000;

fn sched_switch(c: &mut Criterion) {
    let mut g = c.benchmark_group("sched_switch");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    g.bench_function("ping_pong_without_observer", |b| b.iter_custom(ping_pong));
    let observer = host_observer(true);
    g.bench_function("ping_pong_with_sched_switch", |b| b.iter_custom(ping_pong));
    g.finish();

    // The derived number, measured interleaved so drift hits both sides alike.
    let mut with = Vec::new();
    let mut without = Vec::new();
    drop(observer);
    for _ in 0..5 {
        without.push(ping_pong(ROUND_TRIPS));
        let observer = host_observer(true);
        with.push(ping_pong(ROUND_TRIPS));
        drop(observer);
    }
    with.sort();
    without.sort();
    let (w, wo) = (with[2], without[2]);
    let switches = 2 * ROUND_TRIPS;
    #[expect(clippy::cast_precision_loss, reason = "a ratio for display")]
    let per_event_ns = (w.as_nanos() as f64 - wo.as_nanos() as f64) / switches as f64;
    eprintln!(
        "sched_switch: {switches} switches: without {wo:?}, with {w:?} (medians of 5) → {per_event_ns:.1} ns per switch (target ≤ 50 ns)"
    );
    // The reader bench that follows should not be pinned.
    unpin();
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

fn reader(c: &mut Criterion) {
    let layout = CgroupLayout::detect(Path::new("/sys/fs/cgroup"));
    let tree = BenchCgroups::create(&layout);
    let mut g = c.benchmark_group("reader_500_cgroups");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    let mut ebpf = host_observer(false);
    let mut polling = Observer::start(&ObserverSettings::polling(layout.clone())).expect("start");
    let resolve = |o: &Observer| -> Vec<ObservedCgroup> {
        tree.names
            .iter()
            .map(|n| o.cgroup(n).expect("resolve"))
            .collect()
    };
    let ebpf_cgroups = resolve(&ebpf);
    let polling_cgroups = resolve(&polling);
    g.bench_function("ebpf_strategies", |b| {
        b.iter(|| read_all(&mut ebpf, &ebpf_cgroups));
    });
    g.bench_function("polling_only", |b| {
        b.iter(|| read_all(&mut polling, &polling_cgroups));
    });
    g.finish();
    for (name, observer, cgroups) in [
        ("eBPF strategies", &mut ebpf, &ebpf_cgroups),
        ("polling only", &mut polling, &polling_cgroups),
    ] {
        let rounds = 50_u32;
        let started = Instant::now();
        for _ in 0..rounds {
            read_all(observer, cgroups);
        }
        let per_read = started.elapsed() / rounds;
        eprintln!(
            "reader ({name}): {per_read:?} per full read of {CGROUPS} cgroups → {:.3} % of one core at a 1 s interval (target < 0.5 %)",
            per_read.as_secs_f64() * 100.0
        );
    }
    drop(ebpf);
    drop(polling);
    drop(tree);
}

criterion_group!(benches, sched_switch, reader);
criterion_main!(benches);
