//! What nri-resize's replies to the runtime carry: only the fields it changes. NRI records one
//! owner for every field a plugin's reply sets (cpuset, each `unified` key, each huge page
//! size, pids, swap, ...); a reply that restates a field it does not change takes it from the
//! plugin that does (a topology or balloons policy) and the runtime's request fails. Huge page
//! limits are even appended to the request's own list, so a restated one is written twice.

use crate::model::{fields_changed, values_of, LinuxResources, MemoryResources};

/// A staged decrease: the interim memory limit, and the memory+swap limit only where the one
/// asked for would be below it (runc refuses swap below the limit), keeping its swap allowance.
pub(super) fn interim_reply(desired: &LinuxResources, target: u64, interim: u64) -> LinuxResources {
    let limit = i64::try_from(interim).unwrap_or(i64::MAX);
    let swap = desired
        .memory
        .as_ref()
        .and_then(|m| m.swap)
        .filter(|s| *s > 0 && *s < limit)
        .map(|s| {
            let allowance = s.saturating_sub(i64::try_from(target).unwrap_or(i64::MAX));
            limit.saturating_add(allowance.max(0))
        });
    LinuxResources {
        memory: Some(MemoryResources {
            limit: Some(limit),
            swap,
            ..MemoryResources::default()
        }),
        ..LinuxResources::default()
    }
}

/// Whether the runtime holding `allocated` is what answering `desired` (kubelet's request merged
/// over the container) with a kept limit `kept` for `target` left: the same update asked again.
///
/// The memory limit and a swap limit that follows it are compared as [`interim_reply`] writes
/// them. `unified` keys the runtime's view of the container does not carry are not compared:
/// containerd's (NRI's `FromOCILinuxResources`) drops `unified` altogether, while kubelet's
/// request carries `memory.swap.max = 0` on cgroup v2 with swap off.
pub(super) fn answered_already(
    desired: &LinuxResources,
    allocated: &LinuxResources,
    target: u64,
    kept: u64,
) -> bool {
    let mut same = desired.clone();
    same.merge(&interim_reply(desired, target, kept));
    same.unified
        .retain(|k, _| allocated.unified.contains_key(k));
    same == *allocated
}

