//! The runtime's container and pod lifecycle as the engine sees it (an update recorded, applied,
//! a container or pod gone, a synchronize), fanned out to the owners it concerns: the records
//! ([`super::record_store`]), the reclaims ([`super::reclaims`]) and the restarts
//! ([`super::restart`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::record_store::RecordsView;
use super::{restart, ContainerResize, Engine, PodResize};
use crate::clock::now_ms;
use crate::metrics::ContainerLabels;
use crate::model::{Container, LinuxResources, Pod};
use crate::policy::ResizeState;
use crate::state::NodeState;

impl Engine {
    pub(super) fn record(
        &self,
        pod: &Pod,
        ctr: &Container,
        desired: Option<&LinuxResources>,
        state: Option<ResizeState>,
        reason: &str,
    ) {
        self.records.upsert_container(&ctr.id, |entry| {
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
        });
    }

    /// A read-only view of the resize records (the API, the metrics).
    pub fn records(&self) -> RecordsView {
        self.records.view()
    }

    /// The resize records of every container (by container id).
    pub fn container_resizes(&self) -> HashMap<String, ContainerResize> {
        self.records.view().containers()
    }

    /// Has the metrics ask, at every scrape, which containers have a resize pending and its
    /// state, labelled as their series are; containers the model no longer knows are skipped.
    /// Reads the records' view and the model only: the metrics hold nothing of the engine's.
    pub fn publish_resize_states(&self) {
        let view = self.records.view();
        let state = Arc::downgrade(&self.state);
        self.state
            .metrics
            .set_resize_state_source(Box::new(move || {
                state
                    .upgrade()
                    .map(|s| pending_resize_states(&view, &s))
                    .unwrap_or_default()
            }));
    }

    /// Whole-pod resizes, newest state of each.
    pub fn pod_resizes(&self) -> Vec<PodResize> {
        self.records.view().pods()
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
        self.records.upsert_container(container_id, |r| {
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
        });
        // Confirmation: the merged resources asked for vs the cgroup now (what `status` shows).
        if let Some(r) = &ctr.resources {
            self.state.runtime_applied(container_id, r);
        }
        self.state.confirm(container_id, ctr.resources.clone());
    }

    /// Forgets a removed container (and removes its staged decrease's checkpoint: file I/O).
    pub fn forget_container(&self, id: &str) {
        if self.forget_container_in_memory(id) {
            self.reclaims.remove_checkpoint(id);
        }
    }

    /// [`Engine::forget_container`]'s in-memory part: its restart, staged decrease and record
    /// end. `true`: a staged decrease ended, whose checkpoint is for
    /// [`Engine::remove_reclaim_checkpoint`].
    pub fn forget_container_in_memory(&self, id: &str) -> bool {
        self.restarts.note(id, restart::Seen::Stopped);
        let staged = self
            .reclaims
            .take(id, "container removed: staged memory decrease ended");
        self.records.remove_container(id);
        staged
    }

    /// Removes the checkpoint of an ended staged decrease of `container_id` (blocking file I/O).
    pub fn remove_reclaim_checkpoint(&self, container_id: &str) {
        self.reclaims.remove_checkpoint(container_id);
    }

    /// Forgets a removed pod: its whole-pod resize record and the records of any of its
    /// containers still kept (as [`Engine::forget_container`] does for each: a restart or staged
    /// decrease of theirs ends too).
    pub fn forget_pod(&self, pod_id: &str) {
        self.records.remove_pod(pod_id);
        for id in self.records.containers_of(pod_id) {
            self.forget_container(&id);
        }
    }

    /// Keeps the records of the pods whose ids are in `present` only (a synchronize: the
    /// runtime's whole list); every other pod is forgotten ([`Engine::forget_pod`]).
    pub fn retain_pods(&self, present: &[String]) {
        for id in self.records.pods_not_in(present) {
            self.forget_pod(&id);
        }
    }

    /// The runtime applied an update: what was desired is now allocated.
    pub fn applied(&self, ctr: &Container) {
        self.reclaims.notify_applied(&ctr.id);
        self.restarts.note(&ctr.id, restart::Seen::Updated);
        self.records.update_container(&ctr.id, |r| {
            r.allocated.clone_from(&ctr.resources);
            // An in-place resize is done; one waiting for a restart keeps its state and reason.
            if r.state == Some(ResizeState::InProgress) && r.reason.is_empty() {
                r.state = None;
                r.reason.clear();
            }
            r.updated_ms = now_ms();
        });
    }
}

/// The containers with a resize pending and its state, labelled as their series are.
fn pending_resize_states(
    view: &RecordsView,
    state: &NodeState,
) -> Vec<(ContainerLabels, ResizeState)> {
    let pending = view.pending();
    state.read_model(|m| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    use crate::state::NodeState;

    fn engine() -> Engine {
        Engine::detached_for_test(NodeState::new(Config::default()))
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
        engine.records.put_pod(PodResize {
            pod_id: pod_id.into(),
            pod: pod.full_name(),
            ..PodResize::default()
        });
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
