//! What Prometheus sees: an explicit [`Registry`] with the `nri_resize_` prefix (no global
//! registry), per-container series labelled `namespace`, `pod`, `container` and removed when the
//! container goes, the observer's strategies, and NRI handler counts and latency; the process collector's `process_*` series from a second, unprefixed registry.
//!
//! Served as Prometheus text on `--metrics-addr` by [`serve`], with `/healthz` and `/readyz`.
//! The catalog is [`catalog::CATALOG`] (and docs/metrics.md's table); `OpenMetrics` text is served when
//! the scraper asks for it ([`Metrics::encode_openmetrics`]).

pub mod catalog;
mod confirmation;
mod containers;
mod decrease;
mod openmetrics;
mod pod;
mod reserve;
mod restart;
mod series;
mod server;
mod trim;
mod verdict;

use std::collections::HashMap;
use std::fmt;
use std::sync::RwLock;
use std::time::Instant;

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

pub use confirmation::ConfirmationMetrics;
pub use containers::ContainerLabels;
use containers::{ContainerFamilies, LimitValues};
pub use decrease::{DecreaseMetrics, DecreaseOutcome};
pub use pod::PodMetrics;
pub use reserve::ReserveMetrics;
pub use restart::{RestartMetrics, RestartOutcome};
pub use series::ContainerSeries;
pub use server::{serve, serve_with, Limits, MetricsServer, Readiness};
pub use trim::TrimMetrics;
pub use verdict::VerdictMetrics;

use crate::cgroup::ActualResources;
use crate::config::Mode;
use crate::model::LinuxResources;
use crate::nri::HandlerObserver;
use crate::observer::map_memory::MapMemory;
use crate::observer::{
    HotplugStrategy, OomStrategy, PressureStrategy, ReclaimStrategy, Strategies, ThrottleStrategy,
};
use crate::policy::{Direction, ResizeState, Resource, Verdict};
use crate::sync::ReadWriteLocked as _;

const PREFIX: &str = "nri_resize";

