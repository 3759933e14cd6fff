//! The verdict on a resize: whether it hurt the workload. Pure: from the observer's cumulative
//! counters at a few instants to a [`Verdict`] and its reason.
//!
//! The window after a resize is applied is compared with the same length of time before it:
//! CPU throttling (throttled seconds per second), the cpu and memory `some` stall shares (PSI,
//! cgroup v2) and OOM kills. A resize is `harmful` when one of them got worse by more than its
//! threshold ([`VerdictThresholds`]), otherwise `healthy`. Without PSI the stall shares are not
//! compared (and the reason says the verdict rests on throttling and OOM kills only).

use serde::{Deserialize, Serialize};

use super::share::percent as pct;
use super::{cpu_text, memory_limit_text, Direction, Resource, Share};
use crate::model::LinuxResources;

/// The observer's cumulative counters of a container at one instant (`at_ms` on a monotonic
/// clock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterSample {
    pub at_ms: u64,
    /// CFS throttled time (`None`: no bandwidth statistics).
    pub throttled_ns: Option<u64>,
    /// PSI `some` totals (`None`: no PSI).
    pub cpu_stall_us: Option<u64>,
    pub memory_stall_us: Option<u64>,
    pub oom_kills: u64,
}

/// What happened to a container between two samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowStats {
    pub wall_ms: u64,
    /// Throttled seconds per second (can exceed 1 with several CPUs throttled at once).
    pub throttled: Option<f64>,
    /// Share of wall time some task waited for CPU / memory.
    pub cpu_stall: Option<f64>,
    pub memory_stall: Option<f64>,
    pub oom_kills: u64,
}

/// The difference of a cumulative counter; one that went backwards (cgroup recreated, eBPF
/// entry forgotten) counts from zero.
fn delta(from: u64, to: u64) -> u64 {
    if to >= from {
        to - from
    } else {
        to
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "a rate for display and comparison"
)]
fn per_wall(amount: u64, unit_per_ms: f64, wall_ms: u64) -> f64 {
    if wall_ms == 0 {
        0.0
    } else {
        amount as f64 / (wall_ms as f64 * unit_per_ms)
    }
}

impl WindowStats {
    /// From `from` to `to` (`to` later).
    #[must_use]
    pub fn between(from: &CounterSample, to: &CounterSample) -> Self {
        let wall_ms = to.at_ms.saturating_sub(from.at_ms);
        let both = |a: Option<u64>, b: Option<u64>| Some(delta(a?, b?));
        Self {
            wall_ms,
            throttled: both(from.throttled_ns, to.throttled_ns)
                .map(|ns| per_wall(ns, 1e6, wall_ms)),
            cpu_stall: both(from.cpu_stall_us, to.cpu_stall_us)
                .map(|us| per_wall(us, 1e3, wall_ms).min(1.0)),
            memory_stall: both(from.memory_stall_us, to.memory_stall_us)
                .map(|us| per_wall(us, 1e3, wall_ms).min(1.0)),
            oom_kills: delta(from.oom_kills, to.oom_kills),
        }
    }
}

/// The samples that bound `[from_ms, to_ms]`: the last one at or before `from_ms` (else the
/// first one after it) and the last one at or before `to_ms`. `samples` are in time order.
/// `None` when fewer than two distinct samples fall in.
#[must_use]
pub fn bounds(
    samples: &[CounterSample],
    from_ms: u64,
    to_ms: u64,
) -> Option<(CounterSample, CounterSample)> {
    let start = samples
        .iter()
        .rev()
        .find(|s| s.at_ms <= from_ms)
        .or_else(|| samples.iter().find(|s| s.at_ms > from_ms))?;
    let end = samples.iter().rev().find(|s| s.at_ms <= to_ms)?;
    (end.at_ms > start.at_ms).then_some((*start, *end))
}

/// When a resize counts as harmful (`[verdict]`; see the README for the defaults' reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VerdictThresholds {
    /// The cpu `some` stall share grew by at least this (0.10: ten points of wall time).
    pub cpu_stall_increase: Share,
    /// The memory `some` stall share grew by at least this.
    pub memory_stall_increase: Share,
    /// Throttled seconds per second grew by at least this.
    pub throttle_increase: Share,
    /// More OOM kills after than before, by at least this many (0: OOM kills never count).
    pub oom_kills: u64,
}

impl Default for VerdictThresholds {
    fn default() -> Self {
        Self {
            cpu_stall_increase: Share::new(0.10),
            memory_stall_increase: Share::new(0.05),
            throttle_increase: Share::new(0.25),
            oom_kills: 1,
        }
    }
}

/// Whether a resize hurt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Healthy,
    Harmful,
}

impl Verdict {
    pub const ALL: [Self; 2] = [Self::Healthy, Self::Harmful];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Harmful => "harmful",
        }
    }
}

/// One limit a resize changed, as people read it (`cpu 1000m → 250m`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitChange {
    pub resource: Resource,
    pub direction: Direction,
    pub text: String,
}

