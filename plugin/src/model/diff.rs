//! Field-by-field differences between two [`LinuxResources`]: what a reply to the runtime may
//! carry. NRI records one owner for every field a plugin sets (cpuset, each `unified` key, each
//! huge page size, ...), so a reply that restates a field it does not change takes it from the
//! plugin that does and fails the runtime's request.

use std::collections::BTreeMap;

use super::{CpuResources, HugepageLimit, LinuxResources, MemoryResources};

fn changed<T: Copy + PartialEq>(from: Option<T>, to: Option<T>) -> Option<T> {
    to.filter(|v| from != Some(*v))
}

fn changed_str(from: &str, to: &str) -> String {
    if to.is_empty() || to == from {
        String::new()
    } else {
        to.to_string()
    }
}

/// The fields set in `to` whose value differs from `from`'s (a field `from` leaves unset
/// differs); everything else unset. Applying the result over `from` gives `from` merged with
/// `to` ([`LinuxResources::merge`]).
pub fn fields_changed(from: &LinuxResources, to: &LinuxResources) -> LinuxResources {
    let fc = from.cpu.clone().unwrap_or_default();
    let cpu = to.cpu.as_ref().map(|t| CpuResources {
        shares: changed(fc.shares, t.shares),
        quota: changed(fc.quota, t.quota),
        period: changed(fc.period, t.period),
        realtime_runtime: changed(fc.realtime_runtime, t.realtime_runtime),
        realtime_period: changed(fc.realtime_period, t.realtime_period),
        cpus: changed_str(&fc.cpus, &t.cpus),
        mems: changed_str(&fc.mems, &t.mems),
    });
    let fm = from.memory.clone().unwrap_or_default();
    let memory = to.memory.as_ref().map(|t| MemoryResources {
        limit: changed(fm.limit, t.limit),
        reservation: changed(fm.reservation, t.reservation),
        swap: changed(fm.swap, t.swap),
        kernel: changed(fm.kernel, t.kernel),
        kernel_tcp: changed(fm.kernel_tcp, t.kernel_tcp),
        swappiness: changed(fm.swappiness, t.swappiness),
        disable_oom_killer: changed(fm.disable_oom_killer, t.disable_oom_killer),
        use_hierarchy: changed(fm.use_hierarchy, t.use_hierarchy),
    });
    let hugepage_limits = to
        .hugepage_limits
        .iter()
        .filter(|h| !from.hugepage_limits.contains(h))
        .cloned()
        .collect();
    let unified = to
        .unified
        .iter()
        .filter(|(k, v)| from.unified.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    LinuxResources {
        cpu: cpu.filter(|c| *c != CpuResources::default()),
        memory: memory.filter(|m| *m != MemoryResources::default()),
        hugepage_limits,
        blockio_class: to
            .blockio_class
            .clone()
            .filter(|v| from.blockio_class.as_ref() != Some(v)),
        rdt_class: to
            .rdt_class
            .clone()
            .filter(|v| from.rdt_class.as_ref() != Some(v)),
        unified,
        pids_limit: changed(from.pids_limit, to.pids_limit),
    }
}

fn pick<T: Copy>(src: Option<T>, mask: Option<T>) -> Option<T> {
    mask.and(src)
}

fn pick_str(src: &str, mask: &str) -> String {
    if mask.is_empty() {
        String::new()
    } else {
        src.to_string()
    }
}

/// `src`'s values of the fields set in `mask` (where `src` has them); everything else unset.
pub fn values_of(src: &LinuxResources, mask: &LinuxResources) -> LinuxResources {
    let sc = src.cpu.clone().unwrap_or_default();
    let cpu = mask.cpu.as_ref().map(|m| CpuResources {
        shares: pick(sc.shares, m.shares),
        quota: pick(sc.quota, m.quota),
        period: pick(sc.period, m.period),
        realtime_runtime: pick(sc.realtime_runtime, m.realtime_runtime),
        realtime_period: pick(sc.realtime_period, m.realtime_period),
        cpus: pick_str(&sc.cpus, &m.cpus),
        mems: pick_str(&sc.mems, &m.mems),
    });
    let sm = src.memory.clone().unwrap_or_default();
    let memory = mask.memory.as_ref().map(|m| MemoryResources {
        limit: pick(sm.limit, m.limit),
        reservation: pick(sm.reservation, m.reservation),
        swap: pick(sm.swap, m.swap),
        kernel: pick(sm.kernel, m.kernel),
        kernel_tcp: pick(sm.kernel_tcp, m.kernel_tcp),
        swappiness: pick(sm.swappiness, m.swappiness),
        disable_oom_killer: pick(sm.disable_oom_killer, m.disable_oom_killer),
        use_hierarchy: pick(sm.use_hierarchy, m.use_hierarchy),
    });
    let hugepage_limits: Vec<HugepageLimit> = src
        .hugepage_limits
        .iter()
        .filter(|h| {
            mask.hugepage_limits
                .iter()
                .any(|m| m.page_size == h.page_size)
        })
        .cloned()
        .collect();
    let unified: BTreeMap<String, String> = src
        .unified
        .iter()
        .filter(|(k, _)| mask.unified.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    LinuxResources {
        cpu: cpu.filter(|c| *c != CpuResources::default()),
        memory: memory.filter(|m| *m != MemoryResources::default()),
        hugepage_limits,
        blockio_class: mask.blockio_class.as_ref().and(src.blockio_class.clone()),
        rdt_class: mask.rdt_class.as_ref().and(src.rdt_class.clone()),
        unified,
        pids_limit: pick(src.pids_limit, mask.pids_limit),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> LinuxResources {
        LinuxResources {
            cpu: Some(CpuResources {
                shares: Some(1024),
                quota: Some(100_000),
                period: Some(100_000),
                cpus: "0-1".into(),
                mems: "0".into(),
                ..Default::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(512 << 20),
                swap: Some(512 << 20),
                ..Default::default()
            }),
            hugepage_limits: vec![HugepageLimit {
                page_size: "2MB".into(),
                limit: 0,
            }],
            unified: [("pids.max".to_string(), "100".to_string())].into(),
            pids_limit: Some(100),
            ..Default::default()
        }
    }

    #[test]
    fn nothing_changed_is_empty() {
        assert_eq!(fields_changed(&full(), &full()), LinuxResources::default());
    }

    #[test]
    fn only_what_differs_is_kept() {
        let mut to = full();
        to.memory.as_mut().unwrap().limit = Some(256 << 20);
        to.unified.insert("memory.high".into(), "max".into());
        let d = fields_changed(&full(), &to);
        assert_eq!(
            d,
            LinuxResources {
                memory: Some(MemoryResources {
                    limit: Some(256 << 20),
                    ..Default::default()
                }),
                unified: [("memory.high".to_string(), "max".to_string())].into(),
                ..Default::default()
            }
        );
        let mut merged = full();
        merged.merge(&d);
        assert_eq!(merged, to);
    }

    #[test]
    fn unset_in_from_counts_as_changed() {
        let d = fields_changed(&LinuxResources::default(), &full());
        assert_eq!(d, full());
    }

    #[test]
    fn values_of_takes_the_masked_fields_only() {
        let mask = LinuxResources {
            cpu: Some(CpuResources {
                quota: Some(1),
                ..Default::default()
            }),
            memory: Some(MemoryResources {
                limit: Some(1),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = values_of(&full(), &mask);
        assert_eq!(
            v,
            LinuxResources {
                cpu: Some(CpuResources {
                    quota: Some(100_000),
                    ..Default::default()
                }),
                memory: Some(MemoryResources {
                    limit: Some(512 << 20),
                    ..Default::default()
                }),
                ..Default::default()
            }
        );
        assert_eq!(
            values_of(&full(), &LinuxResources::default()),
            LinuxResources::default()
        );
    }
}
