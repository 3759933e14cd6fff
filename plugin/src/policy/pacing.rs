//! Reclaim paced by the workload's memory stall. Pure: the staged decrease (`resize/reclaim/`)
//! reads the container's `memory.pressure` between its reclaim steps and asks the [`Pacer`] how
//! much to reclaim next and how long to wait first.
//!
//! - The stall share since the last step (stalled time over wall time) above the ceiling
//!   (`[memory_decrease] max_stall`, tightenable per pod): the next step is half as large (not
//!   below [`MIN_STEP`]) and comes twice as late (not later than [`MAX_WAIT`]).
//! - Below half the ceiling: the step doubles again (up to what is left) and the wait halves
//!   back towards the configured step interval.
//! - In between: unchanged.
//!
//! The pacer never ends a reclaim: the loop still ends by converging, by its timeout, or by
//! being superseded.

use std::collections::BTreeMap;
use std::time::Duration;

use super::annotation::{
    check_value, sanitize, sanitize_key, AnnotationError, MAX_STALL_ANNOTATION,
};
use super::share::percent as pct;
use super::{bytes_text, Share};

/// The first step of a paced reclaim.
pub const FIRST_STEP: u64 = 32 << 20;
/// The smallest step (pages come back in batches: smaller asks make no difference).
pub const MIN_STEP: u64 = 1 << 20;
/// The longest wait between steps.
pub const MAX_WAIT: Duration = Duration::from_secs(4);

/// What the pacer decided after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaceChange {
    /// The stall was over the ceiling: smaller and later.
    Slower,
    /// Well under the ceiling: larger and sooner.
    Faster,
    Same,
}

/// The pacing state of one staged decrease.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pacer {
    max_stall: Share,
    base_wait: Duration,
    step: u64,
    wait: Duration,
    /// The last stall share seen, and the most seen.
    pub last_stall: Option<f64>,
    pub worst_stall: f64,
    /// Steps that came over the ceiling.
    pub over_ceiling: u32,
}

impl Pacer {
    /// `base_wait`: the configured pause between steps (the shortest the pacer uses).
    #[must_use]
    pub fn new(max_stall: Share, base_wait: Duration) -> Self {
        Self {
            max_stall,
            base_wait,
            step: FIRST_STEP,
            wait: base_wait,
            last_stall: None,
            worst_stall: 0.0,
            over_ceiling: 0,
        }
    }

    /// Bytes to reclaim next, given `left` bytes still to go.
    #[must_use]
    pub fn step(&self, left: u64) -> u64 {
        self.step.min(left)
    }

    /// The pause before the next step.
    #[must_use]
    pub fn wait(&self) -> Duration {
        self.wait
    }

    #[must_use]
    pub fn max_stall(&self) -> Share {
        self.max_stall
    }

    /// Adjusts to the stall share measured since the previous step.
    pub fn observe(&mut self, stall: f64) -> PaceChange {
        self.last_stall = Some(stall);
        self.worst_stall = self.worst_stall.max(stall);
        let ceiling = self.max_stall.get();
        if stall > ceiling {
            self.over_ceiling += 1;
            self.step = (self.step / 2).max(MIN_STEP);
            self.wait = (self.wait * 2).clamp(self.base_wait, MAX_WAIT.max(self.base_wait));
            PaceChange::Slower
        } else if stall < ceiling / 2.0 {
            self.step = self.step.saturating_mul(2);
            self.wait = (self.wait / 2).max(self.base_wait);
            PaceChange::Faster
        } else {
            PaceChange::Same
        }
    }

    /// What a deferred decrease adds to its reason when pacing held it back:
    /// `"; paced by the workload's memory stall (12 % at the last step, ceiling 5 %; 7 steps over it)"`.
    #[must_use]
    pub fn deferred_note(&self) -> String {
        match self.last_stall {
            Some(last) if self.over_ceiling > 0 => format!(
                "; paced by the workload's memory stall ({} % at the last step, up to {} %, ceiling {} %; {} step(s) over it, next step {})",
                pct(last),
                pct(self.worst_stall),
                pct(self.max_stall.get()),
                self.over_ceiling,
                bytes_text(self.step),
            ),
            _ => String::new(),
        }
    }
}

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

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_stall_over_the_ceiling_shrinks_and_delays_the_next_step() {
        let mut p = Pacer::new(Share::new(0.05), Duration::from_millis(100));
        assert_eq!(
            (p.step(u64::MAX), p.wait()),
            (32 * MIB, Duration::from_millis(100))
        );
        assert_eq!(p.step(10 * MIB), 10 * MIB, "never more than what is left");
        assert_eq!(p.observe(0.20), PaceChange::Slower);
        assert_eq!(
            (p.step(u64::MAX), p.wait()),
            (16 * MIB, Duration::from_millis(200))
        );
        for _ in 0..10 {
            p.observe(0.5);
        }
        assert_eq!(
            (p.step(u64::MAX), p.wait()),
            (MIN_STEP, MAX_WAIT),
            "floors hold"
        );
        assert_eq!(p.over_ceiling, 11);
    }

    #[test]
    fn a_low_stall_grows_the_steps_again_and_in_between_holds() {
        let mut p = Pacer::new(Share::new(0.05), Duration::from_millis(100));
        p.observe(0.3);
        p.observe(0.3);
        assert_eq!(p.step(u64::MAX), 8 * MIB);
        assert_eq!(
            p.observe(0.04),
            PaceChange::Same,
            "under the ceiling, over half of it"
        );
        assert_eq!(p.step(u64::MAX), 8 * MIB);
        assert_eq!(p.observe(0.01), PaceChange::Faster);
        assert_eq!(
            (p.step(u64::MAX), p.wait()),
            (16 * MIB, Duration::from_millis(200))
        );
        p.observe(0.0);
        p.observe(0.0);
        assert_eq!(
            (p.step(u64::MAX), p.wait()),
            (64 * MIB, Duration::from_millis(100))
        );
    }

    #[test]
    fn the_deferred_note_names_the_stall_only_when_pacing_held_back() {
        let mut p = Pacer::new(Share::new(0.05), Duration::from_millis(100));
        p.observe(0.01);
        assert_eq!(p.deferred_note(), "");
        p.observe(0.31);
        p.observe(0.12);
        assert_eq!(
            p.deferred_note(),
            "; paced by the workload's memory stall (12 % at the last step, up to 31 %, ceiling 5 %; 2 step(s) over it, next step 16Mi)"
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
