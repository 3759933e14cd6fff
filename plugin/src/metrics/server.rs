//! `/metrics`, `/healthz`, `/readyz` over TCP (`--metrics-addr`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::{openmetrics, Metrics, MetricsError};
use crate::nri::RuntimeLink;
use crate::sync::ReadWriteLocked as _;

/// What `/readyz` checks: registered and synchronized with the runtime, and the observer loaded.
#[derive(Debug, Clone)]
pub struct Readiness {
    pub link: RuntimeLink,
    pub observer_loaded: Arc<AtomicBool>,
    /// The observer's fallbacks (`program: reason`), said in the body of a ready answer.
    pub observer_fallbacks: Arc<std::sync::RwLock<Vec<String>>>,
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

    /// The `/readyz` answer (both listeners give this one): 200 `ready`, naming the observer's
    /// fallbacks if any, or 503 with why not.
    pub fn answer(&self) -> (StatusCode, String) {
        match self.check() {
            Ok(()) => {
                let fallbacks = self.observer_fallbacks.read_locked().join("; ");
                if fallbacks.is_empty() {
                    (StatusCode::OK, "ready".into())
                } else {
                    // Ready: the fallbacks measure the same things, with less detail or later.
                    (
                        StatusCode::OK,
                        format!("ready (observer fallbacks: {fallbacks})"),
                    )
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

/// Binds `addr` (port 0: any free port, logged and returned) and serves until `cancel`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    readiness: Readiness,
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
    info!(addr = %bound, "metrics listening (/metrics, /healthz, /readyz)");
    let app = router(metrics, readiness);
    let task = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await
    });
    Ok(MetricsServer { addr: bound, task })
}
