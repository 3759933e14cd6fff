//! A resize that needs a restart: the container keeps its resources, is evicted, and is stopped
//! through [`super::restart`]; its progress shows in the record, the log and the metrics.

use std::sync::Arc;

use tracing::{error, info, warn};

use super::reply::keep_reply;
use super::{restart, Engine};
use crate::cgroup::{container_path, CgroupIo};
use crate::clock::now_ms;
use crate::metrics::RestartOutcome;
use crate::model::{Container, LinuxResources, Pod};
use crate::nri::{ContainerUpdate, Eviction, UpdateReply};
use crate::policy::ResizeState;

impl Engine {
    /// Keeps the container as it is (no in-place write) and evicts it (when enforcing): the
    /// orchestrator recreates it with the new resources.
    pub(super) fn restart_reply(
        self: &Arc<Self>,
        pod: &Pod,
        ctr: &Container,
        desired: &LinuxResources,
        allocated: &LinuxResources,
        reason: &str,
        enforce: bool,
    ) -> UpdateReply {
        let subject = format!("{}/{}", pod.full_name(), ctr.name);
        info!(container = %subject, %reason, enforce, "resize needs a restart");
        self.record(
            pod,
            ctr,
            Some(desired),
            Some(ResizeState::InProgress),
            reason,
        );
        self.state.metrics.resize_outcome("restart");
        if !enforce {
            return UpdateReply::default();
        }
        self.restart_container(ctr, &subject, reason);
        // Only the fields the request changes are put back (NRI gives each field one owner).
        let keep = keep_reply(allocated, desired);
        UpdateReply {
            updates: (keep != LinuxResources::default())
                .then(|| ContainerUpdate {
                    container_id: ctr.id.clone(),
                    resources: keep,
                    ignore_failure: true,
                })
                .into_iter()
                .collect(),
            evictions: vec![Eviction {
                container_id: ctr.id.clone(),
                reason: format!("nri-resize: {reason}"),
            }],
        }
    }

    /// Stops the container for its restart ([`restart`]): on every runtime, since none carries
    /// out a plugin's NRI eviction; confirmed from the runtime's events and retried when it was not.
    fn restart_container(self: &Arc<Self>, ctr: &Container, subject: &str, reason: &str) {
        // The runtime answers within its request timeout (plus a margin for its own writes).
        let update_wait = self.link.status().runtime.map(|r| {
            let t = r.request_timeout();
            t + t / 4
        });
        let target = restart::Target {
            container_id: ctr.id.clone(),
            subject: subject.to_string(),
            pid: ctr.pid.filter(|p| *p > 1),
            cgroup: container_path(&ctr.cgroups_path).ok(),
            reason: reason.to_string(),
            update_wait,
        };
        let cgroups = self
            .cgroups
            .clone()
            .map(|c| Arc::new(c) as Arc<dyn CgroupIo>);
        let engine = Arc::downgrade(self);
        let report: restart::Report = Arc::new(move |t, p| {
            if let Some(engine) = engine.upgrade() {
                engine.restart_progress(t, p);
            }
        });
        if self.restarts.request(target, cgroups, report) {
            self.state.metrics.restart.started();
        }
    }

    /// A restart's progress, where people look: the log, the resize record (`status`,
    /// `/v1/resizes`) and `nri_resize_restarts_total`.
    fn restart_progress(&self, t: &restart::Target, p: &restart::Progress) {
        use restart::Progress as P;
        let m = &self.state.metrics.restart;
        let (state, reason) = match p {
            P::Confirmed { attempt } => {
                info!(container = %t.subject, attempt, "container stopped for its restart (exit confirmed by the runtime)");
                m.outcome(RestartOutcome::Confirmed);
                m.ended();
                (
                    None,
                    format!(
                        "{}; restarted: the container exited and the runtime confirmed the stop",
                        t.reason
                    ),
                )
            }
            P::Retrying {
                attempt,
                of,
                error,
                delay,
            } => {
                warn!(container = %t.subject, attempt, of, %error, ?delay, "restart not confirmed; retrying");
                m.outcome(RestartOutcome::Retried);
                (
                    Some(ResizeState::InProgress),
                    format!(
                        "{}; restart not confirmed (attempt {attempt} of {of}): {error}; retrying in {delay:?}",
                        t.reason
                    ),
                )
            }
            P::Failed { attempts, error } => {
                error!(container = %t.subject, attempts, %error, "restart failed: the container was not restarted");
                m.outcome(RestartOutcome::Failed);
                m.ended();
                (
                    Some(ResizeState::Error),
                    format!(
                        "{}; restart failed after {attempts} attempts: {error}",
                        t.reason
                    ),
                )
            }
        };
        self.records.update_container(&t.container_id, |r| {
            r.state = state;
            r.reason = reason;
            r.updated_ms = now_ms();
        });
    }

    /// The runtime reported the container stopped (a restart waiting for it is confirmed).
    pub fn container_stopped(&self, id: &str) {
        self.restarts.note(id, restart::Seen::Stopped);
        // Its cgroup is going: a staged decrease has nothing left to reclaim or to apply.
        self.reclaims
            .end(id, "container stopped: staged memory decrease ended");
    }
}
