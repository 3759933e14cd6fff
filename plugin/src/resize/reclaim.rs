//! Staged reclaim: bring a container's memory usage under a lower limit without an OOM kill.
//!
//! The container runs under a safe interim limit (usage plus headroom) while this loop makes the
//! kernel reclaim, in passes with a growing pause between them:
//!
//! - cgroup v1: write the requested `memory.limit_in_bytes` directly. The kernel reclaims inside
//!   the write and refuses it with `EBUSY` when it cannot get under the value — it never OOM-kills
//!   for a v1 limit write. After a refusal the limit follows usage down (usage plus headroom),
//!   so what reclaim won stays won.
//! - cgroup v2: ask `memory.reclaim` for the difference (`EAGAIN`: it got less), and when the
//!   kernel has no `memory.reclaim` (before 5.19) step `memory.high` down towards the target
//!   instead, restoring it to `max` in every outcome. `memory.max` is never written here: writing
//!   it below unreclaimable usage OOM-kills. The caller applies the requested limit through the
//!   runtime once usage fits.
//!
//! Bounded in time: on timeout the limit kept is usage plus headroom (never above the interim,
//! never below the target), and the caller reports why.
//!
//! The loop is synchronous (cgroupfs writes block while the kernel reclaims): run it on a
//! blocking thread. It checks its cancellation token between passes, so a newer update for the
//! same container takes over at once.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::cgroup::{CgroupError, CgroupIo, CgroupVersion};
use crate::policy::{reclaim_request, safe_limit, MemoryUse};

/// One staged decrease of one cgroup.
#[derive(Debug, Clone)]
pub struct ReclaimJob {
    /// The container's cgroup (within the hierarchy, see [`crate::cgroup::resolve`]).
    pub cgroup: PathBuf,
    /// The requested limit.
    pub target: u64,
    /// The limit in place while reclaiming.
    pub interim: u64,
    /// Bytes above usage a kept limit leaves.
    pub headroom: u64,
    pub timeout: Duration,
    /// First pause between passes (doubles up to one second).
    pub step_interval: Duration,
    /// v2: step `memory.high` even where `memory.reclaim` exists.
    pub force_memory_high: bool,
}

/// How a staged decrease ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimOutcome {
    /// Usage fits the target (v1: the target limit is written).
    Reached {
        start: MemoryUse,
        end: MemoryUse,
        passes: u32,
        elapsed: Duration,
    },
    /// The target was not reached in time; `kept` is the limit to keep (v1: already written).
    TimedOut {
        start: MemoryUse,
        end: MemoryUse,
        kept: u64,
        passes: u32,
        elapsed: Duration,
    },
    /// A newer request took over.
    Cancelled,
    /// A cgroup read or write failed (e.g. the container is gone).
    Failed(String),
}

/// The reclaim method actually used, for logs and status.
pub fn method(io: &dyn CgroupIo, force_memory_high: bool) -> &'static str {
    match (io.version(), force_memory_high) {
        (CgroupVersion::V1, _) => "memory.limit_in_bytes",
        (CgroupVersion::V2, true) => "memory.high",
        (CgroupVersion::V2, false) => "memory.reclaim",
    }
}

const MAX_PAUSE: Duration = Duration::from_secs(1);
const SLICE: Duration = Duration::from_millis(10);

/// Sleeps `d` in small slices; `false` if cancelled meanwhile.
fn pause(d: Duration, cancel: &CancellationToken) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if cancel.is_cancelled() {
            return false;
        }
        std::thread::sleep(SLICE.min(until.saturating_duration_since(Instant::now())));
    }
    !cancel.is_cancelled()
}

/// Where a staged decrease stands after one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// The container's memory use after the pass.
    pub usage: MemoryUse,
    /// The memory limit the cgroup holds now (v1: it follows usage down; v2: the interim).
    pub limit: u64,
}

