//! Observer wiring: the observer thread that reads the watched containers' counters on an
//! interval. Which containers are watched (fed by the NRI handler) and resize confirmation
//! (desired vs actual) are node state ([`crate::state`]).
//!
//! The observer is started once, on its own thread (its reads are blocking file and map I/O).
//! Each tick it re-syncs the watched set only when the handler changed it (a generation
//! counter), reads every watched cgroup with the observer's reused buffers, advances the metrics
//! through cached series handles and publishes one [`ContainerObservation`] per container.
//! Every few ticks it also re-reads each confirmed container's cgroup path up to its pod's
//! ([`NodeState::recheck_caps`]): a pod cgroup below the container caps it.
//!
//! Where the observer has a reclaim program to attach on demand, it binds it to the node's
//! [`ReclaimWatch`](crate::observer::ReclaimWatch): the watch's driver attaches and detaches it
//! on its blocking threads, under the lock the observer thread reads under (a switch waits for
//! a tick's reads to end, a tick for a switch).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tracing::{debug, error, info, warn};

use crate::cgroup;
use crate::clock::now_ms;
use crate::metrics::{ContainerLabels, ContainerSeries};
use crate::observer::{
    CpuHotplugEvent, HotplugRing, ObservedCgroup, Observer, ObserverError, ObserverSettings,
    ReclaimSwitch, StallShare, CPUHP_ENTER,
};
use crate::state::{
    ContainerObservation, NodeState, ObserverInfo, RECHECK_EVERY_TICKS as RECHECK_CAPS_EVERY_TICKS,
};
use crate::sync::{Locked as _, ReadWriteLocked as _};

/// How the observer runs.
#[derive(Clone, Debug)]
pub struct ObserverOptions {
    pub settings: ObserverSettings,
    pub interval: Duration,
}

struct Watched {
    labels: ContainerLabels,
    cgroups_path: String,
    cgroup: Option<ObservedCgroup>,
    /// The container's metric series; its `last()` is the last observation read, once
    /// `last_at` is set (one copy of it per container, not two).
    series: ContainerSeries,
    /// When the last observation was read (monotonic: the stall share's wall time).
    last_at: Option<Instant>,
    stall: Option<StallShare>,
    failing: bool,
    unresolved_logged: bool,
}

/// The observer's on-demand reclaim program as the node's reclaim watch switches it.
struct ObserverSwitch {
    observer: Weak<Mutex<Observer>>,
    program: &'static str,
}

impl ObserverSwitch {
    fn with(
        &self,
        f: impl FnOnce(&mut Observer) -> Result<(), ObserverError>,
    ) -> Result<(), ObserverError> {
        let observer = self.observer.upgrade().ok_or(ObserverError::Program {
            program: self.program,
            reason: "the observer stopped".into(),
        })?;
        let mut observer = observer.locked();
        f(&mut observer)
    }
}

impl ReclaimSwitch for ObserverSwitch {
    fn program(&self) -> &'static str {
        self.program
    }

    fn attach(&self) -> Result<(), ObserverError> {
        self.with(Observer::attach_reclaim_events)
    }

    fn detach(&self) -> Result<(), ObserverError> {
        self.with(Observer::detach_reclaim_events)
    }
}

/// The observer thread's state.
struct Loop {
    state: Arc<NodeState>,
    /// Shared with the reclaim watch's switch (a `Weak`): the thread holds the only `Arc`.
    observer: Arc<Mutex<Observer>>,
    generation: u64,
    watched: HashMap<String, Box<Watched>>,
    hotplug: Vec<CpuHotplugEvent>,
    newly_resolved: Vec<String>,
}

