//! `/metrics`, `/healthz`, `/readyz` over TCP (`--metrics-addr`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{openmetrics, Metrics, MetricsError};
use crate::nri::RuntimeLink;
use crate::observer::ReclaimWatch;
use crate::sync::ReadWriteLocked as _;

/// What `/readyz` checks: registered and synchronized with the runtime, and the observer loaded.
#[derive(Debug, Clone)]
pub struct Readiness {
    pub link: RuntimeLink,
    pub observer_loaded: Arc<AtomicBool>,
    /// The observer's fallbacks (`program: reason`), said in the body of a ready answer.
    pub observer_fallbacks: Arc<std::sync::RwLock<Vec<String>>>,
    /// The observer's eBPF map memory in bytes (0: no maps), said in the body of a ready answer:
    /// it counts against the daemon's memory limit and is not in its RSS.
    pub observer_map_bytes: Arc<AtomicU64>,
    /// The reclaim counter attached on demand, said with whether it is attached now.
    pub reclaim_watch: ReclaimWatch,
}

impl Readiness {
    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), &'static str> {
        let s = self.link.status();
        if !s.connected {
            Err("not connected to the runtime")
        } else if !s.synchronized {
            Err("registered, not yet synchronized")
        } else if !self.observer_loaded.load(Ordering::Acquire) {
            Err("observer not loaded")
        } else {
            Ok(())
        }
    }

    /// The `/readyz` answer (both listeners give this one): 200 `ready`, naming the eBPF maps'
    /// memory and the observer's fallbacks if any, or 503 with why not.
    pub fn answer(&self) -> (StatusCode, String) {
        match self.check() {
            Ok(()) => {
                let mut notes = Vec::new();
                let map_bytes = self.observer_map_bytes.load(Ordering::Acquire);
                if map_bytes > 0 {
                    notes.push(format!(
                        "eBPF maps {}",
                        crate::policy::bytes_text(map_bytes)
                    ));
                }
                let fallbacks = self.observer_fallbacks.read_locked().join("; ");
                if !fallbacks.is_empty() {
                    // Ready: the fallbacks measure the same things, with less detail or later.
                    notes.push(format!("observer fallbacks: {fallbacks}"));
                }
                if let Some(on_demand) = self.reclaim_watch.status() {
                    notes.push(on_demand.to_string());
                }
                if notes.is_empty() {
                    (StatusCode::OK, "ready".into())
                } else {
                    (StatusCode::OK, format!("ready ({})", notes.join("; ")))
                }
            }
            Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.into()),
        }
    }
}

#[derive(Debug, Clone)]
struct Ctx {
    metrics: Arc<Metrics>,
    readiness: Readiness,
}

/// The bound metrics listener and its task.
#[derive(Debug)]
pub struct MetricsServer {
    /// The address actually bound (port 0 resolved).
    pub addr: SocketAddr,
    pub task: JoinHandle<std::io::Result<()>>,
}

/// `OpenMetrics` when the scraper's `Accept` asks for it (Prometheus does by default), else the
/// classic text format.
async fn metrics(State(ctx): State<Ctx>, headers: HeaderMap) -> impl IntoResponse {
    ctx.metrics
        .set_nri_connected(ctx.readiness.link.status().connected);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if openmetrics::wants_openmetrics(accept) {
        return (
            StatusCode::OK,
            [(header::CONTENT_TYPE, openmetrics::CONTENT_TYPE)],
            ctx.metrics.encode_openmetrics(),
        );
    }
    match ctx.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
            text,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            e.to_string(),
        ),
    }
}

async fn readyz(State(ctx): State<Ctx>) -> (StatusCode, String) {
    ctx.readiness.answer()
}

fn router(metrics: Arc<Metrics>, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(self::metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(Ctx { metrics, readiness })
}

/// What one client may hold on the metrics listener, so that nothing that reaches the port
/// (idle or slow-header connections, a slowloris) starves `/metrics`, the probes or the rest of
/// the daemon (the NRI handlers share its runtime): connections beyond `max_connections` wait in
/// the kernel's accept queue until one closes; a connection that has not sent a whole request
/// head within `header_read_timeout` (also between keep-alive requests) is closed; none lives
/// longer than `max_connection_age`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub max_connection_age: Duration,
}

