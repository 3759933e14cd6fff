//! The checkpoint directory (`--state-dir`) as the status API reports it. The checkpoint store
//! itself is the resize engine's (`resize/checkpoint.rs`).

use serde::{Deserialize, Serialize};

/// The state directory as the status API reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDirStatus {
    pub path: String,
    /// Checkpoints can be written there.
    pub usable: bool,
    /// The latest problems (unusable directory, unwritable or corrupt checkpoints), newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl StateDirStatus {
    /// Most problems kept.
    pub const MAX_PROBLEMS: usize = 20;

    pub fn problem(&mut self, message: String) {
        if self.problems.len() == Self::MAX_PROBLEMS {
            self.problems.remove(0);
        }
        self.problems.push(message);
    }
}
