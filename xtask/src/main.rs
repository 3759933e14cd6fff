//! `cargo xtask <command>`: build, test, demo, bench and fuzz orchestration for nri-resize.
//!
//! - `setup`      install what the project needs on a fresh Debian 12 machine (idempotent)
//! - `build-ebpf` build the observer's kernel programs from source
//! - `test`       setup + every tier: format, lint, unit, kernel, containerd 1.7 and 2.x, fuzz, vm
//! - `demo`       a private containerd + the plugin + a pod created and resized, narrated
//! - `bench`      every benchmark, side by side with its baseline (`reclaim_pacing`, `trim_containerd` in a 6.12 guest)
//! - `fuzz`       run one fuzz target (default: all, 60 s each; `--runs N` for N executions each)
//! - `manifests`  render deploy/ with kustomize and the Helm chart, lint, validate offline, test the alerts with promtool (also a tier of `test`)
//! - `image`      the daemon as one OCI image archive for linux/amd64 and linux/arm64 (an image
//!   index; `ctr images import`-able), no Docker engine; `--arch amd64` for the host's alone;
//!   `--push registry/repo[:tag]` pushes it to a registry (skopeo)
//! - `soak`       the full soak: 200 pods x 3 containers, 10 resizes/s, 10 minutes (`--pods`, `--seconds`)
//! - `vm-test`    the VM tier alone: cgroup v2 on Debian's 6.1 and 6.12 kernels under QEMU
//!   (`--kernel 6.1|6.12|all`, `--suite <test>`); see `vm.rs`

mod cross;
mod disk;
mod ebpf;
mod guest_oops;
mod image;
mod manifests;
mod push;
mod vm;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

const FUZZ_TARGETS: [&str; 4] = [
    "frame_decoder",
    "ttrpc_decoder",
    "config_parser",
    "annotation_parser",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn run(what: &str, cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("\n==> {what}\n    $ {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("{what}: cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn setup(ebpf: bool) -> anyhow::Result<()> {
    let script = root().join("xtask/scripts/setup-host.sh");
    let mut cmd = Command::new(&script);
    if ebpf {
        cmd.arg("--ebpf");
    }
    run(
        "host setup (Debian packages, containerd 1.7 + 2.x, toolchains)",
        &mut cmd,
    )
}

/// Builds the eBPF object and exports its path to the cargo commands that follow.
fn build_ebpf() -> anyhow::Result<()> {
    eprintln!("\n==> eBPF programs (ebpf/programs) from source");
    let obj = ebpf::build_ebpf(&root(), true)?;
    eprintln!("    object: {}", obj.display());
    std::env::set_var("NRI_RESIZE_EBPF_OBJ", &obj);
    Ok(())
}

fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        run(
            "install cargo-fuzz",
            cargo().args(["install", "--locked", "cargo-fuzz"]),
        )?;
    }
    let nightly = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !nightly {
        bail!("cargo fuzz needs a nightly toolchain (rustup toolchain 'nightly'); none is installed and rustup cannot download here");
    }
    Ok(())
}

/// How long each fuzz target runs: for a time (CI) or to a number of executions (the long runs
/// that back the "≥ 10 M executions without a crash" goal; libFuzzer ends with `Done N runs`).
#[derive(Clone, Copy)]
enum FuzzBudget {
    Seconds(u64),
    Runs(u64),
}

/// Whether the fuzz targets are built with AddressSanitizer. The code they reach is safe Rust
/// (no `unsafe` in the decoders and parsers), so the short runs of `cargo xtask test` build
/// without it (about 40 % less build time, more executions a second); the long runs of `cargo
/// xtask fuzz` keep it, for the dependencies' `unsafe`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sanitizer {
    Address,
    None,
}

