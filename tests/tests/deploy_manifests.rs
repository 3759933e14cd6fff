//! `deploy/` checked where schemas cannot: the kustomizations rendered by kustomize, the
//! `DaemonSet` against what the daemon needs (its flags, mounts, probes on the metrics port), its
//! least-privilege security context (the image test runs the image with it as rendered), the
//! privileged overlay, the `NetworkPolicy` in front of `/metrics`, the
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
    assert_eq!(c["securityContext"]["privileged"], Value::Bool(false));
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

/// The default install (`deploy/`, `deploy/base`) is least privilege: not privileged, every
/// capability dropped but exactly the ones the image test checks in the running container, the
/// runtime's default seccomp profile (and the `AppArmor` one, by leaving it unset), no privilege
/// escalation, a read-only root.
#[test]
fn the_default_daemonset_is_least_privilege() {
    for dir in ["deploy", "deploy/base"] {
        let docs = render(dir);
        let c = container(find(&docs, "DaemonSet"));
        let sc = &c["securityContext"];
        assert_eq!(sc["privileged"], Value::Bool(false), "{dir}");
        assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(false), "{dir}");
        assert_eq!(sc["readOnlyRootFilesystem"], Value::Bool(true), "{dir}");
        assert_eq!(
            sc["capabilities"]["drop"].as_sequence().map(Vec::len),
            Some(1),
            "{dir}"
        );
        assert_eq!(sc["capabilities"]["drop"][0].as_str(), Some("ALL"), "{dir}");
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
            "{dir}: exactly what tests/tests/image_containerd.rs reads back from the container"
        );
        assert_eq!(s(&sc["seccompProfile"]["type"]), "RuntimeDefault", "{dir}");
        // Unset: the runtime's default where the node has AppArmor; naming RuntimeDefault makes
        // containerd refuse the container on nodes without it (seen on 1.7: "apparmor is not
        // supported").
        assert!(sc["appArmorProfile"].is_null(), "{dir}: appArmorProfile");
    }
}

/// No kustomization turns a confinement off: `Unconfined` appears nowhere.
#[test]
fn no_rendering_is_unconfined() {
    for dir in [
        "deploy",
        "deploy/base",
        "deploy/monitoring",
        "deploy/overlays/privileged",
    ] {
        let text = serde_yaml::to_string(&render(dir)).expect("YAML");
        assert!(!text.contains("Unconfined"), "{dir}:\n{text}");
    }
}

/// The privileged overlay changes the security context only, and only as Kubernetes accepts it
/// (privileged with privilege escalation allowed; capabilities moot, so not listed).
#[test]
fn the_privileged_overlay_changes_only_the_security_context() {
    let docs = render("deploy/overlays/privileged");
    let ds = find(&docs, "DaemonSet");
    let c = container(ds);
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], Value::Bool(true));
    assert_eq!(sc["allowPrivilegeEscalation"], Value::Bool(true));
    assert!(sc["capabilities"].is_null(), "{sc:?}");
    let base_docs = render("deploy/base");
    let base = find(&base_docs, "DaemonSet");
    let strip = |ds: &Value| {
        let mut ds = ds.clone();
        ds["spec"]["template"]["spec"]["containers"][0]
            .as_mapping_mut()
            .expect("container")
            .remove("securityContext");
        ds
    };
    assert_eq!(strip(ds), strip(base), "only the securityContext differs");
}

