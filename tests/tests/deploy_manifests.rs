//! `deploy/` checked where schemas cannot: the kustomizations rendered by kustomize, the
//! `DaemonSet` against what the daemon needs (its flags, mounts, probes on the metrics port), the
//! least-privilege overlay against the capabilities the image test runs with, the
//! `PodMonitor`/`ServiceMonitor` custom resources (no schema in kubernetes-validate: checked
//! structurally here), the `ConfigMap` through the daemon's own config parser, the containerd
//! configurations, and the Grafana dashboard's queries against the metrics catalog.
//! Schema validation itself is `cargo xtask manifests` (kubernetes-validate, 1.33-1.37).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use nri_resize::metrics::catalog;
use nri_resize_tests::{plugin_binary, DAEMON_IMAGE, LEAST_PRIVILEGE_CAPS};
use serde_yaml::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the workspace")
        .to_path_buf()
}

/// `kustomize build deploy/<dir>` as YAML documents.
fn render(dir: &str) -> Vec<Value> {
    let out = Command::new("kustomize")
        .arg("build")
        .arg(root().join(dir))
        .output()
        .unwrap_or_else(|e| {
            panic!("run kustomize ({e}); `cargo xtask setup` installs it (Debian trixie package)")
        });
    assert!(
        out.status.success(),
        "kustomize build {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("rendered YAML parses"))
        .collect()
}

fn file(path: &str) -> Value {
    let text = std::fs::read_to_string(root().join(path)).expect("read manifest");
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

fn container(ds: &Value) -> &Value {
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(s(&c["name"]), "nri-resize");
    c
}

/// `--flag=value` arguments of the container.
fn flag<'a>(c: &'a Value, name: &str) -> &'a str {
    c["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .find_map(|a| s(a).strip_prefix(&format!("--{name}=")))
        .unwrap_or_else(|| panic!("no --{name}= in args"))
}

/// The host path mounted at (or above) `path` in the container.
fn host_path_for(ds: &Value, path: &str) -> String {
    let spec = &ds["spec"]["template"]["spec"];
    let c = container(ds);
    let mount = c["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .filter(|m| Path::new(path).starts_with(s(&m["mountPath"])))
        .max_by_key(|m| s(&m["mountPath"]).len())
        .unwrap_or_else(|| panic!("nothing mounted at {path}"));
    let volume = spec["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("volume of the mount");
    s(&volume["hostPath"]["path"]).to_string()
}

#[test]
fn the_daemonset_gives_the_daemon_what_it_needs() {
    let docs = render("deploy");
    let ds = find(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["hostPID"],
        Value::Bool(true),
        "evictions by signal need the host PID namespace"
    );
    assert_eq!(s(&pod["priorityClassName"]), "system-node-critical");
    let c = container(ds);
    assert_eq!(
        s(&c["image"]),
        DAEMON_IMAGE,
        "the image `cargo xtask image` builds"
    );
    assert_eq!(c["securityContext"]["privileged"], Value::Bool(true));
    // Every flag is one the daemon knows.
    let help = Command::new(plugin_binary())
        .args(["run", "--help"])
        .output()
        .expect("nri-resize run --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for a in c["args"].as_sequence().expect("args").iter().skip(1) {
        let name = s(a).split('=').next().expect("flag");
        assert!(
            help.contains(name),
            "{name} is not a flag of `nri-resize run`"
        );
    }
    // Host paths behind the flags and the kernel interfaces.
    let nri = flag(c, "nri-socket");
    for (inside, host) in [
        (nri, "/var/run/nri"),
        (flag(c, "cgroup-root"), "/sys/fs/cgroup"),
        (flag(c, "state-dir"), "/var/lib/nri-resize"),
        (flag(c, "api-socket"), "/run/nri-resize"),
        ("/sys/kernel/btf/vmlinux", "/sys/kernel/btf"),
        ("/sys/kernel/tracing", "/sys/kernel/tracing"),
        ("/sys/fs/bpf", "/sys/fs/bpf"),
    ] {
        assert_eq!(host_path_for(ds, inside), host, "{inside}");
    }
    // Probes on the metrics port the daemon listens on.
    let port = flag(c, "metrics-addr").rsplit(':').next().expect("port");
    let ports = c["ports"].as_sequence().expect("ports");
    let metrics = ports
        .iter()
        .find(|p| p["name"].as_str() == Some("metrics"))
        .expect("a port named metrics");
    assert_eq!(
        metrics["containerPort"]
            .as_u64()
            .map(|p| p.to_string())
            .as_deref(),
        Some(port)
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        assert_eq!(s(&c[probe]["httpGet"]["path"]), path, "{probe}");
        assert_eq!(s(&c[probe]["httpGet"]["port"]), "metrics", "{probe}");
    }
    for kind in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(!c["resources"][kind][r].is_null(), "resources.{kind}.{r}");
        }
    }
    // The ConfigMap mounted at --config parses with the daemon's own parser.
    let config_path = flag(c, "config");
    let cm = find(&docs, "ConfigMap");
    let key = Path::new(config_path)
        .file_name()
        .and_then(|f| f.to_str())
        .expect("file");
    let text = s(&cm["data"][key]);
    nri_resize::config::Config::parse(text, "deploy/base/configmap.yaml")
        .unwrap_or_else(|e| panic!("the ConfigMap's {key} does not parse: {e}"));
}

#[test]
fn least_privilege_has_exactly_the_tested_capabilities() {
    let docs = render("deploy/overlays/least-privilege");
    let ds = find(&docs, "DaemonSet");
    let c = container(ds);
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], Value::Bool(false));
    assert_eq!(sc["capabilities"]["drop"][0].as_str(), Some("ALL"));
    let added: BTreeSet<&str> = sc["capabilities"]["add"]
        .as_sequence()
        .expect("capabilities.add")
        .iter()
        .map(s)
        .collect();
    let tested: BTreeSet<&str> = LEAST_PRIVILEGE_CAPS
        .iter()
        .map(|c| c.trim_start_matches("CAP_"))
        .collect();
    assert_eq!(
        added, tested,
        "the overlay must add exactly what tests/tests/image_containerd.rs runs the image with"
    );
    // The patch changed only the security context: the rest is the base's.
    assert_eq!(ds["spec"]["template"]["spec"]["hostPID"], Value::Bool(true));
    assert_eq!(
        host_path_for(ds, "/sys/kernel/tracing"),
        "/sys/kernel/tracing"
    );
    assert_eq!(
        c["volumeMounts"],
        container(find(&render("deploy/base"), "DaemonSet"))["volumeMounts"]
    );
}

