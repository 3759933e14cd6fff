//! The resize engine: KEP-1287's node side, inside the runtime.
//!
//! Two entry points, one set of rules:
//! - **kubelet-driven** updates arrive one container at a time as NRI `UpdateContainer`
//!   ([`Engine::on_update`]): the resize policy decides in place / restart (eviction) / reject,
//!   admission refuses what can never fit (Infeasible) or does not fit now (Deferred), and when
//!   the container's new limit needs a larger pod cgroup first (cgroup v1 `EINVAL`,
//!   kubernetes/kubernetes#127356) the pod cgroup is raised before the runtime writes the
//!   container;
//! - **whole-pod** resizes through the API ([`Engine::resize_pod`]) are planned by
//!   [`crate::policy::plan`] into KEP-ordered steps and executed one by one — pod cgroup through
//!   cgroupfs, containers through NRI `UpdateContainers` — re-planned from the cgroups' actual
//!   values after every step, so a newer request takes over mid-resize and a resumed resize never
//!   applies a step twice. In-flight resizes are checkpointed in the state directory.
//!
//! `mode = "observe"` decides and reports everything but changes nothing.

pub mod checkpoint;
mod decrease;
mod late;
pub mod node;
pub mod reclaim;
pub mod reevaluate;
pub mod restart;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use self::checkpoint::CheckpointStore;
use self::late::too_late;
use self::node::NodeReader;
use crate::cgroup::{container_path, pod_path, CgroupIo, CgroupVersion, Cgroups, CpuLimit};
use crate::clock::now_ms;
use crate::config::{Config, Mode};
use crate::metrics::RestartOutcome;
use crate::model::{Container, CpuResources, LinuxResources, MemoryResources, Pod};
use crate::nri::{ContainerUpdate, Deadline, Eviction, Rejection, RuntimeLink, UpdateReply};
use crate::policy::{
    admit, changes, check_invariants, decide, parse_effective_policy, plan, plan_single, Admission,
    Allocated, ContainerAllocation, CpuSet, Decision, Limit, Limits, LimitsUpdate, PlanOptions,
    PodAllocation, PodResources, Quantities, ResizeState, Step, DEFAULT_CFS_PERIOD_US,
};
use crate::state::NodeState;
use crate::sync::{Locked as _, ReadWriteLocked as _};

/// The resize record of one container, in the KEP's words.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerResize {
    pub pod_id: String,
    pub container: String,
    /// What the latest request asks for.
    pub desired: Option<LinuxResources>,
    /// What the plugin accepted (what the container holds once actuated).
    pub allocated: Option<LinuxResources>,
    /// `None`: no resize pending.
    pub state: Option<ResizeState>,
    pub reason: String,
    pub updated_ms: u64,
    /// The memory limit a staged decrease was deferred at (kubelet asking for it again restarts
    /// the reclaim); not part of the API.
    #[serde(skip)]
    pub deferred_target: Option<u64>,
}

/// One executed step of a whole-pod resize, with the cgroups' actual values after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// `pod` or the container's name.
    pub target: String,
    /// The step as people read it (`app cpu=1500m memory=512Mi`).
    pub step: String,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// Pod and container limits read back from cgroupfs after the step.
    pub actual: Option<SnapshotLimits>,
    /// An invariant the actual state broke after this step (must never happen).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub violation: String,
}

/// Pod and container limits: CPU millicores and memory bytes, `None` = unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotLimits {
    pub pod: LimitPair,
    pub containers: BTreeMap<String, LimitPair>,
}

/// CPU millicores and memory bytes, `None` = unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitPair {
    pub cpu_millis: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl From<Limits> for LimitPair {
    fn from(l: Limits) -> Self {
        LimitPair {
            cpu_millis: l.cpu.value(),
            memory_bytes: l.memory.value(),
        }
    }
}

impl From<LimitPair> for Limits {
    fn from(p: LimitPair) -> Self {
        Limits::new(
            Limit::from_option(p.cpu_millis),
            Limit::from_option(p.memory_bytes),
        )
    }
}

fn snapshot(p: &PodResources) -> SnapshotLimits {
    SnapshotLimits {
        pod: p.pod.into(),
        containers: p
            .containers
            .iter()
            .map(|(n, l)| (n.clone(), (*l).into()))
            .collect(),
    }
}

