//! A private containerd instance run as a child process of the test (or a private CRI-O,
//! by hand: see [`crate::crio`]).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ImageSpec, ImageStatusRequest, ListPodSandboxRequest, RemovePodSandboxRequest,
    StopPodSandboxRequest, VersionRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::cgroups::CgroupTree;
use crate::cleanup::{self, InstanceRef, BASE_PREFIX, CGROUP_PREFIX};
use crate::crio::{CrioBuild, CrioSettings, CRIO_BIN_ENV};
use crate::images::{image_archives, BUSYBOX_IMAGE, PAUSE_IMAGE};
use crate::seeded_root;
use crate::systemd::CgroupDriver;
use crate::util::{next_instance, require_binary, require_root, tail_lines};
use crate::version::ContainerdVersion;

/// Options of a harness containerd.
#[derive(Debug, Clone)]
pub struct ContainerdOptions {
    /// containerd's `[debug] level` (default `info`, or `$NRI_RESIZE_CONTAINERD_LOG_LEVEL`).
    pub log_level: String,
    /// NRI `plugin_registration_timeout` (default 5 s).
    pub nri_registration_timeout: Duration,
    /// NRI `plugin_request_timeout` (default 2 s).
    pub nri_request_timeout: Duration,
    /// How long to wait for the CRI socket to answer (default 30 s).
    pub start_timeout: Duration,
    /// When the test panics, copy containerd's log to
    /// `/tmp/nri-resize-test-logs/<instance>.log` before the temp dir is removed (default true).
    pub keep_log_on_panic: bool,
}

impl Default for ContainerdOptions {
    fn default() -> Self {
        Self {
            log_level: std::env::var("NRI_RESIZE_CONTAINERD_LOG_LEVEL")
                .unwrap_or_else(|_| "info".to_owned()),
            nri_registration_timeout: Duration::from_secs(5),
            nri_request_timeout: Duration::from_secs(2),
            start_timeout: Duration::from_secs(30),
            keep_log_on_panic: true,
        }
    }
}

/// A private containerd with its own config, root, state, sockets, runc root, NRI socket
/// and cgroup tree, all removed on drop (also when the test panics).
///
/// Layout of the base dir `/tmp/nrt-<pid>-<n>/`: `config.toml`, `containerd.log`,
/// `c.sock` (CRI/gRPC), `c.sock.ttrpc`, `nri.sock`, `root/`, `state/`, `runc/` (runc `--root`),
/// `nri/plugins`, `nri/conf.d` (empty: no system NRI plugin runs), `pods/` (container logs).
///
/// With `$NRI_RESIZE_CRIO_BIN` set, the instance is a private CRI-O in the same layout instead
/// (its `config.toml` is CRI-O's), standing in for containerd 2.x: see [`crate::crio`].
#[derive(Debug)]
pub struct Containerd {
    version: ContainerdVersion,
    /// The CRI-O build this instance runs instead of containerd.
    crio: Option<CrioBuild>,
    opts: ContainerdOptions,
    inst: InstanceRef,
    child: Option<Child>,
    runtime_name: String,
    runtime_version: String,
    channel: Option<Channel>,
    pub(crate) cgroups: CgroupTree,
    /// When `start` began: the teardown says how long the instance lived (never asserted).
    started: Instant,
}

