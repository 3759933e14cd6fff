//! A whole-pod resize through the API: the request, the pod's target built from it, and
//! admission; the executor ([`super::executor`]) then drives the pod there.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::info;

use super::pod_cgroup::PodCgroupError;
use super::records::{from_snapshot, snapshot};
use super::{Engine, PodResize};
use crate::config::Mode;
use crate::model::Pod;
use crate::policy::{
    changes, check_invariants, Admission, ContainerAllocation, CpuSet, Limit, Limits,
    PodAllocation, PodResources, Quantities, ResizeState,
};

/// A whole-pod resize request: new limits per container name (unnamed containers keep theirs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodResizeRequest {
    pub containers: BTreeMap<String, ContainerTarget>,
}

/// New limits of one container; absent = unchanged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerTarget {
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
}

/// Why a whole-pod resize was refused before it started.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error("no pod {0} known to the plugin")]
    UnknownPod(String),
    #[error("pod {pod} has no container {container}")]
    UnknownContainer { pod: String, container: String },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("{state:?}: {reason}")]
    Refused { state: ResizeState, reason: String },
    #[error("cgroup access for pod {pod}: {source}")]
    Cgroup {
        pod: String,
        #[source]
        source: PodCgroupError,
    },
    #[error("{0}")]
    Failed(String),
    /// The daemon is stopping: a resize that had started stays checkpointed and resumes at the
    /// next start.
    #[error("nri-resize is stopping; a resize already under way resumes from its checkpoint at the next start")]
    Stopping,
}

impl Engine {
    /// [`Engine::current_pod`] on a blocking thread, its failure as the resize's.
    pub(super) async fn read_current_pod(
        self: &Arc<Self>,
        pod: &Pod,
    ) -> Result<PodResources, ResizeError> {
        let p = pod.clone();
        self.off_worker(move |e| e.current_pod(&p))
            .await
            .map_err(|source| ResizeError::Cgroup {
                pod: pod.full_name(),
                source,
            })
    }

    fn find_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.state.read_model(|m| {
            m.pods()
                .find(|p| p.namespace == namespace && p.name == name)
                .cloned()
        })
    }

    /// A whole-pod resize through the planner and executor; returns when it finished (or failed).
    ///
    /// The resize is a task of the engine's own ([`Engine::shutdown`] ends it and waits for it),
    /// not of the caller: a caller that goes away (an API client that disconnects) leaves it
    /// running to its end, so its record, its reclaims and the pod's next resize are never left
    /// waiting on a request that no longer exists. At shutdown it stops at its next await,
    /// leaving its checkpoint for the next start.
    pub async fn resize_pod(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
        req: &PodResizeRequest,
    ) -> Result<PodResize, ResizeError> {
        if self.shutdown.is_cancelled() {
            return Err(ResizeError::Stopping);
        }
        let engine = Arc::clone(self);
        let (namespace, name, req) = (namespace.to_owned(), name.to_owned(), req.clone());
        let task = self.tasks.spawn(async move {
            let stop = engine.shutdown.clone();
            tokio::select! {
                r = engine.resize_pod_owned(&namespace, &name, &req) => r,
                () = stop.cancelled() => {
                    info!(pod = %format!("{namespace}/{name}"), "stopping: the resize stays checkpointed");
                    Err(ResizeError::Stopping)
                }
            }
        });
        match task.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down under the task.
            Err(_) => Err(ResizeError::Stopping),
        }
    }

    /// [`Engine::resize_pod`]'s work, inside the engine's task.
    async fn resize_pod_owned(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
        req: &PodResizeRequest,
    ) -> Result<PodResize, ResizeError> {
        let full = format!("{namespace}/{name}");
        let pod = self
            .find_pod(namespace, name)
            .ok_or_else(|| ResizeError::UnknownPod(full.clone()))?;
        if req.containers.is_empty() {
            return Err(ResizeError::Invalid("no containers to resize".into()));
        }
        let current = self.read_current_pod(&pod).await?;
        // A resize in flight: the new request builds on its target (the latest desired state),
        // not on the transient values of a half-done plan.
        let base = if self.runs.running(&pod.id) {
            from_snapshot(&self.runs.target(&pod.id))
        } else {
            current.clone()
        };
        let target = build_target(&base, req, &full)?;
        check_invariants(&target, &self.plan_options())
            .map_err(|v| ResizeError::Invalid(format!("the resulting pod is not allowed: {v}")))?;
        let desired: BTreeMap<String, Quantities> = req
            .containers
            .keys()
            .filter_map(|n| {
                target
                    .containers
                    .get(n)
                    .map(|l| (n.clone(), limits_quantities(l)))
            })
            .collect();
        // Requests follow limits on both sides: containerd before 2.2 does not apply CPU shares
        // from NRI updates, so shares-derived requests would drift from the limits the API set.
        let this_pod = PodAllocation {
            containers: current
                .containers
                .iter()
                .map(|(n, l)| {
                    (
                        n.clone(),
                        ContainerAllocation {
                            quantities: limits_quantities(l),
                            cpuset: CpuSet::default(),
                        },
                    )
                })
                .collect(),
            overhead: Quantities::default(),
        };
        let mut changed: Vec<_> = desired
            .iter()
            .filter_map(|(n, to)| {
                this_pod
                    .containers
                    .get(n)
                    .map(|from| changes(&from.quantities, to))
            })
            .flatten()
            .collect();
        changed.sort_unstable_by_key(|(r, d)| (r.as_str(), d.as_str()));
        changed.dedup();
        let timer = self.state.metrics.resize_timer(&changed);
        // Without the capacity watcher's snapshot, admission reads the node's files.
        let verdict = {
            let (p, d) = (pod.clone(), desired.clone());
            self.off_worker(move |e| e.admission_with(&p, Some(&this_pod), &d))
                .await
        };
        let enforce = self.config().resize.mode == Mode::Enforce;
        if let Admission::Deferred { reason } | Admission::Infeasible { reason } = &verdict {
            let state = verdict.resize_status().state;
            let outcome = verdict.outcome().unwrap_or("deferred");
            self.state.metrics.resize_outcome(outcome);
            timer.finish(outcome);
            return Err(ResizeError::Refused {
                state,
                reason: reason.clone(),
            });
        }
        if !enforce {
            return Err(ResizeError::Refused {
                state: ResizeState::Proposed,
                reason: "mode = observe: planned, not applied".into(),
            });
        }
        let target = snapshot(&target);
        let (p, t) = (pod.clone(), target.clone());
        self.off_worker(move |e| e.checkpoint(&p, &t)).await;
        let result = self.run(pod, target, false).await;
        timer.finish(if result.is_ok() { "in_place" } else { "error" });
        result
    }
}

