//! The annotations nri-resize reads: their names, the errors they yield, and the checks every
//! untrusted value goes through before a parser sees it (size, ASCII, not empty) and before a
//! token is repeated in a message (truncated, escaped).
//!
//! Below the parsers (`resize_policy.rs`, `memory_decrease.rs`) and `validate.rs`; imports none
//! of them.

/// Annotation prefix of per-container resize policies: `resize-policy.nri-resize.io/container.<name>`.
pub const CONTAINER_POLICY_PREFIX: &str = "resize-policy.nri-resize.io/container.";
/// Annotation holding the pod-wide default resize policy.
pub const POD_POLICY_ANNOTATION: &str = "resize-policy.nri-resize.io/pod";
/// Annotation holding the pod's resize action.
pub const ACTION_ANNOTATION: &str = "resize-action.nri-resize.io/pod";
/// Every annotation nri-resize reads starts with one of these.
pub const ANNOTATION_PREFIXES: [&str; 4] = [
    "resize-policy.nri-resize.io/",
    "resize-action.nri-resize.io/",
    "memory-decrease.nri-resize.io/",
    "trim.nri-resize.io/",
];
/// Largest annotation value accepted, in bytes.
pub const MAX_ANNOTATION_VALUE_BYTES: usize = 4096;

/// Annotation prefix of per-container memory-decrease strategies.
pub const CONTAINER_DECREASE_PREFIX: &str = "memory-decrease.nri-resize.io/container.";
/// Annotation holding the pod-wide memory-decrease strategy.
pub const POD_DECREASE_ANNOTATION: &str = "memory-decrease.nri-resize.io/pod";
/// Annotation lowering the stall ceiling of the pod's paced reclaims (`0.02`).
pub const MAX_STALL_ANNOTATION: &str = "memory-decrease.nri-resize.io/max-stall";

/// Annotation opting the pod's containers in to or out of working-set trimming (`on`, `off`).
pub const TRIM_ANNOTATION: &str = "trim.nri-resize.io/pod";
/// Annotation lowering the stall target of the pod's trimming (`0.1%` or `0.001`).
pub const TRIM_MAX_STALL_ANNOTATION: &str = "trim.nri-resize.io/max-stall";

/// How much of an untrusted token an error message repeats.
const MAX_TOKEN_IN_MESSAGE: usize = 64;

