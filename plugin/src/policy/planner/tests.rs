//! Planner tests: the KEP-1287 e2e matrix (every case checks the exact step order and simulates
//! the plan step by step), the intermediate-step case, `plan_single`, and a property test.

use std::collections::BTreeMap;

use super::*;
use crate::policy::quantity::millis_to_shares;
use Limit::{Limited as L, Unlimited as U};

const MI: u64 = 1 << 20;
const V1: PlanOptions = PlanOptions { cgroup_v1: true };
const V2: PlanOptions = PlanOptions { cgroup_v1: false };

/// Guaranteed container: CPU request = limit (millicores), memory limit in MiB.
fn g(cpu: u64, mem_mi: u64) -> Limits {
    Limits {
        cpu: L(cpu),
        memory: L(mem_mi * MI),
        cpu_shares: Some(millis_to_shares(cpu)),
    }
}

/// Burstable container: CPU request (0 = none), CPU limit, memory limit in MiB.
fn b(cpu_req: u64, cpu_lim: Option<u64>, mem_mi: Option<u64>) -> Limits {
    Limits {
        cpu: Limit::from_option(cpu_lim),
        memory: Limit::from_option(mem_mi.map(|m| m * MI)),
        cpu_shares: Some(millis_to_shares(cpu_req)),
    }
}

/// A pod as kubelet sets it up: pod limits = sum of container limits (unlimited if any
/// container is), pod shares = sum of container shares.
fn pod(cs: &[(&str, Limits)]) -> PodResources {
    let containers: BTreeMap<String, Limits> =
        cs.iter().map(|(n, l)| ((*n).to_string(), *l)).collect();
    let sum = |r| {
        containers
            .values()
            .fold(L(0), |a, l: &Limits| a.saturating_add(l.get(r)))
    };
    PodResources {
        pod: Limits {
            cpu: sum(Resource::Cpu),
            memory: sum(Resource::Memory),
            cpu_shares: Some(containers.values().filter_map(|l| l.cpu_shares).sum()),
        },
        containers,
    }
}

