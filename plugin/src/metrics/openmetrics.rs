//! `OpenMetrics` 1.0 text exposition of gathered families (the `prometheus` crate only writes the
//! classic text format). Differences from the classic format that matter here: a counter family
//! is named without `_total` in `# TYPE`/`# HELP` and its sample carries it; `untyped` is
//! `unknown`; every histogram has a `+Inf` bucket; the exposition ends with `# EOF`.
//! Specification: <https://github.com/OpenObservability/OpenMetrics/blob/main/specification/OpenMetrics.md>.

use std::fmt::Write as _;

use prometheus::proto::{LabelPair, MetricFamily, MetricType};

/// The content type served with [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '\n' => out.push_str(r"\n"),
            '"' => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        // Display never uses an exponent and prints integral values without a fraction.
        format!("{v}")
    }
}

fn labels(pairs: &[LabelPair], extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = pairs
        .iter()
        .map(|l| format!("{}=\"{}\"", l.name(), escape(l.value())))
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{}\"", escape(v)));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

#[expect(
    deprecated,
    reason = "the plain model has no other accessor for untyped values"
)]
fn untyped_value(m: &prometheus::proto::Metric) -> f64 {
    m.get_untyped().get_value()
}

/// Writes `families` as `OpenMetrics` text, terminated by `# EOF`.
#[expect(
    clippy::too_many_lines,
    reason = "one arm per metric type, as the specification lists them"
)]
pub fn encode(families: &[MetricFamily]) -> String {
    let mut out = String::new();
    for f in families {
        let name = f.name();
        let (family, kind) = match f.get_field_type() {
            MetricType::COUNTER => (name.strip_suffix("_total").unwrap_or(name), "counter"),
            MetricType::GAUGE => (name, "gauge"),
            MetricType::HISTOGRAM => (name, "histogram"),
            MetricType::SUMMARY => (name, "summary"),
            MetricType::UNTYPED => (name, "unknown"),
        };
        let _ = writeln!(out, "# TYPE {family} {kind}");
        if !f.help().is_empty() {
            let _ = writeln!(out, "# HELP {family} {}", escape(f.help()));
        }
        for m in f.get_metric() {
            let l = m.get_label();
            match f.get_field_type() {
                MetricType::COUNTER => {
                    let _ = writeln!(
                        out,
                        "{family}_total{} {}",
                        labels(l, None),
                        number(m.get_counter().get_value())
                    );
                }
                MetricType::GAUGE => {
                    let _ = writeln!(
                        out,
                        "{family}{} {}",
                        labels(l, None),
                        number(m.get_gauge().get_value())
                    );
                }
                MetricType::UNTYPED => {
                    let _ = writeln!(
                        out,
                        "{family}{} {}",
                        labels(l, None),
                        number(untyped_value(m))
                    );
                }
                MetricType::HISTOGRAM => {
                    let h = m.get_histogram();
                    let mut inf_seen = false;
                    for b in h.get_bucket() {
                        let le = number(b.upper_bound());
                        inf_seen |= b.upper_bound() == f64::INFINITY;
                        let _ = writeln!(
                            out,
                            "{family}_bucket{} {}",
                            labels(l, Some(("le", &le))),
                            b.cumulative_count()
                        );
                    }
                    if !inf_seen {
                        let _ = writeln!(
                            out,
                            "{family}_bucket{} {}",
                            labels(l, Some(("le", "+Inf"))),
                            h.get_sample_count()
                        );
                    }
                    let _ = writeln!(
                        out,
                        "{family}_count{} {}",
                        labels(l, None),
                        h.get_sample_count()
                    );
                    let _ = writeln!(
                        out,
                        "{family}_sum{} {}",
                        labels(l, None),
                        number(h.get_sample_sum())
                    );
                }
                MetricType::SUMMARY => {
                    let s = m.get_summary();
                    for q in s.get_quantile() {
                        let quantile = number(q.quantile());
                        let _ = writeln!(
                            out,
                            "{family}{} {}",
                            labels(l, Some(("quantile", &quantile))),
                            number(q.value())
                        );
                    }
                    let _ = writeln!(
                        out,
                        "{family}_count{} {}",
                        labels(l, None),
                        s.sample_count()
                    );
                    let _ = writeln!(
                        out,
                        "{family}_sum{} {}",
                        labels(l, None),
                        number(s.sample_sum())
                    );
                }
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

/// Whether an `Accept` header asks for `OpenMetrics` (as Prometheus' scraper does by default).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',').any(|part| {
            let mut params = part.split(';').map(str::trim);
            let is_om = params
                .next()
                .is_some_and(|t| t.eq_ignore_ascii_case("application/openmetrics-text"));
            // `q=0` means "not acceptable".
            is_om
                && !params.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f64>().ok())
                        .is_some_and(|q| q <= 0.0)
                })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{ContainerLabels, Metrics};

    fn populated() -> Metrics {
        let m = Metrics::new().expect("metrics");
        m.touch_all_for_catalog();
        m.set_desired(
            &ContainerLabels {
                namespace: "ns \"quoted\"".into(),
                pod: "web\\1".into(),
                container: "app\nx".into(),
            },
            &crate::metrics::test_resources(),
        );
        m
    }

    #[test]
    fn openmetrics_output_parses_and_ends_with_eof() {
        let m = populated();
        let text = m.encode_openmetrics();
        assert!(text.ends_with("# EOF\n"), "{text}");
        let parsed = openmetrics_parser::openmetrics::parse_openmetrics(&text)
            .unwrap_or_else(|e| panic!("OpenMetrics output does not parse: {e:?}\n{text}"));
        let families: Vec<&String> = parsed.families.keys().collect();
        for want in [
            "nri_resize_container_cpu_cfs_throttled_periods",
            "nri_resize_nri_handler_duration_seconds",
            "nri_resize_container_desired_cpu_cores",
            "nri_resize_resize_requests",
        ] {
            assert!(
                parsed.families.contains_key(want),
                "{want} missing from {families:?}"
            );
        }
        assert!(text.contains("nri_resize_resize_requests_total{resource=\"cpu\",direction=\"increase\",outcome=\"in_place\"} 1")
            || text.contains("nri_resize_resize_requests_total{direction=\"increase\",outcome=\"in_place\",resource=\"cpu\"} 1"), "{text}");
        assert!(
            text.contains(r#"le="+Inf""#),
            "histograms have a +Inf bucket: {text}"
        );
        assert!(text.contains(r#"namespace="ns \"quoted\"""#), "{text}");
    }

    #[test]
    fn classic_output_parses() {
        let m = populated();
        let text = m.encode().expect("encode");
        assert!(!text.contains("# EOF"));
        let parsed = openmetrics_parser::prometheus::parse_prometheus(&text)
            .unwrap_or_else(|e| panic!("text format output does not parse: {e:?}\n{text}"));
        assert!(
            parsed
                .families
                .contains_key("nri_resize_container_cpu_cfs_throttled_periods_total"),
            "{:?}",
            parsed.families.keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn both_formats_carry_the_same_samples() {
        let m = populated();
        let om = m.encode_openmetrics();
        let classic = m.encode().expect("encode");
        // The process collector samples the process at each render (its RSS, CPU time and fds
        // move between the two): its series are compared by name and labels, the rest whole.
        let samples = |t: &str| -> Vec<String> {
            let mut v: Vec<String> = t
                .lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .map(|l| match l.rsplit_once(' ') {
                    Some((series, _)) if l.starts_with("process_") => series.to_string(),
                    _ => l.to_string(),
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(samples(&om), samples(&classic));
    }

    #[test]
    fn accept_negotiation() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(wants_openmetrics(Some("application/openmetrics-text")));
        assert!(!wants_openmetrics(Some("text/plain;version=0.0.4")));
        assert!(!wants_openmetrics(Some("application/openmetrics-text;q=0")));
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("*/*")));
    }
}
