//! `nri-resize config check <file>`: a configuration file through the daemon's own reading
//! ([`Config::load`], what `run --config` does), and, where it fails, the key and the line at
//! fault. The verdict is the daemon's parser's alone; locating the fault is a second reading of
//! the same text that only adds where (TOML spans from the `toml` crate).
//!
//! A configuration the daemon accepts may still hold values that cannot be meant (`1Ei` of
//! reserve, `512m` bytes): those are warnings ([`warnings`]), printed with their place as errors
//! are, and the check still passes. `--values` checks the Helm chart's values file: its
//! `config:` written as the chart writes it ([`values`]), places given in the YAML.

use std::fmt::Write as _;
use std::ops::Range;
use std::path::Path;

use crate::config::{Config, ConfigError};

pub mod values;
pub mod warnings;

pub use warnings::{Machine, Warning, MEMORY_KEYS};

/// A configuration the daemon would run with, and what in it cannot be meant.
#[derive(Debug)]
pub struct Checked {
    pub config: Config,
    pub warnings: Vec<Located>,
}

/// A warning with its place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub warning: Warning,
    /// 1-based line and column of its key.
    pub at: Option<(usize, usize)>,
}

impl Located {
    /// `file:line:column: warning: key `k`: message`, as errors are printed.
    pub fn render(&self, path: &str) -> String {
        let mut out = path.to_string();
        if let Some((line, column)) = self.at {
            let _ = write!(out, ":{line}:{column}");
        }
        let _ = write!(
            out,
            ": warning: key `{}`: {}",
            self.warning.key, self.warning.message
        );
        out
    }
}

/// A configuration the daemon would refuse, with where in the file.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.render())]
pub struct CheckError {
    /// The file, as given.
    pub path: String,
    /// The dotted key at fault (`resize.mode`), when it could be found.
    pub key: Option<String>,
    /// 1-based line and column of that key (or of the value or syntax error at fault).
    pub at: Option<(usize, usize)>,
    /// What the daemon's parser said.
    pub cause: ConfigError,
}

impl CheckError {
    fn render(&self) -> String {
        let message = match &self.cause {
            ConfigError::Parse { message, .. } | ConfigError::Invalid { message, .. } => {
                message.clone()
            }
            read @ ConfigError::Read { .. } => return read.to_string(),
        };
        let mut out = self.path.clone();
        if let Some((line, column)) = self.at {
            let _ = write!(out, ":{line}:{column}");
        }
        if let Some(key) = &self.key {
            let _ = write!(out, ": key `{key}`");
        }
        let _ = write!(out, ": {message}");
        out
    }
}

/// Checks `path` as `nri-resize run --config <path>` reads it: the configuration the daemon
/// would run with and its warnings (on this machine's size), or why it would refuse to start.
pub fn check_file(path: &Path) -> Result<Checked, Box<CheckError>> {
    check_file_on(path, Machine::this())
}

/// [`check_file`] for a machine of the given size.
pub fn check_file_on(path: &Path, machine: Machine) -> Result<Checked, Box<CheckError>> {
    let config = Config::load(path).map_err(|cause| {
        let (key, at) = match &cause {
            ConfigError::Read { .. } => (None, None),
            ConfigError::Parse { .. } | ConfigError::Invalid { .. } => {
                std::fs::read_to_string(path).map_or((None, None), |text| locate(&text, &cause))
            }
        };
        Box::new(CheckError {
            path: path.display().to_string(),
            key,
            at,
            cause,
        })
    })?;
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let raw: toml::Table = toml::from_str(&text).unwrap_or_default();
    let entries = keys(&text);
    let warnings = warnings::warnings(&config, &raw, machine)
        .into_iter()
        .map(|warning| {
            let at = entries
                .iter()
                .find(|e| e.path == warning.key)
                .map(|e| line_column(&text, e.key.start));
            Located { warning, at }
        })
        .collect();
    Ok(Checked {
        config,
        warnings: in_file_order(warnings),
    })
}

/// Warnings in the order of their lines, as a person reads the file.
fn in_file_order(mut warnings: Vec<Located>) -> Vec<Located> {
    warnings.sort_by_key(|w| w.at.unwrap_or((usize::MAX, 0)));
    warnings
}

