//! The daemon run from its OCI image (`cargo xtask image`) inside a harness containerd, the
//! way the `DaemonSet` runs it on a node: imported with `ctr -n k8s.io images import`, started
//! with `ctr run` privileged, in the host's PID and network namespaces, with the NRI socket,
//! cgroupfs, the API socket directory and the state directory mounted from the host.
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

/// How the daemon container is privileged: as `deploy/base/daemonset.yaml`, or as the
/// least-privilege overlay (`deploy/overlays/least-privilege`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Privilege {
    /// `privileged: true`.
    Privileged,
    /// Not privileged: the runtime's default capabilities dropped, these added, a read-only
    /// root filesystem, the host's tracefs mounted at `/sys/kernel/tracing` (mounting it would
    /// need `CAP_SYS_ADMIN`).
    Capabilities(Vec<String>),
}

/// The capabilities of the least-privilege overlay (`deploy/overlays/least-privilege`).
pub const LEAST_PRIVILEGE_CAPS: &[&str] = &["CAP_BPF", "CAP_PERFMON", "CAP_KILL"];

/// containerd's default capability set for unprivileged containers (dropped one by one: `ctr`
/// takes no `ALL`).
const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

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
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("find a free TCP port")
}

/// `ctr run` flags for `privilege`; adds the mounts it needs.
fn privilege_args(privilege: &Privilege, mounts: &mut Vec<String>) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    match privilege {
        Privilege::Privileged => args.push("--privileged".into()),
        Privilege::Capabilities(caps) => {
            // As the overlay: `readOnlyRootFilesystem: true`.
            args.push("--read-only".into());
            for c in DEFAULT_CAPS {
                args.extend(["--cap-drop".to_string(), (*c).to_string()]);
            }
            for c in caps {
                args.extend(["--cap-add".to_string(), c.clone()]);
            }
            let tracing = Path::new("/sys/kernel/tracing");
            assert!(
                tracing.join("events").is_dir(),
                "the host has no tracefs at /sys/kernel/tracing to mount (mount -t tracefs tracefs /sys/kernel/tracing)"
            );
            mounts.push(format!(
                "type=bind,src={},dst=/sys/kernel/tracing,options=rbind:rw",
                tracing.display()
            ));
        }
    }
    args
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

    /// Imports `archive` into `ctrd` (namespace `k8s.io`, where kubelet's images live) and
    /// starts the daemon from it. Does not wait for readiness ([`Self::wait_ready`]).
    pub fn start(ctrd: &Containerd, archive: &Path, privilege: &Privilege) -> DaemonContainer {
        let base = ctrd.base_dir();
        let api_dir = base.join("image-daemon-api");
        let state_dir = base.join("image-daemon-state");
        for d in [&api_dir, &state_dir] {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        let d = DaemonContainer {
            ctr: ctrd.containerd_version().ctr_bin(),
            address: ctrd.cri_socket().to_path_buf(),
            id: format!(
                "nri-resize-daemon-{}-{}",
                std::process::id(),
                crate::util::next_instance()
            ),
            api_dir,
            metrics_addr: format!("127.0.0.1:{}", free_port()),
            log_path: base.join("image-daemon.log"),
        };
        let archive = archive.to_str().expect("utf-8 archive path");
        d.run_ctr("import the daemon image", &["images", "import", archive]);
        let images = d.run_ctr("list images", &["images", "ls", "-q"]);
        assert!(
            String::from_utf8_lossy(&images.stdout).contains(DAEMON_IMAGE),
            "{DAEMON_IMAGE} not among the imported images: {}",
            String::from_utf8_lossy(&images.stdout)
        );
        let bind = |src: &Path, dst: &str| {
            format!("type=bind,src={},dst={dst},options=rbind:rw", src.display())
        };
        let nri_socket = ctrd.nri_socket();
        let cgroup = format!("{}/nri-resize-daemon", ctrd.cgroups().path());
        let log_uri = format!("file://{}", d.log_path.display());
        // The host's PID namespace, as `hostPID: true`: this process's (`/proc/1` may be
        // unreadable when the test machine is itself a container).
        let host_pid_ns = format!("pid:/proc/{}/ns/pid", std::process::id());
        let mut mounts = vec![
            // The private containerd's NRI socket where the DaemonSet mounts the node's
            // (/var/run/nri); the socket file itself: its directory also holds the rootfs mounts.
            format!(
                "type=bind,src={},dst=/var/run/nri/nri.sock,options=bind:rw",
                nri_socket.display()
            ),
            bind(Path::new("/sys/fs/cgroup"), "/sys/fs/cgroup"),
            bind(&d.api_dir, "/run/nri-resize"),
            bind(&state_dir, "/var/lib/nri-resize"),
        ];
        let privilege_args = privilege_args(privilege, &mut mounts);
        let mut args: Vec<String> = Vec::new();
        args.extend(
            [
                "run",
                "--detach",
                "--net-host",
                "--with-ns",
                &host_pid_ns,
                "--cgroup",
                &cgroup,
                "--log-uri",
                &log_uri,
                "--env",
                "NRI_RESIZE_LOG=nri_resize=debug,info",
            ]
            .iter()
            .map(ToString::to_string),
        );
        args.extend(privilege_args);
        for m in &mounts {
            args.push("--mount".into());
            args.push(m.clone());
        }
        args.extend(
            [
                DAEMON_IMAGE,
                &d.id,
                "/usr/bin/nri-resize",
                "run",
                "--nri-socket",
                "/var/run/nri/nri.sock",
                "--metrics-addr",
                &d.metrics_addr,
            ]
            .iter()
            .map(ToString::to_string),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        d.run_ctr("run the daemon container", &args);
        d
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
