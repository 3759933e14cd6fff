//! Effective limits: whether a cgroup between a container's and its pod's (the pod's included)
//! caps the container below its own limits (kubernetes/kubernetes#138760: a container raised to
//! 1.5Gi under a pod cgroup left at 175Mi is OOM-killed at 175Mi while every component reports
//! the resize done). Read with each confirmation and again by the observer every
//! [`RECHECK_EVERY_TICKS`] intervals, since the pod cgroup is kubelet's to write without telling
//! anyone. Kept in the confirmation ([`Confirmation::caps`]), counted in
//! `nri_resize_capped_containers`, logged once per change.
//!
//! [`Confirmation::caps`]: super::Confirmation::caps

use std::collections::HashMap;
use std::path::Path;

use tracing::{debug, info, warn};

use super::{NodeState, Observed, Target};
use crate::cgroup::{self, Cap, Caps, CgroupLimits};

/// The observer re-reads the cgroups above the containers every this many ticks (its interval:
/// 1 s by default). A pod cgroup changes rarely; a pass reads each cgroup above a container
/// once (two or three files each: a cost that grows with the pods), so it is kept to every 10 s.
pub const RECHECK_EVERY_TICKS: u32 = 10;

impl NodeState {
    /// The caps on the container of `target` whose cgroup `container` holds `own`: the limits
    /// of every cgroup from its pod's down to its parent. Blocking (cgroupfs). `None` when
    /// unknown: no cgroup access, no pod cgroup given, or a read failed (logged).
    pub(super) fn read_caps(
        &self,
        target: &Target,
        container: &Path,
        own: &CgroupLimits,
    ) -> Option<Caps> {
        let cgroups = self.cgroups.as_ref()?;
        if target.cgroup_parent.is_empty() {
            return None;
        }
        match cgroup::pod_path(&target.cgroup_parent)
            .and_then(|pod| cgroup::read_caps(cgroups, container, own, &pod))
        {
            Ok(caps) => caps,
            Err(e) => {
                debug!(container = %target.labels.container, pod = %target.labels.pod, error = %e, "cgroup path above the container not read");
                None
            }
        }
    }

    /// Records `caps` of reading `seq` for container `id` unless a later reading recorded its
    /// own; `None` (unknown) keeps what was known. Logs each change once and recounts the gauge.
    pub(super) fn record_caps(&self, o: &mut Observed, id: &str, caps: Option<Caps>, seq: u64) {
        let Some(target) = o.targets.get(id) else {
            return;
        };
        let labels = target.labels.clone();
        let Some(c) = o.confirmations.get_mut(id) else {
            return;
        };
        let Some(caps) = caps else { return };
        if c.caps_seq > seq {
            return;
        }
        c.caps_seq = seq;
        let before = c.caps.replace(caps.clone()).unwrap_or_default();
        for (resource, was, now) in [
            ("memory", &before.memory, &caps.memory),
            ("cpu", &before.cpu, &caps.cpu),
        ] {
            log_change(&labels, resource, was.as_ref(), now.as_ref());
        }
        if before != caps {
            self.count_caps(o);
        }
    }

    /// Sets `nri_resize_capped_containers` from the confirmations.
    pub(super) fn count_caps(&self, o: &Observed) {
        let (mut memory, mut cpu) = (0, 0);
        for c in o.confirmations.values().filter_map(|c| c.caps.as_ref()) {
            memory += usize::from(c.memory.is_some());
            cpu += usize::from(c.cpu.is_some());
        }
        self.metrics.confirmation.set_capped(memory, cpu);
    }

    /// Re-reads the cgroups above every confirmed container, up to its pod's (the pod cgroup
    /// may have been written meanwhile: kubelet writes it without telling the runtime), and
    /// records the caps. The container's own limits are its confirmation's `actual`, read back
    /// at each update the runtime reported and at first sight: only the cgroups above it are
    /// read here, each once per pass (a pod's containers share them), so a pass costs the
    /// pods, not the containers (at 500 containers it was most of the daemon's steady CPU).
    /// Blocking (cgroupfs): the observer thread runs it.
    pub fn recheck_caps(&self) {
        struct Job {
            id: String,
            cgroups_path: String,
            cgroup_parent: String,
            own: CgroupLimits,
        }
        let Some(cgroups) = self.cgroups.as_ref() else {
            return;
        };
        let (jobs, seq): (Vec<Job>, u64) = self.observed(|o| {
            // As at a confirmation: only containers whose own cgroup held what was asked.
            let jobs = o
                .confirmations
                .iter()
                .filter(|(_, c)| c.matches != Some(false))
                .filter_map(|(id, c)| {
                    let t = o.targets.get(id)?;
                    if t.cgroup_parent.is_empty() {
                        return None;
                    }
                    Some(Job {
                        id: id.clone(),
                        cgroups_path: t.cgroups_path.clone(),
                        cgroup_parent: t.cgroup_parent.clone(),
                        own: CgroupLimits::from(c.actual.as_ref()?),
                    })
                })
                .collect();
            (jobs, o.next_reading())
        });
        let mut seen = HashMap::new();
        let found: Vec<(String, Caps)> = jobs
            .into_iter()
            .filter_map(|job| {
                let caps = cgroup::container_path(&job.cgroups_path).and_then(|path| {
                    let pod = cgroup::pod_path(&job.cgroup_parent)?;
                    cgroup::read_caps_cached(cgroups, &path, &job.own, &pod, &mut seen)
                });
                match caps {
                    Ok(caps) => Some((job.id, caps?)),
                    Err(e) => {
                        debug!(container = %job.id, error = %e, "cgroup path above the container not re-read");
                        None
                    }
                }
            })
            .collect();
        self.observed(|o| {
            for (id, caps) in found {
                self.record_caps(o, &id, Some(caps), seq);
            }
        });
    }
}