fn fuzz(targets: &[&str], budget: FuzzBudget, sanitizer: Sanitizer) -> anyhow::Result<()> {
    ensure_cargo_fuzz()?;
    for t in targets {
        // `rustup run`: `$CARGO` is the toolchain's own cargo, which knows no `+nightly`.
        let mut cmd = Command::new("rustup");
        cmd.current_dir(root())
            .args([
                "run",
                "nightly",
                "cargo",
                "fuzz",
                "run",
                "--fuzz-dir",
                "plugin/fuzz",
                "--sanitizer",
                if sanitizer == Sanitizer::Address {
                    "address"
                } else {
                    "none"
                },
                t,
                "--",
            ])
            .arg(match budget {
                FuzzBudget::Seconds(s) => format!("-max_total_time={s}"),
                FuzzBudget::Runs(n) => format!("-runs={n}"),
            })
            .arg("-rss_limit_mb=4096")
            // Ends with `stat::number_of_executed_units` and `stat::peak_rss_mb`: the record.
            .arg("-print_final_stats=1");
        let what = match budget {
            FuzzBudget::Seconds(s) => format!("fuzz {t} for {s} s"),
            FuzzBudget::Runs(n) => format!("fuzz {t} for {n} executions"),
        };
        run(&what, &mut cmd)?;
    }
    Ok(())
}

/// Budget of the whole of `cargo xtask test`, under the 90 minutes CI gives a run: the VM tier,
/// last, gets what the host's tiers leave of it.
const RUN_BUDGET: Duration = Duration::from_secs(85 * 60);

struct Tier {
    name: &'static str,
    outcome: Result<(), String>,
    took: Duration,
}

fn tier(results: &mut Vec<Tier>, name: &'static str, f: impl FnOnce() -> anyhow::Result<()>) {
    let start = Instant::now();
    let outcome = f().map_err(|e| format!("{e:#}"));
    if let Err(e) = &outcome {
        eprintln!("\n!!! tier {name} FAILED: {e}");
    }
    results.push(Tier {
        name,
        outcome,
        took: start.elapsed(),
    });
}

/// What a whole `cargo xtask test` writes on a clean clone, at its peak: the target
/// directories (the host's build, the arm64 cross build, fuzzing's, the eBPF object's), the
/// caches (Go builds, kernels, the arm64 userland), the toolchains `setup` installs and the
/// guests' disks. Measured on a clean clone (see `docs/development.md`), with some margin.
const TEST_DISK_NEED: u64 = 16 * disk::GIB;
/// The same for a checkout that has run it before: the guests' disks, rebuilds.
const TEST_DISK_NEED_AGAIN: u64 = 6 * disk::GIB;

