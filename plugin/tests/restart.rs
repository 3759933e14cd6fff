//! A restart right after `kill -9`: the new daemon waits for the old one's listeners (metrics
//! address, status API socket) instead of exiting with "Address already in use", and serves
//! once the old process is gone. Asserted by order and outcome, never by time.

use std::io::{Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// How long any one wait below may take before the test calls the daemon stuck.
const PATIENCE: Duration = Duration::from_secs(90);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A daemon in its own process group (as a shell starts one: `kill -9 -<pgid>` reaches all of
/// it), logging to `log`.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// The same command every time: `dir` holds its sockets and state, `metrics` is fixed.
    fn start(dir: &Path, metrics: &str, log_name: &str) -> Daemon {
        let p = |name: &str| dir.join(name).to_str().expect("utf8").to_string();
        std::fs::create_dir_all(dir.join("cgroup")).expect("cgroup dir");
        let log = dir.join(log_name);
        let child = Command::new(env!("CARGO_BIN_EXE_nri-resize"))
            .args([
                "run",
                "--nri-socket",
                &p("no-runtime.sock"),
                "--api-socket",
                &p("api/api.sock"),
                "--state-dir",
                &p("state"),
                "--cgroup-root",
                &p("cgroup"),
                "--metrics-addr",
                metrics,
                "--no-ebpf",
            ])
            .env("NRI_RESIZE_LOG", "info")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start nri-resize run");
        Daemon { child, log }
    }

    fn pgid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics (with the log) if the daemon has exited.
    fn assert_running(&mut self, what: &str) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!("{what}: the daemon exited ({status}); log:\n{}", self.log());
        }
    }

    /// Waits until `cond` holds, the daemon staying up meanwhile.
    fn wait_for(&mut self, what: &str, mut cond: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !cond(self) {
            self.assert_running(what);
            assert!(
                Instant::now() < deadline,
                "{what}: not within {PATIENCE:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9` of its process group, then reaped: once this returns the process is gone.
    fn kill9_and_reap(&mut self) {
        killpg(self.pgid(), Signal::SIGKILL).expect("kill -9 the process group");
        self.child.wait().expect("reap");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = killpg(self.pgid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// `GET /metrics` over HTTP/1.0: the body when it answers 200.
fn scrape(addr: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.1 200").then(|| body.to_string()))
}

fn api_answers(socket: &Path) -> bool {
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    if write!(s, "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n").is_err() {
        return false;
    }
    let mut resp = String::new();
    s.read_to_string(&mut resp).is_ok() && resp.contains(" 200 ")
}

const WAITING: &str = "in use (a previous nri-resize still exiting?): retrying";

/// The old daemon still holds its listeners (stopped here, so that it stays in that state for
/// as long as the test needs: a daemon killed with SIGKILL closing its eBPF links is the same, briefly):
/// the new one says it waits, and serves `/metrics` and the API once the old one is gone.
#[test]
fn a_restart_waits_for_the_listeners_of_a_daemon_still_exiting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = format!("127.0.0.1:{}", free_port());
    let api = dir.path().join("api/api.sock");

    let mut old = Daemon::start(dir.path(), &metrics, "old.log");
    old.wait_for("the first daemon serves /metrics", |_| {
        scrape(&metrics).is_some()
    });
    old.wait_for("the first daemon serves its API", |_| api_answers(&api));
    killpg(old.pgid(), Signal::SIGSTOP).expect("stop the first daemon's group");

    let mut new = Daemon::start(dir.path(), &metrics, "new.log");
    new.wait_for(
        "the second daemon says it waits for the metrics address",
        |d| d.log().contains(WAITING),
    );
    let said = new.log();
    assert!(
        said.lines()
            .any(|l| l.contains(WAITING) && l.contains("metrics") && l.contains(&metrics)),
        "the wait names the metrics listener and its address:\n{said}"
    );

    old.kill9_and_reap();
    new.wait_for(
        "the second daemon serves /metrics after the first is gone",
        |_| scrape(&metrics).is_some_and(|body| body.contains("nri_resize_nri_connected")),
    );
    new.wait_for("the second daemon serves its API", |_| api_answers(&api));
    let log = new.log();
    assert!(
        log.contains("bound after waiting for it to be free"),
        "the log says the wait ended:\n{log}"
    );
    new.assert_running("after both listeners were bound");
}

/// The API socket too: with metrics off, the new daemon waits for the old one's live socket
/// (it answers, so it is not a stale file to remove) and takes it over once the old one is gone.
#[test]
fn a_restart_waits_for_the_api_socket_of_a_daemon_still_exiting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = dir.path().join("api/api.sock");
    let metrics_a = format!("127.0.0.1:{}", free_port());
    let mut old = Daemon::start(dir.path(), &metrics_a, "old.log");
    old.wait_for("the first daemon serves its API", |_| api_answers(&api));
    killpg(old.pgid(), Signal::SIGSTOP).expect("stop the first daemon's group");

    let metrics_b = format!("127.0.0.1:{}", free_port());
    let mut new = Daemon::start(dir.path(), &metrics_b, "new.log");
    new.wait_for("the second daemon says it waits for the API socket", |d| {
        d.log()
            .lines()
            .any(|l| l.contains(WAITING) && l.contains("status API"))
    });
    old.kill9_and_reap();
    new.wait_for(
        "the second daemon serves its API after the first is gone",
        |_| api_answers(&api),
    );
    new.assert_running("after the API socket was bound");
}

/// The scenario as reported: `kill -9` of the running daemon's process group, then the same
/// command at once. Whether or not the old process still held the address when the new one
/// bound, the new one must not exit: it serves `/metrics` once the old one is gone.
#[test]
fn the_same_command_right_after_kill_9_serves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut old = Daemon::start(dir.path(), &metrics, "old.log");
    old.wait_for("the first daemon serves /metrics", |_| {
        scrape(&metrics).is_some()
    });
    killpg(old.pgid(), Signal::SIGKILL).expect("kill -9 the process group");
    let mut new = Daemon::start(dir.path(), &metrics, "new.log");
    old.child.wait().expect("reap the first daemon");
    new.wait_for(
        "the second daemon serves /metrics after the first is gone",
        |_| scrape(&metrics).is_some(),
    );
    new.wait_for("the second daemon serves its API", |_| {
        api_answers(&dir.path().join("api/api.sock"))
    });
    new.assert_running("serving");
}
