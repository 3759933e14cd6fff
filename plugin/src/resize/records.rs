//! The resize records `status` and `/v1/resizes` read: one per container (desired, allocated,
//! state, reason, in the KEP's words) and one per whole-pod resize (its steps, each with the
//! cgroups' actual values after it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::LinuxResources;
use crate::policy::{Limit, Limits, PodResources, ResizeState};

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

/// The limits of `p` as records and checkpoints keep them.
pub(super) fn snapshot(p: &PodResources) -> SnapshotLimits {
    SnapshotLimits {
        pod: p.pod.into(),
        containers: p
            .containers
            .iter()
            .map(|(n, l)| (n.clone(), (*l).into()))
            .collect(),
    }
}

/// The limits a record or checkpoint keeps, as the planner takes them.
pub(super) fn from_snapshot(s: &SnapshotLimits) -> PodResources {
    PodResources {
        pod: s.pod.into(),
        containers: s
            .containers
            .iter()
            .map(|(n, l)| (n.clone(), (*l).into()))
            .collect(),
    }
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
