//! The clocks of nri-resize: the one wall-clock source of the records people read (`updated_ms`,
//! `at_ms`, journal times), and the monotonic [`Clock`] of the loops that pace themselves (the
//! staged reclaim), real in the daemon and fake in unit tests, so that pacing is tested step by
//! step without sleeping.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Monotonic time and waiting, for a synchronous loop (it runs on a blocking thread).
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Instant;
    /// Waits `d`, or less when `cancel` fires meanwhile.
    fn sleep(&self, d: Duration, cancel: &CancellationToken);
}

/// The machine's monotonic clock; sleeps in small slices so a cancel ends the wait within one.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealClock;

/// How often a [`RealClock`] sleep looks at its cancellation token.
const SLICE: Duration = Duration::from_millis(10);

impl Clock for RealClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, d: Duration, cancel: &CancellationToken) {
        let until = Instant::now() + d;
        while Instant::now() < until && !cancel.is_cancelled() {
            std::thread::sleep(SLICE.min(until.saturating_duration_since(Instant::now())));
        }
    }
}

/// A clock that moves only when slept on (unit tests): a sleep of `d` advances it by `d` at
/// once, a cancelled sleep not at all. Deterministic: a loop on it sees the same times on every
/// run, however loaded the machine.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct FakeClock {
    start: FakeStart,
    passed: std::sync::Mutex<Duration>,
}

/// The instant a [`FakeClock`] starts from: when it was made.
#[cfg(test)]
#[derive(Debug)]
struct FakeStart(Instant);

#[cfg(test)]
impl Default for FakeStart {
    fn default() -> Self {
        Self(Instant::now())
    }
}

#[cfg(test)]
impl FakeClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// How far the clock has moved since it was made.
    pub fn passed(&self) -> Duration {
        *self.passed.lock().expect("fake clock")
    }

    /// Moves the clock by `d` (time the test lets pass, e.g. a slow cgroup write).
    pub fn advance(&self, d: Duration) {
        *self.passed.lock().expect("fake clock") += d;
    }
}

#[cfg(test)]
impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.start.0 + self.passed()
    }

    fn sleep(&self, d: Duration, cancel: &CancellationToken) {
        if !cancel.is_cancelled() {
            self.advance(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_clock_moves_only_when_slept_on_and_not_when_cancelled() {
        let clock = FakeClock::new();
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        let cancel = CancellationToken::new();
        clock.sleep(Duration::from_millis(250), &cancel);
        assert_eq!(clock.now() - t0, Duration::from_millis(250));
        cancel.cancel();
        clock.sleep(Duration::from_secs(5), &cancel);
        assert_eq!(clock.passed(), Duration::from_millis(250));
    }

    #[test]
    fn a_real_sleep_ends_when_cancelled() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        // Returns at once (a wait of an hour would hang the test otherwise): order, not time.
        RealClock.sleep(Duration::from_secs(3600), &cancel);
    }
}