impl Default for Limits {
    /// 32 connections (Prometheus keeps one per scraper, kubelet's probes one each), request
    /// heads within 2 s (the probes' own timeout: a client that needs longer is not one of
    /// ours), 60 s at most a connection (a scraper reconnects; a stuck reader is cut).
    fn default() -> Self {
        Limits {
            max_connections: 32,
            header_read_timeout: Duration::from_secs(2),
            max_connection_age: Duration::from_secs(60),
        }
    }
}

/// Binds `addr` (port 0: any free port, logged and returned) and serves until `cancel`, with the
/// default [`Limits`].
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    cancel: CancellationToken,
) -> Result<MetricsServer, MetricsError> {
    serve_with(addr, metrics, readiness, Limits::default(), cancel).await
}

/// [`serve`] with explicit limits.
pub async fn serve_with(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    limits: Limits,
    cancel: CancellationToken,
) -> Result<MetricsServer, MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind {
            addr: addr.to_string(),
            source,
        })?;
    let bound = listener.local_addr().map_err(|source| MetricsError::Bind {
        addr: addr.to_string(),
        source,
    })?;
    info!(
        addr = %bound,
        max_connections = limits.max_connections,
        header_read_timeout_s = limits.header_read_timeout.as_secs_f64(),
        "metrics listening (/metrics, /healthz, /readyz)"
    );
    let app = router(metrics, readiness);
    let task = tokio::spawn(accept_loop(listener, app, limits, cancel));
    Ok(MetricsServer { addr: bound, task })
}

