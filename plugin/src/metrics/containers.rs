//! The per-container series, kept as plain numbers per container and rendered at scrape time.
//!
//! A `prometheus` metric vector gives every labelled series its own descriptor (a copy of the
//! family's name, help text and label names) and its own label pairs: about 400 bytes a series,
//! 17 series a container on cgroup v2, most of the daemon's growth per container. Here a
//! container costs its three label values and the numbers ([`Values`], about 200 bytes); the
//! families, their help texts and the label pairs exist once per scrape, in [`ContainerFamilies`]'s
//! `collect`. The exposition is the same: names, help, types, label names and order, values.

use std::collections::HashMap;
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
    /// Stalled seconds in [`super::pressure_label_pairs`] order: with the first PSI reading.
    pub pressure: Option<[f64; 6]>,
    pub desired: LimitValues,
    pub allocated: LimitValues,
    pub actual: LimitValues,
}

/// What a family shows of a container: `(resource, kind)` label values and a value.
type Samples = Vec<(Option<[&'static str; 2]>, f64)>;

#[expect(clippy::cast_precision_loss, reason = "exposition values are f64")]
fn f(v: u64) -> f64 {
    v as f64
}

#[expect(clippy::cast_precision_loss, reason = "exposition values are f64")]
fn g(v: Option<i64>) -> Samples {
    v.map(|v| (None, v as f64)).into_iter().collect()
}

/// A family: name (without the registry's prefix), help, type, what it shows of a container.
type Family = (
    &'static str,
    &'static str,
    MetricType,
    fn(&Values) -> Samples,
);

/// The families, in catalog order.
const FAMILIES: [Family; 12] = [
    ("container_throttled_periods_total", "CFS throttle events of the container's cgroup (see docs/observer.md for what one event is per strategy).", MetricType::COUNTER, |v| v.counters.map(|c| (None, f(c.0))).into_iter().collect()),
    ("container_throttled_seconds_total", "Time the container's cgroup spent CFS-throttled.", MetricType::COUNTER, |v| v.counters.map(|c| (None, c.1)).into_iter().collect()),
    ("container_reclaimed_bytes_total", "Memory reclaimed from the container's memcg (pages stolen by kswapd and direct reclaim times the page size).", MetricType::COUNTER, |v| v.reclaim.map(|r| (None, f(r.0))).into_iter().collect()),
    ("container_direct_reclaim_seconds_total", "Time the container's tasks spent in memcg direct reclaim.", MetricType::COUNTER, |v| v.reclaim.map(|r| (None, r.1)).into_iter().collect()),
    ("container_oom_kills_total", "OOM kills of processes in the container's memcg.", MetricType::COUNTER, |v| v.counters.map(|c| (None, f(c.2))).into_iter().collect()),
    ("container_pressure_stalled_seconds_total", "Time some (kind=some) or all (kind=full) of the container's tasks were stalled on cpu, memory or io (cgroup v2 pressure stall information).", MetricType::COUNTER, |v| v.pressure.map(|p| super::pressure_label_pairs().into_iter().zip(p).map(|(l, s)| (Some(l), s)).collect()).unwrap_or_default()),
    ("container_desired_cpu_millicores", "CPU limit the runtime was last asked for (quota / period), in millicores.", MetricType::GAUGE, |v| g(v.desired.cpu_millicores)),
    ("container_actual_cpu_millicores", "CPU limit in the container's cgroup when last read, in millicores.", MetricType::GAUGE, |v| g(v.actual.cpu_millicores)),
    ("container_desired_memory_bytes", "Memory limit the runtime was last asked for, in bytes.", MetricType::GAUGE, |v| g(v.desired.memory_bytes)),
    ("container_actual_memory_bytes", "Memory limit in the container's cgroup when last read, in bytes.", MetricType::GAUGE, |v| g(v.actual.memory_bytes)),
    ("container_allocated_cpu_millicores", "CPU limit the runtime holds for the container (its spec after the last accepted update), in millicores.", MetricType::GAUGE, |v| g(v.allocated.cpu_millicores)),
    ("container_allocated_memory_bytes", "Memory limit the runtime holds for the container, in bytes.", MetricType::GAUGE, |v| g(v.allocated.memory_bytes)),
];

/// The per-container families: one collector, registered once.
#[derive(Clone)]
pub struct ContainerFamilies {
    descs: Arc<Vec<Desc>>,
    values: Arc<Mutex<HashMap<ContainerLabels, Values>>>,
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
            .map(|(name, help, _, _)| {
                let mut labels = vec!["namespace".to_owned(), "pod".into(), "container".into()];
                if name.contains("pressure") {
                    labels.extend(["resource".to_owned(), "kind".into()]);
                }
                Desc::new(
                    (*name).to_owned(),
                    (*help).to_owned(),
                    labels,
                    HashMap::new(),
                )
                .map_err(MetricsError::Register)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            descs: Arc::new(descs),
            values: Arc::default(),
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
        FAMILIES
            .iter()
            .map(|(name, help, kind, samples)| {
                let mut family = MetricFamily::default();
                family.set_name((*name).to_owned());
                family.set_help((*help).to_owned());
                family.set_field_type(*kind);
                for (l, v) in &map {
                    for (extra, value) in samples(v) {
                        // Label pairs sorted by name, as the crate's own vectors give them.
                        let mut labels = vec![pair("container", &l.container)];
                        if let Some([resource, kind]) = extra {
                            labels.push(pair("kind", kind));
                            labels.extend([pair("namespace", &l.namespace), pair("pod", &l.pod)]);
                            labels.push(pair("resource", resource));
                        } else {
                            labels.extend([pair("namespace", &l.namespace), pair("pod", &l.pod)]);
                        }
                        let mut m = proto::Metric::default();
                        m.set_label(labels);
                        if *kind == MetricType::COUNTER {
                            let mut c = proto::Counter::default();
                            c.set_value(value);
                            m.set_counter(c);
                        } else {
                            let mut gauge = proto::Gauge::default();
                            gauge.set_value(value);
                            m.set_gauge(gauge);
                        }
                        family.mut_metric().push(m);
                    }
                }
                family
            })
            .collect()
    }
}