fn duration_toml(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl Containerd {
    /// Starts containerd `version` and imports the pause and busybox images into it.
    ///
    /// Panics (with the tail of containerd's log) if it does not come up, and with an install
    /// hint if not root or a binary is missing.
    /// `$NRI_RESIZE_CONTAINERD` (see [`ContainerdVersion::forced`]) replaces `version`, loudly.
    pub async fn start(version: ContainerdVersion, opts: ContainerdOptions) -> Self {
        Self::start_with(version, opts, true).await
    }

    /// [`Containerd::start`]; `seeded`: start from the published root with the images (made
    /// first if there is none, see [`crate::seeded_root`]) instead of importing them.
    async fn start_with(version: ContainerdVersion, opts: ContainerdOptions, seeded: bool) -> Self {
        static SWEEP: Once = Once::new();
        let (version, crio) = runtime_for(version);
        require_root();
        let started = Instant::now();
        match &crio {
            Some(crio) => crio.require(),
            None => require_binaries(version),
        }
        SWEEP.call_once(cleanup::sweep_stale);
        let archives = tokio::task::spawn_blocking(image_archives)
            .await
            .expect("build images");
        let seed = if seeded && crio.is_none() {
            Box::pin(seeded_root_for(version)).await
        } else {
            None
        };

        let pid = std::process::id();
        let (base, n) = loop {
            let n = next_instance();
            let base = PathBuf::from(format!("/tmp/{BASE_PREFIX}{pid}-{n}"));
            match std::fs::create_dir(&base) {
                Ok(()) => break (base, n),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("create {}: {e}", base.display()),
            }
        };
        let cgroups = CgroupTree::for_instance(CgroupDriver::from_env(), CGROUP_PREFIX, pid, n);
        let inst = InstanceRef {
            grpc_socket: base.join("c.sock"),
            base,
            cgroup_root: cgroups.path().to_owned(),
        };
        let mut this = Self {
            version,
            crio,
            opts,
            inst,
            child: None,
            runtime_name: String::new(),
            runtime_version: String::new(),
            channel: None,
            cgroups,
            started,
        };
        // From here on, Drop cleans up whatever exists.
        let base = this.inst.base.clone();
        std::fs::write(base.join("cgroup-root"), this.cgroups.path()).expect("write cgroup-root");
        for d in [
            "root",
            "state",
            "runc",
            "nri/plugins",
            "nri/conf.d",
            "pods",
            "opt",
            "cni/bin",
            "cni/conf",
        ] {
            std::fs::create_dir_all(base.join(d))
                .unwrap_or_else(|e| panic!("create {}/{d}: {e}", base.display()));
        }
        std::fs::write(this.config_path(), this.config_toml()).expect("write config.toml");
        if let Some(seed) = &seed {
            seeded_root::copy_tree(seed, &base.join("root")).unwrap_or_else(|e| panic!("{e}"));
        }
        // CRI-O's storage takes the images before CRI-O starts (nothing else holds it then).
        let copied = Instant::now();
        if this.crio.is_some() {
            CrioBuild::write_files(&base)
                .unwrap_or_else(|e| panic!("write CRI-O's files below {}: {e}", base.display()));
            for (archive, name) in CrioBuild::images(&archives.pause, &archives.busybox) {
                CrioBuild::import(&base, archive, name).await;
            }
        }
        let copied = copied.elapsed();
        this.cgroups.create();
        Box::pin(this.spawn()).await;
        let up = started.elapsed();
        if seed.is_none() && this.crio.is_none() {
            for archive in [&archives.pause, &archives.busybox] {
                Box::pin(this.import(archive)).await;
            }
        }
        for image in [PAUSE_IMAGE, BUSYBOX_IMAGE] {
            Box::pin(this.wait_image(image)).await;
        }
        let how = match (&seed, &this.crio) {
            (Some(_), _) => "seeded",
            (None, Some(_)) => "copied by skopeo",
            (None, None) => "imported",
        };
        let images = started.elapsed().saturating_sub(up) + copied;
        this.say_up(up.saturating_sub(copied), images, how);
        this
    }

    /// Says how long the instance took to come up and to hold its images: where a slow test's
    /// time goes (the VM tier's guests), never asserted.
    fn say_up(&self, up: Duration, images: Duration, how: &str) {
        eprintln!(
            "harness: {} {} ({}) at {}, cgroups {} ({:?}); up in {:.1} s, images {how} in {:.1} s",
            self.runtime_name,
            self.runtime_version,
            self.describe(),
            self.inst.base.display(),
            self.cgroups.path(),
            self.cgroups.mode(),
            up.as_secs_f64(),
            images.as_secs_f64()
        );
    }

    /// Which containerd this is (CRI-O stands in for [`ContainerdVersion::V2`]).
    pub fn containerd_version(&self) -> ContainerdVersion {
        self.version
    }

    /// True when the instance is CRI-O (`$NRI_RESIZE_CRIO_BIN`), not containerd.
    pub fn is_crio(&self) -> bool {
        self.crio.is_some()
    }

    /// What runs, for messages: `containerd 2`, or `CRI-O (<build dir>)`.
    fn describe(&self) -> String {
        match &self.crio {
            Some(crio) => format!("CRI-O ({})", crio.dir().display()),
            None => self.version.to_string(),
        }
    }

    /// `runtime_version` from the CRI `Version` RPC (e.g. `1.7.24~ds1`, `2.1.9+unknown`).
    pub fn version(&self) -> &str {
        &self.runtime_version
    }

    /// `runtime_name` from the CRI `Version` RPC (`containerd`, `cri-o`).
    pub fn runtime_name(&self) -> &str {
        &self.runtime_name
    }

    /// The instance's base directory.
    pub fn base_dir(&self) -> &Path {
        &self.inst.base
    }

    /// The NRI socket plugins connect to.
    pub fn nri_socket(&self) -> PathBuf {
        self.inst.base.join("nri.sock")
    }

    /// The CRI (containerd gRPC) socket.
    pub fn cri_socket(&self) -> &Path {
        &self.inst.grpc_socket
    }

    /// containerd's combined stdout/stderr (appended across restarts).
    pub fn log_path(&self) -> PathBuf {
        self.inst.base.join("containerd.log")
    }

    /// Last `n` lines of containerd's log.
    pub fn log_tail(&self, n: usize) -> String {
        tail_lines(&self.log_path(), n)
    }

    fn config_path(&self) -> PathBuf {
        self.inst.base.join("config.toml")
    }

    /// The harness's cgroup tree (pods are created below it).
    pub fn cgroups(&self) -> &CgroupTree {
        &self.cgroups
    }

    /// Pid of the running containerd process, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A CRI runtime client (cheap clone of one channel). Panics if containerd is stopped.
    pub fn runtime_client(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(self.channel.clone().expect("containerd is stopped"))
    }

    /// A CRI image client. Panics if containerd is stopped.
    pub fn image_client(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(self.channel.clone().expect("containerd is stopped"))
    }

    /// Stops the containerd process only (SIGTERM, SIGKILL after 10 s). Shims and containers
    /// keep running. No-op if already stopped.
    pub async fn stop(&mut self) {
        self.channel = None;
        if let Some(mut child) = self.child.take() {
            let pid = i32::try_from(child.id()).expect("pid fits i32");
            tokio::task::spawn_blocking(move || {
                cleanup::terminate(pid, Duration::from_secs(10));
                let _ = child.wait();
            })
            .await
            .expect("stop containerd");
        }
        // A fresh socket file marks the restarted instance's NRI as listening.
        let _ = std::fs::remove_file(self.nri_socket());
    }

    /// Stops containerd (if running) and starts it again on the same config and dirs; used to
    /// test plugin reconnects. Waits until CRI answers again.
    pub async fn restart(&mut self) {
        self.stop().await;
        Box::pin(self.spawn()).await;
    }

    fn config_toml(&self) -> String {
        let o = &self.opts;
        if let Some(crio) = &self.crio {
            return crio.config_toml(&CrioSettings {
                base: &self.inst.base,
                log_level: &o.log_level,
                registration_timeout: o.nri_registration_timeout,
                request_timeout: o.nri_request_timeout,
                cgroup_manager: match self.cgroups.driver() {
                    CgroupDriver::Systemd => "systemd",
                    CgroupDriver::Cgroupfs => "cgroupfs",
                },
            });
        }
        let b = self.inst.base.display();
        let common = format!(
            "root = \"{b}/root\"\nstate = \"{b}/state\"\n\n[grpc]\n  address = \"{b}/c.sock\"\n\n\
             [ttrpc]\n  address = \"{b}/c.sock.ttrpc\"\n\n[debug]\n  level = \"{lvl}\"\n",
            lvl = o.log_level
        );
        let nri = format!(
            "  [plugins.\"io.containerd.nri.v1.nri\"]\n    disable = false\n    disable_connections = false\n    \
             socket_path = \"{b}/nri.sock\"\n    plugin_path = \"{b}/nri/plugins\"\n    \
             plugin_config_path = \"{b}/nri/conf.d\"\n    plugin_registration_timeout = \"{reg}\"\n    \
             plugin_request_timeout = \"{req}\"\n\n  [plugins.\"io.containerd.internal.v1.opt\"]\n    path = \"{b}/opt\"\n",
            reg = duration_toml(o.nri_registration_timeout),
            req = duration_toml(o.nri_request_timeout)
        );
        // kubelet's systemd driver goes with runc's (`SystemdCgroup`): container cgroups are
        // `cri-containerd-<id>.scope` units below the pod's slice.
        let systemd = self.cgroups.driver() == CgroupDriver::Systemd;
        let runc_opts = format!("SystemdCgroup = {systemd}\n          Root = \"{b}/runc\"\n");
        match self.version {
            ContainerdVersion::V1_7 => format!(
                "version = 2\n{common}\n[plugins]\n{nri}\n\
                 \x20 [plugins.\"io.containerd.grpc.v1.cri\"]\n\
                 \x20   sandbox_image = \"{PAUSE_IMAGE}\"\n\
                 \x20   restrict_oom_score_adj = true\n\
                 \x20   enable_cdi = false\n\
                 \x20   disable_tcp_service = true\n\
                 \x20   stream_server_address = \"127.0.0.1\"\n\
                 \x20   stream_server_port = \"0\"\n\
                 \x20   [plugins.\"io.containerd.grpc.v1.cri\".cni]\n\
                 \x20     bin_dir = \"{b}/cni/bin\"\n\
                 \x20     conf_dir = \"{b}/cni/conf\"\n\
                 \x20   [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n\
                 \x20     snapshotter = \"overlayfs\"\n\
                 \x20     default_runtime_name = \"runc\"\n\
                 \x20     [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
                 \x20       runtime_type = \"io.containerd.runc.v2\"\n\
                 \x20       [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n\
                 \x20         {runc_opts}"
            ),
            ContainerdVersion::V2 => format!(
                "version = 3\n{common}\n[plugins]\n{nri}\n\
                 \x20 [plugins.\"io.containerd.cri.v1.images\"]\n\
                 \x20   snapshotter = \"overlayfs\"\n\
                 \x20   [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n\
                 \x20     sandbox = \"{PAUSE_IMAGE}\"\n\n\
                 \x20 [plugins.\"io.containerd.cri.v1.runtime\"]\n\
                 \x20   restrict_oom_score_adj = true\n\
                 \x20   enable_cdi = false\n\
                 \x20   [plugins.\"io.containerd.cri.v1.runtime\".cni]\n\
                 \x20     bin_dirs = [\"{b}/cni/bin\"]\n\
                 \x20     conf_dir = \"{b}/cni/conf\"\n\
                 \x20   [plugins.\"io.containerd.cri.v1.runtime\".containerd]\n\
                 \x20     default_runtime_name = \"runc\"\n\
                 \x20     [plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc]\n\
                 \x20       runtime_type = \"io.containerd.runc.v2\"\n\
                 \x20       sandboxer = \"podsandbox\"\n\
                 \x20       [plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\n\
                 \x20         {runc_opts}\n\
                 \x20 [plugins.\"io.containerd.grpc.v1.cri\"]\n\
                 \x20   disable_tcp_service = true\n\
                 \x20   stream_server_address = \"127.0.0.1\"\n\
                 \x20   stream_server_port = \"0\"\n\n\
                 \x20 [plugins.\"io.containerd.image-verifier.v1.bindir\"]\n\
                 \x20   bin_dir = \"{b}/opt/image-verifier\"\n"
            ),
        }
    }

    /// Starts the containerd process and waits for CRI (`Version`) and the NRI socket.
    async fn spawn(&mut self) {
        assert!(self.child.is_none(), "containerd already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|e| panic!("open {}: {e}", self.log_path().display()));
        let log2 = log.try_clone().expect("clone log fd");
        let (bin_dir, bin) = match &self.crio {
            Some(crio) => (crio.dir().to_owned(), crio.crio_bin()),
            None => (self.version.bin_dir(), self.version.containerd_bin()),
        };
        let path = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            bin_dir.display()
        );
        let mut cmd = Command::new(&bin);
        cmd.env_clear();
        if self.crio.is_some() {
            cmd.args(CrioBuild::args(&self.inst.base))
                .envs(CrioBuild::env(&self.inst.base));
        } else {
            cmd.arg("--config").arg(self.config_path());
        }
        let child = cmd
            .current_dir(&self.inst.base)
            .env("PATH", path)
            .env("HOME", &self.inst.base)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        std::fs::write(
            self.inst.base.join("containerd.pid"),
            child.id().to_string(),
        )
        .expect("write containerd.pid");
        self.child = Some(child);

        let started = Instant::now();
        let deadline = started + self.opts.start_timeout;
        let mut last_err = String::from("not tried");
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                panic!(
                    "{} exited during startup ({status}); last 50 lines of {}:\n{}",
                    self.describe(),
                    self.log_path().display(),
                    self.log_tail(50)
                );
            }
            assert!(
                    Instant::now() <= deadline,
                    "{} did not answer CRI Version within {:?} (last error: {last_err}); last 50 lines of {}:\n{}",
                    self.describe(),
                    self.opts.start_timeout,
                    self.log_path().display(),
                    self.log_tail(50)
                );
            match self.try_version().await {
                Ok((channel, name, version)) if self.nri_socket().exists() => {
                    self.channel = Some(channel);
                    self.runtime_name = name;
                    self.runtime_version = version;
                    tracing::debug!(elapsed = ?started.elapsed(), version = %self.runtime_version, "containerd ready");
                    return;
                }
                Ok(_) => last_err = format!("NRI socket {} missing", self.nri_socket().display()),
                Err(e) => last_err = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn try_version(&self) -> Result<(Channel, String, String), String> {
        let channel = connect(self.cri_socket())
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let v = RuntimeServiceClient::new(channel.clone())
            .version(VersionRequest {
                version: "v1".to_owned(),
            })
            .await
            .map_err(|e| format!("Version: {e}"))?
            .into_inner();
        Ok((channel, v.runtime_name, v.runtime_version))
    }

    async fn import(&self, archive: &Path) {
        const WITHIN: Duration = Duration::from_secs(300);
        let mut import = tokio::process::Command::new(self.version.ctr_bin());
        import
            .arg("--address")
            .arg(self.cri_socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .env(
                "PATH",
                format!(
                    "{}:/usr/sbin:/usr/bin:/sbin:/bin",
                    self.version.bin_dir().display()
                ),
            )
            // A hung import is killed when the timeout drops it.
            .kill_on_drop(true);
        let out = tokio::time::timeout(WITHIN, import.output())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "ctr images import {} did not finish within {WITHIN:?}: killed",
                    archive.display()
                )
            })
            .unwrap_or_else(|e| panic!("run {}: {e}", self.version.ctr_bin().display()));
        assert!(
            out.status.success(),
            "ctr images import {} failed ({}): {}{}",
            archive.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Waits until CRI sees `image` (CRI's image store follows containerd's asynchronously).
    async fn wait_image(&self, image: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut client = self.image_client();
        loop {
            let req = ImageStatusRequest {
                image: Some(ImageSpec {
                    image: image.to_owned(),
                    ..Default::default()
                }),
                verbose: false,
            };
            match client.image_status(req).await {
                Ok(r) if r.get_ref().image.is_some() => return,
                other => assert!(
                    Instant::now() < deadline,
                    "{}: image {image} not visible through CRI after import ({other:?}); log:\n{}",
                    self.describe(),
                    self.log_tail(50)
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What runs where a test names containerd `version`: the version `$NRI_RESIZE_CONTAINERD`
/// forces, or a CRI-O build (`$NRI_RESIZE_CRIO_BIN`) standing in for containerd 2.x (what a
/// test expects of 2.x it expects of CRI-O); either is said on the test's output.
fn runtime_for(version: ContainerdVersion) -> (ContainerdVersion, Option<CrioBuild>) {
    let version = match ContainerdVersion::forced() {
        Some(forced) if forced != version => {
            eprintln!(
                "harness: NRI_RESIZE_CONTAINERD={}: running {forced} where the test names {version}",
                forced.label()
            );
            forced
        }
        _ => version,
    };
    match CrioBuild::from_env() {
        Some(crio) => {
            eprintln!(
                "harness: {CRIO_BIN_ENV}={}: running CRI-O where the test names {version}",
                crio.dir().display()
            );
            (ContainerdVersion::V2, Some(crio))
        }
        None => (version, None),
    }
}

/// Connects a tonic channel to a unix socket.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
}

/// Stops and removes every pod of the instance through CRI, with a deadline. Runs on its own
/// thread and runtime so that it works from `Drop` inside or outside a tokio runtime.
fn cri_remove_all_pods(socket: PathBuf) {
    let worker = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let work = async {
                let channel = connect(&socket).await.ok()?;
                let mut rt = RuntimeServiceClient::new(channel);
                let pods = rt
                    .list_pod_sandbox(ListPodSandboxRequest { filter: None })
                    .await
                    .ok()?
                    .into_inner()
                    .items;
                for p in pods {
                    let _ = rt
                        .stop_pod_sandbox(StopPodSandboxRequest {
                            pod_sandbox_id: p.id.clone(),
                        })
                        .await;
                    let _ = rt
                        .remove_pod_sandbox(RemovePodSandboxRequest {
                            pod_sandbox_id: p.id,
                        })
                        .await;
                }
                Some(())
            };
            if tokio::time::timeout(Duration::from_secs(20), work)
                .await
                .is_err()
            {
                tracing::warn!("CRI cleanup timed out");
            }
        });
    });
    let _ = worker.join();
}

/// Panics with an install hint unless `version`'s binaries and runc are there.
fn require_binaries(version: ContainerdVersion) {
    require_binary(
        &version.containerd_bin(),
        &format!("{version} (containerd)"),
    );
    require_binary(&version.ctr_bin(), &format!("{version} (ctr)"));
    require_binary(
        &version.shim_bin(),
        &format!("{version} (containerd-shim-runc-v2)"),
    );
    require_binary(Path::new("/usr/bin/runc"), "runc (/usr/bin/runc)");
}

/// The published root with the images for `version`; the first caller of a containerd build
/// makes it: a private containerd imports the archives, is stopped cleanly, and its root is
/// published. `None` (the caller imports) when it cannot be made.
async fn seeded_root_for(version: ContainerdVersion) -> Option<PathBuf> {
    let archives = image_archives();
    if let Some(root) = seeded_root::published(version, archives) {
        return Some(root);
    }
    let _making = seeded_root::making_lock().lock().await;
    if let Some(root) = seeded_root::published(version, archives) {
        return Some(root);
    }
    let mut maker = Box::pin(Containerd::start_with(
        version,
        ContainerdOptions::default(),
        false,
    ))
    .await;
    maker.channel = None;
    if let Some(mut child) = maker.child.take() {
        if let Ok(pid) = i32::try_from(child.id()) {
            cleanup::terminate(pid, Duration::from_secs(30));
        }
        let _ = child.wait();
    }
    seeded_root::publish(version, archives, &maker.inst.base.join("root"));
    drop(maker);
    seeded_root::published(version, archives)
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let teardown = Instant::now();
        self.channel = None;
        if self.child.is_some() {
            eprintln!(
                "harness: {} at {} ran {:.1} s",
                self.describe(),
                self.inst.base.display(),
                self.started.elapsed().as_secs_f64()
            );
        }
        if let Some(mut child) = self.child.take() {
            if child.try_wait().ok().flatten().is_none() {
                cri_remove_all_pods(self.inst.grpc_socket.clone());
            }
            let pods_removed = teardown.elapsed();
            if let Ok(pid) = i32::try_from(child.id()) {
                cleanup::terminate(pid, Duration::from_secs(10));
            }
            let _ = child.wait();
            eprintln!(
                "harness: {} at {} stopped in {:.1} s (pods removed in {:.1} s)",
                self.describe(),
                self.inst.base.display(),
                teardown.elapsed().as_secs_f64(),
                pods_removed.as_secs_f64()
            );
        }
        if panicking {
            let mut kept = String::new();
            if self.opts.keep_log_on_panic {
                let dir = Path::new("/tmp/nri-resize-test-logs");
                let name = self
                    .inst
                    .base
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let keep = dir.join(format!("{name}.log"));
                if std::fs::create_dir_all(dir)
                    .and_then(|()| std::fs::copy(self.log_path(), &keep))
                    .is_ok()
                {
                    kept = format!(" (log kept at {})", keep.display());
                }
            }
            eprintln!(
                "harness: test panicked; {}{kept}, last 50 lines of its log:\n{}",
                self.describe(),
                self.log_tail(50)
            );
        }
        let problems = cleanup::teardown(&self.inst);
        if !problems.is_empty() {
            eprintln!(
                "harness: cleanup of {} incomplete: {problems:?}",
                self.inst.base.display()
            );
            assert!(
                panicking,
                "harness: cleanup of {} incomplete: {problems:?}",
                self.inst.base.display()
            );
        }
    }
}
