//! docs/configuration.md's reference tables, generated from the configuration's own structs:
//! every key with its type, its default and its meaning, the meaning being the field's doc
//! comment. The structs are read as source (`syn`), the defaults from [`Config::default`]
//! written as TOML, so a new key, a changed default or a reworded doc comment changes the
//! tables, and the test below fails until docs/configuration.md carries them
//! (`NRI_RESIZE_BLESS=1 cargo test -p nri-resize --lib config::reference` rewrites the block).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use syn::{Attribute, Expr, Fields, Item, Lit, Meta, Type};

use super::Config;

/// The sources that define the configuration's structs and enums.
const SOURCES: [(&str, &str); 4] = [
    ("plugin/src/config.rs", include_str!("../config.rs")),
    (
        "plugin/src/policy/resize_policy.rs",
        include_str!("../policy/resize_policy.rs"),
    ),
    (
        "plugin/src/policy/memory_decrease.rs",
        include_str!("../policy/memory_decrease.rs"),
    ),
    (
        "plugin/src/policy/share.rs",
        include_str!("../policy/share.rs"),
    ),
];

const BEGIN: &str = "<!-- config-reference: generated from the configuration's structs (plugin/src/config.rs and the policy types it uses) by `cargo test -p nri-resize --lib config::reference`; `NRI_RESIZE_BLESS=1` rewrites it. Do not edit by hand. -->";
const END: &str = "<!-- /config-reference -->";

/// One key of the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyDoc {
    /// The dotted key (`memory_decrease.timeout`).
    pub path: String,
    /// What a person writes (`memory quantity`, `duration`, ``one of `Reclaim`, ...``).
    pub kind: String,
    /// The default, as TOML.
    pub default: String,
    /// The field's doc comment.
    pub meaning: String,
}

/// A section: a table of the configuration (`""` for the top level).
#[derive(Debug)]
pub(crate) struct SectionDoc {
    pub name: String,
    pub about: String,
    pub keys: Vec<KeyDoc>,
}

/// The structs and enums of [`SOURCES`], by name.
struct Types {
    items: BTreeMap<String, Item>,
}

impl Types {
    fn parse() -> Types {
        let mut items = BTreeMap::new();
        for (path, text) in SOURCES {
            let file = syn::parse_file(text).unwrap_or_else(|e| panic!("{path}: {e}"));
            for item in file.items {
                let name = match &item {
                    Item::Struct(s) => s.ident.to_string(),
                    Item::Enum(e) => e.ident.to_string(),
                    _ => continue,
                };
                items.insert(name, item);
            }
        }
        Types { items }
    }
}

/// The doc comment of `attrs`, its lines joined into one paragraph.
fn doc(attrs: &[Attribute]) -> String {
    let mut lines = Vec::new();
    for a in attrs {
        if let Meta::NameValue(nv) = &a.meta {
            if nv.path.is_ident("doc") {
                if let Expr::Lit(l) = &nv.value {
                    if let Lit::Str(s) = &l.lit {
                        lines.push(s.value().trim().to_string());
                    }
                }
            }
        }
    }
    lines.join(" ").trim().to_string()
}

/// The value of `#[serde(<name> = "...")]`, if any.
fn serde_str(attrs: &[Attribute], name: &str) -> Option<String> {
    let mut found = None;
    for a in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = a.parse_nested_meta(|m| {
            if m.path.is_ident(name) {
                let s: syn::LitStr = m.value()?.parse()?;
                found = Some(s.value());
            } else if m.input.peek(syn::Token![=]) {
                let _: Expr = m.value()?.parse()?;
            }
            Ok(())
        });
    }
    found
}

/// The last segment of a path type (`Duration`, `Share`, `MemoryDecreaseStrategy`).
fn type_name(ty: &Type) -> String {
    match ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        _ => String::new(),
    }
}

