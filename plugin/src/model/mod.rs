//! The plugin's view of the node: pods and containers as the runtime reports them, fed by NRI
//! events and rebuilt from scratch by every `Synchronize`. Plain data, no I/O, no wire types.

mod diff;
#[cfg(test)]
pub mod fixtures;
mod journal;
mod kept;
mod pages;
mod pod_limits;
mod resources;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

pub use diff::{fields_changed, values_of};
pub use journal::{EventKind, EventRecord, Journal};
pub use kept::{is_ours, kept, MAX_KEPT_KEYS, MAX_KEPT_VALUE_BYTES, OVERSIZED};
pub use pages::held_memory_limit;
pub use pod_limits::PodLimits;
pub use resources::{
    limited_bytes, CpuResources, HugepageLimit, LinuxResources, MemoryResources, UNLIMITED_BYTES,
};

/// A pod sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// nri-resize's own labels, bounded ([`kept`]); no other is read.
    pub labels: BTreeMap<String, String>,
    /// nri-resize's own annotations, bounded ([`kept`]): what pod owners write costs the
    /// daemon a bounded amount.
    pub annotations: BTreeMap<String, String>,
    pub runtime_handler: String,
    /// The pod cgroup (kubelet's `cgroup_parent`), as given to the runtime.
    pub cgroup_parent: String,
    /// Sum of the containers' resources, when the runtime passes it (containerd 2.x).
    pub resources: Option<LinuxResources>,
    /// Pod overhead (`RuntimeClass`), when the runtime passes it.
    pub overhead: Option<LinuxResources>,
    pub ips: Vec<String>,
}

impl Pod {
    /// `namespace/name`, how people refer to a pod (just `name` without a namespace).
    pub fn full_name(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }
}

/// Container lifecycle state as the runtime reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    #[default]
    Unknown,
    Created,
    Paused,
    Running,
    Stopped,
}

/// A container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    pub id: String,
    pub pod_id: String,
    pub name: String,
    pub state: ContainerState,
    /// Process id of the container's init, when running and known.
    pub pid: Option<u32>,
    /// The container's cgroup (runtime-specific form: a path, or `slice:prefix:name` for systemd).
    pub cgroups_path: String,
    /// The container's full Linux resources as the runtime holds them.
    pub resources: Option<LinuxResources>,
    /// nri-resize's own labels, bounded ([`kept`]).
    pub labels: BTreeMap<String, String>,
    /// nri-resize's own annotations, bounded ([`kept`]).
    pub annotations: BTreeMap<String, String>,
}

/// All pods and containers the plugin knows of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Model {
    pods: HashMap<String, Box<Pod>>,
    containers: HashMap<String, Box<Container>>,
}

impl Model {
    /// Replaces everything with the runtime's full state (from `Synchronize`).
    pub fn rebuild(&mut self, pods: Vec<Pod>, containers: Vec<Container>) {
        self.pods = pods
            .into_iter()
            .map(|p| (p.id.clone(), Box::new(p)))
            .collect();
        self.containers = containers
            .into_iter()
            .map(|c| (c.id.clone(), Box::new(c)))
            .collect();
    }

    pub fn upsert_pod(&mut self, pod: Pod) {
        self.pods.insert(pod.id.clone(), Box::new(pod));
    }

    /// Removes a pod and any containers of it still known.
    pub fn remove_pod(&mut self, pod_id: &str) -> Option<Pod> {
        self.containers.retain(|_, c| c.pod_id != pod_id);
        self.pods.remove(pod_id).map(|p| *p)
    }

    pub fn upsert_container(&mut self, container: Container) {
        self.containers
            .insert(container.id.clone(), Box::new(container));
    }

    pub fn remove_container(&mut self, id: &str) -> Option<Container> {
        self.containers.remove(id).map(|c| *c)
    }

    /// Records resources applied to a container (an update the runtime accepted).
    pub fn apply_resources(&mut self, id: &str, update: &LinuxResources) -> bool {
        match self.containers.get_mut(id) {
            Some(c) => {
                c.resources
                    .get_or_insert_with(LinuxResources::default)
                    .merge(update);
                true
            }
            None => false,
        }
    }

    pub fn pod(&self, id: &str) -> Option<&Pod> {
        self.pods.get(id).map(AsRef::as_ref)
    }

    pub fn container(&self, id: &str) -> Option<&Container> {
        self.containers.get(id).map(AsRef::as_ref)
    }

