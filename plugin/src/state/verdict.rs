//! Verdicts on applied resizes, as node state: each watched container's recent counters (fed by
//! the observer every interval), the resizes waiting for their window to pass, and the last
//! verdict per container. The comparison itself is pure (`policy::verdict`).
//!
//! A resize starts a verdict when it is applied: at `PostUpdateContainer` for an update through
//! the runtime (kubelet's), when the runtime applied a plugin-initiated update (staged decreases,
//! whole-pod resizes). Once `[verdict] window` has passed, the window after is compared with the
//! same window before and the verdict is recorded and counted. A resize applied while an
//! earlier one's window runs folds into it: one verdict, from the limits before the first to
//! the limits after the last (a staged decrease applies an interim limit, then the requested
//! one), comparing the window before the first with the window after the last. A container
//! that goes takes its verdicts with it.

use std::collections::HashMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tracing::info;

use super::verdict_history::History;
use super::NodeState;
use crate::clock::now_ms;
use crate::model::LinuxResources;
use crate::observer::Observation;
use crate::policy::{
    bounds, judge, limit_changes, CounterSample, LimitChange, Verdict, WindowStats,
};
use crate::sync::{Locked as _, ReadWriteLocked as _};

/// The verdict on a container's last applied resize, as `/v1/resizes` and `status` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResizeVerdict {
    /// `None` while the window after the resize is still running.
    pub verdict: Option<Verdict>,
    /// The limits the resize changed (`cpu 1000m → 250m`).
    pub change: String,
    /// Why: what got worse with both values, or what was compared.
    pub reason: String,
    /// When the resize was applied and when it was judged (wall-clock ms).
    pub applied_ms: u64,
    pub judged_ms: Option<u64>,
    pub window_ms: u64,
    pub before: Option<WindowStats>,
    pub after: Option<WindowStats>,
}

#[derive(Debug)]
struct Pending {
    /// When the first resize of the verdict was applied (the window before ends here).
    first_at_ms: u64,
    /// When the last one was applied (the window after starts here).
    at_ms: u64,
    /// The container's resources before the first.
    before: LinuxResources,
    changes: Vec<LimitChange>,
}

/// Counter history, pending resizes and verdicts per container id.
#[derive(Debug)]
pub struct Verdicts {
    epoch: Instant,
    history: HashMap<String, History>,
    pending: HashMap<String, Pending>,
    /// The container's resources when an update arrived (before it applies).
    before_update: HashMap<String, LinuxResources>,
    pub records: HashMap<String, ResizeVerdict>,
}

impl Default for Verdicts {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            history: HashMap::new(),
            pending: HashMap::new(),
            before_update: HashMap::new(),
            records: HashMap::new(),
        }
    }
}

impl Verdicts {
    fn mono_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// The counters a verdict compares, from one observation.
pub fn counter_sample(at_ms: u64, o: &Observation) -> CounterSample {
    CounterSample {
        at_ms,
        throttled_ns: o.throttling.map(|t| t.throttled_ns),
        cpu_stall_us: o.pressure.map(|p| p.cpu.some_us),
        memory_stall_us: o.pressure.map(|p| p.memory.some_us),
        oom_kills: o.oom.kills,
    }
}

impl NodeState {
    pub fn verdicts<R>(&self, f: impl FnOnce(&mut Verdicts) -> R) -> R {
        f(&mut self.verdicts.locked())
    }

    /// At `UpdateContainer`: remembers what the container holds before the update applies.
    pub(crate) fn verdict_before_update(&self, id: &str, current: Option<&LinuxResources>) {
        if let Some(r) = current {
            self.verdicts(|v| v.before_update.insert(id.to_owned(), r.clone()));
        }
    }

    /// At `PostUpdateContainer`: the update that arrived with `UpdateContainer` is applied.
    pub(crate) fn verdict_update_applied(&self, id: &str, applied: Option<&LinuxResources>) {
        let before = self.verdicts(|v| v.before_update.remove(id));
        if let (Some(before), Some(after)) = (before, applied) {
            self.resize_applied(id, &before, after);
        }
    }