/// Errors of metric registration and encoding.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("register metric: {0}")]
    Register(#[source] prometheus::Error),
    #[error("encode metrics: {0}")]
    Encode(#[source] prometheus::Error),
    #[error("metrics listener {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// The containers with a resize pending and its state, asked at every scrape (set by the daemon:
/// the resize engine's records).
pub type ResizeStateSource = Box<dyn Fn() -> Vec<(ContainerLabels, ResizeState)> + Send + Sync>;

/// Every state `nri_resize_resizes` counts (always present, 0 when none).
const RESIZE_STATES: [ResizeState; 5] = [
    ResizeState::Proposed,
    ResizeState::InProgress,
    ResizeState::Deferred,
    ResizeState::Infeasible,
    ResizeState::Error,
];

/// All metrics of the daemon, in their own registry.
pub struct Metrics {
    registry: Registry,
    /// The process collector's `process_*` series: unprefixed, as every exporter names them.
    process: Registry,
    resize_states: IntGaugeVec,
    resize_state_source: RwLock<Option<ResizeStateSource>>,
    /// Every `namespace, pod, container` series.
    containers: ContainerFamilies,
    resize_requests: IntCounterVec,
    resize_duration: HistogramVec,
    observer_strategy: IntGaugeVec,
    bpf_map_memory: IntGaugeVec,
    nri_connected: IntGauge,
    mode: IntGaugeVec,
    nri_events: IntCounterVec,
    nri_deadlines: IntCounterVec,
    nri_handler_duration: HistogramVec,
    resize_outcomes: IntCounterVec,
    annotation_errors: IntCounter,
    /// Safe memory decreases.
    pub decrease: DecreaseMetrics,
    /// Restarts a resize policy demands.
    pub restart: RestartMetrics,
    /// Resize confirmation latency.
    pub confirmation: ConfirmationMetrics,
    /// Pod-level resources (desired vs actual per pod).
    pub pod: PodMetrics,
    /// Verdicts on applied resizes.
    pub verdict: VerdictMetrics,
    /// Admission's node reserve against kubelet's.
    pub reserve: ReserveMetrics,
    /// Working-set trimming per container.
    pub trim: TrimMetrics,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn register<C: Collector + Clone + 'static>(registry: &Registry, c: C) -> Result<C, MetricsError> {
    registry
        .register(Box::new(c.clone()))
        .map_err(MetricsError::Register)?;
    Ok(c)
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
}

/// `nri_resize_build_info{version, revision, ebpf_object} 1`: `revision` is the commit the binary
/// was built from (`plugin/build.rs`: git, else `NRI_RESIZE_COMMIT`, else `unknown`), as
/// Prometheus' own `*_build_info` name it.
fn build_info(r: &Registry) -> Result<(), MetricsError> {
    let info = register(
        r,
        IntGaugeVec::new(
            opts(
                "build_info",
                "1, labelled with the daemon's version, the commit it was built from and whether its eBPF observer object is built in.",
            ),
            &["version", "revision", "ebpf_object"],
        )
        .map_err(MetricsError::Register)?,
    )?;
    let ebpf_object = if cfg!(nri_resize_ebpf_object) {
        "true"
    } else {
        "false"
    };
    info.with_label_values(&[
        env!("CARGO_PKG_VERSION"),
        env!("NRI_RESIZE_COMMIT"),
        ebpf_object,
    ])
    .set(1);
    Ok(())
}

/// `nri_resize_node_page_size_bytes`: memory limits are held in whole pages, rounded down, and
/// the alert on limits not in effect allows for less than one (a limit asked in bytes, as VPA
/// and `1G` ask, is never read back byte for byte).
fn node_page_size(r: &Registry) -> Result<(), MetricsError> {
    let page = register(
        r,
        IntGauge::with_opts(opts(
            "node_page_size_bytes",
            "The kernel's page size in bytes: memory limits are held in whole pages, rounded down.",
        ))
        .map_err(MetricsError::Register)?,
    )?;
    page.set(i64::try_from(crate::cgroup::page_size()).unwrap_or(i64::MAX));
    Ok(())
}

/// `nri_resize_nri_connected`.
fn nri_connected(r: &Registry) -> Result<IntGauge, MetricsError> {
    register(
        r,
        IntGauge::with_opts(opts(
            "nri_connected",
            "1 while registered with the runtime over NRI.",
        ))
        .map_err(MetricsError::Register)?,
    )
}

/// `nri_resize_mode{mode}`: 1 for the resize mode in effect (`[resize] mode`), 0 for the other.
fn mode(r: &Registry) -> Result<IntGaugeVec, MetricsError> {
    let mode = register(
        r,
        IntGaugeVec::new(
            opts(
                "mode",
                "1 for the resize mode in effect (Enforce or Observe), 0 for the other.",
            ),
            &["mode"],
        )
        .map_err(MetricsError::Register)?,
    )?;
    for m in [Mode::Enforce, Mode::Observe] {
        mode.with_label_values(&[mode_label(m)])
            .set(i64::from(m == Mode::default()));
    }
    Ok(mode)
}

/// The `mode` label's value: the mode as `[resize] mode` spells it.
fn mode_label(m: Mode) -> &'static str {
    match m {
        Mode::Enforce => "Enforce",
        Mode::Observe => "Observe",
    }
}

/// `nri_resize_resizes{state}`, every state present (at 0).
fn resize_states(r: &Registry) -> Result<IntGaugeVec, MetricsError> {
    let states = register(
        r,
        IntGaugeVec::new(
            opts(
                "resizes",
                "Containers with a resize pending, by KEP-1287 state (Proposed, InProgress, Deferred, Infeasible, Error).",
            ),
            &["state"],
        )
        .map_err(MetricsError::Register)?,
    )?;
    for s in RESIZE_STATES {
        states.with_label_values(&[s.as_str()]);
    }
    Ok(states)
}

/// The process collector's `process_*` families, in a registry of their own: unprefixed.
fn process_registry() -> Result<Registry, MetricsError> {
    let process = Registry::new();
    process
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .map_err(MetricsError::Register)?;
    Ok(process)
}

impl Metrics {
    pub fn new() -> Result<Self, MetricsError> {
        let registry =
            Registry::new_custom(Some(PREFIX.to_owned()), None).map_err(MetricsError::Register)?;
        let r = &registry;
        let int_counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(opts(name, help), labels)
                .map_err(MetricsError::Register)
                .and_then(|c| register(r, c))
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(opts(name, help), labels)
                .map_err(MetricsError::Register)
                .and_then(|c| register(r, c))
        };
        build_info(r)?;
        node_page_size(r)?;
        Ok(Metrics {
            process: process_registry()?,
            resize_states: resize_states(r)?,
            resize_state_source: RwLock::new(None),
            containers: register(r, ContainerFamilies::new()?)?,
            resize_requests: int_counter(
                "resize_requests_total",
                "Resize requests per resource and direction they change, by outcome.",
                &["resource", "direction", "outcome"],
            )?,
            resize_duration: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "resize_duration_seconds",
                        "From a resize request's arrival until the plugin finished acting on it.",
                    )
                    .buckets(vec![
                        0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                        2.5, 5.0, 10.0, 30.0,
                    ]),
                    &["resource", "direction"],
                )
                .map_err(MetricsError::Register)?,
            )?,
            observer_strategy: gauge(
                "observer_strategy",
                "1 for the strategy in effect per observer measurement, 0 for the others.",
                &["program", "strategy"],
            )?,
            bpf_map_memory: gauge(
                "bpf_map_memory_bytes",
                "Memory of each of the observer's eBPF maps (memlock): charged to the daemon's memory cgroup, not in its RSS.",
                &["map"],
            )?,
            nri_connected: nri_connected(r)?,
            mode: mode(r)?,
            nri_events: int_counter(
                "nri_events_total",
                "NRI events handled, by event.",
                &["event"],
            )?,
            nri_deadlines: int_counter(
                "nri_handler_deadline_exceeded_total",
                "NRI handler calls that overran their budget and were answered without the handler (fail-open; a memory decrease refused).",
                &["event"],
            )?,
            nri_handler_duration: register(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "nri_handler_duration_seconds",
                        "Time spent in the plugin's NRI handler per event.",
                    )
                    // Finer around the 1 ms handler target, so a p99 read off the buckets
                    // says which side of it the handler is on.
                    .buckets(vec![
                        0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.000_75,
                        0.001, 0.002_5, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0,
                    ]),
                    &["event"],
                )
                .map_err(MetricsError::Register)?,
            )?,
            resize_outcomes: int_counter(
                "resize_outcomes_total",
                "Resize decisions by outcome: in_place, restart, rejected, deferred, infeasible, error.",
                &["outcome"],
            )?,
            annotation_errors: register(
                r,
                IntCounter::with_opts(opts(
                    "annotation_errors_total",
                    "Malformed or disallowed nri-resize pod annotations that were ignored.",
                ))
                .map_err(MetricsError::Register)?,
            )?,
            decrease: DecreaseMetrics::new(r)?,
            restart: RestartMetrics::new(r)?,
            confirmation: ConfirmationMetrics::new(r)?,
            pod: PodMetrics::new(r)?,
            verdict: VerdictMetrics::new(r)?,
            reserve: ReserveMetrics::new(r)?,
            trim: TrimMetrics::new(r)?,
            registry,
        })
    }

    /// Counts one resize decision (`outcome` is one of a fixed set of values).
    pub fn resize_outcome(&self, outcome: &'static str) {
        self.resize_outcomes.with_label_values(&[outcome]).inc();
    }

    /// Counts one ignored annotation.
    pub fn annotation_error(&self) {
        self.annotation_errors.inc();
    }

    /// Starts timing one resize request that changes `changes` (resource, direction); the
    /// returned guard records the duration when dropped and the outcome when told.
    pub fn resize_timer(&self, changes: &[(Resource, Direction)]) -> ResizeTimer<'_> {
        ResizeTimer {
            metrics: self,
            changes: changes.to_vec(),
            start: Instant::now(),
        }
    }

    /// The registry of the `nri_resize_` families (the capacity watcher registers its own in it).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Everything exported: the `nri_resize_` families, then the process collector's, with the
    /// resize states refreshed from their source first.
    pub fn gather(&self) -> Vec<MetricFamily> {
        self.refresh_resize_states();
        let mut families = self.registry.gather();
        families.extend(self.process.gather());
        families
    }

    /// Prometheus text exposition of everything registered.
    pub fn encode(&self) -> Result<String, MetricsError> {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.gather())
            .map_err(MetricsError::Encode)
    }

    /// `OpenMetrics` 1.0 text exposition (ends with `# EOF`).
    pub fn encode_openmetrics(&self) -> String {
        openmetrics::encode(&self.gather())
    }

    /// Where the resize states come from (the daemon's resize engine).
    pub fn set_resize_state_source(&self, source: ResizeStateSource) {
        *self.resize_state_source.write_locked() = Some(source);
    }

    /// `nri_resize_resizes` and `nri_resize_container_resize_state` from the source, now.
    fn refresh_resize_states(&self) {
        let states: HashMap<ContainerLabels, &'static str> = self
            .resize_state_source
            .read_locked()
            .as_ref()
            .map(|source| source().into_iter().map(|(l, s)| (l, s.as_str())).collect())
            .unwrap_or_default();
        for s in RESIZE_STATES {
            let n = states.values().filter(|v| **v == s.as_str()).count();
            self.resize_states
                .with_label_values(&[s.as_str()])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.containers.set_resize_states(&states);
    }

    /// Shows (`true`, the default) or leaves out the per-container families cAdvisor also
    /// exports (`[metrics] cadvisor_duplicates`).
    pub fn set_cadvisor_duplicates(&self, on: bool) {
        self.containers.set_cadvisor_duplicates(on);
    }

    /// Creates the container's verdict counters at 0 (a resize awaits its verdict), if it has
    /// series.
    pub fn container_verdicts_start(&self, labels: &ContainerLabels) {
        self.containers.update(labels, |v| {
            v.verdicts.get_or_insert([0, 0]);
        });
    }

    /// Counts one verdict on a resize of the container labelled `labels` (if it has series).
    pub fn container_verdict(&self, labels: &ContainerLabels, verdict: Verdict) {
        self.containers.update(labels, |v| {
            let counts = v.verdicts.get_or_insert([0, 0]);
            match verdict {
                Verdict::Healthy => counts[0] += 1,
                Verdict::Harmful => counts[1] += 1,
            }
        });
    }

    /// Creates one series of every labelled family so that `gather` lists them all (tests of the
    /// catalog and of the exposition formats).
    #[cfg(test)]
    pub(crate) fn touch_all_for_catalog(&self) {
        self.decrease.outcome(DecreaseOutcome::Direct);
        self.verdict
            .verdict(Resource::Cpu, Direction::Decrease, Verdict::Harmful);
        let l = ContainerLabels::default();
        let mut s = self.container(&l);
        self.container_verdict(&l, Verdict::Healthy);
        let states = vec![(l.clone(), ResizeState::Deferred)];
        self.set_resize_state_source(Box::new(move || states.clone()));
        s.update(&crate::observer::Observation {
            reclaim: crate::observer::Reclaim {
                pgsteal_direct: Some(1),
                direct_reclaim_ns: Some(1),
                ..crate::observer::Reclaim::default()
            },
            pressure: Some(crate::observer::Pressure::default()),
            ..crate::observer::Observation::default()
        });
        self.set_desired(&l, &test_resources());
        self.set_allocated(&l, &test_resources());
        let p = crate::model::PodLimits {
            cpu_millis: Some(1),
            memory_bytes: Some(1),
        };
        self.pod.set_desired("", "", p);
        self.pod.set_actual("", "", p);
        self.set_actual(
            &l,
            &ActualResources {
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                memory_limit: Some(1 << 20),
                ..ActualResources::default()
            },
        );
        self.set_strategies(Strategies::POLLING);
        self.set_bpf_map_memory(&[MapMemory {
            name: "RECLAIM".into(),
            bytes: 1,
            max_entries: 1,
        }]);
        self.observe("CreateContainer", 0.001, "deadline");
        self.resize_outcome("in_place");
        self.annotation_error();
        self.trim.set_working_set(&l, 1);
        self.trim.add_trimmed(&l, 1);
        self.resize_timer(&[(Resource::Cpu, Direction::Increase)])
            .finish("in_place");
    }

    pub fn set_nri_connected(&self, connected: bool) {
        self.nri_connected.set(i64::from(connected));
    }

    /// Marks the resize mode in effect (1) and the other (0): alerts that page on what only
    /// an enforcing daemon does ask it.
    pub fn set_mode(&self, mode: Mode) {
        for m in [Mode::Enforce, Mode::Observe] {
            self.mode
                .with_label_values(&[mode_label(m)])
                .set(i64::from(m == mode));
        }
    }

    /// Marks the strategy in effect per measurement (1) and the others (0).
    pub fn set_strategies(&self, s: Strategies) {
        let set = |program: &str, strategy: &str, on: bool| {
            self.observer_strategy
                .with_label_values(&[program, strategy])
                .set(i64::from(on));
        };
        for t in ThrottleStrategy::ALL {
            set("throttle", t.as_str(), t == s.throttle);
        }
        for r in ReclaimStrategy::ALL {
            set("reclaim", r.as_str(), r == s.reclaim);
        }
        for o in OomStrategy::ALL {
            set("oom", o.as_str(), o == s.oom);
        }
        for h in HotplugStrategy::ALL {
            set("hotplug", h.as_str(), h == s.hotplug);
        }
        for p in PressureStrategy::ALL {
            set("pressure", p.as_str(), p == s.pressure);
        }
    }

    /// The memory of each eBPF map the observer loaded (set once, after load).
    pub fn set_bpf_map_memory(&self, maps: &[MapMemory]) {
        for m in maps {
            self.bpf_map_memory
                .with_label_values(&[m.name.as_str()])
                .set(i64::try_from(m.bytes).unwrap_or(i64::MAX));
        }
    }

    /// The series of one container; counters start from the observer's first reading.
    pub fn container(&self, labels: &ContainerLabels) -> ContainerSeries {
        self.containers.with(labels, |v| {
            v.counters.get_or_insert((0, 0.0, 0));
        });
        ContainerSeries::new(self.containers.clone(), labels.clone())
    }

    /// Sets the desired limits of a container (from the runtime's spec or the last update).
    pub fn set_desired(&self, labels: &ContainerLabels, desired: &LinuxResources) {
        let l = limit_values(desired.cpu_limit_millis(), desired.memory_limit());
        self.containers.with(labels, |v| v.desired = l);
    }

    /// Sets the allocated limits of a container: what the runtime holds for it.
    pub fn set_allocated(&self, labels: &ContainerLabels, allocated: &LinuxResources) {
        let l = limit_values(allocated.cpu_limit_millis(), allocated.memory_limit());
        self.containers.with(labels, |v| v.allocated = l);
    }

    /// Sets the actual limits of a container (read from its cgroup).
    pub fn set_actual(&self, labels: &ContainerLabels, actual: &ActualResources) {
        let l = limit_values(actual.cpu_limit_millis(), actual.memory_limit);
        self.containers.with(labels, |v| v.actual = l);
    }

    /// Removes every series of a container that went away.
    pub fn remove_container(&self, labels: &ContainerLabels) {
        self.containers.remove(labels);
    }

    /// Containers with series (for the footprint's accounting and tests).
    pub fn containers_with_series(&self) -> usize {
        self.containers.len()
    }
}