impl Types {
    /// What a person writes for a field of type `ty` read `with` an adapter.
    fn kind(&self, ty: &str, with: Option<&str>) -> String {
        match with {
            Some("serde_units::memory") => return "memory quantity (`\"512Mi\"`)".into(),
            Some("serde_units::cpu") => return "CPU quantity (`\"500m\"`, `\"1.5\"`)".into(),
            Some("serde_units::millis" | "humantime_serde") => {
                return "duration (`\"60s\"`, `\"100ms\"`)".into()
            }
            _ => {}
        }
        match ty {
            "bool" => "boolean".into(),
            "usize" | "u32" | "u64" => "integer".into(),
            "Share" => "fraction `0.0..=1.0`".into(),
            "PathBuf" => "path".into(),
            "String" => "string".into(),
            other => match self.items.get(other) {
                Some(Item::Enum(e)) => {
                    let variants: Vec<String> = e
                        .variants
                        .iter()
                        .map(|v| format!("`\"{}\"`", v.ident))
                        .collect();
                    format!("one of {}", variants.join(", "))
                }
                _ => panic!("the configuration reference does not know the type {other}"),
            },
        }
    }

    /// The variants' meanings of an enum type, for the meaning column.
    fn variant_docs(&self, ty: &str) -> Option<String> {
        let Some(Item::Enum(e)) = self.items.get(ty) else {
            return None;
        };
        let parts: Vec<String> = e
            .variants
            .iter()
            .map(|v| format!("`{}`: {}", v.ident, doc(&v.attrs)))
            .collect();
        Some(parts.join(" "))
    }

    /// The keys of struct `name` under `prefix`: nested structs as dotted keys.
    fn keys(&self, name: &str, prefix: &str, defaults: &toml::Table, out: &mut Vec<KeyDoc>) {
        let Some(Item::Struct(s)) = self.items.get(name) else {
            panic!("the configuration reference does not find struct {name}");
        };
        let Fields::Named(fields) = &s.fields else {
            panic!("{name} has no named fields");
        };
        for f in &fields.named {
            let ident = f
                .ident
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default();
            let key = serde_str(&f.attrs, "rename").unwrap_or(ident);
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            let ty = type_name(&f.ty);
            let default = defaults.get(&key);
            if let (Some(Item::Struct(_)), Some(toml::Value::Table(t))) =
                (self.items.get(&ty), default)
            {
                self.keys(&ty, &path, t, out);
                continue;
            }
            let with = serde_str(&f.attrs, "with");
            let mut meaning = doc(&f.attrs);
            assert!(
                !meaning.is_empty(),
                "{name}.{key} has no doc comment: the configuration reference needs its meaning"
            );
            if let Some(v) = self.variant_docs(&ty) {
                meaning = format!("{meaning} {v}");
            }
            out.push(KeyDoc {
                path,
                kind: self.kind(&ty, with.as_deref()),
                default: default.map_or_else(|| "—".to_string(), |v| format!("`{v}`")),
                meaning,
            });
        }
    }
}

/// Every section of the configuration with its keys, in the order of [`Config`]'s fields.
pub(crate) fn sections() -> Vec<SectionDoc> {
    let types = Types::parse();
    let defaults = toml::Table::try_from(Config::default()).expect("the default is a table");
    let Some(Item::Struct(config)) = types.items.get("Config") else {
        panic!("no struct Config");
    };
    let Fields::Named(fields) = &config.fields else {
        panic!("Config has no named fields");
    };
    let mut top = SectionDoc {
        name: String::new(),
        about: String::new(),
        keys: Vec::new(),
    };
    let mut tables = Vec::new();
    for f in &fields.named {
        let key = f
            .ident
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default();
        let ty = type_name(&f.ty);
        match (types.items.get(&ty), defaults.get(&key)) {
            (Some(Item::Struct(_)), Some(toml::Value::Table(t))) => {
                let mut keys = Vec::new();
                types.keys(&ty, "", t, &mut keys);
                let about = doc(&f.attrs);
                assert!(!about.is_empty(), "Config.{key} has no doc comment");
                tables.push(SectionDoc {
                    name: key,
                    about,
                    keys,
                });
            }
            (_, default) => {
                let with = serde_str(&f.attrs, "with");
                let meaning = doc(&f.attrs);
                assert!(!meaning.is_empty(), "Config.{key} has no doc comment");
                top.keys.push(KeyDoc {
                    path: key.clone(),
                    kind: types.kind(&ty, with.as_deref()),
                    default: default.map_or_else(|| "—".to_string(), |v| format!("`{v}`")),
                    meaning,
                });
            }
        }
    }
    let mut all = vec![top];
    all.extend(tables);
    all
}