fn test(fuzz_seconds: u64) -> anyhow::Result<()> {
    let started = Instant::now();
    // A disk that fills up mid-run fails far from its cause (a guest paused by QEMU sits silent
    // until its budget kills it, as CI saw once): fail now, with both numbers, instead.
    let target = root().join("target");
    if target.join("debug").is_dir() {
        // A re-run: the builds are mostly there; the guests' disks and the rebuilds are not.
        disk::ensure(
            &target,
            TEST_DISK_NEED_AGAIN,
            "cargo xtask test (run again)",
        )?;
    } else {
        disk::ensure(
            &target,
            TEST_DISK_NEED,
            "cargo xtask test (on a clean clone)",
        )?;
    }
    let disk_at_start = disk::describe(&target);
    eprintln!("==> disk: {disk_at_start}");
    // One whole run: the compiler's incremental caches (a clean clone's were 3.3 GB of its
    // 19 GB `target/`, and the cross build's more) would speed up no later build of it.
    // A developer's own `CARGO_INCREMENTAL` is kept.
    if std::env::var_os("CARGO_INCREMENTAL").is_none() {
        std::env::set_var("CARGO_INCREMENTAL", "0");
    }
    setup(true)?;
    build_ebpf()?;
    let mut results = Vec::new();
    tier(&mut results, "format", || {
        run("rustfmt check", cargo().args(["fmt", "--all", "--check"]))
    });
    tier(&mut results, "lint", || {
        run(
            "clippy (warnings are errors)",
            cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--features",
                "nri-resize/fault-injection",
                "--",
                "-D",
                "warnings",
            ]),
        )
    });
    tier(&mut results, "unit", || {
        run(
            "unit tests (pure logic, in-process transport)",
            cargo().args(["test", "--workspace", "--lib", "--bins"]),
        )?;
        run(
            "the CLI on bad input; the module layering (no cycles, state below its users); a restart right after kill -9; the docs against the binary and their links",
            cargo().args([
                "test",
                "-p",
                "nri-resize",
                "--test",
                "cli",
                "--test",
                "architecture",
                "--test",
                "restart",
                "--test",
                "docs",
            ]),
        )
    });
    tier(&mut results, "manifests", manifests_tier);
    tier(&mut results, "kernel", || {
        run(
            "observer and cgroup I/O on the real kernel (eBPF + cgroupfs)",
            cargo().args([
                "test",
                "-p",
                "nri-resize",
                "--test",
                "observer_kernel",
                "--test",
                "cgroup_kernel",
                "--",
                "--nocapture",
            ]),
        )?;
        run(
            "capacity watcher on the real kernel (cpuhp eBPF, uevents, sysfs; hotplug only in a VM)",
            cargo().args([
                "test",
                "-p",
                "nri-resize",
                "--test",
                "capacity_kernel",
                "--",
                "--nocapture",
            ]),
        )
    });
    tier(&mut results, "containerd", || {
        run("build the plugin binary", cargo().args(TEST_DAEMON_BUILD))?;
        // The daemon's image from the binary just built (tests/tests/image_containerd.rs).
        let archive = image::default_archive(&root());
        image::build_archive(
            &root().join("target/debug/nri-resize"),
            &archive,
            &image::image_name(),
        )?;
        run(
            "real containerd 1.7 and 2.x through CRI",
            cargo().env("NRI_RESIZE_IMAGE_ARCHIVE", &archive).args([
                "test",
                "-p",
                "nri-resize-tests",
                "--",
                "--nocapture",
            ]),
        )
    });
    // The README's other set-up command, as a newcomer runs it (the set-up above, then the
    // demo's own steps: the plugin built as the demo builds it, without the test-only fault
    // injection): its narration must end in the status table.
    tier(&mut results, "demo", demo_steps);
    tier(&mut results, "fuzz", || {
        fuzz(
            &FUZZ_TARGETS,
            FuzzBudget::Seconds(fuzz_seconds),
            Sanitizer::None,
        )
    });
    // The VM tier runs alone, after the host's: beside them, the guests (one busy host thread
    // each) and the host's tests starved each other past their readiness waits and slowed the
    // host's disk for the page-cache loads (tried: 3 + 3 failures in one run).
    // The guests get what is left of the run's budget (capped by the tier's own), so that a slow
    // machine ends the run with the unfinished suites named and this summary printed, rather
    // than being killed by CI's limit with neither.
    let vm_budget = vm::TIER_BUDGET.min(RUN_BUDGET.saturating_sub(started.elapsed()));
    eprintln!(
        "\n==> the host's tiers took {} s; the VM tier gets {} s (what is left of the run's {} s, at most {} s)",
        started.elapsed().as_secs(),
        vm_budget.as_secs(),
        RUN_BUDGET.as_secs(),
        vm::TIER_BUDGET.as_secs()
    );
    let mut vm_summary = Vec::new();
    tier(&mut results, "vm", || {
        vm::vm_test(
            &root(),
            &vm::Options {
                kernels: vm::KERNELS.to_vec(),
                only: Vec::new(),
                budget: vm_budget,
            },
            &mut vm_summary,
        )
    });

    eprintln!("\n==> summary ({} s in all)", started.elapsed().as_secs());
    eprintln!(
        "    disk: at the start {disk_at_start}; at the end {}",
        disk::describe(&target)
    );
    for t in &results {
        let verdict = match &t.outcome {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("FAILED: {e}"),
        };
        eprintln!("    {:<12} {:>5} s  {verdict}", t.name, t.took.as_secs());
    }
    if !vm_summary.is_empty() {
        eprintln!("    vm, per kernel and suite (seconds in the guest):");
        for line in &vm_summary {
            eprintln!("      {line}");
        }
    }
    let failed: Vec<_> = results
        .iter()
        .filter(|t| t.outcome.is_err())
        .map(|t| t.name)
        .collect();
    if !failed.is_empty() {
        bail!("failed tiers: {}", failed.join(", "));
    }
    Ok(())
}