/// A limit pair as series: an unlimited CPU or a memory limit of 0 or less has none.
fn limit_values(cpu_millis: Option<u64>, memory: Option<i64>) -> LimitValues {
    LimitValues {
        cpu_millicores: cpu_millis.map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
        memory_bytes: memory.filter(|l| *l > 0),
    }
}

/// Times one resize request (a drop guard): `finish(outcome)` counts it per resource and
/// direction; dropping it (also after `finish`) records the duration.
#[derive(Debug)]
#[must_use = "the duration is recorded when the timer is dropped"]
pub struct ResizeTimer<'a> {
    metrics: &'a Metrics,
    changes: Vec<(Resource, Direction)>,
    start: Instant,
}

impl ResizeTimer<'_> {
    /// Counts the request under `outcome` (one of the fixed values of `resize_outcomes_total`).
    pub fn finish(&self, outcome: &'static str) {
        for (r, d) in &self.changes {
            self.metrics
                .resize_requests
                .with_label_values(&[r.as_str(), d.as_str(), outcome])
                .inc();
        }
    }
}

impl Drop for ResizeTimer<'_> {
    fn drop(&mut self) {
        let secs = self.start.elapsed().as_secs_f64();
        for (r, d) in &self.changes {
            self.metrics
                .resize_duration
                .with_label_values(&[r.as_str(), d.as_str()])
                .observe(secs);
        }
    }
}

