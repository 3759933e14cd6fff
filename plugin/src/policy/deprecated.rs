//! Annotation values as they were spelled before 2026-11-25, when they took Kubernetes'
//! CamelCase for enum values (as `resizePolicy`'s `NotRequired`, `RestartContainer`): a pod
//! created before an upgrade keeps working as it asked, as Kubernetes keeps a renamed field
//! working for a deprecation period. The old spelling is read as the new one and reported
//! ([`DeprecatedSpelling`]); the parsers ask [`decrease_alias`] and [`mode_alias`].
//!
//! Below the parsers (`memory_decrease.rs`, `pod_level.rs`) and `validate.rs`, which finds them
//! on a pod; imports none of them.

use super::annotation::sanitize_key;

/// `memory-decrease.nri-resize.io/...` before 2026-11-25.
const DECREASE: [(&str, &str); 3] = [
    ("reclaim", "Reclaim"),
    ("restart", "Restart"),
    ("reject", "Reject"),
];

/// `resize-mode.nri-resize.io/pod` before 2026-11-25.
const MODE: [(&str, &str); 2] = [("enforce", "Enforce"), ("observe", "Observe")];

fn alias(table: &[(&str, &'static str)], value: &str) -> Option<&'static str> {
    let value = value.trim();
    table
        .iter()
        .find(|(old, _)| *old == value)
        .map(|(_, current)| *current)
}

/// The current spelling of a memory-decrease value written the old way (`reject` → `Reject`).
pub(super) fn decrease_alias(value: &str) -> Option<&'static str> {
    alias(&DECREASE, value)
}

/// The current spelling of a resize-mode value written the old way (`observe` → `Observe`).
pub(super) fn mode_alias(value: &str) -> Option<&'static str> {
    alias(&MODE, value)
}

/// An annotation value in its old spelling, read as the current one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: {written:?} is the deprecated spelling of {current:?}, read as {current:?}; write {current:?}")]
pub struct DeprecatedSpelling {
    /// The annotation key.
    pub annotation: String,
    /// The value as the pod writes it.
    pub written: String,
    /// The spelling it is read as.
    pub current: &'static str,
}

impl DeprecatedSpelling {
    /// `annotation` holding `value`, when `value` is an old spelling under `lookup`.
    pub(super) fn of(
        annotation: &str,
        value: &str,
        lookup: fn(&str) -> Option<&'static str>,
    ) -> Option<Self> {
        lookup(value).map(|current| DeprecatedSpelling {
            annotation: sanitize_key(annotation),
            written: value.trim().to_string(),
            current,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_old_spelling_reads_as_the_new_one_and_nothing_else_does() {
        for (old, new) in DECREASE {
            assert_eq!(decrease_alias(old), Some(new));
            assert_eq!(decrease_alias(&format!(" {old} ")), Some(new));
            assert_eq!(
                decrease_alias(new),
                None,
                "the current spelling is no alias"
            );
        }
        for (old, new) in MODE {
            assert_eq!(mode_alias(old), Some(new));
            assert_eq!(mode_alias(new), None);
        }
        for other in ["REJECT", "rejects", "", "Reclaim ", "enforce-ish"] {
            assert_eq!(
                decrease_alias(other).or(mode_alias(other)),
                None,
                "{other:?}"
            );
        }
    }

    #[test]
    fn the_report_says_what_to_write() {
        let d = DeprecatedSpelling::of(
            "memory-decrease.nri-resize.io/pod",
            "reject",
            decrease_alias,
        )
        .expect("old spelling");
        assert_eq!(
            d.to_string(),
            "annotation memory-decrease.nri-resize.io/pod: \"reject\" is the deprecated spelling of \"Reject\", read as \"Reject\"; write \"Reject\""
        );
        assert!(DeprecatedSpelling::of("k", "Reject", decrease_alias).is_none());
    }
}
