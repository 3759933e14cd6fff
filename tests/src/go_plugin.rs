//! `nri-other`: the tests' own NRI plugin in Go (`tests/go-plugin`), on NRI's Go stub, independent
//! of nri-resize's code and transport. Built offline with the Go toolchain and the NRI 0.8 Go
//! sources `xtask/scripts/setup-host.sh` unpacks from Debian sid into `<cache>/go-nri`; the
//! binary is cached by the hash of its source and of those packages.
//! Stopped by pid on drop (SIGTERM, then SIGKILL), also when the test panics.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sha2::{Digest as _, Sha256};

use crate::util::{cache_dir, tail_lines};
use crate::Containerd;

/// What the Go plugin does with `UpdateContainer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoPluginMode {
    /// Sets the container's cpuset (`cpus`, `mems`; empty: not set) and, if given, one cgroup v2
    /// `unified` key on every `UpdateContainer`: NRI records it as those fields' owner.
    Adjust {
        cpus: String,
        mems: String,
        unified: Option<(String, String)>,
    },
    /// Subscribes to the events nri-resize subscribes to and answers every one empty.
    Noop,
}

/// The built `nri-other` binary (built on first use; panics with the build's output when the
/// toolchain is missing or the build fails).
pub fn go_plugin_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(build)
}

fn build() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("go-plugin");
    let go_dir = cache_dir().join("go-nri");
    let goroot = go_dir.join("usr/lib/go-1.26");
    let go = goroot.join("bin/go");
    assert!(
        go.is_file() && go_dir.join("usr/share/gocode/src/github.com/containerd/nri/pkg/stub").is_dir(),
        "no Go toolchain / NRI Go stub at {}: run `cargo xtask setup` (xtask/scripts/setup-host.sh)",
        go_dir.display()
    );
    let main = std::fs::read(src.join("main.go")).expect("read tests/go-plugin/main.go");
    let debs = std::fs::read(go_dir.join(".deb")).unwrap_or_default();
    let hash = Sha256::digest([main.as_slice(), b"\0", debs.as_slice()].concat());
    let hex = hash.iter().take(8).fold(String::new(), |mut s, b| {
        use std::fmt::Write as _;
        let _ = write!(s, "{b:02x}");
        s
    });
    let out_dir = cache_dir().join("go-plugin");
    let bin = out_dir.join(format!("nri-other-{hex}"));
    if bin.is_file() {
        return bin;
    }
    std::fs::create_dir_all(&out_dir).expect("create the Go plugin cache dir");
    let tmp = out_dir.join(format!("nri-other-{hex}.{}.tmp", std::process::id()));
    let started = Instant::now();
    let out = Command::new(&go)
        .current_dir(&src)
        .args(["build", "-o"])
        .arg(&tmp)
        .arg(".")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &out_dir)
        .env("GOROOT", &goroot)
        .env("GOPATH", go_dir.join("usr/share/gocode"))
        .env("GOCACHE", out_dir.join("go-build-cache"))
        .env("GO111MODULE", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0")
        .output()
        .expect("run go build");
    assert!(
        out.status.success(),
        "go build of tests/go-plugin failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &bin).expect("move the built Go plugin into place");
    eprintln!(
        "built the Go NRI plugin {} in {} s",
        bin.display(),
        started.elapsed().as_secs()
    );
    bin
}

/// A running `nri-other` attached to a harness containerd.
#[derive(Debug)]
pub struct GoPlugin {
    child: Option<Child>,
    /// Its stdout and stderr: one `update <id> <fields>` line per `UpdateContainer` it adjusted.
    pub log_path: PathBuf,
}

impl GoPlugin {
    /// Starts `nri-other` as plugin `idx`-`name` of `ctrd` and waits (up to 15 s) until the
    /// runtime synchronized it; panics with its log otherwise.
    pub fn start(ctrd: &Containerd, name: &str, idx: &str, mode: &GoPluginMode) -> GoPlugin {
        let log_path = ctrd.base_dir().join(format!("{name}.log"));
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open Go plugin log");
        let mut cmd = Command::new(go_plugin_binary());
        cmd.arg("-socket")
            .arg(ctrd.nri_socket())
            .args(["-name", name, "-idx", idx]);
        match mode {
            GoPluginMode::Noop => {
                cmd.args(["-mode", "noop"]);
            }
            GoPluginMode::Adjust {
                cpus,
                mems,
                unified,
            } => {
                cmd.args(["-mode", "adjust", "-cpus", cpus, "-mems", mems]);
                if let Some((k, v)) = unified {
                    cmd.arg("-unified").arg(format!("{k}={v}"));
                }
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn the Go NRI plugin");
        let mut p = GoPlugin {
            child: Some(child),
            log_path,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while !p.log_tail(50).contains("synchronized") {
            if let Some(Ok(Some(status))) = p.child.as_mut().map(Child::try_wait) {
                panic!("the Go NRI plugin exited ({status}):\n{}", p.log_tail(50));
            }
            assert!(
                Instant::now() < deadline,
                "the Go NRI plugin was not synchronized within 15 s:\n{}",
                p.log_tail(50)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    /// Its pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        tail_lines(&self.log_path, n)
    }

    /// How many `UpdateContainer`s of container `id` it adjusted.
    pub fn updates_of(&self, id: &str) -> usize {
        let needle = format!("update {id} ");
        std::fs::read_to_string(&self.log_path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with(&needle))
            .count()
    }
}

impl Drop for GoPlugin {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
