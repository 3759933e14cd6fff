//! Resize confirmation: a container's cgroup read back and compared with what was asked
//! (desired vs actual), field by field in quantities, recorded in [`Observed`] and the metrics.
//! A memory limit is compared as the kernel holds it, in whole pages ([`held_memory_limit`]).
//!
//! [`Observed`]: super::Observed

use tracing::{debug, warn};

use super::{Confirmation, NodeState};
use crate::cgroup::{self, ActualResources, CgroupIo as _, CgroupLimits, CgroupVersion};
use crate::clock::now_ms;
use crate::model::{held_memory_limit, limited_bytes, LinuxResources};
use crate::policy::{cpu_quota_text, memory_limit_text, DEFAULT_CFS_PERIOD_US};

/// Whether every limit `desired` sets is what `actual` shows. Only CFS quota/period, v1 shares
/// and the memory limit are compared (v2 weight is a lossy conversion of shares); the memory
/// limit in whole pages of `page_size` bytes, as the kernel holds it.
pub fn desired_matches(
    desired: &LinuxResources,
    actual: &ActualResources,
    version: CgroupVersion,
    page_size: u64,
) -> Option<bool> {
    differences(desired, actual, version, page_size).map(|d| d.is_empty())
}

/// What differs between `desired` and `actual`, each naming the field and both values in
/// quantities (`memory limit: desired 40Mi, actual 66.6Mi`); `None`: nothing comparable. A
/// memory limit differs when `actual` is not `desired` rounded down to whole pages of
/// `page_size` bytes (1G, 1000000000 bytes, is held as 999997440 with 4 KiB pages: no
/// difference).
pub fn differences(
    desired: &LinuxResources,
    actual: &ActualResources,
    version: CgroupVersion,
    page_size: u64,
) -> Option<Vec<String>> {
    let mut compared = false;
    let mut found = Vec::new();
    let mut check =
        |field: &str, want: Option<i64>, have: Option<i64>, text: &dyn Fn(i64) -> String| {
            if let Some(w) = want {
                compared = true;
                if have != Some(w) {
                    found.push(format!(
                        "{field}: desired {}, actual {}",
                        text(w),
                        have.map_or_else(|| "unreadable".to_string(), text)
                    ));
                }
            }
        };
    let period = actual.cpu_period.unwrap_or(DEFAULT_CFS_PERIOD_US);
    // CRI: quota 0 means "not set"; -1 unlimited.
    check(
        "cpu quota",
        desired.cpu_quota().filter(|q| *q != 0).map(|q| q.max(-1)),
        actual.cpu_quota,
        &|q| format!("{} ({q}µs per {period}µs)", cpu_quota_text(q, period)),
    );
    check(
        "cpu period",
        desired
            .cpu_period()
            .filter(|p| *p != 0)
            .and_then(|p| i64::try_from(p).ok()),
        actual.cpu_period.and_then(|p| i64::try_from(p).ok()),
        &|p| format!("{p}µs"),
    );
    if version == CgroupVersion::V1 {
        check(
            "cpu.shares",
            desired
                .cpu_shares()
                .filter(|s| *s != 0)
                .and_then(|s| i64::try_from(s).ok()),
            actual.cpu_shares.and_then(|s| i64::try_from(s).ok()),
            &|s| s.to_string(),
        );
    }
    if let Some(asked) = desired
        .memory_limit()
        .filter(|l| *l != 0)
        .map(|l| l.max(-1))
    {
        compared = true;
        let held = held_memory_limit_of(asked, page_size);
        if actual.memory_limit != Some(held) {
            found.push(memory_difference(asked, held, actual.memory_limit));
        }
    }
    compared.then_some(found)
}

/// [`held_memory_limit`] of a limit as the runtime gives it (`-1`: unlimited, held as asked).
fn held_memory_limit_of(asked: i64, page_size: u64) -> i64 {
    limited_bytes(asked)
        .and_then(|b| i64::try_from(held_memory_limit(b, page_size)).ok())
        .unwrap_or(asked)
}

/// `memory limit: desired 40Mi, actual 66.6Mi`; in bytes where the quantities read the same
/// (`desired 1000000000 bytes (999997440 in whole pages), actual 999993344 bytes`), so the two
/// values named as different never read alike.
fn memory_difference(asked: i64, held: i64, actual: Option<i64>) -> String {
    let (d, a) = (
        memory_limit_text(asked),
        actual.map_or_else(|| "unreadable".to_string(), memory_limit_text),
    );
    if d != a {
        return format!("memory limit: desired {d}, actual {a}");
    }
    let held = if held == asked {
        String::new()
    } else {
        format!(" ({held} in whole pages)")
    };
    let a = actual.map_or_else(|| "unreadable".to_string(), |a| format!("{a} bytes"));
    format!("memory limit: desired {asked} bytes{held}, actual {a}")
}

