//! `nri-resize status` as a table a person reads at a glance: a pure function from the API's
//! answers to text (unit-tested here; the CLI only prints it).

use std::fmt::Write as _;

use super::row::Row;
use super::{ContainerStatus, Resizes, Status};
use crate::model::LinuxResources;
use crate::policy::{bytes_quantity, Verdict, UNLIMITED_BYTES};
use crate::trim::TrimState;

/// `500m/128Mi`; `-` when unknown, `max` for unlimited. Exact quantities (`68192Ki`, not a
/// rounded `66.6Mi`): what the table shows, `nri-resize resize` and `update` accept as is.
fn compact(cpu_millis: Option<u64>, cpu_limited: bool, memory: Option<i64>) -> String {
    let cpu = match (cpu_millis, cpu_limited) {
        (Some(m), true) => format!("{m}m"),
        (_, false) => "max".to_string(),
        (None, true) => "-".to_string(),
    };
    let mem = match memory {
        Some(m) if m > 0 && m.unsigned_abs() < UNLIMITED_BYTES => bytes_quantity(m.unsigned_abs()),
        Some(_) => "max".to_string(),
        None => "-".to_string(),
    };
    format!("{cpu}/{mem}")
}

fn mebibytes(bytes: u64) -> String {
    if bytes >= 1 << 20 || bytes == 0 {
        format!("{}Mi", bytes >> 20)
    } else {
        format!("{}Ki", bytes >> 10)
    }
}

pub(super) fn compact_spec(r: Option<&LinuxResources>) -> String {
    r.map_or_else(
        || "-".to_string(),
        |r| {
            compact(
                r.cpu_limit_millis(),
                r.cpu_quota().is_some_and(|q| q > 0),
                r.memory_limit(),
            )
        },
    )
}

/// The limits in effect: the container cgroup's, or where an ancestor cgroup caps one, the
/// ancestor's (the REASON column says which cgroup).
pub(super) fn actual(c: &ContainerStatus) -> String {
    let Some(o) = c.observed.as_ref() else {
        return "-".to_string();
    };
    let caps = o.caps.clone().unwrap_or_default();
    o.actual.as_ref().map_or_else(
        || "-".to_string(),
        |a| {
            let (cpu, cpu_limited) = match &caps.cpu {
                Some(cap) => (Some(cap.effective), true),
                None => (a.cpu_limit_millis(), a.cpu_quota.is_some_and(|q| q > 0)),
            };
            let memory = caps
                .memory
                .as_ref()
                .map_or(a.memory_limit, |cap| i64::try_from(cap.effective).ok());
            compact(cpu, cpu_limited, memory)
        },
    )
}

/// `12 (0.35s)`: throttled periods and seconds; `-` before the first observation.
fn throttling(c: &ContainerStatus) -> String {
    c.observed
        .as_ref()
        .and_then(|o| o.throttling.as_ref())
        .map_or_else(
            || "-".to_string(),
            |t| {
                if t.count == 0 {
                    "0".to_string()
                } else {
                    format!("{} ({:.2}s)", t.count, t.seconds)
                }
            },
        )
}

/// What reclaim took from the container so far, and OOM kills: `12Mi`, `12Mi 1 oom`.
fn reclaim(c: &ContainerStatus, page_size: u64) -> String {
    let Some(o) = c.observed.as_ref() else {
        return "-".to_string();
    };
    let mut s = o.reclaim.as_ref().and_then(|r| r.pages).map_or_else(
        || "-".to_string(),
        |p| mebibytes(p.saturating_mul(page_size)),
    );
    if let Some(oom) = &o.oom {
        if oom.kills > 0 {
            let _ = write!(s, " {} oom", oom.kills);
        }
    }
    s
}

/// `observer: eBPF maps 5.3Mi in 10 maps, 128 possible CPUs (...)`: what the maps cost, which
/// no RSS figure shows; nothing without eBPF.
fn map_memory_line(out: &mut String, o: &crate::api::ObserverView) {
    if o.maps.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "observer: eBPF maps {} in {} maps{} (in the daemon's memory limit, not its RSS)",
        crate::policy::bytes_text(o.map_memory_bytes()),
        o.maps.len(),
        o.possible_cpus
            .map_or_else(String::new, |n| format!(", {n} possible CPUs")),
    );
}