fn check(name: &str, current: &[(&str, Limits)], desired: &[(&str, Limits)], want: &[&str]) {
    let (c, d) = (pod(current), pod(desired));
    for opts in [V1, V2] {
        let p = plan(&c, &d, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got: Vec<String> = p.steps.iter().map(ToString::to_string).collect();
        assert_eq!(got, want, "{name} (v1: {})", opts.cgroup_v1);
        let end = simulate(&c, &p, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            end, d,
            "{name}: simulation does not end in the desired state"
        );
    }
}

// ---- KEP-1287 e2e: Guaranteed pod, one container -------------------------------------------

#[test]
fn e2e_guaranteed_one_container() {
    let c = [("c1", g(500, 256))];
    let cases: [(&str, Limits, &[&str]); 8] = [
        (
            "cpu increase",
            g(1000, 256),
            &["pod cpu=1000m shares=1024", "c1 cpu=1000m shares=1024"],
        ),
        (
            "cpu decrease",
            g(250, 256),
            &["c1 cpu=250m shares=256", "pod cpu=250m shares=256"],
        ),
        (
            "memory increase",
            g(500, 512),
            &["pod memory=512Mi", "c1 memory=512Mi"],
        ),
        (
            "memory decrease",
            g(500, 128),
            &["c1 memory=128Mi", "pod memory=128Mi"],
        ),
        (
            "cpu and memory increase",
            g(1000, 512),
            &[
                "pod cpu=1000m memory=512Mi shares=1024",
                "c1 cpu=1000m memory=512Mi shares=1024",
            ],
        ),
        (
            "cpu and memory decrease",
            g(250, 128),
            &[
                "c1 cpu=250m memory=128Mi shares=256",
                "pod cpu=250m memory=128Mi shares=256",
            ],
        ),
        (
            "increase cpu, decrease memory",
            g(1000, 128),
            &[
                "pod cpu=1000m shares=1024",
                "c1 cpu=1000m memory=128Mi shares=1024",
                "pod memory=128Mi",
            ],
        ),
        (
            "decrease cpu, increase memory",
            g(250, 512),
            &[
                "pod memory=512Mi",
                "c1 cpu=250m memory=512Mi shares=256",
                "pod cpu=250m shares=256",
            ],
        ),
    ];
    for (name, want, steps) in cases {
        check(name, &c, &[("c1", want)], steps);
    }
}

// ---- KEP-1287 e2e: Burstable pod, one container with CPU and memory --------------------------

#[test]
fn e2e_burstable_one_container_cpu_and_memory() {
    // requests: cpu 250m (shares 256), memory 128Mi (not visible to the runtime: memory request
    // changes alone write nothing); limits: cpu 500m, memory 256Mi.
    let c = [("c1", b(250, Some(500), Some(256)))];
    let cases: Vec<(&str, Limits, Vec<&str>)> = vec![
        (
            "increase cpu requests",
            b(400, Some(500), Some(256)),
            vec!["pod shares=409", "c1 shares=409"],
        ),
        (
            "decrease cpu requests",
            b(100, Some(500), Some(256)),
            vec!["c1 shares=102", "pod shares=102"],
        ),
        (
            "increase/decrease memory requests",
            b(250, Some(500), Some(256)),
            vec![],
        ),
        (
            "increase cpu+memory requests",
            b(400, Some(500), Some(256)),
            vec!["pod shares=409", "c1 shares=409"],
        ),
        (
            "increase cpu limits",
            b(250, Some(1000), Some(256)),
            vec!["pod cpu=1000m", "c1 cpu=1000m"],
        ),
        (
            "decrease cpu limits",
            b(250, Some(400), Some(256)),
            vec!["c1 cpu=400m", "pod cpu=400m"],
        ),
        (
            "increase memory limits",
            b(250, Some(500), Some(512)),
            vec!["pod memory=512Mi", "c1 memory=512Mi"],
        ),
        (
            "decrease memory limits",
            b(250, Some(500), Some(200)),
            vec!["c1 memory=200Mi", "pod memory=200Mi"],
        ),
        (
            "increase cpu+memory limits",
            b(250, Some(1000), Some(512)),
            vec!["pod cpu=1000m memory=512Mi", "c1 cpu=1000m memory=512Mi"],
        ),
        (
            "decrease cpu+memory limits",
            b(250, Some(400), Some(200)),
            vec!["c1 cpu=400m memory=200Mi", "pod cpu=400m memory=200Mi"],
        ),
        (
            "increase cpu requests+limits",
            b(400, Some(1000), Some(256)),
            vec!["pod cpu=1000m shares=409", "c1 cpu=1000m shares=409"],
        ),
        (
            "decrease cpu requests+limits",
            b(100, Some(400), Some(256)),
            vec!["c1 cpu=400m shares=102", "pod cpu=400m shares=102"],
        ),
        (
            "increase memory requests+limits",
            b(250, Some(500), Some(512)),
            vec!["pod memory=512Mi", "c1 memory=512Mi"],
        ),
        (
            "decrease memory requests+limits",
            b(250, Some(500), Some(200)),
            vec!["c1 memory=200Mi", "pod memory=200Mi"],
        ),
        (
            "increase cpu+memory requests+limits",
            b(400, Some(1000), Some(512)),
            vec![
                "pod cpu=1000m memory=512Mi shares=409",
                "c1 cpu=1000m memory=512Mi shares=409",
            ],
        ),
        (
            "decrease cpu+memory requests+limits",
            b(100, Some(400), Some(200)),
            vec![
                "c1 cpu=400m memory=200Mi shares=102",
                "pod cpu=400m memory=200Mi shares=102",
            ],
        ),
        (
            "increase cpu, decrease memory (requests+limits)",
            b(400, Some(1000), Some(200)),
            vec![
                "pod cpu=1000m shares=409",
                "c1 cpu=1000m memory=200Mi shares=409",
                "pod memory=200Mi",
            ],
        ),
        (
            "decrease cpu, increase memory (requests+limits)",
            b(100, Some(400), Some(512)),
            vec![
                "pod memory=512Mi",
                "c1 cpu=400m memory=512Mi shares=102",
                "pod cpu=400m shares=102",
            ],
        ),
        (
            "increase cpu requests while decreasing cpu limits",
            b(400, Some(450), Some(256)),
            vec!["c1 cpu=450m shares=409", "pod cpu=450m shares=409"],
        ),
        (
            "decrease cpu requests while increasing cpu limits",
            b(100, Some(1000), Some(256)),
            vec!["pod cpu=1000m shares=102", "c1 cpu=1000m shares=102"],
        ),
        (
            "increase memory requests while decreasing memory limits",
            b(250, Some(500), Some(200)),
            vec!["c1 memory=200Mi", "pod memory=200Mi"],
        ),
        (
            "decrease memory requests while increasing memory limits",
            b(250, Some(500), Some(512)),
            vec!["pod memory=512Mi", "c1 memory=512Mi"],
        ),
        (
            "cpu: requests up limits down; memory: requests up limits down",
            b(400, Some(450), Some(200)),
            vec![
                "c1 cpu=450m memory=200Mi shares=409",
                "pod cpu=450m memory=200Mi shares=409",
            ],
        ),
        (
            "cpu: requests down limits up; memory: requests down limits up",
            b(100, Some(1000), Some(512)),
            vec![
                "pod cpu=1000m memory=512Mi shares=102",
                "c1 cpu=1000m memory=512Mi shares=102",
            ],
        ),
    ];
    for (name, want, steps) in cases {
        check(name, &c, &[("c1", want)], &steps);
    }
}

// ---- KEP-1287 e2e: Burstable pod, one container, CPU only / memory only ----------------------

#[test]
fn e2e_burstable_one_container_cpu_only() {
    // No memory limit anywhere: the pod has none either.
    let c = [("c1", b(250, Some(500), None))];
    let cases: Vec<(&str, Limits, Vec<&str>)> = vec![
        (
            "increase requests",
            b(400, Some(500), None),
            vec!["pod shares=409", "c1 shares=409"],
        ),
        (
            "decrease requests",
            b(100, Some(500), None),
            vec!["c1 shares=102", "pod shares=102"],
        ),
        (
            "increase limits",
            b(250, Some(1000), None),
            vec!["pod cpu=1000m", "c1 cpu=1000m"],
        ),
        (
            "decrease limits",
            b(250, Some(400), None),
            vec!["c1 cpu=400m", "pod cpu=400m"],
        ),
        (
            "increase requests+limits",
            b(400, Some(1000), None),
            vec!["pod cpu=1000m shares=409", "c1 cpu=1000m shares=409"],
        ),
        (
            "decrease requests+limits",
            b(100, Some(400), None),
            vec!["c1 cpu=400m shares=102", "pod cpu=400m shares=102"],
        ),
    ];
    for (name, want, steps) in cases {
        check(name, &c, &[("c1", want)], &steps);
    }
}

#[test]
fn e2e_burstable_one_container_memory_only() {
    // No CPU request (shares 2) and no CPU limit: the pod has no CPU limit.
    let c = [("c1", b(0, None, Some(256)))];
    let cases: Vec<(&str, Limits, Vec<&str>)> = vec![
        ("increase/decrease requests", b(0, None, Some(256)), vec![]),
        (
            "increase limits",
            b(0, None, Some(512)),
            vec!["pod memory=512Mi", "c1 memory=512Mi"],
        ),
        (
            "decrease limits",
            b(0, None, Some(128)),
            vec!["c1 memory=128Mi", "pod memory=128Mi"],
        ),
        (
            "increase requests+limits",
            b(0, None, Some(512)),
            vec!["pod memory=512Mi", "c1 memory=512Mi"],
        ),
        (
            "decrease requests+limits",
            b(0, None, Some(128)),
            vec!["c1 memory=128Mi", "pod memory=128Mi"],
        ),
    ];
    for (name, want, steps) in cases {
        check(name, &c, &[("c1", want)], &steps);
    }
}

// ---- KEP-1287 e2e: Guaranteed pod, three containers -----------------------------------------

type ThreeCase = (&'static str, [(&'static str, Limits); 3], Vec<&'static str>);

