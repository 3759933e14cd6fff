//! The `nri-resize` binary on bad input: it must say what is wrong and exit non-zero.

use std::process::{Command, Stdio};

/// Runs the binary to its end, at most 30 s (a command that regressed into hanging, `run`
/// above all, fails the test instead of hanging it).
fn nri_resize(args: &[&str]) -> (i32, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_nri-resize"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run nri-resize");
    let out = output_within(child, std::time::Duration::from_secs(30));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn a_config_that_does_not_parse_stops_the_daemon_with_its_path_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "jurnal_size = 3\n").expect("write config");
    let api = dir.path().join("api.sock");
    let (code, text) = nri_resize(&[
        "run",
        "--config",
        cfg.to_str().expect("utf8"),
        "--nri-socket",
        "/nonexistent/nri.sock",
        "--api-socket",
        api.to_str().expect("utf8"),
    ]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("bad.toml") && text.contains("jurnal_size"),
        "error names the file and the key:\n{text}"
    );
}

#[test]
fn a_bad_plugin_index_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = dir.path().join("api.sock");
    let (code, text) = nri_resize(&[
        "run",
        "--plugin-idx",
        "7",
        "--nri-socket",
        "/nonexistent/nri.sock",
        "--api-socket",
        api.to_str().expect("utf8"),
    ]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("two digits"), "{text}");
}

#[test]
fn status_without_a_daemon_explains_itself() {
    let (code, text) = nri_resize(&["status", "--api-socket", "/nonexistent/api.sock"]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("cannot reach the nri-resize API") && text.contains("/nonexistent/api.sock"),
        "{text}"
    );
}

#[test]
fn an_error_is_printed_once() {
    let (code, text) = nri_resize(&["status", "--api-socket", "/nonexistent/api.sock"]);
    assert_ne!(code, 0, "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    assert_eq!(
        text.matches("No such file or directory").count(),
        1,
        "{text}"
    );
}

#[test]
fn status_watch_takes_a_duration() {
    let (code, text) = nri_resize(&["status", "--watch", "2", "--api-socket", "/nonexistent"]);
    assert_ne!(code, 0, "a bare number is no duration: {text}");
    assert!(text.contains("2s or 500ms"), "{text}");
}

#[test]
fn update_and_resize_warn_and_resolve_namespace_pod_container() {
    let d = Daemon::start();
    let api = d.api_socket().to_str().expect("utf8").to_string();
    let (code, text) = nri_resize(&[
        "update",
        "default/web/app",
        "--memory-limit",
        "512Mi",
        "--api-socket",
        &api,
    ]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("no container \"default/web/app\" on this node"),
        "{text}"
    );
    let (code, text) = nri_resize(&["update", "a/b", "--cpu-limit", "1.5", "--api-socket", &api]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("neither a container id nor namespace/pod/container"),
        "{text}"
    );
    let (code, text) = nri_resize(&[
        "update",
        "c1",
        "--memory-limit",
        "12Xi",
        "--api-socket",
        &api,
    ]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("12Xi"), "{text}");
    let (code, text) = nri_resize(&[
        "resize",
        "default/web",
        "app=cpu=1500m,memory=1.5Gi",
        "--api-socket",
        &api,
    ]);
    assert_ne!(code, 0, "no such pod: {text}");
    assert!(
        text.contains("behind the API server") && text.contains("--subresource resize"),
        "{text}"
    );
}

#[test]
fn update_without_anything_to_change_is_refused() {
    let (code, text) = nri_resize(&["update", "abc", "--api-socket", "/nonexistent/api.sock"]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("nothing to update"), "{text}");
}

/// `nri-resize config check <file>` on `text`: exit code and output.
fn config_check(text: &str) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, text).expect("write config");
    nri_resize(&["config", "check", cfg.to_str().expect("utf8")])
}

#[test]
fn config_check_accepts_what_the_daemon_accepts() {
    let (code, text) = config_check("journal_size = 64\n[resize]\nmode = \"Observe\"\n");
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("config.toml: ok"), "{text}");
}

#[test]
fn config_check_names_an_unknown_key_and_its_line() {
    let (code, text) = config_check("journal_size = 64\n\n[resize]\nmod = \"observe\"\n");
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("config.toml:4:1: key `resize.mod`") && text.contains("unknown field"),
        "{text}"
    );
    // Printed once.
    assert_eq!(text.matches("resize.mod").count(), 1, "{text}");
}

