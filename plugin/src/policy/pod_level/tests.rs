use std::collections::BTreeMap;

use super::*;
use crate::policy::{CpuSet, ResizeState};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

fn node() -> NodeCapacity {
    NodeCapacity {
        online_cpus_millis: 2000,
        memory_bytes: 8 * GI,
        reserved_memory_bytes: GI,
        online_cpus: CpuSet::first_n(2),
        reserved_cpu_millis: 100,
    }
}

fn limits(cpu: Option<u64>, mem: Option<u64>) -> Limits {
    Limits::new(Limit::from_option(cpu), Limit::from_option(mem))
}

fn containers(list: &[(&str, Option<u64>, Option<u64>)]) -> BTreeMap<String, Limits> {
    list.iter()
        .map(|(n, c, m)| ((*n).to_owned(), limits(*c, *m)))
        .collect()
}

/// A pod using `usage` bytes, all of it anonymous.
fn used(usage: u64) -> PodMemory {
    PodMemory {
        used: MemoryUse {
            usage,
            anon: usage,
            ..MemoryUse::default()
        },
        ..PodMemory::default()
    }
}

fn reason(a: &Admission) -> (ResizeState, String) {
    let s = a.resize_status();
    (s.state, s.reason)
}

#[test]
fn a_pod_limit_within_the_node_and_above_every_container_fits() {
    let c = containers(&[("app", Some(500), Some(128 * MI)), ("side", None, None)]);
    let a = admit_pod_level(
        &node(),
        None,
        &limits(Some(1000), Some(256 * MI)),
        &Limits::default(),
        &c,
        Some(&used(100 * MI)),
    );
    assert_eq!(a, Admission::Fits);
    // Unlimited pod limits never conflict with anything.
    let a = admit_pod_level(
        &node(),
        None,
        &limits(None, None),
        &Limits::default(),
        &c,
        Some(&used(7 * GI)),
    );
    assert_eq!(a, Admission::Fits);
}

#[test]
fn table_of_refusals_in_quantities() {
    let c = containers(&[("app", Some(500), Some(128 * MI))]);
    let cases: &[(Limits, Option<u64>, ResizeState, &str)] = &[
        (
            limits(Some(1901), None),
            None,
            ResizeState::Infeasible,
            "pod CPU limit 1901m exceeds the node's 1900m allocatable CPU",
        ),
        (
            limits(None, Some(7 * GI + 1)),
            None,
            ResizeState::Infeasible,
            "pod memory limit 7168Mi exceeds the node's 7Gi allocatable memory",
        ),
        (
            limits(Some(400), None),
            None,
            ResizeState::Infeasible,
            "container app CPU limit 500m exceeds the requested pod limit 400m",
        ),
        (
            limits(None, Some(64 * MI)),
            None,
            ResizeState::Infeasible,
            "container app memory limit 128Mi exceeds the requested pod limit 64Mi",
        ),
        (
            limits(None, Some(200 * MI)),
            Some(301 * MI + 1000),
            ResizeState::Deferred,
            "usage 301Mi above requested pod limit 200Mi: 301Mi of anonymous memory cannot be reclaimed without swap",
        ),
    ];
    for (want, usage, state, text) in cases {
        let got = reason(&admit_pod_level(
            &node(),
            None,
            want,
            &Limits::default(),
            &c,
            usage.map(used).as_ref(),
        ));
        assert_eq!(got, (*state, (*text).to_owned()), "{want:?}");
    }
}

#[test]
fn the_deferred_case_needs_a_known_usage_and_infeasible_comes_first() {
    let c = containers(&[("app", None, Some(300 * MI))]);
    // Unknown usage: no Deferred; the container check still refuses.
    let a = admit_pod_level(
        &node(),
        None,
        &limits(None, Some(100 * MI)),
        &Limits::default(),
        &c,
        None,
    );
    assert_eq!(reason(&a).0, ResizeState::Infeasible);
    let a = admit_pod_level(
        &node(),
        None,
        &limits(None, Some(100 * MI)),
        &Limits::default(),
        &BTreeMap::new(),
        None,
    );
    assert_eq!(a, Admission::Fits);
    // Usage equal to the limit fits.
    let a = admit_pod_level(
        &node(),
        None,
        &limits(None, Some(100 * MI)),
        &Limits::default(),
        &BTreeMap::new(),
        Some(&used(100 * MI)),
    );
    assert_eq!(a, Admission::Fits);
}

