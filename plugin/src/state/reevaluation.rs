//! The record of a re-evaluation of waiting resizes after a node capacity change: the resize
//! engine makes them (`resize/reevaluate.rs`), the capacity watcher publishes the last ones in
//! the `node` section of `/v1/status` and counts them.

use serde::{Deserialize, Serialize};

use crate::policy::ResizeState;

/// What a re-evaluation did with one waiting resize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReevaluationOutcome {
    /// It fits now and the runtime applied it.
    Applied,
    /// It fits now; `mode = "Observe"` leaves it.
    WouldApply,
    /// Still (or now) Deferred.
    Deferred,
    /// Still (or now) Infeasible.
    Infeasible,
    /// It fits, but applying it failed (the record says why; it keeps waiting).
    Failed,
}

impl ReevaluationOutcome {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::WouldApply => "would_apply",
            Self::Deferred => "deferred",
            Self::Infeasible => "infeasible",
            Self::Failed => "failed",
        }
    }
}

/// One waiting resize, re-evaluated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reevaluation {
    pub container_id: String,
    /// `namespace/pod/container`.
    pub subject: String,
    /// The state it was waiting in.
    pub before: ResizeState,
    pub outcome: ReevaluationOutcome,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}
