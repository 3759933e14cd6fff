//! Observer wiring: which containers are watched (fed by the NRI handler), the observer thread
//! that reads their counters on an interval, and resize confirmation (desired vs actual).
//!
//! The observer is started once, on its own thread (its reads are blocking file and map I/O).
//! Each tick it re-syncs the watched set only when the handler changed it (a generation
//! counter), reads every watched cgroup with the observer's reused buffers, advances the metrics
//! through cached series handles and publishes one [`ContainerObservation`] per container.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, error, info, warn};

use super::NodeState;
use crate::cgroup::{self, ActualResources, CgroupIo as _, CgroupVersion};
use crate::metrics::{ContainerLabels, ContainerSeries};
use crate::model::{Container, LinuxResources, Pod};
use crate::observer::{
    CpuHotplugEvent, Fallback, HotplugRing, Observation, ObservedCgroup, Observer,
    ObserverSettings, Strategies, CPUHP_ENTER,
};
use crate::policy::{cpu_quota_text, memory_limit_text, DEFAULT_CFS_PERIOD_US};
use crate::sync::{Locked as _, ReadWriteLocked as _};

/// A container the observer watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub labels: ContainerLabels,
    pub pod_id: String,
    pub cgroups_path: String,
    pub cgroup_parent: String,
    /// The container's resources as the runtime last reported them.
    pub resources: Option<LinuxResources>,
}

impl Target {
    pub fn new(pod: &Pod, ctr: &Container) -> Self {
        Target {
            labels: ContainerLabels {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                container: ctr.name.clone(),
            },
            pod_id: ctr.pod_id.clone(),
            cgroups_path: ctr.cgroups_path.clone(),
            cgroup_parent: pod.cgroup_parent.clone(),
            resources: ctr.resources.clone(),
        }
    }
}

/// The observer's last reading of a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContainerObservation {
    pub observation: Observation,
    pub at_ms: u64,
}

/// Desired vs actual after a resize (or when the container was first seen).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Confirmation {
    /// What the update asked for (or the container's spec).
    pub desired: Option<LinuxResources>,
    /// What the container's cgroup says.
    pub actual: Option<ActualResources>,
    /// Whether every limit that was asked for is in effect; `None`: nothing comparable.
    pub matches: Option<bool>,
    /// What differs, field by field with both values (empty when it matches).
    pub differences: Vec<String>,
    /// Why the cgroup could not be read.
    pub error: Option<String>,
    pub at_ms: u64,
}

/// The observer as started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObserverInfo {
    pub strategies: Strategies,
    pub fallbacks: Vec<Fallback>,
    pub interval: Duration,
}

/// Watched containers and what is known about them; one lock, short holds.
#[derive(Debug, Default)]
pub struct Observed {
    generation: u64,
    pub targets: HashMap<String, Target>,
    pub observations: HashMap<String, ContainerObservation>,
    pub confirmations: HashMap<String, Confirmation>,
    /// Resources of an `UpdateContainer` awaiting its `PostUpdateContainer`, and when it came.
    pending: HashMap<String, (LinuxResources, std::time::Instant)>,
}

pub use crate::clock::now_ms;

/// Whether every limit `desired` sets is what `actual` shows. Only CFS quota/period, v1 shares
/// and the memory limit are compared (v2 weight is a lossy conversion of shares).
pub fn desired_matches(
    desired: &LinuxResources,
    actual: &ActualResources,
    version: CgroupVersion,
) -> Option<bool> {
    differences(desired, actual, version).map(|d| d.is_empty())
}

