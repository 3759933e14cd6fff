//! The chart's values, rendered with Helm's own engine: a bad value is refused before anything
//! renders, with a message naming the key (`values.schema.json`, its `config` part generated
//! from the daemon's configuration; a template's `fail` for what a schema cannot say); every
//! knob lands where it should; the Prometheus Operator's custom resources render only where the
//! cluster serves their API; every name fits in 63 characters.

use std::collections::BTreeSet;

use serde_yaml::Value;

use super::{
    container, find, flag, helm, helm_chart_py, s, try_helm, Cluster, OPERATOR_API, WITH_OPERATOR,
};

/// A cluster without the Prometheus Operator's CRDs (Helm's built-in API versions only).
const BARE: Cluster<'static> = Cluster {
    release: "nri-resize",
    api_versions: &[],
};

const EVERY_MONITOR: &str = r#"{"monitoring": {"podMonitor": {"enabled": true}, "serviceMonitor": {"enabled": true}, "rules": {"enabled": true}}}"#;

fn kinds(docs: &[Value]) -> BTreeSet<&str> {
    docs.iter().map(|d| s(&d["kind"])).collect()
}

/// The rendered objects of the Prometheus Operator's API group.
fn operator_objects(docs: &[Value]) -> Vec<&str> {
    docs.iter()
        .filter(|d| s(&d["apiVersion"]).starts_with("monitoring.coreos.com/"))
        .map(|d| s(&d["kind"]))
        .collect()
}

/// Without the Operator the install must not fail ("no matches for kind"): nothing of its API
/// renders, whatever the toggles say, and NOTES.txt says what was left out and what to do. With
/// it, each object renders when its toggle is on.
#[test]
fn without_the_operator_nothing_crd_backed_renders() {
    let plain: BTreeSet<&str> = [
        "ConfigMap",
        "DaemonSet",
        "NetworkPolicy",
        "Service",
        "ServiceAccount",
    ]
    .into();
    for values in ["{}", EVERY_MONITOR] {
        let docs = try_helm(values, BARE).unwrap_or_else(|e| panic!("{values}: {e}"));
        assert_eq!(operator_objects(&docs), Vec::<&str>::new(), "{values}");
        assert_eq!(kinds(&docs), plain, "{values}");
    }
    let notes = helm_chart_py("notes", "{}", BARE).expect("NOTES.txt");
    assert!(
        notes.contains("NOT INSTALLED: the PodMonitor and the PrometheusRule")
            && notes.contains(OPERATOR_API)
            && notes.contains("monitoring.scrapeAnnotations.enabled=true"),
        "{notes}"
    );

    let docs = helm(EVERY_MONITOR);
    let mut served = operator_objects(&docs);
    served.sort_unstable();
    assert_eq!(served, ["PodMonitor", "PrometheusRule", "ServiceMonitor"]);
    assert_eq!(
        operator_objects(&helm("{}")),
        ["PodMonitor", "PrometheusRule"],
        "the defaults"
    );
    let off = r#"{"monitoring": {"podMonitor": {"enabled": false}, "serviceMonitor": {"enabled": false}, "rules": {"enabled": false}}}"#;
    assert_eq!(
        operator_objects(&helm(off)),
        Vec::<&str>::new(),
        "toggled off"
    );
    let notes = helm_chart_py("notes", "{}", WITH_OPERATOR).expect("NOTES.txt");
    assert!(!notes.contains("NOT INSTALLED"), "{notes}");
}

