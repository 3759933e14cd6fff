//! Pod-level series (KEP-5419 pod-level resources): the pod's desired limits (what the last
//! `UpdatePodSandbox` asked) and actual limits (read back from the pod cgroup), labelled
//! `namespace` and `pod` only, removed when the pod goes.

use prometheus::{IntGaugeVec, Opts, Registry};

use super::{register, MetricsError};
use crate::model::PodLimits;

const POD_LABELS: [&str; 2] = ["namespace", "pod"];

/// `nri_resize_pod_{desired,actual}_{cpu_millicores,memory_bytes}`.
#[derive(Clone)]
pub struct PodMetrics {
    desired_cpu: IntGaugeVec,
    desired_memory: IntGaugeVec,
    actual_cpu: IntGaugeVec,
    actual_memory: IntGaugeVec,
}

impl std::fmt::Debug for PodMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodMetrics").finish_non_exhaustive()
    }
}

fn gauge(r: &Registry, name: &str, help: &str) -> Result<IntGaugeVec, MetricsError> {
    register(
        r,
        IntGaugeVec::new(Opts::new(name, help), &POD_LABELS).map_err(MetricsError::Register)?,
    )
}

fn set(g: &IntGaugeVec, labels: [&str; 2], v: Option<u64>) {
    match v {
        Some(v) => g
            .with_label_values(&labels)
            .set(i64::try_from(v).unwrap_or(i64::MAX)),
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
                "pod_desired_cpu_millicores",
                "Pod-level CPU limit last asked of the runtime (UpdatePodSandbox); absent when unlimited.",
            )?,
            desired_memory: gauge(
                r,
                "pod_desired_memory_bytes",
                "Pod-level memory limit last asked of the runtime; absent when unlimited.",
            )?,
            actual_cpu: gauge(
                r,
                "pod_actual_cpu_millicores",
                "CPU limit in the pod cgroup when last read; absent when unlimited.",
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
        set(&self.desired_cpu, [namespace, pod], l.cpu_millis);
        set(&self.desired_memory, [namespace, pod], l.memory_bytes);
    }

    /// Sets the pod's actual limits (read from its cgroup).
    pub fn set_actual(&self, namespace: &str, pod: &str, l: PodLimits) {
        set(&self.actual_cpu, [namespace, pod], l.cpu_millis);
        set(&self.actual_memory, [namespace, pod], l.memory_bytes);
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
            text.contains(r#"nri_resize_pod_desired_cpu_millicores{namespace="ns",pod="web"} 500"#),
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
