//! `config check --values <values.yaml>`: the Helm chart's values file turned into the daemon's
//! TOML as the chart's templates do it (`deploy/helm/nri-resize/templates/_helpers.tpl`,
//! `nri-resize.config`), and positions in the YAML for the keys the check names.
//!
//! The file is read as `helm install -f <file>` reads it: over the chart's own `values.yaml`
//! (built in from `deploy/helm/nri-resize/values.yaml`), maps merged key by key and a `null`
//! removing the default. The chart writes `.Values.config` as TOML (null values left out, whole
//! numbers as integers), sets `[resize] mode` from `.Values.mode` and, when `kubeletConfigFile`
//! is set, `[kubelet] config_file` to where it mounts that file (`/etc/kubelet/<basename>`).
//! `tests/tests/deploy_manifests.rs` holds this against Helm's own rendering.

use std::path::Path;

/// Why a values file could not be turned into a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ValuesError {
    #[error("not a YAML values file: {0}")]
    Yaml(String),
    #[error("`config` must be a mapping of the daemon's configuration, got {0}")]
    NotAMapping(String),
    #[error("config.{key}: {value} cannot be written as TOML (the chart fails on it too)")]
    Unwritable { key: String, value: String },
}

/// The chart's default values, which a values file is read over.
const CHART_VALUES: &str = include_str!("../../../deploy/helm/nri-resize/values.yaml");

/// Helm's coalescing of a values file over the chart's: maps merge key by key, a `null` removes
/// the default, anything else replaces it.
fn coalesce(base: &mut serde_json::Value, over: serde_json::Value) {
    use serde_json::Value as J;
    match (base, over) {
        (J::Object(b), J::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(&k);
                } else if let Some(slot) = b.get_mut(&k) {
                    coalesce(slot, v);
                } else {
                    b.insert(k, v);
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// Where the chart mounts kubelet's configuration file (`nri-resize.kubeletConfigMount`).
fn kubelet_mount(file: &str) -> String {
    let base = Path::new(file)
        .file_name()
        .map_or_else(|| file.to_string(), |b| b.to_string_lossy().into_owned());
    format!("/etc/kubelet/{base}")
}

fn to_toml(v: &serde_json::Value, key: &str) -> Result<Option<toml::Value>, ValuesError> {
    use serde_json::Value as J;
    Ok(Some(match v {
        J::Null => return Ok(None),
        J::Bool(b) => toml::Value::Boolean(*b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                toml::Value::Integer(i)
            } else if let Some(f) = n.as_f64() {
                // Whole numbers are written as integers, as the chart does.
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "only whole numbers well within i64 take this path"
                )]
                if f.fract() == 0.0 && f.abs() < 9.0e15 {
                    toml::Value::Integer(f as i64)
                } else {
                    toml::Value::Float(f)
                }
            } else {
                return Err(ValuesError::Unwritable {
                    key: key.to_string(),
                    value: n.to_string(),
                });
            }
        }
        J::String(s) => toml::Value::String(s.clone()),
        J::Array(a) => toml::Value::Array(
            a.iter()
                .enumerate()
                .filter_map(|(i, e)| to_toml(e, &format!("{key}[{i}]")).transpose())
                .collect::<Result<_, _>>()?,
        ),
        J::Object(o) => {
            let mut t = toml::Table::new();
            for (k, v) in o {
                let path = if key.is_empty() {
                    k.clone()
                } else {
                    format!("{key}.{k}")
                };
                if let Some(v) = to_toml(v, &path)? {
                    t.insert(k.clone(), v);
                }
            }
            toml::Value::Table(t)
        }
    }))
}