/// Setup, the eBPF object and the release daemon; returns the daemon's path.
fn release_plugin() -> anyhow::Result<PathBuf> {
    setup(true)?;
    build_ebpf()?;
    run(
        "build the plugin (release)",
        cargo().args([
            "build",
            "--release",
            "-p",
            "nri-resize",
            "--bin",
            "nri-resize",
        ]),
    )?;
    Ok(root().join("target/release/nri-resize"))
}

/// The release daemon with the test-only fault injection, set aside as
/// `target/release/nri-resize-fault-injection` (only the `deadlines` benchmark runs it).
fn release_fault_injection_plugin() -> anyhow::Result<PathBuf> {
    setup(true)?;
    build_ebpf()?;
    run(
        "build the plugin (release, with fault injection)",
        cargo().args([
            "build",
            "--release",
            "-p",
            "nri-resize",
            "--bin",
            "nri-resize",
            "--features",
            "fault-injection",
        ]),
    )?;
    let built = root().join("target/release/nri-resize");
    let kept = root().join("target/release/nri-resize-fault-injection");
    std::fs::copy(&built, &kept)
        .with_context(|| format!("copy {} to {}", built.display(), kept.display()))?;
    Ok(kept)
}

/// The full soak (issue 9): `pods` × 3 containers, 10 resizes/s, for `seconds`, release build.
fn soak(pods: u32, seconds: u64) -> anyhow::Result<()> {
    let bin = release_plugin()?;
    run(
        &format!("soak: {pods} pods x 3 containers for {seconds} s"),
        cargo()
            .env("NRI_RESIZE_BIN", &bin)
            .env("NRI_RESIZE_SOAK_PODS", pods.to_string())
            .env("NRI_RESIZE_SOAK_SECS", seconds.to_string())
            .args([
                "test",
                "--release",
                "-p",
                "nri-resize-tests",
                "--test",
                "soak",
                "--",
                "--nocapture",
            ]),
    )
}

/// The daemon as the test tiers build it: with the test-only fault injection
/// (`plugin/src/cgroup/fault.rs`), inert unless a test asks for a fault.
pub const TEST_DAEMON_BUILD: [&str; 7] = [
    "build",
    "-p",
    "nri-resize",
    "--bin",
    "nri-resize",
    "--features",
    "fault-injection",
];

fn demo() -> anyhow::Result<()> {
    // The eBPF toolchain too: the demo builds the observer's programs (a fresh machine has
    // neither Debian's rustc-web nor bpf-linker until this installs them).
    setup(true)?;
    demo_steps()
}

/// What `cargo xtask demo` runs after the set-up, which `cargo xtask test`'s demo tier runs too
/// (after the same set-up), so that CI goes the demo's own way.
fn demo_steps() -> anyhow::Result<()> {
    // As `test` does: the eBPF object first, so that the daemon built next embeds it (build.rs
    // reads NRI_RESIZE_EBPF_OBJ, which build_ebpf sets) and the demo shows the eBPF observer
    // rather than its polling fallbacks.
    build_ebpf()?;
    run(
        "build the plugin",
        cargo().args(["build", "-p", "nri-resize", "--bin", "nri-resize"]),
    )?;
    run(
        "demo",
        cargo().args(["run", "-q", "-p", "nri-resize-tests", "--bin", "demo"]),
    )
}