/// The CPU and memory limits that differ from `before` to `after` (unset or unlimited is
/// `unlimited`, larger than any value).
#[must_use]
pub fn limit_changes(before: &LinuxResources, after: &LinuxResources) -> Vec<LimitChange> {
    let mut out = Vec::new();
    let cpu = |r: &LinuxResources| r.cpu_quota().filter(|q| *q > 0).and(r.cpu_limit_millis());
    let (a, b) = (cpu(before), cpu(after));
    if a != b {
        let text = |m: Option<u64>| m.map_or_else(|| "unlimited".into(), cpu_text);
        out.push(LimitChange {
            resource: Resource::Cpu,
            direction: direction(a, b),
            text: format!("cpu {} → {}", text(a), text(b)),
        });
    }
    let memory = |r: &LinuxResources| {
        r.memory_limit()
            .and_then(|l| u64::try_from(l).ok())
            .filter(|l| *l > 0 && *l < super::UNLIMITED_BYTES)
    };
    let (a, b) = (memory(before), memory(after));
    if a != b {
        let text = |m: Option<u64>| {
            m.map_or_else(
                || "unlimited".into(),
                |b| memory_limit_text(i64::try_from(b).unwrap_or(i64::MAX)),
            )
        };
        out.push(LimitChange {
            resource: Resource::Memory,
            direction: direction(a, b),
            text: format!("memory {} → {}", text(a), text(b)),
        });
    }
    out
}

/// `None` is unlimited.
fn direction(from: Option<u64>, to: Option<u64>) -> Direction {
    match (from, to) {
        (Some(a), Some(b)) if b < a => Direction::Decrease,
        (None, Some(_)) => Direction::Decrease,
        _ => Direction::Increase,
    }
}

