//! The one catalog of every metric the daemon exports: name, type, unit, labels, meaning.
//!
//! docs/metrics.md carries it as a table ([`markdown`]; a unit test keeps the two identical), the
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

/// How long a family's name, type, unit and labels are promised to stay (as kube-state-metrics
/// marks its families).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stability {
    /// Changed only with a major version, and then listed under "what changed".
    Stable,
    /// May change in any release (it measures something whose definition may still move).
    Experimental,
}

impl Stability {
    pub fn as_str(self) -> &'static str {
        match self {
            Stability::Stable => "stable",
            Stability::Experimental => "experimental",
        }
    }
}

/// One metric family.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Full name, prefix included (for counters, with `_total`).
    pub name: &'static str,
    pub kind: Kind,
    /// The base unit (`seconds`, `bytes`, `cores`) or what is counted.
    pub unit: &'static str,
    /// Label names; `namespace, pod, container` series are removed when the container goes,
    /// `namespace, pod` series when the pod goes.
    pub labels: &'static [&'static str],
    pub stability: Stability,
    /// cAdvisor exports the same measurement: left out with `[metrics] cadvisor_duplicates = false`.
    pub cadvisor_duplicate: bool,
    pub meaning: &'static str,
}

const C: &[&str] = &["namespace", "pod", "container"];
const P: &[&str] = &["namespace", "pod"];

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
        stability: Stability::Stable,
        cadvisor_duplicate: false,
        meaning,
    }
}

/// An entry that may still change.
const fn experimental(entry: Entry) -> Entry {
    Entry {
        stability: Stability::Experimental,
        ..entry
    }
}

/// A per-container entry cAdvisor also exports.
const fn cadvisor(entry: Entry) -> Entry {
    Entry {
        cadvisor_duplicate: true,
        ..entry
    }
}

