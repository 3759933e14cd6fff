//! Admission of a resize against the node: the pod's new demand, every other running container's
//! demand, and the node's capacity ([`crate::policy::admit`]).

use std::collections::BTreeMap;

use tracing::warn;

use super::Engine;
use crate::model::Pod;
use crate::policy::{
    admit, Admission, Allocated, ContainerAllocation, CpuSet, PodAllocation, Quantities,
};
use crate::sync::ReadWriteLocked as _;

impl Engine {
    pub(super) fn admission(&self, pod: &Pod, desired: &BTreeMap<String, Quantities>) -> Admission {
        self.admission_with(pod, None, desired)
    }

    /// Admission with the pod's own allocation given (`None`: as the model has it).
    pub(super) fn admission_with(
        &self,
        pod: &Pod,
        this_pod: Option<&PodAllocation>,
        desired: &BTreeMap<String, Quantities>,
    ) -> Admission {
        // The capacity watcher's snapshot: no file read on an update.
        let snapshot = self.state.capacity.read_locked().clone();
        let node = match self
            .node
            .capacity_with(snapshot.as_ref(), self.state.node_reserve())
        {
            Ok(n) => n,
            Err(e) => {
                warn!(error = %e, "node capacity unknown; admitting without node checks");
                return Admission::Fits;
            }
        };
        self.state.read_model(|m| {
            let mut others = Allocated::default();
            let mut this = PodAllocation::default();
            for c in m.containers() {
                let q = c
                    .resources
                    .as_ref()
                    .map(Quantities::from_linux)
                    .unwrap_or_default();
                // One-container (kubelet) updates: the QoS class is judged on the resized
                // container itself, siblings count as other demand — requests inferred from CPU
                // shares drift when a runtime ignores shares in NRI updates (containerd 1.7).
                if c.pod_id == pod.id && (this_pod.is_some() || desired.contains_key(&c.name)) {
                    if this_pod.is_none() {
                        let cpuset = c
                            .resources
                            .as_ref()
                            .and_then(|r| r.cpu.as_ref())
                            .map(|c| c.cpus.as_str())
                            .filter(|s| !s.is_empty());
                        let cpuset = cpuset
                            .and_then(|s| CpuSet::parse(s).ok())
                            .unwrap_or_default();
                        this.containers.insert(
                            c.name.clone(),
                            ContainerAllocation {
                                quantities: q,
                                cpuset,
                            },
                        );
                    }
                } else if matches!(
                    c.state,
                    crate::model::ContainerState::Running | crate::model::ContainerState::Created
                ) {
                    others = others.saturating_add(Allocated::of(&q));
                }
            }
            this.overhead = pod
                .overhead
                .as_ref()
                .map(Quantities::from_linux)
                .unwrap_or_default();
            if let Some(given) = this_pod {
                this.containers.clone_from(&given.containers);
            }
            admit(&node, &others, &this, desired)
        })
    }
}
