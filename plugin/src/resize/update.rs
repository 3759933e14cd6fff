//! The kubelet update path: one container's `UpdateContainer`, decided by the resize policy,
//! admitted against the node, a memory decrease below usage refused (never answered with another
//! limit: [`super::decrease`]), and the pod cgroup raised first where KEP ordering needs it.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::{error, info, warn};

use super::late::too_late;
use super::{decrease, Engine};
use crate::config::Mode;
use crate::model::{Container, LinuxResources, Pod};
use crate::nri::{Deadline, Rejection, UpdateReply};
use crate::policy::{
    changes, decide, parse_effective_policy, plan_single, Admission, Decision, Limits, Quantities,
    ResizeState, Step,
};

impl Engine {
    /// A kubelet-driven `UpdateContainer`: see the module docs. Runs for the NRI handler on a
    /// blocking thread, sharing the runtime's `deadline`: cgroup reads first, then at most the
    /// pod cgroup's raise; every outcome that depends on the answer reaching the runtime (a
    /// refusal recorded, a restart, a background reclaim) commits the deadline first, and acts on
    /// nothing when the runtime was already answered fail-open (`resize::late`).
    pub fn on_update(
        self: &Arc<Self>,
        pod: &Pod,
        ctr: &Container,
        requested: &LinuxResources,
        deadline: &Deadline,
    ) -> Result<UpdateReply, Rejection> {
        let cfg = self.config();
        let enforce = cfg.resize.mode == Mode::Enforce;
        let allocated = ctr.resources.clone().unwrap_or_default();
        let mut desired = allocated.clone();
        desired.merge(requested);
        // kubelet retrying a refused decrease while its page cache is reclaimed (or one a
        // whole-pod step staged): answered with the progress (kubelet's PodResizeInProgress
        // message) until usage fits; a newer update supersedes.
        if let Some(answer) =
            self.repeated_decrease(pod, ctr, requested, &desired, &allocated, deadline)
        {
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
        // A refusal: recorded with its state and reason, counted, and told to the runtime when
        // enforcing (in observe mode the runtime writes as asked).
        let refuse = |state: ResizeState, reason: &str, outcome: &'static str, message: String| {
            self.record(pod, ctr, Some(&desired), Some(state), reason);
            self.state.metrics.resize_outcome(outcome);
            if enforce {
                Err(Rejection(message))
            } else {
                Ok(UpdateReply::default())
            }
        };
        match decide(&from, &to, &resolved.policy) {
            Decision::NoChange => {
                self.record(pod, ctr, Some(&desired), None, "");
                return Ok(UpdateReply::default());
            }
            Decision::Restart { reason } => {
                too_late(&subject, deadline)?;
                let reason = format!("restart required: {reason}");
                timer.finish("restart");
                return Ok(self.restart_reply(pod, ctr, &desired, &allocated, &reason, enforce));
            }
            Decision::Reject { reason } => {
                too_late(&subject, deadline)?;
                info!(container = %subject, %reason, enforce, "resize rejected by policy");
                timer.finish("rejected");
                let message = format!("resize of {subject} refused: {reason}");
                return refuse(ResizeState::Error, &reason, "rejected", message);
            }
            Decision::InPlace => {}
        }
        let verdict = self.admission(pod, &BTreeMap::from([(ctr.name.clone(), to)]));
        if let Admission::Deferred { reason } | Admission::Infeasible { reason } = &verdict {
            too_late(&subject, deadline)?;
            let state = verdict.resize_status().state;
            info!(container = %subject, ?state, %reason, enforce, "resize not admitted");
            let outcome = verdict.outcome().unwrap_or("deferred");
            timer.finish(outcome);
            let message = format!("resize of {subject} is {state:?}: {reason}");
            return refuse(state, reason, outcome, message);
        }
        match self.decide_decrease(pod, ctr, &allocated, &desired, deadline) {
            decrease::DecreaseVerdict::Direct => {}
            // Never answered with another limit on kubelet's path: refused below usage.
            decrease::DecreaseVerdict::BelowUsage(used) => {
                too_late(&subject, deadline)?;
                timer.finish("deferred");
                return self.refuse_below_usage(pod, ctr, &desired, &allocated, &used, enforce);
            }
            // `decide_decrease` turns the strategy's reclaim into `BelowUsage`; were one to come
            // through, it is refused all the same.
            decrease::DecreaseVerdict::Reclaim => {
                too_late(&subject, deadline)?;
                timer.finish("deferred");
                let reason = "memory decrease below usage".to_string();
                let message = format!("resize of {subject} refused: {reason}");
                return refuse(ResizeState::Deferred, &reason, "deferred", message);
            }
            decrease::DecreaseVerdict::Reject(reason) => {
                too_late(&subject, deadline)?;
                info!(container = %subject, %reason, enforce, "memory decrease rejected");
                timer.finish("deferred");
                let message = format!("resize of {subject} refused: {reason}");
                return refuse(ResizeState::Deferred, &reason, "deferred", message);
            }
            decrease::DecreaseVerdict::Restart(reason) => {
                too_late(&subject, deadline)?;
                timer.finish("restart");
                return Ok(self.restart_reply(pod, ctr, &desired, &allocated, &reason, enforce));
            }
        }
        // The raise is harmless when late, but skipped once the runtime was answered. Only a
        // limit that grows can need a larger pod cgroup first: a decrease skips the pod read.
        let grows = (
            to.cpu.limit > from.cpu.limit,
            to.memory.limit > from.memory.limit,
        );
        if enforce && (grows.0 || grows.1) && self.cgroups.is_some() && !deadline.expired() {
            self.raise_pod_first(pod, ctr, &desired, grows, &subject)?;
        }
        too_late(&subject, deadline)?;
        self.record(pod, ctr, Some(&desired), Some(ResizeState::InProgress), "");
        self.state.metrics.resize_outcome("in_place");
        timer.finish("in_place");
        Ok(UpdateReply::default())
    }

    /// KEP ordering on the kubelet path: when the container's new limit needs a larger pod
    /// cgroup first (cgroup v1 `EINVAL`, kubernetes/kubernetes#127356), the pod cgroup is raised
    /// before the runtime writes the container. A pod cgroup that cannot be read, or no plan,
    /// leaves the runtime to write as asked; a failed raise refuses the update. Only the pod
    /// cgroup's files of the resources that grow are read.
    fn raise_pod_first(
        &self,
        pod: &Pod,
        ctr: &Container,
        desired: &LinuxResources,
        (cpu_grows, memory_grows): (bool, bool),
        subject: &str,
    ) -> Result<(), Rejection> {
        match self.current_pod_for(pod, cpu_grows, memory_grows) {
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
