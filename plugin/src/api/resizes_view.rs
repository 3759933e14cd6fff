//! `nri-resize resizes`: the resize records of `/v1/resizes` joined with `/v1/status` (pod
//! names, what the cgroups hold), one row per container with a record and one per whole-pod
//! resize. A pure function from the API's answers to rows and text; the CLI only prints them.

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::table::{actual, compact_spec};
use super::{Resizes, Status};
use crate::cgroup::ActualResources;
use crate::model::LinuxResources;
use crate::policy::{ResizeState, Verdict};
use crate::resize::PodResize;
use crate::state::ResizeVerdict;

/// One container's resize record, as `resizes --json` prints it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResizeRecord {
    /// `namespace/name`, or the pod's id when the pod is gone.
    pub pod: String,
    pub container: String,
    pub container_id: String,
    /// What the latest request asks for.
    pub desired: Option<LinuxResources>,
    /// What the plugin accepted.
    pub allocated: Option<LinuxResources>,
    /// What the container's cgroup holds, when last read.
    pub actual: Option<ActualResources>,
    /// `None`: no resize pending.
    pub state: Option<ResizeState>,
    pub reason: String,
    /// When the record last changed: RFC 3339 (UTC) and milliseconds since the epoch.
    pub updated: String,
    pub updated_ms: u64,
    /// The verdict on the container's last applied resize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<ResizeVerdict>,
    /// The cells of the table (`resizes` without `--json`).
    #[serde(skip)]
    cells: [String; 3],
}

/// Every record: containers, then whole-pod resizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResizeRecords {
    pub containers: Vec<ResizeRecord>,
    pub pods: Vec<PodResize>,
}

fn rfc3339(ms: u64) -> String {
    humantime_serde::re::humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_millis(ms))
        .to_string()
}

/// `12s ago`, `3m ago` (whole seconds; `-` for no time).
fn ago(ms: u64, now_ms: u64) -> String {
    if ms == 0 {
        return "-".to_string();
    }
    let secs = now_ms.saturating_sub(ms) / 1000;
    let d = Duration::from_secs(if secs >= 3600 { secs / 60 * 60 } else { secs });
    format!("{} ago", humantime_serde::re::humantime::format_duration(d))
}

/// The records of `resizes`, with pod names and actual values from `status`; by pod, then
/// container.
pub fn resize_records(status: &Status, resizes: &Resizes) -> ResizeRecords {
    let mut containers: Vec<ResizeRecord> = resizes
        .containers
        .iter()
        .map(|(id, r)| {
            let pod = status.pods.iter().find(|p| p.pod.id == r.pod_id);
            let ctr = pod.and_then(|p| p.containers.iter().find(|c| &c.id == id));
            let desired_cell = compact_spec(r.desired.as_ref());
            let allocated_cell = compact_spec(r.allocated.as_ref());
            let actual_cell = ctr.map_or_else(|| "-".to_string(), actual);
            ResizeRecord {
                pod: pod.map_or_else(|| r.pod_id.clone(), |p| p.pod.full_name()),
                container: r.container.clone(),
                container_id: id.clone(),
                desired: r.desired.clone(),
                allocated: r.allocated.clone(),
                actual: ctr.and_then(|c| c.observed.as_ref()).and_then(|o| o.actual),
                state: r.state,
                reason: r.reason.clone(),
                updated: rfc3339(r.updated_ms),
                updated_ms: r.updated_ms,
                verdict: resizes.verdicts.get(id).cloned(),
                cells: [desired_cell, allocated_cell, actual_cell],
            }
        })
        .collect();
    containers.sort_by(|a, b| (&a.pod, &a.container).cmp(&(&b.pod, &b.container)));
    ResizeRecords {
        containers,
        pods: resizes.pods.clone(),
    }
}

fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ");
            }
        }
        l.trim_end().to_string()
    };
    let mut out = line(&header.iter().map(ToString::to_string).collect::<Vec<_>>());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

