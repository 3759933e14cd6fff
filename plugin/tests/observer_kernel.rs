//! Real-kernel tests of the observer: they load the eBPF object into the running kernel, put
//! workloads into cgroups of their own and compare what the observer reports with the kernel's
//! own cgroup counters. No containerd needed.
//!
//! Requirements (the tests fail, loudly, when one is missing — they never skip): root, kernel
//! BTF at `/sys/kernel/btf/vmlinux`, cgroup v1 `cpu` and `memory` hierarchies at
//! `/sys/fs/cgroup/{cpu,memory}` (cgroup v2 is exercised in the QEMU suite), and the eBPF object
//! built into the test binary (`cargo xtask build-ebpf` before `cargo test`).
//!
//! Each test creates `/sys/fs/cgroup/{cpu,memory}/nri-resize-obs-test-<pid>-<name>` and removes it
//! in every outcome (a drop guard that first kills the children it spawned).
#![expect(
    clippy::similar_names,
    reason = "before/after pairs of kernel and eBPF counters"
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nri_resize::observer::{
    parse, CgroupLayout, HotplugStrategy, ObservedCgroup, Observer, ObserverSettings, OomStrategy,
    ReclaimStrategy, ThrottleStrategy,
};

const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
const MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";
const MIB: u64 = 1024 * 1024;
const PAGE: u64 = 4096;

fn require_environment() {
    let euid = nix::unistd::geteuid();
    assert!(
        euid.is_root(),
        "observer_kernel tests need root to load eBPF and create cgroups (euid {euid})"
    );
    assert!(
        Path::new("/sys/kernel/btf/vmlinux").is_file(),
        "observer_kernel tests need kernel BTF at /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF)"
    );
    for root in [CPU_ROOT, MEMORY_ROOT] {
        assert!(
            Path::new(root).join("tasks").is_file(),
            "observer_kernel tests need the cgroup v1 hierarchy {root} (this suite covers v1; v2 runs in QEMU)"
        );
    }
}

fn start_observer(settings: &ObserverSettings) -> Observer {
    require_environment();
    let observer = Observer::start(settings).expect("start the observer");
    if let Some(f) = observer.fallbacks().iter().find(|f| f.program == "object") {
        panic!(
            "the eBPF object did not load: {} — run `cargo xtask build-ebpf` and rebuild the tests",
            f.reason
        );
    }
    observer
}

fn host_settings() -> ObserverSettings {
    let mut settings = ObserverSettings::host();
    settings.cgroups = CgroupLayout::V1 {
        cpu: CPU_ROOT.into(),
        memory: MEMORY_ROOT.into(),
    };
    settings
}

/// Our own cgroup in the cpu and memory hierarchies; removed on drop, children killed first.
struct TestCgroup {
    relative: String,
    dirs: Vec<PathBuf>,
    children: Vec<Child>,
}

impl TestCgroup {
    fn create(name: &str) -> Self {
        let relative = format!("nri-resize-obs-test-{}-{name}", std::process::id());
        let mut cgroup = Self {
            relative: relative.clone(),
            dirs: Vec::new(),
            children: Vec::new(),
        };
        for root in [CPU_ROOT, MEMORY_ROOT] {
            let dir = Path::new(root).join(&relative);
            std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
            cgroup.dirs.push(dir);
        }
        cgroup
    }

    fn cpu(&self) -> PathBuf {
        Path::new(CPU_ROOT).join(&self.relative)
    }

    fn memory(&self) -> PathBuf {
        Path::new(MEMORY_ROOT).join(&self.relative)
    }

    fn write(dir: &Path, file: &str, value: &str) {
        let path = dir.join(file);
        std::fs::write(&path, value)
            .unwrap_or_else(|e| panic!("write {value} to {}: {e}", path.display()));
    }

    fn read(dir: &Path, file: &str) -> String {
        let path = dir.join(file);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }

