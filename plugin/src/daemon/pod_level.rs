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

use std::collections::BTreeMap;

use tracing::{info, warn};

use super::handler::ModelHandler;
use super::pod_read::read_pod;
use crate::clock::now_ms;
use crate::config::Mode;
use crate::model::{ContainerState, LinuxResources, Pod, PodLimits};
use crate::nri::Rejection;
use crate::policy::{
    admit_pod_level, effective_enforce, with_overhead, Admission, Limits, ResizeState,
};
use crate::state::{limits_text, NodeReserve, PodLevelStatus};
use crate::sync::ReadWriteLocked as _;

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
        let snapshot = state.capacity.read_locked().clone();
        let read = read_pod(
            state.cgroups.clone(),
            self.node_reader().cloned(),
            snapshot,
            pod.cgroup_parent.clone(),
            state.node_reserve(),
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
            Err(e) => (None, None, Some(e.to_string())),
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
        let read = read_pod(
            state.cgroups.clone(),
            None,
            None,
            pod.cgroup_parent.clone(),
            NodeReserve::default(),
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
                    r.error = Some(e.to_string());
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
