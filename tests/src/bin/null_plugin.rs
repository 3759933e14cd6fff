//! A do-nothing NRI plugin on nri-resize's transport, subscribed to the same events as the
//! daemon: the CRI latency benchmark's second baseline, separating what containerd's NRI path and
//! our transport cost from what the daemon's own work costs.
//!
//! Usage: `null_plugin <nri-socket>`; runs until killed.

use std::sync::Arc;

use async_trait::async_trait;
use nri_resize::model::EventKind;
use nri_resize::nri::{run_session, EventSet, Handler, PluginIdentity, RuntimeLink};
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct Null;

#[async_trait]
impl Handler for Null {
    fn events(&self) -> EventSet {
        EventKind::ALL
            .into_iter()
            .filter(|e| *e != EventKind::ValidateContainerAdjustment)
            .collect()
    }
}

#[tokio::main]
async fn main() {
    let socket = std::env::args()
        .nth(1)
        .expect("usage: null_plugin <nri-socket>");
    let id = PluginIdentity {
        socket: socket.into(),
        name: "null".into(),
        idx: "50".into(),
    };
    let end = run_session(
        &id,
        Arc::new(Null),
        &RuntimeLink::default(),
        None,
        &CancellationToken::new(),
    )
    .await;
    eprintln!("null plugin session ended: {end:?}");
}
