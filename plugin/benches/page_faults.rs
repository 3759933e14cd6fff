//! What the observer costs every page fault of the node, side by side in one run (needs root,
//! kernel BTF and the eBPF object: `cargo xtask build-ebpf` first). Run:
//! `cargo bench -p nri-resize --bench page_faults`.
//!
//! The kernel reports every memcg event — each page fault included — through the
//! `memcg/count_memcg_events` tracepoint (6.16+; Debian's 6.1 and 6.12 lack it and poll
//! instead), and the observer's reclaim counter sits on it. A fault-heavy workload (anonymous
//! memory touched page by page, then unmapped) runs interleaved (`ROUNDS` rounds, medians) with:
//! - no observer;
//! - the observer with reclaim polled from `memory.stat` (`--observer-force-reclaim`): no program
//!   on the fault path, the strongest alternative;
//! - the observer as deployed with no reclaim of nri-resize's in flight: the memcg event program
//!   loaded but not attached (it is attached only while a decrease or trimming reclaims);
//! - the observer with a reclaim in flight: the program attached (the raw `tp_btf` program, the
//!   classic tracepoint where BTF cannot type it).
//!
//! Reported per fault, all as medians over the rounds:
//! - wall clock above no observer, with the spread (min–max) of the no-observer runs beside it:
//!   a difference inside that spread is not a measured cost;
//! - one more run of the observer with the program attached and the kernel's BPF statistics
//!   on: its wall clock
//!   above no observer, the program's run count per fault (every memcg event on the node during
//!   the run is counted, so this is at least the events of our faults) and its run time per
//!   fault (run count × time per run). The statistics add two clock reads around every run, so
//!   that run is slower than the deployed observer: its wall clock is the one the run time can
//!   be compared with.

use std::time::{Duration, Instant};

use nri_resize::observer::{Observer, ObserverSettings, ReclaimStrategy};
use nri_resize_ebpf_common::names;

const MAPPING: usize = 64 << 20;
const PAGE: usize = 4096;
const MAPPINGS_PER_RUN: usize = 8;
const FAULTS_PER_RUN: u64 = (MAPPINGS_PER_RUN * MAPPING / PAGE) as u64;
const ROUNDS: usize = 9;

/// Maps, touches page by page and unmaps `MAPPINGS_PER_RUN` anonymous regions (small pages).
#[expect(
    unsafe_code,
    reason = "mmap/munmap of a private anonymous region owned by this function"
)]
fn fault_run() -> Duration {
    let started = Instant::now();
    for _ in 0..MAPPINGS_PER_RUN {
        // SAFETY: a fresh private anonymous mapping, written only inside its length and unmapped
        // before the loop goes on; nothing else refers to it.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                MAPPING,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(
                p,
                libc::MAP_FAILED,
                "mmap: {}",
                std::io::Error::last_os_error()
            );
            // One fault per 4 KiB page, not one per 2 MiB.
            libc::madvise(p, MAPPING, libc::MADV_NOHUGEPAGE);
            let bytes = p.cast::<u8>();
            for off in (0..MAPPING).step_by(PAGE) {
                bytes.add(off).write_volatile(1);
            }
            libc::munmap(p, MAPPING);
        }
    }
    started.elapsed()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    None,
    Polled,
    /// As deployed with no reclaim in flight: the memcg event program loaded, not attached.
    Idle,
    /// A reclaim in flight: the program attached.
    Reclaiming,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::None => "no observer",
            Side::Polled => "reclaim polled from memory.stat",
            Side::Idle => "observer, no reclaim in flight",
            Side::Reclaiming => "observer, a reclaim in flight",
        }
    }

    fn start(self) -> Option<Observer> {
        let mut settings = ObserverSettings::host();
        settings.hotplug = false;
        match self {
            Side::None => return None,
            Side::Polled => settings.force_reclaim = Some(ReclaimStrategy::MemoryStatPolling),
            Side::Idle | Side::Reclaiming => {}
        }
        let mut observer = Observer::start(&settings).expect("start the observer");
        if self == Side::Reclaiming && observer.reclaim_on_demand().is_some() {
            observer
                .attach_reclaim_events()
                .expect("attach the memcg event program");
        }
        Some(observer)
    }
}