/// What differs between `desired` and `actual`, each naming the field and both values in
/// quantities (`memory limit: desired 40Mi, actual 66.6Mi`); `None`: nothing comparable.
pub fn differences(
    desired: &LinuxResources,
    actual: &ActualResources,
    version: CgroupVersion,
) -> Option<Vec<String>> {
    let mut compared = false;
    let mut found = Vec::new();
    let mut check =
        |field: &str, want: Option<i64>, have: Option<i64>, text: &dyn Fn(i64) -> String| {
            if let Some(w) = want {
                compared = true;
                if have != Some(w) {
                    found.push(format!(
                        "{field}: desired {}, actual {}",
                        text(w),
                        have.map_or_else(|| "unreadable".to_string(), text)
                    ));
                }
            }
        };
    let period = actual.cpu_period.unwrap_or(DEFAULT_CFS_PERIOD_US);
    // CRI: quota 0 means "not set"; -1 unlimited.
    check(
        "cpu quota",
        desired.cpu_quota().filter(|q| *q != 0).map(|q| q.max(-1)),
        actual.cpu_quota,
        &|q| format!("{} ({q}µs per {period}µs)", cpu_quota_text(q, period)),
    );
    check(
        "cpu period",
        desired
            .cpu_period()
            .filter(|p| *p != 0)
            .and_then(|p| i64::try_from(p).ok()),
        actual.cpu_period.and_then(|p| i64::try_from(p).ok()),
        &|p| format!("{p}µs"),
    );
    if version == CgroupVersion::V1 {
        check(
            "cpu.shares",
            desired
                .cpu_shares()
                .filter(|s| *s != 0)
                .and_then(|s| i64::try_from(s).ok()),
            actual.cpu_shares.and_then(|s| i64::try_from(s).ok()),
            &|s| s.to_string(),
        );
    }
    check(
        "memory limit",
        desired
            .memory_limit()
            .filter(|l| *l != 0)
            .map(|l| l.max(-1)),
        actual.memory_limit,
        &|l| memory_limit_text(l),
    );
    compared.then_some(found)
}

impl NodeState {
    pub fn observed<R>(&self, f: impl FnOnce(&mut Observed) -> R) -> R {
        f(&mut self.observed.locked())
    }

    /// Watches (or refreshes) a container the runtime told us about.
    pub(crate) fn track(&self, pod: &Pod, ctr: &Container) {
        let target = Target::new(pod, ctr);
        self.observed(|o| {
            if let Some(r) = &target.resources {
                self.metrics.set_desired(&target.labels, r);
                self.metrics.set_allocated(&target.labels, r);
            }
            if o.targets.get(&ctr.id) != Some(&target) {
                o.targets.insert(ctr.id.clone(), target);
                o.generation += 1;
            }
        });
    }

    /// Stops watching a container; its series, observation and confirmation go with it.
    pub(crate) fn untrack(&self, id: &str) {
        self.observed(|o| self.untrack_locked(o, id));
    }

    fn untrack_locked(&self, o: &mut Observed, id: &str) {
        if let Some(t) = o.targets.remove(id) {
            o.generation += 1;
            // A restarted container has a new id but the same labels: keep the live one's series.
            if !o.targets.values().any(|other| other.labels == t.labels) {
                self.metrics.remove_container(&t.labels);
            }
        }
        o.observations.remove(id);
        o.confirmations.remove(id);
        o.pending.remove(id);
    }

    /// Stops watching every container of a pod.
    pub(crate) fn untrack_pod(&self, pod_id: &str) {
        self.observed(|o| {
            let ids: Vec<String> = o
                .targets
                .iter()
                .filter(|(_, t)| t.pod_id == pod_id)
                .map(|(id, _)| id.clone())
                .collect();
            for id in ids {
                self.untrack_locked(o, &id);
            }
        });
    }

    /// After `Synchronize`: watch exactly the runtime's containers.
    pub(crate) fn retrack(&self, pods: &[Pod], containers: &[Container]) {
        let by_id: HashMap<&str, &Pod> = pods.iter().map(|p| (p.id.as_str(), p)).collect();
        let empty = Pod::default();
        let live: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        self.observed(|o| {
            let gone: Vec<String> = o
                .targets
                .keys()
                .filter(|id| !live.contains(id.as_str()))
                .cloned()
                .collect();
            for id in gone {
                self.untrack_locked(o, &id);
            }
        });
        for c in containers {
            self.track(by_id.get(c.pod_id.as_str()).copied().unwrap_or(&empty), c);
        }
    }