#[test]
fn annotations_only_tighten_the_mode() {
    let ann = |v: &str| BTreeMap::from([(POD_MODE_ANNOTATION.to_owned(), v.to_owned())]);
    assert_eq!(effective_enforce(false, &BTreeMap::new()), (false, None));
    assert_eq!(effective_enforce(true, &BTreeMap::new()), (true, None));
    assert_eq!(effective_enforce(false, &ann("Enforce")), (true, None));
    assert_eq!(effective_enforce(false, &ann(" Observe ")), (false, None));
    assert_eq!(
        effective_enforce(true, &ann("Observe")),
        (true, Some(PodModeError::Looser))
    );
    // The spelling of before 2026-11-25 reads as the current one (deprecated, reported by
    // `deprecated_spellings`), with the same outcome.
    assert_eq!(effective_enforce(false, &ann("enforce")), (true, None));
    assert_eq!(effective_enforce(false, &ann("observe")), (false, None));
    assert_eq!(
        effective_enforce(true, &ann("observe")),
        (true, Some(PodModeError::Looser))
    );
    assert!(effective_enforce(false, &ann("ENFORCE")).1.is_some());
    let (enforce, err) = effective_enforce(false, &ann("maybe"));
    assert!(!enforce);
    assert!(matches!(err, Some(PodModeError::Unknown { ref value }) if value == "maybe"));
}

#[test]
fn quantities_read_like_kubernetes() {
    assert_eq!(cpu_quantity(500), "500m");
    assert_eq!(memory_quantity(128 * MI), "128Mi");
    assert_eq!(memory_quantity(2 * GI), "2Gi");
    assert_eq!(memory_quantity(GI + MI), "1025Mi");
    assert_eq!(memory_quantity(301 * MI + 300_000), "301Mi");
    assert_eq!(memory_quantity(512 * 1024), "512Ki");
    assert_eq!(memory_quantity(1000), "1000");
}

#[test]
fn the_node_and_usage_are_judged_with_the_overhead_the_containers_without() {
    let overhead = limits(Some(100), Some(16 * MI));
    let c = containers(&[("app", Some(1000), Some(100 * MI))]);
    // 1850m + 100m overhead is above the 1900m allocatable.
    let a = admit_pod_level(
        &node(),
        None,
        &limits(Some(1850), None),
        &overhead,
        &c,
        None,
    );
    assert_eq!(
        reason(&a).1,
        "pod CPU limit 1950m exceeds the node's 1900m allocatable CPU"
    );
    // A 100Mi pod limit holds a 100Mi container; 110Mi used fits the 116Mi pod cgroup.
    let a = admit_pod_level(
        &node(),
        None,
        &limits(None, Some(100 * MI)),
        &overhead,
        &c,
        Some(&used(110 * MI)),
    );
    assert_eq!(a, Admission::Fits);
    let a = admit_pod_level(
        &node(),
        None,
        &limits(None, Some(100 * MI)),
        &overhead,
        &c,
        Some(&used(120 * MI)),
    );
    assert_eq!(
        reason(&a),
        (
            ResizeState::Deferred,
            "usage 120Mi above requested pod limit 116Mi: 120Mi of anonymous memory cannot be reclaimed without swap".to_owned()
        )
    );
    // No limit on the overhead adds nothing; an unlimited pod stays unlimited.
    let none = Limits::default();
    assert_eq!(
        with_overhead(&limits(Some(500), None), &none),
        limits(Some(500), None)
    );
    assert_eq!(with_overhead(&none, &overhead), none);
}

#[test]
fn a_lower_memory_limit_whose_usage_could_not_be_read_is_deferred() {
    let why = "pod cgroup read took longer than 500ms";
    for (asked, previous, held) in [
        // Lower than the last known limit, or nothing known: held back.
        (
            Limit::Limited(100 * MI),
            Some(Limit::Limited(200 * MI)),
            true,
        ),
        (Limit::Limited(100 * MI), Some(Limit::Unlimited), true),
        (Limit::Limited(100 * MI), None, true),
        // A raise, the same limit, or no limit at all: nothing to check.
        (
            Limit::Limited(300 * MI),
            Some(Limit::Limited(200 * MI)),
            false,
        ),
        (
            Limit::Limited(200 * MI),
            Some(Limit::Limited(200 * MI)),
            false,
        ),
        (Limit::Unlimited, None, false),
    ] {
        let verdict = admit_unchecked_memory(asked, previous, why);
        assert_eq!(verdict.is_some(), held, "{asked:?} after {previous:?}");
        if let Some(Admission::Deferred { reason }) = verdict {
            assert!(reason.contains(why) && reason.contains("100Mi"), "{reason}");
        }
    }
}