/// An update taken for confirmation: what it asked and when (`None`: none was waiting).
#[derive(Debug)]
#[must_use = "confirm it with NodeState::confirm_taken"]
pub struct TakenUpdate(Option<(LinuxResources, std::time::Instant)>);

impl NodeState {
    /// At `PostUpdateContainer`, in memory: takes the update waiting for confirmation (what it
    /// asked and when) and starts the resize's verdict window. The cgroup read is
    /// [`Self::confirm_taken`], which the handler runs after answering the runtime.
    pub(crate) fn take_update(&self, id: &str) -> TakenUpdate {
        let pending = self.observed(|o| o.pending.remove(id));
        self.verdict_update_applied(id, pending.as_ref().map(|(r, _)| r));
        TakenUpdate(pending)
    }

    /// Reads the cgroup back against what the taken update asked (or the spec, when no update
    /// was waiting) and, when it holds every limit asked for, observes the time since the
    /// `UpdateContainer` in `nri_resize_resize_confirmation_seconds`. Blocking (cgroupfs).
    /// `None` also when a newer update of the container came meanwhile: its own
    /// `PostUpdateContainer` confirms it, and this older reading would be compared with the
    /// wrong request.
    pub(crate) fn confirm_taken(&self, id: &str, taken: TakenUpdate) -> Option<Confirmation> {
        if self.observed(|o| o.pending.contains_key(id)) {
            debug!(container_id = %id, "confirmation superseded by a newer update");
            return None;
        }
        let since = taken.0.as_ref().map(|(_, at)| *at);
        let c = self.confirm(id, taken.0.map(|(r, _)| r))?;
        if let (Some(at), Some(true)) = (since, c.matches) {
            self.metrics
                .confirmation
                .confirmed(at.elapsed().as_secs_f64());
        }
        Some(c)
    }

    /// Records a fresh reading of a container's cgroup (a staged decrease reads it after each
    /// pass) against the desired values of its last confirmation.
    pub fn note_actual(&self, id: &str, actual: &ActualResources) {
        let version = self.cgroups.as_ref().map(cgroup::CgroupIo::version);
        self.observed(|o| {
            let seq = o.next_reading();
            let Some(target) = o.targets.get(id) else {
                return;
            };
            let c = o.confirmations.entry(id.to_owned()).or_default();
            c.seq = seq;
            if let (Some(d), Some(v)) = (&c.desired, version) {
                let diff = differences(d, actual, v, cgroup::page_size());
                c.matches = diff.as_ref().map(Vec::is_empty);
                c.differences = diff.unwrap_or_default();
            }
            c.actual = Some(*actual);
            c.error = None;
            c.at_ms = now_ms();
            self.metrics.set_actual(&target.labels, actual);
        });
    }

    /// Reads the container's cgroup now and records desired vs actual. `desired`: what the
    /// update asked; `None` takes the container's resources as the runtime reports them.
    pub fn confirm(&self, id: &str, desired: Option<LinuxResources>) -> Option<Confirmation> {
        let cgroups = self.cgroups.as_ref()?;
        self.confirm_reading(id, desired, |path| cgroups.read_actual(path))
    }

