//! `nri_resize_resize_verdicts_total{resource,direction,verdict}`: what each applied resize did to
//! its workload (see `policy::verdict`).

use prometheus::{IntCounterVec, Opts, Registry};

use super::{register, MetricsError};
use crate::policy::{Direction, Resource, Verdict};

/// Counts verdicts per changed limit.
#[derive(Clone)]
pub struct VerdictMetrics {
    verdicts: IntCounterVec,
}

impl std::fmt::Debug for VerdictMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerdictMetrics").finish_non_exhaustive()
    }
}

impl VerdictMetrics {
    pub fn new(r: &Registry) -> Result<Self, MetricsError> {
        let verdicts = IntCounterVec::new(
            Opts::new(
                "resize_verdicts_total",
                "Verdicts on applied resizes (healthy, harmful) per resource and direction they changed.",
            ),
            &["resource", "direction", "verdict"],
        )
        .map_err(MetricsError::Register)?;
        Ok(Self {
            verdicts: register(r, verdicts)?,
        })
    }

    /// Counts one verdict for one changed limit.
    pub fn verdict(&self, resource: Resource, direction: Direction, verdict: Verdict) {
        self.verdicts
            .with_label_values(&[resource.as_str(), direction.as_str(), verdict.as_str()])
            .inc();
    }
}