/// Checks the Helm chart's values file at `path`: the configuration the chart would write for
/// it (`config:`, `mode`, `kubeletConfigFile`), read as the daemon reads it, with errors and
/// warnings placed in the YAML.
pub fn check_values_on(path: &Path, machine: Machine) -> Result<Checked, Box<CheckError>> {
    let shown = path.display().to_string();
    let fail = |key: Option<String>, at: Option<(usize, usize)>, cause: ConfigError| {
        Box::new(CheckError {
            path: shown.clone(),
            key,
            at,
            cause,
        })
    };
    let yaml = std::fs::read_to_string(path).map_err(|source| {
        fail(
            None,
            None,
            ConfigError::Read {
                path: path.to_path_buf(),
                source,
            },
        )
    })?;
    let text = values::chart_config(&yaml).map_err(|e| {
        fail(
            None,
            None,
            ConfigError::Parse {
                origin: shown.clone(),
                message: e.to_string(),
            },
        )
    })?;
    let place = |key: &str| values::position(&yaml, &values::values_key(key));
    let config = Config::parse(&text, &shown).map_err(|cause| {
        let (key, _) = locate(&text, &cause);
        let at = key.as_deref().and_then(place);
        let key = key.map(|k| values::values_key(&k).join("."));
        fail(key, at, cause)
    })?;
    let raw: toml::Table = toml::from_str(&text).unwrap_or_default();
    let warnings = warnings::warnings(&config, &raw, machine)
        .into_iter()
        .map(|mut warning| {
            let at = place(&warning.key);
            warning.key = values::values_key(&warning.key).join(".");
            Located { warning, at }
        })
        .collect();
    Ok(Checked {
        config,
        warnings: in_file_order(warnings),
    })
}

/// Where in `text` the daemon's parser found `cause`: the key and its line and column.
fn locate(text: &str, cause: &ConfigError) -> (Option<String>, Option<(usize, usize)>) {
    let keys = keys(text);
    // Unknown keys, values of the wrong type and syntax: the same text read straight into the
    // configuration (every table has defaults, as in the daemon's reading) gives the span.
    if let Err(e) = toml::from_str::<Config>(text) {
        let Some(span) = e.span() else {
            return (None, None);
        };
        let key = keys
            .iter()
            .filter(|k| k.key.contains(&span.start) || k.value.contains(&span.start))
            .min_by_key(|k| k.value.end - k.key.start);
        return match key {
            Some(k) => (Some(k.path.clone()), Some(line_column(text, k.key.start))),
            None => (None, Some(line_column(text, span.start))),
        };
    }
    // A value out of range: the validation's message names the key (`journal_size`,
    // `memory_decrease.timeout`; a second key of the same table by its own name).
    let ConfigError::Invalid { message, .. } = cause else {
        return (None, None);
    };
    let named = |word: &str| {
        message
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .any(|w| w == word)
    };
    let found = keys.iter().find(|k| named(&k.path)).or_else(|| {
        keys.iter().find(|k| match k.path.rsplit_once('.') {
            Some((table, leaf)) => named(leaf) && message.contains(&format!("{table}.")),
            None => false,
        })
    });
    found.map_or((None, None), |k| {
        (Some(k.path.clone()), Some(line_column(text, k.key.start)))
    })
}

/// A key of the document: its dotted path and the byte ranges of the key and of its value.
struct Entry {
    path: String,
    key: Range<usize>,
    value: Range<usize>,
}

