//! The one catalog of every metric the daemon exports: name, type, unit, labels, meaning.
//!
//! README.md carries it as a table ([`markdown`]; a unit test keeps the two identical), the
//! Grafana dashboard in `deploy/grafana/` may only query names listed here (tested), and every
//! family registered in [`super::Metrics`] (and by the capacity watcher) must be listed, and every
//! listed one registered (tested in `capacity/catalog_tests.rs`, which sees both registries).

use std::fmt::Write as _;

/// A metric's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Full name, prefix included (for counters, with `_total`).
    pub name: &'static str,
    pub kind: Kind,
    pub unit: &'static str,
    /// Label names; `namespace, pod, container` series are removed when the container goes,
    /// `namespace, pod` series when the pod goes.
    pub labels: &'static [&'static str],
    pub meaning: &'static str,
}

const C: &[&str] = &["namespace", "pod", "container"];
const P: &[&str] = &["namespace", "pod"];
const PSI: &[&str] = &["namespace", "pod", "container", "resource", "kind"];

const fn e(
    name: &'static str,
    kind: Kind,
    unit: &'static str,
    labels: &'static [&'static str],
    meaning: &'static str,
) -> Entry {
    Entry {
        name,
        kind,
        unit,
        labels,
        meaning,
    }
}

/// Every metric, grouped as the README presents them.
pub const CATALOG: &[Entry] = &[
    // NRI connection and handlers.
    e("nri_resize_nri_connected", Kind::Gauge, "0/1", &[], "1 while registered with the runtime over NRI (refreshed at every scrape)"),
    e("nri_resize_nri_events_total", Kind::Counter, "events", &["event"], "NRI events handled, by event (`CreateContainer`, `UpdateContainer`, ...)"),
    e("nri_resize_nri_handler_duration_seconds", Kind::Histogram, "seconds", &["event"], "time in the plugin's handler per NRI event (buckets 10 µs … 2 s)"),
    e("nri_resize_nri_handler_deadline_exceeded_total", Kind::Counter, "calls", &["event"], "handler calls that overran their budget and were answered without the handler (fail-open; a memory decrease refused)"),
    // Resizes.
    e("nri_resize_resize_outcomes_total", Kind::Counter, "requests", &["outcome"], "resize decisions: `in_place`, `restart`, `rejected`, `deferred`, `infeasible`, `error`"),
    e("nri_resize_resize_requests_total", Kind::Counter, "requests", &["resource", "direction", "outcome"], "resize requests (kubelet updates and whole-pod resizes) per resource (`cpu`, `memory`) and direction (`increase`, `decrease`) they change, by outcome (as above)"),
    e("nri_resize_resize_duration_seconds", Kind::Histogram, "seconds", &["resource", "direction"], "from a resize request's arrival until the plugin finished acting on it (kubelet update: the decision and ordering writes; whole-pod: every step executed and read back)"),
    e("nri_resize_resize_confirmation_seconds", Kind::Histogram, "seconds", &[], "from the runtime's `UpdateContainer` reaching the plugin to the container's cgroup, read back, holding every limit asked for (kubelet-driven updates)"),
    e("nri_resize_resize_verdicts_total", Kind::Counter, "resizes", &["resource", "direction", "verdict"], "verdicts on applied resizes, per limit they changed (`cpu`, `memory`; `increase`, `decrease`): `healthy`, or `harmful` when throttling, the cpu or memory stall share or OOM kills got worse in the `[verdict] window` after the resize than in the same window before (thresholds in `[verdict]`)"),
    e("nri_resize_restarts_total", Kind::Counter, "attempts", &["outcome"], "restart attempts for resizes whose policy demands a restart: `confirmed` (the init process exited and the runtime reported the stop), `retried`, `failed` (gave up)"),
    e("nri_resize_restarts_pending", Kind::Gauge, "restarts", &[], "restarts requested and not yet confirmed or given up"),
    e("nri_resize_annotation_errors_total", Kind::Counter, "annotations", &[], "malformed or disallowed nri-resize pod annotations that were ignored"),
    // Per container: desired / allocated / actual.
    e("nri_resize_container_desired_cpu_millicores", Kind::Gauge, "millicores", C, "CPU limit last asked of the runtime (update or spec); absent when unlimited"),
    e("nri_resize_container_allocated_cpu_millicores", Kind::Gauge, "millicores", C, "CPU limit the runtime holds for the container (its spec after the last accepted update); absent when unlimited"),
    e("nri_resize_container_actual_cpu_millicores", Kind::Gauge, "millicores", C, "CPU limit in the container's cgroup when last read"),
    e("nri_resize_container_desired_memory_bytes", Kind::Gauge, "bytes", C, "memory limit last asked of the runtime; absent when unlimited"),
    e("nri_resize_container_allocated_memory_bytes", Kind::Gauge, "bytes", C, "memory limit the runtime holds for the container; absent when unlimited"),
    e("nri_resize_container_actual_memory_bytes", Kind::Gauge, "bytes", C, "memory limit in the container's cgroup when last read"),
    // Per pod: pod-level resources (KEP-5419), desired / actual.
    e("nri_resize_pod_desired_cpu_millicores", Kind::Gauge, "millicores", P, "pod-level CPU limit last asked of the runtime (`UpdatePodSandbox`); absent when unlimited"),
    e("nri_resize_pod_actual_cpu_millicores", Kind::Gauge, "millicores", P, "CPU limit in the pod cgroup when last read back; absent when unlimited"),
    e("nri_resize_pod_desired_memory_bytes", Kind::Gauge, "bytes", P, "pod-level memory limit last asked of the runtime; absent when unlimited"),
    e("nri_resize_pod_actual_memory_bytes", Kind::Gauge, "bytes", P, "memory limit in the pod cgroup when last read back; absent when unlimited"),
    // Per container: what the observer measures.
    e("nri_resize_container_throttled_periods_total", Kind::Counter, "periods", C, "CFS throttle events of the container's cgroup (docs/observer.md: what one event is per strategy)"),
    e("nri_resize_container_throttled_seconds_total", Kind::Counter, "seconds", C, "time the container's cgroup spent CFS-throttled"),
    e("nri_resize_container_reclaimed_bytes_total", Kind::Counter, "bytes", C, "memory reclaimed from the container's memcg (kswapd + direct pgsteal × page size); absent where the strategy cannot tell"),
    e("nri_resize_container_direct_reclaim_seconds_total", Kind::Counter, "seconds", C, "time the container's tasks spent in memcg direct reclaim (eBPF only)"),
    e("nri_resize_container_oom_kills_total", Kind::Counter, "kills", C, "OOM kills of processes in the container's memcg"),
    e("nri_resize_container_pressure_stalled_seconds_total", Kind::Counter, "seconds", PSI, "time some (`kind=\"some\"`) or all (`full`) of the container's tasks were stalled waiting for `resource` (`cpu`, `memory`, `io`): the `total=` of its cgroup v2 `*.pressure` files; absent on cgroup v1 and on kernels without PSI (`nri_resize_observer_strategy{program=\"pressure\"}` and `/readyz` say why)"),
    // Safe memory decrease (issue 5).
    e("nri_resize_memory_decrease_outcomes_total", Kind::Counter, "decreases", &["outcome"], "memory limit decreases by outcome: `direct`, `inline`, `converged`, `deferred_anonymous`, `deferred_timeout`, `superseded`, `rejected`, `restarted`, `error`"),
    e("nri_resize_memory_decrease_reclaimed_bytes_total", Kind::Counter, "bytes", &[], "bytes by which memory decreases brought container usage down"),
    e("nri_resize_memory_decrease_reclaims_in_progress", Kind::Gauge, "reclaims", &[], "staged memory decreases reclaiming now"),
    e("nri_resize_memory_decrease_reclaim_duration_seconds", Kind::Histogram, "seconds", &[], "time a decrease below usage took to reclaim: inside the update (inline) or from accepting a staged decrease to its end"),
    // Node capacity (issue 6).
    e("nri_resize_node_capacity", Kind::Gauge, "cores / bytes", &["resource"], "online CPUs (cores) and `MemTotal` (bytes)"),
    e("nri_resize_node_allocatable", Kind::Gauge, "cores / bytes", &["resource"], "capacity minus the configured reserve"),
    e("nri_resize_node_capacity_changes_total", Kind::Counter, "changes", &["resource", "direction"], "capacity changes seen (`up`, `down`, `same`)"),
    e("nri_resize_node_capacity_detection_seconds", Kind::Histogram, "seconds", &["source"], "from the kernel event (cpuhp timestamp / uevent arrival) to the metric update"),
    e("nri_resize_node_capacity_events_total", Kind::Counter, "events", &["source"], "events that made the capacity watcher re-read (`cpuhp`, `uevent`, `resync`)"),
    e("nri_resize_node_offline_pinned_containers", Kind::Gauge, "containers", &[], "containers whose cpuset names an offline CPU"),
    e("nri_resize_capacity_reevaluations_total", Kind::Counter, "resizes", &["outcome"], "Deferred and Infeasible resizes re-evaluated after a capacity change (`applied`, `would_apply`, `deferred`, `infeasible`, `failed`)"),
    // Observer.
    e("nri_resize_observer_strategy", Kind::Gauge, "0/1", &["program", "strategy"], "1 for the strategy in effect per observer measurement (`throttle`, `reclaim`, `oom`, `hotplug`, `pressure`), 0 for the others; `pressure` is `pressure_files`, or says why not: `unavailable_cgroup_v1`, `unavailable_no_psi`"),
];