/// The custom resources have no schema in kubernetes-validate: the fields Prometheus Operator
/// needs, and that they point at the `DaemonSet`'s pods and port.
#[test]
fn pod_and_service_monitors_select_the_daemon_and_its_metrics_port() {
    let docs = render("deploy");
    let ds = find(&docs, "DaemonSet");
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    let service = find(&docs, "Service");
    let selects = |selector: &Value, labels: &Value| {
        selector
            .as_mapping()
            .expect("matchLabels")
            .iter()
            .all(|(k, v)| &labels[k] == v)
    };
    assert!(selects(&service["spec"]["selector"], pod_labels));
    assert_eq!(s(&service["spec"]["ports"][0]["targetPort"]), "metrics");
    let podmonitor = find(&docs, "PodMonitor");
    let servicemonitor = file("deploy/monitoring/servicemonitor.yaml");
    for (m, endpoints, target_labels) in [
        (podmonitor, "podMetricsEndpoints", pod_labels),
        (&servicemonitor, "endpoints", &service["metadata"]["labels"]),
    ] {
        let kind = s(&m["kind"]);
        assert_eq!(s(&m["apiVersion"]), "monitoring.coreos.com/v1", "{kind}");
        assert_eq!(s(&m["metadata"]["namespace"]), "kube-system", "{kind}");
        assert!(!m["metadata"]["name"].is_null(), "{kind}");
        assert!(
            selects(&m["spec"]["selector"]["matchLabels"], target_labels),
            "{kind} selects the daemon"
        );
        let e = &m["spec"][endpoints][0];
        assert_eq!(s(&e["port"]), "metrics", "{kind}");
        assert_eq!(s(&e["path"]), "/metrics", "{kind}");
        let known: BTreeSet<&str> = ["port", "path", "interval", "relabelings", "scheme"].into();
        for k in e.as_mapping().expect("endpoint").keys() {
            assert!(
                known.contains(s(k)),
                "{kind}: unexpected endpoint field {k:?}"
            );
        }
    }
}

