//! The `manifests` tier: render every kustomization under `deploy/` with kustomize and the Helm
//! chart (`deploy/helm/nri-resize`) with Helm's own engine (Helm v4's Go library through PyPI's
//! `helm-python-sdk`; `scripts/helm-chart.py`; on a cluster with and without the Prometheus
//! Operator's API, and every value checked against the chart's `values.schema.json`), lint the chart (`helm lint --strict`), validate
//! every rendering offline against the Kubernetes versions in-place resize runs on with
//! `kubernetes-validate` (all installed by `scripts/setup-host.sh`), and run the structural
//! checks that schemas cannot do (`tests/tests/deploy_manifests.rs`: PodMonitor/ServiceMonitor
//! CRDs, which have no schema there; probes against the metrics port; every shipped
//! configuration through `nri-resize config check`; the chart's default rendering against the
//! kustomize install, object for object; the dashboard's queries against the metrics catalog),
//! and the alerts' own tests with `promtool test rules` (Debian's prometheus package, unpacked by
//! setup).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};

/// The kustomizations, by name in `target/manifests/<name>.yaml`.
pub const KUSTOMIZATIONS: &[(&str, &str)] = &[
    ("all", "deploy"),
    ("base", "deploy/base"),
    ("monitoring", "deploy/monitoring"),
    ("privileged", "deploy/overlays/privileged"),
];

/// The Helm chart.
pub const CHART: &str = "deploy/helm/nri-resize";

/// The API version a cluster with the Prometheus Operator's CRDs serves: the chart renders its
/// PodMonitor, ServiceMonitor and PrometheusRule only where the cluster serves it.
pub const OPERATOR_API: &str = "monitoring.coreos.com/v1";

/// One rendering of the chart that is validated: its name in `target/manifests/<name>.yaml`,
/// its values (JSON over values.yaml), and whether the cluster serves [`OPERATOR_API`].
#[derive(Debug)]
pub struct ChartRendering {
    pub name: &'static str,
    pub values: &'static str,
    pub operator: bool,
}

/// The chart's renderings that are validated: the default (with and without the Operator), the
/// privileged one, every toggle the default leaves off turned on, every knob set.
pub const CHART_RENDERINGS: &[ChartRendering] = &[
    ChartRendering {
        name: "helm-default",
        values: "{}",
        operator: true,
    },
    ChartRendering {
        name: "helm-no-operator",
        values: "{}",
        operator: false,
    },
    ChartRendering {
        name: "helm-privileged",
        values: r#"{"privileged": true}"#,
        operator: true,
    },
    ChartRendering {
        name: "helm-all-toggles",
        values: r#"{"mode": "Observe", "monitoring": {"labels": {"release": "kube-prometheus-stack"}, "serviceMonitor": {"enabled": true}, "scrapeAnnotations": {"enabled": true, "target": "service"}}}"#,
        operator: true,
    },
    ChartRendering {
        name: "helm-no-extras",
        values: r#"{"monitoring": {"podMonitor": {"enabled": false}}, "networkPolicy": {"enabled": false}}"#,
        operator: true,
    },
    ChartRendering {
        name: "helm-knobs",
        values: r#"{"image": {"repository": "registry.example/nri-resize", "tag": "0.1.0", "digest": "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
            "imagePullSecrets": [{"name": "regcred"}], "serviceAccount": {"create": false, "name": "node-agents"},
            "pluginIndex": 10, "extraArgs": ["--observer-interval=2s"],
            "extraEnv": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "updateStrategy": {"type": "OnDelete"}, "podAnnotations": {"example.com/team": "infra"},
            "podLabels": {"team": "infra"}, "fullnameOverride": "resize",
            "monitoring": {"scrapeAnnotations": {"enabled": true, "target": "pod"}},
            "networkPolicy": {"prometheusNamespaces": ["monitoring", "gmp-system"]}}"#,
        operator: false,
    },
];

/// In-place resize is beta from 1.33 and GA in 1.35; 1.37.0 is the newest schema set of the
/// pinned kubernetes-validate (1.37.0).
pub const KUBERNETES_VERSIONS: &[&str] = &["1.33.0", "1.34.0", "1.35.0", "1.37.0"];

fn cache() -> PathBuf {
    std::env::var_os("NRI_RESIZE_CACHE")
        .map_or_else(|| PathBuf::from("/var/cache/nri-resize"), PathBuf::from)
}

