//! How long a resize takes to be confirmed: from the runtime's `UpdateContainer` reaching the
//! plugin to the container's cgroup, read back, holding every limit asked for; and how many
//! containers an ancestor cgroup caps below their own limits.

use prometheus::{Histogram, HistogramOpts, IntGaugeVec, Opts, Registry};

use super::{register, MetricsError};

/// `nri_resize_resize_confirmation_seconds` and `nri_resize_capped_containers{resource}`.
#[derive(Clone)]
pub struct ConfirmationMetrics {
    seconds: Histogram,
    capped: IntGaugeVec,
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
            capped: {
                let capped = register(
                    r,
                    IntGaugeVec::new(
                        Opts::new(
                            "capped_containers",
                            "Containers whose limit an ancestor cgroup (their pod's, or one between) caps below their own, per resource (memory, cpu): the smaller limit is the one in effect.",
                        ),
                        &["resource"],
                    )
                    .map_err(MetricsError::Register)?,
                )?;
                for resource in ["memory", "cpu"] {
                    capped.with_label_values(&[resource]);
                }
                capped
            },
        })
    }

    /// Sets how many containers are capped: `memory` and `cpu`.
    pub fn set_capped(&self, memory: usize, cpu: usize) {
        for (resource, n) in [("memory", memory), ("cpu", cpu)] {
            self.capped
                .with_label_values(&[resource])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub fn confirmed(&self, seconds: f64) {
        self.seconds.observe(seconds);
    }
}
