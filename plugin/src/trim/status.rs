//! What trimming says about a container: its state (`/v1/status`, `nri-resize status`) and the
//! figures behind it. The decrease path reads the same record through
//! [`Trimmer::state`](super::Trimmer::state).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::policy::{bytes_text, stall_text, Found, HoldReason};

/// Where trimming stands for one container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum TrimState {
    /// Neither the node default nor the pod's annotation opts it in.
    #[default]
    Off,
    /// Opted in, but trimming cannot run here (cgroup v1, no PSI, no `memory.reclaim`, swap on
    /// without `swappiness=`), or the container's cgroup does not read.
    Unavailable { reason: String },
    /// A probe is running; its next step asks for this many bytes.
    Trimming { next_step: u64 },
    /// Nothing is reclaimed for now, and why.
    Holding { reason: HoldReason },
    /// The last probe found the working set; the next one starts after the re-probe pause.
    Converged { working_set: u64, found: Found },
}

impl TrimState {
    /// The short word of `nri-resize status`'s TRIM column: `off`, `unavailable`, `trimming`,
    /// `holding`, or the working set found (`42Mi`).
    #[must_use]
    pub fn cell(&self) -> String {
        match self {
            Self::Off => "off".into(),
            Self::Unavailable { .. } => "unavailable".into(),
            Self::Trimming { .. } => "trimming".into(),
            Self::Holding { .. } => "holding".into(),
            Self::Converged { working_set, .. } => bytes_text(*working_set),
        }
    }
}

impl std::fmt::Display for TrimState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::Unavailable { reason } => write!(f, "unavailable: {reason}"),
            Self::Trimming { next_step } => {
                write!(f, "trimming (next step {})", bytes_text(*next_step))
            }
            Self::Holding { reason } => write!(f, "holding: {reason}"),
            Self::Converged { working_set, found } => {
                write!(f, "working set {} ({found})", bytes_text(*working_set))
            }
        }
    }
}

/// Trimming's record of one container, as published.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerTrim {
    #[serde(flatten)]
    pub state: TrimState,
    /// The stall target in effect (the node's, or lower by the pod's annotation); `None` while
    /// off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_stall: Option<f64>,
    /// The working set the last converged probe found (kept while the next one runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Page cache trimmed so far.
    pub trimmed_bytes: u64,
    /// Steps taken so far.
    pub steps: u64,
    /// The stall share measured after the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stall: Option<f64>,
    /// The highest stall share measured after a step that refaulted (a stall with nothing
    /// refaulted is the workload's own).
    pub worst_stall: f64,
    /// Bytes refaulted in the intervals after steps.
    pub refaulted_bytes: u64,
    /// The pod's trimming annotations that were not applied, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotation_errors: Vec<String>,
}

impl ContainerTrim {
    /// One line for a person: the state, and the figures once it stepped.
    #[must_use]
    pub fn line(&self) -> String {
        let mut line = self.state.to_string();
        if self.steps > 0 {
            let _ = write!(
                line,
                "; trimmed {} in {} step(s), stall up to {} (target {}), {} refaulted",
                bytes_text(self.trimmed_bytes),
                self.steps,
                stall_text(self.worst_stall),
                stall_text(self.max_stall.unwrap_or(0.0)),
                bytes_text(self.refaulted_bytes),
            );
        }
        for e in &self.annotation_errors {
            line.push_str("; ");
            line.push_str(e);
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_as_a_person_reads_them() {
        let c = ContainerTrim {
            state: TrimState::Converged {
                working_set: 42 << 20,
                found: Found::Stall { share: 0.003 },
            },
            max_stall: Some(0.002),
            trimmed_bytes: 150 << 20,
            steps: 9,
            worst_stall: 0.003,
            ..ContainerTrim::default()
        };
        assert_eq!(c.state.cell(), "42Mi");
        assert_eq!(
            c.line(),
            "working set 42Mi (stall 0.30 % after a step); trimmed 150Mi in 9 step(s), stall up to 0.30 % (target 0.20 %), 0 refaulted"
        );
        let json = serde_json::to_value(&c).expect("json");
        assert_eq!(json["state"], "converged");
        assert_eq!(json["working_set"], 42 << 20);
        assert_eq!(json["found"]["by"], "stall");
        let back: ContainerTrim = serde_json::from_value(json).expect("back");
        assert_eq!(back, c);
        let u = TrimState::Unavailable {
            reason: "cgroup v1".into(),
        };
        assert_eq!(
            (u.cell(), u.to_string()),
            ("unavailable".into(), "unavailable: cgroup v1".into())
        );
    }
}
