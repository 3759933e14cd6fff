//! A container's **effective** limits: the smallest on its cgroup path, from its own cgroup up
//! to its pod's. A container given 1.5Gi whose pod cgroup still holds 175Mi is OOM-killed at
//! 175Mi (kubernetes/kubernetes#138760): its own cgroup holds what was asked, yet the limit in
//! effect is its pod's. Memory: the smallest `memory.max` / `memory.limit_in_bytes`; CPU: the
//! smallest quota/period ratio (`cpu.max`, `cpu.cfs_quota_us` / `cpu.cfs_period_us`).
//!
//! [`caps`] is pure (table-tested); [`read_caps`] reads the path through [`CgroupIo`].

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ActualResources, CgroupError, CgroupIo};
use crate::policy::{cpu_text, memory_limit_text, UNLIMITED_BYTES};

/// One cgroup's CPU bandwidth and memory limits. `None`: the file is absent (no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// CFS quota in µs per period; `-1`: unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period in µs.
    pub cpu_period: Option<u64>,
    /// Memory limit in bytes; `-1`: unlimited.
    pub memory_limit: Option<i64>,
}

impl From<&ActualResources> for CgroupLimits {
    fn from(a: &ActualResources) -> Self {
        CgroupLimits {
            cpu_quota: a.cpu_quota,
            cpu_period: a.cpu_period,
            memory_limit: a.memory_limit,
        }
    }
}

/// Only the limits: the other fields unread (`None`).
impl From<CgroupLimits> for ActualResources {
    fn from(l: CgroupLimits) -> Self {
        ActualResources {
            cpu_quota: l.cpu_quota,
            cpu_period: l.cpu_period,
            memory_limit: l.memory_limit,
            ..ActualResources::default()
        }
    }
}

impl CgroupLimits {
    /// The memory limit in bytes; `None`: unlimited.
    fn memory(&self) -> Option<u64> {
        self.memory_limit
            .and_then(|m| u64::try_from(m).ok())
            .filter(|m| *m > 0 && *m < UNLIMITED_BYTES)
    }

    /// The CPU limit as (quota, period) in µs; `None`: unlimited.
    fn cpu(&self) -> Option<(u64, u64)> {
        let q = self.cpu_quota.and_then(|q| u64::try_from(q).ok())?;
        let p = self.cpu_period?;
        (q > 0 && p > 0).then_some((q, p))
    }
}

/// An ancestor's limit below the container's own: the limit in effect, and who holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cap {
    /// The limit in effect: bytes (memory) or millicores (cpu).
    pub effective: u64,
    /// The container's own limit in the same unit; `None`: unlimited.
    pub own: Option<u64>,
    /// The cgroup that holds it, within the hierarchy (`/kubepods/burstable/pod<uid>`).
    pub cgroup: PathBuf,
    /// Whether that cgroup is the pod's (else one between the pod's and the container's).
    pub pod_cgroup: bool,
    /// `capped by the pod cgroup at 175Mi`.
    pub reason: String,
}

/// The caps on a container's limits; both `None`: its own limits are the ones in effect.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Cap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cap>,
}

impl Caps {
    /// Whether an ancestor caps either limit.
    pub fn any(&self) -> bool {
        self.memory.is_some() || self.cpu.is_some()
    }

    /// Each cap's reason (`memory capped by the pod cgroup at 175Mi`), memory first.
    pub fn reasons(&self) -> Vec<String> {
        [("memory", &self.memory), ("cpu", &self.cpu)]
            .into_iter()
            .filter_map(|(what, c)| Some(format!("{what} {}", c.as_ref()?.reason)))
            .collect()
    }
}

fn who(pod_cgroup: bool, cgroup: &Path) -> String {
    if pod_cgroup {
        "the pod cgroup".to_string()
    } else {
        format!("cgroup {}", cgroup.display())
    }
}

/// The cgroups above a container's, from its pod's down to its parent; `None` when the
/// container's cgroup is not below the pod's (then nothing above it is the pod's to judge).
pub fn ancestors(container: &Path, pod: &Path) -> Option<Vec<PathBuf>> {
    let below = container.strip_prefix(pod).ok()?;
    let mut parts: Vec<_> = below.components().collect();
    // The container's own cgroup is the last component; at least one is needed.
    parts.pop()?;
    let mut at = pod.to_path_buf();
    let mut out = vec![at.clone()];
    for p in parts {
        at.push(p);
        out.push(at.clone());
    }
    Some(out)
}