/// `mem 3% cpu 31%`: the memory and cpu `some` stall shares of the observer's last interval;
/// `-` without PSI (cgroup v1, `psi=0`) or before the second reading.
fn stall(c: &ContainerStatus) -> String {
    c.observed
        .as_ref()
        .and_then(|o| o.stall.as_ref())
        .map_or_else(
            || "-".to_string(),
            |s| format!("mem {} cpu {}", percent(s.memory_some), percent(s.cpu_some)),
        )
}

/// `31%`, `0.4%` below one percent, `0%` for none.
fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p == 0.0 || p >= 1.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

/// One row per container (a pod without containers: one row of dashes).
fn rows(s: &Status, resizes: &Resizes, page_size: u64) -> Vec<Row> {
    s.pods
        .iter()
        .flat_map(|p| {
            let pod = p.pod.full_name();
            if p.containers.is_empty() {
                return vec![[
                    pod,
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    String::new(),
                ]];
            }
            p.containers
                .iter()
                .map(|c| {
                    let rec = resizes.containers.get(&c.id);
                    let desired = compact_spec(
                        rec.and_then(|r| r.desired.as_ref())
                            .or(c.resources.as_ref()),
                    );
                    let allocated = compact_spec(c.resources.as_ref());
                    let (state, reason) = rec.map_or(("-".to_string(), String::new()), |r| {
                        (
                            r.state.map_or("-".to_string(), |s| format!("{s:?}")),
                            r.reason.clone(),
                        )
                    });
                    let mut reason = reason;
                    let verdict = resizes.verdicts.get(&c.id);
                    if let Some(v) = verdict.filter(|v| v.verdict == Some(Verdict::Harmful)) {
                        if !reason.is_empty() {
                            reason.push_str("; ");
                        }
                        let _ = write!(reason, "harmful: {}", v.reason);
                    }
                    if let Some(caps) = c.observed.as_ref().and_then(|o| o.caps.as_ref()) {
                        for r in caps.reasons() {
                            if !reason.is_empty() {
                                reason.push_str("; ");
                            }
                            reason.push_str(&r);
                        }
                    }
                    if let Some(t) = c.trim.as_ref().filter(|t| {
                        matches!(
                            t.state,
                            TrimState::Unavailable { .. } | TrimState::Holding { .. }
                        ) || !t.annotation_errors.is_empty()
                    }) {
                        if !reason.is_empty() {
                            reason.push_str("; ");
                        }
                        let _ = write!(reason, "trim: {}", t.line());
                    }
                    if let Some(o) = &c.observed {
                        if o.matches == Some(false) && reason.is_empty() {
                            reason = if o.differences.is_empty() {
                                "actual differs from desired".into()
                            } else {
                                format!("actual differs from desired: {}", o.differences.join("; "))
                            };
                        }
                    }
                    [
                        pod.clone(),
                        c.name.clone(),
                        desired,
                        allocated,
                        actual(c),
                        state,
                        throttling(c),
                        reclaim(c, page_size),
                        stall(c),
                        verdict.map_or_else(
                            || "-".to_string(),
                            |v| v.verdict.map_or("judging", Verdict::as_str).to_string(),
                        ),
                        c.trim
                            .as_ref()
                            .map_or_else(|| "-".to_string(), |t| t.state.cell()),
                        reason,
                    ]
                })
                .collect()
        })
        .collect()
}

/// `reclaim counter count_memcg_events_btf attached on demand: detached` (the `/readyz` words).
pub fn reclaim_on_demand_line(d: &crate::api::ReclaimOnDemandView) -> String {
    let now = if d.attached {
        format!("attached ({} reclaims in flight)", d.reclaims_in_flight)
    } else {
        "detached".to_string()
    };
    let error = d
        .last_error
        .as_deref()
        .map_or_else(String::new, |e| format!(", last error: {e}"));
    format!(
        "reclaim counter {} attached on demand: {now}{error}",
        d.program
    )
}

