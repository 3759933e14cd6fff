//! Wiring: configuration, the NRI session loop with reconnects, the status API, signals.
//!
//! When the runtime goes away (containerd restart, upgrade, the plugin dropped for a missed
//! deadline), the daemon reconnects with exponential backoff (100 ms doubling to 5 s) and the next
//! `Synchronize` rebuilds the model from scratch; the API keeps serving meanwhile and `/readyz`
//! reports 503 until the plugin is registered and synchronized again. `--exit-on-disconnect`
//! makes it exit with status 3 instead, for setups that prefer the `DaemonSet` to restart it.

mod bind_retry;
mod handler;
mod observe;
#[cfg(test)]
mod pod_level_tests;
mod reserve;
mod trim;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use handler::ModelHandler;
pub use observe::ObserverOptions;

use crate::api;
use crate::backoff::Backoff;
use crate::capacity;
use crate::cgroup::Cgroups;
use crate::config::Config;
use crate::metrics::{self, Readiness};
use crate::nri::{self, HandlerObserver, PluginIdentity, RuntimeLink, SessionEnd};
use crate::resize::checkpoint::CheckpointStore;
use crate::resize::node::NodeReader;
use crate::resize::Engine;
use crate::state::NodeState;
use crate::sync::{Locked as _, ReadWriteLocked as _};
use crate::trim::Trimmer;
use bind_retry::{retry_while_in_use, Gave, BIND_RETRY_FOR};

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
    /// The observer: eBPF programs or cgroup polling, read every `interval`. The cgroup
    /// layout in its settings is also where resize confirmation reads actual values.
    pub observer: ObserverOptions,
    /// Where to serve `/metrics`, `/healthz`, `/readyz` (port 0: any free port); `None`: off.
    pub metrics_addr: Option<SocketAddr>,
    /// Where in-flight resizes are checkpointed.
    pub state_dir: PathBuf,
}

/// Why the daemon stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Asked to stop (SIGTERM/SIGINT).
    Stopped,
    /// The runtime connection was lost and `--exit-on-disconnect` is set.
    Disconnected,
}

/// The node's cgroup I/O (in test builds, slowed on demand: `cgroup/fault.rs`).
fn node_cgroups(opts: &RunOptions) -> Cgroups {
    let cgroups = Cgroups::from_layout(&opts.observer.settings.cgroups);
    #[cfg(feature = "fault-injection")]
    let cgroups = crate::cgroup::fault::from_env(cgroups).unwrap_or_else(|e| {
        // A test build whose test asked for a fault it cannot have: stop loudly.
        error!(error = %e, "fault injection misconfigured");
        std::process::exit(2)
    });
    cgroups
}

/// Opens the checkpoint store; an unusable state directory is reported (log and status) and the
/// daemon serves on without checkpoints.
fn open_checkpoints(dir: &std::path::Path, state: &NodeState) -> Option<CheckpointStore> {
    let checkpoints = match CheckpointStore::open(dir) {
        Ok(store) => Some(store),
        Err(err) => {
            error!(%err, "resize checkpoints disabled: in-flight resizes will not survive a restart");
            state.state_dir_problem(format!(
                "unusable, checkpoints disabled (in-flight resizes will not survive a restart): {err}"
            ));
            None
        }
    };
    {
        let mut sd = state.state_dir.locked();
        sd.path = dir.display().to_string();
        sd.usable = checkpoints.is_some();
    }
    checkpoints
}