/// The caps on a container whose own cgroup holds `own`, under `above` (from the pod's cgroup,
/// `pod`, down to the container's parent). An ancestor caps a limit when its own is smaller
/// (an unlimited container is capped by any limited ancestor); the smallest wins, and of equal
/// ones the nearest the container.
pub fn caps(own: &CgroupLimits, above: &[(PathBuf, CgroupLimits)], pod: &Path) -> Caps {
    let mut memory: Option<(u64, &Path)> = None;
    let mut cpu: Option<((u64, u64), &Path)> = None;
    for (path, limits) in above {
        if let Some(m) = limits.memory() {
            let bound = memory.map(|(b, _)| b).or(own.memory());
            if bound.is_none_or(|b| m <= b) && own.memory().is_none_or(|o| m < o) {
                memory = Some((m, path));
            }
        }
        if let Some(c) = limits.cpu() {
            let bound = cpu.map(|(b, _)| b).or(own.cpu());
            if bound.is_none_or(|b| ratio_le(c, b)) && own.cpu().is_none_or(|o| ratio_lt(c, o)) {
                cpu = Some((c, path));
            }
        }
    }
    let cap = |effective: u64, own: Option<u64>, cgroup: &Path, text: String| {
        let pod_cgroup = cgroup == pod;
        Cap {
            effective,
            own,
            cgroup: cgroup.to_path_buf(),
            pod_cgroup,
            reason: format!("capped by {} at {text}", who(pod_cgroup, cgroup)),
        }
    };
    Caps {
        memory: memory.map(|(m, path)| {
            let text = memory_limit_text(i64::try_from(m).unwrap_or(-1));
            cap(m, own.memory(), path, text)
        }),
        cpu: cpu.map(|(c, path)| {
            let millis = millicores(c);
            cap(millis, own.cpu().map(millicores), path, cpu_text(millis))
        }),
    }
}

fn millicores((quota, period): (u64, u64)) -> u64 {
    quota.saturating_mul(1000) / period
}

/// `a.0/a.1 < b.0/b.1`, exactly.
fn ratio_lt(a: (u64, u64), b: (u64, u64)) -> bool {
    u128::from(a.0) * u128::from(b.1) < u128::from(b.0) * u128::from(a.1)
}

fn ratio_le(a: (u64, u64), b: (u64, u64)) -> bool {
    !ratio_lt(b, a)
}

/// Reads the limits of every cgroup from `pod` down to `container`'s parent and returns the
/// caps on a container holding `own`; `Ok(None)` when `container` is not below `pod`.
/// Blocking (cgroupfs): never on an async worker.
pub fn read_caps(
    io: &dyn CgroupIo,
    container: &Path,
    own: &CgroupLimits,
    pod: &Path,
) -> Result<Option<Caps>, CgroupError> {
    read_caps_cached(io, container, own, pod, &mut HashMap::new())
}