#[test]
fn e2e_guaranteed_three_containers() {
    let c = [
        ("c1", g(500, 256)),
        ("c2", g(500, 256)),
        ("c3", g(500, 256)),
    ];
    let all = |l: Limits| [("c1", l), ("c2", l), ("c3", l)];
    let cases: Vec<ThreeCase> = vec![
        (
            "increase cpu & memory for all three",
            all(g(750, 384)),
            vec![
                "pod cpu=2250m memory=1152Mi shares=2304",
                "c1 cpu=750m memory=384Mi shares=768",
                "c2 cpu=750m memory=384Mi shares=768",
                "c3 cpu=750m memory=384Mi shares=768",
            ],
        ),
        (
            "decrease cpu & memory for all three",
            all(g(250, 128)),
            vec![
                "c1 cpu=250m memory=128Mi shares=256",
                "c2 cpu=250m memory=128Mi shares=256",
                "c3 cpu=250m memory=128Mi shares=256",
                "pod cpu=750m memory=384Mi shares=768",
            ],
        ),
        (
            "increase cpu, decrease memory for all three",
            all(g(750, 128)),
            vec![
                "pod cpu=2250m shares=2304",
                "c1 cpu=750m memory=128Mi shares=768",
                "c2 cpu=750m memory=128Mi shares=768",
                "c3 cpu=750m memory=128Mi shares=768",
                "pod memory=384Mi",
            ],
        ),
        (
            "decrease cpu, increase memory for all three",
            all(g(250, 384)),
            vec![
                "pod memory=1152Mi",
                "c1 cpu=250m memory=384Mi shares=256",
                "c2 cpu=250m memory=384Mi shares=256",
                "c3 cpu=250m memory=384Mi shares=256",
                "pod cpu=750m shares=768",
            ],
        ),
        (
            "increase cpu c1, decrease c2, c3 unchanged: no net cpu change",
            [
                ("c1", g(750, 256)),
                ("c2", g(250, 256)),
                ("c3", g(500, 256)),
            ],
            vec!["c2 cpu=250m shares=256", "c1 cpu=750m shares=768"],
        ),
        (
            "increase memory c1, decrease c2, c3 unchanged: no net memory change",
            [
                ("c1", g(500, 384)),
                ("c2", g(500, 128)),
                ("c3", g(500, 256)),
            ],
            vec!["c2 memory=128Mi", "c1 memory=384Mi"],
        ),
        (
            "increase cpu c1, decrease c2 & c3: net cpu decrease",
            [
                ("c1", g(750, 256)),
                ("c2", g(250, 256)),
                ("c3", g(250, 256)),
            ],
            vec![
                "c2 cpu=250m shares=256",
                "c3 cpu=250m shares=256",
                "c1 cpu=750m shares=768",
                "pod cpu=1250m shares=1280",
            ],
        ),
        (
            "increase memory c1, decrease c2 & c3: net memory decrease",
            [
                ("c1", g(500, 384)),
                ("c2", g(500, 128)),
                ("c3", g(500, 128)),
            ],
            vec![
                "c2 memory=128Mi",
                "c3 memory=128Mi",
                "c1 memory=384Mi",
                "pod memory=640Mi",
            ],
        ),
        (
            "increase cpu c1 & c3, decrease c2: net cpu increase",
            [
                ("c1", g(750, 256)),
                ("c2", g(250, 256)),
                ("c3", g(750, 256)),
            ],
            vec![
                "pod cpu=1750m shares=1792",
                "c2 cpu=250m shares=256",
                "c1 cpu=750m shares=768",
                "c3 cpu=750m shares=768",
            ],
        ),
        (
            "increase memory c1 & c3, decrease c2: net memory increase",
            [
                ("c1", g(500, 384)),
                ("c2", g(500, 128)),
                ("c3", g(500, 384)),
            ],
            vec![
                "pod memory=896Mi",
                "c2 memory=128Mi",
                "c1 memory=384Mi",
                "c3 memory=384Mi",
            ],
        ),
    ];
    for (name, want, steps) in cases {
        check(name, &c, &want, &steps);
    }
}

