//! The per-container series, kept as plain numbers per container and rendered at scrape time.
//!
//! A `prometheus` metric vector gives every labelled series its own descriptor (a copy of the
//! family's name, help text and label names) and its own label pairs: about 400 bytes a series,
//! 17 series a container on cgroup v2, most of the daemon's growth per container. Here a
//! container costs its three label values and the numbers ([`Values`], about 200 bytes); the
//! families, their help texts and the label pairs exist once per scrape, in [`ContainerFamilies`]'s
//! `collect`. The exposition is the same: names, help, types, label names and order, values.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

use super::MetricsError;
use crate::sync::Locked as _;

/// The labels of a container's series: bounded by the containers on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ContainerLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// A limit pair of one view (desired, allocated or actual); `None`: the series is absent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LimitValues {
    pub cpu_millicores: Option<i64>,
    pub memory_bytes: Option<i64>,
}

/// One container's numbers. Counter groups are `None` until their first reading.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Values {
    /// Throttled periods, throttled seconds, OOM kills: from the observer's first reading.
    pub counters: Option<(u64, f64, u64)>,
    /// Reclaimed bytes and direct-reclaim seconds: once the strategy can tell.
    pub reclaim: Option<(u64, f64)>,
    /// Stall totals in seconds (cpu some, cpu full, memory some, memory full, io some, io full):
    /// with the first PSI reading.
    pub pressure: Option<[f64; 6]>,
    /// Verdicts on this container's resizes (healthy, harmful): from the first verdict.
    pub verdicts: Option<[u64; 2]>,
    /// The state of the container's pending resize (KEP spelling); `None`: none pending.
    pub resize_state: Option<&'static str>,
    pub desired: LimitValues,
    pub allocated: LimitValues,
    pub actual: LimitValues,
}