/// Renders every kustomization into `<root>/target/manifests/`; returns the files.
pub fn render(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out_dir = root.join("target/manifests");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("create {}", out_dir.display()))?;
    let mut files = Vec::new();
    for (name, dir) in KUSTOMIZATIONS {
        let out = Command::new("kustomize")
            .arg("build")
            .arg(root.join(dir))
            .output()
            .context("run kustomize (Debian trixie package `kustomize`, installed by setup)")?;
        if !out.status.success() {
            bail!(
                "kustomize build {dir} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let file = out_dir.join(format!("{name}.yaml"));
        std::fs::write(&file, &out.stdout).with_context(|| format!("write {}", file.display()))?;
        eprintln!("    rendered {dir} -> {}", file.display());
        files.push(file);
    }
    Ok(files)
}

fn helm_chart_py(root: &Path) -> Command {
    let mut cmd = Command::new(cache().join("venv/bin/python"));
    cmd.arg(root.join("xtask/scripts/helm-chart.py"));
    cmd
}

/// `helm lint --strict` of the chart against every version, with Helm's own linter.
pub fn lint_chart(root: &Path) -> anyhow::Result<()> {
    let mut cmd = helm_chart_py(root);
    cmd.arg("lint").arg(root.join(CHART));
    for v in KUBERNETES_VERSIONS {
        cmd.arg("--kube-version").arg(format!("v{v}"));
    }
    let out = cmd
        .output()
        .context("run xtask/scripts/helm-chart.py (helm-python-sdk, installed by setup)")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("helm lint --strict {CHART} failed:\n{text}");
    }
    eprintln!("    helm lint --strict {CHART}: clean against {KUBERNETES_VERSIONS:?}");
    Ok(())
}

/// Renders the chart with each of [`CHART_RENDERINGS`] into `<root>/target/manifests/`.
pub fn render_chart(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out_dir = root.join("target/manifests");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("create {}", out_dir.display()))?;
    let mut files = Vec::new();
    for ChartRendering {
        name,
        values,
        operator,
    } in CHART_RENDERINGS
    {
        let mut cmd = helm_chart_py(root);
        cmd.arg("render")
            .arg(root.join(CHART))
            .args(["--values", values]);
        if *operator {
            cmd.args(["--api-versions", OPERATOR_API]);
        }
        let out = cmd
            .output()
            .context("run xtask/scripts/helm-chart.py (helm-python-sdk, installed by setup)")?;
        if !out.status.success() {
            bail!(
                "rendering {CHART} with {values} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let file = out_dir.join(format!("{name}.yaml"));
        std::fs::write(&file, &out.stdout).with_context(|| format!("write {}", file.display()))?;
        let cluster = if *operator {
            "with the Operator's CRDs"
        } else {
            "without the Operator's CRDs"
        };
        let values = values.split_whitespace().collect::<Vec<_>>().join(" ");
        eprintln!(
            "    rendered {CHART} ({values}, {cluster}) -> {}",
            file.display()
        );
        files.push(file);
    }
    Ok(files)
}

/// Validates `files` (strict: unknown fields are errors) against every version.
pub fn validate(files: &[PathBuf]) -> anyhow::Result<()> {
    let kv = cache().join("venv/bin/kubernetes-validate");
    for version in KUBERNETES_VERSIONS {
        let out = Command::new(&kv)
            .args(["--strict", "--quiet", "-k", version])
            .args(files)
            .output()
            .with_context(|| format!("run {} (installed by setup)", kv.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Custom resources have no schema in kubernetes-validate: it warns and passes them;
        // the structural test checks them instead.
        let unexpected: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter(|l| !(l.starts_with("WARN") && l.contains("monitoring.coreos.com/v1")))
            .collect();
        if !out.status.success() || !unexpected.is_empty() {
            bail!("manifests do not validate against Kubernetes {version}:\n{text}");
        }
        eprintln!("    valid against Kubernetes {version} (strict); PodMonitor/ServiceMonitor: no schema, checked structurally");
    }
    Ok(())
}

/// `promtool` as setup unpacks it from Debian's prometheus package (never installed).
fn promtool() -> PathBuf {
    cache().join("prometheus/usr/bin/promtool")
}

/// The alerts: `promtool check rules` on the rules file, then `promtool test rules` on its tests
/// (every alert fires in one case and stays silent in another). A failure carries promtool's
/// own output.
pub fn alerts(root: &Path) -> anyhow::Result<()> {
    let dir = root.join("deploy/monitoring");
    let promtool = promtool();
    for args in [
        ["check", "rules", "nri-resize-rules.yaml"],
        ["test", "rules", "nri-resize-rules.test.yaml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .with_context(|| format!("run {} (unpacked by setup)", promtool.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            bail!(
                "promtool {} failed ({}):\n{text}",
                args.join(" "),
                out.status
            );
        }
        eprintln!(
            "    promtool {}: {}",
            args.join(" "),
            text.trim().replace('\n', " ")
        );
    }
    Ok(())
}
