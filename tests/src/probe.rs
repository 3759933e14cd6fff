//! Reading `/bin/latency-probe` (the busybox image's; source `latency_probe.c`): its windows of
//! per-read latencies, merged over a span of wall-clock time.
//!
//! The probe appends `w <start_ms> <end_ms> <count> <p50_ns> <p99_ns> <max_ns> <errors>` plus its
//! histogram (`<bucket lower bound ns>:<count>`, 8 buckets per power of two) every window. A span
//! merges the histograms of every window that overlaps it, so its percentiles are exact to the
//! bucket (a bucket's lower bound, at most 12.5 % under the true value); windows cut by the span's
//! edges count whole.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The probe's command line: `size_mib` of file at `file`, windows of `window_ms`, lines to `out`.
#[must_use]
pub fn command(file: &str, size_mib: u32, window_ms: u32, out: &str) -> String {
    format!("exec /bin/latency-probe {file} {size_mib} {window_ms} {out}")
}

/// One window of the probe's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Wall-clock bounds, ms since the epoch.
    pub start_ms: u64,
    pub end_ms: u64,
    /// Reads that failed (short or error).
    pub errors: u64,
    pub max_ns: u64,
    /// Bucket lower bound (ns) → reads.
    pub buckets: BTreeMap<u64, u64>,
}

/// The windows of the probe's output (other lines, e.g. `ready`, and torn last lines skipped).
#[must_use]
pub fn parse(text: &str) -> Vec<Window> {
    text.lines().filter_map(parse_window).collect()
}

fn parse_window(line: &str) -> Option<Window> {
    let mut words = line.strip_prefix("w ")?.split_whitespace();
    let mut num = || words.next()?.parse::<u64>().ok();
    let (start_ms, end_ms, _count, _p50, _p99, max_ns, errors) =
        (num()?, num()?, num()?, num()?, num()?, num()?, num()?);
    let mut buckets = BTreeMap::new();
    for pair in words {
        let (lower, n) = pair.split_once(':')?;
        buckets.insert(lower.parse().ok()?, n.parse().ok()?);
    }
    Some(Window {
        start_ms,
        end_ms,
        errors,
        max_ns,
        buckets,
    })
}

/// Milliseconds since the epoch (the probe's window bounds).
#[must_use]
pub fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads merged over a span of windows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Latency {
    pub windows: usize,
    pub reads: u64,
    pub errors: u64,
    pub max: Duration,
    buckets: BTreeMap<u64, u64>,
}

impl Latency {
    /// Every window overlapping `[from, to]`.
    #[must_use]
    pub fn between(windows: &[Window], from: SystemTime, to: SystemTime) -> Self {
        let (from, to) = (epoch_ms(from), epoch_ms(to));
        let mut l = Self::default();
        for w in windows
            .iter()
            .filter(|w| w.end_ms > from && w.start_ms < to)
        {
            l.windows += 1;
            l.errors += w.errors;
            l.max = l.max.max(Duration::from_nanos(w.max_ns));
            for (lower, n) in &w.buckets {
                *l.buckets.entry(*lower).or_default() += n;
                l.reads += n;
            }
        }
        l
    }

    /// The `q`-quantile (bucket lower bound); zero without reads.
    #[must_use]
    pub fn quantile(&self, q: f64) -> Duration {
        if self.reads == 0 {
            return Duration::ZERO;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a rank among at most millions of reads"
        )]
        let rank = ((self.reads - 1) as f64 * q.clamp(0.0, 1.0)) as u64;
        let mut seen = 0;
        for (lower, n) in &self.buckets {
            seen += n;
            if seen > rank {
                return Duration::from_nanos(*lower);
            }
        }
        Duration::ZERO
    }

    /// The share of reads slower than `d` (in buckets whose lower bound is above it).
    #[must_use]
    pub fn share_over(&self, d: Duration) -> f64 {
        let over: u64 = self
            .buckets
            .iter()
            .filter(|(lower, _)| u128::from(**lower) > d.as_nanos())
            .map(|(_, n)| n)
            .sum();
        nri_resize::observer::pressure::share(over, self.reads)
    }

    #[must_use]
    pub fn p50(&self) -> Duration {
        self.quantile(0.5)
    }

    #[must_use]
    pub fn p99(&self) -> Duration {
        self.quantile(0.99)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "ready 419430400\n\
        w 1000 1100 4 10 40 45 0 8:1 10:2 40:1\n\
        w 1100 1200 2 96 96 100 1 96:2\n\
        w 1200 13";

    #[test]
    fn windows_merge_over_a_span() {
        let w = parse(OUT);
        assert_eq!(w.len(), 2, "ready and the torn line skipped");
        let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        let all = Latency::between(&w, at(1050), at(1150));
        assert_eq!((all.windows, all.reads, all.errors), (2, 6, 1));
        assert_eq!(all.p50(), Duration::from_nanos(10));
        assert_eq!(all.p99(), Duration::from_nanos(96));
        assert_eq!(all.max, Duration::from_nanos(100));
        assert!((all.share_over(Duration::from_nanos(40)) - 2.0 / 6.0).abs() < 1e-9);
        let first = Latency::between(&w, at(1000), at(1100));
        assert_eq!((first.windows, first.p99()), (1, Duration::from_nanos(10)));
        assert_eq!(
            Latency::between(&w, at(5000), at(6000)).p99(),
            Duration::ZERO
        );
    }
}
