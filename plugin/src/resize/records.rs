//! The resize records `status` and `/v1/resizes` read: one per container (desired, allocated,
//! state, reason, in the KEP's words) and one per whole-pod resize (its steps, each with the
//! cgroups' actual values after it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{restart, Engine};
use crate::clock::now_ms;
use crate::metrics::ContainerLabels;
use crate::model::{Container, LinuxResources, Pod};
use crate::policy::{Limit, Limits, PodResources, ResizeState};
use crate::sync::Locked as _;

/// The resize record of one container, in the KEP's words.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerResize {
    pub pod_id: String,
    pub container: String,
    /// What the latest request asks for.
    pub desired: Option<LinuxResources>,
    /// What the plugin accepted (what the container holds once actuated).
    pub allocated: Option<LinuxResources>,
    /// `None`: no resize pending.
    pub state: Option<ResizeState>,
    pub reason: String,
    pub updated_ms: u64,
    /// The memory limit a staged decrease was deferred at (kubelet asking for it again restarts
    /// the reclaim); not part of the API.
    #[serde(skip)]
    pub deferred_target: Option<u64>,
}

/// One executed step of a whole-pod resize, with the cgroups' actual values after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// `pod` or the container's name.
    pub target: String,
    /// The step as people read it (`app cpu=1500m memory=512Mi`).
    pub step: String,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// Pod and container limits read back from cgroupfs after the step.
    pub actual: Option<SnapshotLimits>,
    /// An invariant the actual state broke after this step (must never happen).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub violation: String,
}

/// Pod and container limits: CPU millicores and memory bytes, `None` = unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotLimits {
    pub pod: LimitPair,
    pub containers: BTreeMap<String, LimitPair>,
}

/// CPU millicores and memory bytes, `None` = unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitPair {
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl From<Limits> for LimitPair {
    fn from(l: Limits) -> Self {
        LimitPair {
            cpu_millis: l.cpu.value(),
            memory_bytes: l.memory.value(),
        }
    }
}

impl From<LimitPair> for Limits {
    fn from(p: LimitPair) -> Self {
        Limits::new(
            Limit::from_option(p.cpu_millis),
            Limit::from_option(p.memory_bytes),
        )
    }
}

/// The limits of `p` as records and checkpoints keep them.
pub(super) fn snapshot(p: &PodResources) -> SnapshotLimits {
    SnapshotLimits {
        pod: p.pod.into(),
        containers: p
            .containers
            .iter()
            .map(|(n, l)| (n.clone(), (*l).into()))
            .collect(),
    }
}

/// The limits a record or checkpoint keeps, as the planner takes them.
pub(super) fn from_snapshot(s: &SnapshotLimits) -> PodResources {
    PodResources {
        pod: s.pod.into(),
        containers: s
            .containers
            .iter()
            .map(|(n, l)| (n.clone(), (*l).into()))
            .collect(),
    }
}

/// The state of a whole-pod resize, as the API reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodResize {
    pub pod_id: String,
    pub pod: String,
    pub target: SnapshotLimits,
    pub state: Option<ResizeState>,
    pub reason: String,
    pub attempts: u32,
    /// Every step executed, in order, with the actual cgroup values after it.
    pub steps: Vec<StepRecord>,
    /// The resize was picked up again from a checkpoint after a restart.
    pub resumed: bool,
}

impl Engine {
    pub(super) fn record(
        &self,
        pod: &Pod,
        ctr: &Container,
        desired: Option<&LinuxResources>,
        state: Option<ResizeState>,
        reason: &str,
    ) {
        let mut all = self.containers.locked();
        let entry = all.entry(ctr.id.clone()).or_default();
        entry.pod_id.clone_from(&pod.id);
        entry.container.clone_from(&ctr.name);
        if let Some(d) = desired {
            entry.desired = Some(d.clone());
        }
        if entry.allocated.is_none() {
            entry.allocated.clone_from(&ctr.resources);
        }
        entry.state = state;
        entry.reason = reason.to_string();
        entry.updated_ms = now_ms();
        entry.deferred_target = None;
    }

