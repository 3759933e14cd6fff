//! The configuration's JSON Schema, generated from [`Config`] by schemars out of the same serde
//! attributes the daemon reads with: every key (unknown ones refused, `additionalProperties:
//! false`), every enum's values, quantities and durations by pattern (`serde_units`). It is the
//! `config` part of the Helm chart's `values.schema.json`, so `helm install` refuses what the
//! daemon would refuse to start with (`config.resize.mod`, `reserved_memory: 1.5Gx`) before a
//! node sees it. Ranges that [`Config`]'s validation checks (`journal_size` within 1..=1000000, a
//! timeout within 1s..=1h) stay the daemon's: `nri-resize config check` reports them.
//!
//! A unit test keeps the chart's copy in step, as the metrics catalog's test does
//! docs/metrics.md; `NRI_RESIZE_BLESS=1 cargo test -p nri-resize --lib config::schema` rewrites it.

use schemars::generate::SchemaSettings;

use super::Config;

/// Where the chart keeps its values' schema, from the workspace root.
pub const CHART_VALUES_SCHEMA: &str = "deploy/helm/nri-resize/values.schema.json";

/// The schema of [`Config`] as the chart's `config` value: draft-07 (what Helm 3 and 4 both
/// validate), every subschema inline (no `$ref`), no `format` (schemars' `uint32` and the like,
/// which validators do not know).
pub fn chart_config_schema() -> serde_json::Value {
    let generator = SchemaSettings::draft07()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut schema = generator.into_root_schema_for::<Config>().to_value();
    if let Some(root) = schema.as_object_mut() {
        root.remove("$schema");
        root.remove("title");
        root.insert(
            "description".into(),
            "The daemon's config.toml as YAML: each map a [table] (plugin/src/config.rs; \
             generated from it by plugin/src/config/schema.rs). [resize] mode comes from `mode`."
                .into(),
        );
    }
    strip_formats(&mut schema);
    schema
}

/// Removes every `format` keyword (only schemars' numeric ones occur here).
fn strip_formats(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            if m.get("format").is_some_and(serde_json::Value::is_string) {
                m.remove("format");
            }
            m.values_mut().for_each(strip_formats);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_formats),
        _ => {}
    }
}

/// `values.schema.json` (its text) with `properties.config` replaced by [`chart_config_schema`],
/// as `serde_json` writes it (keys sorted, two-space indent, a final newline).
pub fn with_config_schema(values_schema: &str) -> Result<String, serde_json::Error> {
    let mut schema: serde_json::Value = serde_json::from_str(values_schema)?;
    schema["properties"]["config"] = chart_config_schema();
    let mut text = serde_json::to_string_pretty(&schema)?;
    text.push('\n');
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUES_SCHEMA: &str = include_str!("../../../deploy/helm/nri-resize/values.schema.json");

    /// The chart's `values.schema.json` carries the schema of today's [`Config`]. With
    /// `NRI_RESIZE_BLESS=1` the file is rewritten instead.
    #[test]
    fn the_charts_values_schema_carries_the_config_schema() {
        let want = with_config_schema(VALUES_SCHEMA).expect("values.schema.json is JSON");
        if std::env::var_os("NRI_RESIZE_BLESS").is_some_and(|v| v == "1") {
            let path = format!("{}/../{CHART_VALUES_SCHEMA}", env!("CARGO_MANIFEST_DIR"));
            std::fs::write(&path, &want).expect("write values.schema.json");
            return;
        }
        assert!(
            VALUES_SCHEMA == want,
            "{CHART_VALUES_SCHEMA} does not carry the configuration's schema (or is not as \
             serde_json writes it); run `NRI_RESIZE_BLESS=1 cargo test -p nri-resize --lib \
             config::schema`"
        );
    }

    /// Checks `schema` against the TOML `table` at `path`: unknown keys refused, every key
    /// described, tables below likewise.
    fn assert_covers(schema: &serde_json::Value, table: &toml::Table, path: &str) {
        assert_eq!(
            schema["additionalProperties"],
            serde_json::Value::Bool(false),
            "{path}: unknown keys refused"
        );
        for (k, v) in table {
            let sub = &schema["properties"][k];
            assert!(sub.is_object(), "{path}.{k} is not in the schema");
            if let toml::Value::Table(t) = v {
                assert_covers(sub, t, &format!("{path}.{k}"));
            }
        }
        let described = schema["properties"]
            .as_object()
            .map_or(0, serde_json::Map::len);
        assert_eq!(
            described,
            table.len(),
            "{path}: the schema's keys are the table's"
        );
    }

    /// Every key of the configuration is in the schema, and every table refuses unknown keys.
    #[test]
    fn every_key_is_described_and_unknown_keys_are_refused() {
        let schema = chart_config_schema();
        let table = toml::Table::try_from(Config::default()).expect("a table");
        assert_covers(&schema, &table, "config");
        let text = serde_json::to_string(&schema).expect("JSON");
        assert!(
            !text.contains("$ref") && !text.contains("\"format\""),
            "{text}"
        );
        // Enums carry their values.
        let mode = serde_json::to_string(&schema["properties"]["resize"]["properties"]["mode"])
            .expect("JSON");
        assert!(
            mode.contains("Enforce") && mode.contains("Observe"),
            "{mode}"
        );
    }
}
