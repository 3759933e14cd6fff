//! Working-set trimming's per-container series: the working set a probe converged to (named so
//! that it is never mistaken for cAdvisor's `container_memory_working_set_bytes`, which is
//! usage minus inactive file cache) and the bytes trimmed.

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::{register, ContainerLabels, MetricsError};

/// `nri_resize_container_trim_*`.
#[derive(Clone)]
pub struct TrimMetrics {
    working_set: IntGaugeVec,
    trimmed: IntCounterVec,
    postponed: IntCounter,
}

impl std::fmt::Debug for TrimMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrimMetrics").finish_non_exhaustive()
    }
}

const LABELS: [&str; 3] = ["namespace", "pod", "container"];

fn values(l: &ContainerLabels) -> [&str; 3] {
    [&l.namespace, &l.pod, &l.container]
}

impl TrimMetrics {
    pub(super) fn new(r: &Registry) -> Result<Self, MetricsError> {
        Ok(TrimMetrics {
            working_set: register(
                r,
                IntGaugeVec::new(
                    Opts::new(
                        "container_trim_working_set_bytes",
                        "The memory usage at which working-set trimming's last probe found the container's working set (its first sign of harm: stall or refaults), in bytes; absent until a probe converged.",
                    ),
                    &LABELS,
                )
                .map_err(MetricsError::Register)?,
            )?,
            trimmed: register(
                r,
                IntCounterVec::new(
                    Opts::new(
                        "container_trim_trimmed_bytes_total",
                        "Page cache working-set trimming reclaimed from the container, in bytes.",
                    ),
                    &LABELS,
                )
                .map_err(MetricsError::Register)?,
            )?,
            postponed: register(
                r,
                IntCounter::new(
                    "trim_turns_postponed_total",
                    "Container turns working-set trimming postponed to its next pass because the pass reached its time budget ([trim] pass_budget).",
                )
                .map_err(MetricsError::Register)?,
            )?,
        })
    }

    /// `n` container turns postponed to the next pass by the pass's budget.
    pub fn postponed(&self, n: usize) {
        self.postponed.inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }

    /// The working set the container's last probe converged to.
    pub fn set_working_set(&self, labels: &ContainerLabels, bytes: u64) {
        self.working_set
            .with_label_values(&values(labels))
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The working set found before no longer holds: its series goes until a new one is found.
    pub fn clear_working_set(&self, labels: &ContainerLabels) {
        let _ = self.working_set.remove_label_values(&values(labels));
    }

    /// Counts `bytes` trimmed from the container (its series appears at the first step).
    pub fn add_trimmed(&self, labels: &ContainerLabels, bytes: u64) {
        self.trimmed
            .with_label_values(&values(labels))
            .inc_by(bytes);
    }

    /// Removes the container's trimming series.
    pub fn remove(&self, labels: &ContainerLabels) {
        let _ = self.working_set.remove_label_values(&values(labels));
        let _ = self.trimmed.remove_label_values(&values(labels));
    }
}
