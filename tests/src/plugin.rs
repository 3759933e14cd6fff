//! The nri-resize daemon as a child process of a test, attached to a harness containerd.
//! Stopped by pid on drop (SIGTERM, then SIGKILL), also when the test panics.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use nri_resize::api::ApiClient;

use crate::util::tail_lines;
use crate::Containerd;

/// How long a started daemon may take to be ready (registered, synchronized, observer loaded).
/// A bound on a wait for an outcome, not a speed target: the observer loads its eBPF programs at
/// nice 10, and on a machine busy with builds or the VM tier's guests that took over 15 s.
const READY_WITHIN: Duration = Duration::from_secs(90);

/// The plugin binary: `$NRI_RESIZE_BIN`, else `target/debug/nri-resize` of this workspace,
/// built once per test process if needed (with the feature `fault-injection`).
pub fn plugin_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("NRI_RESIZE_BIN") {
            let p = PathBuf::from(p);
            assert!(p.is_file(), "NRI_RESIZE_BIN={} does not exist", p.display());
            return p;
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ is in the workspace");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(root)
            // With the test-only fault injection (`plugin/src/cgroup/fault.rs`), as the test
            // tiers build it.
            .args(["build", "-q", "-p", "nri-resize", "--bin", "nri-resize"])
            .args(["--features", "fault-injection"])
            .status()
            .expect("run cargo build for the plugin binary");
        assert!(status.success(), "building the nri-resize binary failed");
        root.join("target/debug/nri-resize")
    })
}

/// A running `nri-resize run`.
#[derive(Debug)]
pub struct PluginProcess {
    child: Option<Child>,
    pub api_socket: PathBuf,
    pub log_path: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    nri_socket: PathBuf,
    /// Checkpoints of in-flight resizes; kept across `restart`.
    pub state_dir: PathBuf,
}

impl PluginProcess {
    /// Writes the checkpoint an earlier nri-resize (before the refused-decrease protocol) left
    /// in its state directory for a staged decrease of container `id` (of sandbox `pod_id`) to
    /// `target` bytes, the container's spec holding `interim`: what a daemon upgraded over one
    /// finds and resumes at its next start.
    ///
    /// # Panics
    /// If the state directory cannot be written.
    pub fn write_legacy_checkpoint(&self, pod_id: &str, id: &str, target: i64, interim: i64) {
        std::fs::create_dir_all(&self.state_dir).expect("state dir");
        let record = serde_json::json!({
            "container_id": id,
            "pod_id": pod_id,
            "target": target,
            "interim": interim,
        });
        std::fs::write(
            self.state_dir.join(format!("reclaim-{id}.json")),
            record.to_string(),
        )
        .expect("checkpoint");
    }