#[test]
fn burstable_three_containers_with_an_unlimited_one() {
    // c3 has no CPU limit, so the pod has none: CPU limit writes need no ordering, memory does.
    let c = [
        ("c1", b(250, Some(500), Some(256))),
        ("c2", b(250, Some(500), Some(256))),
        ("c3", b(100, None, Some(256))),
    ];
    let d = [
        ("c1", b(250, Some(1000), Some(128))),
        ("c2", b(250, Some(250), Some(384))),
        ("c3", b(100, None, Some(256))),
    ];
    check(
        "burstable 3",
        &c,
        &d,
        &[
            "c2 cpu=250m",
            "c1 cpu=1000m memory=128Mi",
            "c2 memory=384Mi",
        ],
    );
    // c3 gains a CPU limit: the pod gets one, last.
    let d2 = [
        ("c1", b(250, Some(500), Some(256))),
        ("c2", b(250, Some(500), Some(256))),
        ("c3", b(100, Some(200), Some(256))),
    ];
    check("limit appears", &c, &d2, &["c3 cpu=200m", "pod cpu=1200m"]);
    // ...and loses it again: the pod loses it first.
    check(
        "limit disappears",
        &d2,
        &c,
        &["pod cpu=unlimited", "c3 cpu=unlimited"],
    );
}

