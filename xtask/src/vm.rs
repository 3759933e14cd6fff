//! `cargo xtask vm-test`: the portability tier. Boots Debian's own kernels under QEMU (TCG
//! software emulation, cgroup v2 only) and runs the [`SUITES`] inside them.
//!
//! - Kernels come from Debian packages, downloaded with `apt-get download` and unpacked (never
//!   installed) into `/var/cache/nri-resize/vm/<kernel>/`: the uncompressed `vmlinux` (booted
//!   directly through its PVH note with qboot; ~15 s from QEMU start to the first suite) and the
//!   few modules the guest needs.
//! - The initramfs is busybox-static + `xtask/scripts/vm/init.sh` + those modules. The guest's root
//!   is an overlay of the host's `/` (9p, read-only) with a tmpfs upper layer, so test binaries
//!   built on the host run unchanged with the host's libraries. `/tmp` is a virtio ext4 disk.
//! - The run directory (`/var/cache/nri-resize/vm/run-<kernel>-<pid>`) is shared writable at the
//!   same path: the generated `guest.sh`, each suite's log, the results and the hotplug protocol.
//!   It is removed after a passing run unless `NRI_RESIZE_VM_KEEP_RUN` is set.
//! - Hotplug protocol (guest tests ↔ this runner): a test writes `$NRI_RESIZE_HOTPLUG_DIR/request`
//!   containing `cpu` or `memory <size>` (e.g. `memory 128M`); the runner performs it through QMP,
//!   deletes `request` and writes `done` (`ok` or `error: <message>`); the test waits for `done`
//!   and removes it.
//!
//! The kernels boot side by side (one QEMU each, its vCPUs on one host thread); in a guest, suites
//! run one after another, each binary with `--test-threads=1`. Every QEMU process is owned
//! by a guard that kills it on every exit path (and dies with the runner: `PR_SET_PDEATHSIG`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};

use crate::cross::Arch;

/// One run of a test binary in the guest. Adding a suite is one line in [`SUITES`].
#[derive(Clone, Copy, Debug)]
pub struct Suite {
    /// Name of the run in the output and the summary (`--suite` takes it or `test`).
    pub name: &'static str,
    /// Cargo package of the test target.
    pub package: &'static str,
    /// Integration test target (`--test <name>`).
    pub test: &'static str,
    /// Test-name filter passed to the binary (`""`: all tests of the target).
    pub filter: &'static str,
    /// Lists of tests left out of this run (`--skip`, substring), each because it runs in
    /// another run of the same binary: a `..._containerd_1_7` test is the twin of its
    /// `..._containerd_2`, and a test of [`SPLIT_TO_1_7`] or [`SPLIT_TO_2`] runs in one guest.
    pub skip: &'static [&'static [&'static str]],
    /// Extra environment for the binary (the runner always sets `NRI_RESIZE_IN_VM=1` and
    /// `NRI_RESIZE_HOTPLUG_DIR`). `{root}` in a value is the workspace root.
    pub env: &'static [(&'static str, &'static str)],
    /// The kernels (`Kernel::name`) that run it.
    pub kernels: &'static [&'static str],
    /// Longest the suite may take in the guest (everything runs 10–50× slower than native).
    pub timeout_s: u64,
}

impl Suite {
    fn runs_on(&self, kernel: &Kernel) -> bool {
        self.kernels.contains(&kernel.name)
    }

    fn needs_plugin(&self) -> bool {
        self.package == "nri-resize-tests"
    }
}

/// The harness's knob for another containerd 2.x build (`tests/src/version.rs`).
const CONTAINERD_BIN_ENV: &str = "NRI_RESIZE_CONTAINERD_BIN";
/// The harness's knob for a CRI-O build (`tests/src/crio.rs`), passed to the guests the same
/// way: by hand, the real-runtime suites then run against CRI-O on cgroup v2.
const CRIO_BIN_ENV: &str = "NRI_RESIZE_CRIO_BIN";

/// The benchmark table's file (`plugin/src/bench_table.rs`), passed through to the guest.
const BENCH_TABLE_ENV: &str = "NRI_RESIZE_BENCH_TABLE";
/// Where the guest writes its rows, in the run directory.
const GUEST_BENCH_TABLE: &str = "bench-table.jsonl";

/// Appends the rows the guest wrote in `run` to the host's benchmark table, if one is set.
fn copy_bench_rows(run: &Path) -> anyhow::Result<()> {
    let (Some(table), Ok(rows)) = (
        std::env::var_os(BENCH_TABLE_ENV),
        std::fs::read_to_string(run.join(GUEST_BENCH_TABLE)),
    ) else {
        return Ok(());
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&table)
        .with_context(|| format!("open {}", table.to_string_lossy()))?;
    f.write_all(rows.as_bytes())
        .with_context(|| format!("append to {}", table.to_string_lossy()))
}

/// Under the workspace root: the plugin binary and image the guests run (see [`build`]).
const VM_FILES: &str = "target/vm";
/// Every kernel of the tier.
const ALL: &[&str] = &["6.1", "6.12", "5.10", "7.2", "6.12-arm64"];
/// trixie's arm64 kernel (`qemu-system-aarch64`).
const ARM64: &[&str] = &["6.12-arm64"];
/// trixie's 6.12 booted with systemd as PID 1: kubelet's systemd cgroup driver.
const SYSTEMD: &[&str] = &["6.12-systemd"];
/// sid's newest: the newest reclaim code.
const SID: &[&str] = &["7.2"];
/// The kernels whose TCG guests have a CPU slot for QEMU's hotplug (5.10, 6.1) and those that
/// do not (6.12, 7.2: possible CPUs = present).
const OLDEST_TWO: &[&str] = &["6.1", "5.10"];
const NEWEST_TWO: &[&str] = &["6.12", "7.2"];
/// The kernel the real-runtime suites run on (trixie's, what current nodes boot).
const NEWEST: &[&str] = &["6.12"];
/// bookworm's kernel.
const OLDEST: &[&str] = &["6.1"];
/// bookworm's kernel with 128 possible CPUs ([`GuestCpus::ManyPossible`]).
const MANY_CPUS_KERNEL: &[&str] = &["6.1-128cpus"];
/// Every harness containerd of the run is 2.1.9 (`NRI_RESIZE_CONTAINERD`), and the plugin is
/// the binary built on the host.
const ON_2: &[(&str, &str)] = &[
    ("NRI_RESIZE_CONTAINERD", "2"),
    // Debian's 6.1 and 6.12 throttle through `fentry` and count reclaim through `fexit` (no
    // memcg tracepoint): `observer_containerd` and `image_containerd` assert it.
    ("NRI_RESIZE_EXPECT_THROTTLE", "fentry"),
    ("NRI_RESIZE_EXPECT_RECLAIM", "fexit"),
    ("NRI_RESIZE_BIN", "{root}/target/vm/nri-resize"),
    (
        "NRI_RESIZE_IMAGE_ARCHIVE",
        "{root}/target/vm/nri-resize.oci.tar",
    ),
];
/// [`ON_2`] in the guest with 128 possible CPUs, which the test checks it has.
const ON_2_MANY_CPUS: &[(&str, &str)] = &[
    ("NRI_RESIZE_CONTAINERD", "2"),
    ("NRI_RESIZE_EXPECT_THROTTLE", "fentry"),
    ("NRI_RESIZE_EXPECT_RECLAIM", "fexit"),
    ("NRI_RESIZE_EXPECT_POSSIBLE_CPUS", "0-127"),
    ("NRI_RESIZE_BIN", "{root}/target/vm/nri-resize"),
    (
        "NRI_RESIZE_IMAGE_ARCHIVE",
        "{root}/target/vm/nri-resize.oci.tar",
    ),
];
/// The same with containerd 1.7.24.
const ON_1_7: &[(&str, &str)] = &[
    ("NRI_RESIZE_CONTAINERD", "1.7"),
    // Debian's 6.1 and 6.12 throttle through `fentry` and count reclaim through `fexit` (no
    // memcg tracepoint): `observer_containerd` and `image_containerd` assert it.
    ("NRI_RESIZE_EXPECT_THROTTLE", "fentry"),
    ("NRI_RESIZE_EXPECT_RECLAIM", "fexit"),
    ("NRI_RESIZE_BIN", "{root}/target/vm/nri-resize"),
    (
        "NRI_RESIZE_IMAGE_ARCHIVE",
        "{root}/target/vm/nri-resize.oci.tar",
    ),
];
/// [`ON_2`] with kubelet's systemd cgroup driver and runc's (`SystemdCgroup = true`): pod
/// cgroups are slices systemd makes, container cgroups `cri-containerd-<id>.scope` units.
const ON_2_SYSTEMD: &[(&str, &str)] = &[
    ("NRI_RESIZE_CONTAINERD", "2"),
    ("NRI_RESIZE_CGROUP_DRIVER", "systemd"),
    ("NRI_RESIZE_EXPECT_THROTTLE", "fentry"),
    ("NRI_RESIZE_EXPECT_RECLAIM", "fexit"),
    ("NRI_RESIZE_BIN", "{root}/target/vm/nri-resize"),
    (
        "NRI_RESIZE_IMAGE_ARCHIVE",
        "{root}/target/vm/nri-resize.oci.tar",
    ),
];
/// The arm64 guest's containerd (trixie's 1.7.24 for arm64, in its userland) and the plugin
/// cross-built for it; the harness's images come from the host (`NRI_RESIZE_TEST_IMAGES`).
const ON_1_7_ARM64: &[(&str, &str)] = &[
    ("NRI_RESIZE_CONTAINERD", "1.7"),
    ("NRI_RESIZE_EXPECT_THROTTLE", "fentry"),
    ("NRI_RESIZE_EXPECT_RECLAIM", "fexit"),
    ("NRI_RESIZE_BIN", "{root}/target/vm/aarch64/nri-resize"),
];
/// [`ON_1_7_ARM64`] with the image archive.
const ON_1_7_ARM64_IMAGE: &[(&str, &str)] = &[
    ("NRI_RESIZE_CONTAINERD", "1.7"),
    ("NRI_RESIZE_EXPECT_THROTTLE", "fentry"),
    ("NRI_RESIZE_EXPECT_RECLAIM", "fexit"),
    ("NRI_RESIZE_BIN", "{root}/target/vm/aarch64/nri-resize"),
    (
        "NRI_RESIZE_IMAGE_ARCHIVE",
        "{root}/target/vm/nri-resize.oci.tar",
    ),
];
/// Twins named for 1.7, left out where every containerd is 2.1.9 (their `_2` twin runs).
const TWINS_1_7: &[&str] = &[
    "smoke_containerd_1_7",
    "plugin_lifecycle_containerd_1_7",
    "whole_pod_resize_of_three_guaranteed_containers_containerd_1_7",
    "memory_decrease_side_by_side_containerd_1_7",
    "observer_through_containerd_1_7",
    "daemon_image_as_deployed_in_containerd_1_7",
    "every_event_of_a_pods_life_containerd_1_7",
    "restart_happens_and_is_confirmed_containerd_1_7",
    "kubelet_sees_progress_and_reason_containerd_1_7",
    "a_stale_pod_usage_read_never_ooms_the_pod_containerd_1_7",
    "pod_level_resize_containerd_1_7",
    "nri_resize_coexists_with_another_nri_plugin_containerd_1_7",
    "slow_cgroup_fails_open_containerd_1_7",
    "slow_usage_read_refuses_a_memory_decrease_containerd_1_7",
    "a_container_raised_above_its_pod_cgroup_is_reported_capped_containerd_1_7",
    "vpa_decrease_with_and_without_trimming_containerd_1_7",
    "kubelet_updates_beside_whole_pod_resizes_never_hang_containerd_1_7",
];
/// Twins named for 2, left out where every containerd is 1.7.24 (their `_1_7` twin runs).
const TWINS_2: &[&str] = &[
    "smoke_containerd_2",
    "plugin_lifecycle_containerd_2",
    "whole_pod_resize_of_three_guaranteed_containers_containerd_2",
    "memory_decrease_side_by_side_containerd_2",
    "observer_through_containerd_2",
    "daemon_image_as_deployed_in_containerd_2",
    "every_event_of_a_pods_life_containerd_2",
    "restart_happens_and_is_confirmed_containerd_2",
    "kubelet_sees_progress_and_reason_containerd_2",
    "a_stale_pod_usage_read_never_ooms_the_pod_containerd_2",
    "pod_level_resize_containerd_2",
    "nri_resize_coexists_with_another_nri_plugin_containerd_2",
    "slow_cgroup_fails_open_containerd_2",
    "slow_usage_read_refuses_a_memory_decrease_containerd_2",
    "a_container_raised_above_its_pod_cgroup_is_reported_capped_containerd_2",
    "vpa_decrease_with_and_without_trimming_containerd_2",
    "kubelet_updates_beside_whole_pod_resizes_never_hang_containerd_2",
];

/// Tests that are not twins, of suites whose guest runs are split between two runs: these run
/// against 1.7.24 only; the rest ([`SPLIT_TO_2`]) against 2.1.9 only (`faults` on 6.1;
/// `resize_runtime` runs whole against 2.1.9 in the systemd driver's guest). Each still runs
/// once on cgroup v2 and, on the host, on v1; the twins (what differs between containerd
/// versions) run against both.
const SPLIT_TO_1_7: &[&str] = &[
    "a_cli_killed_mid_resize_leaves_the_resize_running_and_the_next_one_runs",
    "kubelet_style_update_that_fails_on_v1_without_ordering_succeeds",
    "plugin_killed_mid_memory_decrease_resumes_from_its_checkpoint",
    "containerd_restart_metrics_continue",
];
/// The split suites' other tests, which run against 2.1.9 only.
const SPLIT_TO_2: &[&str] = &[
    "resize_policy_and_actions",
    "admission_enforce_and_observe",
    "admission_defers_what_does_not_fit_next_to_other_pods",
    "admission_reserve_comes_from_kubelet",
    "plugin_killed_mid_resize_resumes_from_its_checkpoint",
    "a_newer_request_mid_resize_wins",
    "container_removed_during_a_reclaim_is_one_clear_line_not_a_retry_storm",
    "unusable_or_corrupt_state_dir_is_reported_and_the_daemon_serves",
    "sigterm_during_a_staged_decrease_exits_at_once_and_resumes",
    "observe_mode_does_not_resume_checkpoints",
];
/// The suites whose guest runs are split ([`SPLIT_TO_1_7`], [`SPLIT_TO_2`]), as the tests check.
#[cfg(test)]
const SPLIT_SUITES: &[&str] = &["resize_runtime", "faults"];

