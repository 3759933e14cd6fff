//! Ordering-planner time for a 20-container pod in which every kind of change happens at once
//! (CPU and memory up, down, mixed, unchanged; pod net change), next to a naive baseline that
//! writes the pod first and then every container in the order given. Target: `plan` < 50 µs.
//!
//! Run: `cargo bench -p nri-resize --bench planner` (add `-- --quick` for a short run).

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use nri_resize::policy::{
    plan, simulate, Limit, Limits, LimitsUpdate, Plan, PlanOptions, PodResources, Step,
};

const CONTAINERS: u64 = 20;
const MI: u64 = 1 << 20;

fn pod(containers: BTreeMap<String, Limits>) -> PodResources {
    let sum = |f: fn(&Limits) -> Limit| {
        containers
            .values()
            .fold(Limit::Limited(0), |a, l| a.saturating_add(f(l)))
    };
    PodResources {
        pod: Limits {
            cpu: sum(|l| l.cpu),
            memory: sum(|l| l.memory),
            cpu_shares: Some(containers.values().filter_map(|l| l.cpu_shares).sum()),
        },
        containers,
    }
}

/// Container `i` changes CPU by (i mod 3 - 1) × 100m and memory by (i mod 4 - 1) × 64 MiB, so
/// the pod has increases, decreases, both kinds of mixed containers and unchanged ones.
fn scenario() -> (PodResources, PodResources) {
    let mut current = BTreeMap::new();
    let mut desired = BTreeMap::new();
    for i in 0..CONTAINERS {
        let (cpu, mem) = (500 + i * 10, (256 + i) * MI);
        let dcpu = (i % 3 * 100).wrapping_sub(100);
        let dmem = (i % 4 * 64 * MI).wrapping_sub(64 * MI);
        let name = format!("container-{i:02}");
        current.insert(
            name.clone(),
            Limits {
                cpu: Limit::Limited(cpu),
                memory: Limit::Limited(mem),
                cpu_shares: Some(cpu * 1024 / 1000),
            },
        );
        let cpu2 = cpu.wrapping_add(dcpu);
        desired.insert(
            name,
            Limits {
                cpu: Limit::Limited(cpu2),
                memory: Limit::Limited(mem.wrapping_add(dmem)),
                cpu_shares: Some(cpu2 * 1024 / 1000),
            },
        );
    }
    (pod(current), pod(desired))
}

/// The baseline: pod first, then every container in the order given, one write each.
fn naive_plan(desired: &PodResources) -> Plan {
    let full = |l: &Limits| LimitsUpdate {
        cpu: Some(l.cpu),
        memory: Some(l.memory),
        cpu_shares: l.cpu_shares,
    };
    let mut steps = Vec::with_capacity(desired.containers.len() + 1);
    steps.push(Step::SetPod(full(&desired.pod)));
    for (name, l) in &desired.containers {
        steps.push(Step::SetContainer {
            name: name.clone(),
            update: full(l),
        });
    }
    Plan { steps }
}

fn bench(c: &mut Criterion) {
    let (current, desired) = scenario();
    let opts = PlanOptions { cgroup_v1: true };
    let p = plan(&current, &desired, &opts).expect("the scenario is plannable");
    simulate(&current, &p, &opts).expect("the plan keeps the invariants");
    // The baseline's label says what the invariant check finds, not what we expect it to find.
    let naive_check = simulate(&current, &naive_plan(&desired), &opts);
    let naive_verdict = match &naive_check {
        Ok(_) => "keeps the invariants".to_string(),
        Err(e) => format!("breaks invariants: {e}"),
    };
    eprintln!(
        "planner: {} containers, {} steps (naive: {}); naive plan: {naive_verdict}",
        CONTAINERS,
        p.steps.len(),
        naive_plan(&desired).steps.len(),
    );

    // The table row: both measured here, interleaved, median of 9 rounds of 2,000 plans each.
    let per = |f: &dyn Fn()| {
        let t = std::time::Instant::now();
        for _ in 0..2_000 {
            f();
        }
        t.elapsed() / 2_000
    };
    let (mut naive, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..9 {
        naive.push(per(&|| drop(black_box(naive_plan(black_box(&desired))))));
        ours.push(per(&|| {
            drop(black_box(plan(
                black_box(&current),
                black_box(&desired),
                &opts,
            )));
        }));
    }
    naive.sort_unstable();
    ours.sort_unstable();
    let (naive_t, ours_t) = (naive[4], ours[4]);
    nri_resize::bench_table::row(
        &format!("planner, {CONTAINERS}-container pod"),
        &format!(
            "naive in-order plan ({naive_verdict}): {:.1} µs",
            naive_t.as_secs_f64() * 1e6
        ),
        &format!("{:.1} µs", ours_t.as_secs_f64() * 1e6),
        Some(ours_t.as_secs_f64() / naive_t.as_secs_f64().max(1e-12)),
        &format!(
            "< 50 µs: {}",
            nri_resize::bench_table::verdict(ours_t < std::time::Duration::from_micros(50))
        ),
    );

    let mut g = c.benchmark_group("planner/20-containers");
    g.bench_function("baseline: naive given order", |b| {
        b.iter(|| naive_plan(black_box(&desired)));
    });
    g.bench_function("plan", |b| {
        b.iter(|| plan(black_box(&current), black_box(&desired), &opts));
    });
    g.bench_function("plan + simulate", |b| {
        b.iter(|| {
            let p = plan(black_box(&current), black_box(&desired), &opts)?;
            simulate(&current, &p, &opts)
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