/// The records as a person reads them: a container table (desired / allocated / actual as
/// `cpu/memory` quantities, state, when, verdict, reason), then the whole-pod resizes.
pub fn render_resizes(records: &ResizeRecords, now_ms: u64) -> String {
    let mut out = String::new();
    if records.containers.is_empty() {
        out.push_str("(no container resizes)\n");
    } else {
        let rows: Vec<Vec<String>> = records
            .containers
            .iter()
            .map(|r| {
                let verdict = r.verdict.as_ref().map_or_else(
                    || "-".to_string(),
                    |v| v.verdict.map_or("judging", Verdict::as_str).to_string(),
                );
                let mut reason = r.reason.clone();
                if let Some(v) = r
                    .verdict
                    .as_ref()
                    .filter(|v| v.verdict == Some(Verdict::Harmful))
                {
                    if !reason.is_empty() {
                        reason.push_str("; ");
                    }
                    let _ = write!(reason, "harmful: {}", v.reason);
                }
                vec![
                    r.pod.clone(),
                    r.container.clone(),
                    r.cells[0].clone(),
                    r.cells[1].clone(),
                    r.cells[2].clone(),
                    r.state.map_or("-", ResizeState::as_str).to_string(),
                    ago(r.updated_ms, now_ms),
                    verdict,
                    reason,
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "POD",
                "CONTAINER",
                "DESIRED",
                "ALLOCATED",
                "ACTUAL",
                "STATE",
                "UPDATED",
                "VERDICT",
                "REASON",
            ],
            &rows,
        ));
    }
    if !records.pods.is_empty() {
        out.push_str("\nwhole-pod resizes:\n");
        let rows: Vec<Vec<String>> = records
            .pods
            .iter()
            .map(|p| {
                let failed = p.steps.iter().filter(|s| !s.ok).count();
                vec![
                    p.pod.clone(),
                    p.state.map_or("done", ResizeState::as_str).to_string(),
                    p.attempts.to_string(),
                    format!(
                        "{}{}",
                        p.steps.len(),
                        if failed > 0 {
                            format!(" ({failed} failed)")
                        } else {
                            String::new()
                        }
                    ),
                    if p.resumed { "yes" } else { "no" }.to_string(),
                    p.reason.clone(),
                ]
            })
            .collect();
        out.push_str(&table(
            &["POD", "STATE", "ATTEMPTS", "STEPS", "RESUMED", "REASON"],
            &rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ContainerObserved, ContainerStatus, LinkStatusView, PodStatus};
    use crate::model::{Container, Pod};
    use crate::resize::ContainerResize;

    fn res(quota: i64, memory: i64) -> LinuxResources {
        crate::model::fixtures::res(quota, 100_000, memory)
    }

    fn status() -> Status {
        let pod = Pod {
            id: "p1".into(),
            name: "web".into(),
            namespace: "default".into(),
            ..Pod::default()
        };
        let app = Container {
            id: "c1".into(),
            pod_id: "p1".into(),
            name: "app".into(),
            resources: Some(res(50_000, 128 << 20)),
            ..Container::default()
        };
        Status {
            runtime: LinkStatusView::up(),
            pods: vec![PodStatus {
                pod,
                containers: vec![ContainerStatus {
                    container: app,
                    observed: Some(ContainerObserved {
                        actual: Some(ActualResources {
                            cpu_quota: Some(50_000),
                            cpu_period: Some(100_000),
                            memory_limit: Some(128 << 20),
                            ..ActualResources::default()
                        }),
                        ..ContainerObserved::default()
                    }),
                    trim: None,
                }],
                pod_level: None,
            }],
            observer: None,
            metrics_addr: None,
            node: None,
            reserve: None,
            state_dir: crate::state::StateDirStatus::default(),
        }
    }

    fn resizes() -> Resizes {
        let mut r = Resizes::default();
        r.containers.insert(
            "c1".into(),
            ContainerResize {
                pod_id: "p1".into(),
                container: "app".into(),
                desired: Some(res(50_000, 64 << 20)),
                allocated: Some(res(50_000, 128 << 20)),
                state: Some(ResizeState::Deferred),
                reason: "usage 100Mi above requested limit 64Mi".into(),
                updated_ms: 1_764_000_000_000,
                deferred_target: None,
            },
        );
        r.containers.insert(
            "gone".into(),
            ContainerResize {
                pod_id: "p9".into(),
                container: "old".into(),
                ..ContainerResize::default()
            },
        );
        r
    }

    #[test]
    fn a_record_joins_desired_allocated_actual_state_and_time() {
        let records = resize_records(&status(), &resizes());
        assert_eq!(records.containers.len(), 2);
        let app = &records.containers[0];
        assert_eq!(
            (app.pod.as_str(), app.container.as_str()),
            ("default/web", "app")
        );
        assert_eq!(app.state, Some(ResizeState::Deferred));
        assert_eq!(app.updated, "2025-11-24T16:00:00Z");
        assert_eq!(
            app.actual.as_ref().and_then(|a| a.memory_limit),
            Some(128 << 20)
        );
        assert_eq!(
            records.containers[1].pod, "p9",
            "a pod that is gone is named by its id"
        );
        let text = render_resizes(&records, 1_764_000_042_000);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("POD"), "{text}");
        let row = lines[1];
        for cell in [
            "default/web",
            "app",
            "500m/64Mi",
            "500m/128Mi",
            "Deferred",
            "42s ago",
            "usage 100Mi above requested limit 64Mi",
        ] {
            assert!(row.contains(cell), "{cell} in {row}");
        }
        // The JSON is the records, times included.
        let json = serde_json::to_value(&records).expect("json");
        assert_eq!(json["containers"][0]["state"], "Deferred");
        assert_eq!(json["containers"][0]["updated"], "2025-11-24T16:00:00Z");
        assert_eq!(
            json["containers"][0]["desired"]["memory"]["limit"],
            64 << 20
        );
    }

    #[test]
    fn no_records_say_so() {
        let text = render_resizes(&resize_records(&status(), &Resizes::default()), 0);
        assert_eq!(text, "(no container resizes)\n");
    }
}
