//! Small helpers shared by the harness modules.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Where `setup-host.sh` keeps downloads and where the harness caches images
/// (`$NRI_RESIZE_CACHE`, default `/var/cache/nri-resize`).
pub(crate) fn cache_dir() -> PathBuf {
    std::env::var_os("NRI_RESIZE_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/nri-resize"), PathBuf::from)
}

/// A number unique within this process, for instance names.
pub(crate) fn next_instance() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

const INSTALL_HINT: &str = "`cargo xtask test` installs it (xtask/scripts/setup-host.sh)";

/// Panics unless the process runs as root.
pub(crate) fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "nri-resize-tests: the real-runtime tests must run as root (they start containerd, \
             mount overlays and create cgroups); run them through `cargo xtask test` as root"
    );
}

/// Panics unless `path` is an executable file.
pub(crate) fn require_binary(path: &Path, what: &str) {
    let ok = std::fs::metadata(path).is_ok_and(|m| {
        m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
    });
    assert!(
        ok,
        "nri-resize-tests: {what} is missing: {} not found; {INSTALL_HINT}",
        path.display()
    );
}

/// Panics unless `name` is found in `PATH`.
pub(crate) fn require_in_path(name: &str, what: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("nri-resize-tests: {what} is missing: `{name}` not found in PATH; {INSTALL_HINT}");
}

/// Runs `cmd` to its end with its output captured, at most `within`. A child still running then
/// is killed and the run is an error of kind `TimedOut` naming `what`, so a hung tool (`ctr`
/// stuck on a dead socket) fails the test instead of hanging it.
pub(crate) fn output_within(
    cmd: &mut std::process::Command,
    within: Duration,
    what: &str,
) -> std::io::Result<std::process::Output> {
    use std::process::Stdio;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    if let Ok(out) = rx.recv_timeout(within) {
        out
    } else {
        // The waiting thread owns the child and reaps it once it is dead.
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{what} did not exit within {within:?}: killed"),
        ))
    }
}

/// Last `n` lines of a text file (empty when unreadable).
pub fn tail_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `f` every 20 ms until it returns `true` or `timeout` elapses; returns the last result.
pub(crate) fn poll_blocking(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `p`-th percentile (0.0..=1.0) of `samples` (sorted in place); for benchmark reports.
pub fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "index of a small slice"
    )]
    let i = ((samples.len() as f64 - 1.0) * p.clamp(0.0, 1.0)).round() as usize;
    samples[i]
}

/// `GET /metrics` (Prometheus text) of the plugin behind `api`, at the address its status reports.
pub async fn scrape_metrics(api: &nri_resize::api::ApiClient) -> String {
    use std::io::{Read as _, Write as _};
    let addr = api
        .status()
        .await
        .expect("status API")
        .metrics_addr
        .expect("the plugin serves metrics");
    let mut s = std::net::TcpStream::connect(&addr).expect("connect to /metrics");
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").expect("request /metrics");
    let mut response = String::new();
    s.read_to_string(&mut response).expect("read /metrics");
    // The body alone: the status line and headers are no part of the exposition.
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("/metrics: no end of headers in {response:?}"));
    assert!(
        head.starts_with("HTTP/1.") && head.lines().next().is_some_and(|l| l.contains(" 200 ")),
        "/metrics answered {head:?}"
    );
    body.to_owned()
}

/// One event's `nri_resize_nri_handler_duration_seconds` histogram as the plugin's `/metrics`
/// shows it: cumulative bucket counts by upper bound in ns (`+Inf`: `u64::MAX`), sum (s) and
/// count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HandlerHistogram {
    pub buckets: std::collections::BTreeMap<u64, f64>,
    pub sum: f64,
    pub count: f64,
}

