//! The node capacity watcher (KEP-3953): notices within a second that the node's CPUs or memory
//! changed, without restarting anything, and reacts.
//!
//! Event sources, none of them polling:
//!
//! | source | what it says | latency measured from |
//! |---|---|---|
//! | `cpuhp/cpuhp_{enter,exit}` eBPF programs (loaded by the observer) through a ring buffer | every step of a CPU going on- or offline | the program's `bpf_ktime_get_ns` |
//! | kernel uevents (`NETLINK_KOBJECT_UEVENT`, group 1) | CPU and memory devices `online` / `offline` / `add` / `remove` | the uevent's arrival |
//! | a slow full re-read (`[capacity] resync_interval`, 60 s) | anything missed | — |
//!
//! Each event re-reads only the part of the node it concerns ([`snapshot::SysReader`], under an
//! injectable root), diffs it with the last reading, and on a difference: updates
//! `nri_resize_node_capacity_{cpu_cores,memory_bytes}` / `_allocatable_*` / `_changes_total` and the detection-latency
//! histogram, logs one structured event per change (old → new), publishes the `node` section of
//! `/v1/status`, has every Deferred and Infeasible resize re-evaluated (through
//! [`OnCapacityChange`], which the resize engine implements: the watcher does not know the
//! engine) and reports containers pinned (cpuset) to CPUs that went offline. Without the eBPF
//! program the watcher says so once and follows CPUs through their uevents and the resync.
//!
//! The cpuhp steps of one hotplug operation arrive before the kernel's online mask is final:
//! after a burst whose re-read showed nothing yet, the watcher re-reads once more when the burst
//! has been quiet for `settle` (50 ms), a one-shot timer armed only while events flow.

pub mod metrics;
pub mod snapshot;
pub mod uevent;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use metrics::CapacityMetrics;
pub use snapshot::{NodeSnapshot, Scope, SysReader};

use crate::clock::now_ms;
use crate::metrics::MetricsError;
use crate::observer::{CpuHotplugEvent, HotplugRing};
use crate::policy::CpuSet;
use crate::policy::{bytes_quantity, cpu_text};
use crate::state::{
    CapacityChange, ChangeKind, LastChange, NodeState, NodeStatus, PinnedContainer, Reevaluation,
};
use crate::sync::ReadWriteLocked as _;

/// What the watcher asks for when the node's capacity changed: re-evaluate the resizes waiting
/// for capacity (Deferred, Infeasible) against the node as it is now. The resize engine
/// implements it; `cause` names the change, for its log and records.
#[async_trait::async_trait]
pub trait OnCapacityChange: Send + Sync {
    /// Owned (`Arc`): the engine runs its cgroup I/O on blocking threads, which outlive a call
    /// that the watcher's timeout gives up on.
    async fn capacity_changed(self: Arc<Self>, cause: &str) -> Vec<Reevaluation>;
}

/// Why the watcher could not start.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("first reading of the node: {0}")]
    Read(#[from] snapshot::ReadError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
}

/// What made the watcher re-read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Start,
    Cpuhp,
    Uevent,
    Resync,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Cpuhp => "cpuhp",
            Self::Uevent => "uevent",
            Self::Resync => "resync",
        }
    }
}

/// One reason to re-read part of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trigger {
    pub source: Source,
    pub scope: Scope,
    /// `CLOCK_MONOTONIC` nanoseconds of the kernel event (the cpuhp program's timestamp, or the
    /// uevent's arrival); the detection latency is measured from it.
    pub event_ns: Option<u64>,
}

