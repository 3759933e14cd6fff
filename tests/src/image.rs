//! The daemon run from its OCI image (`cargo xtask image`) inside a harness containerd, the
//! way the `DaemonSet` runs it on a node: imported with `ctr -n k8s.io images import`, its pod
//! and container created through CRI with the security context, namespaces and mounts a
//! rendered `DaemonSet` gives them ([`AsDeployed`]).
//!
//! The container's cgroup is placed inside the harness's own cgroup tree, so everything it
//! starts is removed with the harness; the container itself is killed and deleted by id on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{output_within, tail_lines};

/// How long one `ctr` command may take (an image import included) before it counts as hung.
const CTR_TIMEOUT: Duration = Duration::from_secs(300);
/// The same for the best-effort cleanup in `Drop` (which never panics).
const CTR_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
use crate::Containerd;

/// The image's name, as `cargo xtask image` writes it.
pub const DAEMON_IMAGE: &str = concat!("localhost/nri-resize:", env!("CARGO_PKG_VERSION"));

/// The daemon's image archive: `$NRI_RESIZE_IMAGE_ARCHIVE`, else `target/image/nri-resize.oci.tar`
/// of this workspace. Panics with the command that builds it when there is none.
pub fn daemon_image_archive() -> PathBuf {
    let path = std::env::var_os("NRI_RESIZE_IMAGE_ARCHIVE").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("tests/ is in the workspace")
                .join("target/image/nri-resize.oci.tar")
        },
        PathBuf::from,
    );
    assert!(
        path.is_file(),
        "no daemon image archive at {}: build it with `cargo xtask image` (release) or \
         `cargo xtask image --debug` (the containerd tier of `cargo xtask test` does), or point \
         NRI_RESIZE_IMAGE_ARCHIVE at one",
        path.display()
    );
    path
}

/// A plain HTTP/1.0 GET over TCP: (status code, headers lowercased, body). `None` when nothing
/// answers.
pub fn http_get(addr: &str, path: &str, accept: Option<&str>) -> Option<(u16, String, String)> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let accept = accept.map_or_else(String::new, |a| format!("Accept: {a}\r\n"));
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{accept}\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    let code = status.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, headers.to_lowercase(), body.to_string()))
}

/// The capabilities the default `DaemonSet` (`deploy/base`) adds after dropping all (README
/// "Privileges"); `tests/tests/deploy_manifests.rs` holds the manifests to them.
pub const LEAST_PRIVILEGE_CAPS: &[&str] = &["CAP_BPF", "CAP_PERFMON", "CAP_KILL"];

/// The daemon running in a container of `ctrd`, from [`DAEMON_IMAGE`].
#[derive(Debug)]
pub struct DaemonContainer {
    ctr: PathBuf,
    address: PathBuf,
    id: String,
    /// Host directory mounted at `/run/nri-resize` (holds `api.sock`).
    pub api_dir: PathBuf,
    /// Where `/metrics`, `/healthz` and `/readyz` answer (host network).
    pub metrics_addr: String,
    /// The container's stdout/stderr.
    pub log_path: PathBuf,
    /// The daemon's pod cgroup (absolute cgroup path): the daemon is its only container.
    pub pod_cgroup: String,
}

/// A TCP port free on 127.0.0.1 now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("find a free TCP port")
}

impl DaemonContainer {
    fn ctr(&self) -> Command {
        let mut c = Command::new(&self.ctr);
        c.arg("--address").arg(&self.address).args(["-n", "k8s.io"]);
        c
    }

