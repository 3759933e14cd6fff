use super::*;

const MIB: u64 = 1 << 20;

fn stat(usage_mib: u64, file_mib: u64, inactive_mib: u64, shmem_mib: u64) -> CacheStat {
    CacheStat {
        usage: usage_mib * MIB,
        anon: (usage_mib - file_mib) * MIB,
        file: file_mib * MIB,
        shmem: shmem_mib * MIB,
        active_file: (file_mib - inactive_mib - shmem_mib) * MIB,
        inactive_file: inactive_mib * MIB,
        refaulted_file: 0,
    }
}

fn harm(stall: f64, refaulted: u64) -> Harm {
    Harm {
        memory: stall / 2.0,
        io: stall,
        refaulted,
    }
}

fn settings() -> TrimSettings {
    TrimSettings {
        max_stall: Share::new(0.002),
        min_step: MIB,
        max_step: 8 * MIB,
    }
}

/// Each row: one decision of one probe, in order.
#[test]
fn a_cold_cache_is_trimmed_in_growing_steps_down_to_nothing_left() {
    let s = settings();
    let mut p = Probe::default();
    // (usage MiB, file MiB, inactive MiB, stall, refaulted) → expected step.
    let rows: [(u64, u64, u64, f64, u64, TrimStep); 8] = [
        (210, 200, 200, 0.0, 0, TrimStep::Reclaim(MIB)),
        (209, 199, 199, 0.0, 0, TrimStep::Reclaim(2 * MIB)),
        (207, 197, 197, 0.001, 4096, TrimStep::Reclaim(4 * MIB)),
        (203, 193, 193, 0.0, 0, TrimStep::Reclaim(8 * MIB)),
        (195, 185, 185, 0.0, 0, TrimStep::Reclaim(8 * MIB)), // max_step
        (17, 7, 7, 0.0, 0, TrimStep::Reclaim(7 * MIB)),      // all that is left
        (
            10,
            0,
            0,
            0.0,
            0,
            TrimStep::Converged {
                working_set: 10 * MIB,
                found: Found::NothingLeft,
            },
        ),
        // A new probe after the pause starts over (the trimmer resets the probe).
        (
            10,
            0,
            0,
            0.0,
            0,
            TrimStep::Converged {
                working_set: 10 * MIB,
                found: Found::NothingLeft,
            },
        ),
    ];
    for (i, (usage, file, inactive, stall, refaulted, want)) in rows.into_iter().enumerate() {
        let got = p.decide(&s, &stat(usage, file, inactive, 0), harm(stall, refaulted));
        assert_eq!(got, want, "row {i}");
    }
}

#[test]
fn the_first_harm_ends_the_probe_at_the_usage_before_the_step() {
    let s = settings();
    // Refaults over an eighth of the last step (and the 64 KiB floor).
    let mut p = Probe::default();
    assert_eq!(
        p.decide(&s, &stat(150, 100, 10, 0), harm(0.0, 0)),
        TrimStep::Reclaim(MIB)
    );
    assert_eq!(
        p.decide(&s, &stat(149, 99, 9, 0), harm(0.0, REFAULT_FLOOR)),
        TrimStep::Reclaim(2 * MIB),
        "at the floor: noise"
    );
    assert_eq!(
        p.decide(&s, &stat(147, 97, 7, 0), harm(0.0, 300 << 10)),
        TrimStep::Converged {
            working_set: 149 * MIB,
            found: Found::Refaults { bytes: 300 << 10 }
        }
    );
    // Stall over the target with refaults under an eighth of the step (6.16+: the I/O line
    // shows them).
    let mut p = Probe::default();
    p.decide(&s, &stat(150, 100, 100, 0), harm(0.0, 0));
    p.decide(&s, &stat(149, 99, 99, 0), harm(0.0, 0));
    p.decide(&s, &stat(147, 97, 97, 0), harm(0.0, 0));
    assert_eq!(
        p.decide(&s, &stat(143, 93, 93, 0), harm(0.003, 200 << 10)),
        TrimStep::Converged {
            working_set: 147 * MIB,
            found: Found::Stall { share: 0.003 }
        }
    );
    // Stall with no refaults is the workload's own: the probe holds and goes on once quiet.
    let mut p = Probe::default();
    p.decide(&s, &stat(150, 100, 100, 0), harm(0.0, 0));
    assert_eq!(
        p.decide(&s, &stat(149, 99, 99, 0), harm(0.08, 0)),
        TrimStep::Hold(HoldReason::OwnStall { share: 0.08 })
    );
    assert_eq!(
        p.decide(&s, &stat(149, 99, 99, 0), harm(0.0, 0)),
        TrimStep::Reclaim(2 * MIB),
        "the probe goes on where it was"
    );
    // A container that grew past where the step started: the usage now.
    let mut p = Probe::default();
    p.decide(&s, &stat(150, 100, 100, 0), harm(0.0, 0));
    assert!(matches!(
        p.decide(&s, &stat(180, 99, 99, 0), harm(0.01, 1 << 20)),
        TrimStep::Converged { working_set, .. } if working_set == 180 * MIB
    ));
}

