//! The whole-pod executor: drives a pod to its target one planned step at a time (pod cgroup
//! through cgroupfs, containers through NRI `UpdateContainers`), re-planning from the cgroups'
//! actual values after every step, so a newer request takes over mid-resize and a resumed resize
//! never applies a step twice.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::pod_cgroup::update_resources;
use super::pod_checkpoint::checkpoint_key;
use super::records::{from_snapshot, snapshot};
use super::{Engine, PodResize, ResizeError, SnapshotLimits, StepRecord};
use crate::model::Pod;
use crate::nri::ContainerUpdate;
use crate::policy::{check_invariants, plan, Limit, ResizeState, Step};
use crate::sync::Locked as _;

/// Why a step of a whole-pod resize did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StepFailure {
    /// Retried with backoff.
    Failed(String),
    /// Cannot be done now (e.g. memory that cannot be reclaimed): the resize stops, Deferred.
    Deferred(String),
    /// A newer request took over: re-plan at once.
    Superseded,
}

impl fmt::Display for StepFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(e) | Self::Deferred(e) => f.write_str(e),
            Self::Superseded => f.write_str("superseded by a newer request"),
        }
    }
}

impl Engine {
    /// Drives `pod` to `target` (the latest target wins if another request arrives meanwhile).
    pub(super) async fn run(
        self: &Arc<Self>,
        pod: Pod,
        target: SnapshotLimits,
        resumed: bool,
    ) -> Result<PodResize, ResizeError> {
        let running = {
            let mut targets = self.targets.locked();
            let running = targets.get(&pod.id).is_some_and(|(_, r)| *r);
            targets.insert(pod.id.clone(), (target.clone(), true));
            running
        };
        if running {
            // A reclaim for the older target must not hold the newer one up.
            self.supersede_pod_reclaims(&pod.id);
            return self.wait_for(&pod.id, &target).await;
        }
        let result = self.execute(&pod, resumed).await.and_then(|r| {
            if r.target == target {
                Ok(r)
            } else {
                Err(ResizeError::Failed(
                    "superseded by a newer resize request, which was applied instead".into(),
                ))
            }
        });
        self.targets.locked().remove(&pod.id);
        if let Some(store) = &self.checkpoints {
            if let Err(e) = store.remove(&checkpoint_key(&pod.id)) {
                warn!(pod = %pod.full_name(), error = %e, "cannot remove the resize checkpoint");
            }
        }
        result
    }

