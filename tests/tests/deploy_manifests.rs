//! `deploy/` checked where schemas cannot: the kustomizations rendered by kustomize, the
//! `DaemonSet` against what the daemon needs (its flags, mounts, probes on the metrics port), its
//! least-privilege security context (the image test runs the image with it as rendered), the
//! privileged overlay, the `NetworkPolicy` in front of `/metrics`, the
//! `PodMonitor`/`ServiceMonitor` custom resources (no schema in kubernetes-validate: checked
//! structurally here), the `ConfigMap` through the daemon's own config parser, the containerd
//! configurations, and the Grafana dashboard's queries against the metrics catalog. The Helm chart
//! (`deploy/helm/nri-resize`), rendered with Helm's own engine (`xtask/scripts/helm-chart.py`:
//! Helm v4's Go library through `PyPI`'s `helm-python-sdk`), against the kustomize install object
//! for object; every shipped configuration through `nri-resize config check`; the chart's values
//! (`chart_values`: its schema refusing bad values, its knobs, the Operator's objects only where
//! the cluster serves them).
//! Schema validation itself is `cargo xtask manifests` (kubernetes-validate, 1.33-1.37; helm lint).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use nri_resize::metrics::catalog;
use nri_resize_tests::{plugin_binary, DAEMON_IMAGE, LEAST_PRIVILEGE_CAPS};
use serde_yaml::Value;

/// The chart's values: refused when bad, every knob where it lands (a module of this target, not
/// a target of its own: the VM tier runs every other file of tests/tests/ in a guest).
#[path = "deploy_manifests/chart_values.rs"]
mod chart_values;

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
        ("/sys/kernel/btf/vmlinux", "/sys/kernel"),
        ("/sys/kernel/tracing", "/sys/kernel"),
        ("/sys/kernel/debug/tracing", "/sys/kernel"),
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
    nri_resize::config::Config::parse(text, "deploy/base/config.toml")
        .unwrap_or_else(|e| panic!("the ConfigMap's {key} does not parse: {e}"));
}

