//! The capacity watcher on a real kernel: the cpuhp eBPF programs load and attach, the uevent
//! socket receives the kernel's own events, the watcher reads the real sysfs and meminfo — and,
//! inside a VM only, CPUs and memory really change under it.
//!
//! Self-contained: `cargo test -p nri-resize --test capacity_kernel -- --nocapture --test-threads 1`
//! (the tests also serialize themselves).
//!
//! | test | where |
//! |---|---|
//! | the watcher starts and reads the node; the eBPF program attaches; uevents arrive | host and VM |
//! | CPU 1 offline, then online, through `/sys/devices/system/cpu/cpu1/online` | VM only: `#[ignore]`d |
//! | QEMU CPU hotplug through the runner's `NRI_RESIZE_HOTPLUG_DIR` protocol | VM only: `#[ignore]`d |
//! | QEMU memory hotplug, the same way | VM only: `#[ignore]`d |
//!
//! Host CPUs are never offlined: the VM-only tests are `#[ignore]`d (their reason says why), so a
//! plain run on a host reports them as ignored instead of passing without doing anything. The VM
//! tier runs them with `--include-ignored` (`xtask/src/vm.rs`, which also leaves the CPU hotplug
//! test out on kernels that reserve no CPU slot for QEMU under TCG and says so in its summary).
//! Run by hand outside a VM (`--ignored`) they fail: `NRI_RESIZE_IN_VM=1` is missing.
//! Requirements (failing loudly otherwise): root, kernel BTF, tracefs, and the eBPF object built
//! into the test binary (`cargo xtask build-ebpf` first).
//!
//! The QEMU hotplug protocol (implemented by the VM runner): the test writes
//! `$NRI_RESIZE_HOTPLUG_DIR/request` with one line, `cpu` or `memory 128M`, waits up to 120 s
//! for `$NRI_RESIZE_HOTPLUG_DIR/done` holding `ok` or `error: <message>`, and removes `done`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nri_resize::capacity::{self, SysReader, Watcher, WatcherOptions};
use nri_resize::config::Config;
use nri_resize::observer::{
    HotplugStrategy, Observer, ObserverSettings, OomStrategy, ReclaimStrategy, ThrottleStrategy,
};
use nri_resize::policy::CpuSet;
use nri_resize::state::{NodeState, NodeStatus};
use tokio_util::sync::CancellationToken;

/// The tests share the node's CPUs and the watcher's view of them: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn in_vm() -> bool {
    std::env::var("NRI_RESIZE_IN_VM").is_ok_and(|v| v == "1")
}

/// The VM-only tests change the machine's CPUs or memory: outside a VM they fail, never pass.
fn require_vm(what: &str) {
    assert!(
        in_vm(),
        "{what} changes the machine's CPUs or memory, which it does only inside a VM: \
         NRI_RESIZE_IN_VM=1 is not set (the VM tier, `cargo xtask vm-test`, sets it and runs \
         this test with --include-ignored); on a host it never offlines a CPU"
    );
}

/// The runner's QEMU hotplug directory; the test fails without it.
fn hotplug_dir(what: &str) -> PathBuf {
    require_vm(what);
    std::env::var_os("NRI_RESIZE_HOTPLUG_DIR").map_or_else(
        || {
            panic!(
                "{what}: NRI_RESIZE_HOTPLUG_DIR is not set, so no VM runner offers QEMU hotplug \
                 (`cargo xtask vm-test` does)"
            )
        },
        PathBuf::from,
    )
}

/// The observer (owning the attached cpuhp programs) and the watcher task on the real node.
struct Running {
    _observer: Observer,
    state: Arc<NodeState>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn start() -> Self {
        let euid = nix::unistd::geteuid();
        assert!(
            euid.is_root(),
            "capacity_kernel needs root (eBPF, netlink uevents, sysfs) (euid {euid})"
        );
        let mut settings = ObserverSettings::host();
        // Only the cpuhp programs matter here; the rest polls (nothing is read anyway).
        settings.force_throttle = Some(ThrottleStrategy::CpuStatPolling);
        settings.force_reclaim = Some(ReclaimStrategy::MemoryStatPolling);
        settings.force_oom = Some(OomStrategy::MemoryEventsPolling);
        let mut observer = Observer::start(&settings).expect("start the observer");
        assert_eq!(
            observer.strategies().hotplug,
            HotplugStrategy::CpuhpTracepoints,
            "the cpuhp tracepoint programs must load and attach on this kernel; fallbacks: {:?} \
             (no object? run `cargo xtask build-ebpf` and rebuild the test)",
            observer.fallbacks()
        );
        let ring = observer
            .take_hotplug_ring()
            .expect("the observer hands over its cpuhp ring buffer");
        assert!(
            observer.take_hotplug_ring().is_none(),
            "the ring is handed over once"
        );
        let state = NodeState::new(Config::default());
        let watcher =
            Watcher::new(state.clone(), SysReader::new("/")).expect("first reading of the node");
        let cancel = CancellationToken::new();
        let task = tokio::spawn(capacity::run(
            watcher,
            Some(ring),
            None,
            WatcherOptions::host(Duration::from_secs(60)),
            cancel.clone(),
        ));
        let r = Running {
            _observer: observer,
            state,
            cancel,
            task,
        };
        r.wait_for("the event sources to open", Duration::from_secs(10), |s| {
            !s.sources.is_empty()
        })
        .await;
        r
    }