/// Why (part of) an annotation was not applied. Each names the annotation and, where there is
/// one, the offending token (truncated to 64 characters, escaped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// The value is empty or only whitespace.
    #[error("annotation {annotation}: value is empty")]
    Empty {
        /// The annotation key.
        annotation: String,
    },
    /// The value is longer than [`MAX_ANNOTATION_VALUE_BYTES`].
    #[error("annotation {annotation}: value is {len} bytes, more than the {max} allowed")]
    TooLong {
        /// The annotation key.
        annotation: String,
        /// Its length in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The value holds a non-ASCII character.
    #[error("annotation {annotation}: non-ASCII character at byte {at}")]
    NonAscii {
        /// The annotation key.
        annotation: String,
        /// Byte offset of the first non-ASCII byte.
        at: usize,
    },
    /// An entry is not `key=value`.
    #[error("annotation {annotation}: malformed entry {token:?}, expected <resource>[.<direction>]=<policy>")]
    Malformed {
        /// The annotation key.
        annotation: String,
        /// The entry.
        token: String,
    },
    /// An entry's key is not `cpu`, `memory`, or one of them with `.increase` / `.decrease`.
    #[error("annotation {annotation}: unknown key {token:?}, expected cpu, memory, cpu.increase, cpu.decrease, memory.increase or memory.decrease")]
    UnknownKey {
        /// The annotation key.
        annotation: String,
        /// The unknown key.
        token: String,
    },
    /// A value is not one of the allowed ones.
    #[error("annotation {annotation}: unknown value {token:?}, expected {expected}")]
    UnknownValue {
        /// The annotation key.
        annotation: String,
        /// The unknown value.
        token: String,
        /// The allowed values.
        expected: &'static str,
    },
    /// The same key appears twice in one annotation.
    #[error("annotation {annotation}: key {token:?} given more than once")]
    DuplicateKey {
        /// The annotation key.
        annotation: String,
        /// The repeated key.
        token: String,
    },
    /// An annotation under an nri-resize prefix that nri-resize does not know (a typo?).
    #[error("unknown annotation {annotation}, expected {POD_POLICY_ANNOTATION}, {ACTION_ANNOTATION}, {CONTAINER_POLICY_PREFIX}<container>, {POD_DECREASE_ANNOTATION}, {CONTAINER_DECREASE_PREFIX}<container>, {MAX_STALL_ANNOTATION}, {TRIM_ANNOTATION} or {TRIM_MAX_STALL_ANNOTATION}")]
    UnknownAnnotation {
        /// The annotation key.
        annotation: String,
    },
    /// A well-formed setting asked for less than the node default; the node default applies.
    #[error("annotation {annotation}: {key}={requested} is looser than the node default {node_default}, which applies")]
    LooserThanNodeDefault {
        /// The annotation key.
        annotation: String,
        /// The setting (`cpu.decrease`, `action`, ...).
        key: String,
        /// What the annotation asked for.
        requested: &'static str,
        /// The node default that applies instead.
        node_default: &'static str,
    },
    /// A number above the node default where only a lower one may be asked for; the node
    /// default applies.
    #[error("annotation {annotation}: {requested} is looser than the node default {node_default}, which applies")]
    LooserValue {
        /// The annotation key.
        annotation: String,
        /// What the annotation asked for.
        requested: String,
        /// The node default that applies instead.
        node_default: String,
    },
    /// The node does not allow policy annotations.
    #[error("annotation {annotation}: policy annotations are disabled on this node, ignored")]
    Disabled {
        /// The annotation key.
        annotation: String,
    },
}

pub(super) fn check_value<'a>(
    annotation: &str,
    value: &'a str,
) -> Result<&'a str, AnnotationError> {
    if value.len() > MAX_ANNOTATION_VALUE_BYTES {
        return Err(AnnotationError::TooLong {
            annotation: sanitize_key(annotation),
            len: value.len(),
            max: MAX_ANNOTATION_VALUE_BYTES,
        });
    }
    if let Some(at) = value.bytes().position(|b| !b.is_ascii()) {
        return Err(AnnotationError::NonAscii {
            annotation: sanitize_key(annotation),
            at,
        });
    }
    let v = value.trim();
    if v.is_empty() {
        return Err(AnnotationError::Empty {
            annotation: sanitize_key(annotation),
        });
    }
    Ok(v)
}

/// An untrusted token made safe to repeat in a message: at most 64 characters (then `...`),
/// non-ASCII and control characters replaced by `?`.
pub(super) fn sanitize(s: &str) -> String {
    sanitize_to(s, MAX_TOKEN_IN_MESSAGE)
}

/// Like [`sanitize`], for annotation keys (up to 316 bytes in Kubernetes).
pub(super) fn sanitize_key(s: &str) -> String {
    sanitize_to(s, 320)
}

fn sanitize_to(s: &str, limit: usize) -> String {
    let mut out: String = s
        .chars()
        .take(limit)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    if s.chars().nth(limit).is_some() {
        out.push_str("...");
    }
    out
}

/// Helpers shared by the annotation parsers' tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::collections::BTreeMap;

    use super::CONTAINER_POLICY_PREFIX;

    /// Pod annotations from `(key, value)` pairs.
    pub(crate) fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    /// The per-container resize-policy annotation key of container `name`.
    pub(crate) fn ckey(name: &str) -> String {
        format!("{CONTAINER_POLICY_PREFIX}{name}")
    }
}