/// The kernel's interfaces are mounted from what exists on every node: sysfs and procfs refuse
/// the mkdir of a `DirectoryOrCreate` (or unchecked) hostPath, so one of a path the kernel may
/// lack (`/sys/kernel/btf` without BTF) kept the pod in `ContainerCreating` instead of letting the
/// observer poll. Read only; the chart's `btfPath` mounts one external BTF file and passes it as
/// `--btf-path`.
#[test]
fn kernel_interfaces_are_mounted_from_what_always_exists() {
    let btf = "/var/lib/nri-resize-btf/vmlinux";
    let installs = [
        ("deploy", render("deploy")),
        (
            "deploy/overlays/privileged",
            render("deploy/overlays/privileged"),
        ),
        ("chart", helm("{}")),
        (
            "chart with btfPath",
            helm(&format!(r#"{{"btfPath": "{btf}"}}"#)),
        ),
    ];
    for (what, docs) in &installs {
        let ds = find(docs, "DaemonSet");
        let volumes = ds["spec"]["template"]["spec"]["volumes"]
            .as_sequence()
            .expect("volumes");
        for v in volumes.iter().filter(|v| !v["hostPath"].is_null()) {
            let path = s(&v["hostPath"]["path"]);
            if path.starts_with("/sys/") || path.starts_with("/proc/") {
                assert!(
                    matches!(v["hostPath"]["type"].as_str(), Some("Directory" | "File")),
                    "{what}: hostPath {path} must exist on every node (type Directory), not be created: {v:?}"
                );
            }
        }
        let c = container(ds);
        let mount = c["volumeMounts"]
            .as_sequence()
            .expect("volumeMounts")
            .iter()
            .find(|m| s(&m["mountPath"]) == "/sys/kernel")
            .unwrap_or_else(|| panic!("{what}: /sys/kernel not mounted"));
        assert_eq!(mount["readOnly"], Value::Bool(true), "{what}");
        assert_eq!(s(&mount["recursiveReadOnly"]), "IfPossible", "{what}");
        let with_btf = *what == "chart with btfPath";
        let has_flag = c["args"]
            .as_sequence()
            .expect("args")
            .iter()
            .any(|a| s(a).starts_with("--btf-path="));
        assert_eq!(has_flag, with_btf, "{what}: --btf-path only with btfPath");
        if with_btf {
            assert_eq!(flag(c, "btf-path"), btf);
            assert_eq!(
                host_path_for(ds, btf),
                btf,
                "the file is mounted at its own path"
            );
            let v = volumes
                .iter()
                .find(|v| !v["hostPath"].is_null() && s(&v["hostPath"]["path"]) == btf)
                .expect("the BTF file's volume");
            assert_eq!(s(&v["hostPath"]["type"]), "File");
        }
    }
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

/// The namespaces a `NetworkPolicy` peer admits: `kubernetes.io/metadata.name In [...]`, the one
/// expression of its namespace selector.
fn admitted_namespaces(peer: &Value) -> Vec<&str> {
    assert!(
        peer["podSelector"].is_null() && peer["ipBlock"].is_null(),
        "{peer:?}"
    );
    let selector = &peer["namespaceSelector"];
    assert!(selector["matchLabels"].is_null(), "{selector:?}");
    let exprs = selector["matchExpressions"]
        .as_sequence()
        .expect("matchExpressions");
    assert_eq!(exprs.len(), 1, "{exprs:?}");
    assert_eq!(s(&exprs[0]["key"]), "kubernetes.io/metadata.name");
    assert_eq!(s(&exprs[0]["operator"]), "In");
    exprs[0]["values"]
        .as_sequence()
        .expect("values")
        .iter()
        .map(s)
        .collect()
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
    assert_eq!(admitted_namespaces(&from[0]), ["monitoring"]);
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
        let generated = k["configMapGenerator"]
            .as_sequence()
            .into_iter()
            .flatten()
            .flat_map(|g| g["files"].as_sequence().into_iter().flatten());
        for r in ["resources", "patches"]
            .iter()
            .flat_map(|key| k[*key].as_sequence().into_iter().flatten())
            .chain(generated)
        {
            let rel = r.as_str().or_else(|| r["path"].as_str()).expect("entry");
            let p = root().join(dir).join(rel);
            assert!(p.exists(), "{dir}/kustomization.yaml lists missing {rel}");
            listed.insert(p.canonicalize().expect("canonical"));
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
                "nri-resize-rules.selectors.test.yaml",
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

/// No two dashboard panels cover the same cells of Grafana's grid (an overlap hides one).
#[test]
fn the_dashboard_panels_do_not_overlap() {
    let text = std::fs::read_to_string(root().join("deploy/grafana/nri-resize.json"))
        .expect("read dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let rect = |p: &serde_json::Value| {
        let g = &p["gridPos"];
        let n = |k: &str| {
            g[k].as_u64()
                .unwrap_or_else(|| panic!("gridPos.{k} of {p}"))
        };
        (
            n("x"),
            n("y"),
            n("w"),
            n("h"),
            p["title"].as_str().unwrap_or("").to_owned(),
        )
    };
    let panels: Vec<_> = d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .map(rect)
        .collect();
    for (i, a) in panels.iter().enumerate() {
        assert!(a.0 + a.2 <= 24, "{} is wider than the grid", a.4);
        for b in &panels[i + 1..] {
            let apart =
                a.0 + a.2 <= b.0 || b.0 + b.2 <= a.0 || a.1 + a.3 <= b.1 || b.1 + b.3 <= a.1;
            assert!(apart, "panels overlap: {a:?} and {b:?}");
        }
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

/// Every `nri_resize_*`/`process_*` selector of a query: the name and what its braces hold
/// (empty without braces).
fn selectors(expr: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for name in metric_names(expr) {
        // Each occurrence of the name at an identifier boundary, in order.
        let mut from = 0;
        while let Some(i) = expr[from..].find(name.as_str()) {
            let at = from + i;
            from = at + name.len();
            let before = expr[..at].chars().next_back();
            let after = expr[from..].chars().next();
            let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
            if before.is_some_and(ident) || after.is_some_and(ident) {
                continue;
            }
            let labels = expr[from..]
                .strip_prefix('{')
                .and_then(|rest| rest.split_once('}'))
                .map_or(String::new(), |(inside, _)| inside.to_string());
            out.push((name.clone(), labels));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// What a dashboard query shows, from the catalog's units: `bytes`, `seconds`, `cores` or
/// `count` (every other unit: events, containers, ...), `/s` for a rate, `ratio` for a quotient of
/// one unit; flags and info series (unit `1`) joined to filter do not count.
fn query_unit(expr: &str) -> String {
    let mut units = BTreeSet::new();
    for name in metric_names(expr) {
        let entry = catalog::lookup(&name)
            .unwrap_or_else(|| panic!("the dashboard queries {name}, which is not in the catalog"));
        match entry.unit {
            "1" => {}
            u @ ("bytes" | "seconds" | "cores") => {
                units.insert(u);
            }
            _ => {
                units.insert("count");
            }
        }
    }
    assert!(units.len() <= 1, "{expr} mixes units: {units:?}");
    let base = units.into_iter().next().unwrap_or("count");
    if expr.contains(" / ") {
        "ratio".to_string()
    } else if expr.contains("rate(") && !expr.contains("histogram_quantile(") {
        format!("{base}/s")
    } else {
        base.to_string()
    }
}

/// The Grafana units that show a [`query_unit`].
fn grafana_units(unit: &str) -> &'static [&'static str] {
    match unit {
        "bytes" => &["bytes", "decbytes"],
        "bytes/s" => &["Bps", "binBps"],
        "seconds" => &["s"],
        "seconds/s" | "ratio" => &["percentunit"],
        "cores" => &["none"],
        "count" => &["short", "none"],
        "count/s" => &["ops", "cps", "reqps"],
        _ => &[],
    }
}

/// The dashboard has a `node` variable (from the `node` label the monitors set), and every
/// selector of every panel's queries is narrowed by it; every panel shows one unit (its queries
/// measure the same thing, in the unit the panel is set to, no override changes it).
#[test]
fn every_dashboard_panel_is_narrowed_by_node_and_shows_one_unit() {
    let text = std::fs::read_to_string(root().join("deploy/grafana/nri-resize.json"))
        .expect("read dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let node = vars
        .iter()
        .find(|v| v["name"] == "node")
        .expect("a node variable");
    let query = node["query"].as_str().expect("node variable query");
    assert!(
        query.starts_with("label_values(nri_resize_") && query.ends_with(", node)"),
        "{query}"
    );
    assert_eq!(node["includeAll"], serde_json::Value::Bool(true));
    let narrowed = r#"node=~"$node""#;
    let mut panels = 0;
    for panel in d["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        panels += 1;
        let title = panel["title"].as_str().expect("title");
        let unit = panel["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .unwrap_or_else(|| panic!("{title}: no unit"));
        for o in panel["fieldConfig"]["overrides"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let props = o["properties"].as_array().into_iter().flatten();
            for prop in props {
                assert_ne!(prop["id"], "unit", "{title}: an override sets another unit");
            }
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        let mut shown = BTreeSet::new();
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            for (name, labels) in selectors(expr) {
                assert!(
                    labels.contains(narrowed),
                    "{title}: {name} is not narrowed by $node in {expr}"
                );
            }
            shown.insert(query_unit(expr));
        }
        assert_eq!(shown.len(), 1, "{title}: its queries show {shown:?}");
        let shown = shown.into_iter().next().expect("one");
        assert!(
            grafana_units(&shown).contains(&unit),
            "{title}: shows {shown}, set to Grafana unit {unit}"
        );
    }
    assert!(panels >= 20, "{panels} panels");
}

/// The API version a cluster with the Prometheus Operator's CRDs serves.
const OPERATOR_API: &str = "monitoring.coreos.com/v1";

/// How the chart is rendered: the release's name, and what the cluster serves besides Helm's
/// built-in API versions (`helm template --api-versions`; `helm install` asks the cluster).
#[derive(Debug, Clone, Copy)]
struct Cluster<'a> {
    release: &'a str,
    api_versions: &'a [&'a str],
}

/// A cluster with the Prometheus Operator, release `nri-resize`.
const WITH_OPERATOR: Cluster<'static> = Cluster {
    release: "nri-resize",
    api_versions: &[OPERATOR_API],
};

/// `xtask/scripts/helm-chart.py <command> deploy/helm/nri-resize` with `values` for `cluster`:
/// its standard output, or Helm's message (the values refused by the chart's schema, or a
/// template's `fail`).
fn helm_chart_py(command: &str, values: &str, cluster: Cluster<'_>) -> Result<String, String> {
    let cache = std::env::var_os("NRI_RESIZE_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/nri-resize"), PathBuf::from);
    let mut cmd = Command::new(cache.join("venv/bin/python"));
    cmd.arg(root().join("xtask/scripts/helm-chart.py"))
        .arg(command)
        .arg(root().join("deploy/helm/nri-resize"))
        .args(["--values", values, "--release", cluster.release]);
    for api in cluster.api_versions {
        cmd.args(["--api-versions", api]);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("run helm-chart.py ({e}); `cargo xtask setup` installs helm-python-sdk")
    });
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("utf-8"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The chart rendered by Helm's own engine with `values` (JSON over values.yaml) in
/// `kube-system` on `cluster`, or Helm's message.
fn try_helm(values: &str, cluster: Cluster<'_>) -> Result<Vec<Value>, String> {
    let text = helm_chart_py("render", values, cluster)?;
    Ok(serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("rendered YAML parses"))
        .filter(|v: &Value| !v.is_null())
        .collect())
}

/// The chart rendered by Helm's own engine with `values` (JSON over values.yaml), release
/// `nri-resize` in `kube-system`, on a cluster with the Prometheus Operator, as `helm install
/// nri-resize deploy/helm/nri-resize -n kube-system` would there.
fn helm(values: &str) -> Vec<Value> {
    try_helm(values, WITH_OPERATOR)
        .unwrap_or_else(|e| panic!("render the chart with {values}: {e}"))
}

/// Runs `nri-resize config check` on `text` (written to a file named after `origin`); panics
/// with its output unless it passes.
fn config_check(text: &str, origin: &str) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "nri-resize-config-check-{}-{n}.toml",
        std::process::id()
    ));
    std::fs::write(&path, text).expect("write config");
    let out = Command::new(plugin_binary())
        .args(["config", "check"])
        .arg(&path)
        .output()
        .expect("nri-resize config check");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{origin} fails `nri-resize config check`:\n{}{}\n--- {origin}:\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `config.toml` of every `ConfigMap` in `docs`.
fn configs(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some("ConfigMap"))
        .map(|d| s(&d["data"]["config.toml"]).to_string())
        .collect()
}

/// The chart's values the tests render with, beside the default.
const CHART_VALUES: &[&str] = &[
    "{}",
    r#"{"privileged": true}"#,
    r#"{"mode": "Observe"}"#,
    r#"{"kubeletConfigFile": "/etc/kubernetes/kubelet/config.json"}"#,
    r#"{"config": {"memory_decrease": {"strategy": "Reject", "max_stall": 0.1, "timeout": "5s", "headroom": "32Mi"}, "resize": {"reserved_memory": "1.5Gi", "reserved_cpu": "250m", "step_pause": "500ms"}, "capacity": {"resync_interval": "5m"}, "policy": {"memory": {"decrease": "NotRequired"}}}}"#,
];

/// Every configuration the project ships passes `nri-resize config check` (the daemon's own
/// reading): the kustomize `ConfigMap`s, the chart's (default and with values), and every
/// nri-resize `toml` example in README.md and docs/.
#[test]
fn every_shipped_configuration_passes_config_check() {
    let mut checked = 0;
    for dir in ["deploy", "deploy/base", "deploy/overlays/privileged"] {
        let found = configs(&render(dir));
        assert_eq!(found.len(), 1, "{dir}: one ConfigMap");
        for text in found {
            config_check(&text, &format!("kustomize build {dir}"));
            checked += 1;
        }
    }
    for values in CHART_VALUES {
        let found = configs(&helm(values));
        assert_eq!(found.len(), 1, "chart with {values}: one ConfigMap");
        for text in found {
            config_check(&text, &format!("the chart with {values}"));
            checked += 1;
        }
    }
    let mut docs = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    for doc in docs {
        let text = std::fs::read_to_string(&doc).expect("read doc");
        for (i, block) in text.split("```toml\n").skip(1).enumerate() {
            let block = block.split("```").next().unwrap_or_default();
            // containerd's configuration (NRI on) is TOML too: not ours.
            if block.contains("version =") || block.contains("io.containerd") {
                continue;
            }
            config_check(block, &format!("{} toml block {}", doc.display(), i + 1));
            checked += 1;
        }
    }
    eprintln!("{checked} shipped configurations pass `nri-resize config check`");
}

/// Labels Helm charts put on every object and into selectors (the release); kustomize has no
/// release.
const HELM_LABELS: &[&str] = &[
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
];

/// Removes every key named in `keys`, at any depth.
fn remove_keys(v: &mut Value, keys: &[&str]) {
    match v {
        Value::Mapping(m) => {
            for k in keys {
                m.remove(*k);
            }
            m.values_mut().for_each(|v| remove_keys(v, keys));
        }
        Value::Sequence(seq) => seq.iter_mut().for_each(|v| remove_keys(v, keys)),
        _ => {}
    }
}

/// Rendered objects by kind and name.
type Objects = std::collections::BTreeMap<(String, String), Value>;

fn by_object(docs: Vec<Value>) -> Objects {
    docs.into_iter()
        .map(|d| {
            (
                (
                    s(&d["kind"]).to_string(),
                    s(&d["metadata"]["name"]).to_string(),
                ),
                d,
            )
        })
        .collect()
}

/// Brings the two renderings to what must be equal, checking each difference it removes:
/// - Helm's release labels ([`HELM_LABELS`]): on every object and in every selector of the
///   chart (two releases must not select each other's pods); kustomize has no release.
/// - The `ConfigMap`'s name: kustomize's generator appends a hash of its content
///   (`nri-resize-config-<10 characters>`) and rewrites the `DaemonSet`'s reference to it, so a
///   changed configuration is a new `ConfigMap` and rolls the `DaemonSet`; the chart keeps the
///   name and rolls it through the pod template's `checksum/config` annotation (a SHA-256)
///   instead. The suffix and the annotation are checked, then removed.
/// - `config.toml`: the chart writes it from values (keys sorted, no comments), kustomize ships
///   the file as written: compared as TOML tables, then removed.
/// - The `PrometheusRule`'s groups: the chart builds them from its copy of the rules file
///   (`toYaml` sorts keys; compared as values, so order does not matter).
fn normalise(kustomize: Vec<Value>, chart: Vec<Value>) -> (Objects, Objects) {
    let mut k = by_object(kustomize);
    let mut h = by_object(chart);
    // The hash-suffixed ConfigMap.
    let cm_key = k
        .keys()
        .find(|(kind, _)| kind == "ConfigMap")
        .cloned()
        .expect("kustomize renders a ConfigMap");
    let (base, hash) = cm_key.1.rsplit_once('-').expect("name-hash");
    assert_eq!(base, "nri-resize-config", "{}", cm_key.1);
    assert!(
        hash.len() == 10 && hash.chars().all(|c| c.is_ascii_alphanumeric()),
        "kustomize's content hash suffix: {}",
        cm_key.1
    );
    let mut cm = k.remove(&cm_key).expect("ConfigMap");
    cm["metadata"]["name"] = Value::from(base);
    k.insert(("ConfigMap".into(), base.into()), cm);
    let ds_key = ("DaemonSet".to_string(), "nri-resize".to_string());
    let ds = k.get_mut(&ds_key).expect("kustomize DaemonSet");
    let volume = ds["spec"]["template"]["spec"]["volumes"]
        .as_sequence_mut()
        .expect("volumes")
        .iter_mut()
        .find(|v| v["name"].as_str() == Some("config"))
        .expect("the config volume");
    assert_eq!(
        s(&volume["configMap"]["name"]),
        cm_key.1,
        "the DaemonSet mounts the hashed name"
    );
    volume["configMap"]["name"] = Value::from(base);
    // The chart's checksum annotation.
    let ds = h.get_mut(&ds_key).expect("chart DaemonSet");
    let template = ds["spec"]["template"]["metadata"]
        .as_mapping_mut()
        .expect("template metadata");
    let annotations = template
        .remove("annotations")
        .expect("the chart's pod template has annotations");
    let checksum = s(&annotations["checksum/config"]);
    assert!(
        checksum.len() == 64 && checksum.chars().all(|c| c.is_ascii_hexdigit()),
        "checksum/config is a SHA-256: {checksum}"
    );
    assert_eq!(
        annotations.as_mapping().map(serde_yaml::Mapping::len),
        Some(1)
    );
    // config.toml as TOML.
    let cm_name = ("ConfigMap".to_string(), base.to_string());
    let table = |v: &Value| -> toml::Table {
        s(&v["data"]["config.toml"])
            .parse()
            .expect("config.toml is TOML")
    };
    let (kt, ht) = (
        table(&k[&cm_name]),
        table(h.get(&cm_name).expect("chart ConfigMap")),
    );
    assert_eq!(kt, ht, "config.toml: kustomize's and the chart's, as TOML");
    for docs in [&mut k, &mut h] {
        docs.get_mut(&cm_name).expect("ConfigMap")["data"]["config.toml"] = Value::Null;
        for d in docs.values_mut() {
            remove_keys(d, HELM_LABELS);
        }
    }
    (k, h)
}

/// Compares two normalised renderings object for object.
fn assert_same_objects(what: &str, kustomize: Vec<Value>, chart: Vec<Value>) {
    let (k, h) = normalise(kustomize, chart);
    assert_eq!(
        k.keys().collect::<Vec<_>>(),
        h.keys().collect::<Vec<_>>(),
        "{what}: the same objects"
    );
    for (key, kd) in &k {
        if let Some(diff) = first_difference(kd, &h[key], "") {
            panic!("{what}: {key:?} differs at {diff}");
        }
    }
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

/// The chart ships the same alerts: its `files/nri-resize-rules.yaml` is the rules file, byte for
/// byte (a chart cannot read files outside its directory).
#[test]
fn the_charts_rules_are_the_rules_file() {
    let ours = std::fs::read_to_string(root().join("deploy/monitoring/nri-resize-rules.yaml"))
        .expect("read the rules file");
    let chart =
        std::fs::read_to_string(root().join("deploy/helm/nri-resize/files/nri-resize-rules.yaml"))
            .expect("read the chart's copy");
    assert!(
        ours == chart,
        "deploy/helm/nri-resize/files/nri-resize-rules.yaml differs from deploy/monitoring/nri-resize-rules.yaml: copy it over"
    );
}

/// Every alert: a severity Alertmanager routes on, a summary, a description with the numbers
/// (`$value`) or the object (`$labels`), a runbook link to its own entry in docs/runbook.md, and
/// only metrics of the catalog or of kube-state-metrics, cAdvisor and Prometheus itself.
#[test]
fn every_alert_is_complete_and_has_its_runbook_entry() {
    let rules = file("deploy/monitoring/nri-resize-rules.yaml");
    let runbook =
        std::fs::read_to_string(root().join("docs/runbook.md")).expect("read docs/runbook.md");
    // Absolute, under the chart's default `monitoring.rules.runbookBaseUrl`.
    let runbook_base = chart_rules_default("runbookBaseUrl");
    assert!(
        ["https://", "http://"]
            .iter()
            .any(|scheme| runbook_base.starts_with(scheme))
            && runbook_base.ends_with('/'),
        "monitoring.rules.runbookBaseUrl {runbook_base} is not an absolute URL ending in /"
    );
    let base = format!("{runbook_base}docs/runbook.md#");
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
                .strip_prefix(base.as_str())
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

/// Where `a` and `b` first differ: the path and the two values.
fn first_difference(a: &Value, b: &Value, path: &str) -> Option<String> {
    let show = |v: &Value| {
        serde_yaml::to_string(v)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    match (a, b) {
        (Value::Mapping(x), Value::Mapping(y)) => {
            let keys: BTreeSet<String> = x.keys().chain(y.keys()).map(show).collect();
            keys.iter().find_map(|k| {
                let (va, vb) = (&a[k.as_str()], &b[k.as_str()]);
                first_difference(va, vb, &format!("{path}.{k}"))
            })
        }
        (Value::Sequence(x), Value::Sequence(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (va, vb))| first_difference(va, vb, &format!("{path}[{i}]"))),
        _ if a == b => None,
        _ => Some(format!("{path}: kustomize {} / chart {}", show(a), show(b))),
    }
}

/// `helm install nri-resize deploy/helm/nri-resize -n kube-system` with the default values is
/// `kubectl apply -k deploy/`, object for object (but for what [`normalise`] names); without
/// the `PodMonitor` it is `deploy/base`; privileged, it is `deploy/overlays/privileged`.
#[test]
fn the_charts_default_rendering_is_the_kustomize_install() {
    assert_same_objects("deploy/", render("deploy"), helm("{}"));
    assert_same_objects(
        "deploy/base",
        render("deploy/base"),
        helm(r#"{"monitoring": {"podMonitor": {"enabled": false}, "rules": {"enabled": false}}}"#),
    );
    assert_same_objects(
        "deploy/overlays/privileged",
        render("deploy/overlays/privileged"),
        helm(
            r#"{"privileged": true, "monitoring": {"podMonitor": {"enabled": false}, "rules": {"enabled": false}}}"#,
        ),
    );
}

/// A changed configuration rolls the `DaemonSet`: kustomize names the `ConfigMap` after its content
/// (the `DaemonSet` refers to that name), the chart's pod template carries its checksum.
#[test]
fn a_configuration_change_rolls_the_daemonset() {
    let checksum = |values: &str| {
        let docs = helm(values);
        let ds = find(&docs, "DaemonSet");
        s(&ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]).to_string()
    };
    let default = checksum("{}");
    assert_eq!(
        default,
        checksum(r#"{"logLevel": "debug"}"#),
        "only the configuration counts"
    );
    assert_ne!(default, checksum(r#"{"mode": "Observe"}"#));
    assert_ne!(default, checksum(r#"{"config": {"journal_size": 7}}"#));
    let docs = render("deploy/base");
    let cm = s(&find(&docs, "ConfigMap")["metadata"]["name"]).to_string();
    assert!(
        cm.starts_with("nri-resize-config-"),
        "{cm}: hash-suffixed by configMapGenerator"
    );
    let mounted = find(&docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find_map(|v| v["configMap"]["name"].as_str())
        .expect("a ConfigMap volume")
        .to_string();
    assert_eq!(mounted, cm);
}

/// The chart's values reach the objects: mode into config.toml, the monitors' extra labels and
/// `honorLabels`, the `NetworkPolicy`'s admitted namespaces, image, node selection.
#[test]
fn the_charts_values_reach_the_objects() {
    let docs = helm(
        r#"{"mode": "Observe", "image": {"repository": "registry.example/nri-resize", "tag": "9.9.9", "pullPolicy": "Always"},
            "monitoring": {"labels": {"release": "kube-prometheus-stack"}, "serviceMonitor": {"enabled": true}},
            "networkPolicy": {"prometheusNamespaces": ["observability", "gmp-system"]},
            "nodeSelector": {"kubernetes.io/os": "linux", "nri": "on"},
            "tolerations": [], "priorityClassName": ""}"#,
    );
    let cfg = nri_resize::config::Config::parse(&configs(&docs)[0], "chart").expect("config");
    assert_eq!(cfg.resize.mode, nri_resize::config::Mode::Observe);
    for kind in ["PodMonitor", "ServiceMonitor"] {
        let m = find(&docs, kind);
        assert_eq!(
            s(&m["metadata"]["labels"]["release"]),
            "kube-prometheus-stack",
            "{kind}"
        );
        let endpoints = if kind == "PodMonitor" {
            "podMetricsEndpoints"
        } else {
            "endpoints"
        };
        assert_eq!(
            m["spec"][endpoints][0]["honorLabels"],
            Value::Bool(true),
            "{kind}"
        );
    }
    let np = find(&docs, "NetworkPolicy");
    assert_eq!(
        admitted_namespaces(&np["spec"]["ingress"][0]["from"][0]),
        ["observability", "gmp-system"]
    );
    let ds = find(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(s(&pod["nodeSelector"]["nri"]), "on");
    assert!(pod["tolerations"].is_null() && pod["priorityClassName"].is_null());
    let c = container(ds);
    assert_eq!(s(&c["image"]), "registry.example/nri-resize:9.9.9");
    assert_eq!(s(&c["imagePullPolicy"]), "Always");
    // Off by default: ServiceMonitor; off on request: the PodMonitor, the alerts and the
    // NetworkPolicy.
    let docs = helm(
        r#"{"monitoring": {"podMonitor": {"enabled": false}, "rules": {"enabled": false}}, "networkPolicy": {"enabled": false}}"#,
    );
    let kinds: BTreeSet<&str> = docs.iter().map(|d| s(&d["kind"])).collect();
    assert_eq!(
        kinds,
        ["ConfigMap", "DaemonSet", "Service", "ServiceAccount"].into()
    );
}

/// A default of the chart's `monitoring.rules` (values.yaml), the settings node-mixin keeps in
/// `_config`.
fn chart_rules_default(key: &str) -> String {
    let values = file("deploy/helm/nri-resize/values.yaml");
    s(&values["monitoring"]["rules"][key]).to_string()
}

/// The values of [`the_charts_rule_settings_reach_the_rules`] and
/// deploy/monitoring/nri-resize-rules.selectors.test.yaml (its header names them).
const CUSTOM_RULE_SETTINGS: &str = r#"{"monitoring": {"rules": {
    "jobSelector": "job=\"kubernetes-pods\",app_kubernetes_io_name=\"nri-resize\"",
    "daemonSetSelector": "daemonset=\"resize-agent\"",
    "runbookBaseUrl": "https://git.example.com/platform/nri-resize/blob/main/"}}}"#;

/// node-mixin's `_config` as the chart's values: the rules file is written with the defaults of
/// `monitoring.rules` (each selector used, every runbook link under the base); the chart puts the
/// release's settings in their place, every occurrence, and promtool agrees that the alerts then
/// fire for the annotation-based job and the other `DaemonSet`
/// (deploy/monitoring/nri-resize-rules.selectors.test.yaml). A base URL that is not absolute is
/// refused.
#[test]
fn the_charts_rule_settings_reach_the_rules() {
    let plain = std::fs::read_to_string(root().join("deploy/monitoring/nri-resize-rules.yaml"))
        .expect("read the rules file");
    let defaults: Vec<String> = ["jobSelector", "daemonSetSelector"]
        .iter()
        .map(|k| chart_rules_default(k))
        .collect();
    for d in &defaults {
        assert!(
            plain.contains(&format!("{{{d}}}")),
            "the rules file does not select with values.yaml's default {d}"
        );
    }
    let custom: serde_json::Value =
        serde_json::from_str(CUSTOM_RULE_SETTINGS).expect("JSON values");
    let custom = &custom["monitoring"]["rules"];
    let base = custom["runbookBaseUrl"].as_str().expect("base");
    let groups = find(&helm(CUSTOM_RULE_SETTINGS), "PrometheusRule")["spec"]["groups"].clone();
    let rules: Vec<&Value> = groups
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .collect();
    let exprs: Vec<&str> = rules.iter().map(|r| s(&r["expr"])).collect();
    for (key, default) in ["jobSelector", "daemonSetSelector"].iter().zip(&defaults) {
        let value = custom[key].as_str().expect("selector");
        assert!(
            exprs.iter().all(|e| !e.contains(default.as_str())),
            "{key}: the default {default} is left in the chart's rules"
        );
        assert!(
            exprs.iter().any(|e| e.contains(&format!("{{{value}}}"))),
            "{key}: {value} is in none of the chart's rules"
        );
    }
    for r in &rules {
        let url = s(&r["annotations"]["runbook_url"]);
        let anchor = s(&r["alert"]).to_lowercase();
        assert_eq!(url, format!("{base}docs/runbook.md#{anchor}"));
    }
    // promtool on the rendered rules.
    let dir = std::env::temp_dir().join(format!("nri-resize-rule-settings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut file_map = serde_yaml::Mapping::new();
    file_map.insert("groups".into(), groups.clone());
    std::fs::write(
        dir.join("nri-resize-rules.selectors.yaml"),
        serde_yaml::to_string(&file_map).expect("YAML"),
    )
    .expect("write the rendered rules");
    let tests = "nri-resize-rules.selectors.test.yaml";
    std::fs::copy(
        root().join("deploy/monitoring").join(tests),
        dir.join(tests),
    )
    .expect("copy the promtool tests");
    let cache = std::env::var_os("NRI_RESIZE_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/nri-resize"), PathBuf::from);
    let out = Command::new(cache.join("prometheus/usr/bin/promtool"))
        .args(["test", "rules", tests])
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| panic!("run promtool ({e}); `cargo xtask setup` unpacks it"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "promtool test rules {tests} on the chart's rules with {CUSTOM_RULE_SETTINGS}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Not an absolute base: refused with the value named.
    let out = Command::new(cache.join("venv/bin/python"))
        .arg(root().join("xtask/scripts/helm-chart.py"))
        .arg("render")
        .arg(root().join("deploy/helm/nri-resize"))
        .args([
            "--values",
            r#"{"monitoring": {"rules": {"runbookBaseUrl": "docs/"}}}"#,
        ])
        .output()
        .expect("run helm-chart.py");
    assert!(!out.status.success(), "a relative runbookBaseUrl rendered");
    let err = String::from_utf8_lossy(&out.stderr);
    // The schema refuses it before the template's own check does: either names the value.
    assert!(
        err.contains("monitoring.rules.runbookBaseUrl")
            || err.contains("/monitoring/rules/runbookBaseUrl"),
        "{err}"
    );
}

/// The `kubernetes.io/arch` values a pod spec's required node affinity allows (`In`).
fn affinity_arches(pod: &Value) -> BTreeSet<String> {
    let terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .as_sequence()
        .expect("a required node affinity");
    assert_eq!(terms.len(), 1, "one term (terms are ORed)");
    let exprs = terms[0]["matchExpressions"]
        .as_sequence()
        .expect("matchExpressions");
    let arch: Vec<&Value> = exprs
        .iter()
        .filter(|e| s(&e["key"]) == "kubernetes.io/arch")
        .collect();
    assert_eq!(arch.len(), 1, "one kubernetes.io/arch expression");
    assert_eq!(s(&arch[0]["operator"]), "In");
    arch[0]["values"]
        .as_sequence()
        .expect("values")
        .iter()
        .map(|v| s(v).to_string())
        .collect()
}

/// Both installs run only on Linux nodes of the architectures the image is built for
/// (`cargo xtask image`: an image index of linux/amd64 and linux/arm64, `xtask/src/cross.rs`
/// `Arch::ALL`), the architecture through a node affinity (a nodeSelector holds one value).
#[test]
fn node_selection_matches_the_images_built() {
    let cross_rs = std::fs::read_to_string(root().join("xtask/src/cross.rs")).expect("cross.rs");
    // `pub const ALL: [Self; 2] = [Self::Amd64, Self::Arm64];` and the names in `fn name`.
    let all = cross_rs
        .split_once("pub const ALL:")
        .and_then(|(_, rest)| rest.split_once(';'))
        .and_then(|(_, rest)| rest.split_once(';'))
        .map(|(decl, _)| decl)
        .expect("Arch::ALL in cross.rs");
    let body = cross_rs
        .split_once("pub fn name(self)")
        .and_then(|(_, rest)| rest.split_once("\n    }"))
        .map(|(body, _)| body)
        .expect("Arch::name in cross.rs");
    let built: BTreeSet<String> = all
        .split("Self::")
        .skip(1)
        .map(|rest| {
            let variant: String = rest
                .chars()
                .take_while(char::is_ascii_alphanumeric)
                .collect();
            let arm = format!("Self::{variant} => \"");
            let name = body
                .split_once(arm.as_str())
                .and_then(|(_, r)| r.split_once('"'))
                .map(|(n, _)| n.to_string());
            name.unwrap_or_else(|| panic!("no name for Arch::{variant} in cross.rs"))
        })
        .collect();
    assert_eq!(
        built,
        ["amd64".to_string(), "arm64".to_string()].into(),
        "the image's architectures changed: update the node affinity in deploy/base/daemonset.yaml \
         and the chart's values.yaml `architectures`"
    );
    for (what, docs) in [("kustomize", render("deploy")), ("chart", helm("{}"))] {
        let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
        let sel = &pod["nodeSelector"];
        assert_eq!(s(&sel["kubernetes.io/os"]), "linux", "{what}");
        assert!(
            sel["kubernetes.io/arch"].is_null(),
            "{what}: the architecture is the affinity's, not the nodeSelector's"
        );
        assert_eq!(affinity_arches(pod), built, "{what}");
    }
    // The chart's value narrows it; empty drops the constraint.
    let docs = helm(r#"{"architectures": ["arm64"]}"#);
    let pod = &find(&docs, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(affinity_arches(pod), ["arm64".to_string()].into());
    let docs = helm(r#"{"architectures": []}"#);
    assert!(find(&docs, "DaemonSet")["spec"]["template"]["spec"]["affinity"].is_null());
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
            let expected = t["exp_alerts"].as_sequence().cloned().unwrap_or_default();
            if expected.is_empty() {
                silent.insert(name.clone());
            }
            for a in &expected {
                fires.insert((name.clone(), s(&a["exp_labels"]["severity"]).to_string()));
            }
        }
    }
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = s(&rule["alert"]);
            let severity = s(&rule["labels"]["severity"]);
            assert!(
                fires.contains(&(name.to_string(), severity.to_string())),
                "{name}: no promtool case where it fires with severity {severity}"
            );
            assert!(
                silent.contains(name),
                "{name}: no promtool case where it is silent"
            );
        }
    }
}

/// One cause, one alert: the promtool file has cases that evaluate every alert at one time on one
/// situation (a refused memory decrease among them), and each expects exactly one alert to fire
/// there; promtool checks that nothing else fires.
#[test]
fn one_cause_raises_one_alert() {
    let rules = file("deploy/monitoring/nri-resize-rules.yaml");
    let tests = file("deploy/monitoring/nri-resize-rules.test.yaml");
    let names: BTreeSet<String> = alert_names(&rules).into_iter().collect();
    let mut cases = 0;
    for case in tests["tests"].as_sequence().expect("tests") {
        let checks = case["alert_rule_test"]
            .as_sequence()
            .expect("alert_rule_test");
        let times: BTreeSet<&str> = checks.iter().map(|t| s(&t["eval_time"])).collect();
        let evaluated: BTreeSet<String> = checks
            .iter()
            .map(|t| s(&t["alertname"]).to_string())
            .collect();
        if times.len() != 1 || evaluated != names {
            continue;
        }
        cases += 1;
        let firing: Vec<(&str, usize)> = checks
            .iter()
            .map(|t| {
                let n = t["exp_alerts"].as_sequence().map_or(0, Vec::len);
                (s(&t["alertname"]), n)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        assert!(
            firing.len() == 1 && firing[0].1 == 1,
            "a case that evaluates every alert expects {firing:?}, not exactly one alert"
        );
    }
    assert!(cases >= 1, "no promtool case evaluates every alert at once");
    let text = std::fs::read_to_string(root().join("deploy/monitoring/nri-resize-rules.test.yaml"))
        .expect("read the promtool tests");
    assert!(
        text.contains(r#"state="Deferred""#) && text.contains("One cause, one alert"),
        "the one-alert case is the refused (Deferred) memory decrease"
    );
}

/// The alert names of a rules file, each once (an alert may have a rule per severity).
fn alert_names(rules: &Value) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = s(&rule["alert"]).to_string();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

/// The README and docs/metrics.md say how many alerts ship, in words: the number of alert names
/// in the rules file.
#[test]
fn the_readme_counts_the_alerts() {
    let rules = file("deploy/monitoring/nri-resize-rules.yaml");
    let count = alert_names(&rules).len();
    let words = [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
    ];
    let word = words
        .get(count)
        .unwrap_or_else(|| panic!("{count} alerts: extend the words of this test"));
    for doc in ["README.md", "docs/metrics.md"] {
        let text = std::fs::read_to_string(root().join(doc)).expect("read the doc");
        let said: Vec<&str> = text
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[1].trim_end_matches(|c: char| !c.is_alphanumeric()) == "alerts")
            .map(|w| w[0])
            .filter(|n| words.contains(&n.to_lowercase().as_str()))
            .collect();
        assert!(!said.is_empty(), "{doc} does not say how many alerts ship");
        for n in said {
            assert_eq!(
                n.to_lowercase(),
                *word,
                "{doc} says {n} alerts; deploy/monitoring/nri-resize-rules.yaml has {count}"
            );
        }
    }
}

/// `kubeletConfigFile`: the chart mounts that one file read-only (hostPath type `File`: a node
/// without it does not start the pod, rather than run with another reserve than asked) and
/// points `[kubelet] config_file` at it; unset, nothing of kubelet's is mounted.
#[test]
fn the_chart_mounts_kubelets_configuration_when_asked() {
    let docs = helm(r#"{"kubeletConfigFile": "/etc/kubernetes/kubelet/config.json"}"#);
    let ds = find(&docs, "DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    let volume = spec["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"].as_str() == Some("kubelet-config"))
        .expect("a kubelet-config volume");
    assert_eq!(
        s(&volume["hostPath"]["path"]),
        "/etc/kubernetes/kubelet/config.json"
    );
    assert_eq!(s(&volume["hostPath"]["type"]), "File");
    let mount = spec["containers"][0]["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .find(|m| m["name"].as_str() == Some("kubelet-config"))
        .expect("mounted");
    assert_eq!(s(&mount["mountPath"]), "/etc/kubelet/config.json");
    assert_eq!(mount["readOnly"].as_bool(), Some(true));
    let config = &configs(&docs)[0];
    let table: toml::Table = toml::from_str(config).expect("config.toml");
    assert_eq!(
        table["kubelet"]["config_file"].as_str(),
        Some("/etc/kubelet/config.json"),
        "{config}"
    );

    let plain = helm("{}");
    let text = serde_yaml::to_string(&plain).expect("YAML");
    assert!(
        !text.contains("kubelet-config"),
        "nothing of kubelet's mounted by default"
    );
    assert!(!configs(&plain)[0].contains("[kubelet]"));
}

/// `nri-resize config check --values` reads a values file as the chart does: for each set of
/// values, the configuration it builds (`config_check::values::chart_config`, over the chart's
/// own values.yaml) is the one the chart's `ConfigMap` carries when Helm's engine renders it.
#[test]
fn config_check_values_builds_the_configuration_the_chart_renders() {
    use nri_resize::config::Config;
    use nri_resize::config_check::values::chart_config;
    let cases = [
        "{}",
        r#"{"mode": "Observe"}"#,
        r#"{"kubeletConfigFile": "/etc/kubernetes/kubelet/config.json"}"#,
        r#"{"config": {"journal_size": 64, "memory_decrease": {"strategy": "Reject", "max_stall": 0.1, "timeout": "5s", "headroom": "32Mi"}, "resize": {"reserved_memory": "1.5Gi", "reserved_cpu": 0.5, "step_pause": "500ms"}, "capacity": {"resync_interval": "5m"}, "policy": {"memory": {"decrease": "NotRequired"}}, "trim": {"enabled": true}}}"#,
        r#"{"config": {"resize": {"reserved_memory": null}, "journal_size": null}}"#,
    ];
    for values in cases {
        let rendered = configs(&helm(values));
        assert_eq!(rendered.len(), 1, "{values}: one ConfigMap");
        let ours = chart_config(values).unwrap_or_else(|e| panic!("{values}: {e}"));
        let from_helm =
            Config::parse(&rendered[0], "helm").unwrap_or_else(|e| panic!("{values}: {e}"));
        let from_ours = Config::parse(&ours, "ours").unwrap_or_else(|e| panic!("{values}: {e}"));
        assert_eq!(
            from_ours, from_helm,
            "{values}:\n--- helm:\n{}\n--- config check --values:\n{ours}",
            rendered[0]
        );
    }
}