impl Trigger {
    /// Folds `other` into `self`: the wider scope, the earliest event.
    fn merge(&mut self, other: &Trigger) {
        if self.scope != other.scope {
            self.scope = Scope::All;
        }
        self.event_ns = match (self.event_ns, other.event_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if self.source == Source::Resync {
            self.source = other.source;
        }
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock of `bpf_ktime_get_ns`).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// Containers (of `containers`, with `(namespace, pod)` looked up by `pod_of`) whose cpuset
/// names a CPU outside `online`.
pub fn pinned_to_offline<'a>(
    containers: impl IntoIterator<Item = &'a crate::model::Container>,
    pod_of: impl Fn(&str) -> (String, String),
    online: &CpuSet,
) -> Vec<PinnedContainer> {
    let mut out: Vec<PinnedContainer> = containers
        .into_iter()
        .filter(|c| !matches!(c.state, crate::model::ContainerState::Stopped))
        .filter_map(|c| {
            let cpus = c.resources.as_ref()?.cpu.as_ref()?.cpus.as_str();
            let set = CpuSet::parse(cpus).ok().filter(|s| !s.is_empty())?;
            let offline = set.difference(online);
            if offline.is_empty() {
                return None;
            }
            let (namespace, pod) = pod_of(&c.pod_id);
            Some(PinnedContainer {
                container_id: c.id.clone(),
                namespace,
                pod,
                container: c.name.clone(),
                cpuset: set.to_string(),
                offline_cpus: offline.to_string(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.container_id.cmp(&b.container_id));
    out
}

/// The watcher's state: the last reading, its metrics and status. Synchronous and driven by
/// [`Watcher::observe`], so tests run it against a fixture root without sockets or eBPF.
#[derive(Debug)]
pub struct Watcher {
    reader: SysReader,
    state: Arc<NodeState>,
    metrics: CapacityMetrics,
    snapshot: NodeSnapshot,
    status: NodeStatus,
}

impl Watcher {
    /// Registers the metrics in `state`'s registry and takes the first reading.
    pub fn new(state: Arc<NodeState>, reader: SysReader) -> Result<Self, CapacityError> {
        let metrics = CapacityMetrics::register(state.metrics.registry())?;
        let snapshot = reader.read()?;
        let mut w = Watcher {
            reader,
            state,
            metrics,
            snapshot,
            status: NodeStatus::default(),
        };
        w.update_gauges();
        w.check_pinned();
        w.publish();
        info!(
            online_cpus = %w.snapshot.online_cpus,
            present_cpus = %w.snapshot.present_cpus,
            memory_bytes = w.snapshot.memory_bytes,
            memory_blocks = w.snapshot.memory_blocks_online,
            "node capacity"
        );
        Ok(w)
    }

    pub fn snapshot(&self) -> &NodeSnapshot {
        &self.snapshot
    }

    pub fn metrics(&self) -> &CapacityMetrics {
        &self.metrics
    }

    /// The status as published.
    pub fn status(&self) -> &NodeStatus {
        &self.status
    }

    /// Records the event sources in use (status only).
    pub fn set_sources(&mut self, sources: &[&str], resync: Duration) {
        self.status.sources = sources.iter().map(|s| (*s).to_owned()).collect();
        self.status.resync_interval_ms = u64::try_from(resync.as_millis()).unwrap_or(u64::MAX);
        self.publish();
    }

    fn reserves(&self) -> (u64, u64) {
        let r = self.state.node_reserve();
        (r.cpu_millis, r.memory_bytes)
    }

    fn update_gauges(&mut self) {
        let (cpu, mem) = self.reserves();
        self.metrics.set_capacity(&self.snapshot, cpu, mem);
        let s = &self.snapshot;
        let st = &mut self.status;
        st.online_cpus = s.online_cpus.to_string();
        st.online_cpu_count = s.online_cpus.count();
        st.present_cpus = s.present_cpus.to_string();
        st.present_cpu_count = s.present_cpus.count();
        st.memory_bytes = s.memory_bytes;
        st.memory_block_bytes = s.memory_block_bytes;
        st.memory_blocks_online = s.memory_blocks_online;
        st.memory_blocks_present = s.memory_blocks_present;
        st.allocatable_cpu_millis = (u64::from(s.online_cpus.count()) * 1000).saturating_sub(cpu);
        st.allocatable_memory_bytes = s.memory_bytes.saturating_sub(mem);
    }

    fn publish(&mut self) {
        self.status.updated_ms = now_ms();
        *self.state.capacity.write_locked() = Some(self.status.clone());
    }

    /// Re-reads what `trigger` concerns; on a difference updates metrics, logs each change and
    /// publishes the status. Returns the changes (empty: nothing changed or the read failed).
    pub fn observe(&mut self, trigger: &Trigger) -> Vec<CapacityChange> {
        self.metrics.event(trigger.source.as_str());
        let mut next = self.snapshot.clone();
        if let Err(e) = self.reader.refresh(&mut next, trigger.scope) {
            if self.status.read_error.is_none() {
                warn!(error = %e, source = trigger.source.as_str(), "node capacity unreadable; keeping the last reading");
            }
            self.status.read_error = Some(e.to_string());
            self.publish();
            return Vec::new();
        }
        self.status.read_error = None;
        let changes = snapshot::diff(&self.snapshot, &next);
        if changes.is_empty() {
            if trigger.source == Source::Resync {
                // Reserves may have changed with the configuration; containers come and go.
                self.update_gauges();
                self.check_pinned();
                self.publish();
            }
            return changes;
        }
        self.snapshot = next;
        self.update_gauges();
        self.metrics.count_changes(&changes);
        let latency_s = trigger.event_ns.map(|at| {
            #[expect(clippy::cast_precision_loss, reason = "nanoseconds to seconds")]
            let s = monotonic_ns().saturating_sub(at) as f64 / 1e9;
            s
        });
        if let Some(s) = latency_s {
            if changes.iter().any(|c| c.kind.is_capacity()) {
                self.metrics.detected(trigger.source.as_str(), s);
            }
        }
        for c in &changes {
            let (old, new) = c
                .cpus
                .clone()
                .unwrap_or_else(|| (c.old.to_string(), c.new.to_string()));
            info!(
                resource = c.kind.resource().as_str(),
                kind = ?c.kind,
                old = %old,
                new = %new,
                old_count = c.old,
                new_count = c.new,
                direction = c.direction(),
                source = trigger.source.as_str(),
                detection_latency_ms = latency_s.map(|s| s * 1000.0),
                "node capacity changed"
            );
        }
        self.status.changes += changes.iter().filter(|c| c.kind.is_capacity()).count() as u64;
        self.status.last_change = Some(LastChange {
            at_ms: now_ms(),
            source: trigger.source.as_str().to_owned(),
            detection_latency_ms: latency_s.map(|s| s * 1000.0),
            changes: changes.clone(),
        });
        if changes.iter().any(|c| c.kind == ChangeKind::OnlineCpus) {
            self.check_pinned();
        }
        self.publish();
        changes
    }

    /// Finds containers pinned to offline CPUs: status, metric, and a warning for each newly
    /// found one.
    pub fn check_pinned(&mut self) {
        let online = self.snapshot.online_cpus.clone();
        let pinned = self.state.read_model(|m| {
            pinned_to_offline(
                m.containers(),
                |pod_id| {
                    m.pod(pod_id)
                        .map(|p| (p.namespace.clone(), p.name.clone()))
                        .unwrap_or_default()
                },
                &online,
            )
        });
        for p in &pinned {
            let known = self
                .status
                .pinned_to_offline
                .iter()
                .any(|o| o.container_id == p.container_id && o.offline_cpus == p.offline_cpus);
            if !known {
                warn!(
                    namespace = %p.namespace,
                    pod = %p.pod,
                    container = %p.container,
                    cpuset = %p.cpuset,
                    offline_cpus = %p.offline_cpus,
                    "container pinned to CPUs that are offline"
                );
            }
        }
        self.metrics.set_pinned_offline(pinned.len());
        self.status.pinned_to_offline = pinned;
    }

    /// Records what a re-evaluation decided (status and metrics).
    pub fn reevaluated(&mut self, outcomes: Vec<Reevaluation>) {
        for o in &outcomes {
            self.metrics.reevaluated(o.outcome.as_str());
        }
        self.status.last_reevaluation = outcomes;
        self.publish();
    }
}

/// The `node:` header line of `nri-resize status`, in Kubernetes quantities as `kubectl describe
/// node` shows capacity and allocatable (`3500m`, `24683452Ki`: exact).
pub fn node_line(n: &NodeStatus, now_ms: u64) -> String {
    let mut line = format!(
        "node: cpu {} online ({}) / {} present, allocatable {}; memory {}, allocatable {}",
        n.online_cpu_count,
        if n.online_cpus.is_empty() {
            "-"
        } else {
            &n.online_cpus
        },
        n.present_cpu_count,
        cpu_text(n.allocatable_cpu_millis),
        bytes_quantity(n.memory_bytes),
        bytes_quantity(n.allocatable_memory_bytes),
    );
    match &n.last_change {
        Some(c) => {
            let what: Vec<String> = c.changes.iter().map(ToString::to_string).collect();
            let _ = write!(
                line,
                "; last change {} s ago: {} ({}{})",
                now_ms.saturating_sub(c.at_ms) / 1000,
                what.join(", "),
                c.source,
                c.detection_latency_ms
                    .map(|ms| format!(", detected in {ms:.1} ms"))
                    .unwrap_or_default()
            );
        }
        None => line.push_str("; no change since start"),
    }
    if !n.pinned_to_offline.is_empty() {
        let _ = write!(
            line,
            "; {} container(s) pinned to offline CPUs",
            n.pinned_to_offline.len()
        );
    }
    if let Some(e) = &n.read_error {
        let _ = write!(line, "; READ ERROR: {e}");
    }
    line
}

/// How the watcher task runs.
#[derive(Debug, Clone)]
pub struct WatcherOptions {
    /// `/` on a node.
    pub root: PathBuf,
    pub resync_interval: Duration,
    /// Quiet time after a cpuhp burst before the final re-read.
    pub settle: Duration,
    /// Open the uevent socket.
    pub uevents: bool,
}

impl WatcherOptions {
    pub fn host(resync_interval: Duration) -> Self {
        WatcherOptions {
            root: PathBuf::from("/"),
            resync_interval,
            settle: Duration::from_millis(50),
            uevents: true,
        }
    }
}

/// Forwards cpuhp ring buffer batches as triggers.
async fn cpuhp_source(ring: HotplugRing, tx: mpsc::Sender<Trigger>) {
    #[expect(
        deprecated,
        reason = "the ring owns its fd and the AsyncFd owns the ring, which is the I/O safety \
                  tokio's `unsafe fn register` asks for; unsafe code is denied in this crate"
    )]
    let registered = AsyncFd::with_interest(ring, tokio::io::Interest::READABLE);
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            warn!(error = %e, "capacity: cannot await the cpuhp ring buffer; following CPUs through uevents and the resync");
            return;
        }
    };
    let mut events: Vec<CpuHotplugEvent> = Vec::new();
    loop {
        let mut guard = match fd.readable_mut().await {
            Ok(g) => g,
            Err(e) => {
                warn!(error = %e, "capacity: cpuhp ring buffer failed; following CPUs through uevents and the resync");
                return;
            }
        };
        guard.get_inner_mut().drain(&mut events);
        guard.clear_ready();
        // Events that arrived between the drain and `clear_ready` raise readiness again (the
        // ring signals each one written after the consumer caught up), so nothing is stranded.
        guard.get_inner_mut().drain(&mut events);
        drop(guard);
        if let Some(first) = events.iter().map(|e| e.timestamp_ns).min() {
            debug!(steps = events.len(), "capacity: cpuhp events");
            let t = Trigger {
                source: Source::Cpuhp,
                scope: Scope::Cpu,
                event_ns: Some(first),
            };
            events.clear();
            if tx.send(t).await.is_err() {
                return;
            }
        }
    }
}

/// Forwards CPU and memory uevents as triggers.
async fn uevent_source(mut socket: uevent::UeventSocket, tx: mpsc::Sender<Trigger>) {
    let mut events = Vec::new();
    loop {
        let trigger = match socket.recv(&mut events).await {
            Ok(_) => {
                let arrived = monotonic_ns();
                let mut merged: Option<Trigger> = None;
                for ev in events.drain(..) {
                    debug!(action = %ev.action, devpath = %ev.devpath, seqnum = ?ev.seqnum, "capacity: uevent");
                    let Some(scope) = ev.scope() else { continue };
                    let t = Trigger {
                        source: Source::Uevent,
                        scope,
                        event_ns: Some(arrived),
                    };
                    match &mut merged {
                        Some(m) => m.merge(&t),
                        None => merged = Some(t),
                    }
                }
                merged
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                warn!("capacity: the kernel dropped uevents (ENOBUFS); re-reading everything");
                Some(Trigger {
                    source: Source::Uevent,
                    scope: Scope::All,
                    event_ns: None,
                })
            }
            Err(e) => {
                warn!(error = %e, "capacity: uevent socket failed; following eBPF events and the resync");
                return;
            }
        };
        if let Some(t) = trigger {
            if tx.send(t).await.is_err() {
                return;
            }
        }
    }
}

/// Runs the watcher until `cancel` fires: see the module docs. `cpuhp` is the observer's ring
/// buffer (`None`: the eBPF program is not loaded); `reevaluate` (the resize engine) re-evaluates
/// waiting resizes.
pub async fn run(
    mut watcher: Watcher,
    cpuhp: Option<HotplugRing>,
    reevaluate: Option<Arc<dyn OnCapacityChange>>,
    opts: WatcherOptions,
    cancel: CancellationToken,
) {
    let (tx, mut rx) = mpsc::channel::<Trigger>(256);
    let mut sources = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(ring) = cpuhp {
        sources.push("cpuhp");
        tasks.spawn(cpuhp_source(ring, tx.clone()));
    } else {
        warn!("capacity: the cpuhp eBPF program is not loaded; following CPUs through their uevents and the resync");
    }
    if opts.uevents {
        match uevent::UeventSocket::open() {
            Ok(socket) => {
                sources.push("uevent");
                tasks.spawn(uevent_source(socket, tx.clone()));
            }
            Err(e) => {
                warn!(error = %e, "capacity: no kernel uevents; memory changes are seen at the resync");
            }
        }
    }
    drop(tx);
    sources.push("resync");
    watcher.set_sources(&sources, opts.resync_interval);
    info!(sources = ?sources, resync_interval = ?opts.resync_interval, "capacity watcher started");

    let start = tokio::time::Instant::now();
    let mut resync = tokio::time::interval_at(start + opts.resync_interval, opts.resync_interval);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A cpuhp burst whose re-read showed nothing yet: re-read once it has been quiet.
    let mut settle: Option<(tokio::time::Instant, Trigger)> = None;
    let mut open = true;
    loop {
        let settle_at = settle.as_ref().map(|(at, _)| *at);
        let trigger = tokio::select! {
            () = cancel.cancelled() => break,
            _ = resync.tick() => Trigger { source: Source::Resync, scope: Scope::All, event_ns: None },
            () = async { tokio::time::sleep_until(settle_at.unwrap_or(start)).await }, if settle_at.is_some() => {
                let (_, t) = settle.take().expect("settle armed");
                t
            }
            t = rx.recv(), if open => {
                let Some(mut t) = t else {
                    open = false;
                    continue;
                };
                // Coalesce a burst into one re-read.
                while let Ok(more) = rx.try_recv() {
                    t.merge(&more);
                }
                t
            }
        };
        let changes = watcher.observe(&trigger);
        if trigger.source == Source::Cpuhp {
            if changes.iter().any(|c| c.kind == ChangeKind::OnlineCpus) {
                settle = None;
            } else {
                let mut t = trigger;
                if let Some((_, pending)) = &settle {
                    t.merge(pending);
                }
                settle = Some((tokio::time::Instant::now() + opts.settle, t));
            }
        }
        if changes.iter().any(|c| c.kind.is_capacity()) {
            if let Some(reevaluate) = &reevaluate {
                let cause = changes
                    .iter()
                    .filter(|c| c.kind.is_capacity())
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                let reevaluation = tokio::time::timeout(
                    Duration::from_secs(10),
                    Arc::clone(reevaluate).capacity_changed(&cause),
                );
                if let Ok(outcomes) = reevaluation.await {
                    watcher.reevaluated(outcomes);
                } else {
                    warn!("capacity: re-evaluating waiting resizes took over 10 s; left to the next change");
                }
            }
        }
    }
    tasks.shutdown().await;
    info!("capacity watcher stopped");
}

#[cfg(test)]
mod catalog_tests;
#[cfg(test)]
mod tests;
