//! One container's turn: read its counters, measure the harm since its last turn, ask the
//! [`Probe`] what to do, and do it. Blocking (cgroupfs reads, and a `memory.reclaim` write
//! that returns when the kernel has reclaimed): the runner calls it on a blocking thread.

use std::path::Path;
use std::time::Instant;

use super::probe::Writer;
use crate::cgroup::{CgroupError, CgroupIo};
use crate::observer::pressure::share;
use crate::policy::{CacheStat, Harm, Probe, TrimSettings, TrimStep};

/// A container's counters at one moment: the cache breakdown, and its cumulative stalled
/// microseconds (memory, and I/O where `io.pressure` reads).
#[derive(Clone, Copy, Debug)]
pub struct Readings {
    at: Instant,
    pub stat: CacheStat,
    memory_us: u64,
    io_us: Option<u64>,
}

impl Readings {
    pub fn take(io: &dyn CgroupIo, cgroup: &Path) -> Result<Self, CgroupError> {
        let stat = io.cache_stat(cgroup)?;
        let memory_us = io.memory_pressure(cgroup)?.some_us;
        let io_us = io.io_pressure(cgroup).ok().map(|t| t.some_us);
        Ok(Self {
            at: Instant::now(),
            stat,
            memory_us,
            io_us,
        })
    }

    /// The stall shares and refaults from `self` to `later`.
    fn harm_until(&self, later: &Self) -> Harm {
        let wall = u64::try_from(later.at.saturating_duration_since(self.at).as_micros())
            .unwrap_or(u64::MAX);
        let io = match (self.io_us, later.io_us) {
            (Some(a), Some(b)) => share(b.saturating_sub(a), wall),
            _ => 0.0,
        };
        Harm {
            memory: share(later.memory_us.saturating_sub(self.memory_us), wall),
            io,
            refaulted: later
                .stat
                .refaulted_file
                .saturating_sub(self.stat.refaulted_file),
        }
    }
}

/// What one turn did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Turn {
    /// `None`: the first reading of a probe (its baseline), nothing decided.
    pub step: Option<TrimStep>,
    /// The harm measured since the last turn.
    pub harm: Harm,
    /// Droppable page cache that went with the step (at most what it asked for).
    pub trimmed: u64,
    /// The container's usage at the end of the turn (`memory.current`).
    pub usage: u64,
}

/// One turn of a container: `last` is its previous reading (`None` at the start of a probe),
/// replaced by the reading this turn ends with.
pub fn turn(
    io: &dyn CgroupIo,
    cgroup: &Path,
    writer: Writer,
    settings: &TrimSettings,
    probe: &mut Probe,
    last: &mut Option<Readings>,
) -> Result<Turn, CgroupError> {
    let now = Readings::take(io, cgroup)?;
    let Some(before) = last.replace(now) else {
        return Ok(Turn {
            step: None,
            harm: Harm::default(),
            trimmed: 0,
            usage: now.stat.usage,
        });
    };
    let harm = before.harm_until(&now);
    let step = probe.decide(settings, &now.stat, harm);
    let mut trimmed = 0;
    let mut usage = now.stat.usage;
    if let TrimStep::Reclaim(bytes) = step {
        writer.reclaim(io, cgroup, bytes)?;
        // Measured from the end of the step: the next turn's harm is what the step caused.
        let after = Readings::take(io, cgroup)?;
        trimmed = now
            .stat
            .droppable()
            .saturating_sub(after.stat.droppable())
            .min(bytes);
        usage = after.stat.usage;
        *last = Some(after);
    }
    Ok(Turn {
        step: Some(step),
        harm,
        trimmed,
        usage,
    })
}
