//! Pressure stall information (PSI) of a cgroup: how long its tasks were stalled waiting for
//! CPU, memory or I/O. cgroup v2 only: each cgroup has `cpu.pressure`, `memory.pressure` and
//! `io.pressure` whatever its controllers; a kernel booted with `psi=0` hides them, and cgroup v1
//! has none.
//!
//! The files carry cumulative stalled microseconds (`total=`); the observer reads them with its
//! other reads and callers compare two readings ([`StallShare::between`]).

use std::path::Path;

/// The parser is cgroup I/O's too (paced reclaim reads `memory.pressure`).
pub use crate::cgroup::{stall_totals, StallTotals};

/// Whether the observer reads pressure, or why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PressureStrategy {
    /// `cpu.pressure`, `memory.pressure`, `io.pressure` of each container's cgroup.
    PressureFiles,
    /// cgroup v1 has no pressure files.
    UnavailableCgroupV1,
    /// cgroup v2, but the kernel has no PSI (`CONFIG_PSI=n`, or booted with `psi=0`).
    UnavailableNoPsi,
}

impl PressureStrategy {
    pub const ALL: [Self; 3] = [
        Self::PressureFiles,
        Self::UnavailableCgroupV1,
        Self::UnavailableNoPsi,
    ];

    /// Stable name (metrics labels, status API).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PressureFiles => "pressure_files",
            Self::UnavailableCgroupV1 => "unavailable_cgroup_v1",
            Self::UnavailableNoPsi => "unavailable_no_psi",
        }
    }

    /// Whether pressure is read.
    pub fn available(self) -> bool {
        self == Self::PressureFiles
    }

    /// Decides from the layout and a probe of the kernel's own pressure file
    /// (`/proc/pressure/memory`, which fails with `EOPNOTSUPP` under `psi=0` and is absent
    /// without `CONFIG_PSI`). The `Err` carries the reason said in fallbacks and `/readyz`.
    pub fn detect(v1: bool, probe: &Path) -> Result<Self, (Self, String)> {
        if v1 {
            return Err((
                Self::UnavailableCgroupV1,
                "cgroup v1 has no pressure stall information (PSI needs cgroup v2)".into(),
            ));
        }
        match std::fs::read_to_string(probe) {
            Ok(text) if stall_totals(&text).is_some() => Ok(Self::PressureFiles),
            Ok(_) => Err((
                Self::UnavailableNoPsi,
                format!("{} has no PSI totals", probe.display()),
            )),
            Err(e) => Err((
                Self::UnavailableNoPsi,
                format!(
                    "kernel has no PSI (read {}: {e}; booted with psi=0?)",
                    probe.display()
                ),
            )),
        }
    }
}

/// The three pressure files of a cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    pub cpu: StallTotals,
    pub memory: StallTotals,
    pub io: StallTotals,
}

/// The resources a pressure file exists for (metric label `resource`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PressureResource {
    Cpu,
    Memory,
    Io,
}

impl PressureResource {
    pub const ALL: [Self; 3] = [Self::Cpu, Self::Memory, Self::Io];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Memory => "memory",
            Self::Io => "io",
        }
    }
}

impl Pressure {
    pub fn of(&self, resource: PressureResource) -> StallTotals {
        match resource {
            PressureResource::Cpu => self.cpu,
            PressureResource::Memory => self.memory,
            PressureResource::Io => self.io,
        }
    }
}

/// Stalled time (`some`) over wall time between two readings of a cgroup's pressure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallShare {
    /// Wall time between the two readings.
    pub wall_us: u64,
    pub cpu_some_us: u64,
    pub memory_some_us: u64,
    pub io_some_us: u64,
}

impl StallShare {
    /// From `before` to `after`, `wall_us` apart. A total that went backwards (the cgroup was
    /// recreated) counts from zero.
    #[must_use]
    pub fn between(before: &Pressure, after: &Pressure, wall_us: u64) -> Self {
        let d = |a: StallTotals, b: StallTotals| {
            if b.some_us >= a.some_us {
                b.some_us - a.some_us
            } else {
                b.some_us
            }
        };
        Self {
            wall_us,
            cpu_some_us: d(before.cpu, after.cpu),
            memory_some_us: d(before.memory, after.memory),
            io_some_us: d(before.io, after.io),
        }
    }

    /// The share of wall time some task waited for CPU (0.0 ..= 1.0; 0 over no time).
    #[must_use]
    pub fn cpu(&self) -> f64 {
        share(self.cpu_some_us, self.wall_us)
    }

    /// The share of wall time some task waited for memory.
    #[must_use]
    pub fn memory(&self) -> f64 {
        share(self.memory_some_us, self.wall_us)
    }

