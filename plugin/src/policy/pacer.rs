//! The [`Pacer`]: how much a paced staged decrease reclaims next, and when. Pure: the loop
//! (`resize/reclaim/`) measures the [`Harm`] its last step did and asks.
//!
//! The harm is the workload's **stall share** since the last pass (stalled time over wall time),
//! the higher of its `memory.pressure` and its `io.pressure` `some` lines: a reclaimed page the
//! workload needs again is read back from disk, and depending on the kernel that wait shows as
//! memory stall (6.1) or only as I/O stall (6.12). That harm outlives the step that caused it:
//! the pages are missing until the workload happens to touch them again, so every further step
//! adds to it. Hence, against the ceiling `c` (`[memory_decrease] max_stall`, tightenable per
//! pod):
//!
//! - **At or over half the ceiling: hold.** The next passes reclaim nothing (the interim
//!   `memory.max` stays above usage, so the workload can fault back what it needs), each pause
//!   twice as long (up to [`MAX_WAIT`]), until the stall is back under `c / 4`; then it resumes
//!   with [`MIN_STEP`] and half the pause. Passes over `c` itself are counted for the deferred
//!   note.
//! - **Under a quarter of the ceiling: grow.** Until the first hold the step doubles (a cold
//!   cache goes fast); after it, it grows by [`MIN_STEP`] a pass. The pause halves back towards
//!   the configured step interval.
//! - **In between** (`c / 4` to `c / 2`): the same step again.
//!
//! The loop passes the stall above the workload's own (the lowest of its pressure files' 10 s,
//! 1 min and 5 min averages before the decrease): a workload that always waits on its disk is not held forever.
//!
//! A limit kept at the timeout leaves room for at least the usage the reclaim first held at
//! ([`Pacer::kept_usage`]).
//!
//! It starts with [`FIRST_STEP`]: a hot working set is hurt by the first step already. The pacer
//! never ends a reclaim: the loop still ends by converging, by its timeout, or by being
//! superseded.

use std::time::Duration;

use super::share::percent as pct;
use super::{bytes_text, Share};

/// The first step of a paced reclaim (doubles every pass while the stall stays low).
pub const FIRST_STEP: u64 = 1 << 20;
/// The step a reclaim resumes with after holding.
pub const MIN_STEP: u64 = 1 << 20;
/// The longest wait between passes.
pub const MAX_WAIT: Duration = Duration::from_secs(4);

/// What the last reclaim step cost the workload, measured between two passes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Harm {
    /// `memory.pressure` `some` share.
    pub memory: f64,
    /// `io.pressure` `some` share (0 where unreadable).
    pub io: f64,
    /// Bytes the workload refaulted meanwhile (reclaimed pages it needed again).
    pub refaulted: u64,
}

impl Harm {
    /// The stall share the pacer holds against its ceiling.
    #[must_use]
    pub fn stall(&self) -> f64 {
        self.memory.max(self.io)
    }
}

/// What the pacer decided after a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaceChange {
    /// At or over half the ceiling, or holding and not yet under a quarter of it: reclaim
    /// nothing, wait longer.
    Hold,
    /// Holding, and the stall fell under a quarter of the ceiling: small steps again.
    Resume,
    /// Under a quarter of the ceiling: larger and sooner.
    Faster,
    Same,
}

/// The pacing state of one staged decrease.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pacer {
    max_stall: Share,
    base_wait: Duration,
    step: u64,
    wait: Duration,
    holding: bool,
    /// Since the first hold, steps grow by [`MIN_STEP`] instead of doubling.
    held_before: bool,
    /// The last harm seen.
    pub last: Option<Harm>,
    /// The highest stall share seen.
    pub worst_stall: f64,
    /// Passes that came over the ceiling.
    pub over_ceiling: u32,
    /// Times the reclaim went on hold.
    pub holds: u32,
    /// Bytes refaulted while paced.
    pub refaulted: u64,
    /// The container's usage when the reclaim first held: where it reached the working set.
    pub usage_at_first_hold: Option<u64>,
}