/// Every key of `text` (tables and leaves, inline tables included); none when it does not parse.
fn keys(text: &str) -> Vec<Entry> {
    fn walk(table: &toml::de::DeTable<'_>, prefix: &str, out: &mut Vec<Entry>) {
        for (k, v) in table {
            let path = if prefix.is_empty() {
                k.get_ref().to_string()
            } else {
                format!("{prefix}.{}", k.get_ref())
            };
            out.push(Entry {
                path: path.clone(),
                key: k.span(),
                value: v.span(),
            });
            if let toml::de::DeValue::Table(t) = v.get_ref() {
                walk(t, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    if let Ok(doc) = toml::de::DeTable::parse(text) {
        walk(doc.get_ref(), "", &mut out);
    }
    out
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<Config, Box<CheckError>> {
        check_full(text).map(|c| c.config)
    }

    fn check_full(text: &str) -> Result<Checked, Box<CheckError>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).expect("write");
        check_file_on(&path, Machine::default())
    }

    fn check_values(yaml: &str) -> Result<Checked, Box<CheckError>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("values.yaml");
        std::fs::write(&path, yaml).expect("write");
        check_values_on(&path, Machine::default())
    }

    #[test]
    fn a_warning_has_its_file_line_and_column() {
        let checked = check_full("journal_size = 7\n\n[resize]\nreserved_memory = \"512m\"\n")
            .expect("valid: a warning, not an error");
        let [w] = &checked.warnings[..] else {
            panic!("{:?}", checked.warnings)
        };
        assert_eq!(w.at, Some((4, 1)));
        let text = w.render("c.toml");
        assert!(
            text.starts_with(
                "c.toml:4:1: warning: key `resize.reserved_memory`: \"512m\" is 512 milli-bytes"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_values_file_is_checked_as_the_chart_writes_it() {
        let ok = check_values("mode: Observe\nconfig:\n  resize:\n    reserved_memory: 1Gi\n")
            .expect("valid");
        assert_eq!(ok.config.resize.mode, crate::config::Mode::Observe);
        let err =
            check_values("config:\n  journal_size: 4\n  resize:\n    reserved_memory: 1.5Gx\n")
                .unwrap_err();
        assert_eq!(err.at, Some((4, 5)), "{err}");
        assert_eq!(
            err.key.as_deref(),
            Some("config.resize.reserved_memory"),
            "{err}"
        );
        assert!(err.to_string().contains("values.yaml:4:5"), "{err}");
        let err = check_values("config:\n  resize:\n    mod: Observe\n").unwrap_err();
        assert_eq!(err.at, Some((3, 5)), "{err}");
        let err = check_values("mode: observe\n").unwrap_err();
        assert_eq!(err.at, Some((1, 1)), "{err}");
        let warned = check_values("config:\n  resize:\n    reserved_memory: 1Ei\n").expect("valid");
        let [w] = &warned.warnings[..] else {
            panic!("{:?}", warned.warnings)
        };
        assert_eq!(w.at, Some((3, 5)));
        assert_eq!(w.warning.key, "config.resize.reserved_memory");
    }

    #[test]
    fn a_good_file_is_the_daemons_configuration() {
        let cfg = check("journal_size = 7\n[resize]\nmode = \"Observe\"\n").expect("valid");
        assert_eq!(
            check_full(&crate::config::default_toml())
                .expect("valid")
                .warnings,
            [],
            "`config default` is accepted without a warning"
        );
        assert_eq!(
            cfg,
            Config::parse("journal_size = 7\n[resize]\nmode = \"Observe\"\n", "t").unwrap()
        );
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        let err = check("journal_size = 7\n\n[resize]\nmod = \"observe\"\n").unwrap_err();
        assert_eq!(err.key.as_deref(), Some("resize.mod"), "{err}");
        assert_eq!(err.at, Some((4, 1)), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(":4:1: key `resize.mod`") && text.contains("unknown field"),
            "{text}"
        );
    }

    #[test]
    fn a_value_of_the_wrong_kind_is_named_with_its_line() {
        let err =
            check("[memory_decrease]\nstrategy = \"Reclaim\"\ntimeout = \"long\"\n").unwrap_err();
        assert_eq!(err.key.as_deref(), Some("memory_decrease.timeout"), "{err}");
        assert_eq!(err.at, Some((3, 1)), "{err}");
        let err = check("[policy]\nmemory = { decrease = \"Sometimes\" }\n").unwrap_err();
        assert_eq!(err.key.as_deref(), Some("policy.memory.decrease"), "{err}");
        assert_eq!(err.at, Some((2, 12)), "{err}");
    }

    #[test]
    fn a_value_out_of_range_is_named_with_its_line() {
        let err = check("[resize]\nmode = \"Enforce\"\n\n[memory_decrease]\ntimeout = \"10ms\"\n")
            .unwrap_err();
        assert_eq!(err.key.as_deref(), Some("memory_decrease.timeout"), "{err}");
        assert_eq!(err.at, Some((5, 1)), "{err}");
        assert!(err.to_string().contains("1s..=1h"), "{err}");
        let err =
            check("[memory_decrease]\nstrategy = \"Reclaim\"\nheadroom = \"1Ti\"\n").unwrap_err();
        assert_eq!(
            err.key.as_deref(),
            Some("memory_decrease.headroom"),
            "{err}"
        );
        assert_eq!(err.at, Some((3, 1)), "{err}");
    }

    #[test]
    fn a_syntax_error_has_its_line() {
        let err = check("journal_size = 7\n[resize\n").unwrap_err();
        assert_eq!(err.at.map(|(line, _)| line), Some(2), "{err}");
    }

    #[test]
    fn a_missing_file_says_so() {
        let err = check_file(Path::new("/nonexistent/nri-resize.toml")).unwrap_err();
        assert!(matches!(err.cause, ConfigError::Read { .. }), "{err}");
        assert!(
            err.to_string().contains("/nonexistent/nri-resize.toml"),
            "{err}"
        );
    }
}