    /// The share of wall time some task waited for I/O.
    #[must_use]
    pub fn io(&self) -> f64 {
        share(self.io_some_us, self.wall_us)
    }
}

/// `part / whole`, clamped to 0.0 ..= 1.0 (stalled time is sampled on scheduler ticks and can
/// slightly exceed the wall time measured around it).
#[expect(
    clippy::cast_precision_loss,
    reason = "microseconds as f64 for a share: exact up to 2^53 µs (285 years)"
)]
#[must_use]
pub fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        return 0.0;
    }
    (part as f64 / whole as f64).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/pressure/memory` of a 6.18 build machine (cgroup files have the same format).
    const MEMORY_6_18: &str = "some avg10=0.00 avg60=0.06 avg300=0.30 total=3278626\n\
full avg10=0.00 avg60=0.03 avg300=0.14 total=1700034\n";
    /// `/proc/pressure/cpu` of the same machine: the system-wide cpu `full` line is all zeros.
    const CPU_6_18: &str = "some avg10=4.17 avg60=3.37 avg300=4.90 total=2517439716\n\
full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
    /// `cpu.pressure` as kernels before 5.13 write it: no `full` line.
    const CPU_5_10: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=12\n";

    #[test]
    fn parses_some_and_full_totals_of_real_files() {
        let totals = |text| stall_totals(text).map(|t| (t.some_us, t.full_us));
        assert_eq!(totals(MEMORY_6_18), Some((3_278_626, Some(1_700_034))));
        assert_eq!(totals(CPU_6_18), Some((2_517_439_716, Some(0))));
        assert_eq!(totals(CPU_5_10), Some((12, None)));
        assert_eq!(stall_totals(""), None);
        assert_eq!(stall_totals("some avg10=0.00 avg60=0.00\n"), None);
    }

    #[test]
    fn the_steady_stall_is_the_lowest_of_the_some_lines_averages() {
        let steady = |text| stall_totals(text).and_then(|t| t.some_steady_bp);
        assert_eq!(
            steady(MEMORY_6_18),
            Some(0),
            "avg10 0.00 < avg60 0.06 < avg300 0.30"
        );
        assert_eq!(
            steady(CPU_6_18),
            Some(337),
            "avg60, not the full line's 0.00"
        );
        assert_eq!(steady(CPU_5_10), Some(0));
        // A cache warmed from disk a few seconds ago: only the short averages show it.
        assert_eq!(
            steady("some avg10=40.00 avg60=12.5 avg300=2.61 total=5\n"),
            Some(261)
        );
        assert_eq!(steady("some avg60=100.00 total=5\n"), Some(10_000));
        assert_eq!(steady("some total=5\n"), None, "no average: none assumed");
        let share = stall_totals(CPU_6_18).and_then(|t| t.some_steady());
        assert!(
            share.is_some_and(|s| (s - 0.0337).abs() < 1e-12),
            "{share:?}"
        );
    }

    #[test]
    fn share_between_two_readings() {
        let at = |cpu: u64, memory: u64| Pressure {
            cpu: StallTotals {
                some_us: cpu,
                full_us: None,
                ..StallTotals::default()
            },
            memory: StallTotals {
                some_us: memory,
                full_us: Some(0),
                ..StallTotals::default()
            },
            io: StallTotals::default(),
        };
        let s = StallShare::between(&at(1_000, 500), &at(311_000, 20_500), 1_000_000);
        assert!((s.cpu() - 0.31).abs() < 1e-9, "{s:?}");
        assert!((s.memory() - 0.02).abs() < 1e-9, "{s:?}");
        assert!(s.io().abs() < f64::EPSILON);
        // A recreated cgroup counts from zero; no time is no share; clamped to 1.
        let s = StallShare::between(&at(900_000, 0), &at(100_000, 0), 1_000_000);
        assert_eq!(s.cpu_some_us, 100_000);
        assert!(StallShare::between(&at(0, 0), &at(5, 5), 0).cpu().abs() < f64::EPSILON);
        assert!((share(11, 10) - 1.0).abs() < f64::EPSILON);
    }

    #[test]
    fn detection_says_why_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let probe = dir.path().join("memory");
        let (s, why) = PressureStrategy::detect(true, &probe).expect_err("v1");
        assert_eq!(s, PressureStrategy::UnavailableCgroupV1);
        assert!(why.contains("cgroup v1"), "{why}");
        let (s, why) = PressureStrategy::detect(false, &probe).expect_err("no file");
        assert_eq!(s, PressureStrategy::UnavailableNoPsi);
        assert!(why.contains("psi=0"), "{why}");
        std::fs::write(&probe, MEMORY_6_18).expect("write");
        assert_eq!(
            PressureStrategy::detect(false, &probe),
            Ok(PressureStrategy::PressureFiles)
        );
    }
}