// ---- Intermediate steps ----------------------------------------------------------------------

#[test]
fn single_resource_swap_orders_decrease_first() {
    // Tight pod limit; c1 grows by what c2 gives up. The naive name order breaks the pod limit.
    let c = pod(&[("c1", g(1000, 256)), ("c2", g(2000, 256))]);
    let d = pod(&[("c1", g(2000, 256)), ("c2", g(1000, 256))]);
    let p = plan(&c, &d, &V1).unwrap();
    assert_eq!(
        p.to_string(),
        "c2 cpu=1000m shares=1024; c1 cpu=2000m shares=2048"
    );
    assert_eq!(simulate(&c, &p, &V1).unwrap(), d);
    let naive = Plan {
        steps: d
            .containers
            .iter()
            .map(|(n, l)| Step::SetContainer {
                name: n.clone(),
                update: LimitsUpdate {
                    cpu: Some(l.cpu),
                    memory: Some(l.memory),
                    cpu_shares: l.cpu_shares,
                },
            })
            .collect(),
    };
    assert!(matches!(
        simulate(&c, &naive, &V1),
        Err(PlanError::StepViolates {
            step: 0,
            violation: Violation::SumAbovePod { .. },
            ..
        })
    ));
}

#[test]
fn mixed_swap_needs_an_intermediate_step() {
    // c1: CPU up, memory down; c2: the opposite; pod limits tight and unchanged.
    let c = PodResources {
        pod: Limits::new(L(3000), L(3 << 30)),
        containers: [
            ("c1".to_string(), Limits::new(L(1000), L(2 << 30))),
            ("c2".to_string(), Limits::new(L(2000), L(1 << 30))),
        ]
        .into(),
    };
    let mut d = c.clone();
    d.containers
        .insert("c1".into(), Limits::new(L(2000), L(1 << 30)));
    d.containers
        .insert("c2".into(), Limits::new(L(1000), L(2 << 30)));

    // No order of one full write per container works.
    let full = |n: &str| Step::SetContainer {
        name: n.to_string(),
        update: LimitsUpdate {
            cpu: Some(d.containers[n].cpu),
            memory: Some(d.containers[n].memory),
            cpu_shares: None,
        },
    };
    for order in [["c1", "c2"], ["c2", "c1"]] {
        let p = Plan {
            steps: order.iter().map(|n| full(n)).collect(),
        };
        assert!(simulate(&c, &p, &V2).is_err(), "{p}");
    }

    // The planner splits c2: its CPU decrease first, its memory increase last.
    for opts in [V1, V2] {
        let p = plan(&c, &d, &opts).unwrap();
        assert_eq!(
            p.to_string(),
            "c2 cpu=1000m; c1 cpu=2000m memory=1Gi; c2 memory=2Gi"
        );
        assert_eq!(simulate(&c, &p, &opts).unwrap(), d);
    }
}

