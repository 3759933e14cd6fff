//! CRI-O as the harness's runtime, run by hand: `NRI_RESIZE_CRIO_BIN=<dir>` names a directory
//! holding a CRI-O build (`crio` and `pinns`), and every harness instance of the test process
//! is then a private CRI-O instead of the containerd the test names (said loudly in each test's
//! output), with the same layout: its own root, run root, sockets, NRI socket, runc root and
//! cgroup tree below the instance's base directory.
//!
//! No registry is packaged on these machines for CRI-O, so CI cannot have it; the knob is how a
//! developer runs the real-runtime suites against a build of their own. What the instance uses
//! besides the build: Debian's `conmon` and `runc`, the cgroupfs manager with `conmon` in the pod
//! cgroup (so that the harness's cgroup tree holds every process of the instance), host-network
//! pods (no CNI; CRI-O reports `NetworkReady=false`, which is harmless for them), no host port
//! manager (it would need iptables), and the `vfs` storage driver (plain directories: nothing to
//! unmount but the pods' `/dev/shm` and namespace pins, which live below the base directory).
//! The test images go into that storage with `skopeo copy` from the same OCI archives containerd
//! imports.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::images::{BUSYBOX_IMAGE, PAUSE_IMAGE};
use crate::util::{require_binary, require_in_path};

/// Names a directory with a CRI-O build (`crio`, `pinns`); see the module documentation.
pub const CRIO_BIN_ENV: &str = "NRI_RESIZE_CRIO_BIN";

/// The storage driver of every harness CRI-O (and of `skopeo`'s copies into its storage).
const STORAGE_DRIVER: &str = "vfs";

/// A CRI-O build the harness runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CrioBuild {
    dir: PathBuf,
}

/// The harness's settings an instance's CRI-O config carries.
pub(crate) struct CrioSettings<'a> {
    /// The instance's base directory.
    pub base: &'a Path,
    /// `log_level` (`info`, `debug`, ...).
    pub log_level: &'a str,
    /// `nri_plugin_registration_timeout`.
    pub registration_timeout: Duration,
    /// `nri_plugin_request_timeout`.
    pub request_timeout: Duration,
    /// `cgroup_manager`: `systemd` or `cgroupfs`, following kubelet's driver.
    pub cgroup_manager: &'a str,
}

impl CrioBuild {
    /// The build `$NRI_RESIZE_CRIO_BIN` names, if set and not empty.
    pub(crate) fn from_env() -> Option<Self> {
        std::env::var_os(CRIO_BIN_ENV)
            .filter(|v| !v.is_empty())
            .map(|dir| Self {
                dir: PathBuf::from(dir),
            })
    }

    /// The directory of the build.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the `crio` binary.
    pub(crate) fn crio_bin(&self) -> PathBuf {
        self.dir.join("crio")
    }

    fn pinns_bin(&self) -> PathBuf {
        self.dir.join("pinns")
    }

    /// Panics with an install hint unless the build and what it runs with are there.
    pub(crate) fn require(&self) {
        require_binary(&self.crio_bin(), &format!("CRI-O ({CRIO_BIN_ENV}/crio)"));
        require_binary(
            &self.pinns_bin(),
            &format!("CRI-O's pinns ({CRIO_BIN_ENV}/pinns)"),
        );
        require_binary(Path::new("/usr/bin/conmon"), "conmon (/usr/bin/conmon)");
        require_binary(Path::new("/usr/bin/runc"), "runc (/usr/bin/runc)");
        require_in_path(
            "skopeo",
            "skopeo (to put the test images into CRI-O's storage)",
        );
    }

