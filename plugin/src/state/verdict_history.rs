//! One container's counter history for verdicts, bounded by the window, not by its length in
//! observer intervals.
//!
//! A verdict needs the counters at four instants: a window before the first resize, the resize
//! itself (twice, when resizes fold) and a window after the last. Keeping every observation
//! for two windows cost one sample per interval per container: 65 samples at the default 30 s
//! window and 1 s interval, 7,200 at a 1 h window, for each of hundreds of containers that are
//! never resized. The history keeps samples about [`SPACING`]`th` of a window apart, the newest
//! observation (overwritten every interval until the spacing has passed) and, pinned when a
//! resize is applied, the observation just before it. Rates stay exact: a window's statistics
//! are divided by the wall time between the two samples that bound it; only where a window
//! starts moves, by at most a spacing.

use std::collections::VecDeque;

use crate::policy::CounterSample;

/// Samples per window kept apart (the before-window's start is off by at most 1/8 window).
pub const SPACING: u64 = 8;

/// A [`CounterSample`] as kept: `None` is `u64::MAX` (no counter reaches it), 40 bytes instead
/// of 64, for every container the node runs (issue 37: ≤ 10 KiB per container in all).
#[derive(Clone, Copy, Debug)]
struct Kept {
    at_ms: u64,
    throttled_ns: u64,
    cpu_stall_us: u64,
    memory_stall_us: u64,
    oom_kills: u64,
}

const NONE: u64 = u64::MAX;

impl From<CounterSample> for Kept {
    fn from(s: CounterSample) -> Self {
        Kept {
            at_ms: s.at_ms,
            throttled_ns: s.throttled_ns.unwrap_or(NONE),
            cpu_stall_us: s.cpu_stall_us.unwrap_or(NONE),
            memory_stall_us: s.memory_stall_us.unwrap_or(NONE),
            oom_kills: s.oom_kills,
        }
    }
}

impl From<Kept> for CounterSample {
    fn from(k: Kept) -> Self {
        let some = |v: u64| (v != NONE).then_some(v);
        CounterSample {
            at_ms: k.at_ms,
            throttled_ns: some(k.throttled_ns),
            cpu_stall_us: some(k.cpu_stall_us),
            memory_stall_us: some(k.memory_stall_us),
            oom_kills: k.oom_kills,
        }
    }
}

/// Samples a history holds in steady state: two windows at [`SPACING`] per window, the newest
/// and a pinned one. Reserved at the first sample, so the buffer does not double past it.
#[expect(clippy::cast_possible_truncation, reason = "SPACING is 8")]
const STEADY: usize = 2 * SPACING as usize + 3;

/// Counter samples of one container, oldest first.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<Kept>,
    /// The newest sample stays: the next one is appended, not written over it.
    pinned: bool,
}

impl History {
    /// Adds the observation `s` for a window of `window_ms`; drops what is older than `keep_from`.
    pub fn record(&mut self, s: CounterSample, window_ms: u64, keep_from: u64) {
        let s = Kept::from(s);
        if self.samples.capacity() == 0 {
            self.samples.reserve_exact(STEADY);
        }
        let spacing = window_ms / SPACING;
        let len = self.samples.len();
        // The newest sample is written over until it lies a spacing after the one before it.
        let overwrite = !self.pinned
            && len >= 2
            && self.samples[len - 1]
                .at_ms
                .saturating_sub(self.samples[len - 2].at_ms)
                < spacing;
        if overwrite {
            self.samples[len - 1] = s;
        } else {
            self.samples.push_back(s);
        }
        self.pinned = false;
        while self.samples.front().is_some_and(|f| f.at_ms < keep_from) {
            self.samples.pop_front();
        }
    }

    /// A resize was applied now: the newest sample, the last before it, stays.
    pub fn pin(&mut self) {
        self.pinned = true;
    }

    /// The samples in time order.
    pub fn samples(&self) -> Vec<CounterSample> {
        self.samples
            .iter()
            .copied()
            .map(CounterSample::from)
            .collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    #[cfg(test)]
    pub fn push_unthinned(&mut self, s: CounterSample) {
        self.samples.push_back(Kept::from(s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at_ms: u64) -> CounterSample {
        CounterSample {
            at_ms,
            throttled_ns: Some(at_ms * 10),
            cpu_stall_us: None,
            memory_stall_us: None,
            oom_kills: 0,
        }
    }

    /// Every second for `secs` seconds, a 30 s window, two windows and 5 s kept.
    fn fed(h: &mut History, from_s: u64, secs: u64) {
        for t in from_s..from_s + secs {
            let now = t * 1_000;
            h.record(at(now), 30_000, now.saturating_sub(65_000));
        }
    }

    #[test]
    fn the_history_is_bounded_by_the_window_not_the_interval() {
        let mut h = History::default();
        fed(&mut h, 0, 3_600);
        // Two windows and 5 s at a 3.75 s spacing, and the newest: not 65 samples.
        assert!(h.len() <= 20, "{} samples kept", h.len());
        let s = h.samples();
        assert_eq!(
            s.last().map(|s| s.at_ms),
            Some(3_599_000),
            "the newest is kept"
        );
        assert!(
            s[0].at_ms >= 3_599_000 - 65_000,
            "nothing older than kept: {s:?}"
        );
        // Spaced at least 3.75 s apart, but for the newest.
        for w in s[..s.len() - 1].windows(2) {
            assert!(w[1].at_ms - w[0].at_ms >= 3_750, "{w:?}");
        }
        // A 1 s window keeps every sample of its 7 s.
        let mut short = History::default();
        for t in 0..100 {
            short.record(at(t * 1_000), 1_000, (t * 1_000).saturating_sub(7_000));
        }
        assert_eq!(short.len(), 8);
    }

    #[test]
    fn a_pinned_sample_is_not_written_over() {
        let mut h = History::default();
        fed(&mut h, 0, 10);
        let before = h.samples().last().copied().expect("a sample");
        h.pin();
        fed(&mut h, 10, 2);
        let s = h.samples();
        assert!(
            s.contains(&before),
            "the sample before the resize stays: {s:?}"
        );
        assert_eq!(s.last().map(|s| s.at_ms), Some(11_000));
        // Unpinned, the newest is written over again.
        let n = h.len();
        fed(&mut h, 12, 1);
        assert_eq!(h.len(), n);
    }

    /// What is kept reads back as it was given: absent counters stay absent, zeros stay zeros.
    #[test]
    fn a_kept_sample_reads_back_unchanged() {
        let mut h = History::default();
        let absent = CounterSample {
            at_ms: 5,
            throttled_ns: None,
            cpu_stall_us: Some(0),
            memory_stall_us: None,
            oom_kills: 2,
        };
        h.push_unthinned(absent);
        h.push_unthinned(at(10));
        assert_eq!(h.samples(), vec![absent, at(10)]);
    }
}