    /// Every pod, in no particular order.
    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.values().map(AsRef::as_ref)
    }

    /// Every container, in no particular order.
    pub fn containers(&self) -> impl Iterator<Item = &Container> {
        self.containers.values().map(AsRef::as_ref)
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn container_count(&self) -> usize {
        self.containers.len()
    }

    /// A stable, sorted view: pods by namespace/name, each with its containers by name.
    pub fn snapshot(&self) -> Vec<PodView> {
        let mut by_pod: HashMap<&str, Vec<Container>> = HashMap::new();
        for c in self.containers.values() {
            by_pod
                .entry(c.pod_id.as_str())
                .or_default()
                .push(Container::clone(c));
        }
        let mut pods: Vec<PodView> = self
            .pods
            .values()
            .map(|p| {
                let mut containers = by_pod.remove(p.id.as_str()).unwrap_or_default();
                containers.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.id.cmp(&b.id)));
                PodView {
                    pod: Pod::clone(p),
                    containers,
                }
            })
            .collect();
        // Containers whose pod is unknown (should not happen; shown rather than hidden).
        for (pod_id, mut containers) in by_pod {
            containers.sort_by(|a, b| a.name.cmp(&b.name));
            pods.push(PodView {
                pod: Pod {
                    id: pod_id.to_string(),
                    name: "<unknown pod>".into(),
                    ..Pod::default()
                },
                containers,
            });
        }
        pods.sort_by(|a, b| {
            (
                a.pod.namespace.as_str(),
                a.pod.name.as_str(),
                a.pod.id.as_str(),
            )
                .cmp(&(
                    b.pod.namespace.as_str(),
                    b.pod.name.as_str(),
                    b.pod.id.as_str(),
                ))
        });
        pods
    }
}

/// A pod with its containers, as the status API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodView {
    #[serde(flatten)]
    pub pod: Pod,
    pub containers: Vec<Container>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(id: &str, ns: &str, name: &str) -> Pod {
        Pod {
            id: id.into(),
            namespace: ns.into(),
            name: name.into(),
            ..Pod::default()
        }
    }
    fn ctr(id: &str, pod: &str, name: &str) -> Container {
        Container {
            id: id.into(),
            pod_id: pod.into(),
            name: name.into(),
            ..Container::default()
        }
    }

    #[test]
    fn rebuild_replaces_everything() {
        let mut m = Model::default();
        m.upsert_pod(pod("old", "ns", "old"));
        m.upsert_container(ctr("c-old", "old", "x"));
        m.rebuild(vec![pod("p1", "ns", "a")], vec![ctr("c1", "p1", "app")]);
        assert!(m.pod("old").is_none());
        assert!(m.container("c-old").is_none());
        assert_eq!((m.pod_count(), m.container_count()), (1, 1));
    }

    #[test]
    fn removing_a_pod_removes_its_containers() {
        let mut m = Model::default();
        m.rebuild(
            vec![pod("p1", "ns", "a"), pod("p2", "ns", "b")],
            vec![ctr("c1", "p1", "x"), ctr("c2", "p2", "y")],
        );
        m.remove_pod("p1");
        assert!(m.container("c1").is_none());
        assert!(m.container("c2").is_some());
    }

    #[test]
    fn snapshot_is_sorted_and_groups_containers() {
        let mut m = Model::default();
        m.rebuild(
            vec![pod("p2", "b", "z"), pod("p1", "a", "y")],
            vec![
                ctr("c3", "p2", "web"),
                ctr("c1", "p1", "sidecar"),
                ctr("c2", "p1", "app"),
                ctr("c9", "gone", "orphan"),
            ],
        );
        let snap = m.snapshot();
        let names: Vec<_> = snap.iter().map(|v| v.pod.full_name()).collect();
        assert_eq!(names, ["<unknown pod>", "a/y", "b/z"]);
        let a: Vec<_> = snap[1].containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(a, ["app", "sidecar"]);
    }

    #[test]
    fn apply_resources_merges_into_known_container_only() {
        let mut m = Model::default();
        m.upsert_container(ctr("c1", "p1", "x"));
        let upd = LinuxResources {
            pids_limit: Some(5),
            ..Default::default()
        };
        assert!(m.apply_resources("c1", &upd));
        assert!(!m.apply_resources("nope", &upd));
        assert_eq!(
            m.container("c1")
                .unwrap()
                .resources
                .as_ref()
                .unwrap()
                .pids_limit,
            Some(5)
        );
    }
}
