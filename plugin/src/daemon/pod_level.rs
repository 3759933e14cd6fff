//! Pod-level resources (KEP-5419) resized in place. kubelet writes the pod cgroup first, then
//! calls CRI `UpdatePodSandboxResources` ("called after the Kubelet reconfigures the pod-level
//! cgroups ... best effort", cri-api `services.go`); containerd ≥ 2.3 relays it as NRI
//! `UpdatePodSandbox` (a plugin error fails the CRI call, which kubelet logs) and, once its
//! sandbox store holds the new values, `PostUpdatePodSandbox`.
//!
//! On `UpdatePodSandbox` the handler reads the pod cgroup and the node (off the async workers,
//! bounded by [`READ_BUDGET`]), admits the request ([`admit_pod_level`]) and records desired,
//! actual and the verdict; in `enforce` mode (or when the pod's annotation tightens to it) a
//! refused request is answered with a [`Rejection`]. On `PostUpdatePodSandbox` the pod cgroup is
//! read back and compared with what was asked, as containers are confirmed.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::handler::{ModelHandler, NodeState};
use super::observe::now_ms;
use super::pod_read::read_pod;
use crate::config::{Mode, ResizeConfig};
use crate::model::{ContainerState, LinuxResources, Pod, PodLimits};
use crate::nri::Rejection;
use crate::policy::{
    admit_pod_level, cpu_quantity, effective_enforce, memory_quantity, with_overhead, Admission,
    Limits, ResizeState,
};
use crate::sync::{Locked as _, ReadWriteLocked as _};

/// Desired vs actual of one pod's pod-level resources, and where its last resize stands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodLevelStatus {
    /// The pod cgroup's limits the last `UpdatePodSandbox` asked for: the pod-level limits
    /// plus the pod overhead, as kubelet writes them.
    pub desired: PodLimits,
    /// The overhead part of `desired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<PodLimits>,
    /// The pod cgroup's limits when last read.
    pub actual: Option<PodLimits>,
    /// The pod cgroup's memory usage when last read, in bytes.
    pub memory_usage: Option<u64>,
    /// Whether actual equals desired; `None`: not read back.
    pub matches: Option<bool>,
    /// `None`: nothing pending (confirmed).
    pub state: Option<ResizeState>,
    #[serde(default)]
    pub reason: String,
    /// Why the pod cgroup could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub updated_ms: u64,
}

/// `500m/128Mi`, `max` for unlimited.
pub fn limits_text(l: &PodLimits) -> String {
    format!(
        "{}/{}",
        l.cpu_millis.map_or_else(|| "max".into(), cpu_quantity),
        l.memory_bytes.map_or_else(|| "max".into(), memory_quantity)
    )
}

impl NodeState {
    /// Pod-level records by pod id.
    pub fn pod_levels(&self) -> HashMap<String, PodLevelStatus> {
        self.pod_level.locked().clone()
    }

    fn pod_level<R>(&self, f: impl FnOnce(&mut HashMap<String, PodLevelStatus>) -> R) -> R {
        f(&mut self.pod_level.locked())
    }

    /// Forgets a pod's record and series.
    pub(crate) fn forget_pod_level(&self, pod: &Pod) {
        if self.pod_level(|m| m.remove(&pod.id)).is_some() {
            self.metrics.pod.remove(&pod.namespace, &pod.name);
        }
    }

    /// Keeps the records of `pods` only (after `Synchronize`).
    pub(crate) fn retain_pod_levels(&self, pods: &[Pod]) {
        let gone: Vec<Pod> = self.read_model(|m| {
            self.pod_level(|l| {
                l.keys()
                    .filter(|id| !pods.iter().any(|p| &p.id == *id))
                    .filter_map(|id| m.pod(id).cloned())
                    .collect()
            })
        });
        for p in &gone {
            self.forget_pod_level(p);
        }
        self.pod_level(|l| l.retain(|id, _| pods.iter().any(|p| &p.id == id)));
    }
}

