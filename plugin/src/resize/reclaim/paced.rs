//! The pacing side of one staged decrease: reads the container's harm counters between passes
//! (`memory.pressure`, `io.pressure`, `memory.stat` refaults) and feeds the
//! [`Pacer`](crate::policy::Pacer) the shares since the last pass.

use std::time::Instant;

use super::ReclaimJob;
use crate::cgroup::{CgroupIo, CgroupVersion};
use crate::clock::Clock;
use crate::policy::{pacing_off_reason, Harm, Pacer};

/// Pacing of one staged decrease: the pacer and the last readings of the workload's harm.
pub(super) struct Paced {
    pub(super) pacer: Pacer,
    last: Readings,
    at: Instant,
    /// The stall the workload had of its own before the decrease (the lowest of the pressure
    /// files' 10 s, 1 min and 5 min averages, memory and I/O): only stall above it is the
    /// reclaim's harm. A database waiting
    /// on its disk 4 % of the time would otherwise hold every decrease until its timeout.
    own: (f64, f64),
}

/// Cumulative harm counters of the container: stalled µs (memory, I/O) and refaulted bytes.
#[derive(Clone, Copy)]
struct Readings {
    memory_us: u64,
    io_us: Option<u64>,
    refaulted: Option<u64>,
    /// The steady stall (the lowest of the three averages, a share) of memory and I/O.
    memory_steady: Option<f64>,
    io_steady: Option<f64>,
}

impl Readings {
    /// `None` when `memory.pressure` does not read (pacing needs it); I/O stall and refaults
    /// are optional.
    fn take(io: &dyn CgroupIo, cgroup: &std::path::Path) -> Option<Self> {
        let memory = io.memory_pressure(cgroup).ok()?;
        let io_stall = io.io_pressure(cgroup).ok();
        Some(Self {
            memory_us: memory.some_us,
            io_us: io_stall.map(|t| t.some_us),
            refaulted: io.workingset_refaults(cgroup).ok(),
            memory_steady: memory.some_steady(),
            io_steady: io_stall.and_then(|t| t.some_steady()),
        })
    }
}

impl Paced {
    /// On when `job` asks for it and the cgroup's `memory.pressure` reads; else logs why not.
    pub(super) fn start(io: &dyn CgroupIo, job: &ReclaimJob, clock: &dyn Clock) -> Option<Self> {
        if job.max_stall.get() >= 1.0 {
            return None;
        }
        let v1 = io.version() == CgroupVersion::V1;
        let first = if v1 {
            None
        } else {
            Readings::take(io, &job.cgroup)
        };
        if let Some(why) = pacing_off_reason(job.max_stall, first.is_some(), v1) {
            tracing::info!(cgroup = %job.cgroup.display(), reason = why, "staged memory decrease unpaced");
            return None;
        }
        let first = first?;
        if first.io_us.is_none() {
            tracing::info!(cgroup = %job.cgroup.display(), "staged memory decrease paced by memory stall only: io.pressure unreadable");
        }
        let own = (
            first.memory_steady.unwrap_or(0.0),
            first.io_steady.unwrap_or(0.0),
        );
        if own.0.max(own.1) > 0.0 {
            tracing::info!(
                cgroup = %job.cgroup.display(),
                memory_stall = format!("{:.1} %", own.0 * 100.0),
                io_stall = format!("{:.1} %", own.1 * 100.0),
                "staged memory decrease paced on the stall above the workload's own (steady over 10 s to 5 min)"
            );
        }
        Some(Self {
            pacer: Pacer::new(job.max_stall, job.step_interval),
            last: first,
            at: clock.now(),
            own,
        })
    }

    /// Reads the harm since the last reading and adjusts the pacer (an unreadable
    /// `memory.pressure` leaves it as it was).
    pub(super) fn observe(
        &mut self,
        io: &dyn CgroupIo,
        job: &ReclaimJob,
        clock: &dyn Clock,
        usage: u64,
    ) {
        let Some(now) = Readings::take(io, &job.cgroup) else {
            return;
        };
        let at = clock.now();
        let wall =
            u64::try_from(at.saturating_duration_since(self.at).as_micros()).unwrap_or(u64::MAX);
        let share = |stalled_us: u64| crate::observer::pressure::share(stalled_us, wall);
        let since = |now: Option<u64>, then: Option<u64>| Some(now?.saturating_sub(then?));
        let above = |share: f64, own: f64| (share - own).max(0.0);
        let harm = Harm {
            memory: above(
                share(now.memory_us.saturating_sub(self.last.memory_us)),
                self.own.0,
            ),
            io: above(
                since(now.io_us, self.last.io_us).map_or(0.0, share),
                self.own.1,
            ),
            refaulted: since(now.refaulted, self.last.refaulted).unwrap_or(0),
        };
        let change = self.pacer.observe(harm, usage);
        tracing::debug!(cgroup = %job.cgroup.display(), memory_stall = harm.memory, io_stall = harm.io, refaulted = harm.refaulted, ?change, next_step = self.pacer.step(u64::MAX), wait_ms = self.pacer.wait().as_millis(), "reclaim pacing");
        self.last = now;
        self.at = at;
    }
}

/// The usage a limit kept at the timeout leaves room for (see
/// [`Pacer::kept_usage`]); unpaced: usage now.
pub(super) fn kept_usage(paced: Option<&Paced>, usage: u64) -> u64 {
    paced.map_or(usage, |p| p.pacer.kept_usage(usage))
}