/// Renders the status table. `page_size` converts reclaimed pages to bytes and compares a pod
/// cgroup's memory limit in whole pages (the node's page size: the API is node-local).
pub fn render_status(s: &Status, resizes: &Resizes, page_size: u64, now_ms: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "runtime: {} {} ({}){}{}{}",
        s.runtime.name.as_deref().unwrap_or("?"),
        s.runtime.version.as_deref().unwrap_or("?"),
        if s.runtime.connected {
            "connected"
        } else {
            "DISCONNECTED"
        },
        if s.runtime.connected && !s.runtime.synchronized {
            ", not synchronized"
        } else {
            ""
        },
        s.runtime
            .nri_version
            .as_deref()
            .map_or_else(String::new, |v| format!("  NRI {v}")),
        s.metrics_addr
            .as_deref()
            .map_or_else(String::new, |a| format!("  metrics: http://{a}/metrics")),
    );
    if let Some(o) = &s.observer {
        let _ = writeln!(
            out,
            "observer: throttle={} reclaim={} oom={} every {}ms",
            o.strategies.throttle, o.strategies.reclaim, o.strategies.oom, o.interval_ms
        );
        map_memory_line(&mut out, o);
        if let Some(d) = &o.reclaim_on_demand {
            let _ = writeln!(out, "observer: {}", reclaim_on_demand_line(d));
        }
        // Why eBPF is off as a whole (no kernel BTF, no object): one line, as /readyz says it.
        for f in o
            .fallbacks
            .iter()
            .filter(|f| matches!(f.program.as_str(), "btf" | "object"))
        {
            let _ = writeln!(out, "observer: polling cgroup files: {}", f.reason);
        }
    }
    if let Some(node) = &s.node {
        let _ = writeln!(out, "{}", crate::capacity::node_line(node, now_ms));
    }
    if let Some(reserve) = &s.reserve {
        let _ = writeln!(out, "{}", reserve.line());
    }
    if !s.state_dir.problems.is_empty() {
        let _ = writeln!(
            out,
            "state dir {}: {}{}",
            s.state_dir.path,
            if s.state_dir.usable { "" } else { "UNUSABLE; " },
            s.state_dir.problems.last().map_or("", String::as_str)
        );
    }
    let rows = super::pod_row::with_pod_rows(s, rows(s, resizes, page_size), page_size);
    let header = [
        "POD",
        "CONTAINER",
        "DESIRED",
        "ALLOCATED",
        "ACTUAL",
        "STATE",
        "THROTTLED",
        "RECLAIMED",
        "STALL",
        "VERDICT",
        "TRIM",
        "REASON",
    ];
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        l.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(&header));
    for r in &rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        let _ = writeln!(out, "{}", line(&cells));
    }
    if s.pods.is_empty() {
        let _ = writeln!(out, "(no pods)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        ContainerObserved, LinkStatusView, OomView, PodStatus, ReclaimView, StallView,
        ThrottlingView,
    };
    use crate::cgroup::ActualResources;
    use crate::model::{Container, ContainerState, Pod};
    use crate::policy::{Found, ResizeState};
    use crate::resize::ContainerResize;
    use crate::trim::ContainerTrim;

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
            state: ContainerState::Running,
            resources: Some(res(50_000, 128 << 20)),
            ..Container::default()
        };
        let sidecar = Container {
            id: "c2".into(),
            pod_id: "p1".into(),
            name: "sidecar".into(),
            state: ContainerState::Running,
            resources: Some(res(20_000, 64 << 20)),
            ..Container::default()
        };
        Status {
            runtime: LinkStatusView {
                connected: true,
                synchronized: true,
                name: Some("containerd".into()),
                version: Some("1.7.24".into()),
                nri_version: Some("v0.6.1 (inferred from containerd 1.7.24)".into()),
                request_timeout_ms: Some(2000),
                handler_budget_ms: Some(1500),
                connects: 1,
                connected_since: None,
            },
            pods: vec![PodStatus {
                pod,
                containers: vec![
                    ContainerStatus {
                        container: app,
                        observed: Some(ContainerObserved {
                            actual: Some(ActualResources {
                                cpu_quota: Some(50_000),
                                cpu_period: Some(100_000),
                                memory_limit: Some(128 << 20),
                                ..ActualResources::default()
                            }),
                            matches: Some(true),
                            throttling: Some(ThrottlingView {
                                count: 12,
                                seconds: 0.345,
                            }),
                            reclaim: Some(ReclaimView {
                                pages: Some(2560),
                                ..ReclaimView::default()
                            }),
                            oom: Some(OomView {
                                kills: 1,
                                ..OomView::default()
                            }),
                            stall: Some(StallView {
                                cpu_some: 0.31,
                                memory_some: 0.004,
                                io_some: 0.0,
                                interval_ms: 1000,
                            }),
                            ..ContainerObserved::default()
                        }),
                        trim: Some(ContainerTrim {
                            state: TrimState::Converged {
                                working_set: 42 << 20,
                                found: Found::NothingLeft,
                            },
                            ..ContainerTrim::default()
                        }),
                    },
                    ContainerStatus {
                        container: sidecar,
                        observed: None,
                        trim: Some(ContainerTrim {
                            state: TrimState::Unavailable {
                                reason: "cgroup v1".into(),
                            },
                            ..ContainerTrim::default()
                        }),
                    },
                ],
                pod_level: None,
            }],
            observer: None,
            metrics_addr: Some("127.0.0.1:9464".into()),
            node: None,
            reserve: None,
            state_dir: crate::state::StateDirStatus::default(),
        }
    }

    #[test]
    #[expect(
        clippy::too_many_lines,
        reason = "one table asserted row by row, cell by cell"
    )]
    fn one_row_per_container_with_desired_allocated_actual_state_and_counters() {
        let mut resizes = Resizes::default();
        resizes.containers.insert(
            "c1".into(),
            ContainerResize {
                pod_id: "p1".into(),
                container: "app".into(),
                desired: Some(res(100_000, 256 << 20)),
                allocated: Some(res(50_000, 128 << 20)),
                state: Some(ResizeState::Deferred),
                reason: "node has 1 CPU free".into(),
                updated_ms: 0,
                deferred_target: None,
            },
        );
        resizes.verdicts.insert(
            "c1".into(),
            crate::state::ResizeVerdict {
                verdict: Some(Verdict::Harmful),
                change: "cpu 1000m → 500m".into(),
                reason: "cpu stall 31 % (was 2 %) after cpu 1000m → 500m".into(),
                applied_ms: 0,
                judged_ms: Some(30_000),
                window_ms: 30_000,
                before: None,
                after: None,
            },
        );
        let text = render_status(&status(), &resizes, 4096, 0);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("runtime: containerd 1.7.24 (connected)"),
            "{text}"
        );
        assert!(lines[0].contains("http://127.0.0.1:9464/metrics"), "{text}");
        assert!(
            lines[0].contains("NRI v0.6.1 (inferred from containerd 1.7.24)"),
            "{text}"
        );
        let header = lines[1];
        for col in [
            "POD",
            "CONTAINER",
            "DESIRED",
            "ALLOCATED",
            "ACTUAL",
            "STATE",
            "THROTTLED",
            "RECLAIMED",
            "STALL",
            "VERDICT",
            "TRIM",
            "REASON",
        ] {
            assert!(header.contains(col), "{col} in {header}");
        }
        let app: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            app,
            [
                "default/web",
                "app",
                "1000m/256Mi",
                "500m/128Mi",
                "500m/128Mi",
                "Deferred",
                "12",
                "(0.34s)",
                "10Mi",
                "1",
                "oom",
                "mem",
                "0.4%",
                "cpu",
                "31%",
                "harmful",
                "42Mi",
                "node",
                "has",
                "1",
                "CPU",
                "free;",
                "harmful:",
                "cpu",
                "stall",
                "31",
                "%",
                "(was",
                "2",
                "%)",
                "after",
                "cpu",
                "1000m",
                "→",
                "500m"
            ],
            "{text}"
        );
        let sidecar: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(
            sidecar,
            [
                "default/web",
                "sidecar",
                "200m/64Mi",
                "200m/64Mi",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "unavailable",
                "trim:",
                "unavailable:",
                "cgroup",
                "v1"
            ],
            "{text}"
        );
        // Columns line up: every row's DESIRED starts where the header's does.
        let col = header.find("DESIRED").expect("column");
        assert_eq!(&lines[2][col..col + 11], "1000m/256Mi", "{text}");
        assert_eq!(&lines[3][col..col + 9], "200m/64Mi", "{text}");
    }

    /// kubernetes/kubernetes#138760: the container's cgroup holds 512Mi (what was asked), its
    /// pod cgroup 175Mi. ACTUAL is what is in effect, and REASON says which cgroup caps it.
    #[test]
    fn a_capped_container_shows_the_effective_limit_and_why() {
        let mut s = status();
        let o = s.pods[0].containers[0].observed.as_mut().expect("observed");
        o.actual = Some(ActualResources {
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory_limit: Some(512 << 20),
            ..ActualResources::default()
        });
        o.caps = Some(crate::cgroup::Caps {
            memory: Some(crate::cgroup::Cap {
                effective: 175 << 20,
                own: Some(512 << 20),
                cgroup: "/kubepods/burstable/pod1".into(),
                pod_cgroup: true,
                reason: "capped by the pod cgroup at 175Mi".into(),
            }),
            cpu: None,
        });
        let text = render_status(&s, &Resizes::default(), 4096, 0);
        let app = text.lines().find(|l| l.contains(" app ")).expect("app row");
        let cells: Vec<&str> = app.split_whitespace().collect();
        assert_eq!(
            cells[4], "500m/175Mi",
            "ACTUAL is the effective limit: {text}"
        );
        assert!(
            app.ends_with("memory capped by the pod cgroup at 175Mi"),
            "the reason: {text}"
        );
        // Not capped (known): the container's own limit, no reason.
        s.pods[0].containers[0]
            .observed
            .as_mut()
            .expect("observed")
            .caps = Some(crate::cgroup::Caps::default());
        let text = render_status(&s, &Resizes::default(), 4096, 0);
        let app = text.lines().find(|l| l.contains(" app ")).expect("app row");
        assert_eq!(app.split_whitespace().nth(4), Some("500m/512Mi"), "{text}");
        assert!(!app.contains("capped"), "{text}");
    }

    /// eBPF off as a whole (no kernel BTF) is said under the strategies, as `/readyz` says it;
    /// a single measurement's fallback (PSI on cgroup v1) is not repeated there.
    #[test]
    fn an_observer_without_ebpf_says_why_it_polls() {
        let mut s = status();
        let fallback = |program: &str, reason: &str| crate::api::FallbackView {
            program: program.into(),
            reason: reason.into(),
        };
        s.observer = Some(crate::api::ObserverView {
            strategies: crate::observer::Strategies::POLLING.into(),
            fallbacks: vec![
                fallback("btf", "no kernel BTF at /sys/kernel/btf/vmlinux"),
                fallback("pressure", "cgroup v1 has no pressure stall information"),
            ],
            interval_ms: 1000,
            maps: Vec::new(),
            possible_cpus: None,
            reclaim_on_demand: None,
        });
        let text = render_status(&s, &Resizes::default(), 4096, 0);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("observer:"))
            .collect();
        assert_eq!(
            lines,
            [
                "observer: throttle=cpu_stat_polling reclaim=memory_stat_polling oom=memory_events_polling every 1000ms",
                "observer: polling cgroup files: no kernel BTF at /sys/kernel/btf/vmlinux",
            ],
            "{text}"
        );
    }

    /// The eBPF maps' memory is said beside the strategies: it counts against the daemon's
    /// memory limit and no RSS figure shows it.
    #[test]
    fn the_ebpf_maps_memory_is_shown_with_the_possible_cpus() {
        let mut s = status();
        let map = |name: &str, bytes: u64| crate::api::MapMemoryView {
            name: name.into(),
            bytes,
            max_entries: 1,
        };
        s.observer = Some(crate::api::ObserverView {
            strategies: crate::observer::Strategies::POLLING.into(),
            fallbacks: Vec::new(),
            interval_ms: 1000,
            maps: vec![map("RECLAIM", 3 << 20), map("OOM", 1 << 19)],
            possible_cpus: Some(128),
            reclaim_on_demand: None,
        });
        let text = render_status(&s, &Resizes::default(), 4096, 0);
        assert!(
            text.lines().any(|l| l
                == "observer: eBPF maps 3.5Mi in 2 maps, 128 possible CPUs (in the daemon's memory limit, not its RSS)"),
            "{text}"
        );
    }

    #[test]
    fn disconnected_runtime_and_no_pods_say_so() {
        let mut s = status();
        s.runtime.connected = false;
        s.pods.clear();
        let text = render_status(&s, &Resizes::default(), 4096, 0);
        assert!(text.contains("DISCONNECTED"), "{text}");
        assert!(text.contains("(no pods)"), "{text}");
    }

    #[test]
    fn a_mismatch_without_a_reason_is_explained_and_unlimited_is_max() {
        let mut s = status();
        let c = &mut s.pods[0].containers[0];
        c.container.resources = Some(res(-1, -1));
        if let Some(o) = c.observed.as_mut() {
            o.matches = Some(false);
        }
        let text = render_status(&s, &Resizes::default(), 4096, 0);
        let row = text.lines().nth(2).expect("row");
        assert!(row.contains("max/max"), "{text}");
        assert!(row.ends_with("actual differs from desired"), "{text}");
    }

    #[test]
    fn a_mismatch_names_each_field_with_both_values() {
        let mut s = status();
        let c = &mut s.pods[0].containers[0];
        if let Some(o) = c.observed.as_mut() {
            o.matches = Some(false);
            o.differences = vec!["cpu.shares: desired 819, actual 1024".into()];
        }
        let text = render_status(&s, &Resizes::default(), 4096, 0);
        let row = text.lines().nth(2).expect("row");
        assert!(
            row.ends_with("actual differs from desired: cpu.shares: desired 819, actual 1024"),
            "{text}"
        );
    }

    /// What the table shows for a limit, `nri-resize resize` takes back as the same value: a
    /// container at an odd limit (68192Ki, 1234m) resized "to what status says" is unchanged.
    #[test]
    fn a_limit_as_shown_is_what_resize_accepts() {
        let mut resizes = Resizes::default();
        for (quota, memory) in [(123_400, 69_828_608), (150_000, 3 << 29), (100, 4096 + 1)] {
            resizes.containers.insert(
                "c1".into(),
                ContainerResize {
                    pod_id: "p1".into(),
                    container: "app".into(),
                    desired: Some(res(quota, memory)),
                    allocated: Some(res(quota, memory)),
                    state: None,
                    reason: String::new(),
                    updated_ms: 0,
                    deferred_target: None,
                },
            );
            let text = render_status(&status(), &resizes, 4096, 0);
            let cell = text
                .lines()
                .nth(2)
                .expect("app row")
                .split_whitespace()
                .nth(2);
            let (cpu, memory_text) = cell.and_then(|c| c.split_once('/')).expect("cpu/memory");
            let target = crate::api::parse_target(&format!("cpu={cpu},memory={memory_text}"))
                .unwrap_or_else(|e| panic!("{cpu}/{memory_text}: {e}"));
            assert_eq!(
                target.cpu_millis,
                Some(u64::try_from(quota / 100).unwrap()),
                "{text}"
            );
            assert_eq!(
                target.memory_bytes,
                Some(u64::try_from(memory).unwrap()),
                "{text}"
            );
        }
    }
}
