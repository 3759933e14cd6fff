//! The pod row of `nri-resize status`: a pod with pod-level resources (KEP-5419) gets one row
//! above its containers, `CONTAINER` = `(pod)`, with desired / allocated / actual pod cgroup
//! limits (pod-level limits plus overhead) in quantities (`500m/128Mi`), its resize state and
//! reason. Pure: from the API's answer to table cells.

use super::row::Row;
use super::{PodStatus, Status};
use crate::model::PodLimits;
use crate::policy::{with_overhead, Limits};
use crate::state::{limits_differences, limits_text};

/// The cells of the pod row (same columns as the container rows), when the pod has pod-level
/// resources. `page_size`: the node's, in bytes (the pod cgroup holds its memory limit in
/// whole pages).
pub fn pod_row(p: &PodStatus, page_size: u64) -> Option<Row> {
    let l = p.pod_level.as_ref()?;
    // What the runtime holds: the pod-level limits plus overhead, as the pod cgroup has them.
    let allocated = p.pod.resources.as_ref().map_or_else(
        || "-".into(),
        |r| {
            let overhead = p.pod.overhead.as_ref().map(Limits::from_linux);
            let l = with_overhead(&Limits::from_linux(r), &overhead.unwrap_or_default());
            limits_text(&PodLimits {
                cpu_millis: l.cpu.value(),
                memory_bytes: l.memory.value(),
            })
        },
    );
    let mut reason = l.reason.clone();
    if reason.is_empty() {
        if let Some(e) = &l.error {
            reason.clone_from(e);
        } else if l.matches == Some(false) {
            let named = l
                .actual
                .as_ref()
                .map(|a| limits_differences(&l.desired, a, page_size))
                .unwrap_or_default();
            reason = if named.is_empty() {
                "actual differs from desired".into()
            } else {
                format!("actual differs from desired: {}", named.join("; "))
            };
        }
    }
    Some([
        p.pod.full_name(),
        "(pod)".into(),
        limits_text(&l.desired),
        allocated,
        l.actual.as_ref().map_or_else(|| "-".into(), limits_text),
        l.state.map_or_else(|| "-".into(), |s| format!("{s:?}")),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        "-".into(),
        reason,
    ])
}

/// Inserts each pod's row before its first container row (rows start with the pod's name).
pub fn with_pod_rows(s: &Status, rows: Vec<Row>, page_size: u64) -> Vec<Row> {
    let mut out = Vec::with_capacity(rows.len() + s.pods.len());
    let mut pending: Vec<(String, Row)> = s
        .pods
        .iter()
        .filter_map(|p| Some((p.pod.full_name(), pod_row(p, page_size)?)))
        .collect();
    for row in rows {
        if let Some(i) = pending.iter().position(|(name, _)| *name == row[0]) {
            out.push(pending.remove(i).1);
        }
        out.push(row);
    }
    out.extend(pending.into_iter().map(|(_, r)| r));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{render_status, LinkStatusView, Resizes};
    use crate::model::{CpuResources, LinuxResources, MemoryResources, Pod};
    use crate::policy::ResizeState;
    use crate::state::PodLevelStatus;

    const MI: u64 = 1 << 20;

    fn status(level: PodLevelStatus) -> Status {
        let resources = LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(50_000),
                period: Some(100_000),
                ..CpuResources::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(128 << 20),
                ..MemoryResources::default()
            }),
            ..LinuxResources::default()
        };
        Status {
            runtime: LinkStatusView {
                connected: true,
                synchronized: true,
                name: Some("containerd".into()),
                version: Some("2.3.4".into()),
                nri_version: Some("v0.12.0".into()),
                request_timeout_ms: Some(2000),
                handler_budget_ms: Some(1500),
                connects: 1,
                connected_since: None,
            },
            pods: vec![PodStatus {
                pod: Pod {
                    id: "p1".into(),
                    name: "web".into(),
                    namespace: "default".into(),
                    resources: Some(resources),
                    ..Pod::default()
                },
                containers: Vec::new(),
                pod_level: Some(level),
            }],
            observer: None,
            metrics_addr: None,
            node: None,
            reserve: None,
            state_dir: crate::state::StateDirStatus::default(),
        }
    }

    #[test]
    fn the_pod_row_speaks_in_quantities_with_state_and_reason() {
        let level = PodLevelStatus {
            desired: PodLimits {
                cpu_millis: Some(500),
                memory_bytes: Some(100 * MI),
            },
            actual: Some(PodLimits {
                cpu_millis: None,
                memory_bytes: Some(2 << 30),
            }),
            state: Some(ResizeState::Deferred),
            reason: "usage 301Mi above requested pod limit 100Mi".into(),
            ..PodLevelStatus::default()
        };
        let text = render_status(&status(level), &Resizes::default(), 4096, 0);
        let row = text
            .lines()
            .find(|l| l.contains("(pod)"))
            .unwrap_or_else(|| panic!("no pod row:\n{text}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells[..6],
            [
                "default/web",
                "(pod)",
                "500m/100Mi",
                "500m/128Mi",
                "max/2Gi",
                "Deferred"
            ],
            "{text}"
        );
        assert!(
            row.ends_with("usage 301Mi above requested pod limit 100Mi"),
            "{row}"
        );
        // The pod row comes before the pod's container rows (here: the dash row).
        let lines: Vec<&str> = text.lines().collect();
        let pod_at = lines.iter().position(|l| l.contains("(pod)")).expect("row");
        assert!(lines[pod_at + 1].starts_with("default/web"), "{text}");
    }

    #[test]
    fn drift_without_a_reason_is_explained_and_no_record_means_no_row() {
        let level = PodLevelStatus {
            desired: PodLimits {
                cpu_millis: Some(500),
                memory_bytes: None,
            },
            matches: Some(false),
            ..PodLevelStatus::default()
        };
        let s = status(level);
        let row = pod_row(&s.pods[0], 4096).expect("a row");
        assert_eq!(row[2], "500m/max");
        assert_eq!(row[11], "actual differs from desired");
        let mut none = s.clone();
        none.pods[0].pod_level = None;
        assert!(pod_row(&none.pods[0], 4096).is_none());
    }

    #[test]
    fn drift_names_the_field_with_values_that_differ_in_the_table() {
        // 4 KiB short of 128Mi reads as 128Mi on both sides: the reason gives the bytes.
        let level = PodLevelStatus {
            desired: PodLimits {
                cpu_millis: Some(500),
                memory_bytes: Some(128 * MI),
            },
            actual: Some(PodLimits {
                cpu_millis: Some(400),
                memory_bytes: Some(128 * MI - 4096),
            }),
            matches: Some(false),
            ..PodLevelStatus::default()
        };
        let row = pod_row(&status(level).pods[0], 4096).expect("a row");
        assert_eq!(
            (row[2].as_str(), row[4].as_str()),
            ("500m/128Mi", "400m/128Mi")
        );
        assert_eq!(
            row[11],
            "actual differs from desired: cpu: desired 500m, actual 400m; \
             memory: desired 134217728 bytes, actual 134213632 bytes"
        );
    }
}