#[test]
fn a_pod_decrease_is_judged_by_what_cannot_be_reclaimed_and_what_trimming_found() {
    // 300Mi used: 60Mi anonymous, 20Mi of it tmpfs, the rest page cache.
    let pod = |usage: u64, ws: Option<u64>, v1: bool| PodMemory {
        used: MemoryUse {
            usage,
            anon: 40 * MI,
            shmem: 20 * MI,
            file: usage - 40 * MI,
        },
        trimmed_working_set: ws,
        reclaimed: 0,
        reclaim_unsupported: false,
        write_refuses: v1,
    };
    let admit = |limit: u64, m: &PodMemory| {
        reason(&admit_pod_level(
            &node(),
            None,
            &limits(None, Some(limit)),
            &Limits::default(),
            &BTreeMap::new(),
            Some(m),
        ))
    };
    let deferred = |text: &str| (ResizeState::Deferred, text.to_owned());
    // Below anonymous and shared memory: never, on either version.
    for v1 in [false, true] {
        assert_eq!(
            admit(50 * MI, &pod(300 * MI, None, v1)),
            deferred("usage 300Mi above requested pod limit 50Mi: 60Mi of anonymous memory (20Mi of it shared: tmpfs, shm) cannot be reclaimed without swap")
        );
    }
    // Above it, but below the working set trimming found: reclaiming would thrash.
    assert_eq!(
        admit(128 * MI, &pod(300 * MI, Some(200 * MI), false)),
        deferred("requested pod limit 128Mi is below the working set trimming found for the pod's containers (200Mi; usage 300Mi): reclaiming below it would evict memory they use")
    );
    // Only page cache in the way, on v2: reclaim first; still above after: wait, with figures.
    let m = pod(300 * MI, Some(100 * MI), false);
    assert!(m.needs_reclaim(128 * MI));
    assert!(!pod(300 * MI, Some(200 * MI), false).needs_reclaim(128 * MI));
    assert!(!pod(300 * MI, None, false).needs_reclaim(50 * MI));
    assert!(
        !pod(300 * MI, None, true).needs_reclaim(128 * MI),
        "v1: the write refuses"
    );
    assert!(
        !pod(100 * MI, None, false).needs_reclaim(128 * MI),
        "fits already"
    );
    let after = PodMemory {
        reclaimed: 100 * MI,
        ..pod(200 * MI, Some(100 * MI), false)
    };
    assert_eq!(
        admit(128 * MI, &after),
        deferred("usage 200Mi above requested pod limit 128Mi after 100Mi of page cache was reclaimed inline (140Mi of page cache still charged); the limit is written once usage fits")
    );
    // A kernel without memory.reclaim (5.10): nothing reclaimed inside the call, and it says why.
    let old_kernel = PodMemory {
        reclaim_unsupported: true,
        ..pod(200 * MI, Some(100 * MI), false)
    };
    assert_eq!(
        admit(128 * MI, &old_kernel),
        deferred("usage 200Mi above requested pod limit 128Mi (this kernel has no memory.reclaim, 5.19+: page cache cannot be reclaimed inside the call) (140Mi of page cache still charged); the limit is written once usage fits")
    );
    // Reclaimed under the limit: admitted. On v1 the write reclaims itself (or fails): admitted.
    let fits = |limit: u64, m: &PodMemory| {
        admit_pod_level(
            &node(),
            None,
            &limits(None, Some(limit)),
            &Limits::default(),
            &BTreeMap::new(),
            Some(m),
        ) == Admission::Fits
    };
    assert!(fits(128 * MI, &pod(120 * MI, Some(100 * MI), false)));
    assert!(fits(128 * MI, &pod(300 * MI, None, true)));
    // A breakdown that accounts for nothing (no memory.stat) counts all usage as anonymous.
    let blind = PodMemory {
        used: MemoryUse {
            usage: 300 * MI,
            ..MemoryUse::default()
        },
        ..PodMemory::default()
    };
    assert!(!blind.needs_reclaim(128 * MI));
    assert_eq!(admit(128 * MI, &blind).1, "usage 300Mi above requested pod limit 128Mi: memory.stat gives no breakdown, so all of it counts as memory that cannot be reclaimed");
}

/// kubelet 1.36 calls once per pod cgroup write (memory, then CPU), each call carrying the
/// resources it does not change as the pod has them: a pod that already holds a CPU limit above
/// the node's allocatable (1900m here: set before the node shrank) can still have its memory
/// resized and its CPU lowered; only raising a limit above allocatable is refused, and without
/// a known previous limit it is judged as before.
#[test]
fn a_limit_above_allocatable_is_refused_only_where_the_request_raises_it() {
    let c = containers(&[]);
    let before = limits(Some(2100), Some(GI));
    let memory_step = limits(Some(2100), Some(768 * MI));
    let fits = |previous: Option<&Limits>, asked: &Limits| {
        admit_pod_level(&node(), previous, asked, &Limits::default(), &c, None)
    };
    assert_eq!(fits(Some(&before), &memory_step), Admission::Fits);
    assert_eq!(
        fits(Some(&before), &limits(Some(2000), Some(768 * MI))),
        Admission::Fits,
        "lowered, if still above allocatable"
    );
    assert_eq!(
        reason(&fits(Some(&before), &limits(Some(2200), Some(768 * MI)))).1,
        "pod CPU limit 2200m exceeds the node's 1900m allocatable CPU"
    );
    assert_eq!(
        reason(&fits(None, &memory_step)).1,
        "pod CPU limit 2100m exceeds the node's 1900m allocatable CPU",
        "unknown before: judged as a raise"
    );
    let unlimited_before = limits(None, None);
    assert_eq!(
        fits(Some(&unlimited_before), &memory_step),
        Admission::Fits,
        "a limit where there was none lowers it"
    );
}
