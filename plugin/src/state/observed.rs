//! The observer's view of the containers: which are watched (fed by the NRI handler), their last
//! observation and their last desired-vs-actual confirmation (see `confirm.rs`), under one lock
//! with short holds. The observer thread that reads them is wiring (`daemon/observe.rs`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::NodeState;
use crate::cgroup::{ActualResources, Caps};
use crate::metrics::ContainerLabels;
use crate::model::{Container, LinuxResources, Pod};
use crate::observer::map_memory::MapMemory;
use crate::observer::{Fallback, Observation, StallShare, Strategies};
use crate::sync::Locked as _;

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
    /// Stalled time over the interval before this reading (`None` without PSI, or at the first
    /// reading).
    pub stall: Option<StallShare>,
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
    /// What the cgroups above the container's, up to and including its pod's, cap: read with
    /// `actual` and again every few observer intervals (`caps.rs`). `None`: never known (no pod
    /// cgroup given, the container's not below it, or every read failed); a failed read keeps
    /// what was known.
    pub caps: Option<Caps>,
    /// The reading `caps` came from (as `seq`; caps are also re-read on their own).
    pub(super) caps_seq: u64,
    pub at_ms: u64,
    /// When the reading began, in the order of [`Observed::next_reading`]: a reading that began
    /// earlier never replaces one that began later (reads run side by side, off the workers).
    pub(super) seq: u64,
}

/// The observer as started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObserverInfo {
    pub strategies: Strategies,
    pub fallbacks: Vec<Fallback>,
    pub interval: Duration,
    /// Each eBPF map's memory (empty without eBPF).
    pub map_memory: Vec<MapMemory>,
    /// The kernel's possible CPUs, as read at load (`None` without eBPF).
    pub possible_cpus: Option<usize>,
}

/// Watched containers and what is known about them; one lock, short holds.
#[derive(Debug, Default)]
pub struct Observed {
    generation: u64,
    /// The last number [`Observed::next_reading`] gave out.
    readings: u64,
    pub targets: HashMap<String, Box<Target>>,
    pub observations: HashMap<String, Box<ContainerObservation>>,
    pub confirmations: HashMap<String, Box<Confirmation>>,
    /// Resources of an `UpdateContainer` awaiting its `PostUpdateContainer`, and when it came.
    pub(super) pending: HashMap<String, (LinuxResources, std::time::Instant)>,
}

impl Observed {
    /// Changes whenever the watched set does (the observer re-syncs only then).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Numbers a cgroup reading as it begins (see [`Confirmation::seq`]).
    pub(super) fn next_reading(&mut self) -> u64 {
        self.readings += 1;
        self.readings
    }

    /// Whether a reading numbered `seq` of container `id` is newer than the one recorded.
    pub(super) fn newer_reading(&self, id: &str, seq: u64) -> bool {
        self.confirmations.get(id).is_none_or(|c| c.seq < seq)
    }
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
            if o.targets.get(&ctr.id).map(AsRef::as_ref) != Some(&target) {
                o.targets.insert(ctr.id.clone(), Box::new(target));
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
        if o.confirmations.remove(id).is_some_and(|c| c.caps.is_some()) {
            self.count_caps(o);
        }
        o.pending.remove(id);
        self.forget_verdicts(id);
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
        let current = self.observed(|o| {
            o.pending.insert(
                id.to_owned(),
                (resources.clone(), std::time::Instant::now()),
            );
            o.targets.get(id).and_then(|t| t.resources.clone())
        });
        self.verdict_before_update(id, current.as_ref());
    }

    /// The runtime applied a plugin-initiated update (no NRI event reports it): the container's
    /// spec as the observer knows it follows, so later reads compare with what it holds now.
    pub fn runtime_applied(&self, id: &str, resources: &LinuxResources) {
        let before = self.observed(|o| {
            o.targets
                .get_mut(id)
                .and_then(|t| t.resources.replace(resources.clone()))
        });
        if let Some(before) = before {
            self.resize_applied(id, &before, resources);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{ctr, pod};
    use super::*;

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
}