impl HandlerHistogram {
    /// What was observed between `before` and `self` (two scrapes of one daemon).
    #[must_use]
    pub fn since(&self, before: &Self) -> Self {
        Self {
            buckets: self
                .buckets
                .iter()
                .map(|(le, n)| (*le, n - before.buckets.get(le).copied().unwrap_or(0.0)))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }
}

/// The handler-time histograms in a `/metrics` body (Prometheus text format, parsed by
/// `openmetrics-parser`), by `event` label; none when it has no such family (no event yet).
///
/// # Panics
/// When the body does not parse, with the parser's error and the body.
pub fn handler_histograms(body: &str) -> std::collections::BTreeMap<String, HandlerHistogram> {
    use openmetrics_parser::{prometheus::parse_prometheus, PrometheusValue};
    let mut out = std::collections::BTreeMap::new();
    let exposition = parse_prometheus(body).unwrap_or_else(|e| {
        panic!("/metrics does not parse as the Prometheus text format: {e:?}\n{body}")
    });
    let Some(family) = exposition
        .families
        .get("nri_resize_nri_handler_duration_seconds")
    else {
        return out;
    };
    for sample in family.iter_samples() {
        let PrometheusValue::Histogram(h) = &sample.value else {
            continue;
        };
        let Some(name) = sample
            .get_labelset()
            .ok()
            .and_then(|set| set.get_label_value("event").map(str::to_owned))
        else {
            continue;
        };
        let e: &mut HandlerHistogram = out.entry(name).or_default();
        for b in &h.buckets {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "bucket bounds in ns"
            )]
            let le = if b.upper_bound.is_finite() {
                (b.upper_bound * 1e9).round() as u64
            } else {
                u64::MAX
            };
            *e.buckets.entry(le).or_default() += b.count.as_f64();
        }
        e.sum += h.sum.map_or(0.0, |s| s.as_f64());
        #[expect(clippy::cast_precision_loss, reason = "a call count")]
        {
            e.count += h.count.unwrap_or(0) as f64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_past_its_time_is_killed_and_named() {
        let started = Instant::now();
        let err = output_within(
            std::process::Command::new("sleep").arg("30"),
            Duration::from_millis(200),
            "sleep 30",
        )
        .expect_err("sleep outlives 200 ms");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("sleep 30"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let out = output_within(
            std::process::Command::new("echo").arg("hi"),
            Duration::from_secs(10),
            "echo",
        )
        .expect("echo runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
    }

    #[test]
    fn handler_histograms_read_each_event_from_the_text_format() {
        let body = "\
# HELP nri_resize_nri_handler_duration_seconds Time spent in the plugin's NRI handler per event.
# TYPE nri_resize_nri_handler_duration_seconds histogram
nri_resize_nri_handler_duration_seconds_bucket{event=\"update_container\",le=\"0.001\"} 3
nri_resize_nri_handler_duration_seconds_bucket{event=\"update_container\",le=\"0.1\"} 5
nri_resize_nri_handler_duration_seconds_bucket{event=\"update_container\",le=\"+Inf\"} 6
nri_resize_nri_handler_duration_seconds_sum{event=\"update_container\"} 0.75
nri_resize_nri_handler_duration_seconds_count{event=\"update_container\"} 6
nri_resize_nri_handler_duration_seconds_bucket{event=\"create_container\",le=\"0.001\"} 1
nri_resize_nri_handler_duration_seconds_bucket{event=\"create_container\",le=\"0.1\"} 1
nri_resize_nri_handler_duration_seconds_bucket{event=\"create_container\",le=\"+Inf\"} 1
nri_resize_nri_handler_duration_seconds_sum{event=\"create_container\"} 0.0005
nri_resize_nri_handler_duration_seconds_count{event=\"create_container\"} 1
# HELP nri_resize_up Up.
# TYPE nri_resize_up gauge
nri_resize_up 1
";
        let h = handler_histograms(body);
        let update = &h["update_container"];
        assert_eq!(
            update
                .buckets
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect::<Vec<_>>(),
            vec![(1_000_000, 3.0), (100_000_000, 5.0), (u64::MAX, 6.0)]
        );
        assert!((update.sum - 0.75).abs() < 1e-12);
        assert!((update.count - 6.0).abs() < 1e-12);
        assert!((h["create_container"].count - 1.0).abs() < 1e-12);
        let none = HandlerHistogram::default();
        assert!(update
            .since(update)
            .buckets
            .values()
            .all(|n| n.abs() < 1e-12));
        assert_eq!(update.since(&none), *update);
        assert!(handler_histograms("# TYPE nri_resize_up gauge\nnri_resize_up 1\n").is_empty());
        assert!(
            std::panic::catch_unwind(|| handler_histograms("HTTP/1.1 200 OK\r\n\r\nx{ 1\n"))
                .is_err(),
            "an unparsable body is an error, not an empty histogram"
        );
    }
}
