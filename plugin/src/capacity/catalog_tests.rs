//! The metrics catalog (`crate::metrics::catalog`) against the registry as the daemon fills it:
//! its own metrics and the capacity watcher's. Here, not in `metrics/`, because the capacity
//! metrics are registered from this side (the metrics module does not know the watcher).

use std::collections::BTreeSet;

use super::CapacityMetrics;
use crate::metrics::catalog::{lookup, Kind, CATALOG};
use crate::metrics::Metrics;

/// The daemon's metrics with the capacity watcher's, which it registers when it starts.
fn all_metrics() -> Metrics {
    let m = Metrics::new().expect("metrics");
    m.touch_all_for_catalog();
    CapacityMetrics::register(m.registry())
        .expect("capacity metrics")
        .touch_all_for_catalog();
    m
}

#[test]
fn every_registered_family_is_in_the_catalog_and_every_own_entry_is_registered() {
    let m = all_metrics();
    let registered: BTreeSet<String> = m.gather().iter().map(|f| f.name().to_string()).collect();
    for name in &registered {
        assert!(
            lookup(name).is_some(),
            "{name} is registered but not in the catalog (plugin/src/metrics/catalog.rs)"
        );
    }
    for e in CATALOG {
        assert!(
            registered.contains(e.name),
            "{} is in the catalog but not registered",
            e.name
        );
    }
}

#[test]
fn kinds_and_labels_match_the_registry() {
    let m = all_metrics();
    for f in m.gather() {
        let e = lookup(f.name()).expect("in catalog");
        let kind = match f.get_field_type() {
            prometheus::proto::MetricType::COUNTER => Kind::Counter,
            prometheus::proto::MetricType::GAUGE => Kind::Gauge,
            prometheus::proto::MetricType::HISTOGRAM => Kind::Histogram,
            other => panic!("{}: unexpected type {other:?}", f.name()),
        };
        assert_eq!(kind, e.kind, "{}", f.name());
        assert!(
            kind != Kind::Counter || e.name.ends_with("_total"),
            "counter {} must end in _total (OpenMetrics)",
            e.name
        );
        for metric in f.get_metric() {
            let mut got: Vec<&str> = metric
                .get_label()
                .iter()
                .map(prometheus::proto::LabelPair::name)
                .collect();
            got.sort_unstable();
            let mut want: Vec<&str> = e.labels.to_vec();
            want.sort_unstable();
            assert_eq!(got, want, "labels of {}", f.name());
        }
    }
}

/// `[metrics] cadvisor_duplicates = false` leaves out exactly the families the catalog marks as
/// cAdvisor's, and only those.
#[test]
fn the_cadvisor_switch_leaves_out_exactly_the_marked_families() {
    let m = all_metrics();
    let names = |m: &Metrics| -> BTreeSet<String> {
        m.gather().iter().map(|f| f.name().to_string()).collect()
    };
    let all = names(&m);
    m.set_cadvisor_duplicates(false);
    let without = names(&m);
    let left_out: BTreeSet<&str> = all
        .iter()
        .filter(|n| !without.contains(*n))
        .map(String::as_str)
        .collect();
    let marked: BTreeSet<&str> = CATALOG
        .iter()
        .filter(|e| e.cadvisor_duplicate)
        .map(|e| e.name)
        .collect();
    assert_eq!(left_out, marked);
    assert!(!marked.is_empty());
    m.set_cadvisor_duplicates(true);
    assert_eq!(names(&m), all, "switched back on, they return");
}