    /// Another executor runs for this pod and picked up `target`: wait until it is done.
    async fn wait_for(
        &self,
        pod_id: &str,
        target: &SnapshotLimits,
    ) -> Result<PodResize, ResizeError> {
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if !self.targets.locked().contains_key(pod_id) {
                let r = self.pods.locked().get(pod_id).cloned().unwrap_or_default();
                return if r.state.is_none() && &r.target == target {
                    Ok(r)
                } else {
                    Err(ResizeError::Failed(format!(
                        "superseded or failed: {}",
                        r.reason
                    )))
                };
            }
        }
    }

    #[expect(
        clippy::too_many_lines,
        reason = "the executor's loop read top to bottom: plan, step, read back, react"
    )]
    async fn execute(self: &Arc<Self>, pod: &Pod, resumed: bool) -> Result<PodResize, ResizeError> {
        let cfg = self.config();
        let opts = self.plan_options();
        let full = pod.full_name();
        let mut backoff = Duration::from_millis(100);
        let mut attempts = 0u32;
        let mut record = PodResize {
            pod_id: pod.id.clone(),
            pod: full.clone(),
            resumed,
            state: Some(ResizeState::InProgress),
            ..PodResize::default()
        };
        'replan: loop {
            let target = self
                .targets
                .locked()
                .get(&pod.id)
                .map(|(t, _)| t.clone())
                .unwrap_or_default();
            record.target = target.clone();
            self.pods.locked().insert(pod.id.clone(), record.clone());
            let current = self
                .current_pod(pod)
                .map_err(|message| ResizeError::Cgroup {
                    pod: full.clone(),
                    message,
                })?;
            let steps = match plan(&current, &from_snapshot(&target), &opts) {
                Ok(p) => p.steps,
                Err(e) => {
                    record.state = Some(ResizeState::Error);
                    record.reason = format!("no safe plan: {e}");
                    self.pods.locked().insert(pod.id.clone(), record.clone());
                    return Err(ResizeError::Failed(record.reason));
                }
            };
            if steps.is_empty() {
                record.state = None;
                record.reason.clear();
                self.pods.locked().insert(pod.id.clone(), record.clone());
                info!(pod = %full, steps = record.steps.len(), attempts, "whole-pod resize done");
                self.state.metrics.resize_outcome("in_place");
                return Ok(record);
            }
            for step in steps {
                if self
                    .targets
                    .locked()
                    .get(&pod.id)
                    .is_some_and(|(t, _)| t != &target)
                {
                    info!(pod = %full, "newer resize request: re-planning from the current state");
                    continue 'replan;
                }
                let outcome = self.apply_step(pod, &step).await;
                let actual = self.actual_pod(pod);
                let violation = actual
                    .as_ref()
                    .and_then(|a| check_invariants(a, &opts).err())
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                let target_name = match &step {
                    Step::SetPod(_) => "pod".to_string(),
                    Step::SetContainer { name, .. } => name.clone(),
                };
                record.steps.push(StepRecord {
                    target: target_name,
                    step: step.to_string(),
                    ok: outcome.is_ok(),
                    error: outcome
                        .as_ref()
                        .err()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    actual: actual.as_ref().map(snapshot),
                    violation,
                });
                self.pods.locked().insert(pod.id.clone(), record.clone());
                match outcome {
                    Err(StepFailure::Superseded) => continue 'replan,
                    Err(StepFailure::Deferred(reason)) => {
                        warn!(pod = %full, step = %step, %reason, "resize deferred");
                        record.state = Some(ResizeState::Deferred);
                        record.reason.clone_from(&reason);
                        self.pods.locked().insert(pod.id.clone(), record.clone());
                        self.state.metrics.resize_outcome("deferred");
                        return Err(ResizeError::Refused {
                            state: ResizeState::Deferred,
                            reason,
                        });
                    }
                    _ => {}
                }
                if let Err(e) = outcome {
                    attempts += 1;
                    warn!(pod = %full, step = %step, error = %e, attempts, "resize step failed; backing off");
                    if attempts >= cfg.resize.max_attempts {
                        record.state = Some(ResizeState::Error);
                        record.reason = format!("step {step} failed {attempts} times: {e}");
                        record.attempts = attempts;
                        self.pods.locked().insert(pod.id.clone(), record.clone());
                        self.state.metrics.resize_outcome("error");
                        return Err(ResizeError::Failed(record.reason));
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    record.attempts = attempts;
                    continue 'replan;
                }
                if cfg.resize.step_pause_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(cfg.resize.step_pause_ms)).await;
                }
            }
        }
    }

    async fn apply_step(&self, pod: &Pod, step: &Step) -> Result<(), StepFailure> {
        match step {
            Step::SetPod(u) => self.write_pod(pod, u).map_err(StepFailure::Failed),
            Step::SetContainer { name, update } => {
                let ctr = self
                    .state
                    .read_model(|m| {
                        m.containers()
                            .filter(|c| c.pod_id == pod.id)
                            .find(|c| &c.name == name)
                            .cloned()
                    })
                    .ok_or_else(|| StepFailure::Failed(format!("container {name} is gone")))?;
                // A memory decrease below usage: reclaim first (the pod cgroup, lowered by a
                // later step, waits for it).
                if let Some(Limit::Limited(target)) = update.memory {
                    self.reclaim_before_step(pod, &ctr, target).await?;
                }
                let id = ctr.id;
                let resources = update_resources(update);
                let upd = ContainerUpdate {
                    container_id: id.clone(),
                    resources: resources.clone(),
                    ignore_failure: false,
                };
                let failed = self
                    .link
                    .update_containers(&[upd], &[])
                    .await
                    .map_err(|e| StepFailure::Failed(e.to_string()))?;
                if !failed.is_empty() {
                    return Err(StepFailure::Failed(format!(
                        "the runtime could not update {name}"
                    )));
                }
                self.state
                    .write_model(|m| m.apply_resources(&id, &resources));
                self.note_applied_update(&id, &resources);
                Ok(())
            }
        }
    }
}