    /// Remembers what an `UpdateContainer` asked for, to confirm at `PostUpdateContainer`.
    pub(crate) fn expect_update(&self, id: &str, resources: &LinuxResources) {
        self.observed(|o| {
            o.pending.insert(
                id.to_owned(),
                (resources.clone(), std::time::Instant::now()),
            );
        });
    }

    /// At `PostUpdateContainer`: reads the cgroup back against what the update asked (or the
    /// spec, when no update is waiting) and, when it holds every limit asked for, observes the
    /// time since the `UpdateContainer` in `nri_resize_resize_confirmation_seconds`.
    pub(crate) fn confirm_update(&self, id: &str) -> Option<Confirmation> {
        let pending = self.observed(|o| o.pending.remove(id));
        let since = pending.as_ref().map(|(_, at)| *at);
        let c = self.confirm(id, pending.map(|(r, _)| r))?;
        if let (Some(at), Some(true)) = (since, c.matches) {
            self.metrics
                .confirmation
                .confirmed(at.elapsed().as_secs_f64());
        }
        Some(c)
    }

    /// The runtime applied a plugin-initiated update (no NRI event reports it): the container's
    /// spec as the observer knows it follows, so later reads compare with what it holds now.
    pub fn runtime_applied(&self, id: &str, resources: &LinuxResources) {
        self.observed(|o| {
            if let Some(t) = o.targets.get_mut(id) {
                t.resources = Some(resources.clone());
            }
        });
    }

    /// Records a fresh reading of a container's cgroup (a staged decrease reads it after each
    /// pass) against the desired values of its last confirmation.
    pub fn note_actual(&self, id: &str, actual: &ActualResources) {
        let version = self.cgroups.as_ref().map(cgroup::CgroupIo::version);
        self.observed(|o| {
            let Some(target) = o.targets.get(id) else {
                return;
            };
            let c = o.confirmations.entry(id.to_owned()).or_default();
            if let (Some(d), Some(v)) = (&c.desired, version) {
                let diff = differences(d, actual, v);
                c.matches = diff.as_ref().map(Vec::is_empty);
                c.differences = diff.unwrap_or_default();
            }
            c.actual = Some(*actual);
            c.error = None;
            c.at_ms = now_ms();
            self.metrics.set_actual(&target.labels, actual);
        });
    }

    /// Reads the container's cgroup now and records desired vs actual. `desired`: what the
    /// update asked; `None` takes the container's resources as the runtime reports them.
    pub fn confirm(&self, id: &str, desired: Option<LinuxResources>) -> Option<Confirmation> {
        let cgroups = self.cgroups.as_ref()?;
        let target = self.observed(|o| o.targets.get(id).cloned())?;
        let desired = desired.or_else(|| target.resources.clone());
        let mut confirmation = Confirmation {
            desired,
            at_ms: now_ms(),
            ..Confirmation::default()
        };
        match cgroup::container_path(&target.cgroups_path)
            .and_then(|path| cgroups.read_actual(&path))
        {
            Ok(actual) => {
                let diff = confirmation
                    .desired
                    .as_ref()
                    .and_then(|d| differences(d, &actual, cgroups.version()));
                confirmation.matches = diff.as_ref().map(Vec::is_empty);
                confirmation.differences = diff.unwrap_or_default();
                confirmation.actual = Some(actual);
            }
            Err(e) => confirmation.error = Some(e.to_string()),
        }
        if confirmation.matches == Some(false) {
            warn!(
                container = %target.labels.container,
                pod = %target.labels.pod,
                namespace = %target.labels.namespace,
                differences = %confirmation.differences.join("; "),
                "resize not in effect: desired and actual differ"
            );
        } else {
            debug!(
                container = %target.labels.container,
                pod = %target.labels.pod,
                matches = ?confirmation.matches,
                error = ?confirmation.error,
                "desired vs actual recorded"
            );
        }
        self.observed(|o| {
            // The container may have gone meanwhile.
            if o.targets.contains_key(id) {
                if let Some(d) = &confirmation.desired {
                    self.metrics.set_desired(&target.labels, d);
                }
                if let Some(a) = &confirmation.actual {
                    self.metrics.set_actual(&target.labels, a);
                }
                o.confirmations.insert(id.to_owned(), confirmation.clone());
            }
        });
        Some(confirmation)
    }
}

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
    series: ContainerSeries,
    last: Option<Observation>,
    failing: bool,
    unresolved_logged: bool,
}