// ---- Edge cases ------------------------------------------------------------------------------

#[test]
fn no_change_is_an_empty_plan() {
    let c = pod(&[("a", g(500, 256)), ("b", b(100, None, None))]);
    assert!(plan(&c, &c, &V1).unwrap().is_empty());
}

#[test]
fn pod_only_changes_merge_into_one_write() {
    // Overhead changes: pod CPU up, memory down, no container writes.
    let c = PodResources {
        pod: Limits::new(L(1000), L(512 * MI)),
        containers: [("a".to_string(), Limits::new(L(500), L(256 * MI)))].into(),
    };
    let mut d = c.clone();
    d.pod = Limits::new(L(1500), L(300 * MI));
    let p = plan(&c, &d, &V1).unwrap();
    assert_eq!(p.to_string(), "pod cpu=1500m memory=300Mi");
}

#[test]
fn plan_errors() {
    let c = pod(&[("a", g(500, 256))]);
    let d = pod(&[("b", g(500, 256))]);
    assert_eq!(
        plan(&c, &d, &V1),
        Err(PlanError::UnknownContainer { name: "b".into() })
    );
    let mut bad = c.clone();
    bad.containers.insert("a".into(), g(600, 256));
    let err = plan(&c, &bad, &V1).unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::DesiredViolates(Violation::ChildCpuAboveParent { .. })
        ),
        "{err}"
    );
    let err = plan(&c, &bad, &V2).unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::DesiredViolates(Violation::SumAbovePod { .. })
        ),
        "{err}"
    );
    let ghost = Plan {
        steps: vec![Step::SetContainer {
            name: "ghost".into(),
            update: LimitsUpdate::default(),
        }],
    };
    assert!(matches!(
        simulate(&c, &ghost, &V1),
        Err(PlanError::UnknownContainer { .. })
    ));
}

#[test]
fn containers_missing_from_desired_keep_their_values() {
    let c = pod(&[("a", g(500, 256)), ("b", g(500, 256))]);
    let mut d = c.clone();
    d.containers.remove("b");
    d.containers.insert("a".into(), g(250, 256));
    d.pod.cpu = L(750);
    d.pod.cpu_shares = Some(768);
    let p = plan(&c, &d, &V1).unwrap();
    assert_eq!(
        p.to_string(),
        "a cpu=250m shares=256; pod cpu=750m shares=768"
    );
    let end = simulate(&c, &p, &V1).unwrap();
    assert_eq!(end.containers["b"], g(500, 256));
}

// ---- plan_single (kubelet-style one-container updates) ---------------------------------------

#[test]
fn plan_single_table() {
    // Pod limit = sum + 100m / 64Mi overhead.
    let mut c = pod(&[("a", g(500, 256)), ("b", g(500, 256))]);
    c.pod.cpu = L(1100);
    c.pod.memory = L(576 * MI);
    let cases: Vec<(&str, PlanOptions, Limits, Option<&str>)> = vec![
        // kubernetes/kubernetes#127356: CPU up on v1 needs the pod raised first.
        ("cpu up v1", V1, g(800, 256), Some("pod cpu=1400m")),
        ("cpu up v2", V2, g(800, 256), Some("pod cpu=1400m")),
        ("within headroom", V1, g(550, 256), None),
        ("cpu down", V1, g(100, 256), None),
        ("memory up", V1, g(500, 512), Some("pod memory=832Mi")),
        (
            "both up",
            V2,
            g(1000, 512),
            Some("pod cpu=1600m memory=832Mi"),
        ),
        (
            "becomes unlimited",
            V1,
            Limits::new(U, L(256 * MI)),
            Some("pod cpu=unlimited"),
        ),
    ];
    for (name, opts, want, step) in cases {
        let got = plan_single(&c, "a", &want, &opts).unwrap();
        assert_eq!(
            got.as_ref().map(ToString::to_string).as_deref(),
            step,
            "{name}"
        );
        // Raise, then write the container: the invariants hold.
        let mut steps: Vec<Step> = got.into_iter().collect();
        steps.push(Step::SetContainer {
            name: "a".into(),
            update: LimitsUpdate {
                cpu: Some(want.cpu),
                memory: Some(want.memory),
                cpu_shares: None,
            },
        });
        simulate(&c, &Plan { steps }, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(plan_single(&c, "zz", &g(1, 1), &V1).is_err());
    // An unlimited pod never needs a raise.
    let mut unl = c.clone();
    unl.pod = Limits::new(U, U);
    assert_eq!(plan_single(&unl, "a", &g(4000, 4096), &V1).unwrap(), None);
}

// ---- Property test ---------------------------------------------------------------------------

/// xorshift64*: deterministic, dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn limit(&mut self, max: u64, unlimited_one_in: u64) -> Limit {
        if self.below(unlimited_one_in) == 0 {
            U
        } else {
            // Coarse values make equal values (no change) common.
            L(self.below(max / 100 + 1) * 100)
        }
    }
}