/// Runs the staged decrease; `on_pass` sees where it stands after every pass.
pub fn reclaim_to(
    io: &dyn CgroupIo,
    job: &ReclaimJob,
    cancel: &CancellationToken,
    mut on_pass: impl FnMut(&Pass),
) -> ReclaimOutcome {
    let started = Instant::now();
    let read = || io.memory_use(&job.cgroup).map_err(|e| e.to_string());
    let start = match read() {
        Ok(u) => u,
        Err(e) => return ReclaimOutcome::Failed(e),
    };
    let v1 = io.version() == CgroupVersion::V1;
    let mut use_high = !v1 && job.force_memory_high;
    let mut high_set = false;
    let restore_high = |high_set: bool| -> Result<(), String> {
        if high_set {
            io.set_memory_high(&job.cgroup, None)
                .map_err(|e| format!("restoring memory.high: {e}"))?;
        }
        Ok(())
    };
    let mut limit_now = job.interim;
    let mut wait = job.step_interval;
    let mut passes = 0u32;
    loop {
        if cancel.is_cancelled() {
            return match restore_high(high_set) {
                Ok(()) => ReclaimOutcome::Cancelled,
                Err(e) => ReclaimOutcome::Failed(e),
            };
        }
        passes += 1;
        let pass = if v1 {
            v1_pass(io, job, &mut limit_now)
        } else {
            v2_pass(io, job, &mut use_high, &mut high_set)
        };
        let now = match pass.and_then(|()| read()) {
            Ok(u) => u,
            Err(e) => {
                let _ = restore_high(high_set);
                return ReclaimOutcome::Failed(e);
            }
        };
        on_pass(&Pass {
            usage: now,
            limit: limit_now,
        });
        let reached = if v1 {
            limit_now == job.target
        } else {
            now.usage <= job.target
        };
        if reached {
            if let Err(e) = restore_high(high_set) {
                return ReclaimOutcome::Failed(e);
            }
            return ReclaimOutcome::Reached {
                start,
                end: now,
                passes,
                elapsed: started.elapsed(),
            };
        }
        if started.elapsed() >= job.timeout {
            let kept = safe_limit(limit_now, job.target, now.usage, job.headroom);
            if v1 && kept < limit_now {
                // Best effort: a refusal keeps the (higher, still safe) limit in place.
                if io.set_memory_limit(&job.cgroup, Some(kept)).is_ok() {
                    limit_now = kept;
                }
            }
            if let Err(e) = restore_high(high_set) {
                return ReclaimOutcome::Failed(e);
            }
            return ReclaimOutcome::TimedOut {
                start,
                end: now,
                kept: if v1 { limit_now } else { kept },
                passes,
                elapsed: started.elapsed(),
            };
        }
        let left = job.timeout.saturating_sub(started.elapsed());
        if !pause(wait.min(left), cancel) {
            continue; // handled at the top of the loop
        }
        wait = (wait * 2).min(MAX_PAUSE);
    }
}