    /// The resize records of every container (by container id).
    pub fn container_resizes(&self) -> HashMap<String, ContainerResize> {
        self.containers.locked().clone()
    }

    /// The containers with a resize pending and its state, labelled as their series are (the
    /// metrics ask at every scrape). Containers the model no longer knows are skipped.
    pub fn pending_resize_states(&self) -> Vec<(ContainerLabels, ResizeState)> {
        let pending: Vec<(String, String, ResizeState)> = self
            .containers
            .locked()
            .values()
            .filter_map(|r| Some((r.pod_id.clone(), r.container.clone(), r.state?)))
            .collect();
        self.state.read_model(|m| {
            pending
                .into_iter()
                .filter_map(|(pod_id, container, state)| {
                    let pod = m.pod(&pod_id)?;
                    let labels = ContainerLabels {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container,
                    };
                    Some((labels, state))
                })
                .collect()
        })
    }

    /// Has the metrics ask [`Engine::pending_resize_states`] at every scrape (through a weak
    /// reference: the metrics outlive nothing of the engine's).
    pub fn publish_resize_states(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.state
            .metrics
            .set_resize_state_source(Box::new(move || {
                weak.upgrade()
                    .map(|engine| engine.pending_resize_states())
                    .unwrap_or_default()
            }));
    }

    /// Whole-pod resizes, newest state of each.
    pub fn pod_resizes(&self) -> Vec<PodResize> {
        let mut v: Vec<PodResize> = self.pods.locked().values().cloned().collect();
        v.sort_by(|a, b| a.pod.cmp(&b.pod));
        v
    }

    /// An update the runtime applied on the plugin's request (`nri-resize update`, a whole-pod
    /// step, a re-evaluation): what was asked is both desired and allocated now, and the cgroup
    /// is read back against it.
    pub fn note_applied_update(&self, container_id: &str, update: &LinuxResources) {
        let Some(ctr) = self
            .state
            .read_model(|m| m.container(container_id).cloned())
        else {
            return;
        };
        let mut all = self.containers.locked();
        let r = all.entry(container_id.to_string()).or_default();
        r.pod_id.clone_from(&ctr.pod_id);
        r.container.clone_from(&ctr.name);
        // The model already holds the update: it is what is allocated and what was desired.
        r.allocated.clone_from(&ctr.resources);
        r.desired
            .get_or_insert_with(LinuxResources::default)
            .merge(update);
        r.state = None;
        r.reason.clear();
        r.updated_ms = now_ms();
        drop(all);
        // Confirmation: the merged resources asked for vs the cgroup now (what `status` shows).
        if let Some(r) = &ctr.resources {
            self.state.runtime_applied(container_id, r);
        }
        self.state.confirm(container_id, ctr.resources.clone());
    }

    /// Forgets a removed container (and removes its staged decrease's checkpoint: file I/O).
    pub fn forget_container(&self, id: &str) {
        if self.forget_container_in_memory(id) {
            self.remove_reclaim_checkpoint(id);
        }
    }

    /// [`Engine::forget_container`]'s in-memory part: its restart, staged decrease and record
    /// end. `true`: a staged decrease ended, whose checkpoint is for
    /// [`Engine::remove_reclaim_checkpoint`].
    pub fn forget_container_in_memory(&self, id: &str) -> bool {
        self.restarts.note(id, restart::Seen::Stopped);
        let staged = self.take_reclaim(id, "container removed: staged memory decrease ended");
        self.containers.locked().remove(id);
        staged
    }

    /// Forgets a removed pod: its whole-pod resize record and the records of any of its
    /// containers still kept (as [`Engine::forget_container`] does for each: a restart or staged
    /// decrease of theirs ends too).
    pub fn forget_pod(&self, pod_id: &str) {
        self.pods.locked().remove(pod_id);
        let containers: Vec<String> = self
            .containers
            .locked()
            .iter()
            .filter(|(_, r)| r.pod_id == pod_id)
            .map(|(id, _)| id.clone())
            .collect();
        for id in containers {
            self.forget_container(&id);
        }
    }

