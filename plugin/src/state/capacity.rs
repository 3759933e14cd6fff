//! The node's capacity as the capacity watcher last saw it: the `node` section of `/v1/status`
//! and the changes it reports. The watcher (`capacity/`) reads the node and fills them in.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Reevaluation;

/// The `node` section of `/v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Online CPUs in the kernel's list format (`0-3`) and their number.
    pub online_cpus: String,
    pub online_cpu_count: u32,
    pub present_cpus: String,
    pub present_cpu_count: u32,
    /// `MemTotal`, in bytes.
    pub memory_bytes: u64,
    pub memory_block_bytes: u64,
    pub memory_blocks_online: u32,
    pub memory_blocks_present: u32,
    /// Online CPUs minus `[resize] reserved_cpu_millicores`, in millicores.
    pub allocatable_cpu_millis: u64,
    /// `MemTotal` minus `[resize] reserved_memory`, in bytes.
    pub allocatable_memory_bytes: u64,
    /// The event sources in use (`cpuhp`, `uevent`, `resync`).
    pub sources: Vec<String>,
    pub resync_interval_ms: u64,
    /// Capacity changes since start.
    pub changes: u64,
    pub last_change: Option<LastChange>,
    /// Containers whose cpuset names an offline CPU.
    pub pinned_to_offline: Vec<PinnedContainer>,
    /// What the last re-evaluation of waiting resizes decided.
    pub last_reevaluation: Vec<Reevaluation>,
    /// The last reading failed (the values above are from the reading before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_error: Option<String>,
    pub updated_ms: u64,
}

/// The latest change the watcher saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LastChange {
    pub at_ms: u64,
    /// `cpuhp`, `uevent`, `resync`.
    pub source: String,
    /// Kernel event to metric update, in milliseconds (`None` for the resync).
    pub detection_latency_ms: Option<f64>,
    pub changes: Vec<CapacityChange>,
}

/// A container pinned to a CPU that is offline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedContainer {
    pub container_id: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub cpuset: String,
    pub offline_cpus: String,
}

/// The resource a change concerns (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CapacityResource {
    Cpu,
    Memory,
}

impl CapacityResource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Memory => "memory",
        }
    }
}

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Online CPUs (capacity).
    OnlineCpus,
    /// Present CPUs (hot-added or removed; capacity once online).
    PresentCpus,
    /// `MemTotal` (capacity).
    MemoryTotal,
    /// Online memory blocks.
    MemoryBlocksOnline,
    /// Present memory blocks (hot-added or removed).
    MemoryBlocksPresent,
}

impl ChangeKind {
    pub fn resource(self) -> CapacityResource {
        match self {
            Self::OnlineCpus | Self::PresentCpus => CapacityResource::Cpu,
            _ => CapacityResource::Memory,
        }
    }

    /// Whether this changes capacity (what admission and the capacity metrics use).
    pub fn is_capacity(self) -> bool {
        matches!(self, Self::OnlineCpus | Self::MemoryTotal)
    }
}

/// One difference between two readings; CPU counts are CPUs, memory in bytes or blocks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityChange {
    pub kind: ChangeKind,
    pub old: u64,
    pub new: u64,
    /// CPU kinds: the CPU list before and after (`0-3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<(String, String)>,
}

impl CapacityChange {
    /// `up`, `down`, or `same` (a CPU set that changed members but not size).
    pub fn direction(&self) -> &'static str {
        match self.new.cmp(&self.old) {
            std::cmp::Ordering::Greater => "up",
            std::cmp::Ordering::Less => "down",
            std::cmp::Ordering::Equal => "same",
        }
    }
}

impl fmt::Display for CapacityChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cpus {
            Some((old, new)) => write!(f, "{:?} {old} → {new}", self.kind),
            None => write!(f, "{:?} {} → {}", self.kind, self.old, self.new),
        }
    }
}