/// v1: try the target; on `EBUSY` let the limit follow usage down.
fn v1_pass(io: &dyn CgroupIo, job: &ReclaimJob, limit_now: &mut u64) -> Result<(), String> {
    match io.set_memory_limit(&job.cgroup, Some(job.target)) {
        Ok(()) => {
            *limit_now = job.target;
            Ok(())
        }
        Err(CgroupError::Busy { .. }) => {
            let usage = io.memory_use(&job.cgroup).map_err(|e| e.to_string())?.usage;
            let follow = safe_limit(*limit_now, job.target, usage, job.headroom);
            if follow < *limit_now {
                match io.set_memory_limit(&job.cgroup, Some(follow)) {
                    Ok(()) => *limit_now = follow,
                    // Usage grew meanwhile: keep the limit in place.
                    Err(CgroupError::Busy { .. }) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// v2: `memory.reclaim`, or `memory.high` stepping where there is none.
fn v2_pass(
    io: &dyn CgroupIo,
    job: &ReclaimJob,
    use_high: &mut bool,
    high_set: &mut bool,
) -> Result<(), String> {
    let usage = io.memory_use(&job.cgroup).map_err(|e| e.to_string())?.usage;
    if usage <= job.target {
        return Ok(());
    }
    if !*use_high {
        match io.reclaim(&job.cgroup, reclaim_request(usage, job.target)) {
            Ok(()) | Err(CgroupError::Again { .. }) => return Ok(()),
            Err(CgroupError::Unsupported { .. }) => *use_high = true,
            Err(e) => return Err(e.to_string()),
        }
    }
    // Halfway down each pass (the last 32 MiB at once): the kernel throttles allocations above
    // `memory.high` and reclaims, so one big step would stall the workload.
    let gap = usage - job.target;
    let high = if gap <= 32 << 20 {
        job.target
    } else {
        usage - gap / 2
    };
    io.set_memory_high(&job.cgroup, Some(high))
        .map_err(|e| e.to_string())?;
    *high_set = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::cgroup::{ActualResources, CpuLimit};

    const MIB: u64 = 1 << 20;

    /// A fake memcg: usage falls to what is reclaimable's floor when the kernel is asked.
    #[derive(Debug)]
    struct FakeMemcg {
        version: CgroupVersion,
        has_reclaim: bool,
        state: Mutex<Fake>,
    }

    #[derive(Debug, Default)]
    struct Fake {
        usage: u64,
        /// Usage never falls below this (anonymous memory, no swap).
        floor: u64,
        limit: u64,
        high: Option<u64>,
        writes: Vec<String>,
    }

    impl FakeMemcg {
        fn new(version: CgroupVersion, usage: u64, floor: u64, limit: u64) -> Self {
            FakeMemcg {
                version,
                has_reclaim: true,
                state: Mutex::new(Fake {
                    usage,
                    floor,
                    limit,
                    ..Fake::default()
                }),
            }
        }
    }

    impl CgroupIo for FakeMemcg {
        fn version(&self) -> CgroupVersion {
            self.version
        }
        fn read_actual(&self, _: &std::path::Path) -> Result<ActualResources, CgroupError> {
            unreachable!()
        }
        fn set_cpu_limit(&self, _: &std::path::Path, _: CpuLimit) -> Result<(), CgroupError> {
            unreachable!()
        }
        fn procs(&self, _: &std::path::Path) -> Result<Vec<u32>, CgroupError> {
            unreachable!()
        }
        fn set_memory_limit(
            &self,
            _: &std::path::Path,
            limit: Option<u64>,
        ) -> Result<(), CgroupError> {
            let mut s = self.state.lock().unwrap();
            let l = limit.unwrap();
            s.writes.push(format!("limit {}", l / MIB));
            if l < s.floor {
                s.usage = s.usage.min(s.floor.max(l));
                return Err(CgroupError::Busy {
                    path: "/x".into(),
                    value: l.to_string(),
                    source: std::io::Error::from_raw_os_error(libc::EBUSY),
                });
            }
            s.usage = s.usage.min(l);
            s.limit = l;
            Ok(())
        }
        fn memory_use(&self, _: &std::path::Path) -> Result<MemoryUse, CgroupError> {
            let s = self.state.lock().unwrap();
            Ok(MemoryUse {
                usage: s.usage,
                anon: s.floor,
                shmem: 0,
                file: s.usage - s.floor,
            })
        }
        fn reclaim(&self, _: &std::path::Path, bytes: u64) -> Result<(), CgroupError> {
            if !self.has_reclaim {
                return Err(CgroupError::Unsupported {
                    what: "memory.reclaim",
                    version: self.version,
                });
            }
            let mut s = self.state.lock().unwrap();
            s.writes.push(format!("reclaim {}", bytes / MIB));
            let want = s.usage.saturating_sub(bytes);
            s.usage = want.max(s.floor);
            if want < s.floor {
                return Err(CgroupError::Again {
                    path: "/x".into(),
                    value: bytes.to_string(),
                    source: std::io::Error::from_raw_os_error(libc::EAGAIN),
                });
            }
            Ok(())
        }
        fn set_memory_high(
            &self,
            _: &std::path::Path,
            high: Option<u64>,
        ) -> Result<(), CgroupError> {
            let mut s = self.state.lock().unwrap();
            s.writes.push(format!(
                "high {}",
                high.map_or("max".into(), |h| (h / MIB).to_string())
            ));
            if let Some(h) = high {
                s.usage = s.usage.min(h.max(s.floor));
            }
            s.high = high;
            Ok(())
        }
    }

    fn job(target: u64, interim: u64) -> ReclaimJob {
        ReclaimJob {
            cgroup: "/pod/ctr".into(),
            target,
            interim,
            headroom: 16 * MIB,
            timeout: Duration::from_millis(200),
            step_interval: Duration::from_millis(1),
            force_memory_high: false,
        }
    }

    #[test]
    fn v1_page_cache_converges_in_one_limit_write() {
        let fake = FakeMemcg::new(CgroupVersion::V1, 450 * MIB, 50 * MIB, 466 * MIB);
        let out = reclaim_to(
            &fake,
            &job(128 * MIB, 466 * MIB),
            &CancellationToken::new(),
            |_| {},
        );
        assert!(
            matches!(&out, ReclaimOutcome::Reached { passes: 1, end, .. } if end.usage == 128 * MIB),
            "{out:?}"
        );
        assert_eq!(fake.state.lock().unwrap().writes, ["limit 128"]);
    }

    #[test]
    fn v1_anonymous_times_out_with_the_limit_following_usage_down() {
        let fake = FakeMemcg::new(CgroupVersion::V1, 330 * MIB, 300 * MIB, 346 * MIB);
        let out = reclaim_to(
            &fake,
            &job(100 * MIB, 346 * MIB),
            &CancellationToken::new(),
            |_| {},
        );
        let ReclaimOutcome::TimedOut { kept, end, .. } = out else {
            panic!("{out:?}");
        };
        assert_eq!(end.usage, 300 * MIB);
        assert_eq!(kept, 316 * MIB);
        let s = fake.state.lock().unwrap();
        assert_eq!(s.limit, 316 * MIB, "the kept limit is in place");
        assert!(
            s.writes
                .iter()
                .all(|w| w == "limit 100" || w == "limit 316"),
            "{:?}",
            s.writes
        );
    }

    #[test]
    fn v2_reclaims_until_usage_fits_and_never_writes_memory_max() {
        let fake = FakeMemcg::new(CgroupVersion::V2, 450 * MIB, 50 * MIB, 466 * MIB);
        let mut seen = Vec::new();
        let out = reclaim_to(
            &fake,
            &job(128 * MIB, 466 * MIB),
            &CancellationToken::new(),
            |p| seen.push(*p),
        );
        assert!(matches!(out, ReclaimOutcome::Reached { .. }), "{out:?}");
        let s = fake.state.lock().unwrap();
        assert_eq!(s.writes, ["reclaim 323"]);
        assert!(s.usage <= 128 * MIB);
        let last = seen.last().expect("a pass");
        assert_eq!(last.usage.usage, s.usage);
        assert_eq!(last.limit, 466 * MIB, "v2: the cgroup keeps the interim");
    }

    #[test]
    fn v2_without_memory_reclaim_steps_memory_high_and_restores_it() {
        let mut fake = FakeMemcg::new(CgroupVersion::V2, 450 * MIB, 50 * MIB, 466 * MIB);
        fake.has_reclaim = false;
        let out = reclaim_to(
            &fake,
            &job(128 * MIB, 466 * MIB),
            &CancellationToken::new(),
            |_| {},
        );
        assert!(matches!(out, ReclaimOutcome::Reached { .. }), "{out:?}");
        let s = fake.state.lock().unwrap();
        assert_eq!(s.high, None, "memory.high restored: {:?}", s.writes);
        assert!(
            s.writes.len() >= 3 && s.writes.last().unwrap() == "high max",
            "{:?}",
            s.writes
        );

        // Anonymous memory above the target: timed out, memory.high restored too.
        let mut fake = FakeMemcg::new(CgroupVersion::V2, 320 * MIB, 300 * MIB, 336 * MIB);
        fake.has_reclaim = false;
        let out = reclaim_to(
            &fake,
            &job(100 * MIB, 336 * MIB),
            &CancellationToken::new(),
            |_| {},
        );
        assert!(
            matches!(out, ReclaimOutcome::TimedOut { kept, .. } if kept == 316 * MIB),
            "{out:?}"
        );
        assert_eq!(fake.state.lock().unwrap().high, None);
    }

    #[test]
    fn cancellation_stops_at_once_and_restores_memory_high() {
        let mut fake = FakeMemcg::new(CgroupVersion::V2, 320 * MIB, 300 * MIB, 336 * MIB);
        fake.has_reclaim = false;
        let cancel = CancellationToken::new();
        let mut j = job(100 * MIB, 336 * MIB);
        j.timeout = Duration::from_secs(60);
        j.step_interval = Duration::from_millis(50);
        let c = cancel.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            c.cancel();
        });
        let started = Instant::now();
        let out = reclaim_to(&fake, &j, &cancel, |_| {});
        t.join().unwrap();
        assert_eq!(out, ReclaimOutcome::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(fake.state.lock().unwrap().high, None);
    }

    #[test]
    fn a_vanished_cgroup_is_a_clear_failure() {
        let cg = crate::cgroup::Cgroups::V2(crate::cgroup::V2 {
            root: "/nonexistent-nri-resize".into(),
        });
        let out = reclaim_to(&cg, &job(1, 2), &CancellationToken::new(), |_| {});
        assert!(
            matches!(&out, ReclaimOutcome::Failed(e) if e.contains("does not exist")),
            "{out:?}"
        );
    }
}