impl ModelHandler {
    /// Admits an `UpdatePodSandbox` and records it; `Err` when it is refused and enforced.
    pub(super) async fn admit_pod_update(
        &self,
        pod: &Pod,
        overhead: Option<&LinuxResources>,
        resources: &LinuxResources,
    ) -> Result<(), Rejection> {
        let state = self.state();
        let cfg = state.config.read_locked().clone();
        let read = read_pod(
            state.cgroups.clone(),
            self.node_reader().cloned(),
            pod.cgroup_parent.clone(),
            cfg.resize.clone(),
        )
        .await;
        let overhead = overhead.or(pod.overhead.as_ref());
        let asked = Limits::from_linux(resources);
        let extra = overhead.map(Limits::from_linux).unwrap_or_default();
        let cgroup = with_overhead(&asked, &extra);
        let desired = PodLimits {
            cpu_millis: cgroup.cpu.value(),
            memory_bytes: cgroup.memory.value(),
        };
        let containers: BTreeMap<String, Limits> = state.read_model(|m| {
            m.containers()
                .filter(|c| c.pod_id == pod.id && c.state != ContainerState::Stopped)
                .map(|c| {
                    let l = c.resources.as_ref().map(Limits::from_linux);
                    (c.name.clone(), l.unwrap_or_default())
                })
                .collect()
        });
        let (actual, usage, error) = match read.actual {
            Ok((a, u)) => (Some(a), u, None),
            Err(e) => (None, None, Some(e)),
        };
        let verdict = admit_pod_level(
            &read.node.unwrap_or_default(),
            &asked,
            &extra,
            &containers,
            usage,
        );
        let (enforce, annotation) =
            effective_enforce(cfg.resize.mode == Mode::Enforce, &pod.annotations);
        if let Some(e) = annotation {
            warn!(pod = %pod.full_name(), error = %e, "pod annotation ignored");
            state.metrics.annotation_error();
        }
        let status = verdict.resize_status();
        let record = PodLevelStatus {
            desired,
            overhead: overhead.map(PodLimits::from_linux),
            actual,
            memory_usage: usage,
            matches: None,
            state: Some(status.state),
            reason: status.reason.clone(),
            error,
            updated_ms: now_ms(),
        };
        state
            .metrics
            .pod
            .set_desired(&pod.namespace, &pod.name, desired);
        if let Some(a) = actual {
            state.metrics.pod.set_actual(&pod.namespace, &pod.name, a);
        }
        state.pod_level(|m| m.insert(pod.id.clone(), record));
        if verdict == Admission::Fits {
            info!(pod = %pod.full_name(), desired = %limits_text(&desired), "pod-level resize admitted");
            return Ok(());
        }
        info!(pod = %pod.full_name(), state = ?status.state, reason = %status.reason, enforce, "pod-level resize not admitted");
        if enforce {
            return Err(Rejection(format!(
                "pod-level resize of {} is {:?}: {}",
                pod.full_name(),
                status.state,
                status.reason
            )));
        }
        Ok(())
    }

    /// After `PostUpdatePodSandbox`: reads the pod cgroup back and compares it with desired.
    pub(super) async fn confirm_pod(&self, pod: &Pod) {
        let state = self.state();
        let Some(desired) = state.pod_level(|m| m.get(&pod.id).map(|r| r.desired)) else {
            return;
        };
        let reserve = ResizeConfig::default();
        let read = read_pod(
            state.cgroups.clone(),
            None,
            pod.cgroup_parent.clone(),
            reserve,
        )
        .await;
        let mut drift = None;
        state.pod_level(|m| {
            let Some(r) = m.get_mut(&pod.id) else { return };
            r.updated_ms = now_ms();
            match read.actual {
                Ok((actual, usage)) => {
                    r.actual = Some(actual);
                    r.memory_usage = usage;
                    r.error = None;
                    r.matches = Some(actual == desired);
                    if actual == desired && r.state == Some(ResizeState::InProgress) {
                        r.state = None;
                        r.reason.clear();
                    } else {
                        drift = Some(actual);
                    }
                    state
                        .metrics
                        .pod
                        .set_actual(&pod.namespace, &pod.name, actual);
                }
                Err(e) => {
                    r.matches = None;
                    r.error = Some(e);
                }
            }
        });
        if let Some(actual) = drift {
            warn!(
                pod = %pod.full_name(),
                desired = %limits_text(&desired),
                actual = %limits_text(&actual),
                "pod-level resize not in effect: desired and actual differ"
            );
        }
    }
}

#[cfg(test)]
mod tests;
