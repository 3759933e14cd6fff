//! Pausing trimming while a memory decrease reclaims the same container. Two reclaimers on one
//! cgroup would each read the other's work as their own: trimming would take the refaults and
//! stall a staged decrease causes for harm of its own steps (and stop at a working set that is
//! not the workload's), and the decrease's pacing would count trimming's steps. So the decrease
//! path holds a [`TrimPause`] for as long as it reclaims; while one is held the container's
//! turns do nothing and its state says why, and the first turn after it starts a new probe (the
//! readings from before describe another container).
//!
//! The pauses are taken by the resize domain's owner of reclaim (`resize/reclaims.rs`), which
//! also holds the observer's reclaim counter attached for as long as a reclaim of its runs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use super::{Shared, Trimmer};
use crate::sync::Locked as _;

/// The containers paused (how many holders each) and those whose probe a pause disturbed.
#[derive(Debug, Default)]
pub(super) struct Pauses {
    held: Mutex<HashMap<String, u32>>,
    disturbed: Mutex<HashSet<String>>,
}

impl Pauses {
    fn hold(&self, id: &str) {
        *self.held.locked().entry(id.to_owned()).or_default() += 1;
        self.disturbed.locked().insert(id.to_owned());
    }

    fn release(&self, id: &str) {
        let mut held = self.held.locked();
        if let Some(n) = held.get_mut(id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(id);
            }
        }
    }

    /// Whether container `id` is paused now.
    pub(super) fn is_paused(&self, id: &str) -> bool {
        self.held.locked().contains_key(id)
    }

    /// Whether a pause began for `id` since the last call (its probe must start over).
    pub(super) fn take_disturbed(&self, id: &str) -> bool {
        self.disturbed.locked().remove(id)
    }

    /// Forgets a removed container's disturbance (a held pause goes with its holder).
    pub(super) fn forget(&self, id: &str) {
        self.disturbed.locked().remove(id);
    }
}

/// Trimming of one container stays paused while this lives (see the module docs).
#[must_use = "trimming resumes when the pause is dropped"]
pub struct TrimPause {
    shared: Arc<Shared>,
    id: String,
}

impl std::fmt::Debug for TrimPause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrimPause")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Drop for TrimPause {
    fn drop(&mut self) {
        self.shared.pauses.release(&self.id);
    }
}

impl Trimmer {
    /// Pauses trimming of container `id` until the returned guard is dropped (pauses nest).
    pub fn pause(&self, id: &str) -> TrimPause {
        self.shared.pauses.hold(id);
        TrimPause {
            shared: Arc::clone(&self.shared),
            id: id.to_owned(),
        }
    }
}