/// A doc comment made safe inside a Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// The reference as docs/configuration.md carries it, markers included.
pub(crate) fn markdown() -> String {
    let mut out = format!("{BEGIN}\n");
    for s in sections() {
        if s.name.is_empty() {
            out.push_str("\n### Top level\n\n");
        } else {
            let _ = write!(out, "\n### `[{}]`\n\n", s.name);
            if !s.about.is_empty() {
                let _ = writeln!(out, "{}\n", s.about);
            }
        }
        out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
        for k in &s.keys {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                k.path,
                cell(&k.kind),
                cell(&k.default),
                cell(&k.meaning)
            );
        }
    }
    out.push('\n');
    out.push_str(END);
    out
}

/// The generated block of `doc`, markers included.
fn block(doc: &str) -> Option<&str> {
    let start = doc.find(BEGIN)?;
    let end = doc[start..].find(END)? + start + END.len();
    Some(&doc[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/configuration.md carries the reference as generated; `NRI_RESIZE_BLESS=1` rewrites
    /// its block instead.
    #[test]
    fn docs_configuration_md_carries_the_generated_reference() {
        let want = markdown();
        if std::env::var_os("NRI_RESIZE_BLESS").is_some_and(|v| v == "1") {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
            let doc = std::fs::read_to_string(path).expect("read docs/configuration.md");
            let have = block(&doc).expect("docs/configuration.md has the config-reference markers");
            let updated = doc.replacen(have, &want, 1);
            std::fs::write(path, updated).expect("write docs/configuration.md");
            return;
        }
        let doc = include_str!("../../../docs/configuration.md");
        let have = block(doc).expect("docs/configuration.md has the config-reference markers");
        assert_eq!(
            have, want,
            "docs/configuration.md's configuration reference is out of date; run \
             `NRI_RESIZE_BLESS=1 cargo test -p nri-resize --lib config::reference`"
        );
    }

    /// Every key the daemon takes is in the reference, and nothing else: the reference's keys
    /// are exactly the leaves of the default configuration written as TOML.
    #[test]
    fn the_reference_lists_every_key_of_the_configuration() {
        fn leaves(t: &toml::Table, prefix: &str, out: &mut Vec<String>) {
            for (k, v) in t {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    toml::Value::Table(t) => leaves(t, &path, out),
                    _ => out.push(path),
                }
            }
        }
        let mut want = Vec::new();
        leaves(
            &toml::Table::try_from(Config::default()).expect("table"),
            "",
            &mut want,
        );
        want.sort();
        let mut have: Vec<String> = sections()
            .iter()
            .flat_map(|s| {
                s.keys.iter().map(|k| {
                    if s.name.is_empty() {
                        k.path.clone()
                    } else {
                        format!("{}.{}", s.name, k.path)
                    }
                })
            })
            .collect();
        have.sort();
        assert_eq!(have, want);
        let names: Vec<String> = sections().into_iter().map(|s| s.name).collect();
        for section in ["memory_decrease", "metrics", "resize", "trim", "kubelet"] {
            assert!(names.iter().any(|n| n == section), "{section}: {names:?}");
        }
    }

    /// The types and defaults read as a person writes them.
    #[test]
    fn kinds_and_defaults_read_as_written() {
        let all = sections();
        let key = |section: &str, path: &str| -> KeyDoc {
            all.iter()
                .find(|s| s.name == section)
                .and_then(|s| s.keys.iter().find(|k| k.path == path))
                .unwrap_or_else(|| panic!("{section}.{path}"))
                .clone()
        };
        let timeout = key("memory_decrease", "timeout");
        assert_eq!(timeout.default, "`\"1m\"`");
        assert!(timeout.kind.starts_with("duration"), "{timeout:?}");
        let reserved = key("resize", "reserved_memory");
        assert!(reserved.kind.starts_with("memory quantity"), "{reserved:?}");
        assert_eq!(reserved.default, "`\"0\"`");
        let strategy = key("memory_decrease", "strategy");
        assert!(
            strategy.kind.contains("`\"Reclaim\"`") && strategy.kind.contains("`\"Reject\"`"),
            "{strategy:?}"
        );
        assert!(strategy.meaning.contains("`Restart`:"), "{strategy:?}");
        let decrease = key("policy", "memory.decrease");
        assert_eq!(decrease.default, "`\"NotRequired\"`");
        assert_eq!(key("metrics", "cadvisor_duplicates").default, "`true`");
    }
}