/// Quantities of a whole-pod API resize: requests follow limits.
fn limits_quantities(l: &Limits) -> Quantities {
    let mut q = Quantities::default();
    q.cpu.limit = l.cpu;
    q.cpu.request = l.cpu.value();
    q.memory.limit = l.memory;
    q.memory.request = l.memory.value();
    q
}

/// The pod's target: the containers' new limits, and a pod limit that follows its containers and
/// keeps its headroom (overhead), as kubelet sizes it.
fn build_target(
    current: &PodResources,
    req: &PodResizeRequest,
    full: &str,
) -> Result<PodResources, ResizeError> {
    let mut target = current.clone();
    for (cname, t) in &req.containers {
        let limits =
            target
                .containers
                .get_mut(cname)
                .ok_or_else(|| ResizeError::UnknownContainer {
                    pod: full.to_string(),
                    container: cname.clone(),
                })?;
        if t.cpu_millis.is_some_and(|m| m < 10) || t.memory_bytes.is_some_and(|b| b < (4 << 20)) {
            return Err(ResizeError::Invalid(format!(
                "{cname}: CPU below 10m or memory below 4Mi"
            )));
        }
        if let Some(m) = t.cpu_millis {
            limits.cpu = Limit::Limited(m);
            limits.cpu_shares = Some(crate::policy::millis_to_shares(m));
        }
        if let Some(b) = t.memory_bytes {
            limits.memory = Limit::Limited(b);
        }
    }
    // The pod limit follows its containers and keeps its headroom (overhead), as kubelet sizes it.
    for r in crate::policy::Resource::ALL {
        let sum = |p: &PodResources| {
            p.containers
                .values()
                .fold(Limit::Limited(0), |a, l| a.saturating_add(l.get(r)))
        };
        let (old_sum, new_sum) = (sum(current), sum(&target));
        let pod_now = current.pod.get(r);
        let next = match (pod_now, old_sum, new_sum) {
            (Limit::Limited(p), Limit::Limited(o), Limit::Limited(n)) => {
                Limit::Limited((p + n).saturating_sub(o).max(n))
            }
            (Limit::Unlimited, _, _) => Limit::Unlimited,
            (_, _, n) => n,
        };
        match r {
            crate::policy::Resource::Cpu => target.pod.cpu = next,
            crate::policy::Resource::Memory => target.pod.memory = next,
        }
    }
    Ok(target)
}