#[test]
fn a_probe_never_starts_on_a_container_that_is_harmed_already() {
    let s = settings();
    let mut p = Probe::default();
    assert_eq!(
        p.decide(&s, &stat(150, 100, 100, 0), harm(0.05, 0)),
        TrimStep::Hold(HoldReason::OwnStall { share: 0.05 })
    );
    assert_eq!(
        p.decide(&s, &stat(150, 100, 100, 0), harm(0.0, 8 * MIB)),
        TrimStep::Hold(HoldReason::OwnRefaults { bytes: 8 * MIB })
    );
    assert_eq!(p.last_step(), 0, "nothing reclaimed");
    assert_eq!(
        p.decide(&s, &stat(150, 100, 100, 0), harm(0.0, 0)),
        TrimStep::Reclaim(MIB)
    );
}

#[test]
fn steps_never_ask_for_shmem_or_more_than_the_cold_list() {
    let s = settings();
    // 100 MiB file of which 60 MiB is tmpfs: 40 MiB droppable, 3 MiB inactive.
    let mut p = Probe::default();
    assert_eq!(
        p.decide(&s, &stat(150, 100, 3, 60), harm(0.0, 0)),
        TrimStep::Reclaim(MIB)
    );
    assert_eq!(
        p.decide(&s, &stat(149, 99, 3, 60), harm(0.0, 0)),
        TrimStep::Reclaim(2 * MIB)
    );
    assert_eq!(
        p.decide(&s, &stat(147, 97, 1, 60), harm(0.0, 0)),
        TrimStep::Reclaim(MIB),
        "cut to the inactive list, never below the smallest step"
    );
    // Only shmem left: nothing to trim, whatever `file` says.
    let mut p = Probe::default();
    assert_eq!(
        p.decide(&s, &stat(100, 60, 0, 60), harm(0.0, 0)),
        TrimStep::Converged {
            working_set: 100 * MIB,
            found: Found::NothingLeft
        }
    );
}

#[test]
fn harm_and_hold_read_as_a_person_reads_them() {
    assert_eq!(
        Found::Stall { share: 0.0031 }.to_string(),
        "stall 0.31 % after a step"
    );
    assert_eq!(
        Found::Refaults { bytes: 3 * MIB }.to_string(),
        "3Mi refaulted after a step"
    );
    assert_eq!(
        HoldReason::OwnStall { share: 0.05 }.to_string(),
        "the container stalls 5 % on its own"
    );
}

#[test]
fn a_working_set_holds_while_usage_is_at_or_above_it() {
    const MI: u64 = 1 << 20;
    assert!(working_set_holds(208 * MI, 230 * MI));
    assert!(working_set_holds(208 * MI, 208 * MI));
    assert!(!working_set_holds(208 * MI, 150 * MI));
}