#[test]
fn config_check_names_a_bad_value_and_its_line() {
    let (code, text) = config_check("[resize]\nmode = \"maybe\"\n");
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("config.toml:2:1: key `resize.mode`") && text.contains("maybe"),
        "{text}"
    );
    let (code, text) = config_check("journal_size = 0\n");
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("config.toml:1:1: key `journal_size`") && text.contains("1..=1000000"),
        "{text}"
    );
}

#[test]
fn config_check_warns_with_the_line_and_passes() {
    let (code, text) = config_check("journal_size = 64\n[resize]\nreserved_memory = \"512m\"\n");
    assert_eq!(code, 0, "a warning does not fail the check: {text}");
    assert!(
        text.contains("config.toml:3:1: warning: key `resize.reserved_memory`")
            && text.contains("milli-bytes")
            && text.contains("config.toml: ok, with 1 warning"),
        "{text}"
    );
    let (code, text) = config_check("[resize]\nreserved_memory = \"1Ei\"\n");
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("config.toml:2:1: warning:"), "{text}");
}

#[test]
fn config_default_is_what_config_check_accepts() {
    let (code, text) = nri_resize(&["config", "default"]);
    assert_eq!(code, 0, "{text}");
    for section in ["[resize]", "[memory_decrease]", "[metrics]", "[trim]"] {
        assert!(text.contains(section), "{section}:\n{text}");
    }
    let (code, checked) = config_check(&text);
    assert_eq!(code, 0, "{checked}");
    assert!(
        checked.contains("config.toml: ok") && !checked.contains("warning"),
        "{checked}"
    );
}

#[test]
fn config_check_reads_the_charts_values_file() {
    let values = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/helm/nri-resize/values.yaml"
    );
    let (code, text) = nri_resize(&["config", "check", "--values", values]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("values.yaml: ok"), "{text}");
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("values.yaml");
    std::fs::write(
        &bad,
        "mode: Enforce\nconfig:\n  resize:\n    reserved_memory: 1.5Gx\n",
    )
    .expect("write values");
    let (code, text) = nri_resize(&["config", "check", "--values", bad.to_str().expect("utf8")]);
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("values.yaml:4:5: key `config.resize.reserved_memory`"),
        "{text}"
    );
    std::fs::write(&bad, "config:\n  resize:\n    reserved_memory: 512m\n").expect("write");
    let (code, text) = nri_resize(&["config", "check", "--values", bad.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("values.yaml:3:5: warning: key `config.resize.reserved_memory`"),
        "{text}"
    );
}

#[test]
fn version_names_the_commit() {
    let (code, text) = nri_resize(&["--version"]);
    assert_eq!(code, 0, "{text}");
    let git = Command::new("git")
        .args([
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ])
        .output();
    match git {
        Ok(out) if out.status.success() => {
            let commit = String::from_utf8_lossy(&out.stdout).trim().to_string();
            assert_eq!(
                text.trim(),
                format!("nri-resize {} (commit {commit})", env!("CARGO_PKG_VERSION")),
                "built from this checkout"
            );
        }
        _ => assert!(text.contains("(commit "), "{text}"),
    }
}

/// `nri-resize run` with everything under `dir` (its NRI socket named `nri_socket`, an empty
/// cgroup root, metrics on an ephemeral port, no eBPF).
fn daemon_command(dir: &std::path::Path, nri_socket: &str) -> Command {
    let p = |name: &str| dir.join(name).to_str().expect("utf8").to_string();
    std::fs::create_dir_all(dir.join("cgroup")).expect("cgroup dir");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nri-resize"));
    cmd.args([
        "run",
        "--nri-socket",
        &p(nri_socket),
        "--api-socket",
        &p("api/api.sock"),
        "--state-dir",
        &p("state"),
        "--cgroup-root",
        &p("cgroup"),
        "--metrics-addr",
        "127.0.0.1:0",
        "--no-ebpf",
    ]);
    cmd
}