/// Looks a family name up; `name` may be a sample name (`_bucket`, `_sum`, `_count` of a
/// histogram).
pub fn lookup(name: &str) -> Option<&'static Entry> {
    CATALOG.iter().find(|e| e.name == name).or_else(|| {
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = name.strip_suffix(suffix)?;
            CATALOG
                .iter()
                .find(|e| e.name == base && e.kind == Kind::Histogram)
        })
    })
}

/// The catalog as the README's markdown table.
pub fn markdown() -> String {
    let mut s =
        String::from("| metric | type | unit | labels | meaning |\n|---|---|---|---|---|\n");
    for e in CATALOG {
        let labels = if e.labels.is_empty() {
            "—".to_string()
        } else {
            e.labels.join(", ")
        };
        let meaning = e.meaning;
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {labels} | {meaning} |",
            e.name,
            e.kind.as_str(),
            e.unit
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn the_readme_carries_the_catalog_table() {
        let readme = include_str!("../../../README.md");
        let table = markdown();
        assert!(
            readme.contains(&table),
            "README.md's metrics table is out of date; replace it with:\n{table}"
        );
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        let mut seen = BTreeSet::new();
        for e in CATALOG {
            assert!(e.name.starts_with("nri_resize_"), "{}", e.name);
            assert!(seen.insert(e.name), "{} listed twice", e.name);
        }
    }
}