impl Pacer {
    /// `base_wait`: the configured pause between passes (the shortest the pacer uses).
    #[must_use]
    pub fn new(max_stall: Share, base_wait: Duration) -> Self {
        Self {
            max_stall,
            base_wait,
            step: FIRST_STEP,
            wait: base_wait,
            holding: false,
            held_before: false,
            last: None,
            worst_stall: 0.0,
            over_ceiling: 0,
            holds: 0,
            refaulted: 0,
            usage_at_first_hold: None,
        }
    }

    /// Bytes to reclaim next, given `left` bytes still to go: 0 while holding.
    #[must_use]
    pub fn step(&self, left: u64) -> u64 {
        if self.holding {
            0
        } else {
            self.step.min(left)
        }
    }

    /// The pause before the next pass.
    #[must_use]
    pub fn wait(&self) -> Duration {
        self.wait
    }

    #[must_use]
    pub fn holding(&self) -> bool {
        self.holding
    }

    #[must_use]
    pub fn max_stall(&self) -> Share {
        self.max_stall
    }

    /// Adjusts to the harm measured since the previous pass; `usage`: the container's memory
    /// usage now.
    pub fn observe(&mut self, harm: Harm, usage: u64) -> PaceChange {
        let stall = harm.stall();
        self.last = Some(harm);
        self.worst_stall = self.worst_stall.max(stall);
        self.refaulted = self.refaulted.saturating_add(harm.refaulted);
        let ceiling = self.max_stall.get();
        if stall > ceiling {
            self.over_ceiling += 1;
        }
        // `> 0`: a ceiling of 0 still lets a reclaim that stalls nothing go on.
        if stall > 0.0 && stall >= ceiling / 2.0 {
            if !self.holding {
                self.holds += 1;
            }
            self.usage_at_first_hold.get_or_insert(usage);
            (self.holding, self.held_before) = (true, true);
            self.step = MIN_STEP;
            self.wait = (self.wait * 2).clamp(self.base_wait, MAX_WAIT.max(self.base_wait));
            PaceChange::Hold
        } else if self.holding && stall > 0.0 && stall >= ceiling / 4.0 {
            PaceChange::Hold
        } else if self.holding {
            self.holding = false;
            self.wait = (self.wait / 2).max(self.base_wait);
            PaceChange::Resume
        } else if stall <= 0.0 || stall < ceiling / 4.0 {
            self.step = if self.held_before {
                self.step.saturating_add(MIN_STEP)
            } else {
                self.step.saturating_mul(2)
            };
            self.wait = (self.wait / 2).max(self.base_wait);
            PaceChange::Faster
        } else {
            PaceChange::Same
        }
    }

    /// The usage a limit kept at the timeout should leave room for: once the reclaim had to hold,
    /// at least the usage it had then (below it the workload was already stalling), so that a
    /// working set the reclaim cut into and that has not refaulted back yet is not squeezed.
    #[must_use]
    pub fn kept_usage(&self, usage: u64) -> u64 {
        usage.max(self.usage_at_first_hold.unwrap_or(0))
    }

    /// What a deferred decrease adds to its reason when pacing held it back: `"; paced by the
    /// workload's stall (the higher of memory and I/O pressure): 12 % at the last pass, up to
    /// 31 %, ceiling 5 %; held 2 time(s), 7 pass(es) over the ceiling, holding at the end;
    /// 3.2Mi refaulted meanwhile"`.
    #[must_use]
    pub fn deferred_note(&self) -> String {
        match self.last {
            Some(last) if self.holds > 0 => format!(
                "; paced by the workload's stall (the higher of memory and I/O pressure): {} % at the last pass, up to {} %, ceiling {} %; held {} time(s) (first at usage {}), {} pass(es) over the ceiling, {}; {} refaulted meanwhile",
                pct(last.stall()),
                pct(self.worst_stall),
                pct(self.max_stall.get()),
                self.holds,
                bytes_text(self.usage_at_first_hold.unwrap_or(0)),
                self.over_ceiling,
                if self.holding {
                    "holding at the end".to_owned()
                } else {
                    format!("next step {}", bytes_text(self.step))
                },
                bytes_text(self.refaulted),
            ),
            _ => String::new(),
        }
    }
}

#[cfg(test)]
mod tests;
