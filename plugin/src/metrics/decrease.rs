//! Metrics of safe memory decreases (staged reclaim).

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::{register, MetricsError};

/// Why a memory decrease ended the way it did (a fixed set: bounded label values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecreaseOutcome {
    /// The new limit was above usage: written directly.
    Direct,
    /// Page cache reclaimed inside the update, then written directly.
    Inline,
    /// Reclaim reached the target and the limit was applied.
    Converged,
    /// Timed out: anonymous memory above the target (no swap).
    DeferredAnonymous,
    /// Timed out for another reason (reclaim too slow, usage growing).
    DeferredTimeout,
    /// A newer update for the container took over.
    Superseded,
    /// Refused by strategy `reject`.
    Rejected,
    /// Evicted by strategy `restart`.
    Restarted,
    /// A cgroup or runtime error.
    Error,
}

impl DecreaseOutcome {
    pub const ALL: [Self; 9] = [
        Self::Direct,
        Self::Inline,
        Self::Converged,
        Self::DeferredAnonymous,
        Self::DeferredTimeout,
        Self::Superseded,
        Self::Rejected,
        Self::Restarted,
        Self::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Inline => "inline",
            Self::Converged => "converged",
            Self::DeferredAnonymous => "deferred_anonymous",
            Self::DeferredTimeout => "deferred_timeout",
            Self::Superseded => "superseded",
            Self::Rejected => "rejected",
            Self::Restarted => "restarted",
            Self::Error => "error",
        }
    }
}

/// `nri_resize_memory_decrease_*`.
#[derive(Clone)]
pub struct DecreaseMetrics {
    outcomes: IntCounterVec,
    reclaimed: IntCounter,
    in_progress: IntGauge,
    duration: Histogram,
}

impl std::fmt::Debug for DecreaseMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecreaseMetrics").finish_non_exhaustive()
    }
}

impl DecreaseMetrics {
    pub(super) fn new(r: &Registry) -> Result<Self, MetricsError> {
        let metrics = DecreaseMetrics {
            outcomes: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "memory_decrease_outcomes_total",
                        "Memory limit decreases by outcome: direct, inline, converged, deferred_anonymous, deferred_timeout, superseded, rejected, restarted, error.",
                    ),
                    &["outcome"],
                )
                .map_err(MetricsError::Register)?,
            )?,
            reclaimed: register(
                r,
                IntCounter::with_opts(Opts::new(
                    "memory_decrease_reclaimed_bytes_total",
                    "Bytes by which staged memory decreases brought container usage down.",
                ))
                .map_err(MetricsError::Register)?,
            )?,
            in_progress: register(
                r,
                IntGauge::with_opts(Opts::new(
                    "memory_decrease_reclaims_in_progress",
                    "Memory decreases reclaiming now (in the background toward a refused limit, a whole-pod step's, a resumed checkpoint's).",
                ))
                .map_err(MetricsError::Register)?,
            )?,
            duration: register(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "memory_decrease_reclaim_duration_seconds",
                        "Time a memory decrease below usage took to reclaim: inside the update (inline), or a reclaim from its start to its end (converged, deferred or superseded).",
                    )
                    .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]),
                )
                .map_err(MetricsError::Register)?,
            )?,
        };
        // Every outcome present from the start (at 0): the first refusal is an increase.
        for o in DecreaseOutcome::ALL {
            metrics.outcomes.with_label_values(&[o.as_str()]);
        }
        Ok(metrics)
    }

    pub fn outcome(&self, o: DecreaseOutcome) {
        self.outcomes.with_label_values(&[o.as_str()]).inc();
    }

    /// A decrease reclaimed inside the update: `bytes` in `seconds`.
    pub fn inline(&self, bytes: u64, seconds: f64) {
        self.reclaimed.inc_by(bytes);
        self.duration.observe(seconds);
        self.outcome(DecreaseOutcome::Inline);
    }

    pub fn started(&self) {
        self.in_progress.inc();
    }

    /// A staged decrease ended after `seconds`, having brought usage down by `reclaimed` bytes.
    pub fn finished(&self, o: DecreaseOutcome, seconds: f64, reclaimed: u64) {
        self.in_progress.dec();
        self.duration.observe(seconds);
        self.reclaimed.inc_by(reclaimed);
        self.outcome(o);
    }
}
