//! The capacity watcher's metrics, registered in the daemon's registry (prefix `nri_resize_`).
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `nri_resize_node_capacity_cpu_cores` | | online CPUs |
//! | `nri_resize_node_capacity_memory_bytes` | | `MemTotal` |
//! | `nri_resize_node_allocatable_cpu_cores` | | online CPUs minus the reserve (kubelet's or `[resize]`'s) |
//! | `nri_resize_node_allocatable_memory_bytes` | | `MemTotal` minus the reserve (kubelet's or `[resize]`'s) |
//! | `nri_resize_node_capacity_changes_total` | `resource`, `direction` | capacity changes seen (`up`, `down`, `same`) |
//! | `nri_resize_node_capacity_detection_seconds` | `source` | kernel event (cpuhp timestamp / uevent arrival) to metric update |
//! | `nri_resize_node_capacity_events_total` | `source` | events that made the watcher re-read (`cpuhp`, `uevent`, `resync`) |
//! | `nri_resize_node_offline_pinned_containers` | | containers whose cpuset names an offline CPU |
//! | `nri_resize_capacity_reevaluations_total` | `outcome` | waiting resizes re-evaluated after a change |

use prometheus::{Gauge, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry};

use super::snapshot::NodeSnapshot;
use crate::metrics::MetricsError;
use crate::state::CapacityChange;

/// Detection latency buckets, in seconds: from sub-millisecond (event-driven) to the 5-minute
/// poll upstream's machine-info refresh would need.
const LATENCY_BUCKETS: [f64; 14] = [
    0.000_1, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0, 60.0, 300.0,
];

/// See the module docs.
#[derive(Debug, Clone)]
pub struct CapacityMetrics {
    capacity_cpu: Gauge,
    capacity_memory: Gauge,
    allocatable_cpu: Gauge,
    allocatable_memory: Gauge,
    changes: IntCounterVec,
    detection: HistogramVec,
    events: IntCounterVec,
    pinned_offline: IntGauge,
    reevaluations: IntCounterVec,
}

fn reg<C: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    c: Result<C, prometheus::Error>,
) -> Result<C, MetricsError> {
    let c = c.map_err(MetricsError::Register)?;
    r.register(Box::new(c.clone()))
        .map_err(MetricsError::Register)?;
    Ok(c)
}

impl CapacityMetrics {
    /// Registers the metrics in `registry` (once per registry).
    pub fn register(registry: &Registry) -> Result<Self, MetricsError> {
        Ok(CapacityMetrics {
            capacity_cpu: reg(
                registry,
                Gauge::with_opts(Opts::new(
                    "node_capacity_cpu_cores",
                    "Online CPUs of the node, in cores.",
                )),
            )?,
            capacity_memory: reg(
                registry,
                Gauge::with_opts(Opts::new(
                    "node_capacity_memory_bytes",
                    "Memory of the node (MemTotal), in bytes.",
                )),
            )?,
            allocatable_cpu: reg(
                registry,
                Gauge::with_opts(Opts::new(
                    "node_allocatable_cpu_cores",
                    "Online CPUs minus the reserve (kubelet's with [kubelet] config_file, else [resize] reserved_cpu), in cores.",
                )),
            )?,
            allocatable_memory: reg(
                registry,
                Gauge::with_opts(Opts::new(
                    "node_allocatable_memory_bytes",
                    "MemTotal minus the reserve (kubelet's with [kubelet] config_file, else [resize] reserved_memory), in bytes.",
                )),
            )?,
            changes: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "node_capacity_changes_total",
                        "Node capacity changes detected, by resource and direction (up, down, same: other CPUs, same count).",
                    ),
                    &["resource", "direction"],
                ),
            )?,
            detection: reg(
                registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "node_capacity_detection_seconds",
                        "Time from the kernel event (cpuhp tracepoint timestamp, or uevent arrival) to the capacity metric update, in seconds.",
                    )
                    .buckets(LATENCY_BUCKETS.to_vec()),
                    &["source"],
                ),
            )?,
            events: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "node_capacity_events_total",
                        "Events that made the capacity watcher re-read the node, by source (cpuhp, uevent, resync).",
                    ),
                    &["source"],
                ),
            )?,
            pinned_offline: reg(
                registry,
                IntGauge::with_opts(Opts::new(
                    "node_offline_pinned_containers",
                    "Containers whose cpuset names a CPU that is offline.",
                )),
            )?,
            reevaluations: reg(
                registry,
                IntCounterVec::new(
                    Opts::new(
                        "capacity_reevaluations_total",
                        "Deferred and Infeasible resizes re-evaluated after a node capacity change, by outcome (applied, would_apply, deferred, infeasible, failed).",
                    ),
                    &["outcome"],
                ),
            )?,
        })
    }

    /// Sets capacity and allocatable from a reading and the reserves.
    #[expect(
        clippy::cast_precision_loss,
        reason = "gauges are f64; byte counts below 2^53 are exact"
    )]
    pub fn set_capacity(&self, s: &NodeSnapshot, reserved_cpu_millis: u64, reserved_memory: u64) {
        let cpu_millis = u64::from(s.online_cpus.count()) * 1000;
        self.capacity_cpu.set(f64::from(s.online_cpus.count()));
        self.capacity_memory.set(s.memory_bytes as f64);
        self.allocatable_cpu
            .set(cpu_millis.saturating_sub(reserved_cpu_millis) as f64 / 1000.0);
        self.allocatable_memory
            .set(s.memory_bytes.saturating_sub(reserved_memory) as f64);
    }

    /// Counts the capacity changes among `changes`.
    pub fn count_changes(&self, changes: &[CapacityChange]) {
        for c in changes.iter().filter(|c| c.kind.is_capacity()) {
            self.changes
                .with_label_values(&[c.kind.resource().as_str(), c.direction()])
                .inc();
        }
    }

    pub fn detected(&self, source: &'static str, seconds: f64) {
        self.detection.with_label_values(&[source]).observe(seconds);
    }

    pub fn event(&self, source: &'static str) {
        self.events.with_label_values(&[source]).inc();
    }

    pub fn set_pinned_offline(&self, n: usize) {
        self.pinned_offline
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn reevaluated(&self, outcome: &'static str) {
        self.reevaluations.with_label_values(&[outcome]).inc();
    }

    /// Creates one series of every labelled family so that `gather` lists them all (tests of
    /// the metrics catalog).
    #[doc(hidden)]
    pub fn touch_all_for_catalog(&self) {
        self.changes.with_label_values(&["cpu", "up"]);
        self.detection.with_label_values(&["cpuhp"]);
        self.events.with_label_values(&["resync"]);
        self.reevaluations.with_label_values(&["applied"]);
    }
}