#[test]
fn every_manifest_is_part_of_a_kustomization() {
    let mut listed = BTreeSet::new();
    for dir in [
        "deploy",
        "deploy/base",
        "deploy/monitoring",
        "deploy/overlays/least-privilege",
    ] {
        let k = file(&format!("{dir}/kustomization.yaml"));
        for key in ["resources", "patches"] {
            for r in k[key].as_sequence().into_iter().flatten() {
                let rel = r.as_str().or_else(|| r["path"].as_str()).expect("entry");
                let p = root().join(dir).join(rel);
                assert!(p.exists(), "{dir}/kustomization.yaml lists missing {rel}");
                listed.insert(p.canonicalize().expect("canonical"));
            }
        }
    }
    for dir in [
        "deploy/base",
        "deploy/monitoring",
        "deploy/overlays/least-privilege",
    ] {
        for e in std::fs::read_dir(root().join(dir)).expect("read dir") {
            let p = e.expect("entry").path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name == "kustomization.yaml" || name == "servicemonitor.yaml" {
                continue; // servicemonitor.yaml: the documented alternative to the PodMonitor
            }
            assert!(
                listed.contains(&p.canonicalize().expect("canonical")),
                "{} is in no kustomization",
                p.display()
            );
        }
    }
}

#[test]
fn containerd_configs_enable_nri_on_the_socket_the_daemonset_mounts() {
    let ds_docs = render("deploy");
    let c = container(find(&ds_docs, "DaemonSet"));
    let socket = flag(c, "nri-socket");
    for (path, section) in [
        ("deploy/containerd/config-1.7.toml", 2),
        ("deploy/containerd/config-2.x.toml", 3),
    ] {
        let text = std::fs::read_to_string(root().join(path)).expect("read");
        let t: toml::Table = text.parse().unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(t["version"].as_integer(), Some(section), "{path}");
        let nri = &t["plugins"]["io.containerd.nri.v1.nri"];
        assert_eq!(nri["disable"].as_bool(), Some(false), "{path}");
        assert_eq!(
            nri["disable_connections"].as_bool(),
            Some(false),
            "{path}: external plugins must connect"
        );
        assert_eq!(nri["socket_path"].as_str(), Some(socket), "{path}");
    }
}

/// Every `expr`/`query` string of a Grafana dashboard.
fn walk<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                if k == "expr" || k == "query" {
                    if let Some(s) = v.as_str() {
                        out.push(s);
                    }
                }
                walk(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
        _ => {}
    }
}

/// Every metric a dashboard query uses is in the catalog (and so, once merged, in the registry);
/// the dashboard shows the four things it is for.
#[test]
fn the_dashboard_queries_only_cataloged_metrics() {
    let text = std::fs::read_to_string(root().join("deploy/grafana/nri-resize.json"))
        .expect("read dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut exprs = Vec::new();
    walk(&d, &mut exprs);
    let mut used = BTreeSet::new();
    for e in &exprs {
        let mut rest = *e;
        while let Some(i) = rest.find("nri_resize_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            let entry = catalog::lookup(&name).unwrap_or_else(|| {
                panic!("the dashboard queries {name}, which is not in the catalog")
            });
            used.insert(entry.name);
        }
    }
    for needed in [
        "nri_resize_resize_outcomes_total",
        "nri_resize_container_throttled_seconds_total",
        "nri_resize_memory_decrease_reclaims_in_progress",
        "nri_resize_node_capacity",
        "nri_resize_node_allocatable",
    ] {
        assert!(
            used.contains(needed),
            "the dashboard does not show {needed}"
        );
    }
    let unused: Vec<&str> = catalog::CATALOG
        .iter()
        .map(|e| e.name)
        .filter(|n| !used.contains(n))
        .collect();
    assert!(
        unused.is_empty(),
        "cataloged but not on the dashboard: {unused:?}"
    );
}
