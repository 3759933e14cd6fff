//! The kubelet update path: one container's `UpdateContainer`, decided by the resize policy,
//! admitted against the node, a memory decrease below usage staged, and the pod cgroup raised
//! first where KEP ordering needs it.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::{error, info, warn};

use super::{decrease, Engine};
use crate::config::Mode;
use crate::model::{Container, LinuxResources, Pod};
use crate::nri::{Rejection, UpdateReply};
use crate::policy::{
    changes, decide, parse_effective_policy, plan_single, Admission, Decision, Limits, Quantities,
    ResizeState, Step,
};

impl Engine {
    /// A kubelet-driven `UpdateContainer`: see the module docs. Runs inside the NRI handler:
    /// in-memory decisions and at most two cgroupfs writes, well within the deadline.
    pub fn on_update(
        self: &Arc<Self>,
        pod: &Pod,
        ctr: &Container,
        requested: &LinuxResources,
    ) -> Result<UpdateReply, Rejection> {
        let cfg = self.config();
        let enforce = cfg.resize.mode == Mode::Enforce;
        let allocated = ctr.resources.clone().unwrap_or_default();
        let mut desired = allocated.clone();
        desired.merge(requested);
        // kubelet re-sending a decrease that is staged or was deferred: answered with its
        // progress or reason (kubelet's PodResizeInProgress message); a newer update supersedes.
        if let Some(answer) = self.repeated_decrease(pod, ctr, requested, &desired, &allocated) {
            return Err(answer);
        }
        let resolved = parse_effective_policy(&pod.annotations, &ctr.name, &cfg.policy);
        for e in &resolved.errors {
            warn!(pod = %pod.full_name(), container = %ctr.name, error = %e, "resize annotation ignored");
            self.state.metrics.annotation_error();
        }
        let (from, to) = (
            Quantities::from_linux(&allocated),
            Quantities::from_linux(&desired),
        );
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        let timer = self.state.metrics.resize_timer(&changes(&from, &to));
        match decide(&from, &to, &resolved.policy) {
            Decision::NoChange => {
                self.record(pod, ctr, Some(&desired), None, "");
                return Ok(UpdateReply::default());
            }
            Decision::Restart { reason } => {
                let reason = format!("restart required: {reason}");
                timer.finish("restart");
                return Ok(self.restart_reply(pod, ctr, &desired, allocated, &reason, enforce));
            }
            Decision::Reject { reason } => {
                info!(container = %subject, %reason, enforce, "resize rejected by policy");
                self.record(pod, ctr, Some(&desired), Some(ResizeState::Error), &reason);
                self.state.metrics.resize_outcome("rejected");
                timer.finish("rejected");
                if enforce {
                    return Err(Rejection(format!("resize of {subject} refused: {reason}")));
                }
                return Ok(UpdateReply::default());
            }
            Decision::InPlace => {}
        }
        let verdict = self.admission(pod, &BTreeMap::from([(ctr.name.clone(), to)]));
        if let Admission::Deferred { reason } | Admission::Infeasible { reason } = &verdict {
            let state = verdict.resize_status().state;
            info!(container = %subject, ?state, %reason, enforce, "resize not admitted");
            self.record(pod, ctr, Some(&desired), Some(state), reason);
            let outcome = if state == ResizeState::Deferred {
                "deferred"
            } else {
                "infeasible"
            };
            self.state.metrics.resize_outcome(outcome);
            timer.finish(outcome);
            if enforce {
                return Err(Rejection(format!(
                    "resize of {subject} is {state:?}: {reason}"
                )));
            }
            return Ok(UpdateReply::default());
        }
        let mut interim = None;
        match self.decide_decrease(pod, ctr, &allocated, &desired) {
            decrease::DecreaseVerdict::Direct => {}
            decrease::DecreaseVerdict::Interim(limit) => interim = Some(limit),
            decrease::DecreaseVerdict::Reject(reason) => {
                info!(container = %subject, %reason, enforce, "memory decrease rejected");
                self.record(
                    pod,
                    ctr,
                    Some(&desired),
                    Some(ResizeState::Deferred),
                    &reason,
                );
                self.state.metrics.resize_outcome("deferred");
                timer.finish("deferred");
                if enforce {
                    return Err(Rejection(format!("resize of {subject} refused: {reason}")));
                }
                return Ok(UpdateReply::default());
            }
            decrease::DecreaseVerdict::Restart(reason) => {
                timer.finish("restart");
                return Ok(self.restart_reply(pod, ctr, &desired, allocated, &reason, enforce));
            }
        }
        if enforce && self.cgroups.is_some() {
            self.raise_pod_first(pod, ctr, &desired, &subject)?;
        }
        if let Some(limit) = interim {
            timer.finish("in_place");
            return Ok(self.start_staged_decrease(pod, ctr, &desired, limit));
        }
        self.record(pod, ctr, Some(&desired), Some(ResizeState::InProgress), "");
        self.state.metrics.resize_outcome("in_place");
        timer.finish("in_place");
        Ok(UpdateReply::default())
    }

    /// KEP ordering on the kubelet path: when the container's new limit needs a larger pod
    /// cgroup first (cgroup v1 `EINVAL`, kubernetes/kubernetes#127356), the pod cgroup is raised
    /// before the runtime writes the container. A pod cgroup that cannot be read, or no plan,
    /// leaves the runtime to write as asked; a failed raise refuses the update.
    fn raise_pod_first(
        &self,
        pod: &Pod,
        ctr: &Container,
        desired: &LinuxResources,
        subject: &str,
    ) -> Result<(), Rejection> {
        match self.current_pod(pod) {
            Ok(current) => match plan_single(
                &current,
                &ctr.name,
                &Limits::from_linux(desired),
                &self.plan_options(),
            ) {
                Ok(Some(Step::SetPod(raise))) => {
                    if let Err(e) = self.write_pod(pod, &raise) {
                        error!(container = %subject, error = %e, "raising the pod cgroup before the container failed");
                        self.record(
                            pod,
                            ctr,
                            Some(desired),
                            Some(ResizeState::Error),
                            &e.to_string(),
                        );
                        return Err(Rejection(format!(
                            "resize of {subject}: raising the pod cgroup first failed: {e}"
                        )));
                    }
                    info!(container = %subject, step = %Step::SetPod(raise), "pod cgroup raised before the container (KEP ordering)");
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(container = %subject, error = %e, "no ordering plan; the runtime writes as asked");
                }
            },
            Err(e) => {
                warn!(container = %subject, error = %e, "pod cgroup unreadable; the runtime writes as asked");
            }
        }
        Ok(())
    }
}
