//! Working-set trimming's step decision: how much cold page cache to reclaim from an opted-in
//! container next, or whether to hold, or whether it has found the container's working set.
//! Pure: the trimmer (`trim/`) reads the container's `memory.stat`, `memory.current` and the
//! stall and refaults since its last step, and asks.
//!
//! The rules, per probe (a round of steps that ends at the working set):
//!
//! - **What may go.** Only page cache the kernel can drop without swap: `file − shmem` (tmpfs and
//!   shared memory count in `file` but live on the anonymous LRU). A step is cut to the
//!   inactive file list when that is smaller (the pages the kernel itself judges cold), but
//!   never below the smallest step while cache is left, so the kernel can age the active list.
//!   Anonymous memory is never asked for: the writer passes `swappiness=0` where the kernel
//!   takes it, and trimming is unavailable where swap is on and it does not (`trim/probe.rs`).
//! - **Small steps, growing while harmless.** The first step is `min_step` (1 MiB); every step
//!   that did no harm doubles the next one, up to `max_step`, as [`Pacer`](super::Pacer)
//!   grows a staged decrease before its first hold.
//! - **The first sign of harm ends the probe.** Harm after a step is refaults of more than an
//!   eighth of the last step (at least 64 KiB) within one interval, or stall (the higher of the
//!   container's `memory.pressure` and `io.pressure` `some` shares since the step; on 6.16+ a
//!   refault of reclaimed cache barely shows as memory stall, hence I/O too) over the target
//!   while the container refaults at all. A stall with no refaults is not trimming's doing
//!   (trimming takes only page cache, and a page it took that the workload needs comes back as
//!   a refault): the probe holds while it lasts, neither stepping nor concluding (found in the
//!   VM tier: a container still writing its files showed 8 % I/O stall after a 1 MiB step, and
//!   a probe that took it for harm recorded a working set of 298Mi of which 280Mi was cold). Then the probe has found the working set: the usage before that step (what the
//!   container needed), or the usage now if it grew past it. Nothing is reclaimed until the
//!   next probe, a re-probe pause later (working sets move).
//! - **Nothing left.** When less than one smallest step of droppable cache is left, the working
//!   set is the usage now.
//! - **Hold.** Before its first step, a probe never starts on a container that stalls over the
//!   target or refaults on its own: its working set does not fit already, and trimming's harm
//!   could not be told apart from the workload's. It tries again at the next interval.

use serde::{Deserialize, Serialize};

use super::pacer::{Harm, FIRST_STEP};
use super::share::percent;
use super::units::bytes_text;
use super::Share;

/// Refaults at or below this many bytes after a step are noise (16 pages), whatever the step.
pub const REFAULT_FLOOR: u64 = 64 << 10;

/// The `memory.stat` figures trimming decides from, in bytes, and `memory.current`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStat {
    /// `memory.current`.
    pub usage: u64,
    pub anon: u64,
    /// Page cache, shmem included (as the kernel counts it).
    pub file: u64,
    /// Shared memory and tmpfs: on the anonymous LRU, freed only by swap.
    pub shmem: u64,
    pub active_file: u64,
    pub inactive_file: u64,
    /// Bytes of page cache refaulted since the cgroup was created (`workingset_refault_file`).
    pub refaulted_file: u64,
}

impl CacheStat {
    /// Page cache the kernel can drop without swap.
    #[must_use]
    pub fn droppable(&self) -> u64 {
        self.file.saturating_sub(self.shmem)
    }
}

/// How trimming paces, for one container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrimSettings {
    /// The stall share (memory or I/O) a step may cause; the node's `[trim] max_stall`, or
    /// lower by the pod's annotation.
    pub max_stall: Share,
    /// The first step of a probe.
    pub min_step: u64,
    /// The largest step.
    pub max_step: u64,
}

impl Default for TrimSettings {
    fn default() -> Self {
        Self {
            max_stall: Share::new(0.002),
            min_step: FIRST_STEP,
            max_step: 64 << 20,
        }
    }
}

/// The harm that ended a probe, or that there was nothing left to trim.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum Found {
    /// The container refaulted this many bytes after the last step.
    Refaults { bytes: u64 },
    /// The container stalled this share of the interval after the last step.
    Stall { share: f64 },
    /// Less than one smallest step of droppable page cache is left.
    NothingLeft,
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refaults { bytes } => write!(f, "{} refaulted after a step", bytes_text(*bytes)),
            Self::Stall { share } => write!(f, "stall {} after a step", stall_text(*share)),
            Self::NothingLeft => f.write_str("no droppable page cache left"),
        }
    }
}

