//! `nri_resize_node_reserve_mismatch`: admission's node reserve disagrees with kubelet's.

use prometheus::{IntGaugeVec, Opts, Registry};

use super::{register, MetricsError};

/// `nri_resize_node_reserve_mismatch{resource}`.
#[derive(Clone)]
pub struct ReserveMetrics {
    mismatch: IntGaugeVec,
}

impl std::fmt::Debug for ReserveMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReserveMetrics").finish_non_exhaustive()
    }
}

/// The resources compared (bounded label values).
pub const RESOURCES: [&str; 2] = ["memory", "cpu"];

impl ReserveMetrics {
    pub(super) fn new(r: &Registry) -> Result<Self, MetricsError> {
        let mismatch = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "node_reserve_mismatch",
                    "1 when admission's node reserve disagrees with kubelet's (its configuration file or its pods cgroup) for the resource (memory, cpu), else 0; /v1/status says how.",
                ),
                &["resource"],
            )
            .map_err(MetricsError::Register)?,
        )?;
        for resource in RESOURCES {
            mismatch.with_label_values(&[resource]);
        }
        Ok(ReserveMetrics { mismatch })
    }

    /// Sets the mismatch of `resource` (`memory`, `cpu`).
    pub fn set_mismatch(&self, resource: &str, mismatch: bool) {
        self.mismatch
            .with_label_values(&[resource])
            .set(i64::from(mismatch));
    }
}