/// A daemon with no runtime to talk to: it keeps retrying, and its status API and metrics
/// server answer meanwhile. Stopped (SIGTERM, by pid) when dropped.
struct Daemon {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let child = daemon_command(dir.path(), "no-runtime.sock")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nri-resize run");
        let d = Daemon { child, dir };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !d.api_socket().exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the daemon's API socket never appeared"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        d
    }

    fn api_socket(&self) -> std::path::PathBuf {
        self.dir.path().join("api/api.sock")
    }

    fn metrics_addr(&self) -> String {
        let (code, text) = nri_resize(&[
            "status",
            "--json",
            "--api-socket",
            self.api_socket().to_str().expect("utf8"),
        ]);
        assert_eq!(code, 0, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("status --json is JSON");
        v["metrics_addr"]
            .as_str()
            .unwrap_or_else(|| panic!("no metrics_addr in {text}"))
            .to_string()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) {
            if std::time::Instant::now() > deadline {
                eprintln!("the daemon ignored SIGTERM for 10 s; killing it");
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// The child's output once it exits; killed (by pid) and the test failed if it takes longer
/// than `within`.
fn output_within(child: std::process::Child, within: std::time::Duration) -> std::process::Output {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    if let Ok(out) = rx.recv_timeout(within) {
        out.expect("wait")
    } else {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        panic!("the child did not exit within {within:?}");
    }
}

/// A plain HTTP/1.0 GET over the API's unix socket: (status line, body).
fn unix_get(socket: &std::path::Path, path: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect to the API socket");
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let (head, body) = resp.split_once("\r\n\r\n").expect("http response");
    let status = head.split_once("\r\n").map_or(head, |(s, _)| s);
    (status.to_string(), body.to_string())
}

/// A plain HTTP/1.0 GET: (status line, headers, body).
fn http_get(addr: &str, path: &str, accept: Option<&str>) -> (String, String, String) {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the metrics address");
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    let accept = accept.map_or_else(String::new, |a| format!("Accept: {a}\r\n"));
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{accept}\r\n").expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let (head, body) = resp.split_once("\r\n\r\n").expect("http response");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_lowercase(), body.to_string())
}

/// The observer's thread runs at a lower priority (nice 10) than the threads that answer the
/// runtime (nice 0); so does trimming's (nice 19, `SCHED_BATCH`: `trim/worker.rs`).
#[test]
fn the_observer_thread_yields_to_the_runtime_answers() {
    let d = Daemon::start();
    let tasks = format!("/proc/{}/task", d.child.id());
    let nice_of = |tid: &str| -> Option<(String, i64)> {
        let comm = std::fs::read_to_string(format!("{tasks}/{tid}/comm")).ok()?;
        let stat = std::fs::read_to_string(format!("{tasks}/{tid}/stat")).ok()?;
        // Fields after the `(comm)`: state is field 3, nice field 19.
        let after = stat.rsplit_once(") ")?.1;
        let nice = after.split(' ').nth(16)?.parse().ok()?;
        Some((comm.trim().to_string(), nice))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let threads: Vec<(String, i64)> = std::fs::read_dir(&tasks)
            .expect("task dir")
            .filter_map(|e| nice_of(e.ok()?.file_name().to_str()?))
            .collect();
        // `comm` is cut at 15 bytes: "nri-resize-obse".
        // (Just spawned, the thread may not have lowered itself yet: waited for.)
        let observer = threads
            .iter()
            .find(|(c, _)| c.starts_with("nri-resize-obs"));
        let trim = threads.iter().find(|(c, _)| c == "nri-resize-trim");
        if observer.is_some_and(|(_, nice)| *nice == 10) && trim.is_some_and(|(_, n)| *n == 19) {
            assert!(
                threads
                    .iter()
                    .filter(|(c, _)| !c.starts_with("nri-resize-obs") && c != "nri-resize-trim")
                    .all(|(_, n)| *n == 0),
                "every other thread at nice 0: {threads:?}"
            );
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no observer thread at nice 10 and trimming thread at nice 19 in {threads:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn metrics_health_and_readiness_on_the_metrics_address() {
    let d = Daemon::start();
    let addr = d.metrics_addr();
    let (status, _, body) = http_get(&addr, "/healthz", None);
    assert!(status.contains(" 200 "), "{status} {body}");
    let (status, _, body) = http_get(&addr, "/readyz", None);
    assert!(
        status.contains(" 503 "),
        "not registered with a runtime: {status}"
    );
    assert!(
        body.contains("not connected to the runtime"),
        "/readyz says why: {body}"
    );
    // The status API's `/readyz` gives the same answer as the metrics listener's.
    let (api_status, api_body) = unix_get(&d.api_socket(), "/readyz");
    assert_eq!(
        (api_status.split(' ').nth(1), api_body.as_str()),
        (status.split(' ').nth(1), body.as_str()),
        "API socket /readyz vs metrics /readyz"
    );
    let (status, headers, body) = http_get(&addr, "/metrics", None);
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        headers.contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    assert!(body.contains("nri_resize_nri_connected 0"), "{body}");
    assert!(!body.contains("# EOF"), "{body}");
    let (status, headers, body) = http_get(
        &addr,
        "/metrics",
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        headers.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{headers}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    assert!(
        body.contains("# TYPE nri_resize_nri_connected gauge"),
        "{body}"
    );
    openmetrics_parser::openmetrics::parse_openmetrics(&body)
        .unwrap_or_else(|e| panic!("served OpenMetrics does not parse: {e:?}\n{body}"));
}

#[test]
fn status_watch_redraws_until_interrupted() {
    let d = Daemon::start();
    let child = Command::new(env!("CARGO_BIN_EXE_nri-resize"))
        .args([
            "status",
            "--watch",
            "200ms",
            "--api-socket",
            d.api_socket().to_str().expect("utf8"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start status --watch");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let out = output_within(child, std::time::Duration::from_secs(10));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "Ctrl-C ends the watch cleanly: {:?}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let frames = stdout.matches("\x1b[2J\x1b[H").count();
    assert!(
        frames >= 3,
        "expected a redraw every 200ms for 1.5 s, got {frames}:\n{stdout}"
    );
    assert_eq!(
        stdout.matches("runtime: ? ? (DISCONNECTED)").count(),
        frames,
        "every frame is a full table:\n{stdout}"
    );
    assert!(stdout.contains("POD"), "{stdout}");
}

#[test]
fn status_watch_json_prints_one_document_per_line() {
    let d = Daemon::start();
    let child = Command::new(env!("CARGO_BIN_EXE_nri-resize"))
        .args([
            "status",
            "--json",
            "--watch",
            "200ms",
            "--api-socket",
            d.api_socket().to_str().expect("utf8"),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start status --watch --json");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let out = output_within(child, std::time::Duration::from_secs(10));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let docs: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(docs.len() >= 2, "{stdout}");
    assert!(docs.iter().all(|d| d["runtime"]["connected"] == false));
}

/// `--exit-on-disconnect` exits on any lost session, a broken one included: a "runtime" that
/// accepts the connection and then sends a frame no NRI runtime sends (a mux error) makes the
/// daemon exit with status 3, where it used to keep reconnecting.
#[test]
fn exit_on_disconnect_exits_on_a_broken_session_too() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let listener =
        std::os::unix::net::UnixListener::bind(dir.path().join("nri.sock")).expect("bind");
    let mut child = daemon_command(dir.path(), "nri.sock")
        .arg("--exit-on-disconnect")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nri-resize run");
    listener.set_nonblocking(true).expect("nonblocking");
    let connect_by = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut conn = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() > connect_by {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the daemon never connected to the NRI socket");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    conn.set_nonblocking(false).expect("blocking conn");
    // conn 1, 4 GiB announced: far above the mux's maximum payload.
    conn.write_all(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff])
        .expect("write a bad frame");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon kept running after its session broke");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert_eq!(status.code(), Some(3), "{status:?}\n{err}");
    assert!(err.contains("--exit-on-disconnect"), "{err}");
}

/// `nri-resize status --watch | head`: the reader goes away and the watch ends with status 0,
/// silently: no "Broken pipe", no panic.
#[test]
fn status_watch_into_head_ends_quietly() {
    let d = Daemon::start();
    let script = format!(
        "set -o pipefail; '{}' status --watch 100ms --api-socket '{}' | head -n 3 >/dev/null",
        env!("CARGO_BIN_EXE_nri-resize"),
        d.api_socket().display()
    );
    for json in [false, true] {
        let script = if json {
            script.replace("status --watch", "status --json --watch")
        } else {
            script.clone()
        };
        let child = Command::new("bash")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run bash");
        let out = output_within(child, std::time::Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "json={json}: the pipeline (pipefail) fails: {:?}\n{stderr}",
            out.status
        );
        assert!(stderr.is_empty(), "json={json}: said something: {stderr}");
    }
}

/// `nri-resize resizes` reads the records over the socket: a daemon with no runtime has none,
/// and says so; `--json` is the records as JSON.
#[test]
fn resizes_lists_the_records_over_the_socket() {
    let d = Daemon::start();
    let socket = d.api_socket();
    let socket = socket.to_str().expect("utf8");
    let (code, text) = nri_resize(&["resizes", "--api-socket", socket]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(text, "(no container resizes)\n");
    let (code, text) = nri_resize(&["resizes", "--json", "--api-socket", socket]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("resizes --json is JSON");
    assert_eq!(v["containers"], serde_json::json!([]), "{text}");
    assert_eq!(v["pods"], serde_json::json!([]), "{text}");
    let (code, text) = nri_resize(&["resizes", "--api-socket", "/nonexistent/api.sock"]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("cannot reach the nri-resize API"), "{text}");
}
