//! The node-local status API: HTTP/1.1 with JSON over a root-only unix socket
//! (`--api-socket`, default `/run/nri-resize/api.sock`). The CLI (`nri-resize status`,
//! `events`, `update`) is its client.
//!
//! | method | path | answer |
//! |---|---|---|
//! | GET | `/v1/status` | [`Status`]: runtime connection and every pod with its containers |
//! | GET | `/v1/events?since=N` | [`EventRecord`]s with `seq > N`, oldest first |
//! | POST | `/v1/containers/{id}/resources` | applies a [`LinuxResources`] through NRI `UpdateContainers` |
//! | GET | `/healthz` | 200 while the process serves |
//! | GET | `/readyz` | 200 once registered with the runtime and synchronized, else 503 |

mod client;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use client::{ApiClient, ClientError};

use crate::daemon::NodeState;
use crate::model::{EventRecord, LinuxResources, PodView};
use crate::nri::{ContainerUpdate, LinkError, LinkStatus, RuntimeLink};

/// `GET /v1/status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub runtime: LinkStatusView,
    pub pods: Vec<PodView>,
}

/// Runtime connection as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LinkStatusView {
    pub connected: bool,
    pub synchronized: bool,
    pub name: Option<String>,
    pub version: Option<String>,
    pub connects: u64,
    pub connected_since: Option<u64>,
}

impl From<LinkStatus> for LinkStatusView {
    fn from(s: LinkStatus) -> Self {
        LinkStatusView {
            connected: s.connected,
            synchronized: s.synchronized,
            name: s.runtime.as_ref().map(|r| r.name.clone()),
            version: s.runtime.as_ref().map(|r| r.version.clone()),
            connects: s.connects,
            connected_since: s.connected_since,
        }
    }
}

/// `POST /v1/containers/{id}/resources` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UpdateResult {
    /// Updates the runtime reported as failed (empty: applied).
    pub failed: Vec<ContainerUpdate>,
}

/// An API error body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

#[derive(Debug, Clone)]
struct Ctx {
    state: Arc<NodeState>,
    link: RuntimeLink,
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    #[serde(default)]
    since: u64,
}

type ApiResult<T> = Result<Json<T>, (StatusCode, Json<ApiError>)>;

fn api_err(code: StatusCode, msg: impl Into<String>) -> (StatusCode, Json<ApiError>) {
    (code, Json(ApiError { error: msg.into() }))
}

/// Builds the router (also used by tests without a socket).
fn router(state: Arc<NodeState>, link: RuntimeLink) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/events", get(events))
        .route("/v1/containers/{id}/resources", post(update_resources))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(Ctx { state, link })
}

async fn status(State(ctx): State<Ctx>) -> Json<Status> {
    Json(Status {
        runtime: ctx.link.status().into(),
        pods: ctx.state.read_model(crate::model::Model::snapshot),
    })
}

async fn events(State(ctx): State<Ctx>, Query(q): Query<EventsQuery>) -> Json<Vec<EventRecord>> {
    Json(ctx.state.journal(|j| j.since(q.since)))
}

async fn readyz(State(ctx): State<Ctx>) -> (StatusCode, &'static str) {
    let s = ctx.link.status();
    if s.connected && s.synchronized {
        (StatusCode::OK, "ready")
    } else if s.connected {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "registered, not yet synchronized",
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not connected to the runtime",
        )
    }
}

async fn update_resources(
    State(ctx): State<Ctx>,
    UrlPath(id): UrlPath<String>,
    Json(resources): Json<LinuxResources>,
) -> ApiResult<UpdateResult> {
    if ctx.state.read_model(|m| m.container(&id).is_none()) {
        return Err(api_err(
            StatusCode::NOT_FOUND,
            format!("no container {id:?} known to the plugin"),
        ));
    }
    let update = ContainerUpdate {
        container_id: id.clone(),
        resources: resources.clone(),
        ignore_failure: false,
    };
    match ctx
        .link
        .update_containers(std::slice::from_ref(&update), &[])
        .await
    {
        Ok(failed) => {
            if failed.is_empty() {
                ctx.state
                    .write_model(|m| m.apply_resources(&id, &resources));
                info!(container = %id, "plugin-initiated update applied");
            } else {
                warn!(container = %id, "runtime reported the update as failed");
            }
            Ok(Json(UpdateResult { failed }))
        }
        Err(e @ LinkError::NotConnected) => {
            Err(api_err(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
        }
        Err(e) => Err(api_err(StatusCode::BAD_GATEWAY, e.to_string())),
    }
}

/// Binds the socket (root-only, mode 0600, its directory 0700) and serves until `cancel`.
pub async fn serve(
    socket: &Path,
    state: Arc<NodeState>,
    link: RuntimeLink,
    cancel: CancellationToken,
) -> std::io::Result<JoinHandle<std::io::Result<()>>> {
    let with_path = |e: std::io::Error| {
        std::io::Error::new(
            e.kind(),
            format!("status API socket {}: {e}", socket.display()),
        )
    };
    if let Some(dir) = socket.parent() {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(with_path)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(with_path)?;
        }
    }
    if socket.exists() {
        // A live daemon answers on it; a stale file from a crash does not.
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(with_path(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another nri-resize is serving on it",
            )));
        }
        std::fs::remove_file(socket).map_err(with_path)?;
    }
    let listener = UnixListener::bind(socket).map_err(with_path)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(with_path)?;
    info!(socket = %socket.display(), "status API listening");
    let app = router(state, link);
    let path = socket.to_path_buf();
    Ok(tokio::spawn(async move {
        let r = axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
        let _ = std::fs::remove_file(&path);
        r
    }))
}