/// Runs the daemon until `cancel` fires (or the runtime goes away with `exit_on_disconnect`).
#[expect(
    clippy::too_many_lines,
    reason = "the daemon's wiring in start order, then its stop order: read top to bottom"
)]
pub async fn run(opts: RunOptions, cancel: CancellationToken) -> anyhow::Result<Exit> {
    nri::validate_idx(&opts.identity.idx)?;
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
    let cgroups = node_cgroups(&opts);
    // `[observer]` sizes the eBPF maps: read here, at start-up only.
    let mut observer_opts = opts.observer.clone();
    observer_opts.settings.maps = file_config.observer.map_limits();
    let state = NodeState::with_cgroups(file_config, Some(cgroups));
    let link = RuntimeLink::default();
    let metrics_server = match opts.metrics_addr {
        Some(addr) => match bind_metrics(addr, &state, &link, &cancel).await {
            Ok(server) => Some(server),
            Err(Gave::Up(err)) => return Err(err.into()),
            Err(Gave::Cancelled) => return Ok(Exit::Stopped),
        },
        None => None,
    };
    let checkpoints = open_checkpoints(&opts.state_dir, &state);
    // Working-set trimming: its own task, fed the containers the handler tracks; the engine's
    // decreases and the pod-level admission ask it what it found.
    // The observer's reclaim counter, attached while a reclaim of ours is in flight (the
    // trimmer's pauses and turns hold it); the observer binds its program once loaded.
    state.reclaim_watch.start(&cancel);
    let trimmer = Trimmer::start(state.clone(), &cancel);
    let trim_feed = trim::feed(state.clone(), trimmer.clone(), cancel.clone());
    let engine = Arc::new(
        Engine::new(
            state.clone(),
            link.clone(),
            state.cgroups.clone(),
            NodeReader::new("/"),
            checkpoints,
        )
        .with_trimmer(trimmer.clone()),
    );
    engine.publish_resize_states();
    let api_server = match retry_while_in_use(
        "status API",
        BIND_RETRY_FOR,
        &cancel,
        |e: &std::io::Error| e.kind() == std::io::ErrorKind::AddrInUse,
        || {
            api::serve(
                &opts.api_socket,
                state.clone(),
                link.clone(),
                Some(engine.clone()),
                Some(trimmer.clone()),
                cancel.clone(),
            )
        },
    )
    .await
    {
        Ok(task) => task,
        Err(Gave::Up(err)) => return Err(err.into()),
        Err(Gave::Cancelled) => {
            trimmer.shutdown().await;
            state.reclaim_watch.shutdown().await;
            stop_metrics(metrics_server).await;
            return Ok(Exit::Stopped);
        }
    };

    // The observer starts once, here, on its own thread; it stops when `stop_observer` drops.
    // It hands its cpuhp ring buffer to the capacity watcher, which starts with it.
    let (stop_observer, stop_rx) = std::sync::mpsc::channel::<()>();
    let (hotplug_tx, hotplug_rx) = tokio::sync::oneshot::channel();
    let observer_thread = observe::spawn(state.clone(), observer_opts, stop_rx, Some(hotplug_tx))?;
    // Before the first NRI session and the capacity watcher's first gauges.
    let reserve_task = reserve::start(&state, NodeReader::new("/"), &cancel).await;
    let capacity_task = spawn_capacity(&state, &engine, hotplug_rx, &cancel);

    let handler = Arc::new(
        ModelHandler::new(state.clone())
            .with_engine(engine.clone())
            .with_node(NodeReader::new("/")),
    );
    let handler_observer: Arc<dyn HandlerObserver> = state.metrics.clone();
    let exit = session_loop(
        &opts,
        handler.clone(),
        &link,
        Some(handler_observer),
        &cancel,
    )
    .await;
    cancel.cancel();
    handler.settle(Duration::from_secs(1)).await;
    engine.shutdown().await;
    trimmer.shutdown().await;
    state.reclaim_watch.shutdown().await;
    if let Err(err) = trim_feed.await {
        warn!(%err, "trimming feed task ended abnormally");
    }
    if let Some(task) = capacity_task {
        if let Err(err) = task.await {
            warn!(%err, "capacity watcher task ended abnormally");
        }
    }
    reserve::stop(reserve_task).await;
    drop(stop_observer);
    if let Err(err) = api_server.await {
        warn!(%err, "status API task ended abnormally");
    }
    stop_metrics(metrics_server).await;
    join_observer(observer_thread).await;
    Ok(exit)
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr`, waiting while a previous daemon still
/// holds the address (`bind_retry`); records the bound address for the status API.
async fn bind_metrics(
    addr: SocketAddr,
    state: &Arc<NodeState>,
    link: &RuntimeLink,
    cancel: &CancellationToken,
) -> Result<metrics::MetricsServer, Gave<metrics::MetricsError>> {
    let readiness = Readiness {
        link: link.clone(),
        observer_loaded: state.observer_loaded.clone(),
        observer_fallbacks: state.observer_fallbacks.clone(),
        observer_map_bytes: state.observer_map_bytes.clone(),
        reclaim_watch: state.reclaim_watch.clone(),
    };
    let server = retry_while_in_use(
        "metrics",
        BIND_RETRY_FOR,
        cancel,
        |e: &metrics::MetricsError| {
            matches!(e, metrics::MetricsError::Bind { source, .. }
                if source.kind() == std::io::ErrorKind::AddrInUse)
        },
        || {
            metrics::serve(
                addr,
                state.metrics.clone(),
                readiness.clone(),
                cancel.clone(),
            )
        },
    )
    .await?;
    *state.metrics_addr.write_locked() = Some(server.addr);
    Ok(server)
}

/// Waits for the metrics server's task (it stops with the daemon's token).
async fn stop_metrics(server: Option<metrics::MetricsServer>) {
    if let Some(server) = server {
        match server.task.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => warn!(%err, "metrics server ended with an error"),
            Err(err) => warn!(%err, "metrics task ended abnormally"),
        }
    }
}

/// Waits for the observer thread, at most 3 s. It stops at its next tick; while it is still
/// loading its eBPF programs (seconds on slow machines) the exit does not wait for it: the
/// process ends and the kernel drops them. (A plain thread joins it: the runtime's shutdown
/// waits for its blocking pool, not for this.)
async fn join_observer(observer_thread: std::thread::JoinHandle<()>) {
    let (joined_tx, joined_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = joined_tx.send(observer_thread.join().is_ok());
    });
    match tokio::time::timeout(Duration::from_secs(3), joined_rx).await {
        Ok(Ok(true)) => {}
        Ok(_) => warn!("observer thread ended abnormally"),
        Err(_) => warn!("observer still starting after 3 s; exiting without waiting for it"),
    }
}

/// Starts the capacity watcher (`[capacity] enabled`) once the observer handed over its cpuhp
/// ring buffer (or said it has none); it stops with `cancel`.
fn spawn_capacity(
    state: &Arc<NodeState>,
    engine: &Arc<Engine>,
    hotplug: tokio::sync::oneshot::Receiver<Option<crate::observer::HotplugRing>>,
    cancel: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let cfg = state.file_config.capacity.clone();
    if !cfg.enabled {
        info!("capacity watcher disabled ([capacity] enabled = false)");
        return None;
    }
    let watcher = match capacity::Watcher::new(state.clone(), capacity::SysReader::new("/")) {
        Ok(w) => w,
        Err(err) => {
            error!(%err, "capacity watcher cannot start; admission still reads the node per resize");
            return None;
        }
    };
    let (engine, cancel) = (engine.clone(), cancel.clone());
    Some(tokio::spawn(async move {
        let ring = tokio::select! {
            r = hotplug => r.ok().flatten(),
            () = cancel.cancelled() => return,
        };
        capacity::run(
            watcher,
            ring,
            Some(engine as Arc<dyn capacity::OnCapacityChange>),
            capacity::WatcherOptions::host(cfg.resync_interval),
            cancel,
        )
        .await;
    }))
}

async fn session_loop(
    opts: &RunOptions,
    handler: Arc<ModelHandler>,
    link: &RuntimeLink,
    observer: Option<Arc<dyn HandlerObserver>>,
    cancel: &CancellationToken,
) -> Exit {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut failures: u64 = 0;
    loop {
        let started = Instant::now();
        let outcome = nri::run_session(
            &opts.identity,
            handler.clone(),
            link,
            observer.clone(),
            cancel,
        )
        .await;
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
        }
        // Any session that was connected and ended (closed, shut down, or broken by a mux,
        // protocol or registration error); not connecting at all is retried.
        let lost = !matches!(outcome, Err(nri::TransportError::Connect { .. }));
        if lost && opts.exit_on_disconnect {
            error!("exiting because the runtime connection was lost (--exit-on-disconnect)");
            return Exit::Disconnected;
        }
        let delay = backoff.next_delay();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = cancel.cancelled() => return Exit::Stopped,
        }
    }
}
