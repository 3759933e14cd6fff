//! Admission's node reserve: where it comes from (kubelet's configuration or `[resize]`), what it
//! is, and where it disagrees with kubelet's (the `reserve` section of `/v1/status`). The daemon's
//! reserve check (`daemon/reserve.rs`) writes it; admission reads [`NodeReserve`] through
//! [`super::NodeState::node_reserve`].

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::policy::{bytes_quantity, cpu_text};

/// What admission keeps back from the node for the system and kubelet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReserve {
    pub memory_bytes: u64,
    pub cpu_millis: u64,
}

/// Where admission's reserve comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReserveSource {
    /// `[resize] reserved_memory` / `reserved_cpu`.
    #[default]
    Config,
    /// kubelet's configuration file (`[kubelet] config_file`): `systemReserved` +
    /// `kubeReserved` (+ the hard eviction threshold, memory).
    KubeletConfig,
}

/// The `reserve` section of `/v1/status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveStatus {
    pub source: ReserveSource,
    /// The reserve admission uses, as a quantity and in base units.
    pub memory: String,
    pub memory_bytes: u64,
    pub cpu: String,
    pub cpu_millis: u64,
    /// kubelet's configuration file, when one is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet_config: Option<String>,
    /// kubelet's pods cgroup compared with it, when one was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_cgroup: Option<String>,
    /// Disagreements with kubelet and what could not be read, for a person.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    pub checked_ms: u64,
}

impl ReserveStatus {
    /// A status for `reserve` from `source`.
    pub fn new(source: ReserveSource, reserve: NodeReserve) -> Self {
        ReserveStatus {
            source,
            memory: bytes_quantity(reserve.memory_bytes),
            memory_bytes: reserve.memory_bytes,
            cpu: cpu_text(reserve.cpu_millis),
            cpu_millis: reserve.cpu_millis,
            ..ReserveStatus::default()
        }
    }

    /// The reserve kubelet's configuration gives, when that is the source.
    pub fn from_kubelet(&self) -> Option<NodeReserve> {
        (self.source == ReserveSource::KubeletConfig).then_some(NodeReserve {
            memory_bytes: self.memory_bytes,
            cpu_millis: self.cpu_millis,
        })
    }

    /// One line for `nri-resize status`.
    pub fn line(&self) -> String {
        let from = match (&self.source, &self.kubelet_config) {
            (ReserveSource::KubeletConfig, Some(path)) => format!("kubelet's {path}"),
            _ => "[resize]".to_owned(),
        };
        let mut line = format!(
            "reserve: memory {}, cpu {} from {from}",
            self.memory, self.cpu
        );
        if let Some(p) = &self.pods_cgroup {
            let _ = write!(line, ", checked against {p}");
        }
        for problem in &self.problems {
            let _ = write!(line, "\n  ! {problem}");
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kubelets_reserve_overrides_the_configured_one() {
        let r = NodeReserve {
            memory_bytes: 1 << 30,
            cpu_millis: 500,
        };
        assert_eq!(
            ReserveStatus::new(ReserveSource::Config, r).from_kubelet(),
            None
        );
        assert_eq!(
            ReserveStatus::new(ReserveSource::KubeletConfig, r).from_kubelet(),
            Some(r)
        );
    }

    #[test]
    fn the_line_names_source_and_problems() {
        let mut s = ReserveStatus::new(
            ReserveSource::KubeletConfig,
            NodeReserve {
                memory_bytes: 1636 << 20,
                cpu_millis: 1000,
            },
        );
        s.kubelet_config = Some("/var/lib/kubelet/config.yaml".into());
        s.pods_cgroup = Some("/kubepods.slice".into());
        s.problems.push("something disagrees".into());
        assert_eq!(
            s.line(),
            "reserve: memory 1636Mi, cpu 1000m from kubelet's /var/lib/kubelet/config.yaml, checked against /kubepods.slice\n  ! something disagrees"
        );
    }
}
