//! Pressure stall information files (`cpu.pressure`, `memory.pressure`, `io.pressure`, and
//! `/proc/pressure/*`): their cumulative stalled time. The observer reads them per container;
//! paced reclaim reads `memory.pressure` and `io.pressure` between its steps.

/// Cumulative stalled time from one pressure file, in microseconds, and the kernel's one-minute
/// average of the `some` share.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallTotals {
    /// Time at least one task was stalled.
    pub some_us: u64,
    /// Time every non-idle task was stalled at once; `None` where the file has no `full` line
    /// (`cpu.pressure` before 5.13).
    pub full_us: Option<u64>,
    /// The lowest of the `some` line's `avg10`, `avg60` and `avg300`, in hundredths of a percent
    /// (`2.50` → 250): the stall the cgroup has had steadily, over ten seconds as over five
    /// minutes. A burst (a workload warming its cache from disk) raises the short averages only.
    pub some_steady_bp: Option<u32>,
}

impl StallTotals {
    /// [`Self::some_steady_bp`] as a share (250 → 0.025).
    #[must_use]
    pub fn some_steady(&self) -> Option<f64> {
        self.some_steady_bp.map(|bp| f64::from(bp) / 10_000.0)
    }
}

/// Parses a pressure file (`cpu.pressure`, `memory.pressure`, `io.pressure`, or
/// `/proc/pressure/*`):
///
/// ```text
/// some avg10=0.00 avg60=0.00 avg300=0.00 total=12345
/// full avg10=0.00 avg60=0.00 avg300=0.00 total=678
/// ```
///
/// `None` without a `some` total.
#[must_use]
pub fn stall_totals(text: &str) -> Option<StallTotals> {
    let mut some = None;
    let mut full = None;
    let mut some_steady_bp: Option<u32> = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (slot, is_some) = match words.next() {
            Some("some") => (&mut some, true),
            Some("full") => (&mut full, false),
            _ => continue,
        };
        for w in words {
            if let Some(t) = w.strip_prefix("total=") {
                *slot = t.parse::<u64>().ok();
            } else if let Some(a) = ["avg10=", "avg60=", "avg300="]
                .iter()
                .find_map(|k| w.strip_prefix(k))
                .filter(|_| is_some)
            {
                if let Some(bp) = basis_points(a) {
                    some_steady_bp = Some(some_steady_bp.map_or(bp, |s| s.min(bp)));
                }
            }
        }
    }
    Some(StallTotals {
        some_us: some?,
        full_us: full,
        some_steady_bp,
    })
}

/// `"2.50"` (a percentage with two decimals, as the kernel writes it) → 250.
fn basis_points(pct: &str) -> Option<u32> {
    let (whole, frac) = pct.split_once('.').unwrap_or((pct, "0"));
    let frac = format!("{frac:0<2}");
    let v = whole.parse::<u32>().ok()?.checked_mul(100)?;
    v.checked_add(frac.get(..2)?.parse::<u32>().ok()?)
        .map(|bp| bp.min(10_000))
}