/// One log line per change of a cap: capped (or capped elsewhere), or no longer capped.
fn log_change(
    labels: &crate::metrics::ContainerLabels,
    resource: &str,
    was: Option<&Cap>,
    now: Option<&Cap>,
) {
    match (was, now) {
        (_, Some(n)) if was != Some(n) => warn!(
            namespace = %labels.namespace,
            pod = %labels.pod,
            container = %labels.container,
            resource,
            cgroup = %n.cgroup.display(),
            effective = n.effective,
            own = ?n.own,
            reason = %n.reason,
            "container limit capped by an ancestor cgroup: its own limit is not in effect"
        ),
        (Some(w), None) => info!(
            namespace = %labels.namespace,
            pod = %labels.pod,
            container = %labels.container,
            resource,
            cgroup = %w.cgroup.display(),
            "container limit no longer capped by an ancestor cgroup"
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::fixtures::{ctr, pod, res};
    use super::*;

    fn write(dir: &Path, file: &str, value: &str) {
        std::fs::create_dir_all(dir).expect("mkdir");
        std::fs::write(dir.join(file), value).expect("write");
    }

    /// The gauge's value for `resource`; -1 when the series is absent.
    fn capped(text: &str, resource: &str) -> i64 {
        let series = format!("nri_resize_capped_containers{{resource=\"{resource}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
            .unwrap_or(-1)
    }

    /// A v2 fixture: pod `p1` at `/test/p1` with container `c1` under it, tracked; the pod's
    /// and the container's `(memory.max, cpu.max)` as given.
    fn tracked(
        pod_files: (&str, &str),
        c1_files: (&str, &str),
    ) -> (tempfile::TempDir, PathBuf, std::sync::Arc<NodeState>) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pod_dir = tmp.path().join("test/p1");
        write(&pod_dir, "memory.max", pod_files.0);
        write(&pod_dir, "cpu.max", pod_files.1);
        write(&pod_dir.join("c1"), "memory.max", c1_files.0);
        write(&pod_dir.join("c1"), "cpu.max", c1_files.1);
        let state = NodeState::with_cgroups(
            crate::config::Config::default(),
            Some(cgroup::Cgroups::V2(cgroup::V2 {
                root: tmp.path().to_owned(),
            })),
        );
        let mut p = pod("p1");
        p.cgroup_parent = "/test/p1".into();
        state.track(&p, &ctr("c1", "p1", "app"));
        (tmp, pod_dir, state)
    }

    /// kubernetes/kubernetes#138760 on a v2 fixture: the confirmation holds the container's own
    /// 512Mi (it matches what was asked) and the pod cgroup's 175Mi cap; the gauge counts it; a
    /// recheck after the pod cgroup is raised clears it; a gone container leaves the count.
    #[test]
    fn a_pod_cgroup_below_the_container_caps_it_until_raised() {
        let (_tmp, pod_dir, state) = tracked(
            ("183500800\n", "max 100000\n"),
            ("536870912\n", "10000 100000\n"),
        );
        let c = state
            .confirm("c1", Some(res(10_000, 100_000, 512 << 20)))
            .expect("confirmation");
        assert_eq!(c.matches, Some(true), "its own cgroup holds what was asked");
        let caps = c.caps.expect("caps read");
        let m = caps.memory.expect("memory capped");
        assert_eq!((m.effective, m.own), (175 << 20, Some(512 << 20)));
        assert_eq!(m.reason, "capped by the pod cgroup at 175Mi");
        assert_eq!(caps.cpu, None, "the pod's cpu is unlimited");
        let text = state.metrics.encode().expect("encode");
        assert_eq!(capped(&text, "memory"), 1, "{text}");
        assert_eq!(capped(&text, "cpu"), 0, "{text}");

        // Unchanged: the recheck keeps it (and counts it once).
        state.recheck_caps();
        assert_eq!(
            capped(&state.metrics.encode().expect("encode"), "memory"),
            1
        );

        // kubelet raises the pod cgroup: the next recheck clears the cap.
        write(&pod_dir, "memory.max", "1073741824\n");
        state.recheck_caps();
        let kept = state.observed(|o| o.confirmations["c1"].clone());
        assert_eq!(kept.caps, Some(Caps::default()), "{kept:?}");
        assert_eq!(
            capped(&state.metrics.encode().expect("encode"), "memory"),
            0
        );

        // Lowered again, then the container goes: counted, then not.
        write(&pod_dir, "memory.max", "104857600\n");
        state.recheck_caps();
        assert_eq!(
            capped(&state.metrics.encode().expect("encode"), "memory"),
            1
        );
        state.untrack("c1");
        assert_eq!(
            capped(&state.metrics.encode().expect("encode"), "memory"),
            0
        );
    }

    /// A recheck that cannot read the path (pod cgroup gone) keeps what was known.
    /// Seen in the VM tier: the confirmation after `PostCreateContainer` read the container's
    /// new cgroup before runc wrote its limits (unlimited), under a 175Mi pod cgroup. That is
    /// drift (desired 512Mi, actual unlimited), not a cap: no cap is recorded or counted until
    /// its own cgroup holds what was asked, by a confirmation or by the observer's re-check.
    #[test]
    fn a_container_whose_own_limits_are_not_in_place_yet_is_not_capped() {
        let (_tmp, pod_dir, state) =
            tracked(("183500800\n", "max 100000\n"), ("max\n", "max 100000\n"));
        let c = state
            .confirm("c1", Some(res(10_000, 100_000, 128 << 20)))
            .expect("confirmation");
        assert_eq!(c.matches, Some(false), "drift: {c:?}");
        assert_eq!(c.caps, None, "{c:?}");
        state.recheck_caps();
        // 0, or no series yet: nothing counted.
        assert!(capped(&state.metrics.encode().expect("encode"), "memory") <= 0);
        // runc wrote the limits: confirmed, and 128Mi under 175Mi is not capped.
        write(&pod_dir.join("c1"), "memory.max", "134217728\n");
        write(&pod_dir.join("c1"), "cpu.max", "10000 100000\n");
        let c = state
            .confirm("c1", Some(res(10_000, 100_000, 128 << 20)))
            .expect("confirmation");
        assert_eq!(c.matches, Some(true), "{c:?}");
        assert!(c.caps.as_ref().is_some_and(|k| !k.any()), "{c:?}");
    }

    #[test]
    fn an_unreadable_path_keeps_the_known_caps() {
        let (_tmp, pod_dir, state) = tracked(
            ("104857600\n", "max 100000\n"),
            ("209715200\n", "10000 100000\n"),
        );
        let c = state
            .confirm("c1", Some(res(10_000, 100_000, 200 << 20)))
            .expect("confirmation");
        assert_eq!(
            c.caps.and_then(|c| c.memory).map(|m| m.effective),
            Some(100 << 20),
            "a 200Mi container under a 100Mi pod"
        );
        // The recheck reads only the cgroups above the container (its own limits are the
        // confirmation's): the pod's gone, the path is unreadable.
        std::fs::remove_dir_all(&pod_dir).expect("rm");
        state.recheck_caps();
        let kept = state.observed(|o| o.confirmations["c1"].caps.clone());
        assert!(kept.is_some_and(|c| c.memory.is_some()), "kept");
    }

    /// A recheck reads the cgroups above the container only: the container's own limits are
    /// its confirmation's (read back at its last update). With the container's directory
    /// gone, raising the pod cgroup still clears the cap.
    #[test]
    fn a_recheck_reads_only_the_cgroups_above_the_container() {
        let (_tmp, pod_dir, state) = tracked(
            ("104857600\n", "max 100000\n"),
            ("209715200\n", "10000 100000\n"),
        );
        let c = state
            .confirm("c1", Some(res(10_000, 100_000, 200 << 20)))
            .expect("confirmation");
        assert!(
            c.caps.is_some_and(|c| c.memory.is_some()),
            "capped at 100Mi"
        );
        std::fs::remove_dir_all(pod_dir.join("c1")).expect("rm");
        write(&pod_dir, "memory.max", "419430400\n");
        state.recheck_caps();
        let now = state.observed(|o| o.confirmations["c1"].caps.clone());
        assert!(
            now.as_ref().is_some_and(|c| !c.any()),
            "the pod raised to 400Mi no longer caps the 200Mi container: {now:?}"
        );
    }
}