/// What a family shows of a container: the value of its extra label (if it has one) and a value.
type Samples = Vec<(Option<&'static str>, f64)>;

#[expect(clippy::cast_precision_loss, reason = "exposition values are f64")]
fn f(v: u64) -> f64 {
    v as f64
}

#[expect(clippy::cast_precision_loss, reason = "exposition values are f64")]
fn g(v: Option<i64>) -> Samples {
    v.map(|v| (None, v as f64)).into_iter().collect()
}

/// Millicores as cores (the base unit).
#[expect(clippy::cast_precision_loss, reason = "exposition values are f64")]
fn cores(v: Option<i64>) -> Samples {
    v.map(|v| (None, v as f64 / 1000.0)).into_iter().collect()
}

/// One stall total of the pressure series (index in [`Values::pressure`] order).
fn psi(v: &Values, i: usize) -> Samples {
    v.pressure.map(|p| (None, p[i])).into_iter().collect()
}

/// A per-container family.
pub struct Family {
    /// Name without the registry's prefix.
    pub name: &'static str,
    help: &'static str,
    kind: MetricType,
    /// A label beyond `namespace, pod, container`, if any.
    extra_label: Option<&'static str>,
    /// cAdvisor (the kubelet's `/metrics/cadvisor`) exports the same measurement of the same
    /// cgroup: left out when `[metrics] cadvisor_duplicates = false`.
    pub cadvisor_duplicate: bool,
    samples: fn(&Values) -> Samples,
}

const fn fam(
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    cadvisor_duplicate: bool,
    samples: fn(&Values) -> Samples,
) -> Family {
    Family {
        name,
        help,
        kind,
        extra_label: None,
        cadvisor_duplicate,
        samples,
    }
}

const COUNTER: MetricType = MetricType::COUNTER;
const GAUGE: MetricType = MetricType::GAUGE;

/// The families, in catalog order.
pub const FAMILIES: [Family; 19] = [
    fam("container_cpu_cfs_throttled_periods_total", "CFS throttle events of the container's cgroup (see docs/observer.md for what one event is per strategy).", COUNTER, true, |v| v.counters.map(|c| (None, f(c.0))).into_iter().collect()),
    fam("container_cpu_cfs_throttled_seconds_total", "Time the container's cgroup spent CFS-throttled.", COUNTER, true, |v| v.counters.map(|c| (None, c.1)).into_iter().collect()),
    fam("container_memory_reclaimed_bytes_total", "Memory reclaimed from the container's memcg (pages stolen by kswapd and direct reclaim times the page size).", COUNTER, false, |v| v.reclaim.map(|r| (None, f(r.0))).into_iter().collect()),
    fam("container_memory_direct_reclaim_seconds_total", "Time the container's tasks spent in memcg direct reclaim.", COUNTER, false, |v| v.reclaim.map(|r| (None, r.1)).into_iter().collect()),
    fam("container_oom_kills_total", "OOM kills of processes in the container's memcg.", COUNTER, true, |v| v.counters.map(|c| (None, f(c.2))).into_iter().collect()),
    fam("container_pressure_cpu_waiting_seconds_total", "Time some of the container's tasks waited for CPU (cgroup v2 cpu.pressure, some).", COUNTER, true, |v| psi(v, 0)),
    fam("container_pressure_cpu_stalled_seconds_total", "Time all of the container's tasks were stalled on CPU (cgroup v2 cpu.pressure, full).", COUNTER, true, |v| psi(v, 1)),
    fam("container_pressure_memory_waiting_seconds_total", "Time some of the container's tasks waited for memory (cgroup v2 memory.pressure, some).", COUNTER, true, |v| psi(v, 2)),
    fam("container_pressure_memory_stalled_seconds_total", "Time all of the container's tasks were stalled on memory (cgroup v2 memory.pressure, full).", COUNTER, true, |v| psi(v, 3)),
    fam("container_pressure_io_waiting_seconds_total", "Time some of the container's tasks waited for io (cgroup v2 io.pressure, some).", COUNTER, true, |v| psi(v, 4)),
    fam("container_pressure_io_stalled_seconds_total", "Time all of the container's tasks were stalled on io (cgroup v2 io.pressure, full).", COUNTER, true, |v| psi(v, 5)),
    fam("container_desired_cpu_cores", "CPU limit the runtime was last asked for (quota / period), in cores.", GAUGE, false, |v| cores(v.desired.cpu_millicores)),
    fam("container_actual_cpu_cores", "CPU limit in the container's cgroup when last read, in cores.", GAUGE, false, |v| cores(v.actual.cpu_millicores)),
    fam("container_desired_memory_bytes", "Memory limit the runtime was last asked for, in bytes.", GAUGE, false, |v| g(v.desired.memory_bytes)),
    fam("container_actual_memory_bytes", "Memory limit in the container's cgroup when last read, in bytes.", GAUGE, false, |v| g(v.actual.memory_bytes)),
    fam("container_allocated_cpu_cores", "CPU limit the runtime holds for the container (its spec after the last accepted update), in cores.", GAUGE, false, |v| cores(v.allocated.cpu_millicores)),
    fam("container_allocated_memory_bytes", "Memory limit the runtime holds for the container, in bytes.", GAUGE, false, |v| g(v.allocated.memory_bytes)),
    Family {
        name: "container_resize_verdicts_total",
        help: "Verdicts on the container's applied resizes: healthy, or harmful (throttling, stall share or OOM kills worse in the window after the resize than before).",
        kind: COUNTER,
        extra_label: Some("verdict"),
        cadvisor_duplicate: false,
        samples: |v| {
            v.verdicts
                .map(|[healthy, harmful]| vec![(Some("healthy"), f(healthy)), (Some("harmful"), f(harmful))])
                .unwrap_or_default()
        },
    },
    Family {
        name: "container_resize_state",
        help: "1 while the container has a resize pending, labelled with its KEP-1287 state (Proposed, InProgress, Deferred, Infeasible, Error); absent when none is pending.",
        kind: GAUGE,
        extra_label: Some("state"),
        cadvisor_duplicate: false,
        samples: |v| v.resize_state.map(|s| (Some(s), 1.0)).into_iter().collect(),
    },
];

/// The per-container families: one collector, registered once.
#[derive(Clone)]
pub struct ContainerFamilies {
    descs: Arc<Vec<Desc>>,
    values: Arc<Mutex<HashMap<ContainerLabels, Values>>>,
    /// Whether the families cAdvisor also exports are shown.
    cadvisor_duplicates: Arc<AtomicBool>,
}

impl std::fmt::Debug for ContainerFamilies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerFamilies").finish_non_exhaustive()
    }
}