#[cfg(test)]
fn test_resources() -> LinuxResources {
    LinuxResources {
        cpu: Some(crate::model::CpuResources {
            quota: Some(200_000),
            period: Some(100_000),
            ..crate::model::CpuResources::default()
        }),
        memory: Some(crate::model::MemoryResources {
            limit: Some(100 << 20),
            ..crate::model::MemoryResources::default()
        }),
        ..LinuxResources::default()
    }
}

impl HandlerObserver for Metrics {
    fn observe(&self, event: &'static str, seconds: f64, outcome: &'static str) {
        self.nri_events.with_label_values(&[event]).inc();
        self.nri_handler_duration
            .with_label_values(&[event])
            .observe(seconds);
        // Present (at 0) from the event's first call, so that the first overrun is an increase.
        let deadlines = self.nri_deadlines.with_label_values(&[event]);
        if outcome != "ok" {
            deadlines.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::model::{CpuResources, MemoryResources};
    use crate::observer::Observation;
    use crate::observer::{OomKills, Reclaim, Throttling};

    fn labels() -> ContainerLabels {
        ContainerLabels {
            namespace: "ns".into(),
            pod: "web".into(),
            container: "app".into(),
        }
    }

    fn observation(count: u64, ns: u64, pgsteal: Option<u64>, kills: u64) -> Observation {
        Observation {
            throttling: Some(Throttling {
                count,
                throttled_ns: ns,
            }),
            reclaim: Reclaim {
                pgsteal_direct: pgsteal,
                direct_reclaim_ns: pgsteal.map(|_| 500_000_000),
                ..Reclaim::default()
            },
            oom: OomKills {
                kills,
                ..OomKills::default()
            },
            pressure: None,
        }
    }

    #[test]
    fn pressure_series_appear_with_psi_advance_and_are_removed() {
        use crate::observer::{Pressure, StallTotals};
        let m = Metrics::new().expect("metrics");
        let mut s = m.container(&labels());
        s.update(&observation(0, 0, None, 0));
        let text = m.encode().expect("encode");
        assert!(!text.contains("nri_resize_container_pressure"), "{text}");
        let at = |cpu_us: u64, memory_full: Option<u64>| Observation {
            pressure: Some(Pressure {
                cpu: StallTotals {
                    some_us: cpu_us,
                    full_us: None,
                    ..StallTotals::default()
                },
                memory: StallTotals {
                    some_us: 0,
                    full_us: memory_full,
                    ..StallTotals::default()
                },
                io: StallTotals::default(),
            }),
            ..observation(0, 0, None, 0)
        };
        s.update(&at(1_500_000, Some(250_000)));
        s.update(&at(2_000_000, Some(500_000)));
        let text = m.encode().expect("encode");
        let series = |resource: &str, kind: &str| {
            format!(
                r#"nri_resize_container_pressure_{resource}_{kind}_seconds_total{{container="app",namespace="ns",pod="web"}}"#
            )
        };
        for (want, value) in [
            (series("cpu", "waiting"), "2"),
            (series("cpu", "stalled"), "0"),
            (series("memory", "stalled"), "0.5"),
            (series("io", "waiting"), "0"),
        ] {
            let line = format!("{want} {value}\n");
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
        m.remove_container(&labels());
        let text = m.encode().expect("encode");
        assert!(!text.contains("nri_resize_container_pressure"), "{text}");
    }

    #[test]
    fn container_series_follow_observations_and_are_removed() {
        let m = Metrics::new().expect("metrics");
        let mut s = m.container(&labels());
        s.update(&observation(3, 2_000_000_000, None, 0));
        s.update(&observation(5, 3_000_000_000, Some(10), 1));
        m.set_desired(&labels(), &test_resources());
        m.set_allocated(&labels(), &test_resources());
        m.set_actual(
            &labels(),
            &ActualResources {
                memory_limit: Some(1 << 20),
                ..ActualResources::default()
            },
        );
        let text = m.encode().expect("encode");
        let l = r#"{container="app",namespace="ns",pod="web"}"#;
        for want in [
            format!("nri_resize_container_cpu_cfs_throttled_periods_total{l} 5"),
            format!("nri_resize_container_cpu_cfs_throttled_seconds_total{l} 3"),
            format!(
                "nri_resize_container_memory_reclaimed_bytes_total{l} {}",
                10 * crate::cgroup::page_size()
            ),
            format!("nri_resize_container_memory_direct_reclaim_seconds_total{l} 0.5"),
            format!("nri_resize_container_oom_kills_total{l} 1"),
        ] {
            assert!(text.contains(&want), "missing {want:?} in\n{text}");
        }
        assert!(
            text.contains("nri_resize_container_allocated_memory_bytes{"),
            "{text}"
        );
        m.remove_container(&labels());
        // The observer's reading that raced the removal does not bring the series back.
        s.update(&observation(7, 4_000_000_000, Some(12), 1));
        let text = m.encode().expect("encode");
        assert!(!text.contains(r#"container="app""#), "{text}");
        assert_eq!(m.containers_with_series(), 0);
        assert!(
            !m.encode_openmetrics().contains(r#"container="app""#),
            "gone from OpenMetrics too"
        );
    }

    #[test]
    fn reclaim_series_appear_only_when_the_strategy_knows() {
        let m = Metrics::new().expect("metrics");
        let mut s = m.container(&labels());
        s.update(&observation(0, 0, None, 0));
        assert!(!m
            .encode()
            .expect("encode")
            .contains("memory_reclaimed_bytes_total{"));
    }

    #[test]
    fn desired_and_actual_gauges() {
        let m = Metrics::new().expect("metrics");
        let desired = LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(200_000),
                period: Some(100_000),
                ..CpuResources::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(100 << 20),
                ..MemoryResources::default()
            }),
            ..LinuxResources::default()
        };
        m.set_desired(&labels(), &desired);
        m.set_actual(
            &labels(),
            &ActualResources {
                cpu_quota: Some(10_000),
                cpu_period: Some(100_000),
                memory_limit: Some(-1),
                ..ActualResources::default()
            },
        );
        let text = m.encode().expect("encode");
        assert!(text.contains("nri_resize_container_desired_cpu_cores{container=\"app\",namespace=\"ns\",pod=\"web\"} 2\n"), "{text}");
        assert!(text.contains("nri_resize_container_actual_cpu_cores{container=\"app\",namespace=\"ns\",pod=\"web\"} 0.1\n"), "{text}");
        assert!(text.contains("nri_resize_container_desired_memory_bytes{container=\"app\",namespace=\"ns\",pod=\"web\"} 104857600"), "{text}");
        assert!(
            !text.contains("nri_resize_container_actual_memory_bytes{"),
            "unlimited is no series: {text}"
        );
    }

    #[test]
    fn strategies_and_nri_handler_metrics() {
        let m = Metrics::new().expect("metrics");
        m.set_strategies(Strategies::POLLING);
        m.set_nri_connected(true);
        m.observe("CreateContainer", 0.000_2, "ok");
        m.observe("CreateContainer", 3.0, "deadline");
        let text = m.encode().expect("encode");
        for want in [
            r#"nri_resize_observer_strategy{program="throttle",strategy="cpu_stat_polling"} 1"#,
            r#"nri_resize_observer_strategy{program="throttle",strategy="tp_btf_sched_switch"} 0"#,
            r#"nri_resize_observer_strategy{program="pressure",strategy="unavailable_cgroup_v1"} 1"#,
            r#"nri_resize_observer_strategy{program="pressure",strategy="pressure_files"} 0"#,
            "nri_resize_nri_connected 1",
            r#"nri_resize_nri_events_total{event="CreateContainer"} 2"#,
            r#"nri_resize_nri_handler_deadline_exceeded_total{event="CreateContainer"} 1"#,
            r#"nri_resize_nri_handler_duration_seconds_count{event="CreateContainer"} 2"#,
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn build_info_and_process_series_are_exported() {
        let m = Metrics::new().expect("metrics");
        let text = m.encode().expect("encode");
        let version = env!("CARGO_PKG_VERSION");
        let revision = env!("NRI_RESIZE_COMMIT");
        assert!(
            text.contains(&format!(
                "nri_resize_build_info{{ebpf_object=\"{}\",revision=\"{revision}\",version=\"{version}\"}} 1\n",
                cfg!(nri_resize_ebpf_object)
            )),
            "{text}"
        );
        assert!(!revision.is_empty(), "build.rs always names a revision");
        assert!(
            text.contains(&format!(
                "\nnri_resize_node_page_size_bytes {}\n",
                crate::cgroup::page_size()
            )),
            "{text}"
        );
        for family in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
        ] {
            assert!(
                text.contains(&format!("\n{family}")),
                "missing {family:?} in\n{text}"
            );
        }
        assert!(
            !text.contains("nri_resize_process_"),
            "the process series are unprefixed"
        );
    }

    #[test]
    fn resize_states_are_counted_per_state_and_named_per_container() {
        let m = Metrics::new().expect("metrics");
        let text = m.encode().expect("encode");
        for s in RESIZE_STATES {
            let line = format!("nri_resize_resizes{{state=\"{}\"}} 0\n", s.as_str());
            assert!(
                text.contains(&line),
                "without a source every state is 0: {line:?} in\n{text}"
            );
        }
        m.container(&labels());
        let states = Arc::new(Mutex::new(vec![(labels(), ResizeState::Deferred)]));
        let source = states.clone();
        m.set_resize_state_source(Box::new(move || source.lock().expect("lock").clone()));
        let text = m.encode().expect("encode");
        assert!(
            text.contains("nri_resize_resizes{state=\"Deferred\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("nri_resize_resizes{state=\"InProgress\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains(r#"nri_resize_container_resize_state{container="app",namespace="ns",pod="web",state="Deferred"} 1"#),
            "{text}"
        );
        states.lock().expect("lock").clear();
        let text = m.encode().expect("encode");
        assert!(
            text.contains("nri_resize_resizes{state=\"Deferred\"} 0\n"),
            "{text}"
        );
        assert!(
            !text.contains("nri_resize_container_resize_state{"),
            "gone once settled: {text}"
        );
    }

    #[test]
    fn verdicts_are_counted_per_container() {
        let m = Metrics::new().expect("metrics");
        m.container(&labels());
        m.container_verdicts_start(&labels());
        let text = m.encode().expect("encode");
        assert!(
            text.contains(r#"nri_resize_container_resize_verdicts_total{container="app",namespace="ns",pod="web",verdict="harmful"} 0"#),
            "present at 0 before the first verdict: {text}"
        );
        m.container_verdict(&labels(), Verdict::Harmful);
        m.container_verdict(&labels(), Verdict::Harmful);
        let text = m.encode().expect("encode");
        let l = r#"container="app",namespace="ns",pod="web""#;
        assert!(
            text.contains(&format!(
                "nri_resize_container_resize_verdicts_total{{{l},verdict=\"harmful\"}} 2\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "nri_resize_container_resize_verdicts_total{{{l},verdict=\"healthy\"}} 0\n"
            )),
            "{text}"
        );
        m.remove_container(&labels());
        m.container_verdict(&labels(), Verdict::Harmful);
        assert!(
            !m.encode()
                .expect("encode")
                .contains("resize_verdicts_total{container"),
            "removed with the container"
        );
    }

    #[test]
    fn the_cadvisor_switch_hides_and_shows_the_duplicates() {
        let m = Metrics::new().expect("metrics");
        let mut s = m.container(&labels());
        s.update(&observation(3, 2_000_000_000, Some(1), 1));
        m.set_desired(&labels(), &test_resources());
        m.set_cadvisor_duplicates(false);
        let text = m.encode().expect("encode");
        assert!(!text.contains("cfs_throttled"), "{text}");
        assert!(!text.contains("oom_kills_total"), "{text}");
        assert!(
            text.contains("nri_resize_container_memory_reclaimed_bytes_total{"),
            "{text}"
        );
        assert!(
            text.contains("nri_resize_container_desired_cpu_cores{"),
            "{text}"
        );
        m.set_cadvisor_duplicates(true);
        assert!(m
            .encode()
            .expect("encode")
            .contains("nri_resize_container_cpu_cfs_throttled_periods_total{"));
    }
}