    fn run_ctr(&self, what: &str, args: &[&str]) -> std::process::Output {
        let out = output_within(self.ctr().args(args), CTR_TIMEOUT, what)
            .unwrap_or_else(|e| panic!("{what}: run {}: {e}", self.ctr.display()));
        assert!(
            out.status.success(),
            "{what} ({:?}) failed ({}): {}{}",
            args,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// The daemon's log so far (last `n` lines).
    pub fn log_tail(&self, n: usize) -> String {
        tail_lines(&self.log_path, n)
    }

    /// Waits until `/readyz` answers 200 (registered, synchronized, observer loaded).
    pub fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            last = http_get(&self.metrics_addr, "/readyz", None);
            if last.as_ref().is_some_and(|(code, _, _)| *code == 200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "the daemon container was not ready within {timeout:?}; last /readyz: {last:?}\nlog:\n{}",
            self.log_tail(60)
        );
    }

    /// Runs `args` inside the daemon container (`ctr task exec`): (exit code, stdout, stderr).
    pub fn exec(&self, args: &[&str]) -> (i32, String, String) {
        let exec_id = format!("exec-{}", crate::util::next_instance());
        let out = output_within(
            self.ctr()
                .args(["task", "exec", "--exec-id", &exec_id, &self.id])
                .args(args),
            CTR_TIMEOUT,
            "ctr task exec",
        )
        .unwrap_or_else(|e| panic!("ctr task exec: {e}"));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// The daemon's container as a `DaemonSet` in `deploy/` renders it, to be created through CRI
/// the way kubelet creates it: the rendered security context (translated field by field as
/// kubelet does), the host PID namespace if `hostPID`, and the rendered mounts with the host
/// paths a test chooses.
#[derive(Debug, Clone, Default)]
pub struct AsDeployed {
    /// The container's `args` (the image's entrypoint runs them).
    pub args: Vec<String>,
    /// The container's `env`.
    pub env: Vec<(String, String)>,
    /// `hostPID`.
    pub host_pid: bool,
    /// (host path, container path, read only) for every volume mount.
    pub mounts: Vec<(PathBuf, String, bool)>,
    /// The container's `securityContext` in CRI terms.
    pub security: k8s_cri::v1::LinuxContainerSecurityContext,
    /// Host directory behind the API socket's directory (for [`DaemonContainer::api_dir`]).
    pub api_dir: PathBuf,
    /// Where `/metrics` answers (the rendered `--metrics-addr` replaced by the test's).
    pub metrics_addr: String,
    /// `resources.limits.memory` in bytes, applied to the container as kubelet does.
    pub memory_limit: Option<i64>,
}

impl DaemonContainer {
    /// Imports `archive` and creates the daemon's pod and container through CRI as `spec`
    /// says (host network, as every test's pods here); does not wait for readiness.
    pub async fn start_as_deployed(
        ctrd: &Containerd,
        archive: &Path,
        spec: AsDeployed,
    ) -> DaemonContainer {
        use k8s_cri::v1::{
            CreateContainerRequest, LinuxPodSandboxConfig, LinuxSandboxSecurityContext,
            NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
            RunPodSandboxRequest, StartContainerRequest,
        };
        let base = ctrd.base_dir();
        let n = crate::util::next_instance();
        let log_dir = base.join(format!("image-daemon-pod-{n}"));
        std::fs::create_dir_all(&log_dir)
            .unwrap_or_else(|e| panic!("create {}: {e}", log_dir.display()));
        let archive_str = archive.to_str().expect("utf-8 archive path");
        let mut d = DaemonContainer {
            ctr: ctrd.containerd_version().ctr_bin(),
            address: ctrd.cri_socket().to_path_buf(),
            id: String::new(),
            api_dir: spec.api_dir.clone(),
            metrics_addr: spec.metrics_addr.clone(),
            log_path: log_dir.join("nri-resize.log"),
            pod_cgroup: String::new(),
        };
        d.run_ctr(
            "import the daemon image",
            &["images", "import", archive_str],
        );
        let namespaces = NamespaceOption {
            network: NamespaceMode::Node.into(),
            pid: if spec.host_pid {
                NamespaceMode::Node.into()
            } else {
                NamespaceMode::Pod.into()
            },
            ipc: NamespaceMode::Pod.into(),
            ..Default::default()
        };
        let uid = format!("{:08x}-0000-4000-8000-{n:012x}", std::process::id());
        let (cgroup_parent, cgroup_path) = ctrd.cgroups().pod_cgroup(&uid);
        ctrd.cgroups().create_cgroup(&cgroup_path);
        d.pod_cgroup.clone_from(&cgroup_path);
        let sandbox = PodSandboxConfig {
            labels: crate::pod::kubelet_labels(
                &std::collections::HashMap::new(),
                "nri-resize",
                "kube-system",
                &uid,
                None,
            ),
            metadata: Some(PodSandboxMetadata {
                name: "nri-resize".into(),
                uid,
                namespace: "kube-system".into(),
                attempt: 0,
            }),
            log_directory: log_dir.to_string_lossy().into_owned(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent,
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces.clone()),
                    // kubelet: a sandbox is privileged when one of its containers is.
                    privileged: spec.security.privileged,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut client = ctrd.runtime_client();
        let pod_id = Box::pin(client.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox.clone()),
            runtime_handler: String::new(),
        }))
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox for the daemon: {e}"))
        .into_inner()
        .pod_sandbox_id;
        let config = container_config(&spec, namespaces, &sandbox.labels);
        let id = Box::pin(client.create_container(CreateContainerRequest {
            pod_sandbox_id: pod_id,
            config: Some(config),
            sandbox_config: Some(sandbox),
        }))
        .await
        .unwrap_or_else(|e| panic!("CreateContainer for the daemon: {e}"))
        .into_inner()
        .container_id;
        d.id = id;
        client
            .start_container(StartContainerRequest {
                container_id: d.id.clone(),
            })
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "StartContainer for the daemon: {e}\nlog:\n{}",
                    d.log_tail(40)
                )
            });
        d
    }

    /// The OCI spec containerd gave the container (`ctr containers info`): what the runtime
    /// really applied (capabilities, seccomp, mounts), read back.
    pub fn oci_spec(&self) -> serde_json::Value {
        let out = self.run_ctr("container info", &["containers", "info", &self.id]);
        let info: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("ctr containers info is JSON");
        info["Spec"].clone()
    }

    /// The daemon's process status (`/proc/<pid>/status` of the container's init, read from
    /// the host): `CapEff`, `Seccomp`, `NoNewPrivs` as the kernel sees them.
    pub fn process_status(&self) -> String {
        let pid = self.pid();
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"))
    }

    /// The host pid of the container's init (the daemon): `/proc/<pid>/root` is the
    /// container's view of the filesystem, its mounts included.
    pub fn pid(&self) -> u32 {
        let out = self.run_ctr("task ls", &["task", "ls"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let pid = text
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(self.id.as_str()))
                    .then(|| f.next())
                    .flatten()
            })
            .unwrap_or_else(|| panic!("no task {} in\n{text}", self.id));
        pid.parse()
            .unwrap_or_else(|e| panic!("task {} pid {pid:?}: {e}", self.id))
    }
}