/// A valid random state over the given container names: pod limits are the containers' sum
/// plus some headroom, or unlimited.
fn random_state(rng: &mut Rng, names: &[String]) -> PodResources {
    let containers: BTreeMap<String, Limits> = names
        .iter()
        .map(|n| {
            let l = Limits {
                cpu: rng.limit(4000, 8),
                memory: rng.limit(4000, 8),
                cpu_shares: Some(2 + rng.below(4)),
            };
            (n.clone(), l)
        })
        .collect();
    let [cpu, memory] = Resource::ALL.map(|r| {
        let sum = containers
            .values()
            .fold(L(0), |a, l| a.saturating_add(l.get(r)));
        if rng.below(6) == 0 {
            U
        } else {
            sum.saturating_add(L(rng.below(3) * 100))
        }
    });
    let pod = Limits {
        cpu,
        memory,
        cpu_shares: Some(rng.below(3)),
    };
    PodResources { pod, containers }
}

#[test]
fn property_random_plans_keep_invariants_and_reach_desired() {
    let mut rng = Rng(0x5eed_1287);
    let mut steps_total = 0usize;
    for case in 0..20_000 {
        let n = 1 + rng.below(6);
        let names: Vec<String> = (0..n).map(|i| format!("c{i}")).collect();
        let current = random_state(&mut rng, &names);
        let desired = random_state(&mut rng, &names);
        for opts in [V1, V2] {
            let p = plan(&current, &desired, &opts)
                .unwrap_or_else(|e| panic!("case {case}: {e}\n{current:?}\n{desired:?}"));
            let end = simulate(&current, &p, &opts).unwrap_or_else(|e| {
                panic!("case {case}: {e}\nplan: {p}\n{current:?}\n{desired:?}")
            });
            assert_eq!(end, desired, "case {case}: plan {p}");
            // At most two writes per container (one unless it is split) and two pod writes.
            for name in &names {
                let writes = p
                    .steps
                    .iter()
                    .filter(|s| matches!(s, Step::SetContainer { name: n, .. } if n == name))
                    .count();
                assert!(
                    writes <= 2,
                    "case {case}: {name} written {writes} times: {p}"
                );
            }
            assert!(
                p.steps
                    .iter()
                    .filter(|s| matches!(s, Step::SetPod(_)))
                    .count()
                    <= 2
            );
            assert!(
                p.steps.iter().all(|s| !s.update().is_empty()),
                "case {case}: {p}"
            );
            steps_total += p.steps.len();
        }
    }
    assert!(
        steps_total > 20_000,
        "the generator should produce real plans"
    );
}

#[test]
fn property_every_prefix_is_safe_to_stop_at() {
    // KEP failure handling: stop after a failed write; whatever was written must be safe.
    let mut rng = Rng(42);
    for _ in 0..2000 {
        let names: Vec<String> = (0..4).map(|i| format!("c{i}")).collect();
        let current = random_state(&mut rng, &names);
        let desired = random_state(&mut rng, &names);
        let p = plan(&current, &desired, &V1).unwrap();
        for k in 0..=p.steps.len() {
            let prefix = Plan {
                steps: p.steps[..k].to_vec(),
            };
            let state = simulate(&current, &prefix, &V1).unwrap();
            check_invariants(&state, &V1).unwrap();
        }
    }
}