    /// Runs `script` with `sh -c` after the shell moved itself into both hierarchies, so the
    /// workload never runs outside the cgroup.
    fn spawn(&mut self, script: &str) -> u32 {
        let enter = format!(
            "echo $$ > {cpu}/cgroup.procs && echo $$ > {mem}/cgroup.procs && {script}",
            cpu = self.cpu().display(),
            mem = self.memory().display()
        );
        let child = Command::new("sh")
            .args(["-c", &enter])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sh");
        let pid = child.id();
        self.children.push(child);
        pid
    }

    fn kill_children(&mut self) {
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn observed(&self, observer: &Observer) -> ObservedCgroup {
        observer
            .cgroup(Path::new(&self.relative))
            .expect("resolve the test cgroup")
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        self.kill_children();
        for dir in self.dirs.iter().rev() {
            // Killed tasks leave the cgroup asynchronously: retry for a moment.
            let deadline = Instant::now() + Duration::from_secs(5);
            while let Err(e) = std::fs::remove_dir(dir) {
                if Instant::now() > deadline {
                    eprintln!("could not remove {}: {e}", dir.display());
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn within(a: u64, b: u64, percent: u64) -> bool {
    let tolerance = (a.max(b) * percent).div_ceil(100).max(1);
    a.abs_diff(b) <= tolerance
}

fn nr_throttled(cgroup: &TestCgroup) -> u64 {
    parse::cpu_stat(&TestCgroup::read(&cgroup.cpu(), "cpu.stat"))
        .expect("cpu.stat has nr_throttled")
        .nr_throttled
}

#[test]
fn throttling_from_sched_switch_agrees_with_cpu_stat_and_with_forced_fallback() {
    let mut observer = start_observer(&host_settings());
    assert_eq!(
        observer.strategies().throttle,
        ThrottleStrategy::TpBtfSchedSwitch,
        "expected tp_btf/sched_switch on this kernel (fentry is refused here); fallbacks: {:?}",
        observer.fallbacks()
    );
    let mut forced_settings = host_settings();
    forced_settings.force_throttle = Some(ThrottleStrategy::CpuStatPolling);
    forced_settings.hotplug = false;
    let mut polling = start_observer(&forced_settings);
    assert_eq!(
        polling.strategies().throttle,
        ThrottleStrategy::CpuStatPolling
    );

    let mut cgroup = TestCgroup::create("throttle");
    TestCgroup::write(&cgroup.cpu(), "cpu.cfs_period_us", "100000");
    TestCgroup::write(&cgroup.cpu(), "cpu.cfs_quota_us", "10000");
    let observed = cgroup.observed(&observer);
    let base = observer
        .read(&observed)
        .expect("read")
        .throttling
        .expect("throttling");
    let base_polling = polling
        .read(&observed)
        .expect("read")
        .throttling
        .expect("throttling");
    let base_kernel = nr_throttled(&cgroup);

    let started = Instant::now();
    cgroup.spawn("while :; do :; done");
    let first = loop {
        let now = observer
            .read(&observed)
            .expect("read")
            .throttling
            .expect("throttling");
        if now.count > base.count {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "no throttling reported within 2 s: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Let it accumulate ~30 periods, then stop the workload so all counters settle.
    std::thread::sleep(Duration::from_secs(3));
    cgroup.kill_children();
    std::thread::sleep(Duration::from_millis(200));

    let ebpf = observer
        .read(&observed)
        .expect("read")
        .throttling
        .expect("throttling");
    let forced = polling
        .read(&observed)
        .expect("read")
        .throttling
        .expect("throttling");
    let kernel = nr_throttled(&cgroup) - base_kernel;
    let (ebpf_count, forced_count) = (ebpf.count - base.count, forced.count - base_polling.count);
    eprintln!(
        "first throttle after {first:?}; eBPF: {ebpf_count} throttles, {} ms throttled; cpu.stat: {kernel} \
         nr_throttled; forced CpuStatPolling: {forced_count} throttles, {} ms",
        (ebpf.throttled_ns - base.throttled_ns) / 1_000_000,
        (forced.throttled_ns - base_polling.throttled_ns) / 1_000_000,
    );
    assert!(
        kernel >= 20,
        "the workload was throttled only {kernel} times in 3 s"
    );
    assert!(
        within(ebpf_count, kernel, 5),
        "eBPF {ebpf_count} vs cpu.stat nr_throttled {kernel}: more than 5 % apart"
    );
    assert!(
        within(forced_count, ebpf_count, 5),
        "forced fallback {forced_count} vs eBPF {ebpf_count}: more than 5 % apart"
    );
    assert!(
        ebpf.throttled_ns > base.throttled_ns,
        "no throttled time accumulated"
    );

    observer.forget(&observed);
    let after = observer
        .read(&observed)
        .expect("read")
        .throttling
        .expect("throttling");
    assert_eq!(after.count, 0, "forget() left the map entry");
}

#[test]
fn fentry_is_tried_first_and_falls_back_with_a_reason() {
    let observer = start_observer(&host_settings());
    let strategies = observer.strategies();
    if strategies.throttle != ThrottleStrategy::Fentry {
        let fallback = observer
            .fallbacks()
            .iter()
            .find(|f| f.program == "unthrottle_cfs_rq")
            .expect("a fallback from fentry/unthrottle_cfs_rq is recorded");
        assert!(!fallback.reason.is_empty());
        eprintln!("fentry refused: {}", fallback.reason);
    }
    assert_eq!(
        strategies.reclaim,
        ReclaimStrategy::MemcgTracepoints,
        "fallbacks: {:?}",
        observer.fallbacks()
    );
    assert_eq!(
        strategies.oom,
        OomStrategy::MarkVictim,
        "fallbacks: {:?}",
        observer.fallbacks()
    );
    assert_eq!(
        strategies.hotplug,
        HotplugStrategy::CpuhpTracepoints,
        "fallbacks: {:?}",
        observer.fallbacks()
    );
    assert!(
        observer.hotplug_fd().is_some(),
        "the hotplug ring buffer is exposed"
    );
}

#[test]
fn oom_kill_is_attributed_to_the_victims_memcg_once() {
    let mut observer = start_observer(&host_settings());
    assert_eq!(
        observer.strategies().oom,
        OomStrategy::MarkVictim,
        "fallbacks: {:?}",
        observer.fallbacks()
    );
    let mut cgroup = TestCgroup::create("oom");
    TestCgroup::write(
        &cgroup.memory(),
        "memory.limit_in_bytes",
        &(100 * MIB).to_string(),
    );
    let observed = cgroup.observed(&observer);
    let mut forced_settings = host_settings();
    forced_settings.force_oom = Some(OomStrategy::MemoryEventsPolling);
    forced_settings.hotplug = false;
    let mut polling = start_observer(&forced_settings);
    assert_eq!(polling.strategies().oom, OomStrategy::MemoryEventsPolling);
    let before = observer.read(&observed).expect("read").oom;

    // dd allocates its 300 MiB block and fills it: anonymous memory over the limit, no swap.
    let pid = cgroup.spawn("exec dd if=/dev/zero of=/dev/null bs=300M count=1");
    let child = cgroup.children.last_mut().expect("child");
    let status = child.wait().expect("wait dd");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "dd was expected to be OOM-killed (SIGKILL), got {status}"
    );
    let after = observer.read(&observed).expect("read").oom;
    eprintln!("OOM before {before:?}, after {after:?}");
    assert_eq!(
        after.kills - before.kills,
        1,
        "exactly one OOM kill attributed to the cgroup"
    );
    assert_eq!(
        after.last_victim_tgid,
        Some(pid),
        "the victim is the dd process"
    );
    // The cross-check file is read on the first read and whenever eBPF counted a kill (plus
    // every `oom_cross_check_every` reads): the kill above forces a fresh read here.
    assert_eq!(
        after.kernel_oom_kill,
        Some(1),
        "memory.oom_control oom_kill agrees"
    );
    // An observer whose periodic cross-check never comes due still reads the file when it
    // first sees the cgroup.
    let mut rare_settings = host_settings();
    rare_settings.hotplug = false;
    rare_settings.oom_cross_check_every = u32::MAX;
    let mut rare = start_observer(&rare_settings);
    let first = rare.read(&observed).expect("read").oom;
    assert_eq!(
        first.kernel_oom_kill,
        Some(1),
        "first read cross-checks memory.oom_control"
    );
    let forced = polling.read(&observed).expect("read").oom;
    assert_eq!(
        forced.kills, 1,
        "the forced memory.oom_control fallback counts the same kill"
    );
}

#[test]
fn page_cache_reclaim_agrees_with_memory_stat() {
    let mut observer = start_observer(&host_settings());
    assert_eq!(
        observer.strategies().reclaim,
        ReclaimStrategy::MemcgTracepoints,
        "fallbacks: {:?}",
        observer.fallbacks()
    );
    let mut cgroup = TestCgroup::create("reclaim");
    TestCgroup::write(
        &cgroup.memory(),
        "memory.limit_in_bytes",
        &(100 * MIB).to_string(),
    );
    let observed = cgroup.observed(&observer);
    // Disk-backed (tmpfs pages could not be reclaimed without swap).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let file = dir.path().join("page-cache");
    let before = observer.read(&observed).expect("read").reclaim;
    let stat_before = parse::memory_stat(&TestCgroup::read(&cgroup.memory(), "memory.stat"));

    cgroup.spawn(&format!(
        "exec dd if=/dev/zero of={} bs=1M count=300",
        file.display()
    ));
    let child = cgroup.children.last_mut().expect("child");
    let status = child.wait().expect("wait dd");
    assert!(status.success(), "dd failed: {status}");

    let after = observer.read(&observed).expect("read").reclaim;
    let stat_text = TestCgroup::read(&cgroup.memory(), "memory.stat");
    let stat = parse::memory_stat(&stat_text);
    let cache = parse::flat_keyed(&stat_text, "cache").expect("memory.stat cache");
    let written = std::fs::metadata(&file).expect("stat file").len();
    let d = |a: Option<u64>, b: Option<u64>| a.unwrap_or(0) - b.unwrap_or(0);
    let pgsteal = d(after.pgsteal(), before.pgsteal());
    let (pgpgin, pgpgout) = (
        d(after.pgpgin, before.pgpgin),
        d(after.pgpgout, before.pgpgout),
    );
    let (kernel_pgpgin, kernel_pgpgout) = (
        d(stat.pgpgin, stat_before.pgpgin),
        d(stat.pgpgout, stat_before.pgpgout),
    );
    // What the kernel says left the cgroup: the file's pages minus those still charged.
    let kernel_reclaimed = (written - cache.min(written)) / PAGE;
    eprintln!(
        "eBPF: pgsteal {pgsteal} (direct {:?}, kswapd {:?}), pgscan direct {:?}, pgpgin {pgpgin}, pgpgout {pgpgout}, \
         direct reclaim {:?} passes / {:?} ns / {:?} pages; memory.stat: pgpgin {kernel_pgpgin}, pgpgout \
         {kernel_pgpgout}, cache {cache} B; file {written} B → {kernel_reclaimed} pages reclaimed",
        d(after.pgsteal_direct, before.pgsteal_direct),
        d(after.pgsteal_kswapd, before.pgsteal_kswapd),
        d(after.pgscan_direct, before.pgscan_direct),
        after.direct_reclaim_count,
        after.direct_reclaim_ns,
        after.direct_reclaimed_pages,
    );
    assert!(pgsteal > 0, "no reclaim observed");
    assert!(
        within(pgsteal, kernel_reclaimed, 5),
        "eBPF pgsteal {pgsteal} vs memory.stat-derived {kernel_reclaimed} pages"
    );
    assert!(
        within(pgpgin, kernel_pgpgin, 5),
        "eBPF pgpgin {pgpgin} vs memory.stat {kernel_pgpgin}"
    );
    assert!(
        within(pgpgout, kernel_pgpgout, 5),
        "eBPF pgpgout {pgpgout} vs memory.stat {kernel_pgpgout}"
    );
    assert!(
        after.direct_reclaim_count.unwrap_or(0) > 0,
        "no direct reclaim pass timed"
    );
    drop(cgroup);
}