/// Accepts while a connection slot is free; each connection is served by its own task, owned
/// by the loop's `JoinSet` and shut down gracefully with `cancel`.
async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    let mut full_said = false;
    loop {
        // Reap finished connections as we go (the set holds only live ones).
        while connections.try_join_next().is_some() {}
        let slot = if let Ok(slot) = slots.clone().try_acquire_owned() {
            full_said = false;
            slot
        } else {
            if !full_said {
                warn!(
                    max_connections = limits.max_connections,
                    "metrics listener at its connection limit: new connections wait"
                );
                full_said = true;
            }
            tokio::select! {
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break, // never closed
                },
                () = cancel.cancelled() => break,
            }
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // EMFILE and the like: say it, give the system a moment, go on.
                    warn!(%err, "metrics listener: accept failed");
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                        () = cancel.cancelled() => break,
                    }
                }
            },
            () = cancel.cancelled() => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let cancel = cancel.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(err) = r {
                        debug!(%err, "metrics connection ended with an error");
                    }
                }
                () = tokio::time::sleep(limits.max_connection_age) => {
                    debug!("metrics connection closed at its maximum age");
                }
                () = cancel.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    // Bounded: an idle connection closes at once, a half-sent head within
                    // the header timeout.
                    let _ = tokio::time::timeout(limits.header_read_timeout, conn).await;
                }
            }
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;

    use super::*;
    use crate::nri::RuntimeLink;

    /// A client's read of the server's answer (or of the server closing): never hangs the test
    /// (the limits below are 100 times shorter).
    const CLIENT_PATIENCE: Duration = Duration::from_secs(30);

    fn readiness() -> Readiness {
        Readiness {
            link: RuntimeLink::default(),
            observer_loaded: Arc::new(AtomicBool::new(false)),
            observer_fallbacks: Arc::default(),
            observer_map_bytes: Arc::default(),
            reclaim_watch: ReclaimWatch::default(),
        }
    }

    /// Blocks until the server closes `s` (EOF or reset); `Err` with what it read otherwise.
    fn closed_by_server(mut s: TcpStream) -> Result<(), String> {
        s.set_read_timeout(Some(CLIENT_PATIENCE)).expect("timeout");
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(_) => {} // an error answer (408) before the close is fine
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(()),
                Err(e) => return Err(format!("still open: {e}")),
            }
        }
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(CLIENT_PATIENCE)).expect("timeout");
        write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").expect("send");
        let mut resp = String::new();
        s.read_to_string(&mut resp).expect("read the answer");
        resp
    }

    /// `max_connections` idle clients, one more idle and a slowloris (a request head dribbled a
    /// byte at a time) do not keep a scrape out: the idle and the slow are closed by the header
    /// timeout and the scrape is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_and_slow_clients_do_not_starve_the_scrape() {
        let limits = Limits {
            max_connections: 3,
            header_read_timeout: Duration::from_millis(300),
            max_connection_age: Duration::from_secs(600),
        };
        let cancel = CancellationToken::new();
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let server = serve_with(
            "127.0.0.1:0".parse().expect("addr"),
            metrics,
            readiness(),
            limits,
            cancel.clone(),
        )
        .await
        .expect("serve");
        let addr = server.addr;
        let outcome = tokio::task::spawn_blocking(move || {
            let idle: Vec<TcpStream> = (0..=limits.max_connections)
                .map(|_| TcpStream::connect(addr).expect("connect idle"))
                .collect();
            let slow = TcpStream::connect(addr).expect("connect slowloris");
            let dribbler = std::thread::spawn(move || {
                let mut slow = slow;
                let head = b"GET /metrics HTTP/1.1\r\nHost: test\r\nX-Slow: ";
                if slow.write_all(head).is_err() {
                    return true;
                }
                // One byte at a time until the server hangs up (or 30 s: then it never did).
                for _ in 0..3_000 {
                    std::thread::sleep(Duration::from_millis(10));
                    if slow.write_all(b"a").is_err() {
                        return true;
                    }
                }
                false
            });
            let scrape = get(addr, "/metrics");
            let idle_closed: Vec<Result<(), String>> =
                idle.into_iter().map(closed_by_server).collect();
            let slow_closed = dribbler.join().expect("dribbler");
            (scrape, idle_closed, slow_closed)
        })
        .await
        .expect("clients");
        let (scrape, idle_closed, slow_closed) = outcome;
        assert!(scrape.starts_with("HTTP/1.0 200"), "{scrape}");
        assert!(scrape.contains("nri_resize_nri_connected"), "{scrape}");
        assert!(
            idle_closed.iter().all(Result::is_ok),
            "idle connections closed by the server: {idle_closed:?}"
        );
        assert!(slow_closed, "the slowloris was cut off");
        cancel.cancel();
        server
            .task
            .await
            .expect("join")
            .expect("server ends cleanly");
    }

    /// With every slot taken by clients that send nothing, more connections wait (they are
    /// not refused) and are answered once the idle ones are cut.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_over_the_limit_wait_for_a_slot() {
        let limits = Limits {
            max_connections: 1,
            header_read_timeout: Duration::from_millis(200),
            max_connection_age: Duration::from_secs(600),
        };
        let cancel = CancellationToken::new();
        let server = serve_with(
            "127.0.0.1:0".parse().expect("addr"),
            Arc::new(Metrics::new().expect("metrics")),
            readiness(),
            limits,
            cancel.clone(),
        )
        .await
        .expect("serve");
        let addr = server.addr;
        let answers = tokio::task::spawn_blocking(move || {
            let _idle = TcpStream::connect(addr).expect("connect idle");
            let a = std::thread::spawn(move || get(addr, "/healthz"));
            let b = std::thread::spawn(move || get(addr, "/readyz"));
            (a.join().expect("a"), b.join().expect("b"))
        })
        .await
        .expect("clients");
        assert!(answers.0.starts_with("HTTP/1.0 200"), "{}", answers.0);
        assert!(answers.0.ends_with("ok"), "{}", answers.0);
        assert!(answers.1.starts_with("HTTP/1.0 503"), "{}", answers.1);
        cancel.cancel();
        server
            .task
            .await
            .expect("join")
            .expect("server ends cleanly");
    }
}
