//! The staged reclaim loop on fake and tempdir memcgs, on a fake clock: the loop's pauses and
//! timeout, the fake memcg's stall and the wall time pacing divides it by are the clock's, so
//! every run takes the same passes (no sleeping, nothing depends on the machine's load).

use std::sync::Mutex;

use super::*;
use crate::cgroup::{ActualResources, CpuLimit, StallTotals};
use crate::clock::FakeClock;

const MIB: u64 = 1 << 20;

/// A fake memcg: usage falls to what is reclaimable's floor when the kernel is asked.
#[derive(Debug)]
struct FakeMemcg {
    version: CgroupVersion,
    has_reclaim: bool,
    state: Mutex<Fake>,
    /// The time the loop runs on, and the fake's own stall accrues on.
    clock: FakeClock,
}

#[derive(Debug, Default)]
struct Fake {
    usage: u64,
    /// Usage never falls below this (anonymous memory, no swap).
    floor: u64,
    limit: u64,
    high: Option<u64>,
    writes: Vec<String>,
    /// `memory.pressure`'s `some` total (`None`: no PSI).
    psi_us: Option<u64>,
    /// Stall the workload suffers per MiB reclaimed.
    stall_us_per_mib: u64,
    /// `io.pressure`'s `some` total (`None`: unreadable), and its stall per MiB reclaimed.
    io_psi_us: Option<u64>,
    io_stall_us_per_mib: u64,
    /// Bytes refaulted: each reclaim's bytes come back at once.
    refaulted: u64,
    /// I/O stall the workload has of its own, reclaim or not (hundredths of a percent of wall
    /// time on the fake clock); `io.pressure`'s averages say as much.
    io_own_bp: u32,
    /// Someone else (kubelet's `MemoryQoS`) writes `memory.high` to this once the loop has
    /// written it `n` times (between two of its passes).
    owner_writes_high: Option<(usize, Option<u64>)>,
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
            clock: FakeClock::new(),
        }
    }

    /// Runs the staged decrease on this memcg and its fake clock.
    fn reclaim(
        &self,
        job: &ReclaimJob,
        cancel: &CancellationToken,
        on_pass: impl FnMut(&Pass),
    ) -> ReclaimOutcome {
        reclaim_with_clock(self, job, &self.clock, cancel, on_pass)
    }
}