impl Loop {
    fn sync_membership(&mut self, observer: &mut Observer) {
        let state = Arc::clone(&self.state);
        state.observed(|o| {
            if o.generation() == self.generation {
                return;
            }
            self.generation = o.generation();
            self.watched.retain(|id, w| {
                let keep = o
                    .targets
                    .get(id)
                    .is_some_and(|t| t.cgroups_path == w.cgroups_path && t.labels == w.labels);
                if !keep {
                    if let Some(c) = &w.cgroup {
                        observer.forget(c);
                    }
                }
                keep
            });
            for (id, t) in &o.targets {
                if !self.watched.contains_key(id) {
                    self.watched.insert(
                        id.clone(),
                        Box::new(Watched {
                            labels: t.labels.clone(),
                            cgroups_path: t.cgroups_path.clone(),
                            cgroup: None,
                            series: state.metrics.container(&t.labels),
                            last_at: None,
                            stall: None,
                            failing: false,
                            unresolved_logged: false,
                        }),
                    );
                }
            }
        });
    }

    fn read_all(&mut self, observer: &mut Observer) {
        for (id, w) in &mut self.watched {
            if w.cgroup.is_none() {
                // NRI CreateContainer comes before runc creates the cgroup: retry each tick.
                match cgroup::container_path(&w.cgroups_path)
                    .map_err(|e| e.to_string())
                    .and_then(|p: PathBuf| observer.cgroup(&p).map_err(|e| e.to_string()))
                {
                    Ok(c) => {
                        w.cgroup = Some(c);
                        self.newly_resolved.push(id.clone());
                    }
                    Err(e) => {
                        if !w.unresolved_logged {
                            debug!(container = %w.labels.container, pod = %w.labels.pod, error = %e, "cgroup not (yet) observable");
                            w.unresolved_logged = true;
                        }
                        continue;
                    }
                }
            }
            let Some(c) = &w.cgroup else { continue };
            match observer.read(c) {
                Ok(o) => {
                    let at = Instant::now();
                    let before = w.last_at.and_then(|_| w.series.last().pressure);
                    w.stall = match (before, o.pressure, w.last_at) {
                        (Some(before), Some(after), Some(then)) => {
                            let wall = at.duration_since(then).as_micros();
                            let wall = u64::try_from(wall).unwrap_or(u64::MAX);
                            Some(StallShare::between(&before, &after, wall))
                        }
                        _ => None,
                    };
                    w.series.update(&o);
                    w.last_at = Some(at);
                    w.failing = false;
                }
                Err(e) => {
                    if !w.failing {
                        debug!(container = %w.labels.container, pod = %w.labels.pod, error = %e, "observer read failed (container stopped?)");
                        w.failing = true;
                    }
                }
            }
        }
    }

    fn publish(&mut self) {
        let at_ms = now_ms();
        let watched = &self.watched;
        self.state.observed(|o| {
            for (id, w) in watched {
                let Some(observation) = w.last_at.map(|_| *w.series.last()) else {
                    continue;
                };
                if !o.targets.contains_key(id) {
                    continue;
                }
                let value = ContainerObservation {
                    observation,
                    at_ms,
                    stall: w.stall,
                };
                if let Some(slot) = o.observations.get_mut(id) {
                    **slot = value;
                } else {
                    o.observations.insert(id.clone(), Box::new(value));
                }
            }
        });
        // Verdicts on applied resizes compare these counters over time.
        self.state.verdict_tick(
            watched
                .iter()
                .filter_map(|(id, w)| Some((id.as_str(), w.last_at.map(|_| w.series.last())?))),
        );
        // First sight of a container's cgroup: record its actual limits next to its spec.
        for id in self.newly_resolved.drain(..) {
            self.state.confirm(&id, None);
        }
    }

    fn drain_hotplug(&mut self, observer: &mut Observer) {
        observer.drain_hotplug_events(&mut self.hotplug);
        for e in self.hotplug.drain(..) {
            debug!(
                cpu = e.cpu,
                state = e.state,
                step = e.idx,
                ret = e.ret,
                phase = if e.kind == CPUHP_ENTER {
                    "enter"
                } else {
                    "exit"
                },
                "CPU hotplug step"
            );
        }
    }

    fn tick(&mut self) {
        let shared = Arc::clone(&self.observer);
        let mut observer = shared.locked();
        self.sync_membership(&mut observer);
        observer.begin_pass();
        self.read_all(&mut observer);
        observer.end_pass();
        drop(observer);
        self.publish();
        self.drain_hotplug(&mut shared.locked());
    }
}