fn from_snapshot(s: &SnapshotLimits) -> PodResources {
    PodResources {
        pod: s.pod.into(),
        containers: s
            .containers
            .iter()
            .map(|(n, l)| (n.clone(), (*l).into()))
            .collect(),
    }
}

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

/// The state of a whole-pod resize, as the API reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodResize {
    pub pod_id: String,
    pub pod: String,
    pub target: SnapshotLimits,
    pub state: Option<ResizeState>,
    pub reason: String,
    pub attempts: u32,
    /// Every step executed, in order, with the actual cgroup values after it.
    pub steps: Vec<StepRecord>,
    /// The resize was picked up again from a checkpoint after a restart.
    pub resumed: bool,
}

/// What is checkpointed for an in-flight whole-pod resize.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ResizeCheckpoint {
    pod_id: String,
    pod: String,
    target: SnapshotLimits,
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
    #[error("cgroup access for pod {pod}: {message}")]
    Cgroup { pod: String, message: String },
    #[error("{0}")]
    Failed(String),
}

/// Why a step of a whole-pod resize did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StepFailure {
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

/// See the module docs.
#[derive(Debug)]
pub struct Engine {
    state: Arc<NodeState>,
    link: RuntimeLink,
    cgroups: Option<Cgroups>,
    node: NodeReader,
    checkpoints: Option<CheckpointStore>,
    containers: Mutex<HashMap<String, ContainerResize>>,
    pods: Mutex<HashMap<String, PodResize>>,
    /// Latest target per pod id, and whether an executor is running for it.
    targets: Mutex<HashMap<String, (SnapshotLimits, bool)>>,
    resumed: std::sync::atomic::AtomicBool,
    /// Staged memory decreases in flight, by container id.
    reclaims: Mutex<HashMap<String, decrease::ReclaimHandle>>,
    reclaim_generation: std::sync::atomic::AtomicU64,
    /// Restarts in flight ([`restart`]).
    restarts: Arc<restart::Restarts>,
    /// Fires at shutdown: every background task of the engine (staged decreases, resumed
    /// resizes, restarts) stops, leaving its checkpoint for the next start.
    shutdown: tokio_util::sync::CancellationToken,
    /// The engine's background tasks; [`Engine::shutdown`] waits for them.
    tasks: tokio_util::task::TaskTracker,
}

/// A step's update as the Linux resources the runtime applies.
fn update_resources(u: &LimitsUpdate) -> LinuxResources {
    let cpu = (u.cpu.is_some() || u.cpu_shares.is_some()).then(|| CpuResources {
        quota: u.cpu.map(|l| {
            l.value().map_or(-1, |m| {
                i64::try_from(m * DEFAULT_CFS_PERIOD_US / 1000).unwrap_or(i64::MAX)
            })
        }),
        period: u.cpu.map(|_| DEFAULT_CFS_PERIOD_US),
        shares: u.cpu_shares,
        ..CpuResources::default()
    });
    let memory = u.memory.map(|l| MemoryResources {
        limit: Some(
            l.value()
                .map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX)),
        ),
        ..MemoryResources::default()
    });
    LinuxResources {
        cpu,
        memory,
        ..LinuxResources::default()
    }
}

impl Engine {
    pub fn new(
        state: Arc<NodeState>,
        link: RuntimeLink,
        cgroups: Option<Cgroups>,
        node: NodeReader,
        checkpoints: Option<CheckpointStore>,
    ) -> Self {
        let shutdown = tokio_util::sync::CancellationToken::new();
        Engine {
            state,
            link,
            cgroups,
            node,
            checkpoints,
            containers: Mutex::new(HashMap::new()),
            pods: Mutex::new(HashMap::new()),
            targets: Mutex::new(HashMap::new()),
            resumed: std::sync::atomic::AtomicBool::new(false),
            reclaims: Mutex::new(HashMap::new()),
            reclaim_generation: std::sync::atomic::AtomicU64::new(0),
            restarts: Arc::new(restart::Restarts::new(
                shutdown.child_token(),
                restart::Timing::default(),
            )),
            shutdown,
            tasks: tokio_util::task::TaskTracker::new(),
        }
    }

    fn config(&self) -> Config {
        self.state.config.read_locked().clone()
    }

    fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            cgroup_v1: self
                .cgroups
                .as_ref()
                .is_some_and(|c| c.version() == CgroupVersion::V1),
        }
    }

    fn record(
        &self,
        pod: &Pod,
        ctr: &Container,
        desired: Option<&LinuxResources>,
        state: Option<ResizeState>,
        reason: &str,
    ) {
        let mut all = self.containers.locked();
        let entry = all.entry(ctr.id.clone()).or_default();
        entry.pod_id.clone_from(&pod.id);
        entry.container.clone_from(&ctr.name);
        if let Some(d) = desired {
            entry.desired = Some(d.clone());
        }
        if entry.allocated.is_none() {
            entry.allocated.clone_from(&ctr.resources);
        }
        entry.state = state;
        entry.reason = reason.to_string();
        entry.updated_ms = now_ms();
        entry.deferred_target = None;
    }

    /// The resize records of every container (by container id).
    pub fn container_resizes(&self) -> HashMap<String, ContainerResize> {
        self.containers.locked().clone()
    }

    /// Whole-pod resizes, newest state of each.
    pub fn pod_resizes(&self) -> Vec<PodResize> {
        let mut v: Vec<PodResize> = self.pods.locked().values().cloned().collect();
        v.sort_by(|a, b| a.pod.cmp(&b.pod));
        v
    }

    /// An update the runtime applied on the plugin's request (`nri-resize update`, a whole-pod
    /// step, a re-evaluation): what was asked is both desired and allocated now, and the cgroup
    /// is read back against it.
    pub fn note_applied_update(&self, container_id: &str, update: &LinuxResources) {
        let Some(ctr) = self
            .state
            .read_model(|m| m.container(container_id).cloned())
        else {
            return;
        };
        let mut all = self.containers.locked();
        let r = all.entry(container_id.to_string()).or_default();
        r.pod_id.clone_from(&ctr.pod_id);
        r.container.clone_from(&ctr.name);
        // The model already holds the update: it is what is allocated and what was desired.
        r.allocated.clone_from(&ctr.resources);
        r.desired
            .get_or_insert_with(LinuxResources::default)
            .merge(update);
        r.state = None;
        r.reason.clear();
        r.updated_ms = now_ms();
        drop(all);
        // Confirmation: the merged resources asked for vs the cgroup now (what `status` shows).
        if let Some(r) = &ctr.resources {
            self.state.runtime_applied(container_id, r);
        }
        self.state.confirm(container_id, ctr.resources.clone());
    }

    /// Forgets a removed container.
    pub fn forget_container(&self, id: &str) {
        self.restarts.note(id, restart::Seen::Stopped);
        self.supersede_reclaim(id);
        self.containers.locked().remove(id);
    }

    /// The runtime applied an update: what was desired is now allocated.
    pub fn applied(&self, ctr: &Container) {
        self.notify_reclaim_applied(&ctr.id);
        self.restarts.note(&ctr.id, restart::Seen::Updated);
        if let Some(r) = self.containers.locked().get_mut(&ctr.id) {
            r.allocated.clone_from(&ctr.resources);
            // An in-place resize is done; one waiting for a restart keeps its state and reason.
            if r.state == Some(ResizeState::InProgress) && r.reason.is_empty() {
                r.state = None;
                r.reason.clear();
            }
            r.updated_ms = now_ms();
        }
    }

    fn admission(&self, pod: &Pod, desired: &BTreeMap<String, Quantities>) -> Admission {
        self.admission_with(pod, None, desired)
    }

    /// Admission with the pod's own allocation given (`None`: as the model has it).
    fn admission_with(
        &self,
        pod: &Pod,
        this_pod: Option<&PodAllocation>,
        desired: &BTreeMap<String, Quantities>,
    ) -> Admission {
        let cfg = self.config();
        let snapshot = self.state.capacity.read_locked().clone();
        let node = match self.node.capacity_with(snapshot.as_ref(), &cfg.resize) {
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

    /// The pod's current limits: the pod cgroup as cgroupfs says, containers as the model says.
    fn current_pod(&self, pod: &Pod) -> Result<PodResources, String> {
        let cg = self.cgroups.as_ref().ok_or("cgroup access is off")?;
        let path = pod_path(&pod.cgroup_parent).map_err(|e| e.to_string())?;
        let pod_limits = limits_of(&cg.read_actual(&path).map_err(|e| e.to_string())?);
        let containers = self.state.read_model(|m| {
            m.containers()
                .filter(|c| c.pod_id == pod.id)
                .filter(|c| !matches!(c.state, crate::model::ContainerState::Stopped))
                .map(|c| {
                    (
                        c.name.clone(),
                        c.resources
                            .as_ref()
                            .map(Limits::from_linux)
                            .unwrap_or_default(),
                    )
                })
                .collect()
        });
        Ok(PodResources {
            pod: pod_limits,
            containers,
        })
    }

    /// Reads back the actual limits of the pod and its containers from cgroupfs.
    fn actual_pod(&self, pod: &Pod) -> Option<PodResources> {
        let cg = self.cgroups.as_ref()?;
        let read = |p: &Path| cg.read_actual(p).ok().map(|a| limits_of(&a));
        let pod_limits = read(&pod_path(&pod.cgroup_parent).ok()?)?;
        let containers = self.state.read_model(|m| {
            m.containers()
                .filter(|c| c.pod_id == pod.id)
                .filter(|c| !matches!(c.state, crate::model::ContainerState::Stopped))
                .filter_map(|c| {
                    Some((
                        c.name.clone(),
                        read(&container_path(&c.cgroups_path).ok()?)?,
                    ))
                })
                .collect()
        });
        Some(PodResources {
            pod: pod_limits,
            containers,
        })
    }

    fn write_pod(&self, pod: &Pod, u: &LimitsUpdate) -> Result<(), String> {
        let cg = self.cgroups.as_ref().ok_or("cgroup access is off")?;
        let path = pod_path(&pod.cgroup_parent).map_err(|e| e.to_string())?;
        if let Some(cpu) = u.cpu {
            let quota = cpu.value().map(|m| m * DEFAULT_CFS_PERIOD_US / 1000);
            cg.set_cpu_limit(
                &path,
                CpuLimit {
                    quota,
                    period: DEFAULT_CFS_PERIOD_US,
                },
            )
            .map_err(|e| e.to_string())?;
        }
        if let Some(mem) = u.memory {
            cg.set_memory_limit(&path, mem.value())
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// A kubelet-driven `UpdateContainer`: see the module docs. Runs inside the NRI handler:
    /// in-memory decisions and at most two cgroupfs writes, well within the deadline.
    #[expect(
        clippy::too_many_lines,
        reason = "one decision, read top to bottom: policy, admission, ordering"
    )]
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
                too_late(&subject, deadline)?;
                let reason = format!("restart required: {reason}");
                timer.finish("restart");
                return Ok(self.restart_reply(pod, ctr, &desired, allocated, &reason, enforce));
            }
            Decision::Reject { reason } => {
                too_late(&subject, deadline)?;
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
            too_late(&subject, deadline)?;
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
        match self.decide_decrease(pod, ctr, &allocated, &desired, deadline) {
            decrease::DecreaseVerdict::Direct => {}
            decrease::DecreaseVerdict::Interim(limit) => interim = Some(limit),
            decrease::DecreaseVerdict::Reject(reason) => {
                too_late(&subject, deadline)?;
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
                too_late(&subject, deadline)?;
                timer.finish("restart");
                return Ok(self.restart_reply(pod, ctr, &desired, allocated, &reason, enforce));
            }
        }
        if enforce && self.cgroups.is_some() && !deadline.expired() {
            match self.current_pod(pod) {
                Ok(current) => match plan_single(
                    &current,
                    &ctr.name,
                    &Limits::from_linux(&desired),
                    &self.plan_options(),
                ) {
                    Ok(Some(Step::SetPod(raise))) => {
                        if let Err(e) = self.write_pod(pod, &raise) {
                            error!(container = %subject, error = %e, "raising the pod cgroup before the container failed");
                            self.record(pod, ctr, Some(&desired), Some(ResizeState::Error), &e);
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
        }
        too_late(&subject, deadline)?;
        if let Some(limit) = interim {
            timer.finish("in_place");
            return Ok(self.start_staged_decrease(pod, ctr, &desired, limit));
        }
        self.record(pod, ctr, Some(&desired), Some(ResizeState::InProgress), "");
        self.state.metrics.resize_outcome("in_place");
        timer.finish("in_place");
        Ok(UpdateReply::default())
    }

    /// Keeps the container as it is (no in-place write) and evicts it (when enforcing): the
    /// orchestrator recreates it with the new resources.
    fn restart_reply(
        self: &Arc<Self>,
        pod: &Pod,
        ctr: &Container,
        desired: &LinuxResources,
        allocated: LinuxResources,
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
        UpdateReply {
            updates: vec![ContainerUpdate {
                container_id: ctr.id.clone(),
                resources: allocated,
                ignore_failure: true,
            }],
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
        if let Some(r) = self.containers.locked().get_mut(&t.container_id) {
            r.state = state;
            r.reason = reason;
            r.updated_ms = now_ms();
        }
    }

    /// The runtime reported the container stopped (a restart waiting for it is confirmed).
    pub fn container_stopped(&self, id: &str) {
        self.restarts.note(id, restart::Seen::Stopped);
    }

    /// Cancels the engine's background work (staged decreases, resumed resizes, restarts) and
    /// waits for it to end. Checkpoints stay, so the next start resumes what was in flight.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        self.restarts.shutdown().await;
        self.tasks.wait().await;
    }

    fn find_pod(&self, namespace: &str, name: &str) -> Option<Pod> {
        self.state.read_model(|m| {
            m.pods()
                .find(|p| p.namespace == namespace && p.name == name)
                .cloned()
        })
    }

    /// A whole-pod resize through the planner and executor; returns when it finished (or failed).
    pub async fn resize_pod(
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
        let current = self
            .current_pod(&pod)
            .map_err(|message| ResizeError::Cgroup {
                pod: full.clone(),
                message,
            })?;
        // A resize in flight: the new request builds on its target (the latest desired state),
        // not on the transient values of a half-done plan.
        let base = self
            .targets
            .locked()
            .get(&pod.id)
            .map_or_else(|| current.clone(), |(t, _)| from_snapshot(t));
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
        let verdict = self.admission_with(&pod, Some(&this_pod), &desired);
        let enforce = self.config().resize.mode == Mode::Enforce;
        if let Admission::Deferred { reason } | Admission::Infeasible { reason } = &verdict {
            let state = verdict.resize_status().state;
            let outcome = if state == ResizeState::Deferred {
                "deferred"
            } else {
                "infeasible"
            };
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
        self.checkpoint(&pod, &target);
        let result = self.run(pod, target, false).await;
        timer.finish(if result.is_ok() { "in_place" } else { "error" });
        result
    }

    fn checkpoint(&self, pod: &Pod, target: &SnapshotLimits) {
        if let Some(store) = &self.checkpoints {
            let rec = ResizeCheckpoint {
                pod_id: pod.id.clone(),
                pod: pod.full_name(),
                target: target.clone(),
            };
            if let Err(e) = store.save(&checkpoint_key(&pod.id), &rec) {
                error!(pod = %pod.full_name(), error = %e, "cannot checkpoint the resize; it will not survive a restart");
                self.state.state_dir_problem(format!(
                    "checkpoint of {} not written: {e}",
                    pod.full_name()
                ));
            }
        }
    }

    /// Drives `pod` to `target` (the latest target wins if another request arrives meanwhile).
    async fn run(
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

    /// After the first synchronize: picks up checkpointed resizes (once per process).
    /// In `mode = "observe"` nothing is resumed (resuming writes cgroups): the checkpoints stay,
    /// their resizes are reported as Proposed, and a later synchronize in `enforce` resumes them.
    pub fn resume_checkpointed(self: &Arc<Self>) {
        if self.config().resize.mode == Mode::Observe {
            self.report_checkpoints_in_observe_mode();
            return;
        }
        if self.resumed.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        self.resume_reclaims();
        let Some(store) = &self.checkpoints else {
            return;
        };
        let (records, errors) = store.load_prefixed::<ResizeCheckpoint>("pod-");
        for e in errors {
            error!(error = %e, "resize checkpoint unusable");
            self.state
                .state_dir_problem(format!("resize checkpoint unusable: {e}"));
        }
        for (_, rec) in records {
            let pod = self.state.read_model(|m| m.pod(&rec.pod_id).cloned());
            let Some(pod) = pod else {
                warn!(pod = %rec.pod, "checkpointed resize of a pod that no longer exists; dropping it");
                let _ = store.remove(&checkpoint_key(&rec.pod_id));
                continue;
            };
            info!(pod = %rec.pod, "resuming a checkpointed resize");
            let engine = Arc::clone(self);
            self.tasks.spawn(async move {
                tokio::select! {
                    r = engine.run(pod, rec.target, true) => {
                        if let Err(e) = r {
                            error!(pod = %rec.pod, error = %e, "resumed resize failed");
                        }
                    }
                    () = engine.shutdown.cancelled() => {
                        info!(pod = %rec.pod, "stopping: the resumed resize stays checkpointed");
                    }
                }
            });
        }
    }
}

/// The CPU and memory limits a cgroup holds (`-1`, 0 or v1's huge "unlimited" value: unlimited).
fn limits_of(a: &crate::cgroup::ActualResources) -> Limits {
    Limits::new(
        Limit::from_option(a.cpu_limit_millis()),
        Limit::from_option(
            a.memory_limit
                .filter(|&m| {
                    m > 0 && u64::try_from(m).is_ok_and(|b| b < crate::policy::UNLIMITED_BYTES)
                })
                .and_then(|m| u64::try_from(m).ok()),
        ),
    )
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

fn checkpoint_key(pod_id: &str) -> String {
    let safe: String = pod_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(100)
        .collect();
    format!("pod-{safe}")
}

/// Parses the CLI's `cpu=1500m,memory=512Mi` into a target.
pub fn parse_target(spec: &str) -> Result<ContainerTarget, String> {
    let mut t = ContainerTarget::default();
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected key=value"))?;
        match k {
            "cpu" => t.cpu_millis = Some(parse_cpu(v)?),
            "memory" => t.memory_bytes = Some(parse_memory(v)?),
            other => return Err(format!("unknown resource {other:?} (cpu, memory)")),
        }
    }
    if t.cpu_millis.is_none() && t.memory_bytes.is_none() {
        return Err(format!("{spec:?}: give cpu= and/or memory="));
    }
    Ok(t)
}

fn parse_cpu(v: &str) -> Result<u64, String> {
    let bad = || format!("bad CPU quantity {v:?} (e.g. 1500m or 1.5)");
    if let Some(m) = v.strip_suffix('m') {
        return m.parse().map_err(|_| bad());
    }
    let f: f64 = v.parse().map_err(|_| bad())?;
    if !(0.0..=100_000.0).contains(&f) {
        return Err(bad());
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "range checked above"
    )]
    Ok((f * 1000.0).round() as u64)
}

fn parse_memory(v: &str) -> Result<u64, String> {
    let bad = || format!("bad memory quantity {v:?} (e.g. 512Mi, 2Gi, 1048576)");
    let (num, mult) = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("K", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ]
    .iter()
    .find_map(|(s, m)| v.strip_suffix(s).map(|n| (n, *m)))
    .unwrap_or((v, 1));
    num.parse::<u64>()
        .map_err(|_| bad())?
        .checked_mul(mult)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cli_targets() {
        assert_eq!(
            parse_target("cpu=1500m,memory=512Mi").unwrap(),
            ContainerTarget {
                cpu_millis: Some(1500),
                memory_bytes: Some(512 << 20)
            }
        );
        assert_eq!(parse_target("cpu=2").unwrap().cpu_millis, Some(2000));
        assert_eq!(parse_target("cpu=0.25").unwrap().cpu_millis, Some(250));
        assert_eq!(
            parse_target("memory=1Gi").unwrap().memory_bytes,
            Some(1 << 30)
        );
        for bad in [
            "",
            "cpu",
            "gpu=1",
            "cpu=lots",
            "memory=12Xi",
            "cpu=-1",
            "memory=99999999999999Ti",
        ] {
            assert!(parse_target(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn steps_become_runtime_resources() {
        let u = LimitsUpdate {
            cpu: Some(Limit::Limited(1500)),
            memory: Some(Limit::Unlimited),
            cpu_shares: Some(1536),
        };
        let r = update_resources(&u);
        assert_eq!(
            (
                r.cpu_quota(),
                r.cpu_period(),
                r.cpu_shares(),
                r.memory_limit()
            ),
            (Some(150_000), Some(100_000), Some(1536), Some(-1))
        );
        let r = update_resources(&LimitsUpdate {
            memory: Some(Limit::Limited(1 << 30)),
            ..LimitsUpdate::default()
        });
        assert!(r.cpu.is_none());
        assert_eq!(r.memory_limit(), Some(1 << 30));
    }

    #[test]
    fn checkpoint_keys_are_safe() {
        assert_eq!(checkpoint_key("abc-123"), "pod-abc-123");
        assert_eq!(checkpoint_key("../../etc"), "pod-etc");
    }
}