    /// The instance's `crio.conf`; every path CRI-O would otherwise take from the host is
    /// below `base` (the config directory too: no drop-in of the host applies).
    pub(crate) fn config_toml(&self, s: &CrioSettings<'_>) -> String {
        let b = s.base.display();
        format!(
            "[crio]\n\
             root = \"{b}/root\"\n\
             runroot = \"{b}/state\"\n\
             storage_driver = \"{STORAGE_DRIVER}\"\n\
             log_dir = \"{b}/pods\"\n\
             version_file = \"{b}/state/version\"\n\
             version_file_persist = \"{b}/root/version\"\n\
             clean_shutdown_file = \"{b}/root/clean.shutdown\"\n\
             internal_wipe = true\n\
             internal_repair = false\n\n\
             [crio.api]\n\
             listen = \"{b}/c.sock\"\n\
             stream_address = \"127.0.0.1\"\n\
             stream_port = \"0\"\n\n\
             [crio.runtime]\n\
             log_level = \"{lvl}\"\n\
             cgroup_manager = \"{cgm}\"\n\
             conmon_cgroup = \"pod\"\n\
             default_runtime = \"runc\"\n\
             container_exits_dir = \"{b}/exits\"\n\
             container_attach_socket_dir = \"{b}/attach\"\n\
             namespaces_dir = \"{b}/ns\"\n\
             pinns_path = \"{pinns}\"\n\
             hooks_dir = []\n\
             default_mounts_file = \"\"\n\
             disable_hostport_mapping = true\n\n\
             [crio.runtime.runtimes.runc]\n\
             runtime_path = \"/usr/bin/runc\"\n\
             runtime_type = \"oci\"\n\
             runtime_root = \"{b}/runc\"\n\
             monitor_path = \"/usr/bin/conmon\"\n\n\
             [crio.image]\n\
             pause_image = \"{PAUSE_IMAGE}\"\n\
             pause_command = \"/pause\"\n\
             signature_policy = \"{b}/policy.json\"\n\n\
             [crio.network]\n\
             network_dir = \"{b}/cni/conf\"\n\
             plugin_dirs = [\"{b}/cni/bin\"]\n\n\
             [crio.nri]\n\
             enable_nri = true\n\
             nri_listen = \"{b}/nri.sock\"\n\
             nri_plugin_dir = \"{b}/nri/plugins\"\n\
             nri_plugin_config_dir = \"{b}/nri/conf.d\"\n\
             nri_disable_connections = false\n\
             nri_plugin_registration_timeout = \"{reg}ms\"\n\
             nri_plugin_request_timeout = \"{req}ms\"\n",
            lvl = s.log_level,
            cgm = s.cgroup_manager,
            pinns = self.pinns_bin().display(),
            reg = s.registration_timeout.as_millis(),
            req = s.request_timeout.as_millis(),
        )
    }

    /// Writes the files the config and `skopeo` point at: the signature policy, and the
    /// registries and storage configs the `CONTAINERS_*` variables of [`Self::env`] name (so
    /// that nothing of the host's `/etc/containers` applies).
    pub(crate) fn write_files(base: &Path) -> std::io::Result<()> {
        for d in ["exits", "attach", "ns", "crio.conf.d"] {
            std::fs::create_dir_all(base.join(d))?;
        }
        std::fs::write(
            base.join("policy.json"),
            r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )?;
        std::fs::write(
            base.join("registries.conf"),
            "unqualified-search-registries = []\n",
        )?;
        let b = base.display();
        std::fs::write(
            base.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"{STORAGE_DRIVER}\"\nrunroot = \"{b}/state\"\n\
                 graphroot = \"{b}/root\"\n"
            ),
        )
    }

    /// The environment of `crio` and `skopeo` for the instance at `base`.
    pub(crate) fn env(base: &Path) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("CONTAINERS_REGISTRIES_CONF", base.join("registries.conf")),
            ("CONTAINERS_STORAGE_CONF", base.join("storage.conf")),
        ]
    }

    /// `crio`'s arguments for the instance at `base`.
    pub(crate) fn args(base: &Path) -> Vec<PathBuf> {
        vec![
            "--config".into(),
            base.join("config.toml"),
            "--config-dir".into(),
            base.join("crio.conf.d"),
        ]
    }

    /// Copies the OCI archive `archive` of image `name` into the storage of the instance at
    /// `base` (before CRI-O starts, so nothing else holds it). Panics with `skopeo`'s output if
    /// it fails.
    pub(crate) async fn import(base: &Path, archive: &Path, name: &str) {
        const WITHIN: Duration = Duration::from_secs(300);
        let dest = format!(
            "containers-storage:[{STORAGE_DRIVER}@{b}/root+{b}/state]{name}",
            b = base.display()
        );
        let mut copy = tokio::process::Command::new("skopeo");
        copy.args(["--insecure-policy", "copy", "--quiet"])
            .arg(format!("oci-archive:{}", archive.display()))
            .arg(&dest)
            .envs(Self::env(base))
            .kill_on_drop(true);
        let out = tokio::time::timeout(WITHIN, copy.output())
            .await
            .unwrap_or_else(|_| panic!("skopeo copy to {dest} did not finish within {WITHIN:?}"))
            .unwrap_or_else(|e| panic!("run skopeo: {e}"));
        assert!(
            out.status.success(),
            "skopeo copy {} {dest} failed ({}): {}{}",
            archive.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The images every instance holds, with their names.
    pub(crate) fn images<'a>(pause: &'a Path, busybox: &'a Path) -> [(&'a Path, &'static str); 2] {
        [(pause, PAUSE_IMAGE), (busybox, BUSYBOX_IMAGE)]
    }
}