/// The kernel-without-BTF test of `image_containerd`, run against 2.1.9 on 6.12 in its own run.
const NO_BTF: &[&str] = &["daemon_image_on_a_node_without_kernel_btf"];

/// The many-possible-CPUs test of `image_containerd`, run in its own guest
/// ([`GuestCpus::ManyPossible`]).
const MANY_CPUS: &[&str] = &["daemon_image_on_a_node_with_many_possible_cpus"];

/// Test binaries whose VM-only tests are `#[ignore]`d (they change the machine's CPUs and
/// memory, need cgroup v2, or are benchmarks): the guest runs them with `--include-ignored`.
const WITH_IGNORED: &[&str] = &[
    "vm_hotplug",
    "capacity_kernel",
    "cgroup_kernel",
    "trim_load",
];

/// Benchmark-only suites: run when named (`--suite`, as `cargo xtask bench` does), never in
/// the whole tier (`cargo xtask test`'s time budget). Their tests are `#[ignore]`d on hosts.
const BENCH_ONLY: &[&str] = &["trim_load@2.1"];

/// The QEMU CPU hotplug tests, left out where the kernel reserves no CPU slot for QEMU under
/// TCG (Debian's 6.12: possible CPUs = present); they would fail there, not pass unexercised.
const NO_CPU_SLOT: &[&str] = &[
    "a_cpu_requested_from_the_host_runner_appears_in_the_guest",
    "qemu_cpu_hotplug_is_detected_in_a_vm",
];

/// The QEMU hotplug tests of `capacity_kernel`, left out on arm64's `virt` machine booted from a
/// device tree (no ACPI: QEMU cannot hotplug CPUs or DIMMs there).
const NO_QEMU_HOTPLUG: &[&str] = &[
    "a_cpu_requested_from_the_host_runner_appears_in_the_guest",
    "qemu_cpu_hotplug_is_detected_in_a_vm",
    "qemu_memory_hotplug_is_detected_in_a_vm",
];

/// What the guest runs, in order. To add a suite, add one line here. The soak runs natively only.
#[rustfmt::skip]
pub const SUITES: &[Suite] = &[
    // Kernel-facing suites: every kernel.
    // The hotplug suites' VM-only tests are `#[ignore]`d on hosts: the guest runs them with
    // `--include-ignored` (`WITH_IGNORED`). QEMU CPU hotplug only where the kernel reserves a
    // CPU slot for it: not Debian's 6.12 under TCG (`NO_CPU_SLOT`: left out, named in the summary).
    Suite { name: "vm_hotplug",      package: "nri-resize", test: "vm_hotplug",      filter: "", skip: &[],          env: &[], kernels: OLDEST, timeout_s: 120 },
    Suite { name: "vm_hotplug-no-cpu-slot", package: "nri-resize", test: "vm_hotplug", filter: "", skip: &[NO_CPU_SLOT], env: &[], kernels: NEWEST, timeout_s: 120 },
    Suite { name: "cgroup_kernel",   package: "nri-resize", test: "cgroup_kernel",   filter: "", skip: &[], env: &[], kernels: ALL, timeout_s: 600 },
    Suite { name: "observer_kernel", package: "nri-resize", test: "observer_kernel", filter: "", skip: &[], env: &[("NRI_RESIZE_EXPECT_THROTTLE", "fentry"), ("NRI_RESIZE_EXPECT_RECLAIM", "fexit")], kernels: ALL, timeout_s: 420 },
    Suite { name: "capacity_kernel", package: "nri-resize", test: "capacity_kernel", filter: "", skip: &[],          env: &[], kernels: OLDEST_TWO, timeout_s: 300 },
    Suite { name: "capacity_kernel-no-cpu-slot", package: "nri-resize", test: "capacity_kernel", filter: "", skip: &[NO_CPU_SLOT], env: &[], kernels: NEWEST_TWO, timeout_s: 300 },
    Suite { name: "capacity_kernel-no-hotplug", package: "nri-resize", test: "capacity_kernel", filter: "", skip: &[NO_QEMU_HOTPLUG], env: &[], kernels: ARM64, timeout_s: 300 },
    // A real-containerd smoke on arm64: the plugin registers, a CRI resize and its own update
    // reach the cgroups and ContainerStatus and are confirmed, it survives its own and
    // containerd's restarts; and the observer sees a live pod's throttling through eBPF.
    Suite { name: "nri_runtime@1.7-arm64", package: "nri-resize-tests", test: "nri_runtime", filter: "plugin_lifecycle_containerd_1_7", skip: &[], env: ON_1_7_ARM64, kernels: ARM64, timeout_s: 600 },
    Suite { name: "observer_containerd@1.7-arm64", package: "nri-resize-tests", test: "observer_containerd", filter: "observer_through_containerd_1_7", skip: &[], env: ON_1_7_ARM64, kernels: ARM64, timeout_s: 600 },
    // The daemon's image index (amd64 + arm64) imported by arm64's containerd: its arm64
    // binary runs as the DaemonSet runs it.
    Suite { name: "image_containerd@1.7-arm64", package: "nri-resize-tests", test: "image_containerd", filter: "daemon_image_as_deployed_in_containerd_1_7", skip: &[], env: ON_1_7_ARM64_IMAGE, kernels: ARM64, timeout_s: 600 },
    // Every test of the real-runtime suites runs once on cgroup v2, in one guest against one
    // containerd (a pair of twins counts as one test), each suite where the two lanes end
    // close to each other. The host runs
    // every test against both versions on cgroup v1. Memory decrease faces the kernel (reclaim,
    // OOM inside the write) and the core suites differ most between NRI versions: those run in
    // both guests, against both versions (the split suites' other tests in one guest only).
    // Memory decrease against 2.1.9 and paced reclaim on sid's newest kernel (the newest
    // reclaim code), which boots after 6.12 in its lane; against 1.7.24 on 6.1, below.
    Suite { name: "memory_decrease@2.1",    package: "nri-resize-tests", test: "memory_decrease",    filter: "", skip: &[TWINS_1_7], env: ON_2,   kernels: SID, timeout_s: 900 },
    Suite { name: "reclaim_pacing@2.1",     package: "nri-resize-tests", test: "reclaim_pacing",     filter: "", skip: &[],       env: ON_2,   kernels: SID, timeout_s: 600 },
    // Containerd 2.1.9 on 6.1's kernel too (the lanes end closer with these there).
    Suite { name: "nri_runtime@2.1",     package: "nri-resize-tests", test: "nri_runtime",     filter: "", skip: &[TWINS_1_7], env: ON_2,   kernels: OLDEST, timeout_s: 600 },
    // `resize_runtime` against 2.1.9 runs whole in the systemd driver's guest (below); its
    // split share against 1.7.24 on 6.1 with the cgroupfs driver.
    Suite { name: "faults@2.1",             package: "nri-resize-tests", test: "faults",             filter: "", skip: &[TWINS_1_7, SPLIT_TO_1_7], env: ON_2,   kernels: OLDEST, timeout_s: 900 },
    // A VPA-driven decrease through kubelet ≥ 1.34 with and without working-set trimming (v2's
    // memory.reclaim and PSI): `cargo xtask bench` runs it here, as a benchmark.
    // The DaemonSet on a node whose /sys/kernel has no btf: it starts and polls; with
    // `--btf-path` it loads eBPF (tests/src/sys_kernel.rs: what the guest hides and how).
    Suite { name: "image_no_btf@2.1",       package: "nri-resize-tests", test: "image_containerd",   filter: "without_kernel_btf", skip: &[], env: ON_2, kernels: NEWEST, timeout_s: 600 },
    Suite { name: "trim_containerd@2.1",    package: "nri-resize-tests", test: "trim_containerd",    filter: "", skip: &[TWINS_1_7], env: ON_2,   kernels: NEWEST, timeout_s: 900 },
    // NRI handler latency with and without trimming 200 containers: a benchmark only
    // (`BENCH_ONLY`: ~15 minutes of guest time), run by `cargo xtask bench`.
    Suite { name: "trim_load@2.1",          package: "nri-resize-tests", test: "trim_load",          filter: "", skip: &[],          env: ON_2,   kernels: NEWEST, timeout_s: 2400 },
    Suite { name: "nri_runtime@1.7",     package: "nri-resize-tests", test: "nri_runtime",     filter: "", skip: &[TWINS_2],   env: ON_1_7, kernels: OLDEST, timeout_s: 600 },
    Suite { name: "resize_runtime@1.7",  package: "nri-resize-tests", test: "resize_runtime",  filter: "", skip: &[TWINS_2, SPLIT_TO_2],   env: ON_1_7, kernels: OLDEST, timeout_s: 900 },
    Suite { name: "memory_decrease@1.7",    package: "nri-resize-tests", test: "memory_decrease",    filter: "", skip: &[TWINS_2],   env: ON_1_7, kernels: OLDEST, timeout_s: 900 },
    Suite { name: "faults@1.7",             package: "nri-resize-tests", test: "faults",             filter: "", skip: &[TWINS_2, SPLIT_TO_2],   env: ON_1_7, kernels: OLDEST, timeout_s: 900 },
    Suite { name: "observer_containerd@1.7", package: "nri-resize-tests", test: "observer_containerd", filter: "", skip: &[TWINS_2], env: ON_1_7, kernels: OLDEST, timeout_s: 900 },
    Suite { name: "image_containerd@1.7",   package: "nri-resize-tests", test: "image_containerd",   filter: "", skip: &[TWINS_2, NO_BTF, MANY_CPUS],   env: ON_1_7, kernels: OLDEST, timeout_s: 600 },
    // The DaemonSet as deployed on a node with 128 possible CPUs: its eBPF maps load, and it
    // stays within its memory limit with every measurement on eBPF.
    Suite { name: "image_many_cpus@2.1",    package: "nri-resize-tests", test: "image_containerd",   filter: "many_possible_cpus", skip: &[], env: ON_2_MANY_CPUS, kernels: MANY_CPUS_KERNEL, timeout_s: 600 },
    Suite { name: "harness_smoke@1.7",      package: "nri-resize-tests", test: "harness_smoke",      filter: "", skip: &[TWINS_2],   env: ON_1_7, kernels: OLDEST, timeout_s: 300 },
    Suite { name: "pod_level_runtime@1.7", package: "nri-resize-tests", test: "pod_level_runtime", filter: "", skip: &[TWINS_2], env: ON_1_7, kernels: OLDEST, timeout_s: 300 },
    Suite { name: "coexist_containerd@1.7", package: "nri-resize-tests", test: "coexist_containerd", filter: "", skip: &[TWINS_2],   env: ON_1_7, kernels: OLDEST, timeout_s: 600 },
    // kubelet's systemd cgroup driver (kubeadm's, EKS's, GKE's, AKS's default) with systemd as
    // the guest's PID 1: pod slices, `slice:prefix:name` container cgroups, scopes made by runc
    // through systemd. Every test of these suites, against 2.1.9.
    Suite { name: "nri_runtime@2.1-systemd",       package: "nri-resize-tests", test: "nri_runtime",       filter: "", skip: &[TWINS_1_7], env: ON_2_SYSTEMD, kernels: SYSTEMD, timeout_s: 600 },
    Suite { name: "pod_level_runtime@2.1-systemd", package: "nri-resize-tests", test: "pod_level_runtime", filter: "", skip: &[TWINS_1_7], env: ON_2_SYSTEMD, kernels: SYSTEMD, timeout_s: 300 },
    Suite { name: "memory_decrease@2.1-systemd",   package: "nri-resize-tests", test: "memory_decrease",   filter: "", skip: &[TWINS_1_7], env: ON_2_SYSTEMD, kernels: SYSTEMD, timeout_s: 900 },
    Suite { name: "resize_runtime@2.1-systemd",    package: "nri-resize-tests", test: "resize_runtime",    filter: "", skip: &[TWINS_1_7], env: ON_2_SYSTEMD, kernels: SYSTEMD, timeout_s: 900 },
];

/// What the guest runs as PID 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// The initramfs's busybox script runs the suites itself (`xtask/scripts/vm/init.sh`).
    Busybox,
    /// systemd, which runs the suites as a service (kubelet's systemd cgroup driver needs it).
    Systemd,
}

/// A Debian kernel the tier boots.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    /// Short name (`--kernel 6.1`).
    pub name: &'static str,
    /// Debian binary package holding `vmlinuz` (and, but for `modules`, the modules).
    pub package: &'static str,
    /// When `package` has left the archive (an ABI bump replaces it): the newest package whose
    /// name matches this `apt-cache search --names-only` pattern is used instead, loudly.
    pub successor: &'static str,
    /// Where the modules are when not in `package` (sid splits the kernel): the package whose
    /// name is `package`'s with this prefix in place of `linux-binary-`.
    pub modules: Option<&'static str>,
    /// A Debian suite the machine's own sources do not have (bullseye-security, sid): fetched
    /// through a private sources list (`deb` line), never added to the machine's.
    pub apt_source: Option<&'static str>,
    /// Guests of one lane boot one after another; lanes run side by side (one host core each).
    pub lane: usize,
    /// PID 1 of the guest.
    pub init: Init,
    /// The directory of the unpacked kernel in the cache: guests of one package share it.
    pub cache: &'static str,
    /// The guest's machine.
    pub arch: Arch,
    /// The guest's CPUs and firmware.
    pub cpus: GuestCpus,
}