/// The daemon's `ContainerConfig` for CRI from `spec`, in the sandbox's `namespaces`.
/// `sandbox_labels` are the sandbox's (kubelet's pod labels): the container gets them with its
/// own name, as kubelet labels every container.
fn container_config(
    spec: &AsDeployed,
    namespaces: k8s_cri::v1::NamespaceOption,
    sandbox_labels: &std::collections::HashMap<String, String>,
) -> k8s_cri::v1::ContainerConfig {
    use k8s_cri::v1::{
        ContainerConfig, ContainerMetadata, ImageSpec, KeyValue, LinuxContainerConfig, Mount,
    };
    let mut security = spec.security.clone();
    security.namespace_options = Some(namespaces);
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "nri-resize".into(),
            attempt: 0,
        }),
        labels: {
            let mut labels = sandbox_labels.clone();
            labels.insert("io.kubernetes.container.name".into(), "nri-resize".into());
            labels
        },
        image: Some(ImageSpec {
            image: DAEMON_IMAGE.into(),
            user_specified_image: DAEMON_IMAGE.into(),
            ..Default::default()
        }),
        args: spec.args.clone(),
        envs: spec
            .env
            .iter()
            .map(|(key, value)| KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts: spec
            .mounts
            .iter()
            .map(|(host, inside, readonly)| Mount {
                container_path: inside.clone(),
                host_path: host.to_string_lossy().into_owned(),
                readonly: *readonly,
                ..Default::default()
            })
            .collect(),
        log_path: "nri-resize.log".into(),
        linux: Some(LinuxContainerConfig {
            security_context: Some(security),
            resources: spec.memory_limit.map(|memory_limit_in_bytes| {
                k8s_cri::v1::LinuxContainerResources {
                    memory_limit_in_bytes,
                    ..Default::default()
                }
            }),
        }),
        ..Default::default()
    }
}

impl Drop for DaemonContainer {
    fn drop(&mut self) {
        // By id, best effort: the harness's own cleanup kills whatever is left in its cgroups.
        let _ = output_within(
            self.ctr()
                .args(["task", "kill", "--signal", "SIGKILL", &self.id]),
            CTR_CLEANUP_TIMEOUT,
            "ctr task kill",
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            let ok = output_within(
                self.ctr().args(["task", "delete", "--force", &self.id]),
                CTR_CLEANUP_TIMEOUT,
                "ctr task delete",
            )
            .is_ok_and(|o| o.status.success());
            if ok {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = output_within(
            self.ctr().args(["container", "delete", &self.id]),
            CTR_CLEANUP_TIMEOUT,
            "ctr container delete",
        );
    }
}
