//! Settings of reclaim pacing (see [`Pacer`](super::Pacer) for the rules): the stall ceiling a
//! pod's paced reclaims hold to (`[memory_decrease] max_stall`, tightened by the pod's
//! annotation), and why pacing is off where it is.

use std::collections::BTreeMap;

use super::annotation::{
    check_value, sanitize, sanitize_key, AnnotationError, MAX_STALL_ANNOTATION,
};
use super::Share;

/// Why pacing is off for a staged decrease, if it is: `max_stall` of 1.0 turns it off, and it
/// needs the container's `memory.pressure` (cgroup v2 with PSI).
#[must_use]
pub fn pacing_off_reason(max_stall: Share, has_psi: bool, v1: bool) -> Option<&'static str> {
    if max_stall.get() >= 1.0 {
        Some("reclaim pacing off: max_stall = 1.0")
    } else if v1 {
        Some("reclaim pacing off: cgroup v1 has no memory.pressure")
    } else if !has_psi {
        Some("reclaim pacing off: the kernel has no PSI (memory.pressure unreadable; psi=0?)")
    } else {
        None
    }
}

/// Parses the max-stall annotation: a share (`0.02`).
pub fn parse_max_stall_annotation(annotation: &str, value: &str) -> Result<Share, AnnotationError> {
    let v = check_value(annotation, value)?;
    v.parse::<f64>()
        .ok()
        .and_then(|f| Share::try_from(f).ok())
        .ok_or_else(|| AnnotationError::UnknownValue {
            annotation: sanitize_key(annotation),
            token: sanitize(v),
            expected: "a share within 0.0..=1.0, e.g. 0.02",
        })
}

/// The stall ceiling of a pod's paced reclaims: the annotation when it is lower than the node
/// default (annotations only tighten), else the node default. Bad or looser annotations are
/// skipped and returned as errors for the caller to report.
pub fn effective_max_stall(
    annotations: &BTreeMap<String, String>,
    node_default: Share,
    allow_annotations: bool,
) -> (Share, Vec<AnnotationError>) {
    let Some(value) = annotations.get(MAX_STALL_ANNOTATION) else {
        return (node_default, Vec::new());
    };
    let annotation = sanitize_key(MAX_STALL_ANNOTATION);
    if !allow_annotations {
        return (node_default, vec![AnnotationError::Disabled { annotation }]);
    }
    match parse_max_stall_annotation(MAX_STALL_ANNOTATION, value) {
        Ok(s) if s > node_default => (
            node_default,
            vec![AnnotationError::LooserValue {
                annotation,
                requested: s.to_string(),
                node_default: node_default.to_string(),
            }],
        ),
        Ok(s) => (s, Vec::new()),
        Err(e) => (node_default, vec![e]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::annotation::test_support::ann;

    #[test]
    fn the_annotation_only_tightens_the_ceiling() {
        let node = Share::new(0.05);
        let (s, errs) = effective_max_stall(&ann(&[(MAX_STALL_ANNOTATION, "0.02")]), node, true);
        assert_eq!((s, errs.len()), (Share::new(0.02), 0));
        let (s, errs) = effective_max_stall(&ann(&[(MAX_STALL_ANNOTATION, "0.5")]), node, true);
        assert_eq!(s, node);
        assert_eq!(
            errs[0].to_string(),
            "annotation memory-decrease.nri-resize.io/max-stall: 0.5 is looser than the node default 0.05, which applies"
        );
        let (s, errs) = effective_max_stall(&ann(&[(MAX_STALL_ANNOTATION, "lots")]), node, true);
        assert_eq!(s, node);
        assert!(errs[0].to_string().contains("\"lots\""), "{}", errs[0]);
        let (s, errs) = effective_max_stall(&ann(&[(MAX_STALL_ANNOTATION, "0.01")]), node, false);
        assert_eq!((s, errs.len()), (node, 1), "annotations disabled");
        assert_eq!(
            effective_max_stall(&ann(&[]), node, true),
            (node, Vec::new())
        );
    }

    #[test]
    fn pacing_is_off_without_psi_and_says_why() {
        let on = Share::new(0.05);
        assert_eq!(pacing_off_reason(on, true, false), None);
        assert!(pacing_off_reason(on, false, true).is_some_and(|r| r.contains("cgroup v1")));
        assert!(pacing_off_reason(on, false, false).is_some_and(|r| r.contains("no PSI")));
        assert!(pacing_off_reason(Share::new(1.0), true, false).is_some());
    }
}