    /// A resize of container `id` from `before` to `after` was applied now: a verdict starts
    /// when it changed a CPU or memory limit (or folds into the one whose window runs).
    pub fn resize_applied(&self, id: &str, before: &LinuxResources, after: &LinuxResources) {
        let window_ms = self.window_ms();
        let pending = self.verdicts(|v| {
            let at_ms = v.mono_ms();
            let folded = v.pending.remove(id);
            let folds = folded.is_some();
            let (first_at_ms, before) = match folded {
                Some(p) => (p.first_at_ms, p.before),
                None => (at_ms, before.clone()),
            };
            let changes = limit_changes(&before, after);
            if let Some(h) = v.history.get_mut(id) {
                h.pin();
            }
            if changes.is_empty() {
                // Nothing changed (or a folded resize went back where it started).
                if folds {
                    v.records.remove(id);
                }
                return false;
            }
            v.records.insert(
                id.to_owned(),
                ResizeVerdict {
                    verdict: None,
                    change: changes
                        .iter()
                        .map(|c| c.text.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    reason: String::new(),
                    applied_ms: now_ms(),
                    judged_ms: None,
                    window_ms,
                    before: None,
                    after: None,
                },
            );
            v.pending.insert(
                id.to_owned(),
                Pending {
                    first_at_ms,
                    at_ms,
                    before,
                    changes,
                },
            );
            true
        });
        // The container's verdict counters exist (at 0) from now, so that the first verdict is
        // an increase a rule can see.
        if pending {
            if let Some(l) = self.observed(|o| o.targets.get(id).map(|t| t.labels.clone())) {
                self.metrics.container_verdicts_start(&l);
            }
        }
    }

    fn window_ms(&self) -> u64 {
        let window = self.config.read_locked().verdict.window;
        u64::try_from(window.as_millis()).unwrap_or(u64::MAX)
    }

    /// Every observer interval: the latest observation of each watched container. Judges the
    /// resizes whose window has passed. An observation of a container no longer tracked (removed
    /// while the observer read it) is dropped: the check and the history's write happen under
    /// the watched set's lock, which a removal holds while it forgets the history, so a removed
    /// container's history is never re-created.
    pub fn verdict_tick<'a>(&self, observations: impl Iterator<Item = (&'a str, &'a Observation)>) {
        let window_ms = self.window_ms();
        let due: Vec<(String, Pending, u64)> = self.observed(|tracked| {
            self.verdicts(|v| {
                let now = v.mono_ms();
                // Enough history for the window before a resize applied up to a window ago.
                let keep_from =
                    now.saturating_sub(window_ms.saturating_mul(2).saturating_add(5_000));
                for (id, o) in observations {
                    if !tracked.targets.contains_key(id) {
                        continue;
                    }
                    v.history.entry(id.to_owned()).or_default().record(
                        counter_sample(now, o),
                        window_ms,
                        keep_from,
                    );
                }
                let ids: Vec<String> = v
                    .pending
                    .iter()
                    .filter(|(_, p)| now >= p.at_ms.saturating_add(window_ms))
                    .map(|(id, _)| id.clone())
                    .collect();
                ids.into_iter()
                    .filter_map(|id| v.pending.remove(&id).map(|p| (id, p, now)))
                    .collect()
            })
        });
        for (id, p, now) in due {
            self.judge_one(&id, &p, now, window_ms);
        }
    }

    /// Judges `p` for container `id` with what the history holds up to `now`.
    fn judge_one(&self, id: &str, p: &Pending, now: u64, window_ms: u64) {
        let thresholds = self.config.read_locked().verdict.thresholds();
        // The window after runs to this tick (judged on the first tick a window after the
        // resize): the newest sample bounds it, whatever the history's spacing.
        let end = now;
        let judged = self.verdicts(|v| {
            let samples: Vec<CounterSample> = v.history.get(id)?.samples();
            let (a0, a1) = bounds(&samples, p.at_ms, end)?;
            let after = WindowStats::between(&a0, &a1);
            let before = bounds(
                &samples,
                p.first_at_ms.saturating_sub(window_ms),
                p.first_at_ms,
            )
            .map(|(b0, b1)| WindowStats::between(&b0, &b1))
            .unwrap_or_default();
            let (verdict, reason) = judge(&before, &after, &p.changes, &thresholds);
            Some((verdict, reason, before, after))
        });
        let Some((verdict, reason, before, after)) = judged else {
            return;
        };
        for c in &p.changes {
            self.metrics
                .verdict
                .verdict(c.resource, c.direction, verdict);
        }
        let labels = self.observed(|o| o.targets.get(id).map(|t| t.labels.clone()));
        if let Some(l) = &labels {
            self.metrics.container_verdict(l, verdict);
            info!(
                namespace = %l.namespace,
                pod = %l.pod,
                container = %l.container,
                verdict = verdict.as_str(),
                reason = %reason,
                "resize verdict"
            );
        }
        self.verdicts(|v| {
            if let Some(r) = v.records.get_mut(id) {
                r.verdict = Some(verdict);
                r.reason = reason;
                r.judged_ms = Some(now_ms());
                r.before = Some(before);
                r.after = Some(after);
            }
        });
    }