/// Every metric, grouped as docs/metrics.md presents them.
pub const CATALOG: &[Entry] = &[
    // The daemon.
    e("nri_resize_build_info", Kind::Gauge, "1", &["version", "revision", "ebpf_object"], "always 1; `version` of the daemon, `revision` the commit it was built from (`unknown` when built outside git without `NRI_RESIZE_COMMIT`), `ebpf_object` `true` when the eBPF observer is built in (`false`: it can only poll)"),
    e("process_cpu_seconds_total", Kind::Counter, "seconds", &[], "user and system CPU time of the daemon (the `prometheus` crate's process collector, unprefixed like every exporter's)"),
    e("process_open_fds", Kind::Gauge, "file descriptors", &[], "open file descriptors of the daemon"),
    e("process_max_fds", Kind::Gauge, "file descriptors", &[], "the daemon's file descriptor limit"),
    e("process_virtual_memory_bytes", Kind::Gauge, "bytes", &[], "virtual memory size of the daemon"),
    e("process_resident_memory_bytes", Kind::Gauge, "bytes", &[], "resident memory of the daemon"),
    e("process_start_time_seconds", Kind::Gauge, "seconds", &[], "start time of the daemon since the Unix epoch"),
    e("process_threads", Kind::Gauge, "threads", &[], "OS threads of the daemon"),
    // NRI connection and handlers.
    e("nri_resize_mode", Kind::Gauge, "1", &["mode"], "1 for the resize mode in effect (`[resize] mode`: `Enforce` or `Observe`), 0 for the other; in `Observe` nothing is refused, so the alerts that page on refusals and on a lost runtime connection ask it"),
    e("nri_resize_nri_connected", Kind::Gauge, "1", &[], "1 while registered with the runtime over NRI, else 0 (refreshed at every scrape)"),
    e("nri_resize_nri_events_total", Kind::Counter, "events", &["event"], "NRI events handled, by event (`create_container`, `update_container`, ..., `synchronize`)"),
    e("nri_resize_nri_handler_duration_seconds", Kind::Histogram, "seconds", &["event"], "time in the plugin's handler per NRI event (buckets 10 µs … 2 s)"),
    e("nri_resize_nri_handler_deadline_exceeded_total", Kind::Counter, "calls", &["event"], "handler calls that overran their budget and were answered without the handler (fail-open; a memory decrease refused)"),
    // Resizes.
    e("nri_resize_resizes", Kind::Gauge, "containers", &["state"], "containers with a resize pending now, by KEP-1287 state (`Proposed`, `InProgress`, `Deferred`, `Infeasible`, `Error`; every state present, 0 when none)"),
    e("nri_resize_container_resize_state", Kind::Gauge, "1", &["namespace", "pod", "container", "state"], "1 while the container has a resize pending, labelled with its state (as above); absent when none is pending"),
    e("nri_resize_resize_outcomes_total", Kind::Counter, "requests", &["outcome"], "resize decisions: `in_place`, `restart`, `rejected`, `deferred`, `infeasible`, `error`"),
    e("nri_resize_resize_requests_total", Kind::Counter, "requests", &["resource", "direction", "outcome"], "resize requests (kubelet updates and whole-pod resizes) per resource (`cpu`, `memory`) and direction (`increase`, `decrease`) they change, by outcome (as above)"),
    e("nri_resize_resize_duration_seconds", Kind::Histogram, "seconds", &["resource", "direction"], "from a resize request's arrival until the plugin finished acting on it (kubelet update: the decision and ordering writes; whole-pod: every step executed and read back)"),
    e("nri_resize_resize_confirmation_seconds", Kind::Histogram, "seconds", &[], "from the runtime's `UpdateContainer` reaching the plugin to the container's cgroup, read back, holding every limit asked for (kubelet-driven updates)"),
    experimental(e("nri_resize_resize_verdicts_total", Kind::Counter, "resizes", &["resource", "direction", "verdict"], "verdicts on applied resizes, per limit they changed (`cpu`, `memory`; `increase`, `decrease`): `healthy`, or `harmful` when throttling, the cpu or memory stall share or OOM kills got worse in the `[verdict] window` after the resize than in the same window before (thresholds in `[verdict]`)")),
    experimental(e("nri_resize_container_resize_verdicts_total", Kind::Counter, "resizes", &["namespace", "pod", "container", "verdict"], "the same verdicts per container (`healthy`, `harmful`): join with kube-state-metrics' `kube_pod_owner` on `namespace, pod` for the workload")),
    e("nri_resize_capped_containers", Kind::Gauge, "containers", &["resource"], "containers whose limit an ancestor cgroup (their pod's, or one between it and theirs) caps below their own, per resource (`memory`, `cpu`): the smaller limit is in effect, `/v1/status` and `nri-resize status` name the cgroup (kubernetes/kubernetes#138760)"),
    e("nri_resize_restarts_total", Kind::Counter, "attempts", &["outcome"], "restart attempts for resizes whose policy demands a restart: `confirmed` (the init process exited and the runtime reported the stop), `retried`, `failed` (gave up)"),
    e("nri_resize_restarts_pending", Kind::Gauge, "restarts", &[], "restarts requested and not yet confirmed or given up"),
    e("nri_resize_annotation_errors_total", Kind::Counter, "annotations", &[], "malformed or disallowed nri-resize pod annotations that were ignored"),
    // Per container: desired / allocated / actual.
    e("nri_resize_container_desired_cpu_cores", Kind::Gauge, "cores", C, "CPU limit last asked of the runtime (update or spec); absent when unlimited"),
    e("nri_resize_container_allocated_cpu_cores", Kind::Gauge, "cores", C, "CPU limit the runtime holds for the container (its spec after the last accepted update); absent when unlimited"),
    e("nri_resize_container_actual_cpu_cores", Kind::Gauge, "cores", C, "CPU limit in the container's cgroup when last read back; absent when unlimited"),
    e("nri_resize_container_desired_memory_bytes", Kind::Gauge, "bytes", C, "memory limit last asked of the runtime; absent when unlimited"),
    e("nri_resize_container_allocated_memory_bytes", Kind::Gauge, "bytes", C, "memory limit the runtime holds for the container; absent when unlimited"),
    e("nri_resize_container_actual_memory_bytes", Kind::Gauge, "bytes", C, "memory limit in the container's cgroup when last read back; absent when unlimited"),
    // Per pod: pod-level resources (KEP-5419), desired / actual.
    e("nri_resize_pod_desired_cpu_cores", Kind::Gauge, "cores", P, "pod-level CPU limit last asked of the runtime (`UpdatePodSandbox`); absent when unlimited"),
    e("nri_resize_pod_actual_cpu_cores", Kind::Gauge, "cores", P, "CPU limit in the pod cgroup when last read back; absent when unlimited"),
    e("nri_resize_pod_desired_memory_bytes", Kind::Gauge, "bytes", P, "pod-level memory limit last asked of the runtime; absent when unlimited"),
    e("nri_resize_pod_actual_memory_bytes", Kind::Gauge, "bytes", P, "memory limit in the pod cgroup when last read back; absent when unlimited"),
    e("nri_resize_node_page_size_bytes", Kind::Gauge, "bytes", &[], "the kernel's page size: a cgroup holds a memory limit in whole pages, rounded down (1G, 1000000000 bytes, reads back 999997440 with 4 KiB pages), so a limit is in effect when desired minus actual is at least 0 and below this"),
    // Per container: what the observer measures.
    cadvisor(e("nri_resize_container_cpu_cfs_throttled_periods_total", Kind::Counter, "periods", C, "CFS throttle events of the container's cgroup (docs/observer.md: what one event is per strategy); cAdvisor: `container_cpu_cfs_throttled_periods_total`")),
    cadvisor(e("nri_resize_container_cpu_cfs_throttled_seconds_total", Kind::Counter, "seconds", C, "time the container's cgroup spent CFS-throttled; cAdvisor: `container_cpu_cfs_throttled_seconds_total`")),
    e("nri_resize_container_memory_reclaimed_bytes_total", Kind::Counter, "bytes", C, "memory reclaimed from the container's memcg (kswapd + direct pgsteal × page size); absent where the strategy cannot tell"),
    e("nri_resize_container_memory_direct_reclaim_seconds_total", Kind::Counter, "seconds", C, "time the container's tasks spent in memcg direct reclaim (eBPF only)"),
    cadvisor(e("nri_resize_container_oom_kills_total", Kind::Counter, "kills", C, "OOM kills of processes in the container's memcg; cAdvisor: `container_oom_events_total`")),
    cadvisor(e("nri_resize_container_pressure_cpu_waiting_seconds_total", Kind::Counter, "seconds", C, "time some of the container's tasks waited for CPU: `some total=` of its cgroup v2 `cpu.pressure`; absent on cgroup v1 and on kernels without PSI (`nri_resize_observer_strategy{program=\"pressure\"}` says why); cAdvisor: `container_pressure_cpu_waiting_seconds_total`")),
    cadvisor(e("nri_resize_container_pressure_cpu_stalled_seconds_total", Kind::Counter, "seconds", C, "time all of the container's tasks were stalled on CPU (`full total=` of `cpu.pressure`); cAdvisor: `container_pressure_cpu_stalled_seconds_total`")),
    cadvisor(e("nri_resize_container_pressure_memory_waiting_seconds_total", Kind::Counter, "seconds", C, "time some of the container's tasks waited for memory (`some` of `memory.pressure`); cAdvisor: `container_pressure_memory_waiting_seconds_total`")),
    cadvisor(e("nri_resize_container_pressure_memory_stalled_seconds_total", Kind::Counter, "seconds", C, "time all of the container's tasks were stalled on memory (`full` of `memory.pressure`); cAdvisor: `container_pressure_memory_stalled_seconds_total`")),
    cadvisor(e("nri_resize_container_pressure_io_waiting_seconds_total", Kind::Counter, "seconds", C, "time some of the container's tasks waited for io (`some` of `io.pressure`); cAdvisor: `container_pressure_io_waiting_seconds_total`")),
    cadvisor(e("nri_resize_container_pressure_io_stalled_seconds_total", Kind::Counter, "seconds", C, "time all of the container's tasks were stalled on io (`full` of `io.pressure`); cAdvisor: `container_pressure_io_stalled_seconds_total`")),
    // Safe memory decrease.
    e("nri_resize_memory_decrease_outcomes_total", Kind::Counter, "decreases", &["outcome"], "memory limit decreases by outcome: `direct`, `inline`, `converged`, `deferred_anonymous`, `deferred_timeout`, `superseded`, `rejected`, `restarted`, `error`"),
    e("nri_resize_memory_decrease_reclaimed_bytes_total", Kind::Counter, "bytes", &[], "bytes by which memory decreases brought container usage down"),
    e("nri_resize_memory_decrease_reclaims_in_progress", Kind::Gauge, "reclaims", &[], "memory decreases reclaiming now (in the background toward a refused limit, a whole-pod step's, a resumed checkpoint's)"),
    e("nri_resize_memory_decrease_reclaim_duration_seconds", Kind::Histogram, "seconds", &[], "time a decrease below usage took to reclaim: inside the update (inline), or a reclaim from its start to its end"),
    // Working-set trimming (docs/trimming.md).
    experimental(e("nri_resize_container_trim_working_set_bytes", Kind::Gauge, "bytes", C, "the memory usage at which working-set trimming's last probe found the container's working set (its first sign of harm: stall over the target or refaults); not cAdvisor's `container_memory_working_set_bytes` (usage minus inactive file cache); absent until a probe converged")),
    e("nri_resize_container_trim_trimmed_bytes_total", Kind::Counter, "bytes", C, "page cache working-set trimming reclaimed from the container"),
    e("nri_resize_trim_turns_postponed_total", Kind::Counter, "turns", &[], "container turns working-set trimming postponed to its next pass because the pass reached its time budget (`[trim] pass_budget`)"),
    // Node capacity.
    e("nri_resize_node_capacity_cpu_cores", Kind::Gauge, "cores", &[], "online CPUs of the node"),
    e("nri_resize_node_capacity_memory_bytes", Kind::Gauge, "bytes", &[], "memory of the node (`MemTotal`)"),
    e("nri_resize_node_allocatable_cpu_cores", Kind::Gauge, "cores", &[], "online CPUs minus the reserve: kubelet's (`[kubelet] config_file`) or `[resize] reserved_cpu`"),
    e("nri_resize_node_allocatable_memory_bytes", Kind::Gauge, "bytes", &[], "`MemTotal` minus the reserve: kubelet's (`[kubelet] config_file`) or `[resize] reserved_memory`"),
    e("nri_resize_node_reserve_mismatch", Kind::Gauge, "1", &["resource"], "1 when admission's node reserve disagrees with kubelet's (its configuration file or its pods cgroup) for `memory` or `cpu`; `/v1/status` says how"),
    e("nri_resize_node_capacity_changes_total", Kind::Counter, "changes", &["resource", "direction"], "capacity changes seen (`cpu`, `memory`; `up`, `down`, `same`: other CPUs, same count)"),
    experimental(e("nri_resize_node_capacity_detection_seconds", Kind::Histogram, "seconds", &["source"], "from the kernel event (cpuhp timestamp / uevent arrival) to the metric update")),
    experimental(e("nri_resize_node_capacity_events_total", Kind::Counter, "events", &["source"], "events that made the capacity watcher re-read (`cpuhp`, `uevent`, `resync`)")),
    e("nri_resize_node_offline_pinned_containers", Kind::Gauge, "containers", &[], "containers whose cpuset names an offline CPU"),
    e("nri_resize_capacity_reevaluations_total", Kind::Counter, "resizes", &["outcome"], "Deferred and Infeasible resizes re-evaluated after a capacity change (`applied`, `would_apply`, `deferred`, `infeasible`, `failed`)"),
    // Observer.
    e("nri_resize_bpf_map_memory_bytes", Kind::Gauge, "bytes", &["map"], "memory of each of the observer's eBPF maps (`THROTTLE`, `RECLAIM`, `OOM`, ...: its `memlock` in `/proc/self/fdinfo`), set once after load; charged to the daemon's memory cgroup (it counts against the container's memory limit) and not in its RSS; `sum()` is the total (docs/observer.md#map-memory)"),
    e("nri_resize_observer_strategy", Kind::Gauge, "1", &["program", "strategy"], "1 for the strategy in effect per observer measurement (`throttle`, `reclaim`, `oom`, `hotplug`, `pressure`), 0 for the others; `*_polling` and `unavailable*` are the fallbacks from eBPF; `pressure` is `pressure_files`, or says why not: `unavailable_cgroup_v1`, `unavailable_no_psi`"),
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

/// The catalog as docs/metrics.md's table (¹: left out with `[metrics] cadvisor_duplicates = false`).
pub fn markdown() -> String {
    let mut s = String::from(
        "| metric | type | unit | labels | stability | meaning |\n|---|---|---|---|---|---|\n",
    );
    for e in CATALOG {
        let labels = if e.labels.is_empty() {
            "—".to_string()
        } else {
            e.labels.join(", ")
        };
        let meaning = e.meaning;
        let stability = e.stability.as_str();
        let dup = if e.cadvisor_duplicate { " ¹" } else { "" };
        let _ = writeln!(
            s,
            "| `{}`{dup} | {} | {} | {labels} | {stability} | {meaning} |",
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

    const DOC: &str = include_str!("../../../docs/metrics.md");

    #[test]
    fn docs_metrics_md_carries_the_catalog_table() {
        let table = markdown();
        assert!(
            DOC.contains(&table),
            "docs/metrics.md's metrics table is out of date; replace it with:\n{table}"
        );
    }

    /// Every metric name docs/metrics.md writes in backquotes outside the "what changed" section
    /// is a family of the catalog (or a histogram's sample): no documented family is missing from
    /// the daemon.
    #[test]
    fn every_metric_docs_metrics_md_names_is_cataloged() {
        let current = DOC.split("## What changed").next().unwrap_or(DOC);
        for chunk in current.split('`').skip(1).step_by(2) {
            let name = chunk.split(['{', ' ', '[']).next().unwrap_or_default();
            if (name.starts_with("nri_resize_") || name.starts_with("process_"))
                && !name.ends_with('_')
                && !name.contains('*')
            {
                assert!(
                    lookup(name).is_some(),
                    "docs/metrics.md names {name}, which is not in the catalog"
                );
            }
        }
    }

    /// Every label of the catalog has a row in docs/metrics.md's label table (its values and
    /// bound).
    #[test]
    fn every_label_has_its_cardinality_bound_documented() {
        let labels: BTreeSet<&str> = CATALOG
            .iter()
            .flat_map(|e| e.labels.iter().copied())
            .collect();
        for l in labels {
            assert!(
                DOC.contains(&format!("| `{l}` |")),
                "docs/metrics.md's label table has no row for `{l}`"
            );
        }
    }

    #[test]
    fn names_are_unique_prefixed_and_in_base_units() {
        let mut seen = BTreeSet::new();
        for e in CATALOG {
            assert!(
                e.name.starts_with("nri_resize_") || e.name.starts_with("process_"),
                "{}",
                e.name
            );
            assert!(seen.insert(e.name), "{} listed twice", e.name);
            for unit in ["seconds", "bytes", "cores"] {
                if e.unit == unit {
                    let base = e.name.trim_end_matches("_total");
                    assert!(base.ends_with(unit), "{}: the unit ends the name", e.name);
                }
            }
            for not_base in ["millicores", "milliseconds", "_ms", "kilobytes", "_us"] {
                assert!(!e.name.contains(not_base), "{}: not a base unit", e.name);
            }
        }
    }
}
