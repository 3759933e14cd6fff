//! Unit tests only: a runtime for the engine to talk to. The runtime end of an in-memory NRI
//! trunk (the same mux and ttrpc parts containerd uses) that records every `UpdateContainers`
//! and applies nothing, with the plugin's real session on the other end.

use std::sync::{Arc, Mutex};

use nri_resize_proto::api::{
    Empty, RegisterPluginRequest, UpdateContainersRequest, UpdateContainersResponse,
};
use tokio_util::sync::CancellationToken;

use crate::nri::{Mux, PluginIdentity, RuntimeLink, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::sync::Locked as _;

/// Records every `UpdateContainers`.
#[derive(Debug, Default)]
pub struct FakeRuntime {
    pub updates: Mutex<Vec<UpdateContainersRequest>>,
}

#[async_trait::async_trait]
impl nri_resize_proto::api_ttrpc::Runtime for FakeRuntime {
    async fn register_plugin(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        _req: RegisterPluginRequest,
    ) -> ttrpc::Result<Empty> {
        Ok(Empty::new())
    }
    async fn update_containers(
        &self,
        _ctx: &ttrpc::r#async::TtrpcContext,
        req: UpdateContainersRequest,
    ) -> ttrpc::Result<UpdateContainersResponse> {
        self.updates.locked().push(req);
        Ok(UpdateContainersResponse::default())
    }
}

/// The plugin side of the session: it only registers (the test drives the engine).
struct Registers;

impl crate::nri::Handler for Registers {
    fn events(&self) -> crate::nri::EventSet {
        crate::nri::EventSet::empty()
    }
}

/// A connected session: `link` talks to `runtime` until [`Connected::close`].
pub struct Connected {
    pub runtime: Arc<FakeRuntime>,
    cancel: CancellationToken,
    session: tokio::task::JoinHandle<()>,
    server: ttrpc::r#async::Server,
    _plugin_conn: crate::nri::MuxConn,
    _mux: Mux,
}

impl Connected {
    /// Connects `link` to a new fake runtime and waits until the plugin registered.
    pub async fn start(link: &RuntimeLink) -> Self {
        let (plugin_end, runtime_end) = tokio::io::duplex(1 << 20);
        let cancel = CancellationToken::new();
        let session = {
            let (l, c) = (link.clone(), cancel.clone());
            tokio::spawn(async move {
                let id = PluginIdentity {
                    socket: "/test".into(),
                    name: "nri-resize".into(),
                    idx: "42".into(),
                };
                let _ = crate::nri::serve_trunk(plugin_end, &id, Arc::new(Registers), &l, None, &c)
                    .await;
            })
        };
        let mut mux = Mux::start(runtime_end, &[PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN]);
        let plugin_conn = mux.take(PLUGIN_SERVICE_CONN).expect("conn 1");
        let runtime_conn = mux.take(RUNTIME_SERVICE_CONN).expect("conn 2");
        let runtime = Arc::new(FakeRuntime::default());
        let mut server = ttrpc::r#async::Server::new()
            .add_listener(crate::nri::one_shot_listener(runtime_conn))
            .register_service(nri_resize_proto::api_ttrpc::create_runtime(runtime.clone()));
        server.start().await.expect("runtime server");
        for _ in 0..400 {
            if link.status().connected {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(link.status().connected, "the plugin registered");
        Connected {
            runtime,
            cancel,
            session,
            server,
            _plugin_conn: plugin_conn,
            _mux: mux,
        }
    }

    pub async fn close(mut self) {
        self.cancel.cancel();
        let _ = self.session.await;
        let _ = self.server.shutdown().await;
    }
}