    /// A container went: its history, pending verdict and record go.
    pub(crate) fn forget_verdicts(&self, id: &str) {
        self.verdicts(|v| {
            v.history.remove(id);
            v.pending.remove(id);
            v.before_update.remove(id);
            v.records.remove(id);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{ctr, pod, res};
    use super::*;
    use crate::observer::{OomKills, Pressure, StallTotals, Throttling};

    fn observation(cpu_stall_us: u64) -> Observation {
        Observation {
            throttling: Some(Throttling::default()),
            oom: OomKills::default(),
            pressure: Some(Pressure {
                cpu: StallTotals {
                    some_us: cpu_stall_us,
                    full_us: None,
                    ..StallTotals::default()
                },
                ..Pressure::default()
            }),
            ..Observation::default()
        }
    }

    /// Feeds one sample per "second" by moving the history's clock by hand.
    fn feed(state: &NodeState, id: &str, at_ms: u64, cpu_stall_us: u64) {
        state.verdicts(|v| {
            v.history
                .entry(id.into())
                .or_default()
                .push_unthinned(counter_sample(at_ms, &observation(cpu_stall_us)));
        });
    }

    #[test]
    fn an_update_is_judged_after_its_window_and_counted() {
        let mut cfg = crate::config::Config::default();
        cfg.verdict.window = std::time::Duration::from_secs(1);
        let state = NodeState::new(cfg);
        state.track(&pod("p1"), &ctr("c1", "p1", "app"));
        // History: 2 s before the resize at a 2 % cpu stall share.
        let ago = |secs| {
            Instant::now()
                .checked_sub(std::time::Duration::from_secs(secs))
                .expect("the machine is up for more than a few seconds")
        };
        state.verdicts(|v| v.epoch = ago(2));
        feed(&state, "c1", 0, 0);
        feed(&state, "c1", 1_000, 20_000);
        feed(&state, "c1", 2_000, 40_000);
        state.verdict_before_update("c1", Some(&res(100_000, 100_000, 64 << 20)));
        state.verdict_update_applied("c1", Some(&res(25_000, 100_000, 64 << 20)));
        let r = state
            .verdicts(|v| v.records.get("c1").cloned())
            .expect("record");
        assert_eq!((r.verdict, r.change.as_str()), (None, "cpu 1000m → 250m"));
        // A second later, at a 31 % stall share: harmful.
        state.verdicts(|v| {
            let p = v.pending.get_mut("c1").expect("pending");
            (p.first_at_ms, p.at_ms) = (2_000, 2_000);
            v.epoch = ago(3);
        });
        feed(&state, "c1", 3_000, 350_000);
        state.verdict_tick(std::iter::empty());
        let r = state
            .verdicts(|v| v.records.get("c1").cloned())
            .expect("record");
        assert_eq!(r.verdict, Some(Verdict::Harmful), "{r:?}");
        assert_eq!(r.reason, "cpu stall 31 % (was 2 %) after cpu 1000m → 250m");
        let text = state.metrics.encode().expect("encode");
        assert!(
            text.contains(r#"nri_resize_resize_verdicts_total{direction="decrease",resource="cpu",verdict="harmful"} 1"#),
            "{text}"
        );
        state.forget_verdicts("c1");
        assert!(state.verdicts(|v| v.records.is_empty() && v.history.is_empty()));
    }

    /// The observer's tick read a container that was removed meanwhile: its history must not
    /// come back (it would never be dropped again).
    #[test]
    fn a_tick_does_not_recreate_the_history_of_a_removed_container() {
        let state = NodeState::new(crate::config::Config::default());
        state.track(&pod("p1"), &ctr("c1", "p1", "app"));
        state.track(&pod("p1"), &ctr("c2", "p1", "side"));
        let seen = observation(1_000);
        state.verdict_tick([("c1", &seen), ("c2", &seen)].into_iter());
        assert!(state.verdicts(|v| v.history.contains_key("c1")));
        state.untrack("c1");
        state.verdict_tick([("c1", &seen), ("c2", &seen)].into_iter());
        let ids: Vec<String> = state.verdicts(|v| v.history.keys().cloned().collect());
        assert_eq!(ids, ["c2"], "the removed container's history came back");
    }

    #[test]
    fn a_resize_applied_within_the_window_folds_into_one_verdict() {
        let state = NodeState::new(crate::config::Config::default());
        state.track(&pod("p1"), &ctr("c1", "p1", "app"));
        // A staged decrease: the interim limit at the update, the requested one at convergence.
        state.resize_applied(
            "c1",
            &res(10_000, 100_000, 512 << 20),
            &res(10_000, 100_000, 300 << 20),
        );
        state.resize_applied(
            "c1",
            &res(10_000, 100_000, 300 << 20),
            &res(10_000, 100_000, 128 << 20),
        );
        let r = state
            .verdicts(|v| v.records.get("c1").cloned())
            .expect("record");
        assert_eq!(r.change, "memory 512Mi → 128Mi");
        assert_eq!(state.verdicts(|v| v.pending.len()), 1);
        // Back where it started: no verdict at all.
        state.resize_applied(
            "c1",
            &res(10_000, 100_000, 128 << 20),
            &res(10_000, 100_000, 512 << 20),
        );
        assert!(state.verdicts(|v| v.records.is_empty() && v.pending.is_empty()));
    }

    #[test]
    fn an_update_that_changes_no_limit_starts_no_verdict() {
        let state = NodeState::new(crate::config::Config::default());
        state.verdict_before_update("c1", Some(&res(10_000, 100_000, 64 << 20)));
        state.verdict_update_applied("c1", Some(&res(10_000, 100_000, 64 << 20)));
        assert!(state.verdicts(|v| v.records.is_empty() && v.pending.is_empty()));
    }
}
