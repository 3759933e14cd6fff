//! Which containers trimming works on, and with what stall target: the node default
//! (`[trim] enabled`, `max_stall`) and the pod's annotations, which opt the pod in or out
//! (`trim.nri-resize.io/pod: on|off`) and may only lower its target
//! (`trim.nri-resize.io/max-stall: 0.1%`). Both only ever affect the pod that carries them.

use std::collections::BTreeMap;

use super::annotation::{
    check_value, sanitize, sanitize_key, AnnotationError, TRIM_ANNOTATION,
    TRIM_MAX_STALL_ANNOTATION,
};
use super::Share;

/// Whether a container is trimmed, and the stall its steps may cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrimChoice {
    pub enabled: bool,
    pub max_stall: Share,
}

/// Parses the opt-in annotation: `on` or `off`.
pub fn parse_trim_annotation(annotation: &str, value: &str) -> Result<bool, AnnotationError> {
    match check_value(annotation, value)? {
        "on" => Ok(true),
        "off" => Ok(false),
        v => Err(AnnotationError::UnknownValue {
            annotation: sanitize_key(annotation),
            token: sanitize(v),
            expected: "on or off",
        }),
    }
}

/// Parses a stall target: a percentage (`0.1%`) or a share (`0.001`), within 0..=100 %.
pub fn parse_trim_max_stall(annotation: &str, value: &str) -> Result<Share, AnnotationError> {
    let v = check_value(annotation, value)?;
    let share = match v.strip_suffix('%') {
        Some(pct) => pct.trim().parse::<f64>().ok().map(|p| p / 100.0),
        None => v.parse::<f64>().ok(),
    };
    share
        .and_then(|s| Share::try_from(s).ok())
        .ok_or_else(|| AnnotationError::UnknownValue {
            annotation: sanitize_key(annotation),
            token: sanitize(v),
            expected: "a percentage such as 0.1% or a share such as 0.001, within 0..=100 %",
        })
}

/// The pod's choice on top of the node's: an opt-in or opt-out annotation replaces the node's
/// `enabled`; a stall target applies only when lower than the node's. A bad, looser or
/// disallowed annotation is skipped (the node default applies) and returned, for the caller
/// to report.
pub fn effective_trim(
    annotations: &BTreeMap<String, String>,
    node: TrimChoice,
    allow_annotations: bool,
) -> (TrimChoice, Vec<AnnotationError>) {
    let mut choice = node;
    let mut errors = Vec::new();
    for key in [TRIM_ANNOTATION, TRIM_MAX_STALL_ANNOTATION] {
        let Some(value) = annotations.get(key) else {
            continue;
        };
        if !allow_annotations {
            errors.push(AnnotationError::Disabled {
                annotation: sanitize_key(key),
            });
            continue;
        }
        if key == TRIM_ANNOTATION {
            match parse_trim_annotation(key, value) {
                Ok(on) => choice.enabled = on,
                Err(e) => errors.push(e),
            }
            continue;
        }
        match parse_trim_max_stall(key, value) {
            Ok(s) if s > node.max_stall => errors.push(AnnotationError::LooserValue {
                annotation: sanitize_key(key),
                requested: format!("{}%", s.get() * 100.0),
                node_default: format!("{}%", node.max_stall.get() * 100.0),
            }),
            Ok(s) => choice.max_stall = s,
            Err(e) => errors.push(e),
        }
    }
    (choice, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::annotation::test_support::ann;

    fn node() -> TrimChoice {
        TrimChoice {
            enabled: false,
            max_stall: Share::new(0.002),
        }
    }

    #[test]
    fn a_pod_opts_in_or_out_and_only_lowers_its_target() {
        // (annotations, enabled, stall target, errors)
        type Row<'a> = (&'a [(&'a str, &'a str)], bool, f64, usize);
        let rows: [Row<'_>; 9] = [
            (&[], false, 0.002, 0),
            (&[(TRIM_ANNOTATION, "on")], true, 0.002, 0),
            (&[(TRIM_ANNOTATION, " off ")], false, 0.002, 0),
            (
                &[(TRIM_ANNOTATION, "on"), (TRIM_MAX_STALL_ANNOTATION, "0.1%")],
                true,
                0.001,
                0,
            ),
            (
                &[
                    (TRIM_ANNOTATION, "on"),
                    (TRIM_MAX_STALL_ANNOTATION, "0.0005"),
                ],
                true,
                0.0005,
                0,
            ),
            // Looser than the node: the node's target, and an error.
            (
                &[(TRIM_ANNOTATION, "on"), (TRIM_MAX_STALL_ANNOTATION, "5%")],
                true,
                0.002,
                1,
            ),
            // Bad values lose nothing: the node default, and an error each.
            (&[(TRIM_ANNOTATION, "yes")], false, 0.002, 1),
            (
                &[(TRIM_ANNOTATION, "on"), (TRIM_MAX_STALL_ANNOTATION, "lots")],
                true,
                0.002,
                1,
            ),
            (&[(TRIM_MAX_STALL_ANNOTATION, "150%")], false, 0.002, 1),
        ];
        for (i, (pairs, enabled, stall, errors)) in rows.into_iter().enumerate() {
            let (c, errs) = effective_trim(&ann(pairs), node(), true);
            assert_eq!(
                (c.enabled, errs.len()),
                (enabled, errors),
                "row {i}: {errs:?}"
            );
            assert!((c.max_stall.get() - stall).abs() < 1e-12, "row {i}: {c:?}");
        }
    }

    #[test]
    fn errors_name_the_annotation_and_the_token() {
        let (_, errs) = effective_trim(&ann(&[(TRIM_ANNOTATION, "maybe")]), node(), true);
        assert_eq!(
            errs[0].to_string(),
            "annotation trim.nri-resize.io/pod: unknown value \"maybe\", expected on or off"
        );
        let (_, errs) = effective_trim(&ann(&[(TRIM_MAX_STALL_ANNOTATION, "1%")]), node(), true);
        assert_eq!(
            errs[0].to_string(),
            "annotation trim.nri-resize.io/max-stall: 1% is looser than the node default 0.2%, which applies"
        );
        let (c, errs) = effective_trim(&ann(&[(TRIM_ANNOTATION, "on")]), node(), false);
        assert!(!c.enabled, "annotations disabled on the node");
        assert!(errs[0].to_string().contains("disabled"), "{errs:?}");
    }
}
