//! The owner of the resize records ([`ContainerResize`] per container, [`PodResize`] per
//! whole-pod resize): the engine's paths write through [`Records`], everyone else reads a
//! [`RecordsView`] (the API, the metrics' scrape, re-evaluation). The maps are reached only
//! through these two handles, so the architecture test sees every reader and writer
//! (kube-rs' reflector `Writer` / `Store` is the shape).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::records::{ContainerResize, PodResize};
use crate::policy::ResizeState;
use crate::sync::Locked as _;

#[derive(Debug, Default)]
struct Maps {
    containers: Mutex<HashMap<String, Box<ContainerResize>>>,
    pods: Mutex<HashMap<String, PodResize>>,
}

/// The writer; one per engine.
#[derive(Debug, Default)]
pub(crate) struct Records {
    maps: Arc<Maps>,
}

/// A read-only view of the records: cheap to clone, always the writer's latest.
#[derive(Debug, Clone, Default)]
pub struct RecordsView {
    maps: Arc<Maps>,
}

impl Records {
    /// A view that reads what this writer writes.
    pub(crate) fn view(&self) -> RecordsView {
        RecordsView {
            maps: Arc::clone(&self.maps),
        }
    }

    /// Changes the record of container `id`, made empty first when there is none.
    pub(crate) fn upsert_container<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut ContainerResize) -> R,
    ) -> R {
        f(self
            .maps
            .containers
            .locked()
            .entry(id.to_owned())
            .or_default())
    }

    /// Changes the record of container `id` where there is one; `None` where there is not.
    pub(crate) fn update_container<R>(
        &self,
        id: &str,
        f: impl FnOnce(&mut ContainerResize) -> R,
    ) -> Option<R> {
        self.maps.containers.locked().get_mut(id).map(|r| f(r))
    }

    pub(crate) fn remove_container(&self, id: &str) {
        self.maps.containers.locked().remove(id);
    }

    /// The ids of the containers of `pod_id` that have a record.
    pub(crate) fn containers_of(&self, pod_id: &str) -> Vec<String> {
        self.maps
            .containers
            .locked()
            .iter()
            .filter(|(_, r)| r.pod_id == pod_id)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The pods with a record (whole-pod or of a container) that are not in `present`.
    pub(crate) fn pods_not_in(&self, present: &[String]) -> Vec<String> {
        let present: HashSet<&str> = present.iter().map(String::as_str).collect();
        let mut gone: BTreeSet<String> = self
            .maps
            .pods
            .locked()
            .keys()
            .filter(|id| !present.contains(id.as_str()))
            .cloned()
            .collect();
        gone.extend(
            self.maps
                .containers
                .locked()
                .values()
                .filter(|r| !present.contains(r.pod_id.as_str()))
                .map(|r| r.pod_id.clone()),
        );
        gone.into_iter().collect()
    }

    /// Replaces the whole-pod record of `record.pod_id`.
    pub(crate) fn put_pod(&self, record: PodResize) {
        self.maps
            .pods
            .locked()
            .insert(record.pod_id.clone(), record);
    }

    /// Changes the whole-pod record of `pod_id` where there is one.
    pub(crate) fn update_pod(&self, pod_id: &str, f: impl FnOnce(&mut PodResize)) {
        if let Some(r) = self.maps.pods.locked().get_mut(pod_id) {
            f(r);
        }
    }

    pub(crate) fn remove_pod(&self, pod_id: &str) {
        self.maps.pods.locked().remove(pod_id);
    }
}

impl RecordsView {
    /// Every container's record, by container id.
    pub fn containers(&self) -> HashMap<String, ContainerResize> {
        self.maps
            .containers
            .locked()
            .iter()
            .map(|(id, r)| (id.clone(), ContainerResize::clone(r)))
            .collect()
    }

    /// The record of container `id`.
    pub fn container(&self, id: &str) -> Option<ContainerResize> {
        self.maps
            .containers
            .locked()
            .get(id)
            .map(|r| ContainerResize::clone(r))
    }

    /// `(pod id, container name, state)` of every container with a resize pending.
    pub fn pending(&self) -> Vec<(String, String, ResizeState)> {
        self.maps
            .containers
            .locked()
            .values()
            .filter_map(|r| Some((r.pod_id.clone(), r.container.clone(), r.state?)))
            .collect()
    }

    /// Whole-pod resizes, newest state of each, by pod name.
    pub fn pods(&self) -> Vec<PodResize> {
        let mut v: Vec<PodResize> = self.maps.pods.locked().values().cloned().collect();
        v.sort_by(|a, b| a.pod.cmp(&b.pod));
        v
    }

    /// The whole-pod record of `pod_id`.
    pub fn pod(&self, pod_id: &str) -> Option<PodResize> {
        self.maps.pods.locked().get(pod_id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_reads_what_the_writer_wrote_and_pods_not_present_are_named_once() {
        let records = Records::default();
        let view = records.view();
        records.upsert_container("c1", |r| r.pod_id = "p1".into());
        records.upsert_container("c2", |r| r.pod_id = "p2".into());
        records.put_pod(PodResize {
            pod_id: "p2".into(),
            ..PodResize::default()
        });
        assert_eq!(view.containers().len(), 2);
        assert!(view.pod("p2").is_some());
        assert_eq!(records.pods_not_in(&["p1".into()]), vec!["p2".to_string()]);
        assert_eq!(records.update_container("c3", |_| ()), None);
        records.remove_container("c1");
        assert_eq!(view.container("c1"), None);
    }
}