impl CgroupIo for FakeMemcg {
    fn version(&self) -> CgroupVersion {
        self.version
    }
    fn read_actual(&self, _: &std::path::Path) -> Result<ActualResources, CgroupError> {
        unreachable!()
    }
    fn read_limits(&self, _: &std::path::Path) -> Result<crate::cgroup::CgroupLimits, CgroupError> {
        unreachable!()
    }
    fn set_cpu_limit(&self, _: &std::path::Path, _: CpuLimit) -> Result<(), CgroupError> {
        unreachable!()
    }
    fn procs(&self, _: &std::path::Path) -> Result<Vec<u32>, CgroupError> {
        unreachable!()
    }
    fn set_memory_limit(&self, _: &std::path::Path, limit: Option<u64>) -> Result<(), CgroupError> {
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
        let mut s = self.state.lock().unwrap();
        // The owner's write lands between the loop's passes (the loop reads usage after each).
        let n = s.writes.iter().filter(|w| w.starts_with("high")).count();
        if let Some((after, owners)) = s.owner_writes_high {
            if n == after {
                s.high = owners;
                s.owner_writes_high = None;
            }
        }
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
        let stall = s.stall_us_per_mib * (bytes / MIB);
        if let Some(p) = &mut s.psi_us {
            *p += stall;
        }
        let io_stall = s.io_stall_us_per_mib * (bytes / MIB);
        if let Some(p) = &mut s.io_psi_us {
            *p += io_stall;
        }
        if stall + io_stall > 0 {
            s.refaulted += bytes;
        }
        // The write takes as long as the workload stalls on it (at least that long: the
        // workload waits on this very reclaim).
        self.clock
            .advance(Duration::from_micros(stall.max(io_stall)));
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
    fn set_memory_high(&self, _: &std::path::Path, high: Option<u64>) -> Result<(), CgroupError> {
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
    fn memory_high(&self, _: &std::path::Path) -> Result<Option<u64>, CgroupError> {
        Ok(self.state.lock().unwrap().high)
    }
    fn memory_pressure(&self, _: &std::path::Path) -> Result<StallTotals, CgroupError> {
        let s = self.state.lock().unwrap();
        s.psi_us
            .map(|some_us| StallTotals {
                some_us,
                full_us: Some(0),
                some_steady_bp: Some(0),
            })
            .ok_or(CgroupError::Unsupported {
                what: "memory.pressure",
                version: self.version,
            })
    }
    fn io_pressure(&self, _: &std::path::Path) -> Result<StallTotals, CgroupError> {
        let s = self.state.lock().unwrap();
        let own_us = u64::try_from(self.clock.passed().as_micros()).unwrap()
            * u64::from(s.io_own_bp)
            / 10_000;
        s.io_psi_us
            .map(|some_us| StallTotals {
                some_us: some_us + own_us,
                full_us: Some(0),
                some_steady_bp: Some(s.io_own_bp),
            })
            .ok_or(CgroupError::Unsupported {
                what: "io.pressure",
                version: self.version,
            })
    }
    fn workingset_refaults(&self, _: &std::path::Path) -> Result<u64, CgroupError> {
        Ok(self.state.lock().unwrap().refaulted)
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
        max_stall: Share::new(1.0),
        writes: Arc::default(),
    }
}

#[test]
fn v1_page_cache_converges_in_one_limit_write() {
    let fake = FakeMemcg::new(CgroupVersion::V1, 450 * MIB, 50 * MIB, 466 * MIB);
    let out = fake.reclaim(
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
    let out = fake.reclaim(
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
    let out = fake.reclaim(&job(128 * MIB, 466 * MIB), &CancellationToken::new(), |p| {
        seen.push(*p);
    });
    assert!(matches!(out, ReclaimOutcome::Reached { .. }), "{out:?}");
    let s = fake.state.lock().unwrap();
    assert_eq!(s.writes, ["reclaim 323"]);
    assert!(s.usage <= 128 * MIB);
    let last = seen.last().expect("a pass");
    assert_eq!(last.usage.usage, s.usage);
    assert_eq!(last.limit, 466 * MIB, "v2: the cgroup keeps the interim");
}

fn paced(job: ReclaimJob) -> ReclaimJob {
    ReclaimJob {
        max_stall: Share::new(0.05),
        timeout: Duration::from_secs(20),
        ..job
    }
}

/// Reclaim sizes asked for, in MiB.
fn reclaims(fake: &FakeMemcg) -> Vec<u64> {
    let s = fake.state.lock().unwrap();
    s.writes
        .iter()
        .filter_map(|w| w.strip_prefix("reclaim ")?.parse().ok())
        .collect()
}

/// The step of every paced pass, in MiB (0: holding).
fn paced_steps(fake: &FakeMemcg, j: &ReclaimJob) -> (ReclaimOutcome, Vec<u64>) {
    let mut steps = Vec::new();
    let out = fake.reclaim(j, &CancellationToken::new(), |p| {
        steps.push(p.step.expect("paced") / MIB);
    });
    (out, steps)
}

#[test]
fn paced_reclaim_holds_while_the_workload_stalls_resumes_small_and_still_converges() {
    let fake = FakeMemcg::new(CgroupVersion::V2, 100 * MIB, 0, 116 * MIB);
    {
        let mut s = fake.state.lock().unwrap();
        s.psi_us = Some(0);
        // 2 ms of stall per MiB: every step is over 5 % of a pause; the hold after it is not.
        s.stall_us_per_mib = 2_000;
    }
    let (out, steps) = paced_steps(&fake, &paced(job(84 * MIB, 116 * MIB)));
    assert!(matches!(out, ReclaimOutcome::Reached { .. }), "{out:?}");
    assert!(
        steps.windows(2).all(|w| w[0] == 0 || w[1] == 0),
        "a hold after every step: {steps:?}"
    );
    assert!(
        reclaims(&fake).iter().all(|s| *s == 1),
        "{:?}",
        reclaims(&fake)
    );
    assert!(fake.state.lock().unwrap().usage <= 84 * MIB);
}

#[test]
fn io_stall_alone_holds_a_paced_reclaim() {
    let fake = FakeMemcg::new(CgroupVersion::V2, 100 * MIB, 0, 116 * MIB);
    {
        let mut s = fake.state.lock().unwrap();
        (s.psi_us, s.io_psi_us) = (Some(0), Some(0));
        // Refaults waiting on I/O only, as on 6.12.
        s.io_stall_us_per_mib = 2_000;
    }
    let (out, steps) = paced_steps(&fake, &paced(job(92 * MIB, 116 * MIB)));
    assert!(matches!(out, ReclaimOutcome::Reached { .. }), "{out:?}");
    assert!(steps.contains(&0), "held: {steps:?}");
    assert!(
        reclaims(&fake).iter().all(|s| *s == 1),
        "{:?}",
        reclaims(&fake)
    );
}

#[test]
fn the_workloads_own_io_stall_does_not_hold_a_paced_reclaim() {
    let fake = FakeMemcg::new(CgroupVersion::V2, 100 * MIB, 0, 116 * MIB);
    {
        let mut s = fake.state.lock().unwrap();
        (s.psi_us, s.io_psi_us) = (Some(0), Some(0));
        // A database waiting on its disk 8 % of the time, reclaim or not (`avg60=8.00`).
        s.io_own_bp = 800;
    }
    let j = paced(job(68 * MIB, 116 * MIB));
    let (out, steps) = paced_steps(&fake, &j);
    assert!(
        matches!(out, ReclaimOutcome::Reached { .. }),
        "its own 8 % is not the reclaim's harm: {out:?} {steps:?}"
    );
    assert!(!steps.contains(&0), "never held: {steps:?}");
}

#[test]
fn paced_reclaim_grows_its_steps_while_the_stall_stays_low() {
    let fake = FakeMemcg::new(CgroupVersion::V2, 400 * MIB, 0, 416 * MIB);
    {
        let mut s = fake.state.lock().unwrap();
        (s.psi_us, s.io_psi_us) = (Some(0), Some(0));
    }
    let out = fake.reclaim(
        &paced(job(16 * MIB, 416 * MIB)),
        &CancellationToken::new(),
        |_| {},
    );
    assert!(matches!(out, ReclaimOutcome::Reached { .. }), "{out:?}");
    // 1, 2, 4, ... 128, then the rest (the request rounds up a little past the gap).
    let steps = reclaims(&fake);
    assert_eq!(&steps[..8], [1, 2, 4, 8, 16, 32, 64, 128], "{steps:?}");
    assert_eq!(steps.len(), 9, "{steps:?}");
}

#[test]
fn a_paced_memory_high_reclaim_puts_memory_high_back_to_max_while_it_holds() {
    let mut fake = FakeMemcg::new(CgroupVersion::V2, 100 * MIB, 0, 116 * MIB);
    fake.has_reclaim = false;
    {
        let mut s = fake.state.lock().unwrap();
        s.psi_us = Some(0);
        s.stall_us_per_mib = 2_000;
    }
    // The fake stalls on memory.reclaim only: make the first step's pass stall by hand (the
    // workload stalled the whole second the pass took).
    let mut j = paced(job(90 * MIB, 116 * MIB));
    j.force_memory_high = true;
    let first = std::cell::Cell::new(true);
    let out = fake.reclaim(&j, &CancellationToken::new(), |_| {
        if first.replace(false) {
            *fake.state.lock().unwrap().psi_us.as_mut().unwrap() += 1_000_000;
            fake.clock.advance(Duration::from_secs(1));
        }
    });
    assert!(matches!(out, ReclaimOutcome::Reached { .. }), "{out:?}");
    let s = fake.state.lock().unwrap();
    assert_eq!(s.high, None, "{:?}", s.writes);
    assert_eq!(
        &s.writes[..2],
        ["high 99", "high max"],
        "held after the first step"
    );
}

#[test]
fn without_psi_a_paced_job_reclaims_unpaced() {
    let fake = FakeMemcg::new(CgroupVersion::V2, 450 * MIB, 50 * MIB, 466 * MIB);
    let out = fake.reclaim(
        &paced(job(128 * MIB, 466 * MIB)),
        &CancellationToken::new(),
        |_| {},
    );
    assert!(matches!(out, ReclaimOutcome::Reached { .. }), "{out:?}");
    assert_eq!(reclaims(&fake), [323]);
}

#[test]
fn pacing_never_gives_up_before_the_timeout_which_names_the_stall() {
    // Anonymous memory above the target, and every step stalls the workload.
    let fake = FakeMemcg::new(CgroupVersion::V2, 300 * MIB, 200 * MIB, 316 * MIB);
    {
        let mut s = fake.state.lock().unwrap();
        s.psi_us = Some(0);
        s.stall_us_per_mib = 50_000;
    }
    let mut j = paced(job(100 * MIB, 316 * MIB));
    j.timeout = Duration::from_millis(300);
    let out = fake.reclaim(&j, &CancellationToken::new(), |_| {});
    let ReclaimOutcome::TimedOut {
        stall_note,
        kept,
        end,
        elapsed,
        ..
    } = out
    else {
        panic!("{out:?}");
    };
    assert!(
        elapsed >= j.timeout,
        "it held on until the timeout: {elapsed:?}"
    );
    assert_eq!(
        elapsed,
        fake.clock.passed(),
        "the outcome's time is the clock's"
    );
    assert!(end.usage < 299 * MIB, "it resumed after holding: {end:?}");
    assert_eq!(
        kept,
        315 * MIB,
        "room for the 299 MiB it first held at, plus headroom"
    );
    assert!(
        stall_note.starts_with(
            "; paced by the workload's stall (the higher of memory and I/O pressure): "
        ) && stall_note.contains("up to 100 %, ceiling 5 %")
            && stall_note.contains("refaulted meanwhile"),
        "{stall_note}"
    );
}

#[test]
fn v2_without_memory_reclaim_steps_memory_high_and_restores_it() {
    let mut fake = FakeMemcg::new(CgroupVersion::V2, 450 * MIB, 50 * MIB, 466 * MIB);
    fake.has_reclaim = false;
    let out = fake.reclaim(
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
    let out = fake.reclaim(
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

/// `memory.high` set before (kubelet's `MemoryQoS`): the loop never sets it higher, and puts it
/// back afterwards, in every outcome.
#[test]
fn a_memory_high_found_is_never_exceeded_and_is_put_back() {
    for (usage, floor, target, outcome) in [(450, 50, 128, "reached"), (320, 300, 100, "timed out")]
    {
        let mut fake = FakeMemcg::new(CgroupVersion::V2, usage * MIB, floor * MIB, 466 * MIB);
        fake.has_reclaim = false;
        fake.state.lock().unwrap().high = Some(400 * MIB);
        let out = fake.reclaim(
            &job(target * MIB, 466 * MIB),
            &CancellationToken::new(),
            |_| {},
        );
        let s = fake.state.lock().unwrap();
        assert_eq!(
            s.high,
            Some(400 * MIB),
            "{outcome}: put back: {:?}",
            s.writes
        );
        assert!(
            matches!(
                (&out, outcome),
                (ReclaimOutcome::Reached { .. }, "reached")
                    | (ReclaimOutcome::TimedOut { .. }, "timed out")
            ),
            "{out:?}"
        );
        let highs: Vec<u64> = s
            .writes
            .iter()
            .filter_map(|w| w.strip_prefix("high ")?.parse().ok())
            .collect();
        assert!(highs.len() >= 2, "{outcome}: {:?}", s.writes);
        assert!(
            highs.iter().all(|h| *h <= 400),
            "{outcome}: never above the value found: {:?}",
            s.writes
        );
        assert_eq!(s.writes.last().map(String::as_str), Some("high 400"));
    }
}

/// Someone else writes `memory.high` while the loop steps it: theirs stays.
#[test]
fn a_memory_high_written_meanwhile_is_left_to_its_owner() {
    let mut fake = FakeMemcg::new(CgroupVersion::V2, 450 * MIB, 50 * MIB, 466 * MIB);
    fake.has_reclaim = false;
    fake.state.lock().unwrap().owner_writes_high = Some((1, Some(300 * MIB)));
    let out = fake.reclaim(
        &job(128 * MIB, 466 * MIB),
        &CancellationToken::new(),
        |_| {},
    );
    assert!(
        matches!(
            out,
            ReclaimOutcome::TimedOut { .. } | ReclaimOutcome::Reached { .. }
        ),
        "{out:?}"
    );
    let s = fake.state.lock().unwrap();
    assert_eq!(
        s.high,
        Some(300 * MIB),
        "the owner's value stays: {:?}",
        s.writes
    );
    assert!(
        !s.writes.iter().any(|w| w == "high max"),
        "never put back over the owner's: {:?}",
        s.writes
    );
}

#[test]
fn cancellation_stops_at_once_and_restores_memory_high() {
    let mut fake = FakeMemcg::new(CgroupVersion::V2, 320 * MIB, 300 * MIB, 336 * MIB);
    fake.has_reclaim = false;
    let cancel = CancellationToken::new();
    let mut j = job(100 * MIB, 336 * MIB);
    j.timeout = Duration::from_secs(60);
    j.step_interval = Duration::from_millis(50);
    // A newer update takes over after the second pass (its pause already begun once).
    let mut passes = 0;
    let out = fake.reclaim(&j, &cancel, |_| {
        passes += 1;
        if passes == 2 {
            cancel.cancel();
        }
    });
    assert_eq!(out, ReclaimOutcome::Cancelled);
    assert_eq!(passes, 2, "no pass after the cancel");
    let s = fake.state.lock().unwrap();
    assert_eq!(s.high, None);
    assert_eq!(
        s.writes.last().map(String::as_str),
        Some("high max"),
        "memory.high put back last: {:?}",
        s.writes
    );
    assert_eq!(
        fake.clock.passed(),
        Duration::from_millis(50),
        "one pause (before the second pass), none after the cancel"
    );
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

/// A memcg whose `at`-th call (any file) is where a newer update supersedes the decrease: the
/// token fires inside that call, as it would from the NRI handler's thread mid-pass.
#[derive(Debug)]
struct SupersededAt {
    inner: FakeMemcg,
    at: usize,
    calls: std::sync::atomic::AtomicUsize,
    cancel: CancellationToken,
    /// Writes made after the token fired.
    late_writes: Mutex<Vec<String>>,
}

impl SupersededAt {
    fn call(&self, write: Option<String>) {
        if let Some(w) = write {
            if self.cancel.is_cancelled() {
                self.late_writes.lock().unwrap().push(w);
            }
        }
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if n == self.at {
            self.cancel.cancel();
        }
    }
}

impl CgroupIo for SupersededAt {
    fn version(&self) -> CgroupVersion {
        self.inner.version()
    }
    fn read_actual(&self, p: &std::path::Path) -> Result<ActualResources, CgroupError> {
        self.inner.read_actual(p)
    }
    fn read_limits(&self, p: &std::path::Path) -> Result<crate::cgroup::CgroupLimits, CgroupError> {
        self.inner.read_limits(p)
    }
    fn set_cpu_limit(&self, p: &std::path::Path, l: CpuLimit) -> Result<(), CgroupError> {
        self.inner.set_cpu_limit(p, l)
    }
    fn procs(&self, p: &std::path::Path) -> Result<Vec<u32>, CgroupError> {
        self.inner.procs(p)
    }
    fn set_memory_limit(&self, p: &std::path::Path, l: Option<u64>) -> Result<(), CgroupError> {
        self.call(Some(format!("limit {:?}", l.map(|b| b / MIB))));
        self.inner.set_memory_limit(p, l)
    }
    fn memory_use(&self, p: &std::path::Path) -> Result<MemoryUse, CgroupError> {
        self.call(None);
        self.inner.memory_use(p)
    }
    fn reclaim(&self, p: &std::path::Path, bytes: u64) -> Result<(), CgroupError> {
        self.call(Some(format!("reclaim {}", bytes / MIB)));
        CgroupIo::reclaim(&self.inner, p, bytes)
    }
    fn set_memory_high(&self, p: &std::path::Path, h: Option<u64>) -> Result<(), CgroupError> {
        // Putting memory.high back to max is the clean-up a superseded decrease owes.
        let w = h.map(|h| format!("high {}", h / MIB));
        self.call(w);
        self.inner.set_memory_high(p, h)
    }
    fn memory_high(&self, p: &std::path::Path) -> Result<Option<u64>, CgroupError> {
        self.call(None);
        self.inner.memory_high(p)
    }
    fn memory_pressure(&self, p: &std::path::Path) -> Result<StallTotals, CgroupError> {
        self.call(None);
        self.inner.memory_pressure(p)
    }
    fn io_pressure(&self, p: &std::path::Path) -> Result<StallTotals, CgroupError> {
        self.call(None);
        self.inner.io_pressure(p)
    }
    fn workingset_refaults(&self, p: &std::path::Path) -> Result<u64, CgroupError> {
        self.call(None);
        self.inner.workingset_refaults(p)
    }
}

/// Issue: a staged decrease superseded mid-pass took one more step and reported it, which
/// overwrote the newer update's record. With the supersede landing inside each cgroup call of
/// the loop in turn (v1 limit writes, v2 `memory.reclaim`, v2 `memory.high` stepping), nothing
/// is written after it but `memory.high` going back to what was found, no pass is reported
/// after it, and the loop ends `Cancelled` unless it had already finished.
#[test]
fn a_supersede_at_any_call_of_the_loop_stops_it_there() {
    type Scenario = (&'static str, fn() -> FakeMemcg);
    let scenarios: [Scenario; 3] = [
        ("v1, anonymous floor above the target", || {
            FakeMemcg::new(CgroupVersion::V1, 450 * MIB, 200 * MIB, 466 * MIB)
        }),
        ("v2 memory.reclaim, paced", || {
            let f = FakeMemcg::new(CgroupVersion::V2, 450 * MIB, 50 * MIB, 466 * MIB);
            {
                let mut s = f.state.lock().unwrap();
                s.psi_us = Some(0);
                s.io_psi_us = Some(0);
            }
            f
        }),
        ("v2 memory.high stepping", || {
            let mut f = FakeMemcg::new(CgroupVersion::V2, 450 * MIB, 50 * MIB, 466 * MIB);
            f.has_reclaim = false;
            f
        }),
    ];
    for (name, make) in scenarios {
        let mut at = 1;
        loop {
            let io = SupersededAt {
                inner: make(),
                at,
                calls: std::sync::atomic::AtomicUsize::new(0),
                cancel: CancellationToken::new(),
                late_writes: Mutex::new(Vec::new()),
            };
            let mut reported_late = 0;
            let cancel = io.cancel.clone();
            let out = reclaim_with_clock(
                &io,
                &job(128 * MIB, 466 * MIB),
                &io.inner.clock,
                &cancel,
                |_| {
                    if io.cancel.is_cancelled() {
                        reported_late += 1;
                    }
                },
            );
            let fired = io.cancel.is_cancelled();
            assert!(
                io.late_writes.lock().unwrap().is_empty(),
                "{name}, superseded at call {at}: written after the supersede: {:?}",
                io.late_writes.lock().unwrap()
            );
            assert_eq!(
                reported_late, 0,
                "{name}, superseded at call {at}: a pass reported after it"
            );
            if !fired {
                // The loop ended before its `at`-th call: every call has been tried.
                assert!(
                    at > 2,
                    "{name}: the loop made too few calls to test ({out:?})"
                );
                break;
            }
            // Finished before the supersede: it landed in the last call, or in the read of
            // `memory.high` that precedes its put-back (the clean-up, the one write allowed
            // after it).
            let calls = io.calls.load(std::sync::atomic::Ordering::SeqCst);
            assert!(
                matches!(out, ReclaimOutcome::Cancelled)
                    || calls == at
                    || (calls == at + 1 && name == "v2 memory.high stepping"),
                "{name}, superseded at call {at} of {calls}: {out:?}"
            );
            at += 1;
        }
    }
}

/// A v1 memcg whose limit writes answer from a script (`Ok` or `EBUSY`, in order), holding
/// 300 MiB it never gives back; its `cancel_at`-th write is where a newer update supersedes the
/// decrease (the token fires inside the write, as while the kernel reclaims in it).
#[derive(Debug)]
struct ScriptedV1 {
    /// Whether each write succeeds, in order.
    script: Vec<bool>,
    cancel_at: usize,
    cancel: CancellationToken,
    /// Every limit write (MiB), and whether the token had fired when it was made.
    writes: Mutex<Vec<(u64, bool)>>,
}

impl CgroupIo for ScriptedV1 {
    fn version(&self) -> CgroupVersion {
        CgroupVersion::V1
    }
    fn read_actual(&self, _: &std::path::Path) -> Result<ActualResources, CgroupError> {
        unreachable!()
    }
    fn read_limits(&self, _: &std::path::Path) -> Result<crate::cgroup::CgroupLimits, CgroupError> {
        unreachable!()
    }
    fn set_cpu_limit(&self, _: &std::path::Path, _: CpuLimit) -> Result<(), CgroupError> {
        unreachable!()
    }
    fn procs(&self, _: &std::path::Path) -> Result<Vec<u32>, CgroupError> {
        unreachable!()
    }
    fn set_memory_limit(&self, _: &std::path::Path, limit: Option<u64>) -> Result<(), CgroupError> {
        let l = limit.unwrap();
        let mut writes = self.writes.lock().unwrap();
        writes.push((l / MIB, self.cancel.is_cancelled()));
        let n = writes.len();
        if n == self.cancel_at {
            self.cancel.cancel();
        }
        if self.script.get(n - 1).copied().unwrap_or(false) {
            Ok(())
        } else {
            Err(CgroupError::Busy {
                path: "/x".into(),
                value: l.to_string(),
                source: std::io::Error::from_raw_os_error(libc::EBUSY),
            })
        }
    }
    fn memory_use(&self, _: &std::path::Path) -> Result<MemoryUse, CgroupError> {
        Ok(MemoryUse {
            usage: 300 * MIB,
            anon: 300 * MIB,
            shmem: 0,
            file: 0,
        })
    }
    fn reclaim(&self, _: &std::path::Path, _: u64) -> Result<(), CgroupError> {
        unreachable!("v1 never writes memory.reclaim")
    }
    fn set_memory_high(&self, _: &std::path::Path, _: Option<u64>) -> Result<(), CgroupError> {
        unreachable!("v1 has no memory.high")
    }
    fn memory_high(&self, _: &std::path::Path) -> Result<Option<u64>, CgroupError> {
        Ok(None)
    }
}

/// Audit: on v1 a limit write blocks while the kernel reclaims, so a newer update can supersede
/// the decrease during it. Whichever write that is (the target, the limit following usage down,
/// or the kept limit written at the timeout), once it returns nothing more is written and the
/// loop ends `Cancelled`: never `TimedOut` with a `kept` limit the caller would have the runtime
/// apply over the newer update's.
#[test]
fn a_v1_decrease_superseded_during_a_limit_write_writes_nothing_after_it() {
    // The job times out after its first pass: target 100, following usage down to 316, then
    // keeping 316 at the timeout.
    let cases: [(&str, Vec<bool>, usize); 4] = [
        ("the target write, refused", vec![false], 1),
        ("the follow-down write", vec![false, true], 2),
        (
            "the timeout's write of the kept limit",
            vec![false, false, true],
            3,
        ),
        (
            "the timeout's write of the kept limit, refused",
            vec![false, false, false],
            3,
        ),
    ];
    for (name, script, cancel_at) in cases {
        let io = ScriptedV1 {
            script,
            cancel_at,
            cancel: CancellationToken::new(),
            writes: Mutex::new(Vec::new()),
        };
        let mut j = job(100 * MIB, 400 * MIB);
        j.timeout = Duration::ZERO;
        let clock = FakeClock::new();
        let cancel = io.cancel.clone();
        let out = reclaim_with_clock(&io, &j, &clock, &cancel, |_| {});
        let writes = io.writes.lock().unwrap().clone();
        assert_eq!(writes.len(), cancel_at, "{name}: {writes:?}");
        assert!(
            writes.iter().all(|(_, late)| !late),
            "{name}: a limit written after the supersede: {writes:?}"
        );
        assert_eq!(out, ReclaimOutcome::Cancelled, "{name}: {writes:?}");
    }
}

/// A v1 memcg whose first limit write stays inside the kernel (as `mem_cgroup_resize_max` does
/// while it reclaims) until the test releases it, and lands after.
#[derive(Debug)]
struct HeldInKernel {
    inner: FakeMemcg,
    entered: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    release: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl CgroupIo for HeldInKernel {
    fn version(&self) -> CgroupVersion {
        self.inner.version()
    }
    fn read_actual(&self, p: &std::path::Path) -> Result<ActualResources, CgroupError> {
        self.inner.read_actual(p)
    }
    fn read_limits(&self, p: &std::path::Path) -> Result<crate::cgroup::CgroupLimits, CgroupError> {
        self.inner.read_limits(p)
    }
    fn set_cpu_limit(&self, p: &std::path::Path, l: CpuLimit) -> Result<(), CgroupError> {
        self.inner.set_cpu_limit(p, l)
    }
    fn procs(&self, p: &std::path::Path) -> Result<Vec<u32>, CgroupError> {
        self.inner.procs(p)
    }
    fn set_memory_limit(&self, p: &std::path::Path, l: Option<u64>) -> Result<(), CgroupError> {
        if let Some(entered) = self.entered.lock().unwrap().take() {
            entered.send(()).unwrap();
            let release = self.release.lock().unwrap().take().unwrap();
            release.recv().unwrap();
        }
        self.inner.set_memory_limit(p, l)
    }
    fn memory_use(&self, p: &std::path::Path) -> Result<MemoryUse, CgroupError> {
        self.inner.memory_use(p)
    }
    fn reclaim(&self, p: &std::path::Path, bytes: u64) -> Result<(), CgroupError> {
        CgroupIo::reclaim(&self.inner, p, bytes)
    }
    fn set_memory_high(&self, p: &std::path::Path, h: Option<u64>) -> Result<(), CgroupError> {
        self.inner.set_memory_high(p, h)
    }
    fn memory_high(&self, p: &std::path::Path) -> Result<Option<u64>, CgroupError> {
        self.inner.memory_high(p)
    }
    fn memory_pressure(&self, p: &std::path::Path) -> Result<StallTotals, CgroupError> {
        self.inner.memory_pressure(p)
    }
    fn io_pressure(&self, p: &std::path::Path) -> Result<StallTotals, CgroupError> {
        self.inner.io_pressure(p)
    }
    fn workingset_refaults(&self, p: &std::path::Path) -> Result<u64, CgroupError> {
        self.inner.workingset_refaults(p)
    }
}

/// Issue 36 audit: a v1 limit write of a staged decrease still inside the kernel when a newer
/// kubelet update superseded the decrease landed after the runtime's write of the newer limit,
/// leaving the container at the decrease's lower limit. The loop marks every limit write in
/// `job.writes`; the supersede (`Reclaims::supersede_unless_applying`, whose own test shows it
/// waits on the mark) cancels and waits for the mark to clear before the newer update is
/// answered, so the runtime's write comes last.
#[test]
fn a_limit_write_inside_the_kernel_is_marked_until_it_lands() {
    use std::time::Instant;

    let cancel = CancellationToken::new();
    let j = job(128 * MIB, 466 * MIB);
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel();
    let io = HeldInKernel {
        inner: FakeMemcg::new(CgroupVersion::V1, 450 * MIB, 50 * MIB, 466 * MIB),
        entered: Mutex::new(Some(entered_tx)),
        release: Mutex::new(Some(release_rx)),
    };
    std::thread::scope(|s| {
        let looping = s.spawn(|| reclaim_with_clock(&io, &j, &io.inner.clock, &cancel, |_| {}));
        entered_rx.recv().unwrap();
        // The newer update supersedes the decrease while its write is inside the kernel.
        cancel.cancel();
        assert!(
            !j.writes.wait_idle(Instant::now()),
            "the write in the kernel is marked"
        );
        // The kernel lets the write go while the newer update's handler waits (or before).
        let releaser = s.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            release_tx.send(()).unwrap();
        });
        assert!(j.writes.wait_idle(Instant::now() + Duration::from_secs(60)));
        // Answered only now: the runtime writes the newer limit.
        io.inner
            .set_memory_limit(std::path::Path::new("/pod/ctr"), Some(512 * MIB))
            .unwrap();
        releaser.join().unwrap();
        assert_eq!(looping.join().unwrap(), ReclaimOutcome::Cancelled);
    });
    let s = io.inner.state.lock().unwrap();
    assert_eq!(
        s.limit,
        512 * MIB,
        "the newer limit is in place: {:?}",
        s.writes
    );
    assert_eq!(
        s.writes,
        ["limit 128", "limit 512"],
        "ours, then the runtime's"
    );
}