/// Every benchmark, each side by side with its baseline in one run. Each benchmark appends its
/// rows to `target/bench-table.jsonl` (see `nri_resize::bench_table`); a benchmark that fails, or
/// that writes no row, is named and fails the run, and the others still run. The rows, each named
/// with its benchmark, go with the run's date, commit, kernel, runtime versions and load into the
/// committed `docs/bench-results.json`, and docs/benchmarks.md's table is rewritten from it (by the unit
/// test that keeps the two in step, run with `NRI_RESIZE_BLESS=1`).
fn bench() -> anyhow::Result<()> {
    // `deadlines` times the fail-open answer under the test-only slow-cgroup fault: a release
    // build with it compiled in (inert unless armed), built first and set aside, so that the
    // plain release build below is what every other benchmark runs.
    let fault_bin = release_fault_injection_plugin()?;
    let bin = release_plugin()?;
    let table = root().join("target/bench-table.jsonl");
    let _ = std::fs::remove_file(&table);
    let load_before = loadavg();
    let benches: [(&str, &str, &str); 12] = [
        (
            "nri-resize",
            "handler",
            "NRI handler time per event vs a no-op handler",
        ),
        ("nri-resize", "planner", "planner vs a naive plan"),
        ("nri-resize", "observer", "eBPF per-event cost, reader CPU"),
        (
            "nri-resize",
            "page_faults",
            "eBPF cost per page fault vs no observer and polled reclaim",
        ),
        (
            "nri-resize",
            "capacity",
            "capacity watcher: event to metric vs polling, idle CPU",
        ),
        (
            "nri-resize-tests",
            "cri_latency",
            "CRI latency with and without the plugin",
        ),
        (
            "nri-resize-tests",
            "cri_floor",
            "nri-resize − containerd's NRI floor, paired call by call",
        ),
        (
            "nri-resize-tests",
            "resize_api",
            "whole-pod resize through the API vs kubelet's own writes",
        ),
        (
            "nri-resize-tests",
            "memory_decrease",
            "memory decrease vs one direct kernel write and the naive CRI update",
        ),
        (
            "nri-resize-tests",
            "footprint",
            "daemon footprint with 500 containers vs none",
        ),
        (
            "nri-resize-tests",
            "confirm_latency",
            "resize confirmation: CRI update returned to the plugin showing actual = desired",
        ),
        (
            "nri-resize-tests",
            "deadlines",
            "SIGTERM exit mid-reclaim, fail-open answer time, throttling visible: vs their baselines",
        ),
    ];
    let mut failed = Vec::new();
    let mut rows: Vec<serde_json::Value> = Vec::new();
    for (package, name, what) in benches {
        let before = std::fs::read_to_string(&table).map_or(0, |t| t.lines().count());
        let mut cmd = cargo();
        let daemon = if name == "deadlines" {
            &fault_bin
        } else {
            &bin
        };
        cmd.env("NRI_RESIZE_BIN", daemon)
            .env("NRI_RESIZE_BENCH_TABLE", &table)
            .args(["bench", "-p", package, "--bench", name]);
        if let Err(e) = run(what, &mut cmd) {
            eprintln!("!!! benchmark {name} FAILED: {e:#}");
            failed.push(name.to_string());
        }
        collect_rows(&table, before, name, &mut rows, &mut failed);
    }
    // What counting reclaim costs per memcg reclaim call, here (the memcg tracepoint): a row
    // of the observer's real-kernel test (the `fexit` strategy's row comes from the VM below).
    {
        let name = "reclaim_calls";
        let before = std::fs::read_to_string(&table).map_or(0, |t| t.lines().count());
        let mut cmd = cargo();
        cmd.env("NRI_RESIZE_BENCH_TABLE", &table).args([
            "test",
            "-p",
            "nri-resize",
            "--test",
            "observer_kernel",
            "page_cache_reclaim_agrees_with_memory_stat",
            "--",
            "--nocapture",
        ]);
        if let Err(e) = run(
            "reclaim counting per reclaim call (memcg tracepoint, this kernel)",
            &mut cmd,
        ) {
            eprintln!("!!! benchmark {name} FAILED: {e:#}");
            failed.push(name.to_string());
        }
        collect_rows(&table, before, name, &mut rows, &mut failed);
    }
    // Paced reclaim and trimming need cgroup v2's PSI: their side by sides run in the VM tier's
    // guests (paced reclaim on sid's newest kernel, where the VM tier runs it), which write their
    // rows into the run directory (`vm::copy_bench_rows` brings them back); so does the `fexit`
    // reclaim counting (trampolines: refused on these hosts).
    for (name, kernel, what) in [
        (
            "observer_kernel",
            "6.12",
            "reclaim counting per reclaim call with fexit (VM tier, 6.12)",
        ),
        (
            "reclaim_pacing",
            "7.2",
            "paced reclaim vs the direct write and unpaced (VM tier, sid's 7.2)",
        ),
        (
            "trim_containerd",
            "6.12",
            "a VPA-driven decrease through kubelet >= 1.34 with and without trimming (VM tier, 6.12)",
        ),
        (
            "trim_load",
            "6.12",
            "NRI handler latency with and without trimming 200 containers (VM tier, 6.12)",
        ),
    ] {
        let before = std::fs::read_to_string(&table).map_or(0, |t| t.lines().count());
        std::env::set_var("NRI_RESIZE_BENCH_TABLE", &table);
        eprintln!("\n==> benchmark {name}: {what}");
        // A failure here (setup, eBPF build, the guest) fails this benchmark, not the whole run.
        let vm = setup(true)
            .and_then(|()| build_ebpf())
            .and_then(|()| vm::Options::parse(&["--kernel", kernel, "--suite", name].map(String::from)))
            .and_then(|opts| vm::vm_test(&root(), &opts, &mut Vec::new()));
        std::env::remove_var("NRI_RESIZE_BENCH_TABLE");
        if let Err(e) = vm {
            eprintln!("!!! benchmark {name} FAILED: {e:#}");
            failed.push(name.to_string());
        }
        collect_rows(&table, before, name, &mut rows, &mut failed);
    }
    let results = serde_json::json!({
        "date": command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        "commit": commit(),
        "kernel": command_line("uname", &["-r"]),
        "runtimes": runtimes(),
        "machine": format!(
            "{} CPUs, load average {load_before} at the start and {} at the end (shared machine: p99s are noisy)",
            std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
            loadavg()
        ),
        "rows": rows,
    });
    let path = root().join("docs/bench-results.json");
    std::fs::write(&path, serde_json::to_string_pretty(&results)? + "\n")
        .with_context(|| format!("write {}", path.display()))?;
    eprintln!("\n==> results: {}", path.display());
    run(
        "docs/benchmarks.md's benchmark table from the results file",
        cargo().env("NRI_RESIZE_BLESS", "1").args([
            "test",
            "-q",
            "-p",
            "nri-resize",
            "--lib",
            "bench_table::tests::the_docs_carry_the_bench_results",
        ]),
    )?;
    let readme = std::fs::read_to_string(root().join("docs/benchmarks.md"))?;
    let begin = readme.find("<!-- bench-results").unwrap_or(0);
    let end = readme
        .find("<!-- /bench-results -->")
        .unwrap_or(readme.len());
    eprintln!(
        "\n==> one table: every benchmark, ours next to its baseline measured in the same run\n\n{}",
        &readme[begin..end]
    );
    if !failed.is_empty() {
        bail!("benchmarks failed: {}", failed.join(", "));
    }
    Ok(())
}