/// The host's kernel interfaces are mounted read-only; only what the daemon writes is writable
/// (cgroupfs: limits; the NRI socket; its own state and API directories); bpffs, which it
/// never uses, is not mounted.
#[test]
fn kernel_interfaces_are_read_only_and_bpffs_is_not_mounted() {
    let docs = render("deploy");
    let ds = find(&docs, "DaemonSet");
    let writable: BTreeSet<&str> = [
        "/var/run/nri",
        "/sys/fs/cgroup",
        "/var/lib/nri-resize",
        "/run/nri-resize",
    ]
    .into();
    for m in container(ds)["volumeMounts"].as_sequence().expect("mounts") {
        let path = s(&m["mountPath"]);
        assert_ne!(path, "/sys/fs/bpf", "bpffs is not used");
        if !writable.contains(path) {
            assert_eq!(m["readOnly"], Value::Bool(true), "{path} read-only");
        }
    }
    for v in ds["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .expect("volumes")
    {
        assert_ne!(v["hostPath"]["path"].as_str(), Some("/sys/fs/bpf"));
    }
}

/// Only the monitoring namespace reaches the metrics port: one ingress rule, one peer.
#[test]
fn the_network_policy_admits_only_the_monitoring_namespace_to_metrics() {
    let docs = render("deploy");
    let ds = find(&docs, "DaemonSet");
    let np = find(&docs, "NetworkPolicy");
    assert_eq!(s(&np["apiVersion"]), "networking.k8s.io/v1");
    assert_eq!(s(&np["metadata"]["namespace"]), "kube-system");
    let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
    for (k, v) in np["spec"]["podSelector"]["matchLabels"]
        .as_mapping()
        .expect("podSelector.matchLabels")
    {
        assert_eq!(&pod_labels[k], v, "selects the daemon's pods");
    }
    let types: Vec<&str> = np["spec"]["policyTypes"]
        .as_sequence()
        .expect("policyTypes")
        .iter()
        .map(s)
        .collect();
    assert!(types.contains(&"Ingress"), "{types:?}");
    let rules = np["spec"]["ingress"].as_sequence().expect("ingress");
    assert_eq!(rules.len(), 1, "one rule: {rules:?}");
    let from = rules[0]["from"].as_sequence().expect("from");
    assert_eq!(from.len(), 1, "one peer: {from:?}");
    assert!(from[0]["podSelector"].is_null() && from[0]["ipBlock"].is_null());
    assert_eq!(
        s(&from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]),
        "monitoring"
    );
    let ports = rules[0]["ports"].as_sequence().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(s(&ports[0]["port"]), "metrics");
    assert_eq!(s(&ports[0]["protocol"]), "TCP");
    assert!(
        container(ds)["ports"]
            .as_sequence()
            .expect("ports")
            .iter()
            .any(|p| p["name"].as_str() == Some("metrics")),
        "the named port exists on the container"
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
        assert_eq!(
            e["honorLabels"],
            Value::Bool(true),
            "{kind}: the daemon's namespace/pod/container labels must not become exported_*"
        );
        let known: BTreeSet<&str> = [
            "port",
            "path",
            "interval",
            "relabelings",
            "scheme",
            "honorLabels",
        ]
        .into();
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
        "deploy/overlays/privileged",
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
        "deploy/overlays/privileged",
    ] {
        for e in std::fs::read_dir(root().join(dir)).expect("read dir") {
            let p = e.expect("entry").path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if [
                "kustomization.yaml",
                // The documented alternative to the PodMonitor.
                "servicemonitor.yaml",
                // The alerts as a plain rules file, and their promtool tests: not manifests.
                "nri-resize-rules.yaml",
                "nri-resize-rules.test.yaml",
            ]
            .contains(&name)
            {
                continue;
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

/// The metric names (`nri_resize_*`, `process_*`) a Prometheus query uses.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    for prefix in ["nri_resize_", "process_"] {
        let mut rest = expr;
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().next_back();
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[i + name.len()..];
            // `nri_resize_` inside a longer identifier is not a name of ours.
            if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                names.push(name);
            }
        }
    }
    names
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
        for name in metric_names(e) {
            let entry = catalog::lookup(&name).unwrap_or_else(|| {
                panic!("the dashboard queries {name}, which is not in the catalog")
            });
            used.insert(entry.name);
        }
    }
    for needed in [
        "nri_resize_resize_outcomes_total",
        "nri_resize_container_cpu_cfs_throttled_seconds_total",
        "nri_resize_memory_decrease_reclaims_in_progress",
        "nri_resize_node_capacity_cpu_cores",
        "nri_resize_node_allocatable_memory_bytes",
        "nri_resize_resizes",
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

/// The alerts: the `PrometheusRule` kustomize renders carries exactly the groups of the plain
/// rules file (one source of truth).
#[test]
fn the_prometheus_rule_and_the_plain_rules_file_are_the_same_rules() {
    let docs = render("deploy");
    let rule = find(&docs, "PrometheusRule");
    assert_eq!(s(&rule["apiVersion"]), "monitoring.coreos.com/v1");
    assert_eq!(s(&rule["metadata"]["namespace"]), "kube-system");
    let plain = file("deploy/monitoring/nri-resize-rules.yaml");
    assert_eq!(
        rule["spec"]["groups"], plain["groups"],
        "deploy/monitoring/prometheusrule.yaml's groups differ from nri-resize-rules.yaml: copy them over"
    );
}

/// The `[workspace.package] repository` of Cargo.toml (the runbook links point into it).
fn repository() -> String {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).expect("read Cargo.toml");
    let t: toml::Table = text.parse().expect("Cargo.toml");
    t["workspace"]["package"]["repository"]
        .as_str()
        .expect("[workspace.package] repository: the runbook links need it")
        .trim_end_matches('/')
        .to_string()
}