    fn status(&self) -> NodeStatus {
        self.state
            .capacity
            .read()
            .expect("status lock")
            .clone()
            .expect("the watcher publishes a status")
    }

    /// The value of an integral series (0 when absent).
    fn metric(&self, series: &str) -> u64 {
        let text = self.state.metrics.encode().expect("encode metrics");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    }

    /// Waits (polling the published status) until `cond` holds; panics after `limit`.
    async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        cond: impl Fn(&NodeStatus) -> bool,
    ) -> (NodeStatus, Duration) {
        let start = Instant::now();
        let deadline = start + limit;
        loop {
            let s = self.status();
            if cond(&s) {
                return (s, start.elapsed());
            }
            assert!(
                Instant::now() < deadline,
                "{what} not seen after {limit:?} (a generous bound: a wait, not a speed check); status: {s:#?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the watcher stops on cancel")
            .expect("the watcher task does not panic");
    }
}

fn read(path: impl AsRef<Path>) -> String {
    let path = path.as_ref();
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn write(path: impl AsRef<Path>, value: &str) {
    let path = path.as_ref();
    std::fs::write(path, value)
        .unwrap_or_else(|e| panic!("write {value:?} to {}: {e}", path.display()));
}

fn cpu_list(file: &str) -> CpuSet {
    CpuSet::parse(read(format!("/sys/devices/system/cpu/{file}")).trim()).expect("cpu list")
}

fn mem_total_bytes() -> u64 {
    read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("MemTotal in /proc/meminfo")
        * 1024
}

fn print_change(label: &str, s: &NodeStatus, seen_after: Duration) {
    let c = s.last_change.as_ref().expect("a change was recorded");
    eprintln!(
        "{label}: {} via {} — detection latency (kernel event → metric) {} ms; seen by the test {:.1} ms after its write returned",
        c.changes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        c.source,
        c.detection_latency_ms
            .map_or_else(|| "n/a".to_string(), |ms| format!("{ms:.3}")),
        seen_after.as_secs_f64() * 1000.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_reads_the_real_node_with_cpuhp_and_uevents() {
    let _serial = SERIAL.lock().await;
    let r = Running::start().await;
    let s = r.status();
    assert_eq!(
        s.sources,
        ["cpuhp", "uevent", "resync"],
        "every event source opens on this kernel"
    );
    let online = cpu_list("online");
    let present = cpu_list("present");
    assert_eq!(s.online_cpus, online.to_string());
    assert_eq!(s.online_cpu_count, online.count());
    assert_eq!(s.present_cpu_count, present.count());
    assert_eq!(s.memory_bytes, mem_total_bytes());
    if Path::new("/sys/devices/system/memory/block_size_bytes").is_file() {
        assert!(
            s.memory_block_bytes > 0 && s.memory_blocks_present > 0,
            "{s:?}"
        );
        assert!(s.memory_blocks_online <= s.memory_blocks_present, "{s:?}");
    }
    assert!(s.read_error.is_none(), "{s:?}");
    assert_eq!(
        r.metric("nri_resize_node_capacity_cpu_cores"),
        u64::from(online.count())
    );
    assert_eq!(
        r.metric("nri_resize_node_capacity_memory_bytes"),
        mem_total_bytes()
    );
    eprintln!("{}", capacity::node_line(&s, nri_resize::clock::now_ms()));
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_uevents_reach_the_watcher() {
    let _serial = SERIAL.lock().await;
    let r = Running::start().await;
    let series = r#"nri_resize_node_capacity_events_total{source="uevent"}"#;
    let before = r.metric(series);
    // A synthetic `change` uevent: the kernel sends it like any other, nothing changes.
    let mut devices = vec![PathBuf::from("/sys/devices/system/cpu/cpu0/uevent")];
    let memory0 = PathBuf::from("/sys/devices/system/memory/memory0/uevent");
    if memory0.is_file() {
        devices.push(memory0);
    }
    for (i, dev) in devices.iter().enumerate() {
        let sent = Instant::now();
        write(dev, "change");
        let want = before + 1 + u64::try_from(i).expect("few");
        loop {
            if r.metric(series) >= want {
                break;
            }
            assert!(
                Instant::now() < sent + Duration::from_secs(10),
                "no uevent seen 10 s after writing `change` to {}",
                dev.display()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        eprintln!(
            "uevent from {} reached the watcher {:.2} ms after the write",
            dev.display(),
            sent.elapsed().as_secs_f64() * 1000.0
        );
    }
    let s = r.status();
    assert_eq!(s.changes, 0, "a `change` uevent changes no capacity: {s:?}");
    r.stop().await;
}

/// Writes 1 to a CPU's `online` file when dropped: the CPU comes back in every outcome.
struct OnlineAgain(PathBuf);

impl Drop for OnlineAgain {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(&self.0, "1") {
            eprintln!("!!! could not online {} again: {e}", self.0.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "VM only: offlines a CPU (the VM tier runs it with --include-ignored and NRI_RESIZE_IN_VM=1)"]
async fn cpu_offline_and_online_are_detected_in_a_vm() {
    let _serial = SERIAL.lock().await;
    require_vm("cpu_offline_and_online_are_detected_in_a_vm");
    let file = PathBuf::from("/sys/devices/system/cpu/cpu1/online");
    assert!(
        file.is_file(),
        "the VM needs a second, hot-pluggable CPU (e.g. qemu -smp 2): no {}",
        file.display()
    );
    if read(&file).trim() == "0" {
        write(&file, "1");
    }
    let r = Running::start().await;
    let before = r.status();
    let guard = OnlineAgain(file.clone());

    let down = r#"nri_resize_node_capacity_changes_total{direction="down",resource="cpu"}"#;
    let up = r#"nri_resize_node_capacity_changes_total{direction="up",resource="cpu"}"#;
    write(&file, "0");
    let written = Instant::now();
    let (s, _) = r
        .wait_for("CPU 1 offline", Duration::from_secs(60), |s| {
            s.online_cpu_count == before.online_cpu_count - 1
        })
        .await;
    print_change("cpu1 offline", &s, written.elapsed());
    assert!(!CpuSet::parse(&s.online_cpus)
        .expect("list")
        .iter()
        .any(|c| c == 1));
    assert_eq!(r.metric(down), 1);

    write(&file, "1");
    let written = Instant::now();
    let (s, _) = r
        .wait_for("CPU 1 online", Duration::from_secs(60), |s| {
            s.online_cpu_count == before.online_cpu_count
        })
        .await;
    print_change("cpu1 online", &s, written.elapsed());
    assert_eq!(r.metric(up), 1);
    assert_eq!(s.changes, 2, "{s:?}");
    assert_eq!(s.online_cpus, before.online_cpus);
    let samples = r.metric(r#"nri_resize_node_capacity_detection_seconds_count{source="cpuhp"}"#)
        + r.metric(r#"nri_resize_node_capacity_detection_seconds_count{source="uevent"}"#);
    assert!(samples >= 2, "each change has a latency sample");
    drop(guard);
    r.stop().await;
}

/// Asks the VM runner for a QEMU hotplug and waits for its answer.
fn hotplug(dir: &Path, request: &str) {
    let done = dir.join("done");
    let _ = std::fs::remove_file(&done);
    let tmp = dir.join("request.tmp");
    write(&tmp, &format!("{request}\n"));
    std::fs::rename(&tmp, dir.join("request")).expect("publish the hotplug request");
    let asked = Instant::now();
    let answer = loop {
        if let Ok(text) = std::fs::read_to_string(&done) {
            // The runner ends its answer with a newline: a shorter read is a partial write.
            if text.ends_with('\n') {
                break text;
            }
        }
        assert!(
            Instant::now() < asked + Duration::from_secs(120),
            "the VM runner did not answer {request:?} within 120 s (no {})",
            done.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    std::fs::remove_file(&done).expect("remove done");
    let answer = answer.trim();
    assert_eq!(answer, "ok", "QEMU hotplug {request:?} failed: {answer}");
    eprintln!(
        "QEMU hotplug {request:?} done after {:.1} s",
        asked.elapsed().as_secs_f64()
    );
}

/// The possible CPUs must exceed the present ones: the slot QEMU plugs a CPU into.
fn require_a_cpu_slot() {
    let (possible, present) = (cpu_list("possible"), cpu_list("present"));
    assert!(
        possible.count() > present.count(),
        "kernel {}: {} possible CPUs = present: the kernel reserved no slot for QEMU's spare CPU \
         (Debian's 6.9+ kernels under TCG), so CPU hotplug cannot be exercised here; the VM tier \
         leaves this test out on such kernels (`xtask/src/vm.rs`)",
        read("/proc/sys/kernel/osrelease").trim(),
        possible.count()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "VM only: needs the VM runner's QEMU CPU hotplug (NRI_RESIZE_HOTPLUG_DIR)"]
async fn qemu_cpu_hotplug_is_detected_in_a_vm() {
    let _serial = SERIAL.lock().await;
    let dir = hotplug_dir("qemu_cpu_hotplug_is_detected_in_a_vm");
    // A new CPU becomes present; it is onlined here if the kernel did not.
    require_a_cpu_slot();
    let r = Running::start().await;
    qemu_cpu_hotplug(&r, &dir).await;
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "VM only: needs the VM runner's QEMU memory hotplug (NRI_RESIZE_HOTPLUG_DIR)"]
async fn qemu_memory_hotplug_is_detected_in_a_vm() {
    let _serial = SERIAL.lock().await;
    let dir = hotplug_dir("qemu_memory_hotplug_is_detected_in_a_vm");
    let r = Running::start().await;
    qemu_memory_hotplug(&r, &dir).await;
    r.stop().await;
}

async fn qemu_cpu_hotplug(r: &Running, dir: &Path) {
    let before = r.status();
    let present_before = CpuSet::parse(&before.present_cpus).expect("list");
    let dir_for_cpu = dir.to_owned();
    tokio::task::spawn_blocking(move || hotplug(&dir_for_cpu, "cpu"))
        .await
        .expect("hotplug cpu");
    let (s, t) = r
        .wait_for("a hot-added CPU in present", Duration::from_secs(60), |s| {
            s.present_cpu_count > before.present_cpu_count
        })
        .await;
    print_change("cpu hot-added (present)", &s, t);
    let added: Vec<u32> = CpuSet::parse(&s.present_cpus)
        .expect("list")
        .difference(&present_before)
        .iter()
        .collect();
    assert!(!added.is_empty(), "{s:?}");
    let now = r.status();
    if now.online_cpu_count <= before.online_cpu_count {
        for cpu in &added {
            let online = format!("/sys/devices/system/cpu/cpu{cpu}/online");
            if read(&online).trim() == "0" {
                write(&online, "1");
            }
        }
    }
    let written = Instant::now();
    let (s, _) = r
        .wait_for("the hot-added CPU online", Duration::from_secs(60), |s| {
            s.online_cpu_count > before.online_cpu_count
        })
        .await;
    print_change("cpu hot-added (online)", &s, written.elapsed());
    assert!(
        r.metric(r#"nri_resize_node_capacity_changes_total{direction="up",resource="cpu"}"#) >= 1
    );
}

async fn qemu_memory_hotplug(r: &Running, dir: &Path) {
    // Memory: new blocks appear; they are onlined here if the kernel did not.
    let before = r.status();
    let blocks_before = memory_blocks();
    let dir_for_mem = dir.to_owned();
    tokio::task::spawn_blocking(move || hotplug(&dir_for_mem, "memory 128M"))
        .await
        .expect("hotplug memory");
    let (s, t) = r
        .wait_for("hot-added memory blocks", Duration::from_secs(60), |s| {
            s.memory_blocks_present > before.memory_blocks_present
        })
        .await;
    print_change("memory hot-added (blocks present)", &s, t);
    let new_blocks: Vec<PathBuf> = memory_blocks()
        .into_iter()
        .filter(|b| !blocks_before.contains(b))
        .collect();
    assert!(!new_blocks.is_empty(), "{s:?}");
    for block in &new_blocks {
        let state = block.join("state");
        if read(&state).trim() == "offline" {
            write(&state, "online");
        }
    }
    let written = Instant::now();
    let (s, _) = r
        .wait_for("MemTotal to grow", Duration::from_secs(60), |s| {
            s.memory_bytes > before.memory_bytes
        })
        .await;
    print_change("memory hot-added (online)", &s, written.elapsed());
    assert_eq!(s.memory_bytes, mem_total_bytes());
    assert!(
        s.memory_blocks_online > before.memory_blocks_online,
        "{s:?}"
    );
    assert!(
        r.metric(r#"nri_resize_node_capacity_changes_total{direction="up",resource="memory"}"#)
            >= 1
    );
}

fn memory_blocks() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/sys/devices/system/memory")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .and_then(|n| n.strip_prefix("memory"))
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