/// `(name, run_count, run_time_ns)` of the attached memcg events program.
fn memcg_program(o: &Observer) -> Option<(String, u64, u64)> {
    o.program_stats()
        .into_iter()
        .filter(|s| s.name == names::PROG_MEMCG_EVENTS_BTF || s.name == names::PROG_MEMCG_EVENTS)
        .max_by_key(|s| s.run_count)
        .map(|s| (s.name, s.run_count, s.run_time_ns))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[expect(
    clippy::cast_precision_loss,
    reason = "nanoseconds per fault for display"
)]
fn per_fault(d: Duration) -> f64 {
    d.as_nanos() as f64 / FAULTS_PER_RUN as f64
}

fn main() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the page-fault benchmark needs root (eBPF)"
    );
    let sides = [Side::None, Side::Polled, Side::Idle, Side::Reclaiming];
    fault_run(); // warm-up
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    // Per round, with the statistics on: (wall ns per fault, runs per fault, run ns per fault).
    let mut stats_runs: Vec<(f64, f64, f64)> = Vec::new();
    let mut program = String::from("none attached");
    let mut strategy = String::new();
    for round in 0..ROUNDS {
        for (i, side) in sides.iter().enumerate() {
            let observer = side.start();
            if round == 0 {
                if let Some(o) = &observer {
                    strategy = format!("{:?}", o.strategies().reclaim);
                }
            }
            wall[i].push(per_fault(fault_run()));
            // The program's own time, with the kernel's statistics on for one more run.
            if let Some(o) = observer.as_ref().filter(|_| *side == Side::Reclaiming) {
                let enabled =
                    aya::sys::enable_stats(aya::sys::Stats::RunTime).expect("enable BPF stats");
                let before = memcg_program(o);
                let wall_on = per_fault(fault_run());
                let after = memcg_program(o);
                drop(enabled);
                if let (Some(b), Some(a)) = (before, after) {
                    program.clone_from(&a.0);
                    if a.1 > b.1 {
                        #[expect(clippy::cast_precision_loss, reason = "for display")]
                        stats_runs.push((
                            wall_on,
                            (a.1 - b.1) as f64 / FAULTS_PER_RUN as f64,
                            (a.2 - b.2) as f64 / FAULTS_PER_RUN as f64,
                        ));
                    }
                }
            }
        }
    }
    let (base_min, base_max) = wall[0]
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    let base = median(&mut wall[0]);
    let polled = median(&mut wall[1]);
    let idle = median(&mut wall[2]);
    let deployed = median(&mut wall[3]);
    let stats = (!stats_runs.is_empty()).then(|| {
        let col = |f: fn(&(f64, f64, f64)) -> f64| {
            median(&mut stats_runs.iter().map(f).collect::<Vec<_>>())
        };
        (col(|r| r.0), col(|r| r.1), col(|r| r.2))
    });
    eprintln!(
        "\npage faults: {FAULTS_PER_RUN} per run, medians of {ROUNDS} interleaved runs (observer reclaim strategy {strategy}, program {program})"
    );
    for (side, v) in sides.iter().zip([base, polled, idle, deployed]) {
        eprintln!(
            "  {:<34} {v:>8.0} ns per fault ({:+.0} ns)",
            side.label(),
            v - base
        );
    }
    let spread = format!(
        "no-observer runs {base_min:.0}–{base_max:.0} ns, a spread of {:.0} ns",
        base_max - base_min
    );
    eprintln!("  {spread}");
    let stats_text = stats.map_or_else(
        || "no BPF run time (no program on the fault path)".to_owned(),
        |(wall_on, runs, run_ns)| {
            format!(
                "with the kernel's BPF statistics on: {:+.0} ns per fault wall clock, of which BPF run time {run_ns:.0} ns ({runs:.2} runs of {program} per fault, {:.0} ns each; the statistics' clock reads count in both)",
                wall_on - base,
                run_ns / runs.max(1e-9)
            )
        },
    );
    eprintln!("  {stats_text}");
    nri_resize::bench_table::row(
        "eBPF cost per page fault: the memcg event tracepoint under the reclaim counter",
        &format!(
            "no observer: {base:.0} ns per fault ({spread}); reclaim polled from memory.stat (`--observer-force-reclaim`, no program on the fault path): {:+.0} ns",
            polled - base
        ),
        &format!(
            "observer as deployed, no reclaim in flight (program detached): {:+.0} ns per fault; with a reclaim in flight (program attached): {:+.0} ns per fault ({:+.1} %); {stats_text}",
            idle - base,
            deployed - base,
            (deployed - base) / base * 100.0
        ),
        Some(deployed / base.max(1e-9)),
        "— (informational; kernels without the tracepoint, e.g. 6.1 and 6.12, poll instead)",
    );
}
