//! One benchmark table for `cargo xtask bench`: each benchmark appends its results here as JSON
//! lines (to the file named by `NRI_RESIZE_BENCH_TABLE`, when set), and xtask prints them all as
//! one table after the last benchmark: measure, baseline, ours, ratio, target.

use std::fmt::Write as _;
use std::io::Write as _;

use serde::{Deserialize, Serialize};

/// Where rows go (set by `cargo xtask bench`).
pub const ENV: &str = "NRI_RESIZE_BENCH_TABLE";

/// One measured row, with its baseline measured in the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    pub measure: String,
    /// The baseline and its value (`no-op handler: 0.7 µs p99`).
    pub baseline: String,
    pub ours: String,
    /// Ours / baseline, where the two are the same quantity.
    pub ratio: Option<f64>,
    /// The target and whether it is met (`p99 < 1 ms: met`).
    pub target: String,
}

/// Appends `row` to the table file, if one is set; a write error is printed, never fatal.
pub fn report(row: &BenchRow) {
    let Some(path) = std::env::var_os(ENV) else {
        return;
    };
    let line = match serde_json::to_string(row) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("bench table: {e}");
            return;
        }
    };
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        eprintln!("bench table {}: {e}", path.to_string_lossy());
    }
}

/// Shorthand for [`report`].
pub fn row(measure: &str, baseline: &str, ours: &str, ratio: Option<f64>, target: &str) {
    report(&BenchRow {
        measure: measure.into(),
        baseline: baseline.into(),
        ours: ours.into(),
        ratio,
        target: target.into(),
    });
}

/// `met` / `NOT met`.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// The rows of a table file as a Markdown table.
pub fn render(rows: &[BenchRow]) -> String {
    let mut s =
        String::from("| measure | baseline | ours | ratio | target |\n|---|---|---|---|---|\n");
    for r in rows {
        let ratio = r
            .ratio
            .map_or_else(|| "—".to_string(), |x| format!("{x:.2}×"));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {ratio} | {} |",
            r.measure, r.baseline, r.ours, r.target
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_render_as_one_markdown_table() {
        let rows = vec![
            BenchRow {
                measure: "a".into(),
                baseline: "b: 1 ms".into(),
                ours: "2 ms".into(),
                ratio: Some(2.0),
                target: "< 3 ms: met".into(),
            },
            BenchRow {
                measure: "c".into(),
                baseline: "zero".into(),
                ours: "0.1 %".into(),
                ratio: None,
                target: "≈ 0: met".into(),
            },
        ];
        let t = render(&rows);
        assert!(
            t.contains("| a | b: 1 ms | 2 ms | 2.00× | < 3 ms: met |"),
            "{t}"
        );
        assert!(t.contains("| c | zero | 0.1 % | — | ≈ 0: met |"), "{t}");
        let json = serde_json::to_string(&rows[0]).unwrap();
        assert_eq!(serde_json::from_str::<BenchRow>(&json).unwrap(), rows[0]);
    }
}