/// Every alert: a severity Alertmanager routes on, a summary, a description with the numbers
/// (`$value`) or the object (`$labels`), a runbook link to its own entry in docs/runbook.md, and
/// only metrics of the catalog or of kube-state-metrics, cAdvisor and Prometheus itself.
#[test]
fn every_alert_is_complete_and_has_its_runbook_entry() {
    let rules = file("deploy/monitoring/nri-resize-rules.yaml");
    let runbook =
        std::fs::read_to_string(root().join("docs/runbook.md")).expect("read docs/runbook.md");
    let base = format!("{}/blob/main/docs/runbook.md#", repository());
    let mut alerts = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = s(&rule["alert"]);
            alerts.push(name.to_string());
            let severity = s(&rule["labels"]["severity"]);
            assert!(
                ["critical", "warning", "info"].contains(&severity),
                "{name}: severity {severity}"
            );
            let a = &rule["annotations"];
            assert!(!s(&a["summary"]).is_empty(), "{name}: summary");
            let description = s(&a["description"]);
            assert!(
                description.contains("$value") || description.contains("$labels"),
                "{name}: the description says which object and how much"
            );
            let url = s(&a["runbook_url"]);
            let anchor = url
                .strip_prefix(&base)
                .unwrap_or_else(|| panic!("{name}: runbook_url {url} is not under {base}"));
            assert_eq!(anchor, name.to_lowercase(), "{name}: its own entry");
            assert!(
                runbook.contains(&format!("\n## {name}\n")),
                "{name}: no `## {name}` entry in docs/runbook.md"
            );
            for metric in metric_names(s(&rule["expr"])) {
                assert!(
                    catalog::lookup(&metric).is_some(),
                    "{name} uses {metric}, which is not in the catalog"
                );
            }
        }
    }
    assert!(alerts.len() >= 8, "{alerts:?}");
    // Every runbook entry is an alert's.
    for line in runbook.lines() {
        if let Some(entry) = line.strip_prefix("## ") {
            if entry.starts_with("NriResize") {
                assert!(
                    alerts.iter().any(|a| a == entry),
                    "runbook entry {entry} has no alert"
                );
            }
        }
    }
}

/// Every alert has a promtool test case where it fires and one where it stays silent (promtool
/// itself runs them in `cargo xtask manifests`).
#[test]
fn every_alert_fires_in_one_promtool_case_and_stays_silent_in_another() {
    let rules = file("deploy/monitoring/nri-resize-rules.yaml");
    let tests = file("deploy/monitoring/nri-resize-rules.test.yaml");
    assert_eq!(
        tests["rule_files"][0].as_str(),
        Some("nri-resize-rules.yaml")
    );
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for case in tests["tests"].as_sequence().expect("tests") {
        for t in case["alert_rule_test"]
            .as_sequence()
            .expect("alert_rule_test")
        {
            let name = s(&t["alertname"]).to_string();
            let expected = t["exp_alerts"].as_sequence().map_or(0, Vec::len);
            if expected == 0 {
                silent.insert(name);
            } else {
                fires.insert(name);
            }
        }
    }
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = s(&rule["alert"]);
            assert!(
                fires.contains(name),
                "{name}: no promtool case where it fires"
            );
            assert!(
                silent.contains(name),
                "{name}: no promtool case where it is silent"
            );
        }
    }
}