/// Why a probe did not start.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum HoldReason {
    /// The container stalls this share on its own.
    OwnStall { share: f64 },
    /// The container refaults this many bytes per interval on its own.
    OwnRefaults { bytes: u64 },
    /// A memory decrease is reclaiming the container; trimming waits for it to end.
    Decrease,
}

impl std::fmt::Display for HoldReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OwnStall { share } => {
                write!(f, "the container stalls {} on its own", stall_text(*share))
            }
            Self::OwnRefaults { bytes } => write!(
                f,
                "the container refaults {} per interval on its own",
                bytes_text(*bytes)
            ),
            Self::Decrease => f.write_str("a memory decrease is reclaiming the container"),
        }
    }
}

/// Whether a working set trimming found (`working_set`: the usage where reclaiming more made the
/// container refault or stall) still holds for a container using `usage` now: once it uses less,
/// the finding says nothing about it any more (the workload shrank or dropped its cache), and
/// keeping it would make decreases that fit wait.
#[must_use]
pub fn working_set_holds(working_set: u64, usage: u64) -> bool {
    usage >= working_set
}

/// A stall share as a person reads it: `0.15 %`.
#[must_use]
pub fn stall_text(share: f64) -> String {
    if share >= 0.01 {
        format!("{} %", percent(share))
    } else {
        format!("{:.2} %", share * 100.0)
    }
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TrimStep {
    /// Ask `memory.reclaim` for this many bytes.
    Reclaim(u64),
    /// Do nothing this interval.
    Hold(HoldReason),
    /// The probe is over: the working set, and how it was found.
    Converged { working_set: u64, found: Found },
}

/// One probe's progress: the next step's size and what the last step started from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// The next step (0: the probe has not stepped yet; it starts at `min_step`).
    next: u64,
    /// The last step asked for (0: none yet in this probe).
    last: u64,
    /// The usage before the last step.
    usage_before_last: u64,
}

impl Probe {
    /// Decides the next step from `now` and the `harm` since the last decision, and records it.
    pub fn decide(&mut self, s: &TrimSettings, now: &CacheStat, harm: Harm) -> TrimStep {
        let stall = harm.stall();
        let over = stall > s.max_stall.get();
        if self.last == 0 {
            if over {
                return TrimStep::Hold(HoldReason::OwnStall { share: stall });
            }
            if harm.refaulted > REFAULT_FLOOR {
                return TrimStep::Hold(HoldReason::OwnRefaults {
                    bytes: harm.refaulted,
                });
            }
        } else {
            let refaulted = harm.refaulted > REFAULT_FLOOR;
            let found = if harm.refaulted > REFAULT_FLOOR.max(self.last / 8) {
                Some(Found::Refaults {
                    bytes: harm.refaulted,
                })
            } else if over && refaulted {
                Some(Found::Stall { share: stall })
            } else {
                None
            };
            if let Some(found) = found {
                return TrimStep::Converged {
                    working_set: self.usage_before_last.max(now.usage),
                    found,
                };
            }
            if over {
                // Stalling, but on nothing trimming took: the workload's own (its writes, its
                // reads of files it never had). Wait; the probe goes on once it is quiet.
                return TrimStep::Hold(HoldReason::OwnStall { share: stall });
            }
        }
        let min_step = s.min_step.max(1);
        let droppable = now.droppable();
        if droppable < min_step {
            return TrimStep::Converged {
                working_set: now.usage,
                found: Found::NothingLeft,
            };
        }
        let step = if self.last == 0 { min_step } else { self.next };
        let step = step
            .min(s.max_step.max(min_step))
            .min(now.inactive_file.max(min_step))
            .min(droppable);
        self.last = step;
        self.usage_before_last = now.usage;
        self.next = step.saturating_mul(2);
        TrimStep::Reclaim(step)
    }

    /// The last step asked for in this probe (0: none yet).
    #[must_use]
    pub fn last_step(&self) -> u64 {
        self.last
    }

    /// The step after the last one, before it is cut to what the container holds (the first
    /// step of a probe: `min_step`).
    #[must_use]
    pub fn next_step(&self, s: &TrimSettings) -> u64 {
        if self.last == 0 {
            s.min_step
        } else {
            self.next.min(s.max_step)
        }
    }
}

#[cfg(test)]
mod tests;