/// How many CPUs a guest boots and how many the kernel counts as possible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestCpus {
    /// [`BOOT_CPUS`] booted, [`MAX_CPUS`] slots for the hotplug protocol; qboot (fast boot).
    Hotplug,
    /// [`BOOT_CPUS`] booted, [`MANY_POSSIBLE_CPUS`] possible: SeaBIOS's ACPI tables list every
    /// slot, which Debian's 6.1 counts as hotpluggable (qboot's do not; 6.12 counts neither,
    /// and its x86 topology code has no `possible_cpus=` any more: tried). What a large node's
    /// per-CPU allocations (eBPF maps) cost, on a 2-core host.
    ManyPossible,
}

/// Kernels of the tier: bookworm's (via bookworm-security), trixie's, bullseye's 5.10 (the
/// oldest with cgroup v2 that current Kubernetes runs on) and sid's newest.
pub const KERNELS: &[Kernel] = &[
    Kernel {
        name: "6.1",
        package: "linux-image-6.1.0-56-amd64",
        successor: r"^linux-image-6\.1\.0-[0-9]+-amd64$",
        modules: None,
        apt_source: None,
        init: Init::Busybox,
        cache: "6.1",
        arch: Arch::Amd64,
        cpus: GuestCpus::Hotplug,
        lane: 0,
    },
    // bookworm's kernel again, on a guest with 128 possible CPUs (2 booted): the observer's
    // eBPF maps as a large node allocates them (`image_many_cpus@2.1`).
    Kernel {
        name: "6.1-128cpus",
        package: "linux-image-6.1.0-56-amd64",
        successor: r"^linux-image-6\.1\.0-[0-9]+-amd64$",
        modules: None,
        apt_source: None,
        init: Init::Busybox,
        cache: "6.1",
        arch: Arch::Amd64,
        cpus: GuestCpus::ManyPossible,
        lane: 0,
    },
    Kernel {
        name: "6.12",
        package: "linux-image-6.12.107+deb13-amd64",
        successor: r"^linux-image-6\.12\.[0-9]+\+deb13-amd64$",
        modules: None,
        apt_source: None,
        init: Init::Busybox,
        cache: "6.12",
        arch: Arch::Amd64,
        cpus: GuestCpus::Hotplug,
        lane: 1,
    },
    Kernel {
        name: "5.10",
        package: "linux-image-5.10.0-46-amd64",
        successor: r"^linux-image-5\.10\.0-[0-9]+-amd64$",
        modules: None,
        apt_source: Some("http://deb.debian.org/debian-security bullseye-security main"),
        init: Init::Busybox,
        cache: "5.10",
        arch: Arch::Amd64,
        cpus: GuestCpus::Hotplug,
        lane: 1,
    },
    Kernel {
        name: "7.2",
        package: "linux-binary-7.2.13+deb14-amd64",
        successor: r"^linux-binary-7\.[0-9]+\.[0-9]+\+deb[0-9]+-amd64$",
        modules: Some("linux-modules-"),
        apt_source: Some("http://deb.debian.org/debian sid main"),
        init: Init::Busybox,
        cache: "7.2",
        arch: Arch::Amd64,
        cpus: GuestCpus::Hotplug,
        lane: 1,
    },
    // trixie's kernel again, with systemd as PID 1 (its own guest: the other guests' init is
    // busybox's, which is what the cgroupfs driver's nodes look like from below).
    Kernel {
        name: "6.12-systemd",
        package: "linux-image-6.12.107+deb13-amd64",
        successor: r"^linux-image-6\.12\.[0-9]+\+deb13-amd64$",
        modules: None,
        apt_source: None,
        init: Init::Systemd,
        cache: "6.12",
        arch: Arch::Amd64,
        cpus: GuestCpus::Hotplug,
        lane: 1,
    },
    // trixie's arm64 kernel under `qemu-system-aarch64` (software emulation of `-cpu max`), with
    // an arm64 userland unpacked from trixie's packages ([`ARM64_USERLAND`]).
    Kernel {
        name: "6.12-arm64",
        package: "linux-image-6.12.107+deb13-arm64",
        successor: r"^linux-image-6\.12\.[0-9]+\+deb13-arm64$",
        modules: None,
        apt_source: Some("http://deb.debian.org/debian trixie main"),
        init: Init::Busybox,
        cache: "6.12-arm64",
        arch: Arch::Arm64,
        cpus: GuestCpus::Hotplug,
        lane: 0,
    },
];

/// The arm64 guest's userland: these of Debian's packages and what they depend on, unpacked over
/// the host's `/` in the guest (the host's binaries cannot run there): busybox's applets stand
/// in for the host's tools the packages do not bring; the tests also run GNU `dd`
/// (`iflag=nocache`), `perl`, `python3` and `kustomize`.
const ARM64_USERLAND: &[&str] = &[
    "busybox-static",
    // `sh`: busybox's prefers its own applets to `PATH` (its `dd` has no `iflag=nocache`).
    "dash",
    "coreutils",
    "perl-base",
    "python3-minimal",
    "libgcc-s1",
    "runc",
    "containerd",
    // `image_containerd` renders the DaemonSet it runs with kustomize.
    "kustomize",
];

/// Modules the init loads (with their dependencies, which are resolved from each module's
/// `depends=`); a module the kernel has built in is skipped.
const GUEST_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "9pnet_virtio",
    "9p",
    "overlay",
    "crc32c_generic",
    "ext4",
];

/// What the archive extraction keeps from a kernel package.
const PACKAGE_PATTERNS: &[&str] = &[
    "./boot/vmlinuz-*",
    "*/modules/*/vmlinuz",
    "*/modules.builtin",
    "*/kernel/fs/*",
    "*/kernel/drivers/virtio/*",
    "*/kernel/drivers/block/*",
    "*/kernel/net/9p/*",
    "*/kernel/lib/*",
    "*/kernel/crypto/*",
    "*/kernel/arch/x86/crypto/*",
];

