//! Pressure stall information files (`cpu.pressure`, `memory.pressure`, `io.pressure`, and
//! `/proc/pressure/*`): their cumulative stalled time. The observer reads them per container;
//! paced reclaim reads `memory.pressure` and `io.pressure` between its steps.

/// Cumulative stalled time from one pressure file, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallTotals {
    /// Time at least one task was stalled.
    pub some_us: u64,
    /// Time every non-idle task was stalled at once; `None` where the file has no `full` line
    /// (`cpu.pressure` before 5.13).
    pub full_us: Option<u64>,
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
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let slot = match words.next() {
            Some("some") => &mut some,
            Some("full") => &mut full,
            _ => continue,
        };
        *slot = words
            .find_map(|w| w.strip_prefix("total="))
            .and_then(|t| t.parse::<u64>().ok());
    }
    Some(StallTotals {
        some_us: some?,
        full_us: full,
    })
}