/// Every this many ticks the observer thread returns the allocator's free pages to the kernel.
const TRIM_EVERY_TICKS: u32 = 10;

/// Starts the observer on its own thread; it runs until `stop` is dropped or sent to. Once
/// started, the observer hands its CPU hotplug ring buffer to `hotplug` (the capacity watcher);
/// `None` is sent when there is none, and the sender is dropped if the observer cannot start.
pub fn spawn(
    state: Arc<NodeState>,
    opts: ObserverOptions,
    stop: Receiver<()>,
    hotplug: Option<tokio::sync::oneshot::Sender<Option<HotplugRing>>>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("nri-resize-observer".into())
        .spawn(move || {
            if let Err(e) = crate::observer::lower_thread_priority() {
                warn!(error = %e, "observer: cannot lower its thread's priority; it runs at the default");
            }
            let mut observer = match Observer::start(&opts.settings) {
                Ok(o) => o,
                Err(e) => {
                    error!(error = %e, "observer failed to start; /readyz stays unready");
                    return;
                }
            };
            let strategies = observer.strategies();
            for f in observer.fallbacks() {
                warn!(program = f.program, reason = %f.reason, "observer fallback");
            }
            state.metrics.set_strategies(strategies);
            let map_memory = observer.map_memory().to_vec();
            state.metrics.set_bpf_map_memory(&map_memory);
            state.observer_map_bytes.store(
                crate::observer::map_memory::total(&map_memory),
                Ordering::Release,
            );
            *state.observer_info.write_locked() = Some(ObserverInfo {
                strategies,
                fallbacks: observer.fallbacks().to_vec(),
                interval: opts.interval,
                map_memory,
                possible_cpus: observer.possible_cpus(),
            });
            if let Some(tx) = hotplug {
                // The receiver may be gone (capacity watcher disabled): the ring is dropped.
                let _ = tx.send(observer.take_hotplug_ring());
            }
            *state.observer_fallbacks.write_locked() = observer
                .fallbacks()
                .iter()
                .map(|f| format!("{}: {}", f.program, f.reason))
                .collect();
            state.observer_loaded.store(true, Ordering::Release);
            let on_demand = observer.reclaim_on_demand();
            let observer = Arc::new(Mutex::new(observer));
            if let Some(program) = on_demand {
                info!(program, "observer: reclaim counter attached only while nri-resize reclaims");
                state.reclaim_watch.bind(Arc::new(ObserverSwitch {
                    observer: Arc::downgrade(&observer),
                    program,
                }));
            }
            let mut l = Loop {
                state,
                observer,
                generation: 0,
                watched: HashMap::new(),
                hotplug: Vec::new(),
                newly_resolved: Vec::new(),
            };
            let mut ticks: u32 = 0;
            loop {
                l.tick();
                // Memory freed by the other threads (NRI events, syncs, scrapes) stays in
                // their malloc arenas otherwise: RSS grew ~28 KiB per container where the
                // live heap grew about half that (footprint bench, heaptrack).
                ticks = ticks.wrapping_add(1);
                if ticks % TRIM_EVERY_TICKS == 0 {
                    crate::observer::release_freed_memory();
                }
                // Whether a pod cgroup (kubelet's to write) caps a container below its limits.
                if ticks % RECHECK_CAPS_EVERY_TICKS == 0 {
                    l.state.recheck_caps();
                }
                match stop.recv_timeout(opts.interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            l.state.reclaim_watch.unbind();
            {
                let mut observer = l.observer.locked();
                for w in l.watched.values() {
                    if let Some(c) = &w.cgroup {
                        observer.forget(c);
                    }
                }
            }
            // Detaching the programs (dropping their links and maps) waits for the kernel's RCU
            // grace periods: timed, since it is part of every exit.
            let detach = Instant::now();
            drop(l);
            info!(
                detach_ms = detach.elapsed().as_millis(),
                "observer stopped; eBPF programs detached"
            );
        })
}