    /// Keeps the records of the pods whose ids are in `present` only (a synchronize: the
    /// runtime's whole list); every other pod is forgotten ([`Engine::forget_pod`]).
    pub fn retain_pods(&self, present: &[String]) {
        let present: HashSet<&str> = present.iter().map(String::as_str).collect();
        let known = |id: &str| present.contains(id);
        let mut gone: Vec<String> = self
            .pods
            .locked()
            .keys()
            .filter(|id| !known(id))
            .cloned()
            .collect();
        gone.extend(
            self.containers
                .locked()
                .values()
                .filter(|r| !known(&r.pod_id))
                .map(|r| r.pod_id.clone()),
        );
        gone.sort_unstable();
        gone.dedup();
        for id in gone {
            self.forget_pod(&id);
        }
    }

    /// The runtime applied an update: what was desired is now allocated.
    pub fn applied(&self, ctr: &Container) {
        self.notify_reclaim_applied(&ctr.id);
        self.restarts.note(&ctr.id, restart::Seen::Updated);
        if let Some(r) = self.containers.locked().get_mut(&ctr.id) {
            r.allocated.clone_from(&ctr.resources);
            // An in-place resize is done; one waiting for a restart keeps its state and reason.
            if r.state == Some(ResizeState::InProgress) && r.reason.is_empty() {
                r.state = None;
                r.reason.clear();
            }
            r.updated_ms = now_ms();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::nri::RuntimeLink;
    use crate::resize::node::NodeReader;
    use crate::state::NodeState;

    fn engine() -> Engine {
        Engine::new(
            NodeState::new(Config::default()),
            RuntimeLink::default(),
            None,
            NodeReader::new("/nonexistent/nri-resize-test-node"),
            None,
        )
    }

    /// A pod with one container, both with resize records.
    fn pod_with_records(engine: &Engine, pod_id: &str) -> Pod {
        let pod = Pod {
            id: pod_id.into(),
            namespace: "ns".into(),
            name: pod_id.into(),
            ..Pod::default()
        };
        let ctr = Container {
            id: format!("{pod_id}-c"),
            pod_id: pod_id.into(),
            name: "app".into(),
            ..Container::default()
        };
        engine.record(&pod, &ctr, None, Some(ResizeState::Deferred), "test");
        engine.pods.locked().insert(
            pod_id.into(),
            PodResize {
                pod_id: pod_id.into(),
                pod: pod.full_name(),
                ..PodResize::default()
            },
        );
        pod
    }

    fn pod_ids(engine: &Engine) -> Vec<String> {
        engine.pod_resizes().into_iter().map(|r| r.pod_id).collect()
    }

    fn container_ids(engine: &Engine) -> Vec<String> {
        let mut ids: Vec<String> = engine.container_resizes().into_keys().collect();
        ids.sort();
        ids
    }

    #[test]
    fn a_removed_pod_leaves_no_records() {
        let engine = engine();
        pod_with_records(&engine, "p1");
        pod_with_records(&engine, "p2");
        engine.forget_pod("p1");
        assert_eq!(pod_ids(&engine), ["p2"]);
        assert_eq!(container_ids(&engine), ["p2-c"]);
        engine.forget_pod("unknown");
        assert_eq!(pod_ids(&engine), ["p2"]);
    }

    #[test]
    fn a_synchronize_keeps_the_records_of_present_pods_only() {
        let engine = engine();
        pod_with_records(&engine, "p1");
        pod_with_records(&engine, "p2");
        // A container record whose pod has no whole-pod record goes too.
        let p3 = Pod {
            id: "p3".into(),
            ..Pod::default()
        };
        let c3 = Container {
            id: "p3-c".into(),
            pod_id: "p3".into(),
            ..Container::default()
        };
        engine.record(&p3, &c3, None, None, "");
        engine.retain_pods(&["p1".to_string()]);
        assert_eq!(pod_ids(&engine), ["p1"]);
        assert_eq!(container_ids(&engine), ["p1-c"]);
    }
}
