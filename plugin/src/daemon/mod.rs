//! Wiring: configuration, the NRI session loop with reconnects, the status API, signals.
//!
//! When the runtime goes away (containerd restart, upgrade, the plugin dropped for a missed
//! deadline), the daemon reconnects with exponential backoff (100 ms doubling to 5 s) and the next
//! `Synchronize` rebuilds the model from scratch; the API keeps serving meanwhile and `/readyz`
//! reports 503 until the plugin is registered and synchronized again. `--exit-on-disconnect`
//! makes it exit with status 3 instead, for setups that prefer the DaemonSet to restart it.

mod handler;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use handler::{ModelHandler, NodeState};

use crate::api;
use crate::config::Config;
use crate::nri::{self, PluginIdentity, RuntimeLink, SessionEnd};

/// Exit status when the runtime connection is lost and `--exit-on-disconnect` is set.
pub const EXIT_DISCONNECTED: i32 = 3;

/// Everything `nri-resize run` needs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub identity: PluginIdentity,
    pub config_path: Option<PathBuf>,
    pub cgroup_root: PathBuf,
    pub api_socket: PathBuf,
    pub exit_on_disconnect: bool,
}

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Asked to stop (SIGTERM/SIGINT).
    Stopped,
    /// The runtime connection was lost and `--exit-on-disconnect` is set.
    Disconnected,
}

/// Exponential backoff for reconnecting.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            next: min,
            min,
            max,
        }
    }

    /// The delay to wait now; doubles the next one up to the maximum.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Runs the daemon until `cancel` fires (or the runtime goes away with `exit_on_disconnect`).
pub async fn run(opts: RunOptions, cancel: CancellationToken) -> anyhow::Result<Exit> {
    nri::validate_idx(&opts.identity.idx).map_err(anyhow::Error::msg)?;
    let file_config = match &opts.config_path {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    info!(
        socket = %opts.identity.socket.display(),
        name = %opts.identity.name,
        idx = %opts.identity.idx,
        cgroup_root = %opts.cgroup_root.display(),
        api_socket = %opts.api_socket.display(),
        "nri-resize starting"
    );
    let state = NodeState::new(file_config);
    let link = RuntimeLink::default();
    let api_server = api::serve(
        &opts.api_socket,
        state.clone(),
        link.clone(),
        cancel.clone(),
    )
    .await?;

    let handler = Arc::new(ModelHandler::new(state.clone()));
    let exit = session_loop(&opts, handler, &link, &cancel).await;
    cancel.cancel();
    if let Err(err) = api_server.await {
        warn!(%err, "status API task ended abnormally");
    }
    Ok(exit)
}

async fn session_loop(
    opts: &RunOptions,
    handler: Arc<ModelHandler>,
    link: &RuntimeLink,
    cancel: &CancellationToken,
) -> Exit {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut failures: u64 = 0;
    loop {
        let started = Instant::now();
        let outcome = nri::run_session(&opts.identity, handler.clone(), link, None, cancel).await;
        match &outcome {
            Ok(SessionEnd::Cancelled) => return Exit::Stopped,
            Ok(end) => warn!(
                ?end,
                connected_for_s = started.elapsed().as_secs(),
                "runtime connection ended"
            ),
            Err(err) => {
                failures += 1;
                // A missing socket while containerd restarts is expected: say it once, then quietly.
                if failures == 1 || failures.is_power_of_two() {
                    error!(%err, attempts = failures, "NRI session failed");
                }
            }
        }
        if outcome.is_ok() {
            failures = 0;
            if started.elapsed() > Duration::from_secs(10) {
                backoff.reset();
            }
            if opts.exit_on_disconnect {
                error!("exiting because the runtime connection was lost (--exit-on-disconnect)");
                return Exit::Disconnected;
            }
        }
        let delay = backoff.next_delay();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = cancel.cancelled() => return Exit::Stopped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let seq: Vec<u128> = (0..6).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(seq, [100, 200, 400, 800, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }
}