/// The observer thread's state.
struct Loop {
    state: Arc<NodeState>,
    observer: Observer,
    generation: u64,
    watched: HashMap<String, Watched>,
    hotplug: Vec<CpuHotplugEvent>,
    newly_resolved: Vec<String>,
}

impl Loop {
    fn sync_membership(&mut self) {
        let state = Arc::clone(&self.state);
        state.observed(|o| {
            if o.generation == self.generation {
                return;
            }
            self.generation = o.generation;
            let observer = &mut self.observer;
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
                        Watched {
                            labels: t.labels.clone(),
                            cgroups_path: t.cgroups_path.clone(),
                            cgroup: None,
                            series: state.metrics.container(&t.labels),
                            last: None,
                            failing: false,
                            unresolved_logged: false,
                        },
                    );
                }
            }
        });
    }

    fn read_all(&mut self) {
        let metrics = &self.state.metrics;
        for (id, w) in &mut self.watched {
            if w.cgroup.is_none() {
                // NRI CreateContainer comes before runc creates the cgroup: retry each tick.
                match cgroup::container_path(&w.cgroups_path)
                    .map_err(|e| e.to_string())
                    .and_then(|p: PathBuf| self.observer.cgroup(&p).map_err(|e| e.to_string()))
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
            match self.observer.read(c) {
                Ok(o) => {
                    w.series.update(metrics, &o);
                    w.last = Some(o);
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
                let Some(observation) = w.last else { continue };
                if !o.targets.contains_key(id) {
                    continue;
                }
                let value = ContainerObservation { observation, at_ms };
                if let Some(slot) = o.observations.get_mut(id) {
                    *slot = value;
                } else {
                    o.observations.insert(id.clone(), value);
                }
            }
        });
        // First sight of a container's cgroup: record its actual limits next to its spec.
        for id in self.newly_resolved.drain(..) {
            self.state.confirm(&id, None);
        }
    }

    fn drain_hotplug(&mut self) {
        self.observer.drain_hotplug_events(&mut self.hotplug);
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
        self.sync_membership();
        self.read_all();
        self.publish();
        self.drain_hotplug();
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
            *state.observer_info.write_locked() = Some(ObserverInfo {
                strategies,
                fallbacks: observer.fallbacks().to_vec(),
                interval: opts.interval,
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
                match stop.recv_timeout(opts.interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            for w in l.watched.values() {
                if let Some(c) = &w.cgroup {
                    l.observer.forget(c);
                }
            }
            info!("observer stopped");
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CpuResources, MemoryResources};

    fn res(quota: i64, period: u64, mem: i64) -> LinuxResources {
        LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(quota),
                period: Some(period),
                ..CpuResources::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(mem),
                ..MemoryResources::default()
            }),
            ..LinuxResources::default()
        }
    }

    fn actual(quota: i64, period: u64, mem: i64) -> ActualResources {
        ActualResources {
            cpu_quota: Some(quota),
            cpu_period: Some(period),
            memory_limit: Some(mem),
            ..ActualResources::default()
        }
    }

    #[test]
    fn desired_matches_compares_only_what_was_asked() {
        let v = CgroupVersion::V2;
        assert_eq!(
            desired_matches(
                &res(200_000, 100_000, 100 << 20),
                &actual(200_000, 100_000, 100 << 20),
                v
            ),
            Some(true)
        );
        assert_eq!(
            desired_matches(
                &res(200_000, 100_000, 100 << 20),
                &actual(10_000, 100_000, 100 << 20),
                v
            ),
            Some(false)
        );
        // Memory limit 0 means unset in CRI: not compared.
        assert_eq!(
            desired_matches(&res(-1, 100_000, 0), &actual(-1, 100_000, 12345), v),
            Some(true)
        );
        assert_eq!(
            desired_matches(&LinuxResources::default(), &actual(1, 1, 1), v),
            None
        );
    }

    #[test]
    fn differences_name_the_field_and_both_values_in_quantities() {
        let d = differences(
            &res(80_000, 100_000, 40 << 20),
            &actual(100_000, 100_000, 69_828_608),
            CgroupVersion::V2,
        );
        assert_eq!(
            d.expect("comparable"),
            [
                "cpu quota: desired 800m (80000µs per 100000µs), actual 1000m (100000µs per 100000µs)",
                "memory limit: desired 40Mi, actual 66.6Mi",
            ]
        );
        assert_eq!(
            differences(
                &res(-1, 100_000, -1),
                &actual(-1, 100_000, -1),
                CgroupVersion::V2
            ),
            Some(Vec::new())
        );
    }

    fn pod(id: &str) -> Pod {
        Pod {
            id: id.into(),
            namespace: "ns".into(),
            name: format!("pod-{id}"),
            ..Pod::default()
        }
    }

    fn ctr(id: &str, pod: &str, name: &str) -> Container {
        Container {
            id: id.into(),
            pod_id: pod.into(),
            name: name.into(),
            cgroups_path: format!("/test/{pod}/{id}"),
            resources: Some(res(10_000, 100_000, 64 << 20)),
            ..Container::default()
        }
    }

    #[test]
    fn tracking_follows_remove_and_synchronize_and_drops_series() {
        let state = NodeState::new(crate::config::Config::default());
        state.track(&pod("p1"), &ctr("c1", "p1", "app"));
        state.track(&pod("p1"), &ctr("c2", "p1", "side"));
        state.track(&pod("p2"), &ctr("c3", "p2", "web"));
        let text = state.metrics.encode().expect("encode");
        assert!(text.contains(r#"container="side""#), "{text}");
        state.untrack("c2");
        let text = state.metrics.encode().expect("encode");
        assert!(!text.contains(r#"container="side""#), "{text}");
        state.retrack(&[pod("p2")], &[ctr("c3", "p2", "web")]);
        let ids: Vec<String> = state.observed(|o| o.targets.keys().cloned().collect());
        assert_eq!(ids, ["c3"]);
        state.untrack_pod("p2");
        assert!(state.observed(|o| o.targets.is_empty()));
    }

    #[test]
    fn confirm_reads_the_cgroup_under_an_injected_root() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("test/p1/c1");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("cpu.max"), "200000 100000\n").expect("write");
        std::fs::write(dir.join("memory.max"), "67108864\n").expect("write");
        let state = NodeState::with_cgroups(
            crate::config::Config::default(),
            Some(cgroup::Cgroups::V2(cgroup::V2 {
                root: tmp.path().to_owned(),
            })),
        );
        state.track(&pod("p1"), &ctr("c1", "p1", "app"));
        let c = state
            .confirm("c1", Some(res(200_000, 100_000, 64 << 20)))
            .expect("confirmation");
        assert_eq!(c.matches, Some(true), "{c:?}");
        let c = state.confirm("c1", None).expect("confirmation");
        assert_eq!(c.matches, Some(false), "spec asks 10000/100000: {c:?}");
        let text = state.metrics.encode().expect("encode");
        assert!(
            text.contains(r#"nri_resize_container_actual_cpu_millicores{container="app",namespace="ns",pod="pod-p1"} 2000"#),
            "{text}"
        );
    }
}
