//! Checks every nri-resize annotation of a pod at once, for reporting: each parser on its own
//! annotations, and unknown keys under the nri-resize prefixes (typos).

use std::collections::BTreeMap;

use super::annotation::{
    sanitize_key, AnnotationError, ACTION_ANNOTATION, ANNOTATION_PREFIXES,
    CONTAINER_DECREASE_PREFIX, CONTAINER_POLICY_PREFIX, MAX_STALL_ANNOTATION,
    POD_DECREASE_ANNOTATION, POD_POLICY_ANNOTATION, TRIM_ANNOTATION, TRIM_MAX_STALL_ANNOTATION,
};
use super::deprecated::{decrease_alias, mode_alias, DeprecatedSpelling};
use super::memory_decrease::parse_decrease_annotation;
use super::pacing::parse_max_stall_annotation;
use super::pod_level::POD_MODE_ANNOTATION;
use super::resize_policy::{parse_action_annotation, parse_policy_annotation};
use super::trim_opt_in::{parse_trim_annotation, parse_trim_max_stall};

/// Checks every nri-resize annotation of a pod (all containers' policies, the pod policy, the
/// action, and unknown keys under the nri-resize prefixes). Does not apply the node floor, so
/// it never reports [`AnnotationError::LooserThanNodeDefault`].
pub fn validate_annotations(annotations: &BTreeMap<String, String>) -> Vec<AnnotationError> {
    let mut errors = Vec::new();
    for (key, value) in annotations {
        if !ANNOTATION_PREFIXES.iter().any(|p| key.starts_with(p)) {
            continue;
        }
        let result = if key == ACTION_ANNOTATION {
            parse_action_annotation(key, value).map(|_| ())
        } else if key == TRIM_ANNOTATION {
            parse_trim_annotation(key, value).map(|_| ())
        } else if key == TRIM_MAX_STALL_ANNOTATION {
            parse_trim_max_stall(key, value).map(|_| ())
        } else if key == MAX_STALL_ANNOTATION {
            parse_max_stall_annotation(key, value).map(|_| ())
        } else if key == POD_DECREASE_ANNOTATION
            || key
                .strip_prefix(CONTAINER_DECREASE_PREFIX)
                .is_some_and(|name| !name.is_empty())
        {
            parse_decrease_annotation(key, value).map(|_| ())
        } else if key == POD_POLICY_ANNOTATION
            || key
                .strip_prefix(CONTAINER_POLICY_PREFIX)
                .is_some_and(|name| !name.is_empty())
        {
            parse_policy_annotation(key, value).map(|_| ())
        } else {
            Err(AnnotationError::UnknownAnnotation {
                annotation: sanitize_key(key),
            })
        };
        if let Err(e) = result {
            errors.push(e);
        }
    }
    errors
}

/// The pod's nri-resize annotations written in a spelling of before 2026-11-25 (`reject`,
/// `observe`): each is read as its current spelling, and reported so that its owner rewrites it.
pub fn deprecated_spellings(annotations: &BTreeMap<String, String>) -> Vec<DeprecatedSpelling> {
    annotations
        .iter()
        .filter_map(|(key, value)| {
            if key == POD_DECREASE_ANNOTATION
                || key
                    .strip_prefix(CONTAINER_DECREASE_PREFIX)
                    .is_some_and(|name| !name.is_empty())
            {
                DeprecatedSpelling::of(key, value, decrease_alias)
            } else if key == POD_MODE_ANNOTATION {
                DeprecatedSpelling::of(key, value, mode_alias)
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::annotation::test_support::{ann, ckey};

    #[test]
    fn old_spellings_are_found_and_pass_validation() {
        let a = ann(&[
            (POD_DECREASE_ANNOTATION, "reject"),
            ("memory-decrease.nri-resize.io/container.app", "Restart"),
            ("memory-decrease.nri-resize.io/container.db", "restart"),
            (POD_MODE_ANNOTATION, "observe"),
            (ACTION_ANNOTATION, "LiveResize"),
        ]);
        assert_eq!(validate_annotations(&a), [], "accepted, not malformed");
        let found: Vec<(String, String, &str)> = deprecated_spellings(&a)
            .into_iter()
            .map(|d| (d.annotation, d.written, d.current))
            .collect();
        assert_eq!(
            found,
            [
                (
                    "memory-decrease.nri-resize.io/container.db".to_string(),
                    "restart".to_string(),
                    "Restart"
                ),
                (
                    POD_DECREASE_ANNOTATION.to_string(),
                    "reject".to_string(),
                    "Reject"
                ),
                (
                    POD_MODE_ANNOTATION.to_string(),
                    "observe".to_string(),
                    "Observe"
                ),
            ]
        );
        assert_eq!(
            deprecated_spellings(&ann(&[(POD_DECREASE_ANNOTATION, "Reject")])),
            []
        );
    }

    #[test]
    fn validate_reports_unknown_and_bad_annotations() {
        let a = ann(&[
            (
                "resize-policy.nri-resize.io/contianer.app",
                "cpu=NotRequired",
            ),
            ("resize-policy.nri-resize.io/container.", "cpu=NotRequired"),
            (&ckey("a"), "cpu=NotRequired"),
            (&ckey("b"), "cpu=Nope"),
            (ACTION_ANNOTATION, "LiveResize"),
            ("resize-action.nri-resize.io/container.a", "LiveResize"),
            ("unrelated.io/x", "whatever"),
            (MAX_STALL_ANNOTATION, "0.02"),
        ]);
        let errs = validate_annotations(&a);
        let msgs: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(errs.len(), 4, "{msgs:#?}");
        let bad = validate_annotations(&ann(&[(MAX_STALL_ANNOTATION, "2")]));
        assert_eq!(bad.len(), 1, "{bad:?}");
        let trim = validate_annotations(&ann(&[
            (TRIM_ANNOTATION, "on"),
            (TRIM_MAX_STALL_ANNOTATION, "0.1%"),
            ("trim.nri-resize.io/pdo", "on"),
        ]));
        assert_eq!(trim.len(), 1, "only the typo: {trim:?}");
        assert!(msgs.iter().any(|m| m.contains("contianer.app")));
        assert!(msgs.iter().any(|m| m.contains("Nope")));
    }
}