/// The rows benchmark `name` appended to `table` after its first `before` lines, named; a
/// benchmark that wrote none is a failure.
fn collect_rows(
    table: &Path,
    before: usize,
    name: &str,
    rows: &mut Vec<serde_json::Value>,
    failed: &mut Vec<String>,
) {
    let text = std::fs::read_to_string(table).unwrap_or_default();
    let mut wrote = 0;
    for line in text.lines().skip(before) {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(mut r) => {
                r["bench"] = serde_json::Value::from(name);
                rows.push(r);
                wrote += 1;
            }
            Err(e) => eprintln!("!!! benchmark {name}: unreadable row ({e}): {line}"),
        }
    }
    if wrote == 0 {
        eprintln!("!!! benchmark {name} wrote no row to the table");
        if !failed.iter().any(|f| f == name) {
            failed.push(format!("{name} (no row)"));
        }
    }
}

/// The first line a command prints, or `unknown`.
fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The commit measured, `-dirty` when the work tree had changes.
fn commit() -> String {
    let head = command_line("git", &["rev-parse", "--short=12", "HEAD"]);
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    if dirty {
        format!("{head}-dirty")
    } else {
        head
    }
}

/// `/proc/loadavg`'s 1-minute figure.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

/// The containerd versions the harness runs (`containerd --version`, the version field).
fn runtimes() -> Vec<String> {
    let cache = std::env::var_os("NRI_RESIZE_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/nri-resize"), PathBuf::from);
    let v2 = std::env::var_os("NRI_RESIZE_CONTAINERD_BIN")
        .filter(|v| !v.is_empty())
        .map_or_else(|| cache.join("containerd-2/usr/bin"), PathBuf::from);
    [PathBuf::from("/usr/bin"), v2]
        .iter()
        .map(|dir| {
            let line = command_line(&dir.join("containerd").to_string_lossy(), &["--version"]);
            let version = line.split_whitespace().nth(2).unwrap_or(&line).to_string();
            format!("containerd {version}")
        })
        .collect()
}

