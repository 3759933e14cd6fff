//! The pacer's rules, pass by pass.

use super::*;

const MIB: u64 = 1 << 20;
const BASE: Duration = Duration::from_millis(100);

fn stall(memory: f64, io: f64) -> Harm {
    Harm {
        memory,
        io,
        refaulted: 0,
    }
}

#[test]
fn it_starts_small_and_doubles_while_the_stall_stays_under_a_quarter_of_the_ceiling() {
    let mut p = Pacer::new(Share::new(0.05), BASE);
    assert_eq!((p.step(u64::MAX), p.wait()), (MIB, BASE));
    assert_eq!(p.step(MIB / 2), MIB / 2, "never more than what is left");
    for want in [2, 4, 8] {
        assert_eq!(p.observe(stall(0.01, 0.0), 0), PaceChange::Faster);
        assert_eq!(p.step(u64::MAX), want * MIB);
    }
    assert_eq!(
        p.observe(stall(0.0, 0.02), 0),
        PaceChange::Same,
        "over a quarter of the ceiling, under half of it"
    );
    assert_eq!((p.step(u64::MAX), p.wait()), (8 * MIB, BASE));
}

#[test]
fn from_half_the_ceiling_it_holds_until_the_stall_is_under_a_quarter_then_resumes_small() {
    let mut p = Pacer::new(Share::new(0.05), BASE);
    for _ in 0..5 {
        p.observe(stall(0.0, 0.0), 0);
    }
    assert_eq!(p.step(u64::MAX), 32 * MIB);
    assert_eq!(
        p.observe(stall(0.03, 0.0), 0),
        PaceChange::Hold,
        "under the ceiling, but the harm of the steps taken stays: no more"
    );
    assert!(p.holding());
    assert_eq!(
        (p.step(u64::MAX), p.wait()),
        (0, 2 * BASE),
        "holding reclaims nothing"
    );
    assert_eq!(p.over_ceiling, 0);
    for _ in 0..10 {
        assert_eq!(p.observe(stall(0.09, 0.0), 0), PaceChange::Hold);
    }
    assert_eq!(
        (p.step(u64::MAX), p.wait()),
        (0, MAX_WAIT),
        "the wait is capped"
    );
    assert_eq!(p.observe(stall(0.025, 0.0), 0), PaceChange::Hold);
    assert_eq!(
        p.observe(stall(0.02, 0.0), 0),
        PaceChange::Hold,
        "under half the ceiling, not yet under a quarter"
    );
    assert_eq!(p.observe(stall(0.012, 0.0), 0), PaceChange::Resume);
    assert_eq!(
        (p.step(u64::MAX), p.wait()),
        (MIN_STEP, MAX_WAIT / 2),
        "resumes small"
    );
    assert_eq!(p.observe(stall(0.02, 0.0), 0), PaceChange::Same);
    assert_eq!(p.observe(stall(0.0, 0.0), 0), PaceChange::Faster);
    assert_eq!(p.observe(stall(0.01, 0.0), 0), PaceChange::Faster);
    assert_eq!(
        (p.step(u64::MAX), p.wait()),
        (3 * MIB, MAX_WAIT / 8),
        "after a hold, steps grow by 1 MiB a pass"
    );
    assert_eq!((p.holds, p.over_ceiling), (1, 10));
    assert!((p.worst_stall - 0.09).abs() < 1e-9);
}

#[test]
fn io_stall_counts_as_much_as_memory_stall() {
    let mut p = Pacer::new(Share::new(0.05), BASE);
    assert_eq!(
        p.observe(stall(0.0, 0.08), 0),
        PaceChange::Hold,
        "refaults waiting on I/O only (6.12)"
    );
    assert_eq!(p.step(u64::MAX), 0);
    assert_eq!(p.observe(stall(0.03, 0.01), 0), PaceChange::Hold);
    assert_eq!(p.observe(stall(0.01, 0.02), 0), PaceChange::Hold);
    assert_eq!(p.observe(stall(0.01, 0.01), 0), PaceChange::Resume);
}

#[test]
fn a_ceiling_of_zero_holds_on_any_stall_and_reclaims_without() {
    let mut p = Pacer::new(Share::new(0.0), BASE);
    assert_eq!(p.observe(stall(0.0, 0.0), 0), PaceChange::Faster);
    assert_eq!(p.observe(stall(0.001, 0.0), 0), PaceChange::Hold);
    assert_eq!(p.observe(stall(0.0, 0.0), 0), PaceChange::Resume);
}

#[test]
fn the_deferred_note_names_the_stall_in_plain_quantities_only_when_pacing_held_back() {
    let mut p = Pacer::new(Share::new(0.05), BASE);
    p.observe(stall(0.01, 0.0), 0);
    assert_eq!(p.deferred_note(), "");
    p.observe(
        Harm {
            memory: 0.02,
            io: 0.31,
            refaulted: 3 * MIB,
        },
        395 * MIB,
    );
    p.observe(
        Harm {
            memory: 0.12,
            io: 0.04,
            refaulted: MIB / 5,
        },
        390 * MIB,
    );
    assert_eq!(
        p.deferred_note(),
        "; paced by the workload's stall (the higher of memory and I/O pressure): 12 % at the last pass, up to 31 %, ceiling 5 %; held 1 time(s) (first at usage 395Mi), 2 pass(es) over the ceiling, holding at the end; 3.2Mi refaulted meanwhile"
    );
    p.observe(stall(0.0, 0.0), 0);
    assert!(
        p.deferred_note().contains("0 % at the last pass")
            && p.deferred_note().contains("next step 1Mi"),
        "{}",
        p.deferred_note()
    );
}

#[test]
fn a_kept_limit_leaves_room_for_the_usage_it_first_held_at() {
    let mut p = Pacer::new(Share::new(0.05), BASE);
    p.observe(stall(0.0, 0.0), 400 * MIB);
    assert_eq!(p.kept_usage(380 * MIB), 380 * MIB, "never held: usage now");
    p.observe(stall(0.04, 0.0), 390 * MIB);
    p.observe(stall(0.08, 0.0), 385 * MIB);
    p.observe(stall(0.0, 0.0), 387 * MIB);
    p.observe(stall(0.04, 0.0), 370 * MIB);
    assert_eq!(p.usage_at_first_hold, Some(390 * MIB));
    assert_eq!(p.kept_usage(350 * MIB), 390 * MIB);
    assert_eq!(
        p.kept_usage(395 * MIB),
        395 * MIB,
        "usage grew back past it"
    );
}
