//! Metrics of restarts that a resize policy demands (`RestartContainer`, action `Restart`,
//! memory-decrease strategy `restart`).

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

use super::{register, MetricsError};

/// How one restart attempt ended (a fixed set: bounded label values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartOutcome {
    /// The container's init process exited and the runtime reported the stop.
    Confirmed,
    /// The attempt could not be confirmed; another follows after a backoff.
    Retried,
    /// Every attempt failed: the container was not restarted.
    Failed,
}

impl RestartOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Confirmed => "confirmed",
            Self::Retried => "retried",
            Self::Failed => "failed",
        }
    }
}

/// `nri_resize_restarts_*`.
#[derive(Clone)]
pub struct RestartMetrics {
    outcomes: IntCounterVec,
    pending: IntGauge,
}

impl std::fmt::Debug for RestartMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestartMetrics").finish_non_exhaustive()
    }
}

impl RestartMetrics {
    pub(super) fn new(r: &Registry) -> Result<Self, MetricsError> {
        let outcomes = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    "restarts_total",
                    "Restart attempts for resizes whose policy demands a restart, by outcome: confirmed (exited and the runtime reported the stop), retried, failed (gave up).",
                ),
                &["outcome"],
            )
            .map_err(MetricsError::Register)?,
        )?;
        for o in [
            RestartOutcome::Confirmed,
            RestartOutcome::Retried,
            RestartOutcome::Failed,
        ] {
            outcomes.with_label_values(&[o.as_str()]);
        }
        Ok(RestartMetrics {
            outcomes,
            pending: register(
                r,
                IntGauge::with_opts(Opts::new(
                    "restarts_pending",
                    "Restarts requested and not yet confirmed or given up.",
                ))
                .map_err(MetricsError::Register)?,
            )?,
        })
    }

    pub fn outcome(&self, o: RestartOutcome) {
        self.outcomes.with_label_values(&[o.as_str()]).inc();
    }

    pub fn started(&self) {
        self.pending.inc();
    }

    pub fn ended(&self) {
        self.pending.dec();
    }
}