/// The `prometheus.io/*` annotations of the pod template, or of the Service.
fn scrape_annotations(docs: &[Value]) -> (Value, Value) {
    let pod = find(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"].clone();
    let service = find(docs, "Service")["metadata"]["annotations"].clone();
    let only_scrape = |v: Value| {
        let mut m = v.as_mapping().cloned().unwrap_or_default();
        m.retain(|k, _| s(k).starts_with("prometheus.io/"));
        Value::Mapping(m)
    };
    (only_scrape(pod), only_scrape(service))
}

/// Annotation-based scraping (a Prometheus without the Operator): off by default, then the
/// three annotations on the pods or on the headless Service, with the metrics port.
#[test]
fn scrape_annotations_go_on_the_pods_or_the_service() {
    let none = Value::Mapping(serde_yaml::Mapping::new());
    assert_eq!(
        scrape_annotations(&helm("{}")),
        (none.clone(), none.clone())
    );
    let want: Value = serde_yaml::from_str(
        "{prometheus.io/scrape: 'true', prometheus.io/port: '9555', prometheus.io/path: /metrics}",
    )
    .expect("YAML");
    let docs = helm(
        r#"{"metricsPort": 9555, "monitoring": {"scrapeAnnotations": {"enabled": true, "target": "pod"}}}"#,
    );
    assert_eq!(scrape_annotations(&docs), (want.clone(), none.clone()));
    let c = container(find(&docs, "DaemonSet"));
    assert_eq!(flag(c, "metrics-addr"), "0.0.0.0:9555");
    let docs = helm(
        r#"{"metricsPort": 9555, "monitoring": {"scrapeAnnotations": {"enabled": true, "target": "service"}}}"#,
    );
    assert_eq!(scrape_annotations(&docs), (none, want));
}

/// Each bad value of the issue that found them (and its neighbours) is refused before anything
/// renders, with a message that names the key: the schema for shapes and spellings, a
/// template's `fail` for what a schema cannot see.
#[test]
fn the_chart_refuses_bad_values_with_the_key_named() {
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let tag_with_digest = format!(r#"{{"image": {{"tag": "0.1.0@{digest}"}}}}"#);
    let cases: Vec<(String, &[&str])> =
        vec![
        // A typo of a top-level key.
        (
            r#"{"nodeselector": {"kubernetes.io/os": "linux"}}"#.into(),
            &["additional properties 'nodeselector' not allowed"],
        ),
        // The daemon's configuration: unknown keys, malformed quantities, enum values,
        // durations as numbers.
        (
            r#"{"config": {"resize": {"mod": "Observe"}}}"#.into(),
            &["/config/resize", "'mod' not allowed"],
        ),
        (
            r#"{"config": {"resize": {"reserved_memory": "1.5Gx"}}}"#.into(),
            &["/config/resize/reserved_memory", "'1.5Gx' does not match"],
        ),
        (
            r#"{"config": {"memory_decrease": {"strategy": "oom"}}}"#.into(),
            &["/config/memory_decrease/strategy"],
        ),
        (
            r#"{"config": {"memory_decrease": {"timeout": 5000}}}"#.into(),
            &["/config/memory_decrease/timeout"],
        ),
        (
            r#"{"config": {"verdicts": {}}}"#.into(),
            &["'verdicts' not allowed"],
        ),
        (
            r#"{"config": {"trim": {"max_stall": 2}}}"#.into(),
            &["/config/trim/max_stall"],
        ),
        // A digest in the tag (it would land in a label): image.digest pins.
        (tag_with_digest, &["/image/tag", "does not match"]),
        (
            r#"{"image": {"digest": "sha256:abc"}}"#.into(),
            &["/image/digest"],
        ),
        (r#"{"mode": "Enforcing"}"#.into(), &["/mode"]),
        (r#"{"pluginIndex": "5"}"#.into(), &["/pluginIndex"]),
        (r#"{"pluginIndex": 100}"#.into(), &["/pluginIndex"]),
        (
            r#"{"updateStrategy": {"type": "Recreate"}}"#.into(),
            &["/updateStrategy/type"],
        ),
        (
            r#"{"resources": {"requests": {"memroy": "64Mi"}}}"#.into(),
            &["/resources/requests"],
        ),
        (
            r#"{"resources": {"limits": {"memory": "256MB"}}}"#.into(),
            &["/resources/limits/memory"],
        ),
        (r#"{"extraEnv": [{"value": "x"}]}"#.into(), &["/extraEnv/0", "name"]),
        (r#"{"extraArgs": "--foo"}"#.into(), &["/extraArgs"]),
        (r#"{"architectures": ["s390x"]}"#.into(), &["/architectures/0"]),
        (
            r#"{"monitoring": {"scrapeAnnotations": {"target": "node"}}}"#.into(),
            &["/monitoring/scrapeAnnotations/target"],
        ),
        (
            r#"{"networkPolicy": {"prometheusNamespaces": []}}"#.into(),
            &["/networkPolicy/prometheusNamespaces"],
        ),
        // The earlier value, replaced by the list.
        (
            r#"{"networkPolicy": {"monitoringNamespaceSelector": {"matchLabels": {"team": "x"}}}}"#
                .into(),
            &["'monitoringNamespaceSelector' not allowed"],
        ),
        (
            r#"{"serviceAccount": {"create": "yes"}}"#.into(),
            &["/serviceAccount/create"],
        ),
        // What only a template sees: a pod label the selector owns.
        (
            r#"{"podLabels": {"app.kubernetes.io/name": "other"}}"#.into(),
            &["podLabels.app.kubernetes.io/name"],
        ),
        (
            r#"{"podAnnotations": {"checksum/config": "x"}}"#.into(),
            &["podAnnotations.checksum/config"],
        ),
    ];
    for (values, wanted) in &cases {
        let message = match try_helm(values, WITH_OPERATOR) {
            Ok(docs) => panic!("{values} renders ({} objects)", docs.len()),
            Err(message) => message,
        };
        for w in *wanted {
            assert!(message.contains(w), "{values}: {w:?} not in\n{message}");
        }
    }
}

/// A label value as Kubernetes takes it: at most 63 characters of `[A-Za-z0-9_.-]`, starting
/// and ending with an alphanumeric one (or empty).
fn is_label_value(v: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    v.is_empty()
        || (v.len() <= 63
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && edge(v.chars().next())
            && edge(v.chars().next_back()))
}

/// Every `app.kubernetes.io/version` label of the rendering.
fn version_labels(docs: &[Value]) -> BTreeSet<String> {
    docs.iter()
        .map(|d| s(&d["metadata"]["labels"]["app.kubernetes.io/version"]).to_string())
        .collect()
}

/// `image.digest` pins the image (with or without a tag); the version label is the tag or the
/// chart's appVersion, never a digest, and always a valid label value, even for the longest tag
/// a registry allows.
#[test]
fn image_digest_pins_the_image_and_the_version_label_stays_a_label() {
    let chart: Value = serde_yaml::from_str(
        &std::fs::read_to_string(super::root().join("deploy/helm/nri-resize/Chart.yaml"))
            .expect("Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let app_version = s(&chart["appVersion"]);
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let long_tag = format!("v1.2.3-{}", "build.".repeat(25));
    let long_tag = &long_tag[..128];
    for (image, want_image, want_version) in [
        (
            format!(r#"{{"digest": "{digest}"}}"#),
            format!("localhost/nri-resize@{digest}"),
            app_version.to_string(),
        ),
        (
            format!(r#"{{"tag": "0.2.0", "digest": "{digest}"}}"#),
            format!("localhost/nri-resize:0.2.0@{digest}"),
            "0.2.0".to_string(),
        ),
        (
            format!(
                r#"{{"repository": "registry.example:5000/infra/nri-resize", "tag": "{long_tag}"}}"#
            ),
            format!("registry.example:5000/infra/nri-resize:{long_tag}"),
            long_tag[..63].trim_end_matches(['-', '.', '_']).to_string(),
        ),
    ] {
        let docs = helm(&format!(r#"{{"image": {image}}}"#));
        let c = container(find(&docs, "DaemonSet"));
        assert_eq!(s(&c["image"]), want_image, "{image}");
        let versions = version_labels(&docs);
        assert_eq!(versions, [want_version].into(), "{image}");
        for v in &versions {
            assert!(is_label_value(v) && !v.contains('@'), "{image}: {v:?}");
        }
    }
}

/// A valid DNS label (RFC 1123): what a Service's name must be.
fn is_dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Object names: a 52-character release name gives names of at most 63 characters (the Service
/// `...-metrics` included, 71 before), still distinct and still referred to by what uses them;
/// `fullnameOverride` and `nameOverride` name the objects and the app label.
#[test]
fn names_stay_within_63_characters() {
    let release = format!("pool{}", "x".repeat(48));
    assert_eq!(release.len(), 52);
    for (values, cluster) in [
        (
            "{}",
            Cluster {
                release: &release,
                api_versions: &[OPERATOR_API],
            },
        ),
        (
            r#"{"fullnameOverride": "resize-for-the-gpu-node-pool-in-the-eastern-datacenter-of-acme-corp"}"#,
            WITH_OPERATOR,
        ),
    ] {
        let docs = try_helm(values, cluster).unwrap_or_else(|e| panic!("{values}: {e}"));
        let mut names = BTreeSet::new();
        for d in &docs {
            let name = s(&d["metadata"]["name"]);
            assert!(is_dns_label(name), "{values}: {} {name:?}", s(&d["kind"]));
            assert!(
                names.insert((s(&d["kind"]), name)),
                "{values}: {name} twice"
            );
        }
        let service = s(&find(&docs, "Service")["metadata"]["name"]);
        assert!(service.ends_with("-metrics"), "{service}");
        let ds = find(&docs, "DaemonSet");
        let pod = &ds["spec"]["template"]["spec"];
        let cm = s(&find(&docs, "ConfigMap")["metadata"]["name"]);
        assert!(cm.ends_with("-config"), "{cm}");
        assert!(
            pod["volumes"]
                .as_sequence()
                .expect("volumes")
                .iter()
                .any(|v| v["configMap"]["name"].as_str() == Some(cm)),
            "{values}: the DaemonSet mounts {cm}"
        );
        assert_eq!(
            s(&pod["serviceAccountName"]),
            s(&find(&docs, "ServiceAccount")["metadata"]["name"])
        );
    }
    let docs = helm(r#"{"fullnameOverride": "resize"}"#);
    assert_eq!(s(&find(&docs, "DaemonSet")["metadata"]["name"]), "resize");
    assert_eq!(
        s(&find(&docs, "Service")["metadata"]["name"]),
        "resize-metrics"
    );
    let docs = helm(r#"{"nameOverride": "resizer"}"#);
    let ds = find(&docs, "DaemonSet");
    assert_eq!(s(&ds["metadata"]["name"]), "nri-resize-resizer");
    let selector = &ds["spec"]["selector"]["matchLabels"];
    assert_eq!(s(&selector["app.kubernetes.io/name"]), "resizer");
    for (k, v) in selector.as_mapping().expect("matchLabels") {
        assert_eq!(&ds["spec"]["template"]["metadata"]["labels"][k], v);
    }
}

/// The knobs users expect reach the `DaemonSet`: pull secrets, the NRI plugin index (a number
/// zero-padded), extra arguments and environment after the chart's own, the update strategy
/// (no `rollingUpdate` beside `OnDelete`), pod annotations and labels beside the chart's, and the
/// `ServiceAccount` (created, named, or an existing one).
#[test]
fn the_knobs_reach_the_daemonset() {
    let docs = helm(
        r#"{"imagePullSecrets": [{"name": "regcred"}], "pluginIndex": 5,
            "extraArgs": ["--observer-interval=2s"],
            "extraEnv": [{"name": "FOO", "value": "bar"}, {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "updateStrategy": {"type": "OnDelete"},
            "podAnnotations": {"example.com/team": "infra"}, "podLabels": {"team": "infra"}}"#,
    );
    let ds = find(&docs, "DaemonSet");
    let template = &ds["spec"]["template"];
    let pod = &template["spec"];
    assert_eq!(s(&pod["imagePullSecrets"][0]["name"]), "regcred");
    let c = container(ds);
    assert_eq!(flag(c, "plugin-idx"), "05");
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(s)
        .collect();
    assert_eq!(args.last(), Some(&"--observer-interval=2s"), "{args:?}");
    let env: Vec<&str> = c["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .map(|e| s(&e["name"]))
        .collect();
    assert_eq!(env, ["NRI_RESIZE_LOG", "FOO", "NODE"]);
    assert_eq!(
        s(&c["env"][2]["valueFrom"]["fieldRef"]["fieldPath"]),
        "spec.nodeName"
    );
    let strategy: Value = serde_yaml::from_str("{type: OnDelete}").expect("YAML");
    assert_eq!(ds["spec"]["updateStrategy"], strategy);
    assert_eq!(
        s(&template["metadata"]["annotations"]["example.com/team"]),
        "infra"
    );
    assert!(!template["metadata"]["annotations"]["checksum/config"].is_null());
    assert_eq!(s(&template["metadata"]["labels"]["team"]), "infra");
    assert!(ds["spec"]["selector"]["matchLabels"]["team"].is_null());

    let docs = helm(
        r#"{"pluginIndex": "10", "updateStrategy": {"rollingUpdate": {"maxUnavailable": "10%"}}}"#,
    );
    let ds = find(&docs, "DaemonSet");
    assert_eq!(flag(container(ds), "plugin-idx"), "10");
    assert_eq!(
        s(&ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"]),
        "10%"
    );

    // The ServiceAccount: the chart's own by default, named; or one that exists.
    for (values, created, used) in [
        ("{}", Some("nri-resize"), "nri-resize"),
        (r#"{"serviceAccount": {"name": "nri"}}"#, Some("nri"), "nri"),
        (
            r#"{"serviceAccount": {"create": false, "name": "node-agents"}}"#,
            None,
            "node-agents",
        ),
        (r#"{"serviceAccount": {"create": false}}"#, None, "default"),
    ] {
        let docs = helm(values);
        let accounts: Vec<&Value> = docs
            .iter()
            .filter(|d| d["kind"].as_str() == Some("ServiceAccount"))
            .collect();
        assert_eq!(
            accounts.iter().map(|a| s(&a["metadata"]["name"])).next(),
            created,
            "{values}"
        );
        for a in accounts {
            assert_eq!(a["automountServiceAccountToken"], Value::Bool(false));
        }
        let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
        assert_eq!(s(&pod["serviceAccountName"]), used, "{values}");
        assert_eq!(pod["automountServiceAccountToken"], Value::Bool(false));
    }
}