/// [`read_caps`], reading each cgroup above the container once per `seen` (one pass over many
/// containers: a pod's containers share its cgroup).
pub fn read_caps_cached<S: BuildHasher>(
    io: &dyn CgroupIo,
    container: &Path,
    own: &CgroupLimits,
    pod: &Path,
    seen: &mut HashMap<PathBuf, CgroupLimits, S>,
) -> Result<Option<Caps>, CgroupError> {
    let Some(paths) = ancestors(container, pod) else {
        return Ok(None);
    };
    let mut above = Vec::with_capacity(paths.len());
    for p in paths {
        let limits = if let Some(l) = seen.get(&p) {
            *l
        } else {
            let l = io.read_limits(&p)?;
            seen.insert(p.clone(), l);
            l
        };
        above.push((p, limits));
    }
    Ok(Some(caps(own, &above, pod)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: i64 = 1 << 20;

    fn mem(limit: i64) -> CgroupLimits {
        CgroupLimits {
            memory_limit: Some(limit),
            ..CgroupLimits::default()
        }
    }

    fn cpu(quota: i64, period: u64) -> CgroupLimits {
        CgroupLimits {
            cpu_quota: Some(quota),
            cpu_period: Some(period),
            ..CgroupLimits::default()
        }
    }

    fn at(path: &str, l: CgroupLimits) -> (PathBuf, CgroupLimits) {
        (PathBuf::from(path), l)
    }

    const POD: &str = "/kubepods/burstable/pod1";

    #[test]
    fn the_pod_cgroup_caps_a_raised_container_kubernetes_138760() {
        let c = caps(&mem(1536 * MI), &[at(POD, mem(175 * MI))], Path::new(POD));
        let m = c.memory.clone().expect("capped");
        assert_eq!(m.effective, 175 << 20);
        assert_eq!(m.own, Some(1536 << 20));
        assert!(m.pod_cgroup);
        assert_eq!(m.reason, "capped by the pod cgroup at 175Mi");
        assert_eq!(c.cpu, None);
        assert_eq!(c.reasons(), ["memory capped by the pod cgroup at 175Mi"]);
    }

    #[test]
    fn no_cap_when_the_container_is_the_smallest_or_equal() {
        for pod in [256 * MI, 128 * MI, -1] {
            let c = caps(&mem(128 * MI), &[at(POD, mem(pod))], Path::new(POD));
            assert!(!c.any(), "pod {pod}: {c:?}");
        }
        // v1 unlimited: a value at PAGE_COUNTER_MAX reads as -1 already; a huge one is too.
        let huge = i64::try_from(UNLIMITED_BYTES).expect("fits");
        assert!(!caps(&mem(128 * MI), &[at(POD, mem(huge))], Path::new(POD)).any());
        // Absent files: no limit anywhere.
        let none = CgroupLimits::default();
        assert!(!caps(&none, &[at(POD, none)], Path::new(POD)).any());
    }

    #[test]
    fn an_unlimited_container_is_capped_by_any_limited_ancestor() {
        let c = caps(&mem(-1), &[at(POD, mem(64 * MI))], Path::new(POD));
        let m = c.memory.expect("capped");
        assert_eq!((m.effective, m.own), (64 << 20, None));
        let c = caps(
            &cpu(-1, 100_000),
            &[at(POD, cpu(50_000, 100_000))],
            Path::new(POD),
        );
        assert_eq!(c.cpu.expect("capped").effective, 500);
    }

    #[test]
    fn the_smallest_on_the_path_wins_and_names_its_cgroup() {
        let mid = "/kubepods/burstable/pod1/sub";
        let above = [at(POD, mem(300 * MI)), at(mid, mem(200 * MI))];
        let c = caps(&mem(512 * MI), &above, Path::new(POD));
        let m = c.memory.expect("capped");
        assert_eq!(m.effective, 200 << 20);
        assert!(!m.pod_cgroup);
        assert_eq!(m.reason, format!("capped by cgroup {mid} at 200Mi"));
        // The pod's smaller: it wins.
        let above = [at(POD, mem(100 * MI)), at(mid, mem(200 * MI))];
        let m = caps(&mem(512 * MI), &above, Path::new(POD))
            .memory
            .expect("capped");
        assert!(m.pod_cgroup && m.effective == 100 << 20, "{m:?}");
        // Equal: the nearest the container.
        let above = [at(POD, mem(100 * MI)), at(mid, mem(100 * MI))];
        let m = caps(&mem(512 * MI), &above, Path::new(POD))
            .memory
            .expect("capped");
        assert_eq!(m.cgroup, Path::new(mid));
    }

    #[test]
    fn cpu_compares_quota_over_period_not_quota() {
        // Pod 150000/300000 = 500m; container 80000/100000 = 800m: capped at 500m although the
        // pod's quota is larger.
        let c = caps(
            &cpu(80_000, 100_000),
            &[at(POD, cpu(150_000, 300_000))],
            Path::new(POD),
        );
        let cap = c.cpu.expect("capped");
        assert_eq!((cap.effective, cap.own), (500, Some(800)));
        assert_eq!(cap.reason, "capped by the pod cgroup at 500m");
        // Pod 50000/50000 = 1000m over container 80000/100000: not capped although its quota is smaller.
        assert!(!caps(
            &cpu(80_000, 100_000),
            &[at(POD, cpu(50_000, 50_000))],
            Path::new(POD)
        )
        .any());
        // Unlimited pod (v1 -1, v2 `max` read as -1).
        assert!(!caps(
            &cpu(80_000, 100_000),
            &[at(POD, cpu(-1, 100_000))],
            Path::new(POD)
        )
        .any());
    }

    #[test]
    fn memory_and_cpu_are_judged_separately() {
        let own = CgroupLimits {
            cpu_quota: Some(200_000),
            cpu_period: Some(100_000),
            memory_limit: Some(64 * MI),
        };
        let pod = CgroupLimits {
            cpu_quota: Some(100_000),
            cpu_period: Some(100_000),
            memory_limit: Some(128 * MI),
        };
        let c = caps(&own, &[at(POD, pod)], Path::new(POD));
        assert_eq!(c.memory, None);
        assert_eq!(c.cpu.as_ref().map(|c| c.effective), Some(1000));
        assert_eq!(c.reasons(), ["cpu capped by the pod cgroup at 1000m"]);
    }

    #[test]
    fn ancestors_run_from_the_pod_down_to_the_parent() {
        assert_eq!(
            ancestors(Path::new("/kubepods/pod1/ctr"), Path::new("/kubepods/pod1")),
            Some(vec![PathBuf::from("/kubepods/pod1")])
        );
        assert_eq!(
            ancestors(
                Path::new("/kubepods/pod1/a/ctr"),
                Path::new("/kubepods/pod1")
            ),
            Some(vec![
                PathBuf::from("/kubepods/pod1"),
                PathBuf::from("/kubepods/pod1/a")
            ])
        );
        // systemd: the scope below the pod's slice.
        let pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice";
        assert_eq!(
            ancestors(
                &Path::new(pod).join("cri-containerd-abc.scope"),
                Path::new(pod)
            ),
            Some(vec![PathBuf::from(pod)])
        );
        assert_eq!(
            ancestors(Path::new("/other/ctr"), Path::new("/kubepods/pod1")),
            None
        );
        assert_eq!(
            ancestors(Path::new("/kubepods/pod1"), Path::new("/kubepods/pod1")),
            None
        );
    }

    /// v1 and v2 fixtures through the real readers: the same caps.
    #[test]
    fn read_caps_walks_the_path_in_each_version() {
        use super::super::{Cgroups, V1, V2};
        let write = |dir: &Path, file: &str, v: &str| {
            std::fs::create_dir_all(dir).expect("mkdir");
            std::fs::write(dir.join(file), v).expect("write");
        };
        let pod = Path::new("/pod1");
        let ctr = Path::new("/pod1/ctr");

        let tmp = tempfile::tempdir().expect("tempdir");
        let (cpu_root, mem_root) = (tmp.path().join("cpu"), tmp.path().join("memory"));
        write(&cpu_root.join("pod1"), "cpu.cfs_quota_us", "50000\n");
        write(&cpu_root.join("pod1"), "cpu.cfs_period_us", "100000\n");
        write(&cpu_root.join("pod1/ctr"), "cpu.cfs_quota_us", "-1\n");
        write(&cpu_root.join("pod1/ctr"), "cpu.cfs_period_us", "100000\n");
        write(
            &mem_root.join("pod1"),
            "memory.limit_in_bytes",
            "183500800\n",
        );
        write(
            &mem_root.join("pod1/ctr"),
            "memory.limit_in_bytes",
            "536870912\n",
        );
        let v1 = Cgroups::V1(V1 {
            cpu: cpu_root,
            memory: mem_root,
        });

        let tmp2 = tempfile::tempdir().expect("tempdir");
        write(&tmp2.path().join("pod1"), "cpu.max", "50000 100000\n");
        write(&tmp2.path().join("pod1"), "memory.max", "183500800\n");
        write(&tmp2.path().join("pod1/ctr"), "cpu.max", "max 100000\n");
        write(&tmp2.path().join("pod1/ctr"), "memory.max", "536870912\n");
        let v2 = Cgroups::V2(V2 {
            root: tmp2.path().to_owned(),
        });

        for cg in [&v1, &v2] {
            let own = cg.read_limits(ctr).expect("own");
            assert_eq!(own.memory_limit, Some(512 * MI));
            assert_eq!(own.cpu_quota, Some(-1));
            let c = read_caps(cg, ctr, &own, pod).expect("read").expect("below");
            assert_eq!(c.memory.as_ref().map(|m| m.effective), Some(175 << 20));
            assert_eq!(c.cpu.as_ref().map(|m| m.effective), Some(500));
            assert_eq!(
                c.reasons(),
                [
                    "memory capped by the pod cgroup at 175Mi",
                    "cpu capped by the pod cgroup at 500m"
                ]
            );
        }
        // A missing pod cgroup is an error naming it, not "no cap".
        let err = read_caps(
            &v2,
            Path::new("/pod2/ctr"),
            &CgroupLimits::default(),
            Path::new("/pod2"),
        )
        .expect_err("missing");
        assert!(err.to_string().contains("pod2"), "{err}");
    }
}
