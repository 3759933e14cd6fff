//! How long a resize takes to be confirmed: from the runtime's `UpdateContainer` reaching the
//! plugin to the container's cgroup, read back, holding every limit asked for.

use prometheus::{Histogram, HistogramOpts, Registry};

use super::{register, MetricsError};

/// `nri_resize_resize_confirmation_seconds`.
#[derive(Clone)]
pub struct ConfirmationMetrics {
    seconds: Histogram,
}

impl std::fmt::Debug for ConfirmationMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfirmationMetrics")
            .finish_non_exhaustive()
    }
}

impl ConfirmationMetrics {
    pub(super) fn new(r: &Registry) -> Result<Self, MetricsError> {
        Ok(ConfirmationMetrics {
            seconds: register(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "resize_confirmation_seconds",
                        "From the runtime's UpdateContainer reaching the plugin to the container's cgroup, read back, holding every limit asked for (kubelet-driven updates).",
                    )
                    .buckets(vec![
                        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                    ]),
                )
                .map_err(MetricsError::Register)?,
            )?,
        })
    }

    pub fn confirmed(&self, seconds: f64) {
        self.seconds.observe(seconds);
    }
}