/// Renders and validates `deploy/`, then the structural checks of the manifests.
fn manifests_tier() -> anyhow::Result<()> {
    eprintln!("\n==> render deploy/ (kustomize, the Helm chart with Helm's engine), lint the chart, validate (kubernetes-validate)");
    let mut files = manifests::render(&root())?;
    manifests::lint_chart(&root())?;
    files.extend(manifests::render_chart(&root())?);
    manifests::validate(&files)?;
    eprintln!("\n==> alerts: promtool check rules, promtool test rules");
    manifests::alerts(&root())?;
    run(
        "manifests: CRDs, probes, config check, chart = kustomize, dashboard and alerts against the catalog",
        cargo().args([
            "test",
            "-p",
            "nri-resize-tests",
            "--test",
            "deploy_manifests",
        ]),
    )
}

/// `cargo xtask image [--debug] [--out PATH] [--arch amd64,arm64] [--push REF [--push-insecure]]`:
/// eBPF object, the daemon built for each architecture (release unless `--debug`; the foreign
/// one cross-built, see `cross.rs`), one OCI archive whose image index holds them all; with
/// `--push`, that archive pushed to the registry `REF` names (`push.rs`).
fn image_cmd(
    debug: bool,
    out: Option<PathBuf>,
    arches: &[cross::Arch],
    push_to: Option<(push::Destination, push::Transport)>,
) -> anyhow::Result<()> {
    setup(true)?;
    build_ebpf()?;
    let mut binaries = Vec::new();
    for &arch in arches {
        let started = Instant::now();
        let binary = cross::build_daemon(&root(), arch, !debug)?;
        eprintln!(
            "    linux/{arch}: {} ({:.0} s)",
            binary.display(),
            started.elapsed().as_secs_f64()
        );
        match cross::smoke_run(arch, &binary)? {
            Some((version, how)) => eprintln!("    {version}  ($ {how})"),
            None => eprintln!(
                "    not run: no qemu-user emulator for linux/{arch} (Debian package qemu-user-static)"
            ),
        }
        binaries.push((arch, binary));
    }
    let out = out.unwrap_or_else(|| image::default_archive(&root()));
    let built = image::build_multiarch_archive(&binaries, &out, &image::image_name())?;
    eprintln!("\n==> OCI image {} ({})", built.name, built.target_digest);
    for p in &built.platforms {
        eprintln!("    linux/{} manifest {}", p.arch, p.manifest_digest);
        for f in &p.files {
            eprintln!("      {f}");
        }
    }
    eprintln!(
        "    archive: {}\n    import:  ctr -n k8s.io images import {}",
        built.archive.display(),
        built.archive.display()
    );
    if let Some((to, transport)) = push_to {
        let digest = push::push(&built.archive, &to, transport)?;
        eprintln!(
            "\n==> pushed {to} ({digest})\n    helm: --set image.repository={} --set image.tag={} --set image.digest={digest}",
            to.repository(),
            to.tag()
        );
    }
    Ok(())
}

