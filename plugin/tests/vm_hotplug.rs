//! Self-test of the VM tier's hotplug protocol (`cargo xtask vm-test`, see `xtask/src/vm.rs`):
//! the guest asks the host runner for a CPU through `$NRI_RESIZE_HOTPLUG_DIR/request`, the runner
//! plugs one through QMP and answers in `done`, and the guest's `/sys/devices/system/cpu/present`
//! grows; then the same for a 128 MiB DIMM and `MemTotal`. Proves the host side without the
//! capacity watcher.
//!
//! Outside the VM (no `NRI_RESIZE_HOTPLUG_DIR`) there is nobody to plug a CPU: the test says so
//! and returns; the VM tier always runs it with the variable set.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// CPUs in a kernel cpu list such as `0-1,3`.
fn count_cpus(list: &str) -> usize {
    list.trim()
        .split(',')
        .filter(|r| !r.is_empty())
        .map(|r| match r.split_once('-') {
            Some((a, b)) => {
                let a: usize = a.parse().expect("cpu number");
                let b: usize = b.parse().expect("cpu number");
                b - a + 1
            }
            None => 1,
        })
        .sum()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn mem_total_kib() -> u64 {
    read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal in /proc/meminfo")
}

/// Asks for a CPU and waits for `present` to grow by one.
fn cpu_hotplug(dir: &Path, present: &str, before: usize) {
    let answer = request_hotplug(dir, "cpu");
    assert_eq!(answer, "ok", "the host runner could not plug a CPU");
    // ACPI delivers the new CPU asynchronously.
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let now = count_cpus(&read(present));
        if now > before || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "present CPUs: {before} before, {after} after the hotplug ({})",
        read(present).trim()
    );
    assert_eq!(after, before + 1, "{present} did not grow by one CPU");

    // The new CPU comes up offline; bring it online, then back offline so the suites that
    // follow in this guest see the CPUs they booted with.
    let online = "/sys/devices/system/cpu/online";
    let online_before = count_cpus(&read(online));
    let new_cpu = (0..64)
        .map(|n| PathBuf::from(format!("/sys/devices/system/cpu/cpu{n}/online")))
        .find(|p| std::fs::read_to_string(p).is_ok_and(|v| v.trim() == "0"))
        .expect("the plugged CPU is present and offline");
    std::fs::write(&new_cpu, "1").unwrap_or_else(|e| panic!("online {}: {e}", new_cpu.display()));
    assert_eq!(
        count_cpus(&read(online)),
        online_before + 1,
        "{online} after onlining {}",
        new_cpu.display()
    );
    std::fs::write(&new_cpu, "0").unwrap_or_else(|e| panic!("offline {}: {e}", new_cpu.display()));
    assert_eq!(
        count_cpus(&read(online)),
        online_before,
        "{online} after offlining it again"
    );
    eprintln!("{} went online and offline again", new_cpu.display());
}

/// Asks the host runner for `what` (`cpu` or `memory 128M`) and returns its answer.
fn request_hotplug(dir: &Path, what: &str) -> String {
    let request = dir.join("request");
    let done = dir.join("done");
    let _ = std::fs::remove_file(&done);
    // Written whole under another name, then renamed: the runner never sees half a request.
    let partial = dir.join(".request.tmp");
    std::fs::write(&partial, format!("{what}\n")).expect("write the request");
    std::fs::rename(&partial, &request).expect("publish the request");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(answer) = std::fs::read_to_string(&done) {
            if answer.ends_with('\n') {
                std::fs::remove_file(&done).expect("remove done");
                return answer.trim().to_owned();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the host runner did not answer {what:?} within 60 s (request still there: {})",
            request.exists()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_cpu_and_a_dimm_requested_from_the_host_runner_appear_in_the_guest() {
    let Some(dir) = std::env::var_os("NRI_RESIZE_HOTPLUG_DIR").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED: NRI_RESIZE_HOTPLUG_DIR is not set — this test runs inside the VM tier \
             (`cargo xtask vm-test`), where the host runner plugs CPUs through QMP"
        );
        return;
    };
    let present = "/sys/devices/system/cpu/present";
    let before = count_cpus(&read(present));
    let possible = count_cpus(&read("/sys/devices/system/cpu/possible"));
    let release = read("/proc/sys/kernel/osrelease");
    let mut numbers = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    if possible > before {
        cpu_hotplug(&dir, present, before);
    } else {
        assert!(
            version >= (6, 9),
            "kernel {} (before the 6.9 topology rework) must count QEMU's spare CPU slot as possible",
            release.trim()
        );
        // Debian's 6.12.y (with the 2025 fix for QEMU CPU hotplug) counts QEMU's hot-pluggable
        // CPU slots only when it recognises a hypervisor, and software emulation (TCG) is none:
        // the kernel has no number for a new CPU. Said loudly; the memory half still runs.
        eprintln!(
            "NOTE: CPU hotplug NOT exercised on kernel {}: {possible} possible CPUs = {before} present \
             (the kernel reserved no slot for QEMU's spare CPU under TCG)",
            read("/proc/sys/kernel/osrelease").trim()
        );
    }

    // Memory: a 128 MiB DIMM, onlined by the kernel (`memhp_default_state=online`).
    let before = mem_total_kib();
    let answer = request_hotplug(&dir, "memory 128M");
    assert_eq!(answer, "ok", "the host runner could not plug a DIMM");
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let now = mem_total_kib();
        if now >= before + 64 * 1024 || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("MemTotal: {before} kB before, {after} kB after the DIMM");
    assert!(
        after >= before + 64 * 1024,
        "MemTotal did not grow by a 128 MiB DIMM: {before} → {after} kB"
    );

    // A malformed request gets an error answer, and the protocol carries on.
    let answer = request_hotplug(&dir, "gpu");
    assert!(
        answer.starts_with("error: "),
        "a bad request must be refused, got {answer:?}"
    );
}

#[test]
fn cpu_lists_are_counted() {
    assert_eq!(count_cpus("0\n"), 1);
    assert_eq!(count_cpus("0-1\n"), 2);
    assert_eq!(count_cpus("0-1,3,5-6\n"), 5);
}