const INIT_SCRIPT: &str = include_str!("../scripts/vm/init.sh");
/// Guest shell function run after a failed suite: the tails of the containerd and plugin logs
/// its harness left behind (a suite killed by its timeout never reaches the harness's `Drop`,
/// which prints them when a test panics) and of the kernel's log.
const GUEST_LOGS: &str = r#"guest_logs() {
  for f in /tmp/nrt-*/*.log; do
    [ -f "$f" ] || continue
    echo "==> guest: $f (left by the suite), last 40 lines"
    tail -n 40 "$f"
  done
  echo "==> guest: kernel log, last 20 lines"
  dmesg 2>/dev/null | tail -n 20
}
"#;
const STATUS_MARK: &str = "NRI_RESIZE_VM_STATUS ";
/// Guest boot and set-up, on top of the suites' own time.
const BOOT_BUDGET: Duration = Duration::from_secs(90);
/// Default time budget of the whole tier (every kernel, boots and suites): a VM still running
/// when it is spent is killed and its unfinished suites fail. A cap on a stuck guest, not the
/// time the tier takes: on this project's 2-CPU machines the guests ran the same suites up to
/// 2.7x slower on some days than on others (6.1's share took about 59 minutes on 2026-11-25),
/// and the host's tiers take 12-20 minutes before it, under CI's 90.
pub const TIER_BUDGET: Duration = Duration::from_secs(65 * 60);
/// Room a guest's sparse disk may take on the host while its suites run (containerd's content
/// and snapshots, the page-cache suites' files; what they delete is given back).
const GUEST_DISK_NEED: u64 = 3 * crate::disk::GIB;
/// Room for a kernel's packages and their unpacked tree (the arm64 one with its userland:
/// 368 MiB).
const KERNEL_DOWNLOAD_NEED: u64 = crate::disk::GIB;

fn cache_dir() -> PathBuf {
    std::env::var_os("NRI_RESIZE_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/nri-resize"), PathBuf::from)
        .join("vm")
}

/// Whether a run limited to `only` (empty: the whole tier) runs `suite`: a named suite, or any
/// but the [`BENCH_ONLY`] ones when none is named.
fn chosen(only: &[String], suite: &Suite) -> bool {
    let named = only.iter().any(|o| o == suite.test || o == suite.name);
    named || (only.is_empty() && !BENCH_ONLY.contains(&suite.name))
}

/// Options of `cargo xtask vm-test`.
#[derive(Debug)]
pub struct Options {
    pub kernels: Vec<Kernel>,
    /// Only the suites whose name or test target is in this list (empty: all).
    pub only: Vec<String>,
    /// Time budget of the whole run.
    pub budget: Duration,
}

impl Options {
    /// Parses `--kernel 6.1|6.12|all`, `--suite <test>` (repeatable), `--budget-seconds N`.
    pub fn parse(args: &[String]) -> anyhow::Result<Self> {
        let mut kernels = KERNELS.to_vec();
        let mut only = Vec::new();
        let mut budget = TIER_BUDGET;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--kernel" => {
                    let k = it.next().context("--kernel needs 6.1, 6.12 or all")?;
                    kernels = if k == "all" {
                        KERNELS.to_vec()
                    } else {
                        vec![*KERNELS.iter().find(|x| x.name == k).ok_or_else(|| {
                            anyhow!(
                                "unknown kernel {k:?}: one of {} or all",
                                KERNELS
                                    .iter()
                                    .map(|k| k.name)
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        })?]
                    };
                }
                "--suite" => only.push(it.next().context("--suite needs a test name")?.clone()),
                "--budget-seconds" => {
                    let secs = it.next().context("--budget-seconds needs a number")?;
                    budget = Duration::from_secs(secs.parse().context("--budget-seconds")?);
                }
                other => bail!("vm-test: unknown argument {other:?}"),
            }
        }
        for s in &only {
            if !SUITES.iter().any(|x| x.test == s || x.name == s) {
                bail!("unknown suite {s:?}");
            }
        }
        Ok(Self {
            kernels,
            only,
            budget,
        })
    }
}

/// What [`build`] made for [`run`]: the suites of the run and their test executables.
pub struct Built {
    suites: Vec<Suite>,
    binaries: BTreeMap<String, PathBuf>,
    started: Instant,
}

/// Builds the suites, then boots each kernel and runs them. Fails if any suite fails.
/// `summary` gets one line per kernel and suite (verdict and time in the guest).
pub fn vm_test(root: &Path, opts: &Options, summary: &mut Vec<String>) -> anyhow::Result<()> {
    let built = build(root, opts, summary)?;
    run(root, opts, built, summary)
}

/// Everything the guests read from the host, built before any guest boots: the suites' test
/// executables, the plugin binary and its image (copies of their own under `target/vm/`, which
/// no later host build rewrites while the guests read the host's files).
pub fn build(root: &Path, opts: &Options, summary: &mut Vec<String>) -> anyhow::Result<Built> {
    let started = Instant::now();
    if let Some(dir) = std::env::var_os(CONTAINERD_BIN_ENV) {
        let note = format!(
            "{CONTAINERD_BIN_ENV}={}: every `@2.1` run uses that containerd build, not Debian's 2.1.9",
            dir.to_string_lossy()
        );
        eprintln!("!!! {note}");
        summary.push(format!("vm: {note}"));
    }
    if let Some(dir) = std::env::var_os(CRIO_BIN_ENV) {
        let note = format!(
            "{CRIO_BIN_ENV}={}: every real-runtime run uses that CRI-O build, not containerd",
            dir.to_string_lossy()
        );
        eprintln!("!!! {note}");
        summary.push(format!("vm: {note}"));
    }
    let suites: Vec<Suite> = SUITES
        .iter()
        .filter(|s| chosen(&opts.only, s))
        .filter(|s| opts.kernels.iter().any(|k| s.runs_on(k)))
        .copied()
        .collect();
    let on = |arch: Arch| -> Vec<Suite> {
        suites
            .iter()
            .filter(|s| opts.kernels.iter().any(|k| k.arch == arch && s.runs_on(k)))
            .copied()
            .collect()
    };
    let amd64 = on(Arch::Amd64);
    let mut binaries = build_suites(root, &amd64)?;
    let arm64 = on(Arch::Arm64);
    if !arm64.is_empty() {
        binaries.extend(build_cross_suites(root, &arm64)?);
    }
    if suites.iter().any(|s| s.test == "image_containerd") {
        // The daemon's image (`NRI_RESIZE_IMAGE_ARCHIVE`) from the plugin binaries just built:
        // one archive, an image index of every architecture whose guests import it, as
        // `cargo xtask image` writes it.
        let dir = root.join(VM_FILES);
        let mut platforms = Vec::new();
        if amd64.iter().any(|s| s.test == "image_containerd") {
            platforms.push((Arch::Amd64, dir.join("nri-resize")));
        }
        if arm64.iter().any(|s| s.test == "image_containerd") {
            platforms.push((Arch::Arm64, dir.join("aarch64/nri-resize")));
        }
        crate::image::build_multiarch_archive(
            &platforms,
            &dir.join("nri-resize.oci.tar"),
            &crate::image::image_name(),
        )?;
    }
    if suites.iter().any(|s| s.test == "coexist_containerd") {
        // The guests see the host's cache read-only: the tests' Go NRI plugin is built here.
        crate::run(
            "the tests' independent Go NRI plugin (for coexist_containerd in the guests)",
            crate::cargo().args(["run", "-q", "-p", "nri-resize-tests", "--bin", "go_plugin"]),
        )?;
    }
    Ok(Built {
        suites,
        binaries,
        started,
    })
}

/// Boots each kernel of `opts` and runs its suites of `built`. Fails if any suite fails.
pub fn run(
    root: &Path,
    opts: &Options,
    built: Built,
    summary: &mut Vec<String>,
) -> anyhow::Result<()> {
    let Built {
        suites,
        binaries,
        started: tier_started,
    } = built;
    let mut failures = Vec::new();
    let tier_deadline = tier_started + opts.budget;
    // The lanes run side by side, one QEMU at a time each: a guest is one host thread
    // (`tcg,thread=single`), so two lanes keep both of these machines' cores busy; the kernels
    // of a lane boot one after another.
    let mut lanes: BTreeMap<usize, Vec<Kernel>> = BTreeMap::new();
    for kernel in &opts.kernels {
        lanes.entry(kernel.lane).or_default().push(*kernel);
    }
    let per_kernel: Vec<(Vec<String>, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = lanes
            .values()
            .map(|kernels| {
                let suites = &suites;
                let binaries = &binaries;
                let handle = scope.spawn(move || {
                    let mut lane = (Vec::new(), Vec::new());
                    for kernel in kernels {
                        let on_kernel: Vec<Suite> = suites
                            .iter()
                            .filter(|s| s.runs_on(kernel))
                            .copied()
                            .collect();
                        if on_kernel.is_empty() {
                            continue;
                        }
                        let (lines, failed) =
                            run_kernel(root, kernel, &on_kernel, binaries, tier_deadline);
                        lane.0.extend(lines);
                        lane.1.extend(failed);
                    }
                    lane
                });
                (handle, kernels)
            })
            .collect();
        handles
            .into_iter()
            .map(|(h, kernels)| {
                h.join().unwrap_or_else(|_| {
                    let names: Vec<_> = kernels.iter().map(|k| k.name).collect();
                    let e = format!("kernels {}: the runner's thread panicked", names.join(", "));
                    (vec![e.clone()], vec![e])
                })
            })
            .collect()
    });
    for (lines, failed) in per_kernel {
        summary.extend(lines);
        failures.extend(failed);
    }
    eprintln!(
        "\n==> vm-test summary (per suite, seconds in the guest; {} s in all, builds included)",
        tier_started.elapsed().as_secs()
    );
    for line in summary.iter() {
        eprintln!("    {line}");
    }
    if !failures.is_empty() {
        bail!("vm-test failed: {}", failures.join("; "));
    }
    Ok(())
}

/// Boots one kernel and runs its suites; returns its summary lines and its failures.
fn run_kernel(
    root: &Path,
    kernel: &Kernel,
    on_kernel: &[Suite],
    binaries: &BTreeMap<String, PathBuf>,
    tier_deadline: Instant,
) -> (Vec<String>, Vec<String>) {
    let started = Instant::now();
    let mut summary = Vec::new();
    let mut failures = Vec::new();
    // A guest that cannot even boot in what is left of the tier's budget is not started: its
    // suites are named as not run, and why.
    let left = tier_deadline.saturating_duration_since(started);
    if left < BOOT_BUDGET {
        let e = format!(
            "not booted: {} s of the tier's budget left, less than a boot's {} s",
            left.as_secs(),
            BOOT_BUDGET.as_secs()
        );
        failures.push(format!("kernel {}: {e}", kernel.name));
        summary.push(format!("[kernel {}] VM FAILED: {e}", kernel.name));
        for s in on_kernel {
            failures.push(format!("{} on {}", s.name, kernel.name));
            summary.push(format!(
                "[kernel {}] {}    0 s  NOT RUN (the kernel was not booted)",
                kernel.name, s.name
            ));
        }
        return (summary, failures);
    }
    let boot = match prepare_kernel(kernel) {
        Ok(boot) => boot,
        Err(e) => {
            failures.push(format!("kernel {}: {e:#}", kernel.name));
            summary.push(format!("[kernel {}] VM FAILED: {e:#}", kernel.name));
            return (summary, failures);
        }
    };
    let mut outcome = run_vm(root, kernel, &boot, on_kernel, binaries, tier_deadline);
    // A guest that died before its first suite (a kernel oops while booting under TCG, seen
    // on 6.12 with multi-threaded TCG: int3 in `sched_clock_idle_wakeup_event`) is booted once
    // more, loudly; a failure once suites ran is never retried.
    if let Ok((results, Some(e))) = &outcome {
        let left = tier_deadline.saturating_duration_since(Instant::now());
        if results.iter().all(|r| r.status.is_none()) && left >= BOOT_BUDGET {
            eprintln!(
                "!!! kernel {}: the guest died before its first suite ({e}); booting it once more",
                kernel.name
            );
            summary.push(format!(
                "[kernel {}] guest died while booting ({e}); booted once more",
                kernel.name
            ));
            outcome = run_vm(root, kernel, &boot, on_kernel, binaries, tier_deadline);
        }
    }
    match outcome {
        Ok((results, vm_error)) => {
            if let Some(e) = vm_error {
                failures.push(format!("kernel {}: {e}", kernel.name));
                summary.push(format!("[kernel {}] VM FAILED: {e}", kernel.name));
            }
            let passed = results.iter().filter(|r| r.passed()).count();
            let total = results.len();
            for r in results {
                if !r.passed() {
                    failures.push(format!("{} on {}", r.suite, kernel.name));
                }
                summary.push(r.line());
            }
            // The matrix's cell: which guest, what it is, how it went, how long it took.
            summary.push(format!(
                "[kernel {}] cell: {} ({}), PID 1 {}, lane {}: {passed}/{total} suites passed; \
                 whole VM (boot, suites, power-off) {:>4} s",
                kernel.name,
                kernel.package,
                kernel.arch.name(),
                match kernel.init {
                    Init::Busybox => "busybox",
                    Init::Systemd => "systemd (kubelet's systemd cgroup driver)",
                },
                kernel.lane,
                started.elapsed().as_secs()
            ));
        }
        Err(e) => {
            failures.push(format!("kernel {}: {e:#}", kernel.name));
            summary.push(format!("[kernel {}] VM FAILED: {e:#}", kernel.name));
        }
    }
    eprintln!(
        "==> kernel {} done in {} s",
        kernel.name,
        started.elapsed().as_secs()
    );
    (summary, failures)
}

/// The key of a suite's executable in [`Built`]'s map: the test's name (amd64, the host's own
/// build) or `aarch64/<test>`.
fn binary_key(arch: Arch, test: &str) -> String {
    match arch {
        Arch::Amd64 => test.to_owned(),
        Arch::Arm64 => format!("aarch64/{test}"),
    }
}

/// The Rust target of the arm64 guest's executables.
const ARM64_TARGET: &str = "aarch64-unknown-linux-gnu";

/// The arm64 guest's executables: the suites' test binaries cross-built for
/// [`ARM64_TARGET`] with Debian's `rustc-web` (rustup has no aarch64 standard library here;
/// Debian's `libstd-rust-web-dev:arm64` is one) and linked by `aarch64-linux-gnu-gcc`, into
/// `target/cross`; for the real-runtime suites also the plugin binary (copied to
/// `target/vm/aarch64/nri-resize`). The eBPF object is the same one (the programs read
/// BTF-typed arguments, not `pt_regs`).
fn build_cross_suites(root: &Path, suites: &[Suite]) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let cross = |args: &[&str]| {
        let mut cmd = crate::cargo();
        cmd.args(args)
            .args(["--target", ARM64_TARGET, "--target-dir"])
            .arg(root.join("target/cross"))
            .env("RUSTC", crate::ebpf::DEBIAN_RUSTC)
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER",
                "aarch64-linux-gnu-gcc",
            )
            .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
            // Static, like the image's arm64 binary (`cross.rs`): the plugin built here is also
            // the arm64 half of the image the guest imports.
            .env(
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
                "-C target-feature=+crt-static",
            )
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("RUSTC_WRAPPER");
        cmd
    };
    let by_package = tests_by_package(suites);
    let mut binaries = BTreeMap::new();
    for (package, tests) in &by_package {
        let mut cmd = cross(&["test", "--no-run", "--message-format=json", "-p", package]);
        for t in tests {
            cmd.args(["--test", t]);
        }
        eprintln!("\n==> cross-build the arm64 guest's suites of {package}\n    $ {cmd:?}");
        let out = cmd
            .stderr(Stdio::inherit())
            .output()
            .context("run cargo test --no-run --target aarch64-unknown-linux-gnu")?;
        if !out.status.success() {
            bail!(
                "cross-building the arm64 test binaries of {package} failed (Debian's rustc-web, \
                 libstd-rust-web-dev:arm64 and gcc-aarch64-linux-gnu: `cargo xtask setup`)"
            );
        }
        for (name, exe) in test_executables(&out.stdout) {
            if tests.contains(&name.as_str()) {
                binaries.insert(binary_key(Arch::Arm64, &name), exe);
            }
        }
        for t in tests {
            if !binaries.contains_key(&binary_key(Arch::Arm64, t)) {
                bail!("cargo built no aarch64 test executable for {package} --test {t}");
            }
        }
    }
    if suites.iter().any(Suite::needs_plugin) {
        let mut args = vec!["build"];
        args.extend(crate::TEST_DAEMON_BUILD.iter().skip(1));
        crate::run(
            "cross-build the plugin binary for the arm64 guest",
            &mut cross(&args),
        )?;
        let dir = root.join(VM_FILES).join("aarch64");
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let built = root
            .join("target/cross")
            .join(ARM64_TARGET)
            .join("debug/nri-resize");
        let tmp = dir.join("nri-resize.tmp");
        std::fs::copy(&built, &tmp)
            .with_context(|| format!("copy {} to {}", built.display(), tmp.display()))?;
        std::fs::rename(&tmp, dir.join("nri-resize"))?;
    }
    Ok(binaries)
}

/// The harness's two images for the arm64 guest, built on the host (no compiler there) with the
/// cross compiler around the userland's busybox: the value of `NRI_RESIZE_TEST_IMAGES`.
fn arm64_test_images(userland: &Path) -> anyhow::Result<String> {
    let busybox = userland.join("usr/bin/busybox");
    let out = crate::cargo()
        .args([
            "run",
            "-q",
            "-p",
            "nri-resize-tests",
            "--bin",
            "test_images",
            "--",
            "arm64",
        ])
        .arg(&busybox)
        .arg("aarch64-linux-gnu-gcc")
        .stderr(Stdio::inherit())
        .output()
        .context("run the tests' test_images")?;
    if !out.status.success() {
        bail!("building the arm64 test images failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `(target name, executable)` of every test target in cargo's JSON messages.
fn test_executables(stdout: &[u8]) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for line in String::from_utf8_lossy(stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let (Some(name), Some(exe)) = (msg["target"]["name"].as_str(), msg["executable"].as_str())
        else {
            continue;
        };
        let is_test = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|v| v == "test"));
        if is_test {
            out.push((name.to_owned(), PathBuf::from(exe)));
        }
    }
    out
}

/// The test targets of `suites`, each once, by Cargo package.
fn tests_by_package(suites: &[Suite]) -> BTreeMap<&'static str, Vec<&'static str>> {
    let mut by_package: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for s in suites {
        let tests = by_package.entry(s.package).or_default();
        if !tests.contains(&s.test) {
            tests.push(s.test);
        }
    }
    by_package
}

/// `cargo test --no-run --message-format=json` per package; the executable of each suite.
/// Each binary is built once, whatever the number of runs and kernels it has.
fn build_suites(root: &Path, suites: &[Suite]) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let by_package = tests_by_package(suites);
    let mut binaries = BTreeMap::new();
    for (package, tests) in by_package {
        let mut cmd = crate::cargo();
        cmd.args(["test", "--no-run", "--message-format=json", "-p", package]);
        for t in &tests {
            cmd.args(["--test", t]);
        }
        eprintln!("\n==> build the VM suites of {package}\n    $ {cmd:?}");
        let out = cmd
            .stderr(Stdio::inherit())
            .output()
            .context("run cargo test --no-run")?;
        if !out.status.success() {
            bail!("building the test binaries of {package} failed");
        }
        for (name, exe) in test_executables(&out.stdout) {
            if tests.contains(&name.as_str()) {
                binaries.insert(name, exe);
            }
        }
        for t in &tests {
            if !binaries.contains_key(*t) {
                bail!("cargo built no test executable for {package} --test {t}");
            }
        }
    }
    // After the suites: building `nri-resize`'s own test targets relinks its binary without
    // the test-only feature, which the real-runtime suites need (`faults::slow_cgroup_*`).
    if suites.iter().any(Suite::needs_plugin) {
        // The real-runtime suites start the plugin binary (`NRI_RESIZE_BIN`): a copy of its own,
        // which a later host build (`cargo test` relinks `target/debug/nri-resize` without the
        // test-only feature) cannot replace under a running guest.
        crate::run(
            "build the plugin binary for the VM suites",
            crate::cargo().args(crate::TEST_DAEMON_BUILD),
        )?;
        let dir = root.join(VM_FILES);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let bin = dir.join("nri-resize");
        let tmp = dir.join("nri-resize.tmp");
        std::fs::copy(root.join("target/debug/nri-resize"), &tmp)
            .with_context(|| format!("copy the plugin binary to {}", tmp.display()))?;
        std::fs::rename(&tmp, &bin).with_context(|| format!("rename to {}", bin.display()))?;
    }
    Ok(binaries)
}

/// An exclusive `flock` on the cache while a kernel is fetched and unpacked: two runners on
/// one machine never unpack into the same directory at once.
struct CacheLock {
    _file: std::fs::File,
}

impl CacheLock {
    #[allow(unsafe_code, reason = "flock(2) on a file descriptor we own")]
    fn take(path: &Path) -> anyhow::Result<Self> {
        use std::os::fd::AsRawFd as _;
        let file =
            std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
        // SAFETY: flock on an open descriptor owned by `file`, which outlives the lock.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "flock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        Ok(Self { _file: file })
    }
}

/// The unpacked kernel: what QEMU boots.
#[derive(Debug)]
struct Boot {
    vmlinux: PathBuf,
    initramfs: PathBuf,
    /// The arm64 userland laid over the host's `/` (arm64 guests only).
    userland: Option<PathBuf>,
}

/// Downloads and unpacks `kernel` once (cached), writes its initramfs when it changed.
fn prepare_kernel(kernel: &Kernel) -> anyhow::Result<Boot> {
    std::fs::create_dir_all(cache_dir())?;
    let _lock = CacheLock::take(&cache_dir().join(".lock"))?;
    let dir = cache_dir().join(kernel.cache);
    let tree = dir.join("tree");
    let vmlinux = dir.join("vmlinux");
    let stamp = dir.join(".package");
    // The stamp: `<pinned package> <package actually unpacked>`.
    let ready = std::fs::read_to_string(&stamp)
        .is_ok_and(|s| s.split_whitespace().next() == Some(kernel.package))
        && vmlinux.is_file()
        && (kernel.arch == Arch::Amd64
            || std::fs::read_to_string(dir.join("userland/.packages"))
                .is_ok_and(|p| p == userland_stamp()));
    if !ready {
        eprintln!(
            "==> kernel {}: fetching {} (apt-get download; unpacked, not installed)",
            kernel.name, kernel.package
        );
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&tree)?;
        let used = download_kernel(kernel, &dir)?;
        let debs: Vec<PathBuf> = std::fs::read_dir(&dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "deb"))
            .collect();
        if debs.is_empty() {
            bail!("apt-get download left no .deb");
        }
        for deb in &debs {
            unpack(deb, &tree)?;
            std::fs::remove_file(deb)?;
        }
        let vmlinuz = glob_one(&tree.join("boot"), "vmlinuz-")
            .or_else(|_| find_file(&tree, "vmlinuz"))
            .context("no vmlinuz in the kernel's packages")?;
        match kernel.arch {
            Arch::Amd64 => extract_vmlinux(&vmlinuz, &vmlinux)?,
            // Debian's arm64 `vmlinuz` is the raw `Image` QEMU boots.
            Arch::Arm64 => {
                let image = std::fs::read(&vmlinuz)?;
                if image.get(0x38..0x3c) != Some(b"ARM\x64".as_slice()) {
                    bail!("{} is not an arm64 Image", vmlinuz.display());
                }
                std::fs::copy(&vmlinuz, &vmlinux)?;
            }
        }
        if kernel.arch == Arch::Arm64 {
            unpack_userland(&dir)?;
        }
        std::fs::write(&stamp, format!("{} {used}\n", kernel.package))?;
    }
    // Named by content: runners from other checkouts (another init script) share the cache
    // without rewriting a file a starting QEMU reads.
    let busybox = match kernel.arch {
        Arch::Amd64 => PathBuf::from("/bin/busybox"),
        Arch::Arm64 => dir.join("userland/usr/bin/busybox"),
    };
    let cpio = build_initramfs(&tree, &busybox)?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&cpio, &mut hasher);
    let initramfs = dir.join(format!(
        "initramfs-{:016x}.cpio",
        std::hash::Hasher::finish(&hasher)
    ));
    if !initramfs.is_file() {
        let partial = dir.join(format!(".initramfs.{}", std::process::id()));
        std::fs::write(&partial, &cpio)?;
        std::fs::rename(&partial, &initramfs)?;
    }
    Ok(Boot {
        vmlinux,
        initramfs,
        userland: (kernel.arch == Arch::Arm64).then(|| dir.join("userland")),
    })
}

/// What `userland/.packages` holds once [`unpack_userland`] is done: a userland unpacked by
/// another layout is unpacked again.
fn userland_stamp() -> String {
    format!("links-v2 {}", ARM64_USERLAND.join(" "))
}

/// Unpacks the arm64 userland's packages (`userland-debs/`) whole into `userland/`, and links
/// every busybox applet the packages do not provide into `usr/bin` and `usr/sbin`, so that
/// over the host's `/` they stand in for the host's own tools.
fn unpack_userland(dir: &Path) -> anyhow::Result<()> {
    let debs = dir.join("userland-debs");
    let root = dir.join("userland");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    for e in std::fs::read_dir(&debs)?.filter_map(Result::ok) {
        let status = Command::new("dpkg-deb")
            .arg("-x")
            .arg(e.path())
            .arg(&root)
            .status()
            .context("run dpkg-deb")?;
        if !status.success() {
            bail!("dpkg-deb -x {} failed", e.path().display());
        }
    }
    if !root.join("usr/bin/busybox").is_file() {
        bail!("the arm64 userland has no usr/bin/busybox");
    }
    std::fs::write(root.join(".packages"), userland_stamp())?;
    // The applets of the host's busybox (Debian's too, a neighbouring version).
    let out = Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .context("run /bin/busybox --list")?;
    // Both directories get a link (`PATH` has `/usr/sbin` first: a host binary there would
    // shadow one in `usr/bin`), to the packages' own binary where they bring one (GNU `dd`).
    for applet in String::from_utf8_lossy(&out.stdout).lines() {
        if applet == "busybox" {
            continue;
        }
        let own = ["usr/bin", "usr/sbin"]
            .iter()
            .map(|sub| Path::new("/").join(sub).join(applet))
            .find(|p| {
                root.join(p.strip_prefix("/").unwrap_or(p))
                    .symlink_metadata()
                    .is_ok()
            });
        let target = own.unwrap_or_else(|| PathBuf::from("/usr/bin/busybox"));
        for sub in ["usr/bin", "usr/sbin"] {
            let link = root.join(sub).join(applet);
            if link.symlink_metadata().is_ok() {
                continue;
            }
            std::fs::create_dir_all(root.join(sub))?;
            std::os::unix::fs::symlink(&target, &link)?;
        }
    }
    Ok(())
}

/// Extracts what the guest needs (`PACKAGE_PATTERNS`) from one `.deb` into `tree`. A pattern
/// that matches nothing in this package is fine (a split kernel has the image in one package,
/// the modules in another); `prepare_kernel` checks that the image arrived.
fn unpack(deb: &Path, tree: &Path) -> anyhow::Result<()> {
    let script = format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -x -C '{}' --wildcards {}",
        deb.display(),
        tree.display(),
        PACKAGE_PATTERNS
            .iter()
            .map(|p| format!("'{p}'"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = Command::new("bash")
        .args(["-o", "pipefail", "-c", &script])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let only_unmatched = stderr
        .lines()
        .all(|l| l.contains("Not found in archive") || l.contains("Exiting with failure status"));
    if !out.status.success() && !only_unmatched {
        bail!("unpacking {} failed: {stderr}", deb.display());
    }
    Ok(())
}

/// `apt-get` (or `apt-cache`) with the kernel's private sources list, if it has one: its own
/// lists and cache under `dir`, the machine's sources untouched.
fn apt(kernel: &Kernel, program: &str, dir: &Path) -> anyhow::Result<Command> {
    let mut cmd = Command::new(program);
    let Some(source) = kernel.apt_source else {
        return Ok(cmd);
    };
    let apt = dir.join("apt");
    for sub in [
        "sources.list.d",
        "preferences.d",
        "lists/partial",
        "archives/partial",
    ] {
        std::fs::create_dir_all(apt.join(sub))?;
    }
    let list = apt.join("sources.list");
    std::fs::write(
        &list,
        format!(
            "deb [arch={} signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {source}\n",
            kernel.arch.name()
        ),
    )?;
    for key in ["APT::Architecture", "APT::Architectures"] {
        cmd.arg("-o").arg(format!("{key}={}", kernel.arch.name()));
    }
    for (key, value) in [
        ("Dir::Etc::SourceList", list),
        ("Dir::Etc::SourceParts", apt.join("sources.list.d")),
        ("Dir::Etc::Preferences", apt.join("preferences")),
        ("Dir::Etc::PreferencesParts", apt.join("preferences.d")),
        ("Dir::State::Lists", apt.join("lists")),
        ("Dir::State::Status", PathBuf::from("/dev/null")),
        ("Dir::Cache::Archives", apt.join("archives")),
        ("Dir::Cache::pkgcache", PathBuf::new()),
        ("Dir::Cache::srcpkgcache", PathBuf::new()),
    ] {
        cmd.arg("-o").arg(format!("{key}={}", value.display()));
    }
    Ok(cmd)
}

/// `apt-get download` of the pinned package (and its modules package), or of its newest
/// successor when the archive no longer has it. Returns the package downloaded into `dir`.
fn download_kernel(kernel: &Kernel, dir: &Path) -> anyhow::Result<String> {
    // A package `apt-get` cannot write reads like one missing from the archive below.
    crate::disk::ensure(
        dir,
        KERNEL_DOWNLOAD_NEED,
        &format!("downloading kernel {}", kernel.name),
    )?;
    if kernel.apt_source.is_some() {
        let status = apt(kernel, "apt-get", dir)?
            .args(["-q", "-o", "Acquire::Retries=3", "update"])
            .stdout(Stdio::null())
            .status()
            .context("run apt-get update")?;
        if !status.success() {
            bail!(
                "apt-get update of {} failed",
                kernel.apt_source.unwrap_or_default()
            );
        }
    }
    let download = |package: &str| -> anyhow::Result<bool> {
        let mut packages = vec![package.to_owned()];
        if let Some(prefix) = kernel.modules {
            packages.push(package.replacen("linux-binary-", prefix, 1));
        }
        Ok(apt(kernel, "apt-get", dir)?
            .args(["-q", "download"])
            .args(&packages)
            .current_dir(dir)
            .stdout(Stdio::null())
            .status()
            .context("run apt-get download")?
            .success())
    };
    if kernel.arch == Arch::Arm64 {
        let debs = dir.join("userland-debs");
        std::fs::create_dir_all(&debs)?;
        let out = apt(kernel, "apt-cache", dir)?
            .args([
                "depends",
                "--recurse",
                "--no-recommends",
                "--no-suggests",
                "--no-conflicts",
                "--no-breaks",
                "--no-replaces",
                "--no-enhances",
            ])
            .args(ARM64_USERLAND)
            .output()
            .context("run apt-cache depends")?;
        let mut packages: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with(' ') && !l.starts_with('<'))
            .map(str::to_owned)
            .collect();
        packages.sort();
        packages.dedup();
        if !out.status.success() || packages.len() < ARM64_USERLAND.len() {
            bail!("apt-cache depends of the arm64 userland ({ARM64_USERLAND:?}) failed");
        }
        let ok = apt(kernel, "apt-get", dir)?
            .args(["-q", "download"])
            .args(&packages)
            .current_dir(&debs)
            .stdout(Stdio::null())
            .status()
            .context("run apt-get download")?
            .success();
        if !ok {
            bail!("apt-get download of the arm64 userland ({ARM64_USERLAND:?}) failed");
        }
    }
    if download(kernel.package)? {
        return Ok(kernel.package.to_owned());
    }
    let out = apt(kernel, "apt-cache", dir)?
        .args(["search", "--names-only", kernel.successor])
        .output()?;
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    names.sort_by(|a, b| version_order(a, b));
    let successor = names.pop().unwrap_or_default();
    if successor.is_empty() || successor == kernel.package || !download(&successor)? {
        bail!(
            "apt-get download {} failed and no successor matching {} could be downloaded \
             (6.1 comes from bookworm-security, 6.12 from trixie, 5.10 from bullseye-security, \
             7.2 from sid; `apt-get update` first; {})",
            kernel.package,
            kernel.successor,
            crate::disk::describe(dir)
        );
    }
    eprintln!(
        "!!! kernel {}: {} is no longer in the archive; using its successor {successor} \
         (update KERNELS in xtask/src/vm.rs)",
        kernel.name, kernel.package
    );
    Ok(successor)
}

/// `sort -V` for package names: digit runs compare as numbers.
fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn parts(s: &str) -> Vec<Result<u64, String>> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let mut digits = false;
        for c in s.chars() {
            if c.is_ascii_digit() != digits && !cur.is_empty() {
                out.push(if digits {
                    cur.parse().map_err(|_| cur.clone())
                } else {
                    Err(cur.clone())
                });
                cur.clear();
            }
            digits = c.is_ascii_digit();
            cur.push(c);
        }
        if !cur.is_empty() {
            out.push(if digits {
                cur.parse().map_err(|_| cur.clone())
            } else {
                Err(cur)
            });
        }
        out
    }
    parts(a).cmp(&parts(b))
}

fn glob_one(dir: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
    std::fs::read_dir(dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .with_context(|| format!("no {prefix}* in {}", dir.display()))
}

/// The uncompressed ELF inside a bzImage (like the kernel's `scripts/extract-vmlinux`): try each
/// compressor at each of its magic numbers until one yields an ELF file.
fn extract_vmlinux(vmlinuz: &Path, out: &Path) -> anyhow::Result<()> {
    const FORMATS: [(&[u8], &str); 3] = [
        (b"\x28\xb5\x2f\xfd", "zstd"),
        (b"\xfd7zXZ\x00", "xz"),
        (b"\x1f\x8b\x08", "gzip"),
    ];
    let image = std::fs::read(vmlinuz)?;
    for (magic, tool) in FORMATS {
        for offset in image
            .windows(magic.len())
            .enumerate()
            .filter(|(_, w)| *w == magic)
            .map(|(i, _)| i)
        {
            let elf = decompress(tool, &image[offset..])?;
            if elf.len() > 1 << 20 && elf.starts_with(b"\x7fELF") {
                std::fs::write(out, &elf)?;
                return Ok(());
            }
        }
    }
    bail!("no compressed ELF kernel found in {}", vmlinuz.display())
}

/// `tool -dc` of `input`; trailing garbage makes the tool fail after writing the output, so the
/// exit status is not checked (the caller checks the output).
fn decompress(tool: &str, input: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut child = Command::new(tool)
        .args(["-dc"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("run {tool}"))?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .context("stdout")?
        .read_to_end(&mut out)?;
    let _ = child.wait();
    let _ = writer.join();
    Ok(out)
}

/// Modules by name (`-` and `_` are the same) under `tree`.
fn find_modules(tree: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.filter_map(Result::ok) {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if let Some(name) = p.file_name().and_then(|n| n.to_str()) {
                if let Some(stem) = name
                    .strip_suffix(".ko.xz")
                    .or_else(|| name.strip_suffix(".ko.zst"))
                    .or_else(|| name.strip_suffix(".ko"))
                {
                    out.insert(stem.replace('-', "_"), p);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(tree, &mut out);
    out
}

/// The modules the kernel has built in, from `modules.builtin`; `None` where the packages do
/// not ship that file (sid's split `linux-modules-*`).
fn builtin_modules(tree: &Path) -> Option<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    let path = find_file(tree, "modules.builtin").ok()?;
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        if let Some(name) = line.rsplit('/').next().and_then(|n| n.strip_suffix(".ko")) {
            out.insert(name.replace('-', "_"));
        }
    }
    Some(out)
}

fn find_file(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    for e in std::fs::read_dir(dir)?.filter_map(Result::ok) {
        let p = e.path();
        if p.file_name().is_some_and(|n| n == name) {
            return Ok(p);
        }
        if p.is_dir() {
            if let Ok(found) = find_file(&p, name) {
                return Ok(found);
            }
        }
    }
    bail!("{name} not found")
}

/// A module's bytes, decompressed.
fn module_bytes(path: &Path) -> anyhow::Result<Vec<u8>> {
    let raw = std::fs::read(path)?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("xz") => decompress("xz", &raw),
        Some("zst") => decompress("zstd", &raw),
        _ => Ok(raw),
    }
}

/// `depends=` of a module's `.modinfo`.
fn module_depends(bytes: &[u8]) -> Vec<String> {
    let key = b"depends=";
    let Some(start) = bytes.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let rest = &bytes[start + key.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.replace('-', "_"))
        .collect()
}

/// The guest modules and their dependencies, dependencies first: `(file name, bytes)`.
fn resolve_modules(tree: &Path) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    fn visit(
        name: &str,
        modules: &BTreeMap<String, PathBuf>,
        builtin: Option<&BTreeSet<String>>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<(String, Vec<u8>)>,
    ) -> anyhow::Result<()> {
        if !seen.insert(name.to_owned()) || builtin.is_some_and(|b| b.contains(name)) {
            return Ok(());
        }
        let Some(path) = modules.get(name) else {
            if builtin.is_none() {
                // No list of built-in modules: one the packages lack is taken as built in (the
                // guest's mounts fail loudly if it is not).
                eprintln!("    module {name}: not in the packages, taken as built in");
                return Ok(());
            }
            bail!("module {name} is neither built in nor in the package");
        };
        let bytes = module_bytes(path)?;
        for dep in module_depends(&bytes) {
            visit(&dep, modules, builtin, seen, out)?;
        }
        out.push((format!("{name}.ko"), bytes));
        Ok(())
    }
    let modules = find_modules(tree);
    let builtin = builtin_modules(tree);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for m in GUEST_MODULES {
        visit(m, &modules, builtin.as_ref(), &mut seen, &mut out)?;
    }
    Ok(out)
}

/// A `newc` cpio archive, written in memory.
#[derive(Default)]
struct Cpio {
    data: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), body: &[u8]) {
        self.ino += 1;
        let namesize = u32::try_from(name.len() + 1).expect("short name");
        let filesize = u32::try_from(body.len()).expect("file under 4 GiB");
        let fields = [
            self.ino, mode, 0, 0, 1, 0, filesize, 0, 0, rdev.0, rdev.1, namesize, 0,
        ];
        self.data.extend_from_slice(b"070701");
        for f in fields {
            let _ = write!(HexSink(&mut self.data), "{f:08x}");
        }
        self.data.extend_from_slice(name.as_bytes());
        self.data.push(0);
        self.pad();
        self.data.extend_from_slice(body);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.data.len().is_multiple_of(4) {
            self.data.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040_755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, mode: u32, body: &[u8]) {
        self.entry(name, 0o100_000 | mode, (0, 0), body);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.data
    }
}

struct HexSink<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for HexSink<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// CPUs the guest boots with, and its CPU slots: two spare for the hotplug protocol, one for
/// `vm_hotplug`'s and one for `capacity_kernel`'s CPU hotplug, which run in the same guest (with
/// one spare slot, the first took it and the second could not plug a CPU).
const BOOT_CPUS: u8 = 2;
const MAX_CPUS: u8 = 4;
/// Possible CPUs of a [`GuestCpus::ManyPossible`] guest.
const MANY_POSSIBLE_CPUS: u8 = 128;

fn build_initramfs(tree: &Path, busybox: &Path) -> anyhow::Result<Vec<u8>> {
    let busybox = std::fs::read(busybox).with_context(|| {
        format!(
            "read {} (Debian busybox-static; run `cargo xtask setup`)",
            busybox.display()
        )
    })?;
    let modules = resolve_modules(tree)?;
    let mut cpio = Cpio::default();
    for d in [
        "bin", "dev", "proc", "sys", "modules", "lower", "upper", "newroot",
    ] {
        cpio.dir(d);
    }
    // The kernel opens /dev/console for init before devtmpfs is mounted.
    cpio.entry("dev/console", 0o020_600, (5, 1), &[]);
    cpio.file("init", 0o755, INIT_SCRIPT.as_bytes());
    cpio.file("bin/busybox", 0o755, &busybox);
    let mut order = String::new();
    for (name, bytes) in &modules {
        cpio.file(&format!("modules/{name}"), 0o644, bytes);
        order.push_str(name);
        order.push('\n');
    }
    cpio.file("modules.order", 0o644, order.as_bytes());
    Ok(cpio.finish())
}

/// One suite's outcome in one guest.
#[derive(Debug)]
struct SuiteResult {
    suite: String,
    header: String,
    status: Option<i32>,
    seconds: u64,
    /// Which tests ran, from the log (see [`tests_run`]); empty when the log has no verdicts.
    ran: String,
}

/// What libtest's log says ran: `3 passed, 1 ignored (name), 2 filtered out`, from its
/// `test result:` line and its `test NAME ... ignored` lines, so that a summary never reads
/// "ok" for a suite whose tests did not run.
fn tests_run(log: &str) -> String {
    let Some(result) = log
        .lines()
        .filter_map(|l| l.strip_prefix("test result: "))
        .next_back()
    else {
        return String::new();
    };
    let count = |what: &str| -> u64 {
        result
            .split(';')
            .filter_map(|part| {
                part.trim()
                    .trim_start_matches(|c: char| !c.is_ascii_digit())
                    .split_once(' ')
            })
            .find(|(_, name)| name.trim() == what)
            .and_then(|(n, _)| n.parse().ok())
            .unwrap_or(0)
    };
    let ignored: Vec<&str> = log
        .lines()
        .filter_map(|l| {
            let (name, verdict) = l.strip_prefix("test ")?.split_once(" ... ")?;
            verdict.starts_with("ignored").then_some(name.trim())
        })
        .collect();
    let mut s = format!("{} passed", count("passed"));
    if count("failed") > 0 {
        let _ = write!(s, ", {} failed", count("failed"));
    }
    if !ignored.is_empty() || count("ignored") > 0 {
        let _ = write!(s, ", {} ignored ({})", count("ignored"), ignored.join(", "));
    }
    if count("filtered out") > 0 {
        let _ = write!(s, ", {} filtered out", count("filtered out"));
    }
    s
}

impl SuiteResult {
    fn passed(&self) -> bool {
        self.status == Some(0)
    }

    fn line(&self) -> String {
        let verdict = match self.status {
            Some(0) => "ok".to_owned(),
            Some(124) => "FAILED (timed out)".to_owned(),
            Some(s) => format!("FAILED (exit {s})"),
            None => "NOT RUN (the VM stopped first)".to_owned(),
        };
        if self.ran.is_empty() {
            format!("{} {:>4} s  {verdict}", self.header, self.seconds)
        } else {
            format!(
                "{} {:>4} s  {verdict}: {}",
                self.header, self.seconds, self.ran
            )
        }
    }
}

/// Single-quotes `s` for bash.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The script the guest runs in its chroot: every suite, its log, its result line.
fn guest_script(
    root: &Path,
    run: &Path,
    arch: Arch,
    suites: &[Suite],
    binaries: &BTreeMap<String, PathBuf>,
    exports: &[(&str, String)],
) -> String {
    // `CARGO_TARGET_TMPDIR` of the host's build, or of the arm64 guest's cross build.
    let target_tmp = match arch {
        Arch::Amd64 => root.join("target/tmp"),
        Arch::Arm64 => root.join("target/cross").join(ARM64_TARGET).join("tmp"),
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# generated by xtask/src/vm.rs\nset -u\nexport PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         export HOME=/root NRI_RESIZE_IN_VM=1 NRI_RESIZE_HOTPLUG_DIR={hp}\n\
         RUN={run}\nkernel=$(uname -r)\n\
         if [ -f /sys/fs/cgroup/cgroup.controllers ]; then cg=v2; else cg=v1; fi\n\
         if [ -d /run/systemd/system ]; then cg=\"$cg, systemd PID 1\"; fi\n\
         # CARGO_TARGET_TMPDIR must be disk-backed (the overlay's upper layer is tmpfs).\n\
         mkdir -p /tmp/cargo-target-tmp {tt} && mount --bind /tmp/cargo-target-tmp {tt}\n\
         run_suite() {{\n  name=$1 dir=$2 limit=$3; shift 3\n  log=$RUN/logs/$name.log\n  \
         echo \"[kernel $kernel cgroup $cg] $name\" >\"$log\"\n  start=$(date +%s)\n  \
         (cd \"$dir\" && timeout -k 10 \"$limit\" env \"$@\") >>\"$log\" 2>&1\n  rc=$?\n  \
         if [ $rc -ne 0 ]; then guest_logs >>\"$log\" 2>&1; fi\n  \
         echo \"$name $rc $(( $(date +%s) - start )) [kernel $kernel cgroup $cg]\" >>$RUN/results\n}}",
        hp = quote(&run.join("hotplug").to_string_lossy()),
        run = quote(&run.to_string_lossy()),
        tt = quote(&target_tmp.to_string_lossy()),
    );
    // Any containerd 2.x build in place of Debian's 2.1.9, or a CRI-O build in place of
    // containerd (the harness's knobs, passed through: the guest sees the host's `/`), e.g.
    // built by hand; `vm_test` says so loudly.
    if let Some(dir) = std::env::var_os(CRIO_BIN_ENV) {
        let _ = writeln!(s, "export {CRIO_BIN_ENV}={}", quote(&dir.to_string_lossy()));
    }
    if let Some(dir) = std::env::var_os(CONTAINERD_BIN_ENV) {
        let _ = writeln!(
            s,
            "export {CONTAINERD_BIN_ENV}={}",
            quote(&dir.to_string_lossy())
        );
    }
    // `cargo xtask bench`: the guest's benchmark rows go to the run directory, and
    // [`copy_bench_rows`] appends them to the host's table afterwards.
    for (k, v) in exports {
        let _ = writeln!(s, "export {k}={}", quote(v));
    }
    if std::env::var_os(BENCH_TABLE_ENV).is_some() {
        let _ = writeln!(
            s,
            "export {BENCH_TABLE_ENV}={}",
            quote(&run.join(GUEST_BENCH_TABLE).to_string_lossy())
        );
    }
    s.push_str(GUEST_LOGS);
    for suite in suites {
        let bin = &binaries[&binary_key(arch, suite.test)];
        let dir = root.join(match suite.package {
            "nri-resize" => "plugin",
            "nri-resize-tests" => "tests",
            other => other,
        });
        let mut line = format!(
            "run_suite {} {} {}",
            quote(suite.name),
            quote(&dir.to_string_lossy()),
            suite.timeout_s
        );
        for (k, v) in suite.env {
            let v = v.replace("{root}", &root.to_string_lossy());
            let _ = write!(line, " {}", quote(&format!("{k}={v}")));
        }
        let _ = write!(
            line,
            " {} --nocapture --test-threads=1",
            quote(&bin.to_string_lossy())
        );
        if WITH_IGNORED.contains(&suite.test) {
            line.push_str(" --include-ignored");
        }
        if !suite.filter.is_empty() {
            let _ = write!(line, " {}", quote(suite.filter));
        }
        for skip in suite.skip.iter().copied().flatten() {
            let _ = write!(line, " --skip {}", quote(skip));
        }
        s.push_str(&line);
        s.push('\n');
    }
    s.push_str("exit 0\n");
    s
}

/// A QEMU process, killed and reaped when dropped (every exit path, timeouts included).
struct Qemu {
    child: Child,
}

impl Drop for Qemu {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// QEMU gets SIGKILL when this process dies, even when it dies without unwinding (a `SIGTERM`
/// from `timeout`, say), so no guest outlives its runner.
#[allow(unsafe_code, reason = "prctl in the forked child, before exec")]
fn kill_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A QMP connection.
struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    fn connect(socket: &Path, deadline: Instant) -> anyhow::Result<Self> {
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    bail!("connect QMP {}: {e}", socket.display())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut qmp = Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        let greeting = qmp.read_message()?;
        if greeting.get("QMP").is_none() {
            bail!("unexpected QMP greeting {greeting}");
        }
        qmp.execute("qmp_capabilities", serde_json::json!({}))?;
        Ok(qmp)
    }

    fn read_message(&mut self) -> anyhow::Result<serde_json::Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            bail!("QMP connection closed");
        }
        serde_json::from_str(&line).with_context(|| format!("QMP sent {line:?}"))
    }

    /// Runs a command; its `return`, or its `error` as an error. Events are skipped.
    fn execute(
        &mut self,
        command: &str,
        arguments: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        let msg = serde_json::json!({ "execute": command, "arguments": arguments });
        writeln!(self.writer, "{msg}")?;
        loop {
            let reply = self.read_message()?;
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                bail!("{command}: {}", e["desc"].as_str().unwrap_or("error"));
            }
        }
    }

    /// The guest's run state (`running`, `paused`, `io-error`, …: QMP `query-status`).
    fn state(&mut self) -> anyhow::Result<String> {
        let status = self.execute("query-status", serde_json::json!({}))?;
        status["status"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("query-status returned {status}"))
    }

    /// Plugs the first free CPU slot.
    fn hotplug_cpu(&mut self, n: u32) -> anyhow::Result<String> {
        let slots = self.execute("query-hotpluggable-cpus", serde_json::json!({}))?;
        let free = slots
            .as_array()
            .and_then(|a| a.iter().find(|s| s.get("qom-path").is_none()))
            .ok_or_else(|| anyhow!("no free CPU slot (all of maxcpus are plugged)"))?;
        let mut args = free["props"].clone();
        let obj = args.as_object_mut().context("props is an object")?;
        obj.insert("driver".into(), free["type"].clone());
        obj.insert("id".into(), format!("hotcpu{n}").into());
        self.execute("device_add", args)?;
        Ok(format!("cpu {}", free["props"]))
    }

    /// Plugs a DIMM of `size` bytes.
    fn hotplug_memory(&mut self, n: u32, size: u64) -> anyhow::Result<String> {
        let mem = format!("hotmem{n}");
        self.execute(
            "object-add",
            serde_json::json!({"qom-type": "memory-backend-ram", "id": mem, "size": size}),
        )?;
        self.execute(
            "device_add",
            serde_json::json!({"driver": "pc-dimm", "id": format!("hotdimm{n}"), "memdev": mem}),
        )?;
        Ok(format!("memory {size} B"))
    }

    fn perform(&mut self, request: &str, n: u32) -> anyhow::Result<String> {
        let mut words = request.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("cpu"), None, None) => self.hotplug_cpu(n),
            (Some("memory"), Some(size), None) => self.hotplug_memory(n, parse_size(size)?),
            _ => bail!("unknown request {request:?} (expected `cpu` or `memory <size>`)"),
        }
    }
}

/// Why QEMU has paused the guest, if it has: a disk write the host could not take (`io-error`,
/// the host's filesystem full or failing) stops the guest for good, silently.
fn paused(qmp: &mut Qmp, disk: &Path) -> Option<String> {
    match qmp.state().ok()?.as_str() {
        "io-error" => Some(format!(
            "QEMU paused the guest: a write to its disk {} failed on the host ({}); the host's \
             disk is full or failing",
            disk.display(),
            crate::disk::describe(disk)
        )),
        "internal-error" => Some("QEMU stopped the guest on an internal error".to_owned()),
        _ => None,
    }
}

/// `128M`, `1G`, `4096` → bytes.
fn parse_size(s: &str) -> anyhow::Result<u64> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().with_context(|| format!("bad size {s:?}"))?;
    let shift = match unit {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        _ => bail!("bad size unit in {s:?} (K, M or G)"),
    };
    Ok(n << shift)
}

/// What CI shows of a suite's log: all of it when the suite failed (the failing test's output,
/// with the containerd and plugin log tails the harness prints when a test panics, and what the
/// guest adds after a failure), else its header and libtest's verdict lines.
/// Set (to anything): keep the run directory, with every suite's whole log, after a passing run.
const KEEP_RUN_ENV: &str = "NRI_RESIZE_VM_KEEP_RUN";

fn suite_report(log: &str, passed: bool) -> String {
    if !passed {
        return log.to_owned();
    }
    log.lines()
        .enumerate()
        .filter(|(i, l)| {
            *i == 0
                || l.starts_with("running ")
                || l.starts_with("test ")
                || l.starts_with("harness: NRI_RESIZE_CONTAINERD")
        })
        // With `--nocapture` a test's first output line follows its `test name ... `.
        .map(|(_, l)| l.get(..120).unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Boots `kernel`, runs `suites`, serves hotplug requests; the results of every suite (those
/// the VM did not finish are `NOT RUN`), and what went wrong with the VM itself, if anything.
#[expect(
    clippy::too_many_lines,
    reason = "one linear run: set up, boot, watch, collect"
)]
fn run_vm(
    root: &Path,
    kernel: &Kernel,
    boot: &Boot,
    suites: &[Suite],
    binaries: &BTreeMap<String, PathBuf>,
    tier_deadline: Instant,
) -> anyhow::Result<(Vec<SuiteResult>, Option<String>)> {
    // The arm64 guest's real-runtime suites get the harness's images built here (no compiler
    // there).
    let mut exports = Vec::new();
    if let Some(userland) = boot.userland.as_deref() {
        if suites.iter().any(Suite::needs_plugin) {
            exports.push(("NRI_RESIZE_TEST_IMAGES", arm64_test_images(userland)?));
        }
    }
    let run = cache_dir().join(format!("run-{}-{}", kernel.name, std::process::id()));
    let _ = std::fs::remove_dir_all(&run);
    for d in ["logs", "hotplug"] {
        std::fs::create_dir_all(run.join(d))?;
    }
    std::fs::write(run.join("results"), "")?;
    std::fs::write(
        run.join("guest.sh"),
        guest_script(root, &run, kernel.arch, suites, binaries, &exports),
    )?;
    // The guest's /tmp: a sparse ext4 image, removed with the run directory. The host must have
    // room for what the suites write there; a full host disk would pause the guest.
    crate::disk::ensure(
        &cache_dir(),
        GUEST_DISK_NEED,
        &format!("kernel {}'s guest (its disk, sparse)", kernel.name),
    )?;
    let disk = cache_dir().join(format!("disk-{}-{}.img", kernel.name, std::process::id()));
    std::fs::File::create(&disk)?.set_len(8 << 30)?;
    let status = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1"])
        .arg(&disk)
        .status()
        .context("mkfs.ext4 (e2fsprogs)")?;
    if !status.success() {
        bail!("mkfs.ext4 {} failed", disk.display());
    }
    let console = run.join("console.log");
    let qmp_socket = run.join("qmp.sock");
    // `psi=1`: pressure stall information on, whatever the kernel's build default
    // (`CONFIG_PSI_DEFAULT_DISABLED`); the observer's pressure series need it.
    let mut append = format!(
        "console={} loglevel=5 cgroup_no_v1=all psi=1 panic=-1 memhp_default_state=online \
         mitigations=off nri_resize_run={}",
        match kernel.arch {
            Arch::Amd64 => "ttyS0",
            Arch::Arm64 => "ttyAMA0",
        },
        run.display()
    );
    if boot.userland.is_some() {
        // The arm64 userland (9p tag `userland`) over the host's `/`; its busybox runs the
        // suites' script (the host's bash cannot run there).
        append.push_str(" nri_resize_userland=1 nri_resize_shell=/bin/sh");
    }
    if kernel.init == Init::Systemd {
        // systemd starts the suites' service and D-Bus (and what sysinit pulls in), nothing of
        // the host's default target; the host's NTP client would only wait for a network.
        append.push_str(
            " nri_resize_init=systemd systemd.unit=nri-resize-guest.service \
             systemd.mask=systemd-timesyncd.service systemd.show_status=false",
        );
    }
    // The guest mounts its own disk on /tmp: a checkout below it is bound back over the disk.
    if root.starts_with("/tmp") {
        append.push_str(&format!(" nri_resize_keep={}", root.display()));
    }
    let qemu_binary = match kernel.arch {
        Arch::Amd64 => "qemu-system-x86_64",
        Arch::Arm64 => "qemu-system-aarch64",
    };
    let mut cmd = Command::new(qemu_binary);
    cmd.args([
        // One host thread for every vCPU (`thread=single`), not one each (MTTCG, the default).
        // Under MTTCG with QEMU 7.2 (bookworm's), a vCPU can run a stale translation of kernel
        // text another vCPU has just repatched: 6.12 died in CI with "Oops: int3" in
        // `dequeue_entities` right after a cgroup got a CPU quota (the `cfs_bandwidth_used` static
        // key flipping through `text_poke_bp`, whose temporary int3 the other vCPU still saw
        // after the patch was complete). Round-robin TCG switches vCPUs only between translated
        // blocks and invalidates them in the same thread, so every vCPU sees the patched text.
        "-accel",
        "tcg,thread=single",
        "-cpu",
        "max",
        "-nodefaults",
        "-display",
        "none",
    ]);
    match (kernel.arch, kernel.cpus) {
        // One spare CPU slot and two DIMM slots for the hotplug protocol.
        (Arch::Amd64, GuestCpus::Hotplug) => cmd.args([
            "-M",
            "pc",
            "-smp",
            &format!("{BOOT_CPUS},maxcpus={MAX_CPUS}"),
            "-m",
            "1536M,slots=2,maxmem=4G",
            "-bios",
            "/usr/share/qemu/qboot.rom",
        ]),
        // QEMU's default firmware (SeaBIOS): its ACPI tables make every slot a possible CPU.
        (Arch::Amd64, GuestCpus::ManyPossible) => cmd.args([
            "-M",
            "pc",
            "-smp",
            &format!("{BOOT_CPUS},maxcpus={MANY_POSSIBLE_CPUS}"),
            "-m",
            "1536M",
        ]),
        // `virt` booted from a device tree has no hotplug (it needs ACPI, i.e. UEFI firmware):
        // the QEMU hotplug tests are left out there (`NO_QEMU_HOTPLUG`).
        (Arch::Arm64, _) => cmd.args(["-M", "virt", "-smp", &BOOT_CPUS.to_string(), "-m", "1536M"]),
    };
    if let Some(userland) = &boot.userland {
        cmd.arg("-virtfs").arg(format!(
            "local,path={},mount_tag=userland,security_model=none,readonly=on,multidevs=remap",
            userland.display()
        ));
    }
    cmd.arg("-kernel")
        .arg(&boot.vmlinux)
        .arg("-initrd")
        .arg(&boot.initramfs)
        .args(["-append", &append, "-no-reboot"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp_socket.display()))
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        ])
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=run,security_model=none",
            run.display()
        ))
        // `discard=unmap` (and the guest's `-o discard`): what the suites delete is given back
        // to the host's filesystem. A write the host has no room for pauses the guest
        // (`werror=enospc`, QEMU's default); the loop below notices and says so.
        .arg("-drive")
        .arg(format!(
            "file={},format=raw,if=virtio,cache=unsafe,discard=unmap",
            disk.display()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!(
        "\n==> kernel {} ({}): booting QEMU (TCG, cgroup v2 only) for {} suite(s)",
        kernel.name,
        kernel.package,
        suites.len()
    );
    let budget = BOOT_BUDGET + Duration::from_secs(suites.iter().map(|s| s.timeout_s + 15).sum());
    let started = Instant::now();
    let deadline = (started + budget).min(tier_deadline);
    kill_with_parent(&mut cmd);
    let mut qemu = Qemu {
        child: cmd
            .spawn()
            .with_context(|| format!("start {qemu_binary} (run `cargo xtask setup`)"))?,
    };
    let mut qmp = Qmp::connect(&qmp_socket, Instant::now() + Duration::from_secs(20));
    if let Err(e) = &qmp {
        eprintln!("    QMP unavailable, hotplug requests will fail: {e:#}");
    }

    let mut reported = 0usize;
    let mut results: Vec<SuiteResult> = Vec::new();
    let mut hotplugs = 0u32;
    let mut last_poll = Instant::now();
    let request = run.join("hotplug/request");
    let done = run.join("hotplug/done");
    let outcome: anyhow::Result<()> = loop {
        // Hotplug requests from the guest.
        if let Ok(text) = std::fs::read_to_string(&request) {
            let text = text.trim().to_owned();
            if !text.is_empty() {
                hotplugs += 1;
                let answer = match qmp.as_mut().map_err(|e| anyhow!("{e:#}")) {
                    Ok(q) => q.perform(&text, hotplugs),
                    Err(e) => Err(e),
                };
                let reply = match answer {
                    Ok(what) => {
                        eprintln!("    hotplug: {what} plugged (guest asked {text:?})");
                        "ok".to_owned()
                    }
                    Err(e) => {
                        eprintln!("    hotplug {text:?} failed: {e:#}");
                        format!("error: {e:#}")
                    }
                };
                let _ = std::fs::remove_file(&request);
                std::fs::write(&done, format!("{reply}\n"))?;
            }
        }
        // Finished suites: print their logs as they complete.
        let lines: Vec<String> = std::fs::read_to_string(run.join("results"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.ends_with(']'))
            .map(str::to_owned)
            .collect();
        for line in &lines[reported.min(lines.len())..] {
            let mut parts = line.splitn(4, ' ');
            let (name, rc, secs, header) = (
                parts.next().unwrap_or_default().to_owned(),
                parts.next().and_then(|s| s.parse().ok()),
                parts.next().and_then(|s| s.parse().ok()).unwrap_or(0),
                parts.next().unwrap_or_default().to_owned(),
            );
            let log = std::fs::read_to_string(run.join("logs").join(format!("{name}.log")))
                .unwrap_or_default();
            let r = SuiteResult {
                header: format!("{header} {name}"),
                suite: name,
                status: rc,
                seconds: secs,
                ran: tests_run(&log),
            };
            eprintln!("\n{}", suite_report(&log, r.passed()));
            eprintln!("--- {}", r.line());
            results.push(r);
        }
        reported = lines.len();
        if let Some(status) = qemu.child.try_wait()? {
            let console_text = std::fs::read_to_string(&console).unwrap_or_default();
            let guest = console_text
                .lines()
                .find_map(|l| l.trim().strip_prefix(STATUS_MARK))
                .and_then(|s| s.trim().parse::<i32>().ok());
            match guest {
                Some(0) => break Ok(()),
                Some(s) => break Err(anyhow!("guest init reported status {s}")),
                None => {
                    let mut err = String::new();
                    if let Some(mut e) = qemu.child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    break Err(anyhow!(
                        "QEMU exited ({status}) without a status line from the guest{}",
                        if err.is_empty() {
                            String::new()
                        } else {
                            format!("; stderr: {}", err.trim())
                        }
                    ));
                }
            }
        }
        if last_poll.elapsed() >= Duration::from_secs(5) {
            last_poll = Instant::now();
            if let Some(why) = qmp.as_mut().ok().and_then(|q| paused(q, &disk)) {
                break Err(anyhow!("{why}"));
            }
        }
        if Instant::now() > deadline {
            let state = match qmp.as_mut().map(Qmp::state) {
                Ok(Ok(state)) => format!("QEMU's state {state:?}"),
                Ok(Err(e)) => format!("QEMU's state unknown ({e:#})"),
                Err(_) => "no QMP".to_owned(),
            };
            break Err(anyhow!(
                "the VM ran past its budget of {} s (its suites' timeouts, capped by what is left of \
                 the tier's budget) and was killed ({state}; {})",
                deadline.saturating_duration_since(started).as_secs(),
                crate::disk::describe(&disk)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(qmp);
    drop(qemu);
    let _ = std::fs::remove_file(&disk);
    eprintln!(
        "    kernel {}: VM ran {} s",
        kernel.name,
        started.elapsed().as_secs()
    );
    for s in suites {
        if !results.iter().any(|r| r.suite == s.name) {
            results.push(SuiteResult {
                suite: s.name.to_owned(),
                header: format!("[kernel {}] {}", kernel.name, s.name),
                status: None,
                seconds: 0,
                ran: String::new(),
            });
        }
    }
    if let Err(e) = copy_bench_rows(&run) {
        eprintln!(
            "!!! kernel {}: the guest's benchmark rows: {e:#}",
            kernel.name
        );
    }
    let failed = outcome.is_err() || results.iter().any(|r| !r.passed());
    if failed {
        eprintln!(
            "\n==> kernel {}: guest console (last 60 lines of {}):\n{}",
            kernel.name,
            console.display(),
            tail(&console, 60)
        );
        for r in results.iter().filter(|r| r.status.is_none()) {
            let log = run.join("logs").join(format!("{}.log", r.suite));
            if log.is_file() {
                eprintln!(
                    "\n==> {} (unfinished) log tail:\n{}",
                    r.suite,
                    tail(&log, 40)
                );
            }
        }
        if let Some(why) = crate::guest_oops::impossible_rflags(
            &std::fs::read_to_string(&console).unwrap_or_default(),
        ) {
            eprintln!("!!! kernel {}: {why}", kernel.name);
        }
        eprintln!("    run directory kept: {}", run.display());
    } else if std::env::var_os(KEEP_RUN_ENV).is_some() {
        // Passing suites' full logs (measured figures) stay for reading.
        eprintln!("    run directory kept ({KEEP_RUN_ENV}): {}", run.display());
    } else {
        let _ = std::fs::remove_dir_all(&run);
    }
    Ok((results, outcome.err().map(|e| format!("{e:#}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passed_suite_shows_its_verdicts_and_a_failed_one_everything() {
        let log = "[kernel 6.12 cgroup v2] faults@2.1\nrunning 2 tests\nharness: noise\n\
                   test a ... ok\ntest b ... FAILED\ntest result: FAILED. 1 passed; 1 failed";
        let short = suite_report(log, true);
        assert!(short.contains("test a ... ok") && short.contains("test result:"));
        assert!(!short.contains("noise"));
        assert_eq!(suite_report(log, false), log);
    }

    #[test]
    fn the_summary_says_which_tests_ran() {
        let log = "running 4 tests\ntest a ... ok\ntest b ... ignored, VM only: offlines a CPU\n\
                   test c ... ok\n\ntest result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 1 filtered out; finished in 0.01s";
        assert_eq!(tests_run(log), "2 passed, 1 ignored (b), 1 filtered out");
        let all = "test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out";
        assert_eq!(tests_run(all), "5 passed");
        assert_eq!(tests_run("no verdicts"), "");
        let r = SuiteResult {
            suite: "s".into(),
            header: "[kernel 6.12] s".into(),
            status: Some(0),
            seconds: 3,
            ran: tests_run(log),
        };
        assert!(
            r.line()
                .ends_with("ok: 2 passed, 1 ignored (b), 1 filtered out"),
            "{}",
            r.line()
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("128M").expect("size"), 128 << 20);
        assert_eq!(parse_size("1G").expect("size"), 1 << 30);
        assert_eq!(parse_size("4096").expect("size"), 4096);
        assert!(parse_size("12X").is_err());
        assert!(parse_size("M").is_err());
    }

    #[test]
    fn depends_are_read_from_modinfo() {
        let bytes = b"\x00license=GPL\x00depends=virtio_ring,virtio\x00vermagic=6.1\x00";
        assert_eq!(module_depends(bytes), vec!["virtio_ring", "virtio"]);
        assert!(module_depends(b"\x00depends=\x00").is_empty());
    }

    #[test]
    fn cpio_entries_are_aligned_and_terminated() {
        let mut c = Cpio::default();
        c.file("init", 0o755, b"abc");
        let data = c.finish();
        assert!(data.len().is_multiple_of(4));
        assert!(data.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&data);
        assert!(text.contains("TRAILER!!!"));
    }

    #[test]
    fn a_kernel_with_no_time_left_is_not_booted_and_its_suites_are_named() {
        let kernel = &KERNELS[0];
        let suites: Vec<Suite> = SUITES
            .iter()
            .filter(|s| s.runs_on(kernel))
            .copied()
            .collect();
        assert!(!suites.is_empty());
        // The deadline has passed: nothing is prepared or booted, every suite is a failure.
        let (summary, failures) = run_kernel(
            Path::new("/nonexistent"),
            kernel,
            &suites,
            &BTreeMap::new(),
            Instant::now(),
        );
        assert!(summary[0].contains("not booted"), "{summary:?}");
        for s in &suites {
            let failure = format!("{} on {}", s.name, kernel.name);
            assert!(
                failures.contains(&failure),
                "{failure} missing from {failures:?}"
            );
            assert!(summary
                .iter()
                .any(|l| l.contains(s.name) && l.contains("NOT RUN")));
        }
    }

    #[test]
    fn bench_only_suites_run_when_named_and_not_in_the_whole_tier() {
        for name in BENCH_ONLY {
            let suite = SUITES
                .iter()
                .find(|s| s.name == *name)
                .unwrap_or_else(|| panic!("{name} names no suite"));
            assert!(!chosen(&[], suite), "{name} runs in the whole tier");
            assert!(chosen(&[suite.test.to_string()], suite));
            assert!(chosen(&[suite.name.to_string()], suite));
        }
        assert!(SUITES
            .iter()
            .filter(|s| !BENCH_ONLY.contains(&s.name))
            .all(|s| chosen(&[], s)));
    }

    #[test]
    fn every_suite_is_named_once() {
        let names: BTreeSet<_> = SUITES.iter().map(|s| s.name).collect();
        assert_eq!(names.len(), SUITES.len());
        for s in SUITES {
            assert!(
                s.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_@.-".contains(c)),
                "{}: a suite's name is a file name in the guest",
                s.name
            );
            assert!(!s.kernels.is_empty(), "{} runs on no kernel", s.name);
            for k in s.kernels {
                assert!(
                    KERNELS.iter().any(|x| x.name == *k),
                    "{}: unknown kernel {k}",
                    s.name
                );
            }
        }
    }

    #[test]
    fn twins_are_skipped_only_where_the_other_twin_runs() {
        for (skip, other) in [(TWINS_1_7, TWINS_2), (TWINS_2, TWINS_1_7)] {
            assert_eq!(skip.len(), other.len());
            for (a, b) in skip.iter().zip(other) {
                assert_eq!(
                    a.trim_end_matches("_1_7").trim_end_matches("_2"),
                    b.trim_end_matches("_1_7").trim_end_matches("_2"),
                );
            }
        }
        // Every twin names a test that exists (a renamed test would otherwise run twice).
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tests");
        let sources: String = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
            .collect();
        for twin in TWINS_1_7.iter().chain(TWINS_2) {
            assert!(
                sources.contains(&format!("fn {twin}(")),
                "twin {twin} names no test in tests/tests"
            );
        }
        // The split suites' tests are each in one guest's share: the two lists are disjoint,
        // name tests of those suites, and with the twins cover every test of them.
        for name in SPLIT_TO_1_7 {
            assert!(
                !SPLIT_TO_2.contains(name),
                "{name} is in both guests' shares"
            );
        }
        for suite in SPLIT_SUITES {
            let file = dir.join(format!("{suite}.rs"));
            let source = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
            let tests: Vec<&str> = source
                .split("#[tokio::test")
                .skip(1)
                .filter_map(|t| t.split_once("async fn ")?.1.split_once('(').map(|(n, _)| n))
                .collect();
            assert!(tests.len() >= 6, "{suite}: {tests:?}");
            for t in &tests {
                let twin = TWINS_1_7.contains(t) || TWINS_2.contains(t);
                let shares =
                    usize::from(SPLIT_TO_1_7.contains(t)) + usize::from(SPLIT_TO_2.contains(t));
                assert!(
                    twin || shares == 1,
                    "{suite}::{t} is neither a twin nor in exactly one guest's share"
                );
            }
        }
        for name in SPLIT_TO_1_7.iter().chain(SPLIT_TO_2) {
            assert!(
                SPLIT_SUITES.iter().any(|suite| {
                    std::fs::read_to_string(dir.join(format!("{suite}.rs")))
                        .is_ok_and(|src| src.contains(&format!("async fn {name}(")))
                }),
                "{name} names no test of a split suite"
            );
        }
        // Every test of every real-runtime suite (each integration test target of `tests/` but
        // the soak and the offline manifest checks) runs in a guest, on cgroup v2: a pair of
        // twins counts as one test, run by either twin.
        let mut targets: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".rs").map(str::to_string)
            })
            .filter(|t| t != "soak" && t != "deploy_manifests")
            .collect();
        targets.sort();
        assert!(targets.len() >= 8, "{targets:?}");
        let runs = |s: &Suite, test: &str| {
            test.contains(s.filter) && !s.skip.iter().copied().flatten().any(|k| test.contains(k))
        };
        let base = |t: &str| {
            t.trim_end_matches("_containerd_1_7")
                .trim_end_matches("_containerd_2")
                .to_string()
        };
        for target in &targets {
            let source = std::fs::read_to_string(dir.join(format!("{target}.rs"))).unwrap();
            let tests: Vec<&str> = source
                .split("#[tokio::test")
                .skip(1)
                .chain(source.split("#[test]").skip(1))
                .filter_map(|t| t.split_once("fn ")?.1.split_once('(').map(|(n, _)| n))
                .collect();
            assert!(!tests.is_empty(), "{target}: no tests found");
            let suites: Vec<&Suite> = SUITES.iter().filter(|s| s.test == target).collect();
            for t in &tests {
                assert!(
                    tests
                        .iter()
                        .filter(|u| base(u) == base(t))
                        .any(|u| suites.iter().any(|s| runs(s, u))),
                    "{target}::{t} runs in no guest (nor does its twin)"
                );
            }
            // Suites other than the core ones run in one guest only (the tier's time), the
            // systemd driver's guest aside.
            let full = suites
                .iter()
                .filter(|s| s.filter.is_empty() && s.kernels != SYSTEMD)
                .count();
            let core = ["nri_runtime", "resize_runtime", "faults", "memory_decrease"];
            assert!(
                core.contains(&target.as_str()) || full == 1,
                "{target} runs in {full} guests"
            );
        }
        // The core suites run against both containerd versions on cgroup v2 (NRI v0.6 and
        // v0.8); memory decrease on the oldest kernel of the real-runtime suites and sid's
        // newest, with paced reclaim there too.
        for (core, kernels) in [
            ("nri_runtime", ["6.1", "6.1"]),
            ("resize_runtime", ["6.1", "6.12-systemd"]),
            ("memory_decrease", ["6.1", "7.2"]),
        ] {
            for (version, kernel) in [("1.7", kernels[0]), ("2", kernels[1])] {
                assert!(
                    SUITES.iter().any(|s| s.test == core
                        && s.filter.is_empty()
                        && s.kernels.contains(&kernel)
                        && s.env.contains(&("NRI_RESIZE_CONTAINERD", version))),
                    "{core} does not run against containerd {version} on {kernel}"
                );
            }
        }
        assert!(SUITES
            .iter()
            .any(|s| s.test == "reclaim_pacing" && s.kernels == SID));
        // kubelet's systemd cgroup driver: its guest runs these suites whole (twins aside),
        // with systemd as PID 1.
        let systemd: Vec<&Kernel> = KERNELS.iter().filter(|k| k.init == Init::Systemd).collect();
        assert_eq!(systemd.len(), 1);
        assert_eq!(systemd[0].name, SYSTEMD[0]);
        for test in [
            "nri_runtime",
            "resize_runtime",
            "memory_decrease",
            "pod_level_runtime",
        ] {
            assert!(
                SUITES.iter().any(|s| s.test == test
                    && s.kernels == SYSTEMD
                    && s.filter.is_empty()
                    && s.skip == [TWINS_1_7]
                    && s.env.contains(&("NRI_RESIZE_CGROUP_DRIVER", "systemd"))),
                "{test} does not run whole with the systemd driver"
            );
        }
        // Every kernel runs the kernel-facing suites (each package once: the systemd guest
        // boots 6.12's).
        // The guest with many possible CPUs runs what it exists for only.
        for test in ["cgroup_kernel", "observer_kernel", "capacity_kernel"] {
            for kernel in KERNELS
                .iter()
                .filter(|k| k.init == Init::Busybox && k.cpus == GuestCpus::Hotplug)
            {
                assert!(
                    SUITES
                        .iter()
                        .any(|s| s.test == test && s.kernels.contains(&kernel.name)),
                    "{test} does not run on {}",
                    kernel.name
                );
            }
        }
    }
}