    /// A plugin process for `ctrd` named `name` (its sockets, log and state under the
    /// containerd's base directory), started with `args` and `env`.
    fn spawned(
        ctrd: &Containerd,
        name: &str,
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Self {
        let dir = ctrd.base_dir();
        let mut p = PluginProcess {
            child: None,
            // A directory of its own: the daemon refuses to tighten a shared one.
            api_socket: dir.join(format!("{name}-api/api.sock")),
            log_path: dir.join(format!("{name}.log")),
            args,
            env,
            nri_socket: ctrd.nri_socket(),
            state_dir: dir.join(format!("{name}-state")),
        };
        p.spawn();
        p
    }

    /// Starts the plugin against `ctrd` with `extra` arguments; does not wait for readiness.
    pub fn start(ctrd: &Containerd, name: &str, extra: &[&str]) -> PluginProcess {
        let args = extra.iter().map(ToString::to_string).collect();
        PluginProcess::spawned(ctrd, name, args, Vec::new())
    }

    /// [`Self::start`] as the `DaemonSet` runs it: JSON logs at `info` (tests log at `debug`, which
    /// costs every event a formatted line): for benchmarks, which measure what is deployed.
    pub fn start_as_deployed(ctrd: &Containerd, name: &str, extra: &[&str]) -> PluginProcess {
        let mut args: Vec<String> = extra.iter().map(ToString::to_string).collect();
        args.push("--log-format=json".to_string());
        let env = vec![("NRI_RESIZE_LOG".to_string(), "info".to_string())];
        PluginProcess::spawned(ctrd, name, args, env)
    }

    /// [`Self::start_ready`] with extra environment variables (e.g. a test-only fault).
    pub async fn start_ready_env(
        ctrd: &Containerd,
        name: &str,
        env: &[(&str, &str)],
    ) -> PluginProcess {
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        let mut p = PluginProcess::spawned(ctrd, name, Vec::new(), env);
        p.wait_ready(READY_WITHIN).await;
        p
    }

    /// Starts the plugin against `ctrd` with `config` (TOML, written to `<base>/<name>.toml`;
    /// `None`: the built-in defaults) and waits up to 15 s for it to be ready (panics with its
    /// log otherwise).
    pub async fn start_ready(ctrd: &Containerd, name: &str, config: Option<&str>) -> PluginProcess {
        let mut args = Vec::new();
        if let Some(text) = config {
            let path = ctrd.base_dir().join(format!("{name}.toml"));
            std::fs::write(&path, text)
                .unwrap_or_else(|e| panic!("write plugin config {}: {e}", path.display()));
            args.push("--config".to_string());
            args.push(path.to_string_lossy().into_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut plugin = PluginProcess::start(ctrd, name, &args);
        plugin.wait_ready(READY_WITHIN).await;
        plugin
    }

    fn spawn(&mut self) {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open plugin log");
        let child = Command::new(plugin_binary())
            .arg("run")
            .arg("--nri-socket")
            .arg(&self.nri_socket)
            .arg("--api-socket")
            .arg(&self.api_socket)
            // Tests run several plugins at once: an ephemeral metrics port and a state dir each.
            .args(["--metrics-addr", "127.0.0.1:0"])
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(&self.args)
            .env("NRI_RESIZE_LOG", "nri_resize=debug,info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn nri-resize");
        self.child = Some(child);
    }

    /// The status API client.
    pub fn api(&self) -> ApiClient {
        ApiClient::new(&self.api_socket)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last `n` lines of the plugin's log.
    pub fn log_tail(&self, n: usize) -> String {
        tail_lines(&self.log_path, n)
    }

    /// Waits until `/readyz` says registered, synchronized and the observer loaded; panics with
    /// the log otherwise. In the VM tier's emulated guests (`NRI_RESIZE_IN_VM`), where loading
    /// the eBPF programs alone takes up to ~12 s, the wait is at least 60 s.
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let timeout = if std::env::var_os("NRI_RESIZE_IN_VM").is_some() {
            timeout.max(Duration::from_secs(60))
        } else {
            timeout
        };
        let started = Instant::now();
        let deadline = started + timeout;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "nri-resize exited early ({status}); log:\n{}",
                    self.log_tail(40)
                );
            }
            if matches!(self.api().ready().await, Ok(true)) {
                // Where a slow test's time goes (the VM tier's guests): never asserted.
                eprintln!(
                    "harness: nri-resize ready in {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nri-resize not ready after {timeout:?}; log:\n{}",
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends `sig` and waits for exit (up to `timeout`, then SIGKILL). Returns the exit code.
    pub fn stop_with(&mut self, sig: Signal, timeout: Duration) -> Option<i32> {
        let mut child = self.child.take()?;
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
        let _ = kill(pid, sig);
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Graceful stop (SIGTERM); panics if the plugin does not exit 0 within 5 s (75 s in the VM
    /// tier's TCG guests, `NRI_RESIZE_IN_VM`: a SIGTERM during start-up waits for the eBPF
    /// programs to load, which took over 5 s there).
    pub fn stop(&mut self) {
        let within = if std::env::var_os("NRI_RESIZE_IN_VM").is_some() {
            Duration::from_secs(75)
        } else {
            Duration::from_secs(5)
        };
        let code = self.stop_with(Signal::SIGTERM, within);
        assert_eq!(
            code,
            Some(0),
            "nri-resize did not stop cleanly on SIGTERM within {within:?}; log:\n{}",
            self.log_tail(40)
        );
    }

    /// Starts the same plugin again (after `stop`/`stop_with`).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart of a running plugin");
        self.spawn();
    }

    /// Waits for the process to exit by itself; returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "nri-resize still running after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop_with(Signal::SIGTERM, Duration::from_secs(3));
        }
        // The test failed: what the plugin said is part of its output (also in the VM tier,
        // where the log's directory goes with the guest).
        if std::thread::panicking() {
            eprintln!(
                "harness: test panicked; nri-resize log {}, last 40 lines:\n{}",
                self.log_path.display(),
                self.log_tail(40)
            );
        }
    }
}

/// The plugin's resize record of container `id` (`/v1/resizes`); panics when there is none.
pub async fn resize_record(api: &ApiClient, id: &str) -> nri_resize::resize::ContainerResize {
    api.resizes()
        .await
        .expect("resizes API")
        .containers
        .get(id)
        .cloned()
        .expect("a resize record for the container")
}

/// Waits until the resize record of `id` leaves `InProgress`; returns it. Panics with the record
/// after `within` (a bound on the wait, not a speed check).
pub async fn settled(
    api: &ApiClient,
    id: &str,
    within: Duration,
) -> nri_resize::resize::ContainerResize {
    let deadline = Instant::now() + within;
    loop {
        let r = resize_record(api, id).await;
        if r.state != Some(nri_resize::policy::ResizeState::InProgress) {
            return r;
        }
        assert!(Instant::now() < deadline, "still in progress: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