    /// [`Self::confirm`] with the cgroup read by `read`. The reading is numbered as it begins:
    /// when another reading of the container began later and was recorded first, this older
    /// one records nothing (it is returned, not kept), so neither the confirmation nor the
    /// desired and actual gauges go back in time.
    fn confirm_reading(
        &self,
        id: &str,
        desired: Option<LinuxResources>,
        read: impl FnOnce(&std::path::Path) -> Result<ActualResources, cgroup::CgroupError>,
    ) -> Option<Confirmation> {
        let version = self.cgroups.as_ref()?.version();
        let (target, seq) =
            self.observed(|o| Some((o.targets.get(id).cloned()?, o.next_reading())))?;
        let desired = desired.or_else(|| target.resources.clone());
        let mut confirmation = Confirmation {
            desired,
            at_ms: now_ms(),
            seq,
            ..Confirmation::default()
        };
        let mut caps = None;
        match cgroup::container_path(&target.cgroups_path)
            .and_then(|path| read(&path).map(|a| (a, path)))
        {
            Ok((actual, path)) => {
                let diff = confirmation
                    .desired
                    .as_ref()
                    .and_then(|d| differences(d, &actual, version, cgroup::page_size()));
                confirmation.matches = diff.as_ref().map(Vec::is_empty);
                // The cgroups above it, up to the pod's: what caps the limits in effect. Judged
                // only once its own cgroup holds what was asked: before that (runc writes a new
                // cgroup's limits after creating it; an update not yet applied) the difference
                // is drift, reported as such, and an ancestor's lower limit says nothing.
                if confirmation.matches != Some(false) {
                    caps = self.read_caps(&target, &path, &CgroupLimits::from(&actual));
                }
                confirmation.differences = diff.unwrap_or_default();
                confirmation.actual = Some(actual);
            }
            Err(e) => confirmation.error = Some(e.to_string()),
        }
        if confirmation.matches == Some(false) {
            warn!(
                container = %target.labels.container,
                pod = %target.labels.pod,
                namespace = %target.labels.namespace,
                differences = %confirmation.differences.join("; "),
                "resize not in effect: desired and actual differ"
            );
        } else {
            debug!(
                container = %target.labels.container,
                pod = %target.labels.pod,
                matches = ?confirmation.matches,
                error = ?confirmation.error,
                "desired vs actual recorded"
            );
        }
        self.observed(|o| {
            // The container may have gone meanwhile, or a newer reading was recorded.
            if o.targets.contains_key(id) && o.newer_reading(id, seq) {
                if let Some(d) = &confirmation.desired {
                    self.metrics.set_desired(&target.labels, d);
                }
                if let Some(a) = &confirmation.actual {
                    self.metrics.set_actual(&target.labels, a);
                }
                // Caps are also re-read on their own: a later re-read's are kept.
                if let Some(before) = o.confirmations.get(id) {
                    confirmation.caps.clone_from(&before.caps);
                    confirmation.caps_seq = before.caps_seq;
                }
                o.confirmations
                    .insert(id.to_owned(), Box::new(confirmation.clone()));
                self.record_caps(o, id, caps.clone(), seq);
                if let Some(c) = o.confirmations.get(id) {
                    confirmation.caps.clone_from(&c.caps);
                }
            } else {
                confirmation.caps = caps;
            }
        });
        Some(confirmation)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{actual, ctr, pod, res};
    use super::*;

    const PAGE: u64 = 4096;

    #[test]
    fn desired_matches_compares_only_what_was_asked() {
        let v = CgroupVersion::V2;
        assert_eq!(
            desired_matches(
                &res(200_000, 100_000, 100 << 20),
                &actual(200_000, 100_000, 100 << 20),
                v,
                PAGE
            ),
            Some(true)
        );
        assert_eq!(
            desired_matches(
                &res(200_000, 100_000, 100 << 20),
                &actual(10_000, 100_000, 100 << 20),
                v,
                PAGE
            ),
            Some(false)
        );
        // Memory limit 0 means unset in CRI: not compared.
        assert_eq!(
            desired_matches(&res(-1, 100_000, 0), &actual(-1, 100_000, 12345), v, PAGE),
            Some(true)
        );
        assert_eq!(
            desired_matches(&LinuxResources::default(), &actual(1, 1, 1), v, PAGE),
            None
        );
    }

    /// The kernel holds a memory limit in whole pages, rounded down: 1G (1000000000 bytes)
    /// reads back 999997440 with 4 KiB pages, and that is the limit asked, in effect.
    #[test]
    fn a_memory_limit_is_in_effect_when_the_cgroup_holds_it_in_whole_pages() {
        let v = CgroupVersion::V1;
        let held = |asked, page, have| {
            desired_matches(
                &res(-1, 100_000, asked),
                &actual(-1, 100_000, have),
                v,
                page,
            )
        };
        // (asked, page size, read back, in effect)
        let table = [
            (1_000_000_000, PAGE, 999_997_440, true),
            (268_435_457, PAGE, 268_435_456, true),
            (256 << 20, PAGE, 256 << 20, true),
            (1_000_000_000, 16 * 1024, 999_997_440, true),
            (1_000_000_000, 64 * 1024, 999_948_288, true),
            // The bytes asked are not what a 4 KiB-page kernel holds.
            (1_000_000_000, PAGE, 1_000_000_000, false),
            // A page short of what the kernel would hold; a page more.
            (1_000_000_000, PAGE, 999_993_344, false),
            (1_000_000_000, PAGE, 1_000_001_536, false),
            (1_000_000_000, 64 * 1024, 999_997_440, false),
            (1_000_000_000, PAGE, -1, false),
        ];
        for (asked, page, have, in_effect) in table {
            assert_eq!(
                held(asked, page, have),
                Some(in_effect),
                "asked {asked}, read back {have}, {page}-byte pages"
            );
        }
    }

    #[test]
    fn differences_name_the_field_and_both_values_in_quantities() {
        let d = differences(
            &res(80_000, 100_000, 40 << 20),
            &actual(100_000, 100_000, 69_828_608),
            CgroupVersion::V2,
            PAGE,
        );
        assert_eq!(
            d.expect("comparable"),
            [
                "cpu quota: desired 800m (80000µs per 100000µs), actual 1000m (100000µs per 100000µs)",
                "memory limit: desired 40Mi, actual 66.6Mi",
            ]
        );
        assert_eq!(
            differences(
                &res(-1, 100_000, -1),
                &actual(-1, 100_000, -1),
                CgroupVersion::V2,
                PAGE
            ),
            Some(Vec::new())
        );
    }

    /// Values that differ by a page read alike as quantities (953.7Mi): they are named in
    /// bytes, with what the kernel would hold of the one asked.
    #[test]
    fn a_memory_difference_never_reads_desired_x_actual_x() {
        let d = differences(
            &res(-1, 100_000, 1_000_000_000),
            &actual(-1, 100_000, 999_993_344),
            CgroupVersion::V2,
            PAGE,
        );
        assert_eq!(
            d.expect("comparable"),
            ["memory limit: desired 1000000000 bytes (999997440 in whole pages), actual 999993344 bytes"]
        );
        let d = differences(
            &res(-1, 100_000, 256 << 20),
            &actual(-1, 100_000, (256 << 20) - 4096),
            CgroupVersion::V2,
            PAGE,
        );
        assert_eq!(
            d.expect("comparable"),
            ["memory limit: desired 268435456 bytes, actual 268431360 bytes"]
        );
        assert_eq!(
            differences(
                &res(-1, 100_000, 1_000_000_000),
                &actual(-1, 100_000, 999_997_440),
                CgroupVersion::V2,
                PAGE
            ),
            Some(Vec::new())
        );
    }

    /// Two readings side by side: the one that began first ends last. It must not replace
    /// the newer confirmation, nor put the desired gauge back to the older request.
    #[test]
    fn an_older_reading_ending_last_does_not_overwrite_a_newer_one() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let state = NodeState::with_cgroups(
            crate::config::Config::default(),
            Some(cgroup::Cgroups::V2(cgroup::V2 {
                root: tmp.path().to_owned(),
            })),
        );
        state.track(&pod("p1"), &ctr("c1", "p1", "app"));
        let older = res(100_000, 100_000, 100 << 20);
        let newer = res(300_000, 100_000, 400 << 20);
        let c = state
            .confirm_reading("c1", Some(older), |_| {
                // While the older reading is in the kernel, a newer one begins and ends.
                let n = state
                    .confirm_reading("c1", Some(newer.clone()), |_| {
                        Ok(actual(300_000, 100_000, 400 << 20))
                    })
                    .expect("newer");
                assert_eq!(n.matches, Some(true));
                Ok(actual(100_000, 100_000, 100 << 20))
            })
            .expect("older");
        assert_eq!(c.matches, Some(true), "the older reading itself: {c:?}");
        let kept = state.observed(|o| o.confirmations["c1"].clone());
        assert_eq!(kept.desired.as_ref(), Some(&newer), "{kept:?}");
        let text = state.metrics.encode().expect("encode");
        assert!(
            text.contains(r#"nri_resize_container_desired_memory_bytes{container="app",namespace="ns",pod="pod-p1"} 419430400"#),
            "{text}"
        );
    }

    #[test]
    fn confirm_reads_the_cgroup_under_an_injected_root() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("test/p1/c1");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("cpu.max"), "200000 100000\n").expect("write");
        std::fs::write(dir.join("memory.max"), "67108864\n").expect("write");
        let state = NodeState::with_cgroups(
            crate::config::Config::default(),
            Some(cgroup::Cgroups::V2(cgroup::V2 {
                root: tmp.path().to_owned(),
            })),
        );
        state.track(&pod("p1"), &ctr("c1", "p1", "app"));
        let c = state
            .confirm("c1", Some(res(200_000, 100_000, 64 << 20)))
            .expect("confirmation");
        assert_eq!(c.matches, Some(true), "{c:?}");
        let c = state.confirm("c1", None).expect("confirmation");
        assert_eq!(c.matches, Some(false), "spec asks 10000/100000: {c:?}");
        let text = state.metrics.encode().expect("encode");
        assert!(
            text.contains(
                "nri_resize_container_actual_cpu_cores{container=\"app\",namespace=\"ns\",pod=\"pod-p1\"} 2\n"
            ),
            "{text}"
        );
    }
}