impl ContainerFamilies {
    pub fn new() -> Result<Self, MetricsError> {
        let descs = FAMILIES
            .iter()
            .map(|family| {
                let mut labels = vec!["namespace".to_owned(), "pod".into(), "container".into()];
                labels.extend(family.extra_label.map(str::to_owned));
                Desc::new(
                    family.name.to_owned(),
                    family.help.to_owned(),
                    labels,
                    HashMap::new(),
                )
                .map_err(MetricsError::Register)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            descs: Arc::new(descs),
            values: Arc::default(),
            cadvisor_duplicates: Arc::new(AtomicBool::new(true)),
        })
    }

    /// Changes (creating) the numbers of the container labelled `labels`.
    pub fn with<R>(&self, labels: &ContainerLabels, change: impl FnOnce(&mut Values) -> R) -> R {
        let mut map = self.values.locked();
        match map.get_mut(labels) {
            Some(v) => change(v),
            None => change(map.entry(labels.clone()).or_default()),
        }
    }

    /// Changes the numbers of the container labelled `labels` if it still has series: a reading
    /// that races the container's removal does not bring its series back.
    pub fn update(&self, labels: &ContainerLabels, change: impl FnOnce(&mut Values)) {
        if let Some(v) = self.values.locked().get_mut(labels) {
            change(v);
        }
    }

    /// Every series of a container that went away.
    pub fn remove(&self, labels: &ContainerLabels) {
        self.values.locked().remove(labels);
    }

    pub fn len(&self) -> usize {
        self.values.locked().len()
    }

    /// Shows (`true`, the default) or leaves out the families cAdvisor also exports.
    pub fn set_cadvisor_duplicates(&self, on: bool) {
        self.cadvisor_duplicates.store(on, Ordering::Relaxed);
    }

    /// Sets every container's pending resize state: those in `states` to theirs, the others to
    /// none (containers without series are skipped: their series appear when they are tracked).
    pub fn set_resize_states(&self, states: &HashMap<ContainerLabels, &'static str>) {
        for (labels, v) in self.values.locked().iter_mut() {
            v.resize_state = states.get(labels).copied();
        }
    }
}

fn pair(name: &str, value: &str) -> LabelPair {
    let mut p = LabelPair::default();
    p.set_name(name.to_owned());
    p.set_value(value.to_owned());
    p
}

impl Collector for ContainerFamilies {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // A copy of the numbers, so that the NRI handlers and the observer setting them never
        // wait for a scrape building its thousands of series.
        let map: Vec<(ContainerLabels, Values)> = self
            .values
            .locked()
            .iter()
            .map(|(l, v)| (l.clone(), v.clone()))
            .collect();
        let duplicates = self.cadvisor_duplicates.load(Ordering::Relaxed);
        FAMILIES
            .iter()
            .filter(|family| duplicates || !family.cadvisor_duplicate)
            .map(|family| {
                let mut out = MetricFamily::default();
                out.set_name(family.name.to_owned());
                out.set_help(family.help.to_owned());
                out.set_field_type(family.kind);
                for (l, v) in &map {
                    for (extra, value) in (family.samples)(v) {
                        // Label pairs sorted by name, as the crate's own vectors give them.
                        let mut labels = vec![
                            pair("container", &l.container),
                            pair("namespace", &l.namespace),
                            pair("pod", &l.pod),
                        ];
                        if let (Some(name), Some(value)) = (family.extra_label, extra) {
                            labels.push(pair(name, value));
                            labels.sort_by(|a, b| a.name().cmp(b.name()));
                        }
                        let mut m = proto::Metric::default();
                        m.set_label(labels);
                        if family.kind == MetricType::COUNTER {
                            let mut c = proto::Counter::default();
                            c.set_value(value);
                            m.set_counter(c);
                        } else {
                            let mut gauge = proto::Gauge::default();
                            gauge.set_value(value);
                            m.set_gauge(gauge);
                        }
                        out.mut_metric().push(m);
                    }
                }
                out
            })
            .collect()
    }
}
