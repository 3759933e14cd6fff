//! Real-runtime test harness for nri-resize.
//!
//! Runs private containerd instances (1.7 and 2.x, see [`ContainerdVersion`]) as child
//! processes, each with its own temp dir, sockets, runc root, NRI socket and cgroup tree, and
//! drives pods and containers through CRI exactly as kubelet's cgroupfs driver does: the
//! harness creates and limits the pod cgroup `/<tree>/pod<uid>` before `RunPodSandbox` and
//! removes it after `RemovePodSandbox`. By hand, `NRI_RESIZE_CRIO_BIN=<dir>` runs a CRI-O build
//! in the same layout wherever a test starts containerd (`crio.rs`).
//!
//! Images come from local OCI archives (no registry): [`PAUSE_IMAGE`] (sandbox) and
//! [`BUSYBOX_IMAGE`] (default container image), imported once per containerd build; every
//! instance starts from a copy of that containerd root.
//!
//! Error policy: harness failures (not root, binary missing, containerd does not start,
//! cgroup setup fails) panic with context; CRI calls return `Result<_, tonic::Status>` and
//! cgroup limit reads/writes return `std::io::Result` so tests can assert on failures.
//!
//! Cleanup runs in `Drop` of [`Containerd`], also when a test panics: all pods are stopped and
//! removed through CRI (best effort), containerd is stopped by pid, leftover container
//! processes (found in the harness's cgroups) and shims (found by their `-address`) are
//! killed, mounts below the temp dir are detached, the cgroup tree is removed bottom-up in
//! every hierarchy and the temp dir is deleted. Instances left by killed test processes are
//! swept on the next start.
//!
//! ```no_run
//! # async fn demo() {
//! use nri_resize_tests::{Containerd, ContainerdOptions, ContainerdVersion, ContainerSpec, PodSpec, Resources};
//! for v in ContainerdVersion::all() {
//!     let ctrd = Containerd::start(v, ContainerdOptions::default()).await;
//!     let mut spec = PodSpec::new("demo");
//!     spec.resources = Resources::limits(100_000, 256 << 20);
//!     let pod = ctrd.run_pod(spec).await.expect("run pod");
//!     let mut c = ContainerSpec::new("app", &["sleep", "3600"]);
//!     c.resources = Resources::limits(50_000, 64 << 20);
//!     let id = ctrd.create_container(&pod, c).await.expect("create");
//!     ctrd.start_container(&id).await.expect("start");
//!     assert_eq!(ctrd.read_container_cgroup(&id, "cpu.cfs_quota_us"), "50000");
//! }
//! # }
//! ```

mod cgroups;
mod cleanup;
mod containerd;
pub mod cri_pod;
mod crio;
mod go_plugin;
mod image;
mod images;
pub mod kubelet;
mod plugin;
mod pod;
pub mod probe;
mod seeded_root;
mod stats;
mod sys_kernel;
mod systemd;
mod util;
mod version;

pub use cgroups::{shares_to_weight, weight_to_shares, CgroupLimits, CgroupMode, CgroupTree};
pub use cleanup::shim_pids;
pub use containerd::{connect, Containerd, ContainerdOptions};
pub use crio::CRIO_BIN_ENV;
pub use go_plugin::{go_plugin_binary, GoPlugin, GoPluginMode};
pub use image::{
    daemon_image_archive, free_port, http_get, AsDeployed, DaemonContainer, DAEMON_IMAGE,
    LEAST_PRIVILEGE_CAPS,
};
pub use images::{
    build_archives, image_archives, ImageArchives, BUSYBOX_IMAGE, PAUSE_IMAGE, TEST_IMAGES_ENV,
};
/// The CRI v1 API (types and clients) from crate `k8s-cri`.
pub use k8s_cri::v1 as cri;
pub use kubelet::{
    Actuated, Kubelet, KubeletEvent, KubeletPodResize, KubeletPodSync, KubeletResize, KubeletSync,
    KubeletVersion, PodResizeCondition, SandboxCall, StatsRuntime, UsageCache, VpaAction, VpaMode,
};
pub use plugin::{plugin_binary, resize_record, settled, PluginProcess};
pub use pod::{ContainerSpec, Pod, PodSpec, Resources};
pub use stats::MedianInterval;
pub use sys_kernel::SysKernelWithoutBtf;
pub use systemd::{CgroupDriver, CGROUP_DRIVER_ENV};
pub use util::{handler_histograms, percentile, scrape_metrics, tail_lines, HandlerHistogram};
pub use version::ContainerdVersion;

// Tests may share an instance across tasks.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Containerd>();
    send_sync::<Pod>();
};