/// A resize that needs a restart keeps the container as it is: the fields the request changes
/// (from `allocated` to `desired`) get their `allocated` values back; nothing else is set.
pub(super) fn keep_reply(allocated: &LinuxResources, desired: &LinuxResources) -> LinuxResources {
    values_of(allocated, &fields_changed(allocated, desired))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeat_is_told_from_a_newer_update_as_the_runtime_reports_the_container() {
        const MI: i64 = 1 << 20;
        let mem = |limit: i64, swap: Option<i64>| MemoryResources {
            limit: Some(limit),
            swap,
            ..MemoryResources::default()
        };
        let with = |m: MemoryResources, unified: &[(&str, &str)]| LinuxResources {
            memory: Some(m),
            unified: unified
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..LinuxResources::default()
        };
        let (target, kept) = (100 * MI as u64, 317 * MI as u64);
        // cgroup v2, containerd: kubelet's request carries `memory.swap.max`, the container's
        // view has no `unified` at all.
        let swap_off = [("memory.swap.max", "0")];
        let asked = with(mem(100 * MI, None), &swap_off);
        let holds = with(mem(317 * MI, None), &[]);
        assert!(answered_already(&asked, &holds, target, kept));
        // cgroup v1 (kubelet), and CRI-O: memory+swap = memory, moved with the kept limit.
        let asked = with(mem(100 * MI, Some(100 * MI)), &[]);
        let holds = with(mem(317 * MI, Some(317 * MI)), &[]);
        assert!(answered_already(&asked, &holds, target, kept));
        // Newer updates: another limit kept, another swap allowance, a `unified` value the
        // runtime does report differently.
        assert!(!answered_already(&asked, &holds, target, 300 * MI as u64));
        let more_swap = with(mem(100 * MI, Some(150 * MI)), &[]);
        assert!(!answered_already(&more_swap, &holds, target, kept));
        let asked = with(mem(100 * MI, None), &[("memory.high", "max")]);
        let holds = with(mem(317 * MI, None), &[("memory.high", "200000000")]);
        assert!(!answered_already(&asked, &holds, target, kept));
    }
    use crate::model::{CpuResources, HugepageLimit};

    const MI: i64 = 1 << 20;

    /// A container as the runtime reports it with everything another plugin may own.
    fn allocated() -> LinuxResources {
        LinuxResources {
            cpu: Some(CpuResources {
                shares: Some(512),
                quota: Some(50_000),
                period: Some(100_000),
                cpus: "0-1".into(),
                mems: "0".into(),
                ..Default::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(512 * MI),
                swap: Some(512 * MI),
                ..Default::default()
            }),
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 0,
            }],
            blockio_class: Some("slow".into()),
            rdt_class: Some("gold".into()),
            unified: [("memory.high".to_string(), "max".to_string())].into(),
            pids_limit: Some(4096),
        }
    }

    fn with_memory(limit: i64, swap: Option<i64>) -> LinuxResources {
        let mut r = allocated();
        let m = r.memory.as_mut().unwrap();
        m.limit = Some(limit);
        m.swap = swap;
        r
    }

    #[test]
    fn a_staged_decrease_sets_the_memory_limit_and_nothing_else() {
        let desired = with_memory(100 * MI, Some(512 * MI));
        let r = interim_reply(&desired, 100 << 20, 300 << 20);
        let m = r.memory.clone().expect("memory");
        assert_eq!(m.limit, Some(300 * MI));
        assert_eq!(
            m.swap, None,
            "swap above the interim limit is left to the runtime"
        );
        assert_eq!(m.reservation, None);
        assert_eq!(m.kernel, None);
        assert_eq!(m.kernel_tcp, None);
        assert_eq!(m.swappiness, None);
        assert_eq!(m.disable_oom_killer, None);
        assert_eq!(m.use_hierarchy, None);
        assert_eq!(r.cpu, None, "cpu and cpuset");
        assert!(r.hugepage_limits.is_empty(), "huge pages");
        assert!(r.unified.is_empty(), "unified");
        assert_eq!(r.blockio_class, None);
        assert_eq!(r.rdt_class, None);
        assert_eq!(r.pids_limit, None, "pids");
    }

    #[test]
    fn a_staged_decrease_raises_a_swap_limit_below_the_interim_one() {
        // kubelet's "no swap" (memory+swap = limit) stays "no swap" at the interim limit.
        let r = interim_reply(&with_memory(100 * MI, Some(100 * MI)), 100 << 20, 300 << 20);
        let m = r.memory.expect("memory");
        assert_eq!((m.limit, m.swap), (Some(300 * MI), Some(300 * MI)));
        // A swap allowance is kept on top of the interim limit.
        let r = interim_reply(&with_memory(100 * MI, Some(150 * MI)), 100 << 20, 300 << 20);
        assert_eq!(r.memory.expect("memory").swap, Some(350 * MI));
        // Unlimited swap (-1) is not restated.
        let r = interim_reply(&with_memory(100 * MI, Some(-1)), 100 << 20, 300 << 20);
        assert_eq!(r.memory.expect("memory").swap, None);
    }

    #[test]
    fn a_restart_reverts_only_what_the_request_changes() {
        let mut desired = with_memory(256 * MI, Some(512 * MI));
        desired.cpu.as_mut().unwrap().quota = Some(150_000);
        let r = keep_reply(&allocated(), &desired);
        assert_eq!(
            r,
            LinuxResources {
                cpu: Some(CpuResources {
                    quota: Some(50_000),
                    ..Default::default()
                }),
                memory: Some(MemoryResources {
                    limit: Some(512 * MI),
                    ..Default::default()
                }),
                ..Default::default()
            }
        );
    }

    #[test]
    fn a_restart_with_nothing_changed_sets_nothing() {
        assert_eq!(
            keep_reply(&allocated(), &allocated()),
            LinuxResources::default()
        );
    }

    #[test]
    fn a_field_the_container_never_had_is_not_invented() {
        // The request adds a unified key the container has no value for: nothing to put back.
        let mut desired = allocated();
        desired.unified.insert("pids.max".into(), "10".into());
        assert_eq!(
            keep_reply(&allocated(), &desired),
            LinuxResources::default()
        );
    }
}
