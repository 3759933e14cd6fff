//! Pod-level series (KEP-5419 pod-level resources): the pod's desired limits (what the last
//! `UpdatePodSandbox` asked) and actual limits (read back from the pod cgroup), labelled
//! `namespace` and `pod` only, removed when the pod goes.

use prometheus::{GaugeVec, Opts, Registry};

use super::{register, MetricsError};
use crate::model::PodLimits;

const POD_LABELS: [&str; 2] = ["namespace", "pod"];

/// `nri_resize_pod_{desired,actual}_{cpu_cores,memory_bytes}`.
#[derive(Clone)]
pub struct PodMetrics {
    desired_cpu: GaugeVec,
    desired_memory: GaugeVec,
    actual_cpu: GaugeVec,
    actual_memory: GaugeVec,
}

impl std::fmt::Debug for PodMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodMetrics").finish_non_exhaustive()
    }
}

fn gauge(r: &Registry, name: &str, help: &str) -> Result<GaugeVec, MetricsError> {
    register(
        r,
        GaugeVec::new(Opts::new(name, help), &POD_LABELS).map_err(MetricsError::Register)?,
    )
}

/// Sets `v` divided by `per_base_unit` (1000: millicores to cores) or removes the series (`None`).
#[expect(clippy::cast_precision_loss, reason = "gauges are f64")]
fn set(g: &GaugeVec, labels: [&str; 2], v: Option<u64>, per_base_unit: f64) {
    match v {
        Some(v) => g.with_label_values(&labels).set(v as f64 / per_base_unit),
        None => {
            let _ = g.remove_label_values(&labels);
        }
    }
}

impl PodMetrics {
    pub(super) fn new(r: &Registry) -> Result<Self, MetricsError> {
        Ok(PodMetrics {
            desired_cpu: gauge(
                r,
                "pod_desired_cpu_cores",
                "Pod-level CPU limit last asked of the runtime (UpdatePodSandbox), in cores; absent when unlimited.",
            )?,
            desired_memory: gauge(
                r,
                "pod_desired_memory_bytes",
                "Pod-level memory limit last asked of the runtime; absent when unlimited.",
            )?,
            actual_cpu: gauge(
                r,
                "pod_actual_cpu_cores",
                "CPU limit in the pod cgroup when last read, in cores; absent when unlimited.",
            )?,
            actual_memory: gauge(
                r,
                "pod_actual_memory_bytes",
                "Memory limit in the pod cgroup when last read; absent when unlimited.",
            )?,
        })
    }

    /// Sets the pod's desired limits (`None` = unlimited: the series is removed).
    pub fn set_desired(&self, namespace: &str, pod: &str, l: PodLimits) {
        set(&self.desired_cpu, [namespace, pod], l.cpu_millis, 1000.0);
        set(&self.desired_memory, [namespace, pod], l.memory_bytes, 1.0);
    }

    /// Sets the pod's actual limits (read from its cgroup).
    pub fn set_actual(&self, namespace: &str, pod: &str, l: PodLimits) {
        set(&self.actual_cpu, [namespace, pod], l.cpu_millis, 1000.0);
        set(&self.actual_memory, [namespace, pod], l.memory_bytes, 1.0);
    }

    /// Removes every series of a pod that went away.
    pub fn remove(&self, namespace: &str, pod: &str) {
        for g in [
            &self.desired_cpu,
            &self.desired_memory,
            &self.actual_cpu,
            &self.actual_memory,
        ] {
            let _ = g.remove_label_values(&[namespace, pod]);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::metrics::Metrics;
    use crate::model::PodLimits;

    #[test]
    fn pod_series_follow_set_unlimited_and_remove() {
        let m = Metrics::new().expect("metrics");
        let limits = PodLimits {
            cpu_millis: Some(500),
            memory_bytes: Some(128 << 20),
        };
        m.pod.set_desired("ns", "web", limits);
        m.pod.set_actual("ns", "web", limits);
        let text = m.encode().expect("encode");
        assert!(
            text.contains(r#"nri_resize_pod_desired_cpu_cores{namespace="ns",pod="web"} 0.5"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"nri_resize_pod_actual_memory_bytes{namespace="ns",pod="web"} 134217728"#
            ),
            "{text}"
        );
        m.pod.set_actual("ns", "web", PodLimits::default());
        let text = m.encode().expect("encode");
        assert!(
            !text.contains("nri_resize_pod_actual_memory_bytes{"),
            "{text}"
        );
        m.pod.remove("ns", "web");
        let text = m.encode().expect("encode");
        assert!(!text.contains(r#"pod="web""#), "{text}");
    }
}