/// Judges a resize from the window `before` and the window `after` it. The reason names what got
/// worse, with both values, and the change: `cpu stall 31 % (was 2 %) after cpu 1000m → 250m`;
/// for a healthy resize it says what was compared.
#[must_use]
pub fn judge(
    before: &WindowStats,
    after: &WindowStats,
    changes: &[LimitChange],
    t: &VerdictThresholds,
) -> (Verdict, String) {
    let mut worse = Vec::new();
    let mut compared = Vec::new();
    for (name, b, a, limit) in [
        (
            "cpu stall",
            before.cpu_stall,
            after.cpu_stall,
            t.cpu_stall_increase,
        ),
        (
            "memory stall",
            before.memory_stall,
            after.memory_stall,
            t.memory_stall_increase,
        ),
    ] {
        let Some(a) = a else { continue };
        let b = b.unwrap_or(0.0);
        compared.push(format!("{name} {} % (was {} %)", pct(a), pct(b)));
        if a - b >= limit.get() {
            worse.push(format!("{name} {} % (was {} %)", pct(a), pct(b)));
        }
    }
    if let Some(a) = after.throttled {
        let b = before.throttled.unwrap_or(0.0);
        let text = format!("throttled {a:.2} s/s (was {b:.2} s/s)");
        if a - b >= t.throttle_increase.get() {
            worse.push(text.clone());
        }
        compared.push(text);
    }
    if t.oom_kills > 0 && after.oom_kills >= before.oom_kills.saturating_add(t.oom_kills) {
        worse.push(format!(
            "{} OOM kill(s) (was {})",
            after.oom_kills, before.oom_kills
        ));
    }
    compared.push(format!("{} OOM kill(s)", after.oom_kills));
    let change = changes
        .iter()
        .map(|c| c.text.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let change = if change.is_empty() {
        String::new()
    } else {
        format!(" after {change}")
    };
    if worse.is_empty() {
        let no_psi = if after.cpu_stall.is_none() {
            " (no PSI: stall not compared)"
        } else {
            ""
        };
        (
            Verdict::Healthy,
            format!("{}{no_psi}{change}", compared.join(", ")),
        )
    } else {
        (Verdict::Harmful, format!("{}{change}", worse.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(
        at_s: u64,
        throttled_s: u64,
        cpu_ms: u64,
        memory_ms: u64,
        ooms: u64,
    ) -> CounterSample {
        CounterSample {
            at_ms: at_s * 1000,
            throttled_ns: Some(throttled_s * 1_000_000_000),
            cpu_stall_us: Some(cpu_ms * 1000),
            memory_stall_us: Some(memory_ms * 1000),
            oom_kills: ooms,
        }
    }

    fn res(quota: i64, memory: i64) -> LinuxResources {
        crate::model::fixtures::res(quota, 100_000, memory)
    }

    #[test]
    fn window_rates_from_cumulative_counters() {
        let w = WindowStats::between(&sample(10, 1, 200, 0, 0), &sample(20, 6, 3_300, 500, 1));
        assert_eq!(w.wall_ms, 10_000);
        assert_eq!(w.throttled, Some(0.5));
        assert_eq!(w.cpu_stall, Some(0.31));
        assert_eq!(w.memory_stall, Some(0.05));
        assert_eq!(w.oom_kills, 1);
        let no_psi = CounterSample {
            cpu_stall_us: None,
            memory_stall_us: None,
            ..sample(20, 1, 0, 0, 0)
        };
        assert_eq!(
            WindowStats::between(&sample(10, 1, 0, 0, 0), &no_psi).cpu_stall,
            None
        );
    }

    #[test]
    fn bounds_pick_the_samples_around_a_window() {
        let s: Vec<CounterSample> = (0..10).map(|i| sample(i, 0, 0, 0, 0)).collect();
        let (a, b) = bounds(&s, 3_500, 7_200).expect("bounds");
        assert_eq!((a.at_ms, b.at_ms), (3_000, 7_000));
        // History shorter than the window: from the first sample.
        let (a, _) = bounds(&s[5..], 0, 9_000).expect("bounds");
        assert_eq!(a.at_ms, 5_000);
        assert_eq!(bounds(&s, 9_000, 9_500), None, "one sample is no window");
        assert_eq!(bounds(&[], 0, 1), None);
    }

    #[test]
    fn a_cpu_decrease_that_starves_is_harmful_with_both_values_and_the_change() {
        let before = WindowStats::between(&sample(0, 0, 0, 0, 0), &sample(30, 0, 600, 0, 0));
        let after = WindowStats::between(&sample(30, 0, 600, 0, 0), &sample(60, 3, 9_900, 0, 0));
        let changes = limit_changes(&res(100_000, 1 << 30), &res(25_000, 1 << 30));
        assert_eq!(
            changes,
            [LimitChange {
                resource: Resource::Cpu,
                direction: Direction::Decrease,
                text: "cpu 1000m → 250m".into()
            }]
        );
        let (v, reason) = judge(&before, &after, &changes, &VerdictThresholds::default());
        assert_eq!(v, Verdict::Harmful);
        assert_eq!(reason, "cpu stall 31 % (was 2 %) after cpu 1000m → 250m");
    }

    #[test]
    fn thresholds_decide_each_signal() {
        let t = VerdictThresholds::default();
        let quiet = WindowStats::between(&sample(0, 0, 0, 0, 0), &sample(30, 0, 300, 300, 0));
        // Small movements stay healthy, and the reason says what was compared.
        let after =
            WindowStats::between(&sample(30, 0, 300, 300, 0), &sample(60, 1, 2_700, 900, 0));
        let changes = limit_changes(&res(100_000, 1 << 30), &res(50_000, 512 << 20));
        let (v, reason) = judge(&quiet, &after, &changes, &t);
        assert_eq!(v, Verdict::Healthy, "{reason}");
        assert_eq!(
            reason,
            "cpu stall 8 % (was 1 %), memory stall 2 % (was 1 %), throttled 0.03 s/s (was 0.00 s/s), 0 OOM kill(s) after cpu 1000m → 500m, memory 1Gi → 512Mi"
        );
        // Memory stall past its threshold; throttling; an OOM kill.
        let after = WindowStats::between(&sample(30, 0, 0, 300, 0), &sample(60, 9, 0, 2_400, 1));
        let (v, reason) = judge(&quiet, &after, &changes, &t);
        assert_eq!(v, Verdict::Harmful);
        assert_eq!(
            reason,
            "memory stall 7 % (was 1 %), throttled 0.30 s/s (was 0.00 s/s), 1 OOM kill(s) (was 0) after cpu 1000m → 500m, memory 1Gi → 512Mi"
        );
        // OOM kills turned off, throttling threshold raised: healthy.
        let lax = VerdictThresholds {
            throttle_increase: Share::new(0.5),
            memory_stall_increase: Share::new(0.5),
            oom_kills: 0,
            ..t
        };
        assert_eq!(judge(&quiet, &after, &changes, &lax).0, Verdict::Healthy);
    }

    #[test]
    fn without_psi_the_verdict_says_stall_was_not_compared() {
        let no_psi = |at, throttled| CounterSample {
            cpu_stall_us: None,
            memory_stall_us: None,
            ..sample(at, throttled, 0, 0, 0)
        };
        let before = WindowStats::between(&no_psi(0, 0), &no_psi(30, 0));
        let after = WindowStats::between(&no_psi(30, 0), &no_psi(60, 0));
        let changes = limit_changes(&res(100_000, 1 << 30), &res(50_000, 1 << 30));
        let (v, reason) = judge(&before, &after, &changes, &VerdictThresholds::default());
        assert_eq!(v, Verdict::Healthy);
        assert_eq!(
            reason,
            "throttled 0.00 s/s (was 0.00 s/s), 0 OOM kill(s) (no PSI: stall not compared) after cpu 1000m → 500m"
        );
    }

    #[test]
    fn limit_changes_name_unlimited_and_directions() {
        let unlimited = LinuxResources::default();
        let c = limit_changes(&unlimited, &res(50_000, 256 << 20));
        assert_eq!(
            c.iter()
                .map(|c| (c.direction, c.text.as_str()))
                .collect::<Vec<_>>(),
            [
                (Direction::Decrease, "cpu unlimited → 500m"),
                (Direction::Decrease, "memory unlimited → 256Mi")
            ]
        );
        let c = limit_changes(&res(50_000, 256 << 20), &res(200_000, 256 << 20));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].direction, Direction::Increase);
        assert!(limit_changes(&res(1, 1), &res(1, 1)).is_empty());
    }
}