/// The daemon's configuration the chart writes for the values in `yaml` (over the chart's own
/// defaults), as TOML text.
pub fn chart_config(yaml: &str) -> Result<String, ValuesError> {
    let over: serde_json::Value =
        serde_norway::from_str(yaml).map_err(|e| ValuesError::Yaml(e.to_string()))?;
    let mut values: serde_json::Value = serde_norway::from_str(CHART_VALUES)
        .map_err(|e| ValuesError::Yaml(format!("the chart's own values.yaml: {e}")))?;
    match over {
        serde_json::Value::Null => {}
        over @ serde_json::Value::Object(_) => coalesce(&mut values, over),
        other => return Err(ValuesError::Yaml(format!("not a mapping: {other}"))),
    }
    let config = match values.get("config") {
        None | Some(serde_json::Value::Null) => toml::Table::new(),
        Some(v @ serde_json::Value::Object(_)) => match to_toml(v, "")? {
            Some(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        },
        Some(other) => return Err(ValuesError::NotAMapping(other.to_string())),
    };
    let mut config = config;
    let mode = values
        .get("mode")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("Enforce");
    let resize = config
        .entry("resize")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if !resize.is_table() {
        *resize = toml::Value::Table(toml::Table::new());
    }
    if let Some(t) = resize.as_table_mut() {
        t.insert("mode".into(), toml::Value::String(mode.to_string()));
    }
    if let Some(file) = values
        .get("kubeletConfigFile")
        .and_then(serde_json::Value::as_str)
        .filter(|f| !f.is_empty())
    {
        let kubelet = config
            .entry("kubelet")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if !kubelet.is_table() {
            *kubelet = toml::Value::Table(toml::Table::new());
        }
        if let Some(t) = kubelet.as_table_mut() {
            t.insert(
                "config_file".into(),
                toml::Value::String(kubelet_mount(file)),
            );
        }
    }
    toml::to_string(&config).map_err(|e| ValuesError::Unwritable {
        key: String::new(),
        value: e.to_string(),
    })
}

/// The values-file key a configuration key comes from: `config.<key>`, but `mode` for
/// `resize.mode` and `kubeletConfigFile` for `kubelet.config_file` (the chart sets both).
pub fn values_key(config_key: &str) -> Vec<String> {
    match config_key {
        "resize.mode" => vec!["mode".into()],
        "kubelet.config_file" => vec!["kubeletConfigFile".into()],
        k => std::iter::once("config".to_string())
            .chain(k.split('.').map(ToString::to_string))
            .collect(),
    }
}

/// 1-based line and column of the block-mapping key at `path` in `yaml`, or of the deepest
/// part of it that is there (a flow mapping, `memory: { decrease: X }`, gives its parent).
pub fn position(yaml: &str, path: &[String]) -> Option<(usize, usize)> {
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut best: Option<(usize, (usize, usize))> = None;
    for (n, line) in yaml.lines().enumerate() {
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') || body.starts_with('-') {
            continue;
        }
        let indent = line.len() - body.len();
        let Some((key, _)) = body.split_once(':') else {
            continue;
        };
        let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        stack.push((indent, key.to_string()));
        let depth = stack.len();
        let matches = depth <= path.len() && stack.iter().zip(path).all(|((_, k), p)| k == p);
        if matches && best.is_none_or(|(d, _)| depth > d) {
            best = Some((depth, (n + 1, indent + 1)));
        }
    }
    best.map(|(_, at)| at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_charts_own_values_give_its_configuration() {
        let yaml = include_str!("../../../deploy/helm/nri-resize/values.yaml");
        let text = chart_config(yaml).expect("values");
        let cfg = Config::parse(&text, "values.yaml").expect("the chart's default config");
        assert_eq!(cfg.resize.mode, crate::config::Mode::Enforce);
        assert_eq!(cfg.resize.reserved_memory, 1 << 30, "{text}");
    }

    #[test]
    fn a_values_file_is_read_over_the_charts_defaults() {
        // Not given: the chart's default (reserved_memory 1Gi), not the daemon's (0).
        let cfg = Config::parse(&chart_config("mode: Observe\n").expect("values"), "t").unwrap();
        assert_eq!(cfg.resize.reserved_memory, 1 << 30);
        assert_eq!(cfg.resize.mode, crate::config::Mode::Observe);
        // Given: replaces it, the rest of the map stays; null removes the default.
        let text =
            chart_config("config:\n  resize:\n    reserved_memory: 2Gi\n  journal_size: ~\n")
                .expect("values");
        let cfg = Config::parse(&text, "t").unwrap();
        assert_eq!(cfg.resize.reserved_memory, 2 << 30);
        assert_eq!(cfg.resize.max_attempts, 5);
        assert_eq!(cfg.journal_size, Config::default().journal_size);
        assert!(!text.contains("journal_size"), "{text}");
    }

    #[test]
    fn mode_and_kubelet_file_are_set_as_the_chart_sets_them() {
        let text = chart_config(
            "mode: Observe\nkubeletConfigFile: /var/lib/kubelet/config.yaml\nconfig:\n  journal_size: 64.0\n  resize:\n    reserved_cpu: 0.5\n  verdict:\n    window: ~\n",
        )
        .expect("values");
        let cfg = Config::parse(&text, "t").expect(&text);
        assert_eq!(cfg.resize.mode, crate::config::Mode::Observe);
        assert_eq!(cfg.journal_size, 64);
        assert_eq!(cfg.resize.reserved_cpu_millicores, 500);
        assert_eq!(
            cfg.kubelet.config_file,
            std::path::PathBuf::from("/etc/kubelet/config.yaml")
        );
        assert!(matches!(
            chart_config("config: [1, 2]\n"),
            Err(ValuesError::NotAMapping(_))
        ));
    }

    #[test]
    fn keys_are_found_where_the_values_file_has_them() {
        let yaml = "# c\nmode: Enforce\nconfig:\n  journal_size: 1\n  resize:\n    # reserve\n    reserved_memory: 1Gi\n  policy:\n    memory: { decrease: NotRequired }\nresources:\n  resize:\n    reserved_memory: x\n";
        let at = |k: &str| position(yaml, &values_key(k));
        assert_eq!(at("resize.reserved_memory"), Some((7, 5)));
        assert_eq!(at("journal_size"), Some((4, 3)));
        assert_eq!(at("resize.mode"), Some((2, 1)));
        assert_eq!(at("policy.memory.decrease"), Some((9, 5)));
    }
}