/// `--arch amd64,arm64` (default: every architecture of the image).
fn parse_arches(arg: Option<&str>) -> anyhow::Result<Vec<cross::Arch>> {
    let Some(list) = arg else {
        return Ok(cross::Arch::ALL.to_vec());
    };
    let mut arches = list
        .split(',')
        .map(str::parse)
        .collect::<anyhow::Result<Vec<cross::Arch>>>()?;
    arches.sort();
    arches.dedup();
    if arches.is_empty() {
        bail!("--arch: no architecture");
    }
    Ok(arches)
}

/// Every failure ends as one sentence with its causes (`error: … : …`), never a backtrace.
fn main() -> std::process::ExitCode {
    match xtask_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\nerror: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn xtask_main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    match args.first().map(String::as_str) {
        Some("setup") => setup(true),
        Some("build-ebpf") => build_ebpf(),
        Some("test") => test(arg("--fuzz-seconds").map_or(Ok(20), |s| s.parse()).context("--fuzz-seconds")?),
        Some("demo") => demo(),
        Some("bench") => bench(),
        Some("soak") => soak(
            arg("--pods").map_or(Ok(200), |s| s.parse()).context("--pods")?,
            arg("--seconds").map_or(Ok(600), |s| s.parse()).context("--seconds")?,
        ),
        Some("manifests") => {
            setup(false)?;
            manifests_tier()
        }
        Some("image") => {
            // Checked before anything is built.
            let push_to = arg("--push")
                .map(|r| push::Destination::parse(&r, env!("CARGO_PKG_VERSION")))
                .transpose()?
                .map(|to| {
                    let insecure = args.iter().any(|a| a == "--push-insecure");
                    (to, push::Transport { insecure })
                });
            image_cmd(
                args.iter().any(|a| a == "--debug"),
                arg("--out").map(PathBuf::from),
                &parse_arches(arg("--arch").as_deref())?,
                push_to,
            )
        }
        Some("vm-test") => {
            let opts = vm::Options::parse(&args[1..])?;
            setup(true)?;
            build_ebpf()?;
            vm::vm_test(&root(), &opts, &mut Vec::new())
        }
        Some("fuzz") => {
            let budget = match arg("--runs") {
                Some(n) => FuzzBudget::Runs(n.parse().context("--runs")?),
                None => FuzzBudget::Seconds(
                    arg("--seconds").map_or(Ok(60), |s| s.parse()).context("--seconds")?,
                ),
            };
            match arg("--target") {
                Some(t) => fuzz(&[t.as_str()], budget, Sanitizer::Address),
                None => fuzz(&FUZZ_TARGETS, budget, Sanitizer::Address),
            }
        }
        _ => bail!("usage: cargo xtask <setup|build-ebpf|test [--fuzz-seconds N]|demo|bench|fuzz [--target T] [--seconds N | --runs N]|manifests|image [--debug] [--out PATH] [--arch amd64,arm64] [--push REGISTRY/REPO[:TAG] [--push-insecure]]|vm-test [--kernel 6.1|6.12|all] [--suite T] [--budget-seconds N]|soak [--pods N] [--seconds N]>"),
    }
}
