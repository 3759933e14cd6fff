//! NRI transport: the multiplexed unix socket, the ttrpc `Plugin` server and `Runtime` client,
//! registration and the session lifecycle. Carries events to a [`Handler`]; decides nothing.

mod convert;
mod deadline;
mod decode;
mod frame;
mod handler;
pub mod mux;
mod mux_conn;
mod runtime;
mod service;
mod trunk_writer;
mod update_window;
mod version;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nri_resize_proto::api as pb;
use nri_resize_proto::api_ttrpc::{create_plugin, RuntimeClient};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server};

pub use deadline::Deadline;
pub use handler::{
    ContainerUpdate, CreateReply, EventSet, Eviction, Handler, Rejection, RuntimeInfo, UpdateReply,
    DEFAULT_REQUEST_TIMEOUT,
};
pub use mux::{Mux, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
pub use mux_conn::MuxConn;
pub use runtime::{LinkError, LinkStatus, RuntimeLink};
pub use service::HandlerObserver;

use service::{PluginService, SessionSignal};

/// How the plugin presents itself to the runtime.
#[derive(Debug, Clone)]
pub struct PluginIdentity {
    pub socket: PathBuf,
    pub name: String,
    /// Two-digit invocation index ("00".."99"); lower indices are called first.
    pub idx: String,
}

/// How long registration may take (containerd's default registration timeout is 5 s).
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);

/// A session ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The runtime closed the connection (restart, plugin dropped for missing a deadline...).
    RuntimeClosed,
    /// The runtime announced its shutdown and then closed the connection.
    RuntimeShutdown,
    /// Our `Synchronize` answer was late, so the runtime dropped the plugin (containerd 1.7
    /// without closing the connection): the session ended to register again.
    SynchronizedLate,
    /// We were asked to stop.
    Cancelled,
}

/// A session failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot connect to NRI socket {path}: {source}")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("registration as {name:?} (index {idx:?}) failed: {source}")]
    Register {
        name: String,
        idx: String,
        source: ttrpc::Error,
    },
    #[error("starting the ttrpc plugin server failed: {0}")]
    Server(ttrpc::Error),
    #[error("NRI multiplexer: {0}")]
    Mux(#[from] MuxError),
}

/// A plugin index the runtime would refuse.
#[derive(Debug, thiserror::Error)]
#[error("plugin index must be two digits (00-99), got {idx:?}")]
pub struct IdxError {
    pub idx: String,
}

/// Validates a plugin index the way the runtime does (two decimal digits).
pub fn validate_idx(idx: &str) -> Result<(), IdxError> {
    if idx.len() == 2 && idx.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(IdxError {
            idx: idx.to_string(),
        })
    }
}

/// A ttrpc listener that yields one connection and then stays open: ttrpc-rust's
/// `Server::shutdown` panics if its accept loop already ended, which a finite stream would cause.
pub(crate) fn one_shot_listener(conn: MuxConn) -> Listener {
    use futures::StreamExt as _;
    Listener::new(
        futures::stream::iter([Ok::<_, std::io::Error>(conn)]).chain(futures::stream::pending()),
    )
}

/// Connects to the runtime, registers, serves until the connection ends or `cancel` fires.
pub async fn run_session<H: Handler>(
    id: &PluginIdentity,
    handler: Arc<H>,
    link: &RuntimeLink,
    observer: Option<Arc<dyn HandlerObserver>>,
    cancel: &CancellationToken,
) -> Result<SessionEnd, TransportError> {
    let trunk =
        UnixStream::connect(&id.socket)
            .await
            .map_err(|source| TransportError::Connect {
                path: id.socket.clone(),
                source,
            })?;
    serve_trunk(trunk, id, handler, link, observer, cancel).await
}

/// [`run_session`] over an already connected trunk (also used by tests with an in-memory pipe).
pub async fn serve_trunk<H, T>(
    trunk: T,
    id: &PluginIdentity,
    handler: Arc<H>,
    link: &RuntimeLink,
    observer: Option<Arc<dyn HandlerObserver>>,
    cancel: &CancellationToken,
) -> Result<SessionEnd, TransportError>
where
    H: Handler,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let mut mux = Mux::start(trunk, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
    let plugin_conn = mux
        .take(PLUGIN_SERVICE_CONN)
        .expect("plugin connection is created by start");
    let runtime_conn = mux
        .take(RUNTIME_SERVICE_CONN)
        .expect("runtime connection is created by start");

    let (signal_tx, mut signals) = mpsc::unbounded_channel();
    let service = PluginService::new(handler, link.clone(), signal_tx, observer);
    let listener = one_shot_listener(plugin_conn);
    let mut server = Server::new()
        .add_listener(listener)
        .register_service(create_plugin(Arc::new(service)));
    server.start().await.map_err(TransportError::Server)?;

    let client = RuntimeClient::new(Client::new(Socket::new(runtime_conn)));
    let req = pb::RegisterPluginRequest {
        plugin_name: id.name.clone(),
        plugin_idx: id.idx.clone(),
        NRI_version: version::PLUGIN_NRI_VERSION.to_owned(),
        ..Default::default()
    };
    let timeout = i64::try_from(REGISTRATION_TIMEOUT.as_nanos()).unwrap_or(i64::MAX);
    let registered = tokio::select! {
        r = client.register_plugin(ttrpc::context::with_timeout(timeout), &req) => r,
        r = &mut mux.task => {
            let _ = server.shutdown().await;
            return match r {
                Ok(Ok(())) | Err(_) => Err(TransportError::Register { name: id.name.clone(), idx: id.idx.clone(), source: ttrpc::Error::Others("runtime closed the connection during registration".into()) }),
                Ok(Err(e)) => Err(e.into()),
            };
        }
    };
    if let Err(source) = registered {
        mux.task.abort();
        let _ = server.shutdown().await;
        return Err(TransportError::Register {
            name: id.name.clone(),
            idx: id.idx.clone(),
            source,
        });
    }
    info!(name = %id.name, idx = %id.idx, socket = %id.socket.display(), "registered with the runtime");
    link.set_connected(client);

    let mut shutdown_announced = false;
    let end = loop {
        tokio::select! {
            r = &mut mux.task => {
                break match r {
                    Ok(Ok(())) if shutdown_announced => Ok(SessionEnd::RuntimeShutdown),
                    Ok(Ok(())) | Err(_) => Ok(SessionEnd::RuntimeClosed),
                    Ok(Err(e)) => Err(TransportError::Mux(e)),
                };
            }
            Some(sig) = signals.recv() => {
                match sig {
                    SessionSignal::RuntimeShutdown => shutdown_announced = true,
                    SessionSignal::SynchronizedLate => {
                        mux.task.abort();
                        break Ok(SessionEnd::SynchronizedLate);
                    }
                }
            }
            () = cancel.cancelled() => {
                mux.task.abort();
                break Ok(SessionEnd::Cancelled);
            }
        }
    };
    link.set_disconnected();
    if let Err(err) = tokio::time::timeout(Duration::from_secs(2), server.shutdown()).await {
        warn!(%err, "ttrpc server did not shut down in time");
    }
    end
}

#[cfg(test)]
mod tests;

pub use decode::{decode_plugin_request, DecodeError, DECODED_METHODS};
