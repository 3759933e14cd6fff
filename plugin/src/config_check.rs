//! `nri-resize config check <file>`: a configuration file through the daemon's own reading
//! ([`Config::load`], what `run --config` does), and, where it fails, the key and the line at
//! fault. The verdict is the daemon's parser's alone; locating the fault is a second reading of
//! the same text that only adds where (TOML spans from the `toml` crate).

use std::fmt::Write as _;
use std::ops::Range;
use std::path::Path;

use crate::config::{Config, ConfigError};

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
/// would run with, or why it would refuse to start.
pub fn check_file(path: &Path) -> Result<Config, Box<CheckError>> {
    Config::load(path).map_err(|cause| {
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
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, text).expect("write");
        check_file(&path)
    }

    #[test]
    fn a_good_file_is_the_daemons_configuration() {
        let cfg = check("journal_size = 7\n[resize]\nmode = \"Observe\"\n").expect("valid");
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
